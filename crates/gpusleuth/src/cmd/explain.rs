//! `gpusleuth explain`: ranked, evidence-backed findings of a recorded trace,
//! or of a whole `trace --rotate` run when `--db` names its directory.

use crate::args::TraceInput;
use crate::render::explain::{print, Style};
use crate::window::WindowArgs;

#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    pub input: TraceInput,
    /// `--from`/`--to`/`--last`: the findings of the calls that start in the window
    /// (their waits, culprits and memory calls), GPU busy inside it.
    #[command(flatten)]
    pub window: WindowArgs,
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
    print(&args.input, args.window, style)
}
