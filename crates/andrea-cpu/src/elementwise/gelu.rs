//! GELU and its derivative on vectors of lanes, written once over the width
//! ([`F32s`]): the AVX2 GEMM's epilogue applies them to tiles of `C` in registers, and
//! the AVX-512 and NEON levels' `gelu` and `gelu_backward` ops run them over slices
//! (masked tails on AVX-512, a zero-padded vector on NEON). Each is [`simd::gelu`] /
//! [`simd::gelu_grad`] with `Fused`, step for step, so every copy gives the bits of the
//! `multiversion!` copies (the unit tests compare them).

#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

#[cfg(target_arch = "x86_64")]
use crate::simd::lanes::first16;
use crate::simd::lanes::{pow2, F32s};
use crate::simd::{self};

#[cfg(target_arch = "aarch64")]
pub(crate) use neon::{gelu_grad_slice, gelu_slice};

/// `GELU(x)` on a vector: `x / (1 + 2^(x·(K1 + K3·x²)))`.
///
/// # Safety
/// The CPU has `V`'s features.
#[inline(always)]
pub(crate) unsafe fn gelu<V: F32s>(x: V) -> V {
    unsafe {
        let u = V::fmadd(
            V::splat(simd::GELU_K3),
            V::mul(x, x),
            V::splat(simd::GELU_K1),
        );
        let e = pow2::<V, true>(V::mul(x, u));
        V::div(x, V::add(V::splat(1.0), e))
    }
}

/// `dy·GELU'(x)` on a vector (see [`simd::gelu_grad`]).
///
/// # Safety
/// The CPU has `V`'s features.
#[inline(always)]
pub(crate) unsafe fn gelu_grad<V: F32s>(x: V, dy: V) -> V {
    unsafe {
        let one = V::splat(1.0);
        let x2 = V::mul(x, x);
        let u = V::fmadd(V::splat(simd::GELU_K3), x2, V::splat(simd::GELU_K1));
        let e = pow2::<V, true>(V::mul(x, u));
        let s = V::div(one, V::add(one, e));
        let du = V::fmadd(V::splat(simd::GELU_D3), x2, V::splat(simd::GELU_C));
        let w = V::mul(V::mul(V::mul(x, V::splat(2.0)), s), V::sub(one, s));
        V::mul(dy, V::fmadd(w, du, s))
    }
}

/// Lanes of one AVX-512 vector.
#[cfg(target_arch = "x86_64")]
const L: usize = 16;

/// Applies `f` (AVX-512 instructions) to `x` (and `d`, when given, else `y` itself) in vectors, 4 per pass, the
/// last one masked: `y[i] = f(x[i], d[i])`.
///
/// # Safety
/// `x`, `d` (if not null) and `y` are valid for `n` elements; `d` may equal `y`.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn map2(
    x: *const f32,
    d: *const f32,
    y: *mut f32,
    n: usize,
    f: impl Fn(__m512, __m512) -> __m512,
) {
    let d = if d.is_null() { y.cast_const() } else { d };
    let mut i = 0;
    // SAFETY (all blocks): loads and stores stay below n: full vectors while i + 16 <= n,
    // then the mask covers the n - i elements left.
    while i + 4 * L <= n {
        unsafe {
            let r: [__m512; 4] = std::array::from_fn(|j| {
                f(
                    _mm512_loadu_ps(x.add(i + j * L)),
                    _mm512_loadu_ps(d.add(i + j * L)),
                )
            });
            for (j, v) in r.into_iter().enumerate() {
                _mm512_storeu_ps(y.add(i + j * L), v);
            }
        }
        i += 4 * L;
    }
    while i + L <= n {
        unsafe {
            _mm512_storeu_ps(
                y.add(i),
                f(_mm512_loadu_ps(x.add(i)), _mm512_loadu_ps(d.add(i))),
            )
        };
        i += L;
    }
    if i < n {
        let k = first16(n - i);
        unsafe {
            let v = f(
                _mm512_maskz_loadu_ps(k, x.add(i)),
                _mm512_maskz_loadu_ps(k, d.add(i)),
            );
            _mm512_mask_storeu_ps(y.add(i), k, v);
        }
    }
}

/// `y = GELU(x)`; `x == None` means in place. Same bits as [`simd::gelu`].
///
/// # Safety
/// The CPU has AVX-512 F.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
pub(crate) unsafe fn gelu_slice(x: Option<&[f32]>, y: &mut [f32]) {
    let n = y.len();
    let xp = match x {
        Some(x) => {
            assert_eq!(x.len(), n);
            x.as_ptr()
        }
        None => y.as_ptr(),
    };
    // SAFETY: both hold n elements; `f` ignores its second operand.
    unsafe { map2(xp, xp, y.as_mut_ptr(), n, |v, _| gelu::<__m512>(v)) }
}

/// `dx = dy·GELU'(x)`; `dy == None` means `dx` holds `dy`. Same bits as
/// [`simd::gelu_grad`].
///
/// # Safety
/// The CPU has AVX-512 F.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
pub(crate) unsafe fn gelu_grad_slice(x: &[f32], dy: Option<&[f32]>, dx: &mut [f32]) {
    let n = dx.len();
    assert_eq!(x.len(), n);
    let dp = match dy {
        Some(d) => {
            assert_eq!(d.len(), n);
            d.as_ptr()
        }
        None => std::ptr::null(),
    };
    // SAFETY: all hold n elements.
    unsafe {
        map2(x.as_ptr(), dp, dx.as_mut_ptr(), n, |v, d| {
            gelu_grad::<__m512>(v, d)
        })
    }
}

/// The NEON level's slices: four vectors of 4 lanes per pass, then single vectors, the
/// last `n mod 4` elements as one zero-padded vector.
#[cfg(target_arch = "aarch64")]
mod neon {
    use std::arch::aarch64::*;

    use super::{gelu, gelu_grad};

    /// Lanes of one NEON vector.
    const L: usize = 4;

    /// `y[i] = f(x[i], d[i])` for `i < y.len()`; `None` for `x` or `d` means `y`'s old
    /// value.
    fn map2(
        x: Option<&[f32]>,
        d: Option<&[f32]>,
        y: &mut [f32],
        f: impl Fn(float32x4_t, float32x4_t) -> float32x4_t,
    ) {
        let n = y.len();
        assert!(x.is_none_or(|x| x.len() == n) && d.is_none_or(|d| d.len() == n));
        let yp = y.as_mut_ptr();
        let (xp, dp) = (
            x.map_or(yp.cast_const(), |x| x.as_ptr()),
            d.map_or(yp.cast_const(), |d| d.as_ptr()),
        );
        let mut i = 0;
        // SAFETY (all blocks): NEON is baseline aarch64; every access is below n, and an
        // element of `y` is read (as `x` or `d`) before it is written.
        while i + 4 * L <= n {
            unsafe {
                let r: [float32x4_t; 4] = std::array::from_fn(|j| {
                    f(vld1q_f32(xp.add(i + j * L)), vld1q_f32(dp.add(i + j * L)))
                });
                for (j, v) in r.into_iter().enumerate() {
                    vst1q_f32(yp.add(i + j * L), v);
                }
            }
            i += 4 * L;
        }
        while i + L <= n {
            unsafe { vst1q_f32(yp.add(i), f(vld1q_f32(xp.add(i)), vld1q_f32(dp.add(i)))) };
            i += L;
        }
        if i < n {
            let r = n - i;
            let (mut xs, mut ds) = ([0.0f32; L], [0.0f32; L]);
            unsafe {
                std::ptr::copy_nonoverlapping(xp.add(i), xs.as_mut_ptr(), r);
                std::ptr::copy_nonoverlapping(dp.add(i), ds.as_mut_ptr(), r);
                let v = f(vld1q_f32(xs.as_ptr()), vld1q_f32(ds.as_ptr()));
                vst1q_f32(xs.as_mut_ptr(), v);
                std::ptr::copy_nonoverlapping(xs.as_ptr(), yp.add(i), r);
            }
        }
    }

    /// `y = GELU(x)`; `x == None` means in place. Same bits as [`crate::simd::gelu`]
    /// with `Fused`.
    ///
    /// # Safety
    /// None (NEON is baseline aarch64); `unsafe` as the AVX-512 level's.
    pub(crate) unsafe fn gelu_slice(x: Option<&[f32]>, y: &mut [f32]) {
        map2(x, None, y, |v, _| {
            // SAFETY: NEON is baseline aarch64.
            unsafe { gelu::<float32x4_t>(v) }
        })
    }

    /// `dx = dy·GELU'(x)`; `dy == None` means `dx` holds `dy`. Same bits as
    /// [`crate::simd::gelu_grad`] with `Fused`.
    ///
    /// # Safety
    /// None (NEON is baseline aarch64); `unsafe` as the AVX-512 level's.
    pub(crate) unsafe fn gelu_grad_slice(x: &[f32], dy: Option<&[f32]>, dx: &mut [f32]) {
        map2(Some(x), dy, dx, |v, d| {
            // SAFETY: NEON is baseline aarch64.
            unsafe { gelu_grad::<float32x4_t>(v, d) }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::simd::Fused;

    fn data(n: usize, seed: u32) -> Vec<f32> {
        andrea_testkit::random::Rand::new(seed as u64).vec(n, -20.0, 20.0)
    }

    #[cfg(target_arch = "x86_64")]
    /// The 8-lane GELU and GELU' give [`simd::gelu`]'s and [`simd::gelu_grad`]'s bits
    /// (`Fused`), across the clamp of the exponent, for signed zeros, infinities and NaN.
    #[test]
    fn gelu_8_lanes_give_the_generic_bits() {
        if !simd::has_avx2_fma() {
            eprintln!("SKIPPED: this CPU has no AVX2 + FMA");
            return;
        }
        let mut x: Vec<f32> = (0..4000).map(|i| i as f32 * 0.013 - 26.0).collect();
        x.extend([
            f32::NAN,
            f32::INFINITY,
            f32::NEG_INFINITY,
            0.0,
            -0.0,
            1e-30,
            200.0,
        ]);
        x.resize(x.len().div_ceil(8) * 8, 0.5);
        let dy: Vec<f32> = (0..x.len()).map(|i| (i % 13) as f32 * 0.37 - 2.0).collect();
        for (c, d) in x.chunks_exact(8).zip(dy.chunks_exact(8)) {
            let (mut y, mut g) = ([0.0f32; 8], [0.0f32; 8]);
            // SAFETY: AVX2 + FMA checked above; the chunks and arrays hold 8 elements.
            unsafe {
                let v = _mm256_loadu_ps(c.as_ptr());
                _mm256_storeu_ps(y.as_mut_ptr(), gelu::<__m256>(v));
                _mm256_storeu_ps(
                    g.as_mut_ptr(),
                    gelu_grad::<__m256>(v, _mm256_loadu_ps(d.as_ptr())),
                );
            }
            for i in 0..8 {
                let same =
                    |a: f32, b: f32| a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan());
                let want = simd::gelu::<Fused>(c[i]);
                assert!(same(y[i], want), "gelu({}): {} vs {want}", c[i], y[i]);
                let want = d[i] * simd::gelu_grad::<Fused>(c[i]);
                assert!(same(g[i], want), "gelu'({}): {} vs {want}", c[i], g[i]);
            }
        }
    }

    /// The level's slices (AVX-512: masked tails; NEON: a padded last vector), in place
    /// and not, give [`simd::gelu`]'s and [`simd::gelu_grad`]'s bits (`Fused`).
    #[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
    #[test]
    fn gelu_slices_of_the_level_give_the_generic_bits() {
        if !(simd::has_avx512() || simd::has_neon()) {
            eprintln!("SKIPPED: this CPU has no AVX-512 (or ANDREA_SIMD caps the level)");
            return;
        }
        for n in [1usize, 3, 4, 5, 15, 16, 17, 63, 64, 65, 100, 1000] {
            let mut x = data(n, n as u32 + 7);
            x[0] = if n > 1 { 0.0 } else { -3.0 };
            if n >= 16 {
                // Across the exponent's clamp, signed zeros, infinities and NaN.
                let special = [
                    f32::NAN,
                    f32::INFINITY,
                    f32::NEG_INFINITY,
                    -0.0,
                    1e-30,
                    200.0,
                ];
                x[n - 6..].copy_from_slice(&special);
            }
            let dy = data(n, n as u32 + 9);
            let same = |a: f32, b: f32| a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan());
            let mut y = vec![f32::NAN; n];
            let mut yi = x.clone();
            let mut d = vec![f32::NAN; n];
            let mut di = dy.clone();
            // SAFETY: the level (AVX-512 or NEON) checked above.
            unsafe {
                gelu_slice(Some(&x), &mut y);
                gelu_slice(None, &mut yi);
                gelu_grad_slice(&x, Some(&dy), &mut d);
                gelu_grad_slice(&x, None, &mut di);
            }
            for i in 0..n {
                let want = simd::gelu::<Fused>(x[i]);
                assert!(same(y[i], want), "gelu({}) n {n}: {} vs {want}", x[i], y[i]);
                assert!(same(yi[i], want), "in place: gelu({}) n {n}", x[i]);
                let want = dy[i] * simd::gelu_grad::<Fused>(x[i]);
                assert!(
                    same(d[i], want),
                    "gelu'({}) n {n}: {} vs {want}",
                    x[i],
                    d[i]
                );
                assert!(same(di[i], want), "in place: gelu'({}) n {n}", x[i]);
            }
        }
    }
}
