//! The device-bytes timeline of one process, in bounded memory while the
//! ledger replays.
//!
//! A ledger's timeline is thinned to [`super::MAX_TIMELINE_POINTS`] when it
//! is finished ([`super::thin_timeline`]: the first and last points and the
//! highest of each bucket of consecutive points). Kept whole until then, it
//! grew with every change of the device's total: a replay over a run of
//! millions of allocations and frees held tens of MB for points it would
//! thin away (`explain --db DIR`, `memory --at` late in a long trace).
//! [`Timeline`] keeps the first and the latest point exactly and the points
//! between as the highest of groups of `stride` consecutive points; when it
//! holds more than `limit` groups it merges them in pairs and doubles the
//! stride. Until then (timelines up to `limit` + 3 points) nothing is merged, so the
//! finished timeline is exactly `thin_timeline` of every point; above, each
//! point kept is still a real point, the highest of its (coarser) bucket,
//! first and last exact, the peak's point kept (a highest point wins every
//! merge).

use super::{thin_timeline, TimelinePoint};

/// Groups held before a merge: 8 × the finished timeline's points (256 KB).
pub(crate) const HELD_GROUPS: usize = 8 * super::MAX_TIMELINE_POINTS;

/// A timeline being built (see the module's documentation).
#[derive(Debug, Clone)]
pub(crate) struct Timeline {
    first: Option<TimelinePoint>,
    /// The latest point: the last one unless another comes.
    latest: Option<TimelinePoint>,
    /// The highest point of each full group of `stride` points between.
    groups: Vec<TimelinePoint>,
    /// The group being filled, and how many points it has.
    filling: Option<TimelinePoint>,
    in_filling: usize,
    stride: usize,
    /// Groups held before they are merged in pairs (even; merged at `limit` + 2).
    limit: usize,
}

impl Default for Timeline {
    fn default() -> Self {
        Timeline::holding(HELD_GROUPS)
    }
}

/// A [`Timeline`] as stored (`LedgerBuilder::states`).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct TimelineState {
    first: Option<TimelinePoint>,
    latest: Option<TimelinePoint>,
    groups: Vec<TimelinePoint>,
    filling: Option<TimelinePoint>,
    in_filling: u64,
    stride: u64,
}

impl TimelineState {
    /// No point kept (a ledger without history keeps none).
    pub(crate) fn is_empty(&self) -> bool {
        self.first.is_none()
            && self.latest.is_none()
            && self.groups.is_empty()
            && self.filling.is_none()
    }
}

/// The higher of two points, as `thin_timeline` picks within a bucket: the
/// most bytes, then the earliest; of equal points the later one.
pub(super) fn higher(a: TimelinePoint, b: TimelinePoint) -> TimelinePoint {
    let key = |p: &TimelinePoint| (p.live_bytes, std::cmp::Reverse(p.ts_ns));
    if key(&b) >= key(&a) {
        b
    } else {
        a
    }
}

impl Timeline {
    /// A timeline that merges once it holds `limit` groups (rounded up to
    /// an even number, at least 2).
    pub(crate) fn holding(limit: usize) -> Timeline {
        Timeline {
            first: None,
            latest: None,
            groups: Vec::new(),
            filling: None,
            in_filling: 0,
            stride: 1,
            limit: limit.max(2).next_multiple_of(2),
        }
    }

    pub(crate) fn push(&mut self, p: TimelinePoint) {
        if self.first.is_none() {
            self.first = Some(p);
            return;
        }
        if let Some(between) = self.latest.replace(p) {
            self.add_between(between);
        }
    }

    fn add_between(&mut self, p: TimelinePoint) {
        self.filling = Some(self.filling.map_or(p, |f| higher(f, p)));
        self.in_filling += 1;
        if self.in_filling < self.stride {
            return;
        }
        self.groups.extend(self.filling.take());
        self.in_filling = 0;
        // Merged past `limit` (at an even count: every merged group is two).
        if self.groups.len() >= self.limit + 2 {
            let merged: Vec<TimelinePoint> = self
                .groups
                .chunks(2)
                .map(|pair| pair.iter().copied().reduce(higher).unwrap_or(pair[0]))
                .collect();
            self.groups = merged;
            self.stride *= 2;
        }
    }

    /// The timeline, thinned to at most `max` points.
    pub(crate) fn finished(&self, max: usize) -> Vec<TimelinePoint> {
        let mut points: Vec<TimelinePoint> = self.first.into_iter().collect();
        points.extend(self.groups.iter().copied());
        points.extend(self.filling);
        points.extend(self.latest);
        thin_timeline(points, max)
    }

    /// What the timeline holds, to be stored and taken up again ([`Self::from_state`]).
    pub(crate) fn state(&self) -> TimelineState {
        TimelineState {
            first: self.first,
            latest: self.latest,
            groups: self.groups.clone(),
            filling: self.filling,
            in_filling: self.in_filling as u64,
            stride: self.stride as u64,
        }
    }

    /// The timeline [`Self::state`] gave, as the default one would be
    /// after the same points; an error for a state it cannot have had.
    pub(crate) fn from_state(s: TimelineState) -> Result<Timeline, String> {
        let limit = HELD_GROUPS.max(2).next_multiple_of(2);
        let stride_ok = s.stride >= 1 && s.stride.is_power_of_two() && s.stride <= 1 << 40;
        if !stride_ok
            || s.in_filling >= s.stride
            || s.filling.is_some() != (s.in_filling > 0)
            || s.groups.len() > limit + 1
            || (s.first.is_none() && (s.latest.is_some() || !s.groups.is_empty()))
        {
            return Err("a timeline state no replay leaves".into());
        }
        Ok(Timeline {
            first: s.first,
            latest: s.latest,
            groups: s.groups,
            filling: s.filling,
            in_filling: s.in_filling as usize,
            stride: s.stride as usize,
            limit,
        })
    }

    /// Points held now (tests).
    #[cfg(test)]
    fn held(&self) -> usize {
        usize::from(self.first.is_some())
            + self.groups.len()
            + usize::from(self.filling.is_some())
            + usize::from(self.latest.is_some())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A sawtooth with a few spikes: points whose thinning is not trivial.
    fn points(n: u64) -> Vec<TimelinePoint> {
        (0..n)
            .map(|i| TimelinePoint {
                ts_ns: i * 10 + (i % 3),
                live_bytes: (i * 7919) % 1000 + if i % 997 == 13 { 50_000 + i } else { 0 },
            })
            .collect()
    }

    fn built(pts: &[TimelinePoint], limit: usize) -> Timeline {
        let mut t = Timeline::holding(limit);
        for &p in pts {
            t.push(p);
        }
        t
    }

    #[test]
    fn up_to_the_limit_it_is_exactly_the_thinned_timeline() {
        for n in [0, 1, 2, 3, 50, 401, 402, 403] {
            let pts = points(n);
            assert_eq!(
                built(&pts, 400).finished(100),
                thin_timeline(pts.clone(), 100),
                "{n} points"
            );
        }
        // The default holds every point of a timeline up to 8 × the
        // finished size.
        let pts = points(HELD_GROUPS as u64 + 2);
        let t = built(&pts, HELD_GROUPS);
        assert_eq!(
            t.finished(super::super::MAX_TIMELINE_POINTS),
            thin_timeline(pts, super::super::MAX_TIMELINE_POINTS)
        );
    }

    #[test]
    fn beyond_it_memory_is_bounded_and_the_points_that_matter_are_kept() {
        let pts = points(100_000);
        let t = built(&pts, 64);
        assert!(t.held() <= 64 + 4, "{} points held", t.held());
        let out = t.finished(20);
        assert!(out.len() <= 20);
        assert_eq!(out.first(), pts.first());
        assert_eq!(out.last(), pts.last());
        // The peak (most bytes, earliest) is kept, every point is a real one,
        // in time order.
        let peak = pts.iter().copied().reduce(higher);
        assert!(out.contains(&peak.unwrap()), "{out:?}");
        assert!(out.iter().all(|p| pts.contains(p)));
        assert!(out.windows(2).all(|w| w[0].ts_ns <= w[1].ts_ns));
    }
}
