//! `andrea bench train|decode`: tokens per second of full training steps or of KV-cache
//! decoding on a freshly initialised model, measured by `andrea_model::bench` (warm-up,
//! then the median over the timed steps). `--profile` runs the training or decode steps
//! on `andrea::core::timed::Timed` and prints where a step spends its time, op by op.

use andrea::model::bench::{self, BenchReport, DecodeBench, TrainBench};
use andrea::Backend;
use anyhow::{bail, Result};

use crate::cli::{BenchArgs, BenchKind};
use crate::settings::FileConfig;

/// The most timed or warm-up steps of a bench: a median of a million steps is as good as
/// one of more, and the counts are added and held as per-step times.
const MAX_BENCH_STEPS: usize = 1_000_000;

pub fn run<B: Backend>(args: &BenchArgs, backend: B) -> Result<()> {
    for (flag, n) in [("--steps", Some(args.steps)), ("--warmup", args.warmup)] {
        if n.is_some_and(|n| n > MAX_BENCH_STEPS) {
            bail!(
                "{flag} {} is more than a bench can time (at most {MAX_BENCH_STEPS}): a few \
                 dozen steps give a steady median",
                n.unwrap_or_default()
            );
        }
    }
    let file = FileConfig::read(&args.config)?;
    let config = file.model;
    let seq = args.seq_len.unwrap_or(config.context_length.min(256));
    if seq == 0 || seq > config.context_length || args.batch_size == 0 || args.steps == 0 {
        bail!(
            "--seq-len must be in 1..={} (the context length), --batch-size and --steps at least 1",
            config.context_length
        );
    }
    let mut profile = None;
    crate::limits::check_step(&config, args.batch_size, seq)?;
    let report: BenchReport = match args.kind {
        BenchKind::Train if args.profile => {
            let plan = train_plan(args, seq);
            let (report, p) =
                bench::train_profile(backend, config, file.optimizer.unwrap_or_default(), &plan)?;
            profile = Some(p);
            report
        }
        BenchKind::Train => {
            let plan = train_plan(args, seq);
            bench::train(backend, config, file.optimizer.unwrap_or_default(), &plan)?
        }
        BenchKind::Decode => {
            if args.prompt_len == 0 || args.prompt_len >= seq {
                bail!("--prompt-len must be in 1..{seq} (below --seq-len, the cache's capacity)");
            }
            let plan = DecodeBench {
                batch: args.batch_size,
                prompt_len: args.prompt_len,
                capacity: seq,
                warmup: args.warmup.unwrap_or(8),
                steps: args.steps,
                seed: args.seed,
            };
            if args.profile {
                let (report, p) = bench::decode_profile(backend, config, &plan)?;
                profile = Some(p);
                report
            } else {
                bench::decode(backend, config, &plan)?
            }
        }
    };
    if args.json {
        match &profile {
            Some(p) => {
                let mut v = serde_json::to_value(&report)?;
                v["profile"] = serde_json::to_value(&p.ops)?;
                outln!("{v}")?;
            }
            None => outln!("{}", report.to_json())?,
        }
    } else {
        outln!(
            "{} {} on {}: {:.1} tokens/s (median {:.4} s per step of {} tokens, {} timed steps after {} warm-up)",
            report.bench,
            report.config,
            report.backend,
            report.tokens_per_s,
            report.time.median_s,
            report.tokens_per_step,
            report.steps,
            report.warmup
        )?;
        if let Some(p) = &profile {
            outln!(
                "\nper step, over {} timed steps, each op between two synchronisations:\n{}",
                report.steps,
                p.table(report.steps)
            )?;
        }
    }
    Ok(())
}

fn train_plan(args: &BenchArgs, seq: usize) -> TrainBench {
    TrainBench {
        batch: args.batch_size,
        seq,
        warmup: args.warmup.unwrap_or(2),
        steps: args.steps,
        seed: args.seed,
    }
}
