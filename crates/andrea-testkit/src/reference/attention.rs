//! Causal multi-head self-attention, forward and backward.
//!
//! Operands are dense `[B, T, H, D]` (that is, `[B, T, C]` with `C = H·D`); the suite
//! gathers them from whatever strided views the backend was given.

/// `out = softmax(q·kᵀ/sqrt(D), causal)·v` per batch entry and head, for
/// `q, out: [B, Tq, H, D]` and `k, v: [B, Tk, H, D]`. Query `i` sits at position
/// `pos_offset + i` and sees keys `0..=pos_offset + i` (`Tk = pos_offset + Tq`).
pub fn attention_forward(
    out: &mut [f64],
    q: &[f64],
    k: &[f64],
    v: &[f64],
    (b, tq, tk, h, d): (usize, usize, usize, usize, usize),
    pos_offset: usize,
) {
    let scale = 1.0 / (d as f64).sqrt();
    let at = |t_len: usize, bi: usize, t: usize, hi: usize| ((bi * t_len + t) * h + hi) * d;
    for bi in 0..b {
        for hi in 0..h {
            for i in 0..tq {
                let p = probabilities(q, k, (bi, hi, i), (tq, tk, h, d), pos_offset, scale);
                let o = at(tq, bi, i, hi);
                for e in 0..d {
                    out[o + e] = (0..p.len()).map(|j| p[j] * v[at(tk, bi, j, hi) + e]).sum();
                }
            }
        }
    }
}

/// Attention weights of query `i` of head `hi` in batch entry `bi` over the keys it sees.
fn probabilities(
    q: &[f64],
    k: &[f64],
    (bi, hi, i): (usize, usize, usize),
    (tq, tk, h, d): (usize, usize, usize, usize),
    pos_offset: usize,
    scale: f64,
) -> Vec<f64> {
    let qi = ((bi * tq + i) * h + hi) * d;
    let scores: Vec<f64> = (0..=pos_offset + i)
        .map(|j| {
            let kj = ((bi * tk + j) * h + hi) * d;
            scale * (0..d).map(|e| q[qi + e] * k[kj + e]).sum::<f64>()
        })
        .collect();
    let max = scores.iter().fold(f64::NEG_INFINITY, |m, &s| m.max(s));
    let sum: f64 = scores.iter().map(|s| (s - max).exp()).sum();
    scores.iter().map(|s| (s - max).exp() / sum).collect()
}

/// Backward of [`attention_forward`] in training (`pos_offset = 0`, `Tq = Tk = T`):
/// writes (`=`) `dq, dk, dv: [B, T, H, D]` from `dout: [B, T, H, D]`. Per head, with
/// `P` the attention weights and `s = 1/sqrt(D)`:
///
/// ```text
/// dv_j = Σ_i P_ij·dout_i        dP_ij = dout_i·v_j
/// dS_ij = P_ij·(dP_ij - Σ_l P_il·dP_il)
/// dq_i = s·Σ_j dS_ij·k_j        dk_j = s·Σ_i dS_ij·q_i
/// ```
pub fn attention_backward(
    dq: &mut [f64],
    dk: &mut [f64],
    dv: &mut [f64],
    dout: &[f64],
    q: &[f64],
    k: &[f64],
    v: &[f64],
    (b, t, h, d): (usize, usize, usize, usize),
) {
    let scale = 1.0 / (d as f64).sqrt();
    let at = |bi: usize, ti: usize, hi: usize| ((bi * t + ti) * h + hi) * d;
    for g in [&mut *dq, &mut *dk, &mut *dv] {
        g.fill(0.0);
    }
    for bi in 0..b {
        for hi in 0..h {
            for i in 0..t {
                let p = probabilities(q, k, (bi, hi, i), (t, t, h, d), 0, scale);
                let (qi, oi) = (at(bi, i, hi), at(bi, i, hi));
                let dp: Vec<f64> = (0..=i)
                    .map(|j| (0..d).map(|e| dout[oi + e] * v[at(bi, j, hi) + e]).sum())
                    .collect();
                let dot: f64 = p.iter().zip(&dp).map(|(a, b)| a * b).sum();
                for j in 0..=i {
                    let kj = at(bi, j, hi);
                    let ds = p[j] * (dp[j] - dot);
                    for e in 0..d {
                        dv[kj + e] += p[j] * dout[oi + e];
                        dq[qi + e] += scale * ds * k[kj + e];
                        dk[kj + e] += scale * ds * q[qi + e];
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::random::Rand;
    use crate::reference::fd;

    #[test]
    fn attention_backward_matches_finite_differences() {
        let mut r = Rand::new(7);
        let (b, t, h, d) = (2, 4, 2, 3);
        let n = b * t * h * d;
        let q = fd::values(&mut r, n, -1.0, 1.0);
        let k = fd::values(&mut r, n, -1.0, 1.0);
        let v = fd::values(&mut r, n, -1.0, 1.0);
        let w = fd::values(&mut r, n, -1.0, 1.0);
        let loss = |q: &[f64], k: &[f64], v: &[f64]| {
            let mut out = vec![0.0; n];
            attention_forward(&mut out, q, k, v, (b, t, t, h, d), 0);
            fd::dot(&w, &out)
        };
        let (mut dq, mut dk, mut dv) = (vec![5.0; n], vec![5.0; n], vec![5.0; n]);
        attention_backward(&mut dq, &mut dk, &mut dv, &w, &q, &k, &v, (b, t, h, d));
        fd::assert_grad("dq", &dq, &fd::grad(&q, |x| loss(x, &k, &v)));
        fd::assert_grad("dk", &dk, &fd::grad(&k, |x| loss(&q, x, &v)));
        fd::assert_grad("dv", &dv, &fd::grad(&v, |x| loss(&q, &k, x)));
    }

    /// With a KV cache, the last query of a generation step sees every key: the same
    /// result as the last row of the full training-time attention.
    #[test]
    fn generation_step_equals_last_row_of_full_attention() {
        let mut r = Rand::new(8);
        let (t, h, d) = (5, 2, 4);
        let n = t * h * d;
        let q = fd::values(&mut r, n, -1.0, 1.0);
        let k = fd::values(&mut r, n, -1.0, 1.0);
        let v = fd::values(&mut r, n, -1.0, 1.0);
        let mut full = vec![0.0; n];
        attention_forward(&mut full, &q, &k, &v, (1, t, t, h, d), 0);
        let mut last = vec![0.0; h * d];
        attention_forward(
            &mut last,
            &q[(t - 1) * h * d..],
            &k,
            &v,
            (1, 1, t, h, d),
            t - 1,
        );
        assert!(last
            .iter()
            .zip(&full[(t - 1) * h * d..])
            .all(|(a, b)| (a - b).abs() < 1e-15));
    }
}
