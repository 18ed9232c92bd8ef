//! Counts SIGINT/SIGTERM instead of dying, so a trace stops cleanly and keeps
//! everything recorded.

use std::sync::atomic::{AtomicUsize, Ordering};

static INTERRUPTS: AtomicUsize = AtomicUsize::new(0);
static TERMS: AtomicUsize = AtomicUsize::new(0);

extern "C" fn on_signal(sig: libc::c_int) {
    if sig == libc::SIGTERM {
        TERMS.fetch_add(1, Ordering::SeqCst);
    }
    INTERRUPTS.fetch_add(1, Ordering::SeqCst);
}

pub fn install() {
    for sig in [libc::SIGINT, libc::SIGTERM] {
        // SAFETY: the handler only touches an atomic (async-signal-safe); the
        // sigaction struct is zero-initialised and fully set before use.
        unsafe {
            let mut sa: libc::sigaction = std::mem::zeroed();
            sa.sa_sigaction = on_signal as *const () as usize;
            libc::sigemptyset(&mut sa.sa_mask);
            libc::sigaction(sig, &sa, std::ptr::null_mut());
        }
    }
}

/// How many interrupts arrived so far.
pub fn interrupts() -> usize {
    INTERRUPTS.load(Ordering::SeqCst)
}

/// How many of them were SIGTERM: sent to this process alone (`kill PID`,
/// `systemctl stop`, a container's stop), where SIGINT from a terminal's
/// Ctrl-C reaches its whole process group.
pub fn terms() -> usize {
    TERMS.load(Ordering::SeqCst)
}
