//! Native frames: return addresses → function and library, from the
//! process's memory map and each file's ELF symbols (`.symtab` and
//! `.dynsym`), demangled. Files are read once and cached.

use super::python::{read_maps, MapEntry};
use sleuth_core::sites::{Frame, FrameKind};
use std::collections::HashMap;
use std::sync::Arc;

/// Files larger than this are not read for symbols (a 1 GiB libtorch_cuda
/// would cost its size in memory); their frames keep the library name.
const MAX_SYMBOL_FILE: u64 = 512 << 20;

/// Function symbols of one file, by virtual address.
#[derive(Default)]
struct FileSymbols {
    /// (start, size, name), sorted by start.
    funcs: Vec<(u64, u64, String)>,
    /// Loadable segments: (file offset, vaddr, file size).
    segments: Vec<(u64, u64, u64)>,
}

impl FileSymbols {
    fn load(path: &str) -> FileSymbols {
        use object::{Object, ObjectSegment, ObjectSymbol, SymbolKind};
        let too_big = std::fs::metadata(path)
            .map(|m| m.len() > MAX_SYMBOL_FILE)
            .unwrap_or(true);
        if too_big {
            return FileSymbols::default();
        }
        let Ok(data) = std::fs::read(path) else {
            return FileSymbols::default();
        };
        let Ok(file) = object::File::parse(&*data) else {
            return FileSymbols::default();
        };
        let mut funcs: Vec<(u64, u64, String)> = file
            .symbols()
            .chain(file.dynamic_symbols())
            .filter(|s| s.kind() == SymbolKind::Text && s.address() != 0 && s.is_definition())
            .filter_map(|s| {
                let name = s.name().ok()?;
                let name = name.split('@').next().unwrap_or(name);
                Some((s.address(), s.size(), demangle(name)))
            })
            .collect();
        funcs.sort_by(|a, b| a.0.cmp(&b.0).then(b.1.cmp(&a.1)));
        funcs.dedup_by_key(|f| f.0);
        let segments = file
            .segments()
            .map(|s| (s.file_range().0, s.address(), s.file_range().1))
            .collect();
        FileSymbols { funcs, segments }
    }

    fn vaddr_of(&self, file_off: u64) -> Option<u64> {
        self.segments
            .iter()
            .find(|&&(off, _, size)| file_off >= off && file_off < off + size)
            .map(|&(off, vaddr, _)| vaddr + (file_off - off))
    }

    fn function_at(&self, vaddr: u64) -> Option<&str> {
        let i = self.funcs.partition_point(|f| f.0 <= vaddr);
        let (start, size, name) = self.funcs.get(i.checked_sub(1)?)?;
        // Sized symbols must contain the address; unsized ones (assembly)
        // are taken only close by.
        let limit = if *size > 0 { *size } else { 4096 };
        (vaddr - start < limit).then_some(name.as_str())
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

/// Symbolizes native addresses of traced processes.
#[derive(Default)]
pub struct NativeSymbolizer {
    maps: HashMap<u32, Vec<MapEntry>>,
    files: HashMap<String, Arc<FileSymbols>>,
}

impl NativeSymbolizer {
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

    /// One frame for a return address (looked up at `addr - 1`, inside the call).
    /// `module` stays None when the address is in no executable mapping:
    /// not a return address (the frame-pointer chain went astray).
    pub fn frame(&mut self, pid: u32, addr: u64) -> Frame {
        let mut f = Frame {
            kind: Some(FrameKind::Native),
            addr: Some(addr),
            ..Default::default()
        };
        let Some(m) = self.mapping(pid, addr).filter(|m| m.exec) else {
            return f;
        };
        if !m.path.starts_with('/') {
            f.module = Some(m.path.clone()); // [vdso], [anon], ...
            return f;
        }
        let syms = self
            .files
            .entry(m.path.clone())
            .or_insert_with(|| Arc::new(FileSymbols::load(&m.path)))
            .clone();
        let file_off = addr.saturating_sub(1).saturating_sub(m.start) + m.offset;
        f.function = syms
            .vaddr_of(file_off)
            .and_then(|v| syms.function_at(v))
            .map(str::to_string);
        f.module = Some(m.path);
        f
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
    fn symbolizes_this_test_binary() {
        // A function of this very process, by its own address.
        let addr = symbolizes_this_test_binary as *const () as u64;
        let mut s = NativeSymbolizer::default();
        let f = s.frame(std::process::id(), addr + 1);
        assert!(f.module.is_some(), "{f:?}");
        assert!(
            f.function
                .as_deref()
                .is_some_and(|n| n.contains("symbolizes_this_test_binary")),
            "{f:?}"
        );
    }
}
