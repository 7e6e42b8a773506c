//! Training behaviour: the loss at initialisation, overfitting one batch, gradient
//! accumulation, the AdamW step against a float64 host reference (weight decay on 2-D
//! tensors only), exact resume from saved optimizer state, bad input, and the same
//! numbers on another backend.

mod common;

use andrea_core::{AdamWStep, Backend, IGNORE_INDEX};
use andrea_cpu::CpuBackend;
use andrea_model::{Model, ModelError, OptimizerConfig, Trainer};
use andrea_testkit::naive::NaiveBackend;
use andrea_testkit::{reference, Tol};
use common::{small, tiny, tokens};

fn no_clip() -> OptimizerConfig {
    OptimizerConfig {
        grad_clip: None,
        ..OptimizerConfig::default()
    }
}

#[test]
fn loss_at_initialisation_is_close_to_ln_vocab() {
    let cfg = tiny();
    let model = Model::new(CpuBackend::new(), cfg.clone(), 0).unwrap();
    println!(
        "tiny config: {} parameters, {:.1} MFLOP per token at seq 64",
        model.param_count(),
        cfg.training_flops_per_token(64) / 1e6
    );
    let mut tr = Trainer::new(model, no_clip(), 2, 64).unwrap();
    println!("memory at 2 x 64: {}", tr.memory());
    let x = tokens(128, cfg.vocab_size, 1);
    let y = tokens(128, cfg.vocab_size, 2);
    let loss = tr.forward(&x, &y).unwrap();
    let ln_v = (cfg.vocab_size as f32).ln();
    // Logits ~ N(0, 0.02²·d_model) add about var/2 = 0.026 nats to ln V.
    assert!((loss - ln_v).abs() < 0.1, "loss {loss}, ln V {ln_v}");
}

#[test]
fn a_tiny_model_overfits_one_batch() {
    let cfg = tiny();
    let model = Model::new(CpuBackend::new(), cfg.clone(), 1).unwrap();
    let opt = OptimizerConfig {
        lr: 3e-3,
        weight_decay: 0.0,
        ..OptimizerConfig::default()
    };
    let mut tr = Trainer::new(model, opt, 2, 32).unwrap();
    let x = tokens(64, cfg.vocab_size, 3);
    let y = tokens(64, cfg.vocab_size, 4);
    let mut loss = f32::INFINITY;
    for _ in 0..150 {
        loss = tr.train_step(&[(&x, &y)], 3e-3).unwrap().0;
        if loss < 0.01 {
            break;
        }
    }
    println!("loss after {} steps: {loss}", tr.steps());
    assert!(loss < 0.01, "loss {loss} after {} steps", tr.steps());
}

#[test]
fn forward_train_gives_the_gradients_of_forward_then_backward() {
    let cfg = small();
    let x = tokens(2 * 16, cfg.vocab_size, 7);
    let mut y = tokens(2 * 16, cfg.vocab_size, 8);
    y[3] = IGNORE_INDEX;
    let trainer = || {
        let model = Model::new(CpuBackend::new(), cfg.clone(), 3).unwrap();
        Trainer::new(model, no_clip(), 2, 16).unwrap()
    };
    let (mut split, mut fused) = (trainer(), trainer());
    let l_split = split.forward(&x, &y).unwrap();
    split.backward().unwrap();
    let l_fused = fused.forward_train(&x, &y).unwrap();
    // The loss-only pass sums its exponentials in another order than the fused one.
    assert!(
        (l_split - l_fused).abs() <= 1e-6 * l_split.abs(),
        "{l_split} vs {l_fused}"
    );
    assert!(
        fused.logits().is_err(),
        "the logits were overwritten by their gradient"
    );
    fused.backward().unwrap();
    // The same op computes dlogits in both cases, so the gradients are the same bits.
    for p in split.model().params() {
        assert_eq!(
            split.read_grad(p.name()).unwrap(),
            fused.read_grad(p.name()).unwrap(),
            "{}",
            p.name()
        );
    }
}

/// Accumulating adds whole micro-batch gradients, so two micro-batches in one trainer
/// are bit for bit the sum of the two gradients computed apart (what two data-parallel
/// ranks all-reduce): `g₁ + g₂` in f32, element by element.
#[test]
fn accumulation_is_the_f32_sum_of_the_micro_batch_gradients() {
    let cfg = small();
    let x = tokens(3 * 16, cfg.vocab_size, 7);
    let y = tokens(3 * 16, cfg.vocab_size, 8);
    let trainer = || {
        let model = Model::new(CpuBackend::new(), cfg.clone(), 3).unwrap();
        Trainer::new(model, no_clip(), 1, 16).unwrap()
    };
    let (mut both, mut apart) = (trainer(), [trainer(), trainer(), trainer()]);
    for (i, tr) in apart.iter_mut().enumerate() {
        let part = i * 16..(i + 1) * 16;
        both.forward(&x[part.clone()], &y[part.clone()]).unwrap();
        both.backward().unwrap();
        tr.forward(&x[part.clone()], &y[part]).unwrap();
        tr.backward().unwrap();
    }
    assert_eq!(both.micro_batches(), 3);
    assert_eq!(both.memory().gradients, 2 * apart[0].memory().gradients);
    for p in both.model().params() {
        let g: Vec<Vec<f32>> = apart
            .iter()
            .map(|t| t.read_grad(p.name()).unwrap())
            .collect();
        let want: Vec<f32> = (0..g[0].len())
            .map(|i| (g[0][i] + g[1][i]) + g[2][i])
            .collect();
        let got = both.read_grad(p.name()).unwrap();
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&got), bits(&want), "{}", p.name());
    }
}

#[test]
fn two_micro_batches_accumulate_the_gradient_of_their_union() {
    let cfg = small();
    let x = tokens(2 * 16, cfg.vocab_size, 5);
    let y = tokens(2 * 16, cfg.vocab_size, 6);
    let mut whole = Trainer::new(
        Model::new(CpuBackend::new(), cfg.clone(), 2).unwrap(),
        no_clip(),
        2,
        16,
    )
    .unwrap();
    let mut parts = Trainer::new(
        Model::new(CpuBackend::new(), cfg.clone(), 2).unwrap(),
        no_clip(),
        1,
        16,
    )
    .unwrap();
    whole.forward(&x, &y).unwrap();
    whole.backward().unwrap();
    for half in [0..16, 16..32] {
        parts.forward(&x[half.clone()], &y[half]).unwrap();
        parts.backward().unwrap();
    }
    // Each backward adds the gradient of its micro-batch's mean; the step divides by 2.
    assert!((whole.grad_norm().unwrap() - parts.grad_norm().unwrap()).abs() < 1e-5);
    for p in whole.model().params() {
        let want: Vec<f64> = whole
            .read_grad(p.name())
            .unwrap()
            .iter()
            .map(|&g| 2.0 * g as f64)
            .collect();
        let got = parts.read_grad(p.name()).unwrap();
        let scale = want.iter().fold(0.0f64, |m, g| m.max(g.abs()));
        Tol::new(1e-5 * scale, 1e-4)
            .check(p.name(), &got, &want)
            .unwrap();
    }
    let a = whole.step(1e-3).unwrap();
    let b = parts.step(1e-3).unwrap();
    assert!((a.grad_norm - b.grad_norm).abs() < 1e-5, "{a:?} {b:?}");
    let pa = whole
        .model()
        .read_param("transformer.h.0.mlp.c_fc.weight")
        .unwrap();
    let pb = parts
        .model()
        .read_param("transformer.h.0.mlp.c_fc.weight")
        .unwrap();
    Tol::new(1e-6, 1e-5)
        .check("c_fc after a step", &pb, &reference::to_f64(&pa))
        .unwrap();
}

#[test]
fn adamw_step_with_clipping_matches_a_host_reference_decaying_2d_tensors_only() {
    let cfg = small();
    let opt = OptimizerConfig {
        lr: 1e-2,
        beta1: 0.85,
        beta2: 0.97,
        eps: 1e-7,
        weight_decay: 0.3,
        grad_clip: Some(0.05),
    };
    let mut tr = Trainer::new(
        Model::new(CpuBackend::new(), cfg.clone(), 3).unwrap(),
        opt.clone(),
        2,
        8,
    )
    .unwrap();
    let names: Vec<(String, bool)> = tr
        .model()
        .params()
        .iter()
        .map(|p| (p.name().to_string(), p.decay()))
        .collect();
    let x = tokens(16, cfg.vocab_size, 7);
    let y = tokens(16, cfg.vocab_size, 8);
    let mut host: Vec<(Vec<f64>, Vec<f64>, Vec<f64>)> = names
        .iter()
        .map(|(n, _)| {
            let p = reference::to_f64(&tr.model().read_param(n).unwrap());
            let z = vec![0.0; p.len()];
            (p, z.clone(), z)
        })
        .collect();
    for step in 1..=2u64 {
        tr.forward(&x, &y).unwrap();
        tr.backward().unwrap();
        let grads: Vec<Vec<f64>> = names
            .iter()
            .map(|(n, _)| reference::to_f64(&tr.read_grad(n).unwrap()))
            .collect();
        let norm = grads.iter().flatten().map(|g| g * g).sum::<f64>().sqrt();
        let clip = (opt.grad_clip.unwrap() as f64 / (norm + 1e-6)).min(1.0);
        assert!(clip < 1.0, "the test wants clipping to take effect");
        let stats = tr.step(opt.lr).unwrap();
        assert_eq!(stats.step, step);
        assert!((stats.grad_norm as f64 - norm).abs() <= 1e-5 * norm);
        assert!((stats.clip_scale as f64 - clip).abs() <= 1e-5);
        for ((name, decay), ((p, m, v), g)) in names.iter().zip(host.iter_mut().zip(&grads)) {
            let s = AdamWStep {
                lr: opt.lr,
                beta1: opt.beta1,
                beta2: opt.beta2,
                eps: opt.eps,
                weight_decay: if *decay { opt.weight_decay } else { 0.0 },
                step,
                grad_scale: clip as f32,
            };
            reference::adamw(p, g, m, v, &s);
            let got = tr.model().read_param(name).unwrap();
            Tol::new(1e-6, 1e-5).check(name, &got, p).unwrap();
        }
    }
    // The decay rule, stated: 2-D tensors are decayed, 1-D ones are not.
    for (name, decay) in &names {
        assert_eq!(
            *decay,
            !(name.contains("ln_") || name.ends_with("bias")),
            "{name}"
        );
    }
}

#[test]
fn training_resumes_exactly_from_saved_weights_and_optimizer_state() {
    let cfg = small();
    let dir = tempfile::tempdir().unwrap();
    let x = tokens(32, cfg.vocab_size, 9);
    let y = tokens(32, cfg.vocab_size, 10);
    let mut a = Trainer::new(
        Model::new(CpuBackend::new(), cfg.clone(), 4).unwrap(),
        OptimizerConfig::default(),
        2,
        16,
    )
    .unwrap();
    for _ in 0..2 {
        a.train_step(&[(&x, &y)], 1e-3).unwrap();
    }
    a.model().save(dir.path()).unwrap();
    a.save_optimizer_state(dir.path().join("optimizer.safetensors"))
        .unwrap();
    let (la, _) = a.train_step(&[(&x, &y)], 1e-3).unwrap();

    let model = Model::load(CpuBackend::new(), dir.path()).unwrap();
    let mut b = Trainer::new(model, OptimizerConfig::default(), 2, 16).unwrap();
    b.load_optimizer_state(dir.path().join("optimizer.safetensors"))
        .unwrap();
    assert_eq!(b.steps(), 2);
    let (lb, stats) = b.train_step(&[(&x, &y)], 1e-3).unwrap();
    assert_eq!(stats.step, 3);
    assert_eq!(la, lb);
    for p in a.model().params() {
        assert_eq!(
            a.model().read_param(p.name()).unwrap(),
            b.model().read_param(p.name()).unwrap(),
            "{}",
            p.name()
        );
    }
}

#[test]
fn bad_input_is_an_error_naming_the_value_and_the_limit() {
    let cfg = small();
    let model = Model::new(CpuBackend::new(), cfg.clone(), 5).unwrap();
    let e = Trainer::new(model, OptimizerConfig::default(), 2, 33).unwrap_err();
    assert!(
        matches!(
            e,
            ModelError::SequenceTooLong {
                len: 33,
                context: 32
            }
        ),
        "{e}"
    );
    let model = Model::new(CpuBackend::new(), cfg.clone(), 5).unwrap();
    let mut tr = Trainer::new(model, OptimizerConfig::default(), 2, 8).unwrap();
    let mut x = tokens(16, cfg.vocab_size, 11);
    let y = tokens(16, cfg.vocab_size, 12);
    let msg = |e: ModelError| e.to_string();

    assert!(msg(tr.backward().unwrap_err()).contains("call forward first"));
    assert!(msg(tr.step(1e-3).unwrap_err()).contains("no gradients"));
    x[5] = 70;
    let e = msg(tr.forward(&x, &y).unwrap_err());
    assert!(
        e.contains("token id 70 at position 5") && e.contains("70 ids"),
        "{e}"
    );
    x[5] = 1;
    let e = msg(tr.forward(&x[..12], &y[..12]).unwrap_err());
    assert!(e.contains("12 tokens") && e.contains("8 tokens"), "{e}");
    let big = tokens(24, cfg.vocab_size, 13);
    let e = msg(tr.forward(&big, &big).unwrap_err());
    assert!(e.contains("at most 2"), "{e}");
    let e = msg(tr.forward(&x, &y[..8]).unwrap_err());
    assert!(e.contains("16 tokens but 8 targets"), "{e}");
    let ignored = vec![IGNORE_INDEX; 16];
    assert!(tr.forward(&x, &ignored).is_err());
    assert!(tr
        .model()
        .read_param("transformer.h.9.ln_1.weight")
        .is_err());

    // A smaller batch than the arena's is fine.
    tr.forward(&x[..8], &y[..8]).unwrap();
    tr.backward().unwrap();
    tr.step(1e-3).unwrap();

    // A NaN parameter: the loss is reported as not finite, with the step number.
    let mut w = tr.model().read_param("transformer.ln_f.weight").unwrap();
    w[0] = f32::NAN;
    tr.model_mut()
        .write_param("transformer.ln_f.weight", &w)
        .unwrap();
    let e = tr.forward(&x, &y).unwrap_err();
    assert!(
        matches!(
            e,
            ModelError::NonFinite {
                step: 2,
                what: "loss",
                ..
            }
        ),
        "{e}"
    );
    assert!(e.to_string().starts_with("step 2: the loss is NaN"), "{e}");
}

/// The model is generic over the backend: the slowest correct backend gives the same
/// loss and gradients.
#[test]
fn naive_backend_computes_the_same_step() {
    fn run<B: Backend>(be: B) -> (f32, Vec<Vec<f32>>) {
        let cfg = small();
        let mut tr = Trainer::new(
            Model::new(be, cfg.clone(), 6).unwrap(),
            OptimizerConfig::default(),
            2,
            8,
        )
        .unwrap();
        let loss = tr
            .forward(
                &tokens(16, cfg.vocab_size, 14),
                &tokens(16, cfg.vocab_size, 15),
            )
            .unwrap();
        tr.backward().unwrap();
        let grads = tr
            .model()
            .params()
            .iter()
            .map(|p| tr.read_grad(p.name()).unwrap())
            .collect();
        (loss, grads)
    }
    let (l1, g1) = run(CpuBackend::new());
    let (l2, g2) = run(NaiveBackend::new());
    assert!((l1 - l2).abs() < 1e-5 * l1);
    for (a, b) in g1.iter().zip(&g2) {
        let scale = b.iter().fold(0.0f32, |m, g| m.max(g.abs())) as f64;
        Tol::new(1e-5 * scale, 1e-4)
            .check("grad", a, &reference::to_f64(b))
            .unwrap();
    }
}
