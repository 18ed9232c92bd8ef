//! `gpusleuth trace` run as uid 0 with a reduced capability set (util-linux
//! `setpriv`): too few capabilities must fail or warn, never end as a silent
//! success with 0 calls; CAP_BPF + CAP_PERFMON must be enough where the
//! kernel has batched uprobes (uprobe_multi, Linux 6.6+).

mod common;
use common::*;
use std::path::Path;
use std::process::{Command, Output};

/// The script: 6 per-call records (2 cudaMalloc, 2 cuMemAlloc_v2, cudaMemcpy,
/// cuMemcpyHtoD_v2) and 3 counted cuLaunchKernel.
const SCRIPT: &str = "malloc 1048576 a; memcpy 4096; malloc 1e15; cu_launch 3";
const CALLS: i64 = 6;

/// Whether `setpriv` is installed. Its absence is a missing tool, not a
/// machine that cannot trace: the tests skip with a reason, in CI too.
fn have_setpriv() -> bool {
    let ok = Command::new("setpriv")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    if !ok {
        common::skipped("`setpriv` (util-linux) is not installed");
    }
    ok
}

/// A fresh sandbox's trace run under setpriv holding only `caps` (setpriv
/// syntax, e.g. "+bpf,+perfmon"); None (the test skips) without eBPF or setpriv.
fn traced_with_caps(tag: &str, caps: &str, no_multi: bool) -> Option<(Sandbox, Output)> {
    if !require_ebpf() || !have_setpriv() {
        return None;
    }
    let sb = Sandbox::new(tag);
    let out = trace_with_caps(&sb, caps, no_multi);
    Some((sb, out))
}

/// `sandbox.trace_command(...)` run under setpriv holding only `caps`.
fn trace_with_caps(sb: &Sandbox, caps: &str, no_multi: bool) -> Output {
    let inner = sb.trace_command(&["--force"], SCRIPT);
    let set = format!("-all,{caps}");
    let mut cmd = Command::new("setpriv");
    cmd.arg(format!("--inh-caps={set}"))
        .arg(format!("--ambient-caps={set}"))
        .arg(format!("--bounding-set={set}"))
        .arg("--")
        .arg(inner.get_program())
        .args(inner.get_args());
    for (k, v) in inner.get_envs() {
        match v {
            Some(v) => cmd.env(k, v),
            None => cmd.env_remove(k),
        };
    }
    if no_multi {
        cmd.env("GPUSLEUTH_NO_MULTI_UPROBE", "1");
    }
    let out = cmd.output().expect("run setpriv gpusleuth trace");
    assert_no_panic(&out);
    out
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// Linux 6.6 or later (uprobe_multi links exist).
fn kernel_has_uprobe_multi() -> bool {
    let rel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    let mut it = rel
        .trim()
        .split(['.', '-'])
        .map(|p| p.parse::<u32>().unwrap_or(0));
    let (major, minor) = (it.next().unwrap_or(0), it.next().unwrap_or(0));
    (major, minor) >= (6, 6)
}

/// A trace that recorded nothing must have said why, on stderr and in the database.
fn assert_loud_about_unprobed(out: &Output, db: &Path) {
    let err = stderr(out);
    for lib in ["libcudart.so.13", "libcuda.so.1"] {
        assert!(
            err.contains("warning: not probed") && err.contains(lib),
            "no stderr warning for unprobed {lib}:\n{err}"
        );
    }
    assert!(
        err.contains("no CUDA library was probed"),
        "final summary does not say that nothing was probed:\n{err}"
    );
    let db = Db::open(db);
    assert!(
        db.int("SELECT count(*) FROM notes WHERE text LIKE 'not probed:%'") >= 2,
        "the database holds no 'not probed' note per library"
    );
    assert_eq!(
        db.int("SELECT count(*) FROM notes WHERE text LIKE 'no CUDA library was probed%'"),
        1
    );
}

#[test]
fn without_cap_perfmon_the_trace_refuses_to_start() {
    let Some((_sb, out)) = traced_with_caps("caps-bpf-only", "+bpf", false) else {
        return;
    };
    let err = stderr(&out);
    assert_ne!(
        out.status.code(),
        Some(0),
        "traced without CAP_PERFMON:\n{err}"
    );
    assert!(
        err.contains("CAP_PERFMON") && err.lines().count() == 1,
        "expected a one-line error naming CAP_PERFMON:\n{err}"
    );
}

#[test]
fn refused_uprobes_are_reported_not_silent() {
    // One-by-one uprobes (perf_event_open): CAP_SYS_ADMIN on kernels with
    // upstream's 6.16 revert, CAP_PERFMON on older ones. Either the calls are
    // recorded or the loss is loud; 0 calls with nothing said fails.
    let Some((sb, out)) = traced_with_caps("caps-no-multi", "+bpf,+perfmon", true) else {
        return;
    };
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let calls = sb.open_db().int("SELECT count(*) FROM calls");
    if calls == 0 {
        assert_loud_about_unprobed(&out, &sb.db());
        assert!(
            stderr(&out).contains("CAP_SYS_ADMIN"),
            "the warning does not name CAP_SYS_ADMIN:\n{}",
            stderr(&out)
        );
    } else {
        eprintln!("this kernel accepts CAP_PERFMON for perf uprobes");
        assert_eq!(calls, CALLS);
    }
}

#[test]
fn bpf_and_perfmon_suffice_with_batched_uprobes() {
    let Some((sb, out)) = traced_with_caps("caps-bpf-perfmon", "+bpf,+perfmon", false) else {
        return;
    };
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let db = sb.open_db();
    let calls = db.int("SELECT count(*) FROM calls");
    if !kernel_has_uprobe_multi() && calls == 0 {
        eprintln!("kernel before 6.6: no uprobe_multi, checking the loss is loud instead");
        assert_loud_about_unprobed(&out, &sb.db());
        return;
    }
    assert_eq!(calls, CALLS, "stderr:\n{}", stderr(&out));
    assert_eq!(db.int("SELECT count(*) FROM libraries WHERE probes > 0"), 2);
    assert_eq!(db.int("SELECT count(*) FROM notes WHERE level = 'warn'"), 0);
}
