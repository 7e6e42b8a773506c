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

/// Every backward pass writes its gradient without reading the buffer: after a step (or
/// `zero_grad`) the buffer still holds the old gradient, and here NaN in every element
/// of both gradient buffers, yet one or two micro-batches give bit for bit what a fresh
/// trainer's zeroed buffers give. Fails if any op added onto the old contents (a weight
/// product left as `matmul_add`, or a tensor whose op adds left out of the zeroing).
#[test]
fn backward_writes_the_gradient_whatever_the_buffer_held() {
    let cfg = ModelConfig::new(70, 16, 32, 2, 2);
    let x: Vec<u32> = (0..32).map(|i| (i * 7 + 3) % 70).collect();
    let y: Vec<u32> = (0..32).map(|i| (i * 11 + 5) % 70).collect();
    let grads = |tr: &Trainer<CpuBackend>| -> Vec<f32> {
        let mut host = vec![0.0; tr.model.layout().len];
        tr.model
            .backend()
            .download(View::whole(&tr.grads), &mut host)
            .unwrap();
        host
    };
    let trainer = || {
        let model = Model::new(CpuBackend::new(), cfg.clone(), 3).unwrap();
        Trainer::new(model, OptimizerConfig::default(), 2, 16).unwrap()
    };
    for micro in [1, 2] {
        let mut fresh = trainer();
        let mut used = trainer();
        used.reserve_accumulation().unwrap();
        // Some other gradient first, forgotten; then NaN everywhere in both buffers.
        used.forward_train(&y, &x).unwrap();
        used.backward().unwrap();
        used.zero_grad().unwrap();
        assert_eq!(used.grad_norm().unwrap(), 0.0);
        // Every tensor (`wte` with its padding rows); the alignment gaps between tensors
        // are written by nothing and stay zero.
        let (be, layout) = (used.model.backend(), used.model.layout());
        let slots = layout.params().iter().map(|p| p.slot);
        for slot in slots.chain([layout.wte_padded]) {
            let nan = vec![f32::NAN; slot.shape.numel()];
            for buf in [&used.grads, used.micro_grads.as_ref().unwrap()] {
                be.upload(&nan, slot.on(buf)).unwrap();
            }
        }
        assert!(used
            .read_grad("transformer.h.0.mlp.c_fc.weight")
            .unwrap()
            .iter()
            .all(|&g| g == 0.0));
        for tr in [&mut fresh, &mut used] {
            for (tokens, targets) in [(&x, &y), (&y, &x)].into_iter().take(micro) {
                tr.forward_train(tokens, targets).unwrap();
                tr.backward().unwrap();
            }
        }
        let (want, got) = (grads(&fresh), grads(&used));
        assert!(want.iter().all(|g| g.is_finite()));
        let same = want
            .iter()
            .zip(&got)
            .all(|(a, b)| a.to_bits() == b.to_bits());
        assert!(
            same,
            "{micro} micro-batch(es): the gradient depends on the buffer's old contents"
        );
    }
}
