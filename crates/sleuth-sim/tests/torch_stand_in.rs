//! The `libc10_cuda.so` stand-in (no root needed): its symbols demangle to
//! torch 2.11's caching-allocator signatures, and the workload's torch steps
//! create and release CUDA segments by PyTorch's rules.

mod common;

use common::{sim_world, TempDir};
use sleuth_sim::{install_torch_stand_in, SimPaths, TorchStandIn};
use std::process::Command;

/// Runs a script; returns the driver's (cuMemAlloc_v2, cuMemFree_v2) counts.
fn segments(sim: &SimPaths, dir: &TempDir, script: &str) -> (u64, u64) {
    let (code, t) = common::run_script(sim, dir, script, &[]);
    assert_eq!(code, 0, "workload failed");
    let n = |k: &str| t[0].driver.get(k).copied().unwrap_or(0);
    (n("cuMemAlloc_v2"), n("cuMemFree_v2"))
}

const NS: &str = "c10::cuda::CUDACachingAllocator::Native::";

fn demangled_symbols(path: &std::path::Path) -> String {
    let out = Command::new("nm")
        .arg("-C")
        .arg(path)
        .output()
        .expect("nm (binutils, installed with gcc) runs");
    assert!(out.status.success());
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn symbols_demangle_to_the_torch_2_11_signatures() {
    let (_dir, sim) = sim_world("torch-syms");
    let block = format!("{NS}(anonymous namespace)::Block*");
    let wanted = [
        format!("{NS}DeviceCachingAllocator::malloc(unsigned long, CUstream_st*)"),
        format!("{NS}DeviceCachingAllocator::free({block})"),
        format!(
            "{NS}DeviceCachingAllocator::release_block({block}, std::shared_ptr<c10::GatheredContext> const&)"
        ),
        format!(
            "{NS}NativeCachingAllocator::emptyCache(std::pair<unsigned long long, unsigned long long>)"
        ),
    ];
    for which in [TorchStandIn::Torch211, TorchStandIn::AltLayout] {
        install_torch_stand_in(&sim, which).unwrap();
        let syms = demangled_symbols(&sim.libc10_cuda);
        for w in &wanted {
            assert!(
                syms.lines().any(|l| l.ends_with(&format!(" {w}"))),
                "{which:?} lacks {w}:\n{syms}"
            );
        }
    }
    install_torch_stand_in(&sim, TorchStandIn::MallocWithoutStream).unwrap();
    let syms = demangled_symbols(&sim.libc10_cuda);
    assert!(syms.contains(&format!(
        "{NS}DeviceCachingAllocator::malloc(unsigned long)\n"
    )));
    assert!(!syms.contains(&wanted[0]));
}

#[test]
fn segments_follow_pytorch_rules() {
    let (dir, sim) = sim_world("torch-segs");
    for which in [
        TorchStandIn::Torch211,
        TorchStandIn::AltLayout,
        TorchStandIn::MallocWithoutStream,
    ] {
        install_torch_stand_in(&sim, which).unwrap();
        // Small requests share one 2 MiB segment and reuse freed blocks;
        // empty_cache releases it once entirely free.
        assert_eq!(
            segments(
                &sim,
                &dir,
                "repeat 50 { torch_malloc 1000 x; torch_malloc 70000 y; torch_free x; torch_free y }; \
                 torch_empty_cache"
            ),
            (1, 1),
            "{which:?}"
        );
        // A live block pins its segment: empty_cache releases only the other.
        assert_eq!(
            segments(
                &sim,
                &dir,
                "torch_malloc 100 a; torch_malloc 3000000 b; torch_free b; torch_empty_cache"
            ),
            (2, 1),
            "{which:?}"
        );
        // ≥ 10 MiB requests get their own segment unless a free block fits;
        // a 5 MB and a 12 MB request share one 20 MiB segment.
        assert_eq!(
            segments(
                &sim,
                &dir,
                "torch_malloc 5000000 a; torch_malloc 12000000 b; torch_malloc 30000000 c; \
                 torch_free a; torch_empty_cache; torch_free b; torch_free c; torch_empty_cache"
            ),
            (2, 2),
            "{which:?}"
        );
    }
}
