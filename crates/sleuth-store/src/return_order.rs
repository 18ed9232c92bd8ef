//! Calls in return order without SQLite sorting them.
//!
//! The ledger replays calls in the order they returned (end, then start,
//! then row id). No index serves that order, so SQLite sorted every row it
//! read (1 s of the 1.5 s a 10M-call file's memory calls up to its middle
//! took). The writer stores calls nearly in that order already (in the
//! order they were captured: a call is captured when it returns, rows of
//! several threads interleaved), so the rows are read in row-id order, a
//! scan that needs no sort, and put back in order through a small buffer.
//! The buffer proves its own output: a row that arrives after a later one
//! left the buffer means the order cannot be restored in that space, and
//! the reader starts again with SQLite's sort (`Rows::replay_by_return`).
//! So the order is always exactly the sorted query's; only the cost
//! depends on the file.

use std::collections::VecDeque;

/// A row's place: the order the ledger replays calls in is (return time,
/// start time, row id); a whole export's start order is (start time, 0,
/// row id) (`crate::start_order`).
pub(crate) type OrderKey = (u64, u64, i64);

/// How many rows the buffer holds before it lets the earliest go: a call
/// may be stored this many memory calls later than one that returned after
/// it (captured late: another CPU's ring buffer, a long call). About 120
/// bytes a row: a few MB.
pub(crate) const REORDER_ROWS: usize = 1 << 15;

/// Entries an out-of-order row may move on average (plus a fixed
/// allowance) before the buffer gives up: see [`Reorder::push`].
const MOVES_PER_ROW: u64 = 64;
const MOVES_ALLOWED: u64 = 1 << 20;

/// The rows cannot be put back in order here: one arrived after a row that
/// returned later had already left the buffer, or putting them in order
/// would cost more work than SQLite's sort.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct OutOfOrder;

/// Rows in, the same rows out in key order, or [`OutOfOrder`].
///
/// The buffer is a queue kept sorted: a row in order (most rows) goes to
/// its back, a late one is put in place by a binary search, moving the
/// entries after it (few: it is seldom late by many). A binary heap cost
/// a sift through 15 levels per row at this size, in order or not (0.6 s
/// of a 10M-call file's 1.56M memory calls). The entries are small (key,
/// slot) pairs; the rows (about 120 bytes) stay in their slots.
pub(crate) struct Reorder<T> {
    queue: VecDeque<(OrderKey, usize)>,
    slots: Vec<Option<T>>,
    /// Slots given back, for the next rows.
    free: Vec<usize>,
    /// The key of the last row let out: nothing smaller may come after it.
    last: Option<OrderKey>,
    capacity: usize,
    /// Rows taken, and entries moved to put late ones in place: a file
    /// whose rows are all late by many (hostile or odd) is refused before
    /// the moves cost more than a sort (`MOVES_PER_ROW`).
    rows: u64,
    moved: u64,
}

impl<T> Reorder<T> {
    pub(crate) fn new(capacity: usize) -> Reorder<T> {
        Reorder {
            queue: VecDeque::new(),
            slots: Vec::new(),
            free: Vec::new(),
            last: None,
            capacity: capacity.max(1),
            rows: 0,
            moved: 0,
        }
    }

    /// Takes one row; returns the earliest row when the buffer is full.
    /// Keys must be distinct (they end in the row id).
    pub(crate) fn push(&mut self, key: OrderKey, row: T) -> Result<Option<T>, OutOfOrder> {
        if self.last.is_some_and(|last| key < last) {
            return Err(OutOfOrder);
        }
        self.rows += 1;
        let at = match self.queue.back() {
            Some(&(back, _)) if key < back => {
                // Late rows are mostly late by one or two: look there first.
                let len = self.queue.len();
                let near = (1..=8.min(len)).find(|&back| self.queue[len - back].0 < key);
                let at = match near {
                    Some(back) => len - back + 1,
                    None => self.queue.partition_point(|&(k, _)| k < key),
                };
                // VecDeque moves the shorter side.
                let moves = (self.queue.len() - at).min(at) as u64;
                self.moved = self.moved.saturating_add(moves);
                let budget = self
                    .rows
                    .saturating_mul(MOVES_PER_ROW)
                    .saturating_add(MOVES_ALLOWED);
                if self.moved > budget {
                    return Err(OutOfOrder);
                }
                at
            }
            _ => self.queue.len(),
        };
        let slot = match self.free.pop() {
            Some(slot) => {
                self.slots[slot] = Some(row);
                slot
            }
            None => {
                self.slots.push(Some(row));
                self.slots.len() - 1
            }
        };
        self.queue.insert(at, (key, slot));
        if self.queue.len() <= self.capacity {
            return Ok(None);
        }
        Ok(self.pop())
    }

    /// The earliest row held, if any.
    pub(crate) fn pop(&mut self) -> Option<T> {
        let (key, slot) = self.queue.pop_front()?;
        self.last = Some(key);
        self.free.push(slot);
        self.slots[slot].take()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every row out, in key order.
    fn run(keys: &[OrderKey], capacity: usize) -> Result<Vec<OrderKey>, OutOfOrder> {
        let mut r = Reorder::new(capacity);
        let mut out = Vec::new();
        for &k in keys {
            out.extend(r.push(k, k)?);
        }
        while let Some(k) = r.pop() {
            out.push(k);
        }
        Ok(out)
    }

    #[test]
    fn rows_late_by_less_than_the_buffer_come_out_sorted() {
        // Each call returns before the one stored before it: late by one row.
        let keys = [(20, 1, 1), (10, 2, 2), (40, 3, 3), (30, 4, 4), (30, 0, 5)];
        let mut sorted = keys.to_vec();
        sorted.sort();
        assert_eq!(run(&keys, 2).unwrap(), sorted);
        // Ties on the return time keep start, then row id order.
        assert_eq!(
            run(&[(5, 2, 1), (5, 1, 2), (5, 1, 0)], 3).unwrap(),
            [(5, 1, 0), (5, 1, 2), (5, 2, 1)]
        );
    }

    #[test]
    fn a_row_later_than_the_buffer_holds_is_refused_not_misplaced() {
        // (1, 0, 9) arrives after three later rows: with room for two, one
        // of them has left already.
        let keys = [(5, 0, 1), (6, 0, 2), (7, 0, 3), (1, 0, 9)];
        assert_eq!(run(&keys, 2), Err(OutOfOrder));
        assert_eq!(run(&keys, 3).unwrap()[0], (1, 0, 9));
    }

    #[test]
    fn rows_late_by_many_everywhere_are_refused_before_they_cost_more_than_a_sort() {
        // Blocks of 4,096 rows stored backwards: each row goes to the front
        // of its block, moving up to 2,048 entries; 300,000 rows would move
        // about 300 million. The buffer holds a block, so it could order
        // them: it refuses once the moves pass 64 a row (and the allowance).
        let block = 4096i64;
        let keys: Vec<OrderKey> = (0..300_000i64)
            .map(|i| {
                let k = (i / block) * block + (block - 1 - i % block);
                (k as u64, 0, k)
            })
            .collect();
        assert_eq!(run(&keys, block as usize), Err(OutOfOrder));
        // The same rows late by a few each are put in order.
        let near: Vec<OrderKey> = (0..300_000i64)
            .map(|i| {
                let k = (i / 4) * 4 + (3 - i % 4);
                (k as u64, 0, k)
            })
            .collect();
        let mut sorted = near.clone();
        sorted.sort();
        assert_eq!(run(&near, block as usize).unwrap(), sorted);
    }

    #[test]
    fn random_orders_come_out_sorted_or_are_refused() {
        // A small deterministic generator: rows displaced by up to `spread`.
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        for spread in [0u64, 3, 50, 500] {
            let mut keys: Vec<OrderKey> = (0..2000i64)
                .map(|i| (i as u64 * 10 + next() % (spread * 10 + 1), next() % 4, i))
                .collect();
            for capacity in [1, 16, 256, 4096] {
                let mut sorted = keys.clone();
                sorted.sort();
                match run(&keys, capacity) {
                    Ok(out) => assert_eq!(out, sorted, "spread {spread}, capacity {capacity}"),
                    Err(OutOfOrder) => assert!(capacity < 4096, "4096 holds all 2000 rows"),
                }
            }
            if spread == 0 {
                // Stored backwards: only a buffer holding every row restores it.
                keys.reverse();
                assert_eq!(run(&keys, 1), Err(OutOfOrder));
                assert!(run(&keys, 2000).unwrap().is_sorted());
            }
        }
    }
}
