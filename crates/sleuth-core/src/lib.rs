//! gpusleuth's pure core: the op table, the event model, record decoding and
//! every analysis (statistics, time decomposition, memory ledger, findings).
//! Nothing here touches the OS, so every diagnosis is testable from data.

pub mod allocator;
pub mod analysis;
pub mod counted;
pub mod culprits;
pub mod data;
pub mod decompose;
pub mod event;
pub mod findings;
pub mod gpu_activity;
pub mod gpu_busy;
pub mod held;
pub mod int_hash;
pub mod latency;
pub mod ledger;
pub mod nccl;
pub mod ops;
pub mod record;
pub mod rollup;
pub mod sites;
pub mod span;
pub mod stats;
#[cfg(any(test, feature = "testing"))]
pub mod testing;
pub mod threads;
pub mod units;

pub use data::{GpuSample, NodeProcess, ProcessGpuSample, ProcessInfo, SamplePhase, TraceData};
pub use event::{
    BlockEvent, CallEvent, Culprit, Event, OpCount, ProcEvent, ProcKind, WaitEvent, WaitKind, Waker,
};
pub use ops::{op_by_id, op_by_name, Layer, OpClass, OpInfo, OpSet, OPS};
pub use span::TraceSpan;
