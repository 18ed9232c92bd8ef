//! Round 51's exploratory tester: what a command is given to read is never
//! written by it, however the output reaches it (a stdout the shell opened
//! on the trace).

mod common;
#[path = "../../sleuth-store/tests/common/ingero.rs"]
mod ingero;

use common::{assert_no_panic, gpusleuth, require_ebpf, Sandbox};
use std::fs::{File, OpenOptions};
use std::path::{Path, PathBuf};

const EXAMPLES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../examples");

/// A private copy of an example trace (tests never write into examples/).
fn example(sb: &Sandbox, name: &str, dst: &str) -> PathBuf {
    let dst = sb.path(dst);
    std::fs::copy(Path::new(EXAMPLES).join(name), &dst).expect("copy example trace");
    dst
}

fn s(p: &Path) -> &str {
    p.to_str().expect("utf-8 path")
}

/// `path` opened as the shell opens `>> path` and `1<> path`.
fn as_stdout(path: &Path) -> [File; 2] {
    [
        OpenOptions::new().append(true).open(path).unwrap(),
        OpenOptions::new()
            .read(true)
            .write(true)
            .open(path)
            .unwrap(),
    ]
}

/// Before round 51 `export --db t.db >> t.db` appended the export to the
/// trace and `stats --db t.db 1<> t.db` wrote over its header (no longer a
/// database), both exit 0: `-o` refused its input, stdout was never looked at.
#[test]
fn a_stdout_that_is_an_input_is_refused_before_anything_is_written() {
    let sb = Sandbox::new("stdout-input");
    let db = example(&sb, "demo-sim.db", "t.db");
    let other = example(&sb, "h200-contention.db", "other.db");
    let alias = sb.path("alias.db");
    std::os::unix::fs::symlink(&db, &alias).unwrap();
    let src = sb.path("ingero.db");
    ingero::write_ingero(&src, &ingero::dataloader_rows());
    let run = sb.path("run");
    std::fs::create_dir(&run).unwrap();
    let part = example(&sb, "demo-sim.db", "run/part-000001.db");
    let (merged, imported, report) = (
        sb.path("merged.db"),
        sb.path("imported.db"),
        sb.path("r.html"),
    );
    // The command, and the input its stdout is opened on, named as given.
    let cases: Vec<(Vec<&str>, &Path)> = vec![
        (vec!["export", "--db", s(&db), "--format", "json"], &db),
        (vec!["export", "--db", s(&alias)], &alias),
        (vec!["export", "--db", s(&db), "--format", "pftrace"], &db),
        (vec!["stats", "--db", s(&db)], &db),
        (vec!["explain", "--db", s(&db), "--json"], &db),
        (vec!["memory", "--db", s(&db)], &db),
        (vec!["query", "--db", s(&db), "SELECT * FROM calls"], &db),
        (vec!["report", "--db", s(&db), "-o", s(&report)], &db),
        (vec!["merge", s(&other), s(&db), "-o", s(&merged)], &db),
        (
            vec!["import", "--from", "ingero", s(&src), "--db", s(&imported)],
            &src,
        ),
        (vec!["finish", "--db", s(&db)], &db),
        // A run's directory: every file of the run is an input.
        (vec!["export", "--db", s(&run), "--format", "json"], &part),
        (vec!["stats", "--db", s(&run)], &part),
    ];
    for (cmd, input) in &cases {
        let before = std::fs::read(input).unwrap();
        for stdout in as_stdout(input) {
            let out = gpusleuth()
                .args(cmd)
                .stdout(stdout)
                .output()
                .expect("run gpusleuth");
            assert_no_panic(&out);
            let err = String::from_utf8_lossy(&out.stderr);
            assert_eq!(out.status.code(), Some(1), "{cmd:?}: {err}");
            assert!(
                err.contains("is also this command's stdout") && err.contains(s(input)),
                "{cmd:?}: {err}"
            );
            assert_eq!(err.trim_end().lines().count(), 1, "{cmd:?}: {err}");
            assert!(
                std::fs::read(input).unwrap() == before,
                "{cmd:?} changed {input:?}"
            );
        }
    }
    for made in [&merged, &imported, &report] {
        assert!(!made.exists(), "{made:?} written");
    }
    // Another file, even in the run's directory, is written as before.
    let json = run.join("calls.json");
    let out = gpusleuth()
        .args(["export", "--db", s(&run), "--format", "json"])
        .stdout(File::create(&json).unwrap())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let doc: serde_json::Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    assert!(!doc.as_array().unwrap().is_empty());
}

/// `stats --db t.db 2>> t.db` appended its notes and errors to the trace
/// (round 51's tester): refused before anything is read or written, the
/// one line said on stdout (stderr is the trace), the trace unchanged.
#[test]
fn a_stderr_that_is_an_input_is_refused_and_nothing_reaches_it() {
    let sb = Sandbox::new("stderr-input");
    let db = example(&sb, "demo-sim.db", "t.db");
    let before = std::fs::read(&db).unwrap();
    for cmd in [
        vec!["stats", "--db", s(&db)],
        vec!["explain", "--db", s(&db)],
        vec!["export", "--db", s(&db), "--format", "json"],
        vec!["query", "--db", s(&db), "SELECT nonsense"],
    ] {
        for stderr in as_stdout(&db) {
            let out = gpusleuth()
                .args(&cmd)
                .stderr(stderr)
                .output()
                .expect("run gpusleuth");
            let said = String::from_utf8_lossy(&out.stdout);
            assert_eq!(out.status.code(), Some(1), "{cmd:?}: {said}");
            assert!(
                said.starts_with("gpusleuth: error: ")
                    && said.contains("is also this command's stderr")
                    && said.contains(s(&db)),
                "{cmd:?}: {said}"
            );
            assert_eq!(said.trim_end().lines().count(), 1, "{cmd:?}: {said}");
            assert!(
                std::fs::read(&db).unwrap() == before,
                "{cmd:?} changed the trace"
            );
        }
    }
    // Both stdout and stderr the trace: nothing said anywhere, exit 1.
    let [a, b] = as_stdout(&db);
    let out = gpusleuth()
        .args(["stats", "--db", s(&db)])
        .stdout(a)
        .stderr(b)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(std::fs::read(&db).unwrap() == before, "the trace changed");
}

/// `demo --keep DIR` refused, nothing written, and the error's one line.
fn keep_refused(args: &[&str], named: &Path) {
    let out = gpusleuth().arg("demo").args(args).output().unwrap();
    assert_no_panic(&out);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{args:?}: {err}");
    assert!(
        err.contains(&format!("{}: already exists", named.display()))
            && err.contains("name an empty or new folder"),
        "{args:?}: {err}"
    );
    assert_eq!(err.trim_end().lines().count(), 1, "{err}");
}

/// Before round 51 `demo --keep DIR` wrote the bundled trace through a link
/// planted at its name (as root, over any file) and removed a `demo.db`
/// already there to trace over it.
#[test]
fn demo_keep_writes_only_new_files() {
    let sb = Sandbox::new("demo-keep");
    let victim = sb.path("victim.txt");
    std::fs::write(&victim, b"not the demo's").unwrap();
    let planted = sb.path("planted");
    std::fs::create_dir(&planted).unwrap();
    let link = planted.join("h200-contention.db");
    std::os::unix::fs::symlink(&victim, &link).unwrap();
    keep_refused(&["--offline", "--keep", s(&planted)], &link);
    assert_eq!(std::fs::read(&victim).unwrap(), b"not the demo's");
    assert!(link.symlink_metadata().unwrap().file_type().is_symlink());
    // A dangling link is something there too.
    let dangling = sb.path("dangling");
    std::fs::create_dir(&dangling).unwrap();
    let missing = sb.path("missing.db");
    std::os::unix::fs::symlink(&missing, dangling.join("h200-contention.db")).unwrap();
    keep_refused(
        &["--offline", "--keep", s(&dangling)],
        &dangling.join("h200-contention.db"),
    );
    assert!(!missing.exists());
    // A folder holding other files is written; once written, it is kept.
    let kept = sb.path("kept");
    std::fs::create_dir(&kept).unwrap();
    std::fs::write(kept.join("notes.txt"), b"mine").unwrap();
    let out = gpusleuth()
        .args(["demo", "--offline", "--keep", s(&kept)])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let trace = kept.join("h200-contention.db");
    let written = std::fs::read(&trace).unwrap();
    assert_eq!(
        written,
        std::fs::read(Path::new(EXAMPLES).join("h200-contention.db")).unwrap()
    );
    keep_refused(&["--offline", "--keep", s(&kept)], &trace);
    assert_eq!(std::fs::read(&trace).unwrap(), written);
    assert_eq!(std::fs::read(kept.join("notes.txt")).unwrap(), b"mine");
    // Live (root and eBPF): the user's `demo.db` is neither removed nor traced over.
    if !require_ebpf() {
        return;
    }
    let user = sb.path("user");
    std::fs::create_dir(&user).unwrap();
    std::fs::write(user.join("demo.db"), b"the user's").unwrap();
    keep_refused(&["--keep", s(&user)], &user.join("demo.db"));
    assert_eq!(std::fs::read(user.join("demo.db")).unwrap(), b"the user's");
    assert!(!user.join("sim").exists());
}
