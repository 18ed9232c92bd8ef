//! Calls counted in the kernel (launches under `trace --launches driver`
//! or `all`, the default) have no record and so no time; the tracer
//! samples their running counts a few times a second (`trace` stores them
//! with their time, table `op_count_samples`). The calls of a time window
//! are then known between two bounds: those certainly counted inside it
//! (between the samples inside the window) and those that may have been
//! (between the samples around it). The estimate between the bounds
//! assumes a steady rate between two samples.

/// How often the tracer reads the kernel's counts (`trace`'s loop); it
/// stores a sample when a count changed, so a sample's increase was counted
/// in the period before it (later under load: the next read came later).
pub const SAMPLE_PERIOD_NS: u64 = 200_000_000;

/// A running count of one (process, op), `count` calls since the file
/// began, at `ts_ns` (monotonic).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CountSample {
    pub ts_ns: u64,
    pub pid: u32,
    pub op: u16,
    pub count: u64,
}

/// The counted calls of one (process, op) that fell in a window.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize)]
pub struct WindowCount {
    /// Counted between two samples inside the window: certainly in it.
    pub at_least: u64,
    /// Counted between the samples around the window: possibly in it.
    pub at_most: u64,
    /// Linear between the samples around each edge (`at_least..=at_most`).
    pub estimate: u64,
}

/// The calls in `[since, until)` from a running count's points (time,
/// count), sorted by time, counts never decreasing (the caller adds the
/// file's start at 0 and its end at the stored total). Before the first
/// point the count is the first's, after the last the last's.
pub fn in_window(points: &[(u64, u64)], since: u64, until: u64) -> WindowCount {
    if points.is_empty() || until <= since {
        return WindowCount::default();
    }
    let at_least = floor(points, until).saturating_sub(ceil(points, since));
    let at_most = ceil(points, until).saturating_sub(floor(points, since));
    let estimate = linear(points, until)
        .saturating_sub(linear(points, since))
        .clamp(at_least, at_most.max(at_least));
    WindowCount {
        at_least,
        at_most: at_most.max(at_least),
        estimate,
    }
}

/// The count of the last point at or before `t` (the first's before it).
fn floor(points: &[(u64, u64)], t: u64) -> u64 {
    match points.partition_point(|p| p.0 <= t) {
        0 => points[0].1,
        i => points[i - 1].1,
    }
}

/// The count of the first point at or after `t` (the last's after it).
fn ceil(points: &[(u64, u64)], t: u64) -> u64 {
    let i = points.partition_point(|p| p.0 < t);
    points.get(i).unwrap_or(&points[points.len() - 1]).1
}

/// The count at `t`, linear between the points around it.
fn linear(points: &[(u64, u64)], t: u64) -> u64 {
    let i = points.partition_point(|p| p.0 <= t);
    if i == 0 {
        return points[0].1;
    }
    let (t0, c0) = points[i - 1];
    let Some(&(t1, c1)) = points.get(i) else {
        return c0;
    };
    if t1 <= t0 || c1 <= c0 {
        return c0;
    }
    // u128: counts and times up to 2^62 each.
    let add = u128::from(c1 - c0) * u128::from(t - t0) / u128::from(t1 - t0);
    c0.saturating_add(u64::try_from(add).unwrap_or(u64::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;

    // 100 calls per 100 ns from 0 to 1000, sampled every 200.
    const STEADY: &[(u64, u64)] = &[(0, 0), (200, 200), (400, 400), (600, 600), (1000, 1000)];

    #[test]
    fn a_window_on_sample_times_is_exact() {
        let w = in_window(STEADY, 200, 600);
        assert_eq!((w.at_least, w.estimate, w.at_most), (400, 400, 400));
        // The whole file.
        let w = in_window(STEADY, 0, 1000);
        assert_eq!((w.at_least, w.estimate, w.at_most), (1000, 1000, 1000));
    }

    #[test]
    fn a_window_between_samples_is_bounded_and_interpolated() {
        let w = in_window(STEADY, 250, 550);
        assert_eq!((w.at_least, w.estimate, w.at_most), (0, 300, 400));
        // 700..900 lies between the samples at 600 and 1000.
        let w = in_window(STEADY, 700, 900);
        assert_eq!((w.at_least, w.estimate, w.at_most), (0, 200, 400));
        let w = in_window(STEADY, 100, 700);
        assert_eq!((w.at_least, w.estimate, w.at_most), (400, 600, 1000));
    }

    #[test]
    fn bursts_stay_within_the_bounds() {
        // Nothing until 400, then 1000 calls before 600, nothing after.
        let burst = &[(0, 0), (200, 0), (400, 0), (600, 1000), (800, 1000)];
        let w = in_window(burst, 0, 400);
        assert_eq!((w.at_least, w.estimate, w.at_most), (0, 0, 0));
        let w = in_window(burst, 500, 800);
        assert_eq!((w.at_least, w.estimate, w.at_most), (0, 500, 1000));
        let w = in_window(burst, 400, 600);
        assert_eq!((w.at_least, w.estimate, w.at_most), (1000, 1000, 1000));
    }

    #[test]
    fn outside_the_points_and_degenerate_input() {
        // Before the first and after the last point: nothing counted there.
        assert_eq!(in_window(STEADY, 1000, 5000), WindowCount::default());
        assert_eq!(in_window(&[(100, 5)], 0, 50), WindowCount::default());
        // Empty, reversed.
        assert_eq!(in_window(&[], 0, 10), WindowCount::default());
        assert_eq!(in_window(STEADY, 600, 200), WindowCount::default());
        // A crafted decreasing count never underflows or inverts the bounds.
        let w = in_window(&[(0, 0), (100, 50), (200, 10), (300, u64::MAX)], 50, 250);
        assert!(w.at_least <= w.estimate && w.estimate <= w.at_most, "{w:?}");
        // Times and counts at the largest values: no overflow.
        let big = &[(0, 0), (u64::MAX / 2, u64::MAX / 2), (u64::MAX, u64::MAX)];
        let w = in_window(big, 1, u64::MAX - 1);
        assert!(w.at_least <= w.estimate && w.estimate <= w.at_most, "{w:?}");
    }
}
