//! Bounds for attention computed with operands rounded to a narrower format (TF32 or
//! BF16 tensor cores) and FP32 accumulation, per element, from the inputs themselves.
//! The conformance suite adds them to the FP32 tolerances ([`super::attention_out`],
//! [`super::attention_grad`]) when its [`Operands`](crate::suite::Operands) say so, and
//! `andrea-cuda`'s `tests/cpu_vs_cuda.rs` uses them for its own cases.
//!
//! First order in the operand unit roundoff `u` (TF32 2⁻¹¹, BF16 2⁻⁸), per query t and
//! key j (P, dP = dO_t·v_j, D_t = dO_t·out_t and dS = P·(dP - D_t) from the reference):
//!
//! * scores: each product q_d·k_d is off by <= 2u relative, so scale·S is off by
//!   Es_t = 2u·scale·max_j Σ_d |q_td·k_jd|; the softmax turns that into
//!   |ΔP_tj| <= 2·Es_t·P_tj.
//! * out_t = Σ_j P_tj·v_j with P and v rounded again (u each):
//!   |Δout_td| <= (2·Es_t + 2u)·Σ_j P_tj·|v_jd|.
//! * backward: P is recomputed from the saved lse (itself off by Es_t): |ΔP| <= eP =
//!   2.2·Es_t·P; dP is off by Edp = 2u·Σ_d |dO_td·v_jd|, D_t by eD = Σ_d |dO_td|·|Δout_td|,
//!   so |ΔdS| <= edS = eP·|dP - D_t| + P·(Edp + eD); dS and the second operand are rounded
//!   once more (2u): |ΔdV_jd| <= Σ_t (eP + 2u·P)·|dO_td|,
//!   |ΔdK_jd| <= scale·Σ_t (edS + 2u·|dS|)·|q_td|, |ΔdQ_td| <= scale·Σ_j (edS + 2u·|dS|)·|k_jd|.
//!
//! Each bound is doubled for the second-order terms. The FP32 sums come on top (the
//! caller adds the FP32 tolerance). Measured headroom on the emulator, which models the
//! tensor cores' operand rounding lane by lane: worst |diff| / bound 0.06 in
//! `cpu_vs_cuda::attention_mma_*` (last session's note).

/// Sizes `(batch, query positions, key positions, heads, head size)`; queries sit at
/// positions `pos_offset..`, so `k_len = pos_offset + q_len`.
pub type Dims = (usize, usize, usize, usize, usize);

/// Reference probabilities of query `i` (batch `bi`, head `hi`) over keys `0..=pos + i`.
/// q `[B, Tq, H, D]`, k `[B, Tk, H, D]`.
fn probs(dims: Dims, pos: usize, q: &[f64], k: &[f64], bi: usize, hi: usize, i: usize) -> Vec<f64> {
    let (_, tq, tk, h, d) = dims;
    let scale = 1.0 / (d as f64).sqrt();
    let qi = ((bi * tq + i) * h + hi) * d;
    let s: Vec<f64> = (0..=pos + i)
        .map(|j| {
            let kj = ((bi * tk + j) * h + hi) * d;
            scale * (0..d).map(|e| q[qi + e] * k[kj + e]).sum::<f64>()
        })
        .collect();
    let m = s.iter().fold(f64::NEG_INFINITY, |a, &b| a.max(b));
    let z: f64 = s.iter().map(|x| (x - m).exp()).sum();
    s.iter().map(|x| (x - m).exp() / z).collect()
}

/// `Es_t` of every query row, in `(bi, i, hi)` order.
fn score_err(dims: Dims, pos: usize, q: &[f64], k: &[f64], u: f64) -> Vec<f64> {
    let (b, tq, tk, h, d) = dims;
    let scale = 1.0 / (d as f64).sqrt();
    let mut e = vec![0.0; b * tq * h];
    for bi in 0..b {
        for i in 0..tq {
            for hi in 0..h {
                let qi = ((bi * tq + i) * h + hi) * d;
                let mag = (0..=pos + i)
                    .map(|j| {
                        let kj = ((bi * tk + j) * h + hi) * d;
                        (0..d).map(|x| (q[qi + x] * k[kj + x]).abs()).sum::<f64>()
                    })
                    .fold(0.0, f64::max);
                e[(bi * tq + i) * h + hi] = 2.0 * u * scale * mag;
            }
        }
    }
    e
}

/// First-order bound on |Δout| of every element of `[B, Tq, H, D]` (not doubled).
fn out_first_order(dims: Dims, pos: usize, q: &[f64], k: &[f64], v: &[f64], u: f64) -> Vec<f64> {
    let (b, tq, tk, h, d) = dims;
    let es = score_err(dims, pos, q, k, u);
    let mut bound = vec![0.0; b * tq * h * d];
    for bi in 0..b {
        for hi in 0..h {
            for i in 0..tq {
                let p = probs(dims, pos, q, k, bi, hi, i);
                let row = (bi * tq + i) * h + hi;
                for e in 0..d {
                    let pv: f64 = (0..p.len())
                        .map(|j| p[j] * v[((bi * tk + j) * h + hi) * d + e].abs())
                        .sum();
                    bound[row * d + e] = (2.0 * es[row] + 2.0 * u) * pv;
                }
            }
        }
    }
    bound
}

/// The bound on |Δout| of `attention_forward` for operands of unit roundoff `u`, per
/// element of `out: [B, Tq, H, D]` (dense q `[B, Tq, H, D]`, k, v `[B, Tk, H, D]`),
/// doubled; add the FP32 tolerance. All zeros for `u = 0`.
pub fn attention_out(dims: Dims, pos: usize, q: &[f64], k: &[f64], v: &[f64], u: f64) -> Vec<f64> {
    if u == 0.0 {
        return vec![0.0; dims.0 * dims.1 * dims.3 * dims.4];
    }
    let mut b = out_first_order(dims, pos, q, k, v, u);
    b.iter_mut().for_each(|x| *x *= 2.0);
    b
}

/// The bounds on |ΔdQ|, |ΔdK|, |ΔdV| of `attention_backward` (training: `pos_offset = 0`,
/// dense `[B, T, H, D]` inputs and `dout`) for operands of unit roundoff `u`, doubled;
/// add the FP32 tolerance. `(b, t, h, d)` as the reference takes them.
pub fn attention_grads(
    (b, t, h, d): (usize, usize, usize, usize),
    q: &[f64],
    k: &[f64],
    v: &[f64],
    g: &[f64],
    u: f64,
) -> [Vec<f64>; 3] {
    let n = b * t * h * d;
    if u == 0.0 {
        return [vec![0.0; n], vec![0.0; n], vec![0.0; n]];
    }
    let dims = (b, t, t, h, d);
    let mut out = vec![0.0; n];
    crate::reference::attention_forward(&mut out, q, k, v, dims, 0);
    let es = score_err(dims, 0, q, k, u);
    let oerr = out_first_order(dims, 0, q, k, v, u);
    let scale = 1.0 / (d as f64).sqrt();
    let (mut bq, mut bk, mut bv) = (vec![0.0; n], vec![0.0; n], vec![0.0; n]);
    let at = |bi: usize, ti: usize, hi: usize| ((bi * t + ti) * h + hi) * d;
    for bi in 0..b {
        for hi in 0..h {
            for i in 0..t {
                let p = probs(dims, 0, q, k, bi, hi, i);
                let oi = at(bi, i, hi);
                let row = (bi * t + i) * h + hi;
                let dt: f64 = (0..d).map(|e| g[oi + e] * out[oi + e]).sum();
                let ed: f64 = (0..d).map(|e| g[oi + e].abs() * 2.0 * oerr[oi + e]).sum();
                for (j, &pj) in p.iter().enumerate() {
                    let kj = at(bi, j, hi);
                    let dp: f64 = (0..d).map(|e| g[oi + e] * v[kj + e]).sum();
                    let edp: f64 =
                        2.0 * u * (0..d).map(|e| (g[oi + e] * v[kj + e]).abs()).sum::<f64>();
                    let ep = 2.2 * es[row] * pj;
                    let ds = pj * (dp - dt);
                    let eds = ep * (dp - dt).abs() + pj * (edp + ed) + 2.0 * u * ds.abs();
                    for e in 0..d {
                        bv[kj + e] += (ep + 2.0 * u * pj) * g[oi + e].abs();
                        bk[kj + e] += scale * eds * q[oi + e].abs();
                        bq[oi + e] += scale * eds * k[kj + e].abs();
                    }
                }
            }
        }
    }
    for x in [&mut bq, &mut bk, &mut bv] {
        x.iter_mut().for_each(|y| *y *= 2.0);
    }
    [bq, bk, bv]
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Zero for exact operands; positive and growing with u otherwise.
    #[test]
    fn scales_with_the_unit_roundoff() {
        let (b, t, h, d) = (1, 5, 2, 4);
        let n = b * t * h * d;
        let x: Vec<f64> = (0..n).map(|i| ((i * 7 % 11) as f64 - 5.0) / 5.0).collect();
        let y: Vec<f64> = (0..n).map(|i| ((i * 5 % 13) as f64 - 6.0) / 6.0).collect();
        let dims = (b, t, t, h, d);
        assert!(attention_out(dims, 0, &x, &y, &x, 0.0)
            .iter()
            .all(|&e| e == 0.0));
        let lo = attention_out(dims, 0, &x, &y, &x, 1.0 / 2048.0);
        let hi = attention_out(dims, 0, &x, &y, &x, 1.0 / 256.0);
        // (an element is 0 where the value column is all zeros)
        assert!(lo.iter().zip(&hi).all(|(l, h)| *l >= 0.0 && h >= l));
        assert!(
            lo.iter().sum::<f64>() > 0.0
                && hi.iter().sum::<f64>() > 8.0 * lo.iter().sum::<f64>() * 0.9
        );
        let g = attention_grads((b, t, h, d), &x, &y, &x, &y, 1.0 / 256.0);
        assert!(g
            .iter()
            .all(|v| v.iter().all(|&e| e >= 0.0) && v.iter().sum::<f64>() > 0.0));
    }
}
