//! Deterministic reductions (kernels/bias.cu, layernorm.cu's parameter partials,
//! norm.cu): fixed chunks whose boundaries depend only on the sizes, then an ordered
//! final sum, so results are bit-identical from run to run and across GPUs.

use super::{grid, Launch};
use andrea_core::Result;

/// Threads per block of the column kernels (one column each).
pub const COL_BLOCK: u32 = 256;
/// The fewest rows one chunk of a column sum covers.
pub const MIN_ROWS_PER_CHUNK: usize = 64;
/// The most chunks (and so partial rows of scratch) a column sum uses.
pub const MAX_CHUNKS: usize = 1024;

/// A two-pass column sum of `[rows, cols]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ColumnSums {
    pub rows_per_chunk: usize,
    pub chunks: usize,
    /// `column_partials` (or `layernorm_param_partials`): grid (column blocks, chunks).
    pub partials: Launch,
    /// `column_finish`.
    pub finish: Launch,
}

impl ColumnSums {
    /// Scratch floats for `per_row` interleaved sums (1 for a bias, 2 for LayerNorm's
    /// γ and β).
    pub fn scratch_len(&self, cols: usize, per_row: usize) -> usize {
        self.chunks * cols * per_row
    }
}

/// Plans a column sum of `[rows, cols]` with partials kernel `partials`.
pub fn column_sums(
    op: &'static str,
    partials: &'static str,
    rows: usize,
    cols: usize,
) -> Result<ColumnSums> {
    let rows_per_chunk = rows.div_ceil(MAX_CHUNKS).max(MIN_ROWS_PER_CHUNK);
    let chunks = rows.div_ceil(rows_per_chunk);
    let col_blocks = cols.div_ceil(COL_BLOCK as usize);
    Ok(ColumnSums {
        rows_per_chunk,
        chunks,
        partials: Launch {
            kernel: partials,
            grid: grid(op, col_blocks, chunks, 1)?,
            block: [COL_BLOCK, 1, 1],
            smem: 0,
        },
        finish: Launch {
            kernel: "column_finish",
            grid: grid(op, col_blocks, 1, 1)?,
            block: [COL_BLOCK, 1, 1],
            smem: 0,
        },
    })
}

/// Threads per block of the sum-of-squares kernels.
pub const SQ_BLOCK: u32 = 256;
/// The most partial sums (f64) of a sum of squares: the size of the backend's buffer.
pub const SQ_MAX_PARTIALS: usize = 1024;
/// The fewest elements one block sums.
pub const SQ_MIN_CHUNK: usize = 4096;

/// A two-pass sum of squares over `n` elements.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SumSquares {
    /// Elements per block (a multiple of 4, so float4 chunks stay aligned).
    pub chunk: usize,
    pub partials: Launch,
    pub finish: Launch,
}

/// Plans [`andrea_core::OptimOps::sum_squares`] over `n` elements at `offset`.
pub fn sum_squares(n: usize, offset: usize) -> Result<SumSquares> {
    let chunk = n
        .div_ceil(SQ_MAX_PARTIALS)
        .max(SQ_MIN_CHUNK)
        .next_multiple_of(4);
    let blocks = n.div_ceil(chunk);
    Ok(SumSquares {
        chunk,
        partials: Launch {
            kernel: if offset.is_multiple_of(4) {
                "sum_squares_partials_v4"
            } else {
                "sum_squares_partials_v1"
            },
            grid: grid("sum_squares", blocks, 1, 1)?,
            block: [SQ_BLOCK, 1, 1],
            smem: 0,
        },
        finish: Launch {
            kernel: "sum_squares_finish",
            grid: [1, 1, 1],
            block: [SQ_BLOCK, 1, 1],
            smem: 0,
        },
    })
}

/// [`andrea_core::OptimOps::clip_scale`]: one block reads the total the last
/// [`sum_squares`] left and checks the guard.
pub const CLIP_SCALE: Launch = Launch {
    kernel: "clip_scale",
    grid: [1, 1, 1],
    block: [SQ_BLOCK, 1, 1],
    smem: 0,
};

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn chunks_cover_rows_exactly(rows in 1usize..3_000_000, cols in 1usize..10_000) {
            let p = column_sums("bias_backward", "column_partials", rows, cols).unwrap();
            prop_assert!(p.chunks <= MAX_CHUNKS);
            prop_assert!((p.chunks - 1) * p.rows_per_chunk < rows);
            prop_assert!(p.chunks * p.rows_per_chunk >= rows);
            prop_assert!(p.partials.grid[0] as usize * COL_BLOCK as usize >= cols);
        }

        #[test]
        fn squares_fit_the_partial_buffer(n in 1usize..(1usize << 34), off in 0usize..8) {
            let p = sum_squares(n, off).unwrap();
            let blocks = p.partials.grid[0] as usize;
            prop_assert!(blocks <= SQ_MAX_PARTIALS);
            prop_assert!(blocks * p.chunk >= n && (blocks - 1) * p.chunk < n);
            prop_assert_eq!(p.chunk % 4, 0);
        }
    }

    #[test]
    fn chunking_depends_only_on_the_shape() {
        let a = column_sums("x", "column_partials", 16 * 1024, 768).unwrap();
        assert_eq!((a.rows_per_chunk, a.chunks), (64, 256));
        assert_eq!(a.scratch_len(768, 2), 256 * 768 * 2);
        assert_eq!(
            sum_squares(10, 2).unwrap().partials.kernel,
            "sum_squares_partials_v1"
        );
    }
}
