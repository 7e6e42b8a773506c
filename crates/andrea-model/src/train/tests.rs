//! Unit tests of the trainer's internals (padding rows, the non-finite guard).

use super::*;
use andrea_core::prelude::*;
use andrea_core::{ModelConfig, View};
use andrea_cpu::CpuBackend;

/// The padding rows of `wte` (vocab 70 -> 128 rows) stay zero through training:
/// parameters, gradients and both AdamW moments.
#[test]
fn padded_vocabulary_rows_stay_zero() {
    let cfg = ModelConfig::new(70, 8, 16, 1, 2);
    let model = Model::new(CpuBackend::new(), cfg.clone(), 1).unwrap();
    let mut tr = Trainer::new(model, OptimizerConfig::default(), 2, 8).unwrap();
    let x: Vec<u32> = (0..16).map(|i| (i * 5) % 70).collect();
    let padding = |tr: &Trainer<CpuBackend>, buf: &<CpuBackend as MemoryOps>::Buffer| {
        let wte = tr.model.layout().wte_padded;
        let (v, vp, c) = (cfg.vocab_size, cfg.padded_vocab_size(), cfg.d_model);
        let view = View::new(buf, wte.offset + v * c, [(vp - v) * c]);
        let mut host = vec![1.0; view.numel()];
        tr.model.backend().download(view, &mut host).unwrap();
        host.iter().all(|&x| x == 0.0)
    };
    for _ in 0..3 {
        tr.forward(&x, &x).unwrap();
        tr.backward().unwrap();
        assert!(padding(&tr, &tr.grads));
        tr.step(1e-2).unwrap();
        assert!(padding(&tr, tr.model.buffer()));
        assert!(padding(&tr, &tr.m) && padding(&tr, &tr.v));
    }
    // The logits the trainer shows have the real vocabulary only.
    tr.forward(&x, &x).unwrap();
    assert_eq!(tr.logits().unwrap().len(), 16 * 70);
}

/// A NaN gradient is reported with the step number, and the step changes nothing.
#[test]
fn a_non_finite_gradient_norm_is_an_error_and_no_update() {
    let cfg = ModelConfig::new(70, 8, 16, 1, 2);
    let model = Model::new(CpuBackend::new(), cfg, 2).unwrap();
    let mut tr = Trainer::new(model, OptimizerConfig::default(), 1, 8).unwrap();
    let x: Vec<u32> = (0..8).collect();
    tr.train_step(&[(&x, &x)], 1e-3).unwrap();
    tr.forward(&x, &x).unwrap();
    tr.backward().unwrap();
    let name = "transformer.h.0.mlp.c_fc.bias";
    let before = tr.model().read_param(name).unwrap();
    let p = tr.model.layout().get(name).unwrap().slot;
    let nan = vec![f32::NAN; p.shape.numel()];
    tr.model.backend().upload(&nan, p.on(&tr.grads)).unwrap();
    let e = tr.step(1e-3).unwrap_err();
    assert!(
        matches!(
            e,
            ModelError::NonFinite {
                step: 2,
                what: "gradient norm",
                ..
            }
        ),
        "{e}"
    );
    assert_eq!(tr.model().read_param(name).unwrap(), before);
    assert_eq!(tr.steps(), 1);
}
