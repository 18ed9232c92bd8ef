//! Finds the file offsets of CUDA entry points in a library, once per file.
//!
//! aya can resolve a symbol per attach, but that re-parses the ELF for every
//! probe; libcuda.so is tens of MB and we attach ~60 probes, so we parse once.

use object::{Object, ObjectSection, ObjectSymbol};
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
        let data =
            std::fs::read(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
        let file = object::File::parse(&*data)
            .map_err(|e| format!("{} is not a readable ELF file: {e}", path.display()))?;
        let mut offsets = HashMap::new();
        for sym in file.dynamic_symbols().chain(file.symbols()) {
            if !sym.is_definition() || sym.address() == 0 {
                continue;
            }
            let Ok(name) = sym.name() else { continue };
            let name = name.split('@').next().unwrap_or(name);
            if offsets.contains_key(name) {
                continue;
            }
            let Some(index) = sym.section_index() else {
                continue;
            };
            let Ok(section) = file.section_by_index(index) else {
                continue;
            };
            let Some((file_off, _)) = section.file_range() else {
                continue;
            };
            let Some(delta) = sym.address().checked_sub(section.address()) else {
                continue;
            };
            offsets.insert(name.to_string(), file_off + delta);
        }
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
    use object::read::elf::{Dyn, ElfFile64};
    let Ok(data) = std::fs::read(exe) else {
        return Vec::new();
    };
    let Ok(file) = ElfFile64::<object::Endianness>::parse(&*data) else {
        return Vec::new();
    };
    let endian = file.endian();
    let sections = file.elf_section_table();
    let Ok(Some((dyns, strtab_index))) = sections.dynamic(endian, &*data) else {
        return Vec::new();
    };
    let Ok(strtab) = sections.strings(endian, &*data, strtab_index) else {
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
