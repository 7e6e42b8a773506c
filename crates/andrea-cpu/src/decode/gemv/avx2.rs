//! The column form of the few-rows product (`gemv` module) with AVX2 + FMA intrinsics
//! (and the row form's chunk at batch 1, [`row_chunk_one`]),
//! four rows of `W` at a time: `dots[i, j] = x[i, :] · w[j]`, the tied output
//! projection of a decoded token (`x · wteᵀ`), the largest product of a decode step.
//!
//! Why: the generic form ([`super::dot`]) keeps 16 running sums per row of
//! `W`, which the compiler, in the `multiversion!` AVX2 copy, split into eight 2-lane
//! pieces (`vmovsd` loads, `xmm` FMAs: a quarter of each 256-bit operation used), one
//! row at a time, in the hottest loop of a tiny-model decode. Here each row's 16 sums are two `ymm` registers, four rows run together (eight
//! independent FMA chains), and the four reductions share their shuffles, so four dots
//! end in one 128-bit vector (as `avx512` does for sixteen rows with AVX-512).
//!
//! **Same bits as the generic form.** Each row's lanes get the same fused
//! multiply-adds in the same `k` order; each level of the tree adds the same pairs of
//! lanes (`acc[l] + acc[l + h]` for `h = 8, 4, 2, 1`, addition being commutative); the
//! tail (the last `k mod 16` products) is the same serial fused sum, added last. A unit
//! test compares the bits with [`gemv::dot`](super::dot).
//!
//! Requires AVX2 and FMA (the caller checks
//! [`simd::has_avx2_fma`](crate::simd::has_avx2_fma)).

use std::arch::x86_64::*;

use crate::decode::gemv::band::{self, Band, ROWS};

/// Running sums per row of `W` (two 8-lane vectors), as in `gemv::dot`.
const L: usize = 16;

/// `dots[i·cols + j] = x[i, :] · w[j]` for the band's `m` rows of `x` and `cols` rows
/// of `w`; the bits of `gemv::dot::<Fused>`.
///
/// # Safety
/// The CPU must have AVX2 and FMA. (Bounds are asserted.)
#[target_feature(enable = "avx2,fma")]
pub(crate) unsafe fn column_band(dots: &mut [f32], band: Band<'_>) {
    band::by_four(dots, band, |x, w| four_dots(x, w));
}

/// A weight element the row form reads eight at a time: `f32`, or `bf16` widened
/// (`bf16_avx2`, BF16 precision's copy of the weights).
pub(crate) trait Weight8: Copy {
    /// Eight elements from `p` as FP32 (exact).
    ///
    /// # Safety
    /// The CPU must have AVX2, and eight elements from `p` must be readable.
    unsafe fn load8(p: *const Self) -> __m256;
    /// One element as FP32 (exact).
    fn widen(self) -> f32;
}

impl Weight8 for f32 {
    #[inline(always)]
    unsafe fn load8(p: *const f32) -> __m256 {
        // SAFETY: the caller's promise.
        unsafe { _mm256_loadu_ps(p) }
    }
    #[inline(always)]
    fn widen(self) -> f32 {
        self
    }
}

/// The row form's chunk for one row of `A` (`m = 1`, a decoded token):
/// `part[j] += Σ_r a[r]·w[r·ws + j]` over the chunk's rows in order, with a block of the
/// partial row held in registers (up to 12 vectors, 96 columns: the 16 `ymm` registers
/// hold no more beside the weights and the broadcast) while the rows' pieces of that
/// block stream past, block after block; the same fused steps in the same row order as
/// the generic `row_chunk` (same bits). It beats the generic chunk (four rows per pass,
/// the partial row loaded and stored every pass) on two threads or more and loses to it
/// on one, so `gemv` takes it on two threads or more.
///
/// # Safety
/// The CPU must have AVX2 and FMA. (Bounds are asserted.)
#[target_feature(enable = "avx2,fma")]
pub(crate) unsafe fn row_chunk_one<E: Weight8>(part: &mut [f32], a: &[f32], w: &[E], ws: usize) {
    let (n, rows) = (part.len(), a.len());
    assert!(rows > 0 && w.len() >= (rows - 1) * ws + n);
    let mut j0 = 0;
    // SAFETY (all calls): columns j0.. of each row and of `part` are in bounds (asserted).
    unsafe {
        while n - j0 >= 8 {
            j0 += match (n - j0) / 8 {
                12.. => row_block::<12, E>(part, a, w, ws, j0),
                8.. => row_block::<8, E>(part, a, w, ws, j0),
                4.. => row_block::<4, E>(part, a, w, ws, j0),
                2.. => row_block::<2, E>(part, a, w, ws, j0),
                _ => row_block::<1, E>(part, a, w, ws, j0),
            };
        }
    }
    // The last n mod 8 columns, one fused step a row.
    for (j, p) in part.iter_mut().enumerate().skip(j0) {
        *p = a
            .iter()
            .enumerate()
            .fold(*p, |s, (r, &ar)| ar.mul_add(w[r * ws + j].widen(), s));
    }
}

/// Columns `j0..j0 + NV·8` of [`row_chunk_one`]; returns `NV·8`.
///
/// # Safety
/// As [`row_chunk_one`], with those columns in bounds.
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn row_block<const NV: usize, E: Weight8>(
    part: &mut [f32],
    a: &[f32],
    w: &[E],
    ws: usize,
    j0: usize,
) -> usize {
    // SAFETY: columns j0..j0 + NV·8 of `part` and of each row are in bounds (the caller's
    // promise).
    unsafe {
        let p = part.as_mut_ptr().add(j0);
        let mut acc: [__m256; NV] = std::array::from_fn(|v| _mm256_loadu_ps(p.add(v * 8)));
        for (r, &ar) in a.iter().enumerate() {
            let av = _mm256_set1_ps(ar);
            let wr = w.as_ptr().add(r * ws + j0);
            for (v, acc) in acc.iter_mut().enumerate() {
                *acc = _mm256_fmadd_ps(av, E::load8(wr.add(v * 8)), *acc);
            }
        }
        for (v, acc) in acc.iter().enumerate() {
            _mm256_storeu_ps(p.add(v * 8), *acc);
        }
    }
    NV * 8
}

/// The dots of `x` with the four rows `w` (each `x.len()` long); also the decode
/// attention's scores, four positions at a time (`decode::attention`).
#[inline]
#[target_feature(enable = "avx2,fma")]
pub(crate) fn four_dots(x: &[f32], w: [&[f32]; ROWS]) -> [f32; ROWS] {
    let k = x.len();
    let body = k - k % L;
    let mut acc = [[_mm256_setzero_ps(); 2]; ROWS];
    let mut c = 0;
    while c < body {
        // SAFETY: c + 16 <= body <= k, the length of x and of every row (checked once
        // here for the optimiser: `w[r][..k]`).
        unsafe {
            let x0 = _mm256_loadu_ps(x.as_ptr().add(c));
            let x1 = _mm256_loadu_ps(x.as_ptr().add(c + 8));
            for (a, wr) in acc.iter_mut().zip(&w) {
                let wr = &wr[..k];
                a[0] = _mm256_fmadd_ps(x0, _mm256_loadu_ps(wr.as_ptr().add(c)), a[0]);
                a[1] = _mm256_fmadd_ps(x1, _mm256_loadu_ps(wr.as_ptr().add(c + 8)), a[1]);
            }
        }
        c += L;
    }
    // h = 8: lane l of v[r] is row r's `acc[l] + acc[l + 8]`.
    let v: [__m256; ROWS] = std::array::from_fn(|r| _mm256_add_ps(acc[r][0], acc[r][1]));
    // h = 4: rows (a, b) in one vector, a's `v[l] + v[l + 4]` in the low half, b's high.
    let pair = |a: __m256, b: __m256| {
        let lo = _mm256_permute2f128_ps::<0x20>(a, b); // a.lo b.lo
        let hi = _mm256_permute2f128_ps::<0x31>(a, b); // a.hi b.hi
        _mm256_add_ps(lo, hi)
    };
    let (ab, cd) = (pair(v[0], v[1]), pair(v[2], v[3]));
    // h = 2: per half, lanes 0, 1 of row a (b) and 2, 3 of row c (d).
    let s2 = _mm256_add_ps(
        _mm256_shuffle_ps::<0x44>(ab, cd), // per half: ab0 ab1 cd0 cd1
        _mm256_shuffle_ps::<0xEE>(ab, cd), // ab2 ab3 cd2 cd3
    );
    // h = 1: low half [a, c, a, c], high half [b, d, b, d].
    let s1 = _mm256_add_ps(
        _mm256_shuffle_ps::<0x88>(s2, s2), // per half: 0 2 0 2
        _mm256_shuffle_ps::<0xDD>(s2, s2), // 1 3 1 3
    );
    // a b c d
    let sums = _mm_unpacklo_ps(_mm256_castps256_ps128(s1), _mm256_extractf128_ps::<1>(s1));
    // The tail: the last k mod 16 products of each row, a serial fused sum from 0.
    let tail = band::tails(x, w, body);
    let mut out = [0.0f32; ROWS];
    // SAFETY: `tail` and `out` hold four floats.
    unsafe {
        let dots = _mm_add_ps(sums, _mm_loadu_ps(tail.as_ptr()));
        _mm_storeu_ps(out.as_mut_ptr(), dots);
    }
    out
}

#[cfg(test)]
mod tests {
    /// Every dot has the bits of `gemv::dot::<Fused>` (`band::tests::check_kernel`).
    #[test]
    fn dots_give_the_generic_bits() {
        if !crate::simd::has_avx2_fma() {
            eprintln!("SKIPPED: this CPU has no AVX2 + FMA");
            return;
        }
        crate::decode::gemv::band::tests::check_kernel(super::column_band);
    }
}
