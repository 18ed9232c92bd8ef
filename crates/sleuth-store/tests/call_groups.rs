//! The call groups the writer stores when a trace ends (issue 16) against
//! the pass over every call row that readers make without them: the same
//! groups, the same span, and a file changed afterwards is still refused
//! when its rows add up past 2^62 and are read.

mod common;

use common::{rewritten, small_trace_in};
use sleuth_store::stream::{CallQuery, MemoryTrace, Rows};
use sleuth_store::{ReadBudget, Trace, DEFAULT_READ_TIMEOUT};
use std::path::Path;

fn groups(path: &Path) -> Vec<sleuth_store::stream::CallGroup> {
    let t = Trace::open(path).unwrap();
    Rows::open(&t).unwrap().call_groups().unwrap()
}

/// Why the call groups of `t` are refused (they must be).
fn refusal(t: &Trace) -> String {
    Rows::open(t)
        .unwrap()
        .call_groups()
        .unwrap_err()
        .to_string()
}

/// `path` copied with the stored groups' completeness mark removed: readers
/// then make the pass over the rows.
fn without_stored_groups(path: &Path, tag: &str) -> std::path::PathBuf {
    let copy = path.with_file_name(format!("{tag}-raw.db"));
    std::fs::copy(path, &copy).unwrap();
    let c = rusqlite::Connection::open(&copy).unwrap();
    let n = c
        .execute("DELETE FROM meta WHERE key = 'call_groups'", [])
        .unwrap();
    assert_eq!(n, 1, "the writer marks the stored groups complete");
    copy
}

fn assert_same_groups(path: &Path, tag: &str) {
    let stored = groups(path);
    assert!(!stored.is_empty(), "{tag}");
    let raw = without_stored_groups(path, tag);
    assert_eq!(stored, groups(&raw), "{tag}");
    // The span `memory` and `explain` use, for the whole trace and per pid.
    let t = Trace::open(path).unwrap();
    let r = Trace::open(&raw).unwrap();
    let mut pids: Vec<Option<u32>> = vec![None];
    pids.extend(t.pids().unwrap().into_iter().map(Some));
    for pid in pids {
        let a = MemoryTrace::open(&t, pid, ReadBudget::new(DEFAULT_READ_TIMEOUT)).unwrap();
        let b = MemoryTrace::open(&r, pid, ReadBudget::new(DEFAULT_READ_TIMEOUT)).unwrap();
        assert_eq!(
            (a.span.start_ns, a.span.end_ns),
            (b.span.start_ns, b.span.end_ns),
            "{tag} {pid:?}"
        );
    }
}

#[test]
fn stored_groups_equal_the_pass_over_the_rows_on_the_examples() {
    for name in ["demo-sim.db", "h200-contention.db"] {
        let (_dir, path) = rewritten(name, "call-groups");
        assert_same_groups(&path, name);
    }
}

#[test]
fn stored_groups_equal_the_pass_over_the_rows_on_a_small_trace() {
    let (_dir, path) = small_trace_in("call-groups-small");
    assert_same_groups(&path, "small");
}

/// The writer groups the calls as it reads each thread's calls when the
/// trace ends, and dates a process seen only through its calls from its
/// threads' first calls: the same groups and start as the pass over the
/// rows, with rows no reader reads (a duration or size past any call's)
/// left out, nested calls counted, and a process whose only calls are
/// nested started at the first of them.
#[test]
fn stored_groups_leave_out_the_rows_readers_skip_and_count_nested_calls() {
    use common::{call, new_trace};
    use sleuth_core::Event;
    let (_dir, path, w) = new_trace("call-groups-odd");
    let h = w.handle();
    let mut runtime = call("cudaMalloc", 100, 100, 5_000, 3_000);
    runtime.size = Some(4096);
    h.send(Event::Call(runtime)).unwrap();
    let mut nested = call("cuMemAlloc_v2", 100, 100, 6_000, 1_000);
    nested.nested = true;
    h.send(Event::Call(nested)).unwrap();
    // Impossible values: stored, never read or grouped.
    h.send(Event::Call(call(
        "cudaLaunchKernel",
        100,
        101,
        9_000,
        (1 << 62) + 1,
    )))
    .unwrap();
    let mut huge = call("cudaMemset", 100, 101, 10_000, 10);
    huge.size = Some((1 << 50) + 1);
    h.send(Event::Call(huge)).unwrap();
    // A process seen only through nested calls, the earliest one last.
    for ts in [7_000, 4_000] {
        let mut c = call("cuMemAlloc_v2", 300, 301, ts, 100);
        c.nested = true;
        h.send(Event::Call(c)).unwrap();
    }
    h.send(Event::Call(call("cudaLaunchKernel", 100, 101, 12_000, 5)))
        .unwrap();
    w.finish().unwrap();
    assert_same_groups(&path, "odd rows");
    let g = groups(&path);
    assert_eq!(g.iter().map(|g| g.count).sum::<u64>(), 5, "{g:?}");
    let t = Trace::open(&path).unwrap();
    let p = t
        .processes()
        .unwrap()
        .into_iter()
        .find(|p| p.pid == 300)
        .expect("the process seen only through nested calls");
    assert_eq!(p.start_ns, Some(4_000));
}

/// The stored groups are an aggregate: reading them reads no call row, so
/// a file whose rows were changed after it was written is refused when its
/// rows are read (a stream of calls, the whole load), not when the groups are.
#[test]
fn a_trace_changed_after_it_was_written_is_refused_when_its_rows_are_read() {
    let (_dir, path) = rewritten("demo-sim.db", "call-groups-overflow");
    let c = rusqlite::Connection::open(&path).unwrap();
    let n = c
        .execute("UPDATE call_rows SET dur_ns = 1 << 61", [])
        .unwrap();
    assert!(n > 2, "{n} calls");
    drop(c);
    let t = Trace::open(&path).unwrap();
    assert!(!Rows::open(&t).unwrap().call_groups().unwrap().is_empty());
    let streamed = |t: &Trace| {
        Rows::open(t)
            .unwrap()
            .for_each_call::<sleuth_store::StoreError>(&CallQuery::default(), |_| Ok(()))
            .unwrap_err()
            .to_string()
    };
    let e = streamed(&t);
    assert!(e.contains("add up past 2^62"), "{e}");
    let e = t.load(None).unwrap_err().to_string();
    assert!(e.contains("add up past 2^62"), "{e}");
    // Also when the trace made the check first: counting the skipped rows
    // refuses it, and so does a later stream.
    let t = Trace::open(&path).unwrap();
    let e = t.input_problems().unwrap_err().to_string();
    assert!(e.contains("add up past 2^62"), "{e}");
    let e = streamed(&t);
    assert!(e.contains("add up past 2^62"), "{e}");
}

#[test]
fn a_stored_groups_table_of_another_shape_or_with_impossible_rows_is_refused() {
    let (_dir, path) = rewritten("demo-sim.db", "call-groups-damaged");
    let odd = path.with_file_name("odd.db");
    std::fs::copy(&path, &odd).unwrap();
    let c = rusqlite::Connection::open(&odd).unwrap();
    c.execute("UPDATE call_groups SET first_ts_ns = -5", [])
        .unwrap();
    drop(c);
    let t = Trace::open(&odd).unwrap();
    let e = refusal(&t);
    assert!(e.contains("call_groups"), "{e}");

    let c = rusqlite::Connection::open(&path).unwrap();
    c.execute_batch(
        "DROP TABLE call_groups; CREATE TABLE call_groups(pid INTEGER, tid INTEGER, op TEXT)",
    )
    .unwrap();
    drop(c);
    let t = Trace::open(&path).unwrap();
    let e = refusal(&t);
    assert!(e.contains("call_groups"), "{e}");
}

/// The wait groups stored when the trace ends give the counts and the
/// earliest wait that the readers' own aggregate over every wait row gives,
/// for the whole trace and for each process; a damaged table is refused
/// (theirs and the latest ends', `wait_ends`).
#[test]
fn stored_wait_groups_equal_the_aggregate_over_the_rows() {
    for name in ["demo-sim.db", "h200-contention.db"] {
        let (_dir, path) = rewritten(name, "wait-groups");
        let raw = path.with_file_name("wait-groups-raw.db");
        std::fs::copy(&path, &raw).unwrap();
        let c = rusqlite::Connection::open(&raw).unwrap();
        let n = c
            .execute("DELETE FROM meta WHERE key = 'wait_groups'", [])
            .unwrap();
        assert_eq!(n, 1, "the writer marks the stored wait groups complete");
        drop(c);
        let (t, r) = (Trace::open(&path).unwrap(), Trace::open(&raw).unwrap());
        let (a, b) = (Rows::open(&t).unwrap(), Rows::open(&r).unwrap());
        let mut pids: Vec<Option<u32>> = vec![None];
        pids.extend(t.pids().unwrap().into_iter().map(Some));
        let mut waits = 0;
        for pid in pids {
            assert_eq!(
                a.event_counts(pid).unwrap(),
                b.event_counts(pid).unwrap(),
                "{name} {pid:?}"
            );
            assert_eq!(
                a.earliest_wait_or_event(pid).unwrap(),
                b.earliest_wait_or_event(pid).unwrap(),
                "{name} {pid:?}"
            );
            waits += a.event_counts(pid).unwrap().0;
        }
        assert!(waits > 0, "{name} has waits");

        // The stored latest ends: an end no wait can give is refused.
        let c = rusqlite::Connection::open(&path).unwrap();
        c.execute("UPDATE wait_ends SET last_on_ns = -1", [])
            .unwrap();
        drop(c);
        let t = Trace::open(&path).unwrap();
        let budget = ReadBudget::new(DEFAULT_READ_TIMEOUT);
        let e = match sleuth_store::report_reads::load(&t, None, budget, 15) {
            Ok(_) => panic!("{name}: a damaged wait_ends was read"),
            Err(e) => e.to_string(),
        };
        assert!(e.contains("wait_ends"), "{e}");

        let c = rusqlite::Connection::open(&path).unwrap();
        c.execute("UPDATE wait_groups SET count = -1", []).unwrap();
        drop(c);
        let t = Trace::open(&path).unwrap();
        let e = Rows::open(&t)
            .unwrap()
            .event_counts(None)
            .unwrap_err()
            .to_string();
        assert!(e.contains("wait_groups"), "{e}");
    }
}
