//! The few-rows product in BF16 precision: `A`'s rows rounded to BF16 (nearest even, as
//! `andrea_core::round_bf16`), `B` read from a BF16 copy of the weights (half the bytes
//! of the FP32 weights: decoding is bound by streaming them) or, where no copy is kept,
//! rounded as it is read; FP32 accumulation.
//!
//! **Widening is exact and cheap**: a BF16 value is the upper half of an FP32 one, so
//! `f32::from_bits((w as u32) << 16)`, which the compiler vectorises on every level (AVX2:
//! a zero-extending load and a shift per eight weights) and multiplies with FMA.
//!
//! **The products are exact**: two BF16 significands (8 bits each) multiply into at most
//! 16 bits, which FP32's 24 hold, so a fused and an unfused multiply-add round the same
//! sum once: every level gives the same bits, and the only rounding error is that of the
//! FP32 sums, `k` additions (bound: `k·2⁻²⁴·Σ|a·b|`).
//!
//! The sums run in the FP32 forms' order: the row form four rows of `B` per pass into a
//! partial row per chunk, the column form 16 running sums and one fixed tree. So, as in
//! FP32, the result does not depend on the thread count.

use andrea_core::bf16;

#[cfg(target_arch = "x86_64")]
use super::ROW_REGISTERS_MAX_N;
use crate::simd::{multiversion, MulAdd};

/// Where a product in BF16 precision reads `B`, from the element its slice starts at.
#[derive(Clone, Copy)]
pub(crate) enum Weights<'a> {
    /// A BF16 copy of the weights (`bf16_copies`).
    Copy(&'a [bf16]),
    /// The FP32 weights, each rounded to BF16 as it is read.
    Round(&'a [f32]),
}

/// A weight element as a BF16 operand, widened to FP32.
pub(crate) trait Operand: Copy {
    fn operand(self) -> f32;
}

impl Operand for bf16 {
    #[inline(always)]
    fn operand(self) -> f32 {
        f32::from_bits((self.to_bits() as u32) << 16)
    }
}

impl Operand for f32 {
    #[inline(always)]
    fn operand(self) -> f32 {
        crate::elementwise::convert::narrow(self).operand()
    }
}

/// [`row_chunk`], for one row of `A` on a BF16 copy with AVX2 + FMA intrinsics where the
/// CPU has them: `avx2::row_chunk_one` on BF16 weights (the partial row in registers)
/// up to `ROW_REGISTERS_MAX_N` columns, as in FP32, and four rows per pass beyond
/// (`bf16_avx2::row_chunk_four`); the generic loop, which widens as it goes, does not
/// keep up with the memory stream. The same bits.
#[allow(clippy::too_many_arguments)]
pub(crate) fn row_chunk_any(
    part: &mut [f32],
    x: &[f32],
    k: usize,
    k0: usize,
    rows: usize,
    w: Weights<'_>,
    ws: usize,
    m: usize,
    n: usize,
) {
    #[cfg(target_arch = "x86_64")]
    if let (1, Weights::Copy(w), true) = (m, w, crate::simd::has_avx2_fma()) {
        // SAFETY: the CPU has AVX2 and FMA.
        let (part, a) = (&mut part[..n], &x[k0..k0 + rows]);
        return unsafe {
            if n <= ROW_REGISTERS_MAX_N {
                super::avx2::row_chunk_one(part, a, w, ws)
            } else {
                super::bf16_avx2::row_chunk_four(part, a, w, ws)
            }
        };
    }
    row_chunk(part, x, k, k0, rows, w, ws, m, n)
}

/// [`column_band`], for one row of `A` on a BF16 copy with AVX2 + FMA intrinsics where
/// the CPU has them (`bf16_avx2::column_band_one`): the same bits.
pub(crate) fn column_band_any(
    dots: &mut [f32],
    x: &[f32],
    w: Weights<'_>,
    ws: usize,
    m: usize,
    k: usize,
    cols: usize,
) {
    #[cfg(target_arch = "x86_64")]
    if let (1, Weights::Copy(w), true) = (m, w, crate::simd::has_avx2_fma()) {
        // SAFETY: the CPU has AVX2 and FMA.
        return unsafe { super::bf16_avx2::column_band_one(&mut dots[..cols], &x[..k], w, ws) };
    }
    column_band(dots, x, w, ws, m, k, cols)
}

multiversion! {
    /// `part[i, :] = Σ_{r < rows} x[i, k0 + r] · w[r, :]` for each of the `m` rows (`x`
    /// already rounded to BF16), `w[r, :]` the `r`-th row (at stride `ws`) of the chunk.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn row_chunk(
        part: &mut [f32],
        x: &[f32],
        k: usize,
        k0: usize,
        rows: usize,
        w: Weights<'_>,
        ws: usize,
        m: usize,
        n: usize,
    ) {
        match w {
            Weights::Copy(w) => row_chunk_of::<M, bf16>(part, x, k, k0, rows, w, ws, m, n),
            Weights::Round(w) => row_chunk_of::<M, f32>(part, x, k, k0, rows, w, ws, m, n),
        }
    }
}

/// [`row_chunk`] on weights of element type `E`: four rows of `w` per pass,
/// `p[j] += a0·w0[j] + a1·w1[j] + a2·w2[j] + a3·w3[j]` in that order, then the last
/// `rows mod 4` one at a time.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn row_chunk_of<M: MulAdd, E: Operand>(
    part: &mut [f32],
    x: &[f32],
    k: usize,
    k0: usize,
    rows: usize,
    w: &[E],
    ws: usize,
    m: usize,
    n: usize,
) {
    let row = |r: usize| &w[r * ws..][..n];
    let mut r = 0;
    while r + 4 <= rows {
        let (w0, w1, w2, w3) = (row(r), row(r + 1), row(r + 2), row(r + 3));
        for i in 0..m {
            let a = &x[i * k + k0 + r..][..4];
            let p = &mut part[i * n..][..n];
            for j in 0..n {
                let mut s = p[j];
                s = M::mul_add(a[0], w0[j].operand(), s);
                s = M::mul_add(a[1], w1[j].operand(), s);
                s = M::mul_add(a[2], w2[j].operand(), s);
                s = M::mul_add(a[3], w3[j].operand(), s);
                p[j] = s;
            }
        }
        r += 4;
    }
    while r < rows {
        let w0 = row(r);
        for i in 0..m {
            let a0 = x[i * k + k0 + r];
            let p = &mut part[i * n..][..n];
            for j in 0..n {
                p[j] = M::mul_add(a0, w0[j].operand(), p[j]);
            }
        }
        r += 1;
    }
}

multiversion! {
    /// `dots[i·cols + j] = x[i, :] · w[j]` for the `m` rows of `x` (`[m, k]`, rounded
    /// to BF16) and the `cols` rows `w[j]` (at stride `ws`) of a band.
    pub(crate) fn column_band(
        dots: &mut [f32],
        x: &[f32],
        w: Weights<'_>,
        ws: usize,
        m: usize,
        k: usize,
        cols: usize,
    ) {
        match w {
            Weights::Copy(w) => column_band_of::<M, bf16>(dots, x, w, ws, m, k, cols),
            Weights::Round(w) => column_band_of::<M, f32>(dots, x, w, ws, m, k, cols),
        }
    }
}

#[inline(always)]
fn column_band_of<M: MulAdd, E: Operand>(
    dots: &mut [f32],
    x: &[f32],
    w: &[E],
    ws: usize,
    m: usize,
    k: usize,
    cols: usize,
) {
    for j in 0..cols {
        let wj = &w[j * ws..][..k];
        for i in 0..m {
            dots[i * cols + j] = super::dot_with::<M, E>(&x[i * k..][..k], wj, E::operand);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn values(n: usize, seed: u64) -> Vec<f32> {
        andrea_testkit::random::Rand::new(seed).vec(n, -1.0, 1.0)
    }

    fn to_bf16(x: &[f32]) -> Vec<bf16> {
        x.iter().map(|&v| bf16::from_f32(v)).collect()
    }

    /// The AVX2 kernels for one row give the generic forms' bits, on widths and lengths
    /// with and without tails; the generic forms give the same bits from the copy and
    /// from the FP32 weights rounded as read.
    #[test]
    fn the_kernels_for_one_row_have_the_generic_bits() {
        #[cfg(target_arch = "x86_64")]
        if !crate::simd::has_avx2_fma() {
            eprintln!("SKIPPED bf16 AVX2 kernels: this CPU (or ANDREA_SIMD) lacks AVX2 + FMA");
        }
        for &(rows, n) in &[
            (1, 7),
            (3, 8),
            (64, 100),
            (64, 200),
            (5, 769),
            (64, 1030),
            (3, 2304),
        ] {
            let (ws, k) = (n + 3, rows + 5);
            let x: Vec<f32> = values(k, 1).iter().map(|&v| Operand::operand(v)).collect();
            let w32 = values((rows - 1) * ws + n, 2);
            let w16 = to_bf16(&w32);
            let start = values(n, 3);
            let mut want = start.clone();
            row_chunk(&mut want, &x, k, 5, rows, Weights::Copy(&w16), ws, 1, n);
            let mut rounded = start.clone();
            row_chunk(&mut rounded, &x, k, 5, rows, Weights::Round(&w32), ws, 1, n);
            let mut got = start.clone();
            row_chunk_any(&mut got, &x, k, 5, rows, Weights::Copy(&w16), ws, 1, n);
            assert_eq!(
                rounded, want,
                "row form, rows {rows} n {n}: rounded as read"
            );
            assert_eq!(got, want, "row form, rows {rows} n {n}");
        }
        for &(k, cols) in &[(5, 3), (16, 1), (47, 32), (768, 32), (130, 17)] {
            let ws = k + 2;
            let x: Vec<f32> = values(k, 4).iter().map(|&v| Operand::operand(v)).collect();
            let w32 = values((cols - 1) * ws + k, 5);
            let w16 = to_bf16(&w32);
            let mut want = vec![0.0; cols];
            column_band(&mut want, &x, Weights::Copy(&w16), ws, 1, k, cols);
            let mut rounded = vec![0.0; cols];
            column_band(&mut rounded, &x, Weights::Round(&w32), ws, 1, k, cols);
            let mut got = vec![0.0; cols];
            column_band_any(&mut got, &x, Weights::Copy(&w16), ws, 1, k, cols);
            assert_eq!(
                rounded, want,
                "column form, k {k} cols {cols}: rounded as read"
            );
            assert_eq!(got, want, "column form, k {k} cols {cols}");
        }
    }
}
