//! Generation on the CPU backend in BF16 precision against FP32: teacher-forced, the
//! path of `andrea generate` (prefill, then one token at a time through the KV cache),
//! on the shipped tiny config trained briefly on one sequence so that its predictions
//! are confident (a freshly initialised model's logits are nearly flat, and every
//! position would be a near tie).
//!
//! Tolerance of the logits: `model_vs_cpu.rs`'s BF16 tolerance (andrea-cuda's tests,
//! where it is derived): each product's operands rounded to BF16 (`u_op = 2⁻⁸`) give
//! relative errors up to `2·u_op` per product of `Σ|a|·|b|`, through the model's chain of
//! products; `abs = 4e-2·scale`, `rel = 4e-2` (`scale` the largest |logit|).
//!
//! Greedy tokens: at each position the argmax of the BF16 logits is compared with FP32's.
//! Where FP32's two best logits `l₁ ≥ l₂` are closer than the logits' error allows
//! (`l₁ − l₂ <= e(l₁) + e(l₂)`, `e(l) = 4e-2·scale + 4e-2·|l|`), either token is a correct
//! answer; everywhere else BF16 must pick FP32's token, and at least half the positions
//! must be decisive (else the check says little). As `gpu_check agree` does on a GPU.

mod common;

use andrea_core::{MatmulPrecision, ModelConfig};
use andrea_cpu::CpuBackend;
use andrea_model::{Model, OptimizerConfig, Trainer};
use andrea_testkit::tol::top2;
use andrea_testkit::Tol;
use common::{tiny, tokens};

const ABS_OF_SCALE: f64 = 4e-2;
const REL: f64 = 4e-2;
const PROMPT: usize = 8;

/// A tiny model trained for a few steps to predict `seq` (`[65]`), saved in `dir`.
fn trained(cfg: &ModelConfig, seq: &[u32], dir: &std::path::Path) {
    let model = Model::new(CpuBackend::with_threads(2).unwrap(), cfg.clone(), 1).unwrap();
    let opt = OptimizerConfig {
        lr: 3e-3,
        weight_decay: 0.0,
        ..OptimizerConfig::default()
    };
    let mut tr = Trainer::new(model, opt, 1, 64).unwrap();
    let (x, y) = (&seq[..64], &seq[1..65]);
    for _ in 0..30 {
        tr.train_step(&[(x, y)], 3e-3).unwrap();
    }
    tr.model().save(dir).unwrap();
}

/// Teacher-forced logits after the prompt and after each later token of `seq`.
fn logits(be: CpuBackend, dir: &std::path::Path, seq: &[u32]) -> Vec<Vec<f32>> {
    let model = Model::load(be, dir).unwrap();
    let mut cache = model.kv_cache(1, seq.len()).unwrap();
    let mut out = vec![model.extend(&mut cache, &seq[..PROMPT]).unwrap().to_vec()];
    for &t in &seq[PROMPT..seq.len() - 1] {
        out.push(model.extend(&mut cache, &[t]).unwrap().to_vec());
    }
    out
}

fn bf16(threads: usize) -> CpuBackend {
    CpuBackend::with_threads(threads)
        .unwrap()
        .with_precision(MatmulPrecision::Bf16)
        .unwrap()
}

#[test]
fn bf16_decoding_picks_fp32_tokens_wherever_the_margin_is_decisive() {
    let cfg = tiny();
    let seq = tokens(65, cfg.vocab_size, 11);
    let dir = tempfile::tempdir().unwrap();
    trained(&cfg, &seq, dir.path());
    let want = logits(CpuBackend::with_threads(2).unwrap(), dir.path(), &seq);
    let got = logits(bf16(2), dir.path(), &seq);
    assert_eq!(
        got,
        logits(bf16(1), dir.path(), &seq),
        "BF16 decoding differs between 2 threads and 1"
    );
    assert_eq!(got, logits(bf16(3), dir.path(), &seq), "... and 3");
    let (mut decisive, mut flips, mut differ) = (0, Vec::new(), 0);
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        let scale = w.iter().fold(0f64, |m, &l| m.max(f64::from(l).abs()));
        let w64: Vec<f64> = w.iter().map(|&l| l as f64).collect();
        Tol::new(ABS_OF_SCALE * scale, REL)
            .check(&format!("logits at position {}", PROMPT + i), g, &w64)
            .unwrap();
        differ += usize::from(g != w);
        let (best, l1, l2) = top2(w);
        let e = |l: f32| ABS_OF_SCALE * scale + REL * f64::from(l).abs();
        if f64::from(l1 - l2) > e(l1) + e(l2) {
            decisive += 1;
            if top2(g).0 != best {
                flips.push((PROMPT + i, best, top2(g).0));
            }
        }
    }
    let n = want.len();
    println!("BF16 vs FP32: {decisive} of {n} positions decisive, flips {flips:?}");
    assert!(
        flips.is_empty(),
        "BF16 picked other tokens at (position, fp32, bf16) {flips:?}"
    );
    assert!(
        2 * decisive >= n,
        "only {decisive} of {n} positions decisive"
    );
    // BF16 is not FP32 here: the products did round their operands.
    assert!(
        differ == n,
        "BF16 logits equal FP32's at {} positions",
        n - differ
    );
}
