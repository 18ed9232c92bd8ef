//! The CPython layouts gpusleuth walks, checked against each installed
//! interpreter's own headers: `py_offsets.c` prints `offsetof` of every field
//! used, compiled with `Py_BUILD_CORE` against that version's internal
//! headers; and `detect` on a live interpreter must find the same layout
//! (3.13: read from its `_Py_DebugOffsets`).

use sleuth_probe::sites::python::{detect, static_layout, VersionLayout};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// (minor, install prefix) of the pyenv interpreters present.
fn installs() -> Vec<(u32, PathBuf)> {
    ["3.10.13", "3.11.7", "3.12.1", "3.13.0"]
        .iter()
        .filter_map(|v| {
            let prefix = PathBuf::from(format!("/root/.pyenv/versions/{v}"));
            let minor: u32 = v.split('.').nth(1)?.parse().ok()?;
            prefix
                .join(format!("include/python3.{minor}/internal"))
                .exists()
                .then_some((minor, prefix))
        })
        .collect()
}

fn header_offsets(minor: u32, prefix: &Path, dir: &Path) -> HashMap<String, u64> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/py_offsets.c");
    let exe = dir.join(format!("py_offsets_3{minor}"));
    let inc = prefix.join(format!("include/python3.{minor}"));
    let out = Command::new("gcc")
        .arg(format!("-I{}", inc.display()))
        .arg(format!("-I{}/internal", inc.display()))
        .arg(&src)
        .arg("-o")
        .arg(&exe)
        .output()
        .expect("gcc");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = Command::new(&exe).output().expect("run py_offsets");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| {
            let (k, v) = l.rsplit_once(char::is_whitespace)?;
            Some((k.trim().to_string(), v.parse().ok()?))
        })
        .collect()
}

fn check(minor: u32, l: &VersionLayout, h: &HashMap<String, u64>) {
    let get = |k: &str| *h.get(k).unwrap_or_else(|| panic!("3.{minor}: {k} missing"));
    let w = &l.walk;
    assert_eq!(
        w.runtime_interp_head as u64,
        get("runtime.interpreters.head"),
        "3.{minor}"
    );
    assert_eq!(
        w.interp_threads_head as u64,
        get("interp.threads.head"),
        "3.{minor}"
    );
    assert_eq!(w.tstate_next as u64, get("tstate.next"), "3.{minor}");
    assert_eq!(
        w.tstate_thread_id as u64,
        get("tstate.thread_id"),
        "3.{minor}"
    );
    let (frame_key, code_key, prev_key, instr_key) = match minor {
        10 => (
            "tstate.frame",
            "frame.code(f_code)",
            "frame.previous(f_back)",
            "frame.instr(f_lasti)",
        ),
        11 | 12 => (
            "tstate.cframe",
            "frame.code(f_code)",
            "frame.previous",
            "frame.instr(prev_instr)",
        ),
        _ => (
            "tstate.current_frame",
            "frame.code(f_executable)",
            "frame.previous",
            "frame.instr(instr_ptr)",
        ),
    };
    assert_eq!(w.tstate_frame as u64, get(frame_key), "3.{minor}");
    assert_eq!(w.frame_code as u64, get(code_key), "3.{minor}");
    assert_eq!(w.frame_previous as u64, get(prev_key), "3.{minor}");
    assert_eq!(w.frame_instr as u64, get(instr_key), "3.{minor}");
    if minor == 11 || minor == 12 {
        assert_eq!(
            w.cframe_current as u64,
            get("cframe.current_frame"),
            "3.{minor}"
        );
    }
    if minor >= 11 {
        assert_eq!(w.frame_owner as u64, get("frame.owner"), "3.{minor}");
        assert_eq!(
            l.code.code_adaptive,
            Some(get("code.code_adaptive")),
            "3.{minor}"
        );
        assert_eq!(l.code.name, get("code.qualname"), "3.{minor}");
    } else {
        assert_eq!(l.code.name, get("code.name"), "3.{minor}");
    }
    assert_eq!(l.code.filename, get("code.filename"), "3.{minor}");
    assert_eq!(l.code.firstlineno, get("code.firstlineno"), "3.{minor}");
    assert_eq!(l.code.linetable, get("code.linetable"), "3.{minor}");
    assert_eq!(l.code.ascii_size, get("sizeof PyASCIIObject"), "3.{minor}");
    assert_eq!(
        l.code.compact_size,
        get("sizeof PyCompactUnicodeObject"),
        "3.{minor}"
    );
    assert_eq!(l.code.bytes_sval, get("bytes.ob_sval"), "3.{minor}");
}

#[test]
fn layouts_match_each_interpreters_headers_and_detection() {
    let found = installs();
    if found.len() < 2 {
        if std::env::var("CI").as_deref() == Ok("true") {
            panic!("CI must check at least two CPython layouts; found {found:?}");
        }
        eprintln!("skipped: fewer than two pyenv CPythons with headers");
        return;
    }
    let dir = std::env::temp_dir().join(format!("gs-pylayout-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("tmp dir");
    for (minor, prefix) in &found {
        let h = header_offsets(*minor, prefix, &dir);
        if let Some(l) = static_layout(*minor) {
            check(*minor, &l, &h);
        }
        // Detection on a live interpreter: the same layout (3.13: its own
        // debug offsets), and _PyRuntime found.
        let python = prefix.join(format!("bin/python3.{minor}"));
        let mut child = Command::new(&python)
            .args([
                "-c",
                "import sys, time; print('up', flush=True); time.sleep(30)",
            ])
            .stdout(Stdio::piped())
            .spawn()
            .expect("start python");
        let mut line = String::new();
        use std::io::BufRead;
        std::io::BufReader::new(child.stdout.take().expect("stdout"))
            .read_line(&mut line)
            .expect("python up");
        let got = detect(child.id());
        let _ = child.kill();
        let _ = child.wait();
        let p = got
            .unwrap_or_else(|e| panic!("3.{minor}: {e}"))
            .unwrap_or_else(|| panic!("3.{minor}: not detected"));
        assert_eq!(p.layout.minor, *minor);
        check(*minor, &p.layout, &h);
        assert_ne!(p.runtime, 0);
    }
    let _ = std::fs::remove_dir_all(&dir);
}
