//! Bounds on every size a user controls, and the memory check made before a model or
//! a training step is allocated.
//!
//! The bounds are far above any run this program is for (ANDREA-120M trains at batch 8
//! to 64, context 1024) and low enough that products of them cannot overflow `usize`
//! before the memory check refuses them: a flag out of range is refused by the parser
//! with the range, a config value by [`check_step`], and a run that would not fit in
//! the machine's memory by [`check_fits`], naming the size and what to change.

use andrea::{Backend, MemoryPlan, ModelConfig};
use anyhow::{bail, Result};

/// `--batch-size`, `[training].batch_size`.
pub const MAX_BATCH: u64 = 1 << 16;
/// `--seq-len` (also at most the model's context length).
pub const MAX_SEQ: u64 = 1 << 20;
/// `--grad-accum`.
pub const MAX_GRAD_ACCUM: u64 = 1 << 20;
/// `--threads` (also at most [`max_threads`]).
pub const MAX_THREADS: u64 = 1024;
/// `tokenizer train --merges`: shards store ids as u16, so a vocabulary (256 bytes +
/// merges + `<|endoftext|>`) of more than 65536 ids could not be used to train.
pub const MAX_MERGES: u64 = (1 << 16) - 256 - 1;
/// `demo --corpus-bytes`: 8 GiB of generated text.
pub const MAX_CORPUS_BYTES: u64 = 1 << 33;
/// Text `tokenizer encode` takes (and ids text `tokenizer decode` reads): the ids are
/// printed, for looking at; `andrea prepare` turns a corpus of any size into shards.
pub const MAX_TEXT_BYTES: u64 = 64 << 20;

/// A parser for a `usize` flag in `LO..=HI` (clap prints the error with exit status 2).
pub fn in_range<const LO: u64, const HI: u64>(s: &str) -> Result<usize, String> {
    let v: u64 = s
        .trim()
        .parse()
        .map_err(|_| format!("`{s}` is not a whole number in {LO}..={HI}"))?;
    if !(LO..=HI).contains(&v) {
        return Err(format!("{v} is out of range: use a value in {LO}..={HI}"));
    }
    usize::try_from(v).map_err(|_| format!("{v} does not fit this machine's usize"))
}

/// Threads worth starting on this machine: `MAX_THREADS`, and at most 8 per core (more
/// only time-slice the same cores and take seconds to start).
pub fn max_threads() -> usize {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    (8 * cores).clamp(64, MAX_THREADS as usize)
}

/// Refuses a batch shape whose activations cannot even be counted (`usize` overflow)
/// or exceed 2^50 bytes; after it, [`MemoryPlan::new`]'s arithmetic is exact.
pub fn check_step(config: &ModelConfig, batch: usize, seq: usize) -> Result<()> {
    let size = |flag: &str, v: usize, max: u64| -> Result<()> {
        if v == 0 || v as u64 > max {
            bail!("{flag} must be in 1..={max}, got {v}");
        }
        Ok(())
    };
    size("--batch-size", batch, MAX_BATCH)?;
    size("--seq-len", seq, MAX_SEQ)?;
    // The largest activations of a step, each checked: logits [B·T, Vp], the MLP's
    // hidden [L, B·T, M], attention scores [L, B, H, T, T].
    let tokens = batch as u128 * seq as u128;
    let c = config;
    let worst = [
        tokens * c.padded_vocab_size() as u128,
        tokens * c.n_layer as u128 * (c.mlp_dim() as u128 + 8 * c.d_model as u128),
        tokens * seq as u128 * c.n_layer as u128 * c.n_head as u128,
    ];
    let floats: u128 = worst.iter().sum();
    if floats * 4 > 1 << 50 {
        bail!(
            "a training step of --batch-size {batch} x --seq-len {seq} on this model needs about {} of activations: \
             use a smaller --batch-size or --seq-len (or --grad-accum for the same tokens per step)",
            human(floats.saturating_mul(4))
        );
    }
    Ok(())
}

/// Bytes as `12.3 GiB`.
pub fn human(bytes: u128) -> String {
    const UNITS: [&str; 6] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
    let mut v = bytes as f64;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < UNITS.len() {
        v /= 1024.0;
        u += 1;
    }
    format!("{v:.1} {}", UNITS[u])
}

/// Memory this process may still take (Linux: `MemAvailable` + free swap from
/// `/proc/meminfo`); `None` where it is not known, which skips the check.
pub fn available_memory() -> Option<u128> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let field = |key: &str| -> Option<u128> {
        let line = text.lines().find(|l| l.starts_with(key))?;
        let kib: u128 = line[key.len()..]
            .trim()
            .trim_end_matches("kB")
            .trim()
            .parse()
            .ok()?;
        Some(kib * 1024)
    };
    Some(field("MemAvailable:")? + field("SwapFree:").unwrap_or(0))
}

/// Refuses `need` bytes of host memory for `what` when the machine does not have them
/// (CPU backend only: a GPU backend's allocations fail with an error of their own).
pub fn check_fits<B: Backend>(backend: &B, need: u128, what: &str, fix: &str) -> Result<()> {
    if !backend.name().to_ascii_lowercase().contains("cpu") {
        return Ok(());
    }
    if let Some(have) = available_memory() {
        if need > have {
            bail!(
                "{what} needs {} of memory but this machine has {} available: {fix}",
                human(need),
                human(have)
            );
        }
    }
    Ok(())
}

/// The training-memory check of `config` at `batch × seq`: sizes first, then the plan.
pub fn check_training<B: Backend>(
    backend: &B,
    config: &ModelConfig,
    batch: usize,
    seq: usize,
) -> Result<MemoryPlan> {
    check_step(config, batch, seq)?;
    let plan = MemoryPlan::new(backend, config, batch, seq);
    check_fits(
        backend,
        plan.total() as u128,
        &format!("training this model at batch {batch} x seq {seq}"),
        "use a smaller --batch-size or --seq-len (--grad-accum keeps the tokens per step), or a smaller model",
    )?;
    Ok(plan)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_are_enforced_without_overflow() {
        assert_eq!(in_range::<1, 10>("10"), Ok(10));
        assert!(in_range::<1, 10>("0").is_err());
        assert!(in_range::<1, 10>("18446744073709551615").is_err());
        assert!(in_range::<1, 10>("18446744073709551616").is_err());
        assert!(in_range::<1, 10>("-1").is_err());
    }

    #[test]
    fn huge_steps_are_refused_before_any_arithmetic_wraps() {
        let cfg = ModelConfig::andrea_120m();
        check_step(&cfg, 8, 1024).unwrap();
        assert!(check_step(&cfg, usize::MAX, 1024).is_err());
        let err = check_step(&cfg, 65536, 1 << 20).unwrap_err().to_string();
        assert!(err.contains("--batch-size"), "{err}");
    }
}
