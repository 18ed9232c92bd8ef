//! Small shared helpers for human output. The byte and duration formatters
//! live in `sleuth_core::units` so findings, commands and the MCP server all
//! write the same quantity the same way.

pub use sleuth_core::units::{fmt_bytes, fmt_ns};
