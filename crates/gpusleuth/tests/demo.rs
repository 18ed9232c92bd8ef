//! `gpusleuth demo`: the live diagnosis (root + eBPF) and the bundled one.

mod common;

use common::{assert_no_panic, gpusleuth, require_ebpf, run_ok};

#[test]
fn demo_names_the_hog_the_leak_and_the_failed_allocation() {
    if !require_ebpf() {
        return;
    }
    let out = gpusleuth().arg("demo").output().expect("run demo");
    assert_no_panic(&out);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "demo failed: {text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // Issue 14: no path is printed that the demo deletes when it ends.
    for word in text
        .split_whitespace()
        .filter(|w| w.contains("gpusleuth-demo-"))
    {
        assert!(
            std::path::Path::new(word).exists(),
            "printed, then deleted: {word}"
        );
    }
    assert!(text.contains("--keep"), "{text}");
    // Ground truth from the scenario in cmd/demo.rs.
    // The first finding line of a kind.
    let finding = |kind: &str| {
        text.lines()
            .find(|l| l.contains(kind))
            .unwrap_or_else(|| panic!("no {kind}:\n{text}"))
    };
    let pre = finding("cpu_preemption");
    assert!(pre.contains("gs-hog"), "hog not named: {pre}");
    let leak = finding("memory_growth");
    assert!(leak.contains("25 allocation(s), 3.1 MiB"), "{leak}");
    // The failed allocation; and the syncs' sleep is GPU time: stated in the
    // per-thread split ("Where the time went"), never a finding.
    for want in [
        "allocation_failure",
        "returned 2 (out of memory)",
        "Where the time went",
    ] {
        assert!(text.contains(want), "{want:?} missing:\n{text}");
    }
    // The spinning copies are the main victims. A sync's sleep is GPU wait and
    // never blamed; a sync woken on the hog's CPU may still wait runnable, and
    // that part is real, so it may appear lower in the list.
    assert!(
        pre.contains("cudaMemcpy"),
        "the first cpu_preemption finding must be the copies: {pre}"
    );
}

#[test]
fn demo_offline_explains_the_bundled_trace_without_privileges() {
    let out = run_ok(gpusleuth().args(["demo", "--offline"]));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("not tracing live (--offline given)"),
        "{text}"
    );
    assert!(
        text.lines().any(|l| l.contains("cpu_preemption")
            && l.contains("gs-neighbour (pid 718, 100% of the lost time)")),
        "{text}"
    );
    assert!(text.contains("recorded on an NVIDIA H200"), "{text}");
    // The syncs waited for the GPU, and the neighbour's share is said apart.
    assert!(
        text.contains("waiting for the GPU inside syncs (24% more runnable inside CUDA calls: the CPU was taken): GPU-bound"),
        "{text}"
    );
}
