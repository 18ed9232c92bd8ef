//! Turns what NVML lists and what `/proc` shows into holders a person
//! understands. Pure: no I/O, so every rule is tested from hand-built inputs.

use crate::nvml::{GpuDevice, NvmlView};
use crate::pidns::PidNamespace;
use crate::proc_scan::{ProcInfo, ProcSnapshot, ProcState};
use serde::Serialize;
use std::collections::{BTreeMap, BTreeSet};

/// What kind of holder a process is. See docs/vram.md for the rules.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Class {
    /// NVML lists it and it is alive (running or sleeping).
    Active,
    /// NVML lists it and it is stuck in uninterruptible sleep (D).
    #[serde(rename = "stuck_d_state")]
    StuckD,
    /// NVML lists it or it holds device files, and it is a zombie: only its parent can clear it.
    Zombie,
    /// NVML lists a pid that no longer exists: someone else keeps its memory.
    ExitedButListed,
    /// Holds device files while the CUDA process it came from is gone.
    OrphanedWorker,
    /// Holds device files, NVML lists no context for it, its origin is alive or unknown.
    IdleHolder,
    /// NVML pid from another pid namespace that cannot be translated here.
    OtherNamespace,
}

impl Class {
    /// The name used in JSON and in the human table.
    pub fn as_str(self) -> &'static str {
        match self {
            Class::Active => "active",
            Class::StuckD => "stuck_d_state",
            Class::Zombie => "zombie",
            Class::ExitedButListed => "exited_but_listed",
            Class::OrphanedWorker => "orphaned_worker",
            Class::IdleHolder => "idle_holder",
            Class::OtherNamespace => "other_namespace",
        }
    }
}

/// How a holder is known.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Source {
    Nvml,
    OpenFds,
    Mappings,
}

/// Memory NVML attributes to a pid on one GPU.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct GpuUse {
    pub gpu: u32,
    pub used_bytes: Option<u64>,
}

/// A live process that keeps a listed pid's memory, and why we think so.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct HeldBy {
    pub pid: u32,
    /// Strong links to the listed pid: `child`, `process_group`, `session`
    /// (the process tree), or `inherited_mapping` (it maps the GPU's device
    /// file and holds the unified-memory device, NVML lists no context of its
    /// own, and no living ancestor has one: it inherited a context, and the
    /// dead pid's is the one NVML lists on that GPU). `device_files`: it
    /// holds the GPU's device file, no link found (possible, not proven).
    pub evidence: &'static str,
}

/// Evidence that is only a possibility, never enough to end a process.
pub const WEAK_EVIDENCE: &str = "device_files";

/// One holder: a process NVML lists, or one that holds device files.
#[derive(Debug, Clone, Serialize)]
pub struct Holder {
    /// Pid in this pid namespace; for `other_namespace`, the NVML (host) pid.
    pub pid: u32,
    pub class: Class,
    /// One sentence for a person.
    pub reason: String,
    pub known_by: BTreeSet<Source>,
    /// Per-GPU memory as NVML lists it (empty when NVML does not list this pid).
    pub gpus: Vec<GpuUse>,
    /// `/proc` details; absent when the process no longer exists.
    pub process: Option<ProcInfo>,
    /// For a dead, zombie or D-state listed pid: who keeps its memory.
    pub held_by: Vec<HeldBy>,
    /// For a worker: the listed pids whose memory it keeps.
    pub holds_memory_of: Vec<u32>,
    /// For a zombie: the parent that must reap it.
    pub reap_parent: Option<u32>,
}

impl Holder {
    pub fn nvml_bytes(&self) -> u64 {
        self.gpus.iter().filter_map(|g| g.used_bytes).sum()
    }
    pub fn alive(&self) -> bool {
        self.process
            .as_ref()
            .is_some_and(|p| p.state != ProcState::Zombie && p.state != ProcState::Dead)
    }
    /// The pids that keep this one's memory on more than an open device file
    /// (a shared context or a mapping): the ones whose end frees it.
    pub fn strong_holders(&self) -> Vec<u32> {
        self.held_by
            .iter()
            .filter(|x| x.evidence != WEAK_EVIDENCE)
            .map(|x| x.pid)
            .collect()
    }
}

/// One GPU and the memory accounting around it.
#[derive(Debug, Clone, Serialize)]
pub struct GpuSummary {
    #[serde(flatten)]
    pub device: GpuDevice,
    /// Pids of holders tied to this GPU (NVML-listed here, or holding `/dev/nvidiaN`).
    pub holder_pids: Vec<u32>,
    /// Sum of memory NVML lists for pids on this GPU.
    pub listed_bytes: u64,
    /// `used - listed`: driver overhead plus memory no listed process accounts for.
    pub unattributed_bytes: u64,
    /// Memory listed for exited pids that no visible process holds.
    pub held_by_nobody_visible_bytes: u64,
}

/// NVML's status as reported to the user.
#[derive(Debug, Clone, Serialize)]
pub struct NvmlStatus {
    pub available: bool,
    pub driver: Option<String>,
    pub reason: Option<String>,
}

/// The whole answer of `vram`.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub nvml: NvmlStatus,
    pub pid_namespace: PidNamespace,
    pub gpus: Vec<GpuSummary>,
    pub holders: Vec<Holder>,
    /// Things a person must know that fit no row (unreadable processes, namespaces).
    pub notes: Vec<String>,
}

impl Report {
    pub fn holder(&self, pid: u32) -> Option<&Holder> {
        self.holders.iter().find(|h| h.pid == pid)
    }
}

/// Everything NVML lists for one pid, merged over devices.
fn nvml_listing(gpus: &[GpuDevice]) -> BTreeMap<u32, Vec<GpuUse>> {
    let mut m: BTreeMap<u32, Vec<GpuUse>> = BTreeMap::new();
    for g in gpus {
        for p in &g.processes {
            let uses = m.entry(p.pid).or_default();
            match uses.iter_mut().find(|u| u.gpu == g.index) {
                // Compute and graphics lists may both name a pid: count once, take the larger.
                Some(u) => u.used_bytes = u.used_bytes.max(p.used_bytes),
                None => uses.push(GpuUse {
                    gpu: g.index,
                    used_bytes: p.used_bytes,
                }),
            }
        }
    }
    m
}

fn known_by(p: &ProcInfo, listed: bool) -> BTreeSet<Source> {
    let mut s = BTreeSet::new();
    if listed {
        s.insert(Source::Nvml);
    }
    if !p.devices.open.is_empty() {
        s.insert(Source::OpenFds);
    }
    if !p.devices.mapped.is_empty() {
        s.insert(Source::Mappings);
    }
    s
}

fn is_live(p: &ProcInfo) -> bool {
    p.state != ProcState::Zombie && p.state != ProcState::Dead
}

/// Live holders that may keep the memory of listed pid `gone`, strongest
/// evidence first. Listed pids are excluded: they have their own context.
/// Only holders of a GPU's own device file (`/dev/nvidiaN`, of a GPU where
/// `gone` is listed when NVML gives minor numbers) count: opening
/// `nvidiactl` or `nvidia-uvm` alone is what every NVIDIA tool does, and no
/// evidence of device memory.
fn holders_of(
    gone: u32,
    gone_uses: &[GpuUse],
    gpus: &[GpuDevice],
    procs: &ProcSnapshot,
    listed: &BTreeMap<u32, Vec<GpuUse>>,
    dev_prefix: &str,
) -> Vec<HeldBy> {
    let minors: BTreeSet<u32> = gone_uses
        .iter()
        .filter_map(|u| gpus.iter().find(|g| g.index == u.gpu)?.minor)
        .collect();
    let on_its_gpu = |held: &BTreeSet<u32>| {
        if minors.is_empty() {
            !held.is_empty()
        } else {
            !held.is_disjoint(&minors)
        }
    };
    let mut strong = Vec::new();
    let mut weak = Vec::new();
    for p in procs.holders().filter(|p| {
        is_live(p) && !listed.contains_key(&p.pid) && on_its_gpu(&p.devices.gpu_minors(dev_prefix))
    }) {
        let evidence = if p.ppid == gone {
            Some("child")
        } else if p.pgid == gone {
            Some("process_group")
        } else if p.sid == gone {
            Some("session")
        } else if on_its_gpu(&p.devices.mapped_gpu_minors(dev_prefix))
            && p.devices.holds_uvm(dev_prefix)
            && !tree_linked_to_listed(p, listed)
            && !has_listed_live_ancestor(p, procs, listed)
        {
            Some("inherited_mapping")
        } else {
            None
        };
        match evidence {
            Some(e) => strong.push(HeldBy {
                pid: p.pid,
                evidence: e,
            }),
            None => weak.push(HeldBy {
                pid: p.pid,
                evidence: WEAK_EVIDENCE,
            }),
        }
    }
    if strong.is_empty() {
        weak
    } else {
        strong
    }
}

/// Whether `p`'s parent, group or session is a pid NVML lists: then the
/// context it inherited is that pid's, not some other dead pid's.
fn tree_linked_to_listed(p: &ProcInfo, listed: &BTreeMap<u32, Vec<GpuUse>>) -> bool {
    [p.ppid, p.pgid, p.sid]
        .iter()
        .any(|x| *x > 1 && listed.contains_key(x))
}

/// Whether a living ancestor of `p` has a context NVML lists: then a
/// context `p` maps came from that living process, not from a dead one.
fn has_listed_live_ancestor(
    p: &ProcInfo,
    procs: &ProcSnapshot,
    listed: &BTreeMap<u32, Vec<GpuUse>>,
) -> bool {
    let mut cur = p.ppid;
    // Bounded: a pid namespace is at most a few hundred levels deep.
    for _ in 0..4096 {
        if cur <= 1 {
            return false;
        }
        let Some(a) = procs.get(cur) else {
            return false;
        };
        if is_live(a) && listed.contains_key(&cur) {
            return true;
        }
        cur = a.ppid;
    }
    false
}

/// A holder whose CUDA parent is gone: it is in a process group whose leader
/// has exited, and it was reparented out of that group (to init or a subreaper).
/// A daemon that leads its own group (nvidia-persistenced) never matches.
fn lost_its_group_leader(p: &ProcInfo, procs: &ProcSnapshot) -> bool {
    if p.pgid == p.pid || p.pgid == 0 {
        return false;
    }
    let leader_gone = procs.get(p.pgid).is_none_or(|l| !is_live(l));
    let parent_outside_group = procs.get(p.ppid).is_none_or(|parent| parent.pgid != p.pgid);
    leader_gone && parent_outside_group
}

/// Builds the report from one NVML view and one `/proc` snapshot.
pub fn classify(
    nvml: &NvmlView,
    procs: &ProcSnapshot,
    ns: &PidNamespace,
    dev_prefix: &str,
) -> Report {
    let gpus = nvml.gpus();
    let listed = nvml_listing(gpus);
    let mut holders: Vec<Holder> = Vec::new();
    let mut notes = Vec::new();
    // pid of worker -> listed pids whose memory it keeps (strong evidence only).
    let mut keeps: BTreeMap<u32, Vec<u32>> = BTreeMap::new();

    for (&pid, uses) in &listed {
        if !ns.translatable {
            holders.push(Holder {
                pid,
                class: Class::OtherNamespace,
                reason: format!(
                    "NVML lists host pid {pid}, but this pid namespace cannot see host pids; it is not matched to a local process"
                ),
                known_by: [Source::Nvml].into(),
                gpus: uses.clone(),
                process: None,
                held_by: Vec::new(),
                holds_memory_of: Vec::new(),
                reap_parent: None,
            });
            continue;
        }
        let proc_ = procs.get(pid).cloned();
        let (class, reason, held_by, reap_parent) = match &proc_ {
            None => {
                let held_by = holders_of(pid, uses, gpus, procs, &listed, dev_prefix);
                let reason = if held_by.is_empty() {
                    format!("pid {pid} no longer exists and no visible process holds the GPU device files: the memory is held by nobody visible (another namespace, or the driver is still tearing down)")
                } else {
                    format!(
                        "pid {pid} no longer exists; its memory is kept by {} ({})",
                        pid_list(held_by.iter().map(|h| h.pid)),
                        evidence_words(&held_by)
                    )
                };
                (Class::ExitedButListed, reason, held_by, None)
            }
            Some(p) if p.state == ProcState::Zombie => {
                let held_by = holders_of(pid, uses, gpus, procs, &listed, dev_prefix);
                let reason = format!(
                    "zombie: it cannot be killed; its parent {} must reap it{}",
                    p.ppid,
                    if held_by.is_empty() {
                        String::new()
                    } else {
                        format!("; its memory is kept by {}", pid_list(held_by.iter().map(|h| h.pid)))
                    }
                );
                (Class::Zombie, reason, held_by, Some(p.ppid))
            }
            Some(p) if p.state == ProcState::DiskSleep => (
                Class::StuckD,
                "stuck in uninterruptible sleep (D), usually inside a driver call; a kill takes effect only when the call returns".to_string(),
                Vec::new(),
                None,
            ),
            Some(_) => (Class::Active, "alive with a CUDA context NVML lists".to_string(), Vec::new(), None),
        };
        for h in held_by.iter().filter(|h| h.evidence != WEAK_EVIDENCE) {
            keeps.entry(h.pid).or_default().push(pid);
        }
        holders.push(Holder {
            pid,
            class,
            reason,
            known_by: proc_
                .as_ref()
                .map(|p| known_by(p, true))
                .unwrap_or_else(|| [Source::Nvml].into()),
            gpus: uses.clone(),
            process: proc_,
            held_by,
            holds_memory_of: Vec::new(),
            reap_parent,
        });
    }

    for p in procs.holders() {
        if ns.translatable && listed.contains_key(&p.pid) {
            continue;
        }
        let holds_memory_of = keeps.get(&p.pid).cloned().unwrap_or_default();
        let (class, reason, reap_parent) = if p.state == ProcState::Zombie {
            (
                Class::Zombie,
                format!(
                    "zombie: it cannot be killed; its parent {} must reap it",
                    p.ppid
                ),
                Some(p.ppid),
            )
        } else if p.state == ProcState::DiskSleep {
            (
                Class::StuckD,
                "holds device files and is stuck in uninterruptible sleep (D)".to_string(),
                None,
            )
        } else if !holds_memory_of.is_empty() {
            (
                Class::OrphanedWorker,
                format!(
                    "keeps the GPU memory of exited {}: it holds the device files it inherited",
                    pid_list(holds_memory_of.iter().copied())
                ),
                None,
            )
        } else if lost_its_group_leader(p, procs) {
            (
                Class::OrphanedWorker,
                format!(
                    "holds device files; the process that started its group ({}) is gone and it was reparented to {}; NVML shows no GPU memory for it",
                    p.pgid, p.ppid
                ),
                None,
            )
        } else {
            (
                Class::IdleHolder,
                "holds device files; NVML lists no CUDA context for it".to_string(),
                None,
            )
        };
        holders.push(Holder {
            pid: p.pid,
            class,
            reason,
            known_by: known_by(p, false),
            gpus: Vec::new(),
            process: Some(p.clone()),
            held_by: Vec::new(),
            holds_memory_of,
            reap_parent,
        });
    }

    let unreadable = procs
        .procs
        .values()
        .filter(|p| p.devices.unreadable)
        .count();
    if unreadable > 0 {
        notes.push(format!(
            "{unreadable} processes could not be inspected (their fds or maps were not readable: other users' processes need root with CAP_SYS_PTRACE, and one that was exiting reads so too); GPU files they hold are not listed"
        ));
    }
    if let Some(n) = &ns.note {
        notes.push(n.clone());
    }

    let gpus = summarize_gpus(gpus, &holders, dev_prefix);
    holders.sort_by_key(|h| (h.class, h.pid));
    Report {
        nvml: match nvml {
            NvmlView::Available { driver, .. } => NvmlStatus {
                available: true,
                driver: driver.clone(),
                reason: None,
            },
            NvmlView::Unavailable { reason } => NvmlStatus {
                available: false,
                driver: None,
                reason: Some(reason.clone()),
            },
        },
        pid_namespace: ns.clone(),
        gpus,
        holders,
        notes,
    }
}

fn summarize_gpus(gpus: &[GpuDevice], holders: &[Holder], dev_prefix: &str) -> Vec<GpuSummary> {
    gpus.iter()
        .map(|g| {
            let listed_bytes: u64 = g.processes.iter().filter_map(|p| p.used_bytes).sum();
            let nobody: u64 = holders
                .iter()
                .filter(|h| h.class == Class::ExitedButListed && h.held_by.is_empty())
                .flat_map(|h| {
                    h.gpus
                        .iter()
                        .filter(|u| u.gpu == g.index)
                        .filter_map(|u| u.used_bytes)
                })
                .sum();
            let holder_pids = holders
                .iter()
                .filter(|h| {
                    h.gpus.iter().any(|u| u.gpu == g.index)
                        || (g.minor.is_some()
                            && h.process.as_ref().is_some_and(|p| {
                                g.minor
                                    .is_some_and(|m| p.devices.gpu_minors(dev_prefix).contains(&m))
                            }))
                })
                .map(|h| h.pid)
                .collect();
            GpuSummary {
                device: g.clone(),
                holder_pids,
                listed_bytes,
                unattributed_bytes: g.used_bytes.saturating_sub(listed_bytes),
                held_by_nobody_visible_bytes: nobody,
            }
        })
        .collect()
}

/// The evidence of a `held_by` list in words.
fn evidence_words(held_by: &[HeldBy]) -> &'static str {
    if held_by.iter().all(|h| h.evidence == WEAK_EVIDENCE) {
        "holding the GPU's device file; no link to it found"
    } else if held_by.iter().any(|h| h.evidence == "inherited_mapping") {
        "mapping the GPU's device memory it inherited, with no context of its own"
    } else {
        "holding the device files it inherited"
    }
}

fn pid_list(pids: impl Iterator<Item = u32>) -> String {
    let v: Vec<String> = pids.map(|p| p.to_string()).collect();
    match v.len() {
        0 => "nobody".into(),
        1 => format!("pid {}", v[0]),
        _ => format!("pids {}", v.join(", ")),
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::nvml::{ContextKind, NvmlProcess};
    use crate::proc_scan::DeviceHoldings;

    pub fn proc_(pid: u32, ppid: u32, pgid: u32, state: ProcState, files: &[&str]) -> ProcInfo {
        ProcInfo {
            pid,
            comm: format!("p{pid}"),
            cmdline: format!("p{pid} --arg"),
            state,
            ppid,
            pgid,
            sid: pgid,
            uid: 1000,
            user: "u".into(),
            start_ticks: 100 + pid as u64,
            started_unix: None,
            kernel_thread: false,
            cgroup: "/".into(),
            container: None,
            nspid: vec![pid],
            devices: DeviceHoldings {
                open: files.iter().map(|s| s.to_string()).collect(),
                ..DeviceHoldings::default()
            },
        }
    }

    pub fn snapshot(ps: Vec<ProcInfo>) -> ProcSnapshot {
        ProcSnapshot {
            procs: ps.into_iter().map(|p| (p.pid, p)).collect(),
        }
    }

    pub fn gpu(listed: &[(u32, u64)]) -> NvmlView {
        NvmlView::Available {
            driver: Some("sim".into()),
            gpus: vec![GpuDevice {
                index: 0,
                name: "Sim".into(),
                uuid: "GPU-0".into(),
                minor: Some(0),
                total_bytes: 100 << 30,
                used_bytes: listed.iter().map(|l| l.1).sum::<u64>() + (500 << 20),
                free_bytes: 0,
                processes: listed
                    .iter()
                    .map(|&(pid, b)| NvmlProcess {
                        pid,
                        used_bytes: Some(b),
                        kind: ContextKind::Compute,
                    })
                    .collect(),
            }],
        }
    }

    pub fn host_ns() -> PidNamespace {
        PidNamespace {
            initial: true,
            inode: Some(0xEFFF_FFFC),
            translatable: true,
            note: None,
        }
    }

    /// `classify` as on a host: the initial pid namespace, the real device files.
    pub fn classify_host(nvml: &NvmlView, procs: &ProcSnapshot) -> Report {
        classify(nvml, procs, &host_ns(), "/dev/nvidia")
    }

    const DEV: &[&str] = &["/dev/nvidia0", "/dev/nvidiactl", "/dev/nvidia-uvm"];

    /// The GPU.md crash: parent 100 (group leader) killed, worker 101 keeps its files.
    #[test]
    fn crashed_parent_points_at_forked_worker() {
        let procs = snapshot(vec![
            proc_(1, 0, 1, ProcState::Sleeping, &[]),
            proc_(101, 1, 100, ProcState::Sleeping, DEV),
            proc_(300, 1, 300, ProcState::Sleeping, &["/dev/nvidiactl"]),
        ]);
        let r = classify_host(&gpu(&[(100, 2566 << 20)]), &procs);
        let dead = r.holder(100).expect("listed");
        assert_eq!(dead.class, Class::ExitedButListed);
        assert_eq!(
            dead.held_by,
            vec![HeldBy {
                pid: 101,
                evidence: "process_group"
            }]
        );
        let w = r.holder(101).expect("worker");
        assert_eq!(w.class, Class::OrphanedWorker);
        assert_eq!(w.holds_memory_of, vec![100]);
        // A daemon leading its own group is not an orphan.
        assert_eq!(r.holder(300).expect("daemon").class, Class::IdleHolder);
        assert_eq!(r.gpus[0].held_by_nobody_visible_bytes, 0);
        assert_eq!(r.gpus[0].unattributed_bytes, 500 << 20);
    }

    #[test]
    fn dead_pid_with_no_holder_is_reported_as_held_by_nobody() {
        let r = classify_host(&gpu(&[(100, 1 << 30)]), &snapshot(vec![]));
        assert_eq!(r.holder(100).expect("listed").class, Class::ExitedButListed);
        assert_eq!(r.gpus[0].held_by_nobody_visible_bytes, 1 << 30);
    }

    fn mapped(mut p: ProcInfo, files: &[&str]) -> ProcInfo {
        p.devices.mapped = files.iter().map(|s| s.to_string()).collect();
        p.devices.mapping_count = files.len();
        p
    }

    /// Issue 14: the worker called setsid() (own group and session) and was
    /// reparented to init; it maps the GPU and holds nvidia-uvm.
    #[test]
    fn setsid_worker_is_linked_by_its_inherited_mapping() {
        let worker = mapped(
            proc_(660, 1, 660, ProcState::Sleeping, DEV),
            &["/dev/nvidia0"],
        );
        let agent = proc_(300, 1, 300, ProcState::Sleeping, &["/dev/nvidiactl"]);
        let smi = mapped(
            proc_(
                301,
                1,
                301,
                ProcState::Sleeping,
                &["/dev/nvidiactl", "/dev/nvidia0"],
            ),
            &["/dev/nvidiactl"],
        );
        let procs = snapshot(vec![
            proc_(1, 0, 1, ProcState::Sleeping, &[]),
            worker,
            agent,
            smi,
        ]);
        let r = classify_host(&gpu(&[(639, 2566 << 20)]), &procs);
        assert_eq!(
            r.holder(639).expect("dead").held_by,
            vec![HeldBy {
                pid: 660,
                evidence: "inherited_mapping"
            }]
        );
        let w = r.holder(660).expect("worker");
        assert_eq!(w.class, Class::OrphanedWorker);
        assert_eq!(w.holds_memory_of, vec![639]);
        assert_eq!(r.holder(300).expect("agent").class, Class::IdleHolder);
        assert_eq!(r.holder(301).expect("smi").class, Class::IdleHolder);
    }

    /// A worker forked by a living CUDA process maps its parent's context:
    /// not evidence for some other dead pid.
    #[test]
    fn mapping_inherited_from_a_living_listed_parent_is_no_evidence() {
        let parent = mapped(
            proc_(500, 1, 500, ProcState::Sleeping, DEV),
            &["/dev/nvidia0"],
        );
        let child = mapped(
            proc_(501, 500, 501, ProcState::Sleeping, DEV),
            &["/dev/nvidia0"],
        );
        let procs = snapshot(vec![parent, child]);
        let r = classify_host(&gpu(&[(500, 1 << 30), (639, 2 << 30)]), &procs);
        assert_eq!(
            r.holder(639).expect("dead").held_by,
            vec![HeldBy {
                pid: 501,
                evidence: WEAK_EVIDENCE
            }]
        );
        assert_eq!(r.holder(501).expect("child").class, Class::IdleHolder);
    }

    /// A worker linked to one dead pid through the tree does not also get
    /// the memory of another dead pid on the same GPU through its mapping.
    #[test]
    fn tree_link_explains_the_mapping() {
        let worker = mapped(
            proc_(101, 1, 100, ProcState::Sleeping, DEV),
            &["/dev/nvidia0"],
        );
        let procs = snapshot(vec![worker]);
        let r = classify_host(&gpu(&[(100, 2 << 30), (200, 1 << 30)]), &procs);
        assert_eq!(r.holder(101).expect("worker").holds_memory_of, vec![100]);
        assert_eq!(
            r.holder(200).expect("other").held_by,
            vec![HeldBy {
                pid: 101,
                evidence: WEAK_EVIDENCE
            }]
        );
    }

    /// Control and unified-memory files alone make no candidate, even for a
    /// child of the dead pid.
    #[test]
    fn control_files_alone_are_no_evidence() {
        let child = proc_(
            101,
            100,
            100,
            ProcState::Sleeping,
            &["/dev/nvidiactl", "/dev/nvidia-uvm"],
        );
        let r = classify_host(&gpu(&[(100, 1 << 30)]), &snapshot(vec![child]));
        assert!(r.holder(100).expect("dead").held_by.is_empty());
        assert!(r.holder(101).expect("child").holds_memory_of.is_empty());
    }

    #[test]
    fn weak_candidates_when_no_link() {
        let procs = snapshot(vec![proc_(200, 1, 200, ProcState::Sleeping, DEV)]);
        let r = classify_host(&gpu(&[(100, 1 << 30)]), &procs);
        assert_eq!(
            r.holder(100).expect("l").held_by,
            vec![HeldBy {
                pid: 200,
                evidence: "device_files"
            }]
        );
        // Weak evidence alone does not make an orphan.
        assert_eq!(r.holder(200).expect("h").class, Class::IdleHolder);
    }

    #[test]
    fn states_active_zombie_d() {
        let procs = snapshot(vec![
            proc_(10, 1, 10, ProcState::Running, DEV),
            proc_(11, 50, 50, ProcState::Zombie, &[]),
            proc_(12, 1, 12, ProcState::DiskSleep, DEV),
            proc_(50, 1, 50, ProcState::Sleeping, &[]),
        ]);
        let r = classify_host(&gpu(&[(10, 1), (11, 2), (12, 3)]), &procs);
        assert_eq!(r.holder(10).expect("a").class, Class::Active);
        let z = r.holder(11).expect("z");
        assert_eq!((z.class, z.reap_parent), (Class::Zombie, Some(50)));
        assert_eq!(r.holder(12).expect("d").class, Class::StuckD);
        assert!(r.holder(50).is_none(), "non-holder parent is not a holder");
    }

    #[test]
    fn other_namespace_is_never_matched_locally() {
        let procs = snapshot(vec![proc_(2, 1, 2, ProcState::Sleeping, &[])]);
        let ns = PidNamespace {
            initial: false,
            inode: Some(1),
            translatable: false,
            note: Some("n".into()),
        };
        let r = classify(&gpu(&[(2, 1 << 20)]), &procs, &ns, "/dev/nvidia");
        let h = r.holder(2).expect("listed");
        assert_eq!(h.class, Class::OtherNamespace);
        assert!(h.process.is_none());
    }

    #[test]
    fn class_names_match_json() {
        use Class::*;
        for c in [
            Active,
            StuckD,
            Zombie,
            ExitedButListed,
            OrphanedWorker,
            IdleHolder,
            OtherNamespace,
        ] {
            assert_eq!(
                serde_json::to_value(c).expect("json"),
                serde_json::json!(c.as_str())
            );
        }
    }

    #[test]
    fn nvml_absent_still_lists_proc_holders() {
        let procs = snapshot(vec![proc_(7, 1, 7, ProcState::Sleeping, DEV)]);
        let r = classify_host(&NvmlView::Unavailable { reason: "x".into() }, &procs);
        assert!(!r.nvml.available);
        assert_eq!(r.holder(7).expect("h").class, Class::IdleHolder);
    }
}
