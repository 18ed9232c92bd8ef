//! Committed batches survive SIGKILL: a child process (this test binary,
//! re-run with an env var) writes batches and reports each commit on its
//! stdout; the parent kills it mid-write at varying points, then checks every
//! database opens, passes integrity_check, and holds every reported batch.

mod common;
use common::*;
use sleuth_core::Event;
use sleuth_store::{Trace, TraceWriter, WriterOptions};
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};

const CHILD_ENV: &str = "SLEUTH_STORE_CRASH_CHILD_DB";
const BATCH: u64 = 500;

/// Child mode entry: only does something when started by the parent test.
#[test]
fn crash_child_entry() {
    let Ok(path) = std::env::var(CHILD_ENV) else {
        return;
    };
    let w = TraceWriter::create(
        std::path::Path::new(&path),
        session(),
        WriterOptions::default(),
    )
    .expect("child: create");
    let h = w.handle();
    let mut ts = 0u64;
    loop {
        for _ in 0..BATCH {
            ts += 100;
            h.send(Event::Call(call("cudaLaunchKernel", 7, 7, ts, 50)))
                .expect("child: send");
        }
        let committed = h.flush().expect("child: flush");
        println!("committed {committed}");
    }
}

#[test]
fn committed_batches_survive_sigkill() {
    let exe = std::env::current_exe().unwrap();
    let dir = TempDir::new("crash");
    for round in 0..6u64 {
        let db = dir.join(&format!("crash-{round}.db"));
        let mut child = Command::new(&exe)
            .args([
                "--exact",
                "crash_child_entry",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(CHILD_ENV, &db)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let stdout = child.stdout.take().unwrap();
        let mut lines = BufReader::new(stdout).lines();
        // Kill after a different number of commits each round; the child is
        // already writing the next batch when the signal lands.
        let kill_after = 1 + round * 3;
        let mut reported = 0u64;
        let mut seen = 0u64;
        while seen < kill_after {
            let line = lines.next().expect("child ended early").unwrap();
            if let Some(n) = line.strip_prefix("committed ") {
                reported = n.trim().parse().unwrap();
                seen += 1;
            }
        }
        // SAFETY: kill(2) on the pid of our own child, which has not been reaped yet.
        let rc = unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGKILL) };
        assert_eq!(rc, 0);
        let status = child.wait().unwrap();
        assert!(!status.success());
        // Commits reported after our last read also happened before the kill.
        for line in lines.map_while(Result::ok) {
            if let Some(n) = line.strip_prefix("committed ") {
                reported = n.trim().parse().unwrap();
            }
        }
        assert!(reported >= kill_after * BATCH);

        // Read-only first: a crashed WAL database must open without recovery by a writer.
        let t = Trace::open(&db).unwrap_or_else(|e| panic!("round {round}: {e}"));
        let ok: String =
            rusqlite::Connection::open_with_flags(&db, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY)
                .unwrap()
                .query_row("PRAGMA integrity_check", [], |r| r.get(0))
                .unwrap();
        assert_eq!(ok, "ok", "round {round}");
        let data = t.load(None).unwrap();
        assert!(
            data.calls.len() as u64 >= reported,
            "round {round}: {} calls stored, {reported} reported committed",
            data.calls.len()
        );
    }
}

/// Found in round 50: a reader holding the file as the trace ended (a
/// `stats` run in a loop beside the tracer) made leaving WAL mode fail at
/// once, after the completion had committed: the tracer said "completing
/// the trace failed: database is locked" and exited 1 over a complete file.
/// The switch now waits for the reader.
#[test]
fn a_reader_holding_the_file_as_it_ends_does_not_fail_the_trace() {
    let (dir, path, w) = new_trace("reader-at-end");
    let h = w.handle();
    h.send(Event::Call(call("cudaMalloc", 7, 7, 1_000, 10)))
        .unwrap();
    drop(h);
    // The batch committed (WAL mode while tracing), then a reader's snapshot.
    let wal = dir.join("t.db-wal");
    for _ in 0..200 {
        if std::fs::metadata(&wal).is_ok_and(|m| m.len() > 0) {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    let reader = rusqlite::Connection::open(&path).unwrap();
    reader
        .execute_batch("BEGIN; SELECT count(*) FROM call_rows;")
        .unwrap();
    let release = std::thread::spawn(move || {
        std::thread::sleep(std::time::Duration::from_millis(500));
        drop(reader);
    });
    let summary = w.finish().expect("complete despite the reader");
    release.join().unwrap();
    assert!(!summary.kept_wal, "the reader let go within the wait");
    assert!(!wal.exists(), "one self-contained file");
    let t = Trace::open(&path).unwrap();
    assert!(t.has_rollups().unwrap());
}

/// A write that fails (here another connection holds the file's write
/// lock; in the field, a disk filled by another process between two
/// commits) ends the writer: its error says how many events the file does
/// not hold, where it said only the failure (round 60's tester: a trace
/// that lost 92% of its calls read "0 dropped").
#[test]
fn a_failed_write_says_how_many_events_the_file_does_not_hold() {
    let (_dir, path, w) = new_trace("failed-write");
    let h = w.handle();
    for i in 0..3u64 {
        h.send(Event::Call(call("cudaMalloc", 1, 1, i * 1_000, 10)))
            .unwrap();
    }
    h.flush().unwrap();
    let other = rusqlite::Connection::open(&path).unwrap();
    other.execute_batch("BEGIN IMMEDIATE").unwrap();
    for i in 3..8u64 {
        h.send(Event::Call(call("cudaMalloc", 1, 1, i * 1_000, 10)))
            .unwrap();
    }
    h.flush().unwrap();
    other.execute_batch("ROLLBACK").unwrap();
    drop(other);
    h.send(Event::Call(call("cudaMalloc", 1, 1, 9_000, 10)))
        .unwrap();
    drop(h);
    let e = w.finish().unwrap_err().to_string();
    assert!(
        e.contains("6 events of that write and after it were not stored"),
        "{e}"
    );
}
