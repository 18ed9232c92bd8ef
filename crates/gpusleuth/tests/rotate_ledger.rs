//! The run's memory ledger the tracer carries across the files of a
//! `trace --rotate` run (real eBPF, simulated CUDA; `sleuth_store::run_ledger`):
//! `explain --db DIR` answers from the last file's carried ledger without
//! reading a memory call, and gives what the replay of every file's memory
//! calls gives (the same files with the carried ledger removed, as files of
//! an older gpusleuth); after `--keep` pruned files, the carried ledger
//! still holds what they allocated and never freed, with its site named.

mod common;

use common::Sandbox;
use rusqlite::Connection;
use sleuth_store::run_explain::{load, RunLean};
use sleuth_store::{ReadBudget, DEFAULT_READ_TIMEOUT};
use std::path::{Path, PathBuf};

fn budget() -> ReadBudget {
    ReadBudget::new(DEFAULT_READ_TIMEOUT)
}

/// The run's files, oldest first.
fn parts(dir: &Path) -> Vec<PathBuf> {
    sleuth_store::run::run_files(dir)
        .expect("run directory")
        .into_iter()
        .map(|(_, p)| p)
        .collect()
}

/// A copy of the run `dir` without the carried ledger (meta keys and
/// table removed): what `explain --db DIR` answered before the tracer
/// carried one, the replay of every file's memory calls.
fn replay_copy(dir: &Path, to: &Path) -> PathBuf {
    std::fs::create_dir_all(to).expect("copy dir");
    for f in parts(dir) {
        let dst = to.join(f.file_name().expect("name"));
        std::fs::copy(&f, &dst).expect("copy");
        Connection::open(&dst)
            .expect("open copy")
            .execute_batch("DELETE FROM meta WHERE key LIKE 'run%'; DROP TABLE run_ledger")
            .expect("strip the carried ledger");
    }
    to.to_path_buf()
}

/// `explain --json --db DIR`'s stdout, which must succeed.
fn explain_json(dir: &Path) -> String {
    let out = common::run_ok(
        common::gpusleuth()
            .args(["explain", "--json", "--db"])
            .arg(dir),
    );
    String::from_utf8(out.stdout).expect("UTF-8")
}

/// `memory --json --db DIR`: the process that allocated, which must be there.
fn memory_of_run(dir: &Path, args: &[&str]) -> serde_json::Value {
    let out = common::run_ok(
        common::gpusleuth()
            .args(["memory", "--json", "--db"])
            .arg(dir)
            .args(args),
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    v["processes"]
        .as_array()
        .expect("processes")
        .iter()
        .find(|p| p["allocs"].as_u64().unwrap_or(0) > 0)
        .unwrap_or_else(|| panic!("no process allocated: {v}"))
        .clone()
}

/// `memory --by-site --json --db DIR`, which must succeed.
fn sites_of_run(dir: &Path) -> serde_json::Value {
    let out = common::run_ok(
        common::gpusleuth()
            .args(["memory", "--by-site", "--json", "--db"])
            .arg(dir),
    );
    serde_json::from_slice(&out.stdout).expect("JSON")
}

/// [`SCRIPT`]'s allocations by site over its run, by its own account
/// (every call from one native function: its sites add up to the script):
/// 26 made (w 3 MiB, a 2 MiB, 12 leaks of 64 KiB, 12 `s` of 1 MiB), 13
/// unfreed (w and the leaks), one failure of 1e15 bytes; at the peak
/// `peak` bytes (a replay at a moment knows them), or none known over a
/// run's stored tables (None).
fn assert_script_sites(v: &serde_json::Value, peak: Option<u64>) {
    let sites = v["sites"].as_array().expect("sites");
    let sum = |k: &str| -> u64 { sites.iter().map(|s| s[k].as_u64().expect(k)).sum() };
    assert_eq!(sum("allocs"), 26, "{v}");
    assert_eq!(
        sum("alloc_bytes"),
        3_145_728 + 2_097_152 + 12 * (65_536 + 1_048_576),
        "{v}"
    );
    assert_eq!(
        (sum("unfreed"), sum("unfreed_bytes")),
        (13, 3_145_728 + 12 * 65_536),
        "{v}"
    );
    assert_eq!(
        (sum("failed"), sum("failed_bytes")),
        (1, 1_000_000_000_000_000),
        "{v}"
    );
    assert_eq!(sum("at_peak_bytes"), peak.unwrap_or(0), "{v}");
    assert_eq!(v["at_peak_known"], peak.is_some(), "{v}");
    assert!(v["files"].as_array().is_some_and(|f| f.len() >= 3), "{v}");
}

/// What [`SCRIPT`] leaves, by its own account: `w` and the twelve 64 KiB
/// leaks live (3 MiB + 768 KiB), 26 allocations (w, a, 12 leaks, 12 `s`),
/// 13 frees (`a`, 12 `s`), the 1e15 one failed.
fn assert_script_ledger(l: &serde_json::Value, at: &str) {
    assert_eq!(l["live_bytes"], 3_145_728 + 12 * 65_536, "{at}: {l}");
    assert_eq!(l["allocs"], 26, "{at}: {l}");
    assert_eq!(l["frees"], 13, "{at}: {l}");
    assert_eq!(l["unmatched_frees"], 0, "{at}: {l}");
    assert_eq!(l["unfreed"].as_array().map(Vec::len), Some(13), "{at}: {l}");
    assert_eq!(
        l["failed_allocs"].as_array().map(Vec::len),
        Some(1),
        "{at}: {l}"
    );
}

fn ledger_of(r: &RunLean) -> &sleuth_core::ledger::ProcessLedger {
    r.ledgers
        .iter()
        .find(|l| l.allocs > 0)
        .unwrap_or_else(|| panic!("no process allocated: {:?}", r.ledgers))
}

/// The size of `a` in [`SCRIPT`], which no other allocation has.
const A_BYTES: u64 = 2_097_152;

/// `a` is made in an early file and freed ~1 s later (a later file of a
/// 300 ms period); `w` is never freed; a leak every step, a cache emptied
/// and refilled, a failed allocation: findings to compare.
const SCRIPT: &str = "malloc 3145728 w; malloc 2097152 a; \
     repeat 12 { malloc 65536; malloc 1048576 s; free s; sync_sleep 80 }; \
     free a; malloc 1e15; sync_sleep 300";

/// `memory --at` of the run's directory (counted from the oldest file's
/// start): between `a`'s allocation and its free (in a later file) `a`
/// is live, up to the free; at the run's end the ledger replayed from every file equals
/// the one the tracer carried (`end`, `memory --db DIR`); past the end, a
/// one-line error.
fn memory_at_moments_of_the_run(dir: &Path, files: &[PathBuf], end: &serde_json::Value) {
    let rows = |f: &Path, sql: &str| common::Db::open(f).ints(sql);
    let start = rows(&files[0], "SELECT start_mono_ns FROM session")[0][0];
    let run_end = rows(files.last().unwrap(), "SELECT end_mono_ns FROM session")[0][0];
    // `a`'s allocation and its free, each in the file that holds it.
    let a_sql = format!(
        "SELECT ts_ns + dur_ns, ptr FROM calls WHERE op = 'cudaMalloc' AND size = {A_BYTES}"
    );
    let (made, ptr) = files
        .iter()
        .find_map(|f| rows(f, &a_sql).first().map(|r| (r[0], r[1])))
        .expect("a made");
    let free_sql = format!("SELECT ts_ns FROM calls WHERE op = 'cudaFree' AND ptr = {ptr}");
    let freed = files
        .iter()
        .find_map(|f| rows(f, &free_sql).first().map(|r| r[0]))
        .expect("a freed");
    assert!(made < freed);
    let at = |offset: i64| memory_of_run(dir, &["--at", &format!("{offset}ns")]);
    let unfreed = |v: serde_json::Value| -> Vec<u64> {
        let us = v["unfreed"].as_array().unwrap().iter();
        us.map(|u| u["bytes"].as_u64().unwrap()).collect()
    };
    // Midway, and just before the free (in the file that holds it, read
    // with the calls after the moment left out).
    for moment in [(made + freed) / 2, freed - 1] {
        let live = unfreed(at(moment - start));
        assert!(live.contains(&A_BYTES), "a live at {moment}: {live:?}");
    }
    let at_end = at(run_end - start);
    for k in [
        "live_bytes",
        "peak_bytes",
        "allocs",
        "frees",
        "unfreed",
        "failed_allocs",
    ] {
        assert_eq!(at_end[k], end[k], "{k} at the run's end");
    }
    // Its sites then: the script's own account, with what was live per
    // site at the peak adding up to the peak.
    let sites_at = common::run_ok(
        common::gpusleuth()
            .args(["memory", "--by-site", "--json", "--db"])
            .arg(dir)
            .args(["--at", &format!("{}ns", run_end - start)]),
    );
    let sites_at: serde_json::Value = serde_json::from_slice(&sites_at.stdout).expect("JSON");
    assert_script_sites(&sites_at, end["peak_bytes"].as_u64());
    let o = common::gpusleuth()
        .args(["memory", "--at", "1h", "--db"])
        .arg(dir)
        .output()
        .expect("run");
    common::assert_no_panic(&o);
    assert_ne!(o.status.code(), Some(0), "--at 1h");
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(err.contains("outside the run's finished files"), "{err}");
}

#[test]
fn the_carried_ledger_answers_explain_as_the_replay_did() {
    let Some(sb) = Sandbox::for_ebpf("rotl-equal") else {
        return;
    };
    sb.trace(&["--rotate", "300ms"], SCRIPT, 0);
    let files = parts(&sb.db());
    assert!(files.len() >= 3, "{files:?}");
    // `a` is unfreed in the file that made it, alone: its free is in a
    // later file, so the run's ledger spans files. (That file is found by
    // `a`'s own call: a rotation may fall between `w`'s malloc and `a`'s,
    // which once made the first file that allocated hold `w` alone.)
    let alone = |f: &Path| {
        let t = sleuth_store::Trace::open(f).expect("open a file");
        let lean = sleuth_store::lean::load(&t, None, budget()).expect("lean load");
        lean.expect("a finished file").ledgers
    };
    let a_sql = format!("SELECT count(*) FROM calls WHERE op = 'cudaMalloc' AND size = {A_BYTES}");
    let makes_a = |f: &Path| common::Db::open(f).ints(&a_sql)[0][0] > 0;
    let (made_in, ledgers) = files
        .iter()
        .enumerate()
        .find(|(_, f)| makes_a(f))
        .map(|(i, f)| (i, alone(f)))
        .expect("a file that made `a`");
    assert!(made_in + 1 < files.len(), "{files:?}");
    assert!(
        ledgers
            .iter()
            .any(|l| l.unfreed.iter().any(|u| u.bytes == A_BYTES)),
        "{ledgers:?}"
    );

    let carried = load(&sb.db(), None, budget()).expect("explain the run");
    assert_eq!(
        carried.replayed_memory_calls,
        0,
        "the carried ledger answered: {:?}",
        carried.explanation().unwrap().notes
    );
    let old = replay_copy(&sb.db(), &sb.path("replayed"));
    let replayed = load(&old, None, budget()).expect("explain the copy");
    assert!(replayed.replayed_memory_calls > 0);
    assert_eq!(carried.ledgers, replayed.ledgers);
    let l = ledger_of(&carried);
    assert_eq!(l.unmatched_frees, 0, "{l:?}");
    let unfreed: Vec<u64> = l.unfreed.iter().map(|u| u.bytes).collect();
    assert!(unfreed.contains(&3_145_728), "{unfreed:?}");
    assert!(!unfreed.contains(&A_BYTES), "`a` was freed: {unfreed:?}");
    assert_eq!(l.failed_allocs.len(), 1, "{l:?}");

    // The command's whole answer, byte for byte, as before.
    assert_eq!(explain_json(&sb.db()), explain_json(&old));
    // `memory --db DIR`: the run's ledger, what the script left; the same
    // from the replay.
    let m = memory_of_run(&sb.db(), &[]);
    assert_script_ledger(&m, "memory of the run");
    assert_eq!(m, memory_of_run(&old, &[]), "carried and replayed");
    // `--by-site`: the script's allocations added up over the files, what
    // it left unfreed (from the run's ledger), its one failure.
    let sites = sites_of_run(&sb.db());
    assert_script_sites(&sites, None);
    assert_eq!(sites, sites_of_run(&old), "carried and replayed");
    memory_at_moments_of_the_run(&sb.db(), &files, &m);
    let text = common::run_ok(common::gpusleuth().args(["memory", "--db"]).arg(sb.db()));
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(text.starts_with("Run in "), "{text}");
    assert!(text.contains("device live"), "{text}");
    // With --pid: the same rule.
    let pid = l.pid;
    let one = load(&sb.db(), Some(pid), budget()).expect("explain --pid");
    assert_eq!(one.replayed_memory_calls, 0);
    assert_eq!(
        one.ledgers,
        load(&old, Some(pid), budget()).unwrap().ledgers
    );
}

#[test]
fn after_keep_the_carried_ledger_still_holds_what_deleted_files_allocated() {
    let Some(sb) = Sandbox::for_ebpf("rotl-keep") else {
        return;
    };
    sb.trace(&["--rotate", "300ms", "--keep", "2"], SCRIPT, 0);
    let kept = sleuth_store::run::run_files(&sb.db()).expect("run");
    assert_eq!(kept.len(), 2, "{kept:?}");
    assert!(kept[0].0 > 2, "files were pruned: {kept:?}");

    let r = load(&sb.db(), None, budget()).expect("explain the run");
    assert_eq!(r.replayed_memory_calls, 0);
    let l = ledger_of(&r);
    // `w`, made in a deleted file and never freed, is still live, its site
    // named (the tracer copied its stack forward); `a`'s free matched.
    let w = l
        .unfreed
        .iter()
        .find(|u| u.bytes == 3_145_728)
        .unwrap_or_else(|| panic!("w unfreed: {:?}", l.unfreed));
    let site = w.site.as_deref().expect("a site");
    assert!(
        site != sleuth_core::sites::LOST && site != sleuth_core::sites::NOT_CAPTURED,
        "{site}"
    );
    assert_eq!(l.unmatched_frees, 0, "{l:?}");
    // `memory --db DIR` gives the whole run's ledger, deleted files
    // included, and says so.
    let m = memory_of_run(&sb.db(), &[]);
    assert_script_ledger(&m, "memory after --keep");
    let out = common::run_ok(
        common::gpusleuth()
            .args(["memory", "--json", "--db"])
            .arg(sb.db()),
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert!(
        v["notes"]
            .to_string()
            .contains("no longer in the directory"),
        "{v}"
    );
    assert_eq!(v["files"].as_array().map(Vec::len), Some(kept.len()), "{v}");
    let notes = r.explanation().unwrap().notes;
    assert!(
        notes
            .iter()
            .any(|n| n.contains("no longer in the directory")),
        "{notes:?}"
    );
    // At a moment too (`memory --at`, from the state the oldest kept file
    // stored when it began): `w` is live then, and a note says the answer
    // covers the deleted files.
    let out = common::run_ok(
        common::gpusleuth()
            .args(["memory", "--json", "--at", "0", "--db"])
            .arg(sb.db()),
    );
    let at: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    let unfreed_at = |v: &serde_json::Value| -> Vec<u64> {
        v["processes"]
            .as_array()
            .into_iter()
            .flatten()
            .flat_map(|p| p["unfreed"].as_array().cloned().unwrap_or_default())
            .filter_map(|u| u["bytes"].as_u64())
            .collect()
    };
    assert!(
        unfreed_at(&at).contains(&3_145_728),
        "w live at the kept files' start: {at}"
    );
    assert!(
        at["notes"].to_string().contains("also covers the"),
        "{}",
        at["notes"]
    );
    // In text, `w` was made before the oldest kept file began: a negative
    // offset, not "+0ns" (round 60's tester).
    let out = common::run_ok(
        common::gpusleuth()
            .args(["memory", "--at", "0", "--db"])
            .arg(sb.db()),
    );
    let text = String::from_utf8_lossy(&out.stdout);
    let w_line = text
        .lines()
        .find(|l| l.contains("3.0 MiB") && l.contains("cudaMalloc"))
        .unwrap_or_else(|| panic!("w's line: {text}"));
    assert!(
        w_line.contains(" -") && !w_line.contains("+0ns"),
        "{w_line}"
    );
    // The replay of the kept files alone cannot know `w`.
    let old = replay_copy(&sb.db(), &sb.path("replayed"));
    let out = common::run_ok(
        common::gpusleuth()
            .args(["memory", "--json", "--at", "0", "--db"])
            .arg(&old),
    );
    let at_old: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert!(
        !unfreed_at(&at_old).contains(&3_145_728),
        "the replay knows nothing of w: {at_old}"
    );
    let replayed = load(&old, None, budget()).expect("explain the copy");
    assert!(
        !ledger_of(&replayed)
            .unfreed
            .iter()
            .any(|u| u.bytes == 3_145_728),
        "{:?}",
        replayed.ledgers
    );
}

/// A long-lived parent holding `w` from its first file and twelve
/// short-lived children (`spawn`: fork and exec), each leaving 64 KiB
/// behind and exiting, across a 300 ms rotation.
const CHURN: &str = "malloc 3145728 w; \
     repeat 12 { spawn { malloc 65536; launch; sync_device }; sync_sleep 70 }; \
     sync_sleep 300";

/// The processes of `memory --json [args] --db DIR`, by pid.
fn processes_of_run(dir: &Path, args: &[&str]) -> Vec<serde_json::Value> {
    let out = common::run_ok(
        common::gpusleuth()
            .args(["memory", "--json", "--db"])
            .arg(dir)
            .args(args),
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    let mut ps = v["processes"].as_array().expect("processes").clone();
    ps.sort_by_key(|p| p["pid"].as_u64());
    ps
}

/// Processes that exit are retired from the carried ledger at the file
/// they exited in (round 47), with real capture: the chain stays whole
/// from file 1, the last file began with only the parent, and every
/// reader's answer (`explain --db DIR`, `memory` at the end and at a
/// moment in each file, a child's and the parent's alone) equals the
/// replay of every file's memory calls.
#[test]
fn exited_children_are_retired_and_read_where_they_exited() {
    let Some(sb) = Sandbox::for_ebpf("rotl-exits") else {
        return;
    };
    sb.trace(&["--rotate", "300ms"], CHURN, 0);
    let files = parts(&sb.db());
    assert!(files.len() >= 3, "{files:?}");
    let meta = |f: &Path, k: &str| -> String {
        let c = Connection::open(f).expect("open");
        let v = c.query_row("SELECT value FROM meta WHERE key = ?1", [k], |r| {
            r.get::<_, String>(0)
        });
        v.unwrap_or_default()
    };
    let rows_of = |f: &Path, sql: &str| common::Db::open(f).ints(sql);
    let last = files.last().unwrap();
    assert_eq!(meta(last, "run_ledger_from"), "1");
    // The children and, in the last file, the parent itself.
    assert_eq!(meta(last, "run_ledger_retired"), "13", "{last:?}");
    let begun_with = rows_of(last, "SELECT pid FROM run_ledger_begin");
    assert_eq!(begun_with.len(), 1, "{begun_with:?}");
    let carried = load(&sb.db(), None, budget()).expect("explain the run");
    assert_eq!(carried.replayed_memory_calls, 0);
    assert_eq!(carried.ledgers.len(), 13, "{:?}", carried.ledgers);
    let old = replay_copy(&sb.db(), &sb.path("replayed"));
    let replayed = load(&old, None, budget()).expect("explain the copy");
    assert!(replayed.replayed_memory_calls >= 13);
    assert_eq!(carried.ledgers, replayed.ledgers);
    assert_eq!(explain_json(&sb.db()), explain_json(&old));
    let end = processes_of_run(&sb.db(), &[]);
    assert_eq!(end, processes_of_run(&old, &[]));
    let leaks = |ps: &[serde_json::Value]| -> u64 {
        ps.iter().map(|p| p["live_bytes"].as_u64().unwrap()).sum()
    };
    assert_eq!(leaks(&end), 3_145_728 + 12 * 65_536);
    assert_eq!(sites_of_run(&sb.db()), sites_of_run(&old), "by site");
    // At a moment in each file (from the oldest file's start), and of one
    // child that exited early.
    let rows = rows_of;
    let start = rows(&files[0], "SELECT start_mono_ns FROM session")[0][0];
    for f in &files {
        let end = rows(f, "SELECT end_mono_ns FROM session")[0][0];
        let at = format!("{}ns", end - start - 1);
        let carried = processes_of_run(&sb.db(), &["--at", &at]);
        assert_eq!(carried, processes_of_run(&old, &["--at", &at]), "at {at}");
        let by_site = |dir: &Path| {
            let out = common::run_ok(
                common::gpusleuth()
                    .args(["memory", "--by-site", "--json", "--at", &at, "--db"])
                    .arg(dir),
            );
            let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
            v["sites"].clone()
        };
        assert_eq!(by_site(&sb.db()), by_site(&old), "by site at {at}");
    }
    // One child at the end (read from the file it exited in), and the
    // parent at a moment in each file (`--pid`).
    let child = carried.ledgers.iter().find(|l| l.live_bytes == 65_536);
    let child = child.expect("a child").pid;
    let one = load(&sb.db(), Some(child), budget()).expect("explain --pid");
    assert_eq!(one.replayed_memory_calls, 0);
    assert_eq!(
        one.ledgers,
        load(&old, Some(child), budget()).unwrap().ledgers
    );
    let parent = carried.ledgers.iter().find(|l| l.live_bytes == 3_145_728);
    let parent = parent.expect("the parent").pid.to_string();
    for f in &files {
        let end = rows(f, "SELECT end_mono_ns FROM session")[0][0];
        let at = format!("{}ns", end - start - 1);
        let args = ["--pid", parent.as_str(), "--at", at.as_str()];
        let carried = processes_of_run(&sb.db(), &args);
        assert_eq!(carried, processes_of_run(&old, &args), "at {at}");
    }
}
