//! Call sites: the resolved stacks captured at allocations, frees, failed and
//! slow calls, which frame of each one is "the site" a user can act on, and
//! memory grouped by site.
//!
//! A stack lists Python frames (file, function, line) and native frames
//! (function, library), innermost first. The site is the innermost Python
//! frame in the user's own code (not the standard library or an installed
//! package), else the innermost Python frame, else the innermost native frame
//! outside the CUDA and PyTorch libraries, else the innermost native frame.

use crate::data::TraceData;
use crate::event::CallEvent;
use crate::ledger::{live_by_stack, LiveByStack, ProcessLedger};
use crate::ops::OpClass;
use serde::Serialize;
use std::collections::BTreeMap;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum FrameKind {
    Python,
    Native,
}

impl FrameKind {
    pub fn as_str(self) -> &'static str {
        match self {
            FrameKind::Python => "python",
            FrameKind::Native => "native",
        }
    }
    pub fn parse(s: &str) -> Option<FrameKind> {
        match s {
            "python" => Some(FrameKind::Python),
            "native" => Some(FrameKind::Native),
            _ => None,
        }
    }
}

/// One resolved frame.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Frame {
    pub kind: Option<FrameKind>,
    /// Python: the code object's qualified name; native: the symbol
    /// (demangled), or `None` when the address is in no known symbol.
    pub function: Option<String>,
    /// Python: `co_filename`; native: source file when known.
    pub file: Option<String>,
    pub line: Option<u32>,
    /// Native: the mapped file the address belongs to.
    pub module: Option<String>,
    /// Native: the return address.
    pub addr: Option<u64>,
}

impl Frame {
    pub fn is_python(&self) -> bool {
        self.kind == Some(FrameKind::Python)
    }

    /// `file:line function` for Python, `function (module)` for native.
    pub fn label(&self) -> String {
        match self.kind {
            Some(FrameKind::Python) => format!(
                "{}:{} {}",
                self.file.as_deref().unwrap_or("?"),
                self.line
                    .map(|l| l.to_string())
                    .unwrap_or_else(|| "?".into()),
                self.function.as_deref().unwrap_or("?")
            ),
            _ => {
                let module = self
                    .module
                    .as_deref()
                    .map(|m| m.rsplit('/').next().unwrap_or(m))
                    .unwrap_or("?");
                match (&self.function, &self.file, self.line) {
                    (Some(f), Some(file), Some(line)) => format!("{file}:{line} {f} ({module})"),
                    (Some(f), _, _) => format!("{f} ({module})"),
                    (None, _, _) => format!("{:#x} ({module})", self.addr.unwrap_or(0)),
                }
            }
        }
    }
}

/// A resolved stack.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Stack {
    pub id: u64,
    pub pid: u32,
    /// Python frames first (innermost first), then native frames (innermost first).
    pub frames: Vec<Frame>,
    /// What limits this stack, in words ("python frames truncated at 32", ...);
    /// empty when complete.
    pub notes: Vec<String>,
}

/// Paths that belong to the interpreter or installed packages, not to the
/// program being debugged.
fn is_library_path(file: &str) -> bool {
    file.contains("/site-packages/")
        || file.contains("/dist-packages/")
        || file.starts_with('<')
        || file.contains("/lib/python3")
        || file.contains("/lib64/python3")
}

/// Native modules whose frames are never the site (the CUDA libraries and
/// PyTorch itself: the site is whoever called them).
fn is_cuda_or_torch_module(module: &str) -> bool {
    let base = module.rsplit('/').next().unwrap_or(module);
    [
        "libcudart",
        "libcuda.",
        "libc10",
        "libtorch",
        "libcublas",
        "libffi",
        "_ctypes",
    ]
    .iter()
    .any(|p| base.starts_with(p) || base.contains(p))
}

impl Stack {
    /// The frame a user can act on (see the module doc), if any.
    pub fn site(&self) -> Option<&Frame> {
        let py = || self.frames.iter().filter(|f| f.is_python());
        let native = || self.frames.iter().filter(|f| !f.is_python());
        py().find(|f| f.file.as_deref().is_some_and(|p| !is_library_path(p)))
            .or_else(|| py().next())
            .or_else(|| {
                native().find(|f| {
                    f.function.is_some()
                        && f.module
                            .as_deref()
                            .is_some_and(|m| !is_cuda_or_torch_module(m))
                })
            })
            .or_else(|| native().next())
    }

    /// The site as one line, or why there is none.
    pub fn site_label(&self) -> String {
        match self.site() {
            Some(f) => f.label(),
            None if !self.notes.is_empty() => format!("unknown ({})", self.notes.join("; ")),
            None => "unknown (empty stack)".into(),
        }
    }
}

/// Label of a call's site, from its stack id: "not captured" when the call
/// has none, "stack lost" when the id names no stored stack.
pub fn label_of(data: &TraceData, stack_id: Option<u64>) -> String {
    match stack_id {
        None => NOT_CAPTURED.into(),
        Some(id) => data
            .stacks
            .get(&id)
            .map(Stack::site_label)
            .unwrap_or_else(|| LOST.into()),
    }
}

/// Site label of an allocation whose stack was not captured.
pub const NOT_CAPTURED: &str = "(site not captured)";
/// Site label of a stack id whose stack is in none of the files read:
/// dropped with a full ring buffer, or stored only in a file of a run that
/// `--keep` deleted (a live block's stack in the carried allocator views;
/// the tracer copies into each file the stacks its carried ledger names,
/// not those of the views: round 53's tester).
pub const LOST: &str =
    "(stack lost: dropped, see stats.drop_ring_full_stack, or in a file --keep deleted)";

/// Device memory grouped by call site (one process or all).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct SiteMemory {
    /// `file:line function`, `function (module)` or why it is unknown.
    pub site: String,
    /// One stack of this site (for its full frames).
    pub example_stack: Option<u64>,
    pub allocs: u64,
    pub alloc_bytes: u64,
    /// Still live at the end of the trace (or at exit).
    pub unfreed: u64,
    pub unfreed_bytes: u64,
    /// Live at the moment of the process's peak.
    pub at_peak_bytes: u64,
    pub failed: u64,
    pub failed_bytes: u64,
}

/// What the by-site table and the flame graph count of device allocations
/// (`cudaMalloc`-like and `cuMemCreate`, nested calls left out): `count`
/// allocations of `bytes` in all, failed or not, made at `stack_id`. One
/// call is a tally of one; a streamed reader adds them up per stack.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AllocTally {
    pub stack_id: Option<u64>,
    pub failed: bool,
    pub count: u64,
    pub bytes: u64,
}

impl AllocTally {
    /// The tally of one call; None for a call that is no device allocation.
    pub fn of(c: &CallEvent) -> Option<AllocTally> {
        let info = c.info()?;
        let device_alloc = matches!(info.class, OpClass::DeviceAlloc | OpClass::PhysCreate);
        (device_alloc && !c.nested).then(|| AllocTally {
            stack_id: c.stack_id,
            failed: c.failed(),
            count: 1,
            bytes: c.size.unwrap_or(0),
        })
    }
}

/// Device allocations by site: allocated, unfreed at the end and live at
/// each process's peak (summed over processes), failures. Sorted by unfreed
/// bytes, then bytes at the peak, then allocated bytes, largest first.
pub fn memory_by_site(data: &TraceData, ledgers: &[ProcessLedger]) -> Vec<SiteMemory> {
    let at_peak: BTreeMap<u32, LiveByStack> = ledgers
        .iter()
        .filter_map(|l| {
            let at = crate::ledger::ledger(data, Some(l.peak_ts_ns?));
            let p = at.into_iter().find(|p| p.pid == l.pid)?;
            Some((l.pid, live_by_stack(&p)))
        })
        .collect();
    memory_by_site_of(
        data,
        data.calls.iter().filter_map(AllocTally::of),
        ledgers,
        &at_peak,
    )
}

/// [`memory_by_site`] from the allocations' tallies (in call order: the
/// first stack of a site is its example), the ledgers at the end and what
/// each process had live per site at its own peak (`at_peak`, by pid:
/// `LedgerBuilder::finish_with_peak_sites`, or `live_by_stack` of its
/// ledger then). `data` gives the stacks only; its calls are not read.
pub fn memory_by_site_of(
    data: &TraceData,
    allocs: impl IntoIterator<Item = AllocTally>,
    ledgers: &[ProcessLedger],
    at_peak: &BTreeMap<u32, LiveByStack>,
) -> Vec<SiteMemory> {
    let mut rows: BTreeMap<String, SiteMemory> = BTreeMap::new();
    fn row<'a>(
        rows: &'a mut BTreeMap<String, SiteMemory>,
        data: &TraceData,
        stack: Option<u64>,
    ) -> &'a mut SiteMemory {
        let label = label_of(data, stack);
        let r = rows.entry(label.clone()).or_insert_with(|| SiteMemory {
            site: label,
            ..Default::default()
        });
        if r.example_stack.is_none() {
            r.example_stack = stack.filter(|id| data.stacks.contains_key(id));
        }
        r
    }
    for a in allocs {
        let r = row(&mut rows, data, a.stack_id);
        if a.failed {
            r.failed += a.count;
            r.failed_bytes += a.bytes;
        } else {
            r.allocs += a.count;
            r.alloc_bytes += a.bytes;
        }
    }
    for l in ledgers {
        for u in &l.unfreed {
            let r = row(&mut rows, data, u.stack_id);
            r.unfreed += 1;
            r.unfreed_bytes += u.bytes;
        }
        if l.peak_ts_ns.is_some() {
            for (&stack, &bytes) in at_peak.get(&l.pid).into_iter().flatten() {
                let r = row(&mut rows, data, stack);
                r.at_peak_bytes = r.at_peak_bytes.wrapping_add(bytes);
            }
        }
    }
    let mut out: Vec<SiteMemory> = rows.into_values().collect();
    out.sort_by(|a, b| {
        (b.unfreed_bytes, b.at_peak_bytes, b.alloc_bytes)
            .cmp(&(a.unfreed_bytes, a.at_peak_bytes, a.alloc_bytes))
            .then_with(|| a.site.cmp(&b.site))
    });
    out
}

/// One node of a flame graph of allocated device bytes: a frame, the bytes
/// allocated below it, its callees (largest first).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct FlameNode {
    pub name: String,
    pub bytes: u64,
    pub children: Vec<FlameNode>,
}

impl FlameNode {
    fn add(&mut self, path: &[String], bytes: u64) {
        self.bytes += bytes;
        let Some((first, rest)) = path.split_first() else {
            return;
        };
        let i = match self.children.iter().position(|c| &c.name == first) {
            Some(i) => i,
            None => {
                self.children.push(FlameNode {
                    name: first.clone(),
                    ..Default::default()
                });
                self.children.len() - 1
            }
        };
        self.children[i].add(rest, bytes);
    }

    fn sort(&mut self) {
        self.children
            .sort_by(|a, b| b.bytes.cmp(&a.bytes).then_with(|| a.name.cmp(&b.name)));
        self.children.iter_mut().for_each(FlameNode::sort);
    }
}

/// Successful device allocations' bytes by call path, outermost frame
/// first (the root is "all"): Python frames when the stack has any (the
/// user's code), else its native frames; one "(site not captured)" or
/// "(stack lost …)" child for allocations without a stored stack.
pub fn allocated_by_path(data: &TraceData) -> FlameNode {
    allocated_by_path_of(data, data.calls.iter().filter_map(AllocTally::of))
}

/// [`allocated_by_path`] from the allocations' tallies (failed ones are
/// left out); `data` gives the stacks only.
pub fn allocated_by_path_of(
    data: &TraceData,
    allocs: impl IntoIterator<Item = AllocTally>,
) -> FlameNode {
    let mut root = FlameNode {
        name: "all".into(),
        ..Default::default()
    };
    for a in allocs.into_iter().filter(|a| !a.failed) {
        let stack = a.stack_id.and_then(|id| data.stacks.get(&id));
        let path: Vec<String> = match stack {
            Some(st) => {
                let python = st.frames.iter().any(Frame::is_python);
                st.frames
                    .iter()
                    .filter(|f| f.is_python() == python)
                    .rev()
                    .map(Frame::label)
                    .collect()
            }
            None => vec![label_of(data, a.stack_id)],
        };
        root.add(&path, a.bytes);
    }
    root.sort();
    root
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::CallEvent;
    use crate::ops::op_by_name;
    // The frames the other crates' tests build too.
    use crate::testing::py_frame as py;

    fn native(func: &str, module: &str) -> Frame {
        Frame {
            kind: Some(FrameKind::Native),
            function: Some(func.into()),
            module: Some(module.into()),
            addr: Some(0x1000),
            ..Default::default()
        }
    }

    #[test]
    fn site_is_the_innermost_user_frame() {
        let s = Stack {
            id: 1,
            frames: vec![
                py(
                    "/venv/lib/python3.12/site-packages/torch/nn/modules/linear.py",
                    125,
                    "Linear.forward",
                ),
                py("/home/me/train.py", 42, "Model.forward"),
                py("/home/me/train.py", 90, "main"),
                native("cudaMalloc", "/usr/lib/libcudart.so.13"),
            ],
            ..Default::default()
        };
        assert_eq!(s.site_label(), "/home/me/train.py:42 Model.forward");
        let c = Stack {
            id: 2,
            frames: vec![
                native("cudaMalloc", "/x/libcudart.so.13"),
                native("alloc_weights", "/x/workload"),
                native("main", "/x/workload"),
            ],
            ..Default::default()
        };
        assert_eq!(c.site_label(), "alloc_weights (workload)");
        let empty = Stack {
            id: 3,
            notes: vec!["native stack could not be read".into()],
            ..Default::default()
        };
        assert!(empty.site_label().starts_with("unknown (native stack"));
    }

    fn alloc(ts: u64, size: u64, ptr: u64, stack: u64) -> CallEvent {
        CallEvent {
            ts_ns: ts,
            dur_ns: 1,
            pid: 1,
            tid: 1,
            op: op_by_name("cudaMalloc").unwrap().id,
            size: Some(size),
            ptr: Some(ptr),
            stack_id: Some(stack),
            ..Default::default()
        }
    }

    fn free(ts: u64, ptr: u64) -> CallEvent {
        CallEvent {
            ts_ns: ts,
            dur_ns: 1,
            pid: 1,
            tid: 1,
            op: op_by_name("cudaFree").unwrap().id,
            ptr: Some(ptr),
            stack_id: Some(9),
            ..Default::default()
        }
    }

    #[test]
    fn memory_by_site_puts_the_leak_first() {
        let mut data = TraceData::default();
        for (id, line) in [(1u64, 10u32), (2, 20)] {
            data.stacks.insert(
                id,
                Stack {
                    id,
                    pid: 1,
                    frames: vec![py("/w/leak.py", line, "f")],
                    notes: vec![],
                },
            );
        }
        // Line 10: 3 x 100 bytes, freed. Line 20: 2 x 50 bytes, never freed.
        let mut t = 0;
        for i in 0..3 {
            t += 10;
            data.calls.push(alloc(t, 100, 0x1000 + i, 1));
        }
        for i in 0..2 {
            t += 10;
            data.calls.push(alloc(t, 50, 0x2000 + i, 2));
        }
        for i in 0..3 {
            t += 10;
            data.calls.push(free(t, 0x1000 + i));
        }
        // A failed allocation without a captured stack.
        t += 10;
        let mut failed = alloc(t, 1 << 40, 0, 0);
        failed.ret = 2;
        failed.ptr = None;
        failed.stack_id = None;
        data.calls.push(failed);
        let ledgers = crate::ledger::ledger(&data, None);
        let rows = memory_by_site(&data, &ledgers);
        assert_eq!(rows[0].site, "/w/leak.py:20 f");
        assert_eq!((rows[0].unfreed, rows[0].unfreed_bytes), (2, 100));
        assert_eq!(rows[0].at_peak_bytes, 100);
        let l10 = rows.iter().find(|r| r.site == "/w/leak.py:10 f").unwrap();
        assert_eq!(
            (l10.allocs, l10.alloc_bytes, l10.unfreed_bytes),
            (3, 300, 0)
        );
        assert_eq!(l10.at_peak_bytes, 300, "peak is after all five allocations");
        let none = rows.iter().find(|r| r.site == NOT_CAPTURED).unwrap();
        assert_eq!((none.failed, none.failed_bytes), (1, 1 << 40));
    }

    #[test]
    fn allocated_bytes_form_a_tree_of_call_paths() {
        let alloc = op_by_name("cudaMalloc").unwrap().id;
        let call = |size: u64, stack_id: Option<u64>| CallEvent {
            op: alloc,
            size: Some(size),
            stack_id,
            ..Default::default()
        };
        let mut data = TraceData {
            calls: vec![call(100, Some(1)), call(50, Some(2)), call(7, None)],
            ..Default::default()
        };
        let stack = |id: u64, inner: Frame| Stack {
            id,
            pid: 1,
            frames: vec![inner, py("/t.py", 9, "main")],
            notes: vec![],
        };
        data.stacks.insert(1, stack(1, py("/t.py", 3, "leak")));
        data.stacks.insert(2, stack(2, py("/t.py", 5, "weights")));
        let root = allocated_by_path(&data);
        assert_eq!(root.bytes, 157);
        let main = &root.children[0];
        assert_eq!((main.name.as_str(), main.bytes), ("/t.py:9 main", 150));
        let names: Vec<(&str, u64)> = main
            .children
            .iter()
            .map(|c| (c.name.as_str(), c.bytes))
            .collect();
        assert_eq!(names, [("/t.py:3 leak", 100), ("/t.py:5 weights", 50)]);
        assert_eq!(root.children[1].name, NOT_CAPTURED);
    }
}
