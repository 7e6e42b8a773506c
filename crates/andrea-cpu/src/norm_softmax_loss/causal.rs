//! The softmax rows of attention's scores: causal rows keeping their log-sum-exps (the
//! forward), the probabilities recomputed from them, and the softmax gradient (the
//! backward), on the intrinsics kernels of the SIMD level where it has them (the same
//! bits as the `multiversion!` copies).

use std::f32::consts::LOG2_E;

use crate::norm_softmax_loss::rows::{softmax_row_in_place, visible};
use crate::simd::{self, multiversion};

#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
/// An exponential row kernel: `(row, scale2, m2) -> Σ`, unsafe for its instruction set.
type ExpRow = unsafe fn(&mut [f32], f32, f32) -> f32;

/// Causal softmax of `s / sqrt(D)` for rows `first_row..` (rows of stride `tk`),
/// keeping each row's log-sum-exp, in base 2 (the `softmax_avx512` or `softmax_lanes`
/// kernel where the level has it, same bits).
pub(crate) fn causal_softmax(
    s: &mut [f32],
    lse: &mut [f32],
    first_row: usize,
    tq: usize,
    tk: usize,
    pos_offset: usize,
    scale: f32,
) {
    // The intrinsics kernel for this CPU, if any (each gives the base-2 lse).
    #[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
    let vis = |r: usize| visible(first_row + r, tq, tk, Some(pos_offset));
    #[cfg(target_arch = "x86_64")]
    if scale >= 0.0 && simd::has_avx512() {
        // SAFETY: the CPU has AVX-512; scale >= 0; 1 <= visible <= tk.
        unsafe {
            crate::norm_softmax_loss::softmax_avx512::softmax_rows(
                None,
                s,
                tk,
                vis,
                scale,
                |r, l| lse[r] = l,
            )
        };
        return;
    }
    #[cfg(target_arch = "x86_64")]
    if scale >= 0.0 && simd::has_avx2_fma() {
        // SAFETY: the CPU has AVX2 and FMA; scale >= 0; 1 <= visible <= tk.
        unsafe {
            crate::norm_softmax_loss::softmax_avx2::softmax_rows(None, s, tk, vis, scale, |r, l| {
                lse[r] = l
            })
        };
        return;
    }
    #[cfg(target_arch = "aarch64")]
    if scale >= 0.0 && simd::has_neon() {
        // SAFETY: the level has NEON; scale >= 0; 1 <= visible <= tk.
        unsafe {
            crate::norm_softmax_loss::softmax_lanes::neon::softmax_rows(
                None,
                s,
                tk,
                vis,
                scale,
                |r, l| lse[r] = l,
            )
        };
        return;
    }
    causal_softmax_rows(s, lse, first_row, tq, tk, pos_offset, scale)
}

/// `P = 2^(S·scale·log2 e - L)` (L in base 2) on the causal part of rows `first_row..` (stride `t`, `width`
/// computed columns), 0 elsewhere among those columns (the intrinsics kernels where the
/// level has AVX-512, AVX2 or NEON).
pub(crate) fn recompute(
    p: &mut [f32],
    lse: &[f32],
    first_row: usize,
    t: usize,
    width: usize,
    scale: f32,
) {
    #[cfg(target_arch = "x86_64")]
    let avx512 = simd::has_avx512()
        .then_some(crate::norm_softmax_loss::softmax_avx512::exp_shifted_row as ExpRow);
    #[cfg(target_arch = "aarch64")]
    let avx512 = None;
    #[cfg(target_arch = "x86_64")]
    let row_kernel = avx512.or_else(|| {
        simd::has_avx2_fma()
            .then_some(crate::norm_softmax_loss::softmax_avx2::exp_shifted_row as ExpRow)
    });
    #[cfg(target_arch = "aarch64")]
    let row_kernel = avx512.or_else(|| {
        simd::has_neon()
            .then_some(crate::norm_softmax_loss::softmax_lanes::neon::exp_shifted_row as ExpRow)
    });
    #[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
    if let Some(kernel) = row_kernel {
        for (r, (row, &l)) in p.chunks_exact_mut(t).zip(lse).enumerate() {
            let (vis, masked) = row[..width].split_at_mut(first_row + r + 1);
            // SAFETY: the CPU has the kernel's instruction set.
            unsafe { kernel(vis, scale * LOG2_E, l) };
            masked.fill(0.0);
        }
        return;
    }
    recompute_probs(p, lse, first_row, t, width, scale)
}

multiversion! {
    fn causal_softmax_rows(s: &mut [f32], lse: &mut [f32], first_row: usize, tq: usize, tk: usize, pos_offset: usize, scale: f32) {
        for (r, (row, l)) in s.chunks_exact_mut(tk).zip(lse.iter_mut()).enumerate() {
            let n = visible(first_row + r, tq, tk, Some(pos_offset));
            *l = softmax_row_in_place::<M>(row, n, scale);
        }
    }
}

multiversion! {
    fn recompute_probs(p: &mut [f32], lse: &[f32], first_row: usize, t: usize, width: usize, scale: f32) {
        for (r, (row, &l)) in p.chunks_exact_mut(t).zip(lse).enumerate() {
            let (vis, masked) = row[..width].split_at_mut(first_row + r + 1);
            simd::pow2_shifted::<M>(vis, scale * LOG2_E, l);
            masked.fill(0.0);
        }
    }
}

multiversion! {
    /// `dS = scale · P ∘ (dP - rowsum(P ∘ dP))` in place of `dP`, over `width` columns of
    /// rows of stride `t`.
    pub(crate) fn softmax_grad_rows(p: &[f32], dp: &mut [f32], t: usize, width: usize, scale: f32) {
        for (prow, drow) in p.chunks_exact(t).zip(dp.chunks_exact_mut(t)) {
            let (prow, drow) = (&prow[..width], &mut drow[..width]);
            let s = simd::dot(prow, drow);
            for (o, &pv) in drow.iter_mut().zip(prow) {
                *o = scale * pv * (*o - s);
            }
        }
    }
}
