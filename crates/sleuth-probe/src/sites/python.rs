//! CPython in a traced process: which version, where `_PyRuntime` is, how its
//! frames are laid out (what the kernel walks), and how a code object turns
//! into file, function and line (what user space reads).
//!
//! 3.13 describes its own layout in `_Py_DebugOffsets` at the start of
//! `_PyRuntime`; that is read from the process. 3.10–3.12 do not: their
//! offsets below come from `offsetof` on each version's own internal headers
//! (`Include/internal/pycore_*.h`, x86-64), and a test recompiles that check
//! against every interpreter installed on the machine.

use super::procmem::ProcMem;
use sleuth_core::record::{py_frames, RawPyLayout};
use std::path::{Path, PathBuf};

/// Offsets user space needs to read a code object and its strings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CodeLayout {
    pub filename: u64,
    /// `co_qualname` (3.11+), else `co_name`.
    pub name: u64,
    pub firstlineno: u64,
    pub linetable: u64,
    /// `co_code_adaptive` (3.11+): instruction pointers are relative to it.
    pub code_adaptive: Option<u64>,
    /// `sizeof(PyASCIIObject)`: where a compact ASCII string's bytes start.
    pub ascii_size: u64,
    /// `sizeof(PyCompactUnicodeObject)`: where other compact strings' data start.
    pub compact_size: u64,
    /// `offsetof(PyBytesObject, ob_sval)`.
    pub bytes_sval: u64,
}

/// Everything about one interpreter version, except where `_PyRuntime` is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct VersionLayout {
    pub minor: u32,
    /// Kernel walk (its `runtime` field is filled per process).
    pub walk: RawPyLayout,
    pub code: CodeLayout,
}

/// Layouts of 3.10, 3.11 and 3.12 (x86-64, default build, no free threading).
pub fn static_layout(minor: u32) -> Option<VersionLayout> {
    let walk =
        |kind, interp, threads, next, thread_id, frame, cframe, prev, code, instr, owner, isz| {
            RawPyLayout {
                runtime: 0,
                kind,
                runtime_interp_head: interp,
                interp_threads_head: threads,
                tstate_next: next,
                tstate_thread_id: thread_id,
                tstate_frame: frame,
                cframe_current: cframe,
                frame_previous: prev,
                frame_code: code,
                frame_instr: instr,
                frame_owner: owner,
                instr_size: isz,
            }
        };
    let (w, c) = match minor {
        10 => (
            walk(py_frames::V310, 32, 8, 8, 176, 24, 0, 24, 32, 96, 0, 4),
            CodeLayout {
                filename: 104,
                name: 112,
                firstlineno: 40,
                linetable: 120,
                code_adaptive: None,
                ascii_size: 48,
                compact_size: 72,
                bytes_sval: 32,
            },
        ),
        11 => (
            walk(py_frames::V311, 40, 16, 8, 152, 56, 8, 48, 32, 56, 69, 8),
            CodeLayout {
                filename: 112,
                name: 128,
                firstlineno: 72,
                linetable: 136,
                code_adaptive: Some(184),
                ascii_size: 48,
                compact_size: 72,
                bytes_sval: 32,
            },
        ),
        12 => (
            walk(py_frames::V311, 40, 72, 8, 136, 56, 0, 8, 0, 56, 70, 8),
            CodeLayout {
                filename: 112,
                name: 128,
                firstlineno: 68,
                linetable: 136,
                code_adaptive: Some(192),
                ascii_size: 40,
                compact_size: 56,
                bytes_sval: 32,
            },
        ),
        _ => return None,
    };
    Some(VersionLayout {
        minor,
        walk: w,
        code: c,
    })
}

/// Number of u64 words of 3.13's `_Py_DebugOffsets` read here.
pub const DEBUG_OFFSETS_WORDS: usize = 73;

/// 3.13's layout from its `_Py_DebugOffsets` (the words at the start of
/// `_PyRuntime`). The struct changes between minor versions, so only a
/// 3.13 cookie and version are accepted.
pub fn layout_from_debug_offsets(w: &[u64]) -> Result<VersionLayout, String> {
    if w.len() < DEBUG_OFFSETS_WORDS {
        return Err("_Py_DebugOffsets too short".into());
    }
    if w[0].to_le_bytes() != *b"xdebugpy" {
        return Err("_PyRuntime does not start with the _Py_DebugOffsets cookie".into());
    }
    let version = w[1];
    if (version >> 16) & 0xffff != 0x030D {
        return Err(format!(
            "_Py_DebugOffsets of version {version:#x}: only 3.13's layout is known"
        ));
    }
    if w[2] != 0 {
        return Err("free-threaded CPython is not supported".into());
    }
    let u = |i: usize| u32::try_from(w[i]).map_err(|_| format!("debug offset {i} out of range"));
    let walk = RawPyLayout {
        runtime: 0,
        kind: py_frames::V313,
        runtime_interp_head: u(5)?,
        interp_threads_head: u(9)?,
        tstate_next: u(21)?,
        tstate_thread_id: u(24)?,
        tstate_frame: u(23)?,
        cframe_current: 0,
        frame_previous: u(29)?,
        frame_code: u(30)?,
        frame_instr: u(31)?,
        frame_owner: u(33)?,
        instr_size: 8,
    };
    let ascii = w[70];
    Ok(VersionLayout {
        minor: 13,
        walk,
        code: CodeLayout {
            filename: w[35],
            name: w[37],
            firstlineno: w[39],
            linetable: w[38],
            code_adaptive: Some(w[43]),
            ascii_size: ascii,
            // PyCompactUnicodeObject adds utf8_length and utf8 (3.12+).
            compact_size: ascii + 16,
            bytes_sval: w[66],
        },
    })
}

/// A CPython found in a process.
#[derive(Debug, Clone)]
pub struct PyProcess {
    pub pid: u32,
    pub layout: VersionLayout,
    /// Address of `_PyRuntime` in the process.
    pub runtime: u64,
    /// The file that holds it (the executable or libpython).
    pub file: PathBuf,
}

impl PyProcess {
    /// What the kernel needs for this process.
    pub fn kernel_layout(&self) -> RawPyLayout {
        RawPyLayout {
            runtime: self.runtime,
            ..self.layout.walk
        }
    }
}

/// The minor version from a file name: `python3.12`, `libpython3.12.so.1.0`.
fn minor_from_name(path: &Path) -> Option<u32> {
    let name = path.file_name()?.to_str()?;
    let rest = name
        .strip_prefix("libpython3.")
        .or_else(|| name.strip_prefix("python3."))?;
    let digits: String = rest.chars().take_while(|c| c.is_ascii_digit()).collect();
    digits.parse().ok()
}

/// Symbols of one ELF file needed here: `_PyRuntime` and `Py_Version`
/// (3.11+: the version as a `PY_VERSION_HEX` constant), as virtual addresses.
struct PySymbols {
    runtime: u64,
    py_version: Option<u32>,
    /// Lowest virtual address of a loadable segment (for the load bias).
    min_vaddr: u64,
}

fn read_symbols(path: &Path) -> Result<Option<PySymbols>, String> {
    use crate::elf_symbols::{ElfSymbols, Table};
    // Read through a small buffer: the interpreter (or libpython) is tens of
    // MB that reading it whole used to add to the tracer's peak RSS.
    let elf = ElfSymbols::open(path)?;
    let mut runtime = None;
    let mut version_addr = None;
    elf.visit(&[Table::Dynamic, Table::Full], |sym, names| {
        if sym.value == 0 {
            return;
        }
        match names.get(sym.name_off) {
            Some(b"_PyRuntime") => runtime = Some(sym.value),
            Some(b"Py_Version") => version_addr = Some(sym.value),
            _ => {}
        }
    })
    .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    let Some(runtime) = runtime else {
        return Ok(None);
    };
    // Py_Version is a const in a loaded segment: read it from the file.
    let py_version = version_addr.and_then(|a| {
        elf.segments().iter().find_map(|&(off, vaddr, size)| {
            let rel = a.checked_sub(vaddr)?;
            if rel.checked_add(4)? > size {
                return None;
            }
            let b = elf.read_at(off.checked_add(rel)?, 4)?;
            Some(u32::from_le_bytes(b.try_into().ok()?))
        })
    });
    let min_vaddr = elf.segments().iter().map(|s| s.1).min().unwrap_or(0) & !0xfff;
    Ok(Some(PySymbols {
        runtime,
        py_version,
        min_vaddr,
    }))
}

/// One line of /proc/PID/maps.
#[derive(Debug, Clone)]
pub struct MapEntry {
    pub start: u64,
    pub end: u64,
    pub offset: u64,
    /// Mapped executable: a return address can only point into such a mapping.
    pub exec: bool,
    pub path: String,
}

pub fn read_maps(pid: u32) -> Vec<MapEntry> {
    let Ok(text) = std::fs::read_to_string(format!("/proc/{pid}/maps")) else {
        return Vec::new();
    };
    text.lines()
        .filter_map(|l| {
            let mut it = l.split_whitespace();
            let range = it.next()?;
            let perms = it.next()?;
            let offset = u64::from_str_radix(it.next()?, 16).ok()?;
            let _dev = it.next()?;
            let _ino = it.next()?;
            let path = it.collect::<Vec<_>>().join(" ");
            let (s, e) = range.split_once('-')?;
            Some(MapEntry {
                start: u64::from_str_radix(s, 16).ok()?,
                end: u64::from_str_radix(e, 16).ok()?,
                offset,
                exec: perms.contains('x'),
                path,
            })
        })
        .collect()
}

/// Looks for CPython in a process. Ok(None): not a CPython process (or its
/// libpython is not mapped yet); Err: CPython of a layout not supported.
pub fn detect(pid: u32) -> Result<Option<PyProcess>, String> {
    let maps = read_maps(pid);
    let mut candidates: Vec<&MapEntry> = maps
        .iter()
        .filter(|m| m.offset == 0 && minor_from_name(Path::new(&m.path)).is_some())
        .collect();
    // An executable named plainly `python3` (a venv link resolved by the
    // kernel to the real file keeps its name) may still hold _PyRuntime.
    if let Ok(exe) = std::fs::read_link(format!("/proc/{pid}/exe")) {
        let exe_s = exe.display().to_string();
        if exe
            .file_name()
            .and_then(|n| n.to_str())
            .is_some_and(|n| n.starts_with("python"))
        {
            if let Some(m) = maps.iter().find(|m| m.offset == 0 && m.path == exe_s) {
                if !candidates.iter().any(|c| c.path == exe_s) {
                    candidates.push(m);
                }
            }
        }
    }
    for m in candidates {
        let path = PathBuf::from(&m.path);
        let Some(syms) = read_symbols(&path)? else {
            continue;
        };
        let bias = m.start.wrapping_sub(syms.min_vaddr);
        let runtime = syms.runtime.wrapping_add(bias);
        let minor = syms
            .py_version
            .map(|v| (v >> 16) & 0xff)
            .filter(|&maj_min| maj_min != 0)
            .or_else(|| minor_from_name(&path))
            .ok_or_else(|| format!("{}: cannot tell the Python version", path.display()))?;
        let layout = if minor == 13 {
            let mem = ProcMem::open(pid)?;
            let mut buf = vec![0u8; DEBUG_OFFSETS_WORDS * 8];
            mem.read(runtime, &mut buf)?;
            let words: Vec<u64> = buf
                .chunks_exact(8)
                .map(|c| u64::from_le_bytes(c.try_into().unwrap_or([0; 8])))
                .collect();
            layout_from_debug_offsets(&words)?
        } else {
            static_layout(minor).ok_or_else(|| {
                format!(
                    "Python 3.{minor} ({}) has no known frame layout (3.10 to 3.13 are supported)",
                    path.display()
                )
            })?
        };
        return Ok(Some(PyProcess {
            pid,
            layout,
            runtime,
            file: path,
        }));
    }
    Ok(None)
}

/// What a code object says about itself.
#[derive(Debug, Clone)]
pub struct CodeInfo {
    pub filename: String,
    pub name: String,
    pub firstlineno: i32,
    pub linetable: Vec<u8>,
}

/// Longest string or line table read from a process.
const MAX_READ: usize = 1 << 20;

/// Reads a `str` object (compact strings: every code object's names are).
pub fn read_str(mem: &ProcMem, c: &CodeLayout, obj: u64) -> Result<String, String> {
    let mut head = [0u8; 40];
    mem.read(obj, &mut head)?;
    let length = u64::from_le_bytes(head[16..24].try_into().unwrap_or([0; 8])) as usize;
    let state = u32::from_le_bytes(head[32..36].try_into().unwrap_or([0; 4]));
    let kind = (state >> 2) & 7;
    let compact = (state >> 5) & 1 == 1;
    let ascii = (state >> 6) & 1 == 1;
    if !compact {
        return Err("not a compact string".into());
    }
    let width = match kind {
        1 => 1,
        2 => 2,
        4 => 4,
        _ => return Err(format!("string kind {kind}")),
    };
    let bytes = length.saturating_mul(width);
    if bytes > MAX_READ {
        return Err("string too long".into());
    }
    let data_at = obj + if ascii { c.ascii_size } else { c.compact_size };
    let mut raw = vec![0u8; bytes];
    mem.read(data_at, &mut raw)?;
    Ok(decode_units(&raw, width))
}

/// A compact string's code units (`width` bytes each, little-endian) as
/// text. A unit that is no character (a lone surrogate: Python keeps a
/// file name's undecodable bytes so, `surrogateescape`) is U+FFFD, never
/// left out: left out, a path named another file (round 55's tester).
fn decode_units(raw: &[u8], width: usize) -> String {
    let unit = |b: &[u8]| -> u32 {
        match width {
            1 => u32::from(b[0]),
            2 => u32::from(u16::from_le_bytes([b[0], b[1]])),
            _ => u32::from_le_bytes([b[0], b[1], b[2], b[3]]),
        }
    };
    raw.chunks_exact(width)
        .map(|b| char::from_u32(unit(b)).unwrap_or('\u{fffd}'))
        .collect()
}

fn read_u64(mem: &ProcMem, addr: u64) -> Result<u64, String> {
    let mut b = [0u8; 8];
    mem.read(addr, &mut b)?;
    Ok(u64::from_le_bytes(b))
}

/// Reads a code object's file, name, first line and line table.
pub fn read_code(mem: &ProcMem, c: &CodeLayout, code: u64) -> Result<CodeInfo, String> {
    let filename = read_str(mem, c, read_u64(mem, code + c.filename)?)?;
    let name = read_str(mem, c, read_u64(mem, code + c.name)?)?;
    let mut fl = [0u8; 4];
    mem.read(code + c.firstlineno, &mut fl)?;
    let table_obj = read_u64(mem, code + c.linetable)?;
    let size = read_u64(mem, table_obj + 16)? as usize; // ob_size of the bytes object
    if size > MAX_READ {
        return Err("line table too long".into());
    }
    let mut linetable = vec![0u8; size];
    mem.read(table_obj + c.bytes_sval, &mut linetable)?;
    Ok(CodeInfo {
        filename,
        name,
        firstlineno: i32::from_le_bytes(fl),
        linetable,
    })
}

/// The line a frame is at, from its code object and raw instruction field.
pub fn frame_line(layout: &VersionLayout, info: &CodeInfo, code: u64, instr: u64) -> Option<u32> {
    match layout.code.code_adaptive {
        None => {
            // 3.10: f_lasti is an index in 2-byte code units; -1 before the first.
            let lasti = instr as u32 as i32;
            if lasti < 0 {
                return u32::try_from(info.firstlineno).ok();
            }
            super::linetable::line_310(&info.linetable, info.firstlineno, lasti as u32 * 2)
        }
        Some(adaptive) => {
            let first = code + adaptive;
            let unit = instr.checked_sub(first)? / 2;
            super::linetable::line_311(&info.linetable, info.firstlineno, unit as u32)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Lone surrogates (a file name's undecodable bytes under Python's
    /// `surrogateescape`) read as U+FFFD; every width decodes its units.
    #[test]
    fn a_lone_surrogate_is_a_replacement_character_not_dropped() {
        let utf16: Vec<u8> = ["/w/", "\u{e9}", "x.py"]
            .concat()
            .encode_utf16()
            .flat_map(u16::to_le_bytes)
            .collect();
        assert_eq!(decode_units(&utf16, 2), "/w/\u{e9}x.py");
        let mut lone = utf16.clone();
        lone.splice(6..6, 0xdcffu16.to_le_bytes());
        assert_eq!(decode_units(&lone, 2), "/w/\u{fffd}\u{e9}x.py");
        let ucs4: Vec<u8> = [0x2fu32, 0xdcff, 0x1f600]
            .iter()
            .flat_map(|u| u.to_le_bytes())
            .collect();
        assert_eq!(decode_units(&ucs4, 4), "/\u{fffd}\u{1f600}");
        assert_eq!(decode_units(b"caf\xe9", 1), "caf\u{e9}");
    }

    #[test]
    fn names_give_the_minor_version() {
        assert_eq!(minor_from_name(Path::new("/usr/bin/python3.12")), Some(12));
        assert_eq!(
            minor_from_name(Path::new("/x/lib/libpython3.10.so.1.0")),
            Some(10)
        );
        assert_eq!(minor_from_name(Path::new("/usr/bin/python3")), None);
        assert_eq!(minor_from_name(Path::new("/usr/lib/libc.so.6")), None);
    }

    #[test]
    fn debug_offsets_need_the_313_cookie() {
        let mut w = vec![0u64; DEBUG_OFFSETS_WORDS];
        assert!(layout_from_debug_offsets(&w).is_err());
        w[0] = u64::from_le_bytes(*b"xdebugpy");
        w[1] = 0x030E_00F0; // 3.14
        assert!(layout_from_debug_offsets(&w).unwrap_err().contains("3.13"));
        w[1] = 0x030D_00F0;
        w[5] = 632;
        w[70] = 40;
        let l = layout_from_debug_offsets(&w).unwrap();
        assert_eq!(l.walk.runtime_interp_head, 632);
        assert_eq!(l.code.compact_size, 56);
        assert!(layout_from_debug_offsets(&w[..10]).is_err());
    }

    #[test]
    fn static_layouts_cover_310_to_312_only() {
        for m in [10, 11, 12] {
            assert_eq!(static_layout(m).unwrap().minor, m);
        }
        assert!(static_layout(9).is_none());
        assert!(
            static_layout(13).is_none(),
            "3.13 reads its own debug offsets"
        );
    }
}
