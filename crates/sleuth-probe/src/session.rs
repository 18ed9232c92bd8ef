//! A capture session: the pipeline from the kernel to typed events, with no
//! sink attached. It discovers CUDA libraries (standard places, the
//! command's RUNPATH, traced processes' memory maps), attaches to them,
//! rescans as processes map new ones, polls the ring buffer, decodes each
//! record, registers CPython processes for frame walking, and resolves call
//! sites while their process is alive. What to do with the results (store
//! them, show them, serve them) is the caller's business: `trace` feeds the
//! writer, the live view and the metrics from [`Captured`] items.

use crate::capture::{AttachedLib, Capture, CaptureError, LaunchMode, SiteOptions};
use crate::discover::{self, LibFile};
use crate::sites::{python, SiteResolver, Unsymbolized};
use crate::trap_cost::EntryClass;
use sleuth_core::ops::Layer;
use sleuth_core::record::{self, stat};
use sleuth_core::{Event, OpCount, ProcKind};
use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::time::{Duration, Instant};

/// How long after exec (or first sight) a process is looked at for CPython:
/// libpython is mapped by the dynamic loader right after exec, well within this.
const WATCH_FOR: Duration = Duration::from_secs(5);

/// How to start a session.
#[derive(Debug, Clone)]
pub struct SessionOptions {
    /// Trace every process that calls a probed CUDA function.
    pub trace_all: bool,
    pub launch_mode: LaunchMode,
    /// Ring buffer size in bytes (rounded up to a power of two).
    pub ring_bytes: u32,
    pub sites: SiteOptions,
    /// Also probe PyTorch's caching allocator (libc10_cuda.so).
    pub torch_allocator: bool,
}

/// One thing the session produced, in ring-buffer order for the records.
#[derive(Debug)]
pub enum Captured {
    /// A decoded record.
    Event(Event),
    /// A call site, resolved as far as its live process is needed (Python
    /// frames read, native frames placed in their files): the native
    /// function names are for the caller to add (`Unsymbolized::finish`),
    /// off the draining thread.
    Stack(Unsymbolized),
    /// A process seen for the first time, or running a new program (fork,
    /// exec): its name and command line are worth reading now.
    Process(u32),
    /// A library file was probed; `late` when found by a rescan after start.
    Attached { lib: AttachedLib, late: bool },
    /// A library file found but not probed (reported once per file).
    NotProbed(CaptureError),
    /// A fact about the capture worth a note (`warn`: a loss of coverage).
    Note { warn: bool, text: String },
}

/// Records seen on the user-space side of the ring buffer.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RecordCounts {
    /// Every record taken from the ring buffer.
    pub records: u64,
    /// Calls and NCCL calls decoded.
    pub calls: u64,
    pub waits: u64,
    pub procs: u64,
    /// Records that could not be decoded.
    pub decode_errors: u64,
    /// Distinct call sites resolved.
    pub stacks: u64,
}

/// The kernel's loss counters (`stats` map), by name. Records the kernel
/// could not hand over: the ring buffer was full, or a kernel map was.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LossStats {
    pub ring_full_call: u64,
    pub ring_full_wait: u64,
    pub ring_full_proc: u64,
    pub ring_full_block: u64,
    pub ring_full_nccl: u64,
    pub ring_full_stack: u64,
    pub inflight_map_full: u64,
    pub thread_map_full: u64,
    pub count_map_full: u64,
    pub traced_map_full: u64,
    /// Switches to a traced thread our scheduler program did not see: not a
    /// loss (the waits were closed by the next probe, switch-in estimated).
    pub switch_in_unseen: u64,
    /// Not a loss: a return whose entry came before the process was traced.
    pub unmatched_return: u64,
}

impl LossStats {
    /// From the kernel's array, indexed by `record::stat`.
    pub fn from_counters(c: &[u64; stat::MAX]) -> LossStats {
        LossStats {
            ring_full_call: c[stat::RING_DROP_CALL],
            ring_full_wait: c[stat::RING_DROP_WAIT],
            ring_full_proc: c[stat::RING_DROP_PROC],
            ring_full_block: c[stat::RING_DROP_BLOCK],
            ring_full_nccl: c[stat::RING_DROP_NCCL],
            ring_full_stack: c[stat::RING_DROP_STACK],
            inflight_map_full: c[stat::INFLIGHT_FULL],
            thread_map_full: c[stat::THREAD_FULL],
            count_map_full: c[stat::COUNT_FULL],
            traced_map_full: c[stat::TRACED_FULL],
            switch_in_unseen: c[stat::SWITCH_IN_UNSEEN],
            unmatched_return: c[stat::UNMATCHED_RETURN],
        }
    }

    /// The counters as the kernel indexes them (stored and served by `stat::NAMES`).
    pub fn counters(&self) -> [u64; stat::MAX] {
        let mut c = [0; stat::MAX];
        c[stat::RING_DROP_CALL] = self.ring_full_call;
        c[stat::RING_DROP_WAIT] = self.ring_full_wait;
        c[stat::RING_DROP_PROC] = self.ring_full_proc;
        c[stat::RING_DROP_BLOCK] = self.ring_full_block;
        c[stat::RING_DROP_NCCL] = self.ring_full_nccl;
        c[stat::RING_DROP_STACK] = self.ring_full_stack;
        c[stat::INFLIGHT_FULL] = self.inflight_map_full;
        c[stat::THREAD_FULL] = self.thread_map_full;
        c[stat::COUNT_FULL] = self.count_map_full;
        c[stat::TRACED_FULL] = self.traced_map_full;
        c[stat::SWITCH_IN_UNSEEN] = self.switch_in_unseen;
        c[stat::UNMATCHED_RETURN] = self.unmatched_return;
        c
    }

    /// Records lost because the ring buffer was full, every record kind.
    pub fn ring(&self) -> u64 {
        self.ring_full_call
            + self.ring_full_wait
            + self.ring_full_proc
            + self.ring_full_block
            + self.ring_full_nccl
            + self.ring_full_stack
    }

    /// Records lost because a kernel map was full.
    pub fn maps(&self) -> u64 {
        self.inflight_map_full + self.thread_map_full + self.count_map_full + self.traced_map_full
    }

    /// Every loss (attach edges and settled gaps excluded).
    pub fn total(&self) -> u64 {
        self.ring() + self.maps()
    }
}

/// A running capture with its discovery and decoding state.
pub struct CaptureSession {
    cap: Capture,
    start_mono: u64,
    trace_all: bool,
    /// Whether tracing proper began (a library found after it is "late").
    started: bool,
    known_pids: HashSet<u32>,
    /// Library files (dev, ino) that could not be probed: reported once, not every rescan.
    unprobed: HashSet<(u64, u64)>,
    sites_on: bool,
    resolver: SiteResolver,
    /// Processes to look at for CPython, until the deadline.
    watching: HashMap<u32, Instant>,
    counts: RecordCounts,
    /// Processes that exited in the last poll, their kernel counts still to
    /// take ([`Capture::take_op_counts`]).
    exited: Vec<u32>,
    /// Final kernel counts of processes that exited, taken out of the
    /// kernel's map: part of [`CaptureSession::op_counts`] until a new file
    /// of a rotating run no longer needs them ([`Self::forget_exited_counts`]).
    exited_counts: Vec<OpCount>,
    /// One probe trap's cost to the calling thread (`crate::trap_cost`), on
    /// a function that begins as the counted launch functions of the
    /// library it was measured for do, and that library's layer (a driver
    /// library's wins: its launches are the ones counted by default); None
    /// until a library that counts launches is attached, or where it could
    /// not be measured.
    trap: Option<(u64, Layer)>,
    /// The cost measured per class of first instruction (None: failed).
    trap_by_class: HashMap<EntryClass, Option<u64>>,
    /// A recorded call's two traps (entry and return), on a function that
    /// begins as the recorded calls of the library it was measured for do,
    /// and that library's rank ([`call_trap_rank`]); None until a library
    /// that records calls is attached, or where it could not be measured.
    call_trap: Option<(u64, (bool, bool))>,
    /// The recorded call's cost measured per class (None: failed).
    call_trap_by_class: HashMap<EntryClass, Option<u64>>,
}

/// The cost cached for `class`, measured by `measure` the first time it is
/// asked for (None where that failed: logged, naming `what`, and not tried
/// again).
fn cached_cost(
    cache: &mut HashMap<EntryClass, Option<u64>>,
    class: EntryClass,
    what: &str,
    measure: impl FnOnce() -> Result<u64, CaptureError>,
) -> Option<u64> {
    *cache.entry(class).or_insert_with(|| {
        measure()
            .inspect_err(|e| log::warn!("the cost of {what} was not measured: {e}"))
            .ok()
    })
}

/// Which library's recorded calls set their traps' cost: one that records
/// launches (`--launches full`: thousands a second) over one that does
/// not, then a driver library's (its launches nest in the runtime's and
/// are counted by default) over another's.
fn call_trap_rank(e: crate::capture::RecordedEntry, layer: Layer) -> (bool, bool) {
    (e.launches, layer == Layer::Driver)
}

impl CaptureSession {
    /// Loads and attaches the eBPF programs (no library probed yet).
    pub fn start(opts: &SessionOptions, start_mono: u64) -> Result<CaptureSession, CaptureError> {
        let mut cap = Capture::start_with_sites(
            opts.trace_all,
            opts.launch_mode,
            opts.ring_bytes,
            opts.sites,
        )?;
        cap.set_torch_allocator(opts.torch_allocator);
        Ok(CaptureSession {
            cap,
            start_mono,
            trace_all: opts.trace_all,
            started: false,
            known_pids: HashSet::new(),
            unprobed: HashSet::new(),
            sites_on: opts.sites.on,
            resolver: SiteResolver::default(),
            watching: HashMap::new(),
            counts: RecordCounts::default(),
            exited: Vec::new(),
            exited_counts: Vec::new(),
            trap: None,
            trap_by_class: HashMap::new(),
            call_trap: None,
            call_trap_by_class: HashMap::new(),
        })
    }

    /// One probe trap's cost to the calling thread, measured as the counted
    /// launches' library was attached; None before or where it could not be.
    pub fn trap_ns(&self) -> Option<u64> {
        self.trap.map(|(ns, _)| ns)
    }

    /// A recorded call's probes' cost to the calling thread (its entry and
    /// return traps), measured as the libraries that record calls were
    /// attached; None before or where it could not be.
    pub fn call_trap_ns(&self) -> Option<u64> {
        self.call_trap.map(|(ns, _)| ns)
    }

    /// Probes every library found in standard places and `extra_dirs`, the
    /// files in `libs`, and those mapped by `pids` (or by every process in
    /// trace-all mode).
    pub fn discover(
        &mut self,
        libs: &[PathBuf],
        extra_dirs: &[PathBuf],
        pids: &[u32],
        mut f: impl FnMut(Captured),
    ) {
        let mut found: Vec<LibFile> = libs.iter().filter_map(|p| discover::lib_file(p)).collect();
        found.extend(discover::scan_standard(extra_dirs));
        let all;
        let pids = if self.trace_all {
            all = discover::all_pids();
            &all
        } else {
            pids
        };
        for &p in pids {
            found.extend(discover::libs_mapped_by(p));
        }
        for lib in &found {
            self.attach(lib, &mut f);
        }
    }

    /// Starts tracing `pid` (its children follow in the kernel).
    pub fn trace_pid(&mut self, pid: u32, mut f: impl FnMut(Captured)) -> Result<(), CaptureError> {
        self.cap.trace_pid(pid)?;
        self.note_process(pid, &mut f);
        self.watch(pid);
        Ok(())
    }

    /// From here on, libraries found by a rescan are reported as late.
    pub fn mark_started(&mut self) {
        self.started = true;
    }

    /// Waits up to `timeout` for records and hands over what they became.
    /// Also registers CPython in processes that just started it. Returns how
    /// many records were taken.
    pub fn poll(&mut self, timeout: Duration, mut f: impl FnMut(Captured)) -> usize {
        let CaptureSession {
            cap,
            known_pids,
            resolver,
            watching,
            counts,
            exited,
            ..
        } = self;
        let mut state = Decoder {
            own_pid: std::process::id(),
            known_pids,
            resolver,
            watching,
            counts,
            exited,
        };
        let n = cap.poll(timeout, |bytes| state.record(bytes, &mut f));
        for pid in std::mem::take(&mut self.exited) {
            let taken = self.cap.take_op_counts(pid);
            self.exited_counts.extend(taken);
        }
        if self.sites_on {
            self.find_python(&mut f);
        }
        n
    }

    /// Processes whose libraries are rescanned: every process in trace-all
    /// mode, else the traced ones (children included).
    pub fn scan_pids(&self) -> Vec<u32> {
        if self.trace_all {
            discover::all_pids()
        } else {
            self.cap.traced_pids()
        }
    }

    /// Probes libraries that `pids` mapped since the last look.
    pub fn rescan(&mut self, pids: &[u32], mut f: impl FnMut(Captured)) {
        for &p in pids {
            for lib in discover::libs_mapped_by(p) {
                if !self.cap.is_attached(&lib) {
                    self.attach(&lib, &mut f);
                }
            }
        }
    }

    fn attach(&mut self, lib: &LibFile, f: &mut impl FnMut(Captured)) {
        if self.unprobed.contains(&(lib.dev, lib.ino)) {
            return;
        }
        match self.cap.attach_lib(lib) {
            Ok(Some(a)) => {
                if let Some(class) = a.counted_entry {
                    self.measure_trap(class, a.lib.layer);
                }
                let measured = a
                    .recorded_entry
                    .is_some_and(|e| self.measure_call_trap(e, a.lib.layer));
                f(Captured::Attached {
                    lib: a,
                    late: self.started,
                });
                if measured {
                    // The measure's own records (up to ~320 KB, dropped as
                    // decoded) are taken now, not left for the traced
                    // program's first calls to find the ring filling (round
                    // 58's CI: a 4 KiB ring, then measured on the traced
                    // path too, dropped a workload's first allocation).
                    self.poll(Duration::ZERO, &mut *f);
                }
            }
            Ok(None) => {}
            Err(e) => {
                self.unprobed.insert((lib.dev, lib.ino));
                f(Captured::NotProbed(e));
            }
        }
    }

    /// The trap's cost on a function of `class`, for a library of `layer`
    /// that counts launches: measured once per class; a driver library's
    /// replaces a runtime library's (`--launches all` counts both, and the
    /// verdicts count a launch by the driver's count where there is one).
    fn measure_trap(&mut self, class: EntryClass, layer: Layer) {
        if self
            .trap
            .is_some_and(|(_, had)| had == Layer::Driver || layer != Layer::Driver)
        {
            return;
        }
        let cap = &mut self.cap;
        let measured = cached_cost(&mut self.trap_by_class, class, "the probes' trap", || {
            cap.measure_trap_ns(class)
        });
        if let Some(ns) = measured {
            self.trap = Some((ns, layer));
        }
    }

    /// A recorded call's traps on a function that begins as `e` says, for a
    /// library of `layer`: measured once per class, kept where the library
    /// ranks above the one measured before ([`call_trap_rank`]). Whether a
    /// measure ran (its records may still be in the ring).
    fn measure_call_trap(&mut self, e: crate::capture::RecordedEntry, layer: Layer) -> bool {
        let rank = call_trap_rank(e, layer);
        if self.call_trap.is_some_and(|(_, had)| had >= rank) {
            return false;
        }
        let fresh = !self.call_trap_by_class.contains_key(&e.class);
        let cap = &mut self.cap;
        let measured = cached_cost(
            &mut self.call_trap_by_class,
            e.class,
            "a recorded call's traps",
            || cap.measure_call_trap_ns(e),
        );
        if let Some(ns) = measured {
            self.call_trap = Some((ns, rank));
        }
        fresh
    }

    fn note_process(&mut self, pid: u32, f: &mut impl FnMut(Captured)) {
        if self.known_pids.insert(pid) {
            f(Captured::Process(pid));
        }
    }

    fn watch(&mut self, pid: u32) {
        watch(&self.resolver, &mut self.watching, pid);
    }

    /// Registers CPython in watched processes.
    fn find_python(&mut self, f: &mut impl FnMut(Captured)) {
        if self.watching.is_empty() {
            return;
        }
        let now = Instant::now();
        let pids: Vec<u32> = self.watching.keys().copied().collect();
        for pid in pids {
            let lost = |e: &dyn std::fmt::Display| Captured::Note {
                warn: true,
                text: format!("Python frames of pid {pid} not captured: {e}"),
            };
            match python::detect(pid) {
                Ok(Some(p)) => {
                    self.watching.remove(&pid);
                    match self.cap.set_python(pid, p.kernel_layout()) {
                        Ok(()) => {
                            f(Captured::Note {
                                warn: false,
                                text: format!(
                                    "pid {pid} runs Python 3.{} ({}): call sites include Python frames from here on",
                                    p.layout.minor,
                                    p.file.display()
                                ),
                            });
                            self.resolver.set_python(p);
                        }
                        Err(e) => f(lost(&e)),
                    }
                }
                Ok(None) => {
                    if self.watching.get(&pid).is_some_and(|&d| now >= d) {
                        self.watching.remove(&pid);
                    }
                }
                Err(e) => {
                    self.watching.remove(&pid);
                    f(lost(&e));
                }
            }
        }
    }

    /// Libraries probed so far.
    pub fn attached(&self) -> impl Iterator<Item = &AttachedLib> {
        self.cap.attached()
    }

    /// Library files found but not probed.
    pub fn unprobed(&self) -> usize {
        self.unprobed.len()
    }

    /// Every process a record or `trace_pid` has named so far (its
    /// `Captured::Process` was handed out), in no particular order.
    pub fn known_pids(&self) -> Vec<u32> {
        self.known_pids.iter().copied().collect()
    }

    /// Processes the kernel currently traces.
    pub fn traced_pids(&self) -> Vec<u32> {
        self.cap.traced_pids()
    }

    pub fn counts(&self) -> RecordCounts {
        self.counts
    }

    pub fn losses(&self) -> LossStats {
        LossStats::from_counters(&self.cap.loss_stats())
    }

    /// Hot-path calls counted in the kernel, per process and op: those in
    /// the kernel's map and the final counts of processes that exited.
    /// A pid given again to a new process before a file stored the exited
    /// one's counts has both summed under it (one row per pid and op).
    pub fn op_counts(&self) -> Vec<OpCount> {
        let mut by_key: std::collections::BTreeMap<(u32, u16), u64> = Default::default();
        for c in self.cap.op_counts().iter().chain(&self.exited_counts) {
            *by_key.entry((c.pid, c.op)).or_default() += c.count;
        }
        by_key
            .into_iter()
            .map(|((pid, op), count)| OpCount { pid, op, count })
            .collect()
    }

    /// Lets go of the exited processes' final counts: a new file of a
    /// rotating run, once the files before it stored them (no later file
    /// has a share of them). A node agent's run stays bounded by what its
    /// processes alive and its latest file's hold.
    pub fn forget_exited_counts(&mut self) {
        self.exited_counts.clear();
    }

    /// Entries in the kernel's count map (processes alive or not yet seen
    /// to exit), for the trace's end stats.
    pub fn op_count_entries(&self) -> usize {
        self.cap.op_count_entries()
    }

    /// Call sites are sent once per id; after this each is sent again on its
    /// next use (`trace --rotate`: every file names the sites of its calls).
    pub fn forget_stacks(&mut self) -> usize {
        self.cap.forget_stacks()
    }

    /// The thread of each call entered and not yet returned
    /// ([`Capture::open_call_threads`]).
    pub fn open_call_threads(&self) -> Vec<u32> {
        self.cap.open_call_threads()
    }

    /// Runs of gpusleuth's programs the kernel skipped, by program
    /// ([`Capture::program_misses`]).
    pub fn program_misses(&self) -> Vec<(String, u64)> {
        self.cap.program_misses()
    }

    /// Entries left in the kernel's per-process and per-thread maps.
    pub fn map_occupancy(&self) -> (usize, usize) {
        self.cap.map_occupancy()
    }

    pub fn start_mono(&self) -> u64 {
        self.start_mono
    }
}

fn watch(resolver: &SiteResolver, watching: &mut HashMap<u32, Instant>, pid: u32) {
    if resolver.python(pid).is_none() {
        watching.insert(pid, Instant::now() + WATCH_FOR);
    }
}

/// The decoding side of a poll: borrows what it needs of the session while
/// the capture is borrowed for the ring buffer.
struct Decoder<'a> {
    /// gpusleuth's own pid: its records are dropped.
    own_pid: u32,
    known_pids: &'a mut HashSet<u32>,
    resolver: &'a mut SiteResolver,
    watching: &'a mut HashMap<u32, Instant>,
    counts: &'a mut RecordCounts,
    exited: &'a mut Vec<u32>,
}

impl Decoder<'_> {
    fn forget(&mut self, pid: u32) {
        self.resolver.forget(pid);
        self.watching.remove(&pid);
    }

    fn record(&mut self, bytes: &[u8], f: &mut impl FnMut(Captured)) {
        self.counts.records += 1;
        if record::record_type(bytes) == Some(record::REC_STACK) {
            match record::decode_stack(bytes) {
                Ok(raw) => {
                    // Resolved now: the process's maps may be gone later.
                    self.counts.stacks += 1;
                    f(Captured::Stack(self.resolver.resolve_live(&raw)));
                }
                Err(_) => self.counts.decode_errors += 1,
            }
            return;
        }
        let ev = match record::decode(bytes) {
            Ok(ev) => ev,
            Err(_) => {
                self.counts.decode_errors += 1;
                return;
            }
        };
        // gpusleuth's own: the calls and waits of a recorded call's traps
        // being measured (`Capture::measure_call_trap_ns`), never a trace's.
        let own = match &ev {
            Event::Call(c) => c.pid == self.own_pid,
            Event::Wait(w) => w.pid == self.own_pid,
            _ => false,
        };
        if own {
            return;
        }
        match &ev {
            Event::Call(c) => {
                self.counts.calls += 1;
                if self.known_pids.insert(c.pid) {
                    // First call seen from it (trace-all mode): may be Python.
                    watch(self.resolver, self.watching, c.pid);
                    f(Captured::Process(c.pid));
                }
            }
            Event::Nccl(n) => {
                self.counts.calls += 1;
                if self.known_pids.insert(n.call.pid) {
                    f(Captured::Process(n.call.pid));
                }
            }
            Event::Wait(_) => self.counts.waits += 1,
            Event::Block(_) => {}
            Event::Proc(p) => {
                self.counts.procs += 1;
                if matches!(p.kind, ProcKind::Fork | ProcKind::Exec) {
                    // Re-read: a new process, or a new program in it.
                    self.known_pids.insert(p.pid);
                    f(Captured::Process(p.pid));
                    self.forget(p.pid);
                    watch(self.resolver, self.watching, p.pid);
                }
                if p.kind == ProcKind::Exit {
                    // Its whole group is dead (the probe says exit once per
                    // process): a new file of a `--rotate` run does not name
                    // it again, and a process given its pid later is new.
                    // A node agent sees processes come and go for days.
                    self.known_pids.remove(&p.pid);
                    self.exited.push(p.pid);
                    self.forget(p.pid);
                }
            }
        }
        f(Captured::Event(ev));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn losses_are_summed_by_name_and_attach_edges_are_not_losses() {
        let mut c = [0u64; stat::MAX];
        for (i, v) in c.iter_mut().enumerate() {
            *v = 1 << i;
        }
        let l = LossStats::from_counters(&c);
        assert_eq!(l.counters(), c);
        assert_eq!(
            l.ring(),
            1 | 2
                | 4
                | (1 << stat::RING_DROP_BLOCK)
                | (1 << stat::RING_DROP_NCCL)
                | (1 << stat::RING_DROP_STACK)
        );
        assert_eq!(l.maps(), 8 | 16 | 32 | (1 << stat::TRACED_FULL));
        assert_eq!(l.total() & (1 << stat::UNMATCHED_RETURN), 0);
        // Every counter is either a loss summed here or an attach edge, and
        // the named sums agree with record.rs's classification by name.
        assert_eq!(l.switch_in_unseen, 1 << stat::SWITCH_IN_UNSEEN);
        assert_eq!(l.total() & (1 << stat::SWITCH_IN_UNSEEN), 0);
        let covered = l.total() | (1 << stat::UNMATCHED_RETURN) | l.switch_in_unseen;
        assert_eq!(covered, (1u64 << stat::MAX) - 1);
        let by_name = |ring: bool| -> u64 {
            stat::losses()
                .filter(|&i| stat::is_ring_drop(i) == ring)
                .map(|i| c[i])
                .sum()
        };
        assert_eq!(l.ring(), by_name(true));
        assert_eq!(l.maps(), by_name(false));
    }
}
