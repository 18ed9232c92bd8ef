//! Carries out a plan: pin each target with a pidfd, re-check that it is the
//! process the plan meant, end it, then verify through NVML and `/proc` that
//! the memory really came back.

use crate::kill::{self, Ending, PidFd};
use crate::plan::{Plan, Target};
use crate::proc_scan;
use crate::{Observation, Sources};
use serde::Serialize;
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

/// Timing of an execution.
#[derive(Debug, Clone, Copy)]
pub struct ExecOptions {
    /// Wait after SIGTERM before SIGKILL (`--grace`, default 5 s).
    pub grace: Duration,
    /// Wait after SIGKILL for the process to go.
    pub kill_wait: Duration,
    /// How long to wait for NVML and `/proc` to show the memory released.
    pub verify_timeout: Duration,
}

impl Default for ExecOptions {
    fn default() -> Self {
        ExecOptions {
            grace: Duration::from_secs(5),
            kill_wait: Duration::from_secs(5),
            verify_timeout: Duration::from_secs(10),
        }
    }
}

/// What happened to one target.
#[derive(Debug, Clone, Serialize)]
pub struct TargetResult {
    pub pid: u32,
    /// `terminated`, `killed`, `already_gone`, `still_alive`, or `skipped` (not signalled).
    pub status: String,
    pub detail: Option<String>,
}

/// Memory before and after, per GPU.
#[derive(Debug, Clone, Serialize)]
pub struct GpuFreed {
    pub gpu: u32,
    pub used_before_bytes: u64,
    pub used_after_bytes: u64,
    pub freed_bytes: u64,
}

/// Result of executing a plan.
#[derive(Debug, Clone, Serialize)]
pub struct Outcome {
    pub results: Vec<TargetResult>,
    pub freed: Vec<GpuFreed>,
    /// Why memory is still held, one line each; empty when everything was released.
    pub still_held: Vec<String>,
    /// Every target ended and NVML, read again afterwards, no longer lists
    /// the memory the plan meant to free (same as `verified`).
    pub memory_released: bool,
    /// Whether the release was checked through NVML after the targets ended;
    /// false when NVML could not be read then.
    pub verified: bool,
    /// How it was checked, in words.
    pub verification: String,
}

/// Re-checks, while the pidfd pins the process, that it is the planned one:
/// same start time and uid, and it still holds the GPU (device files or an NVML listing).
fn verify_identity(sources: &Sources, t: &Target, listed_before: bool) -> Result<(), String> {
    let now = proc_scan::read_one(&sources.scan, t.pid).ok_or("exited before it was signalled")?;
    if now.start_ticks != t.start_ticks {
        return Err(format!(
            "pid {} now has start time {} (planned {}): the pid was reused, not signalling",
            t.pid, now.start_ticks, t.start_ticks
        ));
    }
    if now.uid != t.uid {
        return Err(format!(
            "pid {} changed owner (uid {} → {}), not signalling",
            t.pid, t.uid, now.uid
        ));
    }
    if !now.devices.holds_any() && !listed_before {
        return Err(format!(
            "pid {} no longer holds GPU device files, not signalling",
            t.pid
        ));
    }
    Ok(())
}

fn end_one(
    sources: &Sources,
    t: &Target,
    before: &Observation,
    opts: &ExecOptions,
) -> TargetResult {
    let result = |status: &str, detail: Option<String>| TargetResult {
        pid: t.pid,
        status: status.into(),
        detail,
    };
    // Pin first, decide second: a pid recycled after this point cannot be hit.
    let pidfd = match PidFd::open(t.pid) {
        Ok(fd) => fd,
        Err(e) if e.raw_os_error() == Some(libc::ESRCH) => return result("already_gone", None),
        Err(e) => return result("skipped", Some(format!("pidfd_open failed: {e}"))),
    };
    let listed_before = before
        .report
        .holder(t.pid)
        .is_some_and(|h| !h.gpus.is_empty());
    if let Err(why) = verify_identity(sources, t, listed_before) {
        return result("skipped", Some(why));
    }
    match kill::terminate(&pidfd, opts.grace, opts.kill_wait) {
        Ok(Ending::Terminated) => result("terminated", None),
        Ok(Ending::Killed) => result("killed", Some(format!("did not exit within {:?} of SIGTERM", opts.grace))),
        Ok(Ending::AlreadyGone) => result("already_gone", None),
        Ok(Ending::StillAlive) => result(
            "still_alive",
            Some("still alive after SIGKILL (stuck in D state in the driver, or a zombie whose parent does not reap)".into()),
        ),
        Err(e) => result("skipped", Some(format!("signal failed: {e}"))),
    }
}

/// What still holds memory the plan meant to free; empty when all is released.
fn leftovers(plan: &Plan, after: &Observation) -> Vec<String> {
    let mut out = Vec::new();
    for t in &plan.targets {
        if let Some(p) = after
            .procs
            .get(t.pid)
            .filter(|p| p.start_ticks == t.start_ticks)
        {
            if p.devices.holds_any() {
                out.push(format!(
                    "pid {} ({}) still holds GPU device files",
                    t.pid, t.comm
                ));
            }
        }
        for listed in &t.frees_listed_pids {
            if let Some(h) = after.report.holder(*listed).filter(|h| !h.gpus.is_empty()) {
                out.push(format!(
                    "NVML still lists pid {} with {} MiB",
                    listed,
                    h.nvml_bytes() >> 20
                ));
            }
        }
    }
    out.sort();
    out.dedup();
    out
}

/// Executes the plan and verifies the release. `before` is the observation the plan was made from.
pub fn execute(
    plan: &Plan,
    sources: &Sources,
    before: &Observation,
    opts: &ExecOptions,
) -> Outcome {
    let results: Vec<TargetResult> = plan
        .targets
        .iter()
        .map(|t| end_one(sources, t, before, opts))
        .collect();

    // The driver frees a context shortly after the last holder exits: poll, bounded.
    let deadline = Instant::now() + opts.verify_timeout;
    let mut after = sources.observe();
    let mut still = leftovers(plan, &after);
    while !still.is_empty() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(200));
        after = sources.observe();
        still = leftovers(plan, &after);
    }

    let used_after: BTreeMap<u32, u64> = after
        .nvml
        .gpus()
        .iter()
        .map(|g| (g.index, g.used_bytes))
        .collect();
    let freed = before
        .nvml
        .gpus()
        .iter()
        .map(|g| {
            let a = used_after.get(&g.index).copied().unwrap_or(g.used_bytes);
            GpuFreed {
                gpu: g.index,
                used_before_bytes: g.used_bytes,
                used_after_bytes: a,
                freed_bytes: g.used_bytes.saturating_sub(a),
            }
        })
        .collect();
    let failed = results
        .iter()
        .filter(|r| r.status == "still_alive" || r.status == "skipped")
        .count();
    let nvml_read = after.report.nvml.available;
    if !nvml_read {
        still.push(format!(
            "NVML could not be read after the targets ended ({}): the release is not verified",
            after
                .report
                .nvml
                .reason
                .as_deref()
                .unwrap_or("unknown reason")
        ));
    }
    let verified = nvml_read && still.is_empty() && failed == 0;
    let listed: Vec<String> = plan
        .targets
        .iter()
        .flat_map(|t| t.frees_listed_pids.iter().map(|p| p.to_string()))
        .collect();
    let verification = if verified {
        format!(
            "NVML no longer lists pid{} {}; /proc shows no target holding GPU device files",
            if listed.len() == 1 { "" } else { "s" },
            listed.join(", ")
        )
    } else {
        "not verified".to_string()
    };
    Outcome {
        results,
        freed,
        still_held: still,
        memory_released: verified,
        verified,
        verification,
    }
}
