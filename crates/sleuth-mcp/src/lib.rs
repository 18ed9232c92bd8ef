//! gpusleuth's Model Context Protocol server.
//!
//! - [`server`]: the handler (tools and the `investigate` prompt).
//! - [`trace_tools`] / [`gpu_tools`]: what each tool computes, as plain functions.
//! - [`http`]: streamable HTTP with Host/Origin checks and the bearer-token rule.
//!
//! Transports: [`serve_stdio`] (stdout carries only JSON-RPC) and [`http::serve_http`].

pub mod args;
pub mod conn_limit;
pub mod gpu_tools;
pub mod http;
pub mod run_tools;
pub mod server;
pub mod site_tools;
pub mod trace_tools;

pub use http::{serve_http, HttpOptions};
pub use server::{ServerOptions, SleuthServer};

use anyhow::Context;
use rmcp::ServiceExt;

/// How long the check ahead of the served trace may take (as a command's
/// read: far above a 10M-call file's seconds).
const CHECK_AHEAD_LIMIT: std::time::Duration = sleuth_store::DEFAULT_READ_TIMEOUT;

/// Serves one client over stdin/stdout until it disconnects.
pub async fn serve_stdio(opts: ServerOptions) -> anyhow::Result<()> {
    let running = SleuthServer::new(opts)
        .serve(rmcp::transport::stdio())
        .await
        .context("MCP initialization over stdio failed")?;
    running
        .waiting()
        .await
        .context("MCP stdio session failed")?;
    Ok(())
}

/// The trace files `--db` names: the file, or a run's files (oldest first:
/// an answer over the run reads them all).
fn files_served(db: &std::path::Path) -> Vec<std::path::PathBuf> {
    if db.is_file() {
        return vec![db.to_path_buf()];
    }
    sleuth_store::run::run_files(db)
        .map(|files| files.into_iter().map(|(_, p)| p).collect())
        .unwrap_or_default()
}

/// Which transport [`run`] serves.
#[derive(Debug, Clone)]
pub enum Transport {
    Stdio,
    Http(HttpOptions),
}

/// Blocking entry point for the CLI: builds a tokio runtime and serves.
/// The trace the server was started on is checked ahead, on a thread of
/// its own, while the client starts: the first question about a large
/// trace then finds its checks paid (seconds at 10M calls; docs/mcp.md).
pub fn run(opts: ServerOptions, transport: Transport) -> anyhow::Result<()> {
    if let Some(db) = opts.db.clone() {
        let _ = std::thread::Builder::new()
            .name("gpusleuth-check".into())
            .spawn(move || {
                // A damaged file is reported by the first tool call that reads it.
                let budget = sleuth_store::ReadBudget::new(CHECK_AHEAD_LIMIT);
                for file in files_served(&db) {
                    let _ = trace_tools::memo().check_ahead(&file, budget.clone());
                }
            });
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    rt.block_on(async move {
        match transport {
            Transport::Stdio => serve_stdio(opts).await,
            Transport::Http(h) => serve_http(opts, h).await,
        }
    })
}
