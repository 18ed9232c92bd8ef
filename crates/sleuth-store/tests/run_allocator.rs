//! The allocator views over a run of `trace --rotate --torch-allocator`
//! (`RunLean::allocator_views`, `RunLean::explanation`): rebuilt by passes
//! over the files' steps, none of them held, they are the views of the same
//! events loaded as one trace, at the end and at any moment, of every
//! process and of each; a damaged file is a one-line error naming it.

mod common;

use common::allocator_workload::{
    end_of, pid_of, random_allocator_workload, write, write_run, write_run_by,
};
use common::TempDir;
use serde_json::Value;
use sleuth_core::allocator::allocator_views;
use sleuth_core::testing::FilesInOrder;
use sleuth_core::Event;
use sleuth_store::run::part_name;
use sleuth_store::run_explain::{load, load_memory, load_memory_at, Moment};
use sleuth_store::{CheckMemo, ReadBudget, Trace};
use std::path::Path;

fn budget() -> ReadBudget {
    ReadBudget::new(sleuth_store::DEFAULT_READ_TIMEOUT)
}

fn json<T: serde::Serialize>(v: &T) -> Value {
    serde_json::to_value(v).unwrap()
}

/// Where two JSON values first differ (a path and both values), if they do.
fn first_difference(got: &Value, want: &Value, path: &str) -> Option<String> {
    match (got, want) {
        (Value::Object(a), Value::Object(b)) => {
            let keys: std::collections::BTreeSet<&String> = a.keys().chain(b.keys()).collect();
            keys.into_iter().find_map(|k| {
                let (x, y) = (
                    a.get(k).unwrap_or(&Value::Null),
                    b.get(k).unwrap_or(&Value::Null),
                );
                first_difference(x, y, &format!("{path}.{k}"))
            })
        }
        (Value::Array(a), Value::Array(b)) if a.len() == b.len() => a
            .iter()
            .zip(b)
            .enumerate()
            .find_map(|(i, (x, y))| first_difference(x, y, &format!("{path}[{i}]"))),
        _ => (got != want).then(|| format!("{path}: {got} != {want}")),
    }
}

fn assert_same(got: &Value, want: &Value, what: &str) {
    if let Some(d) = first_difference(got, want, "") {
        panic!("{what}: {d}");
    }
}

/// The fragmentation findings and the allocator's refusals of an explanation.
fn allocator_answers(e: &sleuth_core::findings::Explanation) -> (Vec<Value>, Vec<String>) {
    let findings = e
        .findings
        .iter()
        .filter(|f| f.kind == sleuth_core::findings::Kind::Fragmentation)
        .map(json)
        .collect();
    let refusals = e
        .notes
        .iter()
        .filter(|n| n.contains("allocator layout"))
        .cloned()
        .collect();
    (findings, refusals)
}

#[test]
fn a_runs_allocator_views_are_those_of_its_events_loaded_as_one_trace() {
    let dir = TempDir::new("run_allocator");
    let (events, end) = random_allocator_workload(0x2545_f491_4f6c_dd1d);
    let whole = dir.join("whole.db");
    write(&whole, &events, (1_000, end), None);
    // Four files, each holding the events that completed while it was the
    // one written: segments and blocks of one file used and freed in later ones.
    let cuts = [1_000, end / 4, end / 2, 3 * end / 4, end + 1];
    let run = dir.join("run");
    write_run(&run, &events, &cuts, end);
    let trace = Trace::open(&whole).unwrap();
    let data = trace.load(None).unwrap();
    assert!(
        data.blocks.len() > 1_000,
        "{} allocator events",
        data.blocks.len()
    );
    let memo = CheckMemo::new();

    // At the end, every process and each.
    for pid in [None, Some(100), Some(200)] {
        let r = load_memory(&run, pid, budget(), &memo).unwrap();
        assert_eq!(r.files.len(), 4);
        let got = r.allocator_views().unwrap();
        let mut want = allocator_views(&data, None, &r.ledgers);
        want.retain(|p, _| pid.is_none_or(|only| only == *p));
        assert_eq!(got.len(), if pid.is_some() { 1 } else { 2 });
        assert!(got.values().all(|v| v.state.is_some()), "views rebuilt");
        assert_same(&json(&got), &json(&want), &format!("pid {pid:?}"));
    }
    // The ledgers the views take their reserved bytes from are the whole
    // trace's.
    let r = load_memory(&run, None, budget(), &memo).unwrap();
    let live = |l: &[sleuth_core::ledger::ProcessLedger]| -> Vec<(u32, u64)> {
        l.iter().map(|p| (p.pid, p.live_bytes)).collect()
    };
    assert_eq!(
        live(&r.ledgers),
        live(&sleuth_core::ledger::ledger(&data, None))
    );

    // At moments: inside each file, at its first and last nanosecond.
    let mut moments: Vec<u64> = (1..10).map(|i| end * i / 10).collect();
    for &c in &cuts[1..4] {
        moments.extend([c - 1, c, c + 1]);
    }
    for at in moments {
        let r = load_memory_at(&run, None, Moment::At(at), budget(), &memo).unwrap();
        let got = r.allocator_views().unwrap();
        // The files that began by the moment, loaded as one trace: their
        // every step calibrates, those up to the moment are replayed.
        let mut began = sleuth_core::TraceData::default();
        for f in &r.files {
            let d = Trace::open(f).unwrap().load(None).unwrap();
            began.calls.extend(d.calls);
            began.blocks.extend(d.blocks);
        }
        assert!(r.files.len() < 4 || at >= cuts[3]);
        let want = allocator_views(&began, Some(at), &r.ledgers);
        assert_same(&json(&got), &json(&want), &format!("at {at} of {end}"));
    }

    // The explanation's fragmentation findings and refusals.
    let one = sleuth_store::lean::load(&trace, None, budget())
        .unwrap()
        .expect("a lean load");
    let merged = load(&run, None, budget()).unwrap();
    let answers = allocator_answers(&merged.explanation().unwrap());
    assert!(!answers.0.is_empty(), "a fragmentation finding");
    assert_eq!(answers, allocator_answers(&one.explanation()));

    // A window over the last three files (`--last`): the views at its end
    // replayed from the run's start (segments of file 1 serve blocks of
    // later files), as the run's files loaded as one trace give them; its
    // explanation answers.
    let last =
        sleuth_store::run_window::last_of_run(&run, end - cuts[1] - 10, &budget(), &memo).unwrap();
    assert_eq!(last.files.len(), 3);
    let mut spanned = sleuth_core::TraceData::default();
    for n in 1..=4 {
        let d = Trace::open(&run.join(part_name(n)))
            .unwrap()
            .load(None)
            .unwrap();
        spanned.calls.extend(d.calls);
        spanned.blocks.extend(d.blocks);
    }
    let none = std::collections::BTreeMap::new();
    for pid in [None, Some(200)] {
        let pids: Vec<u32> = [100, 200]
            .into_iter()
            .filter(|p| pid.is_none_or(|only| only == *p))
            .collect();
        let want =
            sleuth_core::allocator::KnownViews::until(&spanned, &spanned, &pids, None, &none);
        let got = last.allocator_views(pid, &memo, &spanned).unwrap();
        assert!(
            got.end().values().all(|v| v.state.is_some()),
            "views rebuilt"
        );
        assert_same(
            &json(got.end()),
            &json(want.end()),
            &format!("window, pid {pid:?}"),
        );
        let moments =
            |k: &sleuth_core::allocator::KnownViews| json(&k.moments().iter().collect::<Vec<_>>());
        assert_same(
            &moments(&got),
            &moments(&want),
            &format!("window moments, pid {pid:?}"),
        );
    }
    last.explanation(None, &memo).unwrap();
    assert!(
        !last.views_need_earlier_files(None, &memo).unwrap(),
        "it spans 3 files"
    );

    // A window inside the newest file: its views need the earlier files
    // (read over the run, as above), unless the file is the oldest left.
    let newest = sleuth_store::run_window::last_of_run(&run, 10, &budget(), &memo).unwrap();
    assert_eq!(newest.files.len(), 1);
    assert!(newest.views_need_earlier_files(None, &memo).unwrap());
    let want =
        sleuth_core::allocator::KnownViews::until(&spanned, &spanned, &[100, 200], None, &none);
    let got = newest.allocator_views(None, &memo, &spanned).unwrap();
    assert_same(&json(got.end()), &json(want.end()), "newest file's window");
    newest.explanation(None, &memo).unwrap();
    let alone = dir.join("alone");
    std::fs::create_dir_all(&alone).unwrap();
    std::fs::copy(run.join(part_name(4)), alone.join(part_name(4))).unwrap();
    let alone = sleuth_store::run_window::last_of_run(&alone, 10, &budget(), &memo).unwrap();
    assert!(!alone.views_need_earlier_files(None, &memo).unwrap());

    // A damaged word in the third file: a one-line error naming it, not a
    // view that stops there.
    let damaged = dir.join("damaged");
    std::fs::create_dir_all(&damaged).unwrap();
    for n in 1..=4 {
        std::fs::copy(run.join(part_name(n)), damaged.join(part_name(n))).unwrap();
    }
    rusqlite::Connection::open(damaged.join(part_name(3)))
        .unwrap()
        .execute_batch(
            "UPDATE allocator_rows SET w3 = 'x'
             WHERE id = (SELECT min(id) FROM allocator_rows WHERE w3 IS NOT NULL)",
        )
        .unwrap();
    // At the end the views the tracer carried answer: file 3's rows are
    // not read.
    let r = load_memory(&damaged, None, budget(), &CheckMemo::new()).unwrap();
    let carried = json(&r.allocator_views().unwrap());
    assert_same(
        &carried,
        &json(&allocator_views(&data, None, &r.ledgers)),
        "carried",
    );
    // At a moment in file 4 the replays file 4 began with answer; at one
    // in file 3 its steps are read.
    let at =
        |t| load_memory_at(&damaged, None, Moment::At(t), budget(), &CheckMemo::new()).unwrap();
    assert_eq!(at(end - 10).allocator_views().unwrap().len(), 2);
    let r = at((cuts[2] + cuts[3]) / 2);
    let err = r.allocator_views().unwrap_err().to_string();
    assert!(
        err.contains(&part_name(3)) && err.contains("no integer") && !err.contains('\n'),
        "{err}"
    );
    // Without the carried views (a file of an older gpusleuth) the
    // replay answers, and reads file 3.
    drop_carried_views(&damaged, 4..=4);
    let err = load(&damaged, None, budget())
        .unwrap()
        .explanation()
        .unwrap_err()
        .to_string();
    assert!(err.contains(&part_name(3)), "{err}");
}

/// A file of many processes, each a small part of it: the completion's
/// passes (the checkpoints' replay, the carried replays of a run) and the
/// readers' read each process's calls by its threads (one pass over every
/// memory call of the file per process made a file of N short-lived
/// PyTorch processes O(N²) to complete: round 53), and the views are those
/// of the events loaded as one trace, in one file and in a run.
#[test]
fn many_processes_views_read_by_their_threads_are_those_of_the_whole_trace() {
    let dir = TempDir::new("run_allocator_many");
    // Ten copies of the workload (processes 100 and 200, threads 101 and
    // 201) as twenty processes.
    let mut events = Vec::new();
    let mut end = 0;
    for k in 0..10u32 {
        let (e, e_end) = random_allocator_workload(0x9e37_79b9 + u64::from(k));
        end = end.max(e_end);
        let moved = |id: u32| {
            let base = if id >= 200 { 200 } else { 100 };
            1_000 + 1_000 * k + (base - 100) * 5 + (id - base)
        };
        events.extend(e.into_iter().map(|ev| match ev {
            Event::Call(mut c) => {
                (c.pid, c.tid) = (moved(c.pid), moved(c.tid));
                Event::Call(c)
            }
            Event::Block(mut b) => {
                (b.pid, b.tid) = (moved(b.pid), moved(b.tid));
                Event::Block(b)
            }
            other => other,
        }));
    }
    events.sort_by_key(|e| match e {
        Event::Block(b) => (b.end_ns, 1),
        Event::Call(c) => (c.ts_ns, 0),
        _ => (0, 0),
    });
    let before = sleuth_store::passes_by_threads_for_tests();
    let whole = dir.join("whole.db");
    write(&whole, &events, (1_000, end), None);
    let run = dir.join("run");
    write_run(&run, &events, &[1_000, end / 3, 2 * end / 3, end + 1], end);
    assert!(
        sleuth_store::passes_by_threads_for_tests() - before >= 20,
        "the completions read the processes by their threads"
    );
    let trace = Trace::open(&whole).unwrap();
    let data = trace.load(None).unwrap();
    let pids: std::collections::BTreeSet<u32> = data.blocks.iter().map(|b| b.pid).collect();
    assert_eq!(pids.len(), 20);
    let memo = CheckMemo::new();
    let mt = sleuth_store::stream::MemoryTrace::open(&trace, None, budget()).unwrap();
    let ledgers = mt.ledgers(None).unwrap();
    let one_file = mt.allocator_views(None, &ledgers).unwrap();
    let r = load_memory(&run, None, budget(), &memo).unwrap();
    let in_run = r.allocator_views().unwrap();
    let want = allocator_views(&data, None, &r.ledgers);
    assert_eq!(want.len(), 20);
    assert!(want.values().all(|v| v.state.is_some()), "views rebuilt");
    assert_same(&json(&one_file), &json(&want), "one file");
    assert_same(&json(&in_run), &json(&want), "run");
    // A moment of each process, replayed by a reader through its threads.
    let at = end / 2;
    let r = load_memory_at(&run, Some(1_500), Moment::At(at), budget(), &memo).unwrap();
    let mut began = sleuth_core::TraceData::default();
    for f in &r.files {
        let d = Trace::open(f).unwrap().load(None).unwrap();
        began.calls.extend(d.calls);
        began.blocks.extend(d.blocks);
    }
    let mut want = allocator_views(&began, Some(at), &r.ledgers);
    want.retain(|p, _| *p == 1_500);
    assert_same(
        &json(&r.allocator_views().unwrap()),
        &json(&want),
        "at a moment",
    );
}

/// Checks that each of the `n` files of `run` stored, for each process it
/// carried, the views a replay of the files up to it gives (at the end and
/// at the moment its finding describes); returns how many (file,
/// process) pairs were carried.
fn assert_carried(run: &Path, n: u64) -> usize {
    let mut files = Vec::new();
    let mut spanned = sleuth_core::TraceData::default();
    let none = std::collections::BTreeMap::new();
    let mut carried = 0;
    for k in 1..=n {
        let d = Trace::open(&run.join(part_name(k)))
            .unwrap()
            .load(None)
            .unwrap();
        spanned.stacks.extend(d.stacks.clone());
        files.push(d);
        let want = sleuth_core::allocator::KnownViews::until(
            &FilesInOrder(&files),
            &spanned,
            &[100, 200],
            None,
            &none,
        );
        let want_rows = |pid: u32| -> Vec<(Option<i64>, Value)> {
            let end = want.end().get(&pid).map(|v| (None, json(&v.to_stored())));
            let moments = want
                .moments()
                .iter()
                .filter(|((p, _), _)| *p == pid)
                .map(|(&(_, t), v)| (Some(t as i64), json(&v.to_stored())));
            end.into_iter().chain(moments).collect()
        };
        let c = rusqlite::Connection::open(run.join(part_name(k))).unwrap();
        let mut st = c
            .prepare("SELECT pid, at_ns, view FROM run_allocator ORDER BY pid, at_ns")
            .unwrap();
        let got: Vec<(u32, Option<i64>, Value)> = st
            .query_map([], |r| {
                let text: String = r.get(2)?;
                Ok((r.get(0)?, r.get(1)?, serde_json::from_str(&text).unwrap()))
            })
            .unwrap()
            .map(Result::unwrap)
            .collect();
        for pid in [100, 200] {
            let mine: Vec<(Option<i64>, Value)> = got
                .iter()
                .filter(|r| r.0 == pid)
                .map(|r| (r.1, r.2.clone()))
                .collect();
            if mine.is_empty() {
                continue;
            }
            carried += 1;
            let want = want_rows(pid);
            let keys = |v: &[(Option<i64>, Value)]| v.iter().map(|r| r.0).collect::<Vec<_>>();
            assert_eq!(keys(&mine), keys(&want), "file {k}, pid {pid}: moments");
            for (g, w) in mine.iter().zip(&want) {
                assert_same(&g.1, &w.1, &format!("file {k}, pid {pid} at {:?}", g.0));
            }
        }
    }
    carried
}

/// The allocator views of the run `dir` (all processes, and process 200
/// alone, which has some) and its explanation's allocator answers are
/// those of the whole trace `data` (`want_answers`).
fn assert_whole_traces_views(
    dir: &Path,
    data: &sleuth_core::TraceData,
    want_answers: &(Vec<Value>, Vec<String>),
) {
    for pid in [None, Some(200)] {
        let r = load_memory(dir, pid, budget(), &CheckMemo::new()).unwrap();
        let mut want = allocator_views(data, None, &r.ledgers);
        want.retain(|p, _| pid.is_none_or(|only| only == *p));
        assert!(want.contains_key(&200), "{}", dir.display());
        let got = r.allocator_views().unwrap();
        let what = format!("{} pid {pid:?}", dir.display());
        assert_same(&json(&got), &json(&want), &what);
    }
    let e = load(dir, None, budget()).unwrap().explanation().unwrap();
    assert_eq!(&allocator_answers(&e), want_answers, "{}", dir.display());
}

/// Leaves out of `run`'s files `files` the views the tracer carried (as
/// files of an older gpusleuth): a reader then replays them.
fn drop_carried_views(run: &Path, files: std::ops::RangeInclusive<u64>) {
    for n in files {
        rusqlite::Connection::open(run.join(part_name(n)))
            .unwrap()
            .execute_batch("DELETE FROM meta WHERE key = 'run_allocator'")
            .unwrap();
    }
}

/// Inserts process `pid`'s exit at `ts_ns` into `events` (in completion
/// order), before the first event that completes after it; its index.
fn insert_exit(events: &mut Vec<Event>, pid: u32, ts_ns: u64) -> usize {
    let at = events.iter().position(|e| end_of(e) > ts_ns).unwrap();
    let exit = sleuth_core::ProcEvent {
        kind: sleuth_core::ProcKind::Exit,
        ts_ns,
        pid,
        tid: pid,
        ppid: 0,
        exit_code: 0,
        comm: "python".into(),
    };
    events.insert(at, Event::Proc(exit));
    at
}

/// Copies of `run`'s files `files` into `dir`.
fn copy_run(run: &Path, dir: &Path, files: std::ops::RangeInclusive<u64>) {
    std::fs::create_dir_all(dir).unwrap();
    for n in files {
        std::fs::copy(run.join(part_name(n)), dir.join(part_name(n))).unwrap();
    }
}

#[test]
fn the_views_the_tracer_carried_are_the_replays_and_cover_deleted_files() {
    let dir = TempDir::new("run_allocator_carried");
    let (events, end) = random_allocator_workload(0x9e37_79b9_7f4a_7c15);
    let whole = dir.join("whole.db");
    write(&whole, &events, (1_000, end), None);
    // Six files; the last holds the events that completed at the end too.
    let mut cuts: Vec<u64> = (0..=6).map(|k| 1_000 + (end - 1_000) * k / 6).collect();
    cuts[6] = end + 1;
    let run = dir.join("run");
    write_run(&run, &events, &cuts, end);
    let data = Trace::open(&whole).unwrap().load(None).unwrap();
    let one = sleuth_store::lean::load(&Trace::open(&whole).unwrap(), None, budget())
        .unwrap()
        .expect("a lean load");
    let want_answers = allocator_answers(&one.explanation());
    assert!(!want_answers.0.is_empty(), "a fragmentation finding");
    // Every file stored the run's views up to its end, and at the moments
    // their findings describe: those a replay of the files so far gives.
    assert_eq!(
        assert_carried(&run, 6),
        12,
        "both processes carried in every file"
    );
    // Carried and replayed (the carried views left out of the last file)
    // give the whole trace's views and findings.
    let replayed = dir.join("replayed");
    copy_run(&run, &replayed, 1..=6);
    drop_carried_views(&replayed, 6..=6);
    for d in [&run, &replayed] {
        assert_whole_traces_views(d, &data, &want_answers);
    }

    // `--keep 4`: the first two files deleted. The carried views still
    // cover them (segments made there serve blocks of later files); a
    // replay of the files left cannot.
    let kept = dir.join("kept");
    copy_run(&run, &kept, 3..=6);
    let r = load_memory(&kept, None, budget(), &CheckMemo::new()).unwrap();
    assert_eq!(r.files.len(), 4);
    let got = r.allocator_views().unwrap();
    let want = allocator_views(&data, None, &r.ledgers);
    assert_same(&json(&got), &json(&want), "kept");
    let e = load(&kept, None, budget()).unwrap().explanation().unwrap();
    assert_eq!(allocator_answers(&e), want_answers, "kept");
    // A window `--last` over the kept files ends with the newest: its
    // views are the carried ones too.
    let memo = CheckMemo::new();
    let last = sleuth_store::run_window::last_of_run(&kept, end / 3, &budget(), &memo).unwrap();
    assert!(last.files.len() >= 2, "{} files", last.files.len());
    let got = last.allocator_views(None, &memo, &data).unwrap();
    assert_same(&json(got.end()), &json(&want), "kept window");
    drop_carried_views(&kept, 6..=6);
    let r = load_memory(&kept, None, budget(), &CheckMemo::new()).unwrap();
    assert_ne!(
        json(&r.allocator_views().unwrap()),
        json(&want),
        "a replay of the files left"
    );

    // Events that completed just before a rotation but reached the next
    // file (two CPUs on either side of it): the carried views are still
    // those a replay of the files in order gives, at the end and at the
    // moments of the findings (or the reader replays the process).
    let late = dir.join("late");
    let file_of = |e: &Event| {
        let t = end_of(e);
        // Half the events of the last eighth of a file go to the next one,
        // and a few of the next file's first ones stay in this one (no
        // tracer does that: a file then holds steps that completed after
        // its successor began, which a moment there must not take up).
        let band = (end - 1_000) / 48;
        let straddles = |c: u64| t < c && t + band >= c && t % 20 < 10;
        let lingers = |c: u64| t >= c && t < c + band / 8 && (t / 10) % 4 == 3;
        (0..6).find(|&k| {
            let hi = cuts[k + 1];
            let moved_in = (k > 0 && straddles(cuts[k])) || (k < 5 && lingers(cuts[k + 1]));
            let moved_out = (k < 5 && straddles(cuts[k + 1])) || (k > 0 && lingers(cuts[k]));
            ((cuts[k]..hi).contains(&t) && !moved_out) || moved_in
        })
    };
    let moved = events
        .iter()
        .filter(|e| file_of(e).is_some_and(|k| end_of(e) < cuts[k]))
        .count();
    write_run_by(&late, &events, &cuts, end, file_of);
    assert!(moved > 10, "{moved} events moved");
    let late_replayed = dir.join("late_replayed");
    copy_run(&late, &late_replayed, 1..=6);
    drop_carried_views(&late_replayed, 6..=6);
    let views = |d: &Path| {
        let r = load_memory(d, None, budget(), &CheckMemo::new()).unwrap();
        json(&r.allocator_views().unwrap())
    };
    assert_same(&views(&late), &views(&late_replayed), "straddling events");
    let carried = assert_carried(&late, 6);
    assert!(carried >= 8, "{carried} of 12 carried");
    let answers = |d: &Path| {
        json(
            &load(d, None, budget())
                .unwrap()
                .explanation()
                .unwrap()
                .findings,
        )
    };
    assert_eq!(answers(&late), answers(&late_replayed), "straddling events");

    // At moments: from the replays the file holding the moment began with
    // (`run_allocator_begin`), the views a replay of the files begun by
    // then gives, straddling events and all, around each rotation too.
    for d in [&run, &late] {
        let replayed = dir.join(&format!("{}_at", d.file_name().unwrap().to_string_lossy()));
        copy_run(d, &replayed, 1..=6);
        for n in 1..=6 {
            rusqlite::Connection::open(replayed.join(part_name(n)))
                .unwrap()
                .execute_batch("DELETE FROM meta WHERE key = 'run_allocator_begin'")
                .unwrap();
        }
        let mut moments: Vec<u64> = (1..6)
            .map(|i| 1_000 + (end - 1_000) * i / 6 + 777)
            .collect();
        for &c in &cuts[1..6] {
            moments.extend([c - 1, c + 1, c + (end - 1_000) / 48 / 16]);
        }
        for at in moments {
            let views = |dd: &Path| {
                let r =
                    load_memory_at(dd, None, Moment::At(at), budget(), &CheckMemo::new()).unwrap();
                json(&r.allocator_views().unwrap())
            };
            assert_same(
                &views(d),
                &views(&replayed),
                &format!("{} at {at}", d.display()),
            );
        }
    }

    // A damaged carried view: a one-line error naming the table and file.
    let damaged = dir.join("damaged");
    copy_run(&run, &damaged, 1..=6);
    rusqlite::Connection::open(damaged.join(part_name(6)))
        .unwrap()
        .execute_batch(
            "UPDATE run_allocator SET view = '{\"pid\": 100}' WHERE pid = 100 AND at_ns IS NULL",
        )
        .unwrap();
    let err = load_memory(&damaged, None, budget(), &CheckMemo::new())
        .unwrap()
        .allocator_views()
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("run_allocator") && err.contains(&part_name(6)) && !err.contains('\n'),
        "{err}"
    );

    // A damaged begin state: a one-line error naming the table and file,
    // at a moment in that file.
    let at = (cuts[4] + cuts[5]) / 2;
    for (i, damage) in [
        "UPDATE run_allocator_begin SET replay = 'x' WHERE pid = 100",
        "UPDATE run_allocator_begin SET before_ns = -5 WHERE pid = 100",
        "INSERT INTO run_allocator_begin SELECT * FROM run_allocator_begin WHERE pid = 100",
        "UPDATE run_allocator_begin SET replay = replace(replay, '\"layout\":[', '\"layout\":[1,') WHERE pid = 100",
        "UPDATE run_allocator_begin SET replay = replace(replay, '\"allocated\":', '\"allocated\":9223372036854775807') WHERE pid = 100",
    ]
    .iter()
    .enumerate()
    {
        let d = dir.join(&format!("damaged_begin_{i}"));
        copy_run(&run, &d, 1..=6);
        let c = rusqlite::Connection::open(d.join(part_name(5))).unwrap();
        assert_eq!(c.execute(damage, []).unwrap(), 1, "{damage}");
        drop(c);
        let err = load_memory_at(&d, None, Moment::At(at), budget(), &CheckMemo::new())
            .unwrap()
            .allocator_views()
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("run_allocator_begin") && err.contains(&part_name(5)) && !err.contains('\n'),
            "{damage}: {err}"
        );
    }
}

/// A process whose allocator views the tracer carries exits mid-run
/// (round 47): the file it exited in stores its views and lists it in
/// `run_ledger_exited`, later files carry it no more, and a reader of the
/// run takes its views from that file: the same views and findings as the
/// whole trace's and the replay's (the carried views left out), and still
/// the whole trace's once `--keep` deleted the files before it.
#[test]
fn a_process_that_exits_leaves_its_views_in_the_file_it_exited_in() {
    let dir = TempDir::new("run_allocator_exit");
    let (mut events, end) = random_allocator_workload(0x9e37_79b9_7f4a_7c15);
    // Process 200 stops at the run's middle and exits.
    let cut = 1_000 + (end - 1_000) / 2;
    events.retain(|e| pid_of(e) != 200 || end_of(e) <= cut);
    let exit_at = events
        .iter()
        .filter(|e| pid_of(e) == 200)
        .map(end_of)
        .max()
        .unwrap()
        + 1;
    let at = insert_exit(&mut events, 200, exit_at);
    let whole = dir.join("whole.db");
    write(&whole, &events, (1_000, end), None);
    let mut cuts: Vec<u64> = (0..=6).map(|k| 1_000 + (end - 1_000) * k / 6).collect();
    cuts[6] = end + 1;
    let run = dir.join("run");
    write_run(&run, &events, &cuts, end);
    let exit_file = (1..=6u64)
        .find(|&n| end_of(&events[at]) < cuts[n as usize])
        .unwrap();
    assert!(exit_file < 6, "exits in file {exit_file}");
    let pids = |n: u64, sql: &str| -> Vec<u32> {
        let c = rusqlite::Connection::open(run.join(part_name(n))).unwrap();
        let mut st = c.prepare(sql).unwrap();
        let v = st.query_map([], |r| r.get(0)).unwrap();
        v.map(Result::unwrap).collect()
    };
    let carried = "SELECT DISTINCT pid FROM run_allocator ORDER BY pid";
    assert_eq!(pids(exit_file, carried), [100, 200]);
    assert_eq!(pids(exit_file, "SELECT pid FROM run_ledger_exited"), [200]);
    assert_eq!(pids(6, carried), [100]);
    let data = Trace::open(&whole).unwrap().load(None).unwrap();
    let one = sleuth_store::lean::load(&Trace::open(&whole).unwrap(), None, budget())
        .unwrap()
        .expect("a lean load");
    let want_answers = allocator_answers(&one.explanation());
    let replayed = dir.join("replayed");
    copy_run(&run, &replayed, 1..=6);
    drop_carried_views(&replayed, 1..=6);
    for d in [&run, &replayed] {
        assert_whole_traces_views(d, &data, &want_answers);
    }
    // The files before the one it exited in deleted (`--keep`): its views
    // are still the whole trace's, read where it exited; a replay of the
    // files left could not give them.
    let kept = dir.join("kept");
    copy_run(&run, &kept, exit_file..=6);
    let r = load_memory(&kept, Some(200), budget(), &CheckMemo::new()).unwrap();
    let mut want = allocator_views(&data, None, &r.ledgers);
    want.retain(|p, _| *p == 200);
    assert_same(&json(&r.allocator_views().unwrap()), &json(&want), "kept");
    // At a moment in the last file (`memory --at`): its last views, where
    // it exited.
    let t = cuts[5] + (end - cuts[5]) / 2;
    let r = load_memory_at(&kept, None, Moment::At(t), budget(), &CheckMemo::new()).unwrap();
    let mut want_at = allocator_views(&data, Some(t), &r.ledgers);
    want_at.retain(|p, _| *p == 200);
    let mut got = r.allocator_views().unwrap();
    got.retain(|p, _| *p == 200);
    assert!(!want_at.is_empty());
    assert_same(&json(&got), &json(&want_at), "kept, at a moment");
    // A window `--last` over the kept files: the same, where it exited.
    let memo = CheckMemo::new();
    let last = sleuth_store::run_window::last_of_run(&kept, end, &budget(), &memo).unwrap();
    let got = last.allocator_views(Some(200), &memo, &data).unwrap();
    assert_same(&json(got.end()), &json(&want), "kept window");
    drop_carried_views(&kept, exit_file..=6);
    let r = load_memory(&kept, Some(200), budget(), &CheckMemo::new()).unwrap();
    assert_ne!(
        json(&r.allocator_views().unwrap()),
        json(&want),
        "a replay of the files left"
    );
}

/// A process whose allocator events were all in files `--keep` deleted
/// (an idle server still holding its cache; one that then exited in a
/// kept file) keeps its views at the run's end and at any moment of the
/// kept files: the tracer carried them (round 54; before, the readers
/// looked for views only of the processes with allocator events in the
/// files kept, and such a process had none but at the end while alive).
#[test]
fn a_process_whose_allocator_events_were_all_in_deleted_files_keeps_its_views() {
    for exits in [false, true] {
        let dir = TempDir::new("run_allocator_silent");
        let (mut events, end) = random_allocator_workload(0x2545_f491_4f6c_dd1d);
        let mut cuts: Vec<u64> = (0..=6).map(|k| 1_000 + (end - 1_000) * k / 6).collect();
        cuts[6] = end + 1;
        // Process 200 is silent after file 2, which `--keep 4` deletes.
        events.retain(|e| pid_of(e) != 200 || end_of(e) < cuts[2]);
        // It exits in the middle of file 4 (or never).
        let exit_at = cuts[3] + (cuts[4] - cuts[3]) / 2;
        if exits {
            insert_exit(&mut events, 200, exit_at);
        }
        let whole = dir.join("whole.db");
        write(&whole, &events, (1_000, end), None);
        let run = dir.join("run");
        write_run(&run, &events, &cuts, end);
        let data = Trace::open(&whole).unwrap().load(None).unwrap();
        let kept = dir.join("kept");
        copy_run(&run, &kept, 3..=6);
        let what = |w: &str| format!("{w}, exits: {exits}");
        // At the end, every process and 200 alone.
        for pid in [None, Some(200)] {
            let r = load_memory(&kept, pid, budget(), &CheckMemo::new()).unwrap();
            let mut want = allocator_views(&data, None, &r.ledgers);
            want.retain(|p, _| pid.is_none_or(|only| only == *p));
            assert!(
                want.contains_key(&200),
                "{}",
                what("a view of 200 at the end")
            );
            let got = r.allocator_views().unwrap();
            assert_same(&json(&got), &json(&want), &what(&format!("end, {pid:?}")));
        }
        // At moments in each kept file: before its exit, after it. The
        // views are those of the files that began by the moment loaded as
        // one trace, the deleted ones included (their every step
        // calibrates, those up to the moment are replayed).
        for k in 2..6 {
            let t = cuts[k] + (cuts[k + 1].min(end) - cuts[k]) / 3;
            let mut began = sleuth_core::TraceData::default();
            for n in 1..=k as u64 + 1 {
                let d = Trace::open(&run.join(part_name(n)))
                    .unwrap()
                    .load(None)
                    .unwrap();
                began.calls.extend(d.calls);
                began.blocks.extend(d.blocks);
                began.stacks.extend(d.stacks);
            }
            for pid in [None, Some(200)] {
                let r =
                    load_memory_at(&kept, pid, Moment::At(t), budget(), &CheckMemo::new()).unwrap();
                let mut want = allocator_views(&began, Some(t), &r.ledgers);
                want.retain(|p, _| pid.is_none_or(|only| only == *p));
                let got = r.allocator_views().unwrap();
                if !exits || t < exit_at {
                    assert!(want.contains_key(&200), "{}", what("a view of 200"));
                }
                // What 200 holds then is the whole trace's ledger's.
                let live = |l: &[sleuth_core::ledger::ProcessLedger]| {
                    l.iter().find(|p| p.pid == 200).map(|p| p.live_bytes)
                };
                let whole = sleuth_core::ledger::ledger(&data, Some(t));
                assert_eq!(live(&r.ledgers), live(&whole), "{}", what("200's ledger"));
                assert_same(
                    &json(&got),
                    &json(&want),
                    &what(&format!("at a moment of file {}, {pid:?}", k + 1)),
                );
            }
        }
        // A pid the kept files do not know: the files deleted may have held it.
        let err = load_memory(&kept, Some(999), budget(), &CheckMemo::new())
            .err()
            .expect("no process 999")
            .to_string();
        assert!(
            err.contains("no process 999 in this run")
                && err
                    .contains("a process that exited in a file --keep deleted is no longer listed"),
            "{err}"
        );
        // A moment of one process counts from the oldest finished file and
        // is bounded by every finished file, whichever hold the process.
        let kept_span = end - cuts[2];
        for pid in [None, Some(200)] {
            let since =
                |d| load_memory_at(&kept, pid, Moment::Since(d), budget(), &CheckMemo::new());
            let r = since(kept_span - 10).unwrap();
            assert_eq!(r.at_ns, Some(end - 10), "{}", what("the moment"));
            let err = since(kept_span + 10)
                .err()
                .expect("past the run")
                .to_string();
            let span = sleuth_core::units::fmt_ns(kept_span);
            assert!(err.contains(&format!("which last {span} ")), "{err}");
        }
    }
}
