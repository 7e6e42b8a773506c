//! Reductions: bias gradients and the squared norm, in orders fixed by the sizes alone.

use rayon::prelude::*;

use crate::buffer::SendPtr;
use crate::par::cols_per_task;

/// `dbias[j] += Σ_i dout[i, j]` for `dout: [n, m]`: column bands, rows in order.
pub(crate) fn bias_backward(dout: &[f32], dbias: &mut [f32], n: usize, m: usize) {
    let band = cols_per_task(n, m);
    let p = SendPtr(dbias.as_mut_ptr());
    (0..m.div_ceil(band)).into_par_iter().for_each(|i| {
        let c0 = i * band;
        let c1 = (c0 + band).min(m);
        let mut acc = vec![0.0f32; c1 - c0];
        for row in dout.chunks_exact(m) {
            for (a, &g) in acc.iter_mut().zip(&row[c0..c1]) {
                *a += g;
            }
        }
        for (j, a) in (c0..c1).zip(acc) {
            // SAFETY: `j < m`, and the band `c0..c1` belongs to this task alone.
            unsafe { *p.get().add(j) += a };
        }
    });
}

/// Elements per partial sum of [`sum_squares`]; the partials are then added in order.
const SUMSQ_CHUNK: usize = 1 << 16;

/// `Σ x²` in f64: fixed chunks, each summed in 8 f64 lanes, chunks added in order.
pub(crate) fn sum_squares(x: &[f32]) -> f64 {
    let partials: Vec<f64> = x
        .par_chunks(SUMSQ_CHUNK)
        .map(|c| {
            let mut acc = [0.0f64; 8];
            let chunks = c.chunks_exact(8);
            let tail = chunks.remainder();
            for ch in chunks {
                for i in 0..8 {
                    let v = ch[i] as f64;
                    acc[i] += v * v;
                }
            }
            for (i, &v) in tail.iter().enumerate() {
                acc[i] += v as f64 * v as f64;
            }
            acc.iter().sum::<f64>()
        })
        .collect();
    partials.iter().sum()
}
