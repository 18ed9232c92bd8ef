//! Plain data passed in and out of the store.

use serde::Serialize;
use sleuth_core::{CallEvent, Layer};

/// Who produced a trace (`meta.source`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum TraceSource {
    /// Recorded by gpusleuth itself: per-call host context is present.
    Gpusleuth,
    /// Imported from an Ingero database: no per-call host context.
    Ingero,
}

impl TraceSource {
    pub fn as_str(self) -> &'static str {
        match self {
            TraceSource::Gpusleuth => "gpusleuth",
            TraceSource::Ingero => "ingero",
        }
    }
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "gpusleuth" => Some(TraceSource::Gpusleuth),
            "ingero" => Some(TraceSource::Ingero),
            _ => None,
        }
    }
}

/// What a trace session was (the `session` row).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct SessionInfo {
    /// Wall-clock start (Unix ns).
    pub started_unix_ns: i64,
    /// Monotonic start (ns).
    pub start_mono_ns: u64,
    /// Wall-clock ns = monotonic ns + this offset.
    pub realtime_offset_ns: i64,
    pub hostname: String,
    /// `uname -r`.
    pub kernel: String,
    /// The command line of `gpusleuth trace` itself.
    pub command: String,
    /// What was traced: the launched command, the pid list, or "all".
    pub target: String,
    /// How launches were captured ("driver", "all", "full", "off"), or "import".
    pub launch_mode: String,
    pub tool_version: String,
    /// Subtracted from every CLOCK_MONOTONIC time the writer stores: the
    /// file's clock (`crate::file_clock`; `file_clock::clock_base_for`
    /// the run's start for a recorded trace, 0 to keep CLOCK_MONOTONIC).
    /// Every file of a run has the same.
    pub clock_base_ns: u64,
}

#[cfg(test)]
impl SessionInfo {
    /// A session for the crate's own tests that write a trace.
    pub(crate) fn for_tests() -> SessionInfo {
        SessionInfo {
            started_unix_ns: 1_700_000_000_000_000_000,
            start_mono_ns: 1_000,
            realtime_offset_ns: 1_699_999_999_000_000_000,
            hostname: "testhost".into(),
            kernel: "6.1.0".into(),
            command: "gpusleuth trace -- ./work".into(),
            target: "./work".into(),
            launch_mode: "launch".into(),
            tool_version: "0.1.0".into(),
            clock_base_ns: 0,
        }
    }
}

/// A stored session: what was given at creation plus what is known at the end.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Session {
    #[serde(flatten)]
    pub info: SessionInfo,
    pub end_mono_ns: Option<u64>,
    pub source: TraceSource,
}

/// How the writer behaves.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WriterOptions {
    /// Size cap of the database (main file + WAL). Once reached, call and wait
    /// rows are counted in `stats.drop_db_full` instead of stored; aggregates
    /// (processes, op counts, stats, notes) are still written. Default 1 GiB.
    pub max_db_bytes: u64,
    /// Most events per transaction (a batch also ends after 100 ms).
    pub batch_events: usize,
    /// Capacity of the channel to the writer thread, in messages; `send`
    /// blocks when it is full.
    pub queue_capacity: usize,
    /// Replace an existing file instead of refusing.
    pub overwrite: bool,
    /// Recorded in `meta.source`.
    pub source: TraceSource,
    /// Run the writer thread at a lower priority (nice +10): while tracing,
    /// its SQLite work must not take CPU time from the traced threads, and
    /// the bounded queue absorbs its delays.
    pub background: bool,
    /// A file of a rotating trace (`trace --rotate`): its completion
    /// carries the run's memory ledger from the previous file
    /// (`crate::run_ledger`). None for a single trace.
    pub run: Option<crate::run_ledger::RunLink>,
    /// The tracer's pid (`stats.tracer_pid`: its threads are never
    /// culprits), stored when the file is created, so that a file whose
    /// tracer is killed in its first batch names it too.
    pub tracer_pid: Option<u32>,
}

/// Default size cap: 1 GiB.
pub const DEFAULT_MAX_DB_BYTES: u64 = 1 << 30;

impl Default for WriterOptions {
    fn default() -> Self {
        WriterOptions {
            max_db_bytes: DEFAULT_MAX_DB_BYTES,
            background: false,
            batch_events: 4096,
            queue_capacity: 16_384,
            overwrite: false,
            source: TraceSource::Gpusleuth,
            run: None,
            tracer_pid: None,
        }
    }
}

/// A CUDA library the tracer probed.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct LibraryInfo {
    pub path: String,
    pub layer: Option<Layer>,
    pub dev: Option<u64>,
    pub ino: Option<u64>,
    /// When its probes were attached (monotonic ns).
    pub attached_mono_ns: Option<u64>,
    /// Number of probes attached in it.
    pub probes: u32,
    /// Symbols of the op table this copy does not export.
    pub missing: Vec<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum NoteLevel {
    Info,
    Warn,
}

impl NoteLevel {
    pub fn as_str(self) -> &'static str {
        match self {
            NoteLevel::Info => "info",
            NoteLevel::Warn => "warn",
        }
    }
}

/// A remark about the trace a reader should see (late attach, cap reached, import gaps).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Note {
    pub ts_ns: u64,
    pub level: String,
    pub text: String,
}

/// What `TraceWriter::finish` did.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct WriteSummary {
    pub calls_stored: u64,
    pub waits_stored: u64,
    pub proc_events_stored: u64,
    /// Call and wait records not stored because the size cap was reached.
    pub dropped_db_full: u64,
    /// Every event the writer received (calls, waits, lifecycle and
    /// allocator events), those past the size cap included: with the
    /// capture's losses, what the probes produced.
    pub events_received: u64,
    pub call_culprit_rows: u64,
    pub db_bytes: u64,
    /// The file is complete but stays in WAL mode: a reader had it open
    /// when the trace ended (its `-wal` is part of it until a writer, such
    /// as `gpusleuth finish`, folds it in).
    pub kept_wal: bool,
    /// The bytes free on the disk holding the file when it ran low, where
    /// it did: the calls and waits after it were dropped
    /// (`dropped_db_full`) and the file completed in the space set aside
    /// (`disk_reserve`).
    pub disk_ran_low: Option<u64>,
}

/// A call as stored, with its row id (for `Trace::call_culprits_of`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct StoredCall {
    pub id: i64,
    #[serde(flatten)]
    pub call: CallEvent,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum CallOrder {
    /// Oldest first.
    #[default]
    ByTime,
    /// Slowest first.
    ByDurationDesc,
}

/// Which calls `Trace::calls_filtered` returns. `None` fields do not filter.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CallFilter {
    pub pid: Option<u32>,
    /// Exact symbol name, e.g. `cudaMalloc`.
    pub op: Option<String>,
    /// Calls starting at or after this monotonic ns.
    pub since_ns: Option<u64>,
    /// Calls starting before this monotonic ns.
    pub until_ns: Option<u64>,
    pub limit: Option<usize>,
    pub order: CallOrder,
}

/// Which waits `Trace::waits_filtered` returns (by `on_ns`, oldest first).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct WaitFilter {
    pub pid: Option<u32>,
    pub tid: Option<u32>,
    /// Waits ending (`on_ns`) at or after this monotonic ns.
    pub since_ns: Option<u64>,
    /// Waits starting (`off_ns`) before this monotonic ns.
    pub until_ns: Option<u64>,
    pub limit: Option<usize>,
}

/// One input of a merged trace (`gpusleuth merge`), as recorded in `merge_nodes`.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct MergeNode {
    pub node: i64,
    pub hostname: String,
    pub source: String,
    /// The input session's wall-clock offset (wall = monotonic + this).
    pub realtime_offset_ns: i64,
    /// What was added to the input's timestamps to put them on the merged clock.
    pub shift_ns: i64,
    /// Residual clock skew estimated from collective alignment (node clock minus first node's).
    pub skew_ns: i64,
    /// Whether the skew was subtracted (alignment was consistent).
    pub skew_applied: bool,
    pub skew_samples: i64,
    /// Spread (median absolute deviation) of the alignment samples.
    pub skew_spread_ns: Option<i64>,
    /// Added to the input's pids and tids (0 unless they collided with an earlier node's).
    pub pid_offset: i64,
}
