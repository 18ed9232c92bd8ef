//! Fitting a live frame to the terminal: every line cut to its width and
//! the frame kept within its rows. The redraw moves the cursor up by the
//! lines it drew; a line wider than the terminal takes several rows and a
//! frame taller than it scrolls its top away, and then the move up no
//! longer reaches the frame's start: each frame was left in the scrollback
//! under the next (an 80x24 terminal: op rows of 83 columns, findings of
//! up to 142).

use std::collections::BTreeSet;

/// A terminal's size in character cells.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Size {
    pub cols: usize,
    pub rows: usize,
}

/// What a frame fits when the terminal does not say its size.
pub const ASSUMED: Size = Size { cols: 80, rows: 24 };

/// The size of the terminal on `fd` (TIOCGWINSZ), read at each frame so a
/// resize is followed; None when `fd` is no terminal or says 0.
pub fn size_of(fd: libc::c_int) -> Option<Size> {
    let mut ws = libc::winsize {
        ws_row: 0,
        ws_col: 0,
        ws_xpixel: 0,
        ws_ypixel: 0,
    };
    // SAFETY: TIOCGWINSZ writes one `winsize` into the struct passed.
    let rc = unsafe { libc::ioctl(fd, libc::TIOCGWINSZ, &mut ws) };
    (rc == 0 && ws.ws_col > 0 && ws.ws_row > 0).then_some(Size {
        cols: usize::from(ws.ws_col),
        rows: usize::from(ws.ws_row),
    })
}

/// The cells a character takes: 2 for the wide East Asian ranges and
/// emoji, 0 for combining marks, else 1 (no width table is a dependency;
/// these are the ranges process names and paths bring).
fn columns(c: char) -> usize {
    match u32::from(c) {
        0x0300..=0x036F | 0x200B..=0x200F | 0xFE00..=0xFE0F => 0,
        0x1100..=0x115F
        | 0x2E80..=0xA4CF
        | 0xAC00..=0xD7A3
        | 0xF900..=0xFAFF
        | 0xFE30..=0xFE4F
        | 0xFF00..=0xFF60
        | 0xFFE0..=0xFFE6
        | 0x1F300..=0x1F64F
        | 0x1F900..=0x1F9FF
        | 0x20000..=0x3FFFD => 2,
        _ => 1,
    }
}

/// The cells `s` takes.
pub fn width(s: &str) -> usize {
    s.chars().map(columns).sum()
}

/// `s` within `max` cells: whole characters, ending in "…" when cut.
pub fn cut(s: &str, max: usize) -> String {
    if width(s) <= max {
        return s.to_string();
    }
    let mut out = String::new();
    let mut used = 0;
    for c in s.chars() {
        let w = columns(c);
        // One cell stays for the ellipsis.
        if used + w + 1 > max {
            break;
        }
        out.push(c);
        used += w;
    }
    if max > 0 {
        out.push('…');
    }
    out
}

/// A line of a frame and how much it matters: rank 0 is dropped last.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Line {
    pub text: String,
    pub rank: u8,
}

impl Line {
    /// A line of `text` with its newlines, returns and tabs made spaces:
    /// one row, as the redraw counts it (a process named with newlines
    /// made a finding 9 rows long, and each redraw left 8 stale rows
    /// behind: round 55's tester).
    pub fn new(rank: u8, text: impl Into<String>) -> Line {
        let mut text = text.into();
        if text.contains(['\n', '\r', '\t']) {
            text = text.replace(['\n', '\r', '\t'], " ");
        }
        Line { text, rank }
    }
}

/// The lines of `frame` that fit a terminal of `size`, each one row: cut
/// to one cell less than the width (a line filling the last column wraps
/// early on some terminals), at most `rows - 1` of them (the cursor's row
/// after the frame stays on screen, so the next frame's move up reaches its
/// start). When some must go, the least important do (highest rank, the
/// latest first), the order kept, and the last row says how many went.
pub fn fit(frame: &[Line], size: Size) -> Vec<String> {
    let cols = size.cols.saturating_sub(1).max(1);
    let max = size.rows.saturating_sub(1).max(1);
    if frame.len() <= max {
        return frame.iter().map(|l| cut(&l.text, cols)).collect();
    }
    let note = max >= 2;
    let keep = if note { max - 1 } else { max };
    let mut order: Vec<usize> = (0..frame.len()).collect();
    order.sort_by_key(|&i| (frame[i].rank, i));
    let kept: BTreeSet<usize> = order.into_iter().take(keep).collect();
    let mut out: Vec<String> = kept.iter().map(|&i| cut(&frame[i].text, cols)).collect();
    if note {
        let gone = frame.len() - keep;
        out.push(cut(
            &format!("… {gone} more (a taller terminal shows them)"),
            cols,
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_line_is_cut_to_the_width_by_whole_characters() {
        assert_eq!(cut("short", 10), "short");
        assert_eq!(cut("exactly10!", 10), "exactly10!");
        assert_eq!(cut("one too long", 11), "one too lo…");
        assert_eq!(width(&cut(&"x".repeat(142), 79)), 79);
        // Two-byte and three-byte characters are never split.
        let cut_e = cut("ééééé", 4);
        assert_eq!(cut_e, "ééé…");
        assert_eq!(cut("→→→→→", 3), "→→…");
        // Wide characters take two cells: never past the width.
        assert_eq!(cut("名前名前", 5), "名前…");
        assert_eq!(width("名前…"), 5);
        assert_eq!(cut("名前名前", 4), "名…");
        assert_eq!(cut("anything", 0), "");
        assert_eq!(cut("ab", 1), "…");
    }

    #[test]
    fn a_frame_fits_the_rows_dropping_the_least_important_and_saying_so() {
        let frame: Vec<Line> = (0..10)
            .map(|i| Line::new(if i % 2 == 0 { 0 } else { 1 }, format!("line {i}")))
            .collect();
        let size = |rows| Size { cols: 80, rows };
        // Room for all (one row stays for the cursor).
        assert_eq!(fit(&frame, size(11)).len(), 10);
        // 6 rows: 4 lines and the note; the rank-0 lines first, in order.
        assert_eq!(
            fit(&frame, size(6)),
            vec![
                "line 0",
                "line 2",
                "line 4",
                "line 6",
                "… 6 more (a taller terminal shows them)"
            ]
        );
        // Among equals the latest go first.
        assert_eq!(
            fit(&frame, size(9)),
            vec![
                "line 0",
                "line 1",
                "line 2",
                "line 3",
                "line 4",
                "line 6",
                "line 8",
                "… 3 more (a taller terminal shows them)"
            ]
        );
        // No room for the note.
        assert_eq!(fit(&frame, size(2)), vec!["line 0"]);
        assert_eq!(fit(&frame, size(1)), vec!["line 0"]);
    }

    #[test]
    fn every_line_of_a_fitted_frame_takes_one_row() {
        let frame = vec![
            Line::new(0, "h".repeat(200)),
            Line::new(1, "名".repeat(100)),
            // A process named with newlines (a traced program's prctl).
            Line::new(2, "the main thread of W\nX\r\nY\tZ (pid 1)"),
        ];
        for cols in [1, 2, 20, 80, 81] {
            for l in fit(&frame, Size { cols, rows: 24 }) {
                assert!(width(&l) <= cols.saturating_sub(1).max(1), "{cols}: {l}");
                assert!(!l.contains(['\n', '\r', '\t']), "{cols}: {l:?}");
            }
        }
    }
}
