//! Untrusted text on a terminal.
//!
//! Process names, command lines, paths, notes, op names and SQL answers come
//! from traces other people send and from `/proc`: a process may call itself
//! `ESC[2J` or set the window title through an OSC sequence. Every human
//! output passes through [`terminal_safe`] before it is written, so the
//! terminal shows such bytes instead of obeying them. Padding never uses
//! `format!` widths, which panic above 65,535 columns.

use std::borrow::Cow;
use std::fmt::Write as _;

/// Whether `c` must not reach a terminal as is: C0 controls other than
/// newline and tab, DEL, C1 controls (8-bit CSI/OSC), and the bidirectional
/// overrides that reorder what a reader sees.
pub(crate) fn needs_escape(c: char) -> bool {
    match c {
        '\n' | '\t' => false,
        '\u{0}'..='\u{1f}' | '\u{7f}'..='\u{9f}' => true,
        '\u{61c}' | '\u{200e}' | '\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}' => {
            true
        }
        _ => false,
    }
}

/// `s` with every dangerous character written as a visible escape
/// (`\x1b`, `\u{202e}`); borrowed when nothing needed escaping.
pub fn terminal_safe(s: &str) -> Cow<'_, str> {
    if !s.chars().any(needs_escape) {
        return Cow::Borrowed(s);
    }
    let mut out = String::with_capacity(s.len() + 16);
    for c in s.chars() {
        if !needs_escape(c) {
            out.push(c);
        } else if (c as u32) < 0x100 {
            let _ = write!(out, "\\x{:02x}", c as u32);
        } else {
            let _ = write!(out, "\\u{{{:x}}}", c as u32);
        }
    }
    Cow::Owned(out)
}

/// One table cell: newlines and tabs flattened to spaces (a cell is one
/// line), dangerous characters escaped, and at most `max` characters kept
/// (the rest summarized as `…(+N chars)`).
pub fn cell(s: &str, max: usize) -> String {
    let flat = terminal_safe(s).replace(['\n', '\t', '\r'], " ");
    let n = flat.chars().count();
    if n <= max {
        return flat;
    }
    let kept: String = flat.chars().take(max).collect();
    format!("{kept}…(+{} chars)", n - max)
}

/// `s` followed by spaces up to `width` characters.
pub fn pad_right(s: &str, width: usize) -> String {
    let n = s.chars().count();
    let mut out = String::with_capacity(s.len() + width.saturating_sub(n));
    out.push_str(s);
    out.extend(std::iter::repeat_n(' ', width.saturating_sub(n)));
    out
}

/// Spaces up to `width` characters, then `s`.
pub fn pad_left(s: &str, width: usize) -> String {
    let n = s.chars().count();
    let mut out = String::with_capacity(s.len() + width.saturating_sub(n));
    out.extend(std::iter::repeat_n(' ', width.saturating_sub(n)));
    out.push_str(s);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escapes_controls_and_bidi_but_keeps_text() {
        assert!(matches!(
            terminal_safe("python3 train.py"),
            Cow::Borrowed(_)
        ));
        assert_eq!(terminal_safe("a\x1b[2Jb"), "a\\x1b[2Jb");
        assert_eq!(
            terminal_safe("\x1b]0;pwned\x07name"),
            "\\x1b]0;pwned\\x07name"
        );
        assert_eq!(terminal_safe("x\u{9b}31m"), "x\\x9b31m");
        assert_eq!(terminal_safe("r\re\u{7f}"), "r\\x0de\\x7f");
        assert_eq!(terminal_safe("abc\u{202e}fed"), "abc\\u{202e}fed");
        assert_eq!(terminal_safe("two\nlines\tok"), "two\nlines\tok");
        assert_eq!(terminal_safe("ünïcödé 日本"), "ünïcödé 日本");
    }

    #[test]
    fn cells_are_one_line_and_bounded() {
        assert_eq!(cell("a\nb\tc", 10), "a b c");
        let long = "x".repeat(70_000);
        let c = cell(&long, 100);
        assert!(c.starts_with(&"x".repeat(100)));
        assert!(c.ends_with("…(+69900 chars)"), "{}", &c[90..]);
        assert_eq!(cell("\x1b[2J", 100), "\\x1b[2J");
    }

    #[test]
    fn padding_handles_any_width() {
        assert_eq!(pad_right("ab", 4), "ab  ");
        assert_eq!(pad_left("ab", 4), "  ab");
        assert_eq!(pad_left("abcdef", 4), "abcdef");
        // `format!("{:<w$}")` panics for widths above u16::MAX; this must not.
        assert_eq!(pad_right("", 70_000).len(), 70_000);
    }
}
