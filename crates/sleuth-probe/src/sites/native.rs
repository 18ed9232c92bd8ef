//! Native frames: return addresses → function and library, from the
//! process's memory map and each file's ELF symbols (`.symtab` and
//! `.dynsym`), demangled. Files are mapped once and cached.
//!
//! Two halves: [`ProcessMaps`] places an address in its file and must run
//! while the traced process is alive (on the draining thread); [`SymbolFiles`]
//! names it from the file alone, later and on a thread of its own (the trace
//! command's `gpusleuth-sym`). A file's first use stays cheap all the same:
//! its symbol tables are read through a small buffer (`crate::elf_symbols`:
//! a 1.5 GiB libtorch_cuda costs the tracer no file pages), only the function
//! symbols' addresses are indexed, and a name is read and demangled when a
//! frame needs it. Eagerly demangling every symbol of PyTorch's libraries on
//! the draining thread took seconds on the H200, long enough for a short
//! program to exit before its later stacks were resolved (docs/gpu-runs.md).

use super::python::{read_maps, MapEntry};
use crate::elf_symbols::{name_in, ElfSymbols, FileIdentity, Segment, Table};
use sleuth_core::sites::{Frame, FrameKind};
use std::collections::HashMap;

/// One function symbol in 12 bytes (PyTorch's libraries hold millions of
/// them, all indexed while the tracer runs): its start and size as virtual
/// addresses, and where its name starts in the file (read up to its NUL when
/// a frame asks). 32-bit fields cover any library under 4 GiB; a symbol
/// beyond is left out (its frames show the library without a function name).
#[derive(Clone, Copy)]
struct Func {
    start: u32,
    size: u32,
    name_off: u32,
}

/// Function symbols of one file, by virtual address; names stay in the
/// file until a frame asks for one (read from the same file, by path and
/// identity: the file is not held open).
#[derive(Default)]
struct FileSymbols {
    path: String,
    identity: Option<FileIdentity>,
    /// Function symbols, sorted by start.
    funcs: Vec<Func>,
    /// Loadable segments: (file offset, vaddr, file size).
    segments: Vec<Segment>,
    /// Names already demangled, by symbol start.
    names: HashMap<u64, String>,
}

impl FileSymbols {
    fn load(path: &str) -> FileSymbols {
        let Ok(elf) = ElfSymbols::open(std::path::Path::new(path)) else {
            return FileSymbols::default();
        };
        let Some(funcs) = Self::index(&elf) else {
            return FileSymbols::default();
        };
        FileSymbols {
            path: path.to_string(),
            identity: elf.identity(),
            segments: elf.segments().to_vec(),
            funcs,
            names: HashMap::new(),
        }
    }

    /// The function symbols, sorted by start; of two at one address the
    /// larger, then the one of `.symtab` (read first).
    fn index(elf: &ElfSymbols) -> Option<Vec<Func>> {
        let mut funcs: Vec<Func> = Vec::new();
        elf.visit(&[Table::Full, Table::Dynamic], |s, _| {
            if !(s.is_function() && s.is_defined() && s.value != 0) {
                return;
            }
            let (Ok(start), Ok(name_off)) = (u32::try_from(s.value), u32::try_from(s.name_off))
            else {
                return;
            };
            funcs.push(Func {
                start,
                size: u32::try_from(s.size).unwrap_or(u32::MAX),
                name_off,
            });
        })
        .ok()?;
        funcs.sort_by(|a, b| a.start.cmp(&b.start).then(b.size.cmp(&a.size)));
        funcs.dedup_by_key(|f| f.start);
        funcs.shrink_to_fit();
        Some(funcs)
    }

    fn vaddr_of(&self, file_off: u64) -> Option<u64> {
        // Crafted segments (a library is untrusted input) must not wrap around.
        self.segments
            .iter()
            .find(|&&(off, _, size)| file_off >= off && file_off - off < size)
            .and_then(|&(off, vaddr, _)| vaddr.checked_add(file_off - off))
    }

    fn function_at(&mut self, vaddr: u64) -> Option<String> {
        let i = self.funcs.partition_point(|f| u64::from(f.start) <= vaddr);
        let f = *self.funcs.get(i.checked_sub(1)?)?;
        let (start, size) = (u64::from(f.start), u64::from(f.size));
        // Sized symbols must contain the address; unsized ones (assembly)
        // are taken only close by.
        let limit = if size > 0 { size } else { 4096 };
        if vaddr - start >= limit {
            return None;
        }
        if let Some(n) = self.names.get(&start) {
            return Some(n.clone());
        }
        let raw = name_in(
            std::path::Path::new(&self.path),
            self.identity?,
            u64::from(f.name_off),
        )?;
        let name = String::from_utf8_lossy(&raw);
        let name = name.split('@').next().unwrap_or(&name);
        let name = demangle(name);
        self.names.insert(start, name.clone());
        Some(name)
    }
}

fn demangle(name: &str) -> String {
    if name.starts_with("_Z") {
        if let Some(s) = cpp_demangle::Symbol::new(name)
            .ok()
            .and_then(|sym| sym.demangle().ok())
        {
            return without_params(&s).to_string();
        }
    }
    name.to_string()
}

/// `ns::f<int>(long, char*)` → `ns::f<int>`: the parameter list adds
/// length, not information, to a frame's name.
fn without_params(s: &str) -> &str {
    let mut depth = 0i32;
    for (i, c) in s.char_indices() {
        match c {
            '<' => depth += 1,
            '>' => depth -= 1,
            '(' if depth == 0 && i > 0 => return &s[..i],
            _ => {}
        }
    }
    s
}

/// Where a native address lies in its process: read from the live
/// process's memory map, so it is done while the process runs.
#[derive(Debug, Clone, PartialEq)]
pub enum Located {
    /// In no executable mapping: not a return address (the frame-pointer
    /// chain went astray).
    Unmapped,
    /// A mapping without a file: `[vdso]`, `[anon]`, ...
    Special(String),
    /// In a mapped file, at this offset of the file.
    File { path: String, file_off: u64 },
}

/// The memory maps of traced processes (the live half of symbolization).
#[derive(Default)]
pub struct ProcessMaps {
    maps: HashMap<u32, Vec<MapEntry>>,
}

impl ProcessMaps {
    /// Forgets a process's memory map (after exec or exit).
    pub fn forget(&mut self, pid: u32) {
        self.maps.remove(&pid);
    }

    fn mapping(&mut self, pid: u32, addr: u64) -> Option<MapEntry> {
        let find = |maps: &[MapEntry]| {
            maps.iter()
                .find(|m| addr >= m.start && addr < m.end)
                .cloned()
        };
        if let Some(m) = self.maps.get(&pid).and_then(|m| find(m)) {
            return Some(m);
        }
        // Not in the cached map: a library loaded since; read it again.
        let fresh = read_maps(pid);
        let found = find(&fresh);
        self.maps.insert(pid, fresh);
        found
    }

    /// Whether any of the process's memory map is known (read while it
    /// lived): none once it exited before its first stack was resolved.
    pub fn known(&self, pid: u32) -> bool {
        self.maps.get(&pid).is_some_and(|m| !m.is_empty())
    }

    /// Where a return address lies (looked up at `addr - 1`, inside the call).
    pub fn locate(&mut self, pid: u32, addr: u64) -> Located {
        let Some(m) = self.mapping(pid, addr).filter(|m| m.exec) else {
            return Located::Unmapped;
        };
        if !m.path.starts_with('/') {
            return Located::Special(m.path);
        }
        let file_off = addr.saturating_sub(1).saturating_sub(m.start) + m.offset;
        Located::File {
            path: m.path,
            file_off,
        }
    }
}

/// Function names from library files (the half that needs only the files,
/// not the process: it may run later and on another thread).
#[derive(Default)]
pub struct SymbolFiles {
    files: HashMap<String, FileSymbols>,
}

impl SymbolFiles {
    /// The function containing `file_off` of the file at `path`.
    pub fn function(&mut self, path: &str, file_off: u64) -> Option<String> {
        let syms = self
            .files
            .entry(path.to_string())
            .or_insert_with(|| FileSymbols::load(path));
        syms.vaddr_of(file_off).and_then(|v| syms.function_at(v))
    }
}

/// A native frame as known from the live process; `function` is filled by
/// [`SymbolFiles`] from the file offset.
pub fn frame_of(located: &Located, addr: u64) -> Frame {
    Frame {
        kind: Some(FrameKind::Native),
        addr: Some(addr),
        module: match located {
            Located::Unmapped => None,
            Located::Special(m) | Located::File { path: m, .. } => Some(m.clone()),
        },
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn demangled_names_drop_parameters() {
        assert_eq!(
            demangle("_ZN3c104cuda20CUDACachingAllocator6Native22DeviceCachingAllocator6mallocEmP11CUstream_st"),
            "c10::cuda::CUDACachingAllocator::Native::DeviceCachingAllocator::malloc"
        );
        assert_eq!(demangle("cudaMalloc"), "cudaMalloc");
        assert_eq!(without_params("f<g(int)>(long)"), "f<g(int)>");
    }

    #[test]
    fn a_function_symbol_takes_12_bytes() {
        assert_eq!(std::mem::size_of::<Func>(), 12);
    }

    #[test]
    fn symbolizes_this_test_binary() {
        // A function of this very process, by its own address.
        let addr = symbolizes_this_test_binary as *const () as u64;
        let mut maps = ProcessMaps::default();
        let located = maps.locate(std::process::id(), addr + 1);
        let Located::File { path, file_off } = &located else {
            panic!("not in a file: {located:?}");
        };
        assert!(frame_of(&located, addr + 1).module.is_some());
        let name = SymbolFiles::default().function(path, *file_off);
        assert!(
            name.as_deref()
                .is_some_and(|n| n.contains("symbolizes_this_test_binary")),
            "{name:?}"
        );
        assert_eq!(maps.locate(std::process::id(), 8), Located::Unmapped);
    }
}
