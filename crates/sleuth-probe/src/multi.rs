//! Batched uprobes (`BPF_TRACE_UPROBE_MULTI`, Linux 6.6+): one link attaches a
//! program at every CUDA entry point of a library, with a cookie per offset.
//!
//! Why not one perf-event uprobe per entry point (what aya 0.14 offers): each
//! registration and, worse, each release waits for an RCU grace period. We
//! measured 84 probes on the simulated libraries: 2.2 s to attach and 43.8 s
//! to detach on the 2-core CI machine (2026-11-30). A multi link registers and
//! releases all of them with one synchronisation.
//!
//! aya loads the object (maps, globals, tracepoints); the three call programs
//! are loaded a second time here with the multi attach type, their map
//! references resolved to the fds of aya's maps. They use no CO-RE and no
//! bpf-to-bpf calls, so map relocations are all they need.

use object::{Object, ObjectSection, ObjectSymbol, RelocationTarget};
use std::collections::HashMap;
use std::ffi::CString;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::path::Path;

const BPF_PROG_LOAD: libc::c_long = 5;
const BPF_LINK_CREATE: libc::c_long = 28;
const BPF_PROG_TYPE_KPROBE: u32 = 2;
const BPF_TRACE_UPROBE_MULTI: u32 = 48;
const BPF_F_UPROBE_MULTI_RETURN: u32 = 1;
const BPF_PSEUDO_MAP_FD: u8 = 1;
const BPF_PSEUDO_MAP_VALUE: u8 = 2;
const R_BPF_64_64: u32 = 1;

/// A program loaded for multi-uprobe attachment.
pub struct MultiProg {
    fd: OwnedFd,
}

impl MultiProg {
    /// The loaded program's descriptor (for its fdinfo).
    pub fn raw_fd(&self) -> std::os::fd::RawFd {
        self.fd.as_raw_fd()
    }
}

fn bpf(cmd: libc::c_long, attr: &mut [u8; 128]) -> Result<i32, String> {
    // SAFETY: attr is a 128-byte, zero-initialised bpf_attr image that outlives
    // the call; the kernel reads at most `size` bytes of it.
    let r = unsafe { libc::syscall(libc::SYS_bpf, cmd, attr.as_mut_ptr(), attr.len() as u32) };
    if r < 0 {
        Err(std::io::Error::last_os_error().to_string())
    } else {
        Ok(r as i32)
    }
}

fn put_u32(a: &mut [u8; 128], off: usize, v: u32) {
    a[off..off + 4].copy_from_slice(&v.to_ne_bytes());
}
fn put_u64(a: &mut [u8; 128], off: usize, v: u64) {
    a[off..off + 8].copy_from_slice(&v.to_ne_bytes());
}

/// One program's instructions, relocated and ready for `BPF_PROG_LOAD`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Relocated {
    pub name: String,
    /// Raw 8-byte BPF instructions, map references patched to fds.
    pub insns: Vec<u8>,
}

/// Parses the eBPF object `elf` and relocates the programs named in `names`:
/// each reference to a map in `.maps` becomes a `BPF_PSEUDO_MAP_FD` load of
/// that map's fd from `map_fds`, each reference into `.rodata` a
/// `BPF_PSEUDO_MAP_VALUE` load at the right offset. Pure (bytes in,
/// instructions out, no syscall) so it is unit-tested; `load_programs` does
/// the loading. Any other relocation is refused: these programs use no CO-RE
/// and no bpf-to-bpf calls, and a silent mistake would load a wrong program.
pub fn relocate_programs(
    elf: &[u8],
    names: &[&str],
    map_fds: &HashMap<String, RawFd>,
) -> Result<Vec<Relocated>, String> {
    let file = object::File::parse(elf).map_err(|e| format!("eBPF object: {e}"))?;
    let mut out = Vec::with_capacity(names.len());
    for name in names {
        let sym = file
            .symbols()
            .find(|s| s.name() == Ok(name))
            .ok_or_else(|| format!("program {name} not in the object"))?;
        let sec_idx = sym
            .section_index()
            .ok_or_else(|| format!("{name}: no section"))?;
        let section = file.section_by_index(sec_idx).map_err(|e| e.to_string())?;
        let data = section.data().map_err(|e| e.to_string())?;
        let (start, size) = (sym.address() as usize, sym.size() as usize);
        let mut insns = data
            .get(start..start.saturating_add(size))
            .ok_or_else(|| format!("{name}: bad symbol range"))?
            .to_vec();
        for (off, rel) in section.relocations() {
            let off = off as usize;
            if off < start || off >= start + size {
                continue;
            }
            let object::RelocationFlags::Elf { r_type } = rel.flags() else {
                return Err(format!("{name}: unexpected relocation kind"));
            };
            if r_type != R_BPF_64_64 {
                return Err(format!(
                    "{name}: relocation type {r_type} (a bpf-to-bpf call?) unsupported"
                ));
            }
            let RelocationTarget::Symbol(si) = rel.target() else {
                return Err(format!("{name}: relocation without a symbol"));
            };
            let target = file.symbol_by_index(si).map_err(|e| e.to_string())?;
            let tsec = target
                .section_index()
                .and_then(|i| file.section_by_index(i).ok())
                .and_then(|s| s.name().ok().map(str::to_string))
                .unwrap_or_default();
            let at = off - start;
            let insn = insns
                .get_mut(at..at + 16)
                .ok_or_else(|| format!("{name}: relocation past the end"))?;
            if tsec == ".maps" {
                let map = target.name().map_err(|e| e.to_string())?;
                let fd = *map_fds
                    .get(map)
                    .ok_or_else(|| format!("{name}: map {map} not loaded"))?;
                insn[1] = (insn[1] & 0x0f) | (BPF_PSEUDO_MAP_FD << 4);
                insn[4..8].copy_from_slice(&fd.to_ne_bytes());
            } else if tsec.starts_with(".rodata") {
                let fd = *map_fds
                    .get(".rodata")
                    .ok_or_else(|| format!("{name}: .rodata map not loaded"))?;
                let imm = i32::from_ne_bytes([insn[4], insn[5], insn[6], insn[7]]);
                let value_off = target.address() as i32 + imm;
                insn[1] = (insn[1] & 0x0f) | (BPF_PSEUDO_MAP_VALUE << 4);
                insn[4..8].copy_from_slice(&fd.to_ne_bytes());
                insn[12..16].copy_from_slice(&value_off.to_ne_bytes());
            } else {
                return Err(format!("{name}: reference to section {tsec} unsupported"));
            }
        }
        out.push(Relocated {
            name: name.to_string(),
            insns,
        });
    }
    Ok(out)
}

/// Loads the programs named in `names` from the eBPF object `elf`, resolving
/// map references with `map_fds` (map name → fd; `.rodata` included).
pub fn load_programs(
    elf: &[u8],
    names: &[&str],
    map_fds: &HashMap<String, RawFd>,
) -> Result<HashMap<String, MultiProg>, String> {
    let mut out = HashMap::new();
    for Relocated { name, insns } in relocate_programs(elf, names, map_fds)? {
        let license = c"GPL";
        let pname: Vec<u8> = name.bytes().take(15).collect();
        // Without a verifier log first: a log that overflows its buffer fails
        // the load with ENOSPC even for a valid program (the call programs'
        // log outgrew 64 KiB when call-site capture was added). Only a
        // refused program is loaded again, with the log, for its reason.
        let fd = match prog_load(&insns, license, &pname, None) {
            Ok(fd) => fd,
            Err(first) => {
                let mut log = vec![0u8; 1 << 20];
                match prog_load(&insns, license, &pname, Some(&mut log)) {
                    Ok(fd) => fd,
                    Err(e) => {
                        let text = String::from_utf8_lossy(&log);
                        let last = text
                            .trim_end_matches('\0')
                            .lines()
                            .rev()
                            .find(|l| !l.trim().is_empty())
                            .unwrap_or("");
                        return Err(format!(
                            "cannot load {name} for multi-uprobes: {first} ({e}: {last})"
                        ));
                    }
                }
            }
        };
        // SAFETY: the kernel returned a new fd that nothing else owns.
        out.insert(
            name.clone(),
            MultiProg {
                fd: unsafe { OwnedFd::from_raw_fd(fd) },
            },
        );
    }
    Ok(out)
}

/// One BPF_PROG_LOAD of a kprobe-type program for multi-uprobe attachment,
/// with the verifier's log at level 1 when `log` is given.
fn prog_load(
    insns: &[u8],
    license: &std::ffi::CStr,
    pname: &[u8],
    log: Option<&mut Vec<u8>>,
) -> Result<i32, String> {
    let mut attr = [0u8; 128];
    put_u32(&mut attr, 0, BPF_PROG_TYPE_KPROBE);
    put_u32(&mut attr, 4, (insns.len() / 8) as u32);
    put_u64(&mut attr, 8, insns.as_ptr() as u64);
    put_u64(&mut attr, 16, license.as_ptr() as u64);
    if let Some(log) = log {
        put_u32(&mut attr, 24, 1); // log level: the verifier's reason on failure
        put_u32(&mut attr, 28, log.len() as u32);
        put_u64(&mut attr, 32, log.as_mut_ptr() as u64);
    }
    attr[48..48 + pname.len()].copy_from_slice(pname);
    put_u32(&mut attr, 68, BPF_TRACE_UPROBE_MULTI);
    bpf(BPF_PROG_LOAD, &mut attr)
}

/// Attaches `prog` at `offsets` of the file `path` (entry, or return probes
/// with `ret`), each with its cookie, in every process. Dropping the
/// returned fd detaches all.
pub fn attach(
    prog: &MultiProg,
    path: &Path,
    offsets: &[u64],
    cookies: &[u64],
    ret: bool,
) -> Result<OwnedFd, String> {
    attach_pid(prog, path, offsets, cookies, ret, 0)
}

/// [`attach`] for the process `pid` alone (0: every process).
pub fn attach_pid(
    prog: &MultiProg,
    path: &Path,
    offsets: &[u64],
    cookies: &[u64],
    ret: bool,
    pid: u32,
) -> Result<OwnedFd, String> {
    if offsets.is_empty() || offsets.len() != cookies.len() {
        return Err("nothing to attach".into());
    }
    let cpath = CString::new(path.as_os_str().as_encoded_bytes())
        .map_err(|_| "path contains NUL".to_string())?;
    let mut attr = [0u8; 128];
    put_u32(&mut attr, 0, prog.fd.as_raw_fd() as u32);
    put_u32(&mut attr, 8, BPF_TRACE_UPROBE_MULTI);
    put_u64(&mut attr, 16, cpath.as_ptr() as u64);
    put_u64(&mut attr, 24, offsets.as_ptr() as u64);
    put_u64(&mut attr, 40, cookies.as_ptr() as u64);
    put_u32(&mut attr, 48, offsets.len() as u32);
    put_u32(
        &mut attr,
        52,
        if ret { BPF_F_UPROBE_MULTI_RETURN } else { 0 },
    );
    put_u32(&mut attr, 56, pid);
    let fd = bpf(BPF_LINK_CREATE, &mut attr)?;
    // SAFETY: the kernel returned a new fd that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::capture::BPF_OBJECT;

    const PROGS: [&str; 3] = ["call_entry", "call_return", "call_count"];
    const LD_IMM64: u8 = 0x18;

    /// Every map the object defines, with a made-up fd (1000 + index).
    fn fake_fds() -> HashMap<String, RawFd> {
        let file = object::File::parse(BPF_OBJECT).unwrap();
        let maps = file.section_by_name(".maps").unwrap().index();
        let mut fds: HashMap<String, RawFd> = file
            .symbols()
            .filter(|s| s.section_index() == Some(maps))
            .enumerate()
            .map(|(i, s)| (s.name().unwrap().to_string(), 1000 + i as RawFd))
            .collect();
        fds.insert(".rodata".into(), 999);
        fds
    }

    /// (src_reg, imm, second imm) of every 16-byte ld_imm64 in `insns`.
    fn wide_loads(insns: &[u8]) -> Vec<(u8, i32, i32)> {
        let mut out = Vec::new();
        let mut i = 0;
        while i + 8 <= insns.len() {
            if insns[i] == LD_IMM64 && i + 16 <= insns.len() {
                let imm = |o: usize| i32::from_ne_bytes(insns[o..o + 4].try_into().unwrap());
                out.push((insns[i + 1] >> 4, imm(i + 4), imm(i + 12)));
                i += 16;
            } else {
                i += 8;
            }
        }
        out
    }

    #[test]
    fn map_references_become_the_given_fds() {
        let fds = fake_fds();
        let progs = relocate_programs(BPF_OBJECT, &PROGS, &fds).unwrap();
        assert_eq!(
            progs.iter().map(|p| p.name.as_str()).collect::<Vec<_>>(),
            PROGS
        );
        let known: std::collections::HashSet<RawFd> = fds.values().copied().collect();
        for p in &progs {
            assert_eq!(p.insns.len() % 8, 0, "{}", p.name);
            let loads = wide_loads(&p.insns);
            let map_refs: Vec<_> = loads
                .iter()
                .filter(|(src, _, _)| *src == BPF_PSEUDO_MAP_FD)
                .collect();
            // Every program reaches at least one map (the ring buffer or a counter).
            assert!(!map_refs.is_empty(), "{} references no map", p.name);
            for (src, imm, _) in &loads {
                if *src == BPF_PSEUDO_MAP_FD || *src == BPF_PSEUDO_MAP_VALUE {
                    assert!(known.contains(imm), "{}: fd {imm} not given", p.name);
                }
            }
            // Globals (trace_all, self_tgid, ...) are read through .rodata.
            for (_, imm, off) in loads.iter().filter(|l| l.0 == BPF_PSEUDO_MAP_VALUE) {
                assert_eq!(*imm, 999, "{}", p.name);
                assert!(*off >= 0, "{}", p.name);
            }
        }
        // call_entry reads the globals: at least one .rodata value load.
        assert!(wide_loads(&progs[0].insns)
            .iter()
            .any(|l| l.0 == BPF_PSEUDO_MAP_VALUE));
    }

    #[test]
    fn relocation_is_deterministic_and_leaves_the_input_alone() {
        let fds = fake_fds();
        let copy = BPF_OBJECT.to_vec();
        let a = relocate_programs(&copy, &PROGS, &fds).unwrap();
        let b = relocate_programs(&copy, &PROGS, &fds).unwrap();
        assert_eq!(a, b);
        assert_eq!(copy, BPF_OBJECT);
        // Different fds change only the fd immediates.
        let other: HashMap<String, RawFd> =
            fds.iter().map(|(k, v)| (k.clone(), v + 5000)).collect();
        let c = relocate_programs(BPF_OBJECT, &PROGS, &other).unwrap();
        assert_ne!(a, c);
        assert_eq!(a[0].insns.len(), c[0].insns.len());
    }

    #[test]
    fn a_missing_map_or_program_is_an_error() {
        let mut fds = fake_fds();
        fds.remove("events");
        let e = relocate_programs(BPF_OBJECT, &["call_return"], &fds).unwrap_err();
        assert!(e.contains("map events not loaded"), "{e}");
        let mut fds = fake_fds();
        fds.remove(".rodata");
        let e = relocate_programs(BPF_OBJECT, &["call_entry"], &fds).unwrap_err();
        assert!(e.contains(".rodata"), "{e}");
        let e = relocate_programs(BPF_OBJECT, &["no_such_prog"], &fake_fds()).unwrap_err();
        assert!(e.contains("not in the object"), "{e}");
        assert!(relocate_programs(b"not an elf", &PROGS, &fake_fds()).is_err());
    }
}
