//! Attention of one query per sequence over a KV cache: the decode step's attention.
//!
//! Training attention (`attention` module) runs each (sequence, head) as matrix
//! products around a softmax, `S = q·kᵀ` and `out = P·v`, on the GEMM kernels. With one
//! query, `S` is a single row and each product is a few thousand multiply-adds, less
//! than what a GEMM call costs to set up (packing, blocking). Here, per sequence, for all
//! its heads at once:
//!
//! * `s_h[j] = q_h · k_{j,h}` for the `n = pos_offset + 1` visible positions (16-lane
//!   fused dot products, `gemv::dot`, or the column form's kernels with AVX2, AVX-512
//!   or NEON);
//! * the causal softmax of `s_h / sqrt(D)` in place, keeping each row's base-2
//!   log-sum-exp, by training attention's row function
//!   (`norm_softmax_loss::causal::causal_softmax`);
//! * `out_h = Σ_j p_h[j] · v_{j,h}`, each element added in `j` order by fused
//!   multiply-adds (with AVX2, AVX-512 or NEON, each head's output in registers while
//!   the positions stream past).
//!
//! The scores run over positions outside and heads inside: where a position's heads lie
//! side by side, the keys are read in runs of `H·D` floats rather than `D`-float pieces at
//! the cache's stride, head after head. This backend's own KV caches keep each head's
//! positions in one run instead (`AttentionOps::kv_heads_apart`): a head's keys and
//! values are then one stream each, and the L2 streamer does not bring in the other
//! heads' lines of every row.
//! The kernels take either layout ([`Strides`]).
//!
//! Every sum runs in an order fixed by the sizes, so the result does not depend on the
//! thread count. It may differ in the last bits from the fused kernel's (another
//! summation order), within the f32 rounding the KV-cache tests allow between a prefill
//! and one token at a time.
//!
//! **Threads.** A decoded token's attention is `B·H` heads of `2·n·D` multiply-adds
//! (tiny model, batch 1: 4 heads, at most 2·256·32 each), a few microseconds. Below
//! [`MIN_PARALLEL_MACS`] the sequences run on the calling thread; above it they are
//! shared out through the spinning team (`team` module), one task per sequence, or per
//! group of a sequence's heads when there are fewer sequences than threads (batch 1 on
//! 2 threads: two groups of two heads). The team's cheap handoff is what makes a
//! threshold this low pay; through rayon's fork/join batch 1 would stay on one thread.

use std::cell::Cell;

use crate::buffer::SendPtr;
use crate::norm_softmax_loss::causal::causal_softmax;
#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
use crate::simd::lanes::F32Mem;
use crate::simd::{multiversion, MulAdd};
use crate::views::{HeadsPtr, Strides};

/// Multiply-adds of a whole call (`B·H·2·n·D`) below which the heads run on the calling
/// thread (see the module docs).
pub(crate) const MIN_PARALLEL_MACS: usize = 1 << 12;

thread_local! {
    /// A task's scores, reused across calls so a decoding step allocates nothing.
    static SCORES: Cell<Vec<f32>> = const { Cell::new(Vec::new()) };
}

/// One query per (sequence, head): `out = softmax(q·kᵀ/sqrt(D)) · v` over keys
/// `0..=pos_offset` (capped at `k_len`); `lse[b·H + h]` receives the base-2 log-sum-exp
/// of the scaled scores.
///
/// # Safety
/// The heads must be inside their checked views (`B` sequences of `H` heads, `q` and
/// `out` one row, `k` and `v` at least `min(pos_offset + 1, k_len)` rows), `out`
/// disjoint from the rest, and `lse` `B·H` long.
pub(crate) unsafe fn forward(
    [q, k, v, out]: [HeadsPtr; 4],
    lse: &mut [f32],
    heads: usize,
    k_len: usize,
    pos_offset: usize,
    scale: f32,
) {
    let n = (pos_offset + 1).min(k_len);
    let d = q.head_dim();
    let batch = lse.len() / heads;
    // Tasks: each sequence's heads, in groups when there are fewer sequences than
    // threads (batch 1: the heads shared out), all of a group's heads at once: the heads
    // of a position lie side by side, so walking positions in the outer loop reads the
    // cached keys, then values, in contiguous runs of the group's `D`-float heads rather
    // than one head's `D` floats at the cache's stride, head after head.
    let threads = rayon::current_num_threads();
    let parallel = lse.len() * 2 * n * d >= MIN_PARALLEL_MACS;
    let groups = if parallel && batch < threads {
        heads.min(threads.div_ceil(batch))
    } else {
        1
    };
    let lse_ptr = SendPtr(lse.as_mut_ptr());
    let task = |t: usize| {
        let (b, g) = (t / groups, t % groups);
        let hs = (g * heads / groups, (g + 1) * heads / groups);
        let hg = hs.1 - hs.0;
        // SAFETY: sequence b, heads hs, inside the checked views: one row of q and out,
        // n rows of k and v; each task writes only its own heads of its sequence's row
        // of `out` and their entries of `lse`.
        let (qr, kr, vr, or, l) = unsafe {
            (
                q.rows(b, 1, hs),
                k.rows(b, n, hs),
                v.rows(b, n, hs),
                out.row_mut(b, hs),
                std::slice::from_raw_parts_mut(lse_ptr.get().add(b * heads + hs.0), hg),
            )
        };
        let shape = Shape {
            n,
            k_len,
            heads: hg,
            d,
        };
        let strides = (k.strides(), v.strides());
        attend([qr, kr, vr], strides, or, l, shape, pos_offset, scale);
    };
    if parallel {
        crate::team::for_each(batch * groups, &task);
    } else {
        (0..batch).for_each(task);
    }
}

/// Sizes of one sequence's heads: `n` visible positions, score rows of `k_len`, `heads`
/// heads of `d`.
#[derive(Clone, Copy)]
pub(crate) struct Shape {
    pub n: usize,
    pub k_len: usize,
    pub heads: usize,
    pub d: usize,
}

/// One query of `shape.heads` heads side by side (`q`, `out`: `heads·d` floats) over `n`
/// cached positions (`k`, `v`: position `j`'s head `h` at `ks`, `vs` [`Strides`]): the
/// scores, their causal softmax (the base-2 log-sum-exps into `lse`, one per head), the
/// weighted sum of the values into `out`.
pub(crate) fn attend(
    [q, k, v]: [&[f32]; 3],
    (ks, vs): (Strides, Strides),
    out: &mut [f32],
    lse: &mut [f32],
    shape: Shape,
    pos_offset: usize,
    scale: f32,
) {
    let mut s = SCORES.take();
    s.clear();
    s.resize(shape.heads * shape.k_len, 0.0);
    scores_any(q, k, ks, &mut s, shape);
    for (row, lh) in s.chunks_exact_mut(shape.k_len).zip(lse) {
        let lh = std::slice::from_mut(lh);
        causal_softmax(row, lh, 0, 1, shape.k_len, pos_offset, scale);
    }
    weighted_sum_any(&s, v, vs, out, shape);
    SCORES.set(s);
}

/// [`scores`]; with AVX-512, sixteen positions at a time through
/// `gemv::avx512::sixteen_dots` (sixteen independent FMA chains and one shared reduction
/// where the generic `gemv::dot` runs one short chain and one reduction per dot: at head
/// size 32, two FMAs and four levels of shuffles); with AVX2 (and not AVX-512) or NEON,
/// four at a time through `gemv::avx2::four_dots` or `gemv::neon::four_dots` (the generic
/// dot vectorises badly there, or ends each dot in scalar adds). The same bits either way.
pub(crate) fn scores_any(q: &[f32], k: &[f32], ks: Strides, s: &mut [f32], shape: Shape) {
    #[cfg(target_arch = "x86_64")]
    if crate::simd::has_avx512() {
        let Shape { n, k_len, heads, d } = shape;
        let mut j = 0;
        while j + 16 <= n {
            // Positions j..j + 16 of every head lie in `k`.
            assert!(j * ks.pos + ks.span(16, heads, d) <= k.len());
            let first = k[j * ks.pos..].as_ptr();
            for h in 0..heads {
                // SAFETY: row r < 16 of head h starts at (j + r)·ks.pos + h·ks.head and
                // has d floats inside `k` (asserted); the CPU has AVX-512 F.
                unsafe {
                    crate::decode::gemv::avx512::sixteen_dots(
                        &q[h * d..][..d],
                        |r| first.wrapping_add(r * ks.pos + h * ks.head),
                        &mut s[h * k_len + j..][..16],
                    )
                };
            }
            j += 16;
        }
        if j < n {
            // The last positions (fewer than sixteen), four at a time.
            let rest = Shape { n: n - j, ..shape };
            // SAFETY: AVX-512 F implies AVX2 and FMA here (`simd::level`).
            let four =
                |x: &[f32], w: [&[f32]; 4]| unsafe { crate::decode::gemv::avx2::four_dots(x, w) };
            scores_by_four(q, &k[j * ks.pos..], ks, &mut s[j..], rest, four);
        }
        return;
    }
    #[cfg(target_arch = "x86_64")]
    if crate::simd::has_avx2_fma() {
        // SAFETY: the CPU has AVX2 and FMA.
        let four =
            |x: &[f32], w: [&[f32]; 4]| unsafe { crate::decode::gemv::avx2::four_dots(x, w) };
        return scores_by_four(q, k, ks, s, shape, four);
    }
    #[cfg(target_arch = "aarch64")]
    if crate::simd::has_neon() {
        // SAFETY: the level has NEON.
        let four =
            |x: &[f32], w: [&[f32]; 4]| unsafe { crate::decode::gemv::neon::four_dots(x, w) };
        return scores_by_four(q, k, ks, s, shape, four);
    }
    scores(q, k, ks, s, shape)
}

/// [`scores`] four positions at a time through `four_dots` (`gemv::avx2::four_dots` or
/// `gemv::neon::four_dots`), the last ones (fewer than four) on the generic path.
#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
fn scores_by_four(
    q: &[f32],
    k: &[f32],
    ks: Strides,
    s: &mut [f32],
    shape: Shape,
    four_dots: impl Fn(&[f32], [&[f32]; 4]) -> [f32; 4],
) {
    let Shape { n, k_len, heads, d } = shape;
    let mut j = 0;
    while j + 4 <= n {
        for h in 0..heads {
            let row = |r: usize| &k[(j + r) * ks.pos + h * ks.head..][..d];
            let dots = four_dots(&q[h * d..][..d], [row(0), row(1), row(2), row(3)]);
            s[h * k_len + j..][..4].copy_from_slice(&dots);
        }
        j += 4;
    }
    if j < n {
        // The last positions (fewer than four) on the generic path.
        let rest = Shape { n: n - j, ..shape };
        scores(q, &k[j * ks.pos..], ks, &mut s[j..], rest);
    }
}

multiversion! {
    avx512;
    /// `s[h·k_len + j] = q_h · k_{j,h}` for `j < n`, position `j`'s head `h` at
    /// `k[j·ks.pos + h·ks.head..]`.
    fn scores(q: &[f32], k: &[f32], ks: Strides, s: &mut [f32], shape: Shape) {
        let Shape { n, k_len, heads, d } = shape;
        for j in 0..n {
            for h in 0..heads {
                let kjh = &k[j * ks.pos + h * ks.head..][..d];
                s[h * k_len + j] = crate::decode::gemv::dot::<M>(&q[h * d..][..d], kjh);
            }
        }
    }
}

/// [`weighted_sum`]; with AVX-512 and a head size of 16 to 128 in whole vectors, each
/// head's output held in registers while the positions stream past
/// ([`weighted_sum_avx512`]): the generic loop loads and stores the output row for every
/// position and head, and at head size 32 spends more on the loop than on its two FMAs.
/// With AVX2 (and not AVX-512) the same at head sizes of 8 to 96 ([`weighted_sum_avx2`]),
/// and with NEON ([`weighted_sum_neon`]): the same bits either way.
pub(crate) fn weighted_sum_any(p: &[f32], v: &[f32], vs: Strides, out: &mut [f32], shape: Shape) {
    #[cfg(target_arch = "x86_64")]
    if crate::simd::has_avx512() && shape.d.is_multiple_of(16) {
        // SAFETY (every arm): the CPU has AVX-512 F; the head size is NV vectors.
        unsafe {
            match shape.d / 16 {
                1 => return weighted_sum_avx512::<1>(p, v, vs, out, shape),
                2 => return weighted_sum_avx512::<2>(p, v, vs, out, shape),
                3 => return weighted_sum_avx512::<3>(p, v, vs, out, shape),
                4 => return weighted_sum_avx512::<4>(p, v, vs, out, shape),
                5 => return weighted_sum_avx512::<5>(p, v, vs, out, shape),
                6 => return weighted_sum_avx512::<6>(p, v, vs, out, shape),
                7 => return weighted_sum_avx512::<7>(p, v, vs, out, shape),
                8 => return weighted_sum_avx512::<8>(p, v, vs, out, shape),
                _ => {}
            }
        }
    }
    #[cfg(target_arch = "x86_64")]
    if crate::simd::has_avx2_fma() && shape.d.is_multiple_of(8) {
        // SAFETY (every arm): the CPU has AVX2 and FMA; the head size is NV vectors.
        unsafe {
            match shape.d / 8 {
                1 => return weighted_sum_avx2::<1>(p, v, vs, out, shape),
                2 => return weighted_sum_avx2::<2>(p, v, vs, out, shape),
                4 => return weighted_sum_avx2::<4>(p, v, vs, out, shape),
                6 => return weighted_sum_avx2::<6>(p, v, vs, out, shape),
                8 => return weighted_sum_avx2::<8>(p, v, vs, out, shape),
                12 => return weighted_sum_avx2::<12>(p, v, vs, out, shape),
                _ => {}
            }
        }
    }
    #[cfg(target_arch = "aarch64")]
    if crate::simd::has_neon() && shape.d.is_multiple_of(4) {
        // SAFETY (every arm): the level has NEON; the head size is NV vectors.
        unsafe {
            match shape.d / 4 {
                2 => return weighted_sum_neon::<2>(p, v, vs, out, shape),
                4 => return weighted_sum_neon::<4>(p, v, vs, out, shape),
                8 => return weighted_sum_neon::<8>(p, v, vs, out, shape),
                12 => return weighted_sum_neon::<12>(p, v, vs, out, shape),
                16 => return weighted_sum_neon::<16>(p, v, vs, out, shape),
                24 => return weighted_sum_neon::<24>(p, v, vs, out, shape),
                _ => {}
            }
        }
    }
    weighted_sum(p, v, vs, out, shape)
}

/// [`weighted_sum_avx512`] over the width ([`F32Mem`]): per head, `out_h` in `NV`
/// registers of `LANES`, the same fused multiply-adds in `j` order (the generic loop's
/// bits). Instantiated for AVX2 ([`weighted_sum_avx2`]) and NEON ([`weighted_sum_neon`]).
///
/// # Safety
/// The CPU has `V`'s instruction set, and `shape.d == NV·LANES`. (Bounds are asserted.)
#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
#[inline(always)]
unsafe fn weighted_sum_lanes<V: F32Mem, const NV: usize>(
    p: &[f32],
    v: &[f32],
    vs: Strides,
    out: &mut [f32],
    shape: Shape,
) {
    let (l, Shape { n, k_len, heads, d }) = (V::LANES, shape);
    assert!(d == NV * l && out.len() >= heads * d);
    assert!(n == 0 || (p.len() >= (heads - 1) * k_len + n && v.len() >= vs.span(n, heads, d)));
    // SAFETY (whole body): the instruction set is the caller's; position j's head h is d
    // floats at j·vs.pos + h·vs.head inside `v`, head h's d floats of `out` (asserted),
    // and u·LANES + LANES <= d.
    unsafe {
        for h in 0..heads {
            let mut acc = [V::splat(0.0); NV];
            for (j, &pj) in p[h * k_len..][..n].iter().enumerate() {
                let pv = V::splat(pj);
                let row = v.as_ptr().add(j * vs.pos + h * vs.head);
                for (u, a) in acc.iter_mut().enumerate() {
                    *a = V::fmadd(pv, V::load(row.add(u * l)), *a);
                }
            }
            for (u, a) in acc.iter().enumerate() {
                V::store(out.as_mut_ptr().add(h * d + u * l), *a);
            }
        }
    }
}

/// [`weighted_sum_lanes`] on AVX2 (head sizes 8, 16, 32, 48, 64, 96: at most 12 of the
/// 16 `ymm` beside the broadcast and the load).
///
/// # Safety
/// The CPU must have AVX2 and FMA, and `shape.d == NV·8`. (Bounds are asserted.)
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn weighted_sum_avx2<const NV: usize>(
    p: &[f32],
    v: &[f32],
    vs: Strides,
    out: &mut [f32],
    shape: Shape,
) {
    // SAFETY: the caller's.
    unsafe { weighted_sum_lanes::<std::arch::x86_64::__m256, NV>(p, v, vs, out, shape) }
}

/// [`weighted_sum_lanes`] on NEON (head sizes 8 to 96 in the steps of AVX2's: at most
/// 24 of the 32 vector registers beside the broadcast and the load).
///
/// # Safety
/// `shape.d == NV·4`. (Bounds are asserted.)
#[cfg(target_arch = "aarch64")]
#[target_feature(enable = "neon")]
unsafe fn weighted_sum_neon<const NV: usize>(
    p: &[f32],
    v: &[f32],
    vs: Strides,
    out: &mut [f32],
    shape: Shape,
) {
    // SAFETY: the caller's; NEON is baseline aarch64.
    unsafe { weighted_sum_lanes::<std::arch::aarch64::float32x4_t, NV>(p, v, vs, out, shape) }
}

/// [`weighted_sum`] for a head size of `NV` vectors of 16: per head, `out_h` in `NV`
/// registers, one broadcast of `p[h·k_len + j]` and `NV` fused multiply-adds per
/// position, in `j` order from zero (the generic loop's operations on each element).
///
/// # Safety
/// The CPU must have AVX-512 F and `shape.d == NV·16`. (Bounds are asserted.)
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx2,fma")]
unsafe fn weighted_sum_avx512<const NV: usize>(
    p: &[f32],
    v: &[f32],
    vs: Strides,
    out: &mut [f32],
    shape: Shape,
) {
    use std::arch::x86_64::*;
    let Shape { n, k_len, heads, d } = shape;
    assert!(d == NV * 16 && out.len() >= heads * d);
    assert!(n == 0 || (p.len() >= (heads - 1) * k_len + n && v.len() >= vs.span(n, heads, d)));
    for h in 0..heads {
        let mut acc = [_mm512_setzero_ps(); NV];
        for (j, &pj) in p[h * k_len..][..n].iter().enumerate() {
            let pv = _mm512_set1_ps(pj);
            // SAFETY: position j's head h, d floats at j·vs.pos + h·vs.head, inside `v`
            // (asserted).
            let row = unsafe { v.as_ptr().add(j * vs.pos + h * vs.head) };
            for (u, a) in acc.iter_mut().enumerate() {
                // SAFETY: u·16 + 16 <= d floats of that row.
                *a = _mm512_fmadd_ps(pv, unsafe { _mm512_loadu_ps(row.add(u * 16)) }, *a);
            }
        }
        for (u, a) in acc.iter().enumerate() {
            // SAFETY: head h's d floats of `out` (asserted).
            unsafe { _mm512_storeu_ps(out.as_mut_ptr().add(h * d + u * 16), *a) };
        }
    }
}

multiversion! {
    avx512;
    /// `out_h = Σ_j p[h·k_len + j] · v_{j,h}`, each element added in `j` order, position
    /// `j`'s head `h` at `v[j·vs.pos + h·vs.head..]`.
    fn weighted_sum(p: &[f32], v: &[f32], vs: Strides, out: &mut [f32], shape: Shape) {
        let Shape { n, k_len, heads, d } = shape;
        out.fill(0.0);
        for j in 0..n {
            for h in 0..heads {
                let pj = p[h * k_len + j];
                let vjh = &v[j * vs.pos + h * vs.head..][..d];
                for (o, &x) in out[h * d..][..d].iter_mut().zip(vjh) {
                    *o = M::mul_add(pj, x, *o);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use andrea_core::prelude::*;
    use andrea_core::{AttentionShape, Heads, View};

    use crate::CpuBackend;

    /// The scores of the kernels this CPU runs (sixteen positions at a time with
    /// AVX-512, four with AVX2) give the generic dot's bits: whole groups and a ragged
    /// rest, head sizes with and without a tail past the 16-lane dots, the score rows
    /// longer than the visible positions; a cache with each position's heads side by
    /// side and one with each head's positions in a run.
    #[test]
    fn scores_give_the_bits_of_the_generic_dot() {
        use super::{scores, scores_any, Shape};
        let mut r = andrea_testkit::random::Rand::new(3);
        for (n, heads, d) in [(37, 3, 20), (32, 4, 32), (5, 2, 64), (16, 1, 16)] {
            for ks in layouts(n, heads, d) {
                let k_len = n + 3;
                let q = r.vec(heads * d, -1.0, 1.0);
                let k = r.vec(ks.span(n, heads, d), -1.0, 1.0);
                let shape = Shape { n, k_len, heads, d };
                let zeros = || vec![0.0f32; heads * k_len];
                let (mut want, mut got) = (zeros(), zeros());
                scores(&q, &k, ks, &mut want, shape);
                scores_any(&q, &k, ks, &mut got, shape);
                let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                assert_eq!(
                    bits(&got),
                    bits(&want),
                    "n {n}, {heads} heads of {d}, {ks:?}"
                );
            }
        }
    }

    /// A cache of `n` positions of `heads` heads of `d`, with 8 floats of padding: each
    /// position's heads side by side, and each head's positions in a run.
    fn layouts(n: usize, heads: usize, d: usize) -> [super::Strides; 2] {
        [
            super::Strides {
                pos: heads * d + 8,
                head: d,
            },
            super::Strides {
                pos: d,
                head: n * d + 8,
            },
        ]
    }

    /// The weighted sum of the kernels this CPU runs (the output in registers with
    /// AVX-512, AVX2 or NEON) gives the generic loop's bits, at head sizes of one to eight vectors, a
    /// size the fast path does not take, and zero positions.
    #[test]
    fn weighted_sum_gives_the_bits_of_the_generic_loop() {
        use super::{weighted_sum, weighted_sum_any, Shape};
        let mut r = andrea_testkit::random::Rand::new(5);
        for (n, heads, d) in [
            (37, 3, 32),
            (1, 2, 16),
            (20, 1, 128),
            (9, 4, 48),
            (5, 2, 20),
            (0, 2, 32),
            (7, 2, 64),
            (3, 1, 96),
            (4, 3, 8),
        ] {
            for vs in layouts(n, heads, d) {
                let k_len = n + 3;
                let p = r.vec(heads * k_len, 0.0, 1.0);
                let v = r.vec(vs.span(n.max(1), heads, d), -1.0, 1.0);
                let shape = Shape { n, k_len, heads, d };
                let nans = || vec![f32::NAN; heads * d];
                let (mut want, mut got) = (nans(), nans());
                weighted_sum(&p, &v, vs, &mut want, shape);
                weighted_sum_any(&p, &v, vs, &mut got, shape);
                let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                assert_eq!(
                    bits(&got),
                    bits(&want),
                    "n {n}, {heads} heads of {d}, {vs:?}"
                );
                // The AVX2 kernel too, where the dispatch above took AVX-512.
                #[cfg(target_arch = "x86_64")]
                if crate::simd::has_avx2_fma() && [8, 16, 32, 48].contains(&d) {
                    let mut avx2 = nans();
                    // SAFETY: the CPU has AVX2 and FMA; d is NV vectors of 8.
                    unsafe {
                        match d / 8 {
                            1 => super::weighted_sum_avx2::<1>(&p, &v, vs, &mut avx2, shape),
                            2 => super::weighted_sum_avx2::<2>(&p, &v, vs, &mut avx2, shape),
                            4 => super::weighted_sum_avx2::<4>(&p, &v, vs, &mut avx2, shape),
                            _ => super::weighted_sum_avx2::<6>(&p, &v, vs, &mut avx2, shape),
                        }
                    }
                    assert_eq!(
                        bits(&avx2),
                        bits(&want),
                        "avx2: n {n}, {heads} heads of {d}"
                    );
                }
            }
        }
    }

    /// One query per head over caches of several lengths, against an f64 softmax
    /// attention: the output and the base-2 log-sum-exp; a head size with a tail past
    /// the 16-lane dot products; and the same bits on 1 and 2 threads on both sides of
    /// the parallel threshold, for two sequences (one task each) and for one (its three
    /// heads in two groups of one and two on 2 threads).
    #[test]
    fn matches_an_f64_reference_on_any_thread_count() {
        for b in [2, 1] {
            matches_an_f64_reference_for(b);
        }
    }

    fn matches_an_f64_reference_for(b: usize) {
        let (h, d, t_max) = (3, 20, 300);
        let c = h * d;
        let mut r = andrea_testkit::random::Rand::new(11);
        let (q, k, v) = (
            r.vec(b * c, -1.0, 1.0),
            r.vec(b * t_max * c, -1.0, 1.0),
            r.vec(b * t_max * c, -1.0, 1.0),
        );
        let mut bits = Vec::new();
        for threads in [1, 2] {
            let be = CpuBackend::with_threads(threads).unwrap();
            let up = |x: &[f32]| {
                let buf = be.alloc(x.len()).unwrap();
                be.upload(x, View::whole(&buf)).unwrap();
                buf
            };
            let (qb, kb, vb, ob) = (up(&q), up(&k), up(&v), be.alloc(b * c).unwrap());
            let heads = |buf, t| Heads::from_tensor(View::new(buf, 0, [b, t, c]), h).unwrap();
            let mut run_bits = Vec::new();
            // Parallel from pos 17 (two sequences) or 34 (one): B·3·2·(pos + 1)·20
            // multiply-adds reach MIN_PARALLEL_MACS.
            for pos in [0, 1, 3, 16, 37, 299] {
                let tk = pos + 1;
                let shape = AttentionShape {
                    batch: b,
                    heads: h,
                    head_dim: d,
                    q_len: 1,
                    k_len: tk,
                };
                let ws = be.alloc(be.attention_workspace_len(shape)).unwrap();
                be.attention_forward(
                    heads(&qb, 1),
                    heads(&kb, t_max).prefix(tk),
                    heads(&vb, t_max).prefix(tk),
                    heads(&ob, 1),
                    View::whole(&ws),
                    pos,
                )
                .unwrap();
                let (mut out, mut lse) = (vec![0.0; b * c], vec![0.0; b * h]);
                be.download(View::whole(&ob), &mut out).unwrap();
                be.download(View::whole(&ws), &mut lse).unwrap();
                for bi in 0..b {
                    for hi in 0..h {
                        let qi = &q[bi * c + hi * d..][..d];
                        let row =
                            |x: &[f32], j: usize| x[(bi * t_max + j) * c + hi * d..][..d].to_vec();
                        let s: Vec<f64> = (0..tk)
                            .map(|j| {
                                let kj = row(&k, j);
                                (0..d).map(|e| qi[e] as f64 * kj[e] as f64).sum::<f64>()
                                    / (d as f64).sqrt()
                            })
                            .collect();
                        let max = s.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                        let sum: f64 = s.iter().map(|x| (x - max).exp()).sum();
                        let want_lse = (max + sum.ln()) / std::f64::consts::LN_2;
                        let got_lse = lse[bi * h + hi] as f64;
                        assert!(
                            (got_lse - want_lse).abs() < 1e-5,
                            "pos {pos}: lse {got_lse}, want {want_lse}"
                        );
                        for e in 0..d {
                            let want: f64 = (0..tk)
                                .map(|j| (s[j] - max).exp() / sum * row(&v, j)[e] as f64)
                                .sum();
                            let got = out[bi * c + hi * d + e] as f64;
                            assert!(
                                (got - want).abs() < 1e-5,
                                "pos {pos} ({bi}, {hi}, {e}): {got}, want {want}"
                            );
                        }
                    }
                }
                run_bits.extend(out.iter().chain(&lse).map(|x| x.to_bits()));
            }
            bits.push(run_bits);
        }
        assert_eq!(bits[0], bits[1], "batch {b}: 1 and 2 threads differ");
    }
}
