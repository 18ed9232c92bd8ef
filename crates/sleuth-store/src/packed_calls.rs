//! Calls held for a later replay in return order, packed (issue 16).
//!
//! A window's memory and pinning calls are kept by the pass over its calls
//! (`scope_feed::Feed`) so the replay in return order need not read them
//! again: past the bound it does, a read SQLite sorts (1.1 s of `explain`
//! over ten seconds of the bench's 10M-call trace, 250,000 memory calls).
//! A `CallEvent` with its row id takes 168 bytes, and a vector of them
//! grows by doubling; packed, a call is a 32-byte sort key and its other
//! fields as varints (about 30 bytes for an allocation or a free), so the
//! same memory keeps about three times as many calls.

use sleuth_core::CallEvent;

/// Where a call goes in return order, and where its other fields are.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
struct Key {
    end_ns: u64,
    ts_ns: u64,
    id: i64,
    at: u32,
}

/// Calls with their row ids, packed; given back in return order (end,
/// start, row id), as `StreamOrder::ByReturn` reads them.
#[derive(Default)]
pub(crate) struct PackedCalls {
    keys: Vec<Key>,
    bytes: Vec<u8>,
}

/// Bytes a packed call takes at most besides its key: 13 varints of up to
/// 10 bytes and the flags.
const MAX_PACKED: usize = 13 * 10 + 1;

const NESTED: u8 = 1;

impl PackedCalls {
    pub(crate) fn len(&self) -> usize {
        self.keys.len()
    }

    /// Keeps call `c` of row `id`; false (nothing kept) once the packed
    /// fields would pass 4 GiB, where a key's offset ends.
    pub(crate) fn push(&mut self, id: i64, c: &CallEvent) -> bool {
        // Its bytes must end where a 4-byte offset still reaches.
        if u32::try_from(self.bytes.len() + MAX_PACKED).is_err() {
            return false;
        }
        let at = self.bytes.len() as u32;
        self.keys.push(Key {
            end_ns: c.end_ns(),
            ts_ns: c.ts_ns,
            id,
            at,
        });
        let b = &mut self.bytes;
        let optional = [c.size, c.ptr, c.stream, c.kind, c.host_ptr, c.stack_id];
        let mut flags = if c.nested { NESTED } else { 0 };
        for (i, v) in optional.iter().enumerate() {
            if v.is_some() {
                flags |= 2 << i;
            }
        }
        b.push(flags);
        varint(b, c.dur_ns);
        varint(b, c.pid.into());
        varint(b, c.tid.into());
        varint(b, c.op.into());
        varint(b, zigzag(c.ret));
        for v in optional.into_iter().flatten() {
            varint(b, v);
        }
        varint(b, c.runnable_ns);
        varint(b, c.blocked_ns);
        varint(b, c.cpu.into());
        true
    }

    /// Adds `other`'s calls; false (none added) past the offsets' 4 GiB.
    pub(crate) fn append(&mut self, other: PackedCalls) -> bool {
        if u32::try_from(self.bytes.len() + other.bytes.len()).is_err() {
            return false;
        }
        let shift = self.bytes.len() as u32;
        self.keys.extend(other.keys.into_iter().map(|k| Key {
            at: k.at + shift,
            ..k
        }));
        self.bytes.extend_from_slice(&other.bytes);
        true
    }

    /// The calls with their row ids in return order (end, start, row id).
    pub(crate) fn into_return_order(mut self) -> impl Iterator<Item = (i64, CallEvent)> {
        // Row ids differ: the keys are all distinct, an unstable sort is exact.
        self.keys.sort_unstable();
        let bytes = self.bytes;
        self.keys
            .into_iter()
            .map(move |k| (k.id, unpack(&bytes[k.at as usize..], k)))
    }
}

fn unpack(mut b: &[u8], k: Key) -> CallEvent {
    let flags = b[0];
    b = &b[1..];
    let mut next = || read_varint(&mut b);
    let dur_ns = next();
    let pid = next() as u32;
    let tid = next() as u32;
    let op = next() as u16;
    let ret = unzigzag(next());
    let mut optional = [None; 6];
    for (i, v) in optional.iter_mut().enumerate() {
        if flags & (2 << i) != 0 {
            *v = Some(next());
        }
    }
    let [size, ptr, stream, kind, host_ptr, stack_id] = optional;
    CallEvent {
        ts_ns: k.ts_ns,
        dur_ns,
        pid,
        tid,
        op,
        ret,
        size,
        ptr,
        stream,
        kind,
        host_ptr,
        nested: flags & NESTED != 0,
        runnable_ns: next(),
        blocked_ns: next(),
        cpu: next() as u32,
        stack_id,
    }
}

/// Appends `v` as a base-128 varint (7 bits a byte, low first).
fn varint(b: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        b.push((v as u8) | 0x80);
        v >>= 7;
    }
    b.push(v as u8);
}

/// Reads a varint [`varint`] wrote, moving `b` past it.
fn read_varint(b: &mut &[u8]) -> u64 {
    let mut v = 0u64;
    let mut shift = 0;
    loop {
        let byte = b[0];
        *b = &b[1..];
        v |= u64::from(byte & 0x7f) << shift;
        if byte < 0x80 {
            return v;
        }
        shift += 7;
    }
}

fn zigzag(v: i64) -> u64 {
    ((v << 1) ^ (v >> 63)) as u64
}

fn unzigzag(v: u64) -> i64 {
    ((v >> 1) as i64) ^ -((v & 1) as i64)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn call(ts_ns: u64, dur_ns: u64, seed: u64) -> CallEvent {
        let some = |bit: u64, v: u64| (seed >> bit & 1 == 1).then_some(v);
        CallEvent {
            ts_ns,
            dur_ns,
            pid: (seed % 7) as u32 * 1_000_003,
            tid: u32::MAX - seed as u32,
            op: (seed % 40) as u16,
            ret: [0, 2, -1, i64::MIN, i64::MAX][(seed % 5) as usize],
            size: some(0, seed << 20),
            ptr: some(1, u64::MAX - seed),
            stream: some(2, 0),
            kind: some(3, 1),
            host_ptr: some(4, 0x7f00_0000_0000 + seed),
            nested: seed.is_multiple_of(3),
            runnable_ns: seed * 17,
            blocked_ns: u64::MAX >> (seed % 64),
            cpu: (seed % 300) as u32,
            stack_id: some(5, seed * 1_000_000_007),
        }
    }

    fn unpacked(calls: &[(i64, CallEvent)]) -> Vec<(i64, CallEvent)> {
        let mut p = PackedCalls::default();
        for (id, c) in calls {
            assert!(p.push(*id, c));
        }
        assert_eq!(p.len(), calls.len());
        p.into_return_order().collect()
    }

    fn in_return_order(calls: &[(i64, CallEvent)]) -> Vec<(i64, CallEvent)> {
        let mut v = calls.to_vec();
        v.sort_by_key(|(id, c)| (c.end_ns(), c.ts_ns, *id));
        v
    }

    #[test]
    fn every_field_comes_back_in_return_order() {
        // Ties on end, then on start, broken by row id; every optional
        // field present and absent; extreme values.
        let calls: Vec<(i64, CallEvent)> = (0..200u64)
            .map(|i| {
                let ts = 1_000 + (i % 13) * 10;
                let dur = 500 - (i % 7) * 10;
                (1_000 - i as i64 * 3, call(ts, dur, i))
            })
            .chain([
                (i64::MIN, call(0, 0, 63)),
                (i64::MAX, call(u64::MAX / 2, u64::MAX / 2, 62)),
            ])
            .collect();
        let got = unpacked(&calls);
        let want = in_return_order(&calls);
        assert_eq!(format!("{got:?}"), format!("{want:?}"));
    }

    #[test]
    fn appended_calls_sort_with_the_first() {
        let calls: Vec<(i64, CallEvent)> = (0..50u64)
            .map(|i| (i as i64, call(5_000 - i * 10, 3 + i, i)))
            .collect();
        let (a, b) = calls.split_at(20);
        let mut first = PackedCalls::default();
        let mut second = PackedCalls::default();
        for (id, c) in b {
            assert!(second.push(*id, c));
        }
        for (id, c) in a {
            assert!(first.push(*id, c));
        }
        assert!(first.append(second));
        assert_eq!(first.len(), 50);
        let got: Vec<(i64, CallEvent)> = first.into_return_order().collect();
        assert_eq!(format!("{got:?}"), format!("{:?}", in_return_order(&calls)));
    }

    #[test]
    fn an_allocation_packs_in_few_bytes() {
        let mut p = PackedCalls::default();
        let c = CallEvent {
            ts_ns: 30_000_000_000,
            dur_ns: 8_000,
            pid: 4_321,
            tid: 4_321,
            op: 1,
            ret: 0,
            size: Some(2 << 20),
            ptr: Some(0x7f3a_0000_0000),
            stream: None,
            kind: None,
            host_ptr: None,
            nested: false,
            runnable_ns: 0,
            blocked_ns: 0,
            cpu: 3,
            stack_id: Some(17),
        };
        assert!(p.push(9_000_000, &c));
        assert!(p.bytes.len() <= 24, "{} bytes", p.bytes.len());
        assert_eq!(std::mem::size_of::<Key>(), 32);
    }
}
