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

pub use native::SymbolFiles;
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
    /// (pid, code object) → what it says, or why it could not be read.
    code: HashMap<(u32, u64), Result<Arc<CodeInfo>, String>>,
    maps: native::ProcessMaps,
}

/// A stack resolved as far as the live process is needed: Python frames
/// read, native frames placed in their files. [`Unsymbolized::finish`] adds
/// the native function names from the files, at any later time.
#[derive(Debug)]
pub struct Unsymbolized {
    stack: Stack,
    /// (index in `stack.frames`, file, offset in the file).
    lookups: Vec<(usize, String, u64)>,
}

impl Unsymbolized {
    /// Fills the native function names.
    pub fn finish(mut self, files: &mut SymbolFiles) -> Stack {
        for (i, path, off) in self.lookups {
            if let Some(f) = self.stack.frames.get_mut(i) {
                f.function = files.function(&path, off);
            }
        }
        self.stack
    }

    /// Whether every name is already known (no file to read).
    pub fn is_complete(&self) -> bool {
        self.lookups.is_empty()
    }
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
        self.maps.forget(pid);
    }

    fn mem(&mut self, pid: u32) -> Option<Arc<ProcMem>> {
        if let Some(m) = self.mem.get(&pid) {
            return Some(m.clone());
        }
        let m = Arc::new(ProcMem::open(pid).ok()?);
        self.mem.insert(pid, m.clone());
        Some(m)
    }

    fn code_info(&mut self, pid: u32, code: u64) -> Result<Arc<CodeInfo>, String> {
        if let Some(c) = self.code.get(&(pid, code)) {
            return c.clone();
        }
        let layout = self
            .python
            .get(&pid)
            .ok_or("no CPython known in the process")?
            .layout
            .code;
        let mem = self
            .mem(pid)
            .ok_or_else(|| format!("cannot open the memory of process {pid}"))?;
        let info = python::read_code(&mem, &layout, code).map(Arc::new);
        self.code.insert((pid, code), info.clone());
        info
    }

    /// Resolves one raw stack into frames and plain-words notes, as far as
    /// that needs the live process (its code objects, its memory map):
    /// cheap, done as each stack arrives. Naming native frames from library
    /// files, which can take long the first time a large library is seen, is
    /// left to [`Unsymbolized::finish`].
    pub fn resolve_live(&mut self, raw: &RawStack) -> Unsymbolized {
        let pid = raw.pid;
        let mut frames = Vec::new();
        let mut notes = Vec::new();
        let mut unreadable = 0;
        // The first failure, said in the note: "process gone" and "not a
        // code object" call for different fixes.
        let mut first_error = None;
        for f in raw.py_frames().iter().filter(|f| f.code != 0) {
            let layout = self.python.get(&pid).map(|p| p.layout);
            let info = self.code_info(pid, f.code);
            match (layout, info) {
                (Some(layout), Ok(info)) => frames.push(Frame {
                    kind: Some(FrameKind::Python),
                    function: Some(info.name.clone()),
                    file: Some(info.filename.clone()),
                    line: python::frame_line(&layout, &info, f.code, f.instr),
                    ..Default::default()
                }),
                (_, info) => {
                    unreadable += 1;
                    if first_error.is_none() {
                        let why = info.err().unwrap_or_else(|| "no CPython layout".into());
                        first_error = Some(format!("code object {:#x}: {why}", f.code));
                    }
                }
            }
        }
        if unreadable > 0 {
            notes.push(format!(
                "{unreadable} Python frame(s) could not be read (the process exited or the code was freed before it was resolved; first: {})",
                first_error.unwrap_or_default()
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
        let mut lookups = Vec::new();
        for &addr in raw.native_frames() {
            let located = self.maps.locate(pid, addr);
            let frame = native::frame_of(&located, addr);
            if let native::Located::File { path, file_off } = located {
                lookups.push((frames.len(), path, file_off));
            }
            if frame.module.is_none() {
                notes.push(match self.maps.known(pid) {
                    // Not in any mapping: the frame-pointer chain ran through
                    // code built without frame pointers; the rest is noise.
                    true => format!(
                        "native stack unwound through {unwound} frame(s), the rest could not be unwound (code without frame pointers)"
                    ),
                    // No map to place any frame in: the stack was read after
                    // the process exited (the tracer fell behind).
                    false => format!(
                        "native frames not resolved: process {pid} exited before its stack was read (its memory map is gone)"
                    ),
                });
                break;
            }
            unwound += 1;
            frames.push(frame);
        }
        if raw.flags & stack_flag::NATIVE_FULL != 0 && unwound == NATIVE_DEPTH {
            notes.push(format!("native frames truncated at {NATIVE_DEPTH}"));
        }
        Unsymbolized {
            stack: Stack {
                id: raw.id,
                pid,
                frames,
                notes,
            },
            lookups,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[inline(never)]
    fn a_native_function() -> u64 {
        a_native_function as *const () as u64
    }

    /// The live half places native frames without reading any library's
    /// symbols (that is left to `finish`, off the draining thread); the
    /// finished stack names them, and a second resolution gives the same names.
    #[test]
    fn live_resolution_leaves_symbols_for_later() {
        let mut raw = RawStack {
            pid: std::process::id(),
            id: 7,
            n_native: 1,
            ..Default::default()
        };
        raw.native[0] = a_native_function() + 1;
        let mut r = SiteResolver::new();
        let u = r.resolve_live(&raw);
        assert!(!u.is_complete());
        assert_eq!(u.stack.frames.len(), 1);
        assert_eq!(u.stack.frames[0].function, None);
        assert!(u.stack.frames[0].module.is_some());
        let done = u.finish(&mut SymbolFiles::default());
        let name = done.frames[0].function.clone();
        assert!(
            name.as_deref()
                .is_some_and(|n| n.contains("a_native_function")),
            "{name:?}"
        );
        let again = r.resolve_live(&raw).finish(&mut SymbolFiles::default());
        assert_eq!(again.frames[0].function, name);
    }

    /// A Python frame whose code object cannot be read says why (the first
    /// error), so "process gone" and "not a code object" can be told apart.
    #[test]
    fn unreadable_python_frames_say_why() {
        let mut raw = RawStack {
            pid: std::process::id(),
            n_py: 1,
            ..Default::default()
        };
        raw.py[0].code = 0x10;
        let note = only_note(&raw);
        assert!(
            note.contains("1 Python frame(s) could not be read"),
            "{note}"
        );
        assert!(
            note.contains("code object 0x10: no CPython known"),
            "{note}"
        );
    }

    /// The one note of `raw` resolved by a fresh resolver, which places no
    /// frame of it.
    fn only_note(raw: &RawStack) -> String {
        let s = SiteResolver::new()
            .resolve_live(raw)
            .finish(&mut SymbolFiles::default());
        assert!(s.frames.is_empty(), "{:?}", s.frames);
        assert_eq!(s.notes.len(), 1, "{:?}", s.notes);
        s.notes[0].clone()
    }

    /// A native stack read after its process exited says so, not that the
    /// program lacks frame pointers; one of a live process whose chain runs
    /// out of the mappings says the latter.
    #[test]
    fn native_frames_of_an_exited_process_say_it_exited() {
        let mut child = std::process::Command::new("true")
            .spawn()
            .expect("spawn true");
        let gone = child.id();
        child.wait().expect("wait");
        let mut raw = RawStack {
            pid: gone,
            n_native: 1,
            ..Default::default()
        };
        raw.native[0] = 0x1000;
        let note = only_note(&raw);
        assert!(
            note.contains(&format!("process {gone} exited before its stack was read")),
            "{note}"
        );
        let mut alive = raw;
        alive.pid = std::process::id();
        let note = only_note(&alive);
        assert!(note.contains("code without frame pointers"), "{note}");
    }
}
