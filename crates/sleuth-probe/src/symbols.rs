//! Finds the file offsets of CUDA entry points in a library, once per file.
//!
//! aya can resolve a symbol per attach, but that re-parses the ELF for every
//! probe; libcuda.so is tens of MB and we attach ~60 probes, so we parse once.

use crate::elf_symbols::{ElfSymbols, Table};
use std::collections::HashMap;
use std::path::Path;

/// Symbol name → file offset of its first instruction.
#[derive(Debug, Default)]
pub struct SymbolOffsets {
    pub offsets: HashMap<String, u64>,
}

impl SymbolOffsets {
    /// Reads `.dynsym` and `.symtab` of an ELF file. Versioned names
    /// (`cudaMalloc@@libcudart.so.13`) are stored under the plain name.
    pub fn read(path: &Path) -> Result<SymbolOffsets, String> {
        Self::scan(path, |name| {
            Some(name.split('@').next().unwrap_or(name).to_string())
        })
    }

    /// Only `name` (an executable's symbol table is large: its other
    /// names are not kept).
    pub fn read_only(path: &Path, name: &str) -> Result<SymbolOffsets, String> {
        Self::scan(path, |n| (n == name).then(|| n.to_string()))
    }

    /// The one ELF walk: every defined symbol whose name `key` maps to a key
    /// is stored under that key with its file offset (first one wins; the
    /// exported symbols are read first). The tables are read through a small
    /// buffer (`crate::elf_symbols`), so a library of any size costs the
    /// tracer a few hundred KB while it is read.
    fn scan(path: &Path, key: impl Fn(&str) -> Option<String>) -> Result<SymbolOffsets, String> {
        let elf = ElfSymbols::open(path)?;
        let mut offsets = HashMap::new();
        elf.visit(&[Table::Dynamic, Table::Full], |sym, names| {
            if !sym.is_definition() || sym.value == 0 {
                return;
            }
            let Some(k) = names
                .get(sym.name_off)
                .and_then(|n| std::str::from_utf8(n).ok())
                .and_then(&key)
            else {
                return;
            };
            if offsets.contains_key(&k) {
                return;
            }
            let Some(section) = elf.section(sym.shndx) else {
                return;
            };
            let Some((file_off, _)) = section.file_range else {
                return;
            };
            let Some(delta) = sym.value.checked_sub(section.address) else {
                return;
            };
            let Some(at) = file_off.checked_add(delta) else {
                return;
            };
            offsets.insert(k, at);
        })
        .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
        Ok(SymbolOffsets { offsets })
    }

    pub fn get(&self, name: &str) -> Option<u64> {
        self.offsets.get(name).copied()
    }
}

/// The library search path an executable names itself (DT_RUNPATH, else
/// DT_RPATH), with `$ORIGIN` expanded. A command linked against libcudart
/// with an rpath maps it at exec, before any rescan of its memory map could
/// see it, so its folders are probed before the command starts.
pub fn runpath_dirs(exe: &Path) -> Vec<std::path::PathBuf> {
    use object::elf;
    use object::read::elf::{Dyn, FileHeader};
    let Ok(f) = std::fs::File::open(exe) else {
        return Vec::new();
    };
    // Only the headers and the dynamic section are read (object's cache
    // holds what it read: a few KB), not the executable.
    let cache = object::read::ReadCache::new(&f);
    let data = &cache;
    let Ok(header) = elf::FileHeader64::<object::Endianness>::parse(data) else {
        return Vec::new();
    };
    let Ok(endian) = header.endian() else {
        return Vec::new();
    };
    let Ok(sections) = header.sections(endian, data) else {
        return Vec::new();
    };
    let Ok(Some((dyns, strtab_index))) = sections.dynamic(endian, data) else {
        return Vec::new();
    };
    let Ok(strtab) = sections.strings(endian, data, strtab_index) else {
        return Vec::new();
    };
    let mut runpath = None;
    let mut rpath = None;
    for d in dyns {
        let tag = d.d_tag(endian);
        if tag == elf::DT_RUNPATH || tag == elf::DT_RPATH {
            if let Ok(s) = strtab.get(d.d_val(endian) as u32) {
                let s = String::from_utf8_lossy(s).into_owned();
                if tag == elf::DT_RUNPATH {
                    runpath = Some(s)
                } else {
                    rpath = Some(s)
                }
            }
        }
    }
    let origin = exe
        .parent()
        .map(|p| p.display().to_string())
        .unwrap_or_default();
    runpath
        .or(rpath)
        .map(|s| {
            s.split(':')
                .filter(|p| !p.is_empty())
                .map(|p| {
                    std::path::PathBuf::from(
                        p.replace("${ORIGIN}", &origin).replace("$ORIGIN", &origin),
                    )
                })
                .collect()
        })
        .unwrap_or_default()
}

/// Demangled name prefix (up to the parameter list) and the exact parameter
/// lists accepted, per caching-allocator op. Matching on the demangled
/// signature, not the mangled bytes, keeps this working across builds whose
/// mangling differs only in substitutions, and refuses a torch whose
/// functions changed signature (their argument registers would differ).
const TORCH_PATTERNS: &[(u16, &str, &[&str])] = &[
    (
        64,
        "c10::cuda::CUDACachingAllocator::Native::DeviceCachingAllocator::malloc",
        &["(unsigned long, CUstream_st*)"],
    ),
    (
        65,
        "c10::cuda::CUDACachingAllocator::Native::DeviceCachingAllocator::free",
        &["(c10::cuda::CUDACachingAllocator::Native::(anonymous namespace)::Block*)"],
    ),
    (
        66,
        "c10::cuda::CUDACachingAllocator::Native::DeviceCachingAllocator::release_block",
        &["(c10::cuda::CUDACachingAllocator::Native::(anonymous namespace)::Block*, std::shared_ptr<c10::GatheredContext> const&)"],
    ),
    (
        67,
        "c10::cuda::CUDACachingAllocator::Native::NativeCachingAllocator::emptyCache",
        &["(std::pair<unsigned long long, unsigned long long>)", "(c10::MempoolId_t)", "()"],
    ),
];

/// Matches one demangled symbol against the caching-allocator patterns.
pub fn torch_op_for(demangled: &str) -> Option<u16> {
    TORCH_PATTERNS.iter().find_map(|(op, prefix, params)| {
        let rest = demangled.strip_prefix(prefix)?;
        params.contains(&rest).then_some(*op)
    })
}

impl SymbolOffsets {
    /// PyTorch caching-allocator entry points in `libc10_cuda.so`, keyed by
    /// op name (see `sleuth_core::ops`), found by demangled name + signature.
    /// Compiler clones (`.cold`, `.isra`, ...) are skipped.
    pub fn read_torch(path: &Path) -> Result<SymbolOffsets, String> {
        Self::scan(path, |name| {
            let demangled = caching_allocator_function(name)?;
            let op = torch_op_for(&demangled)?;
            sleuth_core::op_by_id(op).map(|info| info.name.to_string())
        })
    }
}

/// The demangled name of a function of PyTorch's CUDA caching allocator
/// (`c10::cuda::CUDACachingAllocator::...`); None for other symbols and
/// for compiler clones (`.cold`, `.isra`, ...).
fn caching_allocator_function(mangled: &str) -> Option<String> {
    if !mangled.starts_with("_ZN3c104cuda20CUDACachingAllocator") || mangled.contains('.') {
        return None;
    }
    cpp_demangle::Symbol::new(mangled).ok()?.demangle().ok()
}

/// Demangled caching-allocator function names in a library (for `check`,
/// when the expected signatures are not found: shows what is there instead).
pub fn torch_candidates(path: &Path) -> Vec<String> {
    let Ok(elf) = ElfSymbols::open(path) else {
        return Vec::new();
    };
    let mut out: Vec<String> = Vec::new();
    let _ = elf.visit(&[Table::Full, Table::Dynamic], |sym, names| {
        let Some(name) = names
            .get(sym.name_off)
            .and_then(|n| std::str::from_utf8(n).ok())
        else {
            return;
        };
        let Some(d) = caching_allocator_function(name) else {
            return;
        };
        let interesting = ["::malloc(", "::free(", "::release_block(", "::emptyCache("];
        if d.contains("Native::") && interesting.iter().any(|k| d.contains(k)) {
            out.push(format!("{d}  [{name}]"));
        }
    });
    out.sort();
    out.dedup();
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn torch_patterns_match_the_torch_2_11_signatures() {
        // Demangled names as `nm -C` printed them for torch 2.11.0+cu130 on the H200.
        let ns = "c10::cuda::CUDACachingAllocator::Native::";
        assert_eq!(
            torch_op_for(&format!(
                "{ns}DeviceCachingAllocator::malloc(unsigned long, CUstream_st*)"
            )),
            Some(64)
        );
        assert_eq!(
            torch_op_for(&format!(
                "{ns}DeviceCachingAllocator::free({ns}(anonymous namespace)::Block*)"
            )),
            Some(65)
        );
        assert_eq!(
            torch_op_for(&format!(
                "{ns}DeviceCachingAllocator::release_block({ns}(anonymous namespace)::Block*, std::shared_ptr<c10::GatheredContext> const&)"
            )),
            Some(66)
        );
        assert_eq!(
            torch_op_for(&format!("{ns}NativeCachingAllocator::emptyCache(std::pair<unsigned long long, unsigned long long>)")),
            Some(67)
        );
        // Near misses: other functions, other signatures, other allocators.
        assert_eq!(torch_op_for(&format!("{ns}DeviceCachingAllocator::free_block({ns}(anonymous namespace)::Block*, std::shared_ptr<c10::GatheredContext> const&)")), None);
        assert_eq!(
            torch_op_for(&format!(
                "{ns}DeviceCachingAllocator::malloc(unsigned long)"
            )),
            None
        );
        assert_eq!(torch_op_for(&format!("{ns}NativeCachingAllocator::malloc(void**, signed char, unsigned long, CUstream_st*)")), None);
    }

    #[test]
    fn demangling_a_real_mangled_name() {
        let d = cpp_demangle::Symbol::new("_ZN3c104cuda20CUDACachingAllocator6Native22DeviceCachingAllocator6mallocEmP11CUstream_st")
            .unwrap()
            .demangle()
            .unwrap();
        assert_eq!(torch_op_for(&d), Some(64), "{d}");
    }
}
