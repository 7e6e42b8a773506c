//! Tolerances: `|got - want| <= abs + rel·|want|`, never a bare constant.
//!
//! [`Tol`] is the type; the functions below are the tolerance of each op in the
//! conformance suite, each with the reason for its size. They assume the value ranges
//! the suite draws (stated in each module of [`crate::suite`]): operands of products in
//! `[-1, 1]`, so an error bound in units of `u = 2⁻²⁴` (f32 unit roundoff) times the
//! number of accumulated terms is the natural scale.
//!
//! Headroom, measured as the worst `|got - want| / bound` over 1500 cases per op with
//! [`report_enabled`]'s `ANDREA_TOL_REPORT=1` (command there): on the naive backend
//! (sequential f32 sums, about the least accurate order) every accumulating op stays
//! below 0.1 (10x headroom) except `gelu_backward` (0.14) and the AdamW moments and
//! parameters (up to 0.23); the ops that are one correctly rounded f32 operation (`add`,
//! `scale`, `embedding`) reach 0.5 by construction. On the CPU backend (blocked GEMM, SIMD
//! exp) the worst was 0.30, the cross-entropy gradient. A real bug (a missing term, a wrong mask, erf
//! instead of tanh, an unbiased variance) is off by orders of magnitude more; see
//! `tests/suite_can_fail.rs`.

use std::fmt;

pub mod operands;

/// f32 unit roundoff, `2⁻²⁴`.
pub const U: f64 = 1.0 / 16_777_216.0;

/// The best and second-best entries of a row of logits: (index of the best, `l₁`, `l₂`),
/// for comparing greedy tokens where the margin `l₁ − l₂` exceeds the logits' error.
pub fn top2(row: &[f32]) -> (usize, f32, f32) {
    let mut best = (0, f32::NEG_INFINITY, f32::NEG_INFINITY);
    for (i, &l) in row.iter().enumerate() {
        if l > best.1 {
            best = (i, l, best.1);
        } else if l > best.2 {
            best.2 = l;
        }
    }
    best
}

/// A tolerance `abs + rel·|want|`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Tol {
    pub abs: f64,
    pub rel: f64,
}

impl Tol {
    /// Bit-exact (up to the sign of zero): copies, fills, masked zeros.
    pub const EXACT: Tol = Tol { abs: 0.0, rel: 0.0 };

    pub const fn new(abs: f64, rel: f64) -> Self {
        Tol { abs, rel }
    }

    /// The allowed error for a reference value `want`.
    pub fn bound(&self, want: f64) -> f64 {
        self.abs + self.rel * want.abs()
    }

    /// The tolerance of a result computed from an input that carries `other`'s error
    /// (`factor` bounds how much the op amplifies that error).
    pub fn plus(self, other: Tol, factor: f64) -> Tol {
        Tol::new(self.abs + factor * other.abs, self.rel + factor * other.rel)
    }

    /// Compares `got` with the reference `want` element by element. On failure, the
    /// message names the worst element (relative to its bound) and how many failed.
    /// A NaN or infinity where the reference is finite always fails; NaN matches NaN.
    pub fn check<T: Copy + Into<f64>>(
        &self,
        name: &str,
        got: &[T],
        want: &[f64],
    ) -> Result<(), String> {
        self.check_plus(name, got, want, &[])
    }

    /// As [`Tol::check`], with `extra[i]` added to element i's bound (a per-element
    /// bound such as [`operands`]'; missing entries count as 0).
    pub fn check_plus<T: Copy + Into<f64>>(
        &self,
        name: &str,
        got: &[T],
        want: &[f64],
        extra: &[f64],
    ) -> Result<(), String> {
        let bound = |i: usize, w: f64| self.bound(w) + extra.get(i).copied().unwrap_or(0.0);
        if got.len() != want.len() {
            return Err(format!(
                "{name}: got {} elements, the reference has {}",
                got.len(),
                want.len()
            ));
        }
        let mut worst: Option<(usize, f64)> = None;
        let mut failed = 0usize;
        for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
            let g: f64 = g.into();
            let ratio = match (g - w).abs() / bound(i, w) {
                // Equal values under an exact tolerance, or NaN where the reference
                // left a NaN untouched (poisoned memory around an output).
                r if r.is_nan() && (g == w || (g.is_nan() && w.is_nan())) => 0.0,
                r if r.is_nan() => f64::INFINITY,
                r => r,
            };
            if ratio > 1.0 {
                failed += 1;
            }
            if worst.is_none_or(|(_, r)| ratio > r) {
                worst = Some((i, ratio));
            }
        }
        if let Some((_, ratio)) = worst.filter(|_| report_enabled()) {
            eprintln!("ANDREA_TOL_REPORT\t{name}\t{ratio:.4}");
        }
        match worst {
            Some((i, _)) if failed > 0 => {
                let (g, w) = (got[i].into(), want[i]);
                Err(format!(
                    "{name}: {failed} of {} elements out of tolerance; worst at index {i}: \
                     got {g:e}, want {w:e}, |diff| {:.3e} > bound {:.3e} ({self}{})",
                    got.len(),
                    (g - w).abs(),
                    bound(i, w),
                    match extra.get(i) {
                        Some(e) => format!(" + operand bound {e:.1e}"),
                        None => String::new(),
                    },
                ))
            }
            _ => Ok(()),
        }
    }
}

/// With `ANDREA_TOL_REPORT=1`, every check prints `ANDREA_TOL_REPORT <name> <ratio>` to
/// stderr, the ratio being the worst `|got - want| / bound` (1 is the limit). How the
/// headroom quoted in the module docs was measured on the naive backend; run the same on
/// another backend's conformance test to see how close it comes:
///
/// ```text
/// ANDREA_TOL_REPORT=1 PROPTEST_CASES=2000 cargo test -p andrea-testkit --test naive_conformance \
///   -- --nocapture 2>&1 | grep ^ANDREA_TOL_REPORT | sort -k3 -g | tail
/// ```
pub fn report_enabled() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var_os("ANDREA_TOL_REPORT").is_some_and(|v| v != "0"))
}

impl fmt::Display for Tol {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "abs {:.1e} + rel {:.1e}·|want|", self.abs, self.rel)
    }
}

// ---- the tolerance of each op -------------------------------------------------------

/// `matmul` with inner size `k`: a k-term f32 dot product of values in [-1, 1] (plus the
/// bias and the old `c`) in any order has error about `k·u`; ×16 headroom.
pub fn matmul(k: usize) -> Tol {
    Tol::new(16.0 * U * (k as f64 + 2.0), 8.0 * U)
}

/// `bias_backward` over `n` rows: an n-term f32 sum of values in [-1, 1] plus the old
/// `dbias`, error about `n·u`; ×16 headroom.
pub fn bias_backward(n: usize) -> Tol {
    Tol::new(16.0 * U * (n as f64 + 1.0), 8.0 * U)
}

/// `add`, `scale`, `embedding`: a single f32 rounding of an exact result (half an ulp);
/// one ulp allowed.
pub fn one_rounding() -> Tol {
    Tol::new(1e-38, 2.0 * U)
}

/// `gelu`: f32 `tanh` is good to a few ulp, but `1 + tanh(u)` cancels for x < 0, so
/// the error is absolute, about `ulp(1)·|x|/2` for |x| <= 8.
pub fn gelu() -> Tol {
    Tol::new(1e-6, 1e-5)
}

/// `gelu_backward`: as [`gelu`], through `1 ± tanh` terms and `x²` factors, times
/// `|dout| <= 1`.
pub fn gelu_backward() -> Tol {
    Tol::new(4e-6, 2e-5)
}

/// `matmul_gelu_backward` with inner size `k`, operands scaled so `|dy·w| <= 1`: the
/// product's error ([`matmul`]) times `|GELU'| <= 1.13`, plus GELU's own error
/// ([`gelu_backward`], for `|dout| <= 1`).
pub fn matmul_gelu_backward(k: usize) -> Tol {
    gelu_backward().plus(matmul(k), 1.2)
}

/// `layernorm` output over `c` channels: mean and variance are c-term f32 sums
/// (error ~ `c·u` relative), then `(x - mean)·rstd·γ + β` with `|x̂| <= ~3`.
pub fn layernorm_out(c: usize) -> Tol {
    Tol::new(16.0 * U * (c as f64 + 8.0), 16.0 * U)
}

/// `layernorm` saved mean and rstd over `c` channels: a c-term sum, relative error
/// `c·u`; rstd also through a square root.
pub fn layernorm_stats(c: usize) -> Tol {
    Tol::new(8.0 * U * (c as f64 + 8.0), 8.0 * U * (c as f64 + 8.0))
}

/// `layernorm_backward` over `c` channels (`dx`): `rstd·(g - mean(g) - x̂·mean(g·x̂))`,
/// two c-term sums with cancellation, `|rstd| <= ~4` for the suite's inputs.
pub fn layernorm_dx(c: usize) -> Tol {
    Tol::new(8.0 * U * (c as f64 + 8.0), 16.0 * U)
}

/// `layernorm_backward` over `n` rows (`dgamma`, `dbeta`): n-term sums of products
/// with `|x̂| <= ~3`, plus the old value.
pub fn layernorm_dparams(n: usize) -> Tol {
    Tol::new(24.0 * U * (n as f64 + 1.0), 16.0 * U)
}

/// `softmax` over `k` columns: f32 `exp` (a few ulp) and a k-term sum of values in
/// (0, 1]; outputs <= 1, so relative error about `k·u`.
pub fn softmax(k: usize) -> Tol {
    Tol::new(8.0 * U, 16.0 * U * (k as f64 + 8.0))
}

/// `softmax_backward` over `k` columns: `scale·p·(dp - Σ p·dp)`, a k-term sum of
/// values in [-1, 1] with `scale <= 3`.
pub fn softmax_backward(k: usize) -> Tol {
    Tol::new(6.0 * U * (k as f64 + 8.0), 16.0 * U)
}

/// `embedding_backward` with `n` contributions: each row of `dwte` is a sum of up to
/// n rows of `dout` in [-1, 1], plus the old value.
pub fn embedding_backward(n: usize) -> Tol {
    Tol::new(16.0 * U * (n as f64 + 1.0), 8.0 * U)
}

/// `softmax_cross_entropy` loss over `v` columns: `log Σ exp` of logits in [-8, 8]:
/// a v-term sum (relative `v·u`, absolute after the log) plus `max`, `|loss| <= ~20`.
pub fn cross_entropy_loss(v: usize) -> Tol {
    Tol::new(8.0 * U * (v as f64 + 16.0), 16.0 * U)
}

/// `softmax_cross_entropy` gradient over `v` columns: `grad_scale·(p - onehot)`, p as
/// in [`softmax`], `grad_scale <= 2`.
pub fn cross_entropy_grad(v: usize) -> Tol {
    Tol::new(4.0 * U * (v as f64 + 16.0), 16.0 * U)
}

/// `sum_squares`: squares may be formed in f32 (one rounding each, all positive), the
/// sum is in f64.
pub fn sum_squares() -> Tol {
    Tol::new(1e-30, 4.0 * U)
}

/// `adamw` parameters with learning rate `lr`: the update `lr·m̂/(√v̂ + eps)` is
/// O(lr); `1 - β^t` in f32 loses up to `u/(1-β)` relative (~1e-4 for β = 0.999,
/// step 1), which moves the parameter by about `1e-4·lr`; plus the final rounding.
pub fn adamw_param(lr: f32) -> Tol {
    Tol::new(5e-4 * lr as f64 + 4.0 * U, 4.0 * U)
}

/// `adamw` first moment: `β1·m + (1-β1)·g`, a few f32 roundings of terms up to 1 in
/// magnitude that may cancel (so the error is absolute).
pub fn adamw_m() -> Tol {
    Tol::new(8.0 * U, 8.0 * U)
}

/// `adamw` second moment: `β2·v + (1-β2)·g²`, a few f32 roundings of positive terms.
pub fn adamw_v() -> Tol {
    Tol::new(1e-12, 16.0 * U)
}

/// `attention_forward` with `k` keys and head size `d`: d-term scores, a k-term
/// softmax, then a k-term weighted sum of values in [-1, 1].
pub fn attention_out(k: usize, d: usize) -> Tol {
    Tol::new(4.0 * U * (k as f64 + d as f64 + 8.0), 16.0 * U)
}

/// `attention_backward` with `t` positions and head size `d`: chains of t- and d-term
/// sums through the softmax backward (with its cancellation).
pub fn attention_grad(t: usize, d: usize) -> Tol {
    Tol::new(8.0 * U * (t as f64 + d as f64 + 8.0), 16.0 * U)
}
