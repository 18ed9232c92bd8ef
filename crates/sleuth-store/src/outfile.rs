//! Writing output files with the same care as traces: never over an input,
//! never over an existing file unless asked, never half-written.
//!
//! The content goes to a private temporary file beside the destination
//! (mode 0600, created exclusively, so a planted symlink is never followed)
//! and is renamed into place only when complete. Without `replace` the
//! rename refuses an existing destination (`RENAME_NOREPLACE`); with it, an
//! existing regular file is replaced. Anything else at the destination (a
//! device such as `/dev/null`, a pipe, a socket, a directory, a symbolic
//! link) is refused even then: a rename over it would put a file in its
//! place, and as root `-o /dev/null --force` replaced the system's
//! `/dev/null` (round 50).

use crate::error::StoreError;
use std::ffi::CString;
use std::io::Write as _;
use std::os::unix::ffi::OsStrExt as _;
use std::os::unix::fs::{MetadataExt as _, OpenOptionsExt as _};
use std::path::{Path, PathBuf};

/// Suffixes SQLite may leave beside a database file.
pub const SQLITE_SIDE_FILES: [&str; 3] = ["-wal", "-shm", "-journal"];

/// What to tell a user whose output path exists: how to replace it, if
/// the command can ("--force replaces it"), else nothing.
pub type Hint<'a> = Option<&'a str>;

pub(crate) fn exists_error(dst: &Path, hint: Hint) -> StoreError {
    StoreError::file(
        dst,
        match hint {
            Some(h) => format!("already exists (refusing to overwrite it; {h})"),
            None => "already exists (refusing to overwrite it)".to_string(),
        },
    )
}

/// What is at `path`, when it is something an output never replaces
/// (anything but a regular file); `None` when nothing or a regular file is
/// there.
fn not_replaceable(path: &Path) -> Option<&'static str> {
    use std::os::unix::fs::FileTypeExt as _;
    let t = std::fs::symlink_metadata(path).ok()?.file_type();
    Some(if t.is_file() {
        return None;
    } else if t.is_symlink() {
        "a symbolic link"
    } else if t.is_dir() {
        "a directory"
    } else if t.is_char_device() {
        "a character device"
    } else if t.is_block_device() {
        "a block device"
    } else if t.is_fifo() {
        "a named pipe"
    } else if t.is_socket() {
        "a socket"
    } else {
        "not a regular file"
    })
}

/// Refuses `path` when something other than a regular file is there: an
/// output (a trace, a report, an export) is written to a new file renamed
/// into place, so it would put a file where a device, a pipe or a link was.
pub fn ensure_replaceable(path: &Path) -> Result<(), StoreError> {
    match not_replaceable(path) {
        None => Ok(()),
        Some(what) => Err(StoreError::file(
            path,
            format!(
                "is {what}, not a regular file (refusing to write an output there, \
                 --force or not: name a regular file)"
            ),
        )),
    }
}

/// Refuses `dst` when it is one of `inputs` (the same file, however named),
/// when it is anything but a regular file ([`ensure_replaceable`]), or when
/// it exists and `replace` is false.
pub fn check_output(
    dst: &Path,
    inputs: &[&Path],
    replace: bool,
    hint: Hint,
) -> Result<(), StoreError> {
    let Ok(meta) = std::fs::metadata(dst) else {
        // Nothing there, or a dangling link (refused as a link).
        return ensure_replaceable(dst);
    };
    for input in inputs {
        if is_file(input, &meta) {
            return Err(StoreError::file(
                dst,
                format!(
                    "is the input {} (refusing to overwrite an input)",
                    input.display()
                ),
            ));
        }
    }
    ensure_replaceable(dst)?;
    if !replace {
        return Err(exists_error(dst, hint));
    }
    Ok(())
}

/// Whether `path` (followed, as a reader opens it) is the file `meta` describes.
fn is_file(path: &Path, meta: &std::fs::Metadata) -> bool {
    std::fs::metadata(path).is_ok_and(|m| (m.dev(), m.ino()) == (meta.dev(), meta.ino()))
}

/// Refuses to go on when stdout is a file the command reads: one of
/// `inputs` however named, a SQLite side file of one, or where an input is
/// a directory (a run, a directory of runs or of traces) a `.db` file in it
/// or in a directory under it, or such a file's side file. The shell opens
/// stdout before the command runs, so `-o`'s refusal of its input
/// ([`check_output`]) never saw it: `export --db t.db >> t.db` appended the
/// export to the trace, and `stats --db t.db 1<> t.db` wrote over its
/// header, the trace no longer a database, both with exit 0 (round 51).
/// Called before anything is read or written; a stdout that is not a
/// regular file (a terminal, a pipe, `/dev/null`) is never an input.
pub fn refuse_stdout_input(inputs: &[&Path]) -> Result<(), StoreError> {
    use std::os::fd::AsFd as _;
    match input_behind(std::io::stdout().as_fd(), inputs) {
        None => Ok(()),
        Some(path) => Err(StoreError::file(
            &path,
            "is also this command's stdout (refusing to write the output into a trace it \
             reads: redirect stdout to another file)",
        )),
    }
}

/// Which of the files `inputs` name ([`refuse_stdout_input`]) the open
/// file `fd` is, if any: stdout, or stderr (`stats --db t.db 2>> t.db`
/// would append its notes and errors to the trace).
pub fn input_behind(fd: std::os::fd::BorrowedFd, inputs: &[&Path]) -> Option<PathBuf> {
    let fd = fd.try_clone_to_owned().ok()?;
    let meta = std::fs::File::from(fd).metadata().ok()?;
    input_at(inputs, &meta)
}

/// Which of the files `inputs` name ([`refuse_stdout_input`]) is the
/// regular file `out` describes.
fn input_at(inputs: &[&Path], out: &std::fs::Metadata) -> Option<PathBuf> {
    if !out.file_type().is_file() {
        return None;
    }
    // A database and its side files: a `-wal` holds committed calls a
    // killed tracer's file has not folded in yet.
    let with_side_files = |path: &Path| {
        std::iter::once(path.to_path_buf())
            .chain(SQLITE_SIDE_FILES.iter().map(|s| {
                let mut p = path.as_os_str().to_owned();
                p.push(s);
                PathBuf::from(p)
            }))
            .find(|p| is_file(p, out))
    };
    // A directory of runs (`finish --db DIR`) holds runs: one level down.
    fn in_dir(dir: &Path, depth: u32, found: &dyn Fn(&Path) -> Option<PathBuf>) -> Option<PathBuf> {
        for entry in std::fs::read_dir(dir).ok()?.flatten() {
            let path = entry.path();
            if entry.file_type().is_ok_and(|t| t.is_dir()) {
                if depth > 0 {
                    if let Some(hit) = in_dir(&path, depth - 1, found) {
                        return Some(hit);
                    }
                }
            } else if path.extension().is_some_and(|e| e == "db") {
                if let Some(hit) = found(&path) {
                    return Some(hit);
                }
            }
        }
        None
    }
    inputs
        .iter()
        .find_map(|input| match std::fs::metadata(input) {
            Ok(m) if m.is_dir() => in_dir(input, 1, &with_side_files),
            _ => with_side_files(input),
        })
}

/// A private temporary path beside `dst` (same directory, so the final
/// rename is atomic), not existing yet.
pub fn temp_path_for(dst: &Path) -> PathBuf {
    use std::sync::atomic::{AtomicU32, Ordering};
    static N: AtomicU32 = AtomicU32::new(0);
    let name = dst
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "output".into());
    let tmp = format!(
        ".{name}.partial-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    );
    match dst.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir.join(tmp),
        _ => PathBuf::from(tmp),
    }
}

/// Writes `bytes` to `dst` atomically: mode 0600, never over one of
/// `inputs`, never over an existing file unless `replace`.
pub fn write_atomic(
    dst: &Path,
    bytes: &[u8],
    inputs: &[&Path],
    replace: bool,
    hint: Hint,
) -> Result<(), StoreError> {
    check_output(dst, inputs, replace, hint)?;
    let tmp = temp_path_for(dst);
    let result = (|| {
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW)
            .open(&tmp)
            .map_err(|e| StoreError::io(dst, e))?;
        f.write_all(bytes)
            .and_then(|()| f.sync_all())
            .map_err(|e| StoreError::io(dst, e))?;
        drop(f);
        publish(&tmp, dst, replace, hint)
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result
}

/// Renames a complete file `tmp` to `dst`. Without `replace`, an existing
/// `dst` (even one created since [`check_output`]) is kept and this fails.
pub fn publish(tmp: &Path, dst: &Path, replace: bool, hint: Hint) -> Result<(), StoreError> {
    if replace {
        // Checked again at the rename: the output may have taken long.
        ensure_replaceable(dst)?;
        return std::fs::rename(tmp, dst).map_err(|e| StoreError::io(dst, e));
    }
    let cstr = |p: &Path| {
        CString::new(p.as_os_str().as_bytes())
            .map_err(|_| StoreError::file(p, "path contains a NUL byte"))
    };
    let (from, to) = (cstr(tmp)?, cstr(dst)?);
    // SAFETY: both pointers are valid NUL-terminated paths that live across
    // the call; AT_FDCWD resolves them like open(2) would.
    let r = unsafe {
        libc::renameat2(
            libc::AT_FDCWD,
            from.as_ptr(),
            libc::AT_FDCWD,
            to.as_ptr(),
            libc::RENAME_NOREPLACE,
        )
    };
    if r == 0 {
        return Ok(());
    }
    let err = std::io::Error::last_os_error();
    match err.raw_os_error() {
        Some(libc::EEXIST) => Err(exists_error(dst, hint)),
        // Filesystems without RENAME_NOREPLACE: a hard link also refuses an
        // existing name, then the temporary name goes.
        Some(libc::EINVAL) | Some(libc::ENOSYS) => {
            std::fs::hard_link(tmp, dst).map_err(|e| match e.kind() {
                std::io::ErrorKind::AlreadyExists => exists_error(dst, hint),
                _ => StoreError::io(dst, e),
            })?;
            std::fs::remove_file(tmp).map_err(|e| StoreError::io(tmp, e))
        }
        _ => Err(StoreError::io(dst, err)),
    }
}

/// Removes a database file and the side files SQLite may have left beside it.
pub fn remove_database(path: &Path) {
    let _ = std::fs::remove_file(path);
    for suffix in SQLITE_SIDE_FILES {
        let mut p = path.as_os_str().to_owned();
        p.push(suffix);
        let _ = std::fs::remove_file(PathBuf::from(p));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt as _;

    fn dir(tag: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("sleuth-outfile-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn new_files_are_private_and_complete() {
        let d = dir("new");
        let out = d.join("r.html");
        write_atomic(&out, b"<html>", &[], false, None).unwrap();
        assert_eq!(std::fs::read(&out).unwrap(), b"<html>");
        let mode = std::fs::metadata(&out).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        // Only the output is left: no temporary file.
        assert_eq!(std::fs::read_dir(&d).unwrap().count(), 1);
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn existing_files_need_replace_and_inputs_never_go() {
        let d = dir("exist");
        let out = d.join("r.html");
        std::fs::write(&out, b"old").unwrap();
        let e = write_atomic(&out, b"new", &[], false, Some("--force replaces it"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("already exists") && e.contains("--force"), "{e}");
        assert_eq!(std::fs::read(&out).unwrap(), b"old");
        write_atomic(&out, b"new", &[], true, None).unwrap();
        assert_eq!(std::fs::read(&out).unwrap(), b"new");

        let input = d.join("t.db");
        std::fs::write(&input, b"trace").unwrap();
        let alias = d.join("alias.db");
        std::os::unix::fs::symlink(&input, &alias).unwrap();
        for dst in [&input, &alias] {
            let e = write_atomic(dst, b"x", &[&input], true, None)
                .unwrap_err()
                .to_string();
            assert!(e.contains("is the input"), "{e}");
        }
        assert_eq!(std::fs::read(&input).unwrap(), b"trace");
        assert_eq!(std::fs::read_dir(&d).unwrap().count(), 3);
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn a_stdout_is_refused_where_it_is_a_file_the_command_reads() {
        let d = dir("stdout");
        let trace = d.join("t.db");
        std::fs::write(&trace, b"trace").unwrap();
        let wal = d.join("t.db-wal");
        std::fs::write(&wal, b"wal").unwrap();
        let run = d.join("runs").join("run1");
        std::fs::create_dir_all(&run).unwrap();
        let part = run.join("part-000001.db");
        std::fs::write(&part, b"part").unwrap();
        let other = run.join("export.json");
        std::fs::write(&other, b"").unwrap();
        let alias = d.join("alias.db");
        std::os::unix::fs::symlink(&trace, &alias).unwrap();
        let meta = |p: &Path| std::fs::File::open(p).unwrap().metadata().unwrap();
        // The trace however named, and its side file.
        assert_eq!(input_at(&[&alias], &meta(&trace)), Some(alias.clone()));
        assert_eq!(input_at(&[&trace], &meta(&wal)), Some(wal.clone()));
        // A run's file, from the run or from a directory of runs.
        assert_eq!(input_at(&[&run], &meta(&part)), Some(part.clone()));
        let runs = d.join("runs");
        assert_eq!(input_at(&[&trace, &runs], &meta(&part)), Some(part.clone()));
        // A file the command does not read: written as before.
        assert_eq!(input_at(&[&trace, &run], &meta(&other)), None);
        assert_eq!(input_at(&[&trace], &meta(Path::new("/dev/null"))), None);
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn a_symlink_at_the_destination_is_neither_followed_nor_replaced() {
        let d = dir("link");
        let victim = d.join("victim");
        std::fs::write(&victim, b"keep").unwrap();
        let out = d.join("out.json");
        std::os::unix::fs::symlink(&victim, &out).unwrap();
        let dangling = d.join("dangling.json");
        std::os::unix::fs::symlink(d.join("nothing"), &dangling).unwrap();
        for dst in [&out, &dangling] {
            for replace in [false, true] {
                let e = write_atomic(dst, b"x", &[], replace, Some("--force replaces it"))
                    .unwrap_err()
                    .to_string();
                assert!(
                    e.contains("is a symbolic link") && !e.contains("--force replaces"),
                    "{e}"
                );
                assert!(std::fs::symlink_metadata(dst)
                    .unwrap()
                    .file_type()
                    .is_symlink());
            }
        }
        assert_eq!(std::fs::read(&victim).unwrap(), b"keep");
        assert!(!d.join("nothing").exists());
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn devices_pipes_and_directories_are_never_replaced() {
        use std::os::unix::fs::FileTypeExt as _;
        let d = dir("special");
        let fifo = d.join("pipe");
        let c = CString::new(fifo.as_os_str().as_bytes()).unwrap();
        // SAFETY: a valid NUL-terminated path that lives across the call.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        let sub = d.join("sub");
        std::fs::create_dir(&sub).unwrap();
        // /dev/null is what a user timing an export names (as root it was
        // replaced by a file): only checked, never written, here.
        let null = Path::new("/dev/null");
        for (dst, what) in [
            (&*fifo, "a named pipe"),
            (&*sub, "a directory"),
            (null, "a character device"),
        ] {
            assert!(check_output(dst, &[], true, None)
                .unwrap_err()
                .to_string()
                .contains(what));
        }
        for replace in [false, true] {
            let e = write_atomic(&fifo, b"x", &[], replace, None)
                .unwrap_err()
                .to_string();
            assert!(e.contains("is a named pipe, not a regular file"), "{e}");
        }
        let tmp = d.join("tmp");
        std::fs::write(&tmp, b"new").unwrap();
        assert!(publish(&tmp, &fifo, true, None).is_err());
        assert!(std::fs::symlink_metadata(&fifo)
            .unwrap()
            .file_type()
            .is_fifo());
        assert!(std::fs::metadata(null)
            .unwrap()
            .file_type()
            .is_char_device());
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn publish_never_replaces_an_existing_file() {
        let d = dir("publish");
        let (tmp, dst) = (d.join("tmp"), d.join("dst"));
        std::fs::write(&tmp, b"new").unwrap();
        std::fs::write(&dst, b"old").unwrap();
        assert!(publish(&tmp, &dst, false, None).is_err());
        assert_eq!(std::fs::read(&dst).unwrap(), b"old");
        std::fs::remove_file(&dst).unwrap();
        publish(&tmp, &dst, false, None).unwrap();
        assert_eq!(std::fs::read(&dst).unwrap(), b"new");
        assert!(!tmp.exists());
        std::fs::remove_dir_all(&d).unwrap();
    }
}
