//! Generation's fused halves of a block, `decode_attention` and `mlp_forward`, against
//! their defaults (`andrea_core::fused`) run on the same backend: compositions of the
//! fine ops (matmul, copy, attention, GELU), each of which the suite checks against its
//! float64 reference. Batch 1 and one new position most of the time (the shape a
//! backend fuses), sometimes two of each (where it may fall back to the default).
//!
//! Operands: `x` in [-1, 1], weights and biases in [-1, 1]/√K (outputs of order one, as
//! in a trained model). Tolerance, elementwise `abs + rel·|ref|` with both `16·C·u`:
//! the two sides add the same products in other orders (a projection cut by heads or
//! hidden bands instead of row chunks), an error of at most a few `K·u·Σ|terms|` with
//! `K <= 4C` terms of order `1/√C` each, carried through a softmax whose
//! scores stay of order one. A wrong head, band, bias or cache row is off by the
//! values' own size (~0.1-1).

use andrea_core::{fused, AttentionShape, Backend, Heads, LinearParams, View};
use proptest::prelude::*;

use super::{buffer, close, read_all, run, to_f64, Case, Config, OrFail};
use crate::random::Rand;
use crate::Tol;

/// `(batch, new positions, heads, head size, cached positions, seed)`.
fn decode_case() -> impl Strategy<Value = (usize, usize, usize, usize, usize, u64)> {
    (
        prop_oneof![4 => Just(1usize), 1 => Just(2usize)],
        prop_oneof![4 => Just(1usize), 1 => Just(2usize)],
        1..=4usize,
        prop_oneof![Just(8usize), Just(16), Just(32), Just(40)],
        prop_oneof![1 => Just(0usize), 3 => 1..=40usize],
        any::<u64>(),
    )
}

/// `16·K·u`, `u` f32's unit roundoff plus any of the backend's operand rounding.
fn tol(k: usize, cfg: &Config) -> Tol {
    let u = f64::from(f32::EPSILON) / 2.0 + cfg.operands.unit_roundoff();
    let t = 16.0 * k as f64 * u;
    Tol::new(t, t)
}

/// `out = GELU(x·W_fc + b_fc)·W_proj + b_proj`, against the default on the same backend.
pub fn mlp_forward<B: Backend>(be: &B, cfg: &Config) -> Case {
    run(
        cfg,
        "mlp_forward",
        decode_case(),
        |(b, t, h, d, _, seed)| {
            let mut r = Rand::new(seed);
            let (n, c) = (b * t, h * d);
            let m = 4 * c;
            let (sc, sm) = (1.0 / (c as f32).sqrt(), 1.0 / (m as f32).sqrt());
            let x = r.vec(n * c, -1.0, 1.0);
            let (w1, b1) = (r.vec(c * m, -sc, sc), r.vec(m, -sc, sc));
            let (w2, b2) = (r.vec(m * c, -sm, sm), r.vec(c, -sm, sm));
            let bufs = [&x, &w1, &b1, &w2, &b2].map(|v| buffer(be, v));
            let [xb, w1b, b1b, w2b, b2b] = bufs;
            let (xb, w1b, b1b, w2b, b2b) = (xb?, w1b?, b1b?, w2b?, b2b?);
            let mut outs = Vec::new();
            for fused_op in [true, false] {
                let (pre, act, out) = (
                    buffer(be, &vec![0.0; n * m])?,
                    buffer(be, &vec![0.0; n * m])?,
                    buffer(be, &vec![0.0; n * c])?,
                );
                let fc = LinearParams {
                    weight: View::new(&w1b, 0, [c, m]).mat(),
                    bias: View::whole(&b1b),
                };
                let proj = LinearParams {
                    weight: View::new(&w2b, 0, [m, c]).mat(),
                    bias: View::whole(&b2b),
                };
                let xv = View::new(&xb, 0, [n, c]);
                let (pv, av, ov) = (
                    View::new(&pre, 0, [n, m]),
                    View::new(&act, 0, [n, m]),
                    View::new(&out, 0, [n, c]),
                );
                if fused_op {
                    be.mlp_forward(xv, fc, pv, av, proj, ov)
                        .or_fail("mlp_forward")?;
                } else {
                    fused::mlp_forward(be, xv, fc, pv, av, proj, ov)
                        .or_fail("fused::mlp_forward")?;
                }
                outs.push(read_all(be, &out)?);
            }
            close(tol(m, cfg), "mlp_forward: out", &outs[0], &to_f64(&outs[1]))
        },
    )
}

/// The attention half over a KV cache whose rows hold `[keys | values]` side by side
/// (the model's layout), against the default on the same backend: `out` and the cache.
pub fn decode_attention<B: Backend>(be: &B, cfg: &Config) -> Case {
    run(
        cfg,
        "decode_attention",
        decode_case(),
        |(b, t, h, d, pos, seed)| {
            let mut r = Rand::new(seed);
            let (n, c) = (b * t, h * d);
            let (cap, sc) = (pos + t + 2, 1.0 / (c as f32).sqrt());
            let x = r.vec(n * c, -1.0, 1.0);
            let (wq, bq) = (r.vec(c * 3 * c, -sc, sc), r.vec(3 * c, -sc, sc));
            let (wp, bp) = (r.vec(c * c, -sc, sc), r.vec(c, -sc, sc));
            // Cached keys and values for positions 0..pos; the rest to be written.
            let cache = r.vec(b * cap * 2 * c, -1.0, 1.0);
            let bufs = [&x, &wq, &bq, &wp, &bp].map(|v| buffer(be, v));
            let [xb, wqb, bqb, wpb, bpb] = bufs;
            let (xb, wqb, bqb, wpb, bpb) = (xb?, wqb?, bqb?, wpb?, bpb?);
            let shape = AttentionShape {
                batch: b,
                heads: h,
                head_dim: d,
                q_len: t,
                k_len: pos + t,
            };
            let ws_len = be.attention_workspace_len(shape).max(1);
            let mut results = Vec::new();
            for fused_op in [true, false] {
                let kv = buffer(be, &cache)?;
                let (qkv, atty, ws, out) = (
                    buffer(be, &vec![0.0; n * 3 * c])?,
                    buffer(be, &vec![0.0; n * c])?,
                    buffer(be, &vec![0.0; ws_len])?,
                    buffer(be, &vec![0.0; n * c])?,
                );
                let half = |which: usize| Heads {
                    buf: &kv,
                    offset: which * c,
                    batch: b,
                    seq: pos + t,
                    heads: h,
                    head_dim: d,
                    batch_stride: cap * 2 * c,
                    seq_stride: 2 * c,
                };
                let qkv_w = LinearParams {
                    weight: View::new(&wqb, 0, [c, 3 * c]).mat(),
                    bias: View::whole(&bqb),
                };
                let proj = LinearParams {
                    weight: View::new(&wpb, 0, [c, c]).mat(),
                    bias: View::whole(&bpb),
                };
                let xv = View::new(&xb, 0, [n, c]);
                let (qv, av, wv, ov) = (
                    View::whole(&qkv),
                    View::whole(&atty),
                    View::whole(&ws),
                    View::new(&out, 0, [n, c]),
                );
                let (k, v) = (half(0), half(1));
                if fused_op {
                    be.decode_attention(xv, qkv_w, qv, k, v, av, wv, proj, ov)
                        .or_fail("decode_attention")?;
                } else {
                    fused::decode_attention(be, xv, qkv_w, qv, k, v, av, wv, proj, ov)
                        .or_fail("fused::decode_attention")?;
                }
                results.push((read_all(be, &out)?, read_all(be, &kv)?));
            }
            let tol = tol(c, cfg);
            close(
                tol,
                "decode_attention: out",
                &results[0].0,
                &to_f64(&results[1].0),
            )?;
            close(
                tol,
                "decode_attention: cache",
                &results[0].1,
                &to_f64(&results[1].1),
            )
        },
    )
}
