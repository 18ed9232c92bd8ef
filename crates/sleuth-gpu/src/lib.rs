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

/// Points the `/proc` scan at stand-in device files (tests only).
pub const DEV_PREFIX_ENV: &str = "GPUSLEUTH_DEV_PREFIX";

/// Whether this build honours the test seams ([`DEV_PREFIX_ENV`],
/// [`nvml::NVML_LIB_ENV`]): debug builds, which is what `cargo test` builds
/// and runs. A release binary never loads a library named by its
/// environment (it runs as root) nor trusts a device prefix from it, so
/// `reclaim --yes` in a release build acts only on what the real driver and
/// the real `/dev/nvidia*` files show.
pub const SEAMS_HONOURED: bool = cfg!(debug_assertions);

/// Where observations come from; tests point both seams at stand-ins.
#[derive(Debug, Clone, Default)]
pub struct Sources {
    pub scan: proc_scan::ScanConfig,
    /// Explicit NVML library; `None` loads the system's `libnvidia-ml.so.1`.
    pub nvml_lib: Option<OsString>,
    /// A sentence when test seams are set: in use (debug build) or ignored (release).
    pub seam_note: Option<String>,
}

/// One look at the machine: what NVML said, what `/proc` showed, and the report built from both.
#[derive(Debug, Clone)]
pub struct Observation {
    pub nvml: nvml::NvmlView,
    pub procs: proc_scan::ProcSnapshot,
    pub report: Report,
}

impl Sources {
    /// The defaults, with the test seams from the environment applied when
    /// this build honours them ([`SEAMS_HONOURED`]).
    pub fn from_env() -> Self {
        Self::from_vars(|k| std::env::var_os(k), SEAMS_HONOURED)
    }

    /// [`Sources::from_env`] over any variable lookup, for tests of both kinds of build.
    pub fn from_vars(get: impl Fn(&str) -> Option<OsString>, honour: bool) -> Self {
        let set = |k: &str| get(k).filter(|v| !v.is_empty());
        let prefix = set(DEV_PREFIX_ENV);
        let lib = set(nvml::NVML_LIB_ENV);
        let mut s = Sources::default();
        if prefix.is_none() && lib.is_none() {
            return s;
        }
        let named: Vec<String> = [(DEV_PREFIX_ENV, &prefix), (nvml::NVML_LIB_ENV, &lib)]
            .iter()
            .filter_map(|(k, v)| v.as_ref().map(|v| format!("{k}={}", v.to_string_lossy())))
            .collect();
        if !honour {
            s.seam_note = Some(format!(
                "ignoring test seams in a release build: {}",
                named.join(", ")
            ));
            return s;
        }
        if let Some(p) = prefix {
            s.scan.dev_prefix = p.to_string_lossy().into_owned();
        }
        s.nvml_lib = lib;
        s.seam_note = Some(format!(
            "test seams in use (debug build): {}",
            named.join(", ")
        ));
        s
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
        if let Some(n) = &self.seam_note {
            report.notes.push(n.clone());
        }
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

#[cfg(test)]
mod tests {
    use super::*;

    fn vars(k: &str) -> Option<OsString> {
        match k {
            DEV_PREFIX_ENV => Some("/tmp/fake/nvidia".into()),
            nvml::NVML_LIB_ENV => Some("/tmp/evil.so".into()),
            _ => None,
        }
    }

    /// A release build ignores the seams (it never loads a library named by
    /// the environment), a debug build uses them; both say so, naming them.
    #[test]
    fn seams_are_used_only_by_debug_builds_and_always_named() {
        for (honour, prefix, lib, note) in [
            (
                false,
                "/dev/nvidia",
                None,
                "ignoring test seams in a release build: ",
            ),
            (
                true,
                "/tmp/fake/nvidia",
                Some("/tmp/evil.so"),
                "test seams in use (debug build): ",
            ),
        ] {
            let s = Sources::from_vars(vars, honour);
            assert_eq!(s.scan.dev_prefix, prefix, "honour {honour}");
            assert_eq!(s.nvml_lib.as_deref(), lib.map(std::ffi::OsStr::new));
            let n = s.seam_note.unwrap_or_default();
            assert!(n.starts_with(note), "{n}");
            assert!(n.contains("GPUSLEUTH_NVML_LIB=/tmp/evil.so"), "{n}");
        }
        let none = Sources::from_vars(|_| None, true);
        assert!(none.seam_note.is_none() && none.nvml_lib.is_none());
    }
}
