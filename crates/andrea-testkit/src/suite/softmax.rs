//! softmax and softmax_backward over `[.., Tq, Tk]` (rank 1 to 4), with a scale in
//! [0.05, 3], an optional causal mask at any valid offset, and in place or not. Scores
//! in [-5, 5], `dprobs` in [-1, 1].

use andrea_core::Backend;
use proptest::prelude::*;

use super::linalg::poison;
use super::{buffer, close, read_all, run, size, size_or_big, to_f64, view, Case, Config, OrFail};
use crate::random::Rand;
use crate::{reference, tol, Tol};

#[derive(Debug, Clone)]
struct SoftmaxCase {
    dims: Vec<usize>,
    scale: f32,
    causal_offset: Option<usize>,
    in_place: bool,
    offset: usize,
    seed: u64,
}

impl SoftmaxCase {
    fn sizes(&self) -> (usize, usize, usize) {
        let d = &self.dims;
        let k = d[d.len() - 1];
        let q = if d.len() >= 2 { d[d.len() - 2] } else { 1 };
        (d.iter().product::<usize>() / k, q, k)
    }
}

fn softmax_case() -> impl Strategy<Value = SoftmaxCase> {
    let lead = prop::collection::vec(size(3), 0..=2);
    let qk = prop_oneof![
        size_or_big(40, 300).prop_map(|k| vec![k]),
        (size(16), size_or_big(40, 300)).prop_map(|(q, k)| vec![q, k])
    ];
    let flags = (any::<bool>(), 0.0f64..1.0, any::<bool>());
    (lead, qk, 0.05f32..3.0, flags, 0..3usize, any::<u64>()).prop_map(
        |(mut dims, qk, scale, (causal, frac, in_place), offset, seed)| {
            dims.extend(qk);
            let mut cs = SoftmaxCase {
                dims,
                scale,
                causal_offset: None,
                in_place,
                offset,
                seed,
            };
            let (_, q, k) = cs.sizes();
            // Any offset that leaves the last query a key: 0..=k-q.
            if causal && q <= k {
                cs.causal_offset = Some(((frac * (k - q + 1) as f64) as usize).min(k - q));
            }
            cs
        },
    )
}

/// Row-wise `softmax(scale·x)` with an optional causal mask; masked entries must be
/// exactly 0.
pub fn softmax<B: Backend>(be: &B, cfg: &Config) -> Case {
    run(cfg, "softmax", softmax_case(), |cs| {
        let mut r = Rand::new(cs.seed);
        let ((rows, q, k), off) = (cs.sizes(), cs.offset);
        let x = r.vec(rows * k + 2 * off, -5.0, 5.0);
        let out = poison(&mut r, rows * k + 2 * off);
        let (x_buf, o_buf) = (buffer(be, &x)?, buffer(be, &out)?);
        let xv = view(&x_buf, off, &cs.dims);
        let (ov, written, before) = if cs.in_place {
            (xv, &x_buf, &x)
        } else {
            (view(&o_buf, off, &cs.dims), &o_buf, &out)
        };
        be.softmax(xv, ov, cs.scale, cs.causal_offset)
            .or_fail("softmax")?;

        let mut want = to_f64(before);
        let x64 = to_f64(&x[off..off + rows * k]);
        let scale = cs.scale as f64;
        reference::softmax(
            &mut want[off..off + rows * k],
            &x64,
            rows,
            q,
            k,
            scale,
            cs.causal_offset,
        );
        let got = read_all(be, written)?;
        close(tol::softmax(k), "softmax: out", &got, &want)?;
        if let Some(o) = cs.causal_offset {
            let masked: Vec<f32> = (0..rows * k)
                .filter(|&e| e % k > o + (e / k) % q)
                .map(|e| got[off + e])
                .collect();
            close(
                Tol::EXACT,
                "softmax: masked entries",
                &masked,
                &vec![0.0; masked.len()],
            )?;
        }
        Ok(())
    })
}

/// `dx = scale·p∘(dp - Σ p·dp)` from (possibly causally masked) probabilities, with
/// `dx` separate or exactly `dprobs`.
pub fn softmax_backward<B: Backend>(be: &B, cfg: &Config) -> Case {
    run(cfg, "softmax_backward", softmax_case(), |cs| {
        let mut r = Rand::new(cs.seed);
        let ((rows, q, k), off) = (cs.sizes(), cs.offset);
        let x = to_f64(&r.vec(rows * k, -5.0, 5.0));
        let mut p64 = vec![0.0; rows * k];
        reference::softmax(&mut p64, &x, rows, q, k, cs.scale as f64, cs.causal_offset);
        let mut probs = r.vec(off, 0.0, 1.0);
        probs.extend(p64.iter().map(|&p| p as f32));
        probs.extend(r.vec(off, 0.0, 1.0));
        let dprobs = r.vec(rows * k + 2 * off, -1.0, 1.0);
        let dx = poison(&mut r, rows * k + 2 * off);
        let (p_buf, dp_buf, dx_buf) = (buffer(be, &probs)?, buffer(be, &dprobs)?, buffer(be, &dx)?);
        let (pv, dpv) = (view(&p_buf, off, &cs.dims), view(&dp_buf, off, &cs.dims));
        let (dxv, written, before) = if cs.in_place {
            (dpv, &dp_buf, &dprobs)
        } else {
            (view(&dx_buf, off, &cs.dims), &dx_buf, &dx)
        };
        be.softmax_backward(pv, dpv, dxv, cs.scale)
            .or_fail("softmax_backward")?;

        let mut want = to_f64(before);
        let (p, dp) = (
            to_f64(&probs[off..off + rows * k]),
            to_f64(&dprobs[off..off + rows * k]),
        );
        reference::softmax_backward(
            &mut want[off..off + rows * k],
            &p,
            &dp,
            rows,
            k,
            cs.scale as f64,
        );
        close(
            tol::softmax_backward(k),
            "softmax_backward: dx",
            &read_all(be, written)?,
            &want,
        )
    })
}
