//! Traces written again through today's writer, and the comparison of a
//! stored-rollup answer with the in-memory one. Shared by sleuth-store's
//! integration tests and, through `#[path]` (gpusleuth's main.rs), by the
//! lean-load tests of `gpusleuth explain` and of the Perfetto export, which
//! check the same bound on the same kind of rewritten trace.

use sleuth_core::rollup::MAX_RELATIVE_ERROR;
use sleuth_core::{Event, TraceData};
use sleuth_store::{SessionInfo, TraceWriter, WriterHandle, WriterOptions};
use std::path::{Path, PathBuf};

pub fn session() -> SessionInfo {
    SessionInfo {
        started_unix_ns: 1_700_000_000_000_000_000,
        start_mono_ns: 1_000,
        realtime_offset_ns: 1_699_999_999_000_000_000,
        hostname: "testhost".into(),
        kernel: "6.1.0".into(),
        command: "gpusleuth trace -- ./work".into(),
        target: "./work".into(),
        launch_mode: "launch".into(),
        tool_version: "0.1.0".into(),
        clock_base_ns: 0,
    }
}

/// Leaves the file at `path` as the tracer leaves the file it is still
/// writing (or a killed writer's): no meta key its completion writes
/// (rollups, call groups, finding and site rollups), no call groups table,
/// no call-row indexes.
pub fn strip_as_being_written(path: &Path) {
    let c = rusqlite::Connection::open(path).unwrap();
    c.execute_batch(
        "DELETE FROM meta WHERE key NOT IN ('schema_version', 'tool', 'source', 'tool_version');
         DROP TABLE call_groups;
         DROP INDEX IF EXISTS call_rows_tid_ts; DROP INDEX IF EXISTS call_rows_op_dur;",
    )
    .unwrap();
}

/// A trace of the repository's `examples/` (written by earlier versions).
pub fn example(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../examples")
        .join(name)
}

/// The two example traces as one trace of two processes (pid 25707 of
/// `h200-contention.db`, pid 725 of `demo-sim.db`; their own calls,
/// waits, processes and kernel counts): what `--pid` answers are checked
/// on, each process among another's events.
pub fn two_processes() -> TraceData {
    let load = |name: &str| {
        sleuth_store::Trace::open(&example(name))
            .unwrap()
            .load(None)
            .unwrap()
    };
    let mut data = load("h200-contention.db");
    let other = load("demo-sim.db");
    data.calls.extend(other.calls);
    data.waits.extend(other.waits);
    data.processes.extend(other.processes);
    data.counts.extend(other.counts);
    data
}

/// Writes `data` through a fresh writer (events in time order), which
/// stores the rollups and the finding rollups when it finishes.
pub fn rewrite(data: &TraceData, path: &Path) {
    rewrite_with(
        data,
        path,
        WriterOptions::default(),
        session(),
        |_| {},
        |_| {},
    );
}

/// [`rewrite_with_options`], also leaving at `unfinished` the file as a
/// tracer killed just before its completion would have: every event
/// committed (the main file and its `-wal` copied while the writer waits),
/// nothing of the completion.
pub fn rewrite_leaving_unfinished(
    data: &TraceData,
    path: &Path,
    opts: WriterOptions,
    unfinished: &Path,
) {
    rewrite_with(data, path, opts, session(), context_of(data), |h| {
        copy_as_killed(h, path, unfinished)
    });
}

/// Copies the file `h` writes at `path` to `unfinished` as a tracer killed
/// now would leave it: every event sent committed first, then the main
/// file and its `-wal` copied while the writer waits.
pub fn copy_as_killed(h: &WriterHandle, path: &Path, unfinished: &Path) {
    h.flush().unwrap();
    std::fs::copy(path, unfinished).unwrap();
    let wal = |p: &Path| {
        let mut s = p.as_os_str().to_owned();
        s.push("-wal");
        PathBuf::from(s)
    };
    if wal(path).exists() {
        std::fs::copy(wal(path), wal(unfinished)).unwrap();
    }
}

/// [`rewrite`], also writing what the report draws besides the calls and
/// waits: call sites, NVML samples and process lifecycle events.
pub fn rewrite_with_context(data: &TraceData, path: &Path) {
    rewrite_with_options(data, path, WriterOptions::default());
}

/// [`rewrite_with_context`] through a writer with `opts` (a file of a
/// rotating trace: `opts.run`).
pub fn rewrite_with_options(data: &TraceData, path: &Path, opts: WriterOptions) {
    rewrite_in_session(data, path, opts, session());
}

/// [`rewrite_with_options`] in `session` (its start: where a file of a run
/// began).
pub fn rewrite_in_session(
    data: &TraceData,
    path: &Path,
    opts: WriterOptions,
    session: SessionInfo,
) {
    rewrite_with(data, path, opts, session, context_of(data), |_| {});
}

/// What [`rewrite_in_session`] writes before the events: call sites, NVML
/// samples and process lifecycle events.
fn context_of(data: &TraceData) -> impl FnOnce(&WriterHandle) + '_ {
    |h| {
        for s in data.stacks.values() {
            h.add_stack(s.clone()).unwrap();
        }
        if let Some(g) = &data.gpu_samples {
            h.add_gpu_samples(g.clone()).unwrap();
        }
        h.add_process_gpu_samples(data.process_gpu.clone()).unwrap();
        for p in &data.procs {
            h.send(Event::Proc(p.clone())).unwrap();
        }
    }
}

/// [`rewrite`] with `before` writing more before the events and `after`
/// called once they are sent, before the writer finishes.
fn rewrite_with(
    data: &TraceData,
    path: &Path,
    opts: WriterOptions,
    session: SessionInfo,
    before: impl FnOnce(&WriterHandle),
    after: impl FnOnce(&WriterHandle),
) {
    let w = TraceWriter::create(path, session, opts).unwrap();
    let h = w.handle();
    before(&h);
    for p in &data.processes {
        h.set_process(p.clone()).unwrap();
    }
    for (k, v) in &data.stats {
        if !k.starts_with("events_") {
            h.set_stat(k.clone(), *v).unwrap();
        }
    }
    h.set_op_counts(data.counts.clone()).unwrap();
    let mut events: Vec<(u64, Event)> = data
        .calls
        .iter()
        .map(|c| (c.ts_ns, Event::Call(c.clone())))
        .chain(data.waits.iter().map(|w| (w.on_ns, Event::Wait(w.clone()))))
        .collect();
    events.sort_by_key(|e| e.0);
    for (_, e) in events {
        h.send(e).unwrap();
    }
    after(&h);
    drop(h);
    w.finish().unwrap();
}

/// A percentile from the rollups against the exact one: within
/// MAX_RELATIVE_ERROR, or both absent.
pub fn close(got: Option<u64>, want: Option<u64>, what: &str) {
    match (got, want) {
        (Some(g), Some(w)) => assert!(
            g.abs_diff(w) as f64 <= w as f64 * MAX_RELATIVE_ERROR,
            "{what}: {g} vs {w}"
        ),
        (g, w) => assert_eq!(g, w, "{what}"),
    }
}

/// Equal, except what the histogram bounds (docs/schema.md): percentiles
/// within MAX_RELATIVE_ERROR, a tail that may leave out calls within one
/// bucket of p95 (its shares then follow those calls).
pub fn assert_close(got: &serde_json::Value, want: &serde_json::Value, at: &str) {
    use serde_json::Value;
    match (got, want) {
        (Value::Object(g), Value::Object(w)) => {
            assert_eq!(
                g.keys().collect::<Vec<_>>(),
                w.keys().collect::<Vec<_>>(),
                "{at}"
            );
            for (k, wv) in w {
                let gv = &g[k];
                let here = format!("{at}.{k}");
                if k.ends_with("p50_ns")
                    || k.ends_with("p95_ns")
                    || k.ends_with("p99_ns")
                    || k == "tail_ns"
                {
                    close(gv.as_u64(), wv.as_u64(), &here);
                } else if k == "p99_over_p50" || k == "tail_over_p50" {
                    let (a, b) = (gv.as_f64().unwrap_or(0.0), wv.as_f64().unwrap_or(0.0));
                    assert!(
                        (a - b).abs() <= b * 3.0 * MAX_RELATIVE_ERROR,
                        "{here}: {a} vs {b}"
                    );
                } else if k == "tail" && gv["calls"] != wv["calls"] {
                    assert!(gv["calls"].as_u64() < wv["calls"].as_u64(), "{here}");
                } else {
                    assert_close(gv, wv, &here);
                }
            }
        }
        (Value::Array(g), Value::Array(w)) => {
            assert_eq!(g.len(), w.len(), "{at}");
            for (i, (a, b)) in g.iter().zip(w).enumerate() {
                assert_close(a, b, &format!("{at}[{i}]"));
            }
        }
        (g, w) => assert_eq!(g, w, "{at}"),
    }
}
