//! Elementwise kernels (add, scale, GELU and its backward, AdamW): a 1-D grid-stride
//! loop, optionally over float4 groups with a scalar tail (kernels/elementwise.cu).

use super::{aligned4, grid, Launch};
use andrea_core::Result;

/// Threads per block.
pub const BLOCK: u32 = 256;
/// At most this many blocks; the grid-stride loop covers the rest (a few waves on any
/// current GPU, and the launch stays cheap for huge tensors).
pub const MAX_BLOCKS: usize = 8192;

/// Elements per access: 4 (16-byte float4) when every view starts 16-byte aligned,
/// else 1. Any length works: the kernels do the `n mod 4` tail with scalar accesses.
pub fn vector_width(offsets: &[usize]) -> usize {
    if aligned4(offsets) {
        4
    } else {
        1
    }
}

/// The launch of kernel `v1` or `v4` (chosen by [`vector_width`] of `offsets`) over `n`
/// elements.
pub fn launch(
    op: &'static str,
    v1: &'static str,
    v4: &'static str,
    n: usize,
    offsets: &[usize],
) -> Result<Launch> {
    let vec = vector_width(offsets);
    let per_block = BLOCK as usize * vec;
    let blocks = n.div_ceil(per_block).clamp(1, MAX_BLOCKS);
    Ok(Launch {
        kernel: if vec == 4 { v4 } else { v1 },
        grid: grid(op, blocks, 1, 1)?,
        block: [BLOCK, 1, 1],
        smem: 0,
    })
}

/// The element indices each thread of `l` touches, in the kernels' own order (the
/// float4 loop, then the tail). A model of the kernels' index arithmetic, for tests.
pub fn touched(l: &Launch, n: usize) -> Vec<usize> {
    let threads = l.grid[0] as usize * l.block[0] as usize;
    let mut out = Vec::new();
    let vec4 = l.kernel.ends_with("_v4");
    for tid in 0..threads {
        if vec4 {
            let n4 = n / 4;
            let mut i = tid;
            while i < n4 {
                out.extend(4 * i..4 * i + 4);
                i += threads;
            }
            if n4 * 4 + tid < n {
                out.push(n4 * 4 + tid);
            }
        } else {
            let mut i = tid;
            while i < n {
                out.push(i);
                i += threads;
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn vector_width_follows_alignment() {
        assert_eq!(vector_width(&[0, 8, 4]), 4);
        assert_eq!(vector_width(&[0, 2]), 1);
        let l = launch("add", "add_v1", "add_v4", 10, &[4, 4]).unwrap();
        assert_eq!(l.kernel, "add_v4");
        assert_eq!(l.grid, [1, 1, 1]);
        let big = launch("add", "add_v1", "add_v4", 1 << 30, &[0]).unwrap();
        assert_eq!(big.grid[0] as usize, MAX_BLOCKS);
    }

    proptest! {
        /// Every element in [0, n) is touched exactly once, and nothing else, for odd
        /// sizes, both widths and grids much smaller than the tensor.
        #[test]
        fn each_element_exactly_once(n in 1usize..5000, off in 0usize..8, blocks in 1u32..4) {
            let mut l = launch("gelu", "g_v1", "g_v4", n, &[off]).unwrap();
            l.grid[0] = l.grid[0].min(blocks);
            let mut t = touched(&l, n);
            t.sort_unstable();
            prop_assert_eq!(t, (0..n).collect::<Vec<_>>());
        }
    }
}
