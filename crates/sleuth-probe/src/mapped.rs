//! Library files read for their ELF symbols, mapped instead of read.
//!
//! The CUDA, NCCL and PyTorch libraries gpusleuth parses are 100 MB to
//! 1.5 GB; reading one into memory adds its size to the tracer's peak RSS
//! (on the 2-core VM: +181 MB read vs +56 MB mapped for a 150 MB library;
//! the likely cause of the 265 MB start-up peak seen on the H200,
//! docs/gpu-runs.md). A read-only mapping costs the pages actually touched, and
//! [`MappedFile::release`] drops those too once parsing is done.

use memmap2::{Mmap, UncheckedAdvice};
use std::path::Path;

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
}
