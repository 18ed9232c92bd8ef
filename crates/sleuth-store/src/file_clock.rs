//! The clock a trace file stores its times on.
//!
//! SQLite stores an integer in 1, 2, 3, 4, 6 or 8 bytes by its magnitude,
//! and a CLOCK_MONOTONIC time past 2^47 ns (39 hours since boot: any node
//! agent's machine) takes 8 bytes where a smaller one takes 6, in every
//! call and wait row and in their time indexes (4.7 bytes per event of the
//! bench's mix: docs/benchmarks.md, "Times on the trace's clock, and a
//! row's pid computed (round 33)").
//! So the writer stores every time as CLOCK_MONOTONIC minus the run's
//! **clock base** (`meta.clock_base_ns`): the monotonic time an hour before
//! the run started, on a whole second (0 on a machine up less than an
//! hour, where the files keep CLOCK_MONOTONIC itself; `MARGIN_ENV` names
//! another margin). Every file of a
//! `--rotate` run has the same base, so the states the tracer carries from
//! file to file need no conversion; a run's times stay under 2^47 for its
//! first 38 hours.
//!
//! Readers need nothing: every stored time is on the one clock (the
//! session's start and end, rows, samples, notes, carried states), and
//! `session.realtime_offset_ns` is wall-clock minus the file's clock, so
//! wall-clock times are computed as before. Only a time compared with
//! another program's CLOCK_MONOTONIC reading adds the base back.

use crate::types::LibraryInfo;
use sleuth_core::{Event, ProcessInfo};

/// How long before the run's start the file's clock starts: a stored time
/// earlier than that (none is recorded: the tracer stamps what it sees
/// after it started) would read as the base itself.
pub const MARGIN_NS: u64 = 3_600 * 1_000_000_000;

/// The clock base of a run that started at `start_mono_ns`.
pub fn clock_base_for(start_mono_ns: u64) -> u64 {
    clock_base_with_margin(start_mono_ns, MARGIN_NS)
}

/// The clock base `margin_ns` before `start_mono_ns`, on a whole second.
pub fn clock_base_with_margin(start_mono_ns: u64, margin_ns: u64) -> u64 {
    let base = start_mono_ns.saturating_sub(margin_ns);
    base - base % 1_000_000_000
}

/// Names a margin in seconds to use instead of [`MARGIN_NS`]: a machine up
/// less than an hour (the H200 device, a CI runner) then records on a clock
/// with a base too, so that what compares stored times with other clocks
/// is tried there (`scripts/gpu/round33_clock_v6.sh`).
pub const MARGIN_ENV: &str = "GPUSLEUTH_CLOCK_MARGIN_S";

/// A CLOCK_MONOTONIC time on the file's clock.
pub(crate) fn on_file_clock(mono_ns: u64, base: u64) -> u64 {
    mono_ns.saturating_sub(base)
}

/// Moves every time of an event onto the file's clock (durations stay).
pub(crate) fn rebase_event(e: &mut Event, base: u64) {
    let at = |t: &mut u64| *t = on_file_clock(*t, base);
    match e {
        Event::Call(c) => at(&mut c.ts_ns),
        Event::Wait(w) => {
            at(&mut w.off_ns);
            at(&mut w.wake_ns);
            at(&mut w.on_ns);
        }
        Event::Proc(p) => at(&mut p.ts_ns),
        Event::Block(b) => {
            at(&mut b.start_ns);
            at(&mut b.end_ns);
        }
        Event::Nccl(n) => at(&mut n.call.ts_ns),
    }
}

pub(crate) fn rebase_process(p: &mut ProcessInfo, base: u64) {
    for t in [&mut p.start_ns, &mut p.exit_ns].into_iter().flatten() {
        *t = on_file_clock(*t, base);
    }
}

pub(crate) fn rebase_library(l: &mut LibraryInfo, base: u64) {
    if let Some(t) = &mut l.attached_mono_ns {
        *t = on_file_clock(*t, base);
    }
}

/// Why a stored clock base is refused.
pub(crate) const NOT_A_BASE: &str =
    "damaged trace: meta.clock_base_ns is not a number of nanoseconds";

/// The file's clock base as stored: 0 in files written before it existed
/// (their times are CLOCK_MONOTONIC), None when it is not a number of
/// nanoseconds (a damaged file).
fn stored_clock_base(conn: &rusqlite::Connection) -> rusqlite::Result<Option<u64>> {
    Ok(match crate::open::meta_value(conn, "clock_base_ns")? {
        None => Some(0),
        Some(v) => v.parse().ok(),
    })
}

/// [`stored_clock_base`] of the trace at `path`, a damaged value a
/// one-line error naming it.
pub(crate) fn stored_clock_base_of(
    conn: &rusqlite::Connection,
    path: &std::path::Path,
) -> Result<u64, crate::StoreError> {
    use crate::error::SqlContext;
    stored_clock_base(conn)
        .at(path)?
        .ok_or_else(|| crate::StoreError::file(path, NOT_A_BASE))
}

/// Now, on the clock of the file `conn` writes (for the notes the
/// completion adds).
pub(crate) fn now_on_file_clock(conn: &rusqlite::Connection) -> rusqlite::Result<u64> {
    let base = stored_clock_base(conn)?.ok_or_else(|| {
        rusqlite::Error::FromSqlConversionFailure(0, rusqlite::types::Type::Text, NOT_A_BASE.into())
    })?;
    Ok(on_file_clock(crate::writer::monotonic_now_ns(), base))
}

#[cfg(test)]
mod tests {
    use super::*;
    use sleuth_core::{BlockEvent, CallEvent, ProcEvent, ProcKind, WaitEvent};

    #[test]
    fn a_margin_of_one_second_gives_a_base_on_any_machine_up_two() {
        assert_eq!(
            clock_base_with_margin(2_500_000_000, 1_000_000_000),
            1_000_000_000
        );
        assert_eq!(clock_base_with_margin(500_000_000, 1_000_000_000), 0);
    }

    #[test]
    fn the_base_is_an_hour_before_the_start_on_a_whole_second() {
        assert_eq!(clock_base_for(0), 0);
        assert_eq!(clock_base_for(MARGIN_NS), 0);
        assert_eq!(clock_base_for(MARGIN_NS + 1_999_999_999), 1_000_000_000);
        let ten_days = 10 * 86_400 * 1_000_000_000u64;
        let b = clock_base_for(ten_days + 123);
        assert_eq!(b, ten_days - MARGIN_NS);
        // The run's first 38 hours stay under 2^47 ns (6 bytes in SQLite).
        assert!(ten_days + 38 * MARGIN_NS - b < 1 << 47);
    }

    #[test]
    fn every_time_of_an_event_moves_and_no_duration_does() {
        let base = 7_000;
        let mut call = Event::Call(CallEvent {
            ts_ns: 10_000,
            dur_ns: 500,
            runnable_ns: 100,
            blocked_ns: 50,
            ..Default::default()
        });
        rebase_event(&mut call, base);
        let Event::Call(c) = call else { panic!() };
        assert_eq!(
            (c.ts_ns, c.dur_ns, c.runnable_ns, c.blocked_ns),
            (3_000, 500, 100, 50)
        );
        let mut wait = Event::Wait(WaitEvent {
            pid: 1,
            tid: 1,
            kind: sleuth_core::WaitKind::Blocked,
            off_ns: 8_000,
            wake_ns: 9_000,
            on_ns: 9_500,
            prev_state: 1,
            cpu: 0,
            culprits: Vec::new(),
            waker: None,
        });
        rebase_event(&mut wait, base);
        let Event::Wait(w) = wait else { panic!() };
        assert_eq!((w.off_ns, w.wake_ns, w.on_ns), (1_000, 2_000, 2_500));
        let mut proc = Event::Proc(ProcEvent {
            kind: ProcKind::Exit,
            ts_ns: 7_001,
            pid: 1,
            tid: 1,
            ppid: 0,
            exit_code: 0,
            comm: String::new(),
        });
        rebase_event(&mut proc, base);
        assert!(matches!(proc, Event::Proc(ProcEvent { ts_ns: 1, .. })));
        let mut block = Event::Block(BlockEvent {
            op: 64,
            pid: 1,
            tid: 1,
            start_ns: 7_500,
            end_ns: 7_600,
            requested: None,
            block: 0,
            words: [0; sleuth_core::event::BLOCK_WORDS],
            stack_id: None,
        });
        rebase_event(&mut block, base);
        assert!(matches!(
            block,
            Event::Block(BlockEvent {
                start_ns: 500,
                end_ns: 600,
                ..
            })
        ));
        let mut p = ProcessInfo {
            start_ns: Some(9_000),
            exit_ns: Some(9_999),
            ..Default::default()
        };
        rebase_process(&mut p, base);
        assert_eq!((p.start_ns, p.exit_ns), (Some(2_000), Some(2_999)));
    }
}
