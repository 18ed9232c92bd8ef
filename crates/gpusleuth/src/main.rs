//! gpusleuth: why is my CUDA program slow right now, and where did my GPU memory go.
//!
//! Thin command layer: each subcommand lives in `cmd/` and calls into the
//! library crates and the shared modules here (`args`, `load`, `render`,
//! `capture`). Errors end as one line on stderr and a non-zero exit.

// A command's output goes through `load::emit`: where stdout cannot be
// written (a full disk, `> /dev/full`) that is a one-line error and exit 1,
// where `println!` panicked (round 50: query, check, merge, import, reclaim).
#![cfg_attr(not(test), deny(clippy::print_stdout))]

/// `println!` that returns the error `load::emit` makes of a stdout that
/// cannot be written.
macro_rules! outln {
    ($($arg:tt)*) => {
        $crate::load::emit(&format!("{}\n", format_args!($($arg)*)))
    };
}

/// `print!` that returns the error `load::emit` makes of a stdout that
/// cannot be written.
macro_rules! out {
    ($($arg:tt)*) => {
        $crate::load::emit(&format!($($arg)*))
    };
}

mod args;
mod capture;
mod checks_memo;
mod cmd;
mod finishing;
mod gpu_sampler;
mod held_child;
mod live;
mod load;
mod metrics;
mod output;
mod output_file;
mod peak_rss;
mod precheck;
mod procinfo;
mod render;
mod signals;
mod sites;
mod term_text;
mod window;
// Traces written again through the writer, and the comparison of a stored-
// aggregate answer with the in-memory one: sleuth-store's test fixture, shared
// by the lean-load tests of `explain` and of the Perfetto export.
#[cfg(test)]
#[path = "../../sleuth-store/tests/common/trace_fixture.rs"]
mod trace_fixture;
// How a unit test that cannot run here says so (failing under CI=true).
#[cfg(test)]
#[path = "../tests/common/skip.rs"]
mod skip;
// A scratch folder removed on drop, for the unit tests that write traces.
#[cfg(test)]
#[path = "../tests/common/temp_dir.rs"]
mod temp_dir;

use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};

#[derive(Parser)]
#[command(name = "gpusleuth", version, about, long_about = None, propagate_version = true)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Trace CUDA runtime and driver calls with eBPF, with host scheduler context.
    Trace(capture::Args),
    /// Per-call latency table (p50/p95/p99, on-CPU/runnable/blocked) from a trace.
    Stats(cmd::stats::Args),
    /// Ranked, evidence-backed findings from a trace.
    Explain(cmd::explain::Args),
    /// The GPU memory ledger of a trace: live, peak, unfreed, failed allocations.
    Memory(cmd::memory::Args),
    /// Who holds GPU memory right now: NVML + /proc, orphans, dead-but-listed pids.
    Vram(cmd::vram::Args),
    /// Free GPU memory held by stuck or orphaned processes (dry run unless --yes).
    Reclaim(cmd::reclaim::Args),
    /// Model Context Protocol server for AI assistants (stdio or HTTP).
    Mcp(cmd::mcp::Args),
    /// Read-only SQL over a trace database.
    Query(cmd::query::Args),
    /// Merge per-node traces of one distributed job (clock offsets, skew from collectives).
    Merge(cmd::merge::Args),
    /// Import another tool's trace (Ingero) into a gpusleuth database.
    Import(cmd::import::Args),
    /// Complete trace files whose tracer was killed before finishing them (a file, a run, or runs).
    Finish(cmd::finish::Args),
    /// Check this machine: kernel, BTF, privileges, tracefs, CUDA libraries, NVML.
    Check(cmd::check::Args),
    /// Run the whole pipeline on a built-in simulated CUDA workload and explain it.
    #[cfg(feature = "sim")]
    Demo(cmd::demo::Args),
    /// One self-contained HTML report of a trace: findings, memory, latency, slow calls, processes.
    Report(cmd::report::Args),
    /// Export a trace: Perfetto (Chrome Trace Event JSON, or Perfetto's protobuf), or the calls as JSON.
    Export(cmd::export::Args),
    /// Measure tracing overhead and capture throughput on simulated workloads.
    #[cfg(feature = "sim")]
    Bench(cmd::bench::Args),
}

/// Whether `command` never runs a caller's SQL, so SQLite's memory
/// statistics (the global mutex and counters behind the SQL sandbox's heap
/// limit, taken on every SQLite allocation) can be off for its process:
/// `query` and `mcp` need them; `trace` turns them off itself; the others
/// are left as they are. Off, a 58-file run's `report --last 1h` took
/// 0.88–0.94 s instead of 0.96–1.09 s (2-vCPU VM, round 39).
fn runs_no_callers_sql(command: &Command) -> bool {
    matches!(
        command,
        Command::Stats(_)
            | Command::Explain(_)
            | Command::Memory(_)
            | Command::Report(_)
            | Command::Export(_)
            | Command::Merge(_)
            | Command::Import(_)
            | Command::Finish(_)
    )
}

fn main() {
    // Behave like a Unix filter: `gpusleuth stats ... | head` ends quietly
    // instead of panicking on a closed stdout.
    // SAFETY: restoring the default disposition of SIGPIPE before any thread starts.
    unsafe { libc::signal(libc::SIGPIPE, libc::SIG_DFL) };
    let matches = Cli::command()
        .try_get_matches()
        .unwrap_or_else(|e| usage_error(e));
    let cli = Cli::from_arg_matches(&matches)
        .unwrap_or_else(|e| usage_error(e.format(&mut Cli::command())));
    if runs_no_callers_sql(&cli.command) {
        sleuth_store::turn_off_memory_statistics();
    }
    refuse_stderr_input(&matches);
    let result = refuse_stdout_input(&matches).and_then(|()| run(cli.command));
    checks_memo::save();
    peak_rss::report_if_asked();
    match result {
        Ok(code) => {
            load::say_notes_after_success();
            std::process::exit(code)
        }
        Err(e) => {
            // One line, the whole context chain, no backtrace; the message
            // may quote a path or a name from an untrusted file.
            let msg = error_line(&e);
            eprintln!("gpusleuth: error: {}", term_text::terminal_safe(&msg));
            std::process::exit(1);
        }
    }
}

/// Ends the process on an argument error: help and the version as clap
/// prints them; any other error as one line on stderr and exit 1, as every
/// other error (clap's three to six lines and exit 2 collided with
/// `reclaim --yes`'s "memory stayed held", 2: round 55's docs tester).
fn usage_error(e: clap::Error) -> ! {
    use clap::error::ErrorKind;
    if matches!(
        e.kind(),
        ErrorKind::DisplayHelp
            | ErrorKind::DisplayVersion
            | ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand
    ) {
        e.exit()
    }
    eprintln!(
        "gpusleuth: {}",
        term_text::terminal_safe(&one_line_usage_error(&e.render().to_string()))
    );
    std::process::exit(1)
}

/// Clap's rendered error in one line: its message and details, without the
/// usage block and the "For more information" hint.
fn one_line_usage_error(rendered: &str) -> String {
    let mut parts: Vec<String> = Vec::new();
    for line in rendered.lines().map(str::trim) {
        if line.starts_with("Usage:") || line.starts_with("For more information") {
            break;
        }
        match line {
            "" => {}
            tip if tip.starts_with("tip:") => parts.push(format!("({tip})")),
            _ => parts.push(line.to_string()),
        }
    }
    parts.join(" ")
}

/// Refuses a stdout that is a file the command reads
/// (`sleuth_store::outfile::refuse_stdout_input`), before it reads or
/// writes anything: `export --db t.db >> t.db` appended the export to the
/// trace, `stats --db t.db 1<> t.db` left it no database (round 51). The
/// inputs are [`input_paths`].
fn refuse_stdout_input(matches: &clap::ArgMatches) -> anyhow::Result<()> {
    Ok(sleuth_store::outfile::refuse_stdout_input(&input_paths(
        matches,
    ))?)
}

/// Ends the command, before it reads or writes anything, when stderr is a
/// file it reads (`stats --db t.db 2>> t.db`: its notes and errors would be
/// appended to the trace; round 51's tester). The error cannot go where
/// errors go: stderr is pointed at /dev/null (nothing more reaches the
/// trace, a panic included) and the one line is said on stdout, unless
/// stdout is an input too.
fn refuse_stderr_input(matches: &clap::ArgMatches) {
    use std::os::fd::AsFd as _;
    let inputs = input_paths(matches);
    let Some(path) = sleuth_store::outfile::input_behind(std::io::stderr().as_fd(), &inputs) else {
        return;
    };
    silence_stderr();
    if sleuth_store::outfile::input_behind(std::io::stdout().as_fd(), &inputs).is_none() {
        let _ = load::emit(&format!(
            "gpusleuth: error: {}: is also this command's stderr (refusing to write notes and \
             errors into a trace it reads: redirect stderr to another file)\n",
            term_text::terminal_safe(&path.display().to_string())
        ));
    }
    std::process::exit(1);
}

/// Points stderr at /dev/null.
fn silence_stderr() {
    if let Ok(null) = std::fs::OpenOptions::new().write(true).open("/dev/null") {
        use std::os::fd::AsRawFd as _;
        // SAFETY: dup2 onto fd 2 of a file this function holds open; no
        // Rust object owns fd 2 (std's stderr writes to the number).
        unsafe { libc::dup2(null.as_raw_fd(), libc::STDERR_FILENO) };
    }
}

/// The files a command reads, as its arguments name them: `db` of the
/// reading commands (a trace, a run's directory, `finish`'s directories of
/// runs), `trace_dir` (the traces `mcp`'s tools may read), `inputs`
/// (`merge`), `src` (`import`); `trace`'s `--db` is what it writes, and
/// `import`'s too.
fn input_paths(matches: &clap::ArgMatches) -> Vec<&std::path::Path> {
    let Some((name, sub)) = matches.subcommand() else {
        return Vec::new();
    };
    let ids: &[&str] = match name {
        "stats" | "explain" | "memory" | "query" | "export" | "report" | "finish" => &["db"],
        "mcp" => &["db", "trace_dir"],
        "merge" => &["inputs"],
        "import" => &["src"],
        _ => &[],
    };
    ids.iter()
        .filter_map(|id| sub.try_get_many::<std::path::PathBuf>(id).ok().flatten())
        .flatten()
        .map(|p| p.as_path())
        .collect()
}

/// Runs `command`.
fn run(command: Command) -> anyhow::Result<i32> {
    match command {
        Command::Trace(a) => capture::run(a),
        Command::Stats(a) => cmd::stats::run(a),
        Command::Explain(a) => cmd::explain::run(a),
        Command::Memory(a) => cmd::memory::run(a),
        Command::Vram(a) => cmd::vram::run(a),
        Command::Reclaim(a) => cmd::reclaim::run(a),
        Command::Mcp(a) => cmd::mcp::run(a),
        Command::Query(a) => cmd::query::run(a),
        Command::Merge(a) => cmd::merge::run(a),
        Command::Import(a) => cmd::import::run(a),
        Command::Finish(a) => cmd::finish::run(a),
        Command::Check(a) => cmd::check::run(a),
        #[cfg(feature = "sim")]
        Command::Demo(a) => cmd::demo::run(a),
        #[cfg(feature = "sim")]
        Command::Bench(a) => cmd::bench::run(a),
        Command::Export(a) => cmd::export::run(a),
        Command::Report(a) => cmd::report::run(a),
    }
}

/// The error and its causes on one line, each cause once: a store error's
/// message already ends with the SQLite error it wraps, which the chain
/// names again ("X: X" before).
fn error_line(e: &anyhow::Error) -> String {
    let mut msg = String::new();
    let causes: Vec<String> = e.chain().map(|c| c.to_string()).collect();
    for (i, text) in causes.iter().enumerate() {
        // Said already, or a wrapper of a deeper cause already said (a
        // damaged value's message inside SQLite's conversion error).
        let wraps_said = !msg.is_empty()
            && causes[i + 1..].iter().any(|deeper| {
                !deeper.is_empty()
                    && msg.ends_with(deeper.as_str())
                    && text.ends_with(deeper.as_str())
            });
        if msg.ends_with(text.as_str()) || wraps_said {
            continue;
        }
        if !msg.is_empty() {
            msg.push_str(": ");
        }
        msg.push_str(text);
    }
    msg.replace(['\n', '\r'], " ")
}

#[cfg(test)]
mod error_line_tests {
    use super::error_line;

    #[test]
    fn a_damaged_value_is_said_once_without_sqlites_conversion_words() {
        let damaged = sleuth_store::StoreError::Sqlite {
            path: "t.db".into(),
            source: rusqlite::Error::FromSqlConversionFailure(
                0,
                rusqlite::types::Type::Integer,
                "damaged trace: allocator_events holds a word that is no integer".into(),
            ),
        };
        assert_eq!(
            error_line(&anyhow::Error::new(damaged)),
            "t.db: damaged trace: allocator_events holds a word that is no integer"
        );
        // Any other SQLite error keeps rusqlite's words, once.
        let other = sleuth_store::StoreError::Sqlite {
            path: "t.db".into(),
            source: rusqlite::Error::InvalidColumnIndex(3),
        };
        assert_eq!(
            error_line(&anyhow::Error::new(other)),
            "t.db: Invalid column index: 3"
        );
        // Context over a cause: both, in order.
        let e = anyhow::Error::new(std::io::Error::other("no such file")).context("reading x");
        assert_eq!(error_line(&e), "reading x: no such file");
    }
}

#[cfg(test)]
mod memory_statistics_tests {
    use super::{runs_no_callers_sql, Cli};
    use clap::Parser;

    fn of(args: &[&str]) -> bool {
        let cli = Cli::try_parse_from(["gpusleuth"].iter().chain(args)).expect("parses");
        runs_no_callers_sql(&cli.command)
    }

    #[test]
    fn the_commands_that_run_a_callers_sql_keep_sqlites_heap_limit() {
        // The sandbox needs the statistics (it refuses to run without them).
        assert!(!of(&["query", "--db", "t.db", "SELECT 1"]));
        assert!(!of(&["mcp", "--db", "t.db"]));
        // The read commands run only gpusleuth's own SQL.
        for c in ["stats", "explain", "memory", "report", "export"] {
            assert!(of(&[c, "--db", "t.db"]), "{c}");
        }
    }
}

#[cfg(test)]
mod usage_error_tests {
    use super::*;

    /// Clap's error in one line: message, details and tip, no usage block.
    #[test]
    fn an_argument_error_is_one_line() {
        for (args, want) in [
            (
                vec!["gpusleuth", "reclaim"],
                "error: the following required arguments were not provided: <--pid <PID>...|--orphans>",
            ),
            (
                vec!["gpusleuth", "stats", "--bogus"],
                "error: unexpected argument '--bogus' found",
            ),
            (
                vec!["gpusleuth", "nosuch"],
                "error: unrecognized subcommand 'nosuch' (tip: a similar subcommand exists: 'bench')",
            ),
        ] {
            let e = Cli::command().try_get_matches_from(args).unwrap_err();
            let line = one_line_usage_error(&e.render().to_string());
            assert!(line.starts_with(want), "{line}");
            assert!(!line.contains('\n') && !line.contains("Usage:"), "{line}");
        }
    }
}
