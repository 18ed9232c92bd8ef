//! The tracer's bound on the allocator replays it carries across a run's
//! files (`run_allocator::MAX_CARRIED_ENTRIES`): past it the processes
//! holding the most are carried no further, with a note, and the run's
//! readers replay them: the same views. A test binary of its own (the
//! bound is lowered for the whole process).

mod common;

use common::allocator_workload::{random_allocator_workload, write, write_run};
use common::TempDir;
use sleuth_core::allocator::allocator_views;
use sleuth_store::run::part_name;
use sleuth_store::run_explain::load_memory;
use sleuth_store::{CheckMemo, ReadBudget, Trace};

#[test]
fn processes_past_the_bound_are_replayed_by_readers() {
    sleuth_store::run_allocator::set_max_carried_for_tests(300);
    let dir = TempDir::new("run_allocator_bound");
    let (events, end) = random_allocator_workload(0x2545_f491_4f6c_dd1d);
    let whole = dir.join("whole.db");
    write(&whole, &events, (1_000, end), None);
    let cuts = [1_000, end / 3, 2 * end / 3, end + 1];
    let run = dir.join("run");
    write_run(&run, &events, &cuts, end);
    // Each process holds a few hundred live blocks: the larger one is
    // dropped at the first file past the bound, and says so.
    let last = rusqlite::Connection::open(run.join(part_name(3))).unwrap();
    let carried: i64 = last
        .query_row("SELECT count(DISTINCT pid) FROM run_allocator", [], |r| {
            r.get(0)
        })
        .unwrap();
    assert!(carried < 2, "{carried} processes carried");
    let notes: Vec<String> = (1..=3)
        .flat_map(|n| {
            let c = rusqlite::Connection::open(run.join(part_name(n))).unwrap();
            let mut st = c
                .prepare("SELECT text FROM notes WHERE text LIKE 'run allocator views%'")
                .unwrap();
            let v: Vec<String> = st
                .query_map([], |r| r.get(0))
                .unwrap()
                .map(Result::unwrap)
                .collect();
            v
        })
        .collect();
    assert!(
        notes
            .iter()
            .any(|n| n.contains("more than the 300 the tracer carries")),
        "{notes:?}"
    );
    // The readers replay what was not carried: the whole trace's views.
    let data = Trace::open(&whole).unwrap().load(None).unwrap();
    let budget = ReadBudget::new(sleuth_store::DEFAULT_READ_TIMEOUT);
    let r = load_memory(&run, None, budget, &CheckMemo::new()).unwrap();
    let got = serde_json::to_value(r.allocator_views().unwrap()).unwrap();
    let want = serde_json::to_value(allocator_views(&data, None, &r.ledgers)).unwrap();
    assert_eq!(got, want);
}
