//! What the end of a trace says besides its counts: that nothing could be
//! seen, or how much was lost and what to change.

use sleuth_store::NoteLevel;

/// What the final summary must say when the trace saw no CUDA call: a
/// warning when no library was probed at all (nothing could be seen), a hint
/// when libraries were probed but nothing called them. `unprobed` counts the
/// libraries that were found but could not be probed (each warned about).
pub(super) fn coverage_warning(
    libs_probed: usize,
    unprobed: usize,
    calls: u64,
) -> Option<(NoteLevel, String)> {
    if libs_probed == 0 && unprobed > 0 {
        Some((NoteLevel::Warn, format!("no CUDA library was probed, so no CUDA call could be recorded ({unprobed} found but not probed: see the 'not probed' warnings above; --cuda-lib PATH names a library)")))
    } else if libs_probed == 0 {
        Some((NoteLevel::Warn, "no CUDA library was found (standard places, LD_LIBRARY_PATH, the command's RUNPATH and traced processes' memory maps were searched), so no CUDA call could be recorded; --cuda-lib PATH names a library".into()))
    } else if calls == 0 {
        Some((NoteLevel::Info, format!("{libs_probed} CUDA libraries were probed but the traced processes made no call through them (no CUDA use, or a library file not probed: --cuda-lib PATH)")))
    } else {
        None
    }
}

/// What the end of a trace says when it lost events: how many, their share
/// of what the probes produced, and what to change for each cause (the end
/// line's counts alone read the same for a sliver and for most of a trace).
/// `launches_recorded`: every launch was a record (`--launches full`), the
/// first thing to give up in a flood.
pub(super) fn lost_warning(
    losses: &sleuth_probe::session::LossStats,
    (capped, disk_low): (u64, Option<u64>),
    received: u64,
    launches_recorded: bool,
) -> Option<String> {
    let lost = losses.total() + capped;
    if lost == 0 {
        return None;
    }
    let mut causes = Vec::new();
    if losses.ring() > 0 {
        let sustained = if launches_recorded {
            "a sustained flood needs fewer recorded calls: --launches driver counts launches \
             in the kernel"
        } else {
            "a sustained flood outruns the writer whatever its size"
        };
        causes.push(format!(
            "{} when the ring buffer was full (a larger --ring-size absorbs bursts; {sustained})",
            losses.ring()
        ));
    }
    if losses.maps() > 0 {
        causes.push(format!(
            "{} when a kernel map was full (more threads or calls in flight than its maps hold)",
            losses.maps()
        ));
    }
    match (capped, disk_low) {
        (0, _) => {}
        (_, Some(free)) => causes.push(format!(
            "{capped} after the disk holding the trace ran low ({} free; the file was completed in \
             space set aside at its start: free space, or --rotate with --keep, lets a trace go on)",
            sleuth_core::units::fmt_bytes(free)
        )),
        (_, None) => causes.push(format!(
            "{capped} past the size cap (--max-db; --rotate goes on in new files)"
        )),
    }
    Some(format!(
        "{lost} events ({}) were lost, so answers from this trace may be incomplete: {}",
        sleuth_core::stats::lost_share(lost, capped, received),
        causes.join("; ")
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn summary_says_when_nothing_could_be_seen() {
        // Nothing found: no warnings were printed, so none may be referred to.
        let (level, text) = coverage_warning(0, 0, 0).unwrap();
        assert_eq!(level, NoteLevel::Warn);
        assert!(text.contains("no CUDA library was found"), "{text}");
        assert!(!text.contains("warnings above"), "{text}");
        let (level, text) = coverage_warning(0, 1, 0).unwrap();
        assert_eq!(level, NoteLevel::Warn);
        assert!(text.contains("1 found but not probed: see the 'not probed' warnings above"));
        let (level, text) = coverage_warning(2, 0, 0).unwrap();
        assert_eq!(level, NoteLevel::Info);
        assert!(text.contains("2 CUDA libraries were probed"));
        assert!(coverage_warning(2, 0, 6).is_none());
    }

    #[test]
    fn a_trace_that_lost_events_says_how_many_their_share_and_what_to_change() {
        let none = sleuth_probe::LossStats::default();
        assert_eq!(lost_warning(&none, (0, None), 1_000, true), None);
        // 30 lost in the ring and 10 in a map against 60 received: 40% of
        // the 100 the probes produced.
        let ring = sleuth_probe::LossStats {
            ring_full_call: 25,
            ring_full_wait: 5,
            thread_map_full: 10,
            ..Default::default()
        };
        let w = lost_warning(&ring, (0, None), 60, true).expect("a warning");
        assert!(
            w.starts_with("40 events (40% of those the probes produced) were lost"),
            "{w}"
        );
        assert!(
            w.contains("30 when the ring buffer was full") && w.contains("--ring-size"),
            "{w}"
        );
        assert!(w.contains("--launches driver counts launches"), "{w}");
        assert!(w.contains("10 when a kernel map was full"), "{w}");
        // Launches already counted in the kernel: no advice to do so.
        let w = lost_warning(&ring, (0, None), 60, false).expect("a warning");
        assert!(
            !w.contains("--launches") && w.contains("outruns the writer whatever its size"),
            "{w}"
        );
        assert!(!w.contains("size cap"), "{w}");
        // The size cap's losses are among what the writer received.
        let w = lost_warning(&none, (5, None), 1_000, false).expect("a warning");
        assert!(w.starts_with("5 events (under 1% of those"), "{w}");
        assert!(
            w.contains("5 past the size cap (--max-db") && !w.contains("ring"),
            "{w}"
        );
        // Dropped because the disk ran low: said as that, not as the cap.
        let w = lost_warning(&none, (5, Some(3 << 20)), 1_000, false).expect("a warning");
        assert!(
            w.contains("5 after the disk holding the trace ran low (3.0 MiB free")
                && !w.contains("size cap"),
            "{w}"
        );
    }
}
