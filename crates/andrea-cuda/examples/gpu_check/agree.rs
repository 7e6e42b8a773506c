//! `gpu_check agree --checkpoint DIR --data SHARD [--prompt 16] [--tokens 48]`: what
//! generation would pick on the CPU and on the GPU (FP32), teacher-forced. Both backends
//! load the checkpoint, prefill the shard's first `--prompt` tokens into a KV cache and
//! then decode the next `--tokens - 1` of the shard one at a time (the path of
//! `andrea generate`), so at every one of the `--tokens` positions both see the same
//! history and a disagreement cannot carry over to the positions after it.
//!
//! At each position the argmax of the two backends' logits is compared. Where the CPU's
//! two best logits `l₁ ≥ l₂` are closer than the logits' error allows, either token is a
//! correct answer and a disagreement there is not counted. The error bound is
//! tests/model_vs_cpu.rs's FP32 tolerance for the logits of its 2-block model (where it
//! is derived; the emulator meets it at 0.02 of it), doubled for a model up to four times
//! as deep (rounding errors of random sign grow like the square root of their number):
//! `e(l) = 2·(3e-5·max|l| + 3e-5·|l|)`. A GPU picks the runner-up only if
//! `l₁ − l₂ ≤ e(l₁) + e(l₂)`, so positions with a larger margin are decisive, and a
//! correct backend agrees at every one of them: the check fails below 100% agreement
//! there, and when fewer than half the positions are decisive (it would then say little).
//! It also reports the agreement over all positions.

use andrea_core::prelude::*;
use andrea_cpu::CpuBackend;
use andrea_cuda::Precision;
use andrea_model::Model;
use andrea_tokenizer::TokenShard;

use super::{backend, device, emit, Flags, Res};

/// Relative FP32 logit tolerance of tests/model_vs_cpu.rs (its `abs` is this times the
/// largest |logit|), doubled for depth (see the module docs).
const LOGIT_TOL: f64 = 2.0 * 3e-5;

/// Teacher-forced logits `[tokens.len() - prompt, vocab]`, as generation computes them.
fn logits<B: Backend>(model: &Model<B>, tokens: &[u32], prompt: usize) -> Res<Vec<Vec<f32>>> {
    let mut cache = model
        .kv_cache(1, tokens.len())
        .map_err(device("kv_cache"))?;
    let mut out = vec![model
        .extend(&mut cache, &tokens[..prompt])
        .map_err(device("prefill"))?
        .to_vec()];
    for &t in &tokens[prompt..tokens.len() - 1] {
        out.push(
            model
                .extend(&mut cache, &[t])
                .map_err(device("decode"))?
                .to_vec(),
        );
    }
    Ok(out)
}

/// The best and second-best entries of a row: (index of the best, l₁, l₂).
fn top2(row: &[f32]) -> (usize, f32, f32) {
    let mut best = (0, f32::NEG_INFINITY, f32::NEG_INFINITY);
    for (i, &l) in row.iter().enumerate() {
        if l > best.1 {
            best = (i, l, best.1);
        } else if l > best.2 {
            best.2 = l;
        }
    }
    best
}

fn argmax(row: &[f32]) -> usize {
    top2(row).0
}

/// The margin a position needs to be decisive: `e(l₁) + e(l₂)` (module docs).
fn margin_bound(row: &[f32], l1: f32, l2: f32) -> f64 {
    let scale = row.iter().fold(0f64, |m, &l| m.max(f64::from(l).abs()));
    LOGIT_TOL * (2.0 * scale + f64::from(l1).abs() + f64::from(l2).abs())
}

pub fn agree(flags: &Flags) -> Res<bool> {
    let checkpoint = flags.text("checkpoint", "");
    let data = flags.text("data", "");
    if checkpoint.is_empty() || data.is_empty() {
        return Err("agree needs --checkpoint DIR and --data SHARD".into());
    }
    let prompt = flags.usize("prompt", 16)?.max(1);
    let n = flags.usize("tokens", 48)?.max(1);
    let shard = TokenShard::open(&data).map_err(device(&data))?;
    if shard.len() < prompt + n {
        return Err(format!(
            "{data}: {} tokens, fewer than --prompt {prompt} + --tokens {n}",
            shard.len()
        ));
    }
    let tokens: Vec<u32> = shard.tokens()[..prompt + n]
        .iter()
        .map(|&t| u32::from(t))
        .collect();
    let cpu = Model::load(CpuBackend::new(), &checkpoint).map_err(device(&checkpoint))?;
    let gpu = Model::load(backend(Precision::FP32)?, &checkpoint).map_err(device(&checkpoint))?;
    let context = cpu.config().context_length;
    if tokens.len() > context {
        return Err(format!(
            "--prompt {prompt} + --tokens {n} is more than the model's context, {context}"
        ));
    }
    let want = logits(&cpu, &tokens, prompt)?;
    let got = logits(&gpu, &tokens, prompt)?;
    let (mut same, mut decisive, mut decisive_same) = (0, 0, 0);
    let mut flips = Vec::new();
    for (i, (w, g)) in want.iter().zip(&got).enumerate() {
        let (best, l1, l2) = top2(w);
        let agrees = argmax(g) == best;
        same += usize::from(agrees);
        let bound = margin_bound(w, l1, l2);
        if f64::from(l1 - l2) > bound {
            decisive += 1;
            decisive_same += usize::from(agrees);
            if !agrees {
                flips.push(serde_json::json!({
                    "position": prompt + i, "cpu": best, "gpu": argmax(g),
                    "cpu_margin": l1 - l2, "bound": bound,
                }));
            }
        }
    }
    let rate = decisive_same as f64 / decisive.max(1) as f64;
    let enough = 2 * decisive >= n;
    let pass = enough && decisive_same == decisive;
    emit(serde_json::json!({
        "phase": "cpu_vs_gpu", "check": "teacher-forced argmax, fp32", "positions": n,
        "agree_all": same as f64 / n as f64, "decisive": decisive,
        "agree_decisive": rate, "threshold": 1.0, "flips": flips, "pass": pass,
    }));
    if !enough {
        eprintln!(
            "agree: only {decisive} of {n} positions have a margin above the error bound; \
             the check needs at least half"
        );
    }
    Ok(pass)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn top_two_and_bound() {
        let row = [0.5, -3.0, 2.0, 1.5];
        assert_eq!(top2(&row), (2, 2.0, 1.5));
        assert_eq!(top2(&[1.0, 1.0]), (0, 1.0, 1.0));
        let b = margin_bound(&row, 2.0, 1.5);
        assert!((b - LOGIT_TOL * (6.0 + 3.5)).abs() < 1e-12, "{b}");
    }
}
