//! Bit-identical results for any thread count: the CPU backend cuts work by sizes only.

use andrea_core::prelude::*;
use andrea_core::{AdamWStep, DeviceMemory, Heads, View};
use andrea_cpu::{CpuBackend, CpuBuffer};

fn values(n: usize, seed: u64) -> Vec<f32> {
    andrea_testkit::random::Rand::new(seed).vec(n, -1.0, 1.0)
}

/// Runs a little of everything and returns every output's bits.
fn everything(be: &CpuBackend) -> Vec<u32> {
    let (b, t, h, hd, v) = (2, 48, 3, 16, 300);
    let c = h * hd;
    let n = b * t;
    let up = |data: &[f32]| {
        let buf = be.alloc(data.len()).unwrap();
        be.upload(data, View::whole(&buf)).unwrap();
        buf
    };
    let mut outs: Vec<CpuBuffer> = Vec::new();
    // GEMMs of several shapes, including a wide one split by columns.
    // (1, 256, 300) and (3, 300, 256): the few-rows path, split over threads.
    for (m, k, nn) in [
        (n, c, 3 * c),
        (1, c, v),
        (c, n, 4 * c),
        (37, 129, 65),
        (1, 256, 300),
        (3, 300, 256),
    ] {
        let a = up(&values(m * k, 1));
        let w = up(&values(k * nn, 2));
        let o = be.alloc(m * nn).unwrap();
        be.matmul(
            View::new(&a, 0, [m, k]).mat(),
            View::new(&w, 0, [k, nn]).mat(),
            None,
            View::new(&o, 0, [m, nn]).mat(),
        )
        .unwrap();
        outs.push(o);
    }
    // x·wᵀ with two rows: the few-rows path's dot-product form (the tied output layer).
    {
        let (m, k, nn) = (2, 320, 300);
        let a = up(&values(m * k, 8));
        let w = up(&values(nn * k, 9));
        let o = be.alloc(m * nn).unwrap();
        be.matmul(
            View::new(&a, 0, [m, k]).mat(),
            View::new(&w, 0, [nn, k]).mat().t(),
            None,
            View::new(&o, 0, [m, nn]).mat(),
        )
        .unwrap();
        outs.push(o);
    }
    // The fused products (bias + GELU, GELU backward) with `k` past one packed slice of
    // the AVX-512 kernel (384), whose bias and epilogues run per thread and block.
    {
        let (m, k, nn) = (100, 400, 70);
        let xa = up(&values(m * k, 11));
        let w = up(&values(k * nn, 12));
        let bias = up(&values(nn, 13));
        let (pre, out) = (be.alloc(m * nn).unwrap(), be.alloc(m * nn).unwrap());
        be.linear_gelu(
            View::new(&xa, 0, [m, k]).mat(),
            View::new(&w, 0, [k, nn]).mat(),
            View::whole(&bias),
            View::new(&pre, 0, [m, nn]),
            View::new(&out, 0, [m, nn]),
        )
        .unwrap();
        let dy = up(&values(m * k, 14));
        let dpre = be.alloc(m * nn).unwrap();
        be.matmul_gelu_backward(
            View::new(&dy, 0, [m, k]).mat(),
            View::new(&w, 0, [k, nn]).mat(),
            View::new(&pre, 0, [m, nn]),
            View::new(&dpre, 0, [m, nn]),
        )
        .unwrap();
        outs.extend([pre, out, dpre]);
    }
    let x = up(&values(n * c, 3));
    let g = up(&values(n * c, 4));
    let gamma = up(&values(c, 5));
    let beta = up(&values(c, 6));
    let (o, mean, rstd) = (
        be.alloc(n * c).unwrap(),
        be.alloc(n).unwrap(),
        be.alloc(n).unwrap(),
    );
    let xv = View::new(&x, 0, [n, c]);
    be.layernorm(
        xv,
        View::whole(&gamma),
        View::whole(&beta),
        View::new(&o, 0, [n, c]),
        View::whole(&mean),
        View::whole(&rstd),
        1e-5,
    )
    .unwrap();
    let (dx, dg, db) = (
        be.alloc(n * c).unwrap(),
        be.alloc(c).unwrap(),
        be.alloc(c).unwrap(),
    );
    be.layernorm_backward(
        xv,
        View::whole(&gamma),
        View::whole(&mean),
        View::whole(&rstd),
        View::new(&g, 0, [n, c]),
        View::new(&dx, 0, [n, c]),
        View::whole(&dg),
        View::whole(&db),
    )
    .unwrap();
    let dbias = be.alloc(c).unwrap();
    be.bias_backward(View::new(&g, 0, [n, c]), View::whole(&dbias))
        .unwrap();
    outs.extend([o, mean, rstd, dx, dg, db, dbias]);

    let ids = be.alloc_ids(n).unwrap();
    let id_vals: Vec<u32> = (0..n as u32).map(|i| (i * 7) % 5).collect(); // many repeats
    be.upload_ids(&id_vals, View::whole(&ids)).unwrap();
    let (dwte, dwpe) = (be.alloc(v * c).unwrap(), be.alloc(t * c).unwrap());
    be.embedding_backward(
        View::whole(&ids),
        View::new(&g, 0, [b, t, c]),
        View::new(&dwte, 0, [v, c]),
        View::new(&dwpe, 0, [t, c]),
    )
    .unwrap();
    outs.extend([dwte, dwpe]);

    let qkv = up(&values(n * 3 * c, 7));
    let att = be.alloc(n * c).unwrap();
    let ws = be.alloc(b * h * t).unwrap();
    let [q, k, vv] = Heads::split_qkv(View::new(&qkv, 0, [b, t, 3 * c]), h).unwrap();
    let out = Heads::from_tensor(View::new(&att, 0, [b, t, c]), h).unwrap();
    be.attention_forward(q, k, vv, out, View::whole(&ws), 0)
        .unwrap();
    let dqkv = be.alloc(n * 3 * c).unwrap();
    let [dq, dk, dv] = Heads::split_qkv(View::new(&dqkv, 0, [b, t, 3 * c]), h).unwrap();
    let dout = Heads::from_tensor(View::new(&g, 0, [b, t, c]), h).unwrap();
    be.attention_backward(
        q,
        k,
        vv,
        out,
        dout,
        dq,
        dk,
        dv,
        View::whole(&ws),
        View::whole(&ws),
    )
    .unwrap();
    outs.extend([att, dqkv]);

    let logits = up(&values(n * v, 8));
    let losses = be.alloc(n).unwrap();
    let targets = be.alloc_ids(n).unwrap();
    be.upload_ids(&id_vals, View::whole(&targets)).unwrap();
    let lv = View::new(&logits, 0, [n, v]);
    be.softmax_cross_entropy(
        lv,
        View::whole(&targets),
        v - 3,
        View::whole(&losses),
        Some(lv),
        0.5,
    )
    .unwrap();
    outs.extend([logits, losses]);

    let p = up(&values(100_003, 9));
    let gr = up(&values(100_003, 10));
    let (m, vm) = (be.alloc(100_003).unwrap(), be.alloc(100_003).unwrap());
    let step = AdamWStep {
        lr: 1e-3,
        beta1: 0.9,
        beta2: 0.95,
        eps: 1e-8,
        weight_decay: 0.1,
        step: 3,
        grad_scale: 0.7,
    };
    be.adamw(
        View::whole(&p),
        View::whole(&gr),
        View::whole(&m),
        View::whole(&vm),
        &step,
    )
    .unwrap();
    let norm = be.sum_squares(View::whole(&gr)).unwrap();
    outs.extend([p, m, vm]);

    let mut bits = vec![norm.to_bits() as u32, (norm.to_bits() >> 32) as u32];
    for o in &outs {
        let mut h = vec![0.0; o.len()];
        be.download(View::whole(o), &mut h).unwrap();
        bits.extend(h.iter().map(|x| x.to_bits()));
    }
    bits
}

#[test]
fn results_do_not_depend_on_the_thread_count_or_the_run() {
    let one = everything(&CpuBackend::with_threads(1).unwrap());
    let one_again = everything(&CpuBackend::with_threads(1).unwrap());
    let two = everything(&CpuBackend::with_threads(2).unwrap());
    let three = everything(&CpuBackend::with_threads(3).unwrap());
    assert_eq!(one, one_again, "two runs on one thread differ");
    assert_eq!(one, two, "1 and 2 threads differ");
    assert_eq!(one, three, "1 and 3 threads differ");
}
