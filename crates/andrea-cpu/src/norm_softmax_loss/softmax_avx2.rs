//! AVX2 + FMA kernels written with intrinsics: the softmax and softmax + cross-entropy
//! rows, as `softmax_avx512` has them for AVX-512. The two stay side by side rather than
//! one body over the width: their row tails differ in kind (`vmaskmovps` with an integer
//! mask here, mask registers there) and so do their pass structures; `pow2` and the
//! bits they must reproduce (`rows`) are shared.
//!
//! What they buy over the `multiversion!` copies (the generic block forms in `simd`,
//! compiled with `avx2,fma`): the row's tail is one masked vector rather than a
//! zero-padded block of 32 through a stack buffer; a softmax from a source reads it in
//! its first pass instead of copying it into the row first; and the loss's gradient,
//! from a source, is streamed to its destination once by non-temporal stores (see
//! [`cross_entropy_row`]).
//!
//! **Same bits as the generic copies** with `Fused`: every element goes through the
//! operations of [`simd::pow2`] in the same order, and sums keep the [`BLOCK`] lanes of
//! [`simd::pow2_shifted`] (element `i` of a row into lane `i mod 32`: four vectors of
//! eight), folded by the tree of [`simd::sum_lanes`]. Unit tests compare the bits.
//!
//! Everything here requires AVX2 and FMA (the callers check [`simd::has_avx2_fma`]).

use std::arch::x86_64::*;
use std::f32::consts::LOG2_E;

use crate::norm_softmax_loss::rows::source;
use crate::simd::lanes;
use crate::simd::{self, BLOCK};

/// The lanes of one vector.
const L: usize = 8;

/// Lanes `0..n` set (all when `n >= 8`), as `vmaskmovps` wants them.
#[inline]
#[target_feature(enable = "avx2")]
fn first(n: usize) -> __m256i {
    let n = n.min(L) as i32;
    _mm256_cmpgt_epi32(
        _mm256_set1_epi32(n),
        _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7),
    )
}

/// `2^z` on 8 lanes: [`lanes::pow2`]; without the upper clamp when `!HI`, for arguments
/// known to be at most 126 (softmax's `x - max`).
#[inline]
#[target_feature(enable = "avx2,fma")]
fn pow2_below<const HI: bool>(z: __m256) -> __m256 {
    // SAFETY: compiled with AVX2 + FMA.
    unsafe { lanes::pow2::<__m256, HI>(z) }
}

/// [`simd::sum_lanes`] of the 32 lanes `a[0] ++ a[1] ++ a[2] ++ a[3]`.
#[inline]
#[target_feature(enable = "avx2")]
fn sum_lanes(a: [__m256; 4]) -> f32 {
    let s8 = _mm256_add_ps(_mm256_add_ps(a[0], a[2]), _mm256_add_ps(a[1], a[3]));
    let s4 = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps::<1>(s8));
    let s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
    _mm_cvtss_f32(_mm_add_ss(s2, _mm_movehdup_ps(s2)))
}

/// Largest of `x[..n]` (`-inf` if `n == 0`). Max is exact, so the order is free.
///
/// # Safety
/// `x` is valid for `n` reads.
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn max(x: *const f32, n: usize) -> f32 {
    let ninf = _mm256_set1_ps(f32::NEG_INFINITY);
    let mut m = [ninf; 4];
    let mut i = 0;
    while i + 4 * L <= n {
        for (j, m) in m.iter_mut().enumerate() {
            // SAFETY: i + 32 <= n.
            *m = _mm256_max_ps(*m, unsafe { _mm256_loadu_ps(x.add(i + j * L)) });
        }
        i += 4 * L;
    }
    while i < n {
        // SAFETY: the mask covers only the elements below n; masked-off lanes read as
        // 0, which the blend replaces by -inf.
        let v = unsafe { _mm256_maskload_ps(x.add(i), first(n - i)) };
        let v = _mm256_blendv_ps(ninf, v, _mm256_castsi256_ps(first(n - i)));
        m[0] = _mm256_max_ps(m[0], v);
        i += L;
    }
    let m8 = _mm256_max_ps(_mm256_max_ps(m[0], m[1]), _mm256_max_ps(m[2], m[3]));
    let m4 = _mm_max_ps(_mm256_castps256_ps128(m8), _mm256_extractf128_ps::<1>(m8));
    let m2 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    _mm_cvtss_f32(_mm_max_ss(m2, _mm_movehdup_ps(m2)))
}

/// What an exponential pass does with `e = 2^(src·scale2 - m2)`: store it, or only sum it.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Sink {
    Store,
    SumOnly,
}

/// `e = 2^(src[i]·scale2 - m2)` for `i < n`, each stored or not as `sink` says; returns
/// `Σ e`, added as [`simd::pow2_shifted`] adds it (same bits). `src` may equal `dst`.
///
/// # Safety
/// `src` is valid for `n` reads and `dst` (unless `SumOnly`) for `n` writes; with `!HI`
/// every `src[i]·scale2 - m2` is at most 126.
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn exp_pass<const HI: bool>(
    src: *const f32,
    dst: *mut f32,
    n: usize,
    scale2: f32,
    m2: f32,
    sink: Sink,
) -> f32 {
    let (vs, vm) = (_mm256_set1_ps(scale2), _mm256_set1_ps(-m2));
    let store = sink == Sink::Store;
    let mut acc = [_mm256_setzero_ps(); 4];
    let mut i = 0;
    // A block of 32 per pass: four independent exp chains, vector j into lanes 8j...
    while i + BLOCK <= n {
        // SAFETY: i + 32 <= n.
        unsafe {
            let e: [__m256; 4] = std::array::from_fn(|j| {
                pow2_below::<HI>(_mm256_fmadd_ps(_mm256_loadu_ps(src.add(i + j * L)), vs, vm))
            });
            for j in 0..4 {
                if store {
                    _mm256_storeu_ps(dst.add(i + j * L), e[j]);
                }
                acc[j] = _mm256_add_ps(acc[j], e[j]);
            }
        }
        i += BLOCK;
    }
    // The last `n - i < 32`: vector j of it into accumulator j (the generic form's
    // zero-padded block, whose padding adds +0.0: nothing), the last one masked.
    let mut j = 0;
    while i < n {
        let k = first(n - i);
        // SAFETY: a full vector when i + 8 <= n, else the mask covers only the n - i
        // elements left (masked-off lanes read as 0 and are not stored).
        let e = unsafe {
            let full = i + L <= n;
            let x = if full {
                _mm256_loadu_ps(src.add(i))
            } else {
                _mm256_maskload_ps(src.add(i), k)
            };
            let e = pow2_below::<HI>(_mm256_fmadd_ps(x, vs, vm));
            if store && full {
                _mm256_storeu_ps(dst.add(i), e);
            } else if store {
                _mm256_maskstore_ps(dst.add(i), k, e);
            }
            _mm256_and_ps(e, _mm256_castsi256_ps(k))
        };
        acc[j] = _mm256_add_ps(acc[j], e);
        j += 1;
        i += L;
    }
    sum_lanes(acc)
}

/// `dst[..n] = src[..n]·k`, by non-temporal stores from `dst`'s first 32-byte boundary
/// on (masked stores before it and for the tail), then a store fence (as the `avx512`
/// module's `stream_scaled`).
///
/// # Safety
/// `src` is valid for `n` reads and `dst` for `n` writes, disjoint.
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn stream_scaled(src: *const f32, dst: *mut f32, n: usize, k: f32) {
    let vk = _mm256_set1_ps(k);
    let head = ((32 - dst as usize % 32) % 32 / 4).min(n);
    // SAFETY (whole body): every access is below n, masked where fewer than 8 are left;
    // the streamed addresses are 32-byte aligned.
    unsafe {
        if head > 0 {
            let m = first(head);
            _mm256_maskstore_ps(dst, m, _mm256_mul_ps(_mm256_maskload_ps(src, m), vk));
        }
        let mut i = head;
        while i + L <= n {
            _mm256_stream_ps(dst.add(i), _mm256_mul_ps(_mm256_loadu_ps(src.add(i)), vk));
            i += L;
        }
        if i < n {
            let m = first(n - i);
            _mm256_maskstore_ps(
                dst.add(i),
                m,
                _mm256_mul_ps(_mm256_maskload_ps(src.add(i), m), vk),
            );
        }
        // Non-temporal stores are weakly ordered: fence them before anything reads the row.
        _mm_sfence();
    }
}

/// [`exp_pass`] with the upper clamp only where it can matter: `x·scale2 - m2 <=
/// max·scale2 - m2`, a rounding error of `m2`, at most 126 while |m2| < 2^24.
///
/// # Safety
/// As [`exp_pass`], without the condition on `HI`.
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn exp_pass_clamped(
    src: *const f32,
    dst: *mut f32,
    n: usize,
    scale2: f32,
    m2: f32,
    sink: Sink,
) -> f32 {
    // SAFETY: the caller's.
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
/// The CPU has AVX2 and FMA.
#[target_feature(enable = "avx2,fma")]
pub(crate) unsafe fn exp_shifted_row(row: &mut [f32], scale2: f32, m2: f32) -> f32 {
    let (n, p) = (row.len(), row.as_mut_ptr());
    // SAFETY: `p` holds n elements; each is read before it is written.
    unsafe { exp_pass_clamped(p, p, n, scale2, m2, Sink::Store) }
}

/// `x[..n] *= s`, the last vector masked.
///
/// # Safety
/// `x` is valid for `n` reads and writes.
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn scale_in_place(x: *mut f32, n: usize, s: f32) {
    let vs = _mm256_set1_ps(s);
    let mut i = 0;
    // SAFETY (both loops): full vectors below n, then the mask covers the rest.
    while i + L <= n {
        unsafe { _mm256_storeu_ps(x.add(i), _mm256_mul_ps(_mm256_loadu_ps(x.add(i)), vs)) };
        i += L;
    }
    if i < n {
        let k = first(n - i);
        unsafe {
            let v = _mm256_maskload_ps(x.add(i), k);
            _mm256_maskstore_ps(x.add(i), k, _mm256_mul_ps(v, vs));
        }
    }
}

/// Rows ahead whose visible source [`softmax_rows`] prefetches.
const PREFETCH_ROWS: usize = 2;

/// Softmax rows: `dst[..n] = softmax(scale·src[..n])`, `dst[n..] = 0` for every row of
/// `dst` (rows of `k_len`, row `r` with `n = visible(r)` visible values, from the same
/// row of `src`, or in place when `src` is `None`), each row's base-2 log-sum-exp
/// `m2 + log2 s` handed to `lse(r, ·)`: the bits of
/// [`crate::norm_softmax_loss::rows::softmax_row_in_place`] with `Fused`, row by row.
///
/// What it changes is the order of the passes, so that rows overlap: a row waits on
/// itself twice (its exponentials on its max, its scaling on the sum of its
/// exponentials through a tree of adds and a divide), and one row at a time left those
/// waits empty, a fraction of the speed of copying the rows. Here the next row's max and this row's masked zeros go between this row's
/// exponentials and its scaling, and the next row's exponentials need only that max.
///
/// # Safety
/// The CPU has AVX2 and FMA. `scale >= 0`; `src`, if given, has `dst.len()` elements;
/// `1 <= visible(r) <= k_len` for every row (checked).
#[target_feature(enable = "avx2,fma")]
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
    if rows == 0 {
        return;
    }
    let scale2 = scale * LOG2_E;
    let d = dst.as_mut_ptr();
    let s = src.map_or(d.cast_const(), |s| s.as_ptr());
    let width = |r: usize| {
        let n = visible(r);
        assert!(n >= 1 && n <= k_len, "row {r}: {n} visible of {k_len}");
        n
    };
    // SAFETY (whole body): rows `r < rows` of `s` and `d` hold `k_len` elements, and every
    // access below stays in row `r`'s first `width(r)` (or, for the zeros, the rest of
    // it). In place (`s == d`), a row is read (its max, then its exponentials) before it
    // is written, and the next row's max reads a row nothing has written yet.
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
            let sum = exp_pass_clamped(src_r, dst_r, n, scale2, m2, Sink::Store);
            if r + 1 < rows {
                n_next = width(r + 1);
                m2_next = max(s.add((r + 1) * k_len), n_next) * scale2;
            }
            std::slice::from_raw_parts_mut(dst_r.add(n), k_len - n).fill(0.0);
            scale_in_place(dst_r, n, 1.0 / sum);
            lse(r, m2 + sum.log2());
        }
    }
}

/// One row of softmax + cross-entropy: returns the loss of `target` under
/// `softmax(src[..vocab])` and writes `grad_scale·(softmax - onehot)` into `dst[..vocab]`,
/// 0 into `dst[vocab..]`, with the bits of
/// [`crate::norm_softmax_loss::rows::cross_entropy_in_place_with`]. `src == None` means in place.
/// Requires `target < vocab <= dst.len()`.
///
/// In place, `e` goes into the row and is scaled there; from a source, `e` goes into a
/// row buffer and `e·k` is streamed to `dst` (as the `softmax_avx512` kernel, which
/// says why).
///
/// # Safety
/// The CPU has AVX2 and FMA.
#[target_feature(enable = "avx2,fma")]
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
    // SAFETY: `s_ptr` has `vocab` elements, `d` dst.len() >= vocab, every read of an
    // element comes before its write when they alias; `target < vocab`; the row buffer
    // holds `vocab`.
    let loss = unsafe {
        let x_t = *s_ptr.add(target);
        let m2 = max(s_ptr, vocab) * LOG2_E;
        let loss = if src.is_none() {
            let sum = exp_pass_clamped(s_ptr, d, vocab, LOG2_E, m2, Sink::Store);
            scale_in_place(d, vocab, grad_scale / sum);
            crate::norm_softmax_loss::rows::loss_of(m2, sum, x_t)
        } else {
            crate::norm_softmax_loss::rows::with_row_scratch(vocab, |buf| {
                let sum = exp_pass_clamped(s_ptr, buf.as_mut_ptr(), vocab, LOG2_E, m2, Sink::Store);
                stream_scaled(buf.as_ptr(), d, vocab, grad_scale / sum);
                crate::norm_softmax_loss::rows::loss_of(m2, sum, x_t)
            })
        };
        *d.add(target) -= grad_scale;
        loss
    };
    dst[vocab..].fill(0.0);
    loss
}

/// The loss of one row of logits, `ln Σ e^x - x_target` over `x[..vocab]`, without its
/// gradient (the same bits as [`cross_entropy_row`]'s loss).
///
/// # Safety
/// The CPU has AVX2 and FMA.
#[target_feature(enable = "avx2,fma")]
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
        if !simd::has_avx2_fma() {
            eprintln!("SKIPPED: this CPU has no AVX2 + FMA");
            return;
        }
        let mut x: Vec<f32> = (0..6000).map(|i| i as f32 * 0.047 - 140.0).collect();
        x.extend([f32::NAN, f32::INFINITY, f32::NEG_INFINITY, 0.0, -0.0, 1e-30]);
        x.resize(x.len().div_ceil(L) * L, 0.5);
        for c in x.chunks_exact(L) {
            let (mut got, mut low) = ([0.0f32; L], [0.0f32; L]);
            // SAFETY: AVX2 + FMA checked above; `c`, `got` and `low` hold 8 elements.
            unsafe {
                let v = _mm256_loadu_ps(c.as_ptr());
                _mm256_storeu_ps(got.as_mut_ptr(), pow2_below::<true>(v));
                _mm256_storeu_ps(low.as_mut_ptr(), pow2_below::<false>(v));
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

    /// One row through [`softmax_rows`] (`dst` is the row).
    fn softmax_row(src: Option<&[f32]>, dst: &mut [f32], n: usize, scale: f32) -> f32 {
        let mut lse = f32::NAN;
        let k_len = dst.len();
        let src = src.map(|s| &s[..k_len]);
        // SAFETY: the callers check AVX2 + FMA; 1 <= n <= k_len.
        unsafe { softmax_rows(src, dst, k_len, |_| n, scale, |_, l| lse = l) };
        lse
    }

    /// Several rows at once give every row the bits and log-sum-exp of the generic row,
    /// in place and from a source, causal and full, around the vector boundaries (the
    /// passes of neighbouring rows interleave: a row that read or wrote its neighbour's
    /// memory, or a pass that used the wrong row's max or sum, shows here).
    #[test]
    fn softmax_rows_give_each_row_the_generic_bits() {
        if !simd::has_avx2_fma() {
            eprintln!("SKIPPED: this CPU has no AVX2 + FMA");
            return;
        }
        for k_len in [1usize, 7, 8, 9, 31, 33, 64, 100] {
            let rows = 5;
            let x = data(rows * k_len, k_len as u32 + 1);
            for causal in [false, true] {
                let vis = |r: usize| if causal { (r % k_len) + 1 } else { k_len };
                let mut want = x.clone();
                let mut want_lse = vec![0.0f32; rows];
                for r in 0..rows {
                    let row = &mut want[r * k_len..(r + 1) * k_len];
                    want_lse[r] = crate::norm_softmax_loss::rows::softmax_row_in_place::<Fused>(
                        row,
                        vis(r),
                        0.3,
                    );
                }
                let mut got = vec![f32::NAN; rows * k_len];
                let mut got_lse = vec![f32::NAN; rows];
                // SAFETY: AVX2 + FMA checked above; `x` has rows * k_len elements.
                unsafe { softmax_rows(Some(&x), &mut got, k_len, vis, 0.3, |r, l| got_lse[r] = l) };
                let mut inplace = x.clone();
                let mut in_lse = vec![f32::NAN; rows];
                // SAFETY: as above.
                unsafe { softmax_rows(None, &mut inplace, k_len, vis, 0.3, |r, l| in_lse[r] = l) };
                let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits(&got), bits(&want), "k_len {k_len} causal {causal}");
                assert_eq!(bits(&inplace), bits(&want), "in place, k_len {k_len}");
                assert_eq!(bits(&got_lse), bits(&want_lse));
                assert_eq!(bits(&in_lse), bits(&want_lse));
            }
        }
    }

    /// Softmax and cross-entropy rows equal the generic forms bit for bit, for lengths
    /// around every vector and block boundary (tails of 1-7 elements, 1-3 full vectors
    /// before a masked one), in place and from a source; the loss alone too.
    #[test]
    fn rows_give_the_generic_bits() {
        if !simd::has_avx2_fma() {
            eprintln!("SKIPPED: this CPU has no AVX2 + FMA");
            return;
        }
        for len in [
            1usize, 2, 7, 8, 9, 15, 16, 17, 23, 24, 25, 31, 32, 33, 63, 64, 65, 100, 256, 1000,
        ] {
            let x = data(len, len as u32);
            for n in [1, len / 3 + 1, len.saturating_sub(1).max(1), len] {
                for scale in [0.125f32, 1.0, 0.0] {
                    let mut want = x.clone();
                    let lw = crate::norm_softmax_loss::rows::softmax_row_in_place::<Fused>(
                        &mut want, n, scale,
                    );
                    let mut got = vec![f32::NAN; len];
                    let lg = softmax_row(Some(&x), &mut got, n, scale);
                    let mut inplace = x.clone();
                    let li = softmax_row(None, &mut inplace, n, scale);
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
                    let mut e = x[..n].to_vec();
                    let mut ew = e.clone();
                    let m2 = lw - 3.0;
                    // SAFETY: as above.
                    let se = unsafe { exp_shifted_row(&mut e, scale * LOG2_E, m2) };
                    let sw = simd::pow2_shifted::<Fused>(&mut ew, scale * LOG2_E, m2);
                    assert_eq!(se.to_bits(), sw.to_bits(), "exp sum len {len} n {n}");
                    assert!(e.iter().zip(&ew).all(|(a, b)| a.to_bits() == b.to_bits()));
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
                // SAFETY: AVX2 + FMA checked above.
                let lg = unsafe { cross_entropy_row(Some(&xp), &mut got, target, len, 0.25) };
                let mut inplace = xp.clone();
                // SAFETY: as above.
                let li = unsafe { cross_entropy_row(None, &mut inplace, target, len, 0.25) };
                // SAFETY: as above.
                let lo = unsafe { cross_entropy_loss_row(&xp, target, len) };
                assert_eq!(lg.to_bits(), lw.to_bits(), "loss len {len} target {target}");
                assert_eq!(li.to_bits(), lw.to_bits());
                assert_eq!(lo.to_bits(), lw.to_bits(), "loss only, len {len}");
                for i in 0..pad {
                    assert_eq!(got[i].to_bits(), want[i].to_bits(), "len {len} at {i}");
                    assert_eq!(inplace[i].to_bits(), want[i].to_bits());
                }
            }
        }
    }
}
