//! Which of an allocator event's 16 `Block` words the writer stores
//! (schema version 4).
//!
//! PyTorch reuses its `Block` structs: a block's events (malloc, free,
//! malloc again) carry words that mostly repeat. A row may leave out (store
//! NULL for) each word equal to the same word of a **base** row, an earlier
//! row of the same block that stores all 16 (`allocator_rows.base_back`: how
//! many rows back it lies; version 4 stored its id, `base_id`); the
//! `allocator_events` view puts them back with one lookup by row id. A base
//! row never has a base itself, so a reader resolves any row in one step,
//! in any order: no chain to follow, no state carried from row to row.
//!
//! Which rows are bases: a row stores all its words when its block has no
//! base yet, or when more than [`MAX_CHANGED`] of its words differ from the
//! base's, and then becomes the block's base. On the seed's PyTorch rounds
//! traced on the H200 (404,794 allocator events each, default allocator and
//! expandable segments) at most 2 changed words gave the smallest rows:
//! 63.1 → 35.5 and 66.3 → 36.3 bytes for the words and their header per
//! row, against 41.9/43.5 for frees stored against their malloc only and
//! 48.0/48.1 with up to 8 changed words (docs/benchmarks.md, round 28).

use sleuth_core::event::BLOCK_WORDS;
use std::collections::HashMap;

/// A row stores all its words once more than this many differ from its
/// block's base row (and becomes the base).
pub(crate) const MAX_CHANGED: usize = 2;

/// Blocks whose base the writer remembers: past this many, it forgets them
/// all (their next rows store all their words again). 4,096 × ~150 bytes;
/// the H200 traces above had ~1,000 blocks.
const MAX_BLOCKS: usize = 4096;

/// The base row of each block the writer stored a row of, in one file, and
/// the id of its last allocator row (the writer gives each row its id, so
/// that a row can name its base by how many rows back it lies: a few bytes
/// where the id took up to 3, schema version 5).
#[derive(Default)]
pub(crate) struct BlockBases {
    bases: HashMap<u64, (i64, [u64; BLOCK_WORDS])>,
    last_id: i64,
}

impl BlockBases {
    /// The id of the next allocator row (the table starts empty in each
    /// file the writer creates).
    pub(crate) fn next_id(&self) -> i64 {
        self.last_id + 1
    }

    /// Row `id` (the one [`Self::next_id`] gave) was stored.
    pub(crate) fn stored(&mut self, id: i64) {
        self.last_id = id;
    }

    /// The base row to store `words` of `block` against (its row id and
    /// words), or None: store them all.
    pub(crate) fn base_for(
        &self,
        block: u64,
        words: &[u64; BLOCK_WORDS],
    ) -> Option<(i64, &[u64; BLOCK_WORDS])> {
        let (id, base) = self.bases.get(&block)?;
        let changed = words.iter().zip(base).filter(|(w, b)| w != b).count();
        (changed <= MAX_CHANGED).then_some((*id, base))
    }

    /// Row `id` stores all of `words`: the base of `block`'s next rows.
    pub(crate) fn stored_whole(&mut self, block: u64, id: i64, words: &[u64; BLOCK_WORDS]) {
        if self.bases.len() >= MAX_BLOCKS && !self.bases.contains_key(&block) {
            self.bases.clear();
        }
        self.bases.insert(block, (id, *words));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn words(seed: u64) -> [u64; BLOCK_WORDS] {
        std::array::from_fn(|i| seed.wrapping_mul(0x9e37_79b9) + i as u64 * 0x1_0000_0000)
    }

    #[test]
    fn a_row_is_stored_against_its_blocks_base_while_few_words_change() {
        let mut b = BlockBases::default();
        let w = words(7);
        assert!(b.base_for(1, &w).is_none(), "no base yet");
        b.stored_whole(1, 10, &w);
        assert!(
            b.base_for(2, &w).is_none(),
            "another block's base is not used"
        );
        let mut near = w;
        near[3] = 0;
        near[9] = 1;
        assert_eq!(b.base_for(1, &near).map(|(id, _)| id), Some(10));
        near[11] = 5;
        assert!(
            b.base_for(1, &near).is_none(),
            "3 changed words: stored whole"
        );
        b.stored_whole(1, 20, &near);
        assert_eq!(b.base_for(1, &near).map(|(id, _)| id), Some(20));
    }

    #[test]
    fn past_its_bound_it_forgets_every_base() {
        let mut b = BlockBases::default();
        for block in 0..MAX_BLOCKS as u64 {
            b.stored_whole(block, block as i64, &words(block));
        }
        assert!(b.base_for(0, &words(0)).is_some());
        // A block already known replaces its base without forgetting.
        b.stored_whole(5, 99, &words(5));
        assert!(b.base_for(0, &words(0)).is_some());
        b.stored_whole(MAX_BLOCKS as u64, 1, &words(1));
        assert!(b.base_for(0, &words(0)).is_none());
        assert_eq!(b.bases.len(), 1);
    }
}
