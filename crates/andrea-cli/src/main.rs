//! # andrea-cli
//!
//! `andrea`, the command line of the project: train a tokenizer and a GPT-2-style model
//! on your own text, watch it learn, resume after an interruption, evaluate it and
//! generate from it.
//!
//! | command | what it does |
//! |---|---|
//! | `andrea demo --out runs/demo` | the whole pipeline on a generated corpus ([`demo`]), samples at the end |
//! | `andrea tokenizer train <inputs>` | learns BPE merges, writes `tokenizer.json` |
//! | `andrea tokenizer encode/decode` | text <-> ids (`--json`) |
//! | `andrea prepare <inputs> --tokenizer --out` | llm.c token shards (train/val) + a copy of the tokenizer |
//! | `andrea train --config/--init/--resume` | the training run ([`train`]) |
//! | `andrea eval --checkpoint [--data]` | mean loss and perplexity over every full window (the run's val data by default) |
//! | `andrea generate --checkpoint --prompt` | streams sampled text until `<|endoftext|>` |
//! | `andrea info --config/--checkpoint` | parameters, FLOPs per token, training memory |
//! | `andrea bench train\|decode --config` | tokens per second (`--json`: one object with `tokens_per_s`) |
//! | `andrea --backend cuda <command>` | the same on an NVIDIA GPU (build with `--features cuda`) |
//!
//! A run directory (`--out`) holds:
//!
//! ```text
//! runs/tiny/
//!   latest -> step-00001000      symbolic link, switched atomically after each save
//!   step-00000500/ step-00001000/
//!     model.safetensors config.json   GPT2LMHeadModel.from_pretrained(dir) loads these
//!     tokenizer.json                  Hugging Face tokenizers format
//!     optimizer.safetensors           AdamW moments (exp_avg.*, exp_avg_sq.*) + step
//!     training_state.json             step, data position, RNG, settings, file checksums
//!   metrics.jsonl                     {"step","train_loss","val_loss","lr","grad_norm","tokens_per_s"},
//!                                     "resumed_from" on a resumed run's first step
//!   loss.svg                          train loss (each step, and smoothed), val loss, resumes
//! ```
//!
//! A config file for `train` is `andrea_core`'s TOML (`[model]`, `[optimizer]`,
//! `[schedule]`) plus an optional `[training]` table read only by this command
//! (`steps`, `batch_size`, `seq_len`, `grad_accum`, `lr_schedule`, `seed`, `eval_every`,
//! `eval_batches`, `sample_every`, `checkpoint_every`); unknown keys are refused by name.
//!
//! Decisions written down here:
//!
//! * Settings come from defaults, then the config file (`[optimizer]`, `[schedule]` and
//!   an optional `[training]` table, see [`settings`]) or the resumed run's saved
//!   settings, then the command line.
//! * The model's vocabulary is the tokenizer's (a config's `vocab_size` is replaced by
//!   it, with a note), so a tiny tokenizer trains a tiny model; shards recording another
//!   vocabulary size are refused.
//! * Batches are llm.c's sequential windows ([`data`]); the data position, the optimizer
//!   moments and the step are in every checkpoint, and the CPU backend's results do not
//!   depend on the thread count, so `--resume` gives bit-identical weights to an
//!   uninterrupted run (`tests/resume.rs` checks it).
//! * Checkpoints ([`checkpoint`]) are directories renamed into place, with checksums;
//!   `<out>/latest` is a symbolic link switched atomically.
//! * Ctrl-C, SIGTERM (what launchers and schedulers send), SIGHUP and SIGUSR1 finish the
//!   current step, write a checkpoint and exit with status 130; only a second Ctrl-C a
//!   second or more after the first quits without one ([`stop`]).
//!   Every error exits with status 2 and one paragraph saying what and how to fix it.
//! * What a command is run for goes to stdout, notes, progress and errors to stderr
//!   ([`output`]); a closed pipe ends that stream, not the work: `andrea tokenizer encode
//!   ... | head` stops with status 0, `andrea train 2>&1 | head` trains on.
//! * `--backend cpu` (the default) or `--backend cuda` (GPU 0), with
//!   `--precision fp32|tf32|bf16` for the GPU's arithmetic (default `tf32`, the CUDA
//!   backend's `Precision::FAST`; the CPU computes in FP32, takes `bf16` for generation
//!   only and refuses `tf32`). The
//!   commands are generic over `B: Backend` ([`backend`]); on the CPU the whole command
//!   runs on a worker of the rayon pool (`CpuBackend::install`), on the GPU on the main
//!   thread, which owns the driver context. The GPU starts when the command needs a model
//!   (`tokenizer` and `prepare` never touch it). A build without the `cuda` feature
//!   refuses `--backend cuda` with the command that builds one; a missing GPU is an error
//!   naming what is missing, never a quiet fall back to the CPU (a run asked for a GPU
//!   that trained for days on the CPU would be worse than a stop).
//! * `mpirun -np W andrea train ...` (build with `--features mpi`) trains data-parallel:
//!   W ranks, one global batch, rank 0 writing ([`dist`]). A build without the feature,
//!   or another command, started as one of several ranks is refused.
//! * Checkpoints do not depend on the backend: a run trained on the GPU resumes,
//!   evaluates or samples on the CPU and back.

#[macro_use]
mod output;

mod backend;
mod bench;
mod checkpoint;
mod cli;
mod data;
mod demo;
mod dist;
mod eval;
#[cfg(test)]
mod fuzz;
mod generate;
mod info;
mod limits;
mod metrics;
mod plot;
mod prepare;
mod run_lock;
mod settings;
mod stop;
mod tokenizer_cmd;
mod train;

use clap::Parser;

use cli::{Cli, Command};

/// Exit status of every error a user can cause (clap uses it for bad flags too).
const USAGE_ERROR: i32 = 2;

/// An error as the user sees it: the chain, outermost first (what was being done, then
/// why it failed).
fn error_report(e: &anyhow::Error) -> String {
    let mut msg = format!("error: {e}");
    for cause in e.chain().skip(1) {
        msg.push_str(&format!("\n  caused by: {cause}"));
    }
    msg
}

fn run(cli: Cli) -> anyhow::Result<i32> {
    if let Some(l) = andrea_dist::launcher_world_size().filter(|l| l.size > 1) {
        if !matches!(cli.command, Command::Train(_)) {
            anyhow::bail!(
                "{} started this command as one of {} ranks ({}={}); only `andrea train` runs \
                 on several ranks: start this command as a single process, without mpirun or srun",
                l.launcher,
                l.size,
                l.var,
                l.size
            );
        }
    }
    match backend::select(&cli.global, &cli.command)? {
        // The whole command runs on a worker of the CPU thread pool, so each op starts its
        // parallel work in place instead of handing it over from `main` and waiting for a
        // wake-up (`CpuBackend::install`): 5x on a tiny model's decoding, nothing lost on
        // large steps. `select` sized the global pool; every handle on it is free.
        backend::Selected::Cpu(precision) => andrea::DefaultBackend::new().install(move || {
            dispatch(&cli, &mut || {
                Ok(andrea::DefaultBackend::new().with_precision(precision)?)
            })
        }),
        // The CUDA backend stays on this thread (it holds the driver's context); its host
        // work (sampling, data loading) is serial.
        #[cfg(feature = "cuda")]
        backend::Selected::Cuda(precision) => {
            dispatch(&cli, &mut || backend::start_cuda(precision))
        }
    }
}

/// Runs the command on backends made by `backend` (once per command; the demo makes a
/// second one to sample from). Commands that need no model never call it.
fn dispatch<B: andrea::Backend>(
    cli: &Cli,
    backend: &mut dyn FnMut() -> anyhow::Result<B>,
) -> anyhow::Result<i32> {
    match &cli.command {
        Command::Demo(a) => return demo::run(a, backend),
        Command::Tokenizer(cmd) => tokenizer_cmd::run(cmd)?,
        Command::Prepare(a) => prepare::run(a)?,
        Command::Train(a) => return train::run(a, backend()?),
        Command::Eval(a) => eval::run(a, backend()?)?,
        Command::Generate(a) => generate::run(a, backend()?)?,
        Command::Info(a) => info::run(a, &backend()?)?,
        Command::Bench(a) => bench::run(a, backend()?)?,
    }
    Ok(0)
}

fn main() {
    let cli = Cli::parse();
    let code = match run(cli) {
        Ok(code) => code,
        // The reader of stdout has gone (`| head`): the output is over, nothing failed.
        Err(e) if output::is_closed(&e) => 0,
        Err(e) => {
            errln!("{}", error_report(&e));
            USAGE_ERROR
        }
    };
    std::process::exit(code);
}
