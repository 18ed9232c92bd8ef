//! `trace --rotate`: a run of files, each completed on its own thread while
//! the next records, the oldest pruned past `--keep`.

use super::*;

/// `--rotate`: the run being written and when its next file starts.
///
/// A record goes to the file open when the draining thread takes it from
/// the ring buffer, so every call and wait is in exactly one file; a call
/// open across a rotation is recorded at its return, in the later file,
/// with its real start (before that file's `start_mono_ns`).
pub(super) struct Rotation {
    pub(super) dir: PathBuf,
    pub(super) every: Duration,
    pub(super) keep: Option<u64>,
    /// Number of the file being written.
    pub(super) n: u64,
    pub(super) next_at: Instant,
    /// The session row every file starts from (its start time replaced).
    pub(super) info: SessionInfo,
    pub(super) opts: WriterOptions,
    pub(super) stored: Stored,
    /// The previous file being completed (rollups, checkpoint) off the draining thread.
    pub(super) finishing: Option<std::thread::JoinHandle<Result<WriteSummary, String>>>,
    /// What the finished files stored.
    pub(super) totals: WriteSummary,
    /// Where completed files go to be checked for later reads (`--precheck`).
    pub(super) precheck: Option<crate::precheck::Queue>,
    /// The next file waited, past its time, for `--finish-killed` to
    /// complete earlier tracers' files (said in the late note).
    pub(super) held_by_earlier: bool,
}

impl Rotation {
    /// Whether the next file starts now: its time has come and the previous
    /// file is complete. One completion at a time bounds the tracer's
    /// memory, and waiting for one on the draining thread stalled it (the
    /// ring buffer filled): while the previous file is still being completed
    /// the current one keeps recording, and the next starts once it is done.
    /// `finishing_earlier`: `--finish-killed` is completing files of
    /// earlier tracers, which counts as a completion.
    pub(super) fn due(&mut self, now: Instant, finishing_earlier: bool) -> bool {
        if finishing_earlier && now >= self.next_at {
            self.held_by_earlier = true;
        }
        let completing =
            finishing_earlier || self.finishing.as_ref().is_some_and(|t| !t.is_finished());
        rotation_due(now, self.next_at, completing)
    }

    /// Ends the current file and continues in the next one. If the next
    /// file cannot be created (disk full, directory gone), recording goes on
    /// in the current one, with a warning, and the next period tries again.
    pub(super) fn rotate(
        &mut self,
        writer: &mut TraceWriter,
        handle: &mut WriterHandle,
        session: &mut CaptureSession,
        sinks: &mut Sinks,
        sampler: Option<&GpuSampler>,
    ) {
        // What was taken before now belongs to the current file.
        sinks.flush_events();
        let late = Instant::now().saturating_duration_since(self.next_at);
        // Never a burst of rotations after a stall: the next one is a period from now.
        self.next_at = Instant::now() + self.every;
        let now = monotonic_ns();
        let path = self.dir.join(sleuth_store::run::part_name(self.n + 1));
        let info = SessionInfo {
            started_unix_ns: realtime_ns(),
            start_mono_ns: now,
            ..self.info.clone()
        };
        let opts = WriterOptions {
            run: self.opts.run.as_ref().map(|r| r.for_file(self.n + 1)),
            ..self.opts.clone()
        };
        let next = match TraceWriter::create(&path, info, opts) {
            Ok(w) => w,
            Err(e) => {
                sinks.note(
                    NoteLevel::Warn,
                    format!(
                        "--rotate: cannot start {} ({e}); recording continues in {}",
                        path.display(),
                        writer.path().display()
                    ),
                );
                return;
            }
        };
        match store_counters(handle, session, &self.stored) {
            Ok(s) => {
                self.stored = s;
                if sinks.metrics.is_some() {
                    // The metrics' last look at the exited processes'
                    // counts: one that exited since the last 200 ms sample
                    // was never counted there (round 55's tester: 735
                    // launches exported as 626 with `--rotate 1s`).
                    sinks
                        .live
                        .set_kernel_counters(session.losses().counters(), session.op_counts());
                }
                // Stored: the exited processes' final counts have no share
                // in a later file.
                session.forget_exited_counts();
            }
            Err(e) => sinks.check(Err(e)),
        }
        if late >= LATE_NOTE {
            // The previous file's completion (or the earlier tracers' files
            // `--finish-killed` completed) outlasted this file's period.
            let r = handle.add_note(
                NoteLevel::Info,
                late_note(self.n, late, self.held_by_earlier),
            );
            sinks.check(r);
        }
        self.held_by_earlier = false;
        let r = handle.set_session_end(now);
        sinks.check(r);
        let new_handle = next.handle();
        let old_writer = std::mem::replace(writer, next);
        let old_handle = std::mem::replace(handle, new_handle.clone());
        sinks.handle = new_handle.clone();
        // Its symbolizer thread still names stacks for the old file.
        let old_stacks = std::mem::take(&mut sinks.stacks);
        if let Some(s) = sampler {
            s.set_handle(new_handle.clone());
        }
        // Sites are sent once per id: sent again, the new file names its calls' sites.
        session.forget_stacks();
        self.n += 1;
        // What makes the new file a trace of its own: libraries and processes.
        for a in session.attached() {
            let r = new_handle.add_library(library_info(a));
            sinks.check(r);
        }
        // Known before the file began: first seen at its start (read at
        // "now", a process that exited while the ring was drained got a
        // start after its exit: round 54's tester).
        for pid in session.known_pids() {
            sinks.process_seen(pid, now);
        }
        let r = new_handle.add_note(
            NoteLevel::Info,
            sleuth_store::run::rotation_note(
                self.n,
                &sleuth_core::units::fmt_ns(
                    u64::try_from(self.every.as_nanos()).unwrap_or(u64::MAX),
                ),
            ),
        );
        sinks.check(r);
        self.join_previous();
        let (dir, keep, current) = (self.dir.clone(), self.keep, self.n);
        let (old_path, precheck) = (old_writer.path().to_path_buf(), self.precheck.clone());
        let complete = move || {
            drop(old_stacks);
            drop(old_handle);
            let r = old_writer.finish().map_err(|e| e.to_string());
            // What the completion freed goes back to the system (below the
            // trim threshold, `tune_malloc`, an arena keeps up to 8 MiB of it).
            sleuth_store::release_freed_heap();
            if let Some(keep) = keep {
                prune(&dir, keep, current);
            }
            // Checked on the checking thread: the next rotation never waits for it.
            if let (Ok(_), Some(q)) = (&r, &precheck) {
                q.send_rotated(&old_path);
            }
            r
        };
        // Completing a file (rollups, checkpoint) takes seconds on a big one:
        // on its own low-priority thread, never on the draining one.
        match std::thread::Builder::new()
            .name("gpusleuth-rot".into())
            .spawn(move || {
                sleuth_probe::placement::lower_this_thread();
                complete()
            }) {
            Ok(t) => self.finishing = Some(t),
            // No thread (out of memory): the old file keeps what its writer
            // committed, without rollups; `stats` over the run says so.
            Err(e) => sinks.note(
                NoteLevel::Warn,
                format!("--rotate: cannot complete the previous file ({e})"),
            ),
        }
    }

    /// Waits for the previous file to be complete and counts what it stored.
    pub(super) fn join_previous(&mut self) {
        if let Some(t) = self.finishing.take() {
            let r = t
                .join()
                .unwrap_or_else(|_| Err("the rotation thread panicked".into()));
            self.add(r);
        }
    }

    fn add(&mut self, r: Result<WriteSummary, String>) {
        match r {
            Ok(s) => {
                let t = &mut self.totals;
                t.calls_stored += s.calls_stored;
                t.waits_stored += s.waits_stored;
                t.proc_events_stored += s.proc_events_stored;
                t.dropped_db_full += s.dropped_db_full;
                t.events_received += s.events_received;
                t.call_culprit_rows += s.call_culprit_rows;
                t.db_bytes += s.db_bytes;
                t.kept_wal |= s.kept_wal;
            }
            Err(e) => {
                eprintln!("gpusleuth: warning: a file of the run could not be completed: {e}")
            }
        }
    }

    /// The run's totals once its last file (`last`) is complete.
    pub(super) fn finish(mut self, last: WriteSummary) -> WriteSummary {
        self.join_previous();
        self.add(Ok(last));
        if let Some(keep) = self.keep {
            prune(&self.dir, keep, self.n);
        }
        self.totals
    }
}

/// [`Rotation::due`]: the time has come and no earlier file is still being completed.
fn rotation_due(now: Instant, next_at: Instant, completing: bool) -> bool {
    now >= next_at && !completing
}

/// A rotation this much past its time says so in the file that recorded longer.
const LATE_NOTE: Duration = Duration::from_secs(1);

/// The note of file `n`, which recorded `late` past its period because file
/// `n - 1` was still being completed, or (`earlier`) `--finish-killed` was
/// completing earlier tracers' files.
fn late_note(n: u64, late: Duration, earlier: bool) -> String {
    let late = sleuth_core::units::fmt_ns(u64::try_from(late.as_nanos()).unwrap_or(u64::MAX));
    match earlier {
        false => format!(
            "file {n} recorded {late} past the period: file {} was still being completed (one file is completed at a time)",
            n.saturating_sub(1)
        ),
        true => format!(
            "file {n} recorded {late} past the period: --finish-killed was completing files earlier tracers left (one file is completed at a time)"
        ),
    }
}

/// Deletes a run's oldest files until `keep` remain; never file `current`
/// (the one being written) or anything newer.
fn prune(dir: &Path, keep: u64, current: u64) {
    let Ok(files) = sleuth_store::run::run_files(dir) else {
        return;
    };
    let excess = files
        .len()
        .saturating_sub(usize::try_from(keep).unwrap_or(usize::MAX));
    for (n, f) in files.into_iter().take(excess) {
        if n < current {
            sleuth_store::outfile::remove_database(&f);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_rotation_waits_for_the_previous_file_to_be_complete_and_says_it_was_late() {
        let t0 = Instant::now();
        let at = t0 + Duration::from_secs(10);
        assert!(!rotation_due(t0, at, false), "before its time");
        assert!(rotation_due(at, at, false));
        assert!(
            !rotation_due(at + Duration::from_secs(3), at, true),
            "previous file still completing"
        );
        assert!(rotation_due(at + Duration::from_secs(3), at, false));
        assert_eq!(
            late_note(4, Duration::from_millis(2_500), false),
            "file 4 recorded 2.500s past the period: file 3 was still being completed (one file is completed at a time)"
        );
        assert_eq!(
            late_note(2, Duration::from_secs(12), true),
            "file 2 recorded 12.000s past the period: --finish-killed was completing files earlier tracers left (one file is completed at a time)"
        );
    }
}
