//! Counts SIGINT/SIGTERM instead of dying, so a trace stops cleanly and keeps
//! everything recorded.

use std::sync::atomic::{AtomicUsize, Ordering};

static INTERRUPTS: AtomicUsize = AtomicUsize::new(0);
static TERMS: AtomicUsize = AtomicUsize::new(0);
/// [`interrupts`] when the launched command was released to run
/// (`usize::MAX`: not yet, or no command).
static AT_COMMAND_START: AtomicUsize = AtomicUsize::new(usize::MAX);

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

/// Notes that the launched command runs from now on: a terminal's Ctrl-C
/// reaches it from here, while one before found nothing to stop.
pub fn mark_command_started() {
    AT_COMMAND_START.store(interrupts(), Ordering::SeqCst);
}

/// The interrupts that came before the launched command ran (all of them
/// while none was marked started): stops it could not have received.
/// Before round 51 every interrupt before the trace loop counted, so a
/// SIGINT sent to the tracer alone just after it was ready (the command
/// running) also sent the command a SIGTERM.
pub fn before_command_started() -> usize {
    match AT_COMMAND_START.load(Ordering::SeqCst) {
        usize::MAX => interrupts(),
        n => n,
    }
}
