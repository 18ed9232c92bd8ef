//! The run's memory ledger carried by the writer across the files of a run
//! (`sleuth_store::run_ledger`): files written through the writer as
//! `trace --rotate` writes them (one `RunLink`, completions in file order),
//! read by `explain --db DIR`'s loader (`run_explain::load`). The carried
//! ledger answers without a memory call read and equals the replay of the
//! same files; pruned files stay covered, with their sites named; a crafted
//! or broken chain falls back to the replay (with a note) or is refused in
//! one line, never answered wrong.

mod common;

use common::trace_fixture::rewrite_with_options;
use common::TempDir;
use rusqlite::Connection;
use sleuth_core::sites::Stack;
use sleuth_core::testing::{alloc, call, failed_alloc, free, py_frame, trace, MS};
use sleuth_core::{CallEvent, TraceData};
use sleuth_store::run::part_name;
use sleuth_store::run_explain::{load, RunLean};
use sleuth_store::run_ledger::RunLink;
use sleuth_store::{ReadBudget, WriterOptions, DEFAULT_READ_TIMEOUT};
use std::path::{Path, PathBuf};

fn budget() -> ReadBudget {
    ReadBudget::new(DEFAULT_READ_TIMEOUT)
}

/// Stack ids are 64-bit hashes: the top bit set, as real ones often have.
const SITE_A: u64 = 0xf000_0000_0000_00a1;
const SITE_B: u64 = 0xf000_0000_0000_00b2;
const SITE_FAIL: u64 = 0xf000_0000_0000_00c3;

fn at(mut c: CallEvent, stack: u64) -> CallEvent {
    c.stack_id = Some(stack);
    c
}

fn stack(id: u64, line: u32) -> Stack {
    Stack {
        id,
        pid: 100,
        frames: vec![py_frame("/train.py", line, "step")],
        notes: Vec::new(),
    }
}

/// A file's trace: `calls`, with the stacks of the sites they name (the
/// tracer stores a stack in each file that has a call of it).
fn part(calls: Vec<CallEvent>) -> TraceData {
    let mut data = trace(calls);
    for (id, line) in [(SITE_A, 10), (SITE_B, 20), (SITE_FAIL, 30)] {
        if data.calls.iter().any(|c| c.stack_id == Some(id)) {
            data.stacks.insert(id, stack(id, line));
        }
    }
    data
}

/// Three files: A (1 MiB) made in file 1 and freed in file 3; B (2 MiB)
/// made in file 1, never freed; a failed allocation in file 1; file 2 has
/// no memory call; C made and freed in file 3.
fn three_parts() -> Vec<TraceData> {
    vec![
        part(vec![
            at(alloc(0, 1 << 20, 0xa000), SITE_A),
            at(alloc(MS, 2 << 20, 0xb000), SITE_B),
            at(failed_alloc(2 * MS, 1 << 40), SITE_FAIL),
            call("cudaLaunchKernel", 10 * MS, MS),
        ]),
        part(vec![call("cudaLaunchKernel", 100 * MS, MS)]),
        part(vec![
            call("cudaLaunchKernel", 200 * MS, MS),
            free(210 * MS, 0xa000),
            alloc(220 * MS, 4096, 0xc000),
            free(230 * MS, 0xc000),
        ]),
    ]
}

/// Writes `parts` as files `first`, `first + 1`, ... of the run of `link`
/// into `dir` (created).
fn write_run(dir: &Path, link: &RunLink, first: u64, parts: &[TraceData]) {
    std::fs::create_dir_all(dir).unwrap();
    for (i, data) in parts.iter().enumerate() {
        let n = first + i as u64;
        let opts = WriterOptions {
            run: Some(link.for_file(n)),
            ..Default::default()
        };
        rewrite_with_options(data, &dir.join(part_name(n)), opts);
    }
}

/// Writes [`three_parts`]-like `parts` as files 1, 2, 3 of one run into
/// `dir` (created), each beginning where a rotation cut the run (0, 90 and
/// 190 ms).
fn write_run_cut_at(dir: &Path, parts: &[TraceData]) {
    write_run_cut(dir, parts, &[0, 90 * MS, 190 * MS]);
}

/// Writes `parts` as files 1, 2, ... of one run into `dir` (created), file
/// k beginning at `starts[k - 1]`.
fn write_run_cut(dir: &Path, parts: &[TraceData], starts: &[u64]) {
    let link = RunLink::new_run();
    std::fs::create_dir_all(dir).unwrap();
    for (k, &start) in starts.iter().enumerate() {
        let n = k as u64 + 1;
        let opts = WriterOptions {
            run: Some(link.for_file(n)),
            ..Default::default()
        };
        let session = sleuth_store::SessionInfo {
            start_mono_ns: start,
            ..common::session()
        };
        common::trace_fixture::rewrite_in_session(
            &parts[k],
            &dir.join(part_name(n)),
            opts,
            session,
        );
    }
}

/// A copy of the run `dir` with no carried ledger (as files written before
/// the tracer carried one): its answer is the replay's.
fn without_carried(dir: &Path, to: &Path) -> PathBuf {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        let dst = to.join(e.file_name());
        std::fs::copy(e.path(), &dst).unwrap();
        let c = Connection::open(&dst).unwrap();
        c.execute_batch("DELETE FROM meta WHERE key LIKE 'run%'; DROP TABLE IF EXISTS run_ledger")
            .unwrap();
    }
    to.to_path_buf()
}

/// A file's `meta` value of `key`, if any.
fn meta(path: &Path, key: &str) -> Option<String> {
    let c = Connection::open(path).unwrap();
    let mut st = c.prepare("SELECT value FROM meta WHERE key = ?1").unwrap();
    let v = st.query_row([key], |r| r.get(0));
    v.ok()
}

fn sql(path: &Path, sql: &str) {
    Connection::open(path).unwrap().execute_batch(sql).unwrap();
}

fn notes(r: &RunLean) -> Vec<String> {
    r.explanation().unwrap().notes
}

/// The same answer as the replay's: ledgers (sites named), findings, notes.
fn assert_same_answer(carried: &RunLean, replayed: &RunLean) {
    assert_eq!(carried.ledgers, replayed.ledgers);
    let (a, b) = (
        carried.explanation().unwrap(),
        replayed.explanation().unwrap(),
    );
    assert_eq!(
        serde_json::to_value(&a).unwrap(),
        serde_json::to_value(&b).unwrap()
    );
}

#[test]
fn the_carried_ledger_answers_as_the_replay_without_reading_a_memory_call() {
    let tmp = TempDir::new("runled-equal");
    let run = tmp.join("run");
    write_run(&run, &RunLink::new_run(), 1, &three_parts());
    let carried = load(&run, None, budget()).unwrap();
    assert_eq!(carried.replayed_memory_calls, 0);
    let replayed = load(&without_carried(&run, &tmp.join("old")), None, budget()).unwrap();
    assert!(replayed.replayed_memory_calls >= 6);
    assert_same_answer(&carried, &replayed);
    let l = &carried.ledgers[0];
    // A made in file 1 and freed in file 3 is matched; B is left; C too.
    assert_eq!((l.allocs, l.frees, l.unmatched_frees), (3, 2, 0));
    assert_eq!(l.unfreed.len(), 1);
    assert_eq!(l.unfreed[0].stack_id, Some(SITE_B));
    assert_eq!(l.unfreed[0].site.as_deref(), Some("/train.py:20 step"));
    assert_eq!(l.failed_allocs.len(), 1);
    // With a pid: the same.
    let one = load(&run, Some(100), budget()).unwrap();
    assert_eq!(one.replayed_memory_calls, 0);
    assert_eq!(one.ledgers, carried.ledgers);
    // The memory alone (`memory --db DIR`, no finding aggregate read): the
    // same ledgers and base data, carried or replayed.
    let memo = sleuth_store::CheckMemo::new();
    for (dir, whole) in [(run.clone(), &carried), (tmp.join("old"), &replayed)] {
        let m = sleuth_store::run_explain::load_memory(&dir, None, budget(), &memo).unwrap();
        assert_eq!(m.ledgers, whole.ledgers);
        assert_eq!(m.replayed_memory_calls, whole.replayed_memory_calls);
        assert_eq!(m.ledger_note, whole.ledger_note);
        assert_eq!(
            serde_json::to_value(&m.data.processes).unwrap(),
            serde_json::to_value(&whole.data.processes).unwrap()
        );
        assert_eq!(m.data.stacks, whole.data.stacks);
    }
}

/// `--keep` deleted file 1: the carried ledger still knows B (made there,
/// never freed, its site named from the stack the writer copied into the
/// later files) and matches A's free; the answer says what it covers.
/// The replay of the kept files could not (A's free unmatched, B unknown).
#[test]
fn a_pruned_run_keeps_what_its_deleted_files_allocated_with_their_sites() {
    let tmp = TempDir::new("runled-pruned");
    let run = tmp.join("run");
    write_run(&run, &RunLink::new_run(), 1, &three_parts());
    std::fs::remove_file(run.join(part_name(1))).unwrap();
    let r = load(&run, None, budget()).unwrap();
    assert_eq!(r.replayed_memory_calls, 0);
    let l = &r.ledgers[0];
    assert_eq!((l.allocs, l.frees, l.unmatched_frees), (3, 2, 0));
    assert_eq!(l.unfreed[0].site.as_deref(), Some("/train.py:20 step"));
    assert_eq!(
        l.failed_allocs[0].site.as_deref(),
        Some("/train.py:30 step")
    );
    assert!(
        notes(&r)
            .iter()
            .any(|n| n.contains("1 earlier file(s) no longer in the directory")),
        "{:?}",
        notes(&r)
    );
    let replayed = load(&without_carried(&run, &tmp.join("old")), None, budget()).unwrap();
    assert_eq!(replayed.ledgers[0].unmatched_frees, 1);
}

/// A process that allocated in a file `--keep` deleted and made no call
/// in the files left (an idle server holding its memory) is in the
/// run's ledger with what it holds: the last file's carried ledger lists
/// it (round 53's tester: "No traced process made CUDA calls" over a run
/// carrying 95 MiB of it).
#[test]
fn a_process_silent_in_the_files_kept_keeps_its_memory_in_the_ledger() {
    let tmp = TempDir::new("runled-silent");
    let run = tmp.join("run");
    let other = |ts| CallEvent {
        pid: 200,
        tid: 200,
        ..call("cudaLaunchKernel", ts, MS)
    };
    let parts = vec![
        part(vec![
            alloc(0, 2 << 20, 0xb000),
            call("cudaLaunchKernel", 10 * MS, MS),
        ]),
        part(vec![other(100 * MS)]),
        part(vec![other(200 * MS)]),
    ];
    write_run(&run, &RunLink::new_run(), 1, &parts);
    std::fs::remove_file(run.join(part_name(1))).unwrap();
    let r = load(&run, None, budget()).unwrap();
    let held: Vec<(u32, u64)> = r.ledgers.iter().map(|l| (l.pid, l.live_bytes)).collect();
    assert!(held.contains(&(100, 2 << 20)), "{held:?}");
    let l = r.ledgers.iter().find(|l| l.pid == 100).unwrap();
    assert_eq!(
        (l.comm.as_str(), l.allocs, l.unfreed.len()),
        ("train", 1, 1)
    );
    let m = sleuth_store::run_explain::load_memory(
        &run,
        None,
        budget(),
        &sleuth_store::CheckMemo::new(),
    )
    .unwrap();
    assert!(m
        .ledgers
        .iter()
        .any(|l| (l.pid, l.live_bytes) == (100, 2 << 20)));
}

/// Runs the loader on a run whose chain `craft` broke: the replay answers
/// (as on the copy without carried ledgers) and a note says why.
fn falls_back(tag: &str, craft: impl FnOnce(&Path), why: &str) {
    let tmp = TempDir::new(tag);
    let run = tmp.join("run");
    write_run(&run, &RunLink::new_run(), 1, &three_parts());
    craft(&run);
    let r = load(&run, None, budget()).unwrap();
    assert!(r.replayed_memory_calls > 0, "{tag}");
    let replayed = load(&without_carried(&run, &tmp.join("old")), None, budget()).unwrap();
    assert_eq!(r.ledgers, replayed.ledgers, "{tag}");
    assert!(
        notes(&r)
            .iter()
            .any(|n| n.contains("replayed from the files' memory calls") && n.contains(why)),
        "{tag}: {:?}",
        notes(&r)
    );
}

#[test]
fn a_crafted_or_broken_chain_falls_back_to_the_replay() {
    let p = |run: &Path, n| run.join(part_name(n));
    falls_back(
        "runled-other-id",
        |run| {
            sql(
                &p(run, 2),
                "UPDATE meta SET value = 'beef' WHERE key = 'run_id'",
            )
        },
        "another run",
    );
    falls_back(
        "runled-gap",
        |run| std::fs::remove_file(p(run, 2)).unwrap(),
        "missing or unfinished",
    );
    falls_back(
        "runled-renumbered",
        |run| {
            sql(
                &p(run, 3),
                "UPDATE meta SET value = '7' WHERE key = 'run_file'",
            )
        },
        "says it is file 7",
    );
    // Meta values no tracer writes: the file carries no link.
    falls_back(
        "runled-odd-meta",
        |run| {
            sql(
                &p(run, 2),
                "UPDATE meta SET value = '99999999999999999999' WHERE key = 'run_ledger_from'",
            )
        },
        "carries no run ledger",
    );
    // File 2 of another run with the same numbers, copied in.
    falls_back(
        "runled-foreign",
        |run| {
            let other = run.parent().unwrap().join("other");
            write_run(&other, &RunLink::new_run(), 1, &three_parts());
            std::fs::copy(p(&other, 2), p(run, 2)).unwrap();
        },
        "another run",
    );
}

/// The writer's side of a broken chain: a file whose completion did not
/// happen (file 2 never finished: its writer dropped) makes file 3 start a
/// new chain and say so; a reader of files 1 and 3 replays.
#[test]
fn a_file_not_completed_breaks_the_chain_and_the_next_says_so() {
    let tmp = TempDir::new("runled-cut");
    let run = tmp.join("run");
    let link = RunLink::new_run();
    let parts = three_parts();
    write_run(&run, &link, 1, &parts[..1]);
    write_run(&run, &link, 3, &parts[2..]);
    let third = run.join(part_name(3));
    assert_eq!(meta(&third, "run_ledger_from").as_deref(), Some("3"));
    let c = Connection::open(&third).unwrap();
    let note: String = c
        .query_row(
            "SELECT text FROM notes WHERE text LIKE 'run ledger:%'",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert!(note.contains("file 3 starts a new chain"), "{note}");
    let r = load(&run, None, budget()).unwrap();
    assert!(r.replayed_memory_calls > 0);
    assert!(
        notes(&r).iter().any(|n| n.contains("restarts between")),
        "{:?}",
        notes(&r)
    );
}

/// Refused in one line: a stored run ledger holding a number no trace
/// holds, or one announced complete but missing. The file's own ledger
/// rollup is range-checked too, its 64-bit stack ids aside.
#[test]
fn a_damaged_run_ledger_is_refused_in_one_line() {
    let refused = |tag: &str, craft: &str| {
        let tmp = TempDir::new(tag);
        let run = tmp.join("run");
        write_run(&run, &RunLink::new_run(), 1, &three_parts());
        sql(&run.join(part_name(3)), craft);
        let e = match load(&run, None, budget()) {
            Ok(_) => panic!("{tag}: accepted"),
            Err(e) => e.to_string(),
        };
        assert_eq!(e.lines().count(), 1, "{e}");
        assert!(e.contains("damaged trace: run_ledger"), "{tag}: {e}");
    };
    refused(
        "runled-huge",
        "UPDATE run_ledger SET ledger = replace(ledger, '\"allocs\":3', '\"allocs\":9223372036854775807')",
    );
    refused("runled-gone", "DROP TABLE run_ledger");
    refused(
        "runled-not-json",
        "UPDATE run_ledger SET ledger = '{\"pid\": 100'",
    );

    // The file's own ledger: a huge count refused, stack ids (past 2^62
    // here) read.
    let tmp = TempDir::new("runled-own");
    let run = tmp.join("run");
    write_run(&run, &RunLink::new_run(), 1, &three_parts());
    let one = run.join(part_name(1));
    let t = sleuth_store::Trace::open(&one).unwrap();
    let lean = sleuth_store::lean::load(&t, None, budget())
        .unwrap()
        .unwrap();
    assert_eq!(lean.ledgers[0].unfreed.len(), 2);
    assert!(lean.ledgers[0]
        .unfreed
        .iter()
        .any(|u| u.stack_id == Some(SITE_A)));
    drop(t);
    sql(
        &one,
        "UPDATE ledger_rollup SET ledger = replace(ledger, '\"allocs\":2', '\"allocs\":9223372036854775807')",
    );
    let t = sleuth_store::Trace::open(&one).unwrap();
    let e = match sleuth_store::lean::load(&t, None, budget()) {
        Ok(_) => panic!("a huge count accepted"),
        Err(e) => e.to_string(),
    };
    assert!(e.contains("damaged trace: ledger_rollup"), "{e}");
}

/// Refused in one line naming `run_ledger_begin`: the state a file began
/// with holding what no replay leaves, a table announced but missing or
/// not a plain table, a second row of a process, a meta value no tracer
/// writes (`memory --at` of the run at a moment in that file).
#[test]
fn a_damaged_run_ledger_begin_is_refused_in_one_line() {
    use sleuth_store::run_explain::{load_memory_at, Moment};
    let refused = |tag: &str, craft: &str| {
        let tmp = TempDir::new(tag);
        let run = tmp.join("run");
        write_run(&run, &RunLink::new_run(), 1, &three_parts());
        let third = run.join(part_name(3));
        assert_eq!(meta(&third, "run_ledger_begin").as_deref(), Some("1"));
        sql(&third, craft);
        let memo = sleuth_store::CheckMemo::new();
        let e = match load_memory_at(&run, None, Moment::At(225 * MS), budget(), &memo) {
            Ok(_) => panic!("{tag}: accepted"),
            Err(e) => e.to_string(),
        };
        assert_eq!(e.lines().count(), 1, "{e}");
        assert!(e.contains("damaged trace: run_ledger_begin"), "{tag}: {e}");
    };
    refused(
        "runbeg-op",
        "UPDATE run_ledger_begin SET state = replace(state, '\"cudaMalloc\"', '\"cudaLaunchKernel\"')",
    );
    refused(
        "runbeg-count",
        "UPDATE run_ledger_begin SET state = replace(state, '\"allocs\":2', '\"allocs\":18446744073709551615')",
    );
    refused(
        "runbeg-json",
        "UPDATE run_ledger_begin SET state = '{\"pid\": 100'",
    );
    refused(
        "runbeg-sites",
        "UPDATE run_ledger_begin SET sites = '[[1]]'",
    );
    refused(
        "runbeg-twice",
        "INSERT INTO run_ledger_begin SELECT * FROM run_ledger_begin",
    );
    refused("runbeg-gone", "DROP TABLE run_ledger_begin");
    refused(
        "runbeg-view",
        "ALTER TABLE run_ledger_begin RENAME TO x; CREATE VIEW run_ledger_begin AS SELECT * FROM x",
    );
    refused(
        "runbeg-until",
        "UPDATE meta SET value = 'soon' WHERE key = 'run_ledger_begin_until'",
    );
}

/// The note of file `n` of `run` on its run ledger's chain (`run ledger: ...`).
fn chain_note(run: &Path, n: u64) -> String {
    Connection::open(run.join(part_name(n)))
        .unwrap()
        .query_row(
            "SELECT text FROM notes WHERE text LIKE 'run ledger:%'",
            [],
            |r| r.get(0),
        )
        .unwrap()
}

/// Past the bound on what the tracer carries (live allocations and the
/// like), the chain stops: the file still stores the run's ledger up to
/// itself, the next starts a new chain and says why, and a reader of both
/// replays (the same answer, read from the calls).
#[test]
fn past_the_carried_bound_the_next_file_starts_a_new_chain() {
    use sleuth_store::run_ledger::MAX_CARRIED_ENTRIES;
    let tmp = TempDir::new("runled-bound");
    let run = tmp.join("run");
    let n = MAX_CARRIED_ENTRIES as u64 + 1;
    let live: Vec<CallEvent> = (0..n)
        .map(|i| alloc(i * 1000, 4096, 0x10_0000 + i * 4096))
        .collect();
    let parts = vec![part(live), part(vec![free(n * 1000 + MS, 0x10_0000)])];
    write_run(&run, &RunLink::new_run(), 1, &parts);
    let note = chain_note(&run, 2);
    assert!(note.contains("not carried further"), "{note}");
    let r = load(&run, None, budget()).unwrap();
    assert!(r.replayed_memory_calls > n, "{}", r.replayed_memory_calls);
    let l = &r.ledgers[0];
    assert_eq!((l.allocs, l.frees, l.unfreed.len() as u64), (n, 1, n - 1));
}

/// Processes count toward the bound by themselves (`PROCESS_ENTRIES`: a
/// process's own tables and sites, however few allocations it made). A
/// node agent's run that sees thousands of short-lived processes, each
/// leaving one allocation behind, stops its chain as it does past the
/// bound's live allocations, far below their number; a reader of both
/// files replays them (every process in the answer).
#[test]
fn many_processes_count_toward_the_carried_bound() {
    use sleuth_store::run_ledger::{MAX_CARRIED_ENTRIES, PROCESS_ENTRIES};
    let tmp = TempDir::new("runled-procs");
    let run = tmp.join("run");
    let n = (MAX_CARRIED_ENTRIES / PROCESS_ENTRIES) as u32 + 1;
    let one_each: Vec<CallEvent> = (0..n)
        .map(|i| {
            let mut c = alloc(u64::from(i) * 1000, 4096, 0x10_0000);
            (c.pid, c.tid) = (1000 + i, 1000 + i);
            c
        })
        .collect();
    let mut freed = free(u64::from(n) * 1000 + MS, 0x10_0000);
    (freed.pid, freed.tid) = (1000, 1000);
    let parts = vec![part(one_each), part(vec![freed])];
    write_run(&run, &RunLink::new_run(), 1, &parts);
    let note = chain_note(&run, 2);
    assert!(note.contains("not carried further"), "{note}");
    assert!(
        note.contains(&format!("its {n} processes counted as")),
        "{note}"
    );
    let r = load(&run, None, budget()).unwrap();
    assert_eq!(r.replayed_memory_calls, u64::from(n) + 1);
    assert_eq!(r.ledgers.len(), n as usize);
    let first = r.ledgers.iter().find(|l| l.pid == 1000).unwrap();
    assert_eq!((first.allocs, first.frees, first.unfreed.len()), (1, 1, 0));
}

/// The tracer stores in each file the host ranges pinned at its end
/// (`run_pinned`): a reader of file 3 knows what file 1 pinned after
/// `--keep` deleted it, which no replay can; a run without the stored
/// ranges (an older tracer) replays the files present.
#[test]
fn memory_pinned_in_a_deleted_file_stays_pinned() {
    use sleuth_core::findings::inputs::PinnedState;
    let dir = TempDir::new("run-pinned-carried");
    let run = dir.join("run");
    let (a, b) = (0x7000_0000u64, 0x9000_0000u64);
    let pin = |ts, ptr| {
        let mut c = call("cudaHostAlloc", ts, MS);
        (c.ptr, c.size) = (Some(ptr), Some(1 << 20));
        c
    };
    let mut unpin = call("cudaFreeHost", 120 * MS, MS);
    unpin.ptr = Some(b);
    let parts = vec![
        part(vec![pin(0, a), pin(MS, b)]),
        part(vec![unpin, call("cudaLaunchKernel", 130 * MS, MS)]),
        part(vec![call("cudaLaunchKernel", 200 * MS, MS)]),
    ];
    write_run(&run, &RunLink::new_run(), 1, &parts);
    let memo = sleuth_store::CheckMemo::new();
    let began = |dir: &Path, n| {
        sleuth_store::run::pinned_when_file_began(dir, n, None, &budget(), &memo)
            .unwrap()
            .ranges()
    };
    let only_a = vec![(100, a, a + (1 << 20))];
    assert_eq!(began(&run, 3), only_a, "b was unpinned in file 2");
    assert_eq!(began(&run, 2).len(), 2, "both pinned when file 2 began");
    // As `--keep 2` leaves it: file 1 gone, its pinning still known.
    std::fs::remove_file(run.join(part_name(1))).unwrap();
    assert_eq!(began(&run, 3), only_a);
    // A file without the ranges it began with (written before round 19)
    // takes its previous file's end ranges.
    sql(
        &run.join(part_name(3)),
        "DELETE FROM meta WHERE key = 'run_copies_judged'",
    );
    assert_eq!(began(&run, 3), only_a, "file 2's end ranges");
    // Without the stored ranges the files present are replayed: file 1's
    // pinning is lost with it.
    let old = without_carried(&run, &dir.join("old"));
    assert_eq!(began(&old, 3), Vec::new());
    // Another process's ranges are not this one's.
    let other =
        sleuth_store::run::pinned_when_file_began(&run, 3, Some(4242), &budget(), &memo).unwrap();
    assert!(other.is_empty());
    let _: PinnedState = other;
}

/// A stored pinned-range table no tracer writes (the ranges a file ended
/// with, or began with) is a one-line error naming it; ranges that are no
/// range are ignored.
#[test]
fn a_damaged_run_pinned_table_is_refused_in_one_line() {
    let dir = TempDir::new("run-pinned-damaged");
    let run = dir.join("run");
    let parts = vec![
        part(vec![call("cudaLaunchKernel", 0, MS)]),
        part(vec![call("cudaLaunchKernel", 100 * MS, MS)]),
    ];
    write_run(&run, &RunLink::new_run(), 1, &parts);
    let (first, second) = (run.join(part_name(1)), run.join(part_name(2)));
    // File 2's own ranges first (the previous file's are read without them).
    for (table, key) in [
        ("run_pinned_begin", "run_copies_judged"),
        ("run_pinned", ""),
    ] {
        let file = if key.is_empty() { &first } else { &second };
        damaged_ranges_are_refused(&run, file, table);
        sql(&second, "DELETE FROM meta WHERE key = 'run_copies_judged'");
    }
}

/// [`a_damaged_run_pinned_table_is_refused_in_one_line`] for one table.
fn damaged_ranges_are_refused(run: &Path, file: &Path, table: &str) {
    let began = || {
        sleuth_store::run::pinned_when_file_began(
            run,
            2,
            None,
            &budget(),
            &sleuth_store::CheckMemo::new(),
        )
    };
    sql(
        file,
        &format!("INSERT INTO {table} VALUES (100, 4096, 4096), (100, 9000, 10)"),
    );
    assert!(
        began().unwrap().is_empty(),
        "{table}: empty and inverted ranges"
    );
    for (damage, what) in [
        (
            format!("INSERT INTO {table} VALUES (-1, 0, 4096)"),
            "holds a pid no process has",
        ),
        (
            format!("DROP TABLE {table}; CREATE TABLE {table}(pid INTEGER, start_ptr INTEGER)"),
            "is not the table gpusleuth writes",
        ),
    ] {
        sql(file, &damage);
        let msg = began().expect_err(&damage).to_string();
        assert!(msg.contains(table) && msg.contains(what), "{msg}");
        assert_eq!(msg.lines().count(), 1, "{msg}");
        sql(
            file,
            &format!("DROP TABLE {table}; CREATE TABLE {table}(pid INTEGER NOT NULL, start_ptr INTEGER NOT NULL, end_ptr INTEGER NOT NULL)"),
        );
    }
}

/// Memory pinned in file 1 (`a`) and copied from in files 2 and 3: the
/// tracer judges each file's copies at its completion against the ranges
/// it carries (`meta.run_copies_judged`), so once `--keep` deleted the
/// files that pinned it, the run (whose reader knows only `c`, pinned in
/// file 2, and would judge file 3 again against it), a file read alone
/// (without a note that its earlier files' pinned memory is unknown) and
/// an op's scope still count the copies from it pinned; the copy from the
/// buffer unpinned in file 2 (`b`) stays pageable. The whole run answers as
/// one trace of the same calls.
#[test]
fn copies_are_judged_at_completion_against_the_whole_runs_pinned_memory() {
    use sleuth_core::findings::inputs::{FindingInputs, PinnedState};
    let dir = TempDir::new("run-copies-judged");
    let run = dir.join("run");
    let (a, b, c) = (0x7000_0000u64, 0x9000_0000u64, 0xb000_0000u64);
    let pin = |ts, ptr| {
        let mut c = call("cudaHostAlloc", ts, MS);
        (c.ptr, c.size) = (Some(ptr), Some(1 << 20));
        c
    };
    let copy = |ts, ptr| {
        let mut c = call("cudaMemcpy", ts, MS);
        (c.host_ptr, c.size, c.kind) = (Some(ptr + 64), Some(4096), Some(1));
        c
    };
    let mut unpin = call("cudaFreeHost", 120 * MS, MS);
    unpin.ptr = Some(b);
    let parts = vec![
        part(vec![pin(0, a), pin(MS, b), copy(5 * MS, a)]),
        part(vec![
            copy(100 * MS, a),
            copy(110 * MS, a),
            unpin,
            pin(130 * MS, c),
        ]),
        part(vec![
            copy(200 * MS, a),
            copy(210 * MS, b),
            copy(220 * MS, c),
        ]),
    ];
    write_run(&run, &RunLink::new_run(), 1, &parts);
    // (pageable, pinned) copies over every thread.
    let counts = |i: &FindingInputs| -> (u64, u64) {
        i.threads.values().fold((0, 0), |(p, k), t| {
            (p + t.pageable.count, k + t.pageable.pinned_copies)
        })
    };
    let whole = dir.join("whole.db");
    let mut all = parts[0].clone();
    for p in &parts[1..] {
        all.calls.extend(p.calls.iter().cloned());
    }
    common::rewrite(&all, &whole);
    let one = sleuth_store::lean::load(&sleuth_store::Trace::open(&whole).unwrap(), None, budget())
        .unwrap()
        .unwrap();
    assert_eq!(counts(&one.inputs), (1, 5), "the calls as one trace");
    assert_eq!(counts(&load(&run, None, budget()).unwrap().inputs), (1, 5));
    // As `--keep 2` leaves it: file 1, which pinned `a`, is gone.
    std::fs::remove_file(run.join(part_name(1))).unwrap();
    let kept = load(&run, None, budget()).unwrap();
    assert_eq!(counts(&kept.inputs), (1, 4), "file 2's and 3's copies of a");
    // As `--keep 1` leaves it: file 3 alone, nothing beside it to read.
    std::fs::remove_file(run.join(part_name(2))).unwrap();
    let third = sleuth_store::Trace::open(&run.join(part_name(3))).unwrap();
    let alone = sleuth_store::lean::load(&third, None, budget())
        .unwrap()
        .unwrap();
    assert_eq!(counts(&alone.inputs), (1, 2), "file 3 read alone");
    assert_eq!(alone.run_file, None, "nothing it cannot know");
    // A window of it starts from the ranges it stored as pinned when it began.
    let began = sleuth_store::run::pinned_when_file_began(
        &run,
        3,
        None,
        &budget(),
        &sleuth_store::CheckMemo::new(),
    )
    .unwrap();
    assert_eq!(began.ranges().len(), 2, "a and c: {:?}", began.ranges());
    let scope = sleuth_store::CallFilter {
        op: Some("cudaMemcpy".into()),
        ..Default::default()
    };
    let op_scope = |earlier| {
        let p = sleuth_store::scoped::window_parts_after(
            &third,
            &scope,
            earlier,
            sleuth_core::ledger::LedgerBuilder::new(None),
        )
        .unwrap();
        counts(&p.inputs)
    };
    assert_eq!(
        op_scope(PinnedState::default()),
        (1, 2),
        "cudaMemcpy's scope"
    );
    // A reader that knows less than the tracer (`c` alone) takes its judgement.
    let only_c = PinnedState::from_ranges([(100, c, c + (1 << 20))]);
    assert_eq!(op_scope(only_c), (1, 2), "cudaMemcpy's scope, c known");
}

/// A file on a chain that did not start at the run's file 1 (its earlier
/// files never completed) cannot know what they pinned: it stores no
/// ranges it began with, its copies count pageable, and read alone it
/// says it is a later file of a run (`run_file`).
#[test]
fn a_chain_begun_after_file_1_does_not_claim_the_runs_pinned_memory() {
    let dir = TempDir::new("run-late-chain");
    let run = dir.join("run");
    let mut copy = call("cudaMemcpy", 100 * MS, MS);
    (copy.host_ptr, copy.size, copy.kind) = (Some(0x7000_0040), Some(4096), Some(1));
    write_run(&run, &RunLink::new_run(), 2, &[part(vec![copy])]);
    let second = sleuth_store::Trace::open(&run.join(part_name(2))).unwrap();
    let lean = sleuth_store::lean::load(&second, None, budget())
        .unwrap()
        .unwrap();
    let pageable: u64 = lean.inputs.threads.values().map(|t| t.pageable.count).sum();
    assert_eq!(pageable, 1);
    assert_eq!(lean.run_file, Some(2));
    assert_eq!(meta(&run.join(part_name(2)), "run_copies_judged"), None);
}

/// `memory --at` of a run (`run_explain::load_memory_at`): at moments in
/// each of the three files, before and after A's free, the run's ledgers
/// equal the ledger of one trace of the same calls at the same moment
/// (`memory --at` of one file); the files that began after the moment are
/// not read. A moment given from the oldest file's start is the same.
/// Outside the files, a one-line error; files `--keep` deleted: a note.
#[test]
fn the_ledger_at_a_moment_of_a_run_is_the_whole_traces_at_that_moment() {
    use sleuth_store::run_explain::{load_memory_at, Moment};
    let tmp = TempDir::new("runled-at");
    let run = tmp.join("run");
    let parts = three_parts();
    write_run_cut_at(&run, &parts);
    let mut all = parts[0].clone();
    for p in &parts[1..] {
        all.calls.extend(p.calls.iter().cloned());
        all.stacks.extend(p.stacks.clone());
    }
    let whole = tmp.join("whole.db");
    rewrite_with_options(&all, &whole, WriterOptions::default());
    let one = sleuth_store::Trace::open(&whole).unwrap();
    let memo = sleuth_store::CheckMemo::new();
    let at = |m| load_memory_at(&run, None, m, budget(), &memo);
    // The same run without the states its files began with: every file replayed.
    let old = without_carried(&run, &tmp.join("old"));
    for (t, files, replayed) in [
        (MS / 2, 1, 1),
        (5 * MS, 1, 3),
        (150 * MS, 2, 0),
        (215 * MS, 3, 1),
        (225 * MS, 3, 2),
        (230 * MS + 10_000, 3, 3),
    ] {
        let r = at(Moment::At(t)).unwrap();
        // One file's memory calls replayed, from the state it began with.
        assert_eq!(r.replayed_memory_calls, replayed, "at {t}");
        let full = load_memory_at(&old, None, Moment::At(t), budget(), &memo).unwrap();
        assert_eq!(
            (&r.ledgers, &r.sites_at),
            (&full.ledgers, &full.sites_at),
            "at {t}"
        );
        if files > 1 {
            assert!(full.replayed_memory_calls > replayed, "at {t}");
        }
        // One process asked for (`--pid`): the same from its state alone.
        let one_pid = load_memory_at(&run, Some(100), Moment::At(t), budget(), &memo).unwrap();
        let one_full = load_memory_at(&old, Some(100), Moment::At(t), budget(), &memo).unwrap();
        assert_eq!(one_pid.ledgers, one_full.ledgers, "pid 100 at {t}");
        assert_eq!(one_pid.sites_at, one_full.sites_at, "pid 100 at {t}");
        assert_eq!(
            one_pid.ledgers, r.ledgers,
            "pid 100 is the only process, at {t}"
        );
        let view = sleuth_store::stream::MemoryTrace::open(&one, None, budget()).unwrap();
        let want = view.ledgers(Some(t)).unwrap();
        // The per-site table then, bytes at the peak up to then included.
        let sites = view.sites_streamed(&want, Some(t)).unwrap();
        assert_eq!(r.sites_at, sites, "sites at {t}");
        assert!(!sites.is_empty(), "at {t}");
        assert_eq!(r.ledgers, want, "at {t}");
        assert_eq!(r.at_ns, Some(t));
        assert_eq!(r.files.len(), files, "at {t}");
        assert_eq!(r.ledger_note, None);
    }
    // A (1 MiB) and B (2 MiB) live at 150 ms; A freed at 210 ms.
    let live = |t| at(Moment::At(t)).unwrap().ledgers[0].live_bytes;
    assert_eq!(live(150 * MS), 3 << 20);
    assert_eq!(live(215 * MS), 2 << 20);
    let start = at(Moment::At(0)).unwrap().data.start_ns.unwrap();
    let since = at(Moment::Since(150 * MS - start)).unwrap();
    assert_eq!(since.at_ns, Some(150 * MS));
    assert_eq!(since.ledgers[0].live_bytes, 3 << 20);
    let past = match at(Moment::At(10_000 * MS)) {
        Err(e) => e.to_string(),
        Ok(_) => panic!("a moment past the run answered"),
    };
    assert!(past.contains("outside the run's finished files"), "{past}");
    assert_eq!(past.lines().count(), 1, "{past}");
    // A state holding a call that returned after the moment is not taken
    // up: the files are replayed (the same answer).
    let whole_run = at(Moment::At(215 * MS)).unwrap();
    sql(
        &run.join(part_name(3)),
        &format!(
            "UPDATE meta SET value = '{}' WHERE key = 'run_ledger_begin_until'",
            216 * MS
        ),
    );
    let late = at(Moment::At(215 * MS)).unwrap();
    assert_eq!(late.replayed_memory_calls, 4);
    assert_eq!(
        (&late.ledgers, &late.sites_at),
        (&whole_run.ledgers, &whole_run.sites_at)
    );
    sql(
        &run.join(part_name(3)),
        &format!(
            "UPDATE meta SET value = '{}' WHERE key = 'run_ledger_begin_until'",
            2 * MS + 1
        ),
    );
    // As `--keep 2` leaves it: the state file 2 began with still knows
    // what file 1 allocated, so the answer is the whole run's.
    let before = at(Moment::At(150 * MS)).unwrap();
    std::fs::remove_file(run.join(part_name(1))).unwrap();
    let pruned = at(Moment::At(150 * MS)).unwrap();
    assert_eq!(pruned.ledgers, before.ledgers);
    assert_eq!(pruned.sites_at, before.sites_at);
    assert_eq!(pruned.ledgers[0].live_bytes, 3 << 20);
    assert!(
        pruned
            .ledger_note
            .as_deref()
            .unwrap()
            .contains("also covers the 1 earlier file(s)"),
        "{:?}",
        pruned.ledger_note
    );
    let pruned_late = at(Moment::At(215 * MS)).unwrap();
    assert_eq!(pruned_late.ledgers, whole_run.ledgers);
    // Without the states, the replay cannot know it (a note says so).
    std::fs::remove_file(old.join(part_name(1))).unwrap();
    let replayed = load_memory_at(&old, None, Moment::At(150 * MS), budget(), &memo).unwrap();
    assert_eq!(replayed.ledgers[0].live_bytes, 0);
    assert!(
        replayed
            .ledger_note
            .as_deref()
            .unwrap()
            .contains("first 1 file(s) are gone"),
        "{:?}",
        replayed.ledger_note
    );
}

/// Calls that returned in the last milliseconds before a rotation are
/// drained into the next file (a record belongs to the file open when it
/// is drained): a moment between their return and the next file's start
/// counts them, as the whole trace does (round 55's tester: `memory --db
/// DIR --at T` in the last ~3 ms of a file missed an allocation and a free
/// stored in the next file).
#[test]
fn a_moment_counts_the_calls_drained_into_the_next_file() {
    use sleuth_store::run_explain::{load_memory_at, Moment};
    let tmp = TempDir::new("runled-late");
    let run = tmp.join("run");
    let parts = vec![
        part(vec![
            at(alloc(MS, 1 << 20, 0xa000), SITE_A),
            call("cudaLaunchKernel", 10 * MS, MS),
        ]),
        // Returned at 97 and 98 ms, stored in file 2 (begun at 100 ms).
        part(vec![
            at(alloc(97 * MS, 2 << 20, 0xb000), SITE_B),
            free(98 * MS, 0xa000),
            call("cudaLaunchKernel", 150 * MS, MS),
            free(160 * MS, 0xb000),
        ]),
    ];
    write_run_cut(&run, &parts, &[0, 100 * MS]);
    let mut all = parts[0].clone();
    all.calls.extend(parts[1].calls.iter().cloned());
    all.stacks.extend(parts[1].stacks.clone());
    let whole = tmp.join("whole.db");
    rewrite_with_options(&all, &whole, WriterOptions::default());
    let one = sleuth_store::Trace::open(&whole).unwrap();
    let view = sleuth_store::stream::MemoryTrace::open(&one, None, budget()).unwrap();
    let memo = sleuth_store::CheckMemo::new();
    // Without the states the files began with: every file replayed.
    let old = without_carried(&run, &tmp.join("old"));
    for t in [
        96 * MS,
        97 * MS + MS / 2,
        99 * MS,
        120 * MS,
        160 * MS + MS / 100,
    ] {
        let want = view.ledgers(Some(t)).unwrap();
        for (how, dir) in [("carried", &run), ("replayed", &old)] {
            for pid in [None, Some(100)] {
                let got = load_memory_at(dir, pid, Moment::At(t), budget(), &memo).unwrap();
                assert_eq!(got.ledgers, want, "{how} {pid:?} at {t}");
            }
        }
    }
    let live = |t| {
        load_memory_at(&run, None, Moment::At(t), budget(), &memo)
            .unwrap()
            .ledgers[0]
            .live_bytes
    };
    assert_eq!(live(96 * MS), 1 << 20);
    assert_eq!(
        live(99 * MS),
        2 << 20,
        "the late allocation and free counted"
    );
}

/// `explain --last` of a window holding the whole of the run's file 1:
/// its ledger takes up the state the tracer stored as the last finished
/// file began, and replays the memory calls from that file on only; the
/// explanation equals the replay of every file's (the same run without
/// its carried states). A window from later in file 1, a run without
/// states, or a run without its file 1 replay every file; with the newest
/// file still being written, the state is the last finished file's.
#[test]
fn a_window_from_the_runs_start_takes_up_the_carried_ledger() {
    use sleuth_store::run_window::RunLast;
    let tmp = TempDir::new("runled-window");
    let run = tmp.join("run");
    // A second process, only in file 1, holds 8 MiB from then on.
    let mut parts = three_parts();
    let mut other = alloc(3 * MS, 8 << 20, 0xd000);
    (other.pid, other.tid) = (200, 200);
    parts[0] = part(parts[0].calls.iter().cloned().chain([other]).collect());
    write_run_cut_at(&run, &parts);
    let old = without_carried(&run, &tmp.join("old"));
    let memo = sleuth_store::CheckMemo::new();
    let window = |dir: &Path, first: u64, since: u64| RunLast {
        dir: dir.to_path_buf(),
        files: (first..=3).map(|n| (n, dir.join(part_name(n)))).collect(),
        since,
        end: u64::MAX,
        run_start: 0,
        oldest_kept: first,
        budget: budget(),
    };
    let explain = |w: &RunLast, pid: Option<u32>| {
        let (e, read) = w.explanation(pid, &memo).unwrap();
        (serde_json::to_value(&e).unwrap(), read.ledger_from_file)
    };
    for (pid, held) in [
        (None, "held 2.0 MiB of device memory in 1 allocation(s)"),
        (
            Some(100),
            "held 2.0 MiB of device memory in 1 allocation(s)",
        ),
        // Process 200 is in no file from the state's on: the state is its ledger.
        (
            Some(200),
            "held 8.0 MiB of device memory in 1 allocation(s)",
        ),
    ] {
        let (carried, from) = explain(&window(&run, 1, 0), pid);
        let (replayed, none) = explain(&window(&old, 1, 0), pid);
        assert_eq!((from, none), (Some(3), None), "pid {pid:?}");
        assert_eq!(carried, replayed, "pid {pid:?}");
        // Made in file 1, held at the end: in the ledger only through the state.
        assert!(carried.to_string().contains(held), "pid {pid:?}: {carried}");
    }
    // From inside file 1 (after A and B were made): replayed, and B is not the window's.
    let (late, from) = explain(&window(&run, 1, 5 * MS), None);
    assert_eq!(from, None);
    assert_eq!(late, explain(&window(&old, 1, 5 * MS), None).0);
    assert!(!late.to_string().contains("held 2.0 MiB"), "{late}");
    // Without file 1 (deleted by --keep): what it made is before the window.
    let (kept, from) = explain(&window(&run, 2, 0), None);
    assert_eq!(from, None);
    assert_eq!(kept, explain(&window(&old, 2, 0), None).0);
    // The newest file still being written (no rollups, no link, no state):
    // file 2's state, files 2 and 3 replayed.
    for dir in [&run, &old] {
        sql(
            &dir.join(part_name(3)),
            "DELETE FROM meta WHERE key = 'rollups' OR key LIKE 'run%'; DROP TABLE call_groups",
        );
    }
    let (live, from) = explain(&window(&run, 1, 0), None);
    assert_eq!(from, Some(2));
    assert_eq!(live, explain(&window(&old, 1, 0), None).0);
    assert!(live.to_string().contains("held 2.0 MiB"), "{live}");
}

/// A process of pid `pid` (comm "job") that exited at `exit_ns`, if given.
fn process(pid: u32, exit_ns: Option<u64>) -> sleuth_core::ProcessInfo {
    sleuth_core::ProcessInfo {
        pid,
        comm: "job".into(),
        exit_ns,
        ..Default::default()
    }
}

/// `call` made by process `pid` (its main thread).
fn by(pid: u32, mut c: CallEvent) -> CallEvent {
    (c.pid, c.tid) = (pid, pid);
    c
}

/// Four files of a node agent's run: process 100 lives throughout (A made
/// in file 1, freed in file 4); 300 allocates 2 MiB and exits in file 1;
/// 400 allocates 8 MiB and exits in file 2; 500 allocates 4 MiB in file 1
/// and exits in file 3 with no call there.
fn exiting_parts() -> (Vec<TraceData>, Vec<u64>) {
    let with = |calls: Vec<CallEvent>, procs: Vec<sleuth_core::ProcessInfo>| {
        let mut d = part(calls);
        d.processes.extend(procs);
        d
    };
    let parts = vec![
        with(
            vec![
                at(alloc(0, 1 << 20, 0xa000), SITE_A),
                by(300, at(alloc(5 * MS, 2 << 20, 0x3000), SITE_B)),
                by(300, call("cudaLaunchKernel", 6 * MS, MS)),
                by(500, at(alloc(20 * MS, 4 << 20, 0x5000), SITE_B)),
                call("cudaLaunchKernel", 30 * MS, MS),
            ],
            vec![process(300, Some(10 * MS)), process(500, None)],
        ),
        with(
            vec![
                by(400, at(alloc(110 * MS, 8 << 20, 0x4000), SITE_A)),
                call("cudaLaunchKernel", 150 * MS, MS),
            ],
            vec![process(400, Some(120 * MS))],
        ),
        with(
            vec![call("cudaLaunchKernel", 250 * MS, MS)],
            vec![process(500, Some(210 * MS))],
        ),
        with(
            vec![
                free(310 * MS, 0xa000),
                call("cudaLaunchKernel", 350 * MS, MS),
            ],
            vec![],
        ),
    ];
    (parts, vec![0, 100 * MS, 200 * MS, 300 * MS])
}

/// The tracer retires a process from the run's carried ledger once it
/// exited (round 47): the file it exited in stores its final ledger (and
/// its final state, `run_ledger_exited`), later files carry only the live
/// ones; readers find a retired process in the file it exited in. Every
/// answer equals the replay of the same files: the ledger at the end, at
/// moments in each file (from the last file's start state and the final
/// states), of one process, a window from the run's start, and the run
/// with its first file deleted (`--keep`).
#[test]
fn exited_processes_leave_the_carried_ledger_and_are_read_where_they_exited() {
    use sleuth_store::run_explain::{load_memory_at, Moment};
    let tmp = TempDir::new("runled-exited");
    let run = tmp.join("run");
    let (parts, starts) = exiting_parts();
    write_run_cut(&run, &parts, &starts);
    let rows = |n: u64, table: &str| -> Vec<i64> {
        let c = Connection::open(run.join(part_name(n))).unwrap();
        let mut st = c
            .prepare(&format!("SELECT pid FROM {table} ORDER BY pid"))
            .unwrap();
        let pids = st.query_map([], |r| r.get(0)).unwrap();
        pids.map(Result::unwrap).collect()
    };
    // Each file's run ledger: the processes alive at its end and those that
    // exited in it; the count of processes retired on the chain so far.
    for (n, ledger, exited, retired) in [
        (1, vec![100, 300, 500], vec![300], "1"),
        (2, vec![100, 400, 500], vec![400], "2"),
        (3, vec![100, 500], vec![500], "3"),
        (4, vec![100], vec![], "3"),
    ] {
        assert_eq!(rows(n, "run_ledger"), ledger, "file {n}");
        assert_eq!(rows(n, "run_ledger_exited"), exited, "file {n}");
        let path = run.join(part_name(n));
        assert_eq!(meta(&path, "run_ledger_retired").as_deref(), Some(retired));
        assert_eq!(meta(&path, "run_ledger_from").as_deref(), Some("1"));
    }
    assert_eq!(rows(4, "run_ledger_begin"), vec![100]);
    let old = without_carried(&run, &tmp.join("old"));
    let carried = load(&run, None, budget()).unwrap();
    assert_eq!(carried.replayed_memory_calls, 0);
    let replayed = load(&old, None, budget()).unwrap();
    assert!(replayed.replayed_memory_calls >= 5);
    assert_same_answer(&carried, &replayed);
    let pids: Vec<u32> = carried.ledgers.iter().map(|l| l.pid).collect();
    assert_eq!(pids, [100, 300, 400, 500]);
    let unfreed = |r: &RunLean, pid| {
        let l = r.ledgers.iter().find(|l| l.pid == pid).unwrap();
        l.unfreed.iter().map(|u| u.bytes).sum::<u64>()
    };
    assert_eq!(unfreed(&carried, 100), 0);
    assert_eq!(unfreed(&carried, 400), 8 << 20);
    for pid in [300, 400, 500] {
        let one = load(&run, Some(pid), budget()).unwrap();
        assert_eq!(one.replayed_memory_calls, 0, "pid {pid}");
        assert_eq!(
            one.ledgers,
            load(&old, Some(pid), budget()).unwrap().ledgers
        );
    }
    // At moments in each file: one file's memory calls replayed.
    let memo = sleuth_store::CheckMemo::new();
    for t in [50 * MS, 150 * MS, 250 * MS, 305 * MS, 320 * MS] {
        let r = load_memory_at(&run, None, Moment::At(t), budget(), &memo).unwrap();
        let full = load_memory_at(&old, None, Moment::At(t), budget(), &memo).unwrap();
        assert_eq!(
            (&r.ledgers, &r.sites_at),
            (&full.ledgers, &full.sites_at),
            "at {t}"
        );
        assert!(r.replayed_memory_calls <= 4, "at {t}");
        for pid in [100, 300, 400, 500] {
            let one = load_memory_at(&run, Some(pid), Moment::At(t), budget(), &memo);
            let one_full = load_memory_at(&old, Some(pid), Moment::At(t), budget(), &memo);
            match (one, one_full) {
                (Ok(a), Ok(b)) => {
                    assert_eq!(
                        (a.ledgers, a.sites_at),
                        (b.ledgers, b.sites_at),
                        "{pid} at {t}"
                    )
                }
                // Of a process in no file begun by then: the same error.
                (Err(a), Err(b)) => {
                    let why = |e: sleuth_store::StoreError| {
                        let e = e.to_string();
                        e[e.find(": ").unwrap()..].to_string()
                    };
                    assert_eq!(why(a), why(b), "{pid} at {t}")
                }
                (a, b) => panic!("pid {pid} at {t}: {:?} vs {:?}", a.err(), b.err()),
            }
        }
    }
    let late = load_memory_at(&run, None, Moment::At(320 * MS), budget(), &memo).unwrap();
    assert_eq!(late.replayed_memory_calls, 1);
    assert_eq!(late.ledgers.len(), 4);
    // A window from the run's start takes up file 4's start state and the
    // final states of the processes retired before it.
    let window = |dir: &Path| sleuth_store::run_window::RunLast {
        dir: dir.to_path_buf(),
        files: (1..=4).map(|n| (n, dir.join(part_name(n)))).collect(),
        since: 0,
        end: u64::MAX,
        run_start: 0,
        oldest_kept: 1,
        budget: budget(),
    };
    let (w, read) = window(&run).explanation(None, &memo).unwrap();
    let (w_old, _) = window(&old).explanation(None, &memo).unwrap();
    assert_eq!(read.ledger_from_file, Some(4));
    assert_eq!(
        serde_json::to_value(&w).unwrap(),
        serde_json::to_value(&w_old).unwrap()
    );
    // File 1 deleted (`--keep 3`): the carried ledger still matches A's
    // free; 400 is read from file 2, where it exited.
    std::fs::remove_file(run.join(part_name(1))).unwrap();
    let kept = load(&run, None, budget()).unwrap();
    assert_eq!(kept.replayed_memory_calls, 0);
    let l = kept.ledgers.iter().find(|l| l.pid == 100).unwrap();
    assert_eq!((l.allocs, l.frees, l.unmatched_frees), (1, 1, 0));
    assert_eq!(unfreed(&kept, 400), 8 << 20);
    let at = load_memory_at(&run, None, Moment::At(305 * MS), budget(), &memo).unwrap();
    let pids: Vec<u32> = at.ledgers.iter().map(|l| l.pid).collect();
    // 300 exited in file 1, no longer in the directory: not listed.
    assert_eq!(pids, [100, 400, 500]);
    assert_eq!(at.ledgers[0].live_bytes, 1 << 20);
}

/// A pid the carried ledger retired at its exit that makes a call again
/// (a reused pid) is another process: the chain goes on, the run's answer
/// is the latest process of the pid, and `--keep` deleting the files
/// before the comeback loses nothing of the other processes (until round
/// 53 the chain restarted there, and they lost what those files held).
#[test]
fn a_retired_pid_that_comes_back_is_another_process_and_the_chain_goes_on() {
    let tmp = TempDir::new("runled-reused");
    let run = tmp.join("run");
    let (mut parts, starts) = exiting_parts();
    // Process 100 keeps 2 MiB made in file 1; pid 300, retired at its exit
    // in file 1, comes back in file 4 (a reused pid).
    parts[0].calls.push(alloc(40 * MS, 2 << 20, 0xb000));
    parts[3].calls.push(by(300, alloc(360 * MS, 4096, 0x9000)));
    write_run_cut(&run, &parts, &starts);
    let last = run.join(part_name(4));
    assert_eq!(meta(&last, "run_ledger_from").as_deref(), Some("1"));
    let carried = load(&run, None, budget()).unwrap();
    assert_eq!(carried.replayed_memory_calls, 0);
    let of = |r: &RunLean, pid| {
        let l = r.ledgers.iter().find(|l| l.pid == pid).unwrap();
        (l.allocs, l.live_bytes)
    };
    // The run's answer is the latest process of the pid; a replay of the
    // files adds both up under it.
    assert_eq!(of(&carried, 300), (1, 4096));
    assert_eq!(of(&carried, 100), (2, 2 << 20));
    let replayed = load(&without_carried(&run, &tmp.join("old")), None, budget()).unwrap();
    assert_eq!(of(&replayed, 300).0, 2);
    // `--keep` deletes the files before the comeback: what process 100
    // made in file 1 is still held (before round 53 the chain restarted at
    // file 4, and it was lost without a word).
    for n in 1..=3 {
        std::fs::remove_file(run.join(part_name(n))).unwrap();
    }
    let kept = load(&run, None, budget()).unwrap();
    assert_eq!(kept.replayed_memory_calls, 0);
    assert_eq!(of(&kept, 100), (2, 2 << 20));
    assert_eq!(of(&kept, 300), (1, 4096));
}

/// The node agent's case: more short-lived processes than the carried
/// bound counts alive (`PROCESS_ENTRIES` each), spread over files, each
/// exiting in the file it ran in: the chain holds (no note), the last
/// file began with only the live process and lists besides it only those
/// that exited in it, and a reader of the run answers for every process
/// without replaying a memory call.
#[test]
fn processes_that_come_and_go_keep_the_chain_whole() {
    use sleuth_store::run_ledger::{MAX_CARRIED_ENTRIES, PROCESS_ENTRIES};
    let tmp = TempDir::new("runled-churn");
    let run = tmp.join("run");
    let files = 4u32;
    let per_file = (MAX_CARRIED_ENTRIES / PROCESS_ENTRIES) as u32 / 2;
    let mut parts = Vec::new();
    for f in 0..files {
        let t0 = u64::from(f) * 10_000 * MS;
        let mut calls = vec![call("cudaLaunchKernel", t0 + MS, MS)];
        let mut procs = Vec::new();
        for i in 0..per_file {
            let pid = 1000 + f * per_file + i;
            let t = t0 + 2 * MS + u64::from(i) * 1000;
            calls.push(by(pid, alloc(t, 4096, 0x10_0000)));
            procs.push(process(pid, Some(t + 100 * 1000)));
        }
        let mut d = part(calls);
        d.processes.extend(procs);
        parts.push(d);
    }
    let starts: Vec<u64> = (0..files).map(|f| u64::from(f) * 10_000 * MS).collect();
    write_run_cut(&run, &parts, &starts);
    let last = run.join(part_name(u64::from(files)));
    assert_eq!(meta(&last, "run_ledger_from").as_deref(), Some("1"));
    let retired = (files * per_file).to_string();
    assert_eq!(
        meta(&last, "run_ledger_retired").as_deref(),
        Some(&*retired)
    );
    let c = Connection::open(&last).unwrap();
    let count = |table: &str| -> u32 {
        let sql = format!("SELECT count(*) FROM {table}");
        c.query_row(&sql, [], |r| r.get(0)).unwrap()
    };
    assert_eq!(count("run_ledger_begin"), 1);
    assert_eq!(count("run_ledger"), per_file + 1);
    assert_eq!(count("run_ledger_exited"), per_file);
    let r = load(&run, None, budget()).unwrap();
    assert_eq!(r.replayed_memory_calls, 0);
    assert_eq!(r.ledgers.len(), (files * per_file) as usize + 1);
    assert!(r
        .ledgers
        .iter()
        .filter(|l| l.pid >= 1000)
        .all(|l| l.unfreed.len() == 1));
}

/// The final states of retired processes are untrusted input too:
/// `memory --at` in a later file refuses, in one line naming
/// `run_ledger_exited`, a state no replay leaves, a foreign or second row,
/// or the table announced but gone; a meta count saying nothing was
/// retired stops the search (the answer then lacks the process, as the
/// file says), and an absent one is an older tracer's file.
#[test]
fn a_damaged_run_ledger_exited_is_refused_in_one_line() {
    use sleuth_store::run_explain::{load_memory_at, Moment};
    let refused = |tag: &str, craft: &str| {
        let tmp = TempDir::new(tag);
        let run = tmp.join("run");
        let (parts, starts) = exiting_parts();
        write_run_cut(&run, &parts, &starts);
        sql(&run.join(part_name(2)), craft);
        let memo = sleuth_store::CheckMemo::new();
        let e = match load_memory_at(&run, None, Moment::At(320 * MS), budget(), &memo) {
            Ok(_) => panic!("{tag}: accepted"),
            Err(e) => e.to_string(),
        };
        assert_eq!(e.lines().count(), 1, "{e}");
        assert!(e.contains("damaged trace: run_ledger_exited"), "{tag}: {e}");
        assert!(e.contains(&part_name(2)), "{tag}: {e}");
    };
    refused(
        "runexit-op",
        "UPDATE run_ledger_exited SET state = replace(state, '\"cudaMalloc\"', '\"cudaLaunchKernel\"')",
    );
    refused(
        "runexit-json",
        "UPDATE run_ledger_exited SET state = '{\"pid\": 400'",
    );
    refused("runexit-foreign", "UPDATE run_ledger_exited SET pid = 401");
    refused(
        "runexit-twice",
        "INSERT INTO run_ledger_exited SELECT * FROM run_ledger_exited",
    );
    refused("runexit-gone", "DROP TABLE run_ledger_exited");
}
