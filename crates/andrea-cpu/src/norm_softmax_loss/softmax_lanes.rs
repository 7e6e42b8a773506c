//! The softmax and softmax + cross-entropy rows on NEON, written with intrinsics over
//! the width ([`F32Rows`]) and instantiated for `float32x4_t` ([`neon`]). They are the
//! AVX2 kernels' (`softmax_avx2`) passes step for step, lane for lane: the same bits.
//! x86 keeps its hand-written kernel: an AVX2 instance of this body gives its bits but
//! not its speed.
//!
//! What they buy over the `multiversion!` copies (the generic block forms in `simd`):
//! the row's tail is one partial vector rather than a zero-padded block of 32 through a
//! stack buffer; a softmax from a source reads it in its first pass instead of copying
//! it into the row first.
//!
//! **Same bits as the generic copies** with `Fused`: every element goes through the
//! operations of [`simd::pow2`] in the same order, and sums keep the [`BLOCK`] lanes of
//! [`simd::pow2_shifted`] (element `i` of a row into lane `i mod 32`: `32 / LANES`
//! vectors), folded by the tree of [`simd::sum_lanes`]. Unit tests compare the bits.

use std::f32::consts::LOG2_E;

use crate::norm_softmax_loss::rows::{loss_of, restore_row_scratch, source, take_row_scratch};
use crate::simd::lanes::{self, F32Rows};
use crate::simd::{self, BLOCK};

/// `2^z` on a vector: [`lanes::pow2`]; without the upper clamp when `!HI`, for arguments
/// known to be at most 126 (softmax's `x - max`).
#[inline(always)]
unsafe fn pow2_below<V: F32Rows, const HI: bool>(z: V) -> V {
    // SAFETY: the caller's instruction set is `V`'s.
    unsafe { lanes::pow2::<V, HI>(z) }
}

/// [`simd::sum_lanes`] of the 32 lanes of `a` (vector `j` holds lanes `j·LANES..`): whole
/// vectors added while the halves are vectors, then [`F32Rows::reduce_add`].
#[inline(always)]
unsafe fn sum_lanes<V: F32Rows>(mut a: V::Block) -> f32 {
    let a = a.as_mut();
    let mut k = a.len();
    // SAFETY (whole body): the caller's instruction set is `V`'s.
    while k > 1 {
        k /= 2;
        for j in 0..k {
            a[j] = unsafe { V::add(a[j], a[j + k]) };
        }
    }
    unsafe { V::reduce_add(a[0]) }
}

/// Largest of `x[..n]` (`-inf` if `n == 0`). Max is exact, so the order is free.
///
/// # Safety
/// `x` is valid for `n` reads; the CPU has `V`'s instruction set.
#[inline(always)]
unsafe fn max<V: F32Rows>(x: *const f32, n: usize) -> f32 {
    let l = V::LANES;
    // SAFETY (whole body): the instruction set is the caller's; every read is below n.
    unsafe {
        let ninf = V::splat(f32::NEG_INFINITY);
        let mut m = V::block(ninf);
        let m = m.as_mut();
        let mut i = 0;
        while i + BLOCK <= n {
            for (j, m) in m.iter_mut().enumerate() {
                *m = V::max(*m, V::load(x.add(i + j * l)));
            }
            i += BLOCK;
        }
        while i < n {
            // Only the elements below n are read; masked-off lanes are -inf.
            let k = V::first(n - i);
            let v = V::select(k, V::load_masked(x.add(i), k), ninf);
            m[0] = V::max(m[0], v);
            i += l;
        }
        // Neighbours pairwise: max(max(m0, m1), max(m2, m3)), ...
        let mut k = m.len();
        while k > 1 {
            k /= 2;
            for j in 0..k {
                m[j] = V::max(m[2 * j], m[2 * j + 1]);
            }
        }
        V::reduce_max(m[0])
    }
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
/// every `src[i]·scale2 - m2` is at most 126; the CPU has `V`'s instruction set.
#[inline(always)]
unsafe fn exp_pass<V: F32Rows, const HI: bool>(
    src: *const f32,
    dst: *mut f32,
    n: usize,
    scale2: f32,
    m2: f32,
    sink: Sink,
) -> f32 {
    let l = V::LANES;
    let store = sink == Sink::Store;
    // SAFETY (whole body): the instruction set is the caller's; every access is below n
    // (full vectors while i + LANES <= n, then the mask covers only the n - i left).
    unsafe {
        let (vs, vm) = (V::splat(scale2), V::splat(-m2));
        let mut acc = V::block(V::splat(0.0));
        // A block of 32 per pass: 32 / LANES independent exp chains, vector j into lanes
        // LANES·j...
        let mut i = 0;
        while i + BLOCK <= n {
            let mut e = acc;
            for (j, e) in e.as_mut().iter_mut().enumerate() {
                *e = pow2_below::<V, HI>(V::fmadd(V::load(src.add(i + j * l)), vs, vm));
            }
            for (j, (a, &e)) in acc.as_mut().iter_mut().zip(e.as_ref()).enumerate() {
                if store {
                    V::store(dst.add(i + j * l), e);
                }
                *a = V::add(*a, e);
            }
            i += BLOCK;
        }
        // The last `n - i < 32`: vector j of it into accumulator j (the generic form's
        // zero-padded block, whose padding adds +0.0: nothing), the last one masked.
        let mut j = 0;
        while i < n {
            let k = V::first(n - i);
            let full = i + l <= n;
            let x = if full {
                V::load(src.add(i))
            } else {
                V::load_masked(src.add(i), k)
            };
            let e = pow2_below::<V, HI>(V::fmadd(x, vs, vm));
            if store && full {
                V::store(dst.add(i), e);
            } else if store {
                V::store_masked(dst.add(i), k, e);
            }
            let a = &mut acc.as_mut()[j];
            *a = V::add(*a, V::keep(k, e));
            j += 1;
            i += l;
        }
        sum_lanes::<V>(acc)
    }
}

/// `dst[..n] = src[..n]·k`, streamed ([`F32Rows::stream`]) from `dst`'s first
/// vector-aligned element on (masked stores before it and for the tail), then fenced (as
/// the `avx512` module's `stream_scaled`).
///
/// # Safety
/// `src` is valid for `n` reads and `dst` for `n` writes, disjoint; the CPU has `V`'s
/// instruction set.
#[inline(always)]
unsafe fn stream_scaled<V: F32Rows>(src: *const f32, dst: *mut f32, n: usize, k: f32) {
    let (l, bytes) = (V::LANES, std::mem::size_of::<V>());
    let head = ((bytes - dst as usize % bytes) % bytes / 4).min(n);
    // SAFETY (whole body): every access is below n, masked where fewer than LANES are
    // left; the streamed addresses are aligned to the vector's size.
    unsafe {
        let vk = V::splat(k);
        if head > 0 {
            let m = V::first(head);
            V::store_masked(dst, m, V::mul(V::load_masked(src, m), vk));
        }
        let mut i = head;
        while i + l <= n {
            V::stream(dst.add(i), V::mul(V::load(src.add(i)), vk));
            i += l;
        }
        if i < n {
            let m = V::first(n - i);
            V::store_masked(dst.add(i), m, V::mul(V::load_masked(src.add(i), m), vk));
        }
        // Non-temporal stores are weakly ordered: fence them before anything reads the row.
        V::stream_fence();
    }
}

/// [`exp_pass`] with the upper clamp only where it can matter: `x·scale2 - m2 <=
/// max·scale2 - m2`, a rounding error of `m2`, at most 126 while |m2| < 2^24.
///
/// # Safety
/// As [`exp_pass`], without the condition on `HI`.
#[inline(always)]
unsafe fn exp_pass_clamped<V: F32Rows>(
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
            exp_pass::<V, false>(src, dst, n, scale2, m2, sink)
        } else {
            exp_pass::<V, true>(src, dst, n, scale2, m2, sink)
        }
    }
}

/// `row = 2^(row·scale2 - m2)`, in place; returns the sum (as [`simd::pow2_shifted`],
/// same bits). `m2` is at least the row's max times `scale2`.
///
/// # Safety
/// The CPU has `V`'s instruction set.
#[inline(always)]
unsafe fn exp_shifted_row<V: F32Rows>(row: &mut [f32], scale2: f32, m2: f32) -> f32 {
    let (n, p) = (row.len(), row.as_mut_ptr());
    // SAFETY: `p` holds n elements; each is read before it is written.
    unsafe { exp_pass_clamped::<V>(p, p, n, scale2, m2, Sink::Store) }
}

/// `x[..n] *= s`, the last vector masked.
///
/// # Safety
/// `x` is valid for `n` reads and writes; the CPU has `V`'s instruction set.
#[inline(always)]
unsafe fn scale_in_place<V: F32Rows>(x: *mut f32, n: usize, s: f32) {
    let l = V::LANES;
    // SAFETY (whole body): full vectors below n, then the mask covers the rest.
    unsafe {
        let vs = V::splat(s);
        let mut i = 0;
        while i + l <= n {
            V::store(x.add(i), V::mul(V::load(x.add(i)), vs));
            i += l;
        }
        if i < n {
            let k = V::first(n - i);
            V::store_masked(x.add(i), k, V::mul(V::load_masked(x.add(i), k), vs));
        }
    }
}

/// One instance's passes over a row, each a function compiled for the instance's
/// instruction set and called, not inlined, from the row loops below (which hold no
/// intrinsics of their own): each pass keeps the vector registers to itself, as the
/// AVX2 kernel's do.
///
/// # Safety
/// As the generic functions each method runs: [`max`], [`exp_pass_clamped`],
/// [`scale_in_place`], [`stream_scaled`].
trait Passes {
    unsafe fn max(x: *const f32, n: usize) -> f32;
    unsafe fn exp_pass(
        src: *const f32,
        dst: *mut f32,
        n: usize,
        scale2: f32,
        m2: f32,
        sink: Sink,
    ) -> f32;
    unsafe fn scale_in_place(x: *mut f32, n: usize, s: f32);
    unsafe fn stream_scaled(src: *const f32, dst: *mut f32, n: usize, k: f32);
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
/// waits empty, a fraction of the speed of copying the rows. Here the next row's max and
/// this row's masked zeros go between this row's exponentials and its scaling, and the
/// next row's exponentials need only that max.
///
/// # Safety
/// The CPU has `P`'s instruction set. `scale >= 0`; `src`, if given, has `dst.len()`
/// elements; `1 <= visible(r) <= k_len` for every row (checked).
#[inline(always)]
unsafe fn softmax_rows<P: Passes>(
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
        let mut m2_next = P::max(s, n_next) * scale2;
        for r in 0..rows {
            let (n, m2) = (n_next, m2_next);
            let (src_r, dst_r) = (s.add(r * k_len), d.add(r * k_len));
            if src.is_some() && r + PREFETCH_ROWS < rows {
                let ahead = r + PREFETCH_ROWS;
                simd::prefetch_raw(s.add(ahead * k_len), width(ahead));
            }
            let sum = P::exp_pass(src_r, dst_r, n, scale2, m2, Sink::Store);
            if r + 1 < rows {
                n_next = width(r + 1);
                m2_next = P::max(s.add((r + 1) * k_len), n_next) * scale2;
            }
            std::slice::from_raw_parts_mut(dst_r.add(n), k_len - n).fill(0.0);
            P::scale_in_place(dst_r, n, 1.0 / sum);
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
/// The CPU has `P`'s instruction set.
#[inline(always)]
unsafe fn cross_entropy_row<P: Passes>(
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
        let m2 = P::max(s_ptr, vocab) * LOG2_E;
        let loss = if src.is_none() {
            let sum = P::exp_pass(s_ptr, d, vocab, LOG2_E, m2, Sink::Store);
            P::scale_in_place(d, vocab, grad_scale / sum);
            loss_of(m2, sum, x_t)
        } else {
            // Not `with_row_scratch`: its closure would lose this instance's features.
            let mut buf = take_row_scratch(vocab);
            let sum = P::exp_pass(s_ptr, buf.as_mut_ptr(), vocab, LOG2_E, m2, Sink::Store);
            P::stream_scaled(buf.as_ptr(), d, vocab, grad_scale / sum);
            restore_row_scratch(buf);
            loss_of(m2, sum, x_t)
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
/// The CPU has `P`'s instruction set.
#[inline(always)]
unsafe fn cross_entropy_loss_row<P: Passes>(x: &[f32], target: usize, vocab: usize) -> f32 {
    assert!(target < vocab && vocab <= x.len());
    let p = x.as_ptr();
    // SAFETY: `p` holds vocab elements; nothing is written.
    unsafe {
        let m2 = P::max(p, vocab) * LOG2_E;
        let sum = P::exp_pass(p, std::ptr::null_mut(), vocab, LOG2_E, m2, Sink::SumOnly);
        loss_of(m2, sum, x[target])
    }
}

/// The row kernels above as functions compiled for one instruction set, `$V` with
/// `$features`; each function is its generic namesake's (same contract and safety).
macro_rules! instance {
    ($(#[$doc:meta])* $name:ident, $V:ty, $features:literal) => {
        $(#[$doc])*
        pub(crate) mod $name {
            /// The vector type of this instance.
            pub(crate) type V = $V;

            /// This instance's [`super::Passes`].
            pub(crate) struct Kernels;

            impl super::Passes for Kernels {
                #[inline(always)]
                unsafe fn max(x: *const f32, n: usize) -> f32 {
                    // SAFETY: the caller's.
                    unsafe { max_pass(x, n) }
                }
                #[inline(always)]
                unsafe fn exp_pass(
                    src: *const f32,
                    dst: *mut f32,
                    n: usize,
                    scale2: f32,
                    m2: f32,
                    sink: super::Sink,
                ) -> f32 {
                    // SAFETY: the caller's.
                    unsafe { exp_pass(src, dst, n, scale2, m2, sink) }
                }
                #[inline(always)]
                unsafe fn scale_in_place(x: *mut f32, n: usize, s: f32) {
                    // SAFETY: the caller's.
                    unsafe { scale_pass(x, n, s) }
                }
                #[inline(always)]
                unsafe fn stream_scaled(src: *const f32, dst: *mut f32, n: usize, k: f32) {
                    // SAFETY: the caller's.
                    unsafe { stream_pass(src, dst, n, k) }
                }
            }

            #[inline]
            #[target_feature(enable = $features)]
            unsafe fn max_pass(x: *const f32, n: usize) -> f32 {
                // SAFETY: the caller's.
                unsafe { super::max::<V>(x, n) }
            }

            /// [`super::exp_pass_clamped`], its two clamps two functions.
            #[inline(always)]
            unsafe fn exp_pass(
                src: *const f32,
                dst: *mut f32,
                n: usize,
                scale2: f32,
                m2: f32,
                sink: super::Sink,
            ) -> f32 {
                // SAFETY: the caller's (as `exp_pass_clamped`).
                unsafe {
                    if m2.abs() < 16_777_216.0 {
                        exp_pass_hi::<false>(src, dst, n, scale2, m2, sink)
                    } else {
                        exp_pass_hi::<true>(src, dst, n, scale2, m2, sink)
                    }
                }
            }

            #[inline]
            #[target_feature(enable = $features)]
            unsafe fn exp_pass_hi<const HI: bool>(
                src: *const f32,
                dst: *mut f32,
                n: usize,
                scale2: f32,
                m2: f32,
                sink: super::Sink,
            ) -> f32 {
                // SAFETY: the caller's.
                unsafe { super::exp_pass::<V, HI>(src, dst, n, scale2, m2, sink) }
            }

            #[inline]
            #[target_feature(enable = $features)]
            unsafe fn scale_pass(x: *mut f32, n: usize, s: f32) {
                // SAFETY: the caller's.
                unsafe { super::scale_in_place::<V>(x, n, s) }
            }

            #[inline]
            #[target_feature(enable = $features)]
            unsafe fn stream_pass(src: *const f32, dst: *mut f32, n: usize, k: f32) {
                // SAFETY: the caller's.
                unsafe { super::stream_scaled::<V>(src, dst, n, k) }
            }

            /// [`super::exp_shifted_row`].
            #[target_feature(enable = $features)]
            pub(crate) unsafe fn exp_shifted_row(row: &mut [f32], scale2: f32, m2: f32) -> f32 {
                // SAFETY: the caller's.
                unsafe { super::exp_shifted_row::<V>(row, scale2, m2) }
            }

            /// [`super::softmax_rows`].
            #[target_feature(enable = $features)]
            pub(crate) unsafe fn softmax_rows(
                src: Option<&[f32]>,
                dst: &mut [f32],
                k_len: usize,
                visible: impl Fn(usize) -> usize,
                scale: f32,
                lse: impl FnMut(usize, f32),
            ) {
                // SAFETY: the caller's.
                unsafe { super::softmax_rows::<Kernels>(src, dst, k_len, visible, scale, lse) }
            }

            /// [`super::cross_entropy_row`].
            #[target_feature(enable = $features)]
            pub(crate) unsafe fn cross_entropy_row(
                src: Option<&[f32]>,
                dst: &mut [f32],
                target: usize,
                vocab: usize,
                grad_scale: f32,
            ) -> f32 {
                // SAFETY: the caller's.
                unsafe { super::cross_entropy_row::<Kernels>(src, dst, target, vocab, grad_scale) }
            }

            /// [`super::cross_entropy_loss_row`].
            #[target_feature(enable = $features)]
            pub(crate) unsafe fn cross_entropy_loss_row(
                x: &[f32],
                target: usize,
                vocab: usize,
            ) -> f32 {
                // SAFETY: the caller's.
                unsafe { super::cross_entropy_loss_row::<Kernels>(x, target, vocab) }
            }

            /// `y = 2^x` on one vector of `x` (`LANES` elements), with or without the
            /// upper clamp ([`super::pow2_below`]), for the unit tests.
            #[cfg(test)]
            #[target_feature(enable = $features)]
            pub(crate) unsafe fn pow2_lanes(x: &[f32], y: &mut [f32], hi: bool) {
                use crate::simd::lanes::F32Mem;
                assert!(x.len() == V::LANES && y.len() == V::LANES);
                // SAFETY: the caller's; both hold one vector.
                unsafe {
                    let v = V::load(x.as_ptr());
                    let e = if hi {
                        super::pow2_below::<V, true>(v)
                    } else {
                        super::pow2_below::<V, false>(v)
                    };
                    V::store(y.as_mut_ptr(), e);
                }
            }
        }
    };
}

instance!(
    /// The row kernels on NEON (the callers check [`simd::has_neon`]).
    neon,
    std::arch::aarch64::float32x4_t,
    "neon"
);

#[cfg(test)]
mod tests {
    use super::*;
    use crate::simd::Fused;

    use super::neon as native;
    use native::{cross_entropy_loss_row, cross_entropy_row, exp_shifted_row, softmax_rows};

    /// Lanes of the instance's vector.
    const L: usize = <native::V as crate::simd::lanes::F32Mem>::LANES;

    /// Whether the level lacks the instance's instruction set (then the test skips).
    fn skipped() -> bool {
        let runs = simd::has_neon();
        if !runs {
            eprintln!("SKIPPED: ANDREA_SIMD caps the level below NEON");
        }
        !runs
    }

    fn data(n: usize, seed: u32) -> Vec<f32> {
        andrea_testkit::random::Rand::new(seed as u64).vec(n, -20.0, 20.0)
    }

    #[test]
    fn pow2_gives_the_generic_bits() {
        if skipped() {
            return;
        }
        let mut x: Vec<f32> = (0..6000).map(|i| i as f32 * 0.047 - 140.0).collect();
        x.extend([f32::NAN, f32::INFINITY, f32::NEG_INFINITY, 0.0, -0.0, 1e-30]);
        x.resize(x.len().div_ceil(L) * L, 0.5);
        for c in x.chunks_exact(L) {
            let (mut got, mut low) = ([0.0f32; L], [0.0f32; L]);
            // SAFETY: the instruction set checked above; one vector each.
            unsafe {
                native::pow2_lanes(c, &mut got, true);
                native::pow2_lanes(c, &mut low, false);
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
        // SAFETY: the callers check the instruction set; 1 <= n <= k_len.
        unsafe { softmax_rows(src, dst, k_len, |_| n, scale, |_, l| lse = l) };
        lse
    }

    /// Several rows at once give every row the bits and log-sum-exp of the generic row,
    /// in place and from a source, causal and full, around the vector boundaries (the
    /// passes of neighbouring rows interleave: a row that read or wrote its neighbour's
    /// memory, or a pass that used the wrong row's max or sum, shows here).
    #[test]
    fn softmax_rows_give_each_row_the_generic_bits() {
        if skipped() {
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
                // SAFETY: the instruction set checked above; `x` has rows * k_len elements.
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
        if skipped() {
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
                // SAFETY: the instruction set checked above.
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
