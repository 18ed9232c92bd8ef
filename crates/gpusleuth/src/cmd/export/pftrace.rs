//! `export --format pftrace`: the trace as Perfetto's own protobuf format
//! (a `Trace` of `TracePacket`s with `TrackEvent`s), which ui.perfetto.dev
//! and trace_processor read natively. It holds what the `perfetto` JSON
//! holds, in about a third of the bytes, with less work per event: the
//! names of ops, categories and arguments are interned once at the start,
//! times are integer nanoseconds, pointers are numbers.
//!
//! Layout (uuids: [`uuid`]): a track per process and per thread; a call is
//! a `SLICE_BEGIN` and a `SLICE_END` on its thread's track; a wait's
//! off-CPU slices go on a child track of the thread, "off-cpu", so they
//! never cut across a call's slice. Begin/end slices must nest on a track
//! (the `perfetto` JSON's complete events need not), so the reader sends
//! each call to the first of the thread's lanes ([`Tracks`]) where it
//! nests: the thread's own track, then child tracks "overlapping calls N"
//! for a call that starts inside another and ends after it (none in the
//! recorded example traces: a thread's calls nest; a damaged or synthetic
//! file may have them). Memory and NVML figures are counter tracks, findings and failed
//! allocations instant events, as in the JSON.
//!
//! Timestamps are nanoseconds since the trace's origin (the JSON's
//! microseconds times 1000); an instant "trace origin" at 0 on a
//! "gpusleuth" track says the origin on the monotonic and wall clocks.

use super::proto::{boolean, double, int, message, string, uint};
use super::{busy_step_at, category, drawn_ledgers, pipelined, Batches, Sink};
use super::{process_label, thread_label};
use crate::window::Window;
use serde_json::Value;
use sleuth_core::findings::Finding;
use sleuth_core::ledger::ProcessLedger;
use sleuth_core::{CallEvent, Culprit, TraceData, WaitEvent};
use std::collections::{BTreeSet, HashMap};
use std::io::Write;

// TracePacket fields (protos/perfetto/trace/trace_packet.proto).
const PACKET: u32 = 1; // Trace.packet
const TIMESTAMP: u32 = 8;
const SEQUENCE_ID: u32 = 10;
const TRACK_EVENT: u32 = 11;
const INTERNED_DATA: u32 = 12;
const SEQUENCE_FLAGS: u32 = 13;
const TRACK_DESCRIPTOR: u32 = 60;
const INCREMENTAL_STATE_CLEARED: u64 = 1;
const NEEDS_INCREMENTAL_STATE: u64 = 2;
/// The one packet sequence of the file (its interned names are its own).
const SEQUENCE: u64 = 1;

// TrackEvent fields and types.
const EV_CATEGORY_IIDS: u32 = 3;
const EV_DEBUG: u32 = 4;
const EV_TYPE: u32 = 9;
const EV_NAME_IID: u32 = 10;
const EV_TRACK: u32 = 11;
const EV_NAME: u32 = 23;
const EV_COUNTER: u32 = 30;
const EV_DOUBLE_COUNTER: u32 = 44;
const SLICE_BEGIN: u64 = 1;
const SLICE_END: u64 = 2;
const INSTANT: u64 = 3;
const COUNTER: u64 = 4;

// TrackDescriptor, ProcessDescriptor, ThreadDescriptor, CounterDescriptor
// and InternedData fields.
const TRACK_UUID: u32 = 1;
const TRACK_NAME: u32 = 2;
const TRACK_PROCESS: u32 = 3;
const TRACK_THREAD: u32 = 4;
const TRACK_PARENT: u32 = 5;
const TRACK_COUNTER: u32 = 8;
const PROCESS_PID: u32 = 1;
const PROCESS_NAME: u32 = 6;
const THREAD_PID: u32 = 1;
const THREAD_TID: u32 = 2;
const THREAD_NAME: u32 = 5;
const COUNTER_UNIT: u32 = 3;
const UNIT_SIZE_BYTES: u64 = 3;
const INTERNED_CATEGORIES: u32 = 1;
const INTERNED_EVENT_NAMES: u32 = 2;
const INTERNED_ARG_NAMES: u32 = 3;
/// An interned entry's (EventCategory, EventName, DebugAnnotationName) fields.
const INTERNED_IID: u32 = 1;
const INTERNED_NAME: u32 = 2;

// DebugAnnotation fields.
const ARG_NAME_IID: u32 = 1;
const ARG_BOOL: u32 = 2;
const ARG_UINT: u32 = 3;
const ARG_INT: u32 = 4;
const ARG_DOUBLE: u32 = 5;
const ARG_STRING: u32 = 6;
const ARG_POINTER: u32 = 7;
const ARG_NAME: u32 = 10;
const ARG_DICT: u32 = 11;
const ARG_ARRAY: u32 = 12;

/// Track uuids. A thread's tracks are `8k..8k+8` for the k-th thread to
/// appear (small numbers: every slice event names its track); the others
/// lie above 2^40, each kind in its own range.
mod uuid {
    pub const THREAD_STRIDE: u64 = 8;
    /// The off-CPU child track of a thread: its uuid plus this.
    pub const OFF_CPU: u64 = 1;
    /// Lane n (1..LANES) of a thread's overlapping calls: its uuid plus 1 + n.
    pub const LANES: usize = 7;
    pub const PROCESS: u64 = 1 << 40;
    pub const MEMORY: u64 = 2 << 40;
    pub const GPUS: u64 = 3 << 40;
    pub const GPU_BUSY: u64 = 4 << 40;
    /// Plus `gpu << 24 | pid`.
    pub const NVML_MEMORY: u64 = 5 << 40;
    pub const FINDINGS: u64 = 6 << 40;
    pub const TOOL: u64 = 7 << 40;
}

/// Categories, interned as their place in this list plus one.
const CATEGORIES: &[&str] = &[
    "cuda.runtime",
    "cuda.driver",
    "cuda.torch",
    "cuda.nccl",
    "cuda.unknown",
    "sched.blocked",
    "sched.runnable",
    "memory",
    "finding",
];

fn category_iid(name: &str) -> u64 {
    CATEGORIES
        .iter()
        .position(|c| *c == name)
        .map_or(0, |i| i as u64 + 1)
}

/// Event names beyond the ops (an op's name is interned as its id).
const OFF_CPU_BLOCKED: (u64, &str) = (1000, "off-cpu: blocked");
const OFF_CPU_RUNNABLE: (u64, &str) = (1001, "off-cpu: runnable");

/// Argument names, interned as their place in this list plus one.
#[derive(Clone, Copy)]
#[repr(u64)]
enum Arg {
    Ret = 1,
    OnCpuNs,
    RunnableNs,
    BlockedNs,
    Cpu,
    Size,
    Ptr,
    Stream,
    Kind,
    Nested,
    Site,
    Stack,
    PrevState,
    Preemptors,
    Culprits,
    Comm,
    Pid,
    Tid,
    Ns,
    Bytes,
    Error,
    LiveBytesAt,
    Severity,
    Summary,
    Recommendation,
    Pids,
    Evidence,
    Tool,
    Version,
    OriginMonoNs,
    OriginUnixNs,
}

const ARG_NAMES: &[&str] = &[
    "ret",
    "on_cpu_ns",
    "runnable_ns",
    "blocked_ns",
    "cpu",
    "size",
    "ptr",
    "stream",
    "kind",
    "nested",
    "site",
    "stack",
    "prev_state",
    "preemptors",
    "culprits",
    "comm",
    "pid",
    "tid",
    "ns",
    "bytes",
    "error",
    "live_bytes_at",
    "severity",
    "summary",
    "recommendation",
    "pids",
    "evidence",
    "tool",
    "version",
    "origin_mono_ns",
    "origin_unix_ns",
];

/// Packets already framed as `Trace.packet` fields, in order: a batch's
/// (serialized on a helper thread) or the document's own.
#[derive(Default)]
pub(super) struct Packets(Vec<u8>);

impl Packets {
    /// A packet: its time (ns since the origin) if it has one, then the
    /// sequence it belongs to, then what `body` writes.
    fn packet(&mut self, ts: Option<u64>, body: impl FnOnce(&mut Vec<u8>)) {
        message(&mut self.0, PACKET, |p| {
            if let Some(ts) = ts {
                uint(p, TIMESTAMP, ts);
            }
            uint(p, SEQUENCE_ID, SEQUENCE);
            body(p);
        });
    }

    /// A `TrackEvent` packet that may name interned strings.
    fn event(&mut self, ts: u64, body: impl FnOnce(&mut Vec<u8>)) {
        self.packet(Some(ts), |p| {
            uint(p, SEQUENCE_FLAGS, NEEDS_INCREMENTAL_STATE);
            message(p, TRACK_EVENT, body);
        });
    }

    /// A slice from `ts` lasting `dur` on `track`: its begin (with what
    /// `body` adds: category, name, arguments) and its end.
    fn slice(&mut self, ts: u64, dur: u64, track: u64, body: impl FnOnce(&mut Vec<u8>)) {
        self.event(ts, |e| {
            uint(e, EV_TYPE, SLICE_BEGIN);
            uint(e, EV_TRACK, track);
            body(e);
        });
        self.event(ts.saturating_add(dur), |e| {
            uint(e, EV_TYPE, SLICE_END);
            uint(e, EV_TRACK, track);
        });
    }

    fn counter(&mut self, ts: u64, track: u64, value: Count) {
        self.event(ts, |e| {
            uint(e, EV_TYPE, COUNTER);
            uint(e, EV_TRACK, track);
            match value {
                Count::Int(v) => int(e, EV_COUNTER, v),
                Count::Double(v) => double(e, EV_DOUBLE_COUNTER, v),
            }
        });
    }

    /// An instant event named `name` (not interned) on `track`.
    fn instant(
        &mut self,
        ts: u64,
        track: u64,
        cat: &str,
        name: &str,
        args: impl FnOnce(&mut Vec<u8>),
    ) {
        self.event(ts, |e| {
            uint(e, EV_TYPE, INSTANT);
            uint(e, EV_TRACK, track);
            uint(e, EV_CATEGORY_IIDS, category_iid(cat));
            string(e, EV_NAME, name);
            args(e);
        });
    }

    /// A track: `uuid`, under `parent`, with what `body` adds (a name, a
    /// process or thread, a counter).
    fn track(&mut self, uuid: u64, parent: Option<u64>, body: impl FnOnce(&mut Vec<u8>)) {
        self.packet(None, |p| {
            message(p, TRACK_DESCRIPTOR, |t| {
                uint(t, TRACK_UUID, uuid);
                if let Some(parent) = parent {
                    uint(t, TRACK_PARENT, parent);
                }
                body(t);
            })
        });
    }

    fn named_track(&mut self, uuid: u64, parent: Option<u64>, name: &str) {
        self.track(uuid, parent, |t| string(t, TRACK_NAME, name));
    }

    /// A counter track of `name` under `parent`, in bytes or plain.
    fn counter_track(&mut self, uuid: u64, parent: Option<u64>, name: &str, bytes: bool) {
        self.track(uuid, parent, |t| {
            string(t, TRACK_NAME, name);
            message(t, TRACK_COUNTER, |c| {
                if bytes {
                    uint(c, COUNTER_UNIT, UNIT_SIZE_BYTES);
                }
            });
        });
    }

    fn process(&mut self, ctx: &TraceData, pid: u32) {
        self.track(uuid::PROCESS + u64::from(pid), None, |t| {
            message(t, TRACK_PROCESS, |p| {
                uint(p, PROCESS_PID, u64::from(pid));
                string(p, PROCESS_NAME, &process_label(ctx, pid));
            })
        });
    }

    fn thread(&mut self, ctx: &TraceData, pid: u32, tid: u32, uuid: u64) {
        let name = thread_label(ctx, pid, tid);
        self.track(uuid, None, |t| {
            message(t, TRACK_THREAD, |th| {
                uint(th, THREAD_PID, u64::from(pid));
                uint(th, THREAD_TID, u64::from(tid));
                string(th, THREAD_NAME, &name);
            })
        });
    }
}

enum Count {
    Int(i64),
    Double(f64),
}

/// An argument named by its interned name.
fn arg(e: &mut Vec<u8>, name: Arg, value: impl FnOnce(&mut Vec<u8>)) {
    named(e, EV_DEBUG, name, value);
}

/// A `DebugAnnotation` in `field` (an event's argument, a dictionary's
/// entry) named by its interned name, with what `value` writes.
fn named(b: &mut Vec<u8>, field: u32, name: Arg, value: impl FnOnce(&mut Vec<u8>)) {
    message(b, field, |a| {
        uint(a, ARG_NAME_IID, name as u64);
        value(a);
    });
}

fn arg_uint(e: &mut Vec<u8>, name: Arg, v: u64) {
    arg(e, name, |a| uint(a, ARG_UINT, v));
}

fn arg_str(e: &mut Vec<u8>, name: Arg, v: &str) {
    arg(e, name, |a| string(a, ARG_STRING, v));
}

/// A JSON value as an argument's value: objects as dictionaries (their
/// keys not interned), arrays as arrays; null, `[]` and `{}` as strings
/// (an argument needs a value).
fn json_value(a: &mut Vec<u8>, v: &Value) {
    match v {
        Value::Null => string(a, ARG_STRING, "null"),
        Value::Bool(b) => boolean(a, ARG_BOOL, *b),
        Value::Number(n) => match (n.as_u64(), n.as_i64()) {
            (Some(u), _) => uint(a, ARG_UINT, u),
            (None, Some(i)) => int(a, ARG_INT, i),
            _ => double(a, ARG_DOUBLE, n.as_f64().unwrap_or(f64::NAN)),
        },
        Value::String(s) => string(a, ARG_STRING, s),
        Value::Array(xs) if xs.is_empty() => string(a, ARG_STRING, "[]"),
        Value::Object(m) if m.is_empty() => string(a, ARG_STRING, "{}"),
        Value::Array(xs) => xs
            .iter()
            .for_each(|x| message(a, ARG_ARRAY, |e| json_value(e, x))),
        Value::Object(m) => m.iter().for_each(|(k, x)| {
            message(a, ARG_DICT, |e| {
                string(e, ARG_NAME, k);
                json_value(e, x);
            })
        }),
    }
}

/// What the reader hands the serializers: tracks as they first appear,
/// then the calls and waits drawn on them.
pub(super) enum Rec {
    Process(u32),
    Thread {
        pid: u32,
        tid: u32,
        uuid: u64,
    },
    /// A child track of a thread: its off-CPU one, or a lane of overlapping calls.
    Child {
        parent: u64,
        uuid: u64,
        lane: usize,
    },
    Call(CallEvent, u64),
    Wait(WaitEvent, u64),
}

impl Rec {
    fn write(&self, out: &mut Packets, ctx: &TraceData, origin: u64) {
        match self {
            &Rec::Process(pid) => out.process(ctx, pid),
            &Rec::Thread { pid, tid, uuid } => out.thread(ctx, pid, tid, uuid),
            &Rec::Child { parent, uuid, lane } => {
                let name = match lane {
                    0 => "off-cpu".to_string(),
                    n => format!("overlapping calls {n}"),
                };
                out.named_track(uuid, Some(parent), &name);
            }
            Rec::Call(c, track) => call(out, c, *track, ctx, origin),
            Rec::Wait(w, track) => off_cpu(out, w, *track, origin),
        }
    }
}

fn call(out: &mut Packets, c: &CallEvent, track: u64, ctx: &TraceData, origin: u64) {
    let host = ctx.has_host_context;
    let stack = c.stack_id.and_then(|id| ctx.stacks.get(&id));
    out.slice(c.ts_ns.saturating_sub(origin), c.dur_ns, track, |e| {
        uint(e, EV_CATEGORY_IIDS, category_iid(category(c.layer())));
        match c.info() {
            Some(op) => uint(e, EV_NAME_IID, u64::from(op.id)),
            None => string(e, EV_NAME, c.op_name()),
        }
        if c.has_status() {
            arg(e, Arg::Ret, |a| int(a, ARG_INT, c.ret));
        }
        if host {
            arg_uint(e, Arg::OnCpuNs, c.on_cpu_ns());
            arg_uint(e, Arg::RunnableNs, c.runnable_ns);
            arg_uint(e, Arg::BlockedNs, c.blocked_ns);
            arg_uint(e, Arg::Cpu, u64::from(c.cpu));
        }
        if let Some(v) = c.size {
            arg_uint(e, Arg::Size, v);
        }
        if let Some(v) = c.ptr {
            arg(e, Arg::Ptr, |a| uint(a, ARG_POINTER, v));
        }
        if let Some(v) = c.stream {
            arg(e, Arg::Stream, |a| uint(a, ARG_POINTER, v));
        }
        if let Some(v) = c.kind {
            arg_uint(e, Arg::Kind, v);
        }
        if c.nested {
            arg(e, Arg::Nested, |a| boolean(a, ARG_BOOL, true));
        }
        if let Some(st) = stack {
            arg_str(e, Arg::Site, &st.site_label());
            arg(e, Arg::Stack, |a| {
                for f in &st.frames {
                    message(a, ARG_ARRAY, |x| string(x, ARG_STRING, &f.label()));
                }
            });
        }
    });
}

/// A wait's blocked and runnable slices on its thread's off-CPU track.
fn off_cpu(out: &mut Packets, w: &WaitEvent, track: u64, origin: u64) {
    let at = |ns: u64| ns.saturating_sub(origin);
    if w.blocked_ns() > 0 {
        out.slice(at(w.off_ns), w.blocked_ns(), track, |e| {
            uint(e, EV_CATEGORY_IIDS, category_iid("sched.blocked"));
            uint(e, EV_NAME_IID, OFF_CPU_BLOCKED.0);
            arg_str(e, Arg::Kind, w.kind.as_str());
            arg_uint(e, Arg::PrevState, u64::from(w.prev_state));
        });
    }
    if w.runnable_ns() > 0 {
        out.slice(at(w.wake_ns.max(w.off_ns)), w.runnable_ns(), track, |e| {
            uint(e, EV_CATEGORY_IIDS, category_iid("sched.runnable"));
            uint(e, EV_NAME_IID, OFF_CPU_RUNNABLE.0);
            arg_uint(e, Arg::Cpu, u64::from(w.cpu));
            arg_str(e, Arg::Kind, w.kind.as_str());
            arg_str(
                e,
                Arg::Preemptors,
                &super::Preemptors(&w.culprits).to_string(),
            );
            if !w.culprits.is_empty() {
                arg(e, Arg::Culprits, |a| {
                    w.culprits.iter().for_each(|c| culprit(a, c))
                });
            }
        });
    }
}

fn culprit(a: &mut Vec<u8>, c: &Culprit) {
    message(a, ARG_ARRAY, |x| {
        named(x, ARG_DICT, Arg::Comm, |d| string(d, ARG_STRING, &c.comm));
        named(x, ARG_DICT, Arg::Pid, |d| {
            uint(d, ARG_UINT, u64::from(c.pid))
        });
        named(x, ARG_DICT, Arg::Tid, |d| {
            uint(d, ARG_UINT, u64::from(c.tid))
        });
        named(x, ARG_DICT, Arg::Ns, |d| uint(d, ARG_UINT, c.ns));
    });
}

/// A thread's tracks as the reader knows them.
struct ThreadTracks {
    uuid: u64,
    off_cpu: bool,
    /// Per lane (0: the thread's own track), the calls open at the last
    /// start seen there, outermost first, as (start, end).
    lanes: Vec<Vec<(u64, u64)>>,
    /// The thread's last calls, all starting at one time, not placed yet:
    /// a call and one nested in it that start at the same nanosecond come
    /// innermost first (it returned first, so its row id is lower) and are
    /// placed longest first, so that the outer one opens first.
    same_start: Vec<CallEvent>,
}

/// Calls of one thread starting at one time held at most, before they are
/// placed as they are (a crafted file's: a real thread's are one or two).
const SAME_START_HELD: usize = 256;

/// The reader's side of the tracks: which were declared, each thread's
/// lanes. Every track is declared (a `Rec` before the first one drawn on
/// it) in the order the reader meets it.
#[derive(Default)]
pub(super) struct Tracks {
    threads: HashMap<(u32, u32), ThreadTracks>,
    processes: BTreeSet<u32>,
}

impl Tracks {
    fn process(&mut self, sink: &mut Sink<Rec>, pid: u32) -> anyhow::Result<()> {
        if self.processes.insert(pid) {
            sink.push(Rec::Process(pid))?;
        }
        Ok(())
    }

    fn thread(
        &mut self,
        sink: &mut Sink<Rec>,
        pid: u32,
        tid: u32,
    ) -> anyhow::Result<&mut ThreadTracks> {
        if !self.threads.contains_key(&(pid, tid)) {
            self.process(sink, pid)?;
            let uuid = (self.threads.len() as u64 + 1) * uuid::THREAD_STRIDE;
            sink.push(Rec::Thread { pid, tid, uuid })?;
            let t = ThreadTracks {
                uuid,
                off_cpu: false,
                lanes: vec![Vec::new()],
                same_start: Vec::new(),
            };
            self.threads.insert((pid, tid), t);
        }
        Ok(self.threads.get_mut(&(pid, tid)).expect("inserted above"))
    }

    /// Hands on a call on the first lane of its thread where it nests.
    /// Calls come in start order (per file of a run); each thread's
    /// calls of one start time wait until one with a later start comes, or
    /// [`Tracks::flush`].
    pub(super) fn call(&mut self, sink: &mut Sink<Rec>, c: CallEvent) -> anyhow::Result<()> {
        let t = self.thread(sink, c.pid, c.tid)?;
        let later = t.same_start.first().is_some_and(|p| p.ts_ns != c.ts_ns);
        if later || t.same_start.len() == SAME_START_HELD {
            Self::place_held(t, sink)?;
        }
        t.same_start.push(c);
        Ok(())
    }

    /// Places every thread's held calls (after the calls, before the waits).
    pub(super) fn flush(&mut self, sink: &mut Sink<Rec>) -> anyhow::Result<()> {
        let mut threads: Vec<&mut ThreadTracks> = self.threads.values_mut().collect();
        // In the threads' order of appearance: the same output every time.
        threads.sort_by_key(|t| t.uuid);
        threads
            .into_iter()
            .try_for_each(|t| Self::place_held(t, sink))
    }

    /// A thread's held calls, longest first (a stable sort: equal ones in
    /// their order).
    fn place_held(t: &mut ThreadTracks, sink: &mut Sink<Rec>) -> anyhow::Result<()> {
        let mut held = std::mem::take(&mut t.same_start);
        held.sort_by_key(|c| std::cmp::Reverse(c.dur_ns));
        for c in held.drain(..) {
            Self::place(t, sink, c)?;
        }
        t.same_start = held;
        Ok(())
    }

    fn place(t: &mut ThreadTracks, sink: &mut Sink<Rec>, c: CallEvent) -> anyhow::Result<()> {
        let (start, end) = (c.ts_ns, c.end_ns());
        let mut lane = 0;
        loop {
            if lane == t.lanes.len() {
                t.lanes.push(Vec::new());
                let uuid = t.uuid + uuid::OFF_CPU + lane as u64;
                sink.push(Rec::Child {
                    parent: t.uuid,
                    uuid,
                    lane,
                })?;
            }
            let open = &mut t.lanes[lane];
            while open.last().is_some_and(|&(_, e)| e <= start) {
                open.pop();
            }
            // Nests in the innermost open call, starting no earlier than it
            // (so a lane's calls arrive in start order), or the lane is
            // the last one, which takes any.
            let nests = open.last().is_none_or(|&(s, e)| s <= start && end <= e);
            if nests || lane + 1 == uuid::LANES {
                open.push((start, end));
                break;
            }
            lane += 1;
        }
        let uuid = match lane {
            0 => t.uuid,
            n => t.uuid + uuid::OFF_CPU + n as u64,
        };
        sink.push(Rec::Call(c, uuid))
    }

    /// Hands on a wait, on its thread's off-CPU track.
    pub(super) fn wait(&mut self, sink: &mut Sink<Rec>, w: WaitEvent) -> anyhow::Result<()> {
        let t = self.thread(sink, w.pid, w.tid)?;
        let uuid = t.uuid + uuid::OFF_CPU;
        if !t.off_cpu {
            t.off_cpu = true;
            let parent = t.uuid;
            sink.push(Rec::Child {
                parent,
                uuid,
                lane: 0,
            })?;
        }
        sink.push(Rec::Wait(w, uuid))
    }
}

/// The output: packets written to `w` in pieces.
struct PacketWriter<'w> {
    w: &'w mut (dyn Write + Send),
    buf: Packets,
}

impl PacketWriter<'_> {
    const PIECE: usize = 1 << 16;

    fn flush_piece(&mut self) -> std::io::Result<()> {
        if self.buf.0.len() >= Self::PIECE {
            self.w.write_all(&self.buf.0)?;
            self.buf.0.clear();
        }
        Ok(())
    }

    fn finish(self) -> std::io::Result<()> {
        self.w.write_all(&self.buf.0)
    }
}

impl Batches<Packets> for PacketWriter<'_> {
    fn append(&mut self, made: &Packets) -> std::io::Result<()> {
        self.buf.0.extend_from_slice(&made.0);
        self.flush_piece()
    }
}

/// What a document holds besides its calls and waits (the `perfetto`
/// JSON's frame): the trace's processes, stacks and NVML samples, the
/// origin, the memory tracks and the findings.
pub(super) struct Frame<'a> {
    pub ctx: &'a TraceData,
    pub origin: u64,
    pub ledgers: &'a [ProcessLedger],
    pub findings: &'a [Finding],
}

/// Writes the document: the interned names and the origin, every process
/// of the trace, what `produce` reads (through the [`Tracks`] it is
/// given), then the memory and NVML counters and the findings.
pub(super) fn write(
    w: &mut (dyn Write + Send),
    f: Frame,
    window: Option<Window>,
    produce: impl FnOnce(&mut Tracks, &mut Sink<Rec>) -> anyhow::Result<()>,
) -> anyhow::Result<()> {
    let (ctx, origin) = (f.ctx, f.origin);
    let mut out = PacketWriter {
        w,
        buf: Packets::default(),
    };
    preamble(&mut out.buf, ctx, origin);
    let mut tracks = Tracks::default();
    let mut first = Packets::default();
    let pids: BTreeSet<u32> = ctx.processes.iter().map(|p| p.pid).collect();
    for pid in pids {
        tracks.processes.insert(pid);
        first.process(ctx, pid);
    }
    out.append(&first)?;
    pipelined(
        &mut out,
        |sink| {
            produce(&mut tracks, sink)?;
            tracks.flush(sink)
        },
        |rec: &Rec, made: &mut Packets| {
            rec.write(made, ctx, origin);
            Ok(())
        },
    )?;
    let mut last = Packets::default();
    for pid in drawn_ledgers(f.ledgers, origin, window)
        .map(|(l, _)| l.pid)
        .chain(ctx.process_gpu.iter().map(|p| p.pid))
    {
        if tracks.processes.insert(pid) {
            last.process(ctx, pid);
        }
    }
    memory_tracks(&mut last, f.ledgers, origin, window);
    gpu_counters(&mut last, ctx, origin, window);
    last.named_track(uuid::FINDINGS, None, "findings (gpusleuth)");
    for finding in f.findings {
        finding_event(&mut last, finding, ctx, origin);
    }
    out.append(&last)?;
    out.finish()?;
    Ok(())
}

/// The sequence's first packet, with every interned name, and the origin.
fn preamble(out: &mut Packets, ctx: &TraceData, origin: u64) {
    out.packet(None, |p| {
        uint(p, SEQUENCE_FLAGS, INCREMENTAL_STATE_CLEARED);
        message(p, INTERNED_DATA, |d| {
            let entry = |d: &mut Vec<u8>, field, iid: u64, name: &str| {
                message(d, field, |e| {
                    uint(e, INTERNED_IID, iid);
                    string(e, INTERNED_NAME, name);
                })
            };
            for (i, c) in CATEGORIES.iter().enumerate() {
                entry(d, INTERNED_CATEGORIES, i as u64 + 1, c);
            }
            for op in sleuth_core::ops::OPS {
                entry(d, INTERNED_EVENT_NAMES, u64::from(op.id), op.name);
            }
            for (iid, name) in [OFF_CPU_BLOCKED, OFF_CPU_RUNNABLE] {
                entry(d, INTERNED_EVENT_NAMES, iid, name);
            }
            for (i, a) in ARG_NAMES.iter().enumerate() {
                entry(d, INTERNED_ARG_NAMES, i as u64 + 1, a);
            }
        });
    });
    out.named_track(uuid::TOOL, None, "gpusleuth");
    out.instant(0, uuid::TOOL, "finding", "trace origin", |e| {
        arg_str(e, Arg::Tool, "gpusleuth");
        arg_str(e, Arg::Version, env!("CARGO_PKG_VERSION"));
        arg_uint(e, Arg::OriginMonoNs, origin);
        let unix = i128::from(origin) + i128::from(ctx.realtime_offset_ns);
        arg(e, Arg::OriginUnixNs, |a| int(a, ARG_INT, unix as i64));
    });
}

/// Device memory per process as counter tracks (the `perfetto` JSON's
/// `memory_tracks`: from the trace's or the window's start) and each
/// failed allocation as an instant on the process's track.
fn memory_tracks(
    out: &mut Packets,
    ledgers: &[ProcessLedger],
    origin: u64,
    window: Option<Window>,
) {
    for (l, start) in drawn_ledgers(ledgers, origin, window) {
        let track = uuid::MEMORY + u64::from(l.pid);
        let process = uuid::PROCESS + u64::from(l.pid);
        out.counter_track(track, Some(process), "device memory (bytes)", true);
        let start_ts = start.at.saturating_sub(origin);
        out.counter(start_ts, track, Count::Int(start.live_bytes as i64));
        for p in l.timeline.iter().filter(|p| start.holds(p.ts_ns)) {
            out.counter(
                p.ts_ns.saturating_sub(origin),
                track,
                Count::Int(p.live_bytes as i64),
            );
        }
        if let Some(exit) = start.exit_in(l) {
            out.counter(exit.saturating_sub(origin), track, Count::Int(0));
        }
        for fa in l.failed_allocs.iter().filter(|fa| start.holds(fa.ts_ns)) {
            let name = format!("failed {}", fa.op);
            out.instant(
                fa.ts_ns.saturating_sub(origin),
                process,
                "memory",
                &name,
                |e| {
                    arg_uint(e, Arg::Bytes, fa.bytes);
                    arg(e, Arg::Error, |a| int(a, ARG_INT, fa.error));
                    arg_uint(e, Arg::LiveBytesAt, fa.live_bytes_at);
                },
            );
        }
    }
}

/// NVML's figures (the `perfetto` JSON's `gpu_counters`): GPU busy per
/// GPU under a "GPUs (NVML)" track, and per process the device memory the
/// driver attributed to it.
fn gpu_counters(out: &mut Packets, data: &TraceData, origin: u64, window: Option<Window>) {
    let held = |ts: u64| Window::covers(window, ts);
    let mut declared = BTreeSet::new();
    if let Some(samples) = &data.gpu_samples {
        out.named_track(uuid::GPUS, None, "GPUs (NVML)");
        for g in samples.iter().filter(|g| held(g.ts_ns)) {
            let track = uuid::GPU_BUSY + u64::from(g.gpu);
            if declared.insert(track) {
                out.counter_track(
                    track,
                    Some(uuid::GPUS),
                    &format!("GPU {} busy (%)", g.gpu),
                    false,
                );
            }
            let at = busy_step_at(g, origin) - origin;
            out.counter(at, track, Count::Double(g.busy_pct));
        }
    }
    for p in data.process_gpu.iter().filter(|p| held(p.ts_ns)) {
        if let Some(b) = p.used_bytes {
            let track = uuid::NVML_MEMORY + (u64::from(p.gpu) << 24) + u64::from(p.pid);
            if declared.insert(track) {
                let name = format!("GPU {} memory held, NVML (bytes)", p.gpu);
                out.counter_track(track, Some(uuid::PROCESS + u64::from(p.pid)), &name, true);
            }
            out.counter(p.ts_ns.saturating_sub(origin), track, Count::Int(b as i64));
        }
    }
}

/// A finding as an instant on the findings track, where the `perfetto`
/// JSON puts it ([`super::finding_time`]).
fn finding_event(out: &mut Packets, f: &Finding, data: &TraceData, origin: u64) {
    let ts = super::finding_time(f, data, origin).saturating_sub(origin);
    let name = super::finding_name(f);
    out.instant(ts, uuid::FINDINGS, "finding", &name, |e| {
        arg_str(e, Arg::Severity, f.severity.as_str());
        arg_str(e, Arg::Summary, &f.summary);
        arg_str(e, Arg::Recommendation, &f.recommendation);
        arg(e, Arg::Pids, |a| json_value(a, &serde_json::json!(f.pids)));
        let culprits = serde_json::to_value(&f.culprits).unwrap_or(Value::Null);
        arg(e, Arg::Culprits, |a| json_value(a, &culprits));
        arg(e, Arg::Evidence, |a| json_value(a, &f.evidence));
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use sleuth_core::Layer;

    #[test]
    fn interned_ids_are_unique_and_name_what_the_lists_say() {
        assert_eq!(Arg::OriginUnixNs as usize, ARG_NAMES.len());
        assert_eq!(ARG_NAMES[Arg::Culprits as usize - 1], "culprits");
        assert_eq!(ARG_NAMES[Arg::LiveBytesAt as usize - 1], "live_bytes_at");
        let mut ids: Vec<u64> = sleuth_core::ops::OPS
            .iter()
            .map(|o| u64::from(o.id))
            .collect();
        ids.extend([OFF_CPU_BLOCKED.0, OFF_CPU_RUNNABLE.0]);
        let n = ids.len();
        ids.sort();
        ids.dedup();
        assert_eq!(ids.len(), n, "event name ids collide");
        for layer in [
            None,
            Some(Layer::Runtime),
            Some(Layer::Driver),
            Some(Layer::Torch),
            Some(Layer::Nccl),
        ] {
            assert_ne!(category_iid(category(layer)), 0);
        }
    }
}
