//! `sleuth_store::finish`: a file its tracer left unfinished (killed just
//! before its completion) completed afterwards holds what the tracer's own
//! completion would have written, row for row; in a run, the file's answers
//! rejoin the run's (issue 16, round 48).

mod common;

use common::allocator_workload::random_allocator_workload;
use common::trace_fixture::{copy_as_killed, rewrite_leaving_unfinished, two_processes};
use common::{session, TempDir};
use rusqlite::Connection;
use sleuth_core::Event;
use sleuth_store::finish::{finish, Finished};
use sleuth_store::run_ledger::RunLink;
use sleuth_store::{CheckMemo, ReadBudget, Trace, TraceWriter, WriterOptions};
use std::path::{Path, PathBuf};

/// Every row of every table (and every index's definition) of `db`, as
/// text, sorted, but the rows `skip` says to leave out: the completion's
/// whole output compared at once.
fn contents(db: &Path, skip: &dyn Fn(&str, &[String]) -> bool) -> Vec<String> {
    let c = Connection::open(db).unwrap();
    let mut out: Vec<String> = Vec::new();
    let tables: Vec<(String, String, String)> = c
        .prepare("SELECT type, name, coalesce(sql, '') FROM sqlite_master ORDER BY name")
        .unwrap()
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
        .unwrap()
        .map(Result::unwrap)
        .collect();
    for (kind, name, sql) in tables {
        out.push(format!("{kind} {name}: {sql}"));
        if kind != "table" || name.starts_with("sqlite_") {
            continue;
        }
        let mut st = c.prepare(&format!("SELECT * FROM \"{name}\"")).unwrap();
        let n = st.column_count();
        let mut rows = st.query([]).unwrap();
        let mut lines = Vec::new();
        while let Some(r) = rows.next().unwrap() {
            let cells: Vec<String> = (0..n)
                .map(|i| match r.get_ref(i).unwrap() {
                    rusqlite::types::ValueRef::Text(t) => String::from_utf8_lossy(t).into_owned(),
                    v => format!("{v:?}"),
                })
                .collect();
            if !skip(&name, &cells) {
                lines.push(format!("{name} {}", cells.join("|")));
            }
        }
        lines.sort();
        out.extend(lines);
    }
    out
}

/// What the tracer's completion and `finish` may write differently: the
/// note `finish` adds, and what each measured of itself (CPU times,
/// batches).
fn not_compared(table: &str, cells: &[String]) -> bool {
    let first = cells.first().map(String::as_str).unwrap_or("");
    match table {
        "notes" => cells
            .iter()
            .any(|c| c.contains("finished by `gpusleuth finish`")),
        "stats" => [
            "tracer_cpu_ns_completion",
            "writer_batches",
            "writer_cpu_ns_commit",
        ]
        .iter()
        .any(|s| first.contains(s)),
        _ => false,
    }
}

fn assert_same_lines(got: &[String], want: &[String]) {
    let only_got: Vec<&String> = got.iter().filter(|l| !want.contains(l)).take(5).collect();
    let only_want: Vec<&String> = want.iter().filter(|l| !got.contains(l)).take(5).collect();
    assert!(
        only_got.is_empty() && only_want.is_empty() && got.len() == want.len(),
        "finish wrote {} rows where the tracer wrote {}; only finish's: {only_got:#?}; only the tracer's: {only_want:#?}",
        got.len(),
        want.len()
    );
}

#[test]
fn a_killed_tracers_file_finished_holds_what_its_own_completion_wrote() {
    let dir = TempDir::new("finish_same");
    let data = two_processes();
    let (done, killed) = (dir.join("done.db"), dir.join("killed.db"));
    rewrite_leaving_unfinished(&data, &done, WriterOptions::default(), &killed);
    let t = Trace::open(&killed).unwrap();
    assert!(
        !t.has_rollups().unwrap(),
        "left as a killed tracer leaves it"
    );
    drop(t);
    let got = finish(Trace::open(&killed).unwrap(), None).unwrap();
    assert_eq!(
        got,
        Finished::Completed {
            calls: data.calls.len() as u64,
            culprit_rows: Connection::open(&done)
                .unwrap()
                .query_row("SELECT count(*) FROM call_culprits", [], |r| r
                    .get::<_, i64>(0))
                .unwrap() as u64,
        }
    );
    assert!(Trace::open(&killed).unwrap().has_rollups().unwrap());
    assert_same_lines(
        &contents(&killed, &not_compared),
        &contents(&done, &not_compared),
    );
    // Said in the file, and one file again (no WAL beside it).
    let c = Connection::open(&killed).unwrap();
    let noted: i64 = c
        .query_row(
            "SELECT count(*) FROM notes WHERE text LIKE 'finished by `gpusleuth finish`%'",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(noted, 1);
    let mode: String = c
        .query_row("PRAGMA journal_mode", [], |r| r.get(0))
        .unwrap();
    assert_eq!(mode, "delete");
    drop(c);
    // A second finish changes nothing.
    let before = std::fs::read(&killed).unwrap();
    assert_eq!(
        finish(Trace::open(&killed).unwrap(), None).unwrap(),
        Finished::AlreadyComplete
    );
    assert_eq!(std::fs::read(&killed).unwrap(), before);
}

/// `events` written at `path` as file `n` of a run (`link`), with a copy
/// of the file as a tracer killed before its completion leaves it at
/// `unfinished`.
fn write_leaving_unfinished(
    path: &Path,
    events: &[Event],
    link: RunLink,
    start: u64,
    unfinished: &Path,
) {
    let info = sleuth_store::SessionInfo {
        start_mono_ns: start,
        ..session()
    };
    let opts = WriterOptions {
        run: Some(link),
        ..Default::default()
    };
    let w = TraceWriter::create(path, info, opts).unwrap();
    let h = w.handle();
    for e in events {
        h.send(e.clone()).unwrap();
    }
    copy_as_killed(&h, path, unfinished);
    drop(h);
    w.finish().unwrap();
}

/// `random_allocator_workload(seed)` as a run of `files` files cut at even
/// times: in `tracer/` as its tracer completed every file, in `finished/`
/// the same run with the files after the first `complete` left as a
/// tracer killed while it completed the first of them leaves them (one
/// chain in both). Returns (`finished/`, `tracer/`).
fn killed_run(dir: &Path, seed: u64, files: usize, complete: usize) -> (PathBuf, PathBuf) {
    let (events, end) = random_allocator_workload(seed);
    killed_run_of(dir, &events, end, files, complete)
}

/// [`killed_run`] of `events` ending at `end`.
fn killed_run_of(
    dir: &Path,
    events: &[Event],
    end: u64,
    files: usize,
    complete: usize,
) -> (PathBuf, PathBuf) {
    let mut cuts: Vec<u64> = (0..files as u64).map(|i| i * end / files as u64).collect();
    cuts[0] = 1_000;
    cuts.push(end + 1);
    let (finished, tracer) = (dir.join("finished"), dir.join("tracer"));
    std::fs::create_dir_all(&finished).unwrap();
    std::fs::create_dir_all(&tracer).unwrap();
    let link = RunLink::new_run();
    let part = |k: usize| -> Vec<Event> {
        let of =
            |e: &&Event| (cuts[k]..cuts[k + 1]).contains(&common::allocator_workload::end_of(e));
        events.iter().filter(of).cloned().collect()
    };
    let name = |n: u64| sleuth_store::run::part_name(n);
    for k in 0..files {
        let n = k as u64 + 1;
        let (t, f) = (tracer.join(name(n)), finished.join(name(n)));
        if k < complete {
            common::allocator_workload::write(
                &t,
                &part(k),
                (cuts[k], cuts[k + 1]),
                Some(link.for_file(n)),
            );
            std::fs::copy(&t, &f).unwrap();
        } else {
            assert!(part(k).len() > 100, "{} events in file {n}", part(k).len());
            write_leaving_unfinished(&t, &part(k), link.for_file(n), cuts[k], &f);
        }
    }
    (finished, tracer)
}

#[test]
fn a_runs_killed_files_finished_rejoin_the_runs_answers() {
    let dir = TempDir::new("finish_run");
    // The tracer completed file 1 and was killed while it completed file 2
    // in the background and wrote file 3: `finished/` gets files 2 and 3
    // finished, `tracer/` the run the tracer would have completed had it
    // lived (the same files, one chain).
    let (finished, tracer) = killed_run(&dir.0, 0x51ed_27a3_90c4_1b77, 3, 1);
    let name = |n: u64| sleuth_store::run::part_name(n);

    // Before: the run's answers leave the killed files out.
    let memo = CheckMemo::new();
    let budget = || ReadBudget::new(sleuth_store::DEFAULT_READ_TIMEOUT);
    let stats = sleuth_store::run::run_stats(&finished, None).unwrap();
    assert_eq!(
        stats.incomplete,
        vec![finished.join(name(2)), finished.join(name(3))]
    );

    // Finished as `gpusleuth finish --db DIR` does: the run's id from its
    // last finished file, a new chain from file 2, continued by file 3.
    let id = sleuth_store::run_ledger::run_id_of(&Trace::open(&finished.join(name(1))).unwrap())
        .unwrap();
    assert!(id.is_some());
    let l = RunLink::for_unfinished(id.as_deref(), 2, "its tracer was killed");
    for n in 2..=3u64 {
        assert!(matches!(
            finish(
                Trace::open(&finished.join(name(n))).unwrap(),
                Some(&l.for_file(n))
            )
            .unwrap(),
            Finished::Completed { .. }
        ));
    }
    let new_chain = |n: u64| {
        let t = Trace::open(&finished.join(name(n))).unwrap();
        common::has_note(&t, &format!("run ledger: file {n} starts a new chain"))
    };
    assert!(new_chain(2));
    assert!(!new_chain(3), "file 3 continues file 2's chain");

    // After: the run answers over its three files, as the tracer's run.
    let (got, want) = (
        sleuth_store::run::run_stats(&finished, None).unwrap(),
        sleuth_store::run::run_stats(&tracer, None).unwrap(),
    );
    assert!(got.incomplete.is_empty());
    assert_eq!(got.files.len(), 3);
    let json = |v: &dyn erased::Ser| v.json();
    assert_eq!(json(&got.report), json(&want.report));
    for pid in [None, Some(100), Some(200)] {
        let (g, w) = (
            sleuth_store::run_explain::load_memory(&finished, pid, budget(), &memo).unwrap(),
            sleuth_store::run_explain::load_memory(&tracer, pid, budget(), &memo).unwrap(),
        );
        // Replayed across the new chain, where the tracer's chain answered.
        assert!(g.replayed_memory_calls > 0 && w.replayed_memory_calls == 0);
        assert_eq!(json(&g.ledgers), json(&w.ledgers), "pid {pid:?}");
        assert_eq!(
            json(&g.allocator_views().unwrap()),
            json(&w.allocator_views().unwrap()),
            "pid {pid:?}"
        );
    }
}

/// Serde values as JSON text, behind one trait object.
mod erased {
    pub trait Ser {
        fn json(&self) -> String;
    }
    impl<T: serde::Serialize> Ser for T {
        fn json(&self) -> String {
            serde_json::to_string(self).unwrap()
        }
    }
}

#[test]
fn what_finish_does_not_complete_is_refused_or_left_as_it_is() {
    let dir = TempDir::new("finish_refused");
    // A trace of an older version (the examples): complete as it is read.
    let older = dir.join("older.db");
    std::fs::copy(common::example("demo-sim.db"), &older).unwrap();
    let before = std::fs::read(&older).unwrap();
    let e = finish(Trace::open(&older).unwrap(), None)
        .unwrap_err()
        .to_string();
    assert!(e.contains("older gpusleuth"), "{e}");
    assert_eq!(std::fs::read(&older).unwrap(), before, "untouched");
    // A file that is no trace at all.
    let junk = dir.join("junk.db");
    std::fs::write(&junk, b"not sqlite").unwrap();
    assert!(Trace::open(&junk).is_err());
    // A complete file: nothing done.
    let (done, killed) = (dir.join("done.db"), dir.join("killed.db"));
    rewrite_leaving_unfinished(&two_processes(), &done, WriterOptions::default(), &killed);
    let before = std::fs::read(&done).unwrap();
    assert_eq!(
        finish(Trace::open(&done).unwrap(), None).unwrap(),
        Finished::AlreadyComplete
    );
    assert_eq!(std::fs::read(&done).unwrap(), before);
    // An unfinished file holding rows no tracer writes: its rollups would
    // be refused by every reader, where its rows are read, those skipped.
    let c = Connection::open(&killed).unwrap();
    c.execute_batch(
        "PRAGMA journal_mode = DELETE;
         UPDATE call_rows SET dur_ns = -5 WHERE id = (SELECT min(id) FROM call_rows);",
    )
    .unwrap();
    drop(c);
    let before = std::fs::read(&killed).unwrap();
    let e = finish(Trace::open(&killed).unwrap(), None)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("rows no tracer writes") && e.contains("1 calls skipped"),
        "{e}"
    );
    assert_eq!(std::fs::read(&killed).unwrap(), before);
}

#[test]
fn a_file_completed_by_another_finish_meanwhile_is_left_as_it_is() {
    // Two finishers on one file (a user's `gpusleuth finish` and a
    // restarted tracer's `--finish-killed`): one checks and replays the
    // file while the other holds the write lock and completes it. The
    // first waits for the lock, finds the file complete, and writes
    // nothing: completed twice, its rollups would count every call twice.
    let dir = TempDir::new("finish_race");
    let (done, killed) = (dir.join("done.db"), dir.join("killed.db"));
    rewrite_leaving_unfinished(&two_processes(), &done, WriterOptions::default(), &killed);
    // The other finisher: its transaction under way.
    let other = Connection::open(&killed).unwrap();
    other.execute_batch("BEGIN IMMEDIATE").unwrap();
    let this = std::thread::spawn({
        let killed = killed.clone();
        // Opened now, while the file is not complete.
        let t = Trace::open(&killed).unwrap();
        move || finish(t, None)
    });
    std::thread::sleep(std::time::Duration::from_millis(300));
    // Its completion committed (what the check reads of it: the mark).
    other
        .execute_batch("INSERT OR REPLACE INTO meta(key, value) VALUES ('rollups', '1'); COMMIT")
        .unwrap();
    drop(other);
    assert_eq!(this.join().unwrap().unwrap(), Finished::AlreadyComplete);
    let c = Connection::open(&killed).unwrap();
    let notes: i64 = c
        .query_row(
            "SELECT count(*) FROM notes WHERE text LIKE 'finished by%'",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(notes, 0, "nothing of this finish written");
    let rollup_rows: i64 = c
        .query_row("SELECT count(*) FROM rollup_ops", [], |r| r.get(0))
        .unwrap();
    assert_eq!(rollup_rows, 0, "no rollups of this finish");
}

/// Found in round 50: a killed tracer's file has no `op_counts` (stored at
/// its end), so its kernel-counted launches were 0 once finished, though
/// their running counts were sampled every 200 ms. The latest sample of
/// each (process, op) is its count now, and a note says so.
#[test]
fn a_killed_files_counted_launches_are_their_latest_samples() {
    use sleuth_core::counted::CountSample;
    let dir = TempDir::new("finish_counts");
    let (path, killed) = (dir.join("t.db"), dir.join("killed.db"));
    let w = TraceWriter::create(&path, session(), WriterOptions::default()).unwrap();
    let h = w.handle();
    let launch = sleuth_core::op_by_name("cuLaunchKernel").unwrap().id;
    let sync = sleuth_core::op_by_name("cuStreamSynchronize").unwrap().id;
    h.send(Event::Call(common::call("cudaMalloc", 7, 7, 1_000, 10)))
        .unwrap();
    let sample = |ts_ns, pid, op, count| CountSample {
        ts_ns,
        pid,
        op,
        count,
    };
    h.add_count_samples(vec![
        sample(200_000_000, 7, launch, 300),
        sample(400_000_000, 7, launch, 5_300),
        sample(400_000_000, 8, sync, 12),
    ])
    .unwrap();
    copy_as_killed(&h, &path, &killed);
    drop(h);
    w.finish().unwrap();
    let count_of = |db: &Path, pid: i64, op: &str| -> Option<i64> {
        Connection::open(db)
            .unwrap()
            .query_row(
                "SELECT count FROM op_counts WHERE pid = ?1 AND op = ?2",
                rusqlite::params![pid, op],
                |r| r.get(0),
            )
            .ok()
    };
    assert_eq!(count_of(&killed, 7, "cuLaunchKernel"), None, "as killed");
    let got = finish(Trace::open(&killed).unwrap(), None).unwrap();
    assert!(matches!(got, Finished::Completed { .. }), "{got:?}");
    assert_eq!(count_of(&killed, 7, "cuLaunchKernel"), Some(5_300));
    assert_eq!(count_of(&killed, 8, "cuStreamSynchronize"), Some(12));
    let noted: i64 = Connection::open(&killed)
        .unwrap()
        .query_row(
            "SELECT count(*) FROM notes WHERE text LIKE '%counts at its last sample%'",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(noted, 1);
    // The stats of the finished file count them.
    let t = Trace::open(&killed).unwrap();
    let counts = t.op_counts(None).unwrap();
    assert!(
        counts
            .iter()
            .any(|c| c.pid == 7 && c.op == launch && c.count == 5_300),
        "{counts:?}"
    );
}

/// Files 3 and 4 of `finished` (a killed run of four files, two complete:
/// [`killed_run`]) completed as `gpusleuth finish --db DIR` does (a new
/// chain from file 3), then file 1 deleted from it and from `tracer` (the
/// run the tracer would have completed) as `--keep 3` deletes it.
fn finish_files_3_and_4_then_delete_file_1(finished: &Path, tracer: &Path) {
    let name = |n: u64| sleuth_store::run::part_name(n);
    let id = sleuth_store::run_ledger::run_id_of(&Trace::open(&finished.join(name(2))).unwrap())
        .unwrap();
    let l = RunLink::for_unfinished(id.as_deref(), 3, "its tracer was killed");
    for n in 3..=4u64 {
        let t = Trace::open(&finished.join(name(n))).unwrap();
        assert!(matches!(
            finish(t, Some(&l.for_file(n))).unwrap(),
            Finished::Completed { .. }
        ));
    }
    for d in [finished, tracer] {
        std::fs::remove_file(d.join(name(1))).unwrap();
    }
}

/// Found in round 50: a `--keep` run whose tracer was killed, finished by
/// `gpusleuth finish`: the killed files start a chain of their own, and
/// the run's memory was replayed from the first file left, so what the
/// files `--keep` had deleted still held was lost (the answer worse than
/// before the finish). The run's ledger now continues the state the tracer
/// carried into the last file of the intact chain (its begin state).
#[test]
fn a_kept_runs_killed_files_keep_what_deleted_files_held() {
    let dir = TempDir::new("finish_kept");
    // Files 1 and 2 complete, the tracer killed while it completed file 3
    // and wrote file 4; file 1 then deleted (`--keep 3`).
    let (finished, tracer) = killed_run(&dir.0, 0x7a3e_11c5_62d0_9f41, 4, 2);
    finish_files_3_and_4_then_delete_file_1(&finished, &tracer);
    // File 1's allocations still live at the end are in the tracer's
    // carried ledger; the finished run's must hold them too.
    let memo = CheckMemo::new();
    let budget = || ReadBudget::new(sleuth_store::DEFAULT_READ_TIMEOUT);
    let json = |v: &dyn erased::Ser| v.json();
    for pid in [None, Some(100), Some(200)] {
        let (g, w) = (
            sleuth_store::run_explain::load_memory(&finished, pid, budget(), &memo).unwrap(),
            sleuth_store::run_explain::load_memory(&tracer, pid, budget(), &memo).unwrap(),
        );
        assert!(g.replayed_memory_calls > 0 && w.replayed_memory_calls == 0);
        assert_eq!(json(&g.ledgers), json(&w.ledgers), "pid {pid:?}");
        let note = g.ledger_note.clone().unwrap_or_default();
        assert!(
            note.contains("continues the one the tracer carried into part-000002.db"),
            "{note}"
        );
    }
}

/// Round 54: after the finish of a killed `--keep` run, a process whose
/// allocator events were all in files `--keep` deleted (an idle server
/// still holding its cache) kept its memory in the run's ledger (round
/// 50) but lost its allocator view (the views of the processes with
/// events in the files kept are replayed from them; it had none). Its
/// views are now those the tracer carried to the newest file that lists
/// it, when no file read after that one holds a call or event of it.
#[test]
fn a_silent_processs_views_survive_the_finish_of_a_killed_kept_run() {
    let dir = TempDir::new("finish_silent_views");
    let (mut events, end) = random_allocator_workload(0x3c6e_f372_fe94_f82b);
    // Process 200's calls and blocks all in file 1 (of four).
    use common::allocator_workload::{end_of, pid_of};
    events.retain(|e| pid_of(e) != 200 || end_of(e) < end / 4);
    let (finished, tracer) = killed_run_of(&dir.0, &events, end, 4, 2);
    finish_files_3_and_4_then_delete_file_1(&finished, &tracer);
    let memo = CheckMemo::new();
    let budget = || ReadBudget::new(sleuth_store::DEFAULT_READ_TIMEOUT);
    for pid in [None, Some(200)] {
        let read = |d: &Path| {
            let r = sleuth_store::run_explain::load_memory(d, pid, budget(), &memo).unwrap();
            let views = r.allocator_views().unwrap();
            serde_json::to_value(views.get(&200)).unwrap()
        };
        let (got, want) = (read(&finished), read(&tracer));
        assert!(!want.is_null(), "the tracer's run has 200's view ({pid:?})");
        assert_eq!(got, want, "pid {pid:?}");
    }
}
