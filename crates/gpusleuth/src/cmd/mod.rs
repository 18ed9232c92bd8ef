//! One module per subcommand; each exposes `Args` (clap) and `run(Args) -> anyhow::Result<i32>` (the exit code).
pub mod trace;
pub mod stats;
pub mod explain;
pub mod memory;
pub mod vram;
pub mod reclaim;
pub mod mcp;
pub mod query;
pub mod import;
pub mod check;
pub mod demo;
pub mod bench;
