//! Proof (c), inference: the KV-cache path (prefill, then one token at a time; batches;
//! chunked prefill) gives the logits of the full forward pass at every position, and
//! generation uses it.

mod common;

use andrea_core::ModelConfig;
use andrea_cpu::CpuBackend;
use andrea_model::{Model, ModelError, OptimizerConfig, Sampler, Trainer, PREFILL_CHUNK};
use andrea_testkit::Tol;
use common::{small, tokens};

/// Full-forward logits `[b, t, V]` of `x` through a trainer (the training code path).
fn full_logits(
    model: Model<CpuBackend>,
    x: &[u32],
    b: usize,
    t: usize,
) -> (Model<CpuBackend>, Vec<f32>) {
    let mut tr = Trainer::new(model, OptimizerConfig::default(), b, t).unwrap();
    tr.forward(x, x).unwrap();
    let logits = tr.logits().unwrap();
    (tr.into_model(), logits)
}

/// Float32 rounding differs between the two paths (different GEMM shapes); a wrong
/// position, mask or cache slot is off by the logits' own size (~0.1-1).
const TOL: Tol = Tol::new(2e-5, 2e-5);

#[test]
fn kv_cache_equals_full_forward_at_every_position() {
    let cfg = small();
    let (b, t, v) = (2, 12, cfg.vocab_size);
    let model = Model::new(CpuBackend::new(), cfg.clone(), 7).unwrap();
    let x = tokens(b * t, v, 20);
    let (model, full) = full_logits(model, &x, b, t);
    let at = |bi: usize, pos: usize| &full[(bi * t + pos) * v..(bi * t + pos + 1) * v];

    let prompt = 3;
    let mut cache = model.kv_cache(b, t).unwrap();
    let first: Vec<u32> = (0..b)
        .flat_map(|bi| x[bi * t..bi * t + prompt].to_vec())
        .collect();
    let logits = model.extend(&mut cache, &first).unwrap().to_vec();
    for bi in 0..b {
        let want: Vec<f64> = at(bi, prompt - 1).iter().map(|&z| z as f64).collect();
        TOL.check("prefill", &logits[bi * v..(bi + 1) * v], &want)
            .unwrap();
    }
    for pos in prompt..t {
        let next: Vec<u32> = (0..b).map(|bi| x[bi * t + pos]).collect();
        let logits = model.extend(&mut cache, &next).unwrap().to_vec();
        for bi in 0..b {
            let want: Vec<f64> = at(bi, pos).iter().map(|&z| z as f64).collect();
            TOL.check(
                &format!("decode position {pos}, sequence {bi}"),
                &logits[bi * v..(bi + 1) * v],
                &want,
            )
            .unwrap();
        }
    }
    assert_eq!(cache.len(), t);
    let e = model.extend(&mut cache, &[1, 2]).unwrap_err();
    assert!(e.to_string().contains("capacity of 12"), "{e}");
}

/// Batch 1, one token at a time from position 0: on the CPU backend all the blocks are
/// then one job (`decode_blocks`, whose tasks each thread claims as it comes). Against the
/// full forward at every position, on 1, 2 and 3 threads (the same bits on all), for a
/// model whose heads are 32 wide (the AVX-512 weighted sum) with three MLP bands, and one
/// whose 40 channels give 8-wide heads and a short last band (128 + 32 hidden columns).
#[test]
fn one_sequence_token_by_token_equals_full_forward_on_any_thread_count() {
    for (d_model, heads) in [(96, 3), (40, 5)] {
        let cfg = ModelConfig::new(70, 24, d_model, 2, heads);
        let (t, v) = (24, cfg.vocab_size);
        let x = tokens(t, v, 21);
        let mut by_threads = Vec::new();
        for threads in [1, 2, 3] {
            let be = CpuBackend::with_threads(threads).unwrap();
            let model = Model::new(be, cfg.clone(), 7).unwrap();
            let (model, full) = full_logits(model, &x, 1, t);
            let mut cache = model.kv_cache(1, t).unwrap();
            let mut all = Vec::new();
            for pos in 0..t {
                let logits = model.extend(&mut cache, &x[pos..pos + 1]).unwrap().to_vec();
                let want: Vec<f64> = full[pos * v..(pos + 1) * v]
                    .iter()
                    .map(|&z| z as f64)
                    .collect();
                TOL.check(
                    &format!("C {d_model}, {threads} threads, position {pos}"),
                    &logits,
                    &want,
                )
                .unwrap();
                all.extend(logits);
            }
            by_threads.push(all);
        }
        for (i, other) in by_threads.iter().enumerate().skip(1) {
            assert!(
                by_threads[0] == *other,
                "C {d_model}: 1 and {} threads decode different bits",
                i + 1
            );
        }
    }
}

#[test]
fn long_prompts_are_prefilled_in_chunks_with_the_same_result() {
    let cfg = ModelConfig::new(50, PREFILL_CHUNK + 40, 16, 2, 2);
    let t = PREFILL_CHUNK + 30;
    let model = Model::new(CpuBackend::new(), cfg.clone(), 8).unwrap();
    let x = tokens(t, cfg.vocab_size, 21);
    let (model, full) = full_logits(model, &x, 1, t);
    let mut cache = model.kv_cache(1, cfg.context_length).unwrap();
    let logits = model.extend(&mut cache, &x).unwrap();
    let want: Vec<f64> = full[(t - 1) * 50..].iter().map(|&z| z as f64).collect();
    TOL.check("chunked prefill", logits, &want).unwrap();
}

/// `extend_with` hands each sequence, in order, the logits `extend` returns: read in
/// place on the CPU backend, downloaded on one whose memory is not the host's (the naive
/// reference backend). Checked for a prefill and for decoded tokens of a batch of two.
#[test]
fn extend_with_hands_each_sequence_the_logits_extend_returns() {
    fn check<B: andrea_core::Backend>(be: impl Fn() -> B) {
        let cfg = small();
        let v = cfg.vocab_size;
        let (a, b) = (
            Model::new(be(), cfg.clone(), 12).unwrap(),
            Model::new(be(), cfg.clone(), 12).unwrap(),
        );
        let (mut ca, mut cb) = (a.kv_cache(2, 8).unwrap(), b.kv_cache(2, 8).unwrap());
        for fed in [tokens(6, v, 30), tokens(2, v, 31), tokens(2, v, 32)] {
            let want = a.extend(&mut ca, &fed).unwrap().to_vec();
            let mut got = Vec::new();
            b.extend_with(&mut cb, &fed, |s, logits| {
                assert_eq!(s, got.len() / v, "sequences in order");
                got.extend_from_slice(logits);
            })
            .unwrap();
            assert_eq!(got, want, "fed {fed:?}");
        }
        let e = b.extend_with(&mut cb, &[1, 2, 3], |_, _| panic!("no logits for an error"));
        assert!(e.unwrap_err().to_string().contains("2 sequences"));
    }
    check(CpuBackend::new);
    check(andrea_testkit::naive::NaiveBackend::new);
}

#[test]
fn generation_is_reproducible_and_batches_agree() {
    let cfg = small();
    let model = Model::new(CpuBackend::new(), cfg.clone(), 9).unwrap();
    let prompt = tokens(5, cfg.vocab_size, 22);
    let greedy = model.generate(&prompt, 10, &mut Sampler::greedy()).unwrap();
    assert_eq!(greedy.len(), 10);
    let both = model
        .generate_batch(&[&prompt, &prompt], 10, &mut Sampler::greedy())
        .unwrap();
    assert_eq!(both, [greedy.clone(), greedy.clone()]);

    // Greedy decoding picks the argmax of the full forward pass over the sequence so far.
    let mut seq = prompt.clone();
    seq.extend(&greedy[..4]);
    let (model, full) = full_logits(model, &seq, 1, seq.len());
    let last = &full[(seq.len() - 1) * cfg.vocab_size..];
    let argmax = (0..last.len()).fold(0, |b, i| if last[i] > last[b] { i } else { b });
    assert_eq!(greedy[4], argmax as u32);

    let sample = |seed| {
        let mut s = Sampler::new(0.8, seed)
            .unwrap()
            .with_top_k(20)
            .unwrap()
            .with_top_p(0.9)
            .unwrap();
        model.generate(&prompt, 8, &mut s).unwrap()
    };
    assert_eq!(sample(1), sample(1));
    assert!(sample(1)
        .iter()
        .chain(&sample(2))
        .all(|&id| (id as usize) < cfg.vocab_size));
}

#[test]
fn bad_generation_input_is_an_error() {
    let cfg = small();
    let model = Model::new(CpuBackend::new(), cfg.clone(), 10).unwrap();
    let e = model.kv_cache(1, 33).unwrap_err();
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
    let e = model
        .generate(&[1; 30], 4, &mut Sampler::greedy())
        .unwrap_err();
    assert!(
        e.to_string()
            .contains("33 tokens is longer than the model's context length 32"),
        "{e}"
    );
    let e = model
        .generate(&[1, 70], 1, &mut Sampler::greedy())
        .unwrap_err();
    assert!(e.to_string().contains("token id 70"), "{e}");
    assert!(model.generate(&[], 1, &mut Sampler::greedy()).is_err());
    assert!(model
        .generate_batch(&[&[1, 2], &[3]], 1, &mut Sampler::greedy())
        .is_err());
    let mut cache = model.kv_cache(2, 8).unwrap();
    assert!(model
        .extend(&mut cache, &[1, 2, 3])
        .unwrap_err()
        .to_string()
        .contains("2 sequences"));
    let other = Model::new(CpuBackend::new(), ModelConfig::new(70, 32, 16, 1, 2), 0).unwrap();
    assert!(other.extend(&mut cache, &[1, 2]).is_err());
    assert_eq!(
        model.generate(&[1], 0, &mut Sampler::greedy()).unwrap(),
        Vec::<u32>::new()
    );
}
