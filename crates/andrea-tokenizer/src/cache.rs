//! A per-thread cache of encoded pieces.
//!
//! Text is Zipfian: a few thousand distinct pieces make up most of it, so remembering
//! the tokens of recent pieces skips most merging. The cache is thread-local (no lock on
//! the hot path; rayon's workers each keep theirs across calls) and belongs to one
//! tokenizer at a time: each [`crate::Tokenizer`] has a unique instance number, and a
//! thread that switches tokenizers starts its cache afresh. It holds at most
//! [`MAX_ENTRIES`] pieces of at most [`MAX_PIECE_LEN`] bytes (a few MiB per thread) and is
//! emptied when full, which keeps it simple and bounded.

use rustc_hash::FxHashMap;
use std::cell::RefCell;

pub(crate) const MAX_PIECE_LEN: usize = 48;
pub(crate) const MAX_ENTRIES: usize = 1 << 16;

#[derive(Default)]
pub(crate) struct PieceCache {
    owner: u64,
    /// piece -> (start, len) in `ids`.
    map: FxHashMap<Box<[u8]>, (u32, u32)>,
    ids: Vec<u32>,
}

impl PieceCache {
    fn reset(&mut self, owner: u64) {
        self.owner = owner;
        self.map.clear();
        self.ids.clear();
    }

    #[inline]
    pub(crate) fn get(&self, piece: &[u8]) -> Option<&[u32]> {
        self.map
            .get(piece)
            .map(|&(s, l)| &self.ids[s as usize..(s + l) as usize])
    }

    #[inline]
    pub(crate) fn insert(&mut self, piece: &[u8], ids: &[u32]) {
        if self.map.len() >= MAX_ENTRIES {
            self.map.clear();
            self.ids.clear();
        }
        let start = self.ids.len() as u32;
        self.ids.extend_from_slice(ids);
        self.map.insert(piece.into(), (start, ids.len() as u32));
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
            if cache.owner != owner {
                cache.reset(owner);
            }
            f(&mut cache)
        }
        Err(_) => {
            let mut local = PieceCache::default();
            local.reset(owner);
            f(&mut local)
        }
    })
}
