//! `andrea prepare`: text files -> train/val token shards, plus a copy of the tokenizer
//! next to them (where `andrea train` looks for it).

use andrea_tokenizer::{write_shards, ShardOptions, Tokenizer};
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
        ..ShardOptions::default()
    };
    let report = write_shards(&tokenizer, &args.inputs, &args.out, &options)
        .context("cannot write the token shards")?;
    if report.train_tokens == 0 {
        bail!(
            "the input holds no text to train on ({} files, {} bytes): give text files or directories holding some",
            report.files,
            report.bytes
        );
    }
    let copy = args.out.join("tokenizer.json");
    tokenizer
        .save(&copy)
        .with_context(|| format!("cannot write {}", copy.display()))?;
    eprintln!(
        "{} files, {} bytes -> {} train tokens in {} shards, {} val tokens in {} shards, in {}",
        report.files,
        report.bytes,
        report.train_tokens,
        report.train_shards.len(),
        report.val_tokens,
        report.val_shards.len(),
        args.out.display()
    );
    Ok(())
}
