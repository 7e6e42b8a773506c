//! The CPU backend's fused attention against the default composition of fine ops
//! (`andrea_core::fused`), which the conformance suite checks against the f64
//! reference. Tolerance `abs 2e-5 + rel 2e-4·|ref|`: both are f32 with different
//! summation orders over at most T·D = 4096 products of O(1) values.

use andrea_core::prelude::*;
use andrea_core::{fused, AttentionShape, Heads, View};
use andrea_cpu::CpuBackend;

fn values(n: usize, seed: u64) -> Vec<f32> {
    andrea_testkit::random::Rand::new(seed).vec(n, -1.0, 1.0)
}

fn close(name: &str, got: &[f32], want: &[f32]) {
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        let bound = 2e-5 + 2e-4 * w.abs();
        assert!(
            (g - w).abs() <= bound,
            "{name}[{i}]: fused {g}, default {w}, bound {bound}"
        );
    }
}

fn run(batch: usize, t: usize, heads: usize, hd: usize) {
    let be = CpuBackend::new();
    let c = heads * hd;
    let up = |data: &[f32]| {
        let b = be.alloc(data.len()).unwrap();
        be.upload(data, View::whole(&b)).unwrap();
        b
    };
    let down = |b: &andrea_cpu::CpuBuffer| {
        let mut v = vec![0.0; andrea_core::DeviceMemory::len(b)];
        be.download(View::whole(b), &mut v).unwrap();
        v
    };
    let qkv = up(&values(batch * t * 3 * c, 1));
    let dout_b = up(&values(batch * t * c, 2));
    let shape = AttentionShape {
        batch,
        heads,
        head_dim: hd,
        q_len: t,
        k_len: t,
    };
    let [q, k, v] = Heads::split_qkv(View::new(&qkv, 0, [batch, t, 3 * c]), heads).unwrap();
    let dout = Heads::from_tensor(View::new(&dout_b, 0, [batch, t, c]), heads).unwrap();

    let mut results = Vec::new();
    for use_fused in [true, false] {
        let out_b = be.alloc(batch * t * c).unwrap();
        let dqkv_b = be.alloc(batch * t * 3 * c).unwrap();
        let ws_len = if use_fused {
            be.attention_workspace_len(shape)
        } else {
            fused::default_attention_workspace_len(shape)
        };
        let ws = be.alloc(ws_len).unwrap();
        let scratch = be.alloc(heads * t * t).unwrap();
        let out = Heads::from_tensor(View::new(&out_b, 0, [batch, t, c]), heads).unwrap();
        let [dq, dk, dv] =
            Heads::split_qkv(View::new(&dqkv_b, 0, [batch, t, 3 * c]), heads).unwrap();
        let (wsv, sv) = (View::whole(&ws), View::whole(&scratch));
        if use_fused {
            be.attention_forward(q, k, v, out, wsv, 0).unwrap();
            be.attention_backward(q, k, v, out, dout, dq, dk, dv, wsv, sv)
                .unwrap();
        } else {
            fused::attention_forward(&be, q, k, v, out, wsv, 0).unwrap();
            fused::attention_backward(&be, q, k, v, out, dout, dq, dk, dv, wsv, sv).unwrap();
        }
        results.push((down(&out_b), down(&dqkv_b)));
    }
    close("out", &results[0].0, &results[1].0);
    close("dqkv", &results[0].1, &results[1].1);
}

#[test]
fn fused_attention_equals_the_default_composition() {
    run(1, 1, 1, 1);
    run(2, 5, 3, 4);
    run(2, 33, 2, 16);
    run(1, 64, 4, 64);
    // Several query blocks of the CPU kernel, the last one ragged.
    run(2, 150, 2, 8);
}

#[test]
fn fused_generation_attention_equals_the_default_composition() {
    // Queries at positions 7..10 over a cache of 10 keys.
    let be = CpuBackend::new();
    let (batch, heads, hd, past, tq) = (2, 3, 8, 7, 3);
    let (c, tk) = (heads * hd, past + tq);
    let q_b = be.alloc(batch * tq * c).unwrap();
    be.upload(&values(batch * tq * c, 3), View::whole(&q_b))
        .unwrap();
    let kv_b = be.alloc(2 * batch * tk * c).unwrap();
    be.upload(&values(2 * batch * tk * c, 4), View::whole(&kv_b))
        .unwrap();
    let q = Heads::from_tensor(View::new(&q_b, 0, [batch, tq, c]), heads).unwrap();
    let k = Heads::from_tensor(View::new(&kv_b, 0, [batch, tk, c]), heads).unwrap();
    let v = Heads::from_tensor(View::new(&kv_b, batch * tk * c, [batch, tk, c]), heads).unwrap();
    let shape = AttentionShape {
        batch,
        heads,
        head_dim: hd,
        q_len: tq,
        k_len: tk,
    };
    let mut outs = Vec::new();
    for use_fused in [true, false] {
        let o_b = be.alloc(batch * tq * c).unwrap();
        let o = Heads::from_tensor(View::new(&o_b, 0, [batch, tq, c]), heads).unwrap();
        let ws = be
            .alloc(fused::default_attention_workspace_len(shape))
            .unwrap();
        if use_fused {
            be.attention_forward(q, k, v, o, View::whole(&ws), past)
                .unwrap();
        } else {
            fused::attention_forward(&be, q, k, v, o, View::whole(&ws), past).unwrap();
        }
        let mut h = vec![0.0; batch * tq * c];
        be.download(View::whole(&o_b), &mut h).unwrap();
        outs.push(h);
    }
    close("out", &outs[0], &outs[1]);
}

/// Runs `residual_layernorm` with `residual` in separate memory, aliasing `a`, aliasing
/// `b`, and all three one view, against `add` + `layernorm`.
#[test]
fn fused_residual_layernorm_equals_add_then_layernorm_in_every_aliasing() {
    let be = CpuBackend::new();
    let (n, c) = (37, 70);
    let up = |data: &[f32]| {
        let b = be.alloc(data.len()).unwrap();
        be.upload(data, View::whole(&b)).unwrap();
        b
    };
    let (a0, b0) = (values(n * c, 5), values(n * c, 6));
    let (gamma, beta) = (up(&values(c, 7)), up(&values(c, 8)));
    let (g, bt) = (View::whole(&gamma), View::whole(&beta));
    for case in 0..4 {
        let (a, b, sep) = (
            up(&a0),
            up(&if case == 3 { a0.clone() } else { b0.clone() }),
            be.alloc(n * c).unwrap(),
        );
        let (av, bv) = (View::new(&a, 0, [n, c]), View::new(&b, 0, [n, c]));
        let res = match case {
            0 => View::new(&sep, 0, [n, c]),
            1 | 3 => av,
            _ => bv,
        };
        let bv = if case == 3 { av } else { bv };
        let (out, mean, rstd) = (
            be.alloc(n * c).unwrap(),
            be.alloc(n).unwrap(),
            be.alloc(n).unwrap(),
        );
        be.residual_layernorm(
            av,
            bv,
            res,
            g,
            bt,
            View::new(&out, 0, [n, c]),
            View::whole(&mean),
            View::whole(&rstd),
            1e-5,
        )
        .unwrap();
        // Reference: the default composition on fresh copies.
        let (ra, rb, rres) = (
            up(&a0),
            up(&if case == 3 { a0.clone() } else { b0.clone() }),
            be.alloc(n * c).unwrap(),
        );
        let (rout, rm, rr) = (
            be.alloc(n * c).unwrap(),
            be.alloc(n).unwrap(),
            be.alloc(n).unwrap(),
        );
        fused::residual_layernorm(
            &be,
            View::new(&ra, 0, [n, c]),
            View::new(&rb, 0, [n, c]),
            View::new(&rres, 0, [n, c]),
            g,
            bt,
            View::new(&rout, 0, [n, c]),
            View::whole(&rm),
            View::whole(&rr),
            1e-5,
        )
        .unwrap();
        let get = |t: View<'_, andrea_cpu::CpuBuffer>| {
            let mut h = vec![0.0; t.numel()];
            be.download(t, &mut h).unwrap();
            h
        };
        assert_eq!(
            get(res),
            get(View::new(&rres, 0, [n, c])),
            "residual, case {case}"
        );
        close("out", &get(View::whole(&out)), &get(View::whole(&rout)));
    }
}

#[test]
fn fused_linear_gelu_equals_matmul_then_gelu() {
    let be = CpuBackend::new();
    for (m, k, n) in [(1, 1, 1), (5, 7, 33), (130, 64, 300)] {
        let up = |data: &[f32]| {
            let b = be.alloc(data.len()).unwrap();
            be.upload(data, View::whole(&b)).unwrap();
            b
        };
        let (x, w, bias) = (
            up(&values(m * k, 1)),
            up(&values(k * n, 2)),
            up(&values(n, 3)),
        );
        let mut got = Vec::new();
        for use_fused in [true, false] {
            let (pre, out) = (be.alloc(m * n).unwrap(), be.alloc(m * n).unwrap());
            let args = (
                View::new(&x, 0, [m, k]).mat(),
                View::new(&w, 0, [k, n]).mat(),
                View::whole(&bias),
                View::new(&pre, 0, [m, n]),
                View::new(&out, 0, [m, n]),
            );
            if use_fused {
                be.linear_gelu(args.0, args.1, args.2, args.3, args.4)
                    .unwrap();
            } else {
                fused::linear_gelu(&be, args.0, args.1, args.2, args.3, args.4).unwrap();
            }
            let mut h = vec![0.0; 2 * m * n];
            be.download(View::whole(&pre), &mut h[..m * n]).unwrap();
            be.download(View::whole(&out), &mut h[m * n..]).unwrap();
            got.push(h);
        }
        // Same GEMM and the same GELU code: bit-identical.
        assert_eq!(got[0], got[1], "{m}x{k}x{n}");
    }
}

/// The MLP's backward through the GELU, fused (one pass, the GELU' of each GEMM block
/// while it is in cache) against the default (matmul, then gelu_backward in place), with
/// `w` transposed as the model passes it; 2 rows take the GEMV path, the others the
/// blocked GEMM.
#[test]
fn fused_matmul_gelu_backward_equals_matmul_then_gelu_backward() {
    let be = CpuBackend::new();
    for (m, k, n) in [(1, 1, 1), (2, 40, 70), (5, 7, 33), (130, 64, 300)] {
        let up = |data: &[f32]| {
            let b = be.alloc(data.len()).unwrap();
            be.upload(data, View::whole(&b)).unwrap();
            b
        };
        let pre_vals: Vec<f32> = values(m * n, 6).iter().map(|v| 4.0 * v).collect();
        let (dy, w, pre) = (up(&values(m * k, 4)), up(&values(n * k, 5)), up(&pre_vals));
        let mut got = Vec::new();
        for use_fused in [true, false] {
            let dpre = be.alloc(m * n).unwrap();
            let args = (
                View::new(&dy, 0, [m, k]).mat(),
                View::new(&w, 0, [n, k]).mat().t(),
                View::new(&pre, 0, [m, n]),
                View::new(&dpre, 0, [m, n]),
            );
            if use_fused {
                be.matmul_gelu_backward(args.0, args.1, args.2, args.3)
                    .unwrap();
            } else {
                fused::matmul_gelu_backward(&be, args.0, args.1, args.2, args.3).unwrap();
            }
            let mut h = vec![0.0; m * n];
            be.download(View::whole(&dpre), &mut h).unwrap();
            got.push(h);
        }
        // Same GEMM and the same GELU' code: bit-identical.
        assert_eq!(got[0], got[1], "{m}x{k}x{n}");
    }
}
