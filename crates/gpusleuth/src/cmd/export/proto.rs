//! Protocol Buffers' wire format, the part a Perfetto trace needs
//! (varints, 64-bit doubles, length-delimited strings and messages),
//! written straight into a byte buffer. Hand-written rather than a
//! generated `prost` model: the export writes a dozen fields of four
//! messages, and building message structs per event would cost an
//! allocation each for what is a few bytes appended.

/// Appends `v` as a base-128 varint.
pub(super) fn varint(b: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        b.push((v as u8) | 0x80);
        v >>= 7;
    }
    b.push(v as u8);
}

fn tag(b: &mut Vec<u8>, field: u32, wire: u8) {
    varint(b, (u64::from(field) << 3) | u64::from(wire));
}

/// A `uint64`/`uint32`/enum field.
pub(super) fn uint(b: &mut Vec<u8>, field: u32, v: u64) {
    tag(b, field, 0);
    varint(b, v);
}

/// An `int64`/`int32` field: two's complement, as protobuf writes it (a
/// negative value takes ten bytes).
pub(super) fn int(b: &mut Vec<u8>, field: u32, v: i64) {
    uint(b, field, v as u64);
}

pub(super) fn boolean(b: &mut Vec<u8>, field: u32, v: bool) {
    uint(b, field, u64::from(v));
}

/// A `double` field (wire type 1: eight bytes, little-endian).
pub(super) fn double(b: &mut Vec<u8>, field: u32, v: f64) {
    tag(b, field, 1);
    b.extend_from_slice(&v.to_le_bytes());
}

/// A `string` field.
pub(super) fn string(b: &mut Vec<u8>, field: u32, s: &str) {
    tag(b, field, 2);
    varint(b, s.len() as u64);
    b.extend_from_slice(s.as_bytes());
}

/// A message field: what `body` appends, preceded by its length. The
/// length is known only after the body: one byte is set aside for it, the
/// common case; a longer body is moved up to make room for a longer varint.
pub(super) fn message(b: &mut Vec<u8>, field: u32, body: impl FnOnce(&mut Vec<u8>)) {
    tag(b, field, 2);
    let at = b.len();
    b.push(0);
    body(b);
    let len = b.len() - at - 1;
    if len < 0x80 {
        b[at] = len as u8;
        return;
    }
    let mut prefix = Vec::with_capacity(10);
    varint(&mut prefix, len as u64);
    b.splice(at..at + 1, prefix);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_are_encoded_as_the_protobuf_documentation_shows() {
        // The encoding guide's examples: field 1 = 150, field 2 = "testing",
        // field 3 = message {field 1 = 150}.
        let mut b = Vec::new();
        uint(&mut b, 1, 150);
        assert_eq!(b, [0x08, 0x96, 0x01]);
        b.clear();
        string(&mut b, 2, "testing");
        assert_eq!(b, [0x12, 0x07, b't', b'e', b's', b't', b'i', b'n', b'g']);
        b.clear();
        message(&mut b, 3, |m| uint(m, 1, 150));
        assert_eq!(b, [0x1a, 0x03, 0x08, 0x96, 0x01]);
        b.clear();
        int(&mut b, 4, -2);
        assert_eq!(
            b,
            [0x20, 0xfe, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01]
        );
        b.clear();
        double(&mut b, 5, 1.5);
        assert_eq!(b[0], 0x29);
        assert_eq!(f64::from_le_bytes(b[1..9].try_into().unwrap()), 1.5);
        b.clear();
        boolean(&mut b, 2, true);
        assert_eq!(b, [0x10, 0x01]);
    }

    #[test]
    fn a_long_message_gets_a_longer_length_and_keeps_its_body() {
        for n in [0usize, 1, 126, 127, 128, 300, 16_383, 16_384, 70_000] {
            let body = "x".repeat(n);
            let mut b = vec![0xaa];
            message(&mut b, 1, |m| m.extend_from_slice(body.as_bytes()));
            let mut want = vec![0xaa, 0x0a];
            varint(&mut want, n as u64);
            want.extend_from_slice(body.as_bytes());
            assert_eq!(b, want, "body of {n} bytes");
        }
        // Nested: an outer length counts the inner one's grown prefix.
        let mut b = Vec::new();
        message(&mut b, 1, |m| {
            message(m, 2, |i| i.extend(std::iter::repeat_n(7u8, 200)))
        });
        assert_eq!(&b[..5], &[0x0a, 203, 0x01, 0x12, 200]);
        assert_eq!(b.len(), 5 + 1 + 200);
    }
}
