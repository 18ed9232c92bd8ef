//! Import of Ingero databases. Fixtures with Ingero's schema are built here
//! (common/ingero.rs), so these tests need nothing outside the repository;
//! the two real Ingero traces in ../shared/data/ingero are an additional
//! check (required in CI, reported as skipped elsewhere when absent).

mod common;
use common::ingero::*;
use common::*;
use sleuth_core::ledger::ledger;
use sleuth_store::{import_ingero, Trace, TraceSource};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

/// The real traces: `GPUSLEUTH_INGERO_DATA`, else `../shared/data/ingero`
/// beside the clone (where CI keeps them).
fn ingero_dir() -> Option<PathBuf> {
    let dir = std::env::var_os("GPUSLEUTH_INGERO_DATA")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(concat!(
                env!("CARGO_MANIFEST_DIR"),
                "/../../../shared/data/ingero"
            ))
        });
    if dir.is_dir() {
        return Some(dir);
    }
    if std::env::var("CI").as_deref() == Ok("true") {
        panic!(
            "Ingero test data missing at {} (required in CI)",
            dir.display()
        );
    }
    skipped(&format!(
        "real Ingero traces not found at {}",
        dir.display()
    ));
    None
}

/// Our op name for the fixture's (source, op).
fn ours(source: i64, op: i64) -> Option<&'static str> {
    let name = INGERO_OPS
        .iter()
        .find(|(s, o, _)| *s == source && *o == op)?
        .2;
    Some(match name {
        "cudaStreamSync" => "cudaStreamSynchronize",
        "cuMemAlloc" => "cuMemAlloc_v2",
        "cudaMalloc" | "cudaFree" | "cudaLaunchKernel" | "cudaMemcpyAsync" | "cuLaunchKernel" => {
            name
        }
        _ => return None,
    })
}

#[test]
fn fixture_imports_every_cuda_row_with_exact_counts() {
    let tmp = TempDir::new("ingero-fixture");
    let (src, dst) = (tmp.join("ingero.db"), tmp.join("out.db"));
    let rows = dataloader_rows();
    write_ingero(&src, &rows);
    let sum = import_ingero(&src, &dst).unwrap();
    let mut want: BTreeMap<String, u64> = BTreeMap::new();
    for r in &rows {
        if let Some(op) = ours(r.source, r.op) {
            *want.entry(op.to_string()).or_insert(0) += 1;
        }
    }
    assert_eq!(want["cudaMalloc"], 7);
    assert_eq!(want["cuMemAlloc_v2"], 10);
    assert_eq!(sum.calls_by_op, want);
    assert_eq!(sum.sched_switch_skipped, 5);
    assert_eq!(sum.skipped_unknown.get("NET/net_send"), Some(&1));
    assert_eq!((sum.proc_events, sum.processes), (2, 2));
    assert_eq!(stored_counts(&dst), want);
    let t = Trace::open(&dst).unwrap();
    assert_eq!(t.source(), TraceSource::Ingero);
    assert!(t.session().unwrap().info.tool_version.starts_with("ingero"));
    assert!(has_note(&t, "RTX 4090"));
}

#[test]
fn imported_allocations_feed_the_ledger_counted_once() {
    let tmp = TempDir::new("ingero-ledger");
    let (src, dst) = (tmp.join("ingero.db"), tmp.join("out.db"));
    write_ingero(&src, &dataloader_rows());
    import_ingero(&src, &dst).unwrap();
    let data = Trace::open(&dst).unwrap().load(None).unwrap();
    // Every cuMemAlloc inside a cudaMalloc of the same thread is nested.
    let nested = data
        .calls
        .iter()
        .filter(|c| c.nested && c.op_name() == "cuMemAlloc_v2")
        .count();
    assert_eq!(nested, MALLOC_SIZES.len());
    let l = ledger(&data, None);
    let main = l.iter().find(|p| p.pid == 2233).unwrap();
    let total: i64 = MALLOC_SIZES.iter().chain(&DIRECT_DRIVER_SIZES).sum();
    // 7 runtime allocations + 3 direct driver ones; the 7 nested twins once.
    assert_eq!(main.allocs, 10);
    assert_eq!(main.unknown_ptr_allocs, 10);
    assert_eq!(main.live_bytes, total as u64);
    assert_eq!(main.peak_bytes, total as u64);
    assert_eq!(main.unfreed.len(), 10);
    assert!(main.unfreed.iter().all(|u| u.ptr.is_none()));
}

#[test]
fn impossible_values_are_skipped_and_said_never_wrapped() {
    let tmp = TempDir::new("ingero-pid");
    let (src, dst) = (tmp.join("ingero.db"), tmp.join("out.db"));
    let mut rows = dataloader_rows();
    rows.push(row(1_774_015_580_000_000_000, -1, 1, 1, 1_000, 4096, 0));
    rows.push(row(1_774_015_580_000_000_000, 2233, 1, 1, -5, 4096, 0));
    write_ingero(&src, &rows);
    let sum = import_ingero(&src, &dst).unwrap();
    assert_eq!(
        sum.calls_by_op["cudaMalloc"], 7,
        "the bad rows are not calls"
    );
    let skipped: u64 = sum.invalid_events.values().sum();
    assert_eq!(skipped, 2, "{:?}", sum.invalid_events);
    assert!(sum
        .invalid_events
        .contains_key("pid or tid outside 0..=4194304"));
    assert!(sum.invalid_events.contains_key("negative duration"));
    let data = Trace::open(&dst).unwrap().load(None).unwrap();
    assert!(data.calls.iter().all(|c| c.pid == 2233));
    assert!(sum.notes.iter().any(|n| n.contains("impossible values")));
}

/// Round 51: a time or size within i64 but past the readers' bounds
/// (2^62 ns, 1 PiB) imported with exit 0, then `stats`, `explain`, `report`
/// and the pftrace export refused the trace ("a value no trace holds"), and
/// a negative `cudaMalloc` size was stored as 2^64 - 1.
#[test]
fn values_past_the_readers_bounds_are_skipped_and_said() {
    let tmp = TempDir::new("ingero-bounds");
    let (src, dst) = (tmp.join("ingero.db"), tmp.join("out.db"));
    const T: i64 = 1_774_015_580_000_000_000;
    let max_ns: i64 = 1 << 62;
    let mut rows = dataloader_rows();
    // (cudaMalloc: size = arg0; cudaMemcpyAsync: size = arg0.)
    rows.push(row(i64::MAX - 5, 2233, 1, 1, 5, 4096, 0));
    rows.push(row(T, 2233, 1, 1, i64::MAX - T, 4096, 0));
    rows.push(row(max_ns - 10, 2233, 1, 1, 100, 4096, 0));
    rows.push(row(T, 2233, 1, 1, 1_000, -1, 0));
    rows.push(row(T, 2233, 1, 7, 1_000, (1 << 50) + 1, 1));
    write_ingero(&src, &rows);
    let sum = import_ingero(&src, &dst).unwrap();
    let want: BTreeMap<String, u64> = [
        "timestamp past 2^62 ns",
        "duration past 2^62 ns",
        "timestamp + duration past 2^62 ns",
        "negative size",
        "size past 2^50 bytes (1 PiB)",
    ]
    .iter()
    .map(|why| (why.to_string(), 1))
    .collect();
    assert_eq!(sum.invalid_events, want);
    assert_eq!(
        sum.calls_by_op["cudaMalloc"], 7,
        "the bad rows are not calls"
    );
    assert!(sum.notes.iter().any(|n| n.contains("negative size")));
    // Every reader takes every row the import wrote.
    let t = Trace::open(&dst).unwrap();
    assert_eq!(t.input_problems().unwrap(), Default::default());
    assert!(t.stats_report(None).unwrap().is_some());
    let data = t.load(None).unwrap();
    assert!(data
        .calls
        .iter()
        .all(|c| c.size.is_none_or(|s| s <= 1 << 50)));
    sleuth_store::scoped::explanation(&t, &Default::default()).unwrap();
    // Each duration within the bound, their sum past it: every reader would
    // refuse the file as damaged, so the import refuses it in one line.
    let (src, dst) = (tmp.join("sum.db"), tmp.join("sum-out.db"));
    let mut rows = dataloader_rows();
    for _ in 0..2 {
        rows.push(row(1, 2233, 1, 5, (1 << 61) + 1, 0, 0));
    }
    write_ingero(&src, &rows);
    let e = import_ingero(&src, &dst).unwrap_err().to_string();
    assert!(e.contains("durations add up past 2^62"), "{e}");
    assert!(!dst.exists());
}

/// Round 51: a session time past 2^62 ns imported, and `memory`, `explain`
/// and `report` failed on the trace; every time counts from the start, so
/// the file is refused in one line, and nothing is written.
#[test]
fn a_session_time_past_the_readers_bound_is_refused() {
    let tmp = TempDir::new("ingero-session-bound");
    let dst = tmp.join("out.db");
    for (column, v) in [
        ("started_at", i64::MAX),
        ("stopped_at", i64::MAX),
        ("started_at", -5),
    ] {
        let src = tmp.join(&format!("{column}{v}.db"));
        write_ingero(&src, &dataloader_rows())
            .execute(&format!("UPDATE sessions SET {column} = ?1"), [v])
            .unwrap();
        let e = import_ingero(&src, &dst).unwrap_err().to_string();
        assert!(
            e.contains(&format!("sessions.{column} {v} is not a time")) && !e.contains('\n'),
            "{e}"
        );
        assert!(!dst.exists());
        // Nor a temporary file beside it.
        let left: Vec<_> = std::fs::read_dir(tmp.join("."))
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| n.starts_with('.'))
            .collect();
        assert!(left.is_empty(), "{left:?}");
    }
}

/// Round 51: Ingero records no exit code, and the import stored 0 for
/// every exit (the report said "exit 0"); docs/import.md says NULL.
#[test]
fn an_imported_exit_code_is_unknown_not_zero() {
    let tmp = TempDir::new("ingero-exit");
    let (src, dst) = (tmp.join("ingero.db"), tmp.join("out.db"));
    write_ingero(&src, &dataloader_rows());
    import_ingero(&src, &dst).unwrap();
    let procs = Trace::open(&dst).unwrap().processes().unwrap();
    let worker = procs.iter().find(|p| p.pid == 2254).unwrap();
    assert!(worker.exit_ns.is_some(), "its exit is recorded: {worker:?}");
    assert_eq!(worker.exit_code, None, "{worker:?}");
    let conn = rusqlite::Connection::open(&dst).unwrap();
    let codes: Vec<Option<i64>> = conn
        .prepare("SELECT exit_code FROM proc_events WHERE kind = 'exit'")
        .unwrap()
        .query_map([], |r| r.get(0))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    assert_eq!(codes, vec![None]);
}

#[test]
fn a_huge_op_name_is_not_copied_per_event() {
    let tmp = TempDir::new("ingero-bigname");
    let (src, dst) = (tmp.join("ingero.db"), tmp.join("out.db"));
    let c = write_ingero(&src, &dataloader_rows());
    add_huge_op(&c, 300);
    drop(c);
    let sum = import_ingero(&src, &dst).unwrap();
    let (name, n) = sum
        .skipped_unknown
        .iter()
        .find(|(k, _)| k.contains("op99"))
        .expect("the long-named op is counted as unknown");
    assert_eq!(*n, 300);
    assert!(
        name.len() < 100,
        "the 1 MB name is not carried: {}",
        name.len()
    );
    assert!(sum.notes.iter().all(|n| n.len() < 4096));
}

#[test]
fn a_view_in_place_of_a_table_is_refused_not_followed() {
    let tmp = TempDir::new("ingero-view");
    let (src, dst) = (tmp.join("ingero.db"), tmp.join("out.db"));
    let c = write_ingero(&src, &dataloader_rows());
    // A recursive view that never ends, under the name the importer reads.
    c.execute_batch(
        "ALTER TABLE events RENAME TO events_real;
         CREATE VIEW events(id, timestamp, pid, tid, source, op, duration, arg0, arg1, ret_code) AS
           WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n)
           SELECT i, i, 1, 1, 1, 1, 1, 0, 0, 0 FROM n;",
    )
    .unwrap();
    drop(c);
    let (tx, rx) = std::sync::mpsc::channel();
    let (s2, d2) = (src.clone(), dst.clone());
    std::thread::spawn(move || {
        let _ = tx.send(
            import_ingero(&s2, &d2)
                .map(|_| ())
                .map_err(|e| e.to_string()),
        );
    });
    let e = rx
        .recv_timeout(Duration::from_secs(30))
        .expect("import hung on a recursive view")
        .expect_err("a view is no Ingero table");
    assert!(e.contains("`events` is a view"), "{e}");
    assert!(!dst.exists());
}

#[test]
fn a_failed_or_refused_import_leaves_nothing_behind() {
    let tmp = TempDir::new("ingero-leftovers");
    let (src, dst) = (tmp.join("ingero.db"), tmp.join("out.db"));
    write_ingero(&src, &dataloader_rows());
    // The output may never be the input.
    let e = import_ingero(&src, &src).unwrap_err().to_string();
    assert!(e.contains("is the input"), "{e}");
    // An existing output is kept as it is.
    std::fs::write(&dst, b"mine").unwrap();
    let e = import_ingero(&src, &dst).unwrap_err().to_string();
    assert!(e.contains("already exists"), "{e}");
    assert_eq!(std::fs::read(&dst).unwrap(), b"mine");
    std::fs::remove_file(&dst).unwrap();
    // A source that fails part-way: only the source is left in the folder.
    let bad = tmp.join("bad.db");
    let c = write_ingero(&bad, &dataloader_rows());
    c.execute_batch("UPDATE events SET pid = 'not a number' WHERE id = 20")
        .unwrap();
    drop(c);
    let e = import_ingero(&bad, &dst).unwrap_err().to_string();
    assert!(e.contains("unreadable Ingero event"), "{e}");
    let mut left: Vec<String> = std::fs::read_dir(&tmp.0)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    left.sort();
    assert_eq!(left, ["bad.db", "ingero.db"]);
    // And a good import right after produces the one file asked for.
    import_ingero(&src, &dst).unwrap();
    assert!(dst.exists());
    assert_eq!(std::fs::read_dir(&tmp.0).unwrap().count(), 3);
}

/// Expected calls per our op name, read straight from the source database.
fn expected_counts(src: &std::path::Path) -> BTreeMap<String, u64> {
    let c = rusqlite::Connection::open_with_flags(src, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY)
        .unwrap();
    let mut st = c
        .prepare(
            "SELECT e.source, o.name, count(*) FROM events e JOIN ops o
             ON o.source_id = e.source AND o.op_id = e.op
             WHERE e.source IN (1, 4) GROUP BY e.source, e.op",
        )
        .unwrap();
    let rename = |s: &str| match s {
        "cudaStreamSync" => "cudaStreamSynchronize".to_string(),
        "cudaDeviceSync" => "cudaDeviceSynchronize".to_string(),
        "cuMemAlloc" => "cuMemAlloc_v2".to_string(),
        other => other.to_string(),
    };
    st.query_map([], |r| {
        Ok((rename(&r.get::<_, String>(1)?), r.get::<_, i64>(2)? as u64))
    })
    .unwrap()
    .map(|r| r.unwrap())
    .collect()
}

#[test]
fn both_real_ingero_databases_import_with_exact_counts() {
    let Some(dir) = ingero_dir() else { return };
    let tmp = TempDir::new("ingero");
    for name in [
        "pytorch-dataloader-starvation.db",
        "vllm-37343-logprobs-amplification.db",
    ] {
        let src = dir.join(name);
        let dst = tmp.join(name);
        let sum = import_ingero(&src, &dst).unwrap_or_else(|e| panic!("{name}: {e}"));
        let want = expected_counts(&src);
        assert!(!want.is_empty());
        assert_eq!(sum.calls_by_op, want, "{name}: summary counts");
        assert_eq!(stored_counts(&dst), want, "{name}: stored counts");

        let t = Trace::open(&dst).unwrap();
        assert_eq!(t.source(), TraceSource::Ingero);
        let data = t.load(None).unwrap();
        assert!(!data.has_host_context);
        assert!(data.waits.is_empty(), "sched_switch never becomes waits");
        assert!(data.calls.windows(2).all(|w| w[0].ts_ns <= w[1].ts_ns));
        assert!(!data.processes.is_empty());
        assert_eq!(data.realtime_offset_ns, 0);
        let notes = t.notes().unwrap();
        assert!(notes
            .iter()
            .any(|n| n.text.contains("no on-CPU/runnable/blocked split")));
        assert!(notes.iter().any(|n| n.text.contains("selective")));
        assert!(sum.sched_switch_skipped > 0);
        assert!(notes.iter().any(|n| n.text.contains("sched_switch")));
        assert!(t.session().unwrap().info.tool_version.starts_with("ingero"));
    }
}

#[test]
fn real_ingero_allocations_carry_sizes_and_feed_the_ledger() {
    let Some(dir) = ingero_dir() else { return };
    let src = dir.join("pytorch-dataloader-starvation.db");
    let tmp = TempDir::new("ingero-sizes");
    let dst = tmp.join("t.db");
    import_ingero(&src, &dst).unwrap();
    let c = rusqlite::Connection::open_with_flags(&src, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY)
        .unwrap();
    let want_bytes: i64 = c
        .query_row(
            "SELECT sum(arg0) FROM events WHERE source = 1 AND op = 1",
            [],
            |r| r.get(0),
        )
        .unwrap();
    let data = Trace::open(&dst).unwrap().load(None).unwrap();
    let got_bytes: u64 = data
        .calls
        .iter()
        .filter(|c| c.op_name() == "cudaMalloc")
        .map(|c| c.size.unwrap())
        .sum();
    assert_eq!(got_bytes as i64, want_bytes);
    // The first cudaMalloc of this trace wraps a cuMemAlloc on the same thread.
    let first_malloc = data
        .calls
        .iter()
        .find(|c| c.op_name() == "cudaMalloc")
        .unwrap();
    let inner = data
        .calls
        .iter()
        .find(|c| {
            c.op_name() == "cuMemAlloc_v2"
                && c.tid == first_malloc.tid
                && c.ts_ns >= first_malloc.ts_ns
        })
        .unwrap();
    assert!(inner.end_ns() <= first_malloc.end_ns());
    assert!(inner.nested);
    assert!(!first_malloc.nested);
    // Issue 14: the ledger counts the sizes Ingero stored, each once
    // (7 cudaMalloc with their nested cuMemAlloc, 3 direct cuMemAlloc).
    let direct_driver: i64 = c
        .query_row(
            "SELECT sum(e.arg0) FROM events e WHERE e.source = 4 AND e.op = 5 AND NOT EXISTS (
                SELECT 1 FROM events r WHERE r.source = 1 AND r.op = 1 AND r.tid = e.tid
                AND r.timestamp <= e.timestamp AND r.timestamp + r.duration >= e.timestamp + e.duration)",
            [],
            |r| r.get(0),
        )
        .unwrap();
    let l = ledger(&data, None);
    let allocs: u64 = l.iter().map(|p| p.allocs).sum();
    let live: u64 = l.iter().map(|p| p.live_bytes).sum();
    assert_eq!(allocs, 10);
    assert_eq!(live as i64, want_bytes + direct_driver);
}

#[test]
fn bad_ingero_inputs_are_clear_errors() {
    let tmp = TempDir::new("ingero-bad");
    let dst = tmp.join("out.db");
    let text = tmp.join("notes.txt");
    std::fs::write(&text, b"not sqlite\n".repeat(500)).unwrap();
    let e = import_ingero(&text, &dst).err().unwrap().to_string();
    assert!(e.contains("notes.txt") && !e.contains('\n'), "{e}");
    assert!(!dst.exists(), "no output for bad input");

    let ours = tmp.join("ours.db");
    small_trace(&ours);
    let e = import_ingero(&ours, &dst).err().unwrap().to_string();
    assert!(e.contains("not an Ingero trace"), "{e}");

    let e = import_ingero(&tmp.join("missing.db"), &dst)
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("no such file"), "{e}");

    {
        // Corrupt copy of an Ingero-schema file.
        let good = tmp.join("good.db");
        write_ingero(&good, &dataloader_rows());
        let mut bytes = std::fs::read(&good).unwrap();
        let mid = bytes.len() / 2;
        assert!(mid > 4096, "fixture large enough to corrupt its middle");
        for b in &mut bytes[4096..mid] {
            *b = 0x5A;
        }
        let bad = tmp.join("corrupt.db");
        std::fs::write(&bad, &bytes).unwrap();
        let e = import_ingero(&bad, &dst).err().unwrap().to_string();
        assert!(e.contains("corrupt.db") && !e.contains('\n'), "{e}");
        assert!(!dst.exists());
    }
}
