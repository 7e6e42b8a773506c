//! `andrea train`: set up a run (from a config, from a checkpoint's weights, or resuming
//! a checkpoint's run), then the training loop: micro-batches, AdamW steps on the
//! schedule's learning rate, evaluation, samples and checkpoints, until the last step
//! or Ctrl-C.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;

use andrea::model::rng::Rng;
use andrea::{Backend, Model, Trainer};
use andrea_tokenizer::Tokenizer;
use anyhow::{bail, Context, Result};

use crate::checkpoint::{self, TrainingState};
use crate::cli::TrainArgs;
use crate::data::{DataPosition, DataStream, MicroBatch, ShardSet};
use crate::dist::Ranks;
use crate::generate;
use crate::metrics::{Metric, Metrics, Progress, METRICS_FILE, PLOT_FILE};
use crate::run_lock::RunLock;
use crate::settings::{FileConfig, TrainSettings};

/// Exit status after Ctrl-C, SIGTERM or SIGUSR1 (the checkpoint was written).
pub const INTERRUPTED: i32 = 130;

/// What a run starts from.
struct Start<B: Backend> {
    model: Model<B>,
    tokenizer: Tokenizer,
    settings: TrainSettings,
    out: PathBuf,
    /// Set when resuming: the checkpoint and its state.
    resumed: Option<(PathBuf, TrainingState)>,
}

fn tokenizer_near_data(data: &Path) -> PathBuf {
    let dir = if data.is_dir() {
        data.to_path_buf()
    } else {
        data.parent().map(Path::to_path_buf).unwrap_or_default()
    };
    dir.join(checkpoint::TOKENIZER_FILE)
}

fn load_tokenizer(path: &Path) -> Result<Tokenizer> {
    Tokenizer::load(path).with_context(|| {
        format!(
            "cannot load the tokenizer {}: pass --tokenizer <tokenizer.json> (the one the shards were made with)",
            path.display()
        )
    })
}

/// `root`: this process prints the notes (rank 0 of a data-parallel run).
fn setup<B: Backend>(args: &TrainArgs, backend: B, root: bool) -> Result<Start<B>> {
    let note = |line: String| {
        if root {
            errln!("note: {line}");
        }
    };
    if let Some(path) = &args.resume {
        let loaded = checkpoint::load(path, backend)?;
        let Some(state) = loaded.state.clone() else {
            bail!(
                "{} has no {}: it is a model, not a training checkpoint; use --init to start a new run from its weights",
                loaded.dir.display(),
                checkpoint::STATE_FILE
            );
        };
        if args.config.is_some() || args.tokenizer.is_some() {
            note(
                "--resume continues the run with its own model, tokenizer and settings; \
                 --config and --tokenizer are ignored (other flags override the saved settings)"
                    .into(),
            );
        }
        let tokenizer = loaded.tokenizer()?.clone();
        if state.settings.data_order.is_none()
            && state.settings.shuffle
            && args.data_order.is_none()
        {
            note(
                "this checkpoint drew its shuffled windows at random starts (an older andrea); \
                  the run goes on with each epoch a permutation of all windows, from the first"
                    .into(),
            );
        }
        let mut settings = state.settings.clone();
        if let Some(cut) = settings.apply_args(args) {
            note(cut);
        }
        // A changed setting changes the run from here on: said, and recorded in the
        // next checkpoints (their settings are the run's from then on).
        for (key, old, new) in changed_settings(&state.settings, &settings) {
            note(format!(
                "--resume changes {key} from {old} to {new} (the next checkpoints record it)"
            ));
        }
        let out = match &args.out {
            Some(o) => o.clone(),
            None => loaded
                .dir
                .parent()
                .map(Path::to_path_buf)
                .unwrap_or_default(),
        };
        return Ok(Start {
            model: loaded.model,
            tokenizer,
            settings,
            out,
            resumed: Some((loaded.dir, state)),
        });
    }
    let file = args.config.as_deref().map(FileConfig::read).transpose()?;
    let (model, tokenizer, mut settings) = if let Some(path) = &args.init {
        let loaded = checkpoint::load(path, backend)?;
        let tokenizer = match &args.tokenizer {
            Some(p) => load_tokenizer(p)?,
            None => loaded.tokenizer()?.clone(),
        };
        let mut settings = TrainSettings::defaults(loaded.model.config().context_length);
        if let Some(f) = &file {
            note(format!(
                "--init takes the model from {}; the config's [model] table is ignored",
                path.display()
            ));
            settings.apply_file(f);
        }
        (loaded.model, tokenizer, settings)
    } else if let Some(file) = &file {
        let mut settings = TrainSettings::defaults(file.model.context_length);
        settings.apply_file(file);
        if let Some(cut) = settings.apply_args(args) {
            note(cut);
        }
        // Before the tokenizer is looked for next to --data, so a missing --data is
        // reported as that.
        settings.validate(&file.model)?;
        let tok_path = args
            .tokenizer
            .clone()
            .unwrap_or_else(|| tokenizer_near_data(&settings.data));
        let tokenizer = load_tokenizer(&tok_path)?;
        let mut config = file.model.clone();
        if config.vocab_size != tokenizer.vocab_size() {
            note(format!(
                "model.vocab_size is {} (the tokenizer's), not the config's {}",
                tokenizer.vocab_size(),
                config.vocab_size
            ));
            config.vocab_size = tokenizer.vocab_size();
        }
        config.eos_token_id = tokenizer.eot_id();
        config.validate().context("the model config")?;
        crate::limits::check_training(&backend, &config, settings.batch_size, settings.seq_len)?;
        let model = Model::new(backend, config, settings.seed)?;
        (model, tokenizer, settings)
    } else {
        bail!(
            "nothing to train: pass --config <model.toml> to train from scratch (configs/tiny.toml is a small one), \
             --init <checkpoint> to start from weights, or --resume <checkpoint> to continue a run"
        );
    };
    if let Some(cut) = settings.apply_args(args) {
        note(cut);
    }
    let Some(out) = args.out.clone() else {
        bail!("pass --out <dir>: the run directory for checkpoints and metrics");
    };
    if model.config().vocab_size != tokenizer.vocab_size() {
        bail!(
            "the tokenizer has {} ids but the model {}: pass the tokenizer the model was trained with",
            tokenizer.vocab_size(),
            model.config().vocab_size
        );
    }
    Ok(Start {
        model,
        tokenizer,
        settings,
        out,
        resumed: None,
    })
}

/// The run directory and the files andrea writes in it under fixed names must be what
/// andrea would write there (a directory; regular files; `latest` a symbolic link or a
/// regular file) or not exist yet: a FIFO or a device under one of those names is
/// refused before anything is read or written (an append to `metrics.jsonl` on a device
/// would vanish, a read of it on a FIFO would block).
fn check_run_outputs(out: &Path) -> Result<()> {
    let fix = "move it away or pass another --out";
    andrea_fs::check_output_dir(out)
        .with_context(|| format!("cannot use {} as the run directory: {fix}", out.display()))?;
    for name in [crate::run_lock::LOCK_FILE, METRICS_FILE, PLOT_FILE] {
        let p = out.join(name);
        andrea_fs::check_output_file(&p)
            .with_context(|| format!("cannot write {}: {fix}", p.display()))?;
    }
    let latest = out.join("latest");
    if let Ok(meta) = std::fs::symlink_metadata(&latest) {
        if !meta.file_type().is_symlink() && !meta.is_file() {
            bail!(
                "cannot write {}: it is {}, where andrea keeps a link to the newest checkpoint: {fix}",
                latest.display(),
                andrea_fs::kind_name(meta.file_type())
            );
        }
    }
    Ok(())
}

/// The settings that differ between `old` and `new`: `(name, old value, new value)`.
fn changed_settings(old: &TrainSettings, new: &TrainSettings) -> Vec<(String, String, String)> {
    let (Ok(serde_json::Value::Object(a)), Ok(serde_json::Value::Object(b))) =
        (serde_json::to_value(old), serde_json::to_value(new))
    else {
        return Vec::new();
    };
    b.iter()
        .filter_map(|(key, new)| {
            let old = a.get(key).unwrap_or(&serde_json::Value::Null);
            (old != new).then(|| (key.clone(), show(old), show(new)))
        })
        .collect()
}

/// A setting's value as the command line takes it (the rates are `f32`: `0.003`, not
/// the `f64` expansion JSON holds).
fn show(v: &serde_json::Value) -> String {
    match v.as_f64() {
        Some(x) if v.is_f64() => (x as f32).to_string(),
        _ => v.to_string(),
    }
}

/// Refuses to mix two runs in one directory; with `--overwrite`, clears the old run
/// (its checkpoints, `latest`, metrics and plot; nothing else in the directory).
fn prepare_run_dir(out: &Path, overwrite: bool, resuming: bool) -> Result<()> {
    let holds_run = out.join("latest").exists() || out.join(METRICS_FILE).exists();
    if holds_run && !resuming {
        if !overwrite && !out.join("latest").exists() {
            bail!(
                "{} holds the metrics of a run that stopped before its first checkpoint (there \
                 is nothing to resume): pass --overwrite to start it again, or another --out",
                out.display()
            );
        }
        if !overwrite {
            bail!(
                "{} already holds a training run: pass --resume {}/latest to continue it, \
                 --overwrite to replace it, or another --out",
                out.display(),
                out.display()
            );
        }
        for (_, p) in checkpoint::list(out)? {
            std::fs::remove_dir_all(&p).with_context(|| format!("removing {}", p.display()))?;
        }
        for name in ["latest", METRICS_FILE, PLOT_FILE] {
            let p = out.join(name);
            if std::fs::symlink_metadata(&p).is_ok() {
                std::fs::remove_file(&p).with_context(|| format!("removing {}", p.display()))?;
            }
        }
    }
    Ok(())
}

/// Resuming from a checkpoint older than the run's newest would overwrite the newer
/// ones as the run passes their steps: refused, or with `--overwrite` they are removed.
fn check_newer_checkpoints(out: &Path, step: u64, overwrite: bool) -> Result<()> {
    let Ok(all) = checkpoint::list(out) else {
        return Ok(());
    };
    let newer: Vec<PathBuf> = all
        .into_iter()
        .filter(|(s, _)| *s > step)
        .map(|(_, p)| p)
        .collect();
    let Some(newest) = newer.last() else {
        return Ok(());
    };
    if !overwrite {
        bail!(
            "--resume from step {step}, but {} holds {} newer checkpoint(s) up to {}, which the \
             resumed run would overwrite: resume from {}/latest, pass another --out for a new \
             branch of the run, or --overwrite to delete the newer checkpoints",
            out.display(),
            newer.len(),
            newest.display(),
            out.display()
        );
    }
    for p in &newer {
        std::fs::remove_dir_all(p).with_context(|| format!("removing {}", p.display()))?;
    }
    // `latest` named one of them: point it back at the checkpoint resumed from.
    let name = format!("step-{step:08}");
    if out.join(&name).is_dir() {
        checkpoint::point_latest(out, &name)
            .with_context(|| format!("updating {}/latest", out.display()))?;
    }
    Ok(())
}

/// The validation data: the flag, else the `val` shards next to the training data.
fn find_val(settings: &TrainSettings) -> Option<PathBuf> {
    if let Some(v) = &settings.val_data {
        return Some(v.clone());
    }
    let data = &settings.data;
    if data.is_dir() {
        return crate::data::shard_paths(data, "val")
            .ok()
            .map(|_| data.clone());
    }
    crate::data::val_sibling(data)
}

/// The run on every rank of the launcher's world ([`crate::dist`]); in a world of several
/// ranks an error ends the whole job (status 2), since the other ranks would wait for
/// this one forever.
pub fn run<B: Backend>(args: &TrainArgs, backend: B) -> Result<i32> {
    let mut ranks = Ranks::init()?;
    match run_ranked(args, backend, &mut ranks) {
        Err(e) if ranks.size() > 1 => {
            let (rank, size) = (ranks.world.rank(), ranks.size());
            errln!("rank {rank} of {size}: {}", crate::error_report(&e));
            if !crate::dist::found_by_every_rank(&e) {
                ranks.world.abort(crate::USAGE_ERROR)
            }
            // Every rank found it (their settings differ): each has said so once all
            // reach the barrier, then MPI ends normally.
            ranks.world.barrier();
            Ok(crate::USAGE_ERROR)
        }
        // Open MPI's mpirun, interrupted, has sent SIGTERM to every rank and is ending
        // the job: `MPI_Finalize` would wait for it until the SIGKILL. Every rank has
        // passed the checkpoint's barrier; leave at once.
        Ok(INTERRUPTED) if ranks.size() > 1 => std::process::exit(INTERRUPTED),
        done => done,
    }
}

fn run_ranked<B: Backend>(args: &TrainArgs, backend: B, ranks: &mut Ranks) -> Result<i32> {
    let root = ranks.is_root();
    let Start {
        model,
        tokenizer,
        mut settings,
        out,
        resumed,
    } = setup(args, backend, root)?;
    settings.val_data = find_val(&settings);
    settings.validate(model.config())?;
    if let Some(total) = args.total_batch_tokens {
        settings.grad_accum = per_rank_accumulation(total, &settings, ranks.size())?;
    }
    let (b, t) = (settings.batch_size, settings.seq_len);
    crate::limits::check_training(model.backend(), model.config(), b, t)?;
    let window = b * t + 1;
    crate::data::check_tokenizer(&settings.data, &tokenizer, "training")?;
    if let Some(v) = &settings.val_data {
        crate::data::check_tokenizer(v, &tokenizer, "validation")?;
    }
    let train = ShardSet::open(&settings.data, "train")?;
    train.check(model.config().vocab_size, window, "training")?;
    let val = match &settings.val_data {
        Some(p) => {
            let v = ShardSet::open(p, "val")?;
            v.check(model.config().vocab_size, window, "validation")?;
            Some(v)
        }
        None => None,
    };
    // Rank 0 alone owns the run directory. Held until `run` returns; the kernel drops
    // it if the process dies.
    if root {
        check_run_outputs(&out)?;
    }
    let _lock = root.then(|| RunLock::acquire(&out)).transpose()?;
    if root {
        checkpoint::remove_stale_temporaries(&out)?;
        prepare_run_dir(&out, args.overwrite, resumed.is_some())?;
    }
    if let Some((_, state)) = resumed.as_ref().filter(|_| root) {
        check_newer_checkpoints(&out, state.step, args.overwrite)?;
    }

    let mut trainer = Trainer::new(model, settings.optimizer(), b, t)?;
    if settings.grad_accum > 1 {
        trainer.reserve_accumulation()?;
    }
    let mut pos = DataPosition::default();
    let mut rng = Rng::new(settings.seed ^ 0x5_4A7F_F1E5);
    if let Some((dir, state)) = &resumed {
        trainer
            .load_optimizer_state(dir.join(checkpoint::OPTIMIZER_FILE))
            .with_context(|| format!("cannot load the optimizer state of {}", dir.display()))?;
        pos = state.data_position;
        rng = Rng::from_state(state.rng_state);
    }
    let mut data = DataStream::new(&train, settings.data_order(), (b, t), settings.seed)?;
    data.check_position(pos)?;
    let start = trainer.steps();
    let cfg = trainer.model().config().clone();
    ranks.agree("the settings", &settings)?;
    ranks.agree("the model config", &cfg)?;
    ranks.agree("the step and data position", &(start, pos, rng.state()))?;
    let world = ranks.size();
    let tokens_per_step = world * settings.tokens_per_step();
    if world > 1 && root {
        errln!(
            "data parallel: {world} ranks, each batch {b} x seq {t} x accum {}; a step sees {} windows",
            settings.grad_accum,
            world * settings.grad_accum
        );
    }
    let say = |line: String| {
        if root {
            errln!("{line}");
        }
    };
    say(format!(
        "model: {} parameters ({} layers, d_model {}, {} heads, context {}, vocabulary {})",
        cfg.param_count(),
        cfg.n_layer,
        cfg.d_model,
        cfg.n_head,
        cfg.context_length,
        cfg.vocab_size
    ));
    say(format!(
        "training: steps {start}..{} of {tokens_per_step} tokens (batch {b} x seq {t} x accum {}{}), {} training tokens; memory {}",
        settings.steps,
        settings.grad_accum,
        if world > 1 { format!(" x {world} ranks") } else { String::new() },
        train.total_tokens(),
        trainer.memory()
    ));
    say(data.describe());

    let stop = Arc::new(AtomicBool::new(false));
    crate::stop::install(stop.clone())?;

    let mut metrics = root.then(|| Metrics::open(&out, start)).transpose()?;
    let progress = Progress::new(start, settings.steps, settings.log_every).quiet(!root);
    let state_at =
        |step: u64, pos: DataPosition, rng_state: u64, settings: &TrainSettings| TrainingState {
            format: 1,
            step,
            data_position: pos,
            rng_state,
            settings: settings.clone(),
            files: Vec::new(),
        };
    let eval_starts: Vec<DataPosition> = val
        .as_ref()
        .map(|v| {
            let mut all = v.all_windows(window, window - 1);
            all.truncate(settings.eval_batches);
            all
        })
        .unwrap_or_default();
    if let Some(v) = &val {
        say(format!(
            "validation: the first {} of the {} windows of {b}x{t} in the validation data \
             (--eval-batches); `andrea eval` reads them all",
            eval_starts.len(),
            v.all_windows(window, window - 1).len()
        ));
    }
    // This rank's micro-batches, read before the step in the order the step uses them.
    let mut batches = vec![MicroBatch::default(); settings.grad_accum];
    let rank = (ranks.world.rank(), ranks.size());
    let mut step = start;
    let mut interrupted = false;
    let began_run = Instant::now();
    while step < settings.steps {
        let began = Instant::now();
        let lr = settings.lr_at(step);
        let epoch = pos.epoch;
        data.read_step(&mut pos, rank, &mut batches)?;
        let micro_batches: Vec<(&[u32], &[u32])> = batches.iter().map(MicroBatch::pair).collect();
        // A NaN or infinite loss or gradient norm is an error naming the step; nothing
        // is written after it.
        let (loss, stats) = ranks
            .train_step(&mut trainer, &micro_batches, lr)
            .map_err(|e| {
                progress.finish();
                anyhow::anyhow!("{e}; {}", last_good(&out))
            })?;
        step = stats.step;
        if pos.epoch > epoch {
            progress.println(&format!(
                "step {step}: epoch {} done ({} windows); epoch {} begins{}",
                pos.epoch,
                data.windows_per_epoch(),
                pos.epoch + 1,
                if settings.data_order() == crate::data::DataOrder::Shuffle {
                    ", in a new order"
                } else {
                    ""
                }
            ));
        }
        let elapsed = began.elapsed().as_secs_f64();
        let mut m = Metric {
            step,
            train_loss: loss,
            val_loss: None,
            lr,
            grad_norm: stats.grad_norm,
            tokens_per_s: tokens_per_step as f64 / elapsed.max(1e-9),
            resumed_from: None,
        };
        let last = step == settings.steps;
        interrupted = ranks.any(stop.load(Ordering::SeqCst));
        let pause = args.stop_at == Some(step);
        let due = |every: u64| last || interrupted || pause || (every > 0 && step % every == 0);
        if let Some(v) = &val {
            if due(settings.eval_every) && !eval_starts.is_empty() {
                // In the trainer's own activation arena: no memory beyond training's.
                let vl = ranks.mean_loss(trainer.shape(), v, &eval_starts, |x, y| {
                    trainer.evaluate(x, y)
                })?;
                progress.println(&format!("step {step}: val loss {vl:.4}"));
                m.val_loss = Some(vl);
            }
        }
        progress.step(&m, settings.steps);
        if let Some(metrics) = &mut metrics {
            metrics.write(&m)?;
            if m.val_loss.is_some() || due(settings.checkpoint_every) {
                metrics.write_plot()?;
            }
        }
        if due(settings.checkpoint_every) && root {
            let dir = checkpoint::save(
                &out,
                &trainer,
                &tokenizer,
                state_at(step, pos, rng.state(), &settings),
            )?;
            checkpoint::prune(&out, settings.keep_checkpoints)?;
            progress.println(&format!("step {step}: checkpoint {}", dir.display()));
        }
        if due(settings.checkpoint_every) {
            // Nobody goes on before rank 0's checkpoint is complete.
            ranks.world.barrier();
        }
        if due(settings.sample_every) && !interrupted && root {
            let text = sample(&trainer, &tokenizer, settings.seed ^ step)?;
            progress.println(&format!("step {step}: sample: {text}"));
        }
        if interrupted || pause {
            break;
        }
    }
    progress.finish();
    if let Some(line) = ranks.summary(began_run.elapsed().as_secs_f64()) {
        say(line);
    }
    if start >= settings.steps {
        say(format!(
            "nothing to do: the run is at step {start} of --steps {}; pass a larger --steps to train further",
            settings.steps
        ));
        return Ok(0);
    }
    if interrupted {
        say(format!(
            "interrupted at step {step}: checkpoint written; continue with `andrea train --resume {}/latest`",
            out.display()
        ));
        return Ok(INTERRUPTED);
    }
    if step < settings.steps {
        say(format!(
            "stopped at step {step} (--stop-at): continue with `andrea train --resume {}/latest`",
            out.display()
        ));
        return Ok(0);
    }
    say(format!(
        "done: {step} steps; newest checkpoint {}/latest",
        out.display()
    ));
    Ok(0)
}

/// Where a failed run can go on from: the newest checkpoint that is intact and whose
/// weights are finite and within [`andrea::model::io::MAX_WEIGHT`] (a diverging run may
/// have saved overflowing weights before its loss went NaN), checked before it is named.
fn last_good(out: &Path) -> String {
    let all = checkpoint::list(out).unwrap_or_default();
    let good = all.iter().rev().find(|(_, dir)| {
        checkpoint::verify(dir).is_ok_and(|s| s.is_some())
            && andrea::model::io::check_weights(dir).is_ok()
    });
    match good {
        Some((step, dir)) => format!(
            "the last good checkpoint is {} (step {step}; its weights are finite): continue \
             with `andrea train --resume {}` and a lower --lr",
            dir.display(),
            dir.display()
        ),
        None if all.is_empty() => {
            "no checkpoint was written yet (use --checkpoint-every to write them during the run)"
                .to_string()
        }
        None => format!(
            "none of the {} checkpoints in {} holds usable weights (each overflows or is \
             damaged): start the run again with a lower --lr",
            all.len(),
            out.display()
        ),
    }
}

/// `--total-batch-tokens` is the global batch: on W ranks each accumulates
/// `total / (W·B·T)` micro-batches, so the flag means the same run on any world size.
fn per_rank_accumulation(total: usize, settings: &TrainSettings, ranks: usize) -> Result<usize> {
    let per_step = ranks * settings.batch_size * settings.seq_len;
    if !total.is_multiple_of(per_step) {
        bail!(
            "--total-batch-tokens {total} is not a multiple of ranks x --batch-size x --seq-len = \
             {ranks} x {} x {} = {per_step}: choose a multiple, or set --grad-accum (per rank) instead",
            settings.batch_size,
            settings.seq_len
        );
    }
    Ok(total / per_step)
}

/// A short sample from the model as it is now, for the log.
fn sample<B: Backend>(trainer: &Trainer<B>, tokenizer: &Tokenizer, seed: u64) -> Result<String> {
    let mut sampler = generate::sampler(0.8, 40, 1.0, seed)?;
    let prompt = generate::prompt_ids(tokenizer, "");
    let mut text = String::new();
    generate::stream(trainer.model(), tokenizer, &prompt, 48, &mut sampler, |s| {
        text.push_str(s);
        Ok(())
    })?;
    Ok(text.replace('\n', " "))
}
