//! LayerNorm over the last dimension, forward and backward.

/// LayerNorm of `x: [N, C]` with `gamma, beta: [C]` into `out: [N, C]`, saving
/// `mean: [N]` and `rstd: [N]`: `out = γ·(x - mean)·rstd + β`, biased variance
/// `var = Σ(x - mean)²/C`, `rstd = 1/sqrt(var + eps)`.
pub fn layernorm(
    out: &mut [f64],
    mean: &mut [f64],
    rstd: &mut [f64],
    x: &[f64],
    gamma: &[f64],
    beta: &[f64],
    n: usize,
    c: usize,
    eps: f64,
) {
    for row in 0..n {
        let x = &x[row * c..(row + 1) * c];
        let m = x.iter().sum::<f64>() / c as f64;
        let var = x.iter().map(|v| (v - m) * (v - m)).sum::<f64>() / c as f64;
        let r = 1.0 / (var + eps).sqrt();
        for i in 0..c {
            out[row * c + i] = gamma[i] * (x[i] - m) * r + beta[i];
        }
        mean[row] = m;
        rstd[row] = r;
    }
}

/// Backward of [`layernorm`] for `x, dout, dx: [N, C]`, `gamma, dgamma, dbeta: [C]`,
/// `mean, rstd: [N]`. With `x̂ = (x - mean)·rstd` and `g = γ·dout`:
///
/// ```text
/// dx     += rstd·(g - mean_c(g) - x̂·mean_c(g·x̂))     (adds: the residual stream's grad)
/// dgamma += Σ_n dout·x̂
/// dbeta  += Σ_n dout
/// ```
pub fn layernorm_backward(
    dx: &mut [f64],
    dgamma: &mut [f64],
    dbeta: &mut [f64],
    dout: &[f64],
    x: &[f64],
    gamma: &[f64],
    mean: &[f64],
    rstd: &[f64],
    n: usize,
    c: usize,
) {
    for row in 0..n {
        let at = |i: usize| row * c + i;
        let xhat = |i: usize| (x[at(i)] - mean[row]) * rstd[row];
        let mut g_mean = 0.0;
        let mut gx_mean = 0.0;
        for i in 0..c {
            let g = gamma[i] * dout[at(i)];
            g_mean += g;
            gx_mean += g * xhat(i);
        }
        g_mean /= c as f64;
        gx_mean /= c as f64;
        for i in 0..c {
            let g = gamma[i] * dout[at(i)];
            dx[at(i)] += rstd[row] * (g - g_mean - xhat(i) * gx_mean);
            dgamma[i] += dout[at(i)] * xhat(i);
            dbeta[i] += dout[at(i)];
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::random::Rand;
    use crate::reference::fd;

    #[test]
    fn layernorm_backward_matches_finite_differences() {
        let mut r = Rand::new(3);
        let (n, c, eps) = (3, 7, 1e-5);
        let x = fd::values(&mut r, n * c, -2.0, 2.0);
        let gamma = fd::values(&mut r, c, 0.5, 1.5);
        let beta = fd::values(&mut r, c, -1.0, 1.0);
        let w = fd::values(&mut r, n * c, -1.0, 1.0);
        let loss = |x: &[f64], gamma: &[f64], beta: &[f64]| {
            let (mut out, mut mean, mut rstd) = (vec![0.0; n * c], vec![0.0; n], vec![0.0; n]);
            layernorm(&mut out, &mut mean, &mut rstd, x, gamma, beta, n, c, eps);
            fd::dot(&w, &out)
        };
        let (mut out, mut mean, mut rstd) = (vec![0.0; n * c], vec![0.0; n], vec![0.0; n]);
        layernorm(&mut out, &mut mean, &mut rstd, &x, &gamma, &beta, n, c, eps);

        // Start from non-zero gradients: dx, dgamma and dbeta all add.
        let dx0 = fd::values(&mut r, n * c, -1.0, 1.0);
        let dg0 = fd::values(&mut r, c, -1.0, 1.0);
        let db0 = fd::values(&mut r, c, -1.0, 1.0);
        let (mut dx, mut dgamma, mut dbeta) = (dx0.clone(), dg0.clone(), db0.clone());
        layernorm_backward(
            &mut dx,
            &mut dgamma,
            &mut dbeta,
            &w,
            &x,
            &gamma,
            &mean,
            &rstd,
            n,
            c,
        );
        let minus = |a: &[f64], b: &[f64]| a.iter().zip(b).map(|(a, b)| a - b).collect::<Vec<_>>();

        let num_dx = fd::grad(&x, |x| loss(x, &gamma, &beta));
        fd::assert_grad("layernorm dx", &minus(&dx, &dx0), &num_dx);
        let num_dg = fd::grad(&gamma, |g| loss(&x, g, &beta));
        fd::assert_grad("layernorm dgamma", &minus(&dgamma, &dg0), &num_dg);
        let num_db = fd::grad(&beta, |b| loss(&x, &gamma, b));
        fd::assert_grad("layernorm dbeta", &minus(&dbeta, &db0), &num_db);
    }

    #[test]
    fn layernorm_uses_biased_variance() {
        // x = [1, 3]: mean 2, biased var 1, so out = [-1, 1]/sqrt(1 + eps).
        let (mut out, mut mean, mut rstd) = ([0.0; 2], [0.0], [0.0]);
        layernorm(
            &mut out,
            &mut mean,
            &mut rstd,
            &[1.0, 3.0],
            &[1.0; 2],
            &[0.0; 2],
            1,
            2,
            1e-5,
        );
        assert_eq!(mean[0], 2.0);
        assert!((rstd[0] - 1.0 / (1.0f64 + 1e-5).sqrt()).abs() < 1e-15);
        assert!((out[1] - rstd[0]).abs() < 1e-15);
    }
}
