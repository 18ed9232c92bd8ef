//! The live view during `trace`: a per-op table and live device bytes per
//! process, redrawn in place on a terminal, plain periodic lines otherwise.
//! Latency percentiles here are estimates from the core's `LogHistogram`
//! (under 6% low, see sleuth_core::latency); device bytes follow the core's
//! `Ledger`, the rules `memory` applies. The final table comes from the
//! database and is exact.

use crate::output::{fmt_bytes, fmt_ns};
use crate::term_text::terminal_safe;
use sleuth_core::latency::LogHistogram;
use sleuth_core::ledger::Ledger;
use sleuth_core::{CallEvent, Event};

use std::collections::BTreeMap;
use std::io::{IsTerminal, Write};
use std::sync::mpsc;

mod fit;
use fit::Line;

#[derive(Default)]
struct OpLive {
    count: u64,
    errors: u64,
    hist: LogHistogram,
    runnable_ns: u64,
    blocked_ns: u64,
}

/// Most recent calls and waits kept for live findings (bounded memory):
/// 4.6 MB of 152-byte calls. 50,000 until round 25, 7.6 MB and the largest
/// share of the tracer's peak heap while a program held 65,536
/// allocations (docs/benchmarks.md). 30,000 is a second of a program
/// making 30,000 calls a second, 0.15 s of the bench's launch flood.
const WINDOW_EVENTS: usize = 30_000;

pub struct LiveView {
    ops: BTreeMap<&'static str, OpLive>,
    /// A bounded window of the trace for live findings.
    window: sleuth_core::TraceData,
    last_top: Option<String>,
    /// Device memory by the core's rules (`cuMemCreate` included), as `memory` counts it.
    /// Kept on a terminal only, the one view that shows it: a pipe's lines
    /// do not, and the ledger holds every live allocation (8.5 MB of the
    /// tracer's footprint at 65,536, docs/benchmarks.md).
    ledger: Ledger,
    waits: u64,
    /// Calls of the ops counted in the kernel (no per-call record: with
    /// `--launches driver`, `cuLaunchKernel`), by op, from the capture loop.
    counted: BTreeMap<&'static str, u64>,
    tty: bool,
    enabled: bool,
    /// Rows the last frame took (each line fitted to one row).
    drawn_lines: usize,
}

impl LiveView {
    pub fn new(enabled: bool) -> LiveView {
        LiveView {
            ops: BTreeMap::new(),
            window: sleuth_core::TraceData {
                has_host_context: true,
                ..Default::default()
            },
            last_top: None,
            ledger: Ledger::live(),
            waits: 0,
            counted: BTreeMap::new(),
            tty: std::io::stderr().is_terminal(),
            enabled,
            drawn_lines: 0,
        }
    }

    pub fn observe(&mut self, ev: &Event) {
        if !self.enabled {
            return;
        }
        match ev {
            Event::Call(c) => {
                self.observe_call(c);
                push_bounded(&mut self.window.calls, c.clone());
            }
            Event::Nccl(n) => {
                self.observe_call(&n.call);
                push_bounded(&mut self.window.calls, n.call.clone());
                push_bounded(&mut self.window.nccl, n.clone());
            }
            Event::Wait(w) => {
                self.waits += 1;
                push_bounded(&mut self.window.waits, w.clone());
            }
            Event::Proc(p) => {
                if p.kind == sleuth_core::ProcKind::Exit {
                    // The driver frees an exited process's memory.
                    self.ledger.forget(p.pid);
                }
            }
            Event::Block(_) => {}
        }
    }

    fn observe_call(&mut self, c: &CallEvent) {
        let o = self.ops.entry(c.op_name()).or_default();
        o.count += 1;
        o.errors += c.failed() as u64;
        o.hist.add(c.dur_ns);
        o.runnable_ns += c.runnable_ns;
        o.blocked_ns += c.blocked_ns;
        if self.tty {
            self.ledger.apply(c);
        }
    }

    /// Names a process in live findings.
    pub fn set_process(&mut self, p: &sleuth_core::ProcessInfo) {
        self.window.processes.retain(|q| q.pid != p.pid);
        self.window.processes.push(p.clone());
    }

    /// The top findings over the recent window, one line each.
    fn findings(&mut self, start_ns: u64, now_ns: u64, n: usize) -> Vec<String> {
        // In place: a stable sort's buffer held the window again at each
        // frame (7.3 MB of the tracer's peak heap in a flood). Keys over
        // the fields that tell calls (waits) apart, so ties do not matter.
        self.window
            .calls
            .sort_unstable_by_key(|c| (c.ts_ns, c.pid, c.tid, c.dur_ns, c.op));
        self.window
            .waits
            .sort_unstable_by_key(|w| (w.on_ns, w.pid, w.tid, w.off_ns));
        self.window.start_ns = Some(
            start_ns.max(
                self.window
                    .calls
                    .first()
                    .map(|c| c.ts_ns)
                    .unwrap_or(start_ns),
            ),
        );
        self.window.end_ns = Some(now_ns);
        sleuth_core::findings::top_findings(&self.window, n)
            .into_iter()
            .map(|f| {
                format!(
                    "[{}] {}: {}",
                    f.severity.as_str(),
                    f.kind.as_str(),
                    f.summary
                )
            })
            .collect()
    }

    /// Redraws (TTY) or prints one summary line (pipe).
    pub fn render(&mut self, elapsed_s: f64, events: u64, drops: u64, start_ns: u64, now_ns: u64) {
        if !self.enabled {
            return;
        }
        let mut err = std::io::stderr().lock();
        if !self.tty {
            let calls: u64 = self.ops.values().map(|o| o.count).sum();
            let _ = writeln!(
                err,
                "gpusleuth: +{elapsed_s:.1}s events={events} calls={calls} waits={} drops={drops}",
                self.waits
            );
            // A finding is printed once, when it first leads.
            let top = self.findings(start_ns, now_ns, 1).into_iter().next();
            if top.is_some() && top != self.last_top {
                // Findings name processes of the traced host: untrusted text.
                let _ = writeln!(
                    err,
                    "gpusleuth: finding so far: {}",
                    terminal_safe(top.as_deref().unwrap_or("")).replace(['\n', '\r'], " ")
                );
                self.last_top = top;
            }
            return;
        }
        let size = fit::size_of(libc::STDERR_FILENO).unwrap_or(fit::ASSUMED);
        let frame = self.frame(elapsed_s, events, drops, start_ns, now_ns, size.cols);
        let lines = fit::fit(&frame, size);
        // Move up over the previous frame and clear to the end of the screen.
        if self.drawn_lines > 0 {
            let _ = write!(err, "\x1b[{}A\x1b[J", self.drawn_lines);
        }
        for l in &lines {
            let _ = writeln!(err, "{l}");
        }
        self.drawn_lines = lines.len();
    }

    /// The lines of a terminal's frame, ranked for [`fit::fit`]: the
    /// header, the table's head and top ops, then the findings and memory,
    /// the rest last. `cols`: the terminal's width, which the op column
    /// narrows to before any number is cut.
    fn frame(
        &mut self,
        elapsed_s: f64,
        events: u64,
        drops: u64,
        start_ns: u64,
        now_ns: u64,
        cols: usize,
    ) -> Vec<Line> {
        let mut lines = vec![Line::new(
            0,
            format!(
                "gpusleuth tracing  +{elapsed_s:.1}s  events {events}  drops {drops}  (Ctrl-C stops)"
            ),
        )];
        lines.extend(self.op_table(cols));
        let pids = self
            .ledger
            .pids()
            .filter(|&p| self.ledger.live_bytes(p) > 0);
        for (i, pid) in pids.take(6).enumerate() {
            let text = format!(
                "pid {pid}: {} live device memory in {} allocations",
                fmt_bytes(self.ledger.live_bytes(pid)),
                self.ledger.live_allocations(pid)
            );
            lines.push(Line::new(if i < 2 { 2 } else { 3 }, text));
        }
        let findings = self.findings(start_ns, now_ns, 3);
        if findings.is_empty() {
            lines.push(Line::new(2, "findings so far: none"));
        } else {
            let head = format!("findings so far (last {}k calls):", WINDOW_EVENTS / 1000);
            lines.push(Line::new(2, head));
            for (i, f) in findings.iter().enumerate() {
                let rank = if i == 0 { 2 } else { 4 };
                lines.push(Line::new(rank, format!("  {}", terminal_safe(f))));
            }
        }
        lines
    }

    /// The op table: its head and the 12 ops with the most calls, those
    /// counted in the kernel among them. Its numbers take 55 cells; the op
    /// column takes what is left of `cols` (one cell stays unused), 12 to
    /// 24 cells: at 80 columns the table is 79 wide.
    fn op_table(&self, cols: usize) -> Vec<Line> {
        let w = cols.saturating_sub(56).clamp(12, 24);
        let row = |name: &str, rest: String| format!("{:<w$} {rest}", fit::cut(name, w));
        let mut lines = vec![Line::new(
            1,
            row(
                "op",
                format!(
                    "{:>9} {:>6} {:>8} {:>8} {:>9} {:>9}",
                    "calls", "errors", "~p50", "~p99", "runnable", "blocked"
                ),
            ),
        )];
        let mut ops: Vec<(&str, u64, Option<&OpLive>)> = self
            .ops
            .iter()
            .map(|(name, o)| (*name, o.count, Some(o)))
            .collect();
        // An op counted in the kernel has no per-call record: its count alone.
        for (name, n) in &self.counted {
            if !self.ops.contains_key(name) {
                ops.push((*name, *n, None));
            }
        }
        ops.sort_by_key(|(name, n, _)| (std::cmp::Reverse(*n), *name));
        for (i, (name, count, o)) in ops.iter().take(12).enumerate() {
            let rest = match o {
                Some(o) => format!(
                    "{:>9} {:>6} {:>8} {:>8} {:>9} {:>9}",
                    count,
                    o.errors,
                    fmt_ns(o.hist.quantile(0.5)),
                    fmt_ns(o.hist.quantile(0.99)),
                    fmt_ns(o.runnable_ns),
                    fmt_ns(o.blocked_ns)
                ),
                None => format!("{count:>9}        counted in kernel"),
            };
            lines.push(Line::new(if i < 3 { 1 } else { 4 }, row(name, rest)));
        }
        lines
    }

    /// The calls of the ops counted in the kernel (cumulative, per process),
    /// added up by op.
    pub fn set_counted(&mut self, counts: &[sleuth_core::OpCount]) {
        self.counted.clear();
        for c in counts {
            let name = sleuth_core::ops::op_by_id(c.op).map_or("?", |o| o.name);
            *self.counted.entry(name).or_default() += c.count;
        }
    }

    /// Removes the live frame before the final report.
    pub fn clear(&mut self) {
        if self.enabled && self.tty && self.drawn_lines > 0 {
            let _ = write!(std::io::stderr(), "\x1b[{}A\x1b[J", self.drawn_lines);
            self.drawn_lines = 0;
        }
    }
}

/// What the capture loop tells the live thread.
enum Msg {
    Events(Vec<Event>),
    Process(sleuth_core::ProcessInfo),
    Kernel(
        [u64; sleuth_core::record::stat::MAX],
        Vec<sleuth_core::OpCount>,
    ),
    Render(Frame),
    /// Remove the live frame, then acknowledge (a warning is printed next).
    Clear(mpsc::SyncSender<()>),
}

/// The numbers of one live frame, from the capture loop.
pub struct Frame {
    pub elapsed_s: f64,
    pub records: u64,
    pub drops: u64,
    pub start_ns: u64,
    pub now_ns: u64,
}

/// Events handed to the live thread at once: one channel message per batch,
/// not per event.
const BATCH: usize = 1024;
/// Batches in flight before the capture loop waits for the live thread.
/// Bounded so a stalled view cannot grow memory without limit; waiting (not
/// dropping) keeps the metrics' counts exact. 16 batches (16k events, ~4 MB)
/// cover a frame's findings pass at 100k events/s; 64 let a flood queue 17 MB.
const QUEUE: usize = 16;

/// The capture loop's side of the live view and the metrics: both run on
/// their own thread, so the thread draining the ring buffer only clones
/// events into a batch (sorting the findings window, rendering and the
/// metrics' lock all happen elsewhere).
pub struct LiveFeed {
    tx: Option<mpsc::SyncSender<Msg>>,
    batch: Vec<Event>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl LiveFeed {
    /// Starts the live thread if there is anything to feed.
    pub fn start(
        view: LiveView,
        metrics: Option<std::sync::Arc<crate::metrics::Metrics>>,
    ) -> LiveFeed {
        if !view.enabled && metrics.is_none() {
            return LiveFeed {
                tx: None,
                batch: Vec::new(),
                thread: None,
            };
        }
        let (tx, rx) = mpsc::sync_channel::<Msg>(QUEUE);
        let thread = std::thread::Builder::new()
            .name("gpusleuth-live".into())
            .spawn(move || {
                let mut view = view;
                for msg in rx {
                    match msg {
                        Msg::Events(evs) => {
                            for ev in &evs {
                                view.observe(ev);
                                if let Some(m) = &metrics {
                                    m.observe(ev);
                                }
                            }
                        }
                        Msg::Process(p) => {
                            if let Some(m) = &metrics {
                                m.set_process(p.pid, &p.comm);
                            }
                            view.set_process(&p);
                        }
                        Msg::Kernel(losses, counts) => {
                            view.set_counted(&counts);
                            if let Some(m) = &metrics {
                                m.set_kernel_counters(&losses, &counts);
                            }
                        }
                        Msg::Render(f) => {
                            view.render(f.elapsed_s, f.records, f.drops, f.start_ns, f.now_ns)
                        }
                        Msg::Clear(ack) => {
                            view.clear();
                            let _ = ack.send(());
                        }
                    }
                }
                view.clear();
            });
        match thread {
            Ok(t) => LiveFeed {
                tx: Some(tx),
                batch: Vec::with_capacity(BATCH),
                thread: Some(t),
            },
            Err(e) => {
                eprintln!(
                    "gpusleuth: warning: no live view or metrics: cannot start their thread ({e})"
                );
                LiveFeed {
                    tx: None,
                    batch: Vec::new(),
                    thread: None,
                }
            }
        }
    }

    /// Whether events are wanted (cloning them is skipped otherwise).
    pub fn wants_events(&self) -> bool {
        self.tx.is_some()
    }

    pub fn observe(&mut self, ev: &Event) {
        if self.tx.is_none() {
            return;
        }
        self.batch.push(ev.clone());
        if self.batch.len() >= BATCH {
            self.flush();
        }
    }

    /// Hands the pending events over (end of a poll).
    pub fn flush(&mut self) {
        if self.batch.is_empty() {
            return;
        }
        let evs = std::mem::replace(&mut self.batch, Vec::with_capacity(BATCH));
        self.send(Msg::Events(evs));
    }

    fn send(&mut self, msg: Msg) {
        if let Some(tx) = &self.tx {
            if tx.send(msg).is_err() {
                // The thread is gone (it panicked): stop feeding it.
                self.tx = None;
            }
        }
    }

    pub fn set_process(&mut self, p: sleuth_core::ProcessInfo) {
        self.flush();
        self.send(Msg::Process(p));
    }

    /// The kernel-side counters for the metrics (losses by `stat` index).
    pub fn set_kernel_counters(
        &mut self,
        losses: [u64; sleuth_core::record::stat::MAX],
        counts: Vec<sleuth_core::OpCount>,
    ) {
        self.send(Msg::Kernel(losses, counts));
    }

    /// Asks for a frame; skipped when the live thread is behind.
    pub fn render(&mut self, frame: Frame) {
        self.flush();
        if let Some(tx) = &self.tx {
            let _ = tx.try_send(Msg::Render(frame));
        }
    }

    /// Removes the live frame before a warning is printed, and waits until it is gone.
    pub fn clear(&mut self) {
        self.flush();
        let (ack_tx, ack_rx) = mpsc::sync_channel(1);
        self.send(Msg::Clear(ack_tx));
        if self.tx.is_some() {
            let _ = ack_rx.recv();
        }
    }

    /// Hands over what is pending and waits for the live thread to end
    /// (the frame removed, the metrics current).
    pub fn finish(&mut self) {
        self.flush();
        self.tx = None;
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for LiveFeed {
    fn drop(&mut self) {
        self.finish();
    }
}

fn push_bounded<T>(v: &mut Vec<T>, item: T) {
    if v.len() == v.capacity() && v.len() < WINDOW_EVENTS {
        // Grown to the window's size exactly, never by doubling: doubling
        // ended at 65,536 slots (a third unused) and each step held the old
        // and the new buffer at once, a peak in the tracer's RSS.
        v.reserve_exact((2 * v.len()).clamp(1024, WINDOW_EVENTS) - v.len());
    }
    if v.len() >= WINDOW_EVENTS {
        // Drop the oldest fifth at once: amortised O(1) per event.
        v.drain(..WINDOW_EVENTS / 5);
    }
    v.push(item);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn live_findings_come_from_the_window_and_memory_stays_bounded() {
        let mut v = LiveView::new(true);
        for i in 0..(WINDOW_EVENTS as u64 + 10) {
            let c = CallEvent {
                ts_ns: i * 1000,
                dur_ns: 10,
                pid: 1,
                tid: 1,
                op: 1,
                ret: if i == 5 { 2 } else { 0 },
                size: Some(1 << 40),
                ..Default::default()
            };
            v.observe(&Event::Call(c));
        }
        assert!(v.window.calls.len() <= WINDOW_EVENTS);
        // Grown to the window exactly, not doubled past it (65,536 slots).
        assert_eq!(v.window.calls.capacity(), WINDOW_EVENTS);
        // The failed allocation at i == 5 fell out of the window: no finding from it.
        assert!(v
            .findings(0, 1 << 40, 3)
            .iter()
            .all(|f| !f.contains("allocation_failure")));
        let mut failing = v.window.calls[0].clone();
        failing.ret = 2;
        v.observe(&Event::Call(failing));
        assert!(v
            .findings(0, 1 << 40, 3)
            .iter()
            .any(|f| f.contains("allocation_failure")));
    }

    /// Round 55's tester: op rows were 83 columns and findings up to 142,
    /// so an 80-column terminal wrapped them and the redraw (up by the
    /// lines printed) left each frame in the scrollback. At 80 columns the
    /// table is 79 wide with every number whole, and the fitted frame of a
    /// full view fits 80x24; an op counted in the kernel is listed with its
    /// count (`--launches driver`: `cuLaunchKernel`).
    #[test]
    fn a_full_frame_fits_an_80x24_terminal_with_whole_numbers() {
        let mut v = LiveView::new(true);
        v.tty = true;
        let ops = sleuth_core::ops::OPS;
        for (i, op) in ops.iter().take(14).enumerate() {
            for k in 0..=i as u64 {
                let c = CallEvent {
                    ts_ns: k,
                    dur_ns: 123_456_789,
                    runnable_ns: 9_876_543_210,
                    blocked_ns: 999_999_999,
                    pid: 7,
                    tid: 7,
                    op: op.id,
                    ..Default::default()
                };
                v.observe(&Event::Call(c));
            }
        }
        let launch = sleuth_core::op_by_name("cuLaunchKernel").unwrap().id;
        v.ops.remove("cuLaunchKernel");
        v.set_counted(&[sleuth_core::OpCount {
            pid: 7,
            op: launch,
            count: 30,
        }]);
        let table = v.op_table(80);
        assert!(table.iter().all(|l| fit::width(&l.text) <= 79), "{table:?}");
        assert!(table
            .iter()
            .all(|l| !l.text.contains('…') || l.text.starts_with("cu")));
        // Every number whole: a 14-call op's totals past 100 s included.
        assert!(table[2].text.contains("121.63ms") && table[2].text.contains("138.272s"));
        let counted = table
            .iter()
            .find(|l| l.text.starts_with("cuLaunchKernel "))
            .unwrap_or_else(|| panic!("no counted row: {table:?}"));
        assert!(counted.text.contains(" 30 ") && counted.text.ends_with("counted in kernel"));
        for pid in 1..=6 {
            v.ledger.apply(&CallEvent {
                pid,
                tid: pid,
                op: sleuth_core::op_by_name("cudaMalloc").unwrap().id,
                size: Some(4096),
                ptr: Some(0xa000),
                ..Default::default()
            });
        }
        let frame = v.frame(1.0, 1, 0, 0, 1 << 40, 80);
        assert_eq!(
            frame.len(),
            21,
            "header, 13 table lines, 6 processes, findings"
        );
        let fitted = fit::fit(&frame, fit::Size { cols: 80, rows: 24 });
        assert_eq!(fitted.len(), 21);
        // A shorter terminal: 14 rows and the note; the ops past the
        // fifth go before the processes' memory and the findings' line.
        let fitted = fit::fit(&frame, fit::Size { cols: 80, rows: 16 });
        assert_eq!(fitted.len(), 15);
        assert!(fitted[0].starts_with("gpusleuth tracing"));
        assert!(fitted[3].starts_with("cudaStreamSynchronize"));
        assert!(fitted[6].starts_with("cudaMemset "));
        assert!(fitted[7].starts_with("pid 1:") && fitted[12].starts_with("pid 6:"));
        assert!(fitted[13].starts_with("findings so far"));
        assert_eq!(fitted[14], "… 7 more (a taller terminal shows them)");
    }

    /// A pipe's lines show no memory: its view keeps no ledger, so no
    /// live allocation is held twice in the tracer (the writer holds it).
    #[test]
    fn a_pipes_view_holds_no_allocation() {
        let malloc = CallEvent {
            ts_ns: 10,
            dur_ns: 100,
            pid: 1,
            tid: 1,
            op: sleuth_core::op_by_name("cudaMalloc").unwrap().id,
            size: Some(4096),
            ptr: Some(0xa000),
            ..Default::default()
        };
        let mut pipe = LiveView::new(true);
        pipe.tty = false;
        let mut terminal = LiveView::new(true);
        terminal.tty = true;
        for v in [&mut pipe, &mut terminal] {
            v.observe(&Event::Call(malloc.clone()));
        }
        assert_eq!(pipe.ledger.live_allocations(1), 0);
        assert_eq!(terminal.ledger.live_allocations(1), 1);
        assert_eq!(terminal.ledger.live_bytes(1), 4096);
    }

    /// Issue 15's acceptance: the live view, the metrics and `memory` (the
    /// core ledger over the stored calls) give the same live bytes on the
    /// same events, `cuMemCreate` (VMM) included.
    #[test]
    fn live_view_metrics_and_memory_agree_on_live_bytes() {
        use sleuth_core::op_by_name;
        let call = |pid: u32, ts: u64, op: &str, size: Option<u64>, ptr: u64| CallEvent {
            ts_ns: ts,
            dur_ns: 100,
            pid,
            tid: pid,
            op: op_by_name(op).unwrap().id,
            size,
            ptr: Some(ptr),
            ..Default::default()
        };
        let mut nested = call(1, 11, "cuMemAlloc_v2", Some(4096), 0xa000);
        nested.nested = true;
        let mut failed = call(2, 60, "cudaMalloc", Some(1 << 40), 0);
        failed.ret = 2;
        failed.ptr = None;
        let calls = vec![
            call(1, 10, "cudaMalloc", Some(4096), 0xa000),
            nested,
            call(1, 20, "cuMemCreate", Some(2 << 20), 0x77),
            call(2, 30, "cuMemCreate", Some(1 << 20), 0x77),
            call(2, 40, "cudaMalloc", Some(512), 0xb000),
            call(1, 50, "cudaFree", None, 0xa000),
            failed,
            call(2, 70, "cuMemRelease", None, 0x77),
            call(2, 80, "cudaFree", None, 0xdead),
        ];
        let mut view = LiveView::new(true);
        // The terminal's view (the one that shows memory).
        view.tty = true;
        let metrics = crate::metrics::Metrics::new();
        for c in &calls {
            view.observe(&Event::Call(c.clone()));
            metrics.observe(&Event::Call(c.clone()));
        }
        let data = sleuth_core::TraceData {
            calls: calls.clone(),
            ..Default::default()
        };
        let memory = sleuth_core::ledger::ledger(&data, None);
        let text = metrics.render(0);
        let from_metrics = |pid: u32| -> u64 {
            let prefix = format!("gpusleuth_device_live_bytes{{pid=\"{pid}\"");
            let line = text
                .lines()
                .find(|l| l.starts_with(&prefix))
                .unwrap_or_else(|| panic!("no live bytes of {pid}:\n{text}"));
            line.rsplit(' ').next().unwrap().parse().unwrap()
        };
        // Ground truth from the calls: pid 1 holds 2 MiB of cuMemCreate,
        // pid 2 holds 512 bytes (its handle released, the failure and the
        // unknown free change nothing).
        for (pid, truth) in [(1u32, 2u64 << 20), (2, 512)] {
            let mem = memory.iter().find(|l| l.pid == pid).unwrap();
            assert_eq!(mem.live_bytes, truth, "memory, pid {pid}");
            assert_eq!(view.ledger.live_bytes(pid), truth, "live view, pid {pid}");
            assert_eq!(from_metrics(pid), truth, "metrics, pid {pid}");
        }
    }
}
