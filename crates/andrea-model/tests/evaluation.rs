//! The loss path without training memory: [`Model::loss`] over an [`Evaluator`] and
//! [`Trainer::evaluate`] give bit for bit the loss of [`Trainer::forward`], and the
//! evaluator and the KV cache hold less than a trainer, by the sizes they report.

mod common;

use andrea_core::IGNORE_INDEX;
use andrea_cpu::CpuBackend;
use andrea_model::{MemoryPlan, Model, ModelError, OptimizerConfig, Trainer};
use common::{small, tiny, tokens};

#[test]
fn evaluation_loss_is_the_trainers_forward_loss_bit_for_bit() {
    let cfg = small();
    let (batch, seq) = (3, 16);
    let model = Model::new(CpuBackend::new(), cfg.clone(), 5).unwrap();
    let mut tr = Trainer::new(model, OptimizerConfig::default(), batch, seq).unwrap();
    let mut ev = tr.model().evaluator(batch, seq).unwrap();
    assert_eq!(ev.shape(), (batch, seq));
    let x = tokens(batch * seq, cfg.vocab_size, 11);
    let y = tokens(batch * seq, cfg.vocab_size, 12);
    // A few steps first, so the weights are not the initialisation's.
    for _ in 0..3 {
        tr.train_step(&[(&x, &y)], 1e-2).unwrap();
    }
    let mut y_ignored = tokens(batch * seq, cfg.vocab_size, 13);
    y_ignored[5] = IGNORE_INDEX;
    y_ignored[20] = IGNORE_INDEX;
    // Full batch, a batch of fewer sequences, and ignored targets.
    let cases: [(&[u32], &[u32]); 3] = [(&x, &y), (&x[..seq], &y[..seq]), (&x, &y_ignored)];
    for (tokens, targets) in cases {
        let eval = tr.model().loss(&mut ev, tokens, targets).unwrap();
        let in_trainer = tr.evaluate(tokens, targets).unwrap();
        let forward = tr.forward(tokens, targets).unwrap();
        assert_eq!(eval.to_bits(), forward.to_bits(), "{eval} vs {forward}");
        assert_eq!(in_trainer.to_bits(), forward.to_bits());
    }
    // The evaluation is of the batch given: another batch has another loss.
    let other = tr.model().loss(&mut ev, &y, &x).unwrap();
    assert_ne!(other, tr.model().loss(&mut ev, &x, &y).unwrap());
}

#[test]
fn the_evaluator_and_the_kv_cache_hold_less_than_a_trainer() {
    let cfg = tiny();
    let (batch, seq) = (4, 64);
    let be = CpuBackend::new();
    let model = Model::new(CpuBackend::new(), cfg.clone(), 0).unwrap();
    let ev = model.evaluator(batch, seq).unwrap();
    let cache = model.kv_cache(batch, seq).unwrap();
    let tr = Trainer::new(model, OptimizerConfig::default(), batch, seq).unwrap();
    let (train, eval, gen) = (tr.memory(), ev.memory(), cache.memory());
    println!("training {train}\nevaluation {eval}\ngeneration {gen}");
    // What the objects hold is what the plans computed from the config say.
    assert_eq!(eval, MemoryPlan::evaluation(&be, &cfg, batch, seq));
    assert_eq!(gen, MemoryPlan::generation(&be, &cfg, batch, seq));
    assert_eq!(train, MemoryPlan::new(&be, &cfg, batch, seq));
    assert_eq!(eval.parameters, train.parameters);
    assert_eq!((eval.gradients, eval.optimizer, eval.kv_cache), (0, 0, 0));
    assert_eq!((gen.gradients, gen.optimizer), (0, 0));
    assert!(gen.kv_cache > 0);
    // Every block's activations (training) against one block's scratch (evaluation);
    // at this size the [N, vocab] logits, which both hold, are most of it.
    assert!(eval.activations < train.activations);
    assert!(eval.total() + train.gradients + train.optimizer < train.total());
    assert!(gen.activations < eval.activations);
    assert!(eval.to_string().contains("activations") && !eval.to_string().contains("AdamW"));

    // ANDREA-120M at 8 x 1024 (plans only, nothing allocated): 12 blocks' activations
    // against one block's scratch.
    let big = andrea_core::ModelConfig::andrea_120m();
    let train = MemoryPlan::new(&be, &big, 8, 1024);
    let eval = MemoryPlan::evaluation(&be, &big, 8, 1024);
    println!("ANDREA-120M at 8 x 1024: training {train}, evaluation {eval}");
    assert!(
        eval.activations * 4 < train.activations,
        "{eval} vs {train}"
    );
    assert!(eval.total() * 4 < train.total());
}

#[test]
fn evaluator_errors_name_the_problem() {
    let cfg = small();
    let model = Model::new(CpuBackend::new(), cfg.clone(), 1).unwrap();
    let mut ev = model.evaluator(2, 8).unwrap();
    let x = tokens(24, cfg.vocab_size, 1);
    let e = model.loss(&mut ev, &x, &x).unwrap_err();
    assert!(
        matches!(e, ModelError::BadBatch { .. }) && e.to_string().contains("evaluator"),
        "{e}"
    );
    let e = model
        .loss(&mut ev, &x[..8], &[IGNORE_INDEX; 8])
        .unwrap_err();
    assert!(e.to_string().contains("IGNORE_INDEX"), "{e}");
    let mut bad = x[..8].to_vec();
    bad[3] = cfg.vocab_size as u32;
    let e = model.loss(&mut ev, &bad, &x[..8]).unwrap_err();
    assert!(
        matches!(e, ModelError::TokenOutOfRange { index: 3, .. }),
        "{e}"
    );
    assert!(matches!(
        model.evaluator(1, cfg.context_length + 1),
        Err(ModelError::SequenceTooLong { .. })
    ));
    assert!(model.evaluator(0, 8).is_err());
    let other = Model::new(CpuBackend::new(), tiny(), 1).unwrap();
    let e = other.loss(&mut ev, &x[..8], &x[..8]).unwrap_err();
    assert!(e.to_string().contains("another config"), "{e}");
}
