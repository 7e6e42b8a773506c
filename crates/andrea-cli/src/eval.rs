//! `andrea eval`: the mean cross-entropy of a checkpoint over every full window of a
//! shard (windows of `B·T + 1` tokens, each `B·T` further, as training reads them), and
//! its perplexity `exp(loss)`.

use andrea::Backend;
use anyhow::{Context, Result};

use crate::checkpoint;
use crate::cli::EvalArgs;
use crate::data::{inputs_and_targets, DataPosition, ShardSet};

/// Mean loss over the windows of `b·t + 1` tokens starting at `starts`, each window's
/// loss by `loss(inputs, targets)` ([`andrea::Model::loss`] or
/// [`andrea::Trainer::evaluate`]). Each window's loss is the mean over its `b·t`
/// targets; all windows have the same size, so this is the mean per token.
pub fn mean_loss(
    (b, t): (usize, usize),
    shards: &ShardSet,
    starts: &[DataPosition],
    loss: impl FnMut(&[u32], &[u32]) -> andrea::Result<f32>,
) -> Result<f32> {
    let sum = loss_sum((b, t), shards, starts, loss)?;
    Ok((sum / starts.len().max(1) as f64) as f32)
}

/// The sum of the windows' losses that [`mean_loss`] averages (a data-parallel rank's
/// share of an evaluation).
pub fn loss_sum(
    (b, t): (usize, usize),
    shards: &ShardSet,
    starts: &[DataPosition],
    mut loss: impl FnMut(&[u32], &[u32]) -> andrea::Result<f32>,
) -> Result<f64> {
    let (window, stride) = (b * t + 1, b * t);
    let mut buf = Vec::with_capacity(window);
    let mut sum = 0.0f64;
    for start in starts {
        let mut pos = *start;
        shards.next_window(&mut pos, window, stride, &mut buf)?;
        let (inputs, targets) = inputs_and_targets(&buf);
        sum += loss(inputs, targets)? as f64;
    }
    Ok(sum)
}

pub fn run<B: Backend>(args: &EvalArgs, backend: B) -> Result<()> {
    let loaded = checkpoint::load(&args.checkpoint, backend)?;
    let config = loaded.model.config().clone();
    let seq = args.seq_len.unwrap_or(config.context_length);
    if seq == 0 || seq > config.context_length || args.batch_size == 0 {
        anyhow::bail!(
            "--seq-len must be in 1..={} (the model's context length) and --batch-size at least 1, \
             got --seq-len {seq} --batch-size {}",
            config.context_length,
            args.batch_size
        );
    }
    if let Some(t) = &loaded.tokenizer {
        crate::data::check_tokenizer(&args.data, t, "evaluation")?;
    }
    crate::limits::check_step(&config, args.batch_size, seq)?;
    let shards = ShardSet::open(&args.data, "val")?;
    let window = args.batch_size * seq + 1;
    shards.check(config.vocab_size, window, "evaluation")?;
    let starts = shards.all_windows(window, window - 1);
    // Only an activation arena: no gradients, no optimizer moments.
    let model = loaded.model;
    let mut evaluator = model
        .evaluator(args.batch_size, seq)
        .context("cannot set up the evaluation")?;
    let loss = mean_loss(evaluator.shape(), &shards, &starts, |x, y| {
        model.loss(&mut evaluator, x, y)
    })?;
    if !loss.is_finite() {
        anyhow::bail!(
            "the loss of {} on {} is {loss}: the model's arithmetic overflowed (its weights are \
             finite but too large, or the run that wrote it was diverging); use an earlier checkpoint",
            loaded.dir.display(),
            args.data.display()
        );
    }
    let tokens = starts.len() * (window - 1);
    let perplexity = (loss as f64).exp();
    if args.json {
        let obj = serde_json::json!({
            "loss": loss,
            "perplexity": perplexity,
            "tokens": tokens,
            "windows": starts.len(),
            "batch_size": args.batch_size,
            "seq_len": seq,
            "checkpoint": loaded.dir,
        });
        println!("{obj}");
    } else {
        println!(
            "loss {loss:.4} (perplexity {perplexity:.2}) over {tokens} tokens in {} windows of {}x{seq}",
            starts.len(),
            args.batch_size
        );
    }
    Ok(())
}
