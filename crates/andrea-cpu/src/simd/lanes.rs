//! One vector of f32 lanes, over the instruction sets andrea's intrinsics kernels use:
//! [`F32s`] is implemented for `__m256` (AVX2 + FMA, 8 lanes) and `__m512` (AVX-512,
//! 16 lanes) on x86-64 and for `float32x4_t` (NEON, 4 lanes) on aarch64, so a kernel
//! whose copies compute the same bits is written once, generic over the width, and
//! instantiated inside a function compiled for that instruction set
//! (`#[target_feature]` on x86-64; NEON is baseline aarch64).
//!
//! The methods are the operations the kernels need, each one instruction (or, for
//! [`F32s::pow2_split`] and [`F32s::scale_pow2`], the one way each instruction set builds
//! `2^k` fastest; both give [`crate::simd::pow2`]'s bits). They are `unsafe` because they
//! run instructions the CPU must have: call them only from code compiled for `Self`'s
//! features, where they inline to one instruction each.

#[cfg(target_arch = "aarch64")]
use std::arch::aarch64::*;
#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

use crate::simd::pow2_consts as q;

/// A vector of f32 lanes (see the module docs).
///
/// # Safety
/// Every method requires the CPU features of its implementation (AVX2 + FMA for
/// `__m256`, AVX-512 F for `__m512`, NEON for `float32x4_t`: always there).
pub(crate) trait F32s: Copy {
    unsafe fn splat(x: f32) -> Self;
    unsafe fn add(a: Self, b: Self) -> Self;
    unsafe fn sub(a: Self, b: Self) -> Self;
    unsafe fn mul(a: Self, b: Self) -> Self;
    unsafe fn div(a: Self, b: Self) -> Self;
    /// `a·b + c` in one rounding.
    unsafe fn fmadd(a: Self, b: Self, c: Self) -> Self;
    /// `max(a, b)`; where either is NaN, `b` (`maxps`) or NaN (NEON's `fmax`), NaN
    /// either way where `b` is.
    unsafe fn max(a: Self, b: Self) -> Self;
    /// `min(a, b)`; NaN as [`F32s::max`].
    unsafe fn min(a: Self, b: Self) -> Self;
    /// For `z` in `[LO, HI]`: `(f, k)` with `f = z - round(z)` exact and `k` whatever
    /// [`F32s::scale_pow2`] needs to multiply by `2^round(z)`.
    unsafe fn pow2_split(z: Self) -> (Self, Self);
    /// `p·2^round(z)` from the `k` of [`F32s::pow2_split`]: one correctly rounded
    /// product, the same whichever way it is built.
    unsafe fn scale_pow2(p: Self, k: Self) -> Self;
}

#[cfg(target_arch = "x86_64")]
impl F32s for __m256 {
    #[inline(always)]
    unsafe fn splat(x: f32) -> Self {
        unsafe { _mm256_set1_ps(x) }
    }
    #[inline(always)]
    unsafe fn add(a: Self, b: Self) -> Self {
        unsafe { _mm256_add_ps(a, b) }
    }
    #[inline(always)]
    unsafe fn sub(a: Self, b: Self) -> Self {
        unsafe { _mm256_sub_ps(a, b) }
    }
    #[inline(always)]
    unsafe fn mul(a: Self, b: Self) -> Self {
        unsafe { _mm256_mul_ps(a, b) }
    }
    #[inline(always)]
    unsafe fn div(a: Self, b: Self) -> Self {
        unsafe { _mm256_div_ps(a, b) }
    }
    #[inline(always)]
    unsafe fn fmadd(a: Self, b: Self, c: Self) -> Self {
        unsafe { _mm256_fmadd_ps(a, b, c) }
    }
    #[inline(always)]
    unsafe fn max(a: Self, b: Self) -> Self {
        unsafe { _mm256_max_ps(a, b) }
    }
    #[inline(always)]
    unsafe fn min(a: Self, b: Self) -> Self {
        unsafe { _mm256_min_ps(a, b) }
    }
    /// `t = z + MAGIC` rounds `z` to an integer held in `t`'s low mantissa bits
    /// ([`crate::simd::pow2`]); `k` is `t`.
    #[inline(always)]
    unsafe fn pow2_split(z: Self) -> (Self, Self) {
        unsafe {
            let magic = _mm256_set1_ps(q::MAGIC);
            let t = _mm256_add_ps(z, magic);
            (_mm256_sub_ps(z, _mm256_sub_ps(t, magic)), t)
        }
    }
    /// `2^round(z)` built in the exponent bits: `bits(t) - bits(MAGIC) + 127`, shifted.
    #[inline(always)]
    unsafe fn scale_pow2(p: Self, t: Self) -> Self {
        unsafe {
            let k = _mm256_sub_epi32(
                _mm256_castps_si256(t),
                _mm256_set1_epi32(q::MAGIC.to_bits() as i32),
            );
            let two_k = _mm256_slli_epi32::<23>(_mm256_add_epi32(k, _mm256_set1_epi32(127)));
            _mm256_mul_ps(p, _mm256_castsi256_ps(two_k))
        }
    }
}

#[cfg(target_arch = "x86_64")]
impl F32s for __m512 {
    #[inline(always)]
    unsafe fn splat(x: f32) -> Self {
        unsafe { _mm512_set1_ps(x) }
    }
    #[inline(always)]
    unsafe fn add(a: Self, b: Self) -> Self {
        unsafe { _mm512_add_ps(a, b) }
    }
    #[inline(always)]
    unsafe fn sub(a: Self, b: Self) -> Self {
        unsafe { _mm512_sub_ps(a, b) }
    }
    #[inline(always)]
    unsafe fn mul(a: Self, b: Self) -> Self {
        unsafe { _mm512_mul_ps(a, b) }
    }
    #[inline(always)]
    unsafe fn div(a: Self, b: Self) -> Self {
        unsafe { _mm512_div_ps(a, b) }
    }
    #[inline(always)]
    unsafe fn fmadd(a: Self, b: Self, c: Self) -> Self {
        unsafe { _mm512_fmadd_ps(a, b, c) }
    }
    #[inline(always)]
    unsafe fn max(a: Self, b: Self) -> Self {
        unsafe { _mm512_max_ps(a, b) }
    }
    #[inline(always)]
    unsafe fn min(a: Self, b: Self) -> Self {
        unsafe { _mm512_min_ps(a, b) }
    }
    /// `k = round(z)`, ties to even, by `vrndscaleps`: what adding and subtracting
    /// `MAGIC` gives on the clamped range, in one instruction instead of two. It may give
    /// `-0.0` where the trick gives `+0.0`; `z - k` and `2^k` are the same.
    #[inline(always)]
    unsafe fn pow2_split(z: Self) -> (Self, Self) {
        unsafe {
            let k = _mm512_roundscale_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(z);
            (_mm512_sub_ps(z, k), k)
        }
    }
    /// `p·2^k` by `vscalefps`, one instruction for the three integer ones of `__m256`.
    #[inline(always)]
    unsafe fn scale_pow2(p: Self, k: Self) -> Self {
        unsafe { _mm512_scalef_ps(p, k) }
    }
}

// NEON and its FMA are baseline aarch64: every CPU that runs this code has them.
#[cfg(target_arch = "aarch64")]
impl F32s for float32x4_t {
    #[inline(always)]
    unsafe fn splat(x: f32) -> Self {
        unsafe { vdupq_n_f32(x) }
    }
    #[inline(always)]
    unsafe fn add(a: Self, b: Self) -> Self {
        unsafe { vaddq_f32(a, b) }
    }
    #[inline(always)]
    unsafe fn sub(a: Self, b: Self) -> Self {
        unsafe { vsubq_f32(a, b) }
    }
    #[inline(always)]
    unsafe fn mul(a: Self, b: Self) -> Self {
        unsafe { vmulq_f32(a, b) }
    }
    #[inline(always)]
    unsafe fn div(a: Self, b: Self) -> Self {
        unsafe { vdivq_f32(a, b) }
    }
    #[inline(always)]
    unsafe fn fmadd(a: Self, b: Self, c: Self) -> Self {
        unsafe { vfmaq_f32(c, a, b) }
    }
    #[inline(always)]
    unsafe fn max(a: Self, b: Self) -> Self {
        unsafe { vmaxq_f32(a, b) }
    }
    #[inline(always)]
    unsafe fn min(a: Self, b: Self) -> Self {
        unsafe { vminq_f32(a, b) }
    }
    /// As `__m256`'s: `k` is `t = z + MAGIC`.
    #[inline(always)]
    unsafe fn pow2_split(z: Self) -> (Self, Self) {
        unsafe {
            let magic = vdupq_n_f32(q::MAGIC);
            let t = vaddq_f32(z, magic);
            (vsubq_f32(z, vsubq_f32(t, magic)), t)
        }
    }
    /// As `__m256`'s: `2^round(z)` built in the exponent bits.
    #[inline(always)]
    unsafe fn scale_pow2(p: Self, t: Self) -> Self {
        unsafe {
            let k = vsubq_s32(
                vreinterpretq_s32_f32(t),
                vdupq_n_s32(q::MAGIC.to_bits() as i32),
            );
            let two_k = vshlq_n_s32::<23>(vaddq_s32(k, vdupq_n_s32(127)));
            vmulq_f32(p, vreinterpretq_f32_s32(two_k))
        }
    }
}

/// Whole-vector loads and stores, for the kernels written once for AVX2 and NEON (the
/// decode attention's weighted sum, the row form's register blocks).
///
/// # Safety
/// As [`F32s`]; the pointers are valid for the lanes each method reads or writes.
pub(crate) trait F32Mem: F32s {
    /// Lanes per vector.
    const LANES: usize;
    unsafe fn load(p: *const f32) -> Self;
    unsafe fn store(p: *mut f32, v: Self);
}

#[cfg(target_arch = "x86_64")]
impl F32Mem for __m256 {
    const LANES: usize = 8;
    #[inline(always)]
    unsafe fn load(p: *const f32) -> Self {
        unsafe { _mm256_loadu_ps(p) }
    }
    #[inline(always)]
    unsafe fn store(p: *mut f32, v: Self) {
        unsafe { _mm256_storeu_ps(p, v) }
    }
}

#[cfg(target_arch = "aarch64")]
impl F32Mem for float32x4_t {
    const LANES: usize = 4;
    #[inline(always)]
    unsafe fn load(p: *const f32) -> Self {
        unsafe { vld1q_f32(p) }
    }
    #[inline(always)]
    unsafe fn store(p: *mut f32, v: Self) {
        unsafe { vst1q_f32(p, v) }
    }
}

/// What the softmax and loss rows over the width (`norm_softmax_loss::softmax_lanes`)
/// need besides whole vectors: a row's last few lanes, non-temporal stores and the
/// reductions of one vector.
///
/// # Safety
/// As [`F32s`]; the pointers are valid for the lanes each method reads or writes.
#[cfg(target_arch = "aarch64")]
pub(crate) trait F32Rows: F32Mem {
    /// `BLOCK / LANES` vectors: one block of [`crate::simd::BLOCK`] lanes.
    type Block: Copy + AsRef<[Self]> + AsMut<[Self]>;
    /// Which lanes a masked access touches: the first `n` ([`F32Rows::first`]).
    type Mask: Copy;
    unsafe fn block(v: Self) -> Self::Block;
    /// A store that may bypass the caches (non-temporal where the instruction set has
    /// one); `p` is aligned to the vector's size. [`F32Rows::stream_fence`] orders it.
    unsafe fn stream(p: *mut f32, v: Self);
    unsafe fn stream_fence();
    /// The first `n` lanes (all when `n >= LANES`).
    unsafe fn first(n: usize) -> Self::Mask;
    /// The lanes of `m` from `p` (only they are read), 0 in the others.
    unsafe fn load_masked(p: *const f32, m: Self::Mask) -> Self;
    /// The lanes of `m` to `p` (only they are written).
    unsafe fn store_masked(p: *mut f32, m: Self::Mask, v: Self);
    /// `v` in the lanes of `m`, `other` in the rest.
    unsafe fn select(m: Self::Mask, v: Self, other: Self) -> Self;
    /// `v` in the lanes of `m`, `+0.0` in the rest.
    unsafe fn keep(m: Self::Mask, v: Self) -> Self;
    /// The lanes' sum as a tree, halves lane by lane (`v[i] + v[i + LANES/2]`, ...,
    /// `v[0] + v[1]`), the last levels of [`crate::simd::sum_lanes`]'s tree.
    unsafe fn reduce_add(v: Self) -> f32;
    /// The largest lane (exact: any order).
    unsafe fn reduce_max(v: Self) -> f32;
}

/// NEON has no masked loads and stores: a mask is the lane count, and a partial vector
/// goes through a zero-filled array.
#[cfg(target_arch = "aarch64")]
impl F32Rows for float32x4_t {
    type Block = [float32x4_t; 8];
    /// The lane count and the lanes below it as all-ones.
    type Mask = (usize, uint32x4_t);
    #[inline(always)]
    unsafe fn block(v: Self) -> Self::Block {
        [v; 8]
    }
    /// A plain store: NEON's non-temporal store (`stnp`) has no intrinsic.
    #[inline(always)]
    unsafe fn stream(p: *mut f32, v: Self) {
        unsafe { vst1q_f32(p, v) }
    }
    #[inline(always)]
    unsafe fn stream_fence() {}
    #[inline(always)]
    unsafe fn first(n: usize) -> Self::Mask {
        let n = n.min(4);
        const IOTA: [u32; 4] = [0, 1, 2, 3];
        unsafe {
            (
                n,
                vcltq_u32(vld1q_u32(IOTA.as_ptr()), vdupq_n_u32(n as u32)),
            )
        }
    }
    #[inline(always)]
    unsafe fn load_masked(p: *const f32, m: Self::Mask) -> Self {
        let mut a = [0.0f32; 4];
        unsafe {
            std::ptr::copy_nonoverlapping(p, a.as_mut_ptr(), m.0);
            vld1q_f32(a.as_ptr())
        }
    }
    #[inline(always)]
    unsafe fn store_masked(p: *mut f32, m: Self::Mask, v: Self) {
        let mut a = [0.0f32; 4];
        unsafe {
            vst1q_f32(a.as_mut_ptr(), v);
            std::ptr::copy_nonoverlapping(a.as_ptr(), p, m.0);
        }
    }
    #[inline(always)]
    unsafe fn select(m: Self::Mask, v: Self, other: Self) -> Self {
        unsafe { vbslq_f32(m.1, v, other) }
    }
    #[inline(always)]
    unsafe fn keep(m: Self::Mask, v: Self) -> Self {
        unsafe { vreinterpretq_f32_u32(vandq_u32(vreinterpretq_u32_f32(v), m.1)) }
    }
    #[inline(always)]
    unsafe fn reduce_add(v: Self) -> f32 {
        unsafe {
            let s2 = vadd_f32(vget_low_f32(v), vget_high_f32(v));
            vget_lane_f32::<0>(s2) + vget_lane_f32::<1>(s2)
        }
    }
    #[inline(always)]
    unsafe fn reduce_max(v: Self) -> f32 {
        unsafe { vmaxvq_f32(v) }
    }
}

/// Mask of the first `n` lanes (all when `n >= 16`), for AVX-512's masked loads and
/// stores.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub(crate) fn first16(n: usize) -> __mmask16 {
    if n >= 16 {
        0xFFFF
    } else {
        ((1u32 << n) - 1) as __mmask16
    }
}

/// `2^z` on a vector: [`crate::simd::pow2`] with `Fused`, step for step; without the upper
/// clamp when `!HI`, for arguments known to be at most 126 (softmax's `x - max`).
///
/// # Safety
/// The CPU has `V`'s features.
#[inline(always)]
pub(crate) unsafe fn pow2<V: F32s, const HI: bool>(z: V) -> V {
    unsafe {
        // `max(LO, z)` returns `z` when it is NaN, as `f32::clamp` does.
        let z = V::max(V::splat(q::LO), z);
        let z = if HI { V::min(V::splat(q::HI), z) } else { z };
        let (f, k) = V::pow2_split(z);
        // Horner, as `simd::poly2f`.
        let h = |acc, c: f32| V::fmadd(acc, f, V::splat(c));
        let p = h(
            h(
                h(h(h(h(V::splat(q::Q6), q::Q5), q::Q4), q::Q3), q::Q2),
                q::Q1,
            ),
            1.0,
        );
        V::scale_pow2(p, k)
    }
}

/// Transposes the 8 x 8 block of `r` (row `i` in `r[i]`) in registers.
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx2")]
pub(crate) fn transpose8(r: [__m256; 8]) -> [__m256; 8] {
    let t0 = _mm256_unpacklo_ps(r[0], r[1]);
    let t1 = _mm256_unpackhi_ps(r[0], r[1]);
    let t2 = _mm256_unpacklo_ps(r[2], r[3]);
    let t3 = _mm256_unpackhi_ps(r[2], r[3]);
    let t4 = _mm256_unpacklo_ps(r[4], r[5]);
    let t5 = _mm256_unpackhi_ps(r[4], r[5]);
    let t6 = _mm256_unpacklo_ps(r[6], r[7]);
    let t7 = _mm256_unpackhi_ps(r[6], r[7]);
    let s0 = _mm256_shuffle_ps::<0x44>(t0, t2);
    let s1 = _mm256_shuffle_ps::<0xEE>(t0, t2);
    let s2 = _mm256_shuffle_ps::<0x44>(t1, t3);
    let s3 = _mm256_shuffle_ps::<0xEE>(t1, t3);
    let s4 = _mm256_shuffle_ps::<0x44>(t4, t6);
    let s5 = _mm256_shuffle_ps::<0xEE>(t4, t6);
    let s6 = _mm256_shuffle_ps::<0x44>(t5, t7);
    let s7 = _mm256_shuffle_ps::<0xEE>(t5, t7);
    [
        _mm256_permute2f128_ps::<0x20>(s0, s4),
        _mm256_permute2f128_ps::<0x20>(s1, s5),
        _mm256_permute2f128_ps::<0x20>(s2, s6),
        _mm256_permute2f128_ps::<0x20>(s3, s7),
        _mm256_permute2f128_ps::<0x31>(s0, s4),
        _mm256_permute2f128_ps::<0x31>(s1, s5),
        _mm256_permute2f128_ps::<0x31>(s2, s6),
        _mm256_permute2f128_ps::<0x31>(s3, s7),
    ]
}
