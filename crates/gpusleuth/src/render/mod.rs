//! Human renderings shared by several commands (and the `trace` summary):
//! commands decide what to show, these modules decide how it reads.

pub mod explain;
pub mod gpu_context;
pub mod processes;
pub mod stats;
pub mod table;
