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
pub mod stdio_cap;
pub mod trace_tools;

pub use http::{serve_http, HttpOptions};
pub use server::{ServerOptions, SleuthServer};

use anyhow::Context;
use rmcp::ServiceExt;

/// How long the check ahead of the served trace may take (as a command's
/// read: far above a 10M-call file's seconds).
const CHECK_AHEAD_LIMIT: std::time::Duration = sleuth_store::DEFAULT_READ_TIMEOUT;

/// Longest request line read on stdio, its newline included (rmcp's own
/// default cap; a tool call is a few hundred bytes).
pub const MAX_STDIO_LINE: usize = 16 << 20;

/// Serves one client over stdin/stdout until it disconnects. A request line
/// over [`MAX_STDIO_LINE`] is answered with JSON-RPC error -32600 (without
/// an `id`: the line was not read), as any message that is not valid
/// JSON-RPC (`stdio_cap::LineCap`);
/// rmcp alone dropped it unanswered and the client waited forever.
pub async fn serve_stdio(opts: ServerOptions) -> anyhow::Result<()> {
    let (stdin, stdout) = rmcp::transport::stdio();
    let transport =
        rmcp::transport::async_rw::AsyncRwTransport::<rmcp::RoleServer, _, _>::new_server(
            stdio_cap::LineCap::new(stdin, MAX_STDIO_LINE),
            stdout,
        )
        // Never reached: LineCap ends every line before this.
        .with_max_line_length(MAX_STDIO_LINE + 1);
    let running = SleuthServer::new(opts)
        .serve(transport)
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
    // Before any thread starts, so every thread shares the few arenas.
    limit_malloc_arenas();
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

/// How many malloc arenas the server's threads share (glibc's default is 8
/// per CPU). Each arena keeps what its threads freed: a `sql` call that ran
/// into SQLite's 256 MiB heap cap left up to that much resident in the arena
/// of its worker thread, and tokio's blocking pool runs each call on
/// whichever thread is free, so RSS grew by about 290 MB per new worker
/// thread and never came back (1.46 GB after 80 such calls).
pub const MALLOC_ARENAS: i32 = 4;

/// Bounds the malloc arenas to [`MALLOC_ARENAS`] (glibc only; elsewhere nothing).
pub fn limit_malloc_arenas() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only sets a tunable of glibc's allocator; it takes
    // plain integers and is called before the server starts its threads.
    unsafe {
        libc::mallopt(libc::M_ARENA_MAX, MALLOC_ARENAS);
    }
}

/// Gives the memory freed in every arena back to the system (glibc's
/// `malloc_trim`; elsewhere nothing). Called after a tool call that failed
/// (SQLite's heap cap is the usual way a call uses much memory) and after
/// the last call running ends; off the caller's path.
pub fn release_freed_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim walks the allocator's own free lists under its
    // locks and returns free pages to the kernel; live allocations are
    // untouched, and it is safe to call from any thread at any time.
    unsafe {
        libc::malloc_trim(0);
    }
}
