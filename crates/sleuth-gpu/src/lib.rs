//! gpusleuth's view of who holds GPU memory and how to get it back safely.
//!
//! - [`nvml`]: devices, memory and listed pids from the driver (loaded at run time).
//! - [`activity`]: utilization samples and per-process memory over time, for `trace`.
//! - [`proc_scan`]: every process holding `/dev/nvidia*` open or mapped.
//! - [`pidns`]: whether NVML's host pids can be matched to our `/proc`.
//! - [`classify`]: pure rules that name each holder (active, exited but listed, orphaned worker, ...).
//! - [`plan`]: pure reclaim plan with the safety refusals.
//! - [`kill`]: the one module that sends signals (pidfd only).
//! - [`reclaim`]: executes a plan and verifies the memory came back.

pub mod activity;
pub mod classify;
pub mod kill;
pub mod nvml;
pub mod pidns;
pub mod plan;
pub mod proc_scan;
pub mod reclaim;

pub use classify::{Class, Holder, Report};
pub use plan::{make_plan, Caller, Plan, Selection};
pub use reclaim::{execute, ExecOptions, Outcome};

use std::ffi::OsString;

/// Where observations come from; tests point both seams at stand-ins.
#[derive(Debug, Clone, Default)]
pub struct Sources {
    pub scan: proc_scan::ScanConfig,
    /// Explicit NVML library; `None` loads the system's `libnvidia-ml.so.1`.
    pub nvml_lib: Option<OsString>,
}

/// One look at the machine: what NVML said, what `/proc` showed, and the report built from both.
#[derive(Debug, Clone)]
pub struct Observation {
    pub nvml: nvml::NvmlView,
    pub procs: proc_scan::ProcSnapshot,
    pub report: Report,
}

impl Sources {
    /// `GPUSLEUTH_DEV_PREFIX` and `GPUSLEUTH_NVML_LIB` applied to the defaults.
    pub fn from_env() -> Self {
        Sources {
            scan: proc_scan::ScanConfig::from_env(),
            nvml_lib: nvml::lib_path_from_env(),
        }
    }

    /// Queries NVML and scans `/proc`. NVML failures are part of the report, not errors;
    /// an unreadable `/proc` yields an empty process list and a note.
    pub fn observe(&self) -> Observation {
        let nvml = nvml::query(self.nvml_lib.as_ref());
        let (procs, scan_error) = match proc_scan::scan(&self.scan) {
            Ok(p) => (p, None),
            Err(e) => (proc_scan::ProcSnapshot::default(), Some(e)),
        };
        let ns = pidns::detect(&self.scan.proc_root);
        let mut report = classify::classify(&nvml, &procs, &ns, &self.scan.dev_prefix);
        if let Some(e) = scan_error {
            report.notes.push(format!(
                "cannot read {}: {e}",
                self.scan.proc_root.display()
            ));
        }
        Observation {
            nvml,
            procs,
            report,
        }
    }
}
