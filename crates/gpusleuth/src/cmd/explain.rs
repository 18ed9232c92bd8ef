//! `gpusleuth explain`: ranked, evidence-backed findings of a recorded trace,
//! or of a whole `trace --rotate` run when `--db` names its directory.

use crate::args::TraceInput;
use crate::render::explain::{print, Style};

#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    pub input: TraceInput,
    /// Machine-readable output (the documented findings contract).
    #[arg(long)]
    pub json: bool,
    /// Markdown report (for issues, pull requests, notebooks).
    #[arg(long, conflicts_with = "json")]
    pub markdown: bool,
}

pub fn run(args: Args) -> anyhow::Result<i32> {
    let style = if args.json {
        Style::Json
    } else if args.markdown {
        Style::Markdown
    } else {
        Style::Text
    };
    print(&args.input, style)
}
