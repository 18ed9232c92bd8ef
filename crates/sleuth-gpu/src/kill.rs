//! The only code that sends signals. A pidfd pins one process: signals sent
//! through it reach that process or fail with ESRCH, never a recycled pid.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::time::{Duration, Instant};

/// A process pinned by `pidfd_open(2)`.
#[derive(Debug)]
pub struct PidFd {
    fd: OwnedFd,
    pid: u32,
}

impl PidFd {
    /// Pins the process that has `pid` right now. Callers must re-check that it
    /// is the process they meant (start time, uid) after this returns.
    pub fn open(pid: u32) -> io::Result<Self> {
        let raw_pid =
            libc::pid_t::try_from(pid).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
        // SAFETY: pidfd_open takes a pid and flags and returns a new fd or -1; no pointers.
        let ret = unsafe { libc::syscall(libc::SYS_pidfd_open, raw_pid, 0 as libc::c_uint) };
        if ret < 0 {
            return Err(io::Error::last_os_error());
        }
        let raw = i32::try_from(ret).map_err(|_| io::Error::from_raw_os_error(libc::EBADF))?;
        // SAFETY: the kernel just returned this fd to us; nothing else owns it.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        Ok(PidFd { fd, pid })
    }

    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// Sends `sig` to the pinned process (`ESRCH` once it has exited).
    pub fn send(&self, sig: libc::c_int) -> io::Result<()> {
        // SAFETY: the fd is a live pidfd we own; a null siginfo asks the kernel to fill a default one.
        let ret = unsafe {
            libc::syscall(
                libc::SYS_pidfd_send_signal,
                self.fd.as_raw_fd(),
                sig,
                std::ptr::null::<libc::siginfo_t>(),
                0 as libc::c_uint,
            )
        };
        if ret < 0 {
            Err(io::Error::last_os_error())
        } else {
            Ok(())
        }
    }

    /// True when the pinned process has exited (the pidfd polls readable).
    pub fn wait_exit(&self, timeout: Duration) -> io::Result<bool> {
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let ms = libc::c_int::try_from(left.as_millis()).unwrap_or(libc::c_int::MAX);
            let mut pfd = libc::pollfd {
                fd: self.fd.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            };
            // SAFETY: one valid pollfd on the stack, count 1.
            let n = unsafe { libc::poll(&mut pfd, 1, ms) };
            if n > 0 {
                return Ok(true);
            }
            if n == 0 {
                return Ok(false);
            }
            let e = io::Error::last_os_error();
            if e.kind() != io::ErrorKind::Interrupted {
                return Err(e);
            }
        }
    }
}

/// How a target ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Ending {
    /// Exited after SIGTERM within the grace period.
    Terminated,
    /// Needed SIGKILL.
    Killed,
    /// Gone before the first signal (ESRCH through the pidfd).
    AlreadyGone,
    /// Still alive after SIGKILL and the wait (D state, or a zombie's parent not reaping).
    StillAlive,
}

/// SIGTERM, wait `grace`, SIGKILL, wait `kill_wait`.
pub fn terminate(pidfd: &PidFd, grace: Duration, kill_wait: Duration) -> io::Result<Ending> {
    match pidfd.send(libc::SIGTERM) {
        Err(e) if e.raw_os_error() == Some(libc::ESRCH) => return Ok(Ending::AlreadyGone),
        r => r?,
    }
    if pidfd.wait_exit(grace)? {
        return Ok(Ending::Terminated);
    }
    match pidfd.send(libc::SIGKILL) {
        Err(e) if e.raw_os_error() == Some(libc::ESRCH) => return Ok(Ending::Terminated),
        r => r?,
    }
    Ok(if pidfd.wait_exit(kill_wait)? {
        Ending::Killed
    } else {
        Ending::StillAlive
    })
}
