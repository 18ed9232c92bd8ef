//! One module per subcommand; each exposes `Args` (clap) and `run(Args) -> anyhow::Result<i32>` (the exit code).
pub mod bench;
pub mod bench_analysis;
pub mod check;
pub mod demo;
pub mod explain;
pub mod export;
pub mod import;
pub mod mcp;
pub mod memory;
pub mod memory_sites;
pub mod query;
pub mod reclaim;
pub mod report;
pub mod stats;
pub mod trace;
pub mod vram;
