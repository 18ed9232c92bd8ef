//! The plain-text tables of the human outputs (`stats`, `memory`).
//!
//! Hand-written rather than a table crate: the tables are two-space
//! separated columns with no borders, right-aligned numbers and a 120-character
//! cell cap, which is what `comfy-table`/`tabled` would need configuring into,
//! for ~30 lines; tests and scripts read these columns.

use crate::term_text::{cell, pad_left, pad_right};

/// Widest a table cell is shown (a 70k-character process name must not
/// make a 70k-column table).
const CELL_CHARS: usize = 120;

/// Left-aligns text columns and right-aligns numbers, two spaces apart.
pub fn table(header: &[&str], rows: &[Vec<String>], left: &[usize]) -> String {
    let rows: Vec<Vec<String>> = rows
        .iter()
        .map(|r| r.iter().map(|c| cell(c, CELL_CHARS)).collect())
        .collect();
    let mut widths: Vec<usize> = header.iter().map(|h| h.len()).collect();
    for r in &rows {
        for (i, cell) in r.iter().enumerate() {
            widths[i] = widths[i].max(cell.chars().count());
        }
    }
    let mut out = String::new();
    let mut line = |cells: Vec<&str>| {
        let mut s = String::new();
        for (i, c) in cells.iter().enumerate() {
            if i > 0 {
                s.push_str("  ");
            }
            if left.contains(&i) {
                s.push_str(&pad_right(c, widths[i]));
            } else {
                s.push_str(&pad_left(c, widths[i]));
            }
        }
        out.push_str(s.trim_end());
        out.push('\n');
    };
    line(header.to_vec());
    for r in &rows {
        line(r.iter().map(String::as_str).collect());
    }
    out
}
