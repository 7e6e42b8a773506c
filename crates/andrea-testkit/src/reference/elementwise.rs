//! The residual add, scaling, and GELU (tanh form) with its derivative.

/// `sqrt(2/π)`.
const SQRT_2_OVER_PI: f64 = 0.797_884_560_802_865_4;
const GELU_CUBIC: f64 = 0.044715;

/// `out = a + b`; all `[n]`.
pub fn add(out: &mut [f64], a: &[f64], b: &[f64]) {
    for i in 0..out.len() {
        out[i] = a[i] + b[i];
    }
}

/// `x *= alpha`; `x: [n]`.
pub fn scale(x: &mut [f64], alpha: f64) {
    for v in x {
        *v *= alpha;
    }
}

/// `GELU(x) = 0.5·x·(1 + tanh(s·(x + 0.044715·x³)))`, `s = sqrt(2/π)`.
pub fn gelu_scalar(x: f64) -> f64 {
    let u = SQRT_2_OVER_PI * (x + GELU_CUBIC * x * x * x);
    0.5 * x * (1.0 + u.tanh())
}

/// `out = GELU(x)`; both `[n]`.
pub fn gelu(out: &mut [f64], x: &[f64]) {
    for i in 0..out.len() {
        out[i] = gelu_scalar(x[i]);
    }
}

/// `dx = dout·GELU'(x)`; all `[n]`. With `u = s·(x + 0.044715·x³)`:
/// `GELU'(x) = 0.5·(1 + tanh u) + 0.5·x·(1 - tanh² u)·s·(1 + 3·0.044715·x²)`.
pub fn gelu_backward(dx: &mut [f64], x: &[f64], dout: &[f64]) {
    for i in 0..dx.len() {
        let x = x[i];
        let th = (SQRT_2_OVER_PI * (x + GELU_CUBIC * x * x * x)).tanh();
        let du = SQRT_2_OVER_PI * (1.0 + 3.0 * GELU_CUBIC * x * x);
        let grad = 0.5 * (1.0 + th) + 0.5 * x * (1.0 - th * th) * du;
        dx[i] = dout[i] * grad;
    }
}

/// `x` rounded to BF16 (nearest, ties to even) as an `f32`, from its bits: the upper 16
/// bits, plus one where the lower 16 are more than half or exactly half with an odd upper
/// part (a carry into the exponent is the right result, up to infinity). NaN stays NaN.
pub fn round_bf16(x: f32) -> f32 {
    if x.is_nan() {
        return f32::NAN;
    }
    let bits = x.to_bits();
    let (upper, lower) = (bits >> 16, bits & 0xffff);
    let up = lower > 0x8000 || (lower == 0x8000 && upper & 1 == 1);
    f32::from_bits((upper + up as u32) << 16)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::random::Rand;
    use crate::reference::fd;

    #[test]
    fn gelu_backward_matches_finite_differences() {
        let mut r = Rand::new(2);
        let x = fd::values(&mut r, 64, -6.0, 6.0);
        let w = fd::values(&mut r, 64, -1.0, 1.0);
        let mut dx = vec![0.0; 64];
        gelu_backward(&mut dx, &x, &w);
        let numeric = fd::grad(&x, |x| {
            let mut y = vec![0.0; x.len()];
            gelu(&mut y, x);
            fd::dot(&w, &y)
        });
        fd::assert_grad("gelu dx", &dx, &numeric);
    }

    #[test]
    fn gelu_known_values() {
        // GELU(0) = 0; GELU(x) -> x for large x and -> 0 for very negative x;
        // GELU(1) with the tanh form is 0.8411919906082768.
        assert_eq!(gelu_scalar(0.0), 0.0);
        assert!((gelu_scalar(1.0) - 0.841_191_990_608_276_8).abs() < 1e-15);
        assert!((gelu_scalar(10.0) - 10.0).abs() < 1e-12);
        assert!(gelu_scalar(-10.0).abs() < 1e-12);
    }

    #[test]
    fn add_and_scale() {
        let mut out = [0.0; 2];
        add(&mut out, &[1.0, 2.0], &[0.5, -2.0]);
        assert_eq!(out, [1.5, 0.0]);
        scale(&mut out, -2.0);
        assert_eq!(out, [-3.0, -0.0]);
    }
}
