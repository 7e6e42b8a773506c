//! Runtime CPU-feature dispatch and the vectorisable math the elementwise kernels share.
//!
//! The crate is built for the baseline x86-64 target so its binaries run anywhere;
//! [`multiversion!`] compiles a hot loop a second time with AVX2 + FMA enabled and
//! picks that copy at run time when the CPU has them ([`level`], which `ANDREA_SIMD`
//! can cap). The AVX2 copy uses fused multiply-adds in the transcendental functions
//! (half the dependent operations), so a machine without AVX2 may differ from one with
//! it in the last bits of GELU, softmax and the loss; on one machine, results never
//! depend on the run or the thread count. The intrinsics kernels (softmax and the loss in
//! `norm_softmax_loss`, GELU in `elementwise::gelu`, written where they can be once over
//! the width with [`lanes::F32s`]) follow the functions here operation for operation and
//! give the AVX2 copy's bits.
//!
//! On aarch64, NEON (with its fused multiply-add) is part of the baseline target, so the
//! `neon` level needs no detection: it is the level unless `ANDREA_SIMD=baseline` caps it,
//! and its copy of a `multiversion!` body is the target's own code with [`Fused`]. The
//! baseline copy there (`Unfused`) is the scalar reference the NEON kernels are tested
//! against.
//!
//! A level is a set of instructions every copy of a kernel may use: [`Level`] names
//! them, [`level`] reads the CPU (and the cap) once, and a kernel's dispatch asks
//! [`has_avx2_fma`], [`has_avx512`] or [`has_neon`]. On other architectures the level is
//! `Baseline` and the generic copies run.

#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
pub(crate) mod lanes;

/// Defines `fn $name(args) -> ret` whose body is compiled twice, once for the baseline
/// target and once with `avx2,fma` (on aarch64: once more for the `neon` level, with
/// [`Fused`]), and dispatches at run time. Helpers called from the
/// body should be `#[inline(always)]` so they are compiled into both copies. Inside the
/// body, the type `M` is [`Fused`] in the AVX2 and NEON copies and [`Unfused`] in the
/// baseline one:
/// math helpers take it as a parameter to use fused multiply-adds where they exist.
///
/// `multiversion! { avx512; fn ... }` adds a third copy with AVX-512 (F, VL, DQ, BW),
/// taken first where the CPU has it. It is opt-in per function, by measurement: on Zen 4,
/// whose 512-bit units are two 256-bit halves, it speeds up LayerNorm (32 registers hold
/// its four-vector sums) and nothing else that is not already an intrinsics kernel.
/// Inside it `M` is [`Fused`] too. The copies run the same operations in the same order
/// on every element (reductions keep explicit lanes in every copy), so they give the
/// same bits.
macro_rules! multiversion {
    (avx512; $(#[$m:meta])* $vis:vis fn $name:ident($($arg:ident : $ty:ty),* $(,)?) $(-> $ret:ty)? $body:block) => {
        $(#[$m])* $vis fn $name($($arg: $ty),*) $(-> $ret)? {
            #[cfg(target_arch = "x86_64")]
            {
                #[target_feature(enable = "avx512f,avx512vl,avx512dq,avx512bw,avx2,fma")]
                unsafe fn avx512($($arg: $ty),*) $(-> $ret)? {
                    #[allow(dead_code)]
                    type M = crate::simd::Fused;
                    $body
                }
                if crate::simd::has_avx512() {
                    // SAFETY: the CPU supports the features `avx512` was compiled for.
                    return unsafe { avx512($($arg),*) };
                }
            }
            crate::simd::multiversion! { fn inner($($arg: $ty),*) $(-> $ret)? $body }
            inner($($arg),*)
        }
    };
    ($(#[$m:meta])* $vis:vis fn $name:ident($($arg:ident : $ty:ty),* $(,)?) $(-> $ret:ty)? $body:block) => {
        $(#[$m])* $vis fn $name($($arg: $ty),*) $(-> $ret)? {
            #[cfg(target_arch = "x86_64")]
            {
                #[target_feature(enable = "avx2,fma")]
                unsafe fn avx2($($arg: $ty),*) $(-> $ret)? {
                    #[allow(dead_code)]
                    type M = crate::simd::Fused;
                    $body
                }
                if crate::simd::has_avx2_fma() {
                    // SAFETY: the CPU supports the features `avx2` was compiled for.
                    return unsafe { avx2($($arg),*) };
                }
            }
            #[cfg(target_arch = "aarch64")]
            {
                // NEON and FMA are baseline aarch64: the copy differs only in `M`.
                fn neon($($arg: $ty),*) $(-> $ret)? {
                    #[allow(dead_code)]
                    type M = crate::simd::Fused;
                    $body
                }
                if crate::simd::has_neon() {
                    return neon($($arg),*);
                }
            }
            #[inline(always)]
            fn baseline($($arg: $ty),*) $(-> $ret)? {
                #[allow(dead_code)]
                type M = crate::simd::Unfused;
                $body
            }
            baseline($($arg),*)
        }
    };
}
pub(crate) use multiversion;

/// The instruction sets andrea's own kernels are compiled for, narrowest first.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Debug)]
pub(crate) enum Level {
    Baseline,
    #[cfg(target_arch = "x86_64")]
    Avx2,
    #[cfg(target_arch = "x86_64")]
    Avx512,
    /// NEON with fused multiply-adds (baseline aarch64).
    #[cfg(target_arch = "aarch64")]
    Neon,
}

impl Level {
    /// Every level of this architecture, narrowest first.
    const ALL: &[Level] = &[
        Level::Baseline,
        #[cfg(target_arch = "x86_64")]
        Level::Avx2,
        #[cfg(target_arch = "x86_64")]
        Level::Avx512,
        #[cfg(target_arch = "aarch64")]
        Level::Neon,
    ];

    pub(crate) fn name(self) -> &'static str {
        match self {
            // Elsewhere the baseline is the target's own.
            Level::Baseline if !cfg!(any(target_arch = "x86_64", target_arch = "aarch64")) => {
                std::env::consts::ARCH
            }
            Level::Baseline => "baseline",
            #[cfg(target_arch = "x86_64")]
            Level::Avx2 => "avx2",
            #[cfg(target_arch = "x86_64")]
            Level::Avx512 => "avx512",
            #[cfg(target_arch = "aarch64")]
            Level::Neon => "neon",
        }
    }
}

/// The widest [`Level`] the kernels use: what the CPU has, capped by the environment
/// variable `ANDREA_SIMD` (`baseline`, `avx2` or `avx512` on x86-64; `baseline` or
/// `neon` on aarch64) if set, read once. The cap exists to test and measure the narrower
/// copies on a wide machine (`.ci/run` runs the conformance suite under each); it never
/// enables what the CPU lacks. The GEMM kernels of the `gemm` crate choose their own.
pub(crate) fn level() -> Level {
    static LEVEL: std::sync::OnceLock<Level> = std::sync::OnceLock::new();
    *LEVEL.get_or_init(|| {
        let cpu = detected();
        let Ok(want) = std::env::var("ANDREA_SIMD") else {
            return cpu;
        };
        let want_lower = want.trim().to_ascii_lowercase();
        let named = |l: &&Level| {
            l.name() == want_lower || **l == Level::Baseline && want_lower == "baseline"
        };
        let Some(&cap) = Level::ALL.iter().find(named) else {
            let names: Vec<_> = Level::ALL[1..].iter().map(|l| l.name()).collect();
            eprintln!(
                "andrea-cpu: ignoring ANDREA_SIMD={want:?} (expected baseline{}); using {}",
                names.iter().map(|n| format!(", {n}")).collect::<String>(),
                cpu.name()
            );
            return cpu;
        };
        cap.min(cpu)
    })
}

/// What the CPU supports.
fn detected() -> Level {
    #[cfg(target_arch = "x86_64")]
    {
        use std::is_x86_feature_detected as has;
        if !(has!("avx2") && has!("fma")) {
            Level::Baseline
        } else if has!("avx512f") && has!("avx512vl") && has!("avx512dq") && has!("avx512bw") {
            Level::Avx512
        } else {
            Level::Avx2
        }
    }
    #[cfg(target_arch = "aarch64")]
    {
        Level::Neon
    }
    #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
    {
        Level::Baseline
    }
}

/// Whether the kernels may use AVX2 and FMA ([`level`]).
#[inline]
pub(crate) fn has_avx2_fma() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        level() >= Level::Avx2
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// Whether the kernels may use AVX-512 F, VL, DQ and BW besides AVX2 and FMA ([`level`]).
#[inline]
pub(crate) fn has_avx512() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        level() >= Level::Avx512
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// Whether the kernels may use NEON's vectors and fused multiply-adds ([`level`]): on
/// aarch64 unless `ANDREA_SIMD=baseline`.
#[inline]
pub(crate) fn has_neon() -> bool {
    #[cfg(target_arch = "aarch64")]
    {
        level() >= Level::Neon
    }
    #[cfg(not(target_arch = "aarch64"))]
    {
        false
    }
}

/// `a·b + c`, fused where the CPU has FMA ([`Fused`]), two roundings otherwise.
pub(crate) trait MulAdd {
    fn mul_add(a: f32, b: f32, c: f32) -> f32;
}

/// `a·b + c` in one rounding (only called from code compiled with `fma`: the AVX2,
/// AVX-512 and NEON copies).
#[cfg_attr(
    not(any(target_arch = "x86_64", target_arch = "aarch64")),
    allow(dead_code)
)]
pub(crate) struct Fused;
/// `a·b + c` as a product and a sum.
pub(crate) struct Unfused;

impl MulAdd for Fused {
    #[inline(always)]
    fn mul_add(a: f32, b: f32, c: f32) -> f32 {
        a.mul_add(b, c)
    }
}

impl MulAdd for Unfused {
    #[inline(always)]
    fn mul_add(a: f32, b: f32, c: f32) -> f32 {
        a * b + c
    }
}

/// Elements per block of the block forms below: 4 AVX2 vectors.
pub(crate) const BLOCK: usize = 32;

/// The constants of [`pow2`], shared with the AVX-512 kernels so every copy uses the same.
pub(crate) mod pow2_consts {
    /// `1.5·2^23`: adding it rounds to an integer held in the low mantissa bits.
    pub(crate) const MAGIC: f32 = 12_582_912.0;
    /// The clamp: `2^z` is a normal f32 on `[LO, HI]`.
    pub(crate) const LO: f32 = -126.0;
    pub(crate) const HI: f32 = 126.0;
    /// `2^f ≈ 1 + f·(Q1 + f·(Q2 + ... + f·Q6))` on `|f| <= 1/2`: minimax for relative
    /// error (1.98e-9 in exact arithmetic; about 1.7e-7 after f32 rounding, the same as
    /// degree 7), fitted with Lawson's algorithm in numpy.
    pub(crate) const Q1: f32 = std::f32::consts::LN_2; // the fit lands on it
    pub(crate) const Q2: f32 = 0.240_226_48;
    pub(crate) const Q3: f32 = 0.055_503_324;
    pub(crate) const Q4: f32 = 0.009_618_437;
    pub(crate) const Q5: f32 = 0.001_339_887_4;
    pub(crate) const Q6: f32 = 1.535_335_2e-4;
}

/// `2^z` for f32, written so loops over it vectorise: `z = k + f` with `k = round(z)` and
/// `|f| <= 1/2` exact, `2^f` by a degree-6 minimax polynomial evaluated in Horner's
/// scheme ([`poly2f`]), `2^k` built in the exponent bits. Relative error below 2.5e-7 on
/// `[-126, 126]`, where `z` is clamped (`2^z` is a normal f32 there).
///
/// `k = round(z)` uses the 1.5·2^23 trick: adding it pushes the fraction out of the
/// mantissa, whose low bits then hold `k`. No float-to-int conversion is needed (Rust's
/// saturating `as i32` does not vectorise).
///
/// Every exponential in this crate is one of these, with `log2 e` taken into the caller's
/// constants: GELU's `x·(K1 + K3·x²)`, and softmax's `x·scale - max` as one multiply-add
/// `x·(scale·log2 e) - max·log2 e`. The only roundings that adds are those of the two
/// constants: the one of `max·log2 e` is shared by a whole row and cancels in the
/// normalisation, and the other is a relative 3e-8 of `scale`. That is cheaper than
/// `e^x` with a two-part `ln 2` reduction and a degree-7 polynomial in Estrin's scheme by
/// six operations on the FMA pipes, which bound these loops.
#[inline(always)]
pub(crate) fn pow2<M: MulAdd>(z: f32) -> f32 {
    use pow2_consts::*;
    let z = z.clamp(LO, HI);
    let t = z + MAGIC;
    let f = z - (t - MAGIC);
    let ki = (t.to_bits() as i32).wrapping_sub(MAGIC.to_bits() as i32);
    poly2f::<M>(f) * f32::from_bits(((ki + 127) as u32) << 23)
}

/// `2^f` on `|f| <= 1/2`: `1 + f·(Q1 + f·(Q2 + ... + f·Q6))`, six multiply-adds in a
/// chain (Horner). Estrin's scheme has a chain half as long but eight operations; the
/// loops here run several independent vectors at once, which hides the chain, and are
/// bound by the FMA pipes, so Horner is the faster here (measured: benches/README.md,
/// "Memory-bound ops").
#[inline(always)]
pub(crate) fn poly2f<M: MulAdd>(f: f32) -> f32 {
    use pow2_consts::*;
    let p = M::mul_add(M::mul_add(Q6, f, Q5), f, Q4);
    let p = M::mul_add(M::mul_add(p, f, Q3), f, Q2);
    M::mul_add(M::mul_add(p, f, Q1), f, 1.0)
}

/// [`pow2`] of a block, in place, computed step by step across the whole block ("step
/// major"). The scalar form's chain of ~12 dependent operations per element otherwise
/// fills the out-of-order window with one vector's chain; interleaving four independent
/// vectors keeps both FMA pipes busy (measured: benches/README.md, "Memory-bound ops").
/// Same operations, same results as [`pow2`].
#[inline(always)]
pub(crate) fn pow2_block<M: MulAdd, const N: usize>(x: &mut [f32; N]) {
    use pow2_consts::*;
    let mut t = [0.0f32; N];
    for i in 0..N {
        x[i] = x[i].clamp(LO, HI);
        t[i] = x[i] + MAGIC;
    }
    for i in 0..N {
        x[i] = poly2f::<M>(x[i] - (t[i] - MAGIC));
    }
    for i in 0..N {
        let ki = (t[i].to_bits() as i32).wrapping_sub(MAGIC.to_bits() as i32);
        x[i] *= f32::from_bits(((ki + 127) as u32) << 23);
    }
}

/// `y = GELU(x)` over a slice, in blocks (see [`pow2_block`]); same results as [`gelu`].
/// (The AVX-512 copy of the `gelu` op uses `elementwise::gelu`'s kernel, same bits.)
#[inline(always)]
pub(crate) fn gelu_slice<M: MulAdd, const N: usize>(x: &[f32], y: &mut [f32]) {
    let mut yc = y.chunks_exact_mut(N);
    let mut xc = x.chunks_exact(N);
    for (o, v) in (&mut yc).zip(&mut xc) {
        let mut e = [0.0f32; N];
        for i in 0..N {
            e[i] = v[i] * M::mul_add(GELU_K3, v[i] * v[i], GELU_K1);
        }
        pow2_block::<M, N>(&mut e);
        for i in 0..N {
            o[i] = v[i] / (1.0 + e[i]);
        }
    }
    for (o, &v) in yc.into_remainder().iter_mut().zip(xc.remainder()) {
        *o = gelu::<M>(v);
    }
}

/// `g = GELU'(v)` for a block (see [`pow2_block`]); same results as [`gelu_grad`].
#[inline(always)]
pub(crate) fn gelu_grad_block<M: MulAdd, const N: usize>(v: &[f32], g: &mut [f32; N]) {
    let v: &[f32; N] = v.try_into().expect("a block");
    for i in 0..N {
        g[i] = v[i] * M::mul_add(GELU_K3, v[i] * v[i], GELU_K1);
    }
    pow2_block::<M, N>(g);
    for i in 0..N {
        let x2 = v[i] * v[i];
        let sg = 1.0 / (1.0 + g[i]);
        let du = M::mul_add(GELU_D3, x2, GELU_C);
        g[i] = M::mul_add(v[i] * 2.0 * sg * (1.0 - sg), du, sg);
    }
}

/// `dx = dy · GELU'(x)` over slices, in blocks; same results as [`gelu_grad`].
/// `dy == None` means `dx` holds `dy` (in place).
#[inline(always)]
pub(crate) fn gelu_grad_slice<M: MulAdd, const N: usize>(
    x: &[f32],
    dy: Option<&[f32]>,
    dx: &mut [f32],
) {
    let mut g = [0.0f32; N];
    let mut dxc = dx.chunks_exact_mut(N);
    let mut xc = x.chunks_exact(N);
    match dy {
        Some(dy) => {
            let mut dyc = dy.chunks_exact(N);
            for ((o, v), d) in (&mut dxc).zip(&mut xc).zip(&mut dyc) {
                gelu_grad_block::<M, N>(v, &mut g);
                for i in 0..N {
                    o[i] = d[i] * g[i];
                }
            }
            for ((o, &v), &d) in dxc
                .into_remainder()
                .iter_mut()
                .zip(xc.remainder())
                .zip(dyc.remainder())
            {
                *o = d * gelu_grad::<M>(v);
            }
        }
        None => {
            for (o, v) in (&mut dxc).zip(&mut xc) {
                gelu_grad_block::<M, N>(v, &mut g);
                for i in 0..N {
                    o[i] *= g[i];
                }
            }
            for (o, &v) in dxc.into_remainder().iter_mut().zip(xc.remainder()) {
                *o *= gelu_grad::<M>(v);
            }
        }
    }
}

/// `sqrt(2/π)`, the GELU tanh-form constant.
pub(crate) const GELU_C: f32 = 0.797_884_6;
/// The cubic coefficient of the GELU tanh form.
pub(crate) const GELU_A: f32 = 0.044_715;
/// `-2u·log2(e) = x·(K1 + K3·x²)`: the exponent of [`gelu`] in base 2, with the constants
/// folded (`K1 = -2·sqrt(2/π)·log2 e`, `K3 = K1·0.044715`, each rounded once from f64),
/// so the hot loops keep fewer of them in registers and `e^(-2u) = 2^(x·(K1 + K3·x²))`
/// needs no `·log2 e` of its own. `x·(...)` is rounded either way, so base 2 costs no
/// accuracy (see [`pow2`]).
pub(crate) const GELU_K1: f32 = (-2.0 * GELU_C_F64 * std::f64::consts::LOG2_E) as f32;
pub(crate) const GELU_K3: f32 =
    (-2.0 * GELU_C_F64 * std::f64::consts::LOG2_E * GELU_A as f64) as f32;
const GELU_C_F64: f64 = 0.797_884_560_802_865_4;
/// `u'(x) = sqrt(2/π) + D3·x²`, `D3 = 3·0.044715·sqrt(2/π)`.
pub(crate) const GELU_D3: f32 = 3.0 * GELU_A * GELU_C;

/// GELU, tanh form. Uses `0.5·(1 + tanh(u)) = 1 / (1 + e^(-2u))`, which has no
/// cancellation near 0 and needs one power of two ([`pow2`]) and one division.
#[inline(always)]
pub(crate) fn gelu<M: MulAdd>(x: f32) -> f32 {
    x / (1.0 + pow2::<M>(x * M::mul_add(GELU_K3, x * x, GELU_K1)))
}

/// Derivative of [`gelu`]: with `s = 1/(1 + e^(-2u))` (so `0.5·(1+tanh u) = s` and
/// `0.5·sech²u = 2·s·(1-s)`), `GELU'(x) = s + x·2·s·(1-s)·u'(x)`,
/// `u'(x) = sqrt(2/π)·(1 + 3·0.044715·x²)`.
#[inline(always)]
pub(crate) fn gelu_grad<M: MulAdd>(x: f32) -> f32 {
    let x2 = x * x;
    let s = 1.0 / (1.0 + pow2::<M>(x * M::mul_add(GELU_K3, x2, GELU_K1)));
    let du = M::mul_add(GELU_D3, x2, GELU_C);
    M::mul_add(x * 2.0 * s * (1.0 - s), du, s)
}

/// Asks for the cache lines of `x` ahead of their use (a hint: no effect on results).
/// Causal rows read only their visible part, so each row's reads start a new stream
/// that the hardware prefetcher picks up late (measured on the causal softmax:
/// benches/README.md, "Memory-bound ops").
#[inline]
pub(crate) fn prefetch(x: &[f32]) {
    prefetch_raw(x.as_ptr(), x.len());
}

/// [`prefetch`] of `n` elements from `p`, for memory the caller may not borrow now (a
/// row of an output another borrow covers). Nothing is read or written: a prefetch
/// touches only the caches, and never faults.
#[inline]
pub(crate) fn prefetch_raw(p: *const f32, n: usize) {
    #[cfg(target_arch = "x86_64")]
    for i in (0..n).step_by(16) {
        use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
        // SAFETY: SSE is baseline x86-64; a prefetch has no effect but on the caches
        // (`wrapping_add`: no pointer arithmetic is promised to stay in bounds).
        unsafe { _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(i).cast()) };
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (p, n);
}

/// Asks for the cache line holding `p` into L2 (not L1): for data a thread will read
/// soon, but not in the next few hundred cycles. A hint, like [`prefetch_raw`].
#[inline]
pub(crate) fn prefetch_l2(p: *const f32) {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T1};
        // SAFETY: as in `prefetch_raw`.
        unsafe { _mm_prefetch::<_MM_HINT_T1>(p.cast()) };
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = p;
}

/// Largest element, with 16 accumulators (`f32::max` reductions do not vectorise on
/// their own); `-inf` for an empty slice.
#[inline(always)]
pub(crate) fn max(x: &[f32]) -> f32 {
    let mut acc = [f32::NEG_INFINITY; 16];
    let chunks = x.chunks_exact(16);
    let tail = chunks.remainder();
    for c in chunks {
        for i in 0..16 {
            acc[i] = acc[i].max(c[i]);
        }
    }
    for (i, &t) in tail.iter().enumerate() {
        acc[i] = acc[i].max(t);
    }
    acc.iter().fold(f32::NEG_INFINITY, |m, &a| m.max(a))
}

/// `y = 2^(y·scale2 - m2)` in place (`e^(y·scale - m)` for `scale2 = scale·log2 e`,
/// `m2 = m·log2 e`, see [`pow2`]); returns `Σ y` (in blocks, [`BLOCK`] accumulators).
#[inline(always)]
pub(crate) fn pow2_shifted<M: MulAdd>(y: &mut [f32], scale2: f32, m2: f32) -> f32 {
    let mut acc = [0.0f32; BLOCK];
    let mut chunks = y.chunks_exact_mut(BLOCK);
    for c in &mut chunks {
        let mut e = [0.0f32; BLOCK];
        for i in 0..BLOCK {
            e[i] = M::mul_add(c[i], scale2, -m2);
        }
        pow2_block::<M, BLOCK>(&mut e);
        c.copy_from_slice(&e);
        for i in 0..BLOCK {
            acc[i] += e[i];
        }
    }
    // The last `r < BLOCK` elements as one zero-padded block (a scalar loop here cost a
    // causal softmax row of 256 as much as its vector part: on average 16 elements, each
    // a ~15-operation pow2 on one lane). Padding lanes add `+0.0`, which leaves every
    // lane's sum unchanged, so the bits are those of the scalar form.
    let rest = chunks.into_remainder();
    if !rest.is_empty() {
        let (mut e, keep) = padded_tail::<M>(rest, scale2, m2, 0.0);
        pow2_block::<M, BLOCK>(&mut e);
        for i in 0..BLOCK {
            e[i] *= keep[i];
            acc[i] += e[i];
        }
        rest.copy_from_slice(&e[..rest.len()]);
    }
    sum_lanes(&acc)
}

/// `(e, keep)` for the last `rest.len() < BLOCK` elements of a row:
/// `e[i] = rest[i]·scale2 - m2` (`pad·scale2 - m2` past the end) and `keep[i]` 1 for the
/// elements, 0 past the end, so the block can go through [`pow2_block`] whole.
#[inline(always)]
fn padded_tail<M: MulAdd>(
    rest: &[f32],
    scale2: f32,
    m2: f32,
    pad: f32,
) -> ([f32; BLOCK], [f32; BLOCK]) {
    let mut x = [pad; BLOCK];
    x[..rest.len()].copy_from_slice(rest);
    let mut e = [0.0f32; BLOCK];
    let mut keep = [0.0f32; BLOCK];
    for i in 0..BLOCK {
        e[i] = M::mul_add(x[i], scale2, -m2);
        keep[i] = if i < rest.len() { 1.0 } else { 0.0 };
    }
    (e, keep)
}

/// `Σ 2^(x·scale2 - m2)` (in blocks, [`BLOCK`] accumulators, as [`pow2_shifted`]), `x`
/// unchanged.
#[inline(always)]
pub(crate) fn sum_pow2<M: MulAdd>(x: &[f32], scale2: f32, m2: f32) -> f32 {
    let mut acc = [0.0f32; BLOCK];
    let chunks = x.chunks_exact(BLOCK);
    let tail = chunks.remainder();
    for c in chunks {
        let mut e = [0.0f32; BLOCK];
        for i in 0..BLOCK {
            e[i] = M::mul_add(c[i], scale2, -m2);
        }
        pow2_block::<M, BLOCK>(&mut e);
        for i in 0..BLOCK {
            acc[i] += e[i];
        }
    }
    // Zero-padded, as in `pow2_shifted`.
    if !tail.is_empty() {
        let (mut e, keep) = padded_tail::<M>(tail, scale2, m2, 0.0);
        pow2_block::<M, BLOCK>(&mut e);
        for i in 0..BLOCK {
            acc[i] += e[i] * keep[i];
        }
    }
    sum_lanes(&acc)
}

/// The sum of [`BLOCK`] lanes as a tree: halves added lane by lane (`acc[i] + acc[i+16]`,
/// then `+8`, `+4`, `+2`, `+1`), the order a vector unit folds them in, so the AVX-512
/// kernels (`norm_softmax_loss::softmax_avx512`) give the same bits with five adds instead
/// of 31 in a chain.
#[inline(always)]
pub(crate) fn sum_lanes(acc: &[f32; BLOCK]) -> f32 {
    fold(*acc)
}

/// `N` lanes (a power of two) summed as a tree, halves lane by lane: lane `i` += lane
/// `i + w` for `w = N/2, N/4, ..., 1`.
///
/// While both halves have 8 lanes or more the adds go 8 at a time, as `[f32; 8]`s, which
/// the compiler keeps in vector registers; written lane by lane it unrolled the whole tree
/// into scalar adds through the stack (63 for 64 lanes, on the path from each row's sum to
/// the next pass of LayerNorm and softmax). The same adds in the same order either way.
#[inline(always)]
fn fold<const N: usize>(mut v: [f32; N]) -> f32 {
    let mut w = N / 2;
    while w >= 8 {
        let (lo, hi) = v.split_at_mut(w);
        for (a, b) in lo.chunks_exact_mut(8).zip(hi.chunks_exact(8)) {
            let s: [f32; 8] = std::array::from_fn(|k| a[k] + b[k]);
            a.copy_from_slice(&s);
        }
        w /= 2;
    }
    while w >= 1 {
        for i in 0..w {
            v[i] += v[i + w];
        }
        w /= 2;
    }
    v[0]
}

/// Lanes of the sums below: four AVX-512 (eight AVX2) accumulators, so a row's sum is
/// four independent chains of adds rather than one, then a tree.
pub(crate) const SUM_LANES: usize = 64;

/// `Σ term(a[i], b[i])` over the common length: element `i` of each 64-block into lane
/// `i`, then 16-blocks and single elements of the rest into lanes from 0, then [`fold`].
/// Every copy adds in this order, so they agree bit for bit.
#[inline(always)]
fn sum_of(a: &[f32], b: &[f32], term: impl Fn(f32, f32) -> f32) -> f32 {
    sum_of_beside(a, b, term, |_| {})
}

/// [`sum_of`], calling `beside(j)` after the `j`-th whole block of [`SUM_LANES`]
/// elements is added (none for the rest): work on other memory that runs in the same
/// loop, so that its loads and stores and the sum's adds overlap (LayerNorm normalises
/// one row while it sums the next). The sum is [`sum_of`]'s, bit for bit.
#[inline(always)]
fn sum_of_beside(
    a: &[f32],
    b: &[f32],
    term: impl Fn(f32, f32) -> f32,
    mut beside: impl FnMut(usize),
) -> f32 {
    let n = a.len().min(b.len());
    let (a, b) = (&a[..n], &b[..n]);
    let mut acc = [0.0f32; SUM_LANES];
    let (mut ca, mut cb) = (a.chunks_exact(SUM_LANES), b.chunks_exact(SUM_LANES));
    for (j, (x, y)) in (&mut ca).zip(&mut cb).enumerate() {
        for i in 0..SUM_LANES {
            acc[i] += term(x[i], y[i]);
        }
        beside(j);
    }
    let (mut ca, mut cb) = (
        ca.remainder().chunks_exact(16),
        cb.remainder().chunks_exact(16),
    );
    for (x, y) in (&mut ca).zip(&mut cb) {
        for i in 0..16 {
            acc[i] += term(x[i], y[i]);
        }
    }
    // The last terms go through a zero-padded block, so `acc` is only ever indexed by
    // constants and stays in registers (a variable index puts it on the stack, and every
    // add of the loops above then waits on a store).
    let mut last = [0.0f32; 16];
    for (l, (&x, &y)) in last
        .iter_mut()
        .zip(ca.remainder().iter().zip(cb.remainder()))
    {
        *l = term(x, y);
    }
    for i in 0..16 {
        acc[i] += last[i];
    }
    fold(acc)
}

/// Two sums `Σ term(a[i], b[i], c[i])` at once, in [`sum_of`]'s order.
#[inline(always)]
pub(crate) fn two_sums_of(
    a: &[f32],
    b: &[f32],
    c: &[f32],
    term: impl Fn(f32, f32, f32) -> (f32, f32),
) -> (f32, f32) {
    const L: usize = SUM_LANES;
    let n = a.len().min(b.len()).min(c.len());
    let (a, b, c) = (&a[..n], &b[..n], &c[..n]);
    let (mut s, mut t) = ([0.0f32; L], [0.0f32; L]);
    let full = n - n % L;
    for ((x, y), z) in a[..full]
        .chunks_exact(L)
        .zip(b[..full].chunks_exact(L))
        .zip(c[..full].chunks_exact(L))
    {
        for i in 0..L {
            let (u, v) = term(x[i], y[i], z[i]);
            s[i] += u;
            t[i] += v;
        }
    }
    let mid = full + (n - full) / 16 * 16;
    for ((x, y), z) in a[full..mid]
        .chunks_exact(16)
        .zip(b[full..mid].chunks_exact(16))
        .zip(c[full..mid].chunks_exact(16))
    {
        for i in 0..16 {
            let (u, v) = term(x[i], y[i], z[i]);
            s[i] += u;
            t[i] += v;
        }
    }
    // Zero-padded, as in `sum_of`.
    let (mut ls, mut lt) = ([0.0f32; 16], [0.0f32; 16]);
    for i in 0..n - mid {
        (ls[i], lt[i]) = term(a[mid + i], b[mid + i], c[mid + i]);
    }
    for i in 0..16 {
        s[i] += ls[i];
        t[i] += lt[i];
    }
    (fold(s), fold(t))
}

/// Sum of `x` ([`sum_of`]'s order).
#[inline(always)]
pub(crate) fn sum(x: &[f32]) -> f32 {
    sum_of(x, x, |v, _| v)
}

/// `Σ (x - c)²` ([`sum_of`]'s order).
#[inline(always)]
pub(crate) fn sum_sq_dev(x: &[f32], c: f32) -> f32 {
    sum_of(x, x, |v, _| (v - c) * (v - c))
}

/// [`sum_sq_dev`], with `beside(j)` run after its `j`-th block of [`SUM_LANES`] elements
/// (see [`sum_of_beside`]); the same bits.
#[inline(always)]
pub(crate) fn sum_sq_dev_beside(x: &[f32], c: f32, beside: impl FnMut(usize)) -> f32 {
    sum_of_beside(x, x, |v, _| (v - c) * (v - c), beside)
}

/// `Σ a·b` ([`sum_of`]'s order).
#[inline(always)]
pub(crate) fn dot(a: &[f32], b: &[f32]) -> f32 {
    sum_of(a, b, |x, y| x * y)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The block forms, at two block widths, give the scalar forms' bits.
    #[test]
    fn block_forms_equal_the_scalar_forms() {
        fn check<M: MulAdd, const N: usize>() {
            let x: Vec<f32> = (0..200).map(|i| i as f32 * 0.19 - 18.0).collect();
            for (j, c) in x.chunks_exact(N).enumerate() {
                let mut blk: [f32; N] = c.try_into().unwrap();
                blk.iter_mut().for_each(|v| *v *= 7.5);
                pow2_block::<M, N>(&mut blk);
                for i in 0..N {
                    assert_eq!(blk[i], pow2::<M>(x[j * N + i] * 7.5), "pow2 at {i}");
                }
            }
            let mut y = vec![0.0; 200];
            gelu_slice::<M, N>(&x, &mut y);
            let mut d = vec![0.0; 200];
            gelu_grad_slice::<M, N>(&x, Some(&x), &mut d);
            for i in 0..200 {
                assert_eq!(y[i], gelu::<M>(x[i]), "gelu at {i}, blocks of {N}");
                assert_eq!(
                    d[i],
                    x[i] * gelu_grad::<M>(x[i]),
                    "gelu' at {i}, blocks of {N}"
                );
            }
        }
        check::<Unfused, BLOCK>();
        check::<Unfused, { 2 * BLOCK }>();
        check::<Fused, BLOCK>();
        check::<Fused, { 2 * BLOCK }>();
    }

    /// The tree of [`fold`] is the lane-by-lane one (values of mixed magnitude and sign,
    /// so a different order of the adds would show in the bits).
    #[test]
    fn fold_adds_lane_i_and_i_plus_w_at_each_level() {
        fn by_lanes<const N: usize>(mut v: [f32; N]) -> f32 {
            let mut w = N / 2;
            while w >= 1 {
                for i in 0..w {
                    v[i] += v[i + w];
                }
                w /= 2;
            }
            v[0]
        }
        let x = andrea_testkit::random::Rand::new(3).vec(64 * 50, -1.0, 1.0);
        for (j, c) in x.chunks_exact(64).enumerate() {
            let v: [f32; 64] = std::array::from_fn(|i| c[i] * 10f32.powi((i % 7) as i32 - 3));
            assert_eq!(
                fold(v).to_bits(),
                by_lanes(v).to_bits(),
                "64 lanes, set {j}"
            );
            let h: [f32; 32] = std::array::from_fn(|i| v[i]);
            assert_eq!(
                fold(h).to_bits(),
                by_lanes(h).to_bits(),
                "32 lanes, set {j}"
            );
            let q: [f32; 16] = std::array::from_fn(|i| v[i]);
            assert_eq!(
                fold(q).to_bits(),
                by_lanes(q).to_bits(),
                "16 lanes, set {j}"
            );
        }
    }

    #[test]
    fn pow2_matches_std_to_a_few_ulp() {
        let mut worst = 0.0f64;
        let mut z = -126.0f32;
        while z <= 126.0 {
            let want = (z as f64).exp2();
            for got in [pow2::<Unfused>(z), pow2::<Fused>(z)] {
                worst = worst.max(((got as f64 - want) / want).abs());
            }
            z += 0.00731;
        }
        assert!(worst < 2.5e-7, "worst relative error {worst}");
        assert_eq!(pow2::<Fused>(0.0), 1.0);
        assert_eq!(pow2::<Fused>(1000.0), 126f32.exp2());
        assert_eq!(pow2::<Fused>(-1000.0), (-126f32).exp2());
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
            let got = gelu::<Unfused>(x) as f64;
            assert!(
                (got - want).abs() <= 1e-6 + 1e-6 * want.abs(),
                "x={x} {got} {want}"
            );
        }
    }
}
