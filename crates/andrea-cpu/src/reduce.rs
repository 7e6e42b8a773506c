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
        fold_lanes(acc)
    }
}

/// `Σ x²` in f64: fixed chunks, each summed in 32 f64 lanes, chunks added in order.
pub(crate) fn sum_squares(x: &[f32]) -> f64 {
    let partials: Vec<f64> = x.par_chunks(SUMSQ_CHUNK).map(sum_squares_lanes).collect();
    partials.iter().sum()
}

/// One chunk of [`sum_squares`] on the widest kernel the CPU (and `ANDREA_SIMD`) allows.
///
/// The compiler vectorises [`sum_squares_chunk`]'s 32 f64 lanes 2 at a time (128-bit
/// `vcvtps2pd` / `vmulpd` / `vaddpd`, seen in the disassembly of both its AVX2 and
/// AVX-512 copies), a quarter of AVX-512's width, far below the speed of reading its
/// input. The intrinsic copies below keep
/// the same lanes (element `i` of each block of 32 into lane `i`), the same separate
/// multiply and add (no FMA: the bits of the generic copy), the same zero-padded last
/// block and the same fold, so every copy gives the same bits (a unit test checks).
fn sum_squares_lanes(c: &[f32]) -> f64 {
    #[cfg(target_arch = "x86_64")]
    {
        if crate::simd::has_avx512() {
            // SAFETY: the CPU has AVX-512 F.
            return unsafe { sum_squares_avx512(c) };
        }
        if crate::simd::has_avx2_fma() {
            // SAFETY: the CPU has AVX2.
            return unsafe { sum_squares_avx2(c) };
        }
    }
    sum_squares_chunk(c)
}

/// `step(block)` for each block of 32 of `c`, the last one zero-padded (as
/// [`sum_squares_chunk`] takes them, a whole zero block when 32 divides `c.len()`).
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn each_block_of_32(c: &[f32], mut step: impl FnMut(&[f32; SUMSQ_LANES])) {
    let mut chunks = c.chunks_exact(SUMSQ_LANES);
    for b in &mut chunks {
        step(b.try_into().expect("a block of 32"));
    }
    let mut last = [0.0f32; SUMSQ_LANES];
    last[..chunks.remainder().len()].copy_from_slice(chunks.remainder());
    step(&last);
}

/// [`sum_squares_chunk`]'s fold of the 32 lanes: `acc[i] += acc[i + w]` for `w` = 16,
/// 8, 4, 2, 1.
fn fold_lanes(mut acc: [f64; SUMSQ_LANES]) -> f64 {
    let mut w = SUMSQ_LANES / 2;
    while w >= 1 {
        for i in 0..w {
            acc[i] += acc[i + w];
        }
        w /= 2;
    }
    acc[0]
}

/// [`sum_squares_chunk`] with AVX2: the 32 lanes in eight vectors of four f64.
///
/// # Safety
/// The CPU must have AVX2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn sum_squares_avx2(c: &[f32]) -> f64 {
    use std::arch::x86_64::*;
    let mut acc = [_mm256_setzero_pd(); SUMSQ_LANES / 4];
    each_block_of_32(c, |block| {
        for (q, pair) in acc.chunks_exact_mut(2).enumerate() {
            // SAFETY: 8 floats at 8q lie in the block of 32.
            let v = unsafe { _mm256_loadu_ps(block.as_ptr().add(8 * q)) };
            let lo = _mm256_cvtps_pd(_mm256_castps256_ps128(v));
            let hi = _mm256_cvtps_pd(_mm256_extractf128_ps::<1>(v));
            pair[0] = _mm256_add_pd(pair[0], _mm256_mul_pd(lo, lo));
            pair[1] = _mm256_add_pd(pair[1], _mm256_mul_pd(hi, hi));
        }
    });
    let mut lanes = [0.0f64; SUMSQ_LANES];
    for (v, out) in acc.iter().zip(lanes.chunks_exact_mut(4)) {
        // SAFETY: `out` holds 4 f64.
        unsafe { _mm256_storeu_pd(out.as_mut_ptr(), *v) };
    }
    fold_lanes(lanes)
}

/// [`sum_squares_chunk`] with AVX-512: the 32 lanes in four vectors of eight f64.
///
/// # Safety
/// The CPU must have AVX-512 F.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx2")]
unsafe fn sum_squares_avx512(c: &[f32]) -> f64 {
    use std::arch::x86_64::*;
    let mut acc = [_mm512_setzero_pd(); SUMSQ_LANES / 8];
    each_block_of_32(c, |block| {
        for (q, pair) in acc.chunks_exact_mut(2).enumerate() {
            // SAFETY: 16 floats at 16q lie in the block of 32.
            let v = unsafe { _mm512_loadu_ps(block.as_ptr().add(16 * q)) };
            let lo = _mm512_cvtps_pd(_mm512_castps512_ps256(v));
            let hi = _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(
                _mm512_castps_pd(v),
            )));
            pair[0] = _mm512_add_pd(pair[0], _mm512_mul_pd(lo, lo));
            pair[1] = _mm512_add_pd(pair[1], _mm512_mul_pd(hi, hi));
        }
    });
    let mut lanes = [0.0f64; SUMSQ_LANES];
    for (v, out) in acc.iter().zip(lanes.chunks_exact_mut(8)) {
        // SAFETY: `out` holds 8 f64.
        unsafe { _mm512_storeu_pd(out.as_mut_ptr(), *v) };
    }
    fold_lanes(lanes)
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

    /// Every copy of a chunk's `Σ x²` (the generic one, and the AVX2 and AVX-512
    /// intrinsics where the CPU has them) gives the bits of the lane-by-lane algorithm
    /// written out here in scalar code, at lengths around the block of 32 and a whole
    /// chunk, with values spread over 2^-20..2^20 (so that an addition in another order
    /// would change the last bits); and the sum is within `1e-12·Σ x²` of an f64 sum in
    /// index order (each of the 32 lanes adds at most a few thousand terms in f64: relative
    /// error about `2048·2^-53` ≈ 2.3e-13).
    #[test]
    fn sum_squares_copies_give_the_lane_algorithms_bits() {
        let mut r = Rand::new(5);
        for len in [
            0,
            1,
            7,
            31,
            32,
            33,
            64,
            100,
            1000,
            SUMSQ_CHUNK - 3,
            SUMSQ_CHUNK,
        ] {
            let x: Vec<f32> = (0..len)
                .map(|_| r.uniform(-1.0, 1.0) * 2f32.powi(r.uniform(-20.0, 20.0) as i32))
                .collect();
            let mut lanes = [0.0f64; SUMSQ_LANES];
            let blocks = len.div_ceil(SUMSQ_LANES) + usize::from(len % SUMSQ_LANES == 0);
            for b in 0..blocks {
                for (i, lane) in lanes.iter_mut().enumerate() {
                    let v = x.get(b * SUMSQ_LANES + i).copied().unwrap_or(0.0) as f64;
                    *lane += v * v;
                }
            }
            let want = fold_lanes(lanes);
            assert_eq!(
                sum_squares_chunk(&x).to_bits(),
                want.to_bits(),
                "generic, {len}"
            );
            assert_eq!(
                sum_squares_lanes(&x).to_bits(),
                want.to_bits(),
                "dispatched, {len}"
            );
            #[cfg(target_arch = "x86_64")]
            {
                if std::arch::is_x86_feature_detected!("avx2") {
                    // SAFETY: the CPU has AVX2.
                    let got = unsafe { sum_squares_avx2(&x) };
                    assert_eq!(got.to_bits(), want.to_bits(), "avx2, {len}");
                } else {
                    eprintln!("SKIPPED the AVX2 copy: no AVX2 on this CPU");
                }
                if std::arch::is_x86_feature_detected!("avx512f") {
                    // SAFETY: the CPU has AVX-512 F.
                    let got = unsafe { sum_squares_avx512(&x) };
                    assert_eq!(got.to_bits(), want.to_bits(), "avx512, {len}");
                } else {
                    eprintln!("SKIPPED the AVX-512 copy: no AVX-512 on this CPU");
                }
            }
            let plain: f64 = x.iter().map(|&v| v as f64 * v as f64).sum();
            assert!(
                (want - plain).abs() <= 1e-12 * plain,
                "{len}: {want} vs {plain}"
            );
        }
    }
}
