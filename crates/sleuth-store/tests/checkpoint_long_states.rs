//! Allocator checkpoints whose states are long (stored in pieces as BLOBs):
//! each gets its first id by a copy of its row (`json_column::set_int`, not
//! an `UPDATE` that holds the record twice), and a window's views taken up
//! from them are the replay's. A test binary of its own: the checkpoints'
//! spacing is set for the whole process.

mod common;

use common::allocator_workload::{many_live_blocks_workload, write};
use common::TempDir;
use sleuth_core::allocator::KnownViews;
use sleuth_store::stream::MemoryTrace;
use sleuth_store::{ReadBudget, Trace};

#[test]
fn long_checkpoint_states_get_their_first_ids_and_are_taken_up() {
    sleuth_store::allocator_checkpoints::set_steps_for_tests(3_000);
    let dir = TempDir::new("checkpoint_long_states");
    let path = dir.join("t.db");
    let (events, end) = many_live_blocks_workload(16_000);
    write(&path, &events, (1_000, end), None);
    let conn = rusqlite::Connection::open(&path).unwrap();
    // Each state's first id: the lowest id of the process's memory calls
    // that returned after it (all of them are memory calls here).
    let mut st = conn
        .prepare(
            "SELECT c.at_ns, c.from_id, typeof(c.replay), length(c.replay),
                    (SELECT min(id) FROM calls WHERE pid = c.pid AND ts_ns + dur_ns > c.at_ns)
             FROM allocator_checkpoints c ORDER BY c.at_ns",
        )
        .unwrap();
    /// A state's time, first id, type and length, and the first id due.
    type State = (i64, Option<i64>, String, i64, Option<i64>);
    let rows: Vec<State> = st
        .query_map([], |r| {
            Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?))
        })
        .unwrap()
        .map(Result::unwrap)
        .collect();
    let long = rows
        .iter()
        .filter(|r| r.2 == "blob" && r.3 > 1 << 20)
        .count();
    assert!(
        rows.len() >= 5 && long >= 2,
        "{} states, {long} long",
        rows.len()
    );
    for (at, from_id, _, _, want) in &rows {
        assert_eq!(from_id, want, "the state at {at}");
    }
    // Views at moments around the states, taken up from them, are those
    // replayed from the start.
    let trace = Trace::open(&path).unwrap();
    let data = trace.load(None).unwrap();
    let before = sleuth_store::allocator_checkpoints::taken_up_for_tests();
    let none = std::collections::BTreeMap::new();
    let json = |v: &KnownViews| {
        serde_json::to_value((v.end(), v.moments().iter().collect::<Vec<_>>())).unwrap()
    };
    let mut moments = vec![end];
    for (at, ..) in rows.iter().skip(1) {
        moments.extend([*at as u64, *at as u64 + 150]);
    }
    for &at in &moments {
        let budget = ReadBudget::new(sleuth_store::DEFAULT_READ_TIMEOUT);
        let mt = MemoryTrace::open(&trace, None, budget).unwrap();
        let got = mt.allocator_views_until(Some(at)).unwrap().expect("views");
        let want = KnownViews::until(&data, &data, &[100], Some(at), &none);
        assert_eq!(json(&got), json(&want), "until {at}");
    }
    let taken = sleuth_store::allocator_checkpoints::taken_up_for_tests() - before;
    assert!(
        taken as usize >= moments.len() - 1,
        "{taken} reads took one up"
    );
}
