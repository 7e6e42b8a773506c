//! Reductions: bias gradients and the squared norm, in orders fixed by the sizes alone.

use rayon::prelude::*;

use crate::buffer::SendPtr;
use crate::elementwise::add_assign;
use crate::par::cols_per_task;
use crate::simd::multiversion;

/// `dbias[j] += Σ_i dout[i, j]` for `dout: [n, m]`: column bands, rows in order.
pub(crate) fn bias_backward(dout: &[f32], dbias: &mut [f32], n: usize, m: usize) {
    let band = cols_per_task(n, m);
    let p = SendPtr(dbias.as_mut_ptr());
    (0..m.div_ceil(band)).into_par_iter().for_each(|i| {
        let c0 = i * band;
        let c1 = (c0 + band).min(m);
        let mut acc = vec![0.0f32; c1 - c0];
        for row in dout.chunks_exact(m) {
            add_assign(&mut acc, &row[c0..c1]);
        }
        for (j, a) in (c0..c1).zip(acc) {
            // SAFETY: `j < m`, and the band `c0..c1` belongs to this task alone.
            unsafe { *p.get().add(j) += a };
        }
    });
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
