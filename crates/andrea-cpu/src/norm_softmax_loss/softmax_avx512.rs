//! AVX-512 kernels written with intrinsics, for the loops the compiler's auto-vectorised
//! copies leave slow: softmax rows (short, with ragged causal lengths) and the softmax +
//! cross-entropy rows of the output layer (GELU's are in `elementwise::gelu`).
//!
//! What the intrinsics buy over the `multiversion!` copies:
//!
//! * **Masked tails.** A row whose length is not a multiple of 16 ends in one masked
//!   vector, not a scalar loop. A causal row of 256 has on average 16 scalar elements
//!   in the generic form, each a ~15-operation `pow2` on one lane: that cost as much as
//!   the rest of the row. Masked *stores* are slow on Zen 4, so only a pass's last
//!   vector is masked.
//! * **`vscalefps`** builds `p·2^k` in one instruction in place of three integer ones.
//! * **Horizontal sums as a tree** of vector adds rather than 32 dependent scalar adds.
//! * **No upper clamp** in softmax's exponentials, whose arguments are at most a rounding
//!   error above 0 (checked per row).
//!
//! **Same bits as the other copies.** Every element goes through the same IEEE
//! operations in the same order as [`crate::simd::pow2`] with `Fused`, and
//! sums keep the same [`BLOCK`] lanes (element `i` of a row into lane `i mod 32`) added
//! in the same order, then folded by the same tree ([`simd::sum_lanes`]). `p·2^k` by
//! `vscalefps` and by a multiply with the built power of two are the same correctly
//! rounded product. Unit tests compare the bits with the generic forms.
//!
//! Everything here requires AVX-512 F and DQ (the callers check [`simd::has_avx512`]).

use std::arch::x86_64::*;
use std::f32::consts::LOG2_E;

use crate::norm_softmax_loss::rows::source;
use crate::simd::lanes::{self, first16 as first};
use crate::simd::{self, BLOCK};

/// The lanes of one vector.
const L: usize = 16;

/// `2^z` on 16 lanes: [`lanes::pow2`] (`vrndscaleps` for `round(z)`, `vscalefps` for
/// `2^k`); without the upper clamp when `!HI`: for arguments known to be at most 126,
/// where that clamp changes nothing (softmax's `x - max`).
#[inline]
#[target_feature(enable = "avx512f")]
fn pow2_below<const HI: bool>(z: __m512) -> __m512 {
    // SAFETY: compiled with AVX-512 F.
    unsafe { lanes::pow2::<__m512, HI>(z) }
}

/// [`simd::sum_lanes`] of the 32 lanes `lo ++ hi`.
#[inline]
#[target_feature(enable = "avx512f,avx512dq")]
fn sum_lanes(lo: __m512, hi: __m512) -> f32 {
    let s16 = _mm512_add_ps(lo, hi);
    let s8 = _mm256_add_ps(
        _mm512_castps512_ps256(s16),
        _mm512_extractf32x8_ps::<1>(s16),
    );
    let s4 = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps::<1>(s8));
    let s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
    _mm_cvtss_f32(_mm_add_ss(s2, _mm_movehdup_ps(s2)))
}

/// Largest of `x[..n]` (`-inf` if `n == 0`). Max is exact, so the order is free.
///
/// # Safety
/// `x` is valid for `n` reads.
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn max(x: *const f32, n: usize) -> f32 {
    let ninf = _mm512_set1_ps(f32::NEG_INFINITY);
    let (mut m0, mut m1) = (ninf, ninf);
    let mut i = 0;
    while i + 2 * L <= n {
        // SAFETY: i + 32 <= n.
        unsafe {
            m0 = _mm512_max_ps(m0, _mm512_loadu_ps(x.add(i)));
            m1 = _mm512_max_ps(m1, _mm512_loadu_ps(x.add(i + L)));
        }
        i += 2 * L;
    }
    while i < n {
        // SAFETY: the mask covers only the n - i elements left.
        unsafe { m0 = _mm512_max_ps(m0, _mm512_mask_loadu_ps(ninf, first(n - i), x.add(i))) };
        i += L;
    }
    _mm512_reduce_max_ps(_mm512_max_ps(m0, m1))
}

/// `dst[i] = 2^(src[i]·scale2 - m2)` for `i < n`; returns their sum, added as
/// [`simd::pow2_shifted`] adds it. `src` may equal `dst`.
///
/// # Safety
/// `src` is valid for `n` reads and `dst` for `n` writes; `m2 >= src[i]·scale2` up to
/// rounding (it is the row's max).
#[inline]
#[target_feature(enable = "avx512f,avx512dq")]
unsafe fn exp_shifted(src: *const f32, dst: *mut f32, n: usize, scale2: f32, m2: f32) -> f32 {
    // `x·scale2 - m2 <= max·scale2 - m2`, a rounding error of `m2`: at most 126 while
    // |m2| < 2^24 (a NaN passes through the clamp either way).
    // SAFETY: the caller's.
    unsafe { exp_pass_clamped(src, dst, n, scale2, m2, Sink::Store) }
}

/// What an exponential pass does with `e = 2^(src·scale2 - m2)`: store it, or only sum it.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Sink {
    Store,
    SumOnly,
}

/// [`exp_shifted`] with [`pow2_below::<HI>`], and what becomes of each `e` ([`Sink`]):
/// the sum is `Σ e` in every case, in the same lanes and order.
///
/// # Safety
/// As [`exp_shifted`] (`dst` unused with [`Sink::SumOnly`]), and with `!HI` every
/// `src[i]·scale2 - m2` is at most 126.
#[inline]
#[target_feature(enable = "avx512f,avx512dq")]
unsafe fn exp_pass<const HI: bool>(
    src: *const f32,
    dst: *mut f32,
    n: usize,
    scale2: f32,
    m2: f32,
    sink: Sink,
) -> f32 {
    let (vs, vm) = (_mm512_set1_ps(scale2), _mm512_set1_ps(-m2));
    let store = sink == Sink::Store;
    let (mut a0, mut a1) = (_mm512_setzero_ps(), _mm512_setzero_ps());
    let mut i = 0;
    // Two blocks of 32 per pass: four independent exp chains in flight.
    while i + 2 * BLOCK <= n {
        // SAFETY: i + 64 <= n.
        unsafe {
            let e0 = pow2_below::<HI>(_mm512_fmadd_ps(_mm512_loadu_ps(src.add(i)), vs, vm));
            let e1 = pow2_below::<HI>(_mm512_fmadd_ps(_mm512_loadu_ps(src.add(i + L)), vs, vm));
            let e2 = pow2_below::<HI>(_mm512_fmadd_ps(_mm512_loadu_ps(src.add(i + 2 * L)), vs, vm));
            let e3 = pow2_below::<HI>(_mm512_fmadd_ps(_mm512_loadu_ps(src.add(i + 3 * L)), vs, vm));
            if store {
                _mm512_storeu_ps(dst.add(i), e0);
                _mm512_storeu_ps(dst.add(i + L), e1);
                _mm512_storeu_ps(dst.add(i + 2 * L), e2);
                _mm512_storeu_ps(dst.add(i + 3 * L), e3);
            }
            a0 = _mm512_add_ps(a0, e0);
            a1 = _mm512_add_ps(a1, e1);
            a0 = _mm512_add_ps(a0, e2);
            a1 = _mm512_add_ps(a1, e3);
        }
        i += 2 * BLOCK;
    }
    // The rest, one vector at a time (lanes alternate between a0 and a1 as in blocks),
    // the last one masked. Masked stores are slow on Zen 4: only the last one is.
    let mut hi = false;
    while i < n {
        let k = first(n - i);
        // SAFETY: a full vector when i + 16 <= n, else the mask covers only the n - i
        // elements left.
        let e = unsafe {
            let full = i + L <= n;
            let x = if full {
                _mm512_loadu_ps(src.add(i))
            } else {
                _mm512_maskz_loadu_ps(k, src.add(i))
            };
            let e = pow2_below::<HI>(_mm512_fmadd_ps(x, vs, vm));
            if store && full {
                _mm512_storeu_ps(dst.add(i), e);
            } else if store {
                _mm512_mask_storeu_ps(dst.add(i), k, e);
            }
            e
        };
        if hi {
            a1 = _mm512_mask_add_ps(a1, k, a1, e);
        } else {
            a0 = _mm512_mask_add_ps(a0, k, a0, e);
        }
        hi = !hi;
        i += L;
    }
    sum_lanes(a0, a1)
}

/// `dst[..n] = src[..n]·k`, by non-temporal stores from `dst`'s first 64-byte boundary
/// on (masked stores before it and for the tail), then a store fence.
///
/// # Safety
/// `src` is valid for `n` reads and `dst` for `n` writes, disjoint.
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn stream_scaled(src: *const f32, dst: *mut f32, n: usize, k: f32) {
    let vk = _mm512_set1_ps(k);
    let head = ((64 - dst as usize % 64) % 64 / 4).min(n);
    // SAFETY (whole body): every access is below n, masked where fewer than 16 are left;
    // the streamed addresses are 64-byte aligned.
    unsafe {
        if head > 0 {
            let m = first(head);
            _mm512_mask_storeu_ps(dst, m, _mm512_mul_ps(_mm512_maskz_loadu_ps(m, src), vk));
        }
        let mut i = head;
        while i + L <= n {
            _mm512_stream_ps(dst.add(i), _mm512_mul_ps(_mm512_loadu_ps(src.add(i)), vk));
            i += L;
        }
        if i < n {
            let m = first(n - i);
            let v = _mm512_mul_ps(_mm512_maskz_loadu_ps(m, src.add(i)), vk);
            _mm512_mask_storeu_ps(dst.add(i), m, v);
        }
        _mm_sfence();
    }
}

/// [`exp_pass`] with the upper clamp chosen as [`exp_shifted`] chooses it.
///
/// # Safety
/// As [`exp_pass`], without the condition on `HI`.
#[inline]
#[target_feature(enable = "avx512f,avx512dq")]
unsafe fn exp_pass_clamped(
    src: *const f32,
    dst: *mut f32,
    n: usize,
    scale2: f32,
    m2: f32,
    sink: Sink,
) -> f32 {
    // SAFETY: the caller's; see `exp_shifted` for when the clamp is needed.
    unsafe {
        if m2.abs() < 16_777_216.0 {
            exp_pass::<false>(src, dst, n, scale2, m2, sink)
        } else {
            exp_pass::<true>(src, dst, n, scale2, m2, sink)
        }
    }
}

/// `row = 2^(row·scale2 - m2)`, in place; returns the sum (as [`simd::pow2_shifted`],
/// same bits). `m2` is at least the row's max times `scale2`.
///
/// # Safety
/// The CPU has AVX-512 F and DQ.
#[target_feature(enable = "avx512f,avx512dq")]
pub(crate) unsafe fn exp_shifted_row(row: &mut [f32], scale2: f32, m2: f32) -> f32 {
    let (n, p) = (row.len(), row.as_mut_ptr());
    // SAFETY: `p` holds n elements; each is read before it is written.
    unsafe { exp_shifted(p, p, n, scale2, m2) }
}

/// `x[..n] *= s`.
///
/// # Safety
/// `x` is valid for `n` reads and writes.
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn scale_in_place(x: *mut f32, n: usize, s: f32) {
    let vs = _mm512_set1_ps(s);
    let mut i = 0;
    while i + L <= n {
        // SAFETY: i + 16 <= n.
        unsafe { _mm512_storeu_ps(x.add(i), _mm512_mul_ps(_mm512_loadu_ps(x.add(i)), vs)) };
        i += L;
    }
    if i < n {
        let k = first(n - i);
        // SAFETY: the mask covers only the n - i elements left.
        unsafe {
            let v = _mm512_maskz_loadu_ps(k, x.add(i));
            _mm512_mask_storeu_ps(x.add(i), k, _mm512_mul_ps(v, vs));
        }
    }
}

/// `x[..n] = 0`.
///
/// # Safety
/// `x` is valid for `n` writes.
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn zero(x: *mut f32, n: usize) {
    let z = _mm512_setzero_ps();
    let mut i = 0;
    while i + L <= n {
        // SAFETY: i + 16 <= n.
        unsafe { _mm512_storeu_ps(x.add(i), z) };
        i += L;
    }
    if i < n {
        // SAFETY: the mask covers only the n - i elements left.
        unsafe { _mm512_mask_storeu_ps(x.add(i), first(n - i), z) };
    }
}

/// One softmax row: `dst[..n] = softmax(scale·src[..n])`, `dst[n..] = 0`; returns the
/// row's `m2 = max·scale·log2 e` and `s = Σ 2^(x·scale·log2 e - m2)`, whose
/// `m2 + log2 s` is the base-2 log-sum-exp [`crate::norm_softmax_loss::rows::softmax_row_in_place`]
/// returns (the same bits). `src == None` means in place. Requires `scale >= 0` and `1 <= n`.
///
/// # Safety
/// The CPU has AVX-512 F and DQ.
#[target_feature(enable = "avx512f,avx512dq")]
pub(crate) unsafe fn softmax_row(
    src: Option<&[f32]>,
    dst: &mut [f32],
    n: usize,
    scale: f32,
) -> (f32, f32) {
    assert!(n >= 1 && n <= dst.len() && scale >= 0.0);
    let s_ptr = source(src, dst, n);
    let d = dst.as_mut_ptr();
    // SAFETY: `s_ptr` has n elements, `d` has dst.len() >= n; every read of an element
    // comes before its write when they alias.
    unsafe {
        let scale2 = scale * LOG2_E;
        let m2 = max(s_ptr, n) * scale2;
        let s = exp_shifted(s_ptr, d, n, scale2, m2);
        scale_in_place(d, n, 1.0 / s);
        zero(d.add(n), dst.len() - n);
        (m2, s)
    }
}

/// Rows ahead whose source [`softmax_rows`] prefetches.
const PREFETCH_ROWS: usize = 2;

/// [`softmax_row`] over every row of `dst` (rows of `k_len`, row `r` with `visible(r)`
/// visible values), from `src` (same shape) or in place; `lse(r, l)` receives row `r`'s
/// base-2 log-sum-exp. The same bits as [`softmax_row`] row by row.
///
/// **Software-pipelined across rows**, three rows in flight. A row waits on itself twice:
/// its exponentials on its maximum (a reduction across lanes), its scaling (`p = e / Σe`)
/// on its sum (a tree of adds over the whole exponential pass, then a division), each
/// 20-60 cycles of latency that one row alone cannot hide (perf put a quarter of the
/// causal softmax's samples on these chains). So row `r + 1`'s maximum is taken before
/// row `r`'s exponentials, and row `r - 1` is scaled after them, when its `1/Σ` has long
/// been ready. Each element still sees the same operations in the same order.
///
/// # Safety
/// The CPU has AVX-512 F and DQ.
#[target_feature(enable = "avx512f,avx512dq")]
pub(crate) unsafe fn softmax_rows(
    src: Option<&[f32]>,
    dst: &mut [f32],
    k_len: usize,
    visible: impl Fn(usize) -> usize,
    scale: f32,
    mut lse: impl FnMut(usize, f32),
) {
    assert!(k_len >= 1 && scale >= 0.0 && src.is_none_or(|s| s.len() == dst.len()));
    let rows = dst.len() / k_len;
    let scale2 = scale * LOG2_E;
    let d = dst.as_mut_ptr();
    let s = src.map_or(d.cast_const(), |s| s.as_ptr());
    let width = |r: usize| {
        let n = visible(r);
        assert!(n >= 1 && n <= k_len, "row {r}: {n} visible of {k_len}");
        n
    };
    if rows == 0 {
        return;
    }
    // The row whose scaling waits: (row, visible, 1/Σ, base-2 lse).
    let mut pending: Option<(usize, usize, f32, f32)> = None;
    // SAFETY (whole body): rows `r < rows` of `s` and `d` hold `k_len` elements, and every
    // access stays in row `r`'s first `width(r)` (or, for the zeros, the rest of it). In
    // place (`s == d`), row `r` is read (its max, then its exponentials) before its
    // elements are written, and the zeros go where no read of the row looks.
    unsafe {
        let mut n_next = width(0);
        let mut m2_next = max(s, n_next) * scale2;
        for r in 0..rows {
            let (n, m2) = (n_next, m2_next);
            let (src_r, dst_r) = (s.add(r * k_len), d.add(r * k_len));
            if src.is_some() && r + PREFETCH_ROWS < rows {
                let ahead = r + PREFETCH_ROWS;
                simd::prefetch_raw(s.add(ahead * k_len), width(ahead));
            }
            if r + 1 < rows {
                n_next = width(r + 1);
                m2_next = max(s.add((r + 1) * k_len), n_next) * scale2;
            }
            zero(dst_r.add(n), k_len - n);
            let sum = exp_shifted(src_r, dst_r, n, scale2, m2);
            if let Some((pr, pn, inv, l)) = pending {
                scale_in_place(d.add(pr * k_len), pn, inv);
                lse(pr, l);
            }
            pending = Some((r, n, 1.0 / sum, m2 + sum.log2()));
        }
        if let Some((pr, pn, inv, l)) = pending {
            scale_in_place(d.add(pr * k_len), pn, inv);
            lse(pr, l);
        }
    }
}

/// One row of softmax + cross-entropy: returns the loss of `target` under
/// `softmax(src[..vocab])` and writes `grad_scale·(softmax - onehot)` into `dst[..vocab]`,
/// 0 into `dst[vocab..]`, as [`crate::norm_softmax_loss::rows::cross_entropy_in_place_with`] does
/// (same bits). `src == None` means in place. Requires `target < vocab <= dst.len()`.
///
/// # Safety
/// The CPU has AVX-512 F and DQ.
#[target_feature(enable = "avx512f,avx512dq")]
pub(crate) unsafe fn cross_entropy_row(
    src: Option<&[f32]>,
    dst: &mut [f32],
    target: usize,
    vocab: usize,
    grad_scale: f32,
) -> f32 {
    assert!(target < vocab && vocab <= dst.len());
    let s_ptr = source(src, dst, vocab);
    let d = dst.as_mut_ptr();
    // SAFETY: as in `softmax_row`; `target < vocab`; the row buffer holds `vocab`.
    unsafe {
        let x_t = *s_ptr.add(target);
        let m2 = max(s_ptr, vocab) * LOG2_E;
        let loss = if src.is_none() {
            // In place: the row's lines are in cache from the max; `e` into the row,
            // then scaled there.
            let sum = exp_pass_clamped(s_ptr, d, vocab, LOG2_E, m2, Sink::Store);
            scale_in_place(d, vocab, grad_scale / sum);
            crate::norm_softmax_loss::rows::loss_of(m2, sum, x_t)
        } else {
            // From a source: `e` into a row buffer that stays in L1/L2, then `e·k`
            // streamed to `dst` once (`stream_scaled`: no read for ownership of `dst`).
            // Writing `e` into `dst` and scaling it there read every line of `dst` from
            // memory first and ran at 29% of a copy (benches/README.md).
            crate::norm_softmax_loss::rows::with_row_scratch(vocab, |buf| {
                let sum = exp_pass_clamped(s_ptr, buf.as_mut_ptr(), vocab, LOG2_E, m2, Sink::Store);
                stream_scaled(buf.as_ptr(), d, vocab, grad_scale / sum);
                crate::norm_softmax_loss::rows::loss_of(m2, sum, x_t)
            })
        };
        *d.add(target) -= grad_scale;
        zero(d.add(vocab), dst.len() - vocab);
        loss
    }
}

/// The loss of one row of logits, `ln Σ e^x - x_target` over `x[..vocab]`, without its
/// gradient (the same bits as [`cross_entropy_row`]'s loss).
///
/// # Safety
/// The CPU has AVX-512 F and DQ.
#[target_feature(enable = "avx512f,avx512dq")]
pub(crate) unsafe fn cross_entropy_loss_row(x: &[f32], target: usize, vocab: usize) -> f32 {
    assert!(target < vocab && vocab <= x.len());
    let p = x.as_ptr();
    // SAFETY: `p` holds vocab elements; nothing is written.
    unsafe {
        let m2 = max(p, vocab) * LOG2_E;
        let sum = exp_pass_clamped(p, std::ptr::null_mut(), vocab, LOG2_E, m2, Sink::SumOnly);
        crate::norm_softmax_loss::rows::loss_of(m2, sum, x[target])
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::simd::Fused;

    fn data(n: usize, seed: u32) -> Vec<f32> {
        andrea_testkit::random::Rand::new(seed as u64).vec(n, -20.0, 20.0)
    }

    #[test]
    fn pow2_gives_the_generic_bits() {
        if !simd::has_avx512() {
            eprintln!("SKIPPED: this CPU has no AVX-512");
            return;
        }
        let mut x: Vec<f32> = (0..6000).map(|i| i as f32 * 0.047 - 140.0).collect();
        x.extend([f32::NAN, f32::INFINITY, f32::NEG_INFINITY, 0.0, -0.0, 1e-30]);
        // Ties and near-ties of `round(z)` (to even, both ways), and small negatives
        // (where `vrndscaleps` gives -0.0 and the generic trick +0.0).
        for k in -127..127 {
            let t = k as f32 + 0.5;
            x.extend([
                t,
                f32::from_bits(t.to_bits() + 1),
                f32::from_bits(t.to_bits() - 1),
            ]);
        }
        x.extend([-0.3, -1e-30, -0.5, -0.49999997]);
        x.resize(x.len().div_ceil(L) * L, 0.5);
        for c in x.chunks_exact(L) {
            let (mut got, mut low) = ([0.0f32; L], [0.0f32; L]);
            // SAFETY: AVX-512 checked above; `c`, `got` and `low` hold 16 elements.
            unsafe {
                let v = _mm512_loadu_ps(c.as_ptr());
                _mm512_storeu_ps(got.as_mut_ptr(), pow2_below::<true>(v));
                _mm512_storeu_ps(low.as_mut_ptr(), pow2_below::<false>(v));
            }
            for ((g, l), &v) in got.iter().zip(low).zip(c) {
                let want = simd::pow2::<Fused>(v);
                let same = |a: f32| a.to_bits() == want.to_bits() || (a.is_nan() && want.is_nan());
                assert!(same(*g), "pow2({v}): {g} vs {want}");
                if v <= 126.0 {
                    assert!(same(l), "pow2_below({v}): {l} vs {want}");
                }
            }
        }
    }

    /// Softmax and cross-entropy rows equal the generic forms bit for bit, for lengths
    /// around every block and vector boundary, in place and from a source.
    #[test]
    fn rows_give_the_generic_bits() {
        if !simd::has_avx512() {
            eprintln!("SKIPPED: this CPU has no AVX-512");
            return;
        }
        for len in [
            1usize, 2, 15, 16, 17, 31, 32, 33, 63, 64, 65, 100, 256, 1000,
        ] {
            let x = data(len, len as u32);
            for n in [1, len / 3 + 1, len.saturating_sub(1).max(1), len] {
                for scale in [0.125f32, 1.0, 0.0] {
                    let mut want = x.clone();
                    let lw = crate::norm_softmax_loss::rows::softmax_row_in_place::<Fused>(
                        &mut want, n, scale,
                    );
                    let mut got = vec![f32::NAN; len];
                    // SAFETY: AVX-512 checked above.
                    let (m, s) = unsafe { softmax_row(Some(&x), &mut got, n, scale) };
                    let lg = m + s.log2();
                    let mut inplace = x.clone();
                    // SAFETY: as above.
                    let (m, s) = unsafe { softmax_row(None, &mut inplace, n, scale) };
                    let li = m + s.log2();
                    assert_eq!(
                        lg.to_bits(),
                        lw.to_bits(),
                        "lse len {len} n {n} scale {scale}"
                    );
                    assert_eq!(li.to_bits(), lw.to_bits());
                    for i in 0..len {
                        assert_eq!(
                            got[i].to_bits(),
                            want[i].to_bits(),
                            "len {len} n {n} at {i}"
                        );
                        assert_eq!(inplace[i].to_bits(), want[i].to_bits());
                    }
                }
            }
            // A task's rows at once (software-pipelined): each row as `softmax_row` gives
            // it, with ragged causal widths, from a source and in place.
            let k_len = len.min(100);
            let rows = 7;
            let xs = data(rows * k_len, 7 + len as u32);
            let vis = |r: usize| (1 + r * k_len / 5).min(k_len);
            for scale in [0.125f32, 0.0] {
                let mut want = xs.clone();
                let mut lw = vec![0.0f32; rows];
                for (r, row) in want.chunks_exact_mut(k_len).enumerate() {
                    // SAFETY: AVX-512 checked above.
                    let (m, s) = unsafe { softmax_row(None, row, vis(r), scale) };
                    lw[r] = m + s.log2();
                }
                let mut got = vec![f32::NAN; rows * k_len];
                let mut inplace = xs.clone();
                let (mut lg, mut li) = (vec![f32::NAN; rows], vec![f32::NAN; rows]);
                // SAFETY: as above.
                unsafe {
                    softmax_rows(Some(&xs), &mut got, k_len, vis, scale, |r, l| lg[r] = l);
                    softmax_rows(None, &mut inplace, k_len, vis, scale, |r, l| li[r] = l);
                }
                for r in 0..rows {
                    assert_eq!(
                        lg[r].to_bits(),
                        lw[r].to_bits(),
                        "rows lse k {k_len} row {r}"
                    );
                    assert_eq!(li[r].to_bits(), lw[r].to_bits(), "in place lse row {r}");
                }
                for i in 0..rows * k_len {
                    assert_eq!(got[i].to_bits(), want[i].to_bits(), "rows k {k_len} at {i}");
                    assert_eq!(inplace[i].to_bits(), want[i].to_bits(), "in place at {i}");
                }
            }
            let pad = len + 7;
            let mut xp = x.clone();
            xp.resize(pad, 3.0);
            for target in [0, len / 2, len - 1] {
                let mut want = xp.clone();
                let lw = crate::norm_softmax_loss::rows::cross_entropy_in_place_with::<Fused>(
                    &mut want,
                    target as u32,
                    len,
                    0.25,
                );
                let mut got = vec![f32::NAN; pad];
                // SAFETY: AVX-512 checked above.
                let lg = unsafe { cross_entropy_row(Some(&xp), &mut got, target, len, 0.25) };
                assert_eq!(lg.to_bits(), lw.to_bits(), "loss len {len} target {target}");
                // SAFETY: as above.
                let lo = unsafe { cross_entropy_loss_row(&xp, target, len) };
                assert_eq!(lo.to_bits(), lw.to_bits(), "loss only, len {len}");
                for i in 0..pad {
                    assert_eq!(got[i].to_bits(), want[i].to_bits(), "len {len} at {i}");
                }
            }
        }
    }
}
