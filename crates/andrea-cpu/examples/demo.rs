//! One ANDREA-120M training step, layer by layer, on the CPU backend: embedding, one
//! transformer block (the other 11 are the same ops on the same shapes), the tied output
//! layer and the loss, then the backward pass and an AdamW update, each op timed.
//! Prints where a step's time goes and what a full 12-layer step would take.
//!
//! `cargo run --release -p andrea-cpu --example demo [-- BATCH SEQ]` (default 4 x 256).

use std::time::Instant;

use andrea_core::{AdamWStep, AttentionShape, Backend, Heads, View};
use andrea_cpu::{CpuBackend, CpuBuffer};

const C: usize = 768;
const H: usize = 12;
const V: usize = 8449;
const LAYERS: usize = 12;

fn randn(be: &CpuBackend, n: usize, std: f32, seed: u64) -> CpuBuffer {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut next = || {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        (s >> 40) as f32 / (1u64 << 24) as f32
    };
    // Irwin-Hall(4) approximates a normal well enough for an initialisation.
    let host: Vec<f32> = (0..n)
        .map(|_| (next() + next() + next() + next() - 2.0) * std * 1.732)
        .collect();
    let b = be.alloc(n).unwrap();
    be.upload(&host, View::whole(&b)).unwrap();
    b
}

struct Timer(Vec<(&'static str, f64, f64)>);

impl Timer {
    fn op(&mut self, name: &'static str, flops: f64, f: impl FnOnce()) {
        let t = Instant::now();
        f();
        self.0.push((name, t.elapsed().as_secs_f64(), flops));
    }
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<usize> = std::env::args()
        .skip(1)
        .filter_map(|a| a.parse().ok())
        .collect();
    let (b, t) = (
        args.first().copied().unwrap_or(4),
        args.get(1).copied().unwrap_or(256),
    );
    let n = b * t;
    let be = CpuBackend::new();
    println!(
        "backend: {}; batch {b} x {t} tokens, d_model {C}, {H} heads, vocab {V}",
        be.name()
    );

    // Parameters of the embedding, one block and the final LayerNorm.
    let wte = randn(&be, V * C, 0.02, 1);
    let wpe = randn(&be, 1024 * C, 0.02, 2);
    let (ln_g, ln_b) = (be.alloc(C)?, be.alloc(C)?);
    be.fill(View::whole(&ln_g), 1.0)?;
    let w_qkv = randn(&be, C * 3 * C, 0.02, 3);
    let b_qkv = be.alloc(3 * C)?;
    let w_proj = randn(&be, C * C, 0.02 / (2.0 * LAYERS as f32).sqrt(), 4);
    let b_proj = be.alloc(C)?;
    let w_fc = randn(&be, C * 4 * C, 0.02, 5);
    let b_fc = be.alloc(4 * C)?;
    let w_fc2 = randn(&be, 4 * C * C, 0.02 / (2.0 * LAYERS as f32).sqrt(), 6);
    let b_fc2 = be.alloc(C)?;

    let ids = be.alloc_ids(n)?;
    let tokens: Vec<u32> = (0..n as u32)
        .map(|i| (i * 2654435761u32) % V as u32)
        .collect();
    be.upload_ids(&tokens, View::whole(&ids))?;
    let targets = be.alloc_ids(n)?;
    be.upload_ids(
        &tokens[1..]
            .iter()
            .chain(&tokens[..1])
            .copied()
            .collect::<Vec<_>>(),
        View::whole(&targets),
    )?;

    // Activations.
    let act = |len| be.alloc(len).unwrap();
    let (x0, ln1, qkv, att, x1, ln2, fc_pre, fc, x2, lnf, logits) = (
        act(n * C),
        act(n * C),
        act(n * 3 * C),
        act(n * C),
        act(n * C),
        act(n * C),
        act(n * 4 * C),
        act(n * 4 * C),
        act(n * C),
        act(n * C),
        act(n * V),
    );
    let stats: Vec<CpuBuffer> = (0..6).map(|_| act(n)).collect();
    let shape = AttentionShape {
        batch: b,
        heads: H,
        q_len: t,
        k_len: t,
    };
    let ws = act(be.attention_workspace_len(shape).max(1));
    let scratch = act(be.attention_backward_scratch_len(shape).max(1));
    let losses = act(n);
    let v3 = |buf, w| View::new(buf, 0, [b, t, w]);
    let v2 = |buf, w| View::new(buf, 0, [n, w]);
    let w2 = |buf, r, c| View::new(buf, 0, [r, c]);
    let mut tm = Timer(Vec::new());
    let f = |m: usize, k: usize, nn: usize| 2.0 * (m * k * nn) as f64;
    let attn_flops = 4.0 * (b * H * t * t * (C / H)) as f64;

    let g = |len| be.alloc(len).unwrap();
    let (dwte, dw_qkv, dw_proj, dw_fc, dw_fc2) =
        (g(V * C), g(C * 3 * C), g(C * C), g(C * 4 * C), g(4 * C * C));
    let (db, dgam, dbet) = (g(4 * C), g(C), g(C));
    let (dlnf, dres, dfc, dln, dqkv, datt) = (
        g(n * C),
        g(n * C),
        g(n * 4 * C),
        g(n * C),
        g(n * 3 * C),
        g(n * C),
    );
    let dwpe = g(1024 * C);
    let (m, vv) = (g(C * 4 * C), g(C * 4 * C));
    let (mut loss, mut norm) = (0.0, 0.0);
    // The first step touches fresh memory (page faults); time the second.
    for step_no in 1..=2 {
        tm.0.clear();
        // ---- forward ----
        tm.op("embedding", 0.0, || {
            be.embedding(
                View::whole(&ids),
                w2(&wte, V, C),
                w2(&wpe, 1024, C),
                v3(&x0, C),
                0,
            )
            .unwrap()
        });
        tm.op("ln_1", 0.0, || {
            be.layernorm(
                v2(&x0, C),
                View::whole(&ln_g),
                View::whole(&ln_b),
                v2(&ln1, C),
                View::whole(&stats[0]),
                View::whole(&stats[1]),
                1e-5,
            )
            .unwrap()
        });
        tm.op("attn.c_attn (qkv matmul)", f(n, C, 3 * C), || {
            be.matmul(
                v2(&ln1, C).mat(),
                w2(&w_qkv, C, 3 * C).mat(),
                Some(View::whole(&b_qkv)),
                v2(&qkv, 3 * C).mat(),
            )
            .unwrap()
        });
        let [q, k, v] = Heads::split_qkv(v3(&qkv, 3 * C), H).unwrap();
        let o = Heads::from_tensor(v3(&att, C), H).unwrap();
        tm.op("attention forward", attn_flops, || {
            be.attention_forward(q, k, v, o, View::whole(&ws), 0)
                .unwrap()
        });
        tm.op("attn.c_proj matmul", f(n, C, C), || {
            be.matmul(
                v2(&att, C).mat(),
                w2(&w_proj, C, C).mat(),
                Some(View::whole(&b_proj)),
                v2(&x1, C).mat(),
            )
            .unwrap()
        });
        tm.op("residual + ln_2", 0.0, || {
            be.residual_layernorm(
                v2(&x0, C),
                v2(&x1, C),
                v2(&x1, C),
                View::whole(&ln_g),
                View::whole(&ln_b),
                v2(&ln2, C),
                View::whole(&stats[2]),
                View::whole(&stats[3]),
                1e-5,
            )
            .unwrap_or_else(|_| {
                be.add(v2(&x0, C), v2(&x1, C), v2(&x1, C)).unwrap();
                be.layernorm(
                    v2(&x1, C),
                    View::whole(&ln_g),
                    View::whole(&ln_b),
                    v2(&ln2, C),
                    View::whole(&stats[2]),
                    View::whole(&stats[3]),
                    1e-5,
                )
                .unwrap();
            })
        });
        tm.op("mlp.c_fc + GELU", f(n, C, 4 * C), || {
            be.linear_gelu(
                v2(&ln2, C).mat(),
                w2(&w_fc, C, 4 * C).mat(),
                View::whole(&b_fc),
                v2(&fc_pre, 4 * C),
                v2(&fc, 4 * C),
            )
            .unwrap()
        });
        tm.op("mlp.c_proj matmul", f(n, 4 * C, C), || {
            be.matmul(
                v2(&fc, 4 * C).mat(),
                w2(&w_fc2, 4 * C, C).mat(),
                Some(View::whole(&b_fc2)),
                v2(&x2, C).mat(),
            )
            .unwrap()
        });
        tm.op("residual add", 0.0, || {
            be.add(v2(&x1, C), v2(&x2, C), v2(&x2, C)).unwrap()
        });
        tm.op("ln_f", 0.0, || {
            be.layernorm(
                v2(&x2, C),
                View::whole(&ln_g),
                View::whole(&ln_b),
                v2(&lnf, C),
                View::whole(&stats[4]),
                View::whole(&stats[5]),
                1e-5,
            )
            .unwrap()
        });
        tm.op("lm_head (x · wteᵀ)", f(n, C, V), || {
            be.matmul(
                v2(&lnf, C).mat(),
                w2(&wte, V, C).mat().t(),
                None,
                v2(&logits, V).mat(),
            )
            .unwrap()
        });
        tm.op("softmax + cross-entropy", 0.0, || {
            be.softmax_cross_entropy(
                v2(&logits, V),
                View::whole(&targets),
                V,
                View::whole(&losses),
                Some(v2(&logits, V)),
                1.0 / n as f32,
            )
            .unwrap()
        });
        let mut l = vec![0.0; n];
        be.download(View::whole(&losses), &mut l)?;
        loss = l.iter().sum::<f32>() / n as f32;

        // ---- backward (gradients of the block's parameters into one buffer) ----
        tm.op("lm_head backward: dx", f(n, V, C), || {
            be.matmul(
                v2(&logits, V).mat(),
                w2(&wte, V, C).mat(),
                None,
                v2(&dlnf, C).mat(),
            )
            .unwrap()
        });
        tm.op("lm_head backward: dwte", f(V, n, C), || {
            be.matmul_add(
                v2(&logits, V).mat().t(),
                v2(&lnf, C).mat(),
                None,
                w2(&dwte, V, C).mat(),
            )
            .unwrap()
        });
        tm.op("ln_f backward", 0.0, || {
            be.layernorm_backward(
                v2(&x2, C),
                View::whole(&ln_g),
                View::whole(&stats[4]),
                View::whole(&stats[5]),
                v2(&dlnf, C),
                v2(&dres, C),
                View::whole(&dgam),
                View::whole(&dbet),
            )
            .unwrap()
        });
        tm.op("mlp.c_proj backward: dx", f(n, C, 4 * C), || {
            be.matmul(
                v2(&dres, C).mat(),
                w2(&w_fc2, 4 * C, C).mat().t(),
                None,
                v2(&dfc, 4 * C).mat(),
            )
            .unwrap()
        });
        tm.op("mlp.c_proj backward: dW", f(4 * C, n, C), || {
            be.matmul_add(
                v2(&fc, 4 * C).mat().t(),
                v2(&dres, C).mat(),
                None,
                w2(&dw_fc2, 4 * C, C).mat(),
            )
            .unwrap()
        });
        tm.op("mlp.c_proj backward: db", 0.0, || {
            be.bias_backward(v2(&dres, C), View::new(&db, 0, [C]))
                .unwrap()
        });
        tm.op("GELU backward", 0.0, || {
            be.gelu_backward(v2(&fc_pre, 4 * C), v2(&dfc, 4 * C), v2(&dfc, 4 * C))
                .unwrap()
        });
        tm.op("mlp.c_fc backward: dx", f(n, 4 * C, C), || {
            be.matmul(
                v2(&dfc, 4 * C).mat(),
                w2(&w_fc, C, 4 * C).mat().t(),
                None,
                v2(&dln, C).mat(),
            )
            .unwrap()
        });
        tm.op("mlp.c_fc backward: dW", f(C, n, 4 * C), || {
            be.matmul_add(
                v2(&ln2, C).mat().t(),
                v2(&dfc, 4 * C).mat(),
                None,
                w2(&dw_fc, C, 4 * C).mat(),
            )
            .unwrap()
        });
        tm.op("ln_2 backward", 0.0, || {
            be.layernorm_backward(
                v2(&x1, C),
                View::whole(&ln_g),
                View::whole(&stats[2]),
                View::whole(&stats[3]),
                v2(&dln, C),
                v2(&dres, C),
                View::whole(&dgam),
                View::whole(&dbet),
            )
            .unwrap()
        });
        tm.op("attn.c_proj backward: dx, dW", f(n, C, C) * 2.0, || {
            be.matmul(
                v2(&dres, C).mat(),
                w2(&w_proj, C, C).mat().t(),
                None,
                v2(&datt, C).mat(),
            )
            .unwrap();
            be.matmul_add(
                v2(&att, C).mat().t(),
                v2(&dres, C).mat(),
                None,
                w2(&dw_proj, C, C).mat(),
            )
            .unwrap();
        });
        let [dq, dk, dv] = Heads::split_qkv(v3(&dqkv, 3 * C), H).unwrap();
        let dout = Heads::from_tensor(v3(&datt, C), H).unwrap();
        tm.op("attention backward", attn_flops * 2.5, || {
            be.attention_backward(
                q,
                k,
                v,
                o,
                dout,
                dq,
                dk,
                dv,
                View::whole(&ws),
                View::whole(&scratch),
            )
            .unwrap()
        });
        tm.op("attn.c_attn backward: dx, dW", f(n, 3 * C, C) * 2.0, || {
            be.matmul(
                v2(&dqkv, 3 * C).mat(),
                w2(&w_qkv, C, 3 * C).mat().t(),
                None,
                v2(&dln, C).mat(),
            )
            .unwrap();
            be.matmul_add(
                v2(&ln1, C).mat().t(),
                v2(&dqkv, 3 * C).mat(),
                None,
                w2(&dw_qkv, C, 3 * C).mat(),
            )
            .unwrap();
        });
        tm.op("ln_1 backward", 0.0, || {
            be.layernorm_backward(
                v2(&x0, C),
                View::whole(&ln_g),
                View::whole(&stats[0]),
                View::whole(&stats[1]),
                v2(&dln, C),
                v2(&dres, C),
                View::whole(&dgam),
                View::whole(&dbet),
            )
            .unwrap()
        });
        tm.op("embedding backward", 0.0, || {
            be.embedding_backward(
                View::whole(&ids),
                v3(&dres, C),
                w2(&dwte, V, C),
                View::new(&dwpe, 0, [t, C]),
            )
            .unwrap()
        });
        norm = be.sum_squares(View::whole(&dw_fc))?.sqrt();
        let step = AdamWStep {
            lr: 6e-4,
            beta1: 0.9,
            beta2: 0.95,
            eps: 1e-8,
            weight_decay: 0.1,
            step: step_no,
            grad_scale: 1.0,
        };
        tm.op("AdamW (mlp.c_fc weight)", 0.0, || {
            be.adamw(
                View::whole(&w_fc),
                View::whole(&dw_fc),
                View::whole(&m),
                View::whole(&vv),
                &step,
            )
            .unwrap()
        });
    }

    println!(
        "loss after one update: {loss:.4} (ln V = {:.4}); |grad mlp.c_fc| = {norm:.3e}\n",
        (V as f32).ln()
    );
    println!(
        "{:<34} {:>9} {:>9}",
        "op (one block unless noted)", "ms", "GFLOP/s"
    );
    let per_layer = [
        "ln_1",
        "attn.c_attn (qkv matmul)",
        "attention forward",
        "attn.c_proj matmul",
        "residual + ln_2",
        "mlp.c_fc + GELU",
        "mlp.c_proj matmul",
        "residual add",
        "mlp.c_proj backward: dx",
        "mlp.c_proj backward: dW",
        "mlp.c_proj backward: db",
        "GELU backward",
        "mlp.c_fc backward: dx",
        "mlp.c_fc backward: dW",
        "ln_2 backward",
        "attn.c_proj backward: dx, dW",
        "attention backward",
        "attn.c_attn backward: dx, dW",
        "ln_1 backward",
    ];
    let (mut layer, mut other) = (0.0, 0.0);
    for (name, secs, flops) in &tm.0 {
        let rate = if *flops > 0.0 {
            format!("{:.1}", flops / secs / 1e9)
        } else {
            String::new()
        };
        println!("{name:<34} {:>9.2} {rate:>9}", secs * 1e3);
        if per_layer.contains(name) {
            layer += secs
        } else {
            other += secs
        }
    }
    // AdamW on one block's MLP weight stands for ~1/30 of all parameters.
    let step_s = LAYERS as f64 * layer + other;
    println!(
        "\none block {:.1} ms; estimated full {LAYERS}-layer step {:.2} s = {:.0} tokens/s",
        layer * 1e3,
        step_s,
        n as f64 / step_s
    );
    Ok(())
}
