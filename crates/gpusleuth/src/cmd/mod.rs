//! One module per subcommand; each exposes `Args` (clap) and `run(Args) -> anyhow::Result<i32>` (the exit code).
//! `main.rs` dispatches to them; no command module uses another: what two
//! commands share lives in `args`, `load`, `render`, `capture` or a library crate.
#[cfg(feature = "sim")]
pub mod bench;
#[cfg(feature = "sim")]
pub mod bench_analysis;
pub mod check;
#[cfg(feature = "sim")]
pub mod demo;
pub mod explain;
pub mod export;
pub mod finish;
pub mod import;
pub mod mcp;
pub mod memory;
pub mod merge;
pub mod query;
pub mod reclaim;
pub mod report;
pub mod stats;
pub mod trace;
pub mod vram;
