//! The live view during `trace`: a per-op table and live device bytes per
//! process, redrawn in place on a terminal, plain periodic lines otherwise.
//! Numbers here are live estimates (latency from a log histogram); the final
//! table comes from the database and is exact.

use crate::output::{fmt_bytes, fmt_ns};
use crate::term_text::terminal_safe;
use sleuth_core::ops::OpClass;
use sleuth_core::{CallEvent, Event};

use std::collections::{BTreeMap, HashMap};
use std::io::{IsTerminal, Write};
use std::sync::mpsc;

/// Log-linear histogram: 16 sub-buckets per power of two (≤ 6.25% error), live use only.
#[derive(Default)]
struct Hist {
    buckets: BTreeMap<u32, u64>,
    n: u64,
}

impl Hist {
    fn bucket(v: u64) -> u32 {
        if v < 16 {
            return v as u32;
        }
        let exp = 63 - v.leading_zeros();
        let sub = ((v >> (exp - 4)) & 0xf) as u32;
        exp * 16 + sub
    }
    fn lower(b: u32) -> u64 {
        if b < 16 {
            return b as u64;
        }
        let (exp, sub) = (b / 16, b % 16);
        (1u64 << exp) | ((sub as u64) << (exp - 4))
    }
    fn add(&mut self, v: u64) {
        *self.buckets.entry(Self::bucket(v)).or_default() += 1;
        self.n += 1;
    }
    fn quantile(&self, q: f64) -> u64 {
        let rank = ((q * self.n as f64).ceil() as u64).max(1);
        let mut seen = 0;
        for (&b, &c) in &self.buckets {
            seen += c;
            if seen >= rank {
                return Self::lower(b);
            }
        }
        0
    }
}

#[derive(Default)]
struct OpLive {
    count: u64,
    errors: u64,
    hist: Hist,
    runnable_ns: u64,
    blocked_ns: u64,
}

/// Most recent calls and waits kept for live findings (bounded memory).
const WINDOW_EVENTS: usize = 50_000;

pub struct LiveView {
    ops: BTreeMap<&'static str, OpLive>,
    /// A bounded window of the trace for live findings.
    window: sleuth_core::TraceData,
    last_top: Option<String>,
    live_bytes: HashMap<u32, (u64, HashMap<u64, u64>)>,
    waits: u64,
    tty: bool,
    enabled: bool,
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
            live_bytes: HashMap::new(),
            waits: 0,
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
            Event::Proc(_) | Event::Block(_) => {}
        }
    }

    fn observe_call(&mut self, c: &CallEvent) {
        let o = self.ops.entry(c.op_name()).or_default();
        o.count += 1;
        o.errors += c.failed() as u64;
        o.hist.add(c.dur_ns);
        o.runnable_ns += c.runnable_ns;
        o.blocked_ns += c.blocked_ns;
        // Live device bytes: count each allocation once (nested driver calls are
        // the runtime's own, already counted at the runtime layer).
        let Some(info) = c.info() else { return };
        if c.nested || c.failed() {
            return;
        }
        let entry = self.live_bytes.entry(c.pid).or_default();
        match (info.class, c.ptr) {
            (OpClass::DeviceAlloc, Some(p)) => {
                let sz = c.size.unwrap_or(0);
                entry.1.insert(p, sz);
                entry.0 += sz;
            }
            (OpClass::DeviceFree, Some(p)) => {
                if let Some(sz) = entry.1.remove(&p) {
                    entry.0 -= sz;
                }
            }
            _ => {}
        }
    }

    /// Names a process in live findings.
    pub fn set_process(&mut self, p: &sleuth_core::ProcessInfo) {
        self.window.processes.retain(|q| q.pid != p.pid);
        self.window.processes.push(p.clone());
    }

    /// The top findings over the recent window, one line each.
    fn findings(&mut self, start_ns: u64, now_ns: u64, n: usize) -> Vec<String> {
        self.window.calls.sort_by_key(|c| c.ts_ns);
        self.window.waits.sort_by_key(|w| w.on_ns);
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
                    terminal_safe(top.as_deref().unwrap_or(""))
                );
                self.last_top = top;
            }
            return;
        }
        let mut lines = vec![format!(
            "gpusleuth tracing  +{elapsed_s:.1}s  events {events}  drops {drops}  (Ctrl-C stops)"
        )];
        lines.push(format!(
            "{:<24} {:>9} {:>6} {:>9} {:>9} {:>10} {:>10}",
            "op", "calls", "errors", "~p50", "~p99", "runnable", "blocked"
        ));
        let mut ops: Vec<_> = self.ops.iter().collect();
        ops.sort_by_key(|(_, o)| std::cmp::Reverse(o.count));
        for (name, o) in ops.iter().take(12) {
            lines.push(format!(
                "{:<24} {:>9} {:>6} {:>9} {:>9} {:>10} {:>10}",
                name,
                o.count,
                o.errors,
                fmt_ns(o.hist.quantile(0.5)),
                fmt_ns(o.hist.quantile(0.99)),
                fmt_ns(o.runnable_ns),
                fmt_ns(o.blocked_ns)
            ));
        }
        let mut pids: Vec<_> = self.live_bytes.iter().filter(|(_, v)| v.0 > 0).collect();
        pids.sort_by_key(|(pid, _)| **pid);
        for (pid, (bytes, allocs)) in pids.iter().take(6) {
            lines.push(format!(
                "pid {pid}: {} live device memory in {} allocations",
                fmt_bytes(*bytes),
                allocs.len()
            ));
        }
        let findings = self.findings(start_ns, now_ns, 3);
        if findings.is_empty() {
            lines.push("findings so far: none".into());
        } else {
            lines.push("findings so far (last 50k calls):".into());
            for f in findings {
                lines.push(format!("  {}", terminal_safe(&truncate(&f, 140))));
            }
        }
        // Move up over the previous frame and clear to the end of the screen.
        if self.drawn_lines > 0 {
            let _ = write!(err, "\x1b[{}A\x1b[J", self.drawn_lines);
        }
        for l in &lines {
            let _ = writeln!(err, "{l}");
        }
        self.drawn_lines = lines.len();
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
/// dropping) keeps the metrics' counts exact.
const QUEUE: usize = 64;

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
                        Msg::Process(p) => view.set_process(&p),
                        Msg::Kernel(losses, counts) => {
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
    if v.len() >= WINDOW_EVENTS {
        // Drop the oldest fifth at once: amortised O(1) per event.
        v.drain(..WINDOW_EVENTS / 5);
    }
    v.push(item);
}

fn truncate(s: &str, max: usize) -> String {
    if s.chars().count() <= max {
        s.to_string()
    } else {
        format!("{}…", s.chars().take(max - 1).collect::<String>())
    }
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

    #[test]
    fn histogram_quantiles_are_within_bucket_error() {
        let mut h = Hist::default();
        for v in 1..=10_000u64 {
            h.add(v * 1000);
        }
        let p50 = h.quantile(0.5) as f64;
        let p99 = h.quantile(0.99) as f64;
        assert!((p50 - 5_000_000.0).abs() / 5_000_000.0 < 0.07, "{p50}");
        assert!((p99 - 9_900_000.0).abs() / 9_900_000.0 < 0.07, "{p99}");
        for v in [0u64, 1, 15, 16, 17, 1 << 40] {
            assert!(Hist::lower(Hist::bucket(v)) <= v);
        }
    }
}
