//! `gpusleuth stats`: per-op latency and time decomposition of a recorded trace.

use crate::args::{JsonOutput, TraceInput};
use crate::load::{emit_json, emit_text, stats_of};

#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    pub input: TraceInput,
    #[command(flatten)]
    pub out: JsonOutput,
}

pub fn run(args: Args) -> anyhow::Result<i32> {
    let report = stats_of(&args.input.db, args.input.pid)?;
    if args.out.json {
        emit_json(&report)?;
    } else {
        emit_text(&crate::render::stats::render(&report))?;
    }
    Ok(0)
}
