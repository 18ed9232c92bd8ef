//! CPython line tables: instruction offset → source line, per format.
//!
//! 3.10 (PEP 626, `Objects/lnotab_notes.txt`): pairs of bytes (byte-offset
//! delta, signed line delta; -128 = no line), offsets in bytes.
//! 3.11+ (`Objects/locations.md`): entries whose first byte is
//! `1 cccc lll` (code, length - 1 in code units), followed by varints whose
//! meaning depends on the code; offsets in 2-byte code units.

/// The line of the instruction at byte offset `addr` (3.10 `co_linetable`).
pub fn line_310(table: &[u8], firstlineno: i32, addr: u32) -> Option<u32> {
    let mut line = firstlineno;
    let mut end: u32 = 0;
    for pair in table.chunks_exact(2) {
        let start = end;
        end = end.saturating_add(pair[0] as u32);
        let ldelta = pair[1] as i8;
        let this = if ldelta == -128 {
            None
        } else {
            line += ldelta as i32;
            Some(line)
        };
        if start <= addr && addr < end {
            return this.and_then(|l| u32::try_from(l).ok());
        }
    }
    None
}

struct Reader<'a> {
    b: &'a [u8],
    i: usize,
}

impl Reader<'_> {
    fn byte(&mut self) -> Option<u8> {
        let v = *self.b.get(self.i)?;
        self.i += 1;
        Some(v)
    }
    fn varint(&mut self) -> Option<u32> {
        let mut b = self.byte()?;
        let mut val = (b & 63) as u32;
        let mut shift = 0;
        while b & 64 != 0 {
            b = self.byte()?;
            shift += 6;
            if shift > 30 {
                return None;
            }
            val |= ((b & 63) as u32) << shift;
        }
        Some(val)
    }
    fn svarint(&mut self) -> Option<i32> {
        let u = self.varint()?;
        Some(if u & 1 != 0 {
            -((u >> 1) as i32)
        } else {
            (u >> 1) as i32
        })
    }
}

/// The line of the instruction at code-unit offset `unit` (3.11+ `co_linetable`).
pub fn line_311(table: &[u8], firstlineno: i32, unit: u32) -> Option<u32> {
    let mut r = Reader { b: table, i: 0 };
    let mut line = firstlineno;
    let mut end: u32 = 0;
    while let Some(first) = r.byte() {
        if first & 0x80 == 0 {
            return None; // not at an entry start: a corrupt table
        }
        let code = (first >> 3) & 15;
        let len = (first & 7) as u32 + 1;
        let this = match code {
            15 => None,
            14 => {
                line += r.svarint()?;
                r.varint()?; // end line delta
                r.varint()?; // column + 1
                r.varint()?; // end column + 1
                Some(line)
            }
            13 => {
                line += r.svarint()?;
                Some(line)
            }
            10..=12 => {
                line += code as i32 - 10;
                r.byte()?;
                r.byte()?;
                Some(line)
            }
            _ => {
                r.byte()?;
                Some(line)
            }
        };
        let start = end;
        end += len;
        if start <= unit && unit < end {
            return this.and_then(|l| u32::try_from(l).ok());
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn format_310_pairs() {
        // Lines 5 (bytes 0..6), none (6..8), 7 (8..20).
        let t = [6u8, 0, 2, 0x80, 12, 2];
        assert_eq!(line_310(&t, 5, 0), Some(5));
        assert_eq!(line_310(&t, 5, 4), Some(5));
        assert_eq!(line_310(&t, 5, 6), None);
        assert_eq!(line_310(&t, 5, 10), Some(7));
        assert_eq!(line_310(&t, 5, 40), None);
    }

    #[test]
    fn format_311_entries() {
        let mut t = Vec::new();
        // 2 units, no column form, line +1 (svarint 2).
        t.extend([0x80 | (13 << 3) | 1, 2]);
        // 3 units, one-line form, line +2.
        t.extend([0x80 | (12 << 3) | 2, 4, 9]);
        // 1 unit, no location.
        t.push(0x80 | (15 << 3));
        // 2 units, long form: line -2 (svarint 5), end delta, col, end col.
        t.extend([0x80 | (14 << 3) | 1, 5, 0, 1, 3]);
        // 1 unit, short form (same line).
        t.extend([0x80, 0x12]);
        assert_eq!(line_311(&t, 10, 0), Some(11));
        assert_eq!(line_311(&t, 10, 1), Some(11));
        assert_eq!(line_311(&t, 10, 2), Some(13));
        assert_eq!(line_311(&t, 10, 4), Some(13));
        assert_eq!(line_311(&t, 10, 5), None);
        assert_eq!(line_311(&t, 10, 6), Some(11));
        assert_eq!(line_311(&t, 10, 8), Some(11));
        assert_eq!(line_311(&t, 10, 9), None);
        assert_eq!(line_311(&[0x05], 1, 0), None, "corrupt table");
    }
}
