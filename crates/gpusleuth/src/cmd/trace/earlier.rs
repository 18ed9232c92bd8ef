//! `trace --finish-killed`: the files earlier tracers left unfinished
//! beside this trace's output (a service or pod restarted after its tracer
//! was SIGKILLed, OOM-killed or lost with its node) completed on a helper
//! thread while this trace records, as `gpusleuth finish` of the output's
//! directory would (`crate::finishing`). Started once the probes are
//! attached, so it never delays the capture's start.

use super::*;
use crate::finishing::{Finisher, Said, Tally};
use std::thread::JoinHandle;

/// What the helper thread did: its tally and what it said, in order.
pub(super) struct Outcome {
    pub(super) tally: Tally,
    pub(super) said: Vec<Said>,
}

/// The helper thread finishing the earlier tracers' files.
pub(super) struct EarlierFiles {
    dir: PathBuf,
    thread: Option<JoinHandle<Outcome>>,
}

impl EarlierFiles {
    /// Starts finishing the files beside `out` (this trace's file or run
    /// directory, left out): the runs and trace files of its directory.
    /// Why, when its thread cannot start.
    pub(super) fn start(out: &Path) -> Result<EarlierFiles, String> {
        let dir = match out.parent() {
            Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
            _ => PathBuf::from("."),
        };
        // Its full name: the notes are read later, from elsewhere.
        let dir = std::fs::canonicalize(&dir).unwrap_or(dir);
        let (own, scan) = (out.to_path_buf(), dir.clone());
        let thread = std::thread::Builder::new()
            .name("gpusleuth-fin".into())
            .spawn(move || {
                // A helper: below the traced threads, placed with the others.
                sleuth_probe::placement::lower_this_thread();
                finish_beside(&scan, &own)
            })
            .map_err(|e| format!("--finish-killed: cannot start its thread ({e})"))?;
        Ok(EarlierFiles {
            dir,
            thread: Some(thread),
        })
    }

    /// Whether it is still finishing files: a rotation waits for it, as for
    /// the previous file's completion (one completion at a time bounds the
    /// tracer's memory).
    pub(super) fn busy(&self) -> bool {
        self.thread.as_ref().is_some_and(|t| !t.is_finished())
    }

    /// Its outcome once it is done (once): what it did, as notes.
    pub(super) fn take_done(&mut self) -> Option<Vec<(NoteLevel, String)>> {
        if self.busy() {
            return None;
        }
        let outcome = self.thread.take()?.join().unwrap_or_else(|_| Outcome {
            tally: Tally {
                failed: 1,
                ..Tally::default()
            },
            said: vec![Said::Error("its thread panicked".into())],
        });
        Some(notes(&self.dir, &outcome))
    }

    /// The note of a trace that ended while it still ran: what it had not
    /// committed is rolled back (each file is finished in one transaction),
    /// and the next start or `gpusleuth finish` completes those files.
    pub(super) fn unfinished_note(&self) -> Option<String> {
        self.busy().then(|| {
            format!(
                "--finish-killed: the earlier tracers' files in {} were still being finished when this trace ended: \
                 what was not done is left as it was (the next `trace --finish-killed` there, or `gpusleuth finish --db`, completes it)",
                self.dir.display()
            )
        })
    }
}

/// Finishes what earlier tracers left in `dir`, `own` left out.
fn finish_beside(dir: &Path, own: &Path) -> Outcome {
    let mut said = Vec::new();
    let mut say = |s: Said| said.push(s);
    // The readers' checks, but not the user's checks cache: this tracer's
    // cache (a service's, a pod's) is not the one its readers use.
    let mut finisher = Finisher::new(sleuth_store::Trace::open, &mut say);
    let result = finisher
        .skip(own)
        .and_then(|()| finisher.finish_under(dir).map(|_| ()));
    let mut tally = finisher.tally;
    if let Err(e) = result {
        tally.failed += 1;
        said.push(Said::Error(format!("{e:#}")));
    }
    Outcome { tally, said }
}

/// The notes this trace stores about it: each file finished or failed,
/// and the summary; nothing when there was nothing to do.
fn notes(dir: &Path, o: &Outcome) -> Vec<(NoteLevel, String)> {
    let t = &o.tally;
    if t.finished == 0 && t.failed == 0 && t.removed == 0 {
        return Vec::new();
    }
    // Each file finished or failed; the others are in the summary's counts.
    let mut notes: Vec<(NoteLevel, String)> = o
        .said
        .iter()
        .filter_map(|s| match s {
            Said::Finished(line) => Some((NoteLevel::Info, line)),
            Said::Error(line) => Some((NoteLevel::Warn, line)),
            Said::Info(_) => None,
        })
        .map(|(level, line)| (level, format!("--finish-killed: {line}")))
        .collect();
    let level = if t.failed > 0 {
        NoteLevel::Warn
    } else {
        NoteLevel::Info
    };
    notes.push((
        level,
        format!(
            "--finish-killed: the files earlier tracers left unfinished in {}: {}",
            dir.display(),
            t.summary()
        ),
    ));
    notes
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn it_says_what_it_finished_and_that_a_trace_ended_before_it_did() {
        let (go, wait) = std::sync::mpsc::channel::<()>();
        let mut e = EarlierFiles {
            dir: PathBuf::from("/var/lib/gpusleuth"),
            thread: Some(std::thread::spawn(move || {
                let _ = wait.recv();
                Outcome {
                    tally: Tally {
                        finished: 1,
                        complete: 8,
                        ..Tally::default()
                    },
                    said: vec![
                        Said::Finished(
                            "/x/part-000009.db: finished (600 calls, 0 culprit rows) in 0.1 s"
                                .into(),
                        ),
                        Said::Info("/x/part-000008.db: already complete".into()),
                    ],
                }
            })),
        };
        // Still running: a rotation waits, and a trace ending now says so.
        assert!(e.busy());
        assert!(e.take_done().is_none());
        let note = e.unfinished_note().expect("busy");
        assert!(
            note.contains("were still being finished when this trace ended"),
            "{note}"
        );
        go.send(()).unwrap();
        while e.busy() {
            std::thread::sleep(Duration::from_millis(1));
        }
        assert!(e.unfinished_note().is_none());
        let said = e.take_done().expect("done");
        assert_eq!(
            said,
            vec![
                (NoteLevel::Info, "--finish-killed: /x/part-000009.db: finished (600 calls, 0 culprit rows) in 0.1 s".to_string()),
                (NoteLevel::Info, "--finish-killed: the files earlier tracers left unfinished in /var/lib/gpusleuth: 1 finished, 8 already complete, 0 in use (left as they are), 0 failed".to_string()),
            ]
        );
        // Said once.
        assert!(e.take_done().is_none());
        // Nothing to do: nothing said.
        let quiet = Outcome {
            tally: Tally {
                complete: 3,
                ..Tally::default()
            },
            said: Vec::new(),
        };
        assert!(notes(Path::new("/d"), &quiet).is_empty());
    }
}
