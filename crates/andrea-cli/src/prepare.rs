//! `andrea prepare`: text files -> a shard set: train/val token shards, the tokenizer
//! (where `andrea train` looks for it) and `manifest.json`, written into a temporary
//! directory and renamed into place whole ([`andrea_tokenizer::shard_set`]).

use andrea_tokenizer::{prepare_shard_set, ShardOptions, Tokenizer};
use anyhow::{bail, Context, Result};

use crate::cli::PrepareArgs;

pub fn run(args: &PrepareArgs) -> Result<()> {
    if !(0.0..1.0).contains(&args.val_fraction) {
        bail!(
            "--val-fraction must be in [0, 1), got {}",
            args.val_fraction
        );
    }
    andrea_tokenizer::check_prefix(&args.prefix).context("--prefix")?;
    andrea_fs::check_output_dir(&args.out)
        .with_context(|| format!("cannot write the shards into {}", args.out.display()))?;
    let tokenizer = Tokenizer::load(&args.tokenizer).with_context(|| {
        format!(
            "cannot load the tokenizer {} (make one with `andrea tokenizer train`)",
            args.tokenizer.display()
        )
    })?;
    let options = ShardOptions {
        prefix: args.prefix.clone(),
        shard_tokens: args.shard_tokens,
        val_fraction: args.val_fraction,
        text_field: args.text_field.clone(),
        eot_per_document: !args.no_eot,
        ..ShardOptions::default()
    };
    let began = std::time::Instant::now();
    let set = prepare_shard_set(&tokenizer, &args.inputs, &args.out, &options).map_err(|e| {
        match e {
            // Already a whole sentence about the input or --out.
            andrea_tokenizer::Error::Invalid(message) => anyhow::anyhow!(message),
            e => anyhow::Error::new(e)
                .context(format!("cannot write the shard set {}", args.out.display())),
        }
    })?;
    for p in &set.removed {
        errln!(
            "removed {}, left by a prepare that did not finish",
            p.display()
        );
    }
    let report = &set.shards;
    let tokens = report.train_tokens + report.val_tokens;
    let seconds = began.elapsed().as_secs_f64();
    errln!(
        "{} files, {} bytes -> {} train tokens in {} shards, {} val tokens in {} shards, in {} \
         ({seconds:.1} s, {:.0} tokens/s)",
        report.files,
        report.bytes,
        report.train_tokens,
        report.train_shards.len(),
        report.val_tokens,
        report.val_shards.len(),
        args.out.display(),
        tokens as f64 / seconds.max(1e-9)
    );
    Ok(())
}
