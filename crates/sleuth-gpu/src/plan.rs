//! Which processes `reclaim` would end, why, and what it refuses. Pure: the
//! safety rules are decided here from a report, and tested without signals.

use crate::classify::{Class, Holder, Report, WEAK_EVIDENCE};
use crate::proc_scan::ProcSnapshot;
use serde::Serialize;
use std::collections::{BTreeMap, BTreeSet};

/// What the user asked to reclaim.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Selection {
    Pids(Vec<u32>),
    /// Every orphaned worker (including the holders of exited-but-listed pids).
    Orphans,
}

/// Who is asking: the rules forbid ending ourselves, our ancestors, or other users' processes.
#[derive(Debug, Clone)]
pub struct Caller {
    pub pid: u32,
    pub uid: u32,
    pub ancestors: BTreeSet<u32>,
}

impl Caller {
    /// The running process, its uid and its ancestors (from `/proc`).
    pub fn current(proc_root: &std::path::Path) -> Self {
        let pid = std::process::id();
        // SAFETY: getuid has no preconditions and cannot fail.
        let uid = unsafe { libc::getuid() };
        let mut ancestors = BTreeSet::new();
        let mut cur = pid;
        // Bounded walk: a pid namespace is at most a few hundred levels of parents deep.
        for _ in 0..4096 {
            let stat = std::fs::read_to_string(proc_root.join(cur.to_string()).join("stat")).ok();
            let Some(ppid) = stat
                .as_deref()
                .and_then(crate::proc_scan::parse_stat)
                .map(|s| s.ppid)
            else {
                break;
            };
            if ppid == 0 || !ancestors.insert(ppid) {
                break;
            }
            cur = ppid;
        }
        Caller {
            pid,
            uid,
            ancestors,
        }
    }
}

/// A process the plan would signal, with the identity to re-check before signalling.
#[derive(Debug, Clone, Serialize)]
pub struct Target {
    pub pid: u32,
    pub start_ticks: u64,
    pub uid: u32,
    pub comm: String,
    pub cmdline: String,
    pub class: Class,
    pub reason: String,
    /// Listed pids whose NVML memory should disappear when this target exits
    /// (itself when NVML lists it, and the exited pids it keeps).
    pub frees_listed_pids: Vec<u32>,
}

/// A pid the plan will not touch, and what to do instead.
#[derive(Debug, Clone, Serialize)]
pub struct Refusal {
    pub pid: u32,
    pub reason: String,
    pub suggestion: Option<String>,
}

/// A holder `vram` names that this plan leaves alone, with what it may
/// hold and the exact command that would end it.
#[derive(Debug, Clone, Serialize)]
pub struct Hint {
    pub pid: u32,
    pub comm: String,
    pub holds: String,
    pub command: String,
}

/// The dry-run answer, and the input to execution.
#[derive(Debug, Clone, Serialize)]
pub struct Plan {
    pub targets: Vec<Target>,
    pub refused: Vec<Refusal>,
    /// Possible holders `--orphans` does not end (no proven link), and how to end them.
    pub hints: Vec<Hint>,
    /// GPU index → bytes expected to be freed (memory of every listed pid whose
    /// every known holder is a target).
    pub expected_free_bytes: BTreeMap<u32, u64>,
}

impl Target {
    /// The command line, or `[comm]` when it is empty (kernel threads, some daemons).
    pub fn cmdline_or_comm(&self) -> String {
        if self.cmdline.is_empty() {
            format!("[{}]", self.comm)
        } else {
            self.cmdline.clone()
        }
    }
}

fn refuse(pid: u32, reason: impl Into<String>, suggestion: Option<String>) -> Refusal {
    Refusal {
        pid,
        reason: reason.into(),
        suggestion,
    }
}

/// Safety rules that apply to any pid, before looking at what it holds.
fn forbidden(pid: u32, procs: &ProcSnapshot, caller: &Caller) -> Option<Refusal> {
    if pid <= 1 {
        return Some(refuse(
            pid,
            "pid 1 (init) and pid 0 are never signalled",
            None,
        ));
    }
    if pid == caller.pid {
        return Some(refuse(pid, "this is gpusleuth itself", None));
    }
    if caller.ancestors.contains(&pid) {
        return Some(refuse(
            pid,
            "an ancestor of gpusleuth (ending it would end this session)",
            None,
        ));
    }
    let p = procs.get(pid)?;
    if p.kernel_thread {
        return Some(refuse(pid, "a kernel thread", None));
    }
    if caller.uid != 0 && p.uid != caller.uid {
        return Some(refuse(
            pid,
            format!(
                "belongs to user {} (uid {}); only root may reclaim other users' processes",
                p.user, p.uid
            ),
            None,
        ));
    }
    None
}

/// Builds the plan from a report and the `/proc` snapshot it was made from
/// (kernel threads and ownership are checked for every pid, holder or not);
/// pids absent from the report are not GPU holders and are refused.
pub fn make_plan(
    report: &Report,
    procs: &ProcSnapshot,
    selection: &Selection,
    caller: &Caller,
) -> Plan {
    let mut targets: BTreeMap<u32, Target> = BTreeMap::new();
    let mut refused = Vec::new();

    let requested: Vec<u32> = match selection {
        Selection::Pids(p) => p.clone(),
        Selection::Orphans => report
            .holders
            .iter()
            .filter(|h| h.class == Class::OrphanedWorker)
            .map(|h| h.pid)
            .collect(),
    };

    for pid in requested {
        if let Some(r) = forbidden(pid, procs, caller) {
            refused.push(r);
            continue;
        }
        let Some(h) = report.holder(pid) else {
            refused.push(refuse(
                pid,
                "not a GPU holder (NVML does not list it and it holds no GPU device files)",
                None,
            ));
            continue;
        };
        match h.class {
            Class::OtherNamespace => refused.push(refuse(
                pid,
                "NVML pid from another pid namespace; it cannot be matched to a local process",
                Some("run gpusleuth in the host pid namespace".into()),
            )),
            Class::Zombie => {
                let parent = h.reap_parent.unwrap_or(0);
                let mut s = if parent <= 1 {
                    "its parent is init (pid 1), which must reap it; gpusleuth never signals pid 1"
                        .to_string()
                } else {
                    format!("its parent {parent} must reap it (wait); ending the parent with --pid {parent} lets init reap it")
                };
                if !h.held_by.is_empty() {
                    s.push_str(&format!(
                        "; its memory is kept by {}",
                        pids(h.held_by.iter().map(|x| x.pid))
                    ));
                }
                refused.push(refuse(
                    pid,
                    "a zombie cannot be killed: it has already exited",
                    Some(s),
                ));
            }
            Class::ExitedButListed => {
                let strong = h.strong_holders();
                if strong.is_empty() {
                    let hint = if h.held_by.is_empty() {
                        "no visible process holds the device files".to_string()
                    } else {
                        format!(
                            "possible holders (no link to pid {pid} found): {}; name them with --pid",
                            pids(h.held_by.iter().map(|x| x.pid))
                        )
                    };
                    refused.push(refuse(pid, "no longer exists", Some(hint)));
                    continue;
                }
                // The dead pid itself cannot be signalled; its linked holders can.
                for w in strong {
                    if let Some(r) = forbidden(w, procs, caller) {
                        refused.push(r);
                        continue;
                    }
                    match target_for(report, w, false) {
                        Ok(t) => {
                            targets.entry(w).or_insert(t);
                        }
                        Err(r) => refused.push(r),
                    }
                }
            }
            Class::Active | Class::StuckD | Class::OrphanedWorker | Class::IdleHolder => {
                let explicit = matches!(selection, Selection::Pids(_));
                match target_for(report, pid, explicit) {
                    Ok(t) => {
                        targets.entry(pid).or_insert(t);
                    }
                    Err(r) => refused.push(r),
                }
            }
        }
    }

    let hints = match selection {
        Selection::Orphans => hints(report, &targets),
        Selection::Pids(_) => Vec::new(),
    };
    let targets: Vec<Target> = targets.into_values().collect();
    let expected_free_bytes = expected_free(report, &targets);
    Plan {
        targets,
        refused,
        hints,
        expected_free_bytes,
    }
}

/// Dead listed pids each weak candidate may hold (it holds their GPU's device file, no link).
fn weakly_held(report: &Report, pid: u32) -> Vec<&Holder> {
    report
        .holders
        .iter()
        .filter(|d| {
            d.class == Class::ExitedButListed
                && d.held_by
                    .iter()
                    .any(|x| x.pid == pid && x.evidence == WEAK_EVIDENCE)
        })
        .collect()
}

/// For `--orphans`: the possible holders of exited pids' memory it leaves.
fn hints(report: &Report, targets: &BTreeMap<u32, Target>) -> Vec<Hint> {
    let mut out: BTreeMap<u32, Hint> = BTreeMap::new();
    for dead in report
        .holders
        .iter()
        .filter(|h| h.class == Class::ExitedButListed)
    {
        for c in dead.held_by.iter().filter(|x| x.evidence == WEAK_EVIDENCE) {
            if targets.contains_key(&c.pid) || out.contains_key(&c.pid) {
                continue;
            }
            let Some(holder) = report.holder(c.pid) else {
                continue;
            };
            let Some(p) = holder.process.as_ref() else {
                continue;
            };
            let what: Vec<String> = weakly_held(report, c.pid)
                .iter()
                .map(|d| {
                    format!(
                        "the {} MiB NVML lists for exited pid {}",
                        d.nvml_bytes() >> 20,
                        d.pid
                    )
                })
                .collect();
            out.insert(
                c.pid,
                Hint {
                    pid: c.pid,
                    comm: p.comm.clone(),
                    holds: format!(
                        "may keep {} (it holds {}; no link to the dead pid proven, so --orphans leaves it)",
                        what.join(" and "),
                        p.devices.files().join(", ")
                    ),
                    command: format!("gpusleuth reclaim --pid {}", c.pid),
                },
            );
        }
    }
    out.into_values().collect()
}

/// A target, only when GPU memory can be shown for it: NVML lists a context
/// of its own, or it is linked to an exited pid whose memory NVML still
/// lists, or (named explicitly with `--pid`) it is a possible holder of
/// such memory. Anything else is refused: holding `nvidiactl` or
/// `nvidia-uvm`, or a device file with no memory shown anywhere, is no
/// reason to end a process.
fn target_for(report: &Report, pid: u32, explicit: bool) -> Result<Target, Refusal> {
    let no_memory = |why: String| refuse(pid, why, None);
    let h = report
        .holder(pid)
        .ok_or_else(|| no_memory("not a GPU holder".into()))?;
    let p = h
        .process
        .as_ref()
        .ok_or_else(|| no_memory("no longer exists".into()))?;
    if !report.nvml.available {
        return Err(no_memory(format!(
            "no GPU memory can be shown for it: NVML is not available ({}); gpusleuth ends nothing it cannot show holds memory",
            report.nvml.reason.as_deref().unwrap_or("unknown reason")
        )));
    }
    let mut frees = h.holds_memory_of.clone();
    if !h.gpus.is_empty() {
        frees.push(pid);
    }
    if frees.is_empty() && explicit {
        frees = weakly_held(report, pid).iter().map(|d| d.pid).collect();
    }
    if frees.is_empty() {
        let files = p.devices.files();
        let only_shared = !files.is_empty() && !files.iter().any(|f| is_gpu_device(f));
        let mut why = "no GPU memory can be shown for it: NVML lists no context of its own and it is linked to no exited pid's memory".to_string();
        if only_shared {
            why.push_str(&format!(
                " (it holds only {}: opening the control or unified-memory device is no evidence of device memory)",
                files.join(", ")
            ));
        }
        return Err(no_memory(why));
    }
    Ok(Target {
        pid,
        start_ticks: p.start_ticks,
        uid: p.uid,
        comm: p.comm.clone(),
        cmdline: p.cmdline.clone(),
        class: h.class,
        reason: h.reason.clone(),
        frees_listed_pids: frees,
    })
}

/// Whether a device path names one GPU (`.../nvidiaN`), not a shared control file.
fn is_gpu_device(path: &str) -> bool {
    path.rsplit_once("nvidia")
        .is_some_and(|(_, n)| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
}

/// A listed pid's memory counts as freed when it is a target, or when it is
/// dead and every process linked to it (child, process group, session) is a
/// target. Holders with no link (weak evidence) promise nothing.
fn expected_free(report: &Report, targets: &[Target]) -> BTreeMap<u32, u64> {
    let target_pids: BTreeSet<u32> = targets.iter().map(|t| t.pid).collect();
    let mut out = BTreeMap::new();
    for h in report.holders.iter().filter(|h| !h.gpus.is_empty()) {
        let linked = h.strong_holders();
        let freed = target_pids.contains(&h.pid)
            || (!h.alive() && !linked.is_empty() && linked.iter().all(|p| target_pids.contains(p)));
        if freed {
            for u in &h.gpus {
                *out.entry(u.gpu).or_insert(0) += u.used_bytes.unwrap_or(0);
            }
        }
    }
    out
}

fn pids(it: impl Iterator<Item = u32>) -> String {
    it.map(|p| p.to_string()).collect::<Vec<_>>().join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::classify::tests::{classify_host, gpu, proc_, snapshot};
    use crate::proc_scan::ProcState;

    const DEV: &[&str] = &["/dev/nvidia0", "/dev/nvidiactl"];

    fn caller() -> Caller {
        Caller {
            pid: 900,
            uid: 1000,
            ancestors: [899, 1].into(),
        }
    }

    fn crash_report() -> (Report, ProcSnapshot) {
        let mut other = proc_(400, 1, 400, ProcState::Sleeping, DEV);
        other.uid = 0;
        let procs = snapshot(vec![
            proc_(1, 0, 1, ProcState::Sleeping, &[]),
            proc_(101, 1, 100, ProcState::Sleeping, DEV),
            proc_(102, 1, 102, ProcState::Sleeping, DEV),
            proc_(11, 50, 50, ProcState::Zombie, &[]),
            proc_(50, 1, 50, ProcState::Sleeping, &[]),
            proc_(899, 1, 899, ProcState::Sleeping, DEV),
            other,
        ]);
        // A kernel thread is visible in /proc but holds nothing.
        let mut kthread = proc_(2, 0, 0, ProcState::Sleeping, &[]);
        kthread.kernel_thread = true;
        let mut all = procs.clone();
        all.procs.insert(2, kthread);
        let report = classify_host(
            &gpu(&[(100, 2 << 30), (102, 1 << 30), (11, 5), (400, 3 << 30)]),
            &procs,
        );
        (report, all)
    }

    #[test]
    fn orphans_plan_names_the_worker_and_the_dead_pids_memory() {
        let (r, p) = crash_report();
        let plan = make_plan(&r, &p, &Selection::Orphans, &caller());
        let t: Vec<u32> = plan.targets.iter().map(|t| t.pid).collect();
        assert_eq!(t, vec![101]);
        assert_eq!(plan.targets[0].frees_listed_pids, vec![100]);
        assert_eq!(plan.expected_free_bytes.get(&0), Some(&(2 << 30)));
        assert!(plan.refused.is_empty());
    }

    #[test]
    fn dead_pid_resolves_to_its_holder() {
        let (r, p) = crash_report();
        let plan = make_plan(&r, &p, &Selection::Pids(vec![100]), &caller());
        assert_eq!(
            plan.targets.iter().map(|t| t.pid).collect::<Vec<_>>(),
            vec![101]
        );
    }

    #[test]
    fn refusals() {
        let (r, p) = crash_report();
        let plan = make_plan(
            &r,
            &p,
            &Selection::Pids(vec![1, 900, 899, 400, 11, 50, 77, 2]),
            &caller(),
        );
        assert!(plan.targets.is_empty(), "{:?}", plan.targets);
        let why: BTreeMap<u32, &str> = plan
            .refused
            .iter()
            .map(|r| (r.pid, r.reason.as_str()))
            .collect();
        assert!(why[&1].contains("pid 1"));
        assert!(why[&900].contains("itself"));
        assert!(why[&899].contains("ancestor"));
        assert!(why[&400].contains("only root"));
        assert!(why[&11].contains("zombie"));
        assert!(why[&50].contains("not a GPU holder"));
        assert!(why[&77].contains("not a GPU holder"));
        assert!(why[&2].contains("kernel thread"));
        let z = plan
            .refused
            .iter()
            .find(|r| r.pid == 11)
            .expect("zombie refusal");
        assert!(z.suggestion.as_deref().unwrap_or("").contains("--pid 50"));
        assert!(plan.expected_free_bytes.is_empty());
    }

    #[test]
    fn root_may_reclaim_other_users() {
        let mut c = caller();
        c.uid = 0;
        let (r, p) = crash_report();
        let plan = make_plan(&r, &p, &Selection::Pids(vec![400, 102]), &c);
        assert_eq!(
            plan.targets.iter().map(|t| t.pid).collect::<Vec<_>>(),
            vec![102, 400]
        );
        assert_eq!(plan.expected_free_bytes.get(&0), Some(&(4 << 30)));
    }

    /// Issue 18: no target without memory NVML can show.
    #[test]
    fn holders_without_memory_evidence_are_refused() {
        let mut c = caller();
        c.uid = 0;
        let (r, p) = crash_report();
        // 899 is our ancestor; 300 holds only nvidiactl and lost its group leader.
        let mut procs = p.clone();
        procs.procs.insert(
            300,
            proc_(300, 1, 299, ProcState::Sleeping, &["/dev/nvidiactl"]),
        );
        let r2 = classify_host(&gpu(&[(100, 2 << 30)]), &procs);
        assert_eq!(r2.holder(300).expect("ctl").class, Class::OrphanedWorker);
        let plan = make_plan(&r2, &procs, &Selection::Orphans, &c);
        assert_eq!(
            plan.targets.iter().map(|t| t.pid).collect::<Vec<_>>(),
            vec![101]
        );
        let why = &plan
            .refused
            .iter()
            .find(|x| x.pid == 300)
            .expect("refused")
            .reason;
        assert!(
            why.contains("no GPU memory") && why.contains("nvidiactl"),
            "{why}"
        );
        let plan = make_plan(&r2, &procs, &Selection::Pids(vec![300]), &c);
        assert!(plan.targets.is_empty());

        // Without NVML nothing at all can be shown.
        let blind = classify_host(
            &crate::nvml::NvmlView::Unavailable {
                reason: "no driver".into(),
            },
            &procs,
        );
        for sel in [Selection::Orphans, Selection::Pids(vec![101, 300])] {
            let plan = make_plan(&blind, &procs, &sel, &c);
            assert!(plan.targets.is_empty(), "{:?}", plan.targets);
            assert!(
                plan.refused
                    .iter()
                    .all(|x| x.reason.contains("NVML is not available")),
                "{:?}",
                plan.refused
            );
        }
        drop(r);
    }

    #[test]
    fn unproven_holders_come_with_the_command_that_ends_them() {
        let procs = snapshot(vec![proc_(200, 1, 200, ProcState::Sleeping, DEV)]);
        let r = classify_host(&gpu(&[(100, 1 << 30)]), &procs);
        let plan = make_plan(&r, &procs, &Selection::Orphans, &caller());
        assert!(plan.targets.is_empty());
        assert_eq!(plan.hints.len(), 1);
        assert_eq!(plan.hints[0].command, "gpusleuth reclaim --pid 200");
        assert!(
            plan.hints[0]
                .holds
                .contains("1024 MiB NVML lists for exited pid 100"),
            "{}",
            plan.hints[0].holds
        );
        // Named explicitly, it is a target that promises nothing.
        let plan = make_plan(&r, &procs, &Selection::Pids(vec![200]), &caller());
        assert_eq!(plan.targets[0].frees_listed_pids, vec![100]);
        assert!(plan.expected_free_bytes.is_empty());
    }
}
