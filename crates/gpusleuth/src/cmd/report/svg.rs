//! Hand-written SVG for the HTML report: a tiny element builder and axis
//! helpers. The report needs a step line, boxes and stacked bars; a few
//! hundred lines of SVG text are simpler to review than a plotting crate.

use std::fmt::Write as _;

/// Escapes text for HTML and SVG (element content and attribute values).
pub fn esc(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for ch in s.chars() {
        match ch {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            // Controls and the bidirectional marks and overrides, which a
            // browser obeys: a name holding U+202E reversed the report's own
            // text after it, pids and times included (round 55's tester).
            c if crate::term_text::needs_escape(c) => out.push('\u{fffd}'),
            c => out.push(c),
        }
    }
    out
}

/// One SVG document being built.
pub struct Svg {
    width: f64,
    height: f64,
    label: String,
    body: String,
}

impl Svg {
    pub fn new(width: f64, height: f64, label: &str) -> Svg {
        Svg {
            width,
            height,
            label: label.to_string(),
            body: String::new(),
        }
    }

    pub fn line(&mut self, x1: f64, y1: f64, x2: f64, y2: f64, stroke: &str, style: &str) {
        let _ = write!(
            self.body,
            r#"<line x1="{x1:.1}" y1="{y1:.1}" x2="{x2:.1}" y2="{y2:.1}" stroke="{stroke}" {style}/>"#
        );
    }

    /// A rectangle with an optional hover title.
    pub fn rect(&mut self, x: f64, y: f64, w: f64, h: f64, fill: &str, title: Option<&str>) {
        let _ = write!(
            self.body,
            r#"<rect x="{x:.1}" y="{y:.1}" width="{:.1}" height="{:.1}" fill="{fill}">"#,
            w.max(0.0),
            h.max(0.0)
        );
        if let Some(t) = title {
            let _ = write!(self.body, "<title>{}</title>", esc(t));
        }
        self.body.push_str("</rect>");
    }

    pub fn circle(&mut self, x: f64, y: f64, r: f64, fill: &str, title: &str) {
        let _ = write!(
            self.body,
            r#"<circle cx="{x:.1}" cy="{y:.1}" r="{r}" fill="{fill}"><title>{}</title></circle>"#,
            esc(title)
        );
    }

    /// Text; `anchor` is start, middle or end.
    pub fn text(&mut self, x: f64, y: f64, s: &str, anchor: &str, class: &str) {
        let _ = write!(
            self.body,
            r#"<text x="{x:.1}" y="{y:.1}" text-anchor="{anchor}" class="{class}">{}</text>"#,
            esc(s)
        );
    }

    pub fn path(&mut self, d: &str, stroke: &str, fill: &str, width: f64) {
        let _ = write!(
            self.body,
            r#"<path d="{d}" stroke="{stroke}" fill="{fill}" stroke-width="{width}"/>"#
        );
    }

    /// A time axis at pixel row `y`: the baseline across `x`'s range, and
    /// about 8 ticks labelled as durations since the start (`x` maps seconds).
    pub fn time_axis(&mut self, x: &Linear, span_s: f64, y: f64) {
        for v in nice_ticks(span_s, 8) {
            let xx = x.at(v);
            self.line(xx, y, xx, y + 4.0, "#999", "");
            self.text(
                xx,
                y + 16.0,
                &crate::output::fmt_ns((v * 1e9) as u64),
                "middle",
                "",
            );
        }
        self.line(x.r0, y, x.r1, y, "#999", "");
    }

    pub fn finish(self) -> String {
        format!(
            r#"<svg xmlns="http://www.w3.org/2000/svg" class="chart" viewBox="0 0 {w} {h}" width="{w}" height="{h}" role="img" aria-label="{l}">{b}</svg>"#,
            w = self.width,
            h = self.height,
            l = esc(&self.label),
            b = self.body
        )
    }
}

/// Maps a value range onto a pixel range.
#[derive(Clone, Copy)]
pub struct Linear {
    pub d0: f64,
    pub d1: f64,
    pub r0: f64,
    pub r1: f64,
}

impl Linear {
    /// Maps `domain` (values) onto `range` (pixels).
    pub fn new(domain: (f64, f64), range: (f64, f64)) -> Linear {
        let ((d0, d1), (r0, r1)) = (domain, range);
        Linear { d0, d1, r0, r1 }
    }
    pub fn at(&self, v: f64) -> f64 {
        if self.d1 <= self.d0 {
            return self.r0;
        }
        self.r0 + (v - self.d0) / (self.d1 - self.d0) * (self.r1 - self.r0)
    }
}

/// The x scale of a chart on the trace's time axis: seconds since `origin`
/// from `left` to `WIDTH - right`; returned with the axis length in seconds.
pub fn time_scale(origin: u64, end: u64, left: f64, right: f64) -> (Linear, f64) {
    let span_s = (end.saturating_sub(origin) as f64 / 1e9).max(1e-6);
    let x = Linear::new((0.0, span_s), (left, super::WIDTH - right));
    (x, span_s)
}

/// The window a report's call sections are narrowed to, drawn on its time
/// charts: monotonic ns `[since, until)` (`until` past the end: to the end).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Band {
    pub since: u64,
    pub until: u64,
}

/// Fill of the window's band (behind the data).
const BAND: &str = "#fdf1c7";

impl Svg {
    /// Shades `band` (if any) on a chart whose x scale is `x` (seconds since
    /// `origin`), from `top` down to `bottom`, clipped to the plot.
    pub fn band(&mut self, band: Option<Band>, x: &Linear, origin: u64, top: f64, bottom: f64) {
        let Some(b) = band else { return };
        let at = |ns: u64| x.at(ns.saturating_sub(origin) as f64 / 1e9);
        let (lo, hi) = (x.r0.min(x.r1), x.r0.max(x.r1));
        let x0 = at(b.since).clamp(lo, hi);
        let x1 = at(b.until).clamp(lo, hi);
        if x1 > x0 {
            self.rect(
                x0,
                top,
                x1 - x0,
                bottom - top,
                BAND,
                Some("the report's window"),
            );
        }
    }
}

/// A y scale from 0 at `base` (the plot's bottom edge) up to `max` at `top`.
pub fn value_scale(max: f64, base: f64, top: f64) -> Linear {
    Linear::new((0.0, max), (base, top))
}

/// Log10 scale (values clamped to the domain, which must be > 0): the
/// [`Linear`] mapping of the domain's logarithms.
#[derive(Clone, Copy)]
pub struct Log(Linear);

impl Log {
    /// Maps `domain` (values, > 0) onto `range` (pixels) on a log10 scale.
    pub fn new(domain: (f64, f64), range: (f64, f64)) -> Log {
        Log(Linear::new(domain, range))
    }
    pub fn at(&self, v: f64) -> f64 {
        let l = self.0;
        let (a, b) = (l.d0.log10(), l.d1.log10());
        if b <= a {
            return l.r0;
        }
        Linear::new((a, b), (l.r0, l.r1)).at(v.clamp(l.d0, l.d1).log10())
    }
}

/// About `n` round tick values covering `[0, max]` (steps of 1, 2 or 5 × 10^k).
pub fn nice_ticks(max: f64, n: usize) -> Vec<f64> {
    if max <= 0.0 || !max.is_finite() {
        return vec![0.0];
    }
    let raw = max / n.max(1) as f64;
    let mag = 10f64.powf(raw.log10().floor());
    let step = [1.0, 2.0, 5.0, 10.0]
        .iter()
        .map(|m| m * mag)
        .find(|s| *s >= raw)
        .unwrap_or(10.0 * mag);
    let mut out = Vec::new();
    let mut v = 0.0;
    while v <= max * (1.0 + 1e-9) {
        out.push(v);
        v += step;
    }
    out
}

/// Powers of ten within `[lo, hi]`, for a log axis.
pub fn decades(lo: f64, hi: f64) -> Vec<f64> {
    let mut out = Vec::new();
    if lo <= 0.0 || hi < lo {
        return out;
    }
    let mut v = 10f64.powf(lo.log10().floor());
    while v <= hi * (1.0 + 1e-9) {
        if v >= lo * (1.0 - 1e-9) {
            out.push(v);
        }
        v *= 10.0;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escapes_markup() {
        assert_eq!(
            esc("<a href=\"x\">&'"),
            "&lt;a href=&quot;x&quot;&gt;&amp;&#39;"
        );
        // Controls and bidirectional overrides never reach the browser.
        assert_eq!(
            esc("a\u{202e}(pid 26113)\u{2066}\u{1b}[2J\u{61c}\nb"),
            "a\u{fffd}(pid 26113)\u{fffd}\u{fffd}[2J\u{fffd}\nb"
        );
    }

    #[test]
    fn ticks_are_round() {
        assert_eq!(nice_ticks(10.0, 5), vec![0.0, 2.0, 4.0, 6.0, 8.0, 10.0]);
        assert_eq!(nice_ticks(0.0, 5), vec![0.0]);
        assert_eq!(decades(3.0, 2000.0), vec![10.0, 100.0, 1000.0]);
    }

    #[test]
    fn scales_map_ends() {
        let l = Linear::new((0.0, 10.0), (100.0, 0.0));
        assert_eq!(l.at(10.0), 0.0);
        let g = Log::new((1.0, 100.0), (0.0, 200.0));
        assert_eq!(g.at(10.0), 100.0);
    }
}
