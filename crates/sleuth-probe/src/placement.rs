//! Keeping the tracer's own threads out of the traced program's way.
//!
//! The traced threads' allowed CPUs are read (`sched_getaffinity` of every
//! thread of every traced process) and compared with the CPUs gpusleuth may
//! use. When some of ours are outside every traced thread's set, the
//! tracer's threads (the draining thread and every `gpusleuth-*` helper:
//! writer, symbolizer, live view, NVML sampler, rotation) are pinned there:
//! they cannot preempt a traced thread at all. Of those CPUs, the ones on
//! cores no traced CPU shares are taken when there are any: two hardware
//! threads of a core share its execution units, so a tracer thread on a
//! traced CPU's sibling would slow the program and itself. When there are none (the
//! usual unpinned program may run anywhere), nothing is pinned: pinning the
//! tracer to one CPU would put it on a CPU the program uses anyway, and
//! crowd its own threads. The helpers run at nice +10 in both cases; the
//! draining thread keeps nice 0, because it must keep up with the ring
//! buffer (a starved consumer loses events, which are counted, but lost).
//!
//! `GPUSLEUTH_PLACEMENT=off` turns all of this off (for before/after
//! measurements in one binary: `gpusleuth bench`); the writer then keeps
//! only the nice +10 it always sets itself.

use std::collections::BTreeSet;

/// The environment variable that turns placement off (`off`).
pub const PLACEMENT_ENV: &str = "GPUSLEUTH_PLACEMENT";
/// Nice value of the tracer's helper threads.
pub const HELPER_NICE: i32 = 10;
/// Thread names (prefix) of the tracer's helper threads.
const HELPER_PREFIX: &str = "gpusleuth-";

/// A set of CPU numbers.
pub type Cpus = BTreeSet<usize>;

/// Lowers the calling thread to [`HELPER_NICE`] (a helper thread's first call).
pub fn lower_this_thread() {
    set_nice(gettid(), HELPER_NICE);
}

fn gettid() -> u32 {
    // SAFETY: gettid has no preconditions and cannot fail.
    unsafe { libc::gettid() as u32 }
}

fn set_nice(tid: u32, nice: i32) -> bool {
    // SAFETY: setpriority takes plain integers; with PRIO_PROCESS and a tid
    // it changes only that thread's nice value (lowering needs no privilege).
    unsafe { libc::setpriority(libc::PRIO_PROCESS, tid as libc::id_t, nice) == 0 }
}

/// The CPUs thread `tid` may run on; None if it is gone.
pub fn affinity(tid: u32) -> Option<Cpus> {
    // SAFETY: an all-zero cpu_set_t is a valid empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: `set` is a valid cpu_set_t of the size passed; the kernel writes at most that much.
    let r = unsafe {
        libc::sched_getaffinity(
            tid as libc::pid_t,
            std::mem::size_of::<libc::cpu_set_t>(),
            &mut set,
        )
    };
    if r != 0 {
        return None;
    }
    let max = 8 * std::mem::size_of::<libc::cpu_set_t>();
    // SAFETY: CPU_ISSET reads bit `c` of a valid set; c < the set's size in bits.
    Some(
        (0..max)
            .filter(|&c| unsafe { libc::CPU_ISSET(c, &set) })
            .collect(),
    )
}

/// Restricts thread `tid` to `cpus`; false if the kernel refused.
pub fn set_affinity(tid: u32, cpus: &Cpus) -> bool {
    // SAFETY: an all-zero cpu_set_t is a valid empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    let max = 8 * std::mem::size_of::<libc::cpu_set_t>();
    for &c in cpus.iter().filter(|&&c| c < max) {
        // SAFETY: c is within the set's size (checked above).
        unsafe { libc::CPU_SET(c, &mut set) };
    }
    // SAFETY: `set` is a valid cpu_set_t of the size passed, read only by the kernel.
    unsafe {
        libc::sched_setaffinity(
            tid as libc::pid_t,
            std::mem::size_of::<libc::cpu_set_t>(),
            &set,
        ) == 0
    }
}

/// The threads of process `pid` (`/proc/PID/task`); empty if it is gone.
fn threads_of(pid: u32) -> Vec<u32> {
    std::fs::read_dir(format!("/proc/{pid}/task"))
        .map(|d| {
            d.flatten()
                .filter_map(|e| e.file_name().to_str()?.parse().ok())
                .collect()
        })
        .unwrap_or_default()
}

/// The CPUs any thread of the traced processes may run on.
pub fn traced_cpus(pids: &[u32]) -> Cpus {
    pids.iter()
        .flat_map(|&p| threads_of(p))
        .filter_map(affinity)
        .flatten()
        .collect()
}

/// CPUs the tracer may use that no traced thread may use (pure).
pub fn spare_cpus(ours: &Cpus, traced: &Cpus) -> Cpus {
    ours.difference(traced).copied().collect()
}

/// Of the `spare` CPUs, those whose core runs no CPU of `traced`
/// (`siblings(cpu)`: the CPUs sharing its core, itself included), when
/// there are any; else `spare` as it is. Two hardware threads of one core
/// share its execution units: a tracer thread on a traced CPU's sibling
/// slows the traced thread and runs slower itself (pure).
pub fn off_traced_cores(spare: &Cpus, traced: &Cpus, siblings: impl Fn(usize) -> Cpus) -> Cpus {
    let whole: Cpus = spare
        .iter()
        .copied()
        .filter(|&c| siblings(c).is_disjoint(traced))
        .collect();
    match whole.is_empty() {
        true => spare.clone(),
        false => whole,
    }
}

/// The CPUs sharing `cpu`'s core, itself included (sysfs
/// `topology/thread_siblings_list`); just `cpu` when unreadable.
pub fn core_siblings(cpu: usize) -> Cpus {
    std::fs::read_to_string(format!(
        "/sys/devices/system/cpu/cpu{cpu}/topology/thread_siblings_list"
    ))
    .ok()
    .and_then(|s| parse_cpu_list(s.trim()))
    .unwrap_or_else(|| Cpus::from([cpu]))
}

/// Parses a `0-3,8` style list (the kernel's); None if malformed.
pub fn parse_cpu_list(s: &str) -> Option<Cpus> {
    let mut out = Cpus::new();
    for part in s.split(',').filter(|p| !p.is_empty()) {
        let (lo, hi): (usize, usize) = match part.split_once('-') {
            Some((lo, hi)) => (lo.parse().ok()?, hi.parse().ok()?),
            None => {
                let c = part.parse().ok()?;
                (c, c)
            }
        };
        // A range wider than any cpu_set_t is not the kernel's.
        if lo > hi || hi >= libc::CPU_SETSIZE as usize {
            return None;
        }
        out.extend(lo..=hi);
    }
    Some(out)
}

/// What placement decided, for the trace's notes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// Tracer threads pinned to these CPUs (none of them a traced thread's).
    Pinned(Cpus),
    /// Every CPU of ours may run a traced thread: unpinned, helpers at nice +10.
    Shared,
}

impl Decision {
    pub fn describe(&self) -> String {
        match self {
            Decision::Pinned(c) => format!(
                "tracer threads pinned to CPU {} (outside the traced threads' CPUs); helpers at nice +{HELPER_NICE}",
                cpu_list(c)
            ),
            Decision::Shared => format!(
                "the traced threads may run on every CPU: tracer threads not pinned; helpers at nice +{HELPER_NICE}, the ring-buffer consumer at normal priority"
            ),
        }
    }
}

/// `0-3,8` style list.
pub fn cpu_list(c: &Cpus) -> String {
    let mut out: Vec<String> = Vec::new();
    let mut it = c.iter().copied().peekable();
    while let Some(lo) = it.next() {
        let mut hi = lo;
        while it.peek() == Some(&(hi + 1)) {
            hi += 1;
            it.next();
        }
        out.push(if lo == hi {
            lo.to_string()
        } else {
            format!("{lo}-{hi}")
        });
    }
    out.join(",")
}

/// Placement state of one trace: re-applied as traced processes and the
/// tracer's threads come and go.
pub struct Placement {
    /// CPUs gpusleuth was allowed at start (before any pinning of its own).
    ours: Cpus,
    /// Each of ours with the CPUs sharing its core (read once: placement
    /// is re-applied every rescan).
    siblings: std::collections::BTreeMap<usize, Cpus>,
    decision: Option<Decision>,
    /// Helper threads already lowered.
    lowered: BTreeSet<u32>,
}

impl Placement {
    /// None when turned off (`GPUSLEUTH_PLACEMENT=off`) or when our own CPUs
    /// cannot be read. Call before pinning anything (it reads ours).
    pub fn from_env() -> Option<Placement> {
        if std::env::var(PLACEMENT_ENV).is_ok_and(|v| v == "off") {
            return None;
        }
        let ours = affinity(std::process::id())?;
        Some(Placement {
            siblings: ours.iter().map(|&c| (c, core_siblings(c))).collect(),
            ours,
            decision: None,
            lowered: BTreeSet::new(),
        })
    }

    /// Places the tracer's threads for the traced processes `pids`. Returns
    /// the decision when it changed (to be noted in the trace).
    pub fn update(&mut self, pids: &[u32]) -> Option<Decision> {
        let me = std::process::id();
        let traced = traced_cpus(pids);
        let siblings = |c: usize| {
            self.siblings
                .get(&c)
                .cloned()
                .unwrap_or_else(|| Cpus::from([c]))
        };
        let spare = off_traced_cores(&spare_cpus(&self.ours, &traced), &traced, siblings);
        let decision = if spare.is_empty() || pids.is_empty() {
            Decision::Shared
        } else {
            Decision::Pinned(spare)
        };
        let tids = threads_of(me);
        for &tid in &tids {
            let helper = tid != me && thread_name(me, tid).starts_with(HELPER_PREFIX);
            if helper && self.lowered.insert(tid) {
                set_nice(tid, HELPER_NICE);
            }
            let cpus = match &decision {
                Decision::Pinned(c) => c,
                Decision::Shared => &self.ours,
            };
            // Only our own threads; a thread that just ended is simply skipped.
            if affinity(tid).as_ref() != Some(cpus) {
                set_affinity(tid, cpus);
            }
        }
        self.lowered.retain(|t| tids.contains(t));
        if self.decision.as_ref() == Some(&decision) {
            return None;
        }
        self.decision = Some(decision.clone());
        Some(decision)
    }
}

/// CPU time of the tracer's own threads so far, in ns: the draining thread
/// (the main thread), the writer (`gpusleuth-db`) and every other
/// `gpusleuth-*` helper. From `/proc/self/task/*/schedstat` (time on CPU,
/// exact); threads that already ended are not in it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TracerCpu {
    pub poller_ns: u64,
    pub writer_ns: u64,
    pub helpers_ns: u64,
    /// The part of `poller_ns` and `writer_ns` spent in the kernel (system
    /// time, from `/proc/self/task/*/stat` in clock ticks: 10 ms steps on
    /// most kernels), to tell syscall and file-system cost from our own code.
    pub poller_sys_ns: u64,
    pub writer_sys_ns: u64,
}

pub fn tracer_cpu() -> TracerCpu {
    let me = std::process::id();
    let mut t = TracerCpu::default();
    for tid in threads_of(me) {
        let Some(ns) = std::fs::read_to_string(format!("/proc/{me}/task/{tid}/schedstat"))
            .ok()
            .and_then(|s| s.split_whitespace().next()?.parse::<u64>().ok())
        else {
            continue;
        };
        let name = thread_name(me, tid);
        if tid == me {
            t.poller_ns += ns;
            t.poller_sys_ns += system_ns(me, tid);
        } else if name == "gpusleuth-db" {
            t.writer_ns += ns;
            t.writer_sys_ns += system_ns(me, tid);
        } else if name.starts_with(HELPER_PREFIX) {
            t.helpers_ns += ns;
        }
    }
    t
}

/// System time of a thread in ns (0 when unreadable).
fn system_ns(pid: u32, tid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/stat")).unwrap_or_default();
    // SAFETY: sysconf takes a plain integer and has no preconditions.
    let ticks_per_s = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    stime_ticks(&stat)
        .filter(|_| ticks_per_s > 0)
        .map(|t| t.saturating_mul(1_000_000_000) / ticks_per_s as u64)
        .unwrap_or(0)
}

/// `stime` (field 15) of a `/proc/*/task/*/stat` line; the command name
/// (field 2) may hold spaces and parentheses, so fields are counted from
/// the last `)`.
fn stime_ticks(stat: &str) -> Option<u64> {
    let rest = &stat[stat.rfind(')')? + 1..];
    rest.split_whitespace().nth(12)?.parse().ok()
}

fn thread_name(pid: u32, tid: u32) -> String {
    std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/comm"))
        .map(|s| s.trim_end().to_string())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(v: &[usize]) -> Cpus {
        v.iter().copied().collect()
    }

    #[test]
    fn system_time_is_read_past_a_command_name_with_spaces() {
        let line = "42 (a b) c) S 1 42 42 0 -1 4194560 100 0 0 0 731 29 0 0 20 0 3 0";
        assert_eq!(stime_ticks(line), Some(29));
        assert_eq!(stime_ticks("42 (x) S 1"), None);
        assert_eq!(stime_ticks("no name"), None);
        // This thread's own line parses.
        let me = std::process::id();
        let own = std::fs::read_to_string(format!("/proc/{me}/task/{}/stat", gettid())).unwrap();
        assert!(stime_ticks(&own).is_some(), "{own}");
    }

    #[test]
    fn spare_cpus_off_the_traced_cores_when_there_are_some() {
        // Two threads per core: (0, 4), (1, 5), (2, 6), (3, 7).
        let siblings = |c: usize| set(&[c % 4, c % 4 + 4]);
        let traced = set(&[0]);
        let spare = spare_cpus(&set(&[0, 1, 2, 3, 4, 5, 6, 7]), &traced);
        assert_eq!(
            off_traced_cores(&spare, &traced, siblings),
            set(&[1, 2, 3, 5, 6, 7])
        );
        // Every spare CPU shares a core with a traced one: the spare ones still.
        let traced = set(&[0, 1, 2, 3]);
        let spare = set(&[4, 5, 6, 7]);
        assert_eq!(off_traced_cores(&spare, &traced, siblings), spare);
        // No SMT: each CPU its own core.
        let alone = |c: usize| set(&[c]);
        assert_eq!(
            off_traced_cores(&set(&[1, 2]), &set(&[0]), alone),
            set(&[1, 2])
        );
    }

    #[test]
    fn cpu_lists_parse_as_the_kernel_writes_them() {
        assert_eq!(parse_cpu_list("0-2,5,7-8"), Some(set(&[0, 1, 2, 5, 7, 8])));
        assert_eq!(parse_cpu_list("3"), Some(set(&[3])));
        assert_eq!(parse_cpu_list("0,64"), Some(set(&[0, 64])));
        for bad in ["x", "3-1", "1-", "0-99999999", "-1"] {
            assert_eq!(parse_cpu_list(bad), None, "{bad}");
        }
        // This machine's own topology reads back with each CPU among its siblings.
        assert!(core_siblings(0).contains(&0));
    }

    #[test]
    fn spare_cpus_are_ours_minus_the_traced_ones() {
        assert_eq!(spare_cpus(&set(&[0, 1, 2, 3]), &set(&[0, 1])), set(&[2, 3]));
        assert!(spare_cpus(&set(&[0, 1]), &set(&[0, 1, 2])).is_empty());
        assert_eq!(cpu_list(&set(&[0, 1, 2, 5, 7, 8])), "0-2,5,7-8");
        assert_eq!(cpu_list(&set(&[])), "");
    }

    #[test]
    fn a_thread_reads_back_the_affinity_it_was_given() {
        // A thread of its own, so the test runner's threads keep theirs.
        let got = std::thread::spawn(|| {
            let all = affinity(gettid()).expect("own affinity");
            let first: Cpus = all.iter().copied().take(1).collect();
            assert!(set_affinity(gettid(), &first));
            (first.clone(), affinity(gettid()).expect("read back"))
        })
        .join()
        .expect("thread");
        assert_eq!(got.0, got.1);
    }
}
