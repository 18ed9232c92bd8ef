//! `trace`'s GPU activity sampler: its own thread polls NVML every second
//! (NVML keeps only ~14 s of 200 ms samples on an H200) and sends to the
//! writer the device busy samples, per-process SM use and the device memory
//! the driver attributes to each traced process. The baseline (`start`) is
//! read synchronously when tracing begins, before the traced command runs
//! or right after `--pid` processes are marked traced; `end` readings when
//! the trace stops, and for a process as soon as NVML stops listing it.
//!
//! Without NVML nothing is sampled and the trace says so in a note; every
//! view then says "not measured".

use crate::metrics::Metrics;
use sleuth_core::gpu_activity::nvml_us_to_trace_ns;
use sleuth_core::held::PROCESS_POLLS_STAT;
use sleuth_core::{GpuSample, ProcessGpuSample, SamplePhase};
use sleuth_gpu::activity::{ActivityPoll, ActivitySampler};
use sleuth_store::{NoteLevel, WriterHandle};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

/// Time between polls: well inside NVML's sample history.
pub const POLL_INTERVAL: Duration = Duration::from_secs(1);

/// Which NVML-listed processes belong to the trace.
#[derive(Debug, Clone)]
pub enum Scope {
    /// Every process (the all-processes mode), except the tracer itself.
    All,
    /// The traced pids, kept current by the capture loop.
    Pids(HashSet<u32>),
}

impl Scope {
    fn contains(&self, pid: u32) -> bool {
        match self {
            Scope::All => pid != std::process::id(),
            Scope::Pids(p) => p.contains(&pid),
        }
    }
}

/// Turns NVML readings into trace rows; pure apart from the clock offset it is given.
struct Converter {
    realtime_offset_ns: i64,
    /// Last device sample per GPU (trace ns), for each sample's period.
    last_sample_ns: HashMap<u32, u64>,
    /// Last stored period per GPU.
    last_period_ns: HashMap<u32, u64>,
    /// (gpu, pid) listed at the previous poll.
    listed: HashSet<(u32, u32)>,
    /// (gpu, pid) ever given a reading.
    seen: HashSet<(u32, u32)>,
    /// (gpu, pid) already given an `end` row (gone from NVML's list).
    closed: HashSet<(u32, u32)>,
    polls_with_memory: u64,
}

impl Converter {
    fn new(realtime_offset_ns: i64) -> Converter {
        Converter {
            realtime_offset_ns,
            last_sample_ns: HashMap::new(),
            last_period_ns: HashMap::new(),
            listed: HashSet::new(),
            seen: HashSet::new(),
            closed: HashSet::new(),
            polls_with_memory: 0,
        }
    }

    /// Device samples with their period: the gap to the previous sample of
    /// the same GPU, or for a GPU's first sample the gap to its second.
    fn device_samples(&mut self, poll: &ActivityPoll) -> Vec<GpuSample> {
        let mut by_gpu: BTreeMap<u32, Vec<(u64, u32)>> = BTreeMap::new();
        for s in &poll.samples {
            if let Some(ts) = nvml_us_to_trace_ns(s.ts_us, self.realtime_offset_ns) {
                by_gpu.entry(s.gpu).or_default().push((ts, s.busy_pct));
            }
        }
        let mut out = Vec::new();
        for (gpu, mut list) in by_gpu {
            list.sort_unstable();
            list.dedup_by_key(|s| s.0);
            for i in 0..list.len() {
                let (ts, pct) = list[i];
                let prev = match self.last_sample_ns.get(&gpu) {
                    Some(&p) if p < ts => Some(p),
                    _ => None,
                };
                let period = match (prev, list.get(i + 1)) {
                    (Some(p), _) => ts - p,
                    (None, Some(&(next, _))) => next - ts,
                    // A lone first sample: its period is unknown until the next
                    // poll; NVML's default window is kept out of the data.
                    (None, None) => 0,
                };
                // NVML once stamped a sample 0.14 ms after the previous one on the
                // H200 (docs/gpu-runs.md): a re-report of the same window, not a
                // 0.14 ms window of its own. Kept out rather than given a period.
                let usual = self.last_period_ns.get(&gpu).copied().unwrap_or(0);
                if prev.is_some() && period < usual / 2 {
                    continue;
                }
                self.last_sample_ns.insert(gpu, ts);
                if period > 0 {
                    self.last_period_ns.insert(gpu, period);
                    out.push(GpuSample {
                        ts_ns: ts,
                        gpu,
                        busy_pct: f64::from(pct),
                        period_ns: period,
                    });
                }
            }
        }
        out
    }

    /// Per-process rows for the processes in `scope`: memory from the
    /// listing, SM use from the newest utilization sample of that poll.
    fn process_rows(
        &mut self,
        poll: &ActivityPoll,
        scope: &Scope,
        phase: SamplePhase,
        now_ns: u64,
    ) -> Vec<ProcessGpuSample> {
        let mut sm: HashMap<(u32, u32), (u64, u32)> = HashMap::new();
        for u in &poll.process_util {
            let e = sm.entry((u.gpu, u.pid)).or_insert((u.ts_us, u.sm_pct));
            if u.ts_us >= e.0 {
                *e = (u.ts_us, u.sm_pct);
            }
        }
        let mut rows = Vec::new();
        let mut listed = HashSet::new();
        for m in poll.process_memory.iter().filter(|m| scope.contains(m.pid)) {
            let key = (m.gpu, m.pid);
            listed.insert(key);
            self.seen.insert(key);
            self.closed.remove(&key);
            rows.push(ProcessGpuSample {
                ts_ns: now_ns,
                gpu: m.gpu,
                pid: m.pid,
                used_bytes: m.used_bytes,
                sm_pct: sm.get(&key).map(|&(_, p)| f64::from(p)),
                phase,
            });
        }
        // Listed before, gone now (exited, or released its context): it holds nothing.
        let mut gone: Vec<(u32, u32)> = if phase == SamplePhase::End {
            self.seen.difference(&listed).copied().collect()
        } else {
            self.listed.difference(&listed).copied().collect()
        };
        gone.retain(|k| !self.closed.contains(k));
        for (gpu, pid) in gone {
            self.closed.insert((gpu, pid));
            rows.push(ProcessGpuSample {
                ts_ns: now_ns,
                gpu,
                pid,
                used_bytes: Some(0),
                sm_pct: None,
                phase: SamplePhase::End,
            });
        }
        self.listed = listed;
        self.polls_with_memory += 1;
        rows.sort_by_key(|r| (r.gpu, r.pid));
        rows
    }
}

/// The running sampler; [`GpuSampler::finish`] takes the `end` readings.
pub struct GpuSampler {
    stop: mpsc::Sender<()>,
    thread: Option<JoinHandle<(ActivitySampler, Converter)>>,
    scope: Arc<Mutex<Scope>>,
    /// Swapped when `trace --rotate` opens the next file.
    handle: Arc<Mutex<WriterHandle>>,
    metrics: Option<Arc<Metrics>>,
}

/// The writer handle samples go to now (a poisoned lock still holds a valid handle).
fn current(h: &Mutex<WriterHandle>) -> WriterHandle {
    h.lock().unwrap_or_else(|p| p.into_inner()).clone()
}

fn mono_now() -> u64 {
    sleuth_probe::monotonic_ns()
}

fn send(
    handle: &WriterHandle,
    metrics: Option<&Arc<Metrics>>,
    dev: Vec<GpuSample>,
    proc_rows: Vec<ProcessGpuSample>,
) {
    if let Some(m) = metrics {
        m.observe_gpu(&dev, &proc_rows);
    }
    // A writer error is the capture loop's to report (it stops the trace).
    if !dev.is_empty() {
        let _ = handle.add_gpu_samples(dev);
    }
    if !proc_rows.is_empty() {
        let _ = handle.add_process_gpu_samples(proc_rows);
    }
}

impl GpuSampler {
    /// Opens NVML and reads the baseline of the processes in `scope` now. On
    /// a machine without NVML, stores a note and returns `None`.
    pub fn start(
        handle: &WriterHandle,
        realtime_offset_ns: i64,
        start_mono_ns: u64,
        scope: Scope,
        metrics: Option<Arc<Metrics>>,
    ) -> Option<GpuSampler> {
        let since_us = (i128::from(start_mono_ns) + i128::from(realtime_offset_ns)) / 1000;
        let lib = sleuth_gpu::Sources::from_env().nvml_lib;
        let mut sampler = match ActivitySampler::open(lib.as_ref(), since_us.max(0) as u64) {
            Ok(s) => s,
            Err(e) => {
                let _ = handle.add_note(
                    NoteLevel::Info,
                    format!("GPU activity and the memory each process held before the trace were not measured: {e}"),
                );
                if let Some(m) = &metrics {
                    m.set_gpu_measured(false);
                }
                return None;
            }
        };
        if let Some(m) = &metrics {
            m.set_gpu_measured(true);
        }
        let mut conv = Converter::new(realtime_offset_ns);
        let poll = sampler.poll();
        let dev = conv.device_samples(&poll);
        let rows = conv.process_rows(&poll, &scope, SamplePhase::Start, mono_now());
        send(handle, metrics.as_ref(), dev, rows);

        let scope = Arc::new(Mutex::new(scope));
        let shared = Arc::new(Mutex::new(handle.clone()));
        let (stop, stopped) = mpsc::channel::<()>();
        let (h, m, s) = (shared.clone(), metrics.clone(), scope.clone());
        let thread = std::thread::Builder::new()
            .name("gpusleuth-nvml".into())
            .spawn(move || {
                // A message or a closed channel both mean: stop.
                while let Err(RecvTimeoutError::Timeout) = stopped.recv_timeout(POLL_INTERVAL) {
                    let poll = sampler.poll();
                    let scope = s.lock().unwrap_or_else(|p| p.into_inner()).clone();
                    let dev = conv.device_samples(&poll);
                    let rows = conv.process_rows(&poll, &scope, SamplePhase::Sample, mono_now());
                    send(&current(&h), m.as_ref(), dev, rows);
                }
                (sampler, conv)
            })
            .ok()?;
        Some(GpuSampler {
            stop,
            thread: Some(thread),
            scope,
            handle: shared,
            metrics,
        })
    }

    /// Sends the samples from now on to `handle` (the next file of a rotating trace).
    pub fn set_handle(&self, handle: WriterHandle) {
        *self.handle.lock().unwrap_or_else(|p| p.into_inner()) = handle;
    }

    /// The traced pids now (`--pid`/launch modes; descendants included).
    pub fn set_pids(&self, pids: impl IntoIterator<Item = u32>) {
        let mut s = self.scope.lock().unwrap_or_else(|p| p.into_inner());
        if let Scope::Pids(set) = &mut *s {
            set.extend(pids);
        }
    }

    /// Stops the thread, takes the `end` readings and stores what the driver
    /// could not give.
    pub fn finish(mut self) {
        let _ = self.stop.send(());
        let Some(Ok((mut sampler, mut conv))) = self.thread.take().map(JoinHandle::join) else {
            return;
        };
        let poll = sampler.poll();
        let scope = self.scope.lock().unwrap_or_else(|p| p.into_inner()).clone();
        let dev = conv.device_samples(&poll);
        let rows = conv.process_rows(&poll, &scope, SamplePhase::End, mono_now());
        let handle = current(&self.handle);
        send(&handle, self.metrics.as_ref(), dev, rows);
        let _ = handle.set_stat(PROCESS_POLLS_STAT, conv.polls_with_memory);
        let u = sampler.unsupported();
        for (what, why) in [
            ("GPU busy samples (nvmlDeviceGetSamples)", &u.samples),
            (
                "per-process GPU utilization (nvmlDeviceGetProcessUtilization)",
                &u.process_util,
            ),
            (
                "per-process GPU memory (nvmlDeviceGetComputeRunningProcesses)",
                &u.process_memory,
            ),
        ] {
            if let Some(why) = why {
                let _ = handle.add_note(
                    NoteLevel::Info,
                    format!("{what} not measured: the driver answered {why}"),
                );
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sleuth_gpu::activity::{ProcessMemory, ProcessUtil, UtilSample};

    const OFFSET: i64 = 1_700_000_000_000_000_000;

    fn us(trace_ns: u64) -> u64 {
        ((trace_ns as i128 + OFFSET as i128) / 1000) as u64
    }

    /// NVML's sample of `gpu` stamped at `trace_ns` on the trace's clock.
    fn sample(gpu: u32, trace_ns: u64, busy_pct: u32) -> UtilSample {
        UtilSample {
            gpu,
            ts_us: us(trace_ns),
            busy_pct,
        }
    }

    #[test]
    fn samples_get_trace_time_and_the_period_since_the_previous_one() {
        let mut c = Converter::new(OFFSET);
        let poll = ActivityPoll {
            samples: vec![
                sample(0, 1_200_000_000, 40),
                sample(0, 1_000_000_000, 100),
                sample(1, 1_000_000_000, 7),
            ],
            ..Default::default()
        };
        let s = c.device_samples(&poll);
        assert_eq!(
            s.len(),
            2,
            "GPU 1's lone first sample has no known period yet: {s:?}"
        );
        assert_eq!(
            (s[0].ts_ns, s[0].period_ns, s[0].busy_pct),
            (1_000_000_000, 200_000_000, 100.0)
        );
        assert_eq!(
            (s[1].ts_ns, s[1].period_ns, s[1].busy_pct),
            (1_200_000_000, 200_000_000, 40.0)
        );
        let next = ActivityPoll {
            samples: vec![sample(1, 1_100_000_000, 9)],
            ..Default::default()
        };
        let s = c.device_samples(&next);
        assert_eq!(
            (s[0].gpu, s[0].ts_ns, s[0].period_ns),
            (1, 1_100_000_000, 100_000_000)
        );
        // A sample stamped 0.14 ms after the last one re-reports its window: not stored.
        let again = ActivityPoll {
            samples: vec![sample(0, 1_200_143_000, 25), sample(0, 1_400_000_000, 30)],
            ..Default::default()
        };
        let s = c.device_samples(&again);
        assert_eq!(s.len(), 1, "{s:?}");
        assert_eq!((s[0].ts_ns, s[0].period_ns), (1_400_000_000, 200_000_000));
    }

    #[test]
    fn process_rows_keep_the_scope_and_close_processes_that_disappear() {
        let mut c = Converter::new(OFFSET);
        let scope = Scope::Pids([10, 11].into_iter().collect());
        let poll = ActivityPoll {
            process_memory: vec![
                ProcessMemory {
                    gpu: 0,
                    pid: 10,
                    used_bytes: Some(1 << 30),
                },
                ProcessMemory {
                    gpu: 0,
                    pid: 11,
                    used_bytes: Some(5),
                },
                ProcessMemory {
                    gpu: 0,
                    pid: 99,
                    used_bytes: Some(7),
                },
            ],
            process_util: vec![
                ProcessUtil {
                    gpu: 0,
                    pid: 10,
                    ts_us: 5,
                    sm_pct: 30,
                },
                ProcessUtil {
                    gpu: 0,
                    pid: 10,
                    ts_us: 9,
                    sm_pct: 60,
                },
            ],
            ..Default::default()
        };
        let r = c.process_rows(&poll, &scope, SamplePhase::Start, 50);
        assert_eq!(r.len(), 2, "pid 99 is not traced");
        assert_eq!(
            (r[0].pid, r[0].used_bytes, r[0].sm_pct),
            (10, Some(1 << 30), Some(60.0))
        );
        assert_eq!(
            (r[1].pid, r[1].sm_pct, r[1].phase),
            (11, None, SamplePhase::Start)
        );
        // pid 11 exits: an `end` row with 0 at the next poll.
        let poll = ActivityPoll {
            process_memory: vec![ProcessMemory {
                gpu: 0,
                pid: 10,
                used_bytes: Some(1 << 29),
            }],
            ..Default::default()
        };
        let r = c.process_rows(&poll, &scope, SamplePhase::Sample, 60);
        assert_eq!(r.len(), 2);
        assert_eq!((r[0].pid, r[0].phase), (10, SamplePhase::Sample));
        assert_eq!(
            (r[1].pid, r[1].used_bytes, r[1].phase),
            (11, Some(0), SamplePhase::End)
        );
        // At the end every process read and not yet closed gets an `end` row.
        let r = c.process_rows(&ActivityPoll::default(), &scope, SamplePhase::End, 70);
        let ends: Vec<(u32, Option<u64>)> = r.iter().map(|r| (r.pid, r.used_bytes)).collect();
        assert_eq!(ends, vec![(10, Some(0))]);
        assert_eq!(c.polls_with_memory, 3);
    }

    #[test]
    fn all_mode_excludes_the_tracer() {
        assert!(!Scope::All.contains(std::process::id()));
        assert!(Scope::All.contains(1));
    }
}
