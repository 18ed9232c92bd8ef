//! Import of the two real Ingero databases in ../shared/data/ingero: every
//! mapped op's count equals the source's, computed from the source here.

mod common;
use common::*;
use sleuth_store::{import_ingero, run_readonly_sql, SqlLimits, Trace, TraceSource};
use std::collections::BTreeMap;
use std::path::PathBuf;

fn ingero_dir() -> Option<PathBuf> {
    let dir = PathBuf::from(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../../shared/data/ingero"
    ));
    if dir.is_dir() {
        return Some(dir);
    }
    if std::env::var("CI").as_deref() == Ok("true") {
        panic!(
            "Ingero test data missing at {} (required in CI)",
            dir.display()
        );
    }
    eprintln!("skipping: Ingero test data not found at {}", dir.display());
    None
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
fn both_ingero_databases_import_with_exact_counts() {
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
        let ours = run_readonly_sql(
            &dst,
            "SELECT op, count(*) FROM calls GROUP BY op",
            SqlLimits::default(),
        )
        .unwrap();
        let ours: BTreeMap<String, u64> = ours
            .rows
            .iter()
            .map(|r| (r[0].as_str().unwrap().to_string(), r[1].as_u64().unwrap()))
            .collect();
        assert_eq!(ours, want, "{name}: stored counts");

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
fn ingero_allocations_carry_sizes_and_driver_calls_inside_runtime_calls_are_nested() {
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

    if let Some(dir) = ingero_dir() {
        // Corrupt copy of a real Ingero file.
        let mut bytes = std::fs::read(dir.join("pytorch-dataloader-starvation.db")).unwrap();
        let mid = bytes.len() / 2;
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
