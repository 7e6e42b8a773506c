//! The column form of the few-rows product (`gemv` module) with NEON intrinsics, four
//! rows of `W` at a time, as `avx2` has it for AVX2: `dots[i, j] = x[i, :] · w[j]`, the
//! tied output projection of a decoded token (`x · wteᵀ`) and the decode attention's
//! scores.
//!
//! Why: the generic form ([`super::dot`]), in the `multiversion!` NEON copy, keeps each
//! row's 16 running sums in four vectors but ends every dot with a tree of 15 scalar
//! adds. Here four rows run together (sixteen independent FMA chains) and their
//! reductions share vector adds, so four dots end in one vector.
//!
//! **Same bits as the generic form** (and as `avx2`): each row's lanes get the same fused
//! multiply-adds in the same `k` order; each level of the tree adds the same pairs of
//! lanes (`acc[l] + acc[l + h]` for `h = 8, 4, 2, 1`, addition being commutative); the
//! tail (the last `k mod 16` products) is the same serial fused sum, added last. A unit
//! test compares the bits with [`gemv::dot`](super::dot).

use std::arch::aarch64::*;

use crate::decode::gemv::band::{self, Band, ROWS};

/// Running sums per row of `W` (four 4-lane vectors), as in `gemv::dot`.
const L: usize = 16;

/// `dots[i·cols + j] = x[i, :] · w[j]` for the band's `m` rows of `x` and `cols` rows
/// of `w`; the bits of `gemv::dot::<Fused>`.
///
/// # Safety
/// None beyond NEON, which aarch64 always has; `unsafe` as the other instruction sets'.
/// (Bounds are asserted.)
#[target_feature(enable = "neon")]
pub(crate) unsafe fn column_band(dots: &mut [f32], band: Band<'_>) {
    band::by_four(dots, band, |x, w| four_dots(x, w));
}

/// The dots of `x` with the four rows `w` (each `x.len()` long); also the decode
/// attention's scores, four positions at a time (`decode::attention`).
#[inline]
#[target_feature(enable = "neon")]
pub(crate) fn four_dots(x: &[f32], w: [&[f32]; ROWS]) -> [f32; ROWS] {
    let k = x.len();
    let body = k - k % L;
    // Row r's lane l (of 16) is lane l % 4 of acc[r][l / 4].
    let mut acc = [[vdupq_n_f32(0.0); 4]; ROWS];
    let mut c = 0;
    while c < body {
        // SAFETY: c + 16 <= body <= k, the length of x and of every row (checked once
        // here for the optimiser: `w[r][..k]`).
        unsafe {
            let xv: [float32x4_t; 4] =
                std::array::from_fn(|u| vld1q_f32(x.as_ptr().add(c + 4 * u)));
            for (a, wr) in acc.iter_mut().zip(&w) {
                let wr = &wr[..k];
                for (u, a) in a.iter_mut().enumerate() {
                    *a = vfmaq_f32(*a, xv[u], vld1q_f32(wr.as_ptr().add(c + 4 * u)));
                }
            }
        }
        c += L;
    }
    // h = 8, then h = 4: row r's lanes 0..4 hold `acc[l] + acc[l + 8]` summed with its
    // `l + 4` partner.
    let u: [float32x4_t; ROWS] = std::array::from_fn(|r| {
        let a = acc[r];
        vaddq_f32(vaddq_f32(a[0], a[2]), vaddq_f32(a[1], a[3]))
    });
    // h = 2: rows (a, b) in one vector, `[a0 + a2, a1 + a3, b0 + b2, b1 + b3]`.
    let pair = |a: float32x4_t, b: float32x4_t| {
        vaddq_f32(
            vcombine_f32(vget_low_f32(a), vget_low_f32(b)),
            vcombine_f32(vget_high_f32(a), vget_high_f32(b)),
        )
    };
    // h = 1: adjacent lanes, `[a, b, c, d]`.
    let sums = vpaddq_f32(pair(u[0], u[1]), pair(u[2], u[3]));
    // The tail: the last k mod 16 products of each row, a serial fused sum from 0.
    let tail = band::tails(x, w, body);
    let mut out = [0.0f32; ROWS];
    // SAFETY: `tail` and `out` hold four floats.
    unsafe { vst1q_f32(out.as_mut_ptr(), vaddq_f32(sums, vld1q_f32(tail.as_ptr()))) };
    out
}

#[cfg(test)]
mod tests {
    /// Every dot has the bits of `gemv::dot::<Fused>` (`band::tests::check_kernel`).
    #[test]
    fn dots_give_the_generic_bits() {
        if !crate::simd::has_neon() {
            eprintln!("SKIPPED: ANDREA_SIMD caps the level below NEON");
            return;
        }
        crate::decode::gemv::band::tests::check_kernel(super::column_band);
    }
}
