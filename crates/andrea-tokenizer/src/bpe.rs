//! Applying merges to one piece: rank-priority BPE.
//!
//! A piece starts as its bytes' tokens. Repeatedly, of all adjacent pairs that have a
//! merge, the one with the lowest rank (the earliest learned) is replaced by the merge's
//! token; among equal pairs the leftmost goes first. This is what GPT-2, `tiktoken` and
//! `tokenizers` compute. Short pieces (almost all of them) use a plain scan over a small
//! array of pair ranks, long ones a heap over a linked list (`O(n log n)`, so a megabyte
//! of `=` signs is not quadratic).

use rustc_hash::FxHashMap;
use std::cmp::Reverse;
use std::collections::BinaryHeap;

/// Pieces up to this many tokens use the quadratic scan.
const SCAN_MAX: usize = 48;

/// The merges of a vocabulary: pair of token ids -> (rank, merged token id).
#[derive(Clone, Debug, Default)]
pub(crate) struct MergeTable {
    map: FxHashMap<u64, u64>,
}

#[inline(always)]
fn key(a: u32, b: u32) -> u64 {
    ((a as u64) << 32) | b as u64
}

impl MergeTable {
    /// Builds the table from merges in rank order. A pair listed twice keeps its later
    /// rank, as `tokenizers` does when it loads such a file.
    pub(crate) fn new(merges: &[[u32; 3]]) -> Self {
        let mut map = FxHashMap::with_capacity_and_hasher(merges.len(), Default::default());
        for (rank, &[a, b, c]) in merges.iter().enumerate() {
            map.insert(key(a, b), ((rank as u64) << 32) | c as u64);
        }
        MergeTable { map }
    }

    /// `(rank, merged id)` of the pair, if it is a merge.
    #[inline(always)]
    fn get(&self, a: u32, b: u32) -> Option<(u32, u32)> {
        self.map
            .get(&key(a, b))
            .map(|&v| ((v >> 32) as u32, v as u32))
    }

    /// Merges the tokens of one piece in place (`ids` holds the piece's byte tokens on
    /// entry, its BPE tokens on return).
    pub(crate) fn apply(&self, ids: &mut Vec<u32>) {
        if ids.len() < 2 {
            return;
        }
        if ids.len() <= SCAN_MAX {
            self.apply_scan(ids);
        } else {
            self.apply_heap(ids);
        }
    }

    fn apply_scan(&self, ids: &mut Vec<u32>) {
        // Fixed arrays on the stack; for pair i = (syms[i], syms[i + 1]): its rank
        // (u32::MAX: no merge) and the token it merges to.
        let mut syms = [0u32; SCAN_MAX];
        let mut rank = [u32::MAX; SCAN_MAX];
        let mut merged = [0u32; SCAN_MAX];
        let mut n = ids.len();
        syms[..n].copy_from_slice(ids);
        for i in 0..n - 1 {
            if let Some((r, m)) = self.get(syms[i], syms[i + 1]) {
                rank[i] = r;
                merged[i] = m;
            }
        }
        while n > 1 {
            let mut best = u32::MAX;
            let mut at = 0;
            for (i, &r) in rank[..n - 1].iter().enumerate() {
                if r < best {
                    best = r;
                    at = i;
                }
            }
            if best == u32::MAX {
                break;
            }
            syms[at] = merged[at];
            for j in at + 1..n - 1 {
                syms[j] = syms[j + 1];
            }
            for j in at + 1..n.saturating_sub(2) {
                rank[j] = rank[j + 1];
                merged[j] = merged[j + 1];
            }
            n -= 1;
            if at + 1 < n {
                (rank[at], merged[at]) = self.get(syms[at], syms[at + 1]).unwrap_or((u32::MAX, 0));
            }
            if at > 0 {
                (rank[at - 1], merged[at - 1]) =
                    self.get(syms[at - 1], syms[at]).unwrap_or((u32::MAX, 0));
            }
        }
        ids.clear();
        ids.extend_from_slice(&syms[..n]);
    }

    fn apply_heap(&self, ids: &mut Vec<u32>) {
        // A doubly linked list over the symbols; merging (i, next[i]) keeps symbol i.
        const NONE: usize = usize::MAX;
        let n = ids.len();
        let mut next: Vec<usize> = (1..=n).collect();
        next[n - 1] = NONE;
        let mut prev: Vec<usize> = (0..n).map(|i| i.wrapping_sub(1)).collect();
        prev[0] = NONE;
        let mut alive = vec![true; n];
        // (rank, position, the pair's tokens): popped lowest rank first, then leftmost.
        let mut heap = BinaryHeap::with_capacity(n);
        for i in 0..n - 1 {
            if let Some((r, _)) = self.get(ids[i], ids[i + 1]) {
                heap.push(Reverse((r, i, ids[i], ids[i + 1])));
            }
        }
        while let Some(Reverse((rank, i, a, b))) = heap.pop() {
            let j = next[i];
            // Skip entries made stale by an earlier merge around them.
            if !alive[i] || j == NONE || ids[i] != a || ids[j] != b {
                continue;
            }
            let Some((r, merged)) = self.get(a, b) else {
                continue;
            };
            if r != rank {
                continue;
            }
            ids[i] = merged;
            alive[j] = false;
            next[i] = next[j];
            if next[j] != NONE {
                prev[next[j]] = i;
            }
            if prev[i] != NONE {
                let p = prev[i];
                if let Some((r, _)) = self.get(ids[p], ids[i]) {
                    heap.push(Reverse((r, p, ids[p], ids[i])));
                }
            }
            if next[i] != NONE {
                let q = next[i];
                if let Some((r, _)) = self.get(ids[i], ids[q]) {
                    heap.push(Reverse((r, i, ids[i], ids[q])));
                }
            }
        }
        let mut w = 0;
        for r in 0..n {
            if alive[r] {
                ids[w] = ids[r];
                w += 1;
            }
        }
        ids.truncate(w);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A toy vocabulary over ids 0..4 ("a", "b", "c", "d").
    fn table() -> MergeTable {
        MergeTable::new(&[
            [0, 1, 10],   // a b -> ab
            [10, 2, 11],  // ab c -> abc
            [0, 0, 12],   // a a -> aa
            [12, 12, 13], // aa aa -> aaaa
            [2, 3, 14],   // c d -> cd
        ])
    }

    #[test]
    fn lowest_rank_first() {
        let t = table();
        let mut ids = vec![0, 1, 2, 3];
        t.apply(&mut ids);
        assert_eq!(ids, [11, 3]); // (ab)c d, not ab (cd)
    }

    #[test]
    fn leftmost_among_equals() {
        let t = table();
        let mut ids = vec![0, 0, 0];
        t.apply(&mut ids);
        assert_eq!(ids, [12, 0]);
        let mut ids = vec![0, 0, 0, 0, 0];
        t.apply(&mut ids);
        assert_eq!(ids, [13, 0]);
    }

    #[test]
    fn heap_agrees_with_scan() {
        let t = table();
        let mut rand = andrea_testkit::random::Rand::new(12345);
        for len in [2usize, 3, 7, 20, 47, 48] {
            for _ in 0..50 {
                let base: Vec<u32> = rand.ids(len, 4);
                let mut a = base.clone();
                t.apply_scan(&mut a);
                let mut b = base.clone();
                t.apply_heap(&mut b);
                assert_eq!(a, b, "{base:?}");
            }
        }
    }
}
