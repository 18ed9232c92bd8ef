//! The CUDA-level segments of one process over time: the address ranges the
//! caching allocator carves blocks out of. A segment is either one live
//! `cudaMalloc`-style allocation (runtime or direct driver call, counted the
//! way the ledger counts it: nested driver twins skipped) or, with
//! `expandable_segments:True`, one `cuMemMap`ped range (torch maps one
//! physical handle per call, so a mapped range is the unit `empty_cache()`
//! can unmap).
//!
//! This tracks address ranges, not byte totals: reserved bytes come from the
//! ledger, and the two are cross-checked by the caller.

use crate::event::CallEvent;
use crate::ops::OpClass;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// How a segment came to exist.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SegmentKind {
    /// A live device allocation (`cudaMalloc`, `cuMemAlloc_v2`, ...).
    Malloc,
    /// A mapped range of a reserved virtual address range (`cuMemMap`).
    Mapped,
}

#[derive(Debug, Clone, Copy)]
pub(super) struct Seg {
    pub size: u64,
    pub kind: SegmentKind,
    pub since_ns: u64,
    /// Some allocator block has overlapped it: it is the caching allocator's.
    pub owned: bool,
}

impl Seg {
    pub fn end(&self, base: u64) -> u64 {
        base.saturating_add(self.size)
    }
}

#[derive(Default, Clone)]
pub(super) struct SegmentMap {
    by_base: BTreeMap<u64, Seg>,
    /// Σ size of the segments an allocator block has used.
    owned_total: u64,
}

impl SegmentMap {
    /// Segments held.
    pub fn len(&self) -> usize {
        self.by_base.len()
    }

    /// Applies one CUDA call (effect at its return, like the ledger).
    pub fn apply(&mut self, c: &CallEvent) {
        let Some(info) = c.info() else { return };
        if c.nested || c.failed() {
            return;
        }
        match info.class {
            OpClass::DeviceAlloc => {
                if let (Some(ptr), Some(size)) = (c.ptr, c.size) {
                    if ptr != 0 && size > 0 {
                        self.remove_base(ptr);
                        self.insert(ptr, size, SegmentKind::Malloc, c.end_ns());
                    }
                }
            }
            // The ledger frees by pointer whatever the free op's class.
            OpClass::DeviceFree | OpClass::HostFree => {
                if let Some(ptr) = c.ptr.filter(|&p| p != 0) {
                    if self
                        .by_base
                        .get(&ptr)
                        .is_some_and(|s| s.kind == SegmentKind::Malloc)
                    {
                        self.remove_base(ptr);
                    }
                }
            }
            OpClass::VirtualMap => match (info.name, c.ptr, c.size) {
                ("cuMemMap", Some(ptr), Some(size)) if size > 0 => {
                    self.unmap(ptr, size);
                    self.insert(ptr, size, SegmentKind::Mapped, c.end_ns());
                }
                ("cuMemUnmap", Some(ptr), Some(size)) if size > 0 => self.unmap(ptr, size),
                _ => {}
            },
            _ => {}
        }
    }

    fn insert(&mut self, base: u64, size: u64, kind: SegmentKind, since_ns: u64) {
        self.by_base.insert(
            base,
            Seg {
                size,
                kind,
                since_ns,
                owned: false,
            },
        );
    }

    fn remove_base(&mut self, base: u64) -> Option<Seg> {
        let s = self.by_base.remove(&base)?;
        if s.owned {
            self.owned_total = self.owned_total.saturating_sub(s.size);
        }
        Some(s)
    }

    /// Removes `[lo, lo+len)` from mapped segments, keeping what lies outside.
    fn unmap(&mut self, lo: u64, len: u64) {
        let hi = lo.saturating_add(len);
        let hit: Vec<u64> = self
            .overlapping(lo, hi)
            .filter(|(_, s)| s.kind == SegmentKind::Mapped)
            .map(|(b, _)| b)
            .collect();
        for base in hit {
            let Some(s) = self.remove_base(base) else {
                continue;
            };
            let end = s.end(base);
            if base < lo {
                self.insert(base, lo - base, s.kind, s.since_ns);
            }
            if end > hi {
                self.insert(hi, end - hi, s.kind, s.since_ns);
            }
        }
    }

    /// Segments overlapping `[lo, hi)`, highest base first.
    pub fn overlapping(&self, lo: u64, hi: u64) -> impl Iterator<Item = (u64, &Seg)> + '_ {
        self.by_base
            .range(..hi)
            .rev()
            .take_while(move |(b, s)| s.end(**b) > lo)
            .map(|(b, s)| (*b, s))
    }

    /// The segment holding `addr`.
    pub fn containing(&self, addr: u64) -> Option<(u64, &Seg)> {
        self.overlapping(addr, addr.saturating_add(1)).next()
    }

    /// Whether `[lo, lo+len)` lies inside live segments (several adjacent
    /// mapped ranges count as one run: an expandable segment's blocks may
    /// span pages).
    pub fn covers(&self, lo: u64, len: u64) -> bool {
        let hi = lo.saturating_add(len);
        let Some((base, seg)) = self.containing(lo) else {
            return false;
        };
        let mut end = seg.end(base);
        if end >= hi {
            return true;
        }
        for (b, s) in self.by_base.range(end..hi) {
            if *b != end {
                break;
            }
            end = s.end(*b);
        }
        end >= hi
    }

    /// Marks the segments under a block as the allocator's.
    pub fn mark_owned(&mut self, lo: u64, len: u64) {
        let hi = lo.saturating_add(len.max(1));
        let bases: Vec<u64> = self
            .overlapping(lo, hi)
            .filter(|(_, s)| !s.owned)
            .map(|(b, _)| b)
            .collect();
        for b in bases {
            if let Some(s) = self.by_base.get_mut(&b) {
                s.owned = true;
                self.owned_total = self.owned_total.saturating_add(s.size);
            }
        }
    }

    /// Bytes of the segments the allocator has used (its `memory_reserved()`).
    pub fn owned_total(&self) -> u64 {
        self.owned_total
    }

    pub fn iter(&self) -> impl Iterator<Item = (u64, &Seg)> + '_ {
        self.by_base.iter().map(|(b, s)| (*b, s))
    }

    /// A map holding `segments` (by base, each once) with `owned_total`
    /// as the replay that left them summed it: a stored state taken up
    /// again (`super::resume`).
    pub fn from_parts(
        segments: impl IntoIterator<Item = (u64, Seg)>,
        owned_total: u64,
    ) -> Result<SegmentMap, String> {
        let mut by_base = BTreeMap::new();
        for (base, seg) in segments {
            if by_base.insert(base, seg).is_some() {
                return Err(format!("segment {base:#x} listed twice"));
            }
        }
        Ok(SegmentMap {
            by_base,
            owned_total,
        })
    }
}
