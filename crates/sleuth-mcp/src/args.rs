//! Tool arguments: what each tool accepts, with the JSON schema clients see.
//! Every field is optional unless a tool cannot answer without it; unknown
//! fields are rejected so a misspelt filter is an error, not a silent no-op.

use rmcp::schemars::{self, JsonSchema};
use serde::{Deserialize, Deserializer};

/// The largest time a trace can hold (its columns are SQLite's signed
/// 64-bit integers). Every time argument (`since_ns`, `until_ns`, `at_ns`,
/// `window_ns`, `last_ns`) and every window bound computed from them is
/// saturated here, in one place: the schema says uint64, and a value of
/// 2^63 or more once wrapped to a negative time in the store's reads
/// (`since_ns: 2^63` selected every call, `until_ns: 2^63` none).
pub const MAX_TIME_NS: u64 = i64::MAX as u64;

/// `ns` saturated to [`MAX_TIME_NS`].
pub fn clamp_ns(ns: u64) -> u64 {
    ns.min(MAX_TIME_NS)
}

/// Deserializes an optional time argument saturated to [`MAX_TIME_NS`].
fn opt_ns<'de, D: Deserializer<'de>>(d: D) -> Result<Option<u64>, D::Error> {
    Ok(Option::<u64>::deserialize(d)?.map(clamp_ns))
}

/// Deserializes a required time argument saturated to [`MAX_TIME_NS`].
fn req_ns<'de, D: Deserializer<'de>>(d: D) -> Result<u64, D::Error> {
    Ok(clamp_ns(u64::deserialize(d)?))
}

/// `gpu_holders`: no arguments; anything given is refused (as every tool
/// refuses an argument it does not know).
#[derive(Debug, Default, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct NoArgs {}

/// Arguments every trace tool accepts.
#[derive(Debug, Default, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct DbOnly {
    /// Trace database to read instead of the server's `--db` (opened read-only; must exist).
    pub db: Option<String>,
}

/// `latency_stats` and `findings`: which calls to consider.
#[derive(Debug, Default, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CallScope {
    /// Trace database to read instead of the server's `--db`.
    pub db: Option<String>,
    /// Only this process.
    pub pid: Option<u32>,
    /// Only this CUDA op, by symbol name (e.g. `cudaMalloc`, `cuMemAlloc_v2`).
    pub op: Option<String>,
    /// Only calls starting at or after this monotonic timestamp (ns, the trace's clock).
    #[serde(default, deserialize_with = "opt_ns")]
    pub since_ns: Option<u64>,
    /// Only calls starting before this monotonic timestamp (ns).
    #[serde(default, deserialize_with = "opt_ns")]
    pub until_ns: Option<u64>,
    /// Only calls starting in the last this many ns of the trace (up to its
    /// end, or for a trace still being written its latest call), as
    /// `gpusleuth stats --last`. Not with since_ns/until_ns.
    #[serde(default, deserialize_with = "opt_ns")]
    pub last_ns: Option<u64>,
}

impl CallScope {
    /// The scope with `last_ns` turned into `since_ns` for `trace` (the
    /// last part of it, never before its start); errors: `last_ns` with
    /// `since_ns`/`until_ns`, or 0 (an empty window).
    pub fn resolved(&self, trace: &sleuth_store::Trace) -> anyhow::Result<CallScope> {
        let Some(last) = self.last_ns else {
            return Ok(self.clone());
        };
        if self.since_ns.is_some() || self.until_ns.is_some() {
            anyhow::bail!("last_ns names its own window: give it without since_ns/until_ns");
        }
        if last == 0 {
            anyhow::bail!("empty time window: last_ns must be above 0");
        }
        let (_, since) = trace.start_and_since_last(last)?;
        Ok(CallScope {
            since_ns: Some(since),
            ..self.clone()
        })
    }

    /// The calls the scope selects, as the store filters them.
    pub fn filter(&self) -> sleuth_store::CallFilter {
        sleuth_store::CallFilter {
            pid: self.pid,
            op: self.op.clone(),
            since_ns: self.since_ns,
            until_ns: self.until_ns,
            ..Default::default()
        }
    }
}

/// `slow_calls`.
#[derive(Debug, Default, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SlowCalls {
    pub db: Option<String>,
    /// CUDA op by symbol name, e.g. `cudaStreamSynchronize`. Omit for the slowest calls of any op.
    pub op: Option<String>,
    /// Only this process.
    pub pid: Option<u32>,
    /// How many calls, slowest first (default 10, at most 100).
    pub limit: Option<u32>,
}

/// `call_sites`.
#[derive(Debug, Default, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CallSites {
    pub db: Option<String>,
    /// Only this process.
    pub pid: Option<u32>,
    /// How many sites per list (default 20, at most 200).
    pub limit: Option<u32>,
}

/// `memory`.
#[derive(Debug, Default, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Memory {
    pub db: Option<String>,
    /// Only this process.
    pub pid: Option<u32>,
    /// The ledger as it stood at this monotonic timestamp (ns); omit for the end of the trace.
    #[serde(default, deserialize_with = "opt_ns")]
    pub at_ns: Option<u64>,
    /// Most timeline points per process (default 50, at most 2000; 0 leaves the timeline out).
    pub timeline_points: Option<u32>,
}

/// `timeline`.
#[derive(Debug, Default, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Timeline {
    pub db: Option<String>,
    /// The process whose events to list.
    pub pid: u32,
    /// Centre of the window: a monotonic timestamp (ns) of the trace.
    #[serde(deserialize_with = "req_ns")]
    pub at_ns: u64,
    /// Half-width of the window in ns (default 10 ms).
    #[serde(default, deserialize_with = "opt_ns")]
    pub window_ns: Option<u64>,
    /// Most events returned (default 200, at most 2000).
    pub limit: Option<u32>,
}

/// `sql`.
#[derive(Debug, Default, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Sql {
    pub db: Option<String>,
    /// One read-only SQL statement (SELECT / WITH ... SELECT). Schema: docs/schema.md.
    pub query: String,
    /// Most rows returned (default 200, at most 1000).
    pub max_rows: Option<u32>,
}

/// `reclaim_plan`.
#[derive(Debug, Default, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Reclaim {
    /// Only these pids (default: every holder the plan considers safe to stop).
    pub pids: Option<Vec<u32>>,
    /// Execute the plan. Honoured only when the server was started with `--allow-reclaim`.
    pub execute: Option<bool>,
}

/// The `investigate` prompt.
#[derive(Debug, Default, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Investigate {
    /// What the user is worried about, e.g. "training step got slower" (optional).
    pub question: Option<String>,
}
