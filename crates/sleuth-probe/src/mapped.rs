//! Library files read for their ELF symbols, mapped instead of read.
//!
//! The CUDA, NCCL and PyTorch libraries gpusleuth parses are 100 MB to
//! 1.5 GB; reading one into memory added its size to the tracer's peak RSS
//! (265 MB on the H200). A read-only mapping costs only the pages touched,
//! but a walk over PyTorch's symbol tables touches a lot of them: on the
//! H200 (2026-11-30, `scripts/gpu/overhead_reps.py`, launch loop) the
//! tracer's peak was 186 MB, 122 MB of it file pages. So walks drop the
//! pages behind them as they go ([`MappedFile::releasing`]): on the 2-core
//! VM, indexing a 14 MB symbol + string table raised peak RSS by 19.1 MB
//! before, 9.8 MB after (98,105 functions).

use memmap2::{Mmap, UncheckedAdvice};
use std::path::Path;

/// Symbols walked between two releases of the pages read: 32,768 entries of
/// 24 bytes plus their names (~100 bytes each in C++ libraries) is ~4 MB.
pub const RELEASE_EVERY: usize = 32_768;

/// A library file mapped read-only.
pub struct MappedFile {
    map: Mmap,
}

impl MappedFile {
    pub fn open(path: &Path) -> std::io::Result<MappedFile> {
        let file = std::fs::File::open(path)?;
        // SAFETY: a read-only private mapping of a library file. The bytes
        // could change underneath only if someone rewrote an installed
        // library in place (package managers replace files by rename, which
        // leaves this mapping intact); the parser reads them as untrusted
        // input either way.
        let map = unsafe { Mmap::map(&file)? };
        Ok(MappedFile { map })
    }

    pub fn bytes(&self) -> &[u8] {
        &self.map
    }

    /// `items` (a walk over this file's symbol table) with the pages read so
    /// far dropped every [`RELEASE_EVERY`] items: a walk over a symbol table
    /// of hundreds of MB (PyTorch's) keeps only a few MB of it resident at
    /// any moment instead of all of it until the walk ends (the H200 showed
    /// 122 MB of file pages resident in the tracer at its peak). Pages read
    /// again (string-table entries) come back from the page cache.
    pub fn releasing<'a, I: Iterator + 'a>(
        &'a self,
        items: I,
    ) -> impl Iterator<Item = I::Item> + 'a {
        items.enumerate().map(move |(i, item)| {
            if i > 0 && i % RELEASE_EVERY == 0 {
                self.release();
            }
            item
        })
    }

    /// Drops the pages read so far from this process's resident set; later
    /// reads fault them back in from the page cache.
    pub fn release(&self) {
        // SAFETY: MADV_DONTNEED on a private read-only file mapping that was
        // never written only drops our page-table entries: later reads see
        // the same bytes, from the file.
        let _ = unsafe { self.map.unchecked_advise(UncheckedAdvice::DontNeed) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn maps_a_file_and_reads_it_again_after_release() {
        let exe = std::env::current_exe().unwrap();
        let m = MappedFile::open(&exe).unwrap();
        let head = m.bytes()[..4].to_vec();
        assert_eq!(&head, b"\x7fELF");
        m.release();
        assert_eq!(&m.bytes()[..4], &head[..]);
        assert!(MappedFile::open(Path::new("/nonexistent/lib.so")).is_err());
    }

    #[test]
    fn releasing_yields_every_item_unchanged() {
        let exe = std::env::current_exe().unwrap();
        let m = MappedFile::open(&exe).unwrap();
        let n = 3 * RELEASE_EVERY + 5;
        let bytes = m.bytes();
        // Reads through the mapping across several releases see the same bytes.
        let seen: Vec<u8> = m
            .releasing((0..n).map(|i| bytes[i % bytes.len()]))
            .collect();
        let expected: Vec<u8> = (0..n).map(|i| bytes[i % bytes.len()]).collect();
        assert_eq!(seen, expected);
    }
}
