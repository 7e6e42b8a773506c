//! The naive backend's arithmetic: plain f32 loops on dense host arrays, summing
//! sequentially. Written independently of [`crate::reference`] (f32, not f64), so the
//! suite compares two implementations, not one with itself.

use andrea_core::check::{MatmulDims, SoftmaxDims};
use andrea_core::{AdamWStep, IGNORE_INDEX};

/// `c[b] (+)= a[b]·b[b] + bias` on dense `[batch, M, K]`, `[batch, K, N]`, `[batch, M, N]`;
/// an operand that is not `batched` has one matrix for every batch entry.
pub fn matmul(
    c: &mut [f32],
    a: &[f32],
    b: &[f32],
    bias: Option<&[f32]>,
    d: MatmulDims,
    (a_batched, b_batched): (bool, bool),
    accumulate: bool,
) {
    let MatmulDims { batch, m, k, n } = d;
    for bt in 0..batch {
        let a = &a[if a_batched { bt * m * k } else { 0 }..];
        let b = &b[if b_batched { bt * k * n } else { 0 }..];
        for i in 0..m {
            for j in 0..n {
                let mut sum = 0.0f32;
                for p in 0..k {
                    sum += a[i * k + p] * b[p * n + j];
                }
                if let Some(bias) = bias {
                    sum += bias[j];
                }
                let cij = &mut c[(bt * m + i) * n + j];
                *cij = if accumulate { *cij + sum } else { sum };
            }
        }
    }
}

/// `dbias[j] += Σ_i dout[i, j]`, `dout: [n, m]`.
pub fn bias_backward(dbias: &mut [f32], dout: &[f32], n: usize, m: usize) {
    for i in 0..n {
        for j in 0..m {
            dbias[j] += dout[i * m + j];
        }
    }
}

const SQRT_2_OVER_PI: f32 = 0.797_884_6;

pub fn gelu(x: f32) -> f32 {
    0.5 * x * (1.0 + (SQRT_2_OVER_PI * (x + 0.044715 * x * x * x)).tanh())
}

pub fn gelu_grad(x: f32) -> f32 {
    let th = (SQRT_2_OVER_PI * (x + 0.044715 * x * x * x)).tanh();
    0.5 * (1.0 + th) + 0.5 * x * (1.0 - th * th) * SQRT_2_OVER_PI * (1.0 + 3.0 * 0.044715 * x * x)
}

/// Rows of `c` channels; two passes (mean, then variance), biased variance.
pub fn layernorm(
    out: &mut [f32],
    mean: &mut [f32],
    rstd: &mut [f32],
    x: &[f32],
    gamma: &[f32],
    beta: &[f32],
    c: usize,
    eps: f32,
) {
    for (row, x) in x.chunks_exact(c).enumerate() {
        let m = x.iter().sum::<f32>() / c as f32;
        let var = x.iter().map(|v| (v - m) * (v - m)).sum::<f32>() / c as f32;
        let r = 1.0 / (var + eps).sqrt();
        for i in 0..c {
            out[row * c + i] = (x[i] - m) * r * gamma[i] + beta[i];
        }
        mean[row] = m;
        rstd[row] = r;
    }
}

/// `ins` is `[x, gamma, mean, rstd, dout]`; `dx`, `dgamma`, `dbeta` add.
pub fn layernorm_backward(
    dx: &mut [f32],
    dgamma: &mut [f32],
    dbeta: &mut [f32],
    ins: &[Vec<f32>; 5],
    c: usize,
) {
    let [x, gamma, mean, rstd, dout] = ins;
    for row in 0..mean.len() {
        let (x, dout) = (&x[row * c..(row + 1) * c], &dout[row * c..(row + 1) * c]);
        let xhat = |i: usize| (x[i] - mean[row]) * rstd[row];
        let (mut g_mean, mut gx_mean) = (0.0f32, 0.0f32);
        for i in 0..c {
            g_mean += gamma[i] * dout[i];
            gx_mean += gamma[i] * dout[i] * xhat(i);
        }
        g_mean /= c as f32;
        gx_mean /= c as f32;
        for i in 0..c {
            dx[row * c + i] += rstd[row] * (gamma[i] * dout[i] - g_mean - xhat(i) * gx_mean);
            dgamma[i] += dout[i] * xhat(i);
            dbeta[i] += dout[i];
        }
    }
}

pub fn softmax(
    out: &mut [f32],
    x: &[f32],
    d: SoftmaxDims,
    scale: f32,
    causal_offset: Option<usize>,
) {
    let k = d.k_len;
    for r in 0..d.rows {
        let seen = causal_offset.map_or(k, |o| (o + r % d.q_len + 1).min(k));
        let row = &x[r * k..r * k + seen];
        let max = row.iter().fold(f32::NEG_INFINITY, |m, &v| m.max(scale * v));
        let sum: f32 = row.iter().map(|&v| (scale * v - max).exp()).sum();
        for j in 0..seen {
            out[r * k + j] = (scale * row[j] - max).exp() / sum;
        }
    }
}

pub fn softmax_backward(dx: &mut [f32], p: &[f32], dp: &[f32], cols: usize, scale: f32) {
    for r in 0..p.len() / cols {
        let row = r * cols..(r + 1) * cols;
        let dot: f32 = p[row.clone()]
            .iter()
            .zip(&dp[row.clone()])
            .map(|(a, b)| a * b)
            .sum();
        for j in row {
            dx[j] = scale * p[j] * (dp[j] - dot);
        }
    }
}

/// Losses `[n]` and gradient `[n, vp]` from logits `[n, vp]` with `vocab` real columns.
pub fn cross_entropy(
    losses: &mut [f32],
    grad: &mut [f32],
    z: &[f32],
    targets: &[u32],
    vp: usize,
    vocab: usize,
    scale: f32,
) {
    for (row, &t) in targets.iter().enumerate() {
        if t == IGNORE_INDEX {
            continue;
        }
        let z = &z[row * vp..row * vp + vocab];
        let max = z.iter().fold(f32::NEG_INFINITY, |m, &v| m.max(v));
        let sum: f32 = z.iter().map(|&v| (v - max).exp()).sum();
        losses[row] = max + sum.ln() - z[t as usize];
        for j in 0..vocab {
            let onehot = if j == t as usize { 1.0 } else { 0.0 };
            grad[row * vp + j] = scale * ((z[j] - max).exp() / sum - onehot);
        }
    }
}

pub fn adamw(p: &mut [f32], g: &[f32], m: &mut [f32], v: &mut [f32], s: &AdamWStep) {
    let t = s.step.min(i32::MAX as u64) as i32;
    let (c1, c2) = (1.0 - s.beta1.powi(t), 1.0 - s.beta2.powi(t));
    for i in 0..p.len() {
        let g = g[i] * s.grad_scale;
        m[i] = s.beta1 * m[i] + (1.0 - s.beta1) * g;
        v[i] = s.beta2 * v[i] + (1.0 - s.beta2) * g * g;
        let update = (m[i] / c1) / ((v[i] / c2).sqrt() + s.eps);
        p[i] -= s.lr * (s.weight_decay * p[i] + update);
    }
}
