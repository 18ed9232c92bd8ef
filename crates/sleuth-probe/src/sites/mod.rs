//! Call sites: finding CPython in traced processes (so the kernel can walk
//! their frames) and turning the kernel's raw stacks into file/function/line
//! and function/library frames.
//!
//! Resolution reads the live process (code objects, memory map), so it runs
//! as soon as a stack record arrives. Each distinct stack arrives once, and
//! code objects and symbol tables are cached, so the cost is per new site,
//! not per call.

pub mod btf;
pub mod linetable;
pub mod native;
pub mod procmem;
pub mod python;

use procmem::ProcMem;
use python::{CodeInfo, PyProcess};
use sleuth_core::record::{stack_flag, RawStack, NATIVE_DEPTH, PY_DEPTH};
use sleuth_core::sites::{Frame, FrameKind, Stack};
use std::collections::HashMap;
use std::sync::Arc;

/// Default threshold above which a call's site is captured even when it
/// neither allocates nor fails. A capture costs a few µs (the frame walks;
/// `gpusleuth bench` measures it), so at 1 ms it adds well under 1% to the
/// calls it is taken on.
pub const DEFAULT_SLOW_NS: u64 = 1_000_000;

/// Resolves raw stacks of traced processes.
#[derive(Default)]
pub struct SiteResolver {
    python: HashMap<u32, PyProcess>,
    mem: HashMap<u32, Arc<ProcMem>>,
    /// (pid, code object) → what it says; None when it could not be read.
    code: HashMap<(u32, u64), Option<Arc<CodeInfo>>>,
    native: native::NativeSymbolizer,
}

impl SiteResolver {
    pub fn new() -> SiteResolver {
        SiteResolver::default()
    }

    /// The CPython known for a process, if any.
    pub fn python(&self, pid: u32) -> Option<&PyProcess> {
        self.python.get(&pid)
    }

    /// Remembers a CPython found in a process.
    pub fn set_python(&mut self, p: PyProcess) {
        self.forget(p.pid);
        self.python.insert(p.pid, p);
    }

    /// Forgets what was read from a process (after exec or exit).
    pub fn forget(&mut self, pid: u32) {
        self.python.remove(&pid);
        self.mem.remove(&pid);
        self.code.retain(|(p, _), _| *p != pid);
        self.native.forget(pid);
    }

    fn mem(&mut self, pid: u32) -> Option<Arc<ProcMem>> {
        if let Some(m) = self.mem.get(&pid) {
            return Some(m.clone());
        }
        let m = Arc::new(ProcMem::open(pid).ok()?);
        self.mem.insert(pid, m.clone());
        Some(m)
    }

    fn code_info(&mut self, pid: u32, code: u64) -> Option<Arc<CodeInfo>> {
        if let Some(c) = self.code.get(&(pid, code)) {
            return c.clone();
        }
        let layout = self.python.get(&pid)?.layout.code;
        let mem = self.mem(pid)?;
        let info = python::read_code(&mem, &layout, code).ok().map(Arc::new);
        self.code.insert((pid, code), info.clone());
        info
    }

    /// Resolves one raw stack into frames and plain-words notes.
    pub fn resolve(&mut self, raw: &RawStack) -> Stack {
        let pid = raw.pid;
        let mut frames = Vec::new();
        let mut notes = Vec::new();
        let mut unreadable = 0;
        for f in raw.py_frames().iter().filter(|f| f.code != 0) {
            let layout = self.python.get(&pid).map(|p| p.layout);
            let info = self.code_info(pid, f.code);
            match (layout, info) {
                (Some(layout), Some(info)) => frames.push(Frame {
                    kind: Some(FrameKind::Python),
                    function: Some(info.name.clone()),
                    file: Some(info.filename.clone()),
                    line: python::frame_line(&layout, &info, f.code, f.instr),
                    ..Default::default()
                }),
                _ => unreadable += 1,
            }
        }
        if unreadable > 0 {
            notes.push(format!(
                "{unreadable} Python frame(s) could not be read (the process exited or the code was freed before it was resolved)"
            ));
        }
        if raw.flags & stack_flag::PY_TRUNC != 0 {
            notes.push(format!(
                "Python frames truncated at {PY_DEPTH} (outermost dropped)"
            ));
        }
        if raw.flags & stack_flag::PY_NO_THREAD != 0 {
            notes.push("this thread has no Python thread state (a native thread)".into());
        }
        if raw.flags & stack_flag::NATIVE_ERR != 0 {
            notes.push("the native stack could not be read".into());
        }
        let mut unwound = 0;
        for &addr in raw.native_frames() {
            let frame = self.native.frame(pid, addr);
            if frame.module.is_none() {
                // Not in any mapping: the frame-pointer chain ran through
                // code built without frame pointers; the rest is noise.
                notes.push(format!(
                    "native stack unwound through {unwound} frame(s), the rest could not be unwound (code without frame pointers)"
                ));
                break;
            }
            unwound += 1;
            frames.push(frame);
        }
        if raw.flags & stack_flag::NATIVE_FULL != 0 && unwound == NATIVE_DEPTH {
            notes.push(format!("native frames truncated at {NATIVE_DEPTH}"));
        }
        Stack {
            id: raw.id,
            pid,
            frames,
            notes,
        }
    }
}
