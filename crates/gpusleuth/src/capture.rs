//! The capture entry point, for `main.rs` (`gpusleuth trace`) and `demo`
//! alike: commands reach the capture through here, never through each other.
//! The run loop itself is in `cmd/trace.rs` until the capture session moves
//! into the library layer (see docs/architecture.md, "Capture session and
//! ledger").

#[cfg(feature = "sim")]
pub use crate::cmd::trace::OnDuration;
pub use crate::cmd::trace::{run, Args};
