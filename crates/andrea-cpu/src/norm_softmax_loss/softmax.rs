//! Row softmax with scale and causal mask, its backward, and the fused
//! softmax + cross-entropy of the output layer.

use rayon::prelude::*;

use std::f32::consts::LOG2_E;

use andrea_core::IGNORE_INDEX;

use crate::norm_softmax_loss::rows::{
    cross_entropy_in_place_with, loss_of, softmax_row_in_place, visible,
};
#[cfg(target_arch = "aarch64")]
use crate::norm_softmax_loss::softmax_lanes::neon;
#[cfg(target_arch = "x86_64")]
use crate::norm_softmax_loss::{softmax_avx2 as avx2, softmax_avx512 as avx512};
use crate::par::rows_per_task;
use crate::simd::{self, multiversion};

use andrea_core::{check, Ids, LossOps, Result, SoftmaxOps, Tensor};

use crate::buffer::{read, write};
use crate::CpuBackend;

multiversion! {
    /// Softmax of one row, first copied from `src` if given (only its `n` visible
    /// values: the rest of the row is written as zeros).
    fn softmax_row(src: Option<&[f32]>, row: &mut [f32], n: usize, scale: f32) {
        if let Some(src) = src {
            row[..n].copy_from_slice(&src[..n]);
        }
        softmax_row_in_place::<M>(row, n, scale);
    }
}

/// Rows ahead whose source the generic softmax prefetches (the intrinsics kernels have
/// their own).
const PREFETCH_ROWS: usize = 2;

/// `y = softmax(src)` (or of `y` in place when `src` is `None`), rows of `k_len`.
pub(crate) fn softmax(
    src: Option<&[f32]>,
    y: &mut [f32],
    q_len: usize,
    k_len: usize,
    scale: f32,
    causal: Option<usize>,
) {
    let rows = rows_per_task(k_len);
    y.par_chunks_mut(rows * k_len)
        .enumerate()
        .for_each(|(t, y)| {
            let src = src.map(|s| &s[t * rows * k_len..t * rows * k_len + y.len()]);
            let vis = |i: usize| visible(t * rows + i, q_len, k_len, causal);
            #[cfg(target_arch = "x86_64")]
            if simd::has_avx512() && scale >= 0.0 {
                // SAFETY: the CPU has AVX-512; scale >= 0; `src` is this task's rows;
                // 1 <= visible <= k_len (a causal row sees its own key).
                unsafe { avx512::softmax_rows(src, y, k_len, vis, scale, |_, _| {}) };
                return;
            }
            #[cfg(target_arch = "x86_64")]
            if simd::has_avx2_fma() && scale >= 0.0 {
                // SAFETY: as above, with AVX2 and FMA.
                unsafe { avx2::softmax_rows(src, y, k_len, vis, scale, |_, _| {}) };
                return;
            }
            #[cfg(target_arch = "aarch64")]
            if simd::has_neon() && scale >= 0.0 {
                // SAFETY: as above, with NEON.
                unsafe { neon::softmax_rows(src, y, k_len, vis, scale, |_, _| {}) };
                return;
            }
            let ahead = |i: usize| (i + PREFETCH_ROWS) * k_len;
            for (i, row) in y.chunks_exact_mut(k_len).enumerate() {
                if let Some(s) = src.filter(|s| ahead(i) < s.len()) {
                    simd::prefetch(&s[ahead(i)..ahead(i) + vis(i + PREFETCH_ROWS)]);
                }
                let src = src.map(|s| &s[i * k_len..(i + 1) * k_len]);
                softmax_row(src, row, vis(i), scale);
            }
        });
}

multiversion! {
    fn softmax_backward_rows(p: &[f32], dp: &[f32], dx: &mut [f32], k_len: usize, scale: f32) {
        for ((p, dp), dx) in p.chunks_exact(k_len).zip(dp.chunks_exact(k_len)).zip(dx.chunks_exact_mut(k_len)) {
            let s = simd::dot(p, dp);
            for ((o, &pv), &dv) in dx.iter_mut().zip(p).zip(dp) {
                *o = scale * pv * (dv - s);
            }
        }
    }
}

multiversion! {
    fn softmax_backward_rows_in_place(p: &[f32], dpdx: &mut [f32], k_len: usize, scale: f32) {
        for (p, d) in p.chunks_exact(k_len).zip(dpdx.chunks_exact_mut(k_len)) {
            let s = simd::dot(p, d);
            for (o, &pv) in d.iter_mut().zip(p) {
                *o = scale * pv * (*o - s);
            }
        }
    }
}

/// `dx = scale · p ∘ (dp - Σ p·dp)` per row; `dp == None` means `dx` holds `dp`.
pub(crate) fn softmax_backward(
    p: &[f32],
    dp: Option<&[f32]>,
    dx: &mut [f32],
    k_len: usize,
    scale: f32,
) {
    let rows = rows_per_task(k_len);
    let chunk = rows * k_len;
    match dp {
        Some(dp) => dx
            .par_chunks_mut(chunk)
            .zip(p.par_chunks(chunk))
            .zip(dp.par_chunks(chunk))
            .for_each(|((dx, p), dp)| softmax_backward_rows(p, dp, dx, k_len, scale)),
        None => dx
            .par_chunks_mut(chunk)
            .zip(p.par_chunks(chunk))
            .for_each(|(dx, p)| softmax_backward_rows_in_place(p, dx, k_len, scale)),
    }
}

multiversion! {
    /// The loss of one row, without its gradient.
    fn cross_entropy_loss_row(logits: &[f32], target: u32, vocab: usize) -> f32 {
        let real = &logits[..vocab];
        let m2 = simd::max(real) * LOG2_E;
        let s = simd::sum_pow2::<M>(real, LOG2_E, m2);
        loss_of(m2, s, logits[target as usize])
    }
}

/// Fused softmax + cross-entropy over rows of `vp` logits (first `vocab` real).
/// `grad`: `None` for the loss only; `Some(None)` to overwrite `logits` with the
/// gradient; `Some(Some(g))` to write it into `g`. Targets are below `vocab` or
/// [`IGNORE_INDEX`] (a row with loss and gradient 0).
pub(crate) fn cross_entropy(
    logits: &mut [f32],
    targets: &[u32],
    vocab: usize,
    vp: usize,
    losses: &mut [f32],
    grad: Option<Option<&mut [f32]>>,
    grad_scale: f32,
) {
    match grad {
        None => logits
            .par_chunks(vp)
            .zip(targets.par_iter().zip(losses.par_iter_mut()))
            .for_each(|(row, (&t, l))| {
                *l = if t == IGNORE_INDEX {
                    0.0
                } else {
                    loss_row(row, t, vocab)
                }
            }),
        Some(None) => logits
            .par_chunks_mut(vp)
            .zip(targets.par_iter().zip(losses.par_iter_mut()))
            .for_each(|(row, (&t, l))| *l = cross_entropy_row(None, row, t, vocab, grad_scale)),
        Some(Some(g)) => logits
            .par_chunks(vp)
            .zip(g.par_chunks_mut(vp))
            .zip(targets.par_iter().zip(losses.par_iter_mut()))
            .for_each(|((row, g), (&t, l))| {
                *l = cross_entropy_row(Some(row), g, t, vocab, grad_scale)
            }),
    }
}

/// The loss of one row (target not ignored), by the intrinsics kernels where the level has
/// AVX-512, AVX2 or NEON (same bits).
fn loss_row(row: &[f32], target: u32, vocab: usize) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if simd::has_avx512() {
        // SAFETY: the CPU has AVX-512; the caller checked target < vocab.
        return unsafe { avx512::cross_entropy_loss_row(row, target as usize, vocab) };
    }
    #[cfg(target_arch = "x86_64")]
    if simd::has_avx2_fma() {
        // SAFETY: the CPU has AVX2 and FMA; the caller checked target < vocab.
        return unsafe { avx2::cross_entropy_loss_row(row, target as usize, vocab) };
    }
    #[cfg(target_arch = "aarch64")]
    if simd::has_neon() {
        // SAFETY: the level has NEON; the caller checked target < vocab.
        return unsafe { neon::cross_entropy_loss_row(row, target as usize, vocab) };
    }
    cross_entropy_loss_row(row, target, vocab)
}

/// The loss of one row of logits (`src`, or `g` itself when `None`), then `g` becomes
/// its gradient.
fn cross_entropy_row(
    src: Option<&[f32]>,
    g: &mut [f32],
    target: u32,
    vocab: usize,
    grad_scale: f32,
) -> f32 {
    if target == IGNORE_INDEX {
        g.fill(0.0);
        return 0.0;
    }
    #[cfg(target_arch = "x86_64")]
    if simd::has_avx512() {
        // SAFETY: the CPU has AVX-512; the caller checked target < vocab.
        return unsafe { avx512::cross_entropy_row(src, g, target as usize, vocab, grad_scale) };
    }
    #[cfg(target_arch = "x86_64")]
    if simd::has_avx2_fma() {
        // SAFETY: the CPU has AVX2 and FMA; the caller checked target < vocab.
        return unsafe { avx2::cross_entropy_row(src, g, target as usize, vocab, grad_scale) };
    }
    #[cfg(target_arch = "aarch64")]
    if simd::has_neon() {
        // SAFETY: the level has NEON; the caller checked target < vocab.
        return unsafe { neon::cross_entropy_row(src, g, target as usize, vocab, grad_scale) };
    }
    if let Some(src) = src {
        g.copy_from_slice(src);
    }
    cross_entropy_in_place(g, target, vocab, grad_scale)
}

multiversion! {
    fn cross_entropy_in_place(g: &mut [f32], target: u32, vocab: usize, grad_scale: f32) -> f32 {
        cross_entropy_in_place_with::<M>(g, target, vocab, grad_scale)
    }
}

impl SoftmaxOps for CpuBackend {
    fn softmax(
        &self,
        x: Tensor<'_, Self>,
        out: Tensor<'_, Self>,
        scale: f32,
        causal_offset: Option<usize>,
    ) -> Result<()> {
        let d = check::softmax(&x, &out, scale, causal_offset)?;
        let (q, k) = (d.q_len, d.k_len);
        if out.same_as(&x) {
            // SAFETY: in place on one checked view.
            let y = unsafe { write(&out) };
            self.run(|| softmax(None, y, q, k, scale, causal_offset));
        } else {
            // SAFETY: checked disjoint.
            let (y, x) = unsafe { (write(&out), read(&x)) };
            self.run(|| softmax(Some(x), y, q, k, scale, causal_offset));
        }
        Ok(())
    }

    fn softmax_backward(
        &self,
        probs: Tensor<'_, Self>,
        dprobs: Tensor<'_, Self>,
        dx: Tensor<'_, Self>,
        scale: f32,
    ) -> Result<()> {
        let k = check::softmax_backward(&probs, &dprobs, &dx)?.cols;
        if dx.same_as(&dprobs) {
            // SAFETY: `dx` is `dprobs` exactly, disjoint from `probs`.
            let (p, d) = unsafe { (read(&probs), write(&dx)) };
            self.run(|| softmax_backward(p, None, d, k, scale));
        } else {
            // SAFETY: checked disjoint.
            let (p, dp, d) = unsafe { (read(&probs), read(&dprobs), write(&dx)) };
            self.run(|| softmax_backward(p, Some(dp), d, k, scale));
        }
        Ok(())
    }
}

impl LossOps for CpuBackend {
    fn softmax_cross_entropy(
        &self,
        logits: Tensor<'_, Self>,
        targets: Ids<'_, Self>,
        vocab: usize,
        losses: Tensor<'_, Self>,
        dlogits: Option<Tensor<'_, Self>>,
        grad_scale: f32,
    ) -> Result<()> {
        let vp = check::softmax_cross_entropy(&logits, &targets, vocab, &losses, dlogits.as_ref())?
            .padded_vocab;
        // SAFETY: checked in bounds; `losses` disjoint from the rest; `dlogits` either
        // disjoint from `logits` or exactly it (then only `logits` is borrowed, mutably).
        let (t, l) = unsafe { (read(&targets), write(&losses)) };
        check::target_values("softmax_cross_entropy", t, vocab)?;
        match dlogits {
            None => {
                let x = unsafe { write(&logits) };
                self.run(|| cross_entropy(x, t, vocab, vp, l, None, grad_scale));
            }
            Some(d) if d.same_as(&logits) => {
                let x = unsafe { write(&logits) };
                self.run(|| cross_entropy(x, t, vocab, vp, l, Some(None), grad_scale));
            }
            Some(d) => {
                let (x, g) = unsafe { (write(&logits), write(&d)) };
                self.run(|| cross_entropy(x, t, vocab, vp, l, Some(Some(g)), grad_scale));
            }
        }
        Ok(())
    }
}
