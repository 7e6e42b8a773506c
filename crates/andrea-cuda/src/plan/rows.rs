//! Row kernels: one warp per row (LayerNorm, softmax; kernels/layernorm.cu and
//! softmax.cu) or one block per row (cross-entropy, kernels/loss.cu).

use super::{aligned4, grid, Launch};
use andrea_core::Result;

/// Threads per block of the warp-per-row kernels: 8 warps, 8 rows.
pub const BLOCK: u32 = 256;
/// Rows per block of the warp-per-row kernels.
pub const ROWS_PER_BLOCK: usize = BLOCK as usize / 32;
/// Threads per row of the cross-entropy kernel.
pub const LOSS_BLOCK: u32 = 256;

/// float4 rows when the row length is a multiple of 4 and every view is 16-byte aligned
/// (then every row start is too).
pub fn vec4_rows(row_len: usize, offsets: &[usize]) -> bool {
    row_len.is_multiple_of(4) && aligned4(offsets)
}

/// A warp-per-row launch over `rows` rows of `kernel`.
pub fn warp_per_row(op: &'static str, kernel: &'static str, rows: usize) -> Result<Launch> {
    Ok(Launch {
        kernel,
        grid: grid(op, rows.div_ceil(ROWS_PER_BLOCK), 1, 1)?,
        block: [BLOCK, 1, 1],
        smem: 0,
    })
}

/// A LayerNorm-family launch: `v4` when [`vec4_rows`] holds, else `v1`.
pub fn layernorm(
    op: &'static str,
    v1: &'static str,
    v4: &'static str,
    rows: usize,
    c: usize,
    offsets: &[usize],
) -> Result<Launch> {
    let kernel = if vec4_rows(c, offsets) { v4 } else { v1 };
    warp_per_row(op, kernel, rows)
}

/// The fused softmax-cross-entropy launch: one block per row.
pub fn cross_entropy(rows: usize) -> Result<Launch> {
    Ok(Launch {
        kernel: "softmax_cross_entropy",
        grid: grid("softmax_cross_entropy", rows, 1, 1)?,
        block: [LOSS_BLOCK, 1, 1],
        smem: 0,
    })
}

/// Columns row `row` of a softmax over `[.., q_len, k_len]` keeps (the rest is masked):
/// the kernels' `n`.
pub fn softmax_visible(row: usize, q_len: usize, k_len: usize, causal: Option<usize>) -> usize {
    match causal {
        Some(o) => (o + row % q_len + 1).min(k_len),
        None => k_len,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_cover_every_row_once() {
        for rows in [1, 7, 8, 9, 1000, 16 * 1024] {
            let l = warp_per_row("softmax", "softmax_forward", rows).unwrap();
            let warps = l.grid[0] as usize * ROWS_PER_BLOCK;
            assert!(warps >= rows && warps - rows < ROWS_PER_BLOCK);
        }
    }

    #[test]
    fn vector_rows_need_alignment_and_length() {
        assert!(vec4_rows(768, &[0, 768, 1536]));
        assert!(!vec4_rows(770, &[0]));
        assert!(!vec4_rows(768, &[2]));
        let l = layernorm("layernorm", "ln_v1", "ln_v4", 3, 21, &[0]).unwrap();
        assert_eq!(l.kernel, "ln_v1");
    }

    #[test]
    fn causal_rows_see_offset_plus_one() {
        assert_eq!(softmax_visible(0, 4, 10, Some(2)), 3);
        assert_eq!(softmax_visible(5, 4, 10, Some(2)), 4); // row 5 is query 1
        assert_eq!(softmax_visible(3, 4, 5, Some(2)), 5);
        assert_eq!(softmax_visible(3, 4, 5, None), 5);
    }
}
