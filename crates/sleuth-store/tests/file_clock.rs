//! The file's clock (`sleuth_store::file_clock`): a trace recorded on a
//! machine up for days, its times stored minus the run's clock base, is
//! the same file as the one recorded at the base's times — every row of
//! every table, the completion's rollups and the states a run carries from
//! file to file included — so every answer is the same too. Times the
//! writer stores but this list does not move make the files differ.

mod common;

use common::allocator_workload::{end_of, random_allocator_workload, write_run_on_clock};
use common::trace_fixture::{rewrite_in_session, session, two_processes};
use common::TempDir;
use rusqlite::types::Value;
use sleuth_core::{Event, TraceData};
use std::collections::BTreeMap;
use std::path::Path;

/// Ten days and a bit: every CLOCK_MONOTONIC time of such a machine takes
/// 8 bytes in SQLite.
const DAYS: u64 = 10 * 86_400 * 1_000_000_000 + 123_456_789;

fn later(e: &Event) -> Event {
    let mut e = e.clone();
    match &mut e {
        Event::Call(c) => c.ts_ns += DAYS,
        Event::Wait(w) => {
            w.off_ns += DAYS;
            w.wake_ns += DAYS;
            w.on_ns += DAYS;
        }
        Event::Proc(p) => p.ts_ns += DAYS,
        Event::Block(b) => {
            b.start_ns += DAYS;
            b.end_ns += DAYS;
        }
        Event::Nccl(n) => n.call.ts_ns += DAYS,
    }
    e
}

/// `data` as recorded `DAYS` later.
fn data_later(data: &TraceData) -> TraceData {
    let mut d = data.clone();
    for c in &mut d.calls {
        c.ts_ns += DAYS;
    }
    for w in &mut d.waits {
        (w.off_ns, w.wake_ns, w.on_ns) = (w.off_ns + DAYS, w.wake_ns + DAYS, w.on_ns + DAYS);
    }
    for p in &mut d.procs {
        p.ts_ns += DAYS;
    }
    for p in &mut d.processes {
        for t in [&mut p.start_ns, &mut p.exit_ns].into_iter().flatten() {
            *t += DAYS;
        }
    }
    for g in d.gpu_samples.iter_mut().flatten() {
        g.ts_ns += DAYS;
    }
    for g in &mut d.process_gpu {
        g.ts_ns += DAYS;
    }
    d
}

/// Every row of every table of the file, but what differs between two
/// writes of the same trace anyway (the clock base itself, the run's random
/// id, CPU times, when notes were stored).
fn rows(path: &Path) -> BTreeMap<String, Vec<Vec<Value>>> {
    let c = rusqlite::Connection::open(path).unwrap();
    let tables: Vec<String> = c
        .prepare("SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name")
        .unwrap()
        .query_map([], |r| r.get(0))
        .unwrap()
        .map(Result::unwrap)
        .collect();
    tables
        .into_iter()
        .map(|t| {
            let sql = match t.as_str() {
                "notes" => "SELECT level, text FROM notes ORDER BY rowid".to_string(),
                "meta" => "SELECT * FROM meta WHERE key NOT IN ('clock_base_ns', 'run_id') \
                           ORDER BY rowid"
                    .to_string(),
                "stats" => "SELECT * FROM stats WHERE name NOT LIKE 'tracer_%' \
                            AND name NOT LIKE 'writer_%' ORDER BY rowid"
                    .to_string(),
                _ => format!("SELECT * FROM {t}"),
            };
            let mut st = c.prepare(&sql).unwrap();
            let n = st.column_count();
            let mut got: Vec<Vec<Value>> = st
                .query_map([], |r| (0..n).map(|i| r.get::<_, Value>(i)).collect())
                .unwrap()
                .map(Result::unwrap)
                .collect();
            // Some tables are written in a hash map's order: as a set.
            got.sort_by_cached_key(|r| format!("{r:?}"));
            (t, got)
        })
        .collect()
}

fn assert_same_file(at_base: &Path, later: &Path) {
    let (a, b) = (rows(at_base), rows(later));
    assert_eq!(a.keys().collect::<Vec<_>>(), b.keys().collect::<Vec<_>>());
    for (t, want) in &a {
        let got = &b[t];
        assert_eq!(got.len(), want.len(), "{}: rows of {t}", later.display());
        for (i, (g, w)) in got.iter().zip(want).enumerate() {
            assert_eq!(g, w, "{}: row {i} of {t}", later.display());
        }
    }
    let base = |p: &Path| {
        rusqlite::Connection::open(p)
            .unwrap()
            .query_row(
                "SELECT CAST(value AS INTEGER) FROM meta WHERE key = 'clock_base_ns'",
                [],
                |r| r.get::<_, i64>(0),
            )
            .unwrap()
    };
    assert_eq!((base(at_base), base(later)), (0, DAYS as i64));
}

#[test]
fn a_trace_recorded_days_after_boot_is_stored_as_the_one_recorded_at_its_base() {
    let dir = TempDir::new("file_clock");
    let mut data = two_processes();
    // NVML samples too (the example traces have none).
    let t0 = data.calls[0].ts_ns;
    data.gpu_samples = Some(
        (0..5)
            .map(|k| sleuth_core::GpuSample {
                ts_ns: t0 + k * 100_000_000,
                gpu: 0,
                busy_pct: 50.0,
                period_ns: 100_000_000,
            })
            .collect(),
    );
    data.process_gpu = [
        sleuth_core::SamplePhase::Start,
        sleuth_core::SamplePhase::Sample,
        sleuth_core::SamplePhase::End,
    ]
    .into_iter()
    .enumerate()
    .map(|(k, phase)| sleuth_core::ProcessGpuSample {
        ts_ns: t0 + k as u64 * 1_000_000,
        gpu: 0,
        pid: data.calls[0].pid,
        used_bytes: Some(1 << 20),
        sm_pct: None,
        phase,
    })
    .collect();
    assert!(!data.waits.is_empty() && !data.procs.is_empty() && !data.processes.is_empty());
    let (a, b) = (dir.join("at_base.db"), dir.join("later.db"));
    rewrite_in_session(&data, &a, Default::default(), session());
    let s = session();
    let later_session = sleuth_store::SessionInfo {
        start_mono_ns: s.start_mono_ns + DAYS,
        // The wall clock is the same: the monotonic clock reads DAYS more.
        realtime_offset_ns: s.realtime_offset_ns - DAYS as i64,
        clock_base_ns: DAYS,
        ..s
    };
    rewrite_in_session(&data_later(&data), &b, Default::default(), later_session);
    assert_same_file(&a, &b);
    // And what readers make of it: the session as stored, wall clock included.
    let read = |p: &Path| sleuth_store::Trace::open(p).unwrap().session().unwrap();
    let (sa, sb) = (read(&a), read(&b));
    assert_eq!(sb.info.clock_base_ns, DAYS);
    assert_eq!(
        (sa.info.start_mono_ns, sa.info.realtime_offset_ns),
        (sb.info.start_mono_ns, sb.info.realtime_offset_ns)
    );
}

#[test]
fn a_runs_files_and_the_states_it_carries_are_on_one_clock() {
    let dir = TempDir::new("file_clock_run");
    let (events, end) = random_allocator_workload(0x9e37_79b9_7f4a_7c15);
    let cuts = [1_000, end / 3, 2 * end / 3, end + 1];
    let file_of = |e: &Event, shift: u64| {
        let t = end_of(e) - shift;
        (0..cuts.len() - 1).find(|&k| (cuts[k]..cuts[k + 1]).contains(&t))
    };
    let (a, b) = (dir.join("at_base"), dir.join("later"));
    write_run_on_clock(&a, &events, &cuts, end, |e| file_of(e, 0), 0);
    let moved: Vec<Event> = events.iter().map(later).collect();
    let moved_cuts: Vec<u64> = cuts.iter().map(|c| c + DAYS).collect();
    write_run_on_clock(
        &b,
        &moved,
        &moved_cuts,
        end + DAYS,
        |e| file_of(e, DAYS),
        DAYS,
    );
    for n in 1..cuts.len() as u64 {
        let name = sleuth_store::run::part_name(n);
        assert_same_file(&a.join(&name), &b.join(&name));
    }
}

/// A stored base that is not a number of nanoseconds is a one-line error
/// naming the file and the key.
#[test]
fn a_damaged_clock_base_is_a_one_line_error() {
    let dir = TempDir::new("file_clock_damaged");
    let path = dir.join("t.db");
    rewrite_in_session(&two_processes(), &path, Default::default(), session());
    for bad in ["abc", "-5", "1e9", "18446744073709551616"] {
        rusqlite::Connection::open(&path)
            .unwrap()
            .execute(
                "UPDATE meta SET value = ?1 WHERE key = 'clock_base_ns'",
                [bad],
            )
            .unwrap();
        let err = sleuth_store::Trace::open(&path)
            .unwrap()
            .session()
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("meta.clock_base_ns is not a number of nanoseconds")
                && err.contains("t.db")
                && !err.contains('\n'),
            "{bad}: {err}"
        );
    }
}
