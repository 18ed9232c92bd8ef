//! The consumer of the kernel's BPF ring buffer (`events`), with its data
//! pages mapped once.
//!
//! aya's `RingBuf` maps the data pages twice, one copy after the other (as
//! the kernel offers), so that a record that wraps past the end reads as
//! one slice. Every page of a mapping the tracer touched counts in its
//! resident set size, so the 8 MiB ring counted 16 MiB of RSS once it had
//! wrapped (round 39), though its memory is 8 MiB. Here the data pages are
//! mapped once and the rare record that wraps is copied into a buffer of
//! this consumer's (issue 16, round 49). The protocol is aya 0.14's
//! (`maps/ring_buf.rs`, whose orderings follow `kernel/bpf/ringbuf.c`): the
//! producer position read with Acquire, each record's header with Acquire
//! (the kernel commits it with a fully ordered xchg), the consumer
//! position published with Release once the record was read, and a SeqCst
//! fence before looking again after consuming, so that either this
//! consumer sees a new record or its producer sees the new position and
//! sends a wakeup.

use aya::maps::MapData;
use std::os::fd::{AsFd, AsRawFd, RawFd};
use std::sync::atomic::{fence, AtomicU32, AtomicUsize, Ordering};

/// The record header's length word: set while the producer writes it.
const BUSY_BIT: u32 = 1 << 31;
/// Set for a record its producer discarded (skipped, never read).
const DISCARD_BIT: u32 = 1 << 30;
/// The header before each record: its length word and a page offset.
const HEADER: usize = 8;

/// One shared mapping, unmapped on drop.
struct Mapping {
    ptr: *mut libc::c_void,
    len: usize,
}

impl Mapping {
    fn new(fd: RawFd, len: usize, prot: libc::c_int, offset: usize) -> std::io::Result<Mapping> {
        let offset = libc::off_t::try_from(offset)
            .map_err(|_| std::io::Error::from_raw_os_error(libc::EINVAL))?;
        // SAFETY: a new shared mapping of `len` bytes of the map's fd at a
        // page-aligned offset; the kernel checks both against the map.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                prot,
                libc::MAP_SHARED,
                fd,
                offset,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error());
        }
        Ok(Mapping { ptr, len })
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: `ptr` and `len` are those mmap returned; nothing refers to
        // the mapping after its owner drops it.
        unsafe { libc::munmap(self.ptr, self.len) };
    }
}

/// The ring buffer's consumer side.
pub(crate) struct Ring {
    /// The map (its fd): kept open while mapped.
    map: MapData,
    /// The consumer page (read-write): the consumer position.
    consumer: Mapping,
    /// The producer page, then the data pages once (read-only).
    producer: Mapping,
    page: usize,
    /// The data area's size (a power of two, a multiple of the page size).
    size: usize,
    /// The consumer position as this consumer last published it.
    pos: usize,
    /// The producer position last read.
    pos_cache: usize,
    /// A record was consumed since the producer position was last read.
    needs_wakeup: bool,
    /// A record that wraps past the data area's end, copied whole.
    wrapped: Vec<u8>,
}

// SAFETY: the mappings are owned by the Ring and touched only through
// `&mut self` (the consumer) or atomics (the positions, the headers).
unsafe impl Send for Ring {}

impl Ring {
    /// Maps the ring buffer map `map` of `size` bytes (a power of two, a
    /// multiple of the page size, as the kernel requires of the map).
    pub(crate) fn new(map: MapData, size: usize) -> std::io::Result<Ring> {
        // SAFETY: sysconf has no preconditions.
        let page = usize::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) })
            .map_err(|_| std::io::Error::from_raw_os_error(libc::EINVAL))?;
        if !size.is_power_of_two() || !size.is_multiple_of(page) {
            return Err(std::io::Error::from_raw_os_error(libc::EINVAL));
        }
        let fd = map.fd().as_fd().as_raw_fd();
        let consumer = Mapping::new(fd, page, libc::PROT_READ | libc::PROT_WRITE, 0)?;
        // The kernel maps the data pages twice past the producer page; a
        // mapping as long as one copy maps them once. Should a kernel refuse
        // the shorter mapping, both copies are mapped, as aya does (only the
        // first is read: the consumer works the same).
        let producer = Mapping::new(fd, page + size, libc::PROT_READ, page)
            .or_else(|_| Mapping::new(fd, page + 2 * size, libc::PROT_READ, page))?;
        let mut ring = Ring {
            map,
            consumer,
            producer,
            page,
            size,
            pos: 0,
            pos_cache: 0,
            needs_wakeup: false,
            wrapped: Vec::new(),
        };
        ring.pos = ring.consumer_pos().load(Ordering::Acquire);
        ring.pos_cache = ring.producer_pos();
        Ok(ring)
    }

    pub(crate) fn as_raw_fd(&self) -> RawFd {
        self.map.fd().as_fd().as_raw_fd()
    }

    fn consumer_pos(&self) -> &AtomicUsize {
        // SAFETY: the consumer page starts with the consumer position, an
        // aligned word the kernel reads atomically; the mapping lives as
        // long as `self`.
        unsafe { &*self.consumer.ptr.cast::<AtomicUsize>() }
    }

    fn producer_pos(&self) -> usize {
        // SAFETY: as `consumer_pos`, for the producer page's first word,
        // which the kernel writes with Release.
        unsafe { &*self.producer.ptr.cast::<AtomicUsize>() }.load(Ordering::Acquire)
    }

    /// The data area, once.
    fn data(&self) -> &[u8] {
        // SAFETY: the producer mapping is `page + size` bytes long and
        // readable; the kernel writes records in it concurrently, which is
        // why a record is read only once its header's busy bit is clear
        // (Acquire), and only up to its length.
        unsafe {
            std::slice::from_raw_parts(self.producer.ptr.cast::<u8>().add(self.page), self.size)
        }
    }

    /// The length word of the record header at `offset` of the data area.
    fn header(&self, offset: usize) -> u32 {
        // SAFETY: `offset` is 8-byte aligned and below `size`, so the word
        // lies in the data area; the kernel commits it with a fully ordered
        // xchg, paired with this Acquire load.
        unsafe {
            &*self
                .producer
                .ptr
                .cast::<u8>()
                .add(self.page + offset)
                .cast::<AtomicU32>()
        }
        .load(Ordering::Acquire)
    }

    /// Hands every record ready now to `f`, in order; how many.
    pub(crate) fn drain(&mut self, f: &mut impl FnMut(&[u8])) -> usize {
        let mask = self.size - 1;
        let mut n = 0;
        loop {
            if self.pos == self.pos_cache {
                if self.needs_wakeup {
                    // Either this sees a new record or its producer sees the
                    // new consumer position and sends a wakeup.
                    fence(Ordering::SeqCst);
                    self.needs_wakeup = false;
                }
                self.pos_cache = self.producer_pos();
                if self.pos == self.pos_cache {
                    return n;
                }
            }
            let offset = self.pos & mask;
            let header = self.header(offset);
            if header & BUSY_BIT != 0 {
                if !self.needs_wakeup {
                    return n;
                }
                fence(Ordering::SeqCst);
                self.needs_wakeup = false;
                continue;
            }
            // The length is below the data area's size (the kernel refuses
            // larger records): the mask keeps a damaged word in range.
            let len = (header & !(BUSY_BIT | DISCARD_BIT)) as usize & mask;
            if header & DISCARD_BIT == 0 {
                let mut wrapped = std::mem::take(&mut self.wrapped);
                f(record(self.data(), offset + HEADER, len, &mut wrapped));
                self.wrapped = wrapped;
                n += 1;
            }
            self.consume(len);
        }
    }

    /// Publishes that the record of `len` bytes at the position was read.
    fn consume(&mut self, len: usize) {
        self.pos += (HEADER + len).next_multiple_of(8);
        // The kernel pairs this with an Acquire load before reusing the
        // record's room.
        self.consumer_pos().store(self.pos, Ordering::Release);
        self.needs_wakeup = true;
    }
}

/// The `len` bytes at `start` of the ring's data area `data` (taken modulo
/// its length): a slice of it, or, for a record that wraps past its end,
/// both parts copied into `wrapped`.
fn record<'a>(data: &'a [u8], start: usize, len: usize, wrapped: &'a mut Vec<u8>) -> &'a [u8] {
    let start = start % data.len();
    let first = len.min(data.len() - start);
    if first == len {
        return &data[start..start + len];
    }
    wrapped.clear();
    wrapped.extend_from_slice(&data[start..]);
    wrapped.extend_from_slice(&data[..len - first]);
    wrapped
}

#[cfg(test)]
mod tests {
    use super::record;

    #[test]
    fn a_record_that_wraps_past_the_end_reads_whole() {
        let data: Vec<u8> = (0u8..64).collect();
        let mut wrapped = Vec::new();
        // Within the area: a slice of it.
        assert_eq!(record(&data, 8, 16, &mut wrapped), &data[8..24]);
        assert!(wrapped.is_empty(), "nothing copied");
        // Ending exactly at the end.
        assert_eq!(record(&data, 48, 16, &mut wrapped), &data[48..64]);
        // Its header the area's last 8 bytes: the record starts at 0.
        assert_eq!(record(&data, 64, 16, &mut wrapped), &data[0..16]);
        // Across the end: both parts, in order.
        let want: Vec<u8> = (56u8..64).chain(0u8..12).collect();
        assert_eq!(record(&data, 56, 20, &mut wrapped), &want[..]);
        // An empty record.
        assert!(record(&data, 40, 0, &mut wrapped).is_empty());
    }
}
