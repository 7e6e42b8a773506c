//! The squared global gradient norm and the AdamW step.

use andrea_core::AdamWStep;

/// `Σ x²` for `x: [n]`.
pub fn sum_squares(x: &[f64]) -> f64 {
    x.iter().map(|v| v * v).sum()
}

/// One AdamW step with `torch.optim.AdamW` semantics on `param, grad, m, v: [n]`
/// (see [`AdamWStep`]); the hyper-parameters are used at f64 precision of their f32
/// values:
///
/// ```text
/// g = grad·grad_scale
/// m = β1·m + (1-β1)·g            v = β2·v + (1-β2)·g²
/// m̂ = m/(1-β1^t)                  v̂ = v/(1-β2^t)
/// p = p - lr·wd·p - lr·m̂/(sqrt(v̂) + eps)
/// ```
pub fn adamw(param: &mut [f64], grad: &[f64], m: &mut [f64], v: &mut [f64], step: &AdamWStep) {
    let (lr, b1, b2) = (step.lr as f64, step.beta1 as f64, step.beta2 as f64);
    let (eps, wd, gs) = (
        step.eps as f64,
        step.weight_decay as f64,
        step.grad_scale as f64,
    );
    let t = step.step as i32;
    let (c1, c2) = (1.0 - b1.powi(t), 1.0 - b2.powi(t));
    for i in 0..param.len() {
        let g = grad[i] * gs;
        m[i] = b1 * m[i] + (1.0 - b1) * g;
        v[i] = b2 * v[i] + (1.0 - b2) * g * g;
        let (m_hat, v_hat) = (m[i] / c1, v[i] / c2);
        param[i] -= lr * wd * param[i] + lr * m_hat / (v_hat.sqrt() + eps);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn step(t: u64) -> AdamWStep {
        AdamWStep {
            lr: 0.125,
            beta1: 0.5,
            beta2: 0.75,
            eps: 0.0625,
            weight_decay: 0.5,
            step: t,
            grad_scale: 2.0,
        }
    }

    /// Two steps worked by hand (powers of two, so f32 hyper-parameters are exact).
    #[test]
    fn two_steps_by_hand() {
        let (mut p, mut m, mut v) = ([1.0], [0.0], [0.0]);
        // Step 1, g = 0.25·2 = 0.5: m = 0.25, v = 0.0625, m̂ = 0.5, v̂ = 0.25,
        // p = 1 - 0.125·0.5·1 - 0.125·0.5/(0.5 + 0.0625) = 0.9375 - 0.111…
        adamw(&mut p, &[0.25], &mut m, &mut v, &step(1));
        assert_eq!((m[0], v[0]), (0.25, 0.0625));
        let p1 = 0.9375 - 0.0625 / 0.5625;
        assert!((p[0] - p1).abs() < 1e-15);
        // Step 2, g = -1: m = 0.125 - 0.5 = -0.375, v = 0.046875 + 0.25 = 0.296875,
        // m̂ = -0.375/0.75 = -0.5, v̂ = 0.296875/0.4375 = 0.678571…
        adamw(&mut p, &[-0.5], &mut m, &mut v, &step(2));
        assert_eq!((m[0], v[0]), (-0.375, 0.296875));
        let p2 = p1 - 0.0625 * p1 + 0.0625 / ((0.296875f64 / 0.4375).sqrt() + 0.0625);
        assert!((p[0] - p2).abs() < 1e-15);
    }

    #[test]
    fn sum_of_squares() {
        assert_eq!(sum_squares(&[3.0, -4.0]), 25.0);
    }
}
