//! The CPU backend's fused attention against the default composition of fine ops
//! (`andrea_core::fused`), which the conformance suite checks against the f64
//! reference. Tolerance `abs 2e-5 + rel 2e-4·|ref|`: both are f32 with different
//! summation orders over at most T·D = 4096 products of O(1) values.

use andrea_core::{fused, AttentionShape, Backend, Heads, View};
use andrea_cpu::CpuBackend;

fn values(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            ((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        })
        .collect()
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
