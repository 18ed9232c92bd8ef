//! The tracer checks the files it finished, so that the first command on
//! one finds its checks paid.
//!
//! Every reader checks a trace before trusting it (`sleuth_store::checked`):
//! on a 10M-call file that is ~3.5 s of a first command, paid once per file
//! since the checks cache (round 9) keeps what passed. The tracer knows when
//! a file is complete, so it runs those same checks (`CheckMemo::check_ahead`,
//! on this run's memo of the user's cache: `checks_memo`) and saves what
//! passed, as its first reader would have. The reader's rules hold
//! unchanged: the cache is the one of the user running the tracer, and a
//! file is remembered only once it has been left alone for 2 s (the settled
//! rule: a write in the same tick of the file clock as the last one would
//! keep every time equal), so each check first waits for that.
//!
//! Only files of at least `trace --precheck SIZE` (default [`DEFAULT_MIN`])
//! are checked, because prechecking adds the 2 s settling wait (and the
//! checks) to the end of the trace, and what it saves the first command is
//! the checks alone: under 32 MiB they cost that command 0.7 s or less
//! (measured: 0.25 s at 19 MB, 0.7–0.8 s at 33 MB; the test suite's traces,
//! milliseconds), above it more (1.5 s at 64 MB, checked whole at open;
//! ~4 s at 1 GB; docs/benchmarks.md, round 10). `--precheck off`, or a
//! cache turned off (`GPUSLEUTH_CACHE_DIR=`, where nothing could be saved),
//! checks nothing.
//!
//! A rotated file is checked whatever its size (`Queue::send_rotated`): a
//! run's readers open every file of it, so the checks of a run of small
//! files add up (59 files of 12 MB: 10 s of a first `report --last 30s`,
//! round 38), and that check runs while the trace goes on. One under the
//! threshold still waiting when the trace ends is skipped: the end waits
//! only for files of the threshold.
//!
//! The checks run on one helper thread, `gpusleuth-check`: placed and
//! lowered like the tracer's other helpers (`sleuth_probe::placement` finds
//! it by its name), fed the rotated files as each is completed (so the next
//! file's recording never waits for a check) and the last file at the end of
//! the trace, which then waits for it; an interrupt ends the wait and the
//! check at once (the file is already complete). A failed check is a
//! one-line warning: nothing is remembered, the file stays as written.

use sleuth_store::{CheckMemo, ReadBudget, DEFAULT_READ_TIMEOUT};
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// The smallest file checked by default (`--precheck`): see the module's
/// documentation.
pub const DEFAULT_MIN: &str = "32M";

/// `--precheck`: the smallest file checked; None: off.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MinBytes(pub Option<u64>);

impl Default for MinBytes {
    fn default() -> Self {
        MinBytes(Some(32 << 20))
    }
}

/// `--precheck`: a size (`0`: every file), or `off`.
pub fn parse_min(s: &str) -> Result<MinBytes, String> {
    match s {
        "off" => Ok(MinBytes(None)),
        "0" => Ok(MinBytes(Some(0))),
        _ => crate::args::size(s).map(|b| MinBytes(Some(b))),
    }
}

/// How often a wait looks at the cancellation.
const NAP: Duration = Duration::from_millis(20);

/// What became of one file.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    /// Checked and saved: how long the settling wait and the checks took,
    /// and the checking thread's CPU.
    Saved {
        waited: Duration,
        checked: Duration,
        cpu: Duration,
    },
    /// Written again while waiting (by someone else: the tracer is done
    /// with it), or gone (`--keep` deleted it): nothing to remember.
    Skipped,
    /// Interrupted: nothing remembered, a reader checks it.
    Cancelled,
    /// A check failed (the file as it stands would be refused by a reader).
    Failed(String),
}

/// Waits until the file at `path` has settled, then checks it ahead through
/// `memo`, within `cancel` (cancelling it stops the wait and the reads).
pub fn check(memo: &CheckMemo, path: &Path, cancel: &ReadBudget) -> Outcome {
    let t0 = Instant::now();
    loop {
        if cancel.is_stopped() {
            return Outcome::Cancelled;
        }
        match memo.settles_in(path) {
            None => return Outcome::Skipped,
            Some(Duration::ZERO) => break,
            Some(d) => std::thread::sleep(d.min(NAP)),
        }
    }
    let waited = t0.elapsed();
    let cpu0 = thread_cpu();
    let t1 = Instant::now();
    let r = memo.check_ahead(path, cancel.narrowed(DEFAULT_READ_TIMEOUT));
    match r {
        Ok(true) => Outcome::Saved {
            waited,
            checked: t1.elapsed(),
            cpu: thread_cpu().saturating_sub(cpu0),
        },
        // Written in the moment between the wait and the check.
        Ok(false) => Outcome::Skipped,
        Err(_) if cancel.is_stopped() => Outcome::Cancelled,
        // Deleted while being checked (`--keep`): not a damaged file.
        Err(_) if !path.exists() => Outcome::Skipped,
        Err(e) => Outcome::Failed(e.to_string().replace(['\n', '\r'], " ")),
    }
}

/// CPU time of the calling thread (the checks run on one thread: SQLite
/// reads on the caller's).
fn thread_cpu() -> Duration {
    // SAFETY: an all-zero rusage is a valid value to be overwritten.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: RUSAGE_THREAD with a pointer to a live local.
    if unsafe { libc::getrusage(libc::RUSAGE_THREAD, &mut ru) } != 0 {
        return Duration::ZERO;
    }
    let tv = |t: libc::timeval| {
        Duration::from_secs(t.tv_sec as u64) + Duration::from_micros(t.tv_usec as u64)
    };
    tv(ru.ru_utime) + tv(ru.ru_stime)
}

/// The one-line warning of a failed check.
pub fn failed_line(path: &Path, why: &str) -> String {
    crate::term_text::terminal_safe(&format!(
        "gpusleuth: warning: {} did not pass the checks a reader makes ({why}); nothing was remembered, the file is kept as written",
        path.display()
    ))
    .into_owned()
}

/// A file to check.
struct Item {
    path: PathBuf,
    /// Checked only while the trace runs: skipped once it ends (a rotated
    /// file under the threshold; the end never waits for one).
    while_tracing: bool,
}

/// Sends finished files to the checking thread (cheap to clone: the
/// rotation's completing thread holds one).
#[derive(Clone)]
pub struct Queue {
    /// None: the end (sent by [`Prechecker::finish`] only).
    tx: mpsc::Sender<Option<Item>>,
    min_bytes: u64,
}

impl Queue {
    /// Queues the file at `path` if it is large enough; whether it was.
    pub fn send(&self, path: &Path) -> bool {
        self.is_large(path) && self.queue(path, false)
    }

    /// Queues a file a rotation completed, whatever its size: a run's
    /// readers open every file of it (59 files of 12 MB cost a first
    /// `report --last 30s` 10 s of checks, round 38), and the check runs
    /// while the trace goes on. One under the threshold is skipped if the
    /// trace ends first (the end waits only for files of the threshold).
    pub fn send_rotated(&self, path: &Path) -> bool {
        let large = self.is_large(path);
        self.queue(path, !large)
    }

    fn is_large(&self, path: &Path) -> bool {
        std::fs::metadata(path).is_ok_and(|m| m.len() >= self.min_bytes)
    }

    fn queue(&self, path: &Path, while_tracing: bool) -> bool {
        let item = Item {
            path: path.to_path_buf(),
            while_tracing,
        };
        self.tx.send(Some(item)).is_ok()
    }
}

/// Outcomes kept for [`Prechecker::finish`]: the end of a trace reports
/// the last file's, and at most two files are pending then (the last one
/// and the one completed before it), so a long run keeps no more.
const OUTCOMES_KEPT: usize = 16;

/// The checking thread of one trace.
pub struct Prechecker {
    queue: Queue,
    /// Cancelling it stops the thread's wait and reads.
    cancel: ReadBudget,
    /// Cancelled when the trace ends: stops the files checked only while
    /// it runs.
    ending: ReadBudget,
    thread: JoinHandle<()>,
    /// The latest files' outcomes, in order.
    done: Arc<Mutex<Vec<(PathBuf, Outcome)>>>,
}

impl Prechecker {
    /// The thread, started; None when prechecking is off (`min_bytes` None,
    /// or no cache to save into) or no thread could be started.
    pub fn start(min_bytes: MinBytes, memo: &'static CheckMemo) -> Option<Prechecker> {
        let min_bytes = min_bytes.0.filter(|_| memo.saves())?;
        let (tx, rx) = mpsc::channel::<Option<Item>>();
        // The whole run's cancellations (no deadline of their own): each
        // check narrows one to its own deadline.
        let unbounded = || ReadBudget::new(Duration::from_secs(100 * 365 * 86_400));
        let (cancel, ending) = (unbounded(), unbounded());
        let done: Arc<Mutex<Vec<(PathBuf, Outcome)>>> = Arc::default();
        let (c, e, d) = (cancel.clone(), ending.clone(), done.clone());
        let thread = std::thread::Builder::new()
            .name("gpusleuth-check".into())
            .spawn(move || {
                sleuth_probe::placement::lower_this_thread();
                // Until the end is sent: files queued before it are checked
                // first (in order), a clone of the queue still held elsewhere
                // keeps nothing waiting.
                while let Ok(Some(Item {
                    path,
                    while_tracing,
                })) = rx.recv()
                {
                    let outcome = check(memo, &path, if while_tracing { &e } else { &c });
                    if let Outcome::Failed(why) = &outcome {
                        eprintln!("{}", failed_line(&path, why));
                    }
                    let mut d = d.lock().unwrap_or_else(|e| e.into_inner());
                    if d.len() >= OUTCOMES_KEPT {
                        d.remove(0);
                    }
                    d.push((path, outcome));
                }
            })
            .ok()?;
        Some(Prechecker {
            queue: Queue { tx, min_bytes },
            cancel,
            ending,
            thread,
            done,
        })
    }

    pub fn queue(&self) -> Queue {
        self.queue.clone()
    }

    /// Waits until every queued file is checked, or until `interrupted`
    /// says to stop (then the check under way ends within a few ms).
    /// Returns each file's outcome.
    pub fn finish(self, interrupted: impl Fn() -> bool) -> Vec<(PathBuf, Outcome)> {
        let Prechecker {
            queue,
            cancel,
            ending,
            thread,
            done,
        } = self;
        ending.cancel();
        let _ = queue.tx.send(None);
        while !thread.is_finished() {
            if interrupted() {
                cancel.cancel();
            }
            std::thread::sleep(NAP);
        }
        let _ = thread.join();
        let out = std::mem::take(&mut *done.lock().unwrap_or_else(|e| e.into_inner()));
        out
    }
}

/// The line the end of a trace prints for the file it waited for.
pub fn outcome_line(path: &Path, outcome: &Outcome) -> Option<String> {
    let s = |d: &Duration| format!("{:.1} s", d.as_secs_f64());
    let text = match outcome {
        Outcome::Saved {
            waited,
            checked,
            cpu,
        } => format!(
            "gpusleuth: checked {} for later reads: {} waiting for the file to settle, {} checking ({} CPU); the first command on it skips these checks",
            path.display(),
            s(waited),
            s(checked),
            s(cpu)
        ),
        Outcome::Cancelled => format!(
            "gpusleuth: the check of {} for later reads was interrupted; the trace is complete (its first reader checks it)",
            path.display()
        ),
        Outcome::Skipped | Outcome::Failed(_) => return None,
    };
    Some(crate::term_text::terminal_safe(&text).into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_threshold_is_a_size_or_off() {
        assert_eq!(parse_min("off"), Ok(MinBytes(None)));
        assert_eq!(parse_min("0"), Ok(MinBytes(Some(0))));
        assert_eq!(parse_min(DEFAULT_MIN), Ok(MinBytes::default()));
        assert!(parse_min("soon").is_err());
    }

    /// A cancelled check stops waiting at once, and a file that is gone is
    /// skipped without a warning (`--keep` deleted it).
    #[test]
    fn a_cancelled_or_vanished_file_is_not_checked() {
        let dir = std::env::temp_dir().join(format!("gs-precheck-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("dir");
        let f = dir.join("t.db");
        std::fs::write(&f, b"just written").expect("write");
        let memo = CheckMemo::new();
        let cancel = ReadBudget::new(Duration::from_secs(60));
        cancel.cancel();
        let t = Instant::now();
        assert_eq!(check(&memo, &f, &cancel), Outcome::Cancelled);
        assert!(t.elapsed() < Duration::from_millis(500));
        let live = ReadBudget::new(Duration::from_secs(60));
        assert_eq!(check(&memo, &dir.join("gone.db"), &live), Outcome::Skipped);
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// A file the reader's checks refuse is a failure with the reason (for
    /// the one-line warning), once the file has settled.
    #[test]
    fn a_damaged_file_fails_its_check() {
        let dir = std::env::temp_dir().join(format!("gs-precheck-bad-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("dir");
        let f = dir.join("t.db");
        let mut bytes = std::fs::read(
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/h200-contention.db"),
        )
        .expect("example");
        // Pages 3 and 4 overwritten: the header still says SQLite.
        bytes[8192..16384].fill(0xA5);
        std::fs::write(&f, bytes).expect("write");
        let memo = CheckMemo::new();
        let budget = ReadBudget::new(Duration::from_secs(60));
        let Outcome::Failed(why) = check(&memo, &f, &budget) else {
            panic!("a damaged file passed");
        };
        let line = failed_line(&f, &why);
        assert!(
            line.starts_with("gpusleuth: warning: ") && !line.contains('\n'),
            "{line}"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }
}
