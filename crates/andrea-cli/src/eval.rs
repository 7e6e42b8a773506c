//! `andrea eval`: the mean cross-entropy of a checkpoint over every full window of the
//! validation data (windows of `B·T + 1` tokens, each `B·T` further, in order: the
//! windows the training log's validation loss reads the first `--eval-batches` of, with
//! the run's `B` and `T` by default, so the two agree where they read the same windows),
//! its perplexity `exp(loss)`, and bits per byte: the loss summed over the evaluated
//! targets, in bits, over the bytes of text those targets decode to (special tokens
//! such as `<|endoftext|>` count no bytes). Unlike the loss per token, bits per byte
//! compare across tokenizers.

use andrea::Backend;
use anyhow::{bail, Context, Result};
use std::path::PathBuf;

use crate::checkpoint;
use crate::cli::EvalArgs;
use crate::data::{inputs_and_targets, DataPosition, ShardSet};
use andrea_tokenizer::Tokenizer;

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

/// Bytes of text the targets of the windows at `starts` decode to (special tokens: none).
fn target_bytes(
    shards: &ShardSet,
    starts: &[DataPosition],
    window: usize,
    tokenizer: &Tokenizer,
) -> Result<u64> {
    let mut buf = Vec::with_capacity(window);
    let mut bytes = 0;
    for start in starts {
        let mut pos = *start;
        shards.next_window(&mut pos, window, window - 1, &mut buf)?;
        let (_, targets) = inputs_and_targets(&buf);
        let text: Vec<u32> = targets
            .iter()
            .copied()
            .filter(|&t| !tokenizer.is_special(t))
            .collect();
        bytes += tokenizer
            .decode_bytes(&text)
            .context("decoding the evaluated tokens")?
            .len() as u64;
    }
    Ok(bytes)
}

/// `--data`, or else the validation data the checkpoint's run recorded (the path as it
/// was given to `andrea train`, so relative to where the run was started).
fn data<B: Backend>(args: &EvalArgs, loaded: &checkpoint::Loaded<B>) -> Result<PathBuf> {
    if let Some(data) = &args.data {
        return Ok(data.clone());
    }
    let dir = loaded.dir.display();
    let Some(state) = &loaded.state else {
        bail!(
            "pass --data <shards>: the checkpoint {dir} has no training state, so no run \
             recorded the data to evaluate on"
        );
    };
    let Some(val) = &state.settings.val_data else {
        bail!(
            "pass --data <shards>: the run that wrote {dir} recorded no validation data (it \
             trained on {} without val shards)",
            state.settings.data.display()
        );
    };
    if std::fs::metadata(val).is_err() {
        bail!(
            "the run that wrote {dir} validated on {}, which is not there from this directory \
             (a relative path is relative to where the run was started): pass --data <shards>",
            val.display()
        );
    }
    errln!(
        "note: evaluating on {}, the run's validation data",
        val.display()
    );
    Ok(val.clone())
}

pub fn run<B: Backend>(args: &EvalArgs, backend: B) -> Result<()> {
    let loaded = checkpoint::load(&args.checkpoint, backend)?;
    let config = loaded.model.config().clone();
    let run = loaded.state.as_ref().map(|s| &s.settings);
    let seq = args
        .seq_len
        .or(run.map(|s| s.seq_len))
        .unwrap_or(config.context_length);
    let batch = args.batch_size.or(run.map(|s| s.batch_size)).unwrap_or(8);
    if seq == 0 || seq > config.context_length || batch == 0 {
        anyhow::bail!(
            "--seq-len must be in 1..={} (the model's context length) and --batch-size at least 1, \
             got --seq-len {seq} --batch-size {batch}",
            config.context_length,
        );
    }
    let data = data(args, &loaded)?;
    if let Some(t) = &loaded.tokenizer {
        crate::data::check_tokenizer(&data, t, "evaluation")?;
    }
    crate::limits::check_step(&config, batch, seq)?;
    let shards = ShardSet::open(&data, "val")?;
    let window = batch * seq + 1;
    shards.check(config.vocab_size, window, "evaluation")?;
    let all = shards.all_windows(window, window - 1);
    let mut starts = all.clone();
    if let Some(n) = args.windows {
        starts.truncate(n.max(1));
    }
    // Only an activation arena: no gradients, no optimizer moments.
    let model = loaded.model;
    let mut evaluator = model
        .evaluator(batch, seq)
        .context("cannot set up the evaluation")?;
    let loss = mean_loss(evaluator.shape(), &shards, &starts, |x, y| {
        model.loss(&mut evaluator, x, y)
    })?;
    if !loss.is_finite() {
        anyhow::bail!(
            "the loss of {} on {} is {loss}: the model's arithmetic overflowed (its weights are \
             finite but too large, or the run that wrote it was diverging); use an earlier checkpoint",
            loaded.dir.display(),
            data.display()
        );
    }
    let tokens = starts.len() * (window - 1);
    let perplexity = (loss as f64).exp();
    let bytes = loaded
        .tokenizer
        .as_ref()
        .map(|t| target_bytes(&shards, &starts, window, t))
        .transpose()?;
    let bits_per_byte =
        bytes.map(|b| loss as f64 * tokens as f64 / (std::f64::consts::LN_2 * b.max(1) as f64));
    // How this figure relates to the training log's validation loss.
    let log = run.map(|s| {
        let same_shape = s.batch_size == batch && s.seq_len == seq;
        let read = s.eval_batches.min(all.len());
        match (same_shape, read == starts.len()) {
            (true, true) => "the windows the training log's validation loss reads".to_string(),
            (true, false) => format!(
                "the training log's validation loss reads the first {read} of these {} windows \
                 (--eval-batches {}); --windows {read} reads the same",
                all.len(),
                s.eval_batches
            ),
            (false, _) => format!(
                "the training log reads windows of {}x{} (--eval-batches {}); pass --batch-size {} \
                 --seq-len {} --windows {read} to read the same",
                s.batch_size, s.seq_len, s.eval_batches, s.batch_size, s.seq_len
            ),
        }
    });
    if args.json {
        let obj = serde_json::json!({
            "loss": loss,
            "perplexity": perplexity,
            "bits_per_byte": bits_per_byte,
            "tokens": tokens,
            "bytes": bytes,
            "windows": starts.len(),
            "windows_in_data": all.len(),
            "batch_size": batch,
            "seq_len": seq,
            "checkpoint": loaded.dir,
        });
        outln!("{obj}")?;
    } else {
        let bpb = match bits_per_byte {
            Some(b) => format!(", {b:.4} bits per byte"),
            None => String::new(),
        };
        outln!(
            "loss {loss:.4} (perplexity {perplexity:.2}{bpb}) over {tokens} tokens{} in {} of {} windows of {batch}x{seq}",
            bytes.map(|b| format!(" ({b} bytes of text)")).unwrap_or_default(),
            starts.len(),
            all.len(),
        )?;
        if let Some(line) = log {
            outln!("note: {line}")?;
        }
        if bytes.is_none() {
            outln!("note: no bits per byte: the checkpoint has no tokenizer.json to decode the tokens with")?;
        }
    }
    Ok(())
}
