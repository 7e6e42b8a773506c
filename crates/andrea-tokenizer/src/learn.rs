//! Learning merges from counted pieces: the BPE training loop.
//!
//! State: every distinct piece ("word") as a sequence of token ids with its count; for
//! every adjacent pair of ids, its count (summed over words, weighted by word counts) and
//! the words it occurs in; a max-heap of candidate pairs.
//!
//! Each step takes the pair with the highest count, **ties broken by the smaller
//! `(left id, right id)`**, makes it a token, and rewrites only the words that contain it,
//! updating the counts of the pairs around each occurrence (incremental: the cost of a
//! step is the number of occurrences it merges, not the corpus size). The heap is lazy:
//! an entry whose count is stale is re-queued with the current count when it surfaces;
//! pairs whose count grows get a fresh entry. So the pair chosen is exactly the best one
//! at every step, and the result depends only on the counts: not on hashing, thread
//! count or input order.
//!
//! With andrea's id layout (bytes in GPT-2 order, then merges in order) this is the rule
//! of the Hugging Face `BpeTrainer` (ids there are specials, then the alphabet sorted by
//! its byte-level characters, which is the same order), so on the same pieces both learn
//! the same merges; `tests/hf_fixtures.rs` checks it. Like that trainer, a merge whose
//! result already is a token (two merges can spell the same string) reuses the token's
//! id and does not count toward the number of new tokens.

use indicatif::ProgressBar;
use rustc_hash::FxHashMap;
use std::cmp::Ordering;
use std::collections::BinaryHeap;

/// A word being merged: its ids and how often it occurs.
pub(crate) struct Word {
    pub ids: Vec<u32>,
    pub count: i64,
}

#[derive(Default)]
struct Pairs {
    index: FxHashMap<u64, u32>,
    /// Per pair: its two ids, its count, the words it may occur in (each listed once
    /// per time it appeared there; an entry may be stale, which merging tolerates).
    ids: Vec<(u32, u32)>,
    count: Vec<i64>,
    words: Vec<Vec<u32>>,
    /// Pairs whose count grew in this step (to re-queue).
    grown: Vec<u32>,
    is_grown: Vec<bool>,
}

impl Pairs {
    #[inline]
    fn id(&mut self, a: u32, b: u32) -> u32 {
        let key = ((a as u64) << 32) | b as u64;
        match self.index.entry(key) {
            std::collections::hash_map::Entry::Occupied(e) => *e.get(),
            std::collections::hash_map::Entry::Vacant(e) => {
                let id = self.ids.len() as u32;
                e.insert(id);
                self.ids.push((a, b));
                self.count.push(0);
                self.words.push(Vec::new());
                self.is_grown.push(false);
                id
            }
        }
    }

    /// Adds `delta` to the count of `(a, b)`; `w` is the word where it happened.
    #[inline]
    fn bump(&mut self, a: u32, b: u32, delta: i64, w: u32) {
        let p = self.id(a, b) as usize;
        self.count[p] += delta;
        if delta > 0 {
            let list = &mut self.words[p];
            if list.last() != Some(&w) {
                list.push(w);
            }
            if !self.is_grown[p] {
                self.is_grown[p] = true;
                self.grown.push(p as u32);
            }
        }
    }
}

/// A heap entry: higher count first, then the smaller pair of ids.
#[derive(PartialEq, Eq)]
struct Candidate {
    count: i64,
    a: u32,
    b: u32,
    pair: u32,
}

impl Ord for Candidate {
    fn cmp(&self, other: &Self) -> Ordering {
        self.count
            .cmp(&other.count)
            .then_with(|| (other.a, other.b).cmp(&(self.a, self.b)))
    }
}

impl PartialOrd for Candidate {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

/// Learns merges until `new_tokens` tokens have been made, no pair is left, or the best
/// pair occurs fewer than `min_count` times. `tokens` holds the bytes of the existing
/// ids (at least those the words use) and receives the new tokens; returns the merges
/// as `[left, right, merged]` in rank order.
pub(crate) fn learn(
    mut words: Vec<Word>,
    tokens: &mut Vec<Box<[u8]>>,
    new_tokens: usize,
    min_count: u64,
    progress: &ProgressBar,
) -> Vec<[u32; 3]> {
    let mut pairs = Pairs::default();
    for (w, word) in words.iter().enumerate() {
        for win in word.ids.windows(2) {
            pairs.bump(win[0], win[1], word.count, w as u32);
        }
    }
    let mut heap = BinaryHeap::with_capacity(pairs.ids.len());
    for p in pairs.grown.drain(..) {
        pairs.is_grown[p as usize] = false;
        let (a, b) = pairs.ids[p as usize];
        heap.push(Candidate {
            count: pairs.count[p as usize],
            a,
            b,
            pair: p,
        });
    }

    let mut index: FxHashMap<Box<[u8]>, u32> = tokens
        .iter()
        .enumerate()
        .map(|(i, t)| (t.clone(), i as u32))
        .collect();
    // Counts are i64: a minimum beyond i64::MAX is one no pair reaches (not, wrapped, one
    // every pair does).
    let min_count = i64::try_from(min_count.max(1)).unwrap_or(i64::MAX);
    // Grown as merges are made: `new_tokens` is the user's number and may be huge.
    let mut merges = Vec::with_capacity(new_tokens.min(1 << 16));
    let mut made = 0;
    while made < new_tokens {
        let Some(top) = heap.pop() else { break };
        let current = pairs.count[top.pair as usize];
        if current != top.count {
            if current > 0 {
                heap.push(Candidate {
                    count: current,
                    ..top
                });
            }
            continue;
        }
        if current < min_count {
            break;
        }
        let (a, b) = (top.a, top.b);
        let merged: Box<[u8]> = [&tokens[a as usize][..], &tokens[b as usize][..]]
            .concat()
            .into();
        let c = match index.get(&merged) {
            Some(&id) => id,
            None => {
                let id = tokens.len() as u32;
                tokens.push(merged.clone());
                index.insert(merged, id);
                made += 1;
                progress.inc(1);
                id
            }
        };
        merges.push([a, b, c]);

        let occurs_in = std::mem::take(&mut pairs.words[top.pair as usize]);
        for &w in &occurs_in {
            merge_in_word(&mut words[w as usize], w, a, b, c, top.pair, &mut pairs);
        }
        debug_assert_eq!(pairs.count[top.pair as usize], 0);
        for p in std::mem::take(&mut pairs.grown) {
            pairs.is_grown[p as usize] = false;
            let count = pairs.count[p as usize];
            if count > 0 {
                let (a, b) = pairs.ids[p as usize];
                heap.push(Candidate {
                    count,
                    a,
                    b,
                    pair: p,
                });
            }
        }
    }
    merges
}

/// Replaces each occurrence of `(a, b)` in word `w` by `c`, left to right without
/// overlap, and updates the counts of the pairs around it.
#[inline]
fn merge_in_word(word: &mut Word, w: u32, a: u32, b: u32, c: u32, ab: u32, pairs: &mut Pairs) {
    let ids = &mut word.ids;
    let n = ids.len();
    let count = word.count;
    let (mut read, mut write) = (0, 0);
    while read < n {
        if read + 1 < n && ids[read] == a && ids[read + 1] == b {
            // `ids[write - 1]` is the new left neighbour (possibly a `c` just made),
            // `ids[read + 2]` the old right one.
            if write > 0 {
                let left = ids[write - 1];
                pairs.bump(left, a, -count, w);
                pairs.bump(left, c, count, w);
            }
            if read + 2 < n {
                let right = ids[read + 2];
                pairs.bump(b, right, -count, w);
                pairs.bump(c, right, count, w);
            }
            pairs.count[ab as usize] -= count;
            ids[write] = c;
            read += 2;
        } else {
            ids[write] = ids[read];
            read += 1;
        }
        write += 1;
    }
    ids.truncate(write);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bytes(s: &str) -> Word {
        Word {
            ids: s.bytes().map(u32::from).collect(),
            count: 1,
        }
    }

    fn alphabet() -> Vec<Box<[u8]>> {
        (0..=255u8).map(|b| Box::from([b].as_slice())).collect()
    }

    #[test]
    fn most_frequent_pair_first_ties_to_smaller_ids() {
        let mut tokens = alphabet();
        let words = vec![
            Word {
                count: 3,
                ..bytes("ab")
            },
            Word {
                count: 3,
                ..bytes("cd")
            },
            Word {
                count: 5,
                ..bytes("xy")
            },
        ];
        let merges = learn(words, &mut tokens, 3, 1, &ProgressBar::hidden());
        let a = |s: &str| s.as_bytes()[0] as u32;
        assert_eq!(
            merges,
            [
                [a("x"), a("y"), 256],
                [a("a"), a("b"), 257],
                [a("c"), a("d"), 258]
            ]
        );
        assert_eq!(&*tokens[257], b"ab");
    }

    #[test]
    fn overlapping_occurrences_are_counted_once() {
        // "aaaa": pair (a, a) occurs 3 times, merges twice; then (aa, aa).
        let mut tokens = alphabet();
        let merges = learn(
            vec![bytes("aaaa")],
            &mut tokens,
            5,
            1,
            &ProgressBar::hidden(),
        );
        assert_eq!(merges, [[97, 97, 256], [256, 256, 257]]);
    }

    #[test]
    fn stops_at_min_count() {
        let mut tokens = alphabet();
        let words = vec![
            Word {
                count: 2,
                ..bytes("ab")
            },
            bytes("cd"),
        ];
        let merges = learn(words, &mut tokens, 10, 2, &ProgressBar::hidden());
        assert_eq!(merges.len(), 1);
    }
}
