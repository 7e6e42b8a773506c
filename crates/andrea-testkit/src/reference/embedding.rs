//! Token + position embedding, forward and backward (scatter-add).

/// `out[b, t] = wte[ids[b·T + t]] + wpe[pos_offset + t]` for `out: [B, T, C]`,
/// `ids: [B·T]`, `wte: [V, C]`, `wpe: [T_ctx, C]`.
pub fn embedding(
    out: &mut [f64],
    ids: &[u32],
    wte: &[f64],
    wpe: &[f64],
    b: usize,
    t: usize,
    c: usize,
    pos_offset: usize,
) {
    for bt in 0..b * t {
        let tok = ids[bt] as usize;
        let pos = pos_offset + bt % t;
        for i in 0..c {
            out[bt * c + i] = wte[tok * c + i] + wpe[pos * c + i];
        }
    }
}

/// Backward of [`embedding`] with positions from 0: `dwte[ids[n]] += dout[n]`,
/// `dwpe[t] += Σ_b dout[b, t]`, for `dout: [B, T, C]`, `dwte: [V, C]`, `dwpe: [T_ctx, C]`.
pub fn embedding_backward(
    dwte: &mut [f64],
    dwpe: &mut [f64],
    dout: &[f64],
    ids: &[u32],
    b: usize,
    t: usize,
    c: usize,
) {
    for bt in 0..b * t {
        let tok = ids[bt] as usize;
        let pos = bt % t;
        for i in 0..c {
            dwte[tok * c + i] += dout[bt * c + i];
            dwpe[pos * c + i] += dout[bt * c + i];
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::random::Rand;
    use crate::reference::fd;

    #[test]
    fn embedding_backward_matches_finite_differences() {
        let mut r = Rand::new(5);
        let (b, t, c, v, ctx) = (2, 3, 4, 3, 5);
        let ids = [2, 0, 2, 2, 1, 0]; // repeated tokens: the scatter must add
        let wte = fd::values(&mut r, v * c, -1.0, 1.0);
        let wpe = fd::values(&mut r, ctx * c, -1.0, 1.0);
        let w = fd::values(&mut r, b * t * c, -1.0, 1.0);
        let loss = |wte: &[f64], wpe: &[f64]| {
            let mut out = vec![0.0; b * t * c];
            embedding(&mut out, &ids, wte, wpe, b, t, c, 0);
            fd::dot(&w, &out)
        };
        let (mut dwte, mut dwpe) = (vec![0.0; v * c], vec![0.0; ctx * c]);
        embedding_backward(&mut dwte, &mut dwpe, &w, &ids, b, t, c);
        fd::assert_grad("dwte", &dwte, &fd::grad(&wte, |e| loss(e, &wpe)));
        fd::assert_grad("dwpe", &dwpe, &fd::grad(&wpe, |p| loss(&wte, p)));
    }

    #[test]
    fn position_offset() {
        // One token at position 2: wte[1] + wpe[2].
        let mut out = [0.0; 1];
        embedding(&mut out, &[1], &[10.0, 20.0], &[1.0, 2.0, 3.0], 1, 1, 1, 2);
        assert_eq!(out, [23.0]);
    }
}
