//! What the driver says: devices, memory, and the pids it lists, through
//! nvml-wrapper with the library loaded at run time (so the binary runs on
//! machines without a driver, and tests can point at a simulated library).

use nvml_wrapper::enums::device::UsedGpuMemory;
use nvml_wrapper::struct_wrappers::device::ProcessInfo;
use nvml_wrapper::Nvml;
use serde::Serialize;
use std::ffi::OsString;

/// Env var that overrides where `libnvidia-ml.so.1` is loaded from: a test
/// seam, honoured only by debug builds (see `Sources::from_env`).
pub const NVML_LIB_ENV: &str = "GPUSLEUTH_NVML_LIB";

/// Which NVML process list a pid came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ContextKind {
    Compute,
    Graphics,
}

/// One pid NVML lists on one device.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct NvmlProcess {
    /// Pid as NVML reports it: a pid in the host (initial) pid namespace.
    pub pid: u32,
    /// Bytes of device memory; `None` when NVML cannot say.
    pub used_bytes: Option<u64>,
    pub kind: ContextKind,
}

/// One GPU as NVML reports it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct GpuDevice {
    pub index: u32,
    pub name: String,
    pub uuid: String,
    /// `/dev/nvidiaN` minor number, when NVML gives it.
    pub minor: Option<u32>,
    pub total_bytes: u64,
    pub used_bytes: u64,
    pub free_bytes: u64,
    pub processes: Vec<NvmlProcess>,
}

/// Result of asking NVML: the devices, or why there are none.
#[derive(Debug, Clone)]
pub enum NvmlView {
    Available {
        driver: Option<String>,
        gpus: Vec<GpuDevice>,
    },
    Unavailable {
        reason: String,
    },
}

impl NvmlView {
    pub fn gpus(&self) -> &[GpuDevice] {
        match self {
            NvmlView::Available { gpus, .. } => gpus,
            NvmlView::Unavailable { .. } => &[],
        }
    }
}

/// Queries NVML. Never fails: an absent driver or library becomes `Unavailable`
/// with the reason, so the `/proc` view still works.
pub fn query(lib_path: Option<&OsString>) -> NvmlView {
    let init = match lib_path {
        Some(p) => Nvml::builder().lib_path(p.as_os_str()).init(),
        None => Nvml::init(),
    };
    let nvml = match init {
        Ok(n) => n,
        Err(e) => {
            let lib = lib_path
                .map(|p| p.to_string_lossy().into_owned())
                .unwrap_or_else(|| "libnvidia-ml.so.1".into());
            return NvmlView::Unavailable {
                reason: format!("{e} (library {lib})"),
            };
        }
    };
    match read_devices(&nvml) {
        Ok(gpus) => NvmlView::Available {
            driver: nvml.sys_driver_version().ok(),
            gpus,
        },
        Err(e) => NvmlView::Unavailable {
            reason: format!("NVML query failed: {e}"),
        },
    }
}

fn read_devices(nvml: &Nvml) -> Result<Vec<GpuDevice>, nvml_wrapper::error::NvmlError> {
    let count = nvml.device_count()?;
    let mut gpus = Vec::with_capacity(count as usize);
    for index in 0..count {
        let dev = nvml.device_by_index(index)?;
        let mem = dev.memory_info()?;
        let mut processes = Vec::new();
        // A device that cannot list one kind of context still shows the other.
        if let Ok(list) = dev.running_compute_processes() {
            processes.extend(list.into_iter().map(|p| to_proc(p, ContextKind::Compute)));
        }
        if let Ok(list) = dev.running_graphics_processes() {
            processes.extend(list.into_iter().map(|p| to_proc(p, ContextKind::Graphics)));
        }
        gpus.push(GpuDevice {
            index,
            name: dev.name().unwrap_or_else(|_| "unknown".into()),
            uuid: dev.uuid().unwrap_or_else(|_| "unknown".into()),
            minor: dev.minor_number().ok(),
            total_bytes: mem.total,
            used_bytes: mem.used,
            free_bytes: mem.free,
            processes,
        });
    }
    Ok(gpus)
}

fn to_proc(p: ProcessInfo, kind: ContextKind) -> NvmlProcess {
    NvmlProcess {
        pid: p.pid,
        used_bytes: match p.used_gpu_memory {
            UsedGpuMemory::Used(b) => Some(b),
            UsedGpuMemory::Unavailable => None,
        },
        kind,
    }
}
