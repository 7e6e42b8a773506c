//! Finite differences: the check every backward reference passes against its forward.

use crate::random::Rand;
use crate::Tol;

/// Central differences of a scalar function,
/// `∂f/∂x_i ≈ (f(x + h·e_i) - f(x - h·e_i)) / 2h`: error O(h²) in exact arithmetic plus
/// O(ε/h) of rounding; `h = 1e-5` balances them in f64 at ~1e-10.
pub fn grad(x: &[f64], f: impl Fn(&[f64]) -> f64) -> Vec<f64> {
    const H: f64 = 1e-5;
    let mut x = x.to_vec();
    (0..x.len())
        .map(|i| {
            let x0 = x[i];
            x[i] = x0 + H;
            let up = f(&x);
            x[i] = x0 - H;
            let down = f(&x);
            x[i] = x0;
            (up - down) / (2.0 * H)
        })
        .collect()
}

/// `Σ w·y`: the scalar loss whose gradient with respect to `y` is `w`.
pub fn dot(w: &[f64], y: &[f64]) -> f64 {
    w.iter().zip(y).map(|(a, b)| a * b).sum()
}

/// Random f64 values in `[lo, hi)`.
pub fn values(r: &mut Rand, n: usize, lo: f64, hi: f64) -> Vec<f64> {
    (0..n).map(|_| lo + (hi - lo) * r.unit()).collect()
}

/// The tolerance between an analytic gradient and central differences.
pub const FD_TOL: Tol = Tol::new(1e-7, 1e-6);

/// Asserts (this is test code) that an analytic gradient matches finite differences.
#[track_caller]
pub fn assert_grad(name: &str, analytic: &[f64], numeric: &[f64]) {
    if let Err(e) = FD_TOL.check(name, analytic, numeric) {
        panic!("{e}");
    }
}
