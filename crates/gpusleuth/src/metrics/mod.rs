//! Live metrics of `gpusleuth trace --metrics ADDR`, served as OpenMetrics
//! (or Prometheus text 0.0.4, by the scraper's `Accept` header) on
//! `GET /metrics`. See docs/metrics.md for every name and label.
//!
//! The capture loop hands each decoded event to [`Metrics::observe`] and, a
//! five times a second, the kernel-side counters (drops, in-kernel launch
//! counts) to [`Metrics::set_kernel_counters`]. Label cardinality is bounded:
//! ops come from the fixed op table, and at most [`MAX_PROCESSES`] processes
//! get their own `pid`/`comm` labels (`state::MAX_PROCESSES`, see `state`).

mod encode;
mod gpu;
mod http;
mod nccl;
mod state;

use sleuth_core::{Event, GpuSample, OpCount, ProcessGpuSample};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::{Arc, Mutex, MutexGuard};

/// Shared between the live thread and the GPU sampler (writers) and the
/// HTTP thread (reader, through the registry's collector).
pub struct Metrics {
    state: Arc<Mutex<state::State>>,
    registry: prometheus_client::registry::Registry,
}

impl Metrics {
    pub fn new() -> Metrics {
        let state = Arc::new(Mutex::new(state::State::default()));
        Metrics {
            registry: encode::registry(state.clone()),
            state,
        }
    }

    fn lock(&self) -> MutexGuard<'_, state::State> {
        // A panic while holding the lock leaves plain counters behind: still usable.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Accounts one decoded event.
    pub fn observe(&self, ev: &Event) {
        self.lock().observe(ev, read_comm);
    }

    /// Replaces the kernel-side counters: losses indexed like
    /// `record::stat::NAMES`, and the in-kernel per-process op counts.
    pub fn set_kernel_counters(&self, losses: &[u64], counts: &[OpCount]) {
        // A process's name from /proc, None when it is gone.
        self.lock()
            .set_kernel_counters(losses, counts, crate::procinfo::comm);
    }

    /// The name the tracer read for a process it saw (`state::State::set_process`).
    pub fn set_process(&self, pid: u32, comm: &str) {
        self.lock().set_process(pid, comm);
    }

    /// Accounts NVML readings from the GPU sampler thread.
    pub fn observe_gpu(&self, dev: &[GpuSample], rows: &[ProcessGpuSample]) {
        self.lock().gpu.observe(dev, rows, read_comm);
    }

    /// Whether GPU activity is measured in this trace (NVML available).
    pub fn set_gpu_measured(&self, measured: bool) {
        self.lock().gpu.measured = Some(measured);
    }

    /// The OpenMetrics exposition text; `size`: the bytes it is expected to
    /// take (the last page's), so that its buffer is not grown by doubling
    /// past it. The 0.0.4 answer is sent from it (`http::Chunks`).
    pub fn render(&self, size: usize) -> String {
        encode::render(&self.registry, size)
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new()
    }
}

/// Binds `addr` and serves `GET /metrics` from a background thread.
pub fn serve(addr: SocketAddr) -> anyhow::Result<Arc<Metrics>> {
    let metrics = Arc::new(Metrics::new());
    http::spawn(addr, metrics.clone())?;
    Ok(metrics)
}

/// `--metrics` values: `HOST:PORT`, `[V6]:PORT`, or a bare `PORT` (loopback).
pub fn parse_addr(s: &str) -> Result<SocketAddr, String> {
    let s = s.trim();
    if let Ok(port) = s.trim_start_matches(':').parse::<u16>() {
        return Ok(SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), port));
    }
    s.parse::<SocketAddr>()
        .map_err(|_| format!("'{s}' is not an address (e.g. 127.0.0.1:9464, or a port)"))
}

/// The process name, read once when a process is first seen; `?` when it
/// is gone.
fn read_comm(pid: u32) -> String {
    crate::procinfo::comm(pid).unwrap_or_else(|| "?".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_default_to_loopback() {
        assert_eq!(parse_addr("9464").unwrap().to_string(), "127.0.0.1:9464");
        assert_eq!(parse_addr(":9464").unwrap().to_string(), "127.0.0.1:9464");
        assert_eq!(parse_addr("0.0.0.0:1").unwrap().to_string(), "0.0.0.0:1");
        assert!(parse_addr("[::1]:9464").is_ok());
        assert!(parse_addr("localhost:x").is_err());
    }
}
