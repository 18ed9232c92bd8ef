//! ELF symbol tables read through small buffers, never mapped or loaded whole.
//!
//! The tracer reads the symbols of the CUDA, NCCL, Python and PyTorch
//! libraries it meets (uprobe offsets, `_PyRuntime`, native frame names).
//! PyTorch's libraries are 0.5 to 1.5 GB with symbol and string tables of
//! tens of MB each. Loading a file made its size part of the tracer's peak
//! RSS; mapping it still counted every page a walk touched (on the H200,
//! 2026-12-01, 7 to 20 MiB of libtorch pages at the tracer's peak, with the
//! pages dropped every 32k symbols). Here a walk reads each table through a
//! 64 KiB buffer with `pread` (the page cache serves it; nothing of the file
//! becomes ours), and a name is read only when asked for, through a window
//! that serves the mostly increasing offsets of a table walk in few reads.
//!
//! `object` parses the headers (through its `ReadCache`, a few KB) and gives
//! the record layouts; only the chunked reading is ours.

use object::elf;
use object::read::elf::{FileHeader, ProgramHeader, SectionHeader, Sym};
use object::read::ReadCache;
use object::Endianness;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::Path;

/// Bytes read per `pread` of a symbol table, and the name window's size.
const CHUNK: usize = 64 * 1024;

/// The longest symbol name read (mangled C++ template names reach a few
/// KB; a longer one, or one without its terminating NUL, is not a name).
pub const MAX_NAME: usize = 64 * 1024;

/// Which symbol table.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Table {
    /// `.dynsym`: the exported symbols (present in every shared library).
    Dynamic,
    /// `.symtab`: every symbol, when the file is not stripped.
    Full,
}

/// One symbol, as stored in its table (addresses widened to 64 bits).
#[derive(Clone, Copy, Debug)]
pub struct RawSymbol {
    pub value: u64,
    pub size: u64,
    /// Where the name starts in the file (its string table's offset plus
    /// `st_name`); read it with [`NameReader`] or [`name_in`].
    pub name_off: u64,
    pub kind: u8,
    pub bind: u8,
    pub shndx: u16,
}

impl RawSymbol {
    /// Defined in a section of this file (not undefined, absolute or common).
    /// `SHN_XINDEX` symbols count as defined, as in `object`.
    pub fn is_defined(&self) -> bool {
        self.shndx != elf::SHN_UNDEF
            && (self.shndx < elf::SHN_LORESERVE || self.shndx == elf::SHN_XINDEX)
    }

    /// A function (`STT_FUNC` or an ifunc resolver).
    pub fn is_function(&self) -> bool {
        matches!(self.kind, elf::STT_FUNC | elf::STT_GNU_IFUNC)
    }

    /// What `object` calls a definition: a defined function, object or
    /// untyped symbol (untyped local names starting with `$` are ARM mapping
    /// symbols, not definitions; the caller filters those by name).
    pub fn is_definition(&self) -> bool {
        self.is_defined() && matches!(self.kind, elf::STT_FUNC | elf::STT_OBJECT | elf::STT_NOTYPE)
    }
}

/// A symbol table's place in the file.
#[derive(Clone, Copy, Debug)]
struct TableAt {
    which: Table,
    offset: u64,
    count: u64,
    strings: (u64, u64),
}

/// A section's address and file range (None in the file for `SHT_NOBITS`).
#[derive(Clone, Copy, Debug)]
pub struct SectionAt {
    pub address: u64,
    pub file_range: Option<(u64, u64)>,
}

/// A loadable segment: (file offset, virtual address, size in the file).
pub type Segment = (u64, u64, u64);

#[derive(Clone, Copy, Debug)]
enum Class {
    Elf32,
    Elf64,
}

/// An ELF file opened for its symbols.
pub struct ElfSymbols {
    file: File,
    class: Class,
    endian: Endianness,
    tables: Vec<TableAt>,
    sections: Vec<SectionAt>,
    segments: Vec<Segment>,
}

impl ElfSymbols {
    /// Opens `path` and reads its headers. Errors are one line each.
    pub fn open(path: &Path) -> Result<ElfSymbols, String> {
        let file = File::open(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
        let not_elf =
            |e: object::read::Error| format!("{} is not a readable ELF file: {e}", path.display());
        let mut ident = [0u8; 5];
        file.read_exact_at(&mut ident, 0)
            .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
        let class = match (&ident[..4], ident[4]) {
            (b"\x7fELF", elf::ELFCLASS32) => Class::Elf32,
            (b"\x7fELF", elf::ELFCLASS64) => Class::Elf64,
            _ => return Err(format!("{} is not an ELF file", path.display())),
        };
        let layout = match class {
            Class::Elf32 => Layout::read::<elf::FileHeader32<Endianness>>(&file),
            Class::Elf64 => Layout::read::<elf::FileHeader64<Endianness>>(&file),
        }
        .map_err(not_elf)?;
        Ok(ElfSymbols {
            file,
            class,
            endian: layout.endian,
            tables: layout.tables,
            sections: layout.sections,
            segments: layout.segments,
        })
    }

    /// Visits every symbol of the tables in `order` (a table the file lacks
    /// is skipped). `f` gets each symbol and a reader for names of its table.
    /// Memory: one 64 KiB chunk and one name window, whatever the table's size.
    pub fn visit(
        &self,
        order: &[Table],
        mut f: impl FnMut(&RawSymbol, &mut NameReader<'_>),
    ) -> std::io::Result<()> {
        for which in order {
            for t in self.tables.iter().filter(|t| t.which == *which) {
                let mut names = NameReader::new(&self.file, t.strings);
                match self.class {
                    Class::Elf32 => {
                        self.walk::<elf::FileHeader32<Endianness>>(t, &mut names, &mut f)?
                    }
                    Class::Elf64 => {
                        self.walk::<elf::FileHeader64<Endianness>>(t, &mut names, &mut f)?
                    }
                }
            }
        }
        Ok(())
    }

    fn walk<Elf: FileHeader<Endian = Endianness>>(
        &self,
        t: &TableAt,
        names: &mut NameReader<'_>,
        f: &mut impl FnMut(&RawSymbol, &mut NameReader<'_>),
    ) -> std::io::Result<()> {
        let size = std::mem::size_of::<Elf::Sym>();
        let per_chunk = (CHUNK / size).max(1);
        let mut buf = vec![0u8; per_chunk * size];
        let mut done = 0u64;
        while done < t.count {
            let n = (t.count - done).min(per_chunk as u64) as usize;
            let bytes = &mut buf[..n * size];
            // A crafted section offset near 2^64 must not wrap around.
            let at = t
                .offset
                .checked_add(done * size as u64)
                .ok_or_else(|| std::io::Error::other("symbol table beyond any file"))?;
            self.file.read_exact_at(bytes, at)?;
            let Ok((syms, _)) = object::pod::slice_from_bytes::<Elf::Sym>(bytes, n) else {
                return Ok(());
            };
            for s in syms {
                let e = self.endian;
                let raw = RawSymbol {
                    value: s.st_value(e).into(),
                    size: s.st_size(e).into(),
                    // Saturating: NameReader refuses an offset outside the table.
                    name_off: t.strings.0.saturating_add(u64::from(s.st_name(e))),
                    kind: s.st_type(),
                    bind: s.st_bind(),
                    shndx: s.st_shndx(e),
                };
                f(&raw, names);
            }
            done += n as u64;
        }
        Ok(())
    }

    /// The loadable segments (file offset, virtual address, file size).
    pub fn segments(&self) -> &[Segment] {
        &self.segments
    }

    /// Section `index` (a symbol's `shndx`).
    pub fn section(&self, index: u16) -> Option<&SectionAt> {
        self.sections.get(usize::from(index))
    }

    /// Which file this is (device, inode), to read a name from it later
    /// without holding it open ([`name_in`]).
    pub fn identity(&self) -> Option<FileIdentity> {
        use std::os::unix::fs::MetadataExt;
        let m = self.file.metadata().ok()?;
        Some(FileIdentity {
            dev: m.dev(),
            ino: m.ino(),
        })
    }

    /// `len` bytes at `offset` of the file.
    pub fn read_at(&self, offset: u64, len: usize) -> Option<Vec<u8>> {
        let mut b = vec![0u8; len];
        self.file.read_exact_at(&mut b, offset).ok()?;
        Some(b)
    }
}

/// A file's device and inode.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FileIdentity {
    dev: u64,
    ino: u64,
}

/// The name at `name_off` of the file at `path`, if that path still names
/// the file `identity` was taken from (a library replaced since, by an
/// upgrade, would give another file's bytes: no name then). The file is
/// opened for the read only: the symbolizer names functions of hundreds of
/// libraries in a long trace, and holding each open would spend the
/// tracer's descriptors.
pub fn name_in(path: &Path, identity: FileIdentity, name_off: u64) -> Option<Vec<u8>> {
    use std::os::unix::fs::MetadataExt;
    let file = File::open(path).ok()?;
    let m = file.metadata().ok()?;
    if (m.dev(), m.ino()) != (identity.dev, identity.ino) {
        return None;
    }
    read_cstr(&file, name_off)
}

/// What the headers say: tables, sections, segments.
struct Layout {
    endian: Endianness,
    tables: Vec<TableAt>,
    sections: Vec<SectionAt>,
    segments: Vec<Segment>,
}

impl Layout {
    fn read<Elf: FileHeader<Endian = Endianness>>(file: &File) -> object::read::Result<Layout> {
        let cache = ReadCache::new(file);
        let header = Elf::parse(&cache)?;
        let endian = header.endian()?;
        let shdrs = header.section_headers(endian, &cache)?;
        let sections = shdrs
            .iter()
            .map(|s| SectionAt {
                address: s.sh_addr(endian).into(),
                file_range: s.file_range(endian),
            })
            .collect();
        let sym_size = std::mem::size_of::<Elf::Sym>() as u64;
        let mut tables = Vec::new();
        for s in shdrs {
            let which = match s.sh_type(endian) {
                elf::SHT_DYNSYM => Table::Dynamic,
                elf::SHT_SYMTAB => Table::Full,
                _ => continue,
            };
            let entsize: u64 = s.sh_entsize(endian).into();
            let Some((offset, size)) = s.file_range(endian) else {
                continue;
            };
            // A table of records of another size is not one we can read.
            if entsize != 0 && entsize != sym_size {
                continue;
            }
            let Some(strings) = shdrs
                .get(s.sh_link(endian) as usize)
                .filter(|l| l.sh_type(endian) == elf::SHT_STRTAB)
                .and_then(|l| l.file_range(endian))
            else {
                continue;
            };
            tables.push(TableAt {
                which,
                offset,
                count: size / sym_size,
                strings,
            });
        }
        let segments = header
            .program_headers(endian, &cache)?
            .iter()
            .filter(|p| p.p_type(endian) == elf::PT_LOAD)
            .map(|p| {
                (
                    p.p_offset(endian).into(),
                    p.p_vaddr(endian).into(),
                    p.p_filesz(endian).into(),
                )
            })
            .collect();
        Ok(Layout {
            endian,
            tables,
            sections,
            segments,
        })
    }
}

/// Names of one string table, read through a window: a walk asks for names
/// at mostly increasing offsets, which one 64 KiB read serves many of.
pub struct NameReader<'a> {
    file: &'a File,
    /// The string table: (file offset, size).
    table: (u64, u64),
    window: Vec<u8>,
    window_at: u64,
}

impl<'a> NameReader<'a> {
    fn new(file: &'a File, table: (u64, u64)) -> NameReader<'a> {
        NameReader {
            file,
            table,
            window: Vec::new(),
            window_at: 0,
        }
    }

    /// The name at `name_off` (a [`RawSymbol::name_off`] of this table),
    /// without its NUL; None when it lies outside the table, is not
    /// terminated within it, or is longer than [`MAX_NAME`].
    pub fn get(&mut self, name_off: u64) -> Option<&[u8]> {
        let (start, size) = self.table;
        let end = start.checked_add(size)?;
        if name_off < start || name_off >= end {
            return None;
        }
        if let Some(len) = self.len_in_window(name_off) {
            let from = (name_off - self.window_at) as usize;
            return Some(&self.window[from..from + len]);
        }
        // Refill at the name: a window of CHUNK, or up to the table's end;
        // a name longer than the window gets a window of its own length.
        let mut want = CHUNK as u64;
        loop {
            let len = want.min(end - name_off) as usize;
            self.window.resize(len, 0);
            self.file.read_exact_at(&mut self.window, name_off).ok()?;
            self.window_at = name_off;
            if let Some(n) = self.len_in_window(name_off) {
                return Some(&self.window[..n]);
            }
            if len as u64 == end - name_off || want as usize > MAX_NAME {
                return None;
            }
            want = (want * 2).min(MAX_NAME as u64 + 1);
        }
    }

    /// The length of the name at `off` if the window holds all of it.
    fn len_in_window(&self, off: u64) -> Option<usize> {
        let from = usize::try_from(off.checked_sub(self.window_at)?).ok()?;
        let rest = self.window.get(from..)?;
        let n = rest.iter().position(|&b| b == 0)?;
        (n <= MAX_NAME).then_some(n)
    }
}

/// A NUL-terminated string at `off` of `file`, read in growing steps (most
/// names are short) and at most [`MAX_NAME`] long.
fn read_cstr(file: &File, off: u64) -> Option<Vec<u8>> {
    let mut out = Vec::new();
    let mut step = 256usize;
    loop {
        let at = off.checked_add(out.len() as u64)?;
        let mut buf = vec![0u8; step];
        let got = file.read_at(&mut buf, at).ok()?;
        if got == 0 {
            return None;
        }
        if let Some(n) = buf[..got].iter().position(|&b| b == 0) {
            out.extend_from_slice(&buf[..n]);
            return (out.len() <= MAX_NAME).then_some(out);
        }
        out.extend_from_slice(&buf[..got]);
        if out.len() > MAX_NAME {
            return None;
        }
        step = (step * 4).min(CHUNK);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use object::{Object, ObjectSegment, ObjectSymbol};

    /// A path of this test process's own under the temporary directory;
    /// the file (and the folder, once the last test's file is gone) is
    /// removed when the test ends, passed or not.
    /// A file in a folder of its own: with one shared folder, a test's
    /// drop could remove the folder between another test's `create_dir_all`
    /// and its write (CI saw that write fail with NotFound).
    fn scratch(name: &str) -> Scratch {
        let dir =
            std::env::temp_dir().join(format!("gs-elf-symbols-{}-{name}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        Scratch(dir.join(name))
    }

    struct Scratch(std::path::PathBuf);

    impl std::ops::Deref for Scratch {
        type Target = Path;
        fn deref(&self) -> &Path {
            &self.0
        }
    }

    impl AsRef<Path> for Scratch {
        fn as_ref(&self) -> &Path {
            &self.0
        }
    }

    impl Drop for Scratch {
        fn drop(&mut self) {
            let _ = std::fs::remove_file(&self.0);
            if let Some(dir) = self.0.parent() {
                let _ = std::fs::remove_dir(dir);
            }
        }
    }

    /// Every symbol of this test binary, as `object` reads it from the whole
    /// file: (table, address, size, name).
    fn by_object(path: &Path) -> Vec<(u64, u64, Vec<u8>)> {
        let data = std::fs::read(path).unwrap();
        let file = object::File::parse(&*data).unwrap();
        file.symbols()
            .chain(file.dynamic_symbols())
            .map(|s| (s.address(), s.size(), s.name_bytes().unwrap().to_vec()))
            .collect()
    }

    #[test]
    fn reads_the_same_symbols_and_segments_as_object_does() {
        let exe = std::env::current_exe().unwrap();
        let elf = ElfSymbols::open(&exe).unwrap();
        let id = elf.identity().unwrap();
        let mut ours = Vec::new();
        elf.visit(&[Table::Full, Table::Dynamic], |s, names| {
            let name = names.get(s.name_off).unwrap().to_vec();
            // The lazy read by offset gives the same bytes.
            assert_eq!(name_in(&exe, id, s.name_off).unwrap(), name);
            ours.push((s.value, s.size, name));
        })
        .unwrap();
        // object skips the null symbol at index 0 of each table.
        ours.retain(|(v, s, n)| !(*v == 0 && *s == 0 && n.is_empty()));
        let mut theirs = by_object(&exe);
        theirs.retain(|(v, s, n)| !(*v == 0 && *s == 0 && n.is_empty()));
        assert!(ours.len() > 1000, "{} symbols", ours.len());
        assert_eq!(ours, theirs);

        let data = std::fs::read(&exe).unwrap();
        let file = object::File::parse(&*data).unwrap();
        let segs: Vec<Segment> = file
            .segments()
            .map(|s| (s.file_range().0, s.address(), s.file_range().1))
            .collect();
        assert_eq!(elf.segments(), &segs[..]);
    }

    #[test]
    fn a_name_is_read_again_only_from_the_same_file() {
        let src = std::env::current_exe().unwrap();
        let p = scratch("same-file.so");
        std::fs::copy(&src, &p).unwrap();
        let elf = ElfSymbols::open(&p).unwrap();
        let mut first = None;
        elf.visit(&[Table::Full], |s, names| {
            if first.is_none() && s.is_function() {
                first = names.get(s.name_off).map(|n| (s.name_off, n.to_vec()));
            }
        })
        .unwrap();
        let (off, name) = first.expect("a function symbol");
        let id = elf.identity().unwrap();
        assert_eq!(name_in(&p, id, off), Some(name));
        // Replaced by rename (as package managers do): another inode, no name.
        let q = scratch("same-file.so.new");
        std::fs::copy(&src, &q).unwrap();
        std::fs::rename(&q, &p).unwrap();
        assert_eq!(name_in(&p, id, off), None);
    }

    #[test]
    fn a_file_that_is_not_elf_is_a_one_line_error() {
        let p = scratch("not-elf.so");
        std::fs::write(&p, b"not an elf file at all").unwrap();
        let e = ElfSymbols::open(&p).err().unwrap();
        assert!(e.contains("not an ELF file") && !e.contains('\n'), "{e}");
        // A truncated ELF header: an error, not a panic.
        std::fs::write(&p, b"\x7fELF\x02\x01\x01").unwrap();
        assert!(ElfSymbols::open(&p).is_err());
        assert!(ElfSymbols::open(&scratch("missing.so")).is_err());
    }

    #[test]
    fn a_truncated_library_is_an_error_not_a_panic() {
        let exe = std::fs::read(std::env::current_exe().unwrap()).unwrap();
        let p = scratch("truncated.so");
        // Cut inside the symbol tables, and just before the section headers.
        let shoff = u64::from_le_bytes(exe[0x28..0x30].try_into().unwrap()) as usize;
        for len in [exe.len() / 2, exe.len() * 9 / 10, shoff, shoff + 64] {
            std::fs::write(&p, &exe[..len]).unwrap();
            match ElfSymbols::open(&p) {
                Err(e) => assert!(!e.contains('\n'), "{e}"),
                Ok(elf) => {
                    // Headers read; tables beyond the end fail the walk.
                    let walked = elf.visit(&[Table::Full, Table::Dynamic], |s, names| {
                        let _ = names.get(s.name_off);
                    });
                    assert!(
                        walked.is_err() || len >= shoff,
                        "cut at {len} of {}",
                        exe.len()
                    );
                }
            }
        }
    }

    #[test]
    fn names_are_bounded_by_their_table() {
        let p = scratch("strings");
        // Two names, then bytes without a NUL up to the end of the "table".
        let mut bytes = b"\0first\0second\0".to_vec();
        bytes.extend(std::iter::repeat_n(b'x', 3 * CHUNK));
        std::fs::write(&p, &bytes).unwrap();
        let f = File::open(&p).unwrap();
        let mut r = NameReader::new(&f, (0, bytes.len() as u64));
        assert_eq!(r.get(1), Some(&b"first"[..]));
        assert_eq!(r.get(7), Some(&b"second"[..]));
        assert_eq!(r.get(0), Some(&b""[..]));
        assert_eq!(r.get(14), None, "unterminated");
        assert_eq!(r.get(bytes.len() as u64), None, "past the table");
        // A table that starts later: offsets before it are refused.
        let mut r = NameReader::new(&f, (7, 7));
        assert_eq!(r.get(1), None);
        assert_eq!(r.get(7), Some(&b"second"[..]));
        assert_eq!(read_cstr(&f, 1), Some(b"first".to_vec()));
        assert_eq!(read_cstr(&f, 14), None, "longer than MAX_NAME");
    }

    #[test]
    fn a_name_across_the_window_is_read_whole_and_a_huge_one_refused() {
        let p = scratch("long-name");
        // "a", then a 30,000-byte name starting near the end of the first
        // window, then one longer than MAX_NAME.
        let mut bytes = b"\0a\0".to_vec();
        bytes.resize(60_000, b'.');
        bytes.push(0);
        let long_at = bytes.len() as u64;
        bytes.extend(std::iter::repeat_n(b'n', 30_000));
        bytes.push(0);
        let huge_at = bytes.len() as u64;
        bytes.extend(std::iter::repeat_n(b'h', MAX_NAME + 100));
        bytes.push(0);
        std::fs::write(&p, &bytes).unwrap();
        let f = File::open(&p).unwrap();
        let mut r = NameReader::new(&f, (0, bytes.len() as u64));
        assert_eq!(r.get(1), Some(&b"a"[..]));
        assert_eq!(r.get(long_at).map(|n| n.len()), Some(30_000));
        assert!(r.get(huge_at).is_none());
        assert_eq!(read_cstr(&f, long_at).map(|n| n.len()), Some(30_000));
        assert!(read_cstr(&f, huge_at).is_none());
    }
}
