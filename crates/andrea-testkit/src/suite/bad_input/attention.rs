//! Bad input for attention_forward, attention_backward, decode_attention and
//! decode_blocks.

use andrea_core::{
    AttentionShape, Backend, DecodeBlock, Heads, LinearParams, NormOutputs, NormParams, View,
};

use super::{filled, Expect};
use crate::suite::{fail, Case, Config};

/// attention_forward, attention_backward.
pub fn bad_input_attention<B: Backend>(be: &B, _cfg: &Config) -> Case {
    let mut x = Expect::new("bad_input_attention");
    // B 1, T 4, H 2, D 2: qkv [1, 4, 12], out [1, 4, 4].
    let (b, t, h, c) = (1, 4, 2, 4);
    let (qkv_buf, out_buf, dout_buf, dqkv_buf) = (
        filled(be, 48)?,
        filled(be, 16)?,
        filled(be, 16)?,
        filled(be, 48)?,
    );
    let heads = |buf, off, t, width| {
        Heads::from_tensor(View::new(buf, off, [b, t, width]), h)
            .ok_or_else(|| fail("attention: heads"))
    };
    let split = |buf| {
        Heads::split_qkv(View::new(buf, 0, [b, t, 3 * c]), h)
            .ok_or_else(|| fail("attention: heads"))
    };
    let [q, k, v] = split(&qkv_buf)?;
    let [dq, dk, dv] = split(&dqkv_buf)?;
    let (out, dout) = (heads(&out_buf, 0, t, c)?, heads(&dout_buf, 0, t, c)?);
    let shape = AttentionShape {
        batch: b,
        heads: h,
        head_dim: c / h,
        q_len: t,
        k_len: t,
    };
    let (ws_len, sc_len) = (
        be.attention_workspace_len(shape).max(1),
        be.attention_backward_scratch_len(shape).max(1),
    );
    let (ws_buf, sc_buf) = (filled(be, ws_len)?, filled(be, sc_len)?);
    let (ws, sc) = (View::whole(&ws_buf), View::whole(&sc_buf));

    let op = &["attention_forward"];
    x.ok("attention_forward", || {
        be.attention_forward(q, k, v, out, ws, 0)
    });
    x.err(
        op,
        "attention_forward: pos_offset 1 with k.seq = q.seq",
        || be.attention_forward(q, k, v, out, ws, 1),
    );
    x.err(op, "attention_forward: pos_offset usize::MAX", || {
        be.attention_forward(q, k, v, out, ws, usize::MAX)
    });
    x.err(op, "attention_forward: v has 3 positions, k has 4", || {
        be.attention_forward(q, k, v.prefix(3), out, ws, 0)
    });
    x.err(op, "attention_forward: out is q", || {
        be.attention_forward(q, k, v, q, ws, 0)
    });
    let big_ws = filled(be, ws_len.max(b * t * c))?;
    let o_in_ws = heads(&big_ws, 0, t, c)?;
    x.err(op, "attention_forward: out overlaps the workspace", || {
        be.attention_forward(q, k, v, o_in_ws, View::whole(&big_ws), 0)
    });
    x.err(op, "attention_forward: k with 4 heads for 2", || {
        let k4 = Heads {
            heads: 4,
            head_dim: 1,
            head_stride: 1,
            ..k
        };
        be.attention_forward(q, k4, v, out, ws, 0)
    });
    x.err(op, "attention_forward: zero positions", || {
        be.attention_forward(q.prefix(0), k.prefix(0), v.prefix(0), out.prefix(0), ws, 0)
    });
    // Heads apart (a head's positions in one run): a last head past the buffer's end,
    // and heads that share elements in an output, are refused by every backend; a
    // well-formed output so laid out is taken where the backend takes the layout (the
    // CUDA kernels refuse it by name).
    x.err(
        op,
        "attention_forward: k's heads 40 apart, past the buffer end",
        || {
            be.attention_forward(
                q,
                Heads {
                    head_stride: 40,
                    ..k
                },
                v,
                out,
                ws,
                0,
            )
        },
    );
    x.err(
        op,
        "attention_forward: out's heads 1 apart, sharing elements",
        || {
            be.attention_forward(
                q,
                k,
                v,
                Heads {
                    head_stride: 1,
                    ..out
                },
                ws,
                0,
            )
        },
    );
    let apart = Heads {
        seq_stride: 2,
        head_stride: 8,
        ..out
    };
    if be.kv_heads_apart() {
        x.ok("attention_forward: out with heads apart", || {
            be.attention_forward(q, k, v, apart, ws, 0)
        });
    } else {
        x.err(op, "attention_forward: out with heads apart", || {
            be.attention_forward(q, k, v, apart, ws, 0)
        });
    }
    x.err(op, "attention_forward: q past the buffer end", || {
        be.attention_forward(Heads { offset: 9, ..q }, k, v, out, ws, 0)
    });
    if be.attention_workspace_len(shape) > 0 {
        x.err(op, "attention_forward: workspace one float short", || {
            be.attention_forward(q, k, v, out, View::new(&ws_buf, 0, [ws_len - 1]), 0)
        });
    }

    let op = &["attention_backward"];
    let bwd = |dq, dk, ws, sc| be.attention_backward(q, k, v, out, dout, dq, dk, dv, ws, sc);
    x.ok("attention_forward, then attention_backward", || {
        be.attention_forward(q, k, v, out, ws, 0)?;
        bwd(dq, dk, ws, sc)
    });
    x.err(op, "attention_backward: dk is dq", || bwd(dq, dq, ws, sc));
    x.err(op, "attention_backward: dq is q", || bwd(q, dk, ws, sc));
    x.err(op, "attention_backward: dq with 3 positions", || {
        bwd(dq.prefix(3), dk, ws, sc)
    });
    // A backend that asks for no scratch ignores the view it is given.
    if be.attention_backward_scratch_len(shape) > 0 {
        x.err(
            op,
            "attention_backward: scratch overlaps the workspace",
            || bwd(dq, dk, ws, ws),
        );
        x.err(op, "attention_backward: scratch one float short", || {
            bwd(dq, dk, ws, View::new(&sc_buf, 0, [sc_len - 1]))
        });
    }
    decode_attention(be, &mut x)?;
    decode_blocks(be, &mut x)?;
    x.finish()
}

/// decode_attention: one new position of one sequence (C 4, H 2) over a cache of 4
/// positions whose rows hold `[keys | values]`, at position 2.
fn decode_attention<B: Backend>(be: &B, x: &mut Expect) -> Case {
    let ops = &["decode_attention", "matmul", "attention_forward"];
    let (c, h, cap) = (4, 2, 4);
    let (xb, wq, bq, scratch, kv, wp, bp, out) = (
        filled(be, c)?,
        filled(be, c * 3 * c)?,
        filled(be, 3 * c)?,
        filled(be, 64)?,
        filled(be, cap * 2 * c)?,
        filled(be, c * c)?,
        filled(be, c)?,
        filled(be, 2 * c)?,
    );
    let cache = |which: usize, heads: usize, seq: usize| Heads {
        buf: &kv,
        offset: which * c,
        batch: 1,
        seq,
        heads,
        head_dim: c / heads,
        batch_stride: cap * 2 * c,
        seq_stride: 2 * c,
        head_stride: c / heads,
    };
    let lin = |w, rows, cols, b| LinearParams {
        weight: View::new(w, 0, [rows, cols]).mat(),
        bias: View::new(b, 0, [cols]),
    };
    let (qkv, atty, ws) = (
        View::new(&scratch, 0, [3 * c]),
        View::new(&scratch, 12, [c]),
        View::new(&scratch, 16, [48]),
    );
    let run = |xv, keys, values, out_view| {
        be.decode_attention(
            xv,
            lin(&wq, c, 3 * c, &bq),
            qkv,
            keys,
            values,
            atty,
            ws,
            lin(&wp, c, c, &bp),
            out_view,
        )
    };
    let (xv, ov) = (View::new(&xb, 0, [1, c]), View::new(&out, 0, [1, c]));
    x.ok("decode_attention", || {
        run(xv, cache(0, h, 3), cache(1, h, 3), ov)
    });
    x.err(
        ops,
        "decode_attention: x of 4 channels, keys of 3 heads of 1",
        || run(xv, cache(0, 3, 3), cache(1, 3, 3), ov),
    );
    x.err(
        ops,
        "decode_attention: values of another length than keys",
        || run(xv, cache(0, h, 3), cache(1, h, 2), ov),
    );
    x.err(ops, "decode_attention: out [2, 4] for x [1, 4]", || {
        run(
            xv,
            cache(0, h, 3),
            cache(1, h, 3),
            View::new(&out, 0, [2, c]),
        )
    });
    x.err(ops, "decode_attention: out overlapping the cache", || {
        run(
            xv,
            cache(0, h, 3),
            cache(1, h, 3),
            View::new(&kv, 2, [1, c]),
        )
    });
    x.err(ops, "decode_attention: the cache past its buffer", || {
        run(xv, cache(0, h, 5), cache(1, h, 5), ov)
    });
    Ok(())
}

/// decode_blocks: one block (C 4, H 2, M 16) over a cache of 4 positions, as the model
/// lays out generation's views (`residual_3` exactly `residual_2`, `next_out.out` exactly
/// `ln_1`). Valid calls come first and between the bad ones, so a backend that remembers
/// what passed (the CPU's) is asked each bad call after a good one of the same views.
fn decode_blocks<B: Backend>(be: &B, x: &mut Expect) -> Case {
    let ops = &[
        "decode_blocks",
        "decode_attention",
        "matmul",
        "attention_forward",
        "residual_layernorm",
        "layernorm",
        "mlp_forward",
        "linear_gelu",
    ];
    let (c, h, m, cap) = (4, 2, 16, 4);
    let (wq, bq, wp, bp, wf, bf, wm, bm) = (
        filled(be, c * 3 * c)?,
        filled(be, 3 * c)?,
        filled(be, c * c)?,
        filled(be, c)?,
        filled(be, c * m)?,
        filled(be, m)?,
        filled(be, m * c)?,
        filled(be, c)?,
    );
    let (norms, kv, acts, scratch) = (
        filled(be, 4 * c)?,
        filled(be, cap * 2 * c)?,
        filled(be, 4 * c + 4)?,
        filled(be, 3 * c + c + 8 + c + 2 * m)?,
    );
    let cache = |which: usize, seq: usize| Heads {
        buf: &kv,
        offset: which * c,
        batch: 1,
        seq,
        heads: h,
        head_dim: c / h,
        batch_stride: cap * 2 * c,
        seq_stride: 2 * c,
        head_stride: c / h,
    };
    let lin = |w, rows, cols, b| LinearParams {
        weight: View::new(w, 0, [rows, cols]).mat(),
        bias: View::new(b, 0, [cols]),
    };
    let norm = |at: usize| NormParams {
        gamma: View::new(&norms, at, [c]),
        beta: View::new(&norms, at + c, [c]),
    };
    // acts: x, ln_1 (= next_out.out), residual_2 (= residual_3), ln_2_out, 4 stats.
    let row = |i: usize| View::new(&acts, i * c, [1, c]);
    let stat = |i: usize| View::new(&acts, 4 * c + i, [1]);
    // scratch: qkv, atty, workspace (8), proj, fc_pre, fc.
    let at = |off: usize, len: usize| View::new(&scratch, off, [1, len]);
    // Where `proj` is: its own scratch (0), over residual_2 (1), over the cache (2).
    let block = |seq: usize, proj: usize| DecodeBlock {
        x: row(0),
        ln_1: row(1),
        keys: cache(0, seq),
        values: cache(1, seq),
        c_attn: lin(&wq, c, 3 * c, &bq),
        attn_proj: lin(&wp, c, c, &bp),
        ln_2: norm(0),
        c_fc: lin(&wf, c, m, &bf),
        mlp_proj: lin(&wm, m, c, &bm),
        next: norm(2 * c),
        qkv: at(0, 3 * c),
        atty: at(3 * c, c),
        workspace: View::new(&scratch, 4 * c, [8]),
        proj: match proj {
            0 => at(4 * c + 8, c),
            1 => row(2),
            _ => View::new(&kv, 0, [1, c]),
        },
        fc_pre: at(5 * c + 8, m),
        fc: at(5 * c + 8 + m, m),
        residual_2: row(2),
        ln_2_out: NormOutputs {
            out: row(3),
            mean: stat(0),
            rstd: stat(1),
        },
        residual_3: row(2),
        next_out: NormOutputs {
            out: row(1),
            mean: stat(2),
            rstd: stat(3),
        },
    };
    let (proj, eps) = (0, 1e-5);
    x.ok("decode_blocks", || be.decode_blocks(&[block(3, proj)], eps));
    x.err(ops, "decode_blocks: the cache past its buffer", || {
        be.decode_blocks(&[block(5, proj)], eps)
    });
    x.ok("decode_blocks", || be.decode_blocks(&[block(2, proj)], eps));
    x.err(
        ops,
        "decode_blocks: a cache shorter than the new position",
        || be.decode_blocks(&[block(0, proj)], eps),
    );
    x.err(
        ops,
        "decode_blocks: scratch proj overlapping residual_2",
        || be.decode_blocks(&[block(3, 1)], eps),
    );
    x.err(
        ops,
        "decode_blocks: scratch proj overlapping the cache",
        || be.decode_blocks(&[block(3, 2)], eps),
    );
    x.ok("decode_blocks", || {
        be.decode_blocks(&[block(3, proj), block(4, proj)], eps)
    });
    x.err(
        ops,
        "decode_blocks: a good block, then one past the cache",
        || be.decode_blocks(&[block(3, proj), block(5, proj)], eps),
    );
    Ok(())
}
