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
pub mod server;
pub mod site_tools;
pub mod trace_tools;

pub use http::{serve_http, HttpOptions};
pub use server::{ServerOptions, SleuthServer};

use anyhow::Context;
use rmcp::ServiceExt;

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

/// Which transport [`run`] serves.
#[derive(Debug, Clone)]
pub enum Transport {
    Stdio,
    Http(HttpOptions),
}

/// Blocking entry point for the CLI: builds a tokio runtime and serves.
pub fn run(opts: ServerOptions, transport: Transport) -> anyhow::Result<()> {
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
