//! Proof (b): andrea against Hugging Face transformers' `GPT2LMHeadModel` on the
//! fixtures `scripts/make_fixtures.py` wrote (a random GPT-2 with vocabulary 8449,
//! d_model 16, 2 blocks, 2 heads; batches of 2 x 8 tokens; the reference computed in
//! float64 from the same float32 weights). Regenerate with
//! `python crates/andrea-model/scripts/make_fixtures.py` (needs torch + transformers).
//!
//! Tolerances (`abs + rel·|want|`), met by float32 with 10x or more to spare (the test
//! prints the worst ratio to the bound with `--nocapture`):
//!
//! * logits: 1e-5 + 1e-5 rel: a few float32 roundings through a 16-wide model;
//! * loss, gradient norms, step losses: 1e-5 relative;
//! * gradients: 1e-5·max|grad of the tensor| + 1e-3 rel: the token embedding's gradient
//!   is a sum over 16 positions of values down to 1e-9 (rows of tokens never seen get only
//!   softmax mass), so the tolerance is relative to each tensor's scale;
//! * parameters after 3 AdamW steps: 5e-3·lr + 1e-5 rel. An Adam update is
//!   `lr·m̂/(sqrt(v̂) + eps)`, about `lr` whatever the gradient's size, so an element whose
//!   gradient is small against its tensor's float32 noise moves in a slightly different
//!   direction (measured: at most 4.8e-4·lr). A missing bias correction changes the first
//!   update 5-fold; weight decay on the wrong tensors moves them by `3·lr·wd·|p|`, ~1e-4
//!   for the weights here (decay of biases and LayerNorm is checked exactly in
//!   `tests/training.rs`).

use std::path::{Path, PathBuf};

use andrea_core::IGNORE_INDEX;
use andrea_cpu::CpuBackend;
use andrea_model::{Model, OptimizerConfig, Trainer};
use andrea_testkit::Tol;
use safetensors::tensor::Dtype;
use safetensors::SafeTensors;

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures")
}

struct Expected<'a>(SafeTensors<'a>);

impl Expected<'_> {
    fn f64s(&self, name: &str) -> Vec<f64> {
        let t = self
            .0
            .tensor(name)
            .unwrap_or_else(|_| panic!("fixture has no {name}"));
        let d = t.data();
        match t.dtype() {
            Dtype::F32 => d
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes(b.try_into().unwrap()) as f64)
                .collect(),
            Dtype::F64 => d
                .chunks_exact(8)
                .map(|b| f64::from_le_bytes(b.try_into().unwrap()))
                .collect(),
            other => panic!("{name}: unexpected dtype {other:?}"),
        }
    }

    fn ids(&self, name: &str) -> Vec<u32> {
        let t = self.0.tensor(name).unwrap();
        assert_eq!(t.dtype(), Dtype::I64);
        t.data()
            .chunks_exact(8)
            .map(|b| match i64::from_le_bytes(b.try_into().unwrap()) {
                -100 => IGNORE_INDEX,
                id => id as u32,
            })
            .collect()
    }
}

/// Checks and returns the worst |got - want| / bound.
fn check(tol: Tol, name: &str, got: &[f32], want: &[f64]) -> f64 {
    tol.check(name, got, want).unwrap();
    got.iter()
        .zip(want)
        .map(|(g, w)| (*g as f64 - w).abs() / tol.bound(*w))
        .fold(0.0, f64::max)
}

fn scaled(want: &[f64], abs_of_max: f64, rel: f64) -> Tol {
    let max = want.iter().fold(0.0f64, |m, x| m.max(x.abs()));
    Tol::new(abs_of_max * max, rel)
}

#[test]
fn matches_transformers_gpt2_logits_loss_gradients_and_adamw_steps() {
    let dir = fixtures();
    let expected_path = dir.join("hf_tiny_expected.safetensors");
    // The fixtures are committed: missing ones are a broken checkout, not a reason to
    // pass without checking anything.
    for f in [
        &expected_path,
        &dir.join("hf_tiny/model.safetensors"),
        &dir.join("hf_tiny/config.json"),
    ] {
        assert!(
            f.is_file(),
            "the fixture {} is missing: restore it from git, or regenerate the fixtures with \
             `python crates/andrea-model/scripts/make_fixtures.py` (torch + transformers)",
            f.display()
        );
    }
    let bytes = std::fs::read(&expected_path).unwrap();
    let (_, meta) = SafeTensors::read_metadata(&bytes).unwrap();
    let meta = meta.metadata().clone().unwrap();
    let hyper = |k: &str| meta[k].parse::<f32>().unwrap();
    let want = Expected(SafeTensors::deserialize(&bytes).unwrap());

    let model = Model::load(CpuBackend::new(), dir.join("hf_tiny")).unwrap();
    assert_eq!(model.config().vocab_size, 8449);
    let names: Vec<String> = model
        .params()
        .iter()
        .map(|p| p.name().to_string())
        .collect();
    let opt = OptimizerConfig {
        lr: hyper("lr"),
        beta1: hyper("beta1"),
        beta2: hyper("beta2"),
        eps: hyper("eps"),
        weight_decay: hyper("weight_decay"),
        grad_clip: Some(hyper("grad_clip")),
    };
    let mut trainer = Trainer::new(model, opt.clone(), 2, 8).unwrap();
    let batch = |i: usize| {
        (
            want.ids(&format!("tokens.{i}")),
            want.ids(&format!("targets.{i}")),
        )
    };
    let mut worst: Vec<(f64, String)> = Vec::new();
    let rel = Tol::new(0.0, 1e-5);

    // Forward, loss and every gradient on batch 0.
    let (tokens, targets) = batch(0);
    let loss = trainer.forward(&tokens, &targets).unwrap();
    worst.push((
        check(rel, "loss", &[loss], &want.f64s("loss")),
        "loss".into(),
    ));
    let logits = trainer.logits().unwrap();
    let tol = Tol::new(1e-5, 1e-5);
    worst.push((
        check(tol, "logits", &logits, &want.f64s("logits")),
        "logits".into(),
    ));
    trainer.backward().unwrap();
    for name in &names {
        let g = want.f64s(&format!("grad.{name}"));
        let got = trainer.read_grad(name).unwrap();
        worst.push((
            check(scaled(&g, 1e-5, 1e-3), name, &got, &g),
            format!("grad {name}"),
        ));
    }
    trainer.zero_grad().unwrap();

    // Three AdamW steps with clipping, one batch each.
    let (step_loss, grad_norm) = (want.f64s("step_loss"), want.f64s("grad_norm"));
    for i in 0..3 {
        let (tokens, targets) = batch(i);
        let loss = trainer.forward(&tokens, &targets).unwrap();
        trainer.backward().unwrap();
        let stats = trainer.step(opt.lr).unwrap();
        assert!(
            stats.clip_scale < 1.0,
            "clipping should take effect: {stats:?}"
        );
        worst.push((
            check(rel, "step loss", &[loss], &step_loss[i..=i]),
            format!("step {i} loss"),
        ));
        worst.push((
            check(rel, "grad norm", &[stats.grad_norm], &grad_norm[i..=i]),
            format!("step {i} grad norm"),
        ));
    }
    for name in &names {
        let p = want.f64s(&format!("final.{name}"));
        let got = trainer.model().read_param(name).unwrap();
        // Adam normalises each update to about `lr`, so an element whose gradient is near
        // the float32 noise of its tensor moves in a slightly different direction: the
        // bound is in units of lr (measured worst 4.8e-4·lr).
        let tol = Tol::new(5e-3 * opt.lr as f64, 1e-5);
        worst.push((check(tol, name, &got, &p), format!("final {name}")));
    }
    let (tokens, targets) = batch(0);
    let loss = trainer.forward(&tokens, &targets).unwrap();
    worst.push((
        check(rel, "final loss", &[loss], &want.f64s("final_loss")),
        "final loss".into(),
    ));

    worst.sort_by(|a, b| b.0.total_cmp(&a.0));
    eprintln!("transformers fixtures: worst |error| / bound:");
    for (r, what) in worst.iter().take(5) {
        eprintln!("  {r:.3}  {what}");
    }
}
