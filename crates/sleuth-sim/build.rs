//! Builds the simulated CUDA libraries and programs (C, in `csrc/`) with the
//! system `gcc` (and the C++ `libc10_cuda.so` stand-in with `g++`) into
//! OUT_DIR; `src/lib.rs` embeds the results. No extra crates: gcc and g++ are
//! on every development and CI machine.

use std::path::PathBuf;
use std::process::Command;

fn gcc(args: &[&str], what: &str) {
    compile("gcc", args, what)
}

fn compile(compiler: &str, args: &[&str], what: &str) {
    let out = Command::new(compiler)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("sleuth-sim needs {compiler} to build {what}: {e}"));
    if !out.status.success() {
        panic!(
            "{compiler} failed building {what}:\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

fn main() {
    let src =
        PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").expect("cargo sets this")).join("csrc");
    let out = PathBuf::from(std::env::var("OUT_DIR").expect("cargo sets this"));
    println!("cargo:rerun-if-changed=csrc");
    let s = |f: &str| src.join(f).to_string_lossy().into_owned();
    let o = |f: &str| out.join(f).to_string_lossy().into_owned();
    let common = [
        "-O2",
        "-Wall",
        "-Wextra",
        "-Werror",
        "-fno-omit-frame-pointer",
        // Every function starts with endbr64, like CET-enabled distribution
        // builds. It also keeps a lock-prefixed counter increment from being a
        // function's first instruction: x86 uprobes cannot single-step those
        // and the kernel then silently skips the breakpoint.
        "-fcf-protection=full",
        // The stand-ins find one another through their rpath, written as
        // DT_RPATH, which the loader searches before LD_LIBRARY_PATH
        // (DT_RUNPATH, ld's default, comes after it): on a GPU machine whose
        // LD_LIBRARY_PATH holds the real driver (containers:
        // /usr/local/nvidia/lib64) the workload loaded the real libcuda.so.1,
        // so `demo` failed on a missing simulator symbol and the bench's
        // flood timed failing launches, each with its call site (round 40).
        "-Wl,--disable-new-dtags",
    ];
    let inc = format!("-I{}", src.display());

    // Driver stand-in: plain exported symbols, like the real libcuda.so.1.
    let mut args = shared_lib(&common, "libcuda.so.1");
    args.extend([
        inc.clone(),
        format!("-Wl,--version-script={}", s("libcuda.map")),
        "-o".into(),
        o("libcuda.so.1"),
        s("libcuda.c"),
        "-lpthread".into(),
    ]);
    gcc(&refs(&args), "libcuda.so.1");

    // Runtime stand-in: versioned symbols (cudaMalloc@@libcudart.so.13), finds
    // the driver next to itself like an installed toolkit does.
    let mut args = shared_lib(&common, "libcudart.so.13");
    args.extend([
        inc.clone(),
        format!("-Wl,--version-script={}", s("libcudart.map")),
        "-Wl,-rpath,$ORIGIN".into(),
        "-o".into(),
        o("libcudart.so.13"),
        s("libcudart.c"),
        o("libcuda.so.1"),
    ]);
    gcc(&refs(&args), "libcudart.so.13");

    // PyTorch caching-allocator stand-ins (C++: the probes find them by
    // demangled name): torch 2.11's Block layout and signatures, a different
    // Block layout, and a malloc signature gpusleuth must refuse. All carry
    // the soname libc10_cuda.so and use the runtime found next to them.
    for (file, define) in [
        ("libc10_cuda.so", None),
        ("libc10_cuda_alt_layout.so", Some("-DSIM_TORCH_ALT_LAYOUT")),
        (
            "libc10_cuda_malloc_no_stream.so",
            Some("-DSIM_TORCH_MALLOC_NO_STREAM"),
        ),
    ] {
        let mut args = shared_lib(&common, "libc10_cuda.so");
        args.extend(define.map(String::from));
        args.extend([
            "-Wl,-rpath,$ORIGIN".into(),
            "-o".into(),
            o(file),
            s("c10_cuda.cpp"),
            o("libcudart.so.13"),
        ]);
        compile("g++", &refs(&args), file);
    }

    // The workload links both; materialize() puts it in bin/ beside lib/.
    let mut args = owned(&common);
    args.extend([
        inc.clone(),
        "-Wl,-rpath,$ORIGIN/../lib".into(),
        "-o".into(),
        o("workload"),
        s("workload.c"),
        o("libcudart.so.13"),
        o("libcuda.so.1"),
        "-lpthread".into(),
        "-ldl".into(),
    ]);
    gcc(&refs(&args), "workload");

    let mut args = owned(&common);
    args.extend(["-o".into(), o("gs-hog"), s("hog.c")]);
    gcc(&refs(&args), "gs-hog");

    // NCCL stand-in (plain exported symbols, like the real libnccl.so.2) and
    // the rank program linked against it (finds it via rpath $ORIGIN/../nccl-lib).
    let mut args = shared_lib(&common, "libnccl.so.2");
    args.extend([
        inc.clone(),
        "-fvisibility=hidden".into(),
        "-o".into(),
        o("libnccl.so.2"),
        s("libnccl.c"),
    ]);
    gcc(&refs(&args), "libnccl.so.2");
    let mut args = owned(&common);
    args.extend([
        inc,
        "-Wl,-rpath,$ORIGIN/../nccl-lib".into(),
        "-o".into(),
        o("nccl_rank"),
        s("nccl_rank.c"),
        o("libnccl.so.2"),
    ]);
    gcc(&refs(&args), "nccl_rank");
}

/// The common flags, as an argument list to extend.
fn owned(common: &[&str]) -> Vec<String> {
    common.iter().map(|a| a.to_string()).collect()
}

/// The common flags and those of a shared library named `soname`.
fn shared_lib(common: &[&str], soname: &str) -> Vec<String> {
    let mut args = owned(common);
    args.extend([
        "-shared".into(),
        "-fPIC".into(),
        format!("-Wl,-soname,{soname}"),
    ]);
    args
}

fn refs(v: &[String]) -> Vec<&str> {
    v.iter().map(String::as_str).collect()
}
