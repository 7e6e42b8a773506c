//! Embedding planning (kernels/embedding.cu), including the host-side sort that makes
//! the backward pass deterministic without atomics.

use super::{aligned4, grid, int, Launch};
use andrea_core::Result;

/// Threads per block (over channels).
pub const BLOCK: u32 = 128;

/// One block per token.
pub fn forward(tokens: usize, c: usize, offsets: &[usize]) -> Result<Launch> {
    int("embedding", "channels", c)?;
    let v4 = c.is_multiple_of(4) && aligned4(offsets);
    Ok(Launch {
        kernel: if v4 {
            "embedding_forward_v4"
        } else {
            "embedding_forward_v1"
        },
        grid: grid("embedding", tokens, 1, 1)?,
        block: [BLOCK, 1, 1],
        smem: 0,
    })
}

/// Token positions grouped by id: `order` lists the positions of each id in increasing
/// order, segment `s` is `order[start[s]..start[s + 1]]` and belongs to `ids[s]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Segments {
    pub order: Vec<u32>,
    pub start: Vec<u32>,
    pub ids: Vec<u32>,
}

impl Segments {
    /// Groups the positions of `tokens` by id (a stable sort, so each segment keeps
    /// increasing positions: the order the CPU backend adds them in).
    pub fn of(tokens: &[u32]) -> Self {
        let mut order: Vec<u32> = (0..tokens.len() as u32).collect();
        order.sort_by_key(|&p| tokens[p as usize]);
        let mut start = Vec::new();
        let mut ids = Vec::new();
        for (i, &p) in order.iter().enumerate() {
            let id = tokens[p as usize];
            if ids.last() != Some(&id) {
                ids.push(id);
                start.push(i as u32);
            }
        }
        start.push(order.len() as u32);
        Segments { order, start, ids }
    }

    /// `order`, `start` and `ids` in one array (one upload), and their offsets in it.
    pub fn packed(&self) -> (Vec<u32>, [usize; 3]) {
        let mut v = Vec::with_capacity(self.order.len() + self.start.len() + self.ids.len());
        v.extend_from_slice(&self.order);
        v.extend_from_slice(&self.start);
        v.extend_from_slice(&self.ids);
        (
            v,
            [0, self.order.len(), self.order.len() + self.start.len()],
        )
    }
}

/// The two backward launches: `(dwte by segment, dwpe by position)`.
pub fn backward(segments: usize, seq: usize) -> Result<(Launch, Launch)> {
    const OP: &str = "embedding_backward";
    let wte = Launch {
        kernel: "embedding_backward_wte",
        grid: grid(OP, segments, 1, 1)?,
        block: [BLOCK, 1, 1],
        smem: 0,
    };
    let wpe = Launch {
        kernel: "embedding_backward_wpe",
        grid: grid(OP, seq, 1, 1)?,
        block: [BLOCK, 1, 1],
        smem: 0,
    };
    Ok((wte, wpe))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn segments_of_a_small_sequence() {
        let s = Segments::of(&[5, 2, 5, 5, 0, 2]);
        assert_eq!(s.ids, vec![0, 2, 5]);
        assert_eq!(s.start, vec![0, 1, 3, 6]);
        assert_eq!(s.order, vec![4, 1, 5, 0, 2, 3]);
        let (packed, at) = s.packed();
        assert_eq!(at, [0, 6, 10]);
        assert_eq!(packed.len(), 13);
    }

    proptest! {
        /// Each position appears once, in the segment of its id, in increasing order.
        #[test]
        fn segments_partition_positions(tokens in prop::collection::vec(0u32..20, 1..300)) {
            let s = Segments::of(&tokens);
            prop_assert_eq!(s.start.len(), s.ids.len() + 1);
            let mut seen = vec![false; tokens.len()];
            for (k, &id) in s.ids.iter().enumerate() {
                let seg = &s.order[s.start[k] as usize..s.start[k + 1] as usize];
                prop_assert!(!seg.is_empty());
                prop_assert!(seg.windows(2).all(|w| w[0] < w[1]));
                for &p in seg {
                    prop_assert_eq!(tokens[p as usize], id);
                    prop_assert!(!seen[p as usize]);
                    seen[p as usize] = true;
                }
            }
            prop_assert!(seen.iter().all(|&x| x));
        }
    }
}
