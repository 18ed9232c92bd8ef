//! End to end, as root with real eBPF, no GPU: `gpusleuth trace
//! --torch-allocator` on the simulated CUDA world plus sleuth-sim's
//! `libc10_cuda.so` stand-in (a caching allocator with torch 2.11's demangled
//! entry points). The expected allocator state is derived here, step by step,
//! from the script and the stand-in's documented rules (sleuth-sim's lib.rs),
//! never from the tool.

mod common;

use common::*;
use serde_json::Value;
use sleuth_sim::{
    device_ptrs, install_torch_stand_in, TorchStandIn, TORCH_BLOCK_ROUNDING, TORCH_LARGE_ROUNDING,
    TORCH_LARGE_SEGMENT, TORCH_SMALL_SEGMENT,
};

/// The scenario. Comments give what the stand-in does at each step. The
/// final sleep keeps the process alive while its call sites are resolved
/// (they are read from the live process's memory map).
const SCRIPT: &str = "malloc 4096 other; \
    torch_malloc 1000 a; torch_malloc 300 b; \
    torch_malloc 5000000 c; torch_malloc 12000000 d; torch_malloc 30000000 e; \
    torch_free c; torch_free e; torch_empty_cache; \
    torch_malloc 2000000 f; torch_malloc 600000 g; torch_free a; \
    torch_malloc 8000000 h; torch_free h; sleep 300";

/// A request rounded like the stand-in (and PyTorch) does.
fn block(req: u64) -> u64 {
    req.max(1).div_ceil(TORCH_BLOCK_ROUNDING) * TORCH_BLOCK_ROUNDING
}

/// What the scenario leaves behind, derived from the stand-in's rules.
struct Expected {
    mallocs: i64,
    frees: i64,
    releases: i64,
    empty_caches: i64,
    /// Live blocks at the end: (segment index, offset in it, size, requested).
    live: Vec<(usize, u64, u64, u64)>,
    /// Segments live at the end (indices into `segment_sizes`), allocator-owned.
    live_segments: Vec<usize>,
    /// Every device allocation in order: `other`, then the segments S1..S4.
    segment_sizes: Vec<u64>,
    outside_bytes: u64,
}

fn expected() -> Expected {
    let (a, b, c, d, e) = (
        block(1000),
        block(300),
        block(5_000_000),
        block(12_000_000),
        block(30_000_000),
    );
    let (f, g) = (block(2_000_000), block(600_000));
    // S1 (small, 2 MiB): a at 0, b at a. S2 (large, 20 MiB as c < 10 MiB):
    // c at 0; d (≥ 10 MiB) is best-fitted into S2's remainder (20 MiB − c
    // holds it) at c. e needs its own segment S3: e rounded up to 2 MiB.
    let s3 = e.div_ceil(TORCH_LARGE_ROUNDING) * TORCH_LARGE_ROUNDING;
    assert!(TORCH_LARGE_SEGMENT - c >= d && s3 - e > 1 << 20);
    // free c (its neighbour d is live: no merge), free e (merges with its
    // remainder: S3 entirely free); empty_cache releases S3 only.
    // f: best fit among free large blocks (c, S2's tail after d) is the tail
    // (smaller), at c + d. g (small) goes after b in S1. free a: no merge
    // (b is live). h = 8e6 fits in neither c nor the tail (20 MiB − c − d − f):
    // a new 20 MiB S4, freed again: S4 entirely free, kept until the next empty_cache.
    let tail = TORCH_LARGE_SEGMENT - c - d;
    assert!(tail >= f && tail < c && tail - f > 1 << 20);
    assert!(block(8_000_000) > c && block(8_000_000) > tail - f);
    Expected {
        mallocs: 8,
        frees: 4,
        releases: 1,
        empty_caches: 1,
        live: vec![
            (1, a, b, 300),
            (1, a + b, g, 600_000),
            (2, c, d, 12_000_000),
            (2, c + d, f, 2_000_000),
        ],
        live_segments: vec![1, 2, 4],
        segment_sizes: vec![
            4096,
            TORCH_SMALL_SEGMENT,
            TORCH_LARGE_SEGMENT,
            s3,
            TORCH_LARGE_SEGMENT,
        ],
        outside_bytes: 4096,
    }
}

fn hex(p: u64) -> String {
    format!("{p:#x}")
}

fn torch_args(sb: &Sandbox) -> Vec<String> {
    let mut args = vec!["--torch-allocator".to_string()];
    for lib in [&sb.sim.libcudart, &sb.sim.libcuda, &sb.sim.libc10_cuda] {
        args.push("--cuda-lib".into());
        args.push(lib.display().to_string());
    }
    args
}

fn trace_scenario(sb: &Sandbox) {
    let args = torch_args(sb);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    sb.trace(&args, SCRIPT, 0);
}

/// `gpusleuth memory --db DB --json`: the one traced process.
fn memory_process(sb: &Sandbox) -> Value {
    let out = run_ok(gpusleuth().args(["memory", "--json", "--db"]).arg(sb.db()));
    let v: Value = serde_json::from_slice(&out.stdout).expect("memory --json prints JSON");
    let procs = v["processes"].as_array().expect("processes").clone();
    assert_eq!(procs.len(), 1, "one traced process: {v:#}");
    procs.into_iter().next().expect("one process")
}

fn u(v: &Value, key: &str) -> u64 {
    v[key]
        .as_u64()
        .unwrap_or_else(|| panic!("{key} is not a number in {v:#}"))
}

/// Runs the scenario with one build of the stand-in and checks every number
/// of the allocator view against the derivation above.
fn check_scenario(which: TorchStandIn, tag: &str) {
    let Some(sb) = Sandbox::for_ebpf(tag) else {
        return;
    };
    install_torch_stand_in(&sb.sim, which).expect("install the allocator stand-in");
    trace_scenario(&sb);
    let x = expected();
    let bases = device_ptrs(&x.segment_sizes);

    // The raw events, per op, as stored.
    let db = sb.open_db();
    let per_op = |op: &str| {
        db.int(&format!(
            "SELECT count(*) FROM allocator_events WHERE op='{op}'"
        ))
    };
    assert_eq!(per_op("DeviceCachingAllocator::malloc"), x.mallocs);
    // Every block allocation names its site: the workload's function that
    // called the allocator (the stand-in and the workload keep frame pointers).
    assert_eq!(
        db.int(
            "SELECT count(*) FROM allocator_events e JOIN stacks s ON s.id = e.stack_id
             WHERE e.op = 'DeviceCachingAllocator::malloc' AND s.site LIKE '% (workload)'"
        ),
        x.mallocs,
        "block allocations without a workload site"
    );
    assert_eq!(per_op("DeviceCachingAllocator::free"), x.frees);
    assert_eq!(per_op("DeviceCachingAllocator::release_block"), x.releases);
    assert_eq!(
        db.int("SELECT count(*) FROM allocator_events"),
        x.mallocs + x.frees + x.releases
    );
    assert_eq!(
        db.int("SELECT count(*) FROM calls WHERE layer='torch' AND op='NativeCachingAllocator::emptyCache'"),
        x.empty_caches
    );
    // The requested sizes are the malloc arguments, in order.
    let requested: Vec<i64> = db
        .ints("SELECT requested FROM allocator_events WHERE op='DeviceCachingAllocator::malloc' ORDER BY end_ns")
        .into_iter()
        .map(|r| r[0])
        .collect();
    assert_eq!(
        requested,
        vec![1000, 300, 5_000_000, 12_000_000, 30_000_000, 2_000_000, 600_000, 8_000_000]
    );
    // The segment release freed S3 at CUDA level too.
    assert_eq!(
        db.ints("SELECT ptr FROM calls WHERE op='cuMemFree_v2'"),
        vec![vec![bases[3] as i64]]
    );
    let lib = db.text_ints("SELECT missing, probes FROM libraries WHERE layer='torch'");
    assert_eq!(lib.len(), 1, "one torch library attached: {lib:?}");
    assert_eq!(lib[0].0, "[]", "every entry point found");
    assert!(lib[0].1 > 0, "probes attached: {lib:?}");

    // The rebuilt allocator.
    let p = memory_process(&sb);
    let al = &p["allocator"];
    let cal = &al["calibration"];
    let (req_i, size_i, ptr_i) = which.block_words();
    assert_eq!(cal["recognised"], true, "{al:#}");
    assert_eq!(cal["requested_index"], req_i as u64, "{cal:#}");
    assert_eq!(cal["size_index"], size_i as u64, "{cal:#}");
    assert_eq!(cal["ptr_index"], ptr_i as u64, "{cal:#}");
    assert_eq!(u(cal, "malloc_events"), x.mallocs as u64);

    let allocated: u64 = x.live.iter().map(|l| l.2).sum();
    let requested: u64 = x.live.iter().map(|l| l.3).sum();
    let reserved: u64 = x.live_segments.iter().map(|&i| x.segment_sizes[i]).sum();
    assert_eq!(u(al, "allocated_bytes"), allocated, "{al:#}");
    assert_eq!(u(al, "requested_bytes"), requested);
    assert_eq!(u(al, "rounding_bytes"), allocated - requested);
    assert_eq!(u(al, "allocator_reserved_bytes"), reserved);
    assert_eq!(u(al, "outside_allocator_bytes"), x.outside_bytes);
    assert_eq!(u(al, "reserved_bytes"), reserved + x.outside_bytes);
    assert_eq!(
        al["gap_bytes"].as_i64(),
        Some((reserved - allocated) as i64)
    );
    assert_eq!(al["unexplained_bytes"].as_i64(), Some(0));
    assert_eq!(u(al, "live_blocks"), x.live.len() as u64);
    // S4 is entirely free (releasable); S1 and S2 are pinned by live blocks.
    assert_eq!(u(al, "releasable_bytes"), x.segment_sizes[4]);
    assert_eq!(
        u(al, "pinned_free_bytes"),
        reserved - allocated - x.segment_sizes[4]
    );
    let counts = &al["counts"];
    assert_eq!(u(counts, "mallocs"), x.mallocs as u64);
    assert_eq!(u(counts, "frees"), x.frees as u64);
    assert_eq!(u(counts, "segment_releases"), x.releases as u64);
    for k in [
        "failed_mallocs",
        "unmatched_frees",
        "reused_live_blocks",
        "free_ptr_mismatches",
    ] {
        assert_eq!(u(counts, k), 0, "{k}");
    }
    assert_eq!(al["inconsistencies"].as_array().map(Vec::len), Some(0));
    assert_eq!(
        u(&al["pools"]["small"], "reserved_bytes"),
        x.segment_sizes[1]
    );
    assert_eq!(
        u(&al["pools"]["small"], "allocated_bytes"),
        x.live.iter().filter(|l| l.0 == 1).map(|l| l.2).sum::<u64>()
    );

    // Segment by segment: base, size, live blocks (ptr, size), free bytes.
    let segs = al["segments"].as_array().expect("segments");
    let owned: Vec<&Value> = segs
        .iter()
        .filter(|s| s["allocator_owned"] == true)
        .collect();
    assert_eq!(owned.len(), x.live_segments.len(), "{segs:#?}");
    let mut free_sum = 0;
    for &i in &x.live_segments {
        let s = owned
            .iter()
            .find(|s| s["base"] == hex(bases[i]))
            .unwrap_or_else(|| panic!("segment S{i} at {} missing: {segs:#?}", hex(bases[i])));
        assert_eq!(u(s, "size"), x.segment_sizes[i]);
        let mut want: Vec<(String, u64)> = x
            .live
            .iter()
            .filter(|l| l.0 == i)
            .map(|l| (hex(bases[i] + l.1), l.2))
            .collect();
        let mut got: Vec<(String, u64)> = s["live_blocks"]
            .as_array()
            .expect("live_blocks")
            .iter()
            .map(|b| (b["ptr"].as_str().unwrap_or("").to_string(), u(b, "size")))
            .collect();
        want.sort();
        got.sort();
        assert_eq!(got, want, "live blocks of S{i}");
        let live: u64 = want.iter().map(|w| w.1).sum();
        assert_eq!(u(s, "free_bytes"), x.segment_sizes[i] - live);
        free_sum += u(s, "free_bytes");
    }
    assert_eq!(
        free_sum,
        reserved - allocated,
        "the gap is the segments' free bytes"
    );
    // The direct cudaMalloc is reported beside the allocator, not inside it.
    let other: Vec<&Value> = segs
        .iter()
        .filter(|s| s["allocator_owned"] != true)
        .collect();
    assert_eq!(other.len(), 1, "{segs:#?}");
    assert_eq!(other[0]["base"], hex(bases[0]));
}

#[test]
fn allocated_reserved_and_gap_match_the_scenario() {
    check_scenario(TorchStandIn::Torch211, "torch-211");
}

#[test]
fn calibration_follows_another_block_layout() {
    check_scenario(TorchStandIn::AltLayout, "torch-alt");
}

/// `gpusleuth check --json` with LD_LIBRARY_PATH naming the sim's lib dir:
/// the torch_allocator line for this sandbox's stand-in.
/// The detail of `check`'s torch_allocator line, once its verdict is `ok`.
fn check_detail(sb: &Sandbox, ok: bool) -> String {
    let line = check_line(sb);
    assert_eq!(line["ok"], ok, "{line:#}");
    line["detail"].as_str().unwrap_or("").to_string()
}

fn check_line(sb: &Sandbox) -> Value {
    let out = gpusleuth()
        .args(["check", "--json"])
        .env("LD_LIBRARY_PATH", &sb.sim.lib_dir)
        .output()
        .expect("run gpusleuth check");
    assert_no_panic(&out);
    let v: Value = serde_json::from_slice(&out.stdout).expect("check --json prints JSON");
    let path = std::fs::canonicalize(&sb.sim.libc10_cuda).expect("stand-in path");
    let path = path.display().to_string();
    v["checks"]
        .as_array()
        .expect("checks")
        .iter()
        .find(|c| {
            c["name"] == "torch_allocator"
                && c["detail"]
                    .as_str()
                    .is_some_and(|d| d.starts_with(&format!("{path}:")))
        })
        .cloned()
        .unwrap_or_else(|| panic!("check does not list {path}: {v:#}"))
}

#[test]
fn check_finds_the_four_entry_points() {
    // No eBPF needed: check reads the library's symbol table.
    let sb = Sandbox::new("torch-check");
    let detail = check_detail(&sb, true);
    assert!(
        detail.contains("4 of 4 caching-allocator entry points found"),
        "{detail}"
    );
}

#[test]
fn a_changed_malloc_signature_is_not_probed() {
    let sb = Sandbox::new("torch-nostream");
    install_torch_stand_in(&sb.sim, TorchStandIn::MallocWithoutStream)
        .expect("install the allocator stand-in");
    let detail = check_detail(&sb, false);
    assert!(
        detail.contains("3 of 4 caching-allocator entry points found"),
        "{detail}"
    );
    assert!(
        detail.contains("DeviceCachingAllocator::malloc(unsigned long)"),
        "check shows what is there instead: {detail}"
    );
    if !require_ebpf() {
        return;
    }
    trace_scenario(&sb);
    let db = sb.open_db();
    let lib = db.text_ints("SELECT missing, probes FROM libraries WHERE layer='torch'");
    assert_eq!(lib.len(), 1, "{lib:?}");
    let missing: Vec<String> = serde_json::from_str(&lib[0].0).expect("missing is JSON");
    assert_eq!(missing, vec!["DeviceCachingAllocator::malloc".to_string()]);
    // All or nothing: without malloc, free/release alone would rebuild nonsense.
    assert_eq!(
        lib[0].1, 0,
        "no torch probe may be attached when one entry point is missing"
    );
    assert_eq!(db.int("SELECT count(*) FROM allocator_events"), 0);
    assert_eq!(
        db.int("SELECT count(*) FROM notes WHERE level='warn' AND text LIKE '%caching-allocator entry points not found%'"),
        1,
        "the fallback to the CUDA-level view must be said in the trace"
    );
    // No malloc was captured, so no allocator numbers are claimed.
    assert_eq!(
        db.int("SELECT count(*) FROM allocator_events WHERE op='DeviceCachingAllocator::malloc'"),
        0
    );
    let p = memory_process(&sb);
    let al = &p["allocator"];
    assert!(
        al.is_null()
            || (al["calibration"]["recognised"] == false && al["allocated_bytes"].is_null()),
        "no allocator view without malloc events: {al:#}"
    );
    // The CUDA-level trace still works: the direct cudaMalloc and 4 segments, one freed.
    let x = expected();
    let stats = stats_json(&sb.db());
    assert_eq!(
        stats_count(&stats, "driver", "cuMemAlloc_v2"),
        x.segment_sizes.len() as u64
    );
    assert_eq!(stats_count(&stats, "driver", "cuMemFree_v2"), 1);
    assert_eq!(
        u(&p, "live_bytes"),
        x.live_segments
            .iter()
            .map(|&i| x.segment_sizes[i])
            .sum::<u64>()
            + x.outside_bytes
    );
}
