//! Row-wise softmax with scale and causal mask, forward and backward.

/// `out = softmax(scale·x)` row by row for `x, out: [rows, Tk]`, row `r` holding query
/// `i = r % Tq`. With `causal_offset = Some(o)`, query `i` sees only columns
/// `j <= o + i`; masked entries of `out` are 0.
pub fn softmax(
    out: &mut [f64],
    x: &[f64],
    rows: usize,
    q_len: usize,
    k_len: usize,
    scale: f64,
    causal_offset: Option<usize>,
) {
    for r in 0..rows {
        let i = r % q_len;
        let seen = causal_offset.map_or(k_len, |o| (o + i + 1).min(k_len));
        let row = &x[r * k_len..(r + 1) * k_len];
        let max = row[..seen]
            .iter()
            .fold(f64::NEG_INFINITY, |m, &v| m.max(scale * v));
        let sum: f64 = row[..seen].iter().map(|&v| (scale * v - max).exp()).sum();
        for j in 0..k_len {
            out[r * k_len + j] = if j < seen {
                (scale * row[j] - max).exp() / sum
            } else {
                0.0
            };
        }
    }
}

/// Backward of [`softmax`] from its output: `dx = scale·p∘(dp - Σ_j p·dp)` row by row,
/// for `probs, dprobs, dx: [rows, cols]`. Masked entries have `p = 0`, so `dx = 0`.
pub fn softmax_backward(
    dx: &mut [f64],
    probs: &[f64],
    dprobs: &[f64],
    rows: usize,
    cols: usize,
    scale: f64,
) {
    for r in 0..rows {
        let p = &probs[r * cols..(r + 1) * cols];
        let dp = &dprobs[r * cols..(r + 1) * cols];
        let dot: f64 = p.iter().zip(dp).map(|(a, b)| a * b).sum();
        for j in 0..cols {
            dx[r * cols + j] = scale * p[j] * (dp[j] - dot);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::random::Rand;
    use crate::reference::fd;

    #[test]
    fn softmax_backward_matches_finite_differences() {
        let mut r = Rand::new(4);
        // Two heads of 3 queries over 5 keys, causal offset 2, scale 0.7.
        let (rows, tq, tk, scale, off) = (6, 3, 5, 0.7, Some(2));
        let x = fd::values(&mut r, rows * tk, -3.0, 3.0);
        let w = fd::values(&mut r, rows * tk, -1.0, 1.0);
        let forward = |x: &[f64]| {
            let mut p = vec![0.0; rows * tk];
            softmax(&mut p, x, rows, tq, tk, scale, off);
            p
        };
        let p = forward(&x);
        let mut dx = vec![0.0; rows * tk];
        softmax_backward(&mut dx, &p, &w, rows, tk, scale);
        fd::assert_grad(
            "softmax dx",
            &dx,
            &fd::grad(&x, |x| fd::dot(&w, &forward(x))),
        );
    }

    #[test]
    fn causal_mask_by_query_index() {
        // Tq = 2, Tk = 3, offset 1: query 0 sees columns 0..=1, query 1 all three.
        let mut p = [9.0; 12];
        softmax(&mut p, &[0.0; 12], 4, 2, 3, 1.0, Some(1));
        let h = 0.5;
        let t = 1.0 / 3.0;
        let want = [h, h, 0.0, t, t, t, h, h, 0.0, t, t, t];
        assert!(
            p.iter().zip(want).all(|(a, b)| (a - b).abs() < 1e-15),
            "{p:?}"
        );
    }
}
