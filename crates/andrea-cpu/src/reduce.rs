//! Reductions: bias gradients and the squared norm, in orders fixed by the sizes alone.

use rayon::prelude::*;

use crate::elementwise::add_assign;
use crate::simd::multiversion;

/// Elements of `dout` per partial column sum of [`bias_backward`] (512 KB): a task's rows
/// are one contiguous stretch of memory, which the hardware prefetchers stream, and the
/// partials cost 1/43 of the input's reads at `[1024, 3072]`.
const BIAS_PARTIAL_ELEMS: usize = 1 << 17;

/// Rows per partial of [`bias_backward`] for rows of `m` (sizes alone fix it).
fn bias_rows_per_partial(m: usize) -> usize {
    (BIAS_PARTIAL_ELEMS / m.max(1)).max(1)
}

/// `dbias[j] += Σ_i dout[i, j]` for `dout: [n, m]`.
///
/// Rows are cut into blocks of [`bias_rows_per_partial`] (a stretch of whole rows, read
/// front to back: column bands read a few cache lines from every row, a stride the
/// prefetchers do not follow, and ran at half a copy's speed); each block's column sums
/// go into a partial, rows added in order; then each column adds its partials in block
/// order, and that total into `dbias`. The order depends on `n` and `m` alone, so the
/// bits do not depend on the thread count, and only adds are used, so every
/// instruction-set copy gives the same bits.
pub(crate) fn bias_backward(dout: &[f32], dbias: &mut [f32], n: usize, m: usize) {
    bias_backward_in_blocks(dout, dbias, n, m, bias_rows_per_partial(m));
}

/// [`bias_backward`] with blocks of `rows` rows (a parameter so tests can cross blocks
/// at small sizes).
fn bias_backward_in_blocks(dout: &[f32], dbias: &mut [f32], n: usize, m: usize, rows: usize) {
    let dout = &dout[..n * m];
    let blocks = n.div_ceil(rows);
    if blocks <= 1 {
        let mut acc = vec![0.0f32; m];
        column_sums(dout, &mut acc);
        add_assign(dbias, &acc);
        return;
    }
    let mut partials = vec![0.0f32; blocks * m];
    partials
        .par_chunks_mut(m)
        .zip(dout.par_chunks(rows * m))
        .for_each(|(acc, block)| column_sums(block, acc));
    // Columns in bands of 1024, each band's partials added in block order.
    let band = 1024;
    dbias.par_chunks_mut(band).enumerate().for_each(|(i, out)| {
        let (c0, w) = (i * band, out.len());
        let mut total = partials[c0..c0 + w].to_vec();
        for b in 1..blocks {
            add_assign(&mut total, &partials[b * m + c0..][..w]);
        }
        add_assign(out, &total);
    });
}

multiversion! {
    /// `acc[j] += Σ_i rows[i, j]` for the whole rows of `rows` (each `acc.len()` long),
    /// rows added in order, four per pass over `acc` so it is loaded and stored once a
    /// pass: `(((acc + r0) + r1) + r2) + r3`, the same order as one row at a time.
    fn column_sums(rows: &[f32], acc: &mut [f32]) {
        let m = acc.len();
        let mut quads = rows.chunks_exact(4 * m);
        for q in &mut quads {
            let (r0, r) = q.split_at(m);
            let (r1, r) = r.split_at(m);
            let (r2, r3) = r.split_at(m);
            for ((((a, &x0), &x1), &x2), &x3) in acc.iter_mut().zip(r0).zip(r1).zip(r2).zip(r3) {
                *a = *a + x0 + x1 + x2 + x3;
            }
        }
        for r in quads.remainder().chunks_exact(m) {
            for (a, &x) in acc.iter_mut().zip(r) {
                *a += x;
            }
        }
    }
}

/// Elements per partial sum of [`sum_squares`]; the partials are then added in order.
const SUMSQ_CHUNK: usize = 1 << 16;

/// f64 lanes of [`sum_squares`]: four AVX-512 (eight AVX2) accumulators, so the adds are
/// four independent chains, not one.
const SUMSQ_LANES: usize = 32;

multiversion! {
    avx512;
    /// `Σ x²` of one chunk in f64: element `i` of each block of 32 into lane `i`, the
    /// last block zero-padded, the lanes folded as a tree (the same order in every copy).
    fn sum_squares_chunk(c: &[f32]) -> f64 {
        let mut acc = [0.0f64; SUMSQ_LANES];
        let chunks = c.chunks_exact(SUMSQ_LANES);
        let mut last = [0.0f32; SUMSQ_LANES];
        last[..chunks.remainder().len()].copy_from_slice(chunks.remainder());
        for ch in chunks.chain(std::iter::once(&last[..])) {
            for i in 0..SUMSQ_LANES {
                let v = ch[i] as f64;
                acc[i] += v * v;
            }
        }
        let mut w = SUMSQ_LANES / 2;
        while w >= 1 {
            for i in 0..w {
                acc[i] += acc[i + w];
            }
            w /= 2;
        }
        acc[0]
    }
}

/// `Σ x²` in f64: fixed chunks, each summed in 32 f64 lanes, chunks added in order.
pub(crate) fn sum_squares(x: &[f32]) -> f64 {
    let partials: Vec<f64> = x.par_chunks(SUMSQ_CHUNK).map(sum_squares_chunk).collect();
    partials.iter().sum()
}

#[cfg(test)]
mod tests {
    use super::*;
    use andrea_testkit::random::Rand;
    use andrea_testkit::tol;

    /// `dbias + Σ_i dout[i, j]` in f64.
    fn reference(dout: &[f32], dbias: &[f32], n: usize, m: usize) -> Vec<f64> {
        let mut want: Vec<f64> = dbias.iter().map(|&v| v as f64).collect();
        for row in dout[..n * m].chunks_exact(m) {
            for (w, &v) in want.iter_mut().zip(row) {
                *w += v as f64;
            }
        }
        want
    }

    /// Blocks of every size around the four-row passes (1 to 9 rows: remainders 0-3 of
    /// a block, the last block short), column counts not a multiple of any vector width,
    /// and one band of columns past 1024; then the production blocking at a size where a
    /// block is 131 rows and the last one ragged (the conformance suite's shapes stay
    /// under 6000 elements, one block). Tolerance `tol::bias_backward(n)`, the suite's:
    /// `n`-term f32 sums of values in [-1, 1].
    #[test]
    fn column_sums_cross_blocks_and_ragged_columns() {
        let mut r = Rand::new(17);
        let mut cases: Vec<(usize, usize, usize)> = Vec::new();
        for rows in 1..=9 {
            for (n, m) in [(23, 1), (23, 7), (37, 17), (41, 33), (13, 1030)] {
                cases.push((n, m, rows));
            }
        }
        cases.push((300, 1000, bias_rows_per_partial(1000)));
        for (n, m, rows) in cases {
            let dout = r.vec(n * m + 5, -1.0, 1.0);
            let mut dbias = r.vec(m, -1.0, 1.0);
            let want = reference(&dout, &dbias, n, m);
            if rows == bias_rows_per_partial(m) {
                bias_backward(&dout, &mut dbias, n, m);
            } else {
                bias_backward_in_blocks(&dout, &mut dbias, n, m, rows);
            }
            tol::bias_backward(n)
                .check(
                    &format!("bias_backward n {n} m {m} blocks of {rows}"),
                    &dbias,
                    &want,
                )
                .unwrap();
        }
    }
}
