//! SECURITY.md's promises for the agent, with real eBPF: drops are never
//! silent (every emitted record is stored or counted), and kernel state
//! drains as traced processes exit (bounded maps, no leak).

mod common;

use common::Sandbox;

#[test]
fn ring_overflow_is_counted_exactly() {
    let Some(sb) = Sandbox::for_ebpf("ring-overflow") else {
        return;
    };
    const N: i64 = 5000;
    // A 4 KiB ring holds ~32 call records; the workload emits 4 per iteration
    // (cudaMalloc, cuMemAlloc_v2, cudaFree, cuMemFree_v2) far faster than that.
    let out = sb.trace(&["--ring-size", "4K"], &format!("churn {N}"), 0);
    let db = sb.open_db();
    let stored = db.int("SELECT count(*) FROM calls");
    let dropped = db.int("SELECT value FROM stats WHERE name = 'drop_ring_full_call'");
    assert!(
        dropped > 0,
        "a 4 KiB ring under a flood must overflow (stored {stored})"
    );
    assert_eq!(
        stored + dropped,
        4 * N,
        "every call record emitted must be stored or counted as dropped"
    );
    // The summary the user sees says so too.
    let stats = common::stats_json(&sb.db());
    let drops = stats["drops"]["ring_full_call"]
        .as_u64()
        .or_else(|| stats["drops"]["drop_ring_full_call"].as_u64());
    assert_eq!(
        drops,
        Some(dropped as u64),
        "stats --json must report the drops: {}",
        stats["drops"]
    );
    // And the end of the trace warns with every loss, their share and the cause.
    let lost = stats["drops"]["total"].as_u64().expect("drops.total");
    // explain counts them: no finding there is not a clean trace.
    assert_eq!(common::explain_json(&sb.db())["events_lost"], lost);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(&format!("gpusleuth: warning: {lost} events ("))
            && err.contains("% of those the probes produced) were lost")
            && err.contains("when the ring buffer was full (a larger --ring-size"),
        "{err}"
    );
}

#[test]
fn records_that_wrap_past_the_rings_end_are_read_whole() {
    // The consumer maps the ring's data pages once (round 49): a record that
    // wraps past the end is copied whole. A 4 KiB ring laps every ~30
    // records, and records of several sizes (calls, waits, call sites) land
    // across its end again and again; paced so that few if any are dropped
    // (tests beside this one may take the CPUs), every field of every call
    // stored must read as the workload made it.
    let Some(sb) = Sandbox::for_ebpf("ring-wrap") else {
        return;
    };
    const N: usize = 600;
    sb.trace(
        &["--ring-size", "4K"],
        &format!("repeat {N} {{ malloc 4096 a; free a; sleep 2 }}"),
        0,
    );
    let db = sb.open_db();
    let dropped = db.int(
        "SELECT coalesce(sum(value), 0) FROM stats WHERE name LIKE 'drop_%' AND name != 'drop_db_full'",
    );
    let rows = |op: &str| {
        db.ints(&format!(
            "SELECT size, ptr, ret FROM calls WHERE op = '{op}' ORDER BY ts_ns"
        ))
    };
    let mallocs = [rows("cudaMalloc"), rows("cuMemAlloc_v2")];
    let frees = [rows("cudaFree"), rows("cuMemFree_v2")];
    let stored: usize = mallocs.iter().chain(&frees).map(Vec::len).sum();
    assert!(
        stored >= 4 * N * 9 / 10,
        "most of the {} calls stored, to have lapped the ring: {stored} ({dropped} records dropped)",
        4 * N
    );
    if dropped == 0 {
        assert_eq!(stored, 4 * N, "nothing dropped: every call stored");
    }
    let mut handed_out = std::collections::BTreeSet::new();
    for (op, m) in ["cudaMalloc", "cuMemAlloc_v2"].iter().zip(&mallocs) {
        for r in m {
            assert_eq!((r[0], r[2]), (4096, 0), "{op}: {r:?}");
            assert!(r[1] != 0, "{op} returned a pointer: {r:?}");
            handed_out.insert(r[1]);
        }
    }
    // The simulated allocator hands out the next 4 KiB each time (the two
    // layers the same pointer): as many pointers as calls, 4 KiB apart,
    // and every free names one of them.
    let first = *handed_out.first().expect("allocations stored");
    assert!(handed_out.len() <= N, "{} pointers", handed_out.len());
    for p in &handed_out {
        let off = p - first;
        assert!(
            off % 4096 == 0 && off < 4096 * N as i64,
            "{p:#x} from {first:#x}"
        );
    }
    for (op, f) in ["cudaFree", "cuMemFree_v2"].iter().zip(&frees) {
        for r in f {
            assert!(
                handed_out.contains(&r[1]),
                "{op} of a pointer never handed out: {r:?}"
            );
            assert_eq!(r[2], 0, "{op}: {r:?}");
        }
    }
}

#[test]
fn exit_churn_leaves_no_kernel_state() {
    let Some(sb) = Sandbox::for_ebpf("exit-churn") else {
        return;
    };
    const CHILDREN: i64 = 300;
    // Each child's launches are counted in the kernel (`--launches driver`,
    // the default): 3 launches each.
    sb.trace(
        &[],
        &format!("repeat {CHILDREN} {{ fork {{ malloc 512 x; free x; launch 3 }} }}"),
        0,
    );
    let db = sb.open_db();
    // Every child was traced (followed at fork, in the kernel) and seen to exit.
    assert_eq!(
        db.int("SELECT count(*) FROM proc_events WHERE kind = 'fork'"),
        CHILDREN
    );
    assert_eq!(
        db.int("SELECT count(*) FROM proc_events WHERE kind = 'exit'"),
        CHILDREN + 1
    );
    assert_eq!(
        db.int("SELECT count(DISTINCT pid) FROM calls WHERE op = 'cudaMalloc'"),
        CHILDREN
    );
    // And the kernel maps drained: nothing left per process or per thread.
    assert_eq!(
        db.int("SELECT value FROM stats WHERE name = 'map_traced_left'"),
        0
    );
    assert_eq!(
        db.int("SELECT value FROM stats WHERE name = 'map_threads_left'"),
        0
    );
    // Each child's counts were taken out of the kernel's count map when it
    // exited (a node agent's map filled after 16,384 processes), and kept:
    // every child's 3 launches are in the trace.
    assert_eq!(
        db.int("SELECT value FROM stats WHERE name = 'map_counts_left'"),
        0
    );
    let counted = db.ints(
        "SELECT count(DISTINCT pid), min(count), max(count) FROM op_counts WHERE op = 'cuLaunchKernel'",
    );
    assert_eq!(counted, vec![vec![CHILDREN, 3, 3]]);
    assert_eq!(
        db.int("SELECT sum(value) FROM stats WHERE name LIKE 'drop_%'"),
        0
    );
}

/// Kills the workloads a sandbox started (they outlive a killed tracer).
fn kill_workloads_of(sb: &Sandbox) {
    let marker = sb.truth_path().display().to_string();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let Ok(cmd) = std::fs::read(format!("/proc/{pid}/cmdline")) else {
            continue;
        };
        if String::from_utf8_lossy(&cmd).contains(&marker) {
            // SAFETY: sending SIGKILL to a process this test started.
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
    }
}

/// A traced workload that allocates and frees for a long while, in a fresh
/// sandbox (None without eBPF), returned once tracing has started and run
/// for 1.5 s: start-up (loading the probes) takes seconds on a loaded
/// machine, a signal before it would test nothing, and batches commit every
/// 100 ms, so by then some are on disk.
fn churn_traced(tag: &str) -> Option<(Sandbox, std::process::Child)> {
    let sb = Sandbox::for_ebpf(tag)?;
    let ready = sb.path("ready");
    let child = sb.spawn_trace(
        &["--ready-file", ready.to_str().unwrap()],
        "repeat 2000 { churn 5; sleep 5 }",
        None,
    );
    common::wait_for_file(&ready, 60);
    std::thread::sleep(std::time::Duration::from_millis(1500));
    Some((sb, child))
}

#[test]
fn a_sigkilled_trace_leaves_a_readable_database_with_what_was_committed() {
    let Some((sb, mut child)) = churn_traced("sigkill") else {
        return;
    };
    // SAFETY: SIGKILL to the gpusleuth process this test spawned.
    unsafe { libc::kill(child.id() as i32, libc::SIGKILL) };
    let _ = child.wait();
    kill_workloads_of(&sb);
    let db = sb.open_db();
    let check = db.text_ints("SELECT integrity_check, 0 FROM pragma_integrity_check");
    assert_eq!(check[0].0, "ok", "{check:?}");
    let calls = db.int("SELECT count(*) FROM calls");
    assert!(calls > 0, "committed batches must survive SIGKILL");
    // The read commands work on it as on any trace.
    common::run_ok(common::gpusleuth().args(["stats", "--db"]).arg(sb.db()));
}

/// The files of run `dir`, oldest first (`part-NNNNNN.db`).
fn parts(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let files = sleuth_store::run::run_files(dir).expect("a run's directory");
    files.into_iter().map(|(_, p)| p).collect()
}

/// Which files of run `dir` hold complete rollups, in order, as gpusleuth's
/// readers open them. (A plain read-only connection fails with "attempt to
/// write a readonly database" on a file whose tracer was killed inside
/// leaving WAL mode, where SQLite wrote a rollback journal for page 1:
/// readers open with `immutable=1` and read the main file, round 50.)
fn finished_files(dir: &std::path::Path) -> Vec<bool> {
    parts(dir)
        .iter()
        .map(|p| {
            sleuth_store::Trace::open(p)
                .unwrap_or_else(|e| panic!("{}: {e}", p.display()))
                .has_rollups()
                .unwrap()
        })
        .collect()
}

/// A `--rotate 300ms` run SIGKILLed after 2.5 s in a new sandbox, its
/// workload killed too: the sandbox, the tracer's pid and which of the
/// run's files (`sb.db()`) were complete. None where eBPF is unavailable.
fn killed_rotating_run(tag: &str) -> Option<(Sandbox, u32, Vec<bool>)> {
    let sb = Sandbox::for_ebpf(tag)?;
    let ready = sb.path("ready");
    let mut child = sb.spawn_trace(
        &["--rotate", "300ms", "--ready-file", ready.to_str().unwrap()],
        "repeat 2000 { churn 5; sleep 5 }",
        None,
    );
    common::wait_for_file(&ready, 60);
    std::thread::sleep(std::time::Duration::from_millis(2500));
    let tracer = child.id();
    // SAFETY: SIGKILL to the gpusleuth process this test spawned.
    unsafe { libc::kill(tracer as i32, libc::SIGKILL) };
    let _ = child.wait();
    kill_workloads_of(&sb);
    let before = finished_files(&sb.db());
    assert!(before.len() >= 3, "{before:?}");
    assert_eq!(
        before.last(),
        Some(&false),
        "the file being written when killed"
    );
    Some((sb, tracer, before))
}

#[test]
fn a_sigkilled_rotating_run_is_made_whole_again_by_finish() {
    let Some((sb, tracer, before)) = killed_rotating_run("sigkill-rotate") else {
        return;
    };
    let dir = sb.db();
    // The run's answers leave it out, and say how to finish it.
    let out = common::run_ok(common::gpusleuth().args(["stats", "--db"]).arg(&dir));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("not finished") && err.contains("gpusleuth finish"),
        "{err}"
    );

    let out = common::run_ok(common::gpusleuth().args(["finish", "--db"]).arg(&dir));
    let said = String::from_utf8_lossy(&out.stdout);
    let unfinished = before.iter().filter(|f| !**f).count();
    assert!(
        said.contains(&format!(
            "{unfinished} finished, {} already complete",
            before.len() - unfinished
        )),
        "{said}"
    );
    assert!(finished_files(&dir).iter().all(|f| *f));
    // Each file says whose threads were the tracer's (stored with its first
    // batch and every second since), so none of them is a culprit.
    for p in parts(&dir) {
        let pid = common::Db::open(&p).int("SELECT value FROM stats WHERE name = 'tracer_pid'");
        assert_eq!(pid, i64::from(tracer), "{}", p.display());
    }
    // The run answers over every file now: all the calls they hold.
    let out = common::run_ok(
        common::gpusleuth()
            .args(["stats", "--json", "--db"])
            .arg(&dir),
    );
    assert!(!String::from_utf8_lossy(&out.stderr).contains("not finished"));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let counted: u64 = v["ops"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|o| o["count"].as_u64().filter(|_| o["p50_ns"].is_u64()))
        .sum();
    let stored: i64 = parts(&dir)
        .iter()
        .map(|p| common::Db::open(p).int("SELECT count(*) FROM calls"))
        .sum();
    assert_eq!(counted as i64, stored);
    // Every answer over the run names the file `finish` completed and what
    // it lacks (round 53: only a single file's answers did).
    let killed = parts(&dir).last().unwrap().clone();
    let name = killed.file_name().unwrap().to_string_lossy().into_owned();
    for cmd in ["stats", "explain", "memory", "export"] {
        let out = common::run_ok(common::gpusleuth().args([cmd, "--db"]).arg(&dir));
        let err = String::from_utf8_lossy(&out.stderr);
        let said: Vec<&str> = err
            .lines()
            .filter(|l| l.contains("finished by `gpusleuth finish`"))
            .collect();
        assert_eq!(said.len(), unfinished, "{cmd}: {err}");
        assert!(said.iter().any(|l| l.contains(&name)), "{cmd}: {err}");
    }
}

#[test]
fn a_restarted_tracer_finishes_what_its_killed_predecessor_left() {
    // The service's and the pod's case: the next start, a run of its own
    // beside the killed one, completes the killed run's files while it
    // records (`--finish-killed`), and says so in its own trace.
    let Some((sb, _, before)) = killed_rotating_run("finish-killed") else {
        return;
    };
    let killed = sb.db();
    let next = sb.path("next-run");
    let mut cmd = common::gpusleuth();
    cmd.arg("trace")
        .arg("--db")
        .arg(&next)
        .args(["--rotate", "1s", "--finish-killed", "--quiet", "--"])
        .arg(&sb.sim.workload)
        .arg("repeat 300 { churn 5; sleep 5 }")
        .env("LD_LIBRARY_PATH", &sb.sim.lib_dir);
    let out = common::run_ok(&mut cmd);
    let unfinished = before.iter().filter(|f| !**f).count();
    assert!(unfinished >= 1);
    assert!(finished_files(&killed).iter().all(|f| *f), "{before:?}");
    // Its own run is whole and was never taken for an earlier one.
    assert!(finished_files(&next).iter().all(|f| *f));
    let notes: Vec<String> = parts(&next)
        .iter()
        .flat_map(|p| {
            common::Db::open(p).strings("SELECT text FROM notes WHERE text LIKE '--finish-killed%'")
        })
        .collect();
    let summary = format!(
        "{unfinished} finished, {} already complete, 0 in use (left as they are), 0 failed",
        before.len() - unfinished
    );
    assert!(
        notes.iter().any(|n| n.contains(&summary)),
        "{notes:?}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        notes.iter().filter(|n| n.contains(": finished (")).count(),
        unfinished,
        "{notes:?}"
    );
    // The killed run answers over every file, without the note that one is unfinished.
    let out = common::run_ok(common::gpusleuth().args(["stats", "--db"]).arg(&killed));
    assert!(!String::from_utf8_lossy(&out.stderr).contains("not finished"));
}

#[test]
fn two_interrupts_stop_the_trace_cleanly_and_keep_everything() {
    let Some((sb, mut child)) = churn_traced("sigint") else {
        return;
    };
    for _ in 0..2 {
        // SAFETY: SIGINT to the gpusleuth process this test spawned (as Ctrl-C would).
        unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    let status = common::wait_child(&mut child, 30);
    kill_workloads_of(&sb);
    assert_eq!(
        status.code(),
        Some(130),
        "stopped by Ctrl-C while the command ran"
    );
    // Finished properly: one self-contained file, counters and notes written.
    assert!(
        !sb.path("trace.db-wal").exists()
            || std::fs::metadata(sb.path("trace.db-wal")).unwrap().len() == 0
    );
    let db = sb.open_db();
    assert!(db.int("SELECT count(*) FROM calls") > 0);
    assert_eq!(
        db.int("SELECT count(*) FROM stats WHERE name = 'map_traced_left'"),
        1
    );
    assert_eq!(
        db.int("SELECT count(*) FROM notes WHERE text LIKE '%second interrupt%'"),
        1
    );
}

#[test]
fn trace_all_mode_follows_a_cuda_process_it_did_not_start() {
    let Some(sb) = Sandbox::for_ebpf("all-mode") else {
        return;
    };
    let ready = sb.path("ready");
    // `gpusleuth trace` with neither --pid nor a command: every process that calls CUDA.
    let mut tracer = std::process::Command::new(env!("CARGO_BIN_EXE_gpusleuth"))
        .arg("trace")
        .arg("--db")
        .arg(sb.db())
        .arg("--quiet")
        .args(["--duration", "4s", "--cuda-lib"])
        .arg(&sb.sim.libcudart)
        .arg("--cuda-lib")
        .arg(&sb.sim.libcuda)
        .arg("--ready-file")
        .arg(&ready)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("start tracer");
    common::wait_for_file(&ready, 30);
    // A workload started by someone else, after the tracer: 7 cudaMalloc, 3 cudaFree.
    let mut workload = std::process::Command::new(&sb.sim.workload)
        .arg("repeat 3 { malloc 4096 a; free a }; repeat 4 { malloc 4096 b }")
        .env("LD_LIBRARY_PATH", &sb.sim.lib_dir)
        .spawn()
        .expect("run workload");
    let pid = workload.id();
    assert!(workload.wait().unwrap().success());
    let st = common::wait_child(&mut tracer, 30);
    assert_eq!(st.code(), Some(0));
    let db = sb.open_db();
    // Other tests' workloads running now are CUDA processes too: look at ours.
    let count = |op: &str| {
        db.int(&format!(
            "SELECT count(*) FROM calls WHERE pid = {pid} AND op = '{op}'"
        ))
    };
    assert_eq!(count("cudaMalloc"), 7);
    assert_eq!(count("cudaFree"), 3);
    assert_eq!(
        db.int(&format!("SELECT count(*) FROM processes WHERE pid = {pid}")),
        1
    );
}

/// Found in round 50: one SIGTERM to the tracer alone (`kill PID`, a
/// container's or a service's stop) was ignored while it traced a launched
/// command, which it took for a Ctrl-C the command had received too: the
/// trace went on until the command ended by itself (or the SIGKILL after a
/// grace period left the file unfinished). It is passed on to the command,
/// whose exit ends the trace with the file complete.
#[test]
fn a_sigterm_to_the_tracer_alone_ends_the_command_and_the_trace() {
    let Some(sb) = Sandbox::for_ebpf("sigterm-alone") else {
        return;
    };
    let ready = sb.path("ready");
    let mut child = sb.spawn_trace(
        &["--ready-file", ready.to_str().unwrap()],
        "malloc 4096 a; sleep 60000",
        None,
    );
    common::wait_for_file(&ready, 60);
    // SAFETY: SIGTERM to the gpusleuth process this test spawned.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    // Ignored, it ran the command's 60 s; passed on, it ends at once.
    let status = common::wait_child(&mut child, 30);
    kill_workloads_of(&sb);
    assert_eq!(status.code(), Some(143), "the command's SIGTERM exit");
    let db = sb.open_db();
    assert_eq!(db.int("SELECT count(*) FROM meta WHERE key = 'rollups'"), 1);
    assert_eq!(
        db.int("SELECT count(*) FROM notes WHERE text LIKE '%SIGTERM passed on%'"),
        1
    );
}

/// Found in round 51: a SIGINT sent to the tracer alone (`kill -INT`)
/// while it traces a launched command waits for the command, which a
/// terminal's Ctrl-C reaches too: the wait was silent. Said once on
/// stderr (with how to stop now); the trace then ends with the command.
#[test]
fn a_sigint_to_the_tracer_alone_says_it_waits_for_the_command() {
    let Some(sb) = Sandbox::for_ebpf("sigint-alone") else {
        return;
    };
    let ready = sb.path("ready");
    let mut child = sb.spawn_trace(
        &["--ready-file", ready.to_str().unwrap()],
        "malloc 4096 a; sleep 1500; free a",
        None,
    );
    common::wait_for_file(&ready, 60);
    // SAFETY: SIGINT to the gpusleuth process this test spawned.
    unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
    let status = common::wait_child(&mut child, 30);
    kill_workloads_of(&sb);
    assert_eq!(status.code(), Some(0), "the command ran to its end");
    let err = std::fs::read_to_string(sb.path("trace.stderr")).unwrap();
    assert_eq!(
        err.matches("interrupt: the trace ends when the command")
            .count(),
        1,
        "{err}"
    );
    let db = sb.open_db();
    assert_eq!(
        db.int("SELECT count(*) FROM calls WHERE op = 'cudaFree'"),
        1
    );
}

/// Found in round 50: a stop in the first ~150 ms (the probes attaching)
/// killed the tracer outright, as the signals were caught only once it
/// traced: the file was left unfinished, and with `--rotate` every reader
/// of the run said "the first file is still being written" for good. Now
/// a stop then leaves no file (nothing started) or a complete one.
#[test]
fn a_stop_while_the_tracer_starts_leaves_no_file_or_a_complete_one() {
    let Some(sb) = Sandbox::for_ebpf("stop-at-start") else {
        return;
    };
    for (i, delay_ms) in [0u64, 20, 60, 120, 250].into_iter().enumerate() {
        let db = sb.path(&format!("start-{i}.db"));
        let mut fresh = common::gpusleuth();
        fresh
            .args(["trace", "--quiet", "--db"])
            .arg(&db)
            .arg("--")
            .arg(&sb.sim.workload)
            .arg("malloc 4096 a; sleep 300")
            .env("LD_LIBRARY_PATH", &sb.sim.lib_dir);
        let mut child = fresh
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("spawn gpusleuth trace");
        std::thread::sleep(std::time::Duration::from_millis(delay_ms));
        // SAFETY: SIGTERM to the gpusleuth process this test spawned.
        unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
        let status = common::wait_child(&mut child, 30);
        use std::os::unix::process::ExitStatusExt as _;
        if status.signal().is_some() {
            // Before main() caught signals (an instant after exec): nothing
            // was written yet.
            assert!(!db.exists(), "delay {delay_ms} ms: killed with a file");
        } else if db.exists() {
            let t = sleuth_store::Trace::open(&db).expect("a readable trace");
            assert!(
                t.has_rollups().unwrap(),
                "delay {delay_ms} ms: left unfinished"
            );
        } else {
            assert_eq!(status.code(), Some(130), "delay {delay_ms} ms");
        }
    }
    kill_workloads_of(&sb);
}

/// Found in round 50: `trace --force` over a file or a run a live tracer
/// was writing removed it, and the first tracer recorded into nothing
/// ("attempt to write a readonly database"). `--force` replaces a trace,
/// never a live one: not `trace`'s, nor `report`'s or `export`'s `-o`.
#[test]
fn force_never_replaces_a_live_tracers_files() {
    let Some(sb) = Sandbox::for_ebpf("force-live") else {
        return;
    };
    let ready = sb.path("ready");
    let mut first = sb.spawn_trace(
        &["--ready-file", ready.to_str().unwrap()],
        "malloc 4096 a; sleep 2500; free a",
        None,
    );
    common::wait_for_file(&ready, 60);
    let out = sb
        .trace_command(&["--force"], "malloc 7 z")
        .output()
        .unwrap();
    common::assert_no_panic(&out);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("is writing it: refusing to replace a live trace"),
        "{err}"
    );
    // Round 60's tester: `report`/`export -o LIVE --force` wrote over the
    // live trace (exit 0) and its tracer then failed to complete it.
    let example = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../examples/h200-contention.db"
    );
    let live = sb.db();
    for cmd in [
        vec!["report", "--db", example, "-o"],
        vec!["export", "--db", example, "--format", "json", "-o"],
    ] {
        let out = common::gpusleuth()
            .args(&cmd)
            .arg(&live)
            .arg("--force")
            .output()
            .unwrap();
        common::assert_no_panic(&out);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{cmd:?}: {err}");
        assert!(
            err.contains("is writing it: refusing to replace a live trace"),
            "{cmd:?}: {err}"
        );
    }
    let status = common::wait_child(&mut first, 60);
    kill_workloads_of(&sb);
    assert_eq!(status.code(), Some(0), "the first trace ends as it would");
    let db = sb.open_db();
    assert_eq!(db.int("SELECT count(*) FROM meta WHERE key = 'rollups'"), 1);
    assert_eq!(
        db.int("SELECT count(*) FROM calls WHERE op = 'cudaMalloc' AND size = 4096"),
        1
    );
}

/// Round 60's tester: `trace --db` of a path that is not UTF-8 panicked
/// (the command line read with `std::env::args`), and a command argument
/// that is not UTF-8 was refused: file names are bytes.
#[test]
fn paths_that_are_not_utf8_are_traced() {
    use std::os::unix::ffi::OsStrExt as _;
    let Some(sb) = Sandbox::for_ebpf("non-utf8") else {
        return;
    };
    let db = sb.dir.join(std::ffi::OsStr::from_bytes(b"nu\xff\xfe.db"));
    let truth = sb.dir.join(std::ffi::OsStr::from_bytes(b"tr\xffuth"));
    let out = common::gpusleuth()
        .arg("trace")
        .arg("--db")
        .arg(&db)
        .arg("--quiet")
        .arg("--")
        .arg(&sb.sim.workload)
        .arg("--truth")
        .arg(&truth)
        .arg("malloc 4096 a; free a")
        .env("LD_LIBRARY_PATH", &sb.sim.lib_dir)
        .output()
        .unwrap();
    common::assert_no_panic(&out);
    common::assert_success(&out);
    let truth = sleuth_sim::parse_truth(&std::fs::read_to_string(&truth).unwrap()).unwrap();
    assert_eq!(truth.len(), 1, "the workload got its own argument");
    let db = common::Db::open(&db);
    assert_eq!(
        db.int("SELECT count(*) FROM calls WHERE op = 'cudaMalloc' AND size = 4096"),
        1
    );
}

/// `trace --db EXISTING` without `--force` leaves the file as it is and
/// starts nothing; its one line says how to replace it (round 60's tester:
/// the path twice and no hint).
#[test]
fn an_existing_trace_is_kept_and_the_refusal_says_force() {
    let Some(sb) = Sandbox::for_ebpf("exists") else {
        return;
    };
    std::fs::write(sb.db(), b"mine").unwrap();
    let out = sb.trace_command(&[], "malloc 4096 a").output().unwrap();
    common::assert_no_panic(&out);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains(&format!("--db {}: already exists", sb.db().display()))
            && err.contains("--force replaces it"),
        "{err}"
    );
    assert_eq!(err.trim_end().lines().count(), 1, "{err}");
    assert_eq!(std::fs::read(sb.db()).unwrap(), b"mine");
    assert!(!sb.truth_path().exists(), "the command was not started");
}

/// A small file system mounted for one test, detached when dropped.
struct Tmpfs(std::path::PathBuf);

impl Tmpfs {
    fn mount(dir: std::path::PathBuf, size: &str) -> Tmpfs {
        use std::ffi::CString;
        use std::os::unix::ffi::OsStrExt as _;
        std::fs::create_dir_all(&dir).unwrap();
        let target = CString::new(dir.as_os_str().as_bytes()).unwrap();
        let data = CString::new(format!("size={size},mode=0700")).unwrap();
        // SAFETY: NUL-terminated strings that outlive the call.
        let rc = unsafe {
            libc::mount(
                c"tmpfs".as_ptr(),
                target.as_ptr(),
                c"tmpfs".as_ptr(),
                0,
                data.as_ptr().cast(),
            )
        };
        assert_eq!(rc, 0, "mount tmpfs: {}", std::io::Error::last_os_error());
        Tmpfs(dir)
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        use std::os::unix::ffi::OsStrExt as _;
        let target = std::ffi::CString::new(self.0.as_os_str().as_bytes()).unwrap();
        // SAFETY: a NUL-terminated path that outlives the call.
        unsafe { libc::umount2(target.as_ptr(), libc::MNT_DETACH) };
    }
}

/// Round 60's tester: a flood traced onto a file system that filled up
/// kept 8% of its calls, said "0 dropped", and was read as "its tracer was
/// killed" (the writer's first failed write ended it, the file left
/// without its rollups). The writer now stops storing calls and waits
/// where the disk runs low, counts them as dropped, says so, and
/// completes the file in space it set aside; the traced program is not
/// touched.
#[test]
fn a_disk_that_fills_up_leaves_a_complete_trace_that_counts_its_losses() {
    let Some(sb) = Sandbox::for_ebpf("disk-full") else {
        return;
    };
    let small = Tmpfs::mount(sb.path("small"), "16M");
    let db = small.0.join("t.db");
    let out = sb
        .trace_command_into(
            &db,
            &["--launches", "full"],
            "repeat 60000 { launch 1; sync_stream }",
        )
        .output()
        .unwrap();
    common::assert_no_panic(&out);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{err}");
    assert!(
        err.contains("(the disk ran low)")
            && err.contains("after the disk holding the trace ran low"),
        "{err}"
    );
    let truth = sb.truth();
    assert_eq!(
        truth[0].runtime["cudaLaunchKernel"], 60_000,
        "the program ran whole"
    );
    assert_complete_and_counts_its_losses(&db, "the disk holding the trace ran low");
    // The space set aside is gone with the writer.
    let left: Vec<_> = std::fs::read_dir(&small.0)
        .unwrap()
        .flatten()
        .map(|e| e.file_name())
        .collect();
    assert_eq!(left, vec![std::ffi::OsString::from("t.db")], "{left:?}");
}

/// The disk filled by another process while a trace records (between two
/// of the writer's commits, so its low-space check cannot see it coming):
/// the failed transaction is set back, the space set aside handed back,
/// and the rest is counted as dropped; the file is complete and says so.
#[test]
fn a_disk_another_process_fills_leaves_a_complete_trace() {
    let Some(sb) = Sandbox::for_ebpf("disk-filled") else {
        return;
    };
    let small = Tmpfs::mount(sb.path("small"), "24M");
    let db = small.0.join("t.db");
    let started = sb.path("started");
    let script = format!(
        "touch {}; repeat 60 {{ launch 200; sync_sleep 40 }}",
        started.display()
    );
    let tracer = sb
        .trace_command_into(&db, &["--launches", "full"], &script)
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    common::wait_for_file(&started, 60);
    std::thread::sleep(std::time::Duration::from_millis(300));
    // Everything the file system has left, taken.
    let mut fill = std::fs::File::create(small.0.join("fill")).unwrap();
    let chunk = vec![0u8; 64 << 10];
    while std::io::Write::write_all(&mut fill, &chunk).is_ok() {}
    let out = tracer.wait_with_output().unwrap();
    common::assert_no_panic(&out);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{err}");
    assert!(err.contains("(the disk ran low)"), "{err}");
    assert_eq!(
        sb.truth()[0].runtime["cudaLaunchKernel"],
        12_000,
        "the program ran whole"
    );
    drop(fill);
    // Ran low, or (most often) filled between two commits: either note.
    assert_complete_and_counts_its_losses(&db, "the disk holding the trace");
}

/// The trace at `db` was completed, holds one note beginning with `note`,
/// and every call and wait the writer received was stored or counted as
/// dropped (some were).
fn assert_complete_and_counts_its_losses(db: &std::path::Path, note: &str) {
    let t = sleuth_store::Trace::open(db).expect("a readable trace");
    assert!(t.has_rollups().unwrap(), "completed");
    drop(t);
    let d = common::Db::open(db);
    let stat = |name: &str| d.int(&format!("SELECT value FROM stats WHERE name = '{name}'"));
    let stored = d.int("SELECT count(*) FROM calls");
    let waits = d.int("SELECT count(*) FROM waits");
    assert!(stat("drop_db_full") > 0 && stored > 0, "{stored} stored");
    assert_eq!(
        stat("events_call") + stat("events_wait"),
        stored + waits + stat("drop_db_full")
    );
    assert_eq!(
        d.int(&format!(
            "SELECT count(*) FROM notes WHERE text LIKE '{note}%'"
        )),
        1
    );
}
