//! What the row kernels of softmax and the loss share, whatever their instruction set:
//! the causal mask's row lengths, the loss from a row's maximum and sum, a thread's row
//! buffer, a row's source; and the generic (`multiversion!`) forms of a softmax row and
//! a loss row, whose bits every intrinsics kernel reproduces.

use std::f32::consts::{LN_2, LOG2_E};

use crate::simd::{self, MulAdd};

/// Number of visible columns of row `row` (query `row % q_len`) under the mask.
#[inline]
pub(crate) fn visible(row: usize, q_len: usize, k_len: usize, causal: Option<usize>) -> usize {
    match causal {
        Some(o) => (o + row % q_len + 1).min(k_len),
        None => k_len,
    }
}

#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
thread_local! {
    /// Per-thread row buffer of the loss's kernels, grown on first use, then reused.
    static ROW: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Runs `f` on this thread's row buffer of at least `n` elements.
#[cfg(target_arch = "x86_64")]
pub(crate) fn with_row_scratch<R>(n: usize, f: impl FnOnce(&mut [f32]) -> R) -> R {
    ROW.with_borrow_mut(|b| {
        if b.len() < n {
            b.resize(n, 0.0);
        }
        f(&mut b[..n])
    })
}

/// This thread's row buffer, at least `n` long, out of its slot until
/// [`restore_row_scratch`] puts it back: for kernels written over the width, whose work
/// must not run in a closure of theirs (a closure outside the `#[target_feature]`
/// function that instantiates the kernel is compiled without those features, and every
/// intrinsic in it becomes a call).
#[cfg(target_arch = "aarch64")]
pub(crate) fn take_row_scratch(n: usize) -> Vec<f32> {
    let mut b = ROW.with_borrow_mut(std::mem::take);
    if b.len() < n {
        b.resize(n, 0.0);
    }
    b
}

/// Puts back the buffer [`take_row_scratch`] took.
#[cfg(target_arch = "aarch64")]
pub(crate) fn restore_row_scratch(b: Vec<f32>) {
    ROW.set(b);
}

/// The loss `ln Σ e^x - x_t` of a row from its `m2 = max·log2 e` and
/// `s = Σ 2^(x·log2 e - m2)`: `ln 2·(m2 + log2 s) - x_t`.
#[inline(always)]
pub(crate) fn loss_of(m2: f32, s: f32, x_t: f32) -> f32 {
    LN_2 * (m2 + s.log2()) - x_t
}

/// The start of a row's source: `src`, which must hold `n` elements, or `dst` itself.
#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
pub(crate) fn source(src: Option<&[f32]>, dst: &[f32], n: usize) -> *const f32 {
    match src {
        Some(s) => {
            assert!(s.len() >= n, "a source row of {} for {n}", s.len());
            s.as_ptr()
        }
        None => dst.as_ptr(),
    }
}

/// `y[..n] = softmax(scale·y[..n])`, `y[n..] = 0`. Returns the row's log-sum-exp of the
/// scaled scores *in base 2*, `log2 Σ 2^(x·scale2)` with `scale2 = scale·log2 e` (the
/// attention backward recomputes the probabilities as `2^(x·scale2 - lse)`).
#[inline(always)]
pub(crate) fn softmax_row_in_place<M: MulAdd>(y: &mut [f32], n: usize, scale: f32) -> f32 {
    let (head, tail) = y.split_at_mut(n);
    let scale2 = scale * LOG2_E;
    // max(scale2·x) is scale2·max(x) for scale >= 0, scale2·min(x) otherwise.
    let m2 = if scale >= 0.0 {
        simd::max(head) * scale2
    } else {
        -simd::max(&head.iter().map(|v| -v).collect::<Vec<_>>()) * scale2
    };
    let s = simd::pow2_shifted::<M>(head, scale2, m2);
    let inv = 1.0 / s;
    for v in head.iter_mut() {
        *v *= inv;
    }
    tail.fill(0.0);
    m2 + s.log2()
}

/// The loss of one row whose logits are in `g` (target not ignored), then `g` becomes
/// the gradient.
#[inline(always)]
pub(crate) fn cross_entropy_in_place_with<M: MulAdd>(
    g: &mut [f32],
    target: u32,
    vocab: usize,
    grad_scale: f32,
) -> f32 {
    // One exp pass: e^(x - max) into the row, then scale by grad_scale / Σ.
    let x_t = g[target as usize];
    let (real, pad) = g.split_at_mut(vocab);
    let m2 = simd::max(real) * LOG2_E;
    let sum = simd::pow2_shifted::<M>(real, LOG2_E, m2);
    let loss = loss_of(m2, sum, x_t);
    let k = grad_scale / sum;
    for o in real.iter_mut() {
        *o *= k;
    }
    real[target as usize] -= grad_scale;
    pad.fill(0.0);
    loss
}
