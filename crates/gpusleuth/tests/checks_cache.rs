//! The checks cache shared by command-line runs (`check_cache` in the
//! store): a run that read a settled trace leaves its entry in the cache
//! directory, a later run answers the same, a file changed in place since is
//! checked again and refused when damaged, and an empty
//! `GPUSLEUTH_CACHE_DIR` turns the cache off.

mod common;
#[path = "common/mcp_stdio.rs"]
mod mcp_stdio;

use common::run_ok;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

fn example() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/h200-contention.db")
}

/// A fresh directory with a copy of the example trace, left alone long
/// enough to be remembered (the store's two-second "settled" rule).
fn settled_copy(tag: &str) -> (PathBuf, PathBuf) {
    let dir = std::env::temp_dir().join(format!("gs-checks-cache-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("dir");
    let db = dir.join("t.db");
    std::fs::copy(example(), &db).expect("copy");
    std::thread::sleep(Duration::from_millis(2_100));
    (dir, db)
}

fn gpusleuth(cache: &Path) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_gpusleuth"));
    c.env("GPUSLEUTH_CACHE_DIR", cache);
    c
}

fn memory_json(cache: &Path, db: &Path) -> String {
    let out = run_ok(gpusleuth(cache).args(["memory", "--json", "--db"]).arg(db));
    String::from_utf8(out.stdout).expect("utf8")
}

#[test]
fn runs_share_the_checks_and_a_changed_file_is_checked_again() {
    let (dir, db) = settled_copy("share");
    let cache = dir.join("cache");
    let first = memory_json(&cache, &db);
    let saved =
        std::fs::read_to_string(cache.join("checks.json")).expect("the run saved its checks");
    assert!(saved.contains("\"whole\":true"), "{saved}");
    let mode = {
        use std::os::unix::fs::PermissionsExt;
        std::fs::metadata(cache.join("checks.json"))
            .expect("stat")
            .permissions()
            .mode()
    };
    assert_eq!(mode & 0o777, 0o600, "private to the user");
    // A second run (and another command) read the same answers.
    assert_eq!(memory_json(&cache, &db), first);
    run_ok(
        gpusleuth(&cache)
            .args(["query", "--db"])
            .arg(&db)
            .arg("SELECT count(*) FROM calls"),
    );

    // One byte of the calls table's root page, in place, same size.
    common::damage_in_place(&db);
    common::assert_refused_as_damaged(
        gpusleuth(&cache)
            .args(["memory", "--json", "--db"])
            .arg(&db),
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn an_empty_cache_dir_turns_the_cache_off() {
    let (dir, db) = settled_copy("off");
    run_ok(
        Command::new(env!("CARGO_BIN_EXE_gpusleuth"))
            .env("GPUSLEUTH_CACHE_DIR", "")
            .env("HOME", &dir)
            .env_remove("XDG_CACHE_HOME")
            .args(["memory", "--db"])
            .arg(&db),
    );
    let left: Vec<_> = std::fs::read_dir(&dir)
        .expect("dir")
        .map(|e| e.expect("entry").file_name())
        .collect();
    assert_eq!(
        left,
        vec![std::ffi::OsString::from("t.db")],
        "nothing written beside it or in HOME"
    );
    // Without the variable the cache lives under HOME.
    run_ok(
        Command::new(env!("CARGO_BIN_EXE_gpusleuth"))
            .env_remove("GPUSLEUTH_CACHE_DIR")
            .env("HOME", &dir)
            .env_remove("XDG_CACHE_HOME")
            .args(["memory", "--db"])
            .arg(&db),
    );
    assert!(dir.join(".cache/gpusleuth/checks.json").exists());
    let _ = std::fs::remove_dir_all(&dir);
}

/// The MCP server saves what a tool call checked into the same cache
/// after the call: a later command-line run (or server) starts from it.
/// (A file named in the call: the one given with `--db` is checked ahead.)
#[test]
fn the_mcp_server_saves_its_checks_for_later_runs() {
    // The servers of this file's tests share one cache: one at a time (two
    // saving at once may lose one's news, by design).
    let _one = common::serial();
    let (dir, db) = settled_copy("mcp");
    let mut server = mcp_stdio::McpStdio::start(
        &["--trace-dir".as_ref(), dir.as_os_str()],
        Duration::from_secs(60),
    );
    let cache = mcp_stdio::bin::test_cache_dir();
    assert!(
        common::checks_entry_of(&cache, &db).is_none(),
        "nothing checked before the call"
    );
    let r = server.call(
        "tools/call",
        serde_json::json!({"name": "sql", "arguments": {"db": db.display().to_string(), "query": "SELECT count(*) FROM calls"}}),
    );
    assert_ne!(r["result"]["isError"], true, "{r}");
    let entry = common::checks_entry_of(&cache, &db).expect("saved after the call");
    assert_eq!(entry["passed"]["whole"], true, "{entry}");
    drop(server);
    let _ = std::fs::remove_dir_all(&dir);
}

/// The trace the server is started on is checked ahead, before any
/// question: the cache holds every check of it (the call-row pass and the
/// skipped-row counts too) without a tool call.
#[test]
fn the_mcp_server_checks_its_trace_before_the_first_question() {
    let _one = common::serial();
    let (dir, db) = settled_copy("ahead");
    let server =
        mcp_stdio::McpStdio::start(&["--db".as_ref(), db.as_os_str()], Duration::from_secs(60));
    let cache = mcp_stdio::bin::test_cache_dir();
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    let entry = loop {
        match common::checks_entry_of(&cache, &db) {
            Some(e) => break e,
            None if std::time::Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(100))
            }
            None => panic!("the server did not check its trace ahead"),
        }
    };
    let passed = &entry["passed"];
    assert_eq!(passed["whole"], true, "{entry}");
    assert!(
        passed["call_scan"].is_object() && passed["problems"].is_object(),
        "{entry}"
    );
    drop(server);
    let _ = std::fs::remove_dir_all(&dir);
}
