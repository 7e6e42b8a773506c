//! Runtime CPU-feature dispatch and the vectorisable math the elementwise kernels share.
//!
//! The crate is built for the baseline x86-64 target so its binaries run anywhere;
//! [`multiversion!`] compiles a hot loop a second time with AVX2 + FMA enabled and
//! picks that copy at run time when the CPU has them. Both copies perform the same
//! operations in the same order (no FMA contraction, no reassociation), so results do
//! not depend on which one ran.

/// Defines `fn $name(args) -> ret` whose body is compiled twice, once for the baseline
/// target and once with `avx2,fma`, and dispatches at run time. Helpers called from the
/// body should be `#[inline(always)]` so they are compiled into both copies.
macro_rules! multiversion {
    ($(#[$m:meta])* $vis:vis fn $name:ident($($arg:ident : $ty:ty),* $(,)?) $(-> $ret:ty)? $body:block) => {
        $(#[$m])* $vis fn $name($($arg: $ty),*) $(-> $ret)? {
            #[cfg(target_arch = "x86_64")]
            {
                #[target_feature(enable = "avx2,fma")]
                unsafe fn avx2($($arg: $ty),*) $(-> $ret)? $body
                if crate::simd::has_avx2_fma() {
                    // SAFETY: the CPU supports the features `avx2` was compiled for.
                    return unsafe { avx2($($arg),*) };
                }
            }
            #[inline(always)]
            fn baseline($($arg: $ty),*) $(-> $ret)? $body
            baseline($($arg),*)
        }
    };
}
pub(crate) use multiversion;

/// Whether the CPU has AVX2 and FMA (detected once, then cached by std).
#[inline]
pub(crate) fn has_avx2_fma() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("fma")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// `e^x` for f32, written so loops over it vectorise: `x = k·ln2 + r` with `|r| <= ln2/2`,
/// `e^r` by its Taylor series to `r^7/7!` (relative error below 2e-7 on that interval),
/// and `2^k` built in the exponent bits. Inputs are clamped to [-87, 88], where `e^x` is
/// a normal f32.
#[inline(always)]
pub(crate) fn exp(x: f32) -> f32 {
    const LN2_HI: f32 = 0.693_145_75;
    const LN2_LO: f32 = 1.428_606_8e-6;
    let x = x.clamp(-87.0, 88.0);
    let k = floor(x * std::f32::consts::LOG2_E + 0.5);
    // Two-step reduction keeps r accurate: k·ln2 in two parts.
    let r = (x - k * LN2_HI) - k * LN2_LO;
    // Horner form of 1 + r + r²/2! + ... + r⁷/7!.
    let mut p = 1.0 / 5040.0;
    p = p * r + 1.0 / 720.0;
    p = p * r + 1.0 / 120.0;
    p = p * r + 1.0 / 24.0;
    p = p * r + 1.0 / 6.0;
    p = p * r + 0.5;
    p = p * r + 1.0;
    p = p * r + 1.0;
    let bits = ((k as i32 + 127) as u32) << 23;
    p * f32::from_bits(bits)
}

/// `floor(y)` for `|y| < 2^31` by truncation and a correction: vectorises on every
/// x86-64 (SSE2 has no rounding instruction, so `f32::floor` would be a library call).
#[inline(always)]
pub(crate) fn floor(y: f32) -> f32 {
    let t = (y as i32) as f32;
    if t > y {
        t - 1.0
    } else {
        t
    }
}

/// `sqrt(2/π)`, the GELU tanh-form constant.
pub(crate) const GELU_C: f32 = 0.797_884_6;
/// The cubic coefficient of the GELU tanh form.
pub(crate) const GELU_A: f32 = 0.044_715;

/// GELU, tanh form. Uses `0.5·(1 + tanh(u)) = 1 / (1 + e^(-2u))`, which has no
/// cancellation near 0 and needs one `exp` and one division.
#[inline(always)]
pub(crate) fn gelu(x: f32) -> f32 {
    let u = GELU_C * (x + GELU_A * x * x * x);
    x / (1.0 + exp(-2.0 * u))
}

/// Derivative of [`gelu`]: with `s = 1/(1 + e^(-2u))` (so `0.5·(1+tanh u) = s` and
/// `0.5·sech²u = 2·s·(1-s)`), `GELU'(x) = s + x·2·s·(1-s)·u'(x)`,
/// `u'(x) = sqrt(2/π)·(1 + 3·0.044715·x²)`.
#[inline(always)]
pub(crate) fn gelu_grad(x: f32) -> f32 {
    let x2 = x * x;
    let u = GELU_C * (x + GELU_A * x2 * x);
    let s = 1.0 / (1.0 + exp(-2.0 * u));
    let du = GELU_C * (1.0 + 3.0 * GELU_A * x2);
    s + x * 2.0 * s * (1.0 - s) * du
}

/// Sum of `x` with 16 independent accumulators (vectorises without reassociating
/// across lanes differently on different targets).
#[inline(always)]
pub(crate) fn sum(x: &[f32]) -> f32 {
    let mut acc = [0.0f32; 16];
    let chunks = x.chunks_exact(16);
    let tail = chunks.remainder();
    for c in chunks {
        for i in 0..16 {
            acc[i] += c[i];
        }
    }
    let mut s = 0.0;
    for (i, &t) in tail.iter().enumerate() {
        acc[i] += t;
    }
    for a in acc {
        s += a;
    }
    s
}

/// `Σ (x - c)²` with 16 accumulators.
#[inline(always)]
pub(crate) fn sum_sq_dev(x: &[f32], c: f32) -> f32 {
    let mut acc = [0.0f32; 16];
    let chunks = x.chunks_exact(16);
    let tail = chunks.remainder();
    for ch in chunks {
        for i in 0..16 {
            let d = ch[i] - c;
            acc[i] += d * d;
        }
    }
    for (i, &t) in tail.iter().enumerate() {
        let d = t - c;
        acc[i] += d * d;
    }
    let mut s = 0.0;
    for a in acc {
        s += a;
    }
    s
}

/// `Σ a·b` with 16 accumulators.
#[inline(always)]
pub(crate) fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0.0f32; 16];
    let n = a.len().min(b.len());
    let (a, b) = (&a[..n], &b[..n]);
    let (ca, cb) = (a.chunks_exact(16), b.chunks_exact(16));
    let (ta, tb) = (ca.remainder(), cb.remainder());
    for (x, y) in ca.zip(cb) {
        for i in 0..16 {
            acc[i] += x[i] * y[i];
        }
    }
    for i in 0..ta.len() {
        acc[i] += ta[i] * tb[i];
    }
    let mut s = 0.0;
    for v in acc {
        s += v;
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exp_matches_std_to_a_few_ulp() {
        let mut worst = 0.0f64;
        let mut x = -87.0f32;
        while x < 88.0 {
            let want = (x as f64).exp();
            let got = exp(x) as f64;
            worst = worst.max(((got - want) / want).abs());
            x += 0.0137;
        }
        assert!(worst < 5e-7, "worst relative error {worst}");
    }

    #[test]
    fn gelu_matches_the_tanh_form() {
        for i in -2000..2000 {
            let x = i as f32 * 0.005;
            let xd = x as f64;
            let want = 0.5
                * xd
                * (1.0
                    + ((2.0 / std::f64::consts::PI).sqrt() * (xd + 0.044715 * xd.powi(3))).tanh());
            let got = gelu(x) as f64;
            assert!(
                (got - want).abs() <= 1e-6 + 1e-6 * want.abs(),
                "x={x} {got} {want}"
            );
        }
    }
}
