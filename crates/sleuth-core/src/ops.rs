//! The CUDA entry points gpusleuth probes, and what each argument means.
//!
//! One table drives everything: which symbols are attached, what the kernel
//! side reads (the attach cookie carries the op id and the out-pointer
//! argument), and how user space decodes sizes, pointers and copy kinds.

use serde::Serialize;

/// The library an op lives in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, PartialOrd, Ord)]
#[serde(rename_all = "lowercase")]
pub enum Layer {
    /// `libcudart.so*`, the CUDA runtime API.
    Runtime,
    /// `libcuda.so.1`, the CUDA driver API.
    Driver,
    /// PyTorch's CUDA caching allocator in `libc10_cuda.so` (opt-in: `trace --torch-allocator`).
    Torch,
    /// `libnccl.so.2`, NVIDIA's collective communication library.
    Nccl,
}

impl Layer {
    pub fn as_str(self) -> &'static str {
        match self {
            Layer::Runtime => "runtime",
            Layer::Driver => "driver",
            Layer::Torch => "torch",
            Layer::Nccl => "nccl",
        }
    }
    pub fn parse(s: &str) -> Option<Layer> {
        match s {
            "runtime" => Some(Layer::Runtime),
            "driver" => Some(Layer::Driver),
            "torch" => Some(Layer::Torch),
            "nccl" => Some(Layer::Nccl),
            _ => None,
        }
    }
}

/// What an op does to memory or time; drives the ledger and the findings.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum OpClass {
    /// Allocates device memory (counted in the ledger).
    DeviceAlloc,
    /// Releases device memory.
    DeviceFree,
    /// Allocates managed (unified) memory, reported apart from device memory.
    ManagedAlloc,
    /// Allocates page-locked host memory, reported apart from device memory.
    HostAlloc,
    /// Releases page-locked host memory.
    HostFree,
    /// Page-locks an existing host range (`cudaHostRegister`): pinned, not allocated.
    HostRegister,
    /// Undoes a `HostRegister`.
    HostUnregister,
    /// Creates a physical allocation of the virtual memory API (`cuMemCreate`).
    PhysCreate,
    /// Releases a physical allocation (`cuMemRelease`).
    PhysRelease,
    /// Maps/unmaps/reserves virtual address ranges (no memory by itself).
    VirtualMap,
    Copy,
    Memset,
    Sync,
    Launch,
    /// A caching-allocator block handed out (`DeviceCachingAllocator::malloc`).
    BlockAlloc,
    /// A caching-allocator block given back to the cache (`DeviceCachingAllocator::free`).
    BlockFree,
    /// A whole cached segment returned to CUDA (`DeviceCachingAllocator::release_block`).
    BlockRelease,
    /// An NCCL collective (`ncclAllReduce`, ...): every rank of the communicator takes part.
    Collective,
    /// NCCL point-to-point (`ncclSend`, `ncclRecv`).
    PointToPoint,
    /// `ncclGroupStart` / `ncclGroupEnd`.
    Group,
    /// Creates an NCCL communicator (`ncclCommInitRank`, `ncclCommSplit`, ...).
    CommInit,
    /// Ends an NCCL communicator (`ncclCommDestroy`, `ncclCommAbort`).
    CommEnd,
    Other,
}

/// Whether a call queued kernels on the GPU: a kernel or graph launch, an
/// NCCL collective or point-to-point call, that did not fail. After a sync,
/// the GPU has the thread's work again from the first of these
/// (`sync_stall`'s stretch ends there). Copies and memsets are not: their
/// GPU time is not known, and a small one (`x.cuda(non_blocking=True)` of
/// a few KB) keeps the GPU busy for microseconds (round 56's tester: a 4 KB
/// copy at the top of each step hid a 30% stall).
pub fn queues_kernels(c: &crate::CallEvent) -> bool {
    c.info().is_some_and(|i| {
        matches!(
            i.class,
            OpClass::Launch | OpClass::Collective | OpClass::PointToPoint
        ) || i.name == "cudaGraphLaunch"
    }) && !c.failed()
}

/// Static description of one probed entry point.
#[derive(Debug, Clone, Copy)]
pub struct OpInfo {
    pub id: u16,
    pub name: &'static str,
    pub layer: Layer,
    pub class: OpClass,
    /// 1-based index of an out-pointer argument read at return (0: none).
    pub out_arg: u8,
    /// 0-based index of the byte-count argument, if any.
    pub size_arg: Option<u8>,
    /// 0-based index of the pointer/handle argument an op consumes (frees, copies' destination).
    pub ptr_arg: Option<u8>,
    /// 0-based index of the stream argument, if passed in a register.
    pub stream_arg: Option<u8>,
    /// 0-based index of the `cudaMemcpyKind` argument, if any.
    pub kind_arg: Option<u8>,
    /// Whether the function returns a status (`cudaError_t` / `CUresult`).
    /// False for functions that return nothing (`void`) or something else (a
    /// pointer): what the return register holds is then no error code, so
    /// such calls never count as failed.
    pub returns_status: bool,
}

macro_rules! op {
    ($id:expr, $name:expr, $layer:ident, $class:ident, out=$out:expr, size=$size:expr, ptr=$ptr:expr, stream=$stream:expr, kind=$kind:expr) => {
        op!(
            $id,
            $name,
            $layer,
            $class,
            out = $out,
            size = $size,
            ptr = $ptr,
            stream = $stream,
            kind = $kind,
            status = true
        )
    };
    ($id:expr, $name:expr, $layer:ident, $class:ident, out=$out:expr, size=$size:expr, ptr=$ptr:expr, stream=$stream:expr, kind=$kind:expr, status=$status:expr) => {
        OpInfo {
            id: $id,
            name: $name,
            layer: Layer::$layer,
            class: OpClass::$class,
            out_arg: $out,
            size_arg: $size,
            ptr_arg: $ptr,
            stream_arg: $stream,
            kind_arg: $kind,
            returns_status: $status,
        }
    };
}

/// Every op gpusleuth knows, runtime first. Ids are stable: they are stored in traces.
#[rustfmt::skip] // one op a row: the table reads (and diffs) as a table
pub const OPS: &[OpInfo] = &[
    op!(1, "cudaMalloc", Runtime, DeviceAlloc, out = 1, size = Some(1), ptr = None, stream = None, kind = None),
    op!(2, "cudaFree", Runtime, DeviceFree, out = 0, size = None, ptr = Some(0), stream = None, kind = None),
    op!(3, "cudaMallocManaged", Runtime, ManagedAlloc, out = 1, size = Some(1), ptr = None, stream = None, kind = None),
    op!(4, "cudaMallocHost", Runtime, HostAlloc, out = 1, size = Some(1), ptr = None, stream = None, kind = None),
    op!(5, "cudaHostAlloc", Runtime, HostAlloc, out = 1, size = Some(1), ptr = None, stream = None, kind = None),
    op!(6, "cudaFreeHost", Runtime, HostFree, out = 0, size = None, ptr = Some(0), stream = None, kind = None),
    op!(7, "cudaMallocAsync", Runtime, DeviceAlloc, out = 1, size = Some(1), ptr = None, stream = Some(2), kind = None),
    op!(8, "cudaFreeAsync", Runtime, DeviceFree, out = 0, size = None, ptr = Some(0), stream = Some(1), kind = None),
    op!(9, "cudaMemcpy", Runtime, Copy, out = 0, size = Some(2), ptr = Some(0), stream = None, kind = Some(3)),
    op!(10, "cudaMemcpyAsync", Runtime, Copy, out = 0, size = Some(2), ptr = Some(0), stream = Some(4), kind = Some(3)),
    op!(11, "cudaMemset", Runtime, Memset, out = 0, size = Some(2), ptr = Some(0), stream = None, kind = None),
    op!(12, "cudaMemsetAsync", Runtime, Memset, out = 0, size = Some(2), ptr = Some(0), stream = Some(3), kind = None),
    op!(13, "cudaLaunchKernel", Runtime, Launch, out = 0, size = None, ptr = Some(0), stream = None, kind = None),
    op!(14, "cudaStreamSynchronize", Runtime, Sync, out = 0, size = None, ptr = None, stream = Some(0), kind = None),
    op!(15, "cudaDeviceSynchronize", Runtime, Sync, out = 0, size = None, ptr = None, stream = None, kind = None),
    op!(16, "cudaEventSynchronize", Runtime, Sync, out = 0, size = None, ptr = Some(0), stream = None, kind = None),
    op!(17, "cudaGraphLaunch", Runtime, Other, out = 0, size = None, ptr = Some(0), stream = Some(1), kind = None),
    // The device ordinal, kept in the call's `ptr` field (the ledger follows it).
    op!(18, "cudaSetDevice", Runtime, Other, out = 0, size = None, ptr = Some(0), stream = None, kind = None),
    op!(19, "cudaHostRegister", Runtime, HostRegister, out = 0, size = Some(1), ptr = Some(0), stream = None, kind = None),
    op!(20, "cudaHostUnregister", Runtime, HostUnregister, out = 0, size = None, ptr = Some(0), stream = None, kind = None),
    op!(32, "cuMemAlloc_v2", Driver, DeviceAlloc, out = 1, size = Some(1), ptr = None, stream = None, kind = None),
    op!(33, "cuMemFree_v2", Driver, DeviceFree, out = 0, size = None, ptr = Some(0), stream = None, kind = None),
    op!(34, "cuMemAllocManaged", Driver, ManagedAlloc, out = 1, size = Some(1), ptr = None, stream = None, kind = None),
    op!(35, "cuMemAllocHost_v2", Driver, HostAlloc, out = 1, size = Some(1), ptr = None, stream = None, kind = None),
    op!(36, "cuMemCreate", Driver, PhysCreate, out = 1, size = Some(1), ptr = None, stream = None, kind = None),
    op!(37, "cuMemRelease", Driver, PhysRelease, out = 0, size = None, ptr = Some(0), stream = None, kind = None),
    op!(38, "cuMemMap", Driver, VirtualMap, out = 0, size = Some(1), ptr = Some(0), stream = None, kind = None),
    op!(39, "cuMemUnmap", Driver, VirtualMap, out = 0, size = Some(1), ptr = Some(0), stream = None, kind = None),
    op!(40, "cuMemAddressReserve", Driver, VirtualMap, out = 1, size = Some(1), ptr = None, stream = None, kind = None),
    op!(41, "cuMemAllocAsync", Driver, DeviceAlloc, out = 1, size = Some(1), ptr = None, stream = Some(2), kind = None),
    op!(42, "cuMemFreeAsync", Driver, DeviceFree, out = 0, size = None, ptr = Some(0), stream = Some(1), kind = None),
    op!(43, "cuLaunchKernel", Driver, Launch, out = 0, size = None, ptr = Some(0), stream = None, kind = None),
    op!(44, "cuLaunchKernelEx", Driver, Launch, out = 0, size = None, ptr = Some(1), stream = None, kind = None),
    op!(45, "cuMemcpy", Driver, Copy, out = 0, size = Some(2), ptr = Some(0), stream = None, kind = None),
    op!(46, "cuMemcpyAsync", Driver, Copy, out = 0, size = Some(2), ptr = Some(0), stream = Some(3), kind = None),
    op!(47, "cuMemcpyHtoD_v2", Driver, Copy, out = 0, size = Some(2), ptr = Some(0), stream = None, kind = None),
    op!(48, "cuMemcpyDtoH_v2", Driver, Copy, out = 0, size = Some(2), ptr = Some(0), stream = None, kind = None),
    op!(49, "cuMemcpyDtoD_v2", Driver, Copy, out = 0, size = Some(2), ptr = Some(0), stream = None, kind = None),
    op!(50, "cuMemcpyHtoDAsync_v2", Driver, Copy, out = 0, size = Some(2), ptr = Some(0), stream = Some(3), kind = None),
    op!(51, "cuMemcpyDtoHAsync_v2", Driver, Copy, out = 0, size = Some(2), ptr = Some(0), stream = Some(3), kind = None),
    op!(52, "cuMemcpyDtoDAsync_v2", Driver, Copy, out = 0, size = Some(2), ptr = Some(0), stream = Some(3), kind = None),
    op!(53, "cuCtxSynchronize", Driver, Sync, out = 0, size = None, ptr = None, stream = None, kind = None),
    op!(54, "cuStreamSynchronize", Driver, Sync, out = 0, size = None, ptr = None, stream = Some(0), kind = None),
    op!(55, "cuEventSynchronize", Driver, Sync, out = 0, size = None, ptr = Some(0), stream = None, kind = None),
    op!(56, "cuMemFreeHost", Driver, HostFree, out = 0, size = None, ptr = Some(0), stream = None, kind = None),
    op!(57, "cuMemAddressFree", Driver, VirtualMap, out = 0, size = Some(1), ptr = Some(0), stream = None, kind = None),
    op!(58, "cuMemHostRegister_v2", Driver, HostRegister, out = 0, size = Some(1), ptr = Some(0), stream = None, kind = None),
    op!(59, "cuMemHostUnregister", Driver, HostUnregister, out = 0, size = None, ptr = Some(0), stream = None, kind = None),
    // PyTorch caching allocator (libc10_cuda.so, `.symtab`), found by demangled
    // name and signature (sleuth-probe's torch_symbols). Member functions: arg 0
    // is `this`. The kernel side also reads the Block struct (see gs_block).
    // They return a Block* or nothing, not a status.
    op!(64, "DeviceCachingAllocator::malloc", Torch, BlockAlloc, out = 0, size = Some(1), ptr = None, stream = Some(2), kind = None, status = false),
    op!(65, "DeviceCachingAllocator::free", Torch, BlockFree, out = 0, size = None, ptr = Some(1), stream = None, kind = None, status = false),
    op!(66, "DeviceCachingAllocator::release_block", Torch, BlockRelease, out = 0, size = None, ptr = Some(1), stream = None, kind = None, status = false),
    op!(67, "NativeCachingAllocator::emptyCache", Torch, Other, out = 0, size = None, ptr = None, stream = None, kind = None, status = false),
    // NCCL (libnccl.so.2, 2.28's exported ABI). The communicator, counts,
    // datatypes and stack-passed arguments are described by `nccl::args_of`;
    // the kernel side adds the caller's stack words (GS_COOKIE_NCCL).
    op!(80, "ncclCommInitRank", Nccl, CommInit, out = 1, size = None, ptr = None, stream = None, kind = None),
    op!(81, "ncclCommInitRankConfig", Nccl, CommInit, out = 1, size = None, ptr = None, stream = None, kind = None),
    op!(82, "ncclCommInitAll", Nccl, CommInit, out = 1, size = None, ptr = None, stream = None, kind = None),
    op!(83, "ncclCommSplit", Nccl, CommInit, out = 4, size = None, ptr = None, stream = None, kind = None),
    op!(84, "ncclCommDestroy", Nccl, CommEnd, out = 0, size = None, ptr = None, stream = None, kind = None),
    op!(85, "ncclCommAbort", Nccl, CommEnd, out = 0, size = None, ptr = None, stream = None, kind = None),
    op!(86, "ncclAllReduce", Nccl, Collective, out = 0, size = None, ptr = None, stream = None, kind = None),
    op!(87, "ncclAllGather", Nccl, Collective, out = 0, size = None, ptr = None, stream = None, kind = None),
    op!(88, "ncclReduceScatter", Nccl, Collective, out = 0, size = None, ptr = None, stream = None, kind = None),
    op!(89, "ncclBroadcast", Nccl, Collective, out = 0, size = None, ptr = None, stream = None, kind = None),
    op!(90, "ncclReduce", Nccl, Collective, out = 0, size = None, ptr = None, stream = None, kind = None),
    op!(91, "ncclSend", Nccl, PointToPoint, out = 0, size = None, ptr = None, stream = None, kind = None),
    op!(92, "ncclRecv", Nccl, PointToPoint, out = 0, size = None, ptr = None, stream = None, kind = None),
    op!(93, "ncclGroupStart", Nccl, Group, out = 0, size = None, ptr = None, stream = None, kind = None),
    op!(94, "ncclGroupEnd", Nccl, Group, out = 0, size = None, ptr = None, stream = None, kind = None),
];

/// Looks an op up by id.
pub fn op_by_id(id: u16) -> Option<&'static OpInfo> {
    OPS.iter().find(|o| o.id == id)
}

/// Looks an op up by its exact symbol name.
pub fn op_by_name(name: &str) -> Option<&'static OpInfo> {
    OPS.iter().find(|o| o.name == name)
}

/// A set of this build's ops, by id: a per-call test of membership without
/// comparing names (a window's pass tests each of its calls against two
/// sets of op names: 2.4% of ten seconds of the bench's trace, round 43).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct OpSet([u64; 4]);

/// Every op id of [`OPS`] is below [`OpSet`]'s capacity.
const _: () = {
    let mut i = 0;
    while i < OPS.len() {
        assert!(OPS[i].id < 256, "an op id past OpSet's capacity");
        i += 1;
    }
};

impl OpSet {
    /// The ops of these names (names this build does not know: none).
    pub fn of_names<'a>(names: impl IntoIterator<Item = &'a str>) -> OpSet {
        let mut set = OpSet::default();
        for info in names.into_iter().filter_map(op_by_name) {
            set.0[usize::from(info.id / 64)] |= 1 << (info.id % 64);
        }
        set
    }

    /// Whether op `id` is in the set (an id past [`OPS`]' never is).
    pub fn contains(&self, id: u16) -> bool {
        self.0
            .get(usize::from(id / 64))
            .is_some_and(|w| w & (1 << (id % 64)) != 0)
    }
}

/// Ops of one layer.
pub fn ops_of(layer: Layer) -> impl Iterator<Item = &'static OpInfo> {
    OPS.iter().filter(move |o| o.layer == layer)
}

/// CUDA `cudaMemcpyKind` names.
pub fn memcpy_kind_name(kind: u64) -> &'static str {
    match kind {
        0 => "HostToHost",
        1 => "HostToDevice",
        2 => "DeviceToHost",
        3 => "DeviceToDevice",
        4 => "Default",
        _ => "Unknown",
    }
}

/// Direction of a driver copy op, from its name.
pub fn driver_copy_kind(name: &str) -> Option<&'static str> {
    if name.contains("HtoD") {
        Some("HostToDevice")
    } else if name.contains("DtoH") {
        Some("DeviceToHost")
    } else if name.contains("DtoD") {
        Some("DeviceToDevice")
    } else {
        None
    }
}

/// 0-based index of the host-side pointer argument of a copy: the source of a
/// host-to-device copy, the destination of a device-to-host one. None for
/// other ops and for copies whose direction the arguments do not say
/// (`cudaMemcpyDefault`, `cuMemcpy`: unified addressing decides at run time).
pub fn host_ptr_arg(info: &OpInfo, kind: Option<u64>) -> Option<u8> {
    if info.class != OpClass::Copy {
        return None;
    }
    let direction = match info.layer {
        Layer::Runtime => memcpy_kind_name(kind?),
        _ => driver_copy_kind(info.name)?,
    };
    match direction {
        "HostToDevice" => Some(1),
        "DeviceToHost" => Some(0),
        _ => None,
    }
}

/// Whether an op's return code means failure (cudaSuccess / CUDA_SUCCESS are 0).
pub fn is_error(ret: i64) -> bool {
    ret != 0
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    #[test]
    fn an_op_set_holds_the_ops_of_its_names_and_no_other() {
        let names = ["cudaMemcpy", "cuMemcpyHtoD_v2", "ncclGroupEnd", "notAnOp"];
        let set = OpSet::of_names(names);
        for o in OPS {
            assert_eq!(set.contains(o.id), names.contains(&o.name), "{}", o.name);
        }
        for id in [0, 63, 64, 255, 256, 1000, u16::MAX] {
            assert!(!set.contains(id), "{id}");
        }
        assert_eq!(OpSet::of_names([]), OpSet::default());
    }

    #[test]
    fn ids_and_names_are_unique() {
        let ids: HashSet<_> = OPS.iter().map(|o| o.id).collect();
        let names: HashSet<_> = OPS.iter().map(|o| o.name).collect();
        assert_eq!(ids.len(), OPS.len());
        assert_eq!(names.len(), OPS.len());
    }

    #[test]
    fn layers_follow_symbol_prefixes() {
        for o in OPS {
            match o.layer {
                Layer::Runtime => assert!(o.name.starts_with("cuda"), "{}", o.name),
                Layer::Driver => assert!(
                    o.name.starts_with("cu") && !o.name.starts_with("cuda"),
                    "{}",
                    o.name
                ),
                Layer::Torch => assert!(o.name.contains("CachingAllocator::"), "{}", o.name),
                Layer::Nccl => assert!(o.name.starts_with("nccl"), "{}", o.name),
            }
        }
    }

    #[test]
    fn allocations_read_their_pointer_at_return() {
        for o in OPS {
            if matches!(
                o.class,
                OpClass::DeviceAlloc
                    | OpClass::ManagedAlloc
                    | OpClass::HostAlloc
                    | OpClass::PhysCreate
            ) {
                assert_eq!(o.out_arg, 1, "{}", o.name);
                assert_eq!(o.size_arg, Some(1), "{}", o.name);
            }
            // NCCL records (gs_nccl) read any of args 1..6; calls 1..3.
            let max_out = if o.layer == Layer::Nccl { 6 } else { 3 };
            assert!(
                o.out_arg <= max_out,
                "the kernel side reads out-pointers from args 1..{max_out} only"
            );
        }
    }

    #[test]
    fn only_functions_that_return_a_status_can_fail() {
        let void: Vec<&str> = OPS
            .iter()
            .filter(|o| !o.returns_status)
            .map(|o| o.name)
            .collect();
        // Every CUDA runtime/driver entry point returns cudaError_t/CUresult;
        // the caching allocator's members return a Block* or nothing.
        assert!(void.contains(&"NativeCachingAllocator::emptyCache"));
        assert!(OPS
            .iter()
            .all(|o| o.returns_status == (o.layer != Layer::Torch)));
    }

    #[test]
    fn host_side_of_copies() {
        let rt = op_by_name("cudaMemcpyAsync").unwrap();
        assert_eq!(host_ptr_arg(rt, Some(1)), Some(1)); // H2D: the source
        assert_eq!(host_ptr_arg(rt, Some(2)), Some(0)); // D2H: the destination
        assert_eq!(host_ptr_arg(rt, Some(3)), None);
        assert_eq!(host_ptr_arg(rt, Some(4)), None); // default: decided at run time
        assert_eq!(host_ptr_arg(rt, None), None);
        let htod = op_by_name("cuMemcpyHtoDAsync_v2").unwrap();
        assert_eq!(host_ptr_arg(htod, None), Some(1));
        let dtoh = op_by_name("cuMemcpyDtoH_v2").unwrap();
        assert_eq!(host_ptr_arg(dtoh, None), Some(0));
        assert_eq!(host_ptr_arg(op_by_name("cuMemcpy").unwrap(), None), None);
        assert_eq!(
            host_ptr_arg(op_by_name("cudaMalloc").unwrap(), Some(1)),
            None
        );
    }

    #[test]
    fn lookups() {
        assert_eq!(op_by_name("cuLaunchKernelEx").unwrap().id, 44);
        assert_eq!(op_by_id(1).unwrap().name, "cudaMalloc");
        assert!(op_by_id(999).is_none());
        assert_eq!(
            ops_of(Layer::Driver).count(),
            OPS.iter().filter(|o| o.layer == Layer::Driver).count()
        );
    }
}
