//! What the GPUs are doing while a trace runs, as NVML says: device
//! utilization samples (`nvmlDeviceGetSamples(GPU_UTILIZATION_SAMPLES)`,
//! "some kernel was running" during the sample window, not SM occupancy),
//! per-process SM utilization (`nvmlDeviceGetProcessUtilization`) and the
//! device memory the driver attributes to each process
//! (`nvmlDeviceGetComputeRunningProcesses`).
//!
//! NVML keeps a short ring of samples (about 70 samples 200 ms apart on an
//! H200, so ~14 s): a caller must poll at least every few seconds or lose
//! history. Each poll asks only for samples newer than the last one seen.
//! Timestamps stay NVML's (CPU wall-clock microseconds); converting them to a
//! trace's monotonic clock is the caller's job.

use nvml_wrapper::enum_wrappers::device::Sampling;
use nvml_wrapper::enums::device::{SampleValue, UsedGpuMemory};
use nvml_wrapper::error::NvmlError;
use nvml_wrapper::Nvml;
use std::collections::HashMap;
use std::ffi::OsString;

/// One device utilization sample: the GPU was busy `busy_pct` of the window ending at `ts_us`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UtilSample {
    pub gpu: u32,
    /// NVML's CPU timestamp, microseconds since the Unix epoch.
    pub ts_us: u64,
    pub busy_pct: u32,
}

/// One per-process utilization sample.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProcessUtil {
    pub gpu: u32,
    pub pid: u32,
    pub ts_us: u64,
    pub sm_pct: u32,
}

/// Device memory NVML attributes to one process on one GPU at poll time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProcessMemory {
    pub gpu: u32,
    pub pid: u32,
    /// `None` when the driver cannot say (e.g. some containers).
    pub used_bytes: Option<u64>,
}

/// What one poll returned.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ActivityPoll {
    /// New device samples since the previous poll, oldest first per GPU.
    pub samples: Vec<UtilSample>,
    /// New per-process utilization samples since the previous poll.
    pub process_util: Vec<ProcessUtil>,
    /// Every compute/graphics process NVML lists now.
    pub process_memory: Vec<ProcessMemory>,
    /// The poll's wall-clock time (microseconds since the epoch), for memory readings.
    pub now_us: u64,
}

/// What the driver cannot give on this machine: said once, in words.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Unsupported {
    /// Device utilization samples unavailable, with NVML's reason.
    pub samples: Option<String>,
    /// Per-process utilization unavailable, with NVML's reason.
    pub process_util: Option<String>,
    /// Per-process memory unavailable, with NVML's reason.
    pub process_memory: Option<String>,
}

/// An open NVML session that remembers the last sample seen per device.
pub struct ActivitySampler {
    nvml: Nvml,
    gpus: u32,
    last_sample_us: HashMap<u32, u64>,
    last_process_us: HashMap<u32, u64>,
    unsupported: Unsupported,
}

fn wall_us() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_micros() as u64)
        .unwrap_or(0)
}

/// "No sample newer than lastSeen" is how NVML says "nothing new".
fn empty_if_not_found<T>(r: Result<Vec<T>, NvmlError>) -> Result<Vec<T>, NvmlError> {
    match r {
        Err(NvmlError::NotFound) => Ok(Vec::new()),
        other => other,
    }
}

fn sample_pct(v: &SampleValue) -> u32 {
    let pct = match *v {
        SampleValue::U32(x) => u64::from(x),
        SampleValue::U64(x) => x,
        SampleValue::I64(x) => x.max(0) as u64,
        SampleValue::F64(x) if x.is_finite() && x > 0.0 => x.round() as u64,
        SampleValue::F64(_) => 0,
    };
    pct.min(100) as u32
}

impl ActivitySampler {
    /// Opens NVML (`lib`: an explicit library, else the system's). Samples
    /// older than `since_us` (wall-clock microseconds) are never returned.
    pub fn open(lib: Option<&OsString>, since_us: u64) -> Result<ActivitySampler, String> {
        let nvml = match lib {
            Some(p) => Nvml::builder().lib_path(p.as_os_str()).init(),
            None => Nvml::init(),
        }
        .map_err(|e| {
            let lib = lib
                .map(|p| p.to_string_lossy().into_owned())
                .unwrap_or_else(|| "libnvidia-ml.so.1".into());
            format!("NVML unavailable: {e} (library {lib})")
        })?;
        let gpus = nvml
            .device_count()
            .map_err(|e| format!("NVML cannot count devices: {e}"))?;
        Ok(ActivitySampler {
            nvml,
            gpus,
            last_sample_us: (0..gpus).map(|g| (g, since_us)).collect(),
            last_process_us: (0..gpus).map(|g| (g, since_us)).collect(),
            unsupported: Unsupported::default(),
        })
    }

    /// Number of GPUs NVML sees.
    pub fn gpu_count(&self) -> u32 {
        self.gpus
    }

    /// What the driver refused so far (each kind remembered once; not asked again).
    pub fn unsupported(&self) -> &Unsupported {
        &self.unsupported
    }

    /// Reads everything new. A device that fails one query still answers the others.
    pub fn poll(&mut self) -> ActivityPoll {
        let mut out = ActivityPoll {
            now_us: wall_us(),
            ..Default::default()
        };
        for gpu in 0..self.gpus {
            let Ok(dev) = self.nvml.device_by_index(gpu) else {
                continue;
            };
            if self.unsupported.samples.is_none() {
                let last = self.last_sample_us.get(&gpu).copied().unwrap_or(0);
                match empty_if_not_found(dev.samples(Sampling::GpuUtilization, last)) {
                    Ok(list) => {
                        for s in list.iter().filter(|s| s.timestamp > last) {
                            out.samples.push(UtilSample {
                                gpu,
                                ts_us: s.timestamp,
                                busy_pct: sample_pct(&s.value),
                            });
                        }
                        if let Some(max) = list.iter().map(|s| s.timestamp).max() {
                            self.last_sample_us.insert(gpu, max.max(last));
                        }
                    }
                    Err(e) => self.unsupported.samples = Some(e.to_string()),
                }
            }
            if self.unsupported.process_util.is_none() {
                let last = self.last_process_us.get(&gpu).copied().unwrap_or(0);
                match empty_if_not_found(dev.process_utilization_stats(last)) {
                    Ok(list) => {
                        for s in list.iter().filter(|s| s.timestamp > last) {
                            out.process_util.push(ProcessUtil {
                                gpu,
                                pid: s.pid,
                                ts_us: s.timestamp,
                                sm_pct: s.sm_util.min(100),
                            });
                        }
                        if let Some(max) = list.iter().map(|s| s.timestamp).max() {
                            self.last_process_us.insert(gpu, max.max(last));
                        }
                    }
                    Err(e) => self.unsupported.process_util = Some(e.to_string()),
                }
            }
            let mut listed = Vec::new();
            let mut failures = Vec::new();
            match dev.running_compute_processes() {
                Ok(l) => listed.extend(l),
                Err(e) => failures.push(e.to_string()),
            }
            if let Ok(l) = dev.running_graphics_processes() {
                listed.extend(l);
            }
            if listed.is_empty()
                && !failures.is_empty()
                && self.unsupported.process_memory.is_none()
            {
                self.unsupported.process_memory = Some(failures.join("; "));
            }
            // A process with both a compute and a graphics context is listed twice: one figure.
            let mut seen: HashMap<u32, Option<u64>> = HashMap::new();
            for p in listed {
                let bytes = match p.used_gpu_memory {
                    UsedGpuMemory::Used(b) => Some(b),
                    UsedGpuMemory::Unavailable => None,
                };
                let e = seen.entry(p.pid).or_insert(bytes);
                *e = (*e).max(bytes);
            }
            let mut mem: Vec<ProcessMemory> = seen
                .into_iter()
                .map(|(pid, used_bytes)| ProcessMemory {
                    gpu,
                    pid,
                    used_bytes,
                })
                .collect();
            mem.sort_by_key(|m| m.pid);
            out.process_memory.extend(mem);
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sample_values_become_percentages() {
        assert_eq!(sample_pct(&SampleValue::U32(37)), 37);
        assert_eq!(sample_pct(&SampleValue::U64(250)), 100);
        assert_eq!(sample_pct(&SampleValue::I64(-3)), 0);
        assert_eq!(sample_pct(&SampleValue::F64(12.6)), 13);
        assert_eq!(sample_pct(&SampleValue::F64(f64::NAN)), 0);
    }

    #[test]
    fn not_found_means_nothing_new() {
        let r: Result<Vec<u8>, NvmlError> = Err(NvmlError::NotFound);
        assert_eq!(empty_if_not_found(r).unwrap(), Vec::<u8>::new());
        let r: Result<Vec<u8>, NvmlError> = Err(NvmlError::NotSupported);
        assert!(empty_if_not_found(r).is_err());
    }
}
