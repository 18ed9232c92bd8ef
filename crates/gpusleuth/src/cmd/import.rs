//! `gpusleuth import --from ingero SRC.db --db F`: convert another tool's trace.

use anyhow::Context;
use std::path::PathBuf;

#[derive(Clone, Copy, clap::ValueEnum)]
pub enum From {
    /// An Ingero trace database (https://github.com/ingero-io/ingero).
    Ingero,
}

#[derive(clap::Args)]
pub struct Args {
    /// Format of the source database.
    #[arg(long, value_enum)]
    from: From,
    /// The database to import (opened read-only).
    src: PathBuf,
    /// The gpusleuth trace to create (must not exist).
    #[arg(long)]
    db: PathBuf,
    #[command(flatten)]
    out: crate::args::JsonOutput,
}

pub fn run(args: Args) -> anyhow::Result<i32> {
    let summary = match args.from {
        From::Ingero => sleuth_store::import_ingero(&args.src, &args.db)
            .with_context(|| format!("importing {}", args.src.display()))?,
    };
    if args.out.json {
        outln!("{}", serde_json::to_string_pretty(&summary)?)?;
        return Ok(0);
    }
    outln!(
        "imported {} calls, {} process events, {} processes into {}",
        summary.calls,
        summary.proc_events,
        summary.processes,
        args.db.display()
    )?;
    for (op, n) in &summary.calls_by_op {
        outln!("  {op:<24} {n:>8}")?;
    }
    if !summary.notes.is_empty() {
        outln!("what the Ingero trace lacks or what was left out:")?;
        for n in &summary.notes {
            outln!("  - {n}")?;
        }
    }
    Ok(0)
}
