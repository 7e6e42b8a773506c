//! The real `Trainer` on the decorator backends: `Timed` counts each op the
//! architecture implies and the FLOPs `ModelConfig::training_flops_per_token` states;
//! `Compare` runs a training step on two backends in lockstep without a divergence.

use andrea_core::timed::{Profile, Timed};
use andrea_core::{Backend, ModelConfig};
use andrea_cpu::CpuBackend;
use andrea_model::bench::synthetic_batch;
use andrea_model::{Model, OptimizerConfig, Trainer};
use andrea_testkit::compare::Compare;
use andrea_testkit::naive::NaiveBackend;
use andrea_testkit::Tol;

/// `steps` full training steps (forward with the loss's gradient, backward, AdamW) of a
/// freshly initialised model.
fn train<B: Backend>(
    be: B,
    cfg: &ModelConfig,
    batch: usize,
    seq: usize,
    steps: usize,
) -> Trainer<B> {
    let (x, y) = synthetic_batch(cfg.vocab_size, batch, seq, 3);
    let model = Model::new(be, cfg.clone(), 1).unwrap();
    let mut tr = Trainer::new(model, OptimizerConfig::default(), batch, seq).unwrap();
    for _ in 0..steps {
        tr.forward_train(&x, &y).unwrap();
        tr.backward().unwrap();
        tr.step(1e-3).unwrap();
    }
    tr
}

fn calls(p: &Profile, ops: &[&str]) -> u64 {
    p.ops
        .iter()
        .filter(|s| ops.contains(&s.op))
        .map(|s| s.calls)
        .sum()
}

#[test]
fn timed_counts_the_ops_of_a_training_step() {
    let (batch, seq) = (2, 16);
    for n_layer in [1, 3] {
        // vocab 128: a multiple of the padding, so the logits' product is the config's.
        let cfg = ModelConfig::new(128, 32, 32, n_layer, 4);
        let tr = train(Timed::new(CpuBackend::new()), &cfg, batch, seq, 1);
        let timed = tr.model().backend();
        // After a first step (and the allocations before it), count one step alone.
        timed.reset();
        let one = {
            let (x, y) = synthetic_batch(cfg.vocab_size, batch, seq, 3);
            let mut tr = tr;
            tr.forward_train(&x, &y).unwrap();
            tr.backward().unwrap();
            tr.step(1e-3).unwrap();
            tr.model().backend().profile()
        };
        let l = n_layer as u64;
        let per_step = |ops: &[&str]| calls(&one, ops);
        assert_eq!(per_step(&["embedding"]), 1, "{one:?}");
        assert_eq!(per_step(&["embedding_backward"]), 1);
        assert_eq!(per_step(&["softmax_cross_entropy"]), 1);
        assert_eq!(per_step(&["attention_forward"]), l);
        assert_eq!(per_step(&["attention_backward"]), l);
        // 2 LayerNorms per block and the final one, forward (plain or fused with the
        // residual add) and backward.
        assert_eq!(per_step(&["layernorm", "residual_layernorm"]), 2 * l + 1);
        assert_eq!(per_step(&["layernorm_backward"]), 2 * l + 1);
        // The GELU backward rides in the MLP's dX product: no separate pass.
        assert_eq!(per_step(&["matmul_gelu_backward"]), l);
        assert_eq!(per_step(&["gelu_backward"]), 0);
        // The logits are written once by the LM head's product, replaced in place by
        // their gradient, and read in place by both of its backward products: no copies.
        assert_eq!(per_step(&["copy"]), 0);

        let products = [
            "matmul",
            "matmul_add",
            "linear_gelu",
            "matmul_gelu_backward",
            "attention_forward",
            "attention_backward",
        ];
        let flops: f64 = one
            .ops
            .iter()
            .filter(|s| products.contains(&s.op))
            .map(|s| s.flops)
            .sum();
        let want = cfg.training_flops_per_token(seq) * (batch * seq) as f64;
        assert!(
            (flops - want).abs() <= 1e-9 * want,
            "{n_layer} layers: timed {flops} FLOPs, the config says {want}"
        );
        assert!(one.op_seconds() <= one.wall_s, "{one:?}");
        println!("{n_layer} layers:\n{}", one.table(1));
    }
}

#[test]
fn compare_runs_training_steps_on_two_backends_in_lockstep() {
    let cfg = ModelConfig::new(70, 32, 32, 2, 4);
    // The fused CPU kernels against the naive backend's plain loops and default
    // (unfused) attention: float32 rounding of different summation orders, through
    // two steps of AdamW (whose first steps move each parameter by about lr).
    let be = Compare::new(NaiveBackend::new(), CpuBackend::new(), Tol::new(2e-5, 2e-3));
    let tr = train(be, &cfg, 2, 8, 2);
    let be = tr.model().backend();
    if let Err(d) = be.agreement() {
        panic!("{d}");
    }
}

#[test]
fn timed_counts_each_product_under_its_shape() {
    // d_model 32, 16 tokens, vocabulary 256 (a multiple of the padding), MLP 128: the
    // output layer's shapes differ from every block product's.
    let (batch, seq, n_layer) = (2, 8, 2);
    let cfg = ModelConfig::new(256, 32, 32, n_layer, 4);
    let tr = train(Timed::new(CpuBackend::new()), &cfg, batch, seq, 1);
    let p = tr.model().backend().profile();
    let products = [
        "matmul",
        "matmul_add",
        "linear_gelu",
        "matmul_gelu_backward",
    ];
    for s in &p.ops {
        if !products.contains(&s.op) {
            assert!(s.shape.is_empty(), "{s:?}");
            continue;
        }
        // `[B] MxKxN ab`: the shape must account for the row's FLOPs, call by call.
        let (batch, dims) = match s.shape.strip_prefix('[') {
            Some(rest) => {
                let (b, dims) = rest.split_once("] ").expect("[B] before the shape");
                (b.parse::<f64>().unwrap(), dims)
            }
            None => (1.0, s.shape.as_str()),
        };
        let (mkn, layouts) = dims.split_once(' ').expect("layouts after the shape");
        assert!(matches!(layouts, "nn" | "nt" | "tn" | "tt"), "{s:?}");
        let mkn: Vec<f64> = mkn.split('x').map(|v| v.parse().unwrap()).collect();
        assert_eq!(mkn.len(), 3, "{s:?}");
        let want = 2.0 * batch * mkn[0] * mkn[1] * mkn[2] * s.calls as f64;
        assert!((s.flops - want).abs() <= 1e-9 * want, "{s:?}: {want} FLOPs");
    }
    let calls = |op: &str, shape: &str| {
        p.ops
            .iter()
            .filter(|s| s.op == op && s.shape == shape)
            .map(|s| s.calls)
            .sum::<u64>()
    };
    let tokens = batch * seq;
    let l = n_layer as u64;
    // The logits against the tied embedding (`x·wteᵀ`), its gradient's product written
    // into the embedding's (`dlogitsᵀ·x`), and the MLP's fused products, forward and
    // backward.
    assert_eq!(calls("matmul", &format!("{tokens}x32x256 nt")), 1, "{p:?}");
    assert_eq!(calls("matmul", &format!("256x{tokens}x32 tn")), 1, "{p:?}");
    assert_eq!(
        calls("linear_gelu", &format!("{tokens}x32x128 nn")),
        l,
        "{p:?}"
    );
    assert_eq!(
        calls("matmul_gelu_backward", &format!("{tokens}x32x128 nt")),
        l
    );
}
