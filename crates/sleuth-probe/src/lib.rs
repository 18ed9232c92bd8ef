//! gpusleuth's capture path: find CUDA libraries, load and attach the eBPF
//! programs (aya), drain the ring buffer. Linux only; needs root.

pub mod caps;
pub mod capture;
pub mod discover;
pub mod elf_symbols;
mod multi;
pub mod placement;
mod ring;
pub mod session;
pub mod sites;
pub mod symbols;
pub mod trap_cost;

pub use capture::{
    monotonic_ns, preflight, AttachedLib, Capture, CaptureError, LaunchMode, SiteOptions,
    DEFAULT_RING_BYTES,
};
pub use discover::LibFile;
pub use session::{CaptureSession, Captured, LossStats, RecordCounts, SessionOptions};
