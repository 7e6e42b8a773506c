//! The few-row product in BF16 precision (`bf16` module) with AVX2 + FMA intrinsics, for
//! one row of `A` (batch-1 decoding) on a BF16 copy of the weights: eight weights widened
//! per instruction (`vpmovzxwd`, then a shift by 16), one FMA each. The row form is
//! `avx2::row_chunk_one` on BF16 weights (its partial row in registers); the column form
//! is here.
//!
//! Why: the generic forms' loops, compiled for AVX2, ran at a fraction of the memory
//! stream on the copy (the widening defeated the row form's vectoriser and split the
//! column form's sums), so decoding from half the bytes was slower than from FP32.
//!
//! **Same bits as the generic forms.** The row form keeps each column's partial sum in a
//! register while the chunk's rows stream past, one fused step a row in row order, which
//! is the generic form's sequence (four fused steps a pass, in row order). The column form
//! keeps the generic dot's 16 running sums as two vectors and reduces them in its tree
//! (`acc[l] + acc[l + h]`, `h = 8, 4, 2, 1`), then adds the serial fused tail. Unit tests
//! compare the bits.
//!
//! Requires AVX2 and FMA (the caller checks).

use std::arch::x86_64::*;

use andrea_core::bf16;

use super::avx2::Weight8;

impl Weight8 for bf16 {
    /// Eight BF16 weights widened: zero-extended to 32 bits, shifted into the upper half.
    #[inline(always)]
    unsafe fn load8(p: *const bf16) -> __m256 {
        // SAFETY: the caller's promise: AVX2, and eight elements from `p` readable.
        unsafe {
            let h = _mm_loadu_si128(p.cast());
            _mm256_castsi256_ps(_mm256_slli_epi32::<16>(_mm256_cvtepu16_epi32(h)))
        }
    }
    #[inline(always)]
    fn widen(self) -> f32 {
        f32::from_bits((self.to_bits() as u32) << 16)
    }
}

/// `part[j] += Σ_r a[r]·w[r·ws + j]` over the rows in order, four rows of `w` per pass
/// over the whole partial row: for rows wider than `avx2::row_chunk_one` streams well
/// (that kernel reads each row in pieces of a register block, a row stride apart). The
/// same fused steps in the same row order (the bits of `bf16::row_chunk`).
///
/// # Safety
/// The CPU must have AVX2 and FMA. (Bounds are asserted.)
#[target_feature(enable = "avx2,fma")]
pub(crate) unsafe fn row_chunk_four(part: &mut [f32], a: &[f32], w: &[bf16], ws: usize) {
    let (n, rows) = (part.len(), a.len());
    assert!(rows > 0 && w.len() >= (rows - 1) * ws + n);
    let body = n - n % 8;
    for r in (0..rows).step_by(4) {
        let take = (rows - r).min(4);
        let av: [__m256; 4] = std::array::from_fn(|t| _mm256_set1_ps(a[r + t.min(take - 1)]));
        for j in (0..body).step_by(8) {
            // SAFETY: columns j..j + 8 <= n of `part` and of rows r..r + take (asserted).
            unsafe {
                let p = part.as_mut_ptr().add(j);
                let mut acc = _mm256_loadu_ps(p);
                for (t, av) in av.iter().enumerate().take(take) {
                    let wr = w.as_ptr().add((r + t) * ws + j);
                    acc = _mm256_fmadd_ps(*av, bf16::load8(wr), acc);
                }
                _mm256_storeu_ps(p, acc);
            }
        }
        for (j, p) in part.iter_mut().enumerate().skip(body) {
            for t in 0..take {
                *p = a[r + t].mul_add(w[(r + t) * ws + j].widen(), *p);
            }
        }
    }
}

/// `dots[j] = x · w[j]` for the `cols` rows `w[j]` (at stride `ws`, each `x.len()` long):
/// the bits of `bf16::column_band` for one row of `A`.
///
/// # Safety
/// The CPU must have AVX2 and FMA. (Bounds are asserted.)
#[target_feature(enable = "avx2,fma")]
pub(crate) unsafe fn column_band_one(dots: &mut [f32], x: &[f32], w: &[bf16], ws: usize) {
    let (k, cols) = (x.len(), dots.len());
    assert!(cols > 0 && w.len() >= (cols - 1) * ws + k);
    let body = k - k % 16;
    for (j, d) in dots.iter_mut().enumerate() {
        let wj = &w[j * ws..][..k];
        let (mut lo, mut hi) = (_mm256_setzero_ps(), _mm256_setzero_ps());
        let mut c = 0;
        while c < body {
            // SAFETY: c + 16 <= body <= k, the length of `x` and of `wj`.
            unsafe {
                lo = _mm256_fmadd_ps(
                    _mm256_loadu_ps(x.as_ptr().add(c)),
                    bf16::load8(wj.as_ptr().add(c)),
                    lo,
                );
                hi = _mm256_fmadd_ps(
                    _mm256_loadu_ps(x.as_ptr().add(c + 8)),
                    bf16::load8(wj.as_ptr().add(c + 8)),
                    hi,
                );
            }
            c += 16;
        }
        let tail = x[body..]
            .iter()
            .zip(&wj[body..])
            .fold(0.0f32, |s, (&a, &b)| {
                a.mul_add(f32::from_bits((b.to_bits() as u32) << 16), s)
            });
        // The tree: lanes l + 8, l + 4, l + 2, l + 1 onto lane l.
        let v8 = _mm256_add_ps(lo, hi);
        let v4 = _mm_add_ps(_mm256_castps256_ps128(v8), _mm256_extractf128_ps::<1>(v8));
        let v2 = _mm_add_ps(v4, _mm_movehl_ps(v4, v4));
        let v1 = _mm_add_ss(v2, _mm_shuffle_ps::<0b01>(v2, v2));
        *d = _mm_cvtss_f32(v1) + tail;
    }
}
