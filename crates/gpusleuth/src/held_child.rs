//! Launches a command that waits, after fork and before exec, until the
//! tracer has attached its probes and marked the child as traced. The
//! command's first instruction is therefore already traced.

use anyhow::{bail, Context, Result};
use std::ffi::CString;
use std::os::fd::RawFd;

pub struct HeldChild {
    pub pid: u32,
    release_fd: RawFd,
    error_fd: RawFd,
}

fn pipe_cloexec() -> Result<(RawFd, RawFd)> {
    let mut fds = [0; 2];
    // SAFETY: fds is a valid array of two ints for pipe2 to fill.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        bail!("cannot create a pipe: {}", std::io::Error::last_os_error());
    }
    Ok((fds[0], fds[1]))
}

/// Forks `argv`, holding it before exec until [`HeldChild::release`].
pub fn spawn_held(argv: &[std::ffi::OsString]) -> Result<HeldChild> {
    use std::os::unix::ffi::OsStrExt as _;
    let cargs: Vec<CString> = argv
        .iter()
        .map(|a| CString::new(a.as_bytes()))
        .collect::<Result<_, _>>()
        .context("command arguments contain a NUL byte")?;
    let Some(prog) = cargs.first() else {
        bail!("no command given after --")
    };
    let mut ptrs: Vec<*const libc::c_char> = cargs.iter().map(|c| c.as_ptr()).collect();
    ptrs.push(std::ptr::null());
    let (gate_r, gate_w) = pipe_cloexec()?;
    let (err_r, err_w) = pipe_cloexec()?;

    // SAFETY: after fork the child only calls async-signal-safe functions
    // (close, read, execvp, write, _exit) on data prepared before the fork.
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        bail!("cannot fork: {}", std::io::Error::last_os_error());
    }
    if pid == 0 {
        // SAFETY: child side, async-signal-safe calls only (see above).
        unsafe {
            libc::close(gate_w);
            libc::close(err_r);
            let mut b = 0u8;
            let n = libc::read(gate_r, (&mut b as *mut u8).cast(), 1);
            if n != 1 {
                libc::_exit(127); // the tracer went away before releasing us
            }
            libc::execvp(prog.as_ptr(), ptrs.as_ptr());
            let errno = *libc::__errno_location();
            let bytes = errno.to_ne_bytes();
            libc::write(err_w, bytes.as_ptr().cast(), bytes.len());
            libc::_exit(127);
        }
    }
    // SAFETY: closing the child's ends in the parent; the fds are ours.
    unsafe {
        libc::close(gate_r);
        libc::close(err_w);
    }
    Ok(HeldChild {
        pid: pid as u32,
        release_fd: gate_w,
        error_fd: err_r,
    })
}

impl HeldChild {
    /// Lets the child exec; reports an exec failure (command not found, ...).
    pub fn release(self, command: &str) -> Result<()> {
        let b = 1u8;
        // SAFETY: writing one byte from a local to our pipe end, then closing it.
        unsafe {
            libc::write(self.release_fd, (&b as *const u8).cast(), 1);
            libc::close(self.release_fd);
        }
        let mut buf = [0u8; 4];
        // SAFETY: reading into a local buffer from our pipe end; EOF means exec succeeded
        // (the write end is close-on-exec).
        let n = unsafe { libc::read(self.error_fd, buf.as_mut_ptr().cast(), buf.len()) };
        // SAFETY: closing our fd.
        unsafe { libc::close(self.error_fd) };
        if n == 4 {
            let err = std::io::Error::from_raw_os_error(i32::from_ne_bytes(buf));
            // Reap the failed child so it does not linger as a zombie.
            let mut status = 0;
            // SAFETY: waiting for our own child.
            unsafe { libc::waitpid(self.pid as i32, &mut status, 0) };
            bail!("cannot run '{command}': {err}");
        }
        Ok(())
    }

    /// Kills a child that will never be released (setup failed).
    pub fn abandon(self) {
        // SAFETY: closing our fds makes the child's read return 0 and exit 127; then reap it.
        unsafe {
            libc::close(self.release_fd);
            libc::close(self.error_fd);
            let mut status = 0;
            libc::waitpid(self.pid as i32, &mut status, 0);
        }
    }
}

/// Non-blocking wait: Some(exit code) once the child has ended. A signal
/// death becomes 128 + signal, like a shell reports it.
pub fn try_wait(pid: u32) -> Option<i32> {
    let mut status = 0;
    // SAFETY: waitpid on our own child with WNOHANG writes only `status`.
    let r = unsafe { libc::waitpid(pid as i32, &mut status, libc::WNOHANG) };
    if r != pid as i32 {
        return None;
    }
    if libc::WIFEXITED(status) {
        Some(libc::WEXITSTATUS(status))
    } else if libc::WIFSIGNALED(status) {
        Some(128 + libc::WTERMSIG(status))
    } else {
        None
    }
}
