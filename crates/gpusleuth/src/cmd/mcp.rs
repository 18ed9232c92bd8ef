//! `gpusleuth mcp [--db F] [--http ADDR] [--allow-reclaim]`: the Model Context
//! Protocol server. stdio by default: stdout carries only JSON-RPC and every
//! log line goes to stderr. The bearer token for HTTP comes from the
//! environment or a file, never from the command line (it would show in `ps`).

use anyhow::{bail, Context};
use sleuth_mcp::{HttpOptions, ServerOptions, Transport};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

/// Environment variable holding the HTTP bearer token.
pub const TOKEN_ENV: &str = "GPUSLEUTH_MCP_TOKEN";

#[derive(clap::Args)]
pub struct Args {
    /// Trace database the tools read, or a run's directory (`trace --rotate`):
    /// the tools answer over its files (`sql` reads one of them).
    #[arg(long)]
    db: Option<PathBuf>,
    /// Directory of traces a tool call may also name with its `db` argument
    /// (any other path is refused, whether it exists or not).
    #[arg(long, value_name = "DIR")]
    trace_dir: Option<PathBuf>,
    /// Serve streamable HTTP on this address (e.g. 127.0.0.1:8765; port 0 picks one) instead of stdio.
    /// A non-loopback address requires a bearer token ($GPUSLEUTH_MCP_TOKEN or --token-file).
    #[arg(long, value_name = "ADDR")]
    http: Option<SocketAddr>,
    /// File holding the HTTP bearer token (first line); refused when other users may read it.
    #[arg(long, value_name = "PATH", requires = "http")]
    token_file: Option<PathBuf>,
    /// Extra host name accepted in Host/Origin headers (e.g. this machine's DNS name), repeatable.
    #[arg(long, value_name = "NAME", requires = "http")]
    allow_host: Vec<String>,
    /// Let `reclaim_plan` execute when a call passes execute=true (otherwise plans are dry runs only).
    #[arg(long)]
    allow_reclaim: bool,
}

pub fn run(args: Args) -> anyhow::Result<i32> {
    if let Some(db) = &args.db {
        if !db.is_file() && !db.is_dir() {
            bail!(
                "trace database {} does not exist (give a trace file or a run's directory)",
                db.display()
            );
        }
    }
    if let Some(dir) = &args.trace_dir {
        if !dir.is_dir() {
            bail!("--trace-dir {} is not a directory", dir.display());
        }
    }
    let opts = ServerOptions {
        db: args.db,
        trace_dir: args.trace_dir,
        allow_reclaim: args.allow_reclaim,
        gpu_sources: sleuth_gpu::Sources::from_env(),
    };
    let transport = match args.http {
        None => Transport::Stdio,
        Some(addr) => Transport::Http(HttpOptions {
            addr,
            token: read_token(args.token_file.as_deref())?,
            extra_hosts: args.allow_host,
        }),
    };
    sleuth_mcp::run(opts, transport)?;
    Ok(0)
}

/// The token from `--token-file`, else from the environment; None when neither is set.
fn read_token(file: Option<&Path>) -> anyhow::Result<Option<String>> {
    let raw = match file {
        Some(path) => {
            check_private(path)?;
            std::fs::read_to_string(path)
                .with_context(|| format!("cannot read token file {}", path.display()))?
        }
        None => match std::env::var(TOKEN_ENV) {
            Ok(v) => v,
            Err(std::env::VarError::NotPresent) => return Ok(None),
            Err(e) => bail!("{TOKEN_ENV}: {e}"),
        },
    };
    let token = raw.lines().next().unwrap_or("").trim().to_string();
    if token.is_empty() {
        bail!("the bearer token is empty");
    }
    Ok(Some(token))
}

/// A token file other users can read gives the token away: refuse it.
fn check_private(path: &Path) -> anyhow::Result<()> {
    use std::os::unix::fs::MetadataExt;
    let meta = std::fs::metadata(path)
        .with_context(|| format!("cannot read token file {}", path.display()))?;
    if !meta.is_file() {
        bail!("token file {} is not a regular file", path.display());
    }
    let mode = meta.mode() & 0o777;
    if mode & 0o077 != 0 {
        bail!(
            "token file {} is readable by other users (mode {mode:04o}): run chmod 600 on it",
            path.display()
        );
    }
    Ok(())
}

#[cfg(test)]
#[path = "mcp_lean_tests.rs"]
mod lean_tests;
