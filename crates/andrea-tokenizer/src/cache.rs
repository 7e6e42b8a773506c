//! A per-thread cache of encoded pieces.
//!
//! Text is Zipfian: a few thousand distinct pieces make up most of it, so remembering
//! the tokens of recent pieces skips most merging. The cache is a fixed table of 65536
//! slots of 64 bytes (4 MiB per thread, allocated on first use), two-way set
//! associative: a piece hashes to a pair of slots, a hit in the second slot swaps it to
//! the first, and an insert pushes the first to the second and drops what was there. No
//! allocation per entry, no lock (each thread has its own; rayon's workers keep theirs
//! across calls), bounded memory, and old entries fade out instead of the cache being
//! emptied. (A small second table for the most frequent pieces, meant to stay in L2, was
//! measured slower: the extra probe costs more than the misses it saves.) Pieces of at most [`KEY_MAX`] bytes and [`IDS_MAX`] tokens are
//! cached: nearly all of them in text.
//!
//! The cache belongs to one tokenizer at a time: each [`crate::Tokenizer`] has a unique
//! instance number, and a thread that switches tokenizers starts a new generation, which
//! makes every older slot a miss.

use std::cell::RefCell;
use std::hash::Hasher;

pub(crate) const KEY_MAX: usize = 22;
pub(crate) const IDS_MAX: usize = 8;
const SETS: usize = 1 << 15;

#[derive(Clone, Copy)]
#[repr(C, align(64))]
struct Slot {
    /// The generation that wrote the slot; 0 is never current, so zeroed slots are empty.
    generation: u32,
    key_len: u8,
    n_ids: u8,
    /// The piece, zero-padded (so comparing is comparing two arrays).
    key: [u8; KEY_MAX],
    ids: [u32; IDS_MAX],
}

const EMPTY: Slot = Slot {
    generation: 0,
    key_len: 0,
    n_ids: 0,
    key: [0; KEY_MAX],
    ids: [0; IDS_MAX],
};

#[derive(Default)]
pub(crate) struct PieceCache {
    owner: u64,
    generation: u32,
    slots: Vec<Slot>,
}

#[inline]
fn padded(piece: &[u8]) -> [u8; KEY_MAX] {
    let mut key = [0u8; KEY_MAX];
    key[..piece.len()].copy_from_slice(piece);
    key
}

#[inline]
fn set_of(piece: &[u8]) -> usize {
    let mut h = rustc_hash::FxHasher::default();
    h.write(piece);
    // Fx mixes into the high bits best.
    ((h.finish() >> 40) as usize & (SETS - 1)) * 2
}

/// Looks `key` up in the set at `i` of `slots`; a hit ends up in the set's first slot.
#[inline]
fn find(slots: &mut [Slot], i: usize, generation: u32, len: usize, key: &[u8; KEY_MAX]) -> bool {
    let hit = |s: &Slot| s.generation == generation && s.key_len as usize == len && s.key == *key;
    if hit(&slots[i]) {
        true
    } else if hit(&slots[i + 1]) {
        slots.swap(i, i + 1);
        true
    } else {
        false
    }
}

#[inline]
fn put(slots: &mut [Slot], i: usize, slot: Slot) {
    slots[i + 1] = slots[i];
    slots[i] = slot;
}

impl PieceCache {
    fn start(&mut self, owner: u64) {
        if self.slots.is_empty() {
            self.slots = vec![EMPTY; 2 * SETS];
        }
        if self.owner != owner || self.generation == 0 {
            self.owner = owner;
            self.generation = self.generation.wrapping_add(1);
            if self.generation == 0 {
                // Wrapped around: old slots could look current again.
                self.slots.fill(EMPTY);
                self.generation = 1;
            }
        }
    }

    /// The tokens of `piece` (at most [`KEY_MAX`] bytes), if cached.
    #[inline]
    pub(crate) fn get(&mut self, piece: &[u8]) -> Option<&[u32]> {
        debug_assert!(piece.len() <= KEY_MAX);
        let key = padded(piece);
        let i = set_of(piece);
        if !find(&mut self.slots, i, self.generation, piece.len(), &key) {
            return None;
        }
        let s = &self.slots[i];
        Some(&s.ids[..s.n_ids as usize])
    }

    /// Remembers the tokens of `piece` (ignored if either is too long to cache).
    #[inline]
    pub(crate) fn insert(&mut self, piece: &[u8], ids: &[u32]) {
        if piece.len() > KEY_MAX || ids.len() > IDS_MAX {
            return;
        }
        let mut slot = Slot {
            generation: self.generation,
            key_len: piece.len() as u8,
            n_ids: ids.len() as u8,
            key: padded(piece),
            ids: [0; IDS_MAX],
        };
        slot.ids[..ids.len()].copy_from_slice(ids);
        put(&mut self.slots, set_of(piece), slot);
    }
}

thread_local! {
    static CACHE: RefCell<PieceCache> = RefCell::new(PieceCache::default());
}

/// Runs `f` with this thread's cache for tokenizer `owner` (a fresh one if the thread's
/// cache is already in use further up the stack).
pub(crate) fn with_cache<R>(owner: u64, f: impl FnOnce(&mut PieceCache) -> R) -> R {
    CACHE.with(|cell| match cell.try_borrow_mut() {
        Ok(mut cache) => {
            cache.start(owner);
            f(&mut cache)
        }
        Err(_) => {
            let mut local = PieceCache::default();
            local.start(owner);
            f(&mut local)
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn remembers_and_forgets_other_tokenizers() {
        let mut c = PieceCache::default();
        c.start(1);
        assert!(c.get(b"hello").is_none());
        c.insert(b"hello", &[1, 2]);
        c.insert(b"world", &[3]);
        assert_eq!(c.get(b"hello"), Some(&[1, 2][..]));
        assert_eq!(c.get(b"world"), Some(&[3][..]));
        assert!(c.get(b"hell").is_none());
        c.insert(b"too many ids", &[0; IDS_MAX + 1]);
        assert!(c.get(b"too many ids").is_none());
        c.start(2);
        assert!(c.get(b"hello").is_none());
        c.start(2);
        c.insert(b"x y", &[7]);
        assert_eq!(c.get(b"x y"), Some(&[7][..]));
    }

    #[test]
    fn bounded_and_still_correct_under_pressure() {
        let mut c = PieceCache::default();
        c.start(1);
        for i in 0..200_000u32 {
            let k = i.to_le_bytes();
            c.insert(&k, &[i]);
        }
        let mut hits = 0;
        for i in 0..200_000u32 {
            if let Some(v) = c.get(&i.to_le_bytes()) {
                assert_eq!(v, [i]);
                hits += 1;
            }
        }
        assert!(hits > 0 && hits <= 2 * SETS);
    }
}
