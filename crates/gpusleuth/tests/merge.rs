//! `gpusleuth merge` on input it must refuse, and over an output it must
//! keep (round 51's exploratory tester): each refusal is one line, exit 1,
//! no panic, and nothing is written.

mod common;

use common::{assert_no_panic, gpusleuth, Sandbox};
use sleuth_core::{op_by_name, CallEvent, Event};
use sleuth_store::{SessionInfo, TraceWriter, WriterOptions};
use std::path::Path;
use std::process::Output;

/// A complete trace of process `pid`: one cudaMalloc at `ts_ns`, its
/// session's wall-clock offset `realtime_offset_ns`.
fn write_trace(path: &Path, pid: u32, ts_ns: u64, realtime_offset_ns: i64) {
    let info = SessionInfo {
        started_unix_ns: 1_700_000_000_000_000_000,
        start_mono_ns: 1_000,
        realtime_offset_ns,
        hostname: "node".into(),
        command: "test".into(),
        target: "test".into(),
        launch_mode: "launch".into(),
        tool_version: "test".into(),
        clock_base_ns: 0,
        ..Default::default()
    };
    let w = TraceWriter::create(path, info, WriterOptions::default()).unwrap();
    let h = w.handle();
    h.send(Event::Call(CallEvent {
        ts_ns,
        dur_ns: 500,
        pid,
        tid: pid,
        op: op_by_name("cudaMalloc").unwrap().id,
        size: Some(4096),
        ..Default::default()
    }))
    .unwrap();
    h.set_session_end(ts_ns + 1_000).unwrap();
    drop(h);
    w.finish().unwrap();
}

fn run(args: &[&str]) -> Output {
    let out = gpusleuth().args(args).output().expect("run gpusleuth");
    assert_no_panic(&out);
    out
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// The one error line of a failed run (exit 1).
fn refusal(out: &Output) -> String {
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(1), "{err}");
    let lines: Vec<&str> = err.lines().collect();
    assert_eq!(lines.len(), 1, "one line: {err}");
    assert!(lines[0].starts_with("gpusleuth: error"), "{err}");
    err
}

/// Found in round 51: a killed tracer's file (no rollups, no session end)
/// merged as it was, its calls outside the merged session and its
/// kernel-counted launches lost; a file a tracer was still writing merged
/// too. The first is refused naming `gpusleuth finish`, the second naming
/// the process writing it.
#[test]
fn an_unfinished_or_live_input_is_refused() {
    let sb = Sandbox::new("merge-unfinished");
    let (a, killed, out_db) = (sb.path("a.db"), sb.path("killed.db"), sb.path("job.db"));
    write_trace(&a, 10, 1_000_000, 0);
    write_trace(&killed, 20, 2_000_000, 0);
    // As its tracer leaves it when killed before its completion.
    let c = rusqlite::Connection::open(&killed).unwrap();
    c.execute_batch(
        "DELETE FROM meta WHERE key = 'rollups'; UPDATE session SET end_mono_ns = NULL;",
    )
    .unwrap();
    drop(c);
    let err = refusal(&run(&["merge", s(&a), s(&killed), "-o", s(&out_db)]));
    assert!(
        err.contains("is not finished") && err.contains("`gpusleuth finish --db"),
        "{err}"
    );
    assert!(!out_db.exists());

    // The same file held open by a live process (as its tracer holds it).
    let mut holder = std::process::Command::new("sleep")
        .arg("60")
        .stdin(std::fs::File::open(&killed).unwrap())
        .spawn()
        .expect("spawn sleep");
    let out = run(&["merge", s(&a), s(&killed), "-o", s(&out_db)]);
    let _ = holder.kill();
    let _ = holder.wait();
    let err = refusal(&out);
    assert!(
        err.contains(&format!("is being written by sleep (pid {})", holder.id())),
        "{err}"
    );
    assert!(!out_db.exists());
}

/// `--force` renames the merge over the output: a trace a tracer still
/// records there would go on into a file no name leads to. Such an output
/// is refused, --force or not (as `trace --force` refuses it); a complete
/// trace a reader holds is replaced.
#[test]
fn force_never_replaces_a_trace_being_written() {
    let sb = Sandbox::new("merge-live-output");
    let (a, b, out_db) = (sb.path("a.db"), sb.path("b.db"), sb.path("job.db"));
    write_trace(&a, 10, 1_000_000, 0);
    write_trace(&b, 20, 2_000_000, 0);
    write_trace(&out_db, 30, 3_000_000, 0);
    let hold = || {
        std::process::Command::new("sleep")
            .arg("60")
            .stdin(std::fs::File::open(&out_db).unwrap())
            .spawn()
            .expect("spawn sleep")
    };
    let merge = || run(&["merge", s(&a), s(&b), "-o", s(&out_db), "--force"]);
    // Complete and held by a reader: replaced.
    let mut reader = hold();
    let out = merge();
    let _ = reader.kill();
    let _ = reader.wait();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    // Not completed by its tracer, and held: refused, left as it is.
    std::fs::remove_file(&out_db).unwrap();
    write_trace(&out_db, 30, 3_000_000, 0);
    rusqlite::Connection::open(&out_db)
        .unwrap()
        .execute_batch(
            "DELETE FROM meta WHERE key = 'rollups'; UPDATE session SET end_mono_ns = NULL;",
        )
        .unwrap();
    let before = std::fs::read(&out_db).unwrap();
    let mut tracer = hold();
    let out = merge();
    let _ = tracer.kill();
    let _ = tracer.wait();
    let err = refusal(&out);
    assert!(
        err.contains(&format!("sleep (pid {}) is writing it", tracer.id()))
            && err.contains("refusing to replace a live trace"),
        "{err}"
    );
    assert_eq!(std::fs::read(&out_db).unwrap(), before);
}

/// Found in round 51: node n's pids move by n × 2^22 in 32 bits, so a
/// 1025th trace's offset wrapped to 0 (its pids taken for node 0's), and a
/// crafted pid above Linux's pid_max moved past 2^32 (a panic in a debug
/// build, a wrap onto another node's pid in release). Both are refused in
/// one line, before anything is read or written.
#[test]
fn more_nodes_or_pids_than_the_pid_offsets_hold_are_refused() {
    let sb = Sandbox::new("merge-nodes");
    let out_db = sb.path("job.db");
    let names: Vec<String> = (0..1025)
        .map(|i| s(&sb.path(&format!("n{i}.db"))).to_string())
        .collect();
    let mut args = vec!["merge", "-o", s(&out_db)];
    args.extend(names.iter().map(String::as_str));
    let err = refusal(&run(&args));
    assert!(
        err.contains("1025 traces given: merge takes at most 1024"),
        "{err}"
    );
    assert!(!out_db.exists());

    // Node b's pid 10 collides with node a's: its pids move by 2^22, and
    // its pid 4294967000 cannot.
    let (a, b) = (sb.path("a.db"), sb.path("b.db"));
    write_trace(&a, 10, 1_000_000, 0);
    write_trace(&b, 10, 2_000_000, 0);
    let big = sb.path("big.db");
    write_trace(&big, 4_294_967_000, 2_000_000, 0);
    // The big pid's call joins node b's file.
    let c = rusqlite::Connection::open(&b).unwrap();
    c.execute_batch(&format!(
        "ATTACH '{}' AS big;
         INSERT INTO call_rows(ts_ns, dur_ns, tid, op_id, ret, size, nested, runnable_ns,
                               blocked_ns, cpu, pid_gap)
            SELECT ts_ns, dur_ns, tid, op_id, ret, size, nested, runnable_ns, blocked_ns, cpu,
                   pid_gap FROM big.call_rows;
         INSERT INTO rollup_ops SELECT * FROM big.rollup_ops;",
        s(&big)
    ))
    .unwrap();
    drop(c);
    let err = refusal(&run(&["merge", s(&a), s(&b), "-o", s(&out_db)]));
    assert!(
        err.contains("pid 4294967000 is above Linux's pid_max"),
        "{err}"
    );
    assert!(!out_db.exists());
}

/// Found in round 51: node n's shift (its wall-clock offset minus the first
/// node's) wrapped in a release build for offsets far apart, and a shift
/// that moved times below 0 (a trace recorded a day before the first
/// node's clock began) wrote them so, rows every reader then skipped.
/// Both are refused in one line naming the input; nothing is written.
#[test]
fn a_clock_shift_that_overflows_or_leaves_the_range_is_refused() {
    let sb = Sandbox::new("merge-shift");
    let (a, b, out_db) = (sb.path("a.db"), sb.path("b.db"), sb.path("job.db"));
    let day: i64 = 86_400_000_000_000;
    let now: i64 = 1_700_000_000_000_000_000;
    write_trace(&a, 10, 1_000_000, now);
    write_trace(&b, 20, 2_000_000, now - day);
    let err = refusal(&run(&["merge", s(&a), s(&b), "-o", s(&out_db)]));
    assert!(
        err.contains("b.db: its times moved onto the first trace's clock (by -86400000000000 ns")
            && err.contains("leave the readers' range 0..2^62 ns"),
        "{err}"
    );
    assert!(!out_db.exists());

    std::fs::remove_file(&b).unwrap();
    write_trace(&b, 20, 2_000_000, -(now * 5));
    let err = refusal(&run(&["merge", s(&a), s(&b), "-o", s(&out_db)]));
    assert!(
        err.contains("b.db: its wall-clock offset (-8500000000000000000 ns) is too far from the first trace's"),
        "{err}"
    );
    assert!(!out_db.exists());
}
