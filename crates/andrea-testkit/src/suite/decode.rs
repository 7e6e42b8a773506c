//! Generation's fused halves of a block, `decode_attention` and `mlp_forward`, and its
//! decoder stack, `decode_blocks`, against their defaults (`andrea_core::fused`) run on the same backend: compositions of the
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

use andrea_core::{
    fused, AttentionShape, Backend, DecodeBlock, Heads, LinearParams, NormOutputs, NormParams, View,
};
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

/// Keys (`which` 0) or values (1) of a cache of `b` sequences of `cap` positions in one
/// buffer, `seq` of them in view: each position's keys then values, heads side by side,
/// or, with `apart` (where the backend takes it, [`AttentionOps::kv_heads_apart`]), the
/// keys then the values, each sequence's heads one after the other, a head's positions
/// in one run. Both layouts take `2·b·cap·h·d` floats.
fn cache_half<M>(
    buf: &M,
    which: usize,
    (b, cap, seq): (usize, usize, usize),
    (h, d): (usize, usize),
    apart: bool,
) -> Heads<'_, M> {
    let c = h * d;
    let (offset, batch_stride, seq_stride, head_stride) = if apart {
        (which * b * cap * c, cap * c, d, cap * d)
    } else {
        (which * c, cap * 2 * c, 2 * c, d)
    };
    Heads {
        buf,
        offset,
        batch: b,
        seq,
        heads: h,
        head_dim: d,
        batch_stride,
        seq_stride,
        head_stride,
    }
}

/// The attention half over a KV cache whose rows hold `[keys | values]` side by side
/// (the model's layout), or half the cases with heads apart where the backend takes that
/// layout (`cache_half`), against the default on the same backend: `out` and the cache.
pub fn decode_attention<B: Backend>(be: &B, cfg: &Config) -> Case {
    run(
        cfg,
        "decode_attention",
        (decode_case(), any::<bool>()),
        |((b, t, h, d, pos, seed), apart)| {
            let apart = apart && be.kv_heads_apart();
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
                let half = |which: usize| cache_half(&kv, which, (b, cap, pos + t), (h, d), apart);
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

/// The decoder stack: 1-3 blocks, each with its own weights, LayerNorms and `[keys |
/// values]` cache, against the default (each block as its four ops) on the same backend:
/// the last block's output and LayerNorm, and every cache. Half the cases lay the
/// activations out as the model's generation does (two residual slots taken in turn,
/// `residual_3` exactly `residual_2`, one LayerNorm output that each block reads as its
/// `ln_1` and writes as the next one's), half give every view its own memory.
///
/// Tolerance: `mlp_forward`'s `16·4C·u` per block, times 4 for the LayerNorm after it
/// (`γ <= 1.5` over a residual whose spread stays near its inputs' `1/√3`), summed over
/// the blocks; a dropped residual or a block's stale input is off by order one. Half the
/// cases keep the caches with heads apart where the backend takes that (`cache_half`).
pub fn decode_blocks<B: Backend>(be: &B, cfg: &Config) -> Case {
    let case = (decode_case(), 1..=3usize, any::<bool>(), any::<bool>());
    run(
        cfg,
        "decode_blocks",
        case,
        |((b, t, h, d, pos, seed), blocks, shared, apart)| {
            let apart = apart && be.kv_heads_apart();
            let mut r = Rand::new(seed);
            let (n, c) = (b * t, h * d);
            let (m, cap) = (4 * c, pos + t + 2);
            let (sc, sm) = (1.0 / (c as f32).sqrt(), 1.0 / (m as f32).sqrt());
            let eps = 1e-5;
            // Per block: c_attn, attn_proj, ln_2, c_fc, mlp_proj, next (weights, biases,
            // γ, β), and the cache.
            let mut params = Vec::new();
            for _ in 0..blocks {
                let mut p = Vec::new();
                for (rows, cols, s) in [(c, 3 * c, sc), (c, c, sc)] {
                    p.push(r.vec(rows * cols, -s, s));
                    p.push(r.vec(cols, -s, s));
                }
                p.push(r.vec(c, 0.5, 1.5));
                p.push(r.vec(c, -0.5, 0.5));
                for (rows, cols, s) in [(c, m, sc), (m, c, sm)] {
                    p.push(r.vec(rows * cols, -s, s));
                    p.push(r.vec(cols, -s, s));
                }
                p.push(r.vec(c, 0.5, 1.5));
                p.push(r.vec(c, -0.5, 0.5));
                p.push(r.vec(b * cap * 2 * c, -1.0, 1.0));
                params.push(p);
            }
            let (x0, ln0) = (r.vec(n * c, -1.0, 1.0), r.vec(n * c, -1.0, 1.0));
            let shape = AttentionShape {
                batch: b,
                heads: h,
                head_dim: d,
                q_len: t,
                k_len: pos + t,
            };
            let ws_len = be.attention_workspace_len(shape).max(1);
            let zeros = |len: usize| buffer(be, &vec![0.0; len]);
            let mut results = Vec::new();
            for fused_op in [true, false] {
                let mut bufs = Vec::new();
                for p in &params {
                    let mut bb = Vec::new();
                    for v in p {
                        bb.push(buffer(be, v)?);
                    }
                    bufs.push(bb);
                }
                // Activations: per block (x, ln_1, residual_2, ln_2 out/mean/rstd,
                // residual_3, next out/mean/rstd), as buffer indices into `acts`.
                let mut acts = vec![buffer(be, &x0)?];
                let rows = |len: usize| vec![0.0f32; len];
                let mut layout = Vec::new();
                if shared {
                    // 0, 1: the residual slots; 2: the shared LayerNorm output (block 0's
                    // ln_1), 3, 4: its mean and rstd; 5-7: ln_2's outputs.
                    acts.push(zeros(n * c)?);
                    acts.push(buffer(be, &ln0)?);
                    for len in [n, n, n * c, n, n] {
                        acts.push(buffer(be, &rows(len))?);
                    }
                    for l in 0..blocks {
                        let (x, y) = (l % 2, (l + 1) % 2);
                        layout.push([x, 2, y, 5, 6, 7, y, 2, 3, 4]);
                    }
                } else {
                    // Block l's x is the previous block's residual_3, its ln_1 the
                    // previous next_out.out; everything else its own.
                    acts.push(buffer(be, &ln0)?);
                    let (mut x, mut ln) = (0, 1);
                    for _ in 0..blocks {
                        let first = acts.len();
                        for len in [n * c, n * c, n, n, n * c, n * c, n, n] {
                            acts.push(buffer(be, &rows(len))?);
                        }
                        let o = |i: usize| first + i;
                        layout.push([x, ln, o(0), o(1), o(2), o(3), o(4), o(5), o(6), o(7)]);
                        (x, ln) = (o(4), o(5));
                    }
                }
                let scratch = [n * 3 * c, n * c, ws_len, n * c, n * m, n * m].map(&zeros);
                let [qkv, atty, ws, proj, fc_pre, fc] = scratch;
                let (qkv, atty, ws, proj, fc_pre, fc) = (qkv?, atty?, ws?, proj?, fc_pre?, fc?);
                let rows_of = |i: usize| View::new(&acts[i], 0, [n, c]);
                let stats = |i: usize| View::new(&acts[i], 0, [n]);
                let stack: Vec<_> = bufs
                    .iter()
                    .zip(&layout)
                    .map(|(w, a)| {
                        let lin = |i: usize, rows: usize, cols: usize| LinearParams {
                            weight: View::new(&w[i], 0, [rows, cols]).mat(),
                            bias: View::whole(&w[i + 1]),
                        };
                        let norm = |i: usize| NormParams {
                            gamma: View::whole(&w[i]),
                            beta: View::whole(&w[i + 1]),
                        };
                        let half = |which: usize| {
                            cache_half(&w[12], which, (b, cap, pos + t), (h, d), apart)
                        };
                        DecodeBlock {
                            x: rows_of(a[0]),
                            ln_1: rows_of(a[1]),
                            keys: half(0),
                            values: half(1),
                            c_attn: lin(0, c, 3 * c),
                            attn_proj: lin(2, c, c),
                            ln_2: norm(4),
                            c_fc: lin(6, c, m),
                            mlp_proj: lin(8, m, c),
                            next: norm(10),
                            qkv: View::whole(&qkv),
                            atty: View::whole(&atty),
                            workspace: View::whole(&ws),
                            proj: View::new(&proj, 0, [n, c]),
                            fc_pre: View::new(&fc_pre, 0, [n, m]),
                            fc: View::new(&fc, 0, [n, m]),
                            residual_2: rows_of(a[2]),
                            ln_2_out: NormOutputs {
                                out: rows_of(a[3]),
                                mean: stats(a[4]),
                                rstd: stats(a[5]),
                            },
                            residual_3: rows_of(a[6]),
                            next_out: NormOutputs {
                                out: rows_of(a[7]),
                                mean: stats(a[8]),
                                rstd: stats(a[9]),
                            },
                        }
                    })
                    .collect();
                if fused_op {
                    be.decode_blocks(&stack, eps).or_fail("decode_blocks")?;
                } else {
                    fused::decode_blocks(be, &stack, eps).or_fail("fused::decode_blocks")?;
                }
                let last = layout[blocks - 1];
                let mut out = Vec::new();
                for i in [last[6], last[7], last[8], last[9]] {
                    out.push(read_all(be, &acts[i])?);
                }
                for w in &bufs {
                    out.push(read_all(be, &w[12])?);
                }
                results.push(out);
            }
            let tol = tol(4 * m * blocks, cfg);
            let names = [
                "residual_3",
                "next_out.out",
                "next_out.mean",
                "next_out.rstd",
            ];
            for (i, (got, want)) in results[0].iter().zip(&results[1]).enumerate() {
                let what = names.get(i).copied().unwrap_or("a cache");
                close(tol, &format!("decode_blocks: {what}"), got, &to_f64(want))?;
            }
            Ok(())
        },
    )
}
