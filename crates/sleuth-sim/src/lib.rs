//! Simulated CUDA for tests, the demo and the bench: a `libcudart.so.13` and a
//! `libcuda.so.1` that export the real entry points with the real ABI, a
//! `libc10_cuda.so` with PyTorch's caching-allocator entry points, a scripted
//! `workload` linked against them, and a CPU hog (`gs-hog`).
//!
//! The C sources live in `csrc/` and are built by `build.rs` with gcc;
//! [`materialize`] writes fresh copies into a directory. Uprobes attach to a
//! file's inode, so every test materializes its own copy and never sees the
//! calls of another test running in parallel.
//!
//! # The stand-ins
//! - The runtime calls the driver like the real one: `cudaMalloc` →
//!   `cuMemAlloc_v2`, `cudaFree` → `cuMemFree_v2`, `cudaMallocManaged` →
//!   `cuMemAllocManaged`, `cudaMallocHost`/`cudaHostAlloc` → `cuMemAllocHost_v2`,
//!   `cudaFreeHost` → `cuMemFreeHost`, `cudaMallocAsync`/`cudaFreeAsync` →
//!   `cuMemAllocAsync`/`cuMemFreeAsync`, `cudaMemcpy[Async]` → `cuMemcpy{HtoD,DtoH,DtoD}[Async]_v2`
//!   by kind (`cuMemcpy[Async]` for host-to-host and default), `cudaLaunchKernel` →
//!   `cuLaunchKernel`, `cudaStreamSynchronize` → `cuStreamSynchronize`,
//!   `cudaDeviceSynchronize` → `cuCtxSynchronize`, `cudaEventSynchronize` →
//!   `cuEventSynchronize`, `cudaHostRegister`/`cudaHostUnregister` →
//!   `cuMemHostRegister_v2`/`cuMemHostUnregister`. `cudaMemset[Async]`, `cudaGraphLaunch` and
//!   `cudaSetDevice` make no (probed) driver call. `cudaFree(NULL)` makes none either.
//! - Allocation rule (see [`device_ptrs`]): device memory (`cuMemAlloc_v2`,
//!   `cuMemAllocManaged`, `cuMemAllocAsync`, and the physical handles of
//!   `cuMemCreate`) comes from one bump pointer starting at [`DEVICE_BASE`],
//!   advancing by the size rounded up to [`ALIGN`], never reused; pinned host
//!   memory from another at [`HOST_BASE`]; `cuMemAddressReserve` ranges from a
//!   third at [`VA_BASE`]. Size 0 yields pointer 0.
//!   `cudaSetDevice(d)` succeeds for `d < SIM_DEVICE_COUNT` (env; default 1) and
//!   returns 101 (`cudaErrorInvalidDevice`) otherwise; memory is one pool for all.
//!   A device allocation that would take the live device bytes beyond `SIM_DEVICE_BYTES` (env; default
//!   [`DEFAULT_DEVICE_BYTES`]) fails with 2 (`CUDA_ERROR_OUT_OF_MEMORY` /
//!   `cudaErrorMemoryAllocation`) and does not advance the bump pointer.
//!   A forked child continues from its parent's state.
//! - The caching-allocator stand-in (`libc10_cuda.so`, C++, see
//!   `csrc/c10_cuda.cpp`) defines `DeviceCachingAllocator::malloc/free/release_block`
//!   and `NativeCachingAllocator::emptyCache` with torch 2.11's demangled
//!   names and signatures, and PyTorch's rules: requests rounded up to
//!   [`TORCH_BLOCK_ROUNDING`]; requests ≤ [`TORCH_SMALL_BLOCK_MAX`] served
//!   from [`TORCH_SMALL_SEGMENT`] segments, larger ones from
//!   [`TORCH_LARGE_SEGMENT`] segments (requests below
//!   [`TORCH_MIN_LARGE_ALLOC`]) or segments rounded up to
//!   [`TORCH_LARGE_ROUNDING`]; best fit among free blocks; a block is split
//!   when the rest is ≥ 512 B (small pool) or > 1 MiB (large pool); frees
//!   merge free neighbours; `emptyCache` calls `release_block` (→ `cudaFree`)
//!   on every segment that is one free block. Segments come from the
//!   simulated `cudaMalloc`. The `Block` struct's first 16 words follow
//!   [`TorchStandIn`]'s layout.
//! - Scripted time: `simSetNextDurationNs(ns)` (exported by the driver
//!   stand-in, never probed) makes the thread's next sync or `cuMemFree_v2`
//!   sleep `ns` (the thread blocks, like a GPU wait) or its next copy spin `ns` of *thread CPU
//!   time* (like a pageable copy: under CPU contention its wall time grows by
//!   exactly the time it waited runnable); `simSetNextAwaitPath(path)` makes
//!   the next sync block until `path` exists.
//! - With `SIM_GPU_ACTIVITY=PATH` the driver stand-in appends `mem PID BYTES`
//!   (after each change of the process's device bytes) and `busy PID START_US
//!   END_US` (each scripted sync, CLOCK_REALTIME µs) lines to PATH: the
//!   simulated NVML of sleuth-gpu's tests reads them.
//!
//! # The workload's step language
//! `workload [--wait-file PATH] [--truth PATH] SCRIPT...` — the arguments after
//! the options are joined with spaces into one script. Steps are separated by
//! `;`, blocks are `{ ... }`. Numbers accept `0x`, and `1e15` forms.
//!
//! | step | calls |
//! |---|---|
//! | `malloc SIZE [NAME]` | `cudaMalloc`; NAME remembers the pointer |
//! | `malloc_managed` / `malloc_host` / `host_alloc` / `malloc_async` `SIZE [NAME]` | `cudaMallocManaged` / `cudaMallocHost` / `cudaHostAlloc` / `cudaMallocAsync` |
//! | `free NAME [MS]`, `free_host NAME`, `free_async NAME` | `cudaFree` (its driver free blocks MS ms first, as a real one waits for the device; default none), `cudaFreeHost`, `cudaFreeAsync` |
//! | `cu_malloc SIZE [NAME]`, `cu_free NAME` | `cuMemAlloc_v2`, `cuMemFree_v2` directly |
//! | `vmm SIZE` | `cuMemAddressReserve`, `cuMemCreate`, `cuMemMap`, `cuMemUnmap`, `cuMemRelease`, `cuMemAddressFree`, once each |
//! | `memcpy SIZE [h2d\|d2h\|d2d\|h2h\|default]`, `memcpy_async ...` | `cudaMemcpy`, `cudaMemcpyAsync` (default h2d) |
//! | `memset SIZE`, `memset_async SIZE` | `cudaMemset`, `cudaMemsetAsync` |
//! | `launch [N]`, `cu_launch [N]`, `launch_ex [N]` | N × `cudaLaunchKernel`, `cuLaunchKernel`, `cuLaunchKernelEx`; each driver launch burns 4 µs of the thread's CPU (a real launch's host cost; since round 56) |
//! | `sync_stream`, `sync_device`, `sync_event`, `graph_launch`, `set_device [D]` | one call each |
//! | `sync_sleep MS [stream\|device\|event]` | a runtime sync whose driver sync sleeps MS ms |
//! | `sync_until PATH` | `cudaStreamSynchronize` whose driver sync blocks until PATH exists (a GPU wait of unknown length) |
//! | `spin MS [SIZE]` | `cudaMemcpy` host-to-device of SIZE bytes (default 4096) spinning MS ms of CPU |
//! | `compute MS` | MS ms of the thread's CPU time outside any CUDA call (host work: Python, data preparation) |
//! | `h2d SIZE MS [NAME]` | `cudaMemcpy` host-to-device of SIZE bytes spinning MS ms; source: the named (pinned) pointer, or a pageable `calloc` buffer |
//! | `host_register SIZE NAME` | `calloc` SIZE bytes and `cudaHostRegister` them (pinned); NAME remembers the pointer |
//! | `loaders K MS N` | K loader threads (comm `gs-loader`), each building N batches of MS ms CPU time and handing each over through a pipe |
//! | `next_batch` | read one batch from the loaders' pipe (blocks until one is ready: woken by a loader) |
//! | `churn N` | N × (`cudaMalloc` 256 B, `cudaFree`): many short calls |
//! | `pingpong N` | N round trips between two threads over pipes (2N context switches), no CUDA |
//! | `sleep MS` | plain sleep, no CUDA |
//! | `pin CPU` | `sched_setaffinity` to one CPU |
//! | `await PATH`, `touch PATH` | wait for a file to exist; create a file |
//! | `stamp PATH` | append CLOCK_MONOTONIC ns as a line to PATH (for timing a section) |
//! | `dlopen PATH` | load a runtime copy; later runtime steps call through it |
//! | `torch_malloc SIZE [NAME]` | `DeviceCachingAllocator::malloc` of the `libc10_cuda.so` stand-in (loaded by the first torch step); NAME remembers the `Block*` |
//! | `torch_free NAME` | `DeviceCachingAllocator::free` of that block |
//! | `torch_empty_cache` | `NativeCachingAllocator::emptyCache`: `release_block` + `cudaFree` per entirely free segment |
//! | `repeat N { ... }` | run the block N times |
//! | `fork { ... }` | fork; the child runs the block and exits 0; the parent waits |
//! | `spawn { ... }` | fork + exec of the workload itself with the block as its script; the parent waits |
//! | `exit CODE` | exit now with CODE |
//!
//! With `--truth PATH` every process of the scenario appends one JSON line at
//! exit ([`Truth`]): its pid, ppid, exit code, runtime calls it made, driver
//! calls the driver stand-in served in that process, and its allocations.
//! Useful for the bench and for debugging; tests compute expectations from the
//! scenario they wrote.

use std::collections::BTreeMap;
use std::io;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

/// First device pointer of a fresh process.
pub const DEVICE_BASE: u64 = 0x7f00_0000_0000;
/// First pinned-host pointer of a fresh process.
pub const HOST_BASE: u64 = 0x7e00_0000_0000;
/// First reserved virtual address range of a fresh process.
pub const VA_BASE: u64 = 0x7d00_0000_0000;
/// Alignment of every simulated allocation.
pub const ALIGN: u64 = 512;
/// Device memory when `SIM_DEVICE_BYTES` is not set (80 GiB, like an H100/A100).
pub const DEFAULT_DEVICE_BYTES: u64 = 80 << 30;
/// `cudaErrorMemoryAllocation` / `CUDA_ERROR_OUT_OF_MEMORY`.
pub const ERR_OUT_OF_MEMORY: i64 = 2;
/// The hog's process name (comm).
pub const HOG_COMM: &str = "gs-hog";
/// The caching-allocator stand-in rounds every request up to a multiple of this.
pub const TORCH_BLOCK_ROUNDING: u64 = 512;
/// Largest (rounded) request of the stand-in's small pool.
pub const TORCH_SMALL_BLOCK_MAX: u64 = 1 << 20;
/// Segment size of the small pool.
pub const TORCH_SMALL_SEGMENT: u64 = 2 << 20;
/// Segment size of the large pool for requests below [`TORCH_MIN_LARGE_ALLOC`].
pub const TORCH_LARGE_SEGMENT: u64 = 20 << 20;
/// From this request size on, a large segment is the request rounded up to [`TORCH_LARGE_ROUNDING`].
pub const TORCH_MIN_LARGE_ALLOC: u64 = 10 << 20;
/// Rounding of large segments for big requests.
pub const TORCH_LARGE_ROUNDING: u64 = 2 << 20;

const LIBCUDART: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/libcudart.so.13"));
const LIBCUDA: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/libcuda.so.1"));
const WORKLOAD: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/workload"));
const HOG: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/gs-hog"));
const LIBNCCL: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/libnccl.so.2"));
const NCCL_RANK: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/nccl_rank"));
const LIBC10_CUDA: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/libc10_cuda.so"));
const LIBC10_CUDA_ALT_LAYOUT: &[u8] =
    include_bytes!(concat!(env!("OUT_DIR"), "/libc10_cuda_alt_layout.so"));
const LIBC10_CUDA_MALLOC_NO_STREAM: &[u8] =
    include_bytes!(concat!(env!("OUT_DIR"), "/libc10_cuda_malloc_no_stream.so"));

/// Builds of the `libc10_cuda.so` stand-in (all with soname `libc10_cuda.so`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TorchStandIn {
    /// torch 2.11's signatures and `Block` layout: word 0 device, 1 stream,
    /// 2..6 stream_uses, 7 size, 8 requested_size, 9 pool, 10 ptr, 11
    /// allocated, 12 prev, 13 next.
    Torch211,
    /// The same signatures, another `Block` layout: 2 pool, 3 ptr, 4 prev,
    /// 5 size, 6 next, 9 requested_size, 10 allocated.
    AltLayout,
    /// `DeviceCachingAllocator::malloc(unsigned long)`: no stream parameter,
    /// a signature the tracer must not probe (the other three are as in torch 2.11).
    MallocWithoutStream,
}

impl TorchStandIn {
    /// Word indices of (requested_size, size, ptr) in the `Block` struct.
    pub fn block_words(self) -> (usize, usize, usize) {
        match self {
            TorchStandIn::Torch211 | TorchStandIn::MallocWithoutStream => (8, 7, 10),
            TorchStandIn::AltLayout => (9, 5, 3),
        }
    }

    fn bytes(self) -> &'static [u8] {
        match self {
            TorchStandIn::Torch211 => LIBC10_CUDA,
            TorchStandIn::AltLayout => LIBC10_CUDA_ALT_LAYOUT,
            TorchStandIn::MallocWithoutStream => LIBC10_CUDA_MALLOC_NO_STREAM,
        }
    }
}

/// Where [`materialize`] put things.
#[derive(Debug, Clone)]
pub struct SimPaths {
    /// Folder holding `libcudart.so.13` and `libcuda.so.1` (for LD_LIBRARY_PATH / `--cuda-lib`).
    pub lib_dir: PathBuf,
    pub libcudart: PathBuf,
    pub libcuda: PathBuf,
    /// The scripted workload (`bin/workload`, finds the libraries via rpath `$ORIGIN/../lib`).
    pub workload: PathBuf,
    /// The CPU hog (`bin/gs-hog CPU MS [READY_FILE]`).
    pub hog: PathBuf,
    /// The caching-allocator stand-in (`lib/libc10_cuda.so`, [`TorchStandIn::Torch211`];
    /// replace it with [`install_torch_stand_in`]).
    pub libc10_cuda: PathBuf,
    /// Folder holding the NCCL stand-in, apart from the CUDA libraries (so
    /// tests of the CUDA layers do not probe it).
    pub nccl_lib_dir: PathBuf,
    /// The NCCL stand-in (`nccl-lib/libnccl.so.2`): collectives block until every
    /// rank of the communicator has arrived (ranks rendezvous through a file
    /// in `$SIM_NCCL_DIR`).
    pub libnccl: PathBuf,
    /// One rank of a simulated data-parallel job
    /// (`bin/nccl_rank RANK NRANKS ID_FILE ITERS WORK_MS [--input-ms MS] [--cpu CPU] [--log FILE]`):
    /// per step it sleeps `--input-ms`, burns WORK_MS of CPU, then all-reduces.
    pub nccl_rank: PathBuf,
}

fn write_file(path: &Path, bytes: &[u8], mode: u32) -> io::Result<()> {
    std::fs::write(path, bytes)?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
}

/// Writes fresh copies of the simulated libraries and programs under `dir`
/// (`dir/lib/`, `dir/bin/`): new files, so new inodes, on every call.
pub fn materialize(dir: &Path) -> io::Result<SimPaths> {
    let lib_dir = dir.join("lib");
    let bin_dir = dir.join("bin");
    let nccl_lib_dir = dir.join("nccl-lib");
    std::fs::create_dir_all(&lib_dir)?;
    std::fs::create_dir_all(&nccl_lib_dir)?;
    std::fs::create_dir_all(&bin_dir)?;
    let paths = SimPaths {
        libcudart: lib_dir.join("libcudart.so.13"),
        libcuda: lib_dir.join("libcuda.so.1"),
        workload: bin_dir.join("workload"),
        hog: bin_dir.join("gs-hog"),
        libc10_cuda: lib_dir.join("libc10_cuda.so"),
        libnccl: nccl_lib_dir.join("libnccl.so.2"),
        nccl_lib_dir,
        nccl_rank: bin_dir.join("nccl_rank"),
        lib_dir,
    };
    // Remove first: rewriting a file in place keeps its inode (and would
    // corrupt a copy that a running process has mapped).
    for (path, bytes) in [
        (&paths.libcudart, LIBCUDART),
        (&paths.libcuda, LIBCUDA),
        (&paths.workload, WORKLOAD),
        (&paths.hog, HOG),
        (&paths.libc10_cuda, LIBC10_CUDA),
        (&paths.libnccl, LIBNCCL),
        (&paths.nccl_rank, NCCL_RANK),
    ] {
        replace_file(path, bytes)?;
    }
    for program in [&paths.workload, &paths.hog, &paths.nccl_rank] {
        wait_until_executable(program)?;
    }
    Ok(paths)
}

/// Linux's ETXTBSY (the same number on every architecture it runs on).
const ETXTBSY: i32 = 26;

/// How long [`wait_until_executable`] waits for a program's last writer.
const EXEC_READY_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(20);

/// Runs `program` once (no arguments, no input or output: each stand-in then
/// does nothing or prints its usage) until the kernel lets it execute.
///
/// Why: a thread of this process that forks while another writes a program
/// hands the child a copy of the write descriptor, held until the child execs
/// or exits; while any is open, exec of the program fails with ETXTBSY
/// ("Text file busy"). Test harnesses fork from many threads, and a loaded
/// machine can hold such a child for milliseconds. Our own descriptors are
/// closed by now, so once one exec succeeds none can reappear.
fn wait_until_executable(program: &Path) -> io::Result<()> {
    let start = std::time::Instant::now();
    loop {
        let spawned = std::process::Command::new(program)
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .status();
        match spawned {
            Err(e) if e.raw_os_error() == Some(ETXTBSY) => {
                if start.elapsed() > EXEC_READY_TIMEOUT {
                    return Err(e);
                }
                std::thread::sleep(std::time::Duration::from_millis(2));
            }
            Err(e) => return Err(e),
            Ok(_) => return Ok(()),
        }
    }
}

/// Writes `bytes` at `path` as a new file (a new inode), removing any old one.
fn replace_file(path: &Path, bytes: &[u8]) -> io::Result<()> {
    match std::fs::remove_file(path) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
        _ => {}
    }
    write_file(path, bytes, 0o755)
}

/// Replaces `paths.libc10_cuda` with another build of the allocator stand-in
/// (a new inode); the workload's torch steps load whichever is there.
pub fn install_torch_stand_in(paths: &SimPaths, which: TorchStandIn) -> io::Result<()> {
    replace_file(&paths.libc10_cuda, which.bytes())
}

/// Writes one more copy of the runtime library at `path` (a new inode), e.g.
/// for the workload's `dlopen` step.
pub fn copy_runtime_to(path: &Path) -> io::Result<()> {
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent)?;
    }
    let _ = std::fs::remove_file(path);
    write_file(path, LIBCUDART, 0o755)
}

fn round_up(n: u64) -> u64 {
    n.div_ceil(ALIGN) * ALIGN
}

/// The device pointers a fresh process gets for successive successful device
/// allocations of `sizes` (runtime or driver, device or managed or `cuMemCreate`),
/// by the simulated allocator's rule.
pub fn device_ptrs(sizes: &[u64]) -> Vec<u64> {
    let mut next = DEVICE_BASE;
    sizes
        .iter()
        .map(|&size| {
            if size == 0 {
                return 0;
            }
            let p = next;
            next += round_up(size);
            p
        })
        .collect()
}

/// One process's line of the workload's `--truth` file.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Truth {
    pub pid: u32,
    pub ppid: u32,
    pub exit_code: i32,
    /// Runtime calls the process made, by symbol name.
    pub runtime: BTreeMap<String, u64>,
    /// Driver calls the driver stand-in served in the process (including
    /// those the runtime made), by symbol name.
    pub driver: BTreeMap<String, u64>,
    /// Allocations: (op, size, pointer or 0, return code).
    pub allocs: Vec<Alloc>,
}

/// One allocation the workload made, as it saw it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Alloc {
    pub op: String,
    pub size: u64,
    /// The returned pointer (0 when the call failed).
    pub ptr: u64,
    pub ret: i64,
}

mod truth;
pub use truth::parse_truth;
