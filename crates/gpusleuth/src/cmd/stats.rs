//! `gpusleuth stats`: per-op latency and time decomposition of a recorded trace.

use crate::args::{JsonOutput, TraceInput};
use crate::load::{emit_json, emit_text, load_trace};
use sleuth_core::stats;

#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    pub input: TraceInput,
    #[command(flatten)]
    pub out: JsonOutput,
}

pub fn run(args: Args) -> anyhow::Result<i32> {
    let data = load_trace(&args.input.db, args.input.pid)?;
    let report = stats::compute(&data);
    if args.out.json {
        emit_json(&report)?;
    } else {
        emit_text(&crate::render::stats::render(&report))?;
    }
    Ok(0)
}
