//! `--from`/`--to`/`--last`: a part of one trace, named as time since the
//! trace started (as `memory --at` counts it) or as its last part, for
//! `stats`, `explain`, `export` and `report` (`--last` of a run's directory:
//! its newest file, or the files it spans, [`WindowArgs::source_of`]). A long trace (a node agent's, a day of training) is asked
//! about "the last ten minutes" or "the slow phase", not only as a whole;
//! the answers read the window's calls through the `(tid, ts_ns)` index,
//! so their cost grows with the window, not with the trace (issue 16).

use crate::output::fmt_ns;
use sleuth_core::findings::inputs::PinnedState;
use sleuth_store::run_window::RunLast;
use sleuth_store::stream::CallQuery;
use sleuth_store::{CallFilter, Trace};
use std::path::{Path, PathBuf};

/// The options, flattened into each command that takes a window.
#[derive(clap::Args, Clone, Copy, Debug, Default)]
pub struct WindowArgs {
    /// Only what happened from this moment on, as time since the trace
    /// started (as `memory --at` counts it: 1.5s, 250ms, 0). One file,
    /// not a `--rotate` run's directory (there: --last).
    #[arg(long, value_parser = crate::args::duration_ns, allow_hyphen_values = true)]
    pub from: Option<u64>,
    /// Only what happened before this moment (time since the trace started).
    #[arg(long, value_parser = crate::args::duration_ns, allow_hyphen_values = true)]
    pub to: Option<u64>,
    /// Only the last part of the trace (`5m`): up to its end, or for a
    /// trace still being written up to its latest call. A `--rotate` run's
    /// directory: up to its newest file's end, over the files it spans.
    #[arg(long, value_parser = crate::args::duration_ns, allow_hyphen_values = true, conflicts_with_all = ["from", "to"])]
    pub last: Option<u64>,
}

/// A window in monotonic ns, `[since, until)`; `until` is `u64::MAX`
/// without `--to`. `from_ns`/`to_ns` are the options as given (time since
/// the trace started), for the answer's header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Window {
    pub since: u64,
    pub until: u64,
    pub from_ns: u64,
    pub to_ns: Option<u64>,
    /// `--last`, as given.
    pub last_ns: Option<u64>,
    /// `from_ns` counts from the oldest file still kept of a run whose
    /// earlier files `--keep` removed, not from the run's start.
    pub from_kept: bool,
}

impl WindowArgs {
    /// Whether a window was asked for.
    pub fn is_set(&self) -> bool {
        self.from.is_some() || self.to.is_some() || self.last.is_some()
    }

    /// [`Self::resolve`] in the file a window was read from: for a run's
    /// newest file, `--last`'s offset counts from the run's start, as over
    /// its files (round 59's tester: "168.96ms or more after it began" of
    /// a 2.7-s run, counted from its newest file's start).
    pub fn resolve_in(
        &self,
        trace: &Trace,
        file: Option<&WindowFile>,
    ) -> anyhow::Result<Option<Window>> {
        let w = self.resolve(trace)?;
        Ok(match (w, file.and_then(|f| f.run_start)) {
            (Some(mut w), Some(run_start)) if w.last_ns.is_some() => {
                w.from_ns = w.since.saturating_sub(run_start);
                w.from_kept = file.is_some_and(|f| f.run_pruned);
                Some(w)
            }
            (w, _) => w,
        })
    }

    /// The window the options name in `trace`, or None for the whole
    /// trace. Errors (one line each): an empty window, a start past the
    /// end of a finished trace.
    pub fn resolve(&self, trace: &Trace) -> anyhow::Result<Option<Window>> {
        if !self.is_set() {
            return Ok(None);
        }
        if let Some(last) = self.last {
            return last_part(trace, last).map(Some);
        }
        let from = self.from.unwrap_or(0);
        if let Some(to) = self.to {
            if to <= from {
                match self.from {
                    Some(_) => anyhow::bail!(
                        "--to {} is not after --from {}: the window would be empty",
                        fmt_ns(to),
                        fmt_ns(from)
                    ),
                    None => anyhow::bail!(
                        "--to {}: the window from the trace's start would be empty",
                        fmt_ns(to)
                    ),
                }
            }
        }
        let session = trace.session()?;
        let start = session.info.start_mono_ns;
        if let Some(end) = session.end_mono_ns {
            let lasts = end.saturating_sub(start);
            if from > lasts {
                // In whole ns where the rounded figures would read the same.
                let (f, l) = match fmt_ns(from) == fmt_ns(lasts) {
                    true => (format!("{from}ns"), format!("{lasts}ns")),
                    false => (fmt_ns(from), fmt_ns(lasts)),
                };
                anyhow::bail!(
                    "--from {f}: the trace lasts only {l} (--from is the time since the trace started)"
                );
            }
        }
        Ok(Some(Window {
            since: start.saturating_add(from),
            until: self.to.map_or(u64::MAX, |t| start.saturating_add(t)),
            from_ns: from,
            to_ns: self.to,
            last_ns: None,
            from_kept: false,
        }))
    }

    /// Where a window of `db` is read from: `db` itself, or for a run's
    /// directory (`trace --rotate`) with `--last D` its newest file when
    /// that file holds the whole window (said on stderr), else the files
    /// the window spans (named on stderr). One-line error: `--from`/`--to`
    /// on a directory (they count from one file's start). `allocator_views`:
    /// the answer shows PyTorch allocator views (of process `pid`), which a
    /// window in the newest file replays from the run's oldest file: then
    /// it is read as a window over the run even when it lies in one file
    /// (`RunLast::views_need_earlier_files`).
    pub fn source_of(
        &self,
        db: &Path,
        allocator_views: Option<Option<u32>>,
    ) -> anyhow::Result<WindowSource> {
        if !db.is_dir() {
            return Ok(WindowSource::File(WindowFile {
                path: db.to_path_buf(),
                run: None,
                run_start: None,
                run_pruned: false,
                note: None,
            }));
        }
        let Some(last) = self.last else {
            anyhow::bail!(
                "--from/--to count from the start of one trace file; --db names a run's directory (pick the part-*.db file that holds the window, or use --last D for the run's latest part)"
            );
        };
        if last == 0 {
            anyhow::bail!("--last 0: the window would be empty (give a duration such as 5m)");
        }
        let run = sleuth_store::run_window::last_of_run(
            db,
            last,
            &crate::checks_memo::budget(),
            crate::checks_memo::memo(),
        )?;
        let memo = crate::checks_memo::memo();
        let whole_run = match allocator_views {
            Some(pid) => run.views_need_earlier_files(pid, memo)?,
            None => false,
        };
        if let ([(number, newest)], false) = (run.files.as_slice(), whole_run) {
            let note = format!(
                "gpusleuth: --last {} of the run in {}: read from its newest file, {}",
                fmt_ns(last),
                db.display(),
                name_of(newest)
            );
            return Ok(WindowSource::File(WindowFile {
                path: newest.clone(),
                run: Some((db.to_path_buf(), *number)),
                run_start: Some(run.run_start),
                run_pruned: run.oldest_kept > 1,
                note: Some(note),
            }));
        }
        let note = match whole_run {
            true => format!(
                "gpusleuth: --last {} of the run in {}: read from its newest file, {}, its allocator views \
                 replayed from the run's oldest file",
                fmt_ns(last),
                db.display(),
                files_named(&run)
            ),
            false => format!(
                "gpusleuth: --last {} of the run in {}: read from the {} files it spans, {}",
                fmt_ns(last),
                db.display(),
                run.files.len(),
                files_named(&run)
            ),
        };
        Ok(WindowSource::Run(run, note))
    }
}

/// Where a window is read from ([`WindowArgs::source_of`]).
pub enum WindowSource {
    File(WindowFile),
    /// Several files of a run (`--last` of its directory), and the stderr
    /// line naming them, said once the answer is made (a failure stays
    /// one line).
    Run(RunLast, String),
}

/// "part-000003.db to part-000005.db" (or the one file's name).
pub fn files_named(run: &RunLast) -> String {
    let paths: Vec<PathBuf> = run.files.iter().map(|(_, p)| p.clone()).collect();
    sleuth_store::run::first_to_last(&sleuth_store::run::file_names(&paths))
}

/// The trace file a window is read from ([`WindowArgs::source_of`]).
pub struct WindowFile {
    pub path: PathBuf,
    /// For a run's newest file: the run's directory and the file's number.
    pub run: Option<(PathBuf, u64)>,
    /// For a run's newest file: the run's start (`RunLast::run_start`),
    /// where `--last`'s offset counts from ([`WindowArgs::resolve_in`]).
    pub run_start: Option<u64>,
    /// Whether that start is the oldest kept file's, `--keep` having
    /// removed the run's earlier files.
    pub run_pruned: bool,
    /// For a run's newest file: the stderr line naming it, said once the
    /// answer is made ([`Self::say`]), so that a failure stays one line.
    pub note: Option<String>,
}

impl WindowFile {
    /// For a run's newest file, a window's `memory_growth` checked against
    /// the run's ledger, not the file's alone
    /// (`sleuth_store::window_growth::settle_over_run`).
    pub fn settle_growth(
        &self,
        since: u64,
        e: &mut sleuth_core::findings::Explanation,
    ) -> anyhow::Result<()> {
        if let Some((dir, _)) = &self.run {
            sleuth_store::window_growth::settle_over_run(
                dir,
                since,
                &crate::checks_memo::budget(),
                crate::checks_memo::memo(),
                e,
            )?;
        }
        Ok(())
    }

    /// Says which file of a run answered (nothing for a file of its own).
    pub fn say(&self) {
        if let Some(n) = &self.note {
            eprintln!("{n}");
        }
    }

    /// The host memory process `pid` (or each) had pinned when the file
    /// began: what a run's earlier files left pinned (stored by the
    /// previous file, or their pinning calls replayed); for a run's file
    /// given by its path, what its previous file beside it stored, if it
    /// did; nothing for a file of its own. `trace` is the file, open. A
    /// window's copies are judged against it.
    pub fn pinned_earlier(&self, trace: &Trace, pid: Option<u32>) -> anyhow::Result<PinnedState> {
        let memo = crate::checks_memo::memo();
        Ok(match &self.run {
            Some((dir, n)) => {
                sleuth_store::run::pinned_when_file_began(dir, *n, pid, trace.budget(), memo)?
            }
            None => sleuth_store::run::pinned_before_file(trace, pid)?.unwrap_or_default(),
        })
    }
}

/// A file's name for a message.
pub(crate) fn name_of(path: &Path) -> String {
    sleuth_store::run::file_name(path)
}

/// `--last D`: from D before the trace's end (its session end, or for a
/// trace still being written its latest call's) to the end, open-ended.
fn last_part(trace: &Trace, last: u64) -> anyhow::Result<Window> {
    if last == 0 {
        anyhow::bail!("--last 0: the window would be empty (give a duration such as 5m)");
    }
    let (start, since) = trace.start_and_since_last(last)?;
    Ok(Window {
        since,
        until: u64::MAX,
        from_ns: since - start,
        to_ns: None,
        last_ns: Some(last),
        from_kept: false,
    })
}

impl Window {
    /// The window `--last D` names over a run's files: from D before the
    /// newest file's end, counted from the start of the run's oldest file
    /// still in its directory.
    pub fn of_run(run: &RunLast, last: u64) -> Window {
        Window {
            since: run.since,
            until: u64::MAX,
            from_ns: run.since.saturating_sub(run.run_start),
            to_ns: None,
            last_ns: Some(last),
            from_kept: run.oldest_kept > 1,
        }
    }

    /// Whether `ts_ns` is inside window `w` (every moment is, without one).
    pub fn covers(w: Option<Window>, ts_ns: u64) -> bool {
        w.is_none_or(|w| (w.since..w.until).contains(&ts_ns))
    }

    /// The end bound for a store filter: None when open-ended.
    pub fn until_ns(&self) -> Option<u64> {
        (self.until != u64::MAX).then_some(self.until)
    }

    /// The calls of process `pid` (or all) that start in window `w` (or
    /// all), as a streamed read.
    pub fn calls(w: Option<Window>, pid: Option<u32>) -> CallQuery {
        CallQuery {
            pid,
            since_ns: w.map(|w| w.since),
            until_ns: w.and_then(|w| w.until_ns()),
            ..Default::default()
        }
    }

    /// The calls of process `pid` (or all) that start in the window, as a
    /// filter of the loading and explaining reads.
    pub fn filter(&self, pid: Option<u32>) -> CallFilter {
        CallFilter {
            pid,
            since_ns: Some(self.since),
            until_ns: self.until_ns(),
            ..Default::default()
        }
    }

    /// "calls that started from 10.0s to 20.0s after the trace began",
    /// the header line of a windowed answer.
    pub fn describe(&self) -> String {
        if let Some(last) = self.last_ns {
            // A run whose first files `--keep` removed: "after it began"
            // read as after the run's start (round 60's tester).
            let after = match self.from_kept {
                true => "the run's oldest file still kept began (--last; --keep removed its earlier files)",
                false => "it began (--last)",
            };
            return format!(
                "Window: the calls that started in the last {} of the trace, {} or more after {after}",
                fmt_ns(last),
                fmt_ns(self.from_ns)
            );
        }
        match self.to_ns {
            Some(to) => format!(
                "Window: the calls that started from {} to {} after the trace began (--from/--to)",
                fmt_ns(self.from_ns),
                fmt_ns(to)
            ),
            None => format!(
                "Window: the calls that started {} or more after the trace began (--from)",
                fmt_ns(self.from_ns)
            ),
        }
    }

    /// The window in a JSON answer: the options as ns since the trace
    /// started, and the monotonic bounds the store was read with.
    pub fn json(&self) -> serde_json::Value {
        serde_json::json!({
            "from_ns": self.from_ns,
            "to_ns": self.to_ns,
            "last_ns": self.last_ns,
            "since_mono_ns": self.since,
            "until_mono_ns": self.until_ns(),
        })
    }
}
