//! An export to a stdout that is a regular file (`export > trace.json`)
//! read straight through the reorder buffer, as `-o` reads it (issue 16,
//! round 46).
//!
//! Stdout cannot be written again in general: what reached a pipe or a
//! terminal is gone, so the buffer's reach is proved before the first call
//! is written (the keys pass: 1.5–2 s of the 10M-call export on the
//! development VM). A regular file can be taken back to where the export
//! began, so there the calls go straight through the buffer, and a trace
//! whose calls it cannot place is written again from that point, its reach
//! proved first. Taken back only where nobody else wrote: stdout must end
//! where it stands when the export begins (nothing after it to lose),
//! stderr must not be the same file (a warning would be cut), and before
//! the file is cut back it must hold exactly what the export wrote after
//! its start; otherwise the export fails with one line (the output is
//! partial) and says to use `-o`.

use std::fs::File;
use std::io::{Seek, SeekFrom, Write};
use std::os::fd::AsFd;
use std::os::unix::fs::MetadataExt;

/// Stdout as a file to write the export into straight through the reorder
/// buffer, and where it stands (its end): None unless stdout is a regular
/// file that ends where it stands and stderr is another file.
pub(super) fn regular_stdout() -> Option<(File, u64)> {
    let out = File::from(std::io::stdout().as_fd().try_clone_to_owned().ok()?);
    let start = ends_where_it_stands(&out)?;
    if stderr_is_stdout() {
        return None;
    }
    Some((out, start))
}

/// Whether stderr and stdout are the same file or pipe (device and inode):
/// what is said on stderr would land in the output.
pub(super) fn stderr_is_stdout() -> bool {
    let id = |fd: std::io::Result<std::os::fd::OwnedFd>| {
        let meta = File::from(fd.ok()?).metadata().ok()?;
        Some((meta.dev(), meta.ino()))
    };
    let out = id(std::io::stdout().as_fd().try_clone_to_owned());
    out.is_some() && out == id(std::io::stderr().as_fd().try_clone_to_owned())
}

/// Where `f` stands, when it is a regular file that ends there. A file
/// opened to append (`>>`) writes at its end wherever it stands (a shell
/// leaves it at 0): its end, then.
pub(super) fn ends_where_it_stands(mut f: &File) -> Option<u64> {
    let m = f.metadata().ok()?;
    if !m.file_type().is_file() {
        return None;
    }
    if appends(f) {
        return Some(m.len());
    }
    let at = f.stream_position().ok()?;
    (m.len() == at).then_some(at)
}

/// Whether `f` was opened to append (`O_APPEND`).
fn appends(f: &File) -> bool {
    use std::os::fd::AsRawFd;
    // SAFETY: F_GETFL reads the flags of a descriptor `f` owns and keeps
    // open for the call; it takes no pointer.
    let flags = unsafe { libc::fcntl(f.as_raw_fd(), libc::F_GETFL) };
    flags >= 0 && flags & libc::O_APPEND != 0
}

/// A writer that counts the bytes it passed on.
pub(super) struct Counted<W> {
    inner: W,
    pub(super) bytes: u64,
}

impl<W: Write> Counted<W> {
    pub(super) fn new(inner: W) -> Counted<W> {
        Counted { inner, bytes: 0 }
    }
}

impl<W: Write> Write for Counted<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.bytes += n as u64;
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}

/// Cuts `f` back to `start`, where the export began, after it wrote
/// `written` bytes there; refused when the file is not `start + written`
/// bytes long (someone else wrote to it: cutting would lose their bytes).
pub(super) fn take_back(mut f: &File, start: u64, written: u64) -> anyhow::Result<()> {
    let len = f.metadata()?.len();
    if Some(len) != start.checked_add(written) {
        anyhow::bail!(
            "stdout changed while the export was written ({len} bytes where it wrote up to {}), so it cannot be written again from where it began: export with -o FILE",
            start.saturating_add(written)
        );
    }
    f.set_len(start)?;
    f.seek(SeekFrom::Start(start))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch(tag: &str) -> std::path::PathBuf {
        std::env::temp_dir().join(format!("gpusleuth-stdout-{tag}-{}", std::process::id()))
    }

    #[test]
    fn a_file_is_taken_back_only_where_it_holds_what_was_written() {
        let path = scratch("take-back");
        std::fs::write(&path, b"before ").unwrap();
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .open(&path)
            .unwrap();
        let start = ends_where_it_stands(&f).expect("at its end");
        assert_eq!(start, 7);
        f.write_all(b"partial output").unwrap();
        // Another writer's bytes after the export's: not cut.
        std::fs::OpenOptions::new()
            .append(true)
            .open(&path)
            .unwrap()
            .write_all(b"!")
            .unwrap();
        let e = take_back(&f, start, 14).unwrap_err().to_string();
        assert!(e.contains("stdout changed") && e.contains("-o FILE"), "{e}");
        assert_eq!(std::fs::read(&path).unwrap(), b"before partial output!");
        // As the export left it: cut back, and the next write lands there.
        take_back(&f, start, 15).unwrap();
        f.write_all(b"whole").unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"before whole");
        std::fs::remove_file(&path).unwrap();
    }

    #[test]
    fn only_a_regular_file_that_ends_where_it_stands_is_written_speculatively() {
        let path = scratch("ends");
        std::fs::write(&path, b"0123456789").unwrap();
        let mut f = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
        // At 0 of a 10-byte file: writing would overwrite, taking back would cut.
        assert_eq!(ends_where_it_stands(&f), None);
        f.seek(SeekFrom::End(0)).unwrap();
        assert_eq!(ends_where_it_stands(&f), Some(10));
        std::fs::remove_file(&path).unwrap();
        let null = File::options().write(true).open("/dev/null").unwrap();
        assert_eq!(ends_where_it_stands(&null), None);
    }
}
