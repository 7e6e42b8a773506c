//! Training settings: defaults, then the config file's `[optimizer]`, `[schedule]` and
//! `[training]` tables (or, on `--resume`, the settings the run was started with), then
//! the command line, each layer overriding the one before.
//!
//! The config file is `andrea_core`'s (`[model]`, `[optimizer]`, `[schedule]`) plus an
//! optional `[training]` table for the settings only the command line knows (batch size,
//! sequence length, steps, ...). Unknown keys in any table are refused by name.

use std::path::{Path, PathBuf};

use andrea::{ModelConfig, OptimizerConfig, ScheduleConfig};
use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};

use crate::cli::{DataOrder, LrSchedule, TrainArgs};
use crate::limits;

/// A config file as the CLI reads it.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileConfig {
    pub model: ModelConfig,
    #[serde(default)]
    pub optimizer: Option<OptimizerConfig>,
    #[serde(default)]
    pub schedule: Option<ScheduleConfig>,
    #[serde(default)]
    pub training: Option<TrainingTable>,
}

/// `[training]`: every key optional, the command line overrides it.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TrainingTable {
    pub steps: Option<u64>,
    pub batch_size: Option<usize>,
    pub seq_len: Option<usize>,
    pub grad_accum: Option<usize>,
    pub lr_schedule: Option<LrSchedule>,
    pub seed: Option<u64>,
    pub eval_every: Option<u64>,
    pub eval_batches: Option<usize>,
    pub sample_every: Option<u64>,
    pub checkpoint_every: Option<u64>,
    pub data_order: Option<DataOrder>,
}

impl FileConfig {
    pub fn read(path: &Path) -> Result<FileConfig> {
        // A config is a few KiB: read only a regular file, and only up to 1 MiB.
        let text = andrea_fs::read_regular_text(path, 1 << 20).with_context(|| {
            format!(
                "cannot read the config file {}: check the path",
                path.display()
            )
        })?;
        let cfg: FileConfig = toml::from_str(&text).map_err(|e| {
            anyhow::anyhow!(
                "{}: {}\n(the tables are [model], [optimizer], [schedule] and [training]; \
                 see configs/tiny.toml for every key)",
                path.display(),
                e.to_string().trim_end()
            )
        })?;
        // A [schedule] table sets the run's length; without `total_steps` it would be the
        // library's default of 1 step, which no one writing the table means.
        if cfg.schedule.is_some() && !schedule_names_total_steps(&text) {
            anyhow::bail!(
                "{}: the [schedule] table has no total_steps: add `total_steps = N` (the \
                 step at which the cosine reaches its floor; --steps overrides it) or leave \
                 the table out",
                path.display()
            );
        }
        let checked = cfg.model.validate().and_then(|()| {
            cfg.optimizer.as_ref().map_or(Ok(()), |o| o.validate())?;
            cfg.schedule.as_ref().map_or(Ok(()), |s| s.validate())
        });
        checked.with_context(|| format!("in the config file {}", path.display()))?;
        Ok(cfg)
    }
}

/// Whether the config text's `[schedule]` table has a `total_steps` key.
fn schedule_names_total_steps(text: &str) -> bool {
    toml::from_str::<toml::Table>(text).is_ok_and(|t| {
        t.get("schedule")
            .and_then(|s| s.as_table())
            .is_some_and(|s| s.contains_key("total_steps"))
    })
}

/// Every setting of a training run, resolved. Saved in each checkpoint so that
/// `--resume` continues with the same settings.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TrainSettings {
    pub data: PathBuf,
    pub val_data: Option<PathBuf>,
    pub steps: u64,
    pub batch_size: usize,
    pub seq_len: usize,
    pub grad_accum: usize,
    pub lr: f32,
    pub lr_schedule: LrSchedule,
    pub warmup_steps: u64,
    pub min_lr: f32,
    pub weight_decay: f32,
    pub beta1: f32,
    pub beta2: f32,
    pub eps: f32,
    /// 0: no clipping.
    pub grad_clip: f32,
    pub seed: u64,
    pub eval_every: u64,
    pub eval_batches: usize,
    pub sample_every: u64,
    pub checkpoint_every: u64,
    pub log_every: u64,
    /// The order of the training windows; see [`TrainSettings::data_order`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data_order: Option<DataOrder>,
    /// Checkpoints written before `data_order` existed say `shuffle` instead (and read
    /// in order without it).
    #[serde(default, skip_serializing)]
    pub shuffle: bool,
    /// Newest checkpoints kept (0: all).
    #[serde(default)]
    pub keep_checkpoints: usize,
    /// `--total-batch-tokens`, when given (sets `grad_accum`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub total_batch_tokens: Option<usize>,
}

impl TrainSettings {
    /// Defaults (nanoGPT/llm.c-like) for a model of this context length.
    pub fn defaults(context: usize) -> TrainSettings {
        let opt = OptimizerConfig::default();
        TrainSettings {
            data: PathBuf::new(),
            val_data: None,
            steps: 1000,
            batch_size: 8,
            seq_len: context.min(256),
            grad_accum: 1,
            lr: opt.lr,
            lr_schedule: LrSchedule::Cosine,
            warmup_steps: 0,
            min_lr: opt.lr * 0.1,
            weight_decay: opt.weight_decay,
            beta1: opt.beta1,
            beta2: opt.beta2,
            eps: opt.eps,
            grad_clip: opt.grad_clip.unwrap_or(0.0),
            seed: 1337,
            eval_every: 100,
            eval_batches: 20,
            sample_every: 500,
            checkpoint_every: 500,
            log_every: 10,
            data_order: Some(DataOrder::Shuffle),
            shuffle: false,
            total_batch_tokens: None,
            keep_checkpoints: 0,
        }
    }

    /// Applies a config file's tables over these settings.
    pub fn apply_file(&mut self, file: &FileConfig) {
        if let Some(o) = &file.optimizer {
            self.lr = o.lr;
            self.beta1 = o.beta1;
            self.beta2 = o.beta2;
            self.eps = o.eps;
            self.weight_decay = o.weight_decay;
            self.grad_clip = o.grad_clip.unwrap_or(0.0);
        }
        if let Some(s) = &file.schedule {
            self.warmup_steps = s.warmup_steps;
            self.steps = s.total_steps;
            self.min_lr = self.lr * s.min_lr_ratio;
        } else {
            self.min_lr = self.lr * 0.1;
        }
        if let Some(t) = &file.training {
            set(&mut self.steps, t.steps);
            set(&mut self.batch_size, t.batch_size);
            set(&mut self.seq_len, t.seq_len);
            set(&mut self.grad_accum, t.grad_accum);
            set(&mut self.lr_schedule, t.lr_schedule);
            set(&mut self.seed, t.seed);
            set(&mut self.eval_every, t.eval_every);
            set(&mut self.eval_batches, t.eval_batches);
            set(&mut self.sample_every, t.sample_every);
            set(&mut self.checkpoint_every, t.checkpoint_every);
            if t.data_order.is_some() {
                self.data_order = t.data_order;
            }
        }
    }

    /// Applies the command line over these settings. A warmup that came from the config
    /// file or the resumed run and is longer than the run is cut to the run's length, so
    /// that `--steps 10` tries a config out; the note returned says so. One the user
    /// passed (`--warmup-steps`) is never changed: [`Self::validate`] refuses it.
    #[must_use = "the note says that the warmup was cut"]
    pub fn apply_args(&mut self, a: &TrainArgs) -> Option<String> {
        if let Some(lr) = a.lr {
            // The floor follows the peak unless it is given too.
            if a.min_lr.is_none() && self.lr > 0.0 {
                self.min_lr = lr * (self.min_lr / self.lr);
            }
            self.lr = lr;
        }
        set(&mut self.data, a.data.clone());
        if a.val_data.is_some() {
            self.val_data = a.val_data.clone();
        }
        set(&mut self.steps, a.steps);
        set(&mut self.batch_size, a.batch_size);
        set(&mut self.seq_len, a.seq_len);
        set(&mut self.grad_accum, a.grad_accum);
        set(&mut self.lr_schedule, a.lr_schedule);
        set(&mut self.warmup_steps, a.warmup_steps);
        set(&mut self.min_lr, a.min_lr);
        set(&mut self.weight_decay, a.weight_decay);
        set(&mut self.beta1, a.beta1);
        set(&mut self.beta2, a.beta2);
        set(&mut self.eps, a.eps);
        set(&mut self.grad_clip, a.grad_clip);
        set(&mut self.seed, a.seed);
        set(&mut self.eval_every, a.eval_every);
        set(&mut self.eval_batches, a.eval_batches);
        set(&mut self.sample_every, a.sample_every);
        set(&mut self.checkpoint_every, a.checkpoint_every);
        set(&mut self.log_every, a.log_every);
        set(&mut self.keep_checkpoints, a.keep_checkpoints);
        if a.data_order.is_some() {
            self.data_order = a.data_order;
        } else if a.shuffle {
            self.data_order = Some(DataOrder::Shuffle);
        }
        if let Some(total) = a.total_batch_tokens {
            // Checked in `validate`: 0 marks a total that B·T does not divide.
            let micro = self.batch_size.checked_mul(self.seq_len).unwrap_or(0);
            self.grad_accum = if micro > 0 && total % micro == 0 {
                total / micro
            } else {
                0
            };
            self.total_batch_tokens = Some(total);
        }
        (a.warmup_steps.is_none() && self.warmup_steps > self.steps).then(|| {
            let note = format!(
                "the warmup of {} steps is longer than the run's {}: it is cut to {} \
                 (pass --warmup-steps to choose it)",
                self.warmup_steps, self.steps, self.steps
            );
            self.warmup_steps = self.steps;
            note
        })
    }

    /// Checks the values against each other and the model; the error names the flag.
    pub fn validate(&self, model: &ModelConfig) -> Result<()> {
        if self.data.as_os_str().is_empty() {
            bail!("no training data: pass --data <shard or directory> (make shards with `andrea prepare`)");
        }
        if let (Some(total), 0) = (self.total_batch_tokens, self.grad_accum) {
            bail!(
                "--total-batch-tokens {total} is not a multiple of --batch-size x --seq-len = {}: \
                 choose a multiple, or set --grad-accum instead",
                self.batch_size as u128 * self.seq_len as u128
            );
        }
        for (flag, v) in [
            ("--steps", self.steps as usize),
            ("--batch-size", self.batch_size),
            ("--seq-len", self.seq_len),
            ("--grad-accum", self.grad_accum),
            ("--eval-batches", self.eval_batches),
        ] {
            if v == 0 {
                bail!("{flag} must be at least 1, got 0");
            }
        }
        for (flag, v, max) in [
            ("--batch-size", self.batch_size, limits::MAX_BATCH),
            ("--seq-len", self.seq_len, limits::MAX_SEQ),
            ("--grad-accum", self.grad_accum, limits::MAX_GRAD_ACCUM),
        ] {
            if v as u64 > max {
                bail!("{flag} (or its key in [training]) must be at most {max}, got {v}");
            }
        }
        if self.seq_len > model.context_length {
            bail!(
                "--seq-len {} is longer than the model's context length {}: pass --seq-len {} or less",
                self.seq_len,
                model.context_length,
                model.context_length
            );
        }
        if self.warmup_steps > self.steps {
            bail!(
                "--warmup-steps {} is more than the run's {} steps (--steps): pass \
                 --warmup-steps {} or less, or leave it out (a longer warmup from the config \
                 is cut to the run)",
                self.warmup_steps,
                self.steps,
                self.steps
            );
        }
        // The peak first: a bad --lr must not be reported as a bad --min-lr.
        if !(self.lr >= 0.0 && self.lr.is_finite()) {
            bail!("--lr must be a non-negative finite number, got {}", self.lr);
        }
        if !(self.min_lr >= 0.0 && self.min_lr <= self.lr) {
            bail!(
                "--min-lr must be in [0, --lr = {}], got {}",
                self.lr,
                self.min_lr
            );
        }
        if !(self.grad_clip >= 0.0 && self.grad_clip.is_finite()) {
            bail!(
                "--grad-clip must be a non-negative number (0 disables clipping), got {}",
                self.grad_clip
            );
        }
        self.optimizer()
            .validate()
            .map_err(|e| anyhow::anyhow!("{e} (set it with the matching --flag)"))?;
        Ok(())
    }

    pub fn optimizer(&self) -> OptimizerConfig {
        OptimizerConfig {
            lr: self.lr,
            beta1: self.beta1,
            beta2: self.beta2,
            eps: self.eps,
            weight_decay: self.weight_decay,
            grad_clip: (self.grad_clip > 0.0).then_some(self.grad_clip),
        }
    }

    /// The learning rate of optimizer step `step` (0-based).
    pub fn lr_at(&self, step: u64) -> f32 {
        match self.lr_schedule {
            LrSchedule::Constant if step < self.warmup_steps => {
                (self.lr as f64 * (step + 1) as f64 / self.warmup_steps as f64) as f32
            }
            LrSchedule::Constant => self.lr,
            LrSchedule::Cosine => {
                let schedule = ScheduleConfig {
                    warmup_steps: self.warmup_steps,
                    total_steps: self.steps.max(1),
                    min_lr_ratio: if self.lr > 0.0 {
                        self.min_lr / self.lr
                    } else {
                        0.0
                    },
                };
                schedule.lr(self.lr, step)
            }
        }
    }

    /// The order of the training windows (a checkpoint from before the setting existed:
    /// shuffled if it says `shuffle`, else sequential, its default then).
    pub fn data_order(&self) -> DataOrder {
        match (self.data_order, self.shuffle) {
            (Some(order), _) => order,
            (None, true) => DataOrder::Shuffle,
            (None, false) => DataOrder::Sequential,
        }
    }

    /// Tokens one optimizer step sees.
    pub fn tokens_per_step(&self) -> usize {
        self.batch_size * self.seq_len * self.grad_accum
    }
}

fn set<T>(slot: &mut T, value: Option<T>) {
    if let Some(v) = value {
        *slot = v;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cosine_goes_from_peak_to_floor() {
        let mut s = TrainSettings::defaults(64);
        s.steps = 10;
        s.warmup_steps = 2;
        s.lr = 1.0;
        s.min_lr = 0.1;
        assert!((s.lr_at(0) - 0.5).abs() < 1e-6);
        assert!((s.lr_at(2) - 1.0).abs() < 1e-6);
        assert!((s.lr_at(10) - 0.1).abs() < 1e-6);
        s.lr_schedule = LrSchedule::Constant;
        assert_eq!(s.lr_at(9), 1.0);
    }

    #[test]
    fn a_schedule_without_total_steps_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.toml");
        let model =
            "[model]\nvocab_size = 10\ncontext_length = 8\nd_model = 8\nn_layer = 1\nn_head = 1\n";
        std::fs::write(&path, format!("{model}[schedule]\nmin_lr_ratio = 0.2\n")).unwrap();
        let err = FileConfig::read(&path).unwrap_err().to_string();
        assert!(err.contains("no total_steps"), "{err}");
        std::fs::write(&path, format!("{model}[schedule]\ntotal_steps = 50\n")).unwrap();
        let mut s = TrainSettings::defaults(8);
        s.apply_file(&FileConfig::read(&path).unwrap());
        assert_eq!(s.steps, 50);
    }

    /// A config of a small model with `tables`, and the default settings with it applied.
    fn from_file(tables: &str) -> (FileConfig, TrainSettings) {
        let model =
            "[model]\nvocab_size = 10\ncontext_length = 8\nd_model = 8\nn_layer = 1\nn_head = 1\n";
        let file: FileConfig = toml::from_str(&format!("{model}{tables}")).unwrap();
        let mut s = TrainSettings::defaults(8);
        s.apply_file(&file);
        (file, s)
    }

    #[test]
    fn command_line_overrides_the_file() {
        let (_, mut s) = from_file("[training]\nbatch_size = 3\nsteps = 7\n");
        assert_eq!((s.batch_size, s.steps), (3, 7));
        let args = TrainArgs {
            steps: Some(9),
            ..TrainArgs::default()
        };
        assert_eq!(s.apply_args(&args), None);
        assert_eq!((s.batch_size, s.steps), (3, 9));
    }

    #[test]
    fn a_warmup_from_the_file_is_cut_to_the_run_one_passed_is_not() {
        let (file, mut s) = from_file("[schedule]\nwarmup_steps = 700\ntotal_steps = 1000\n");
        s.data = "d".into();
        let args = |steps, warmup_steps| TrainArgs {
            steps: Some(steps),
            warmup_steps,
            ..TrainArgs::default()
        };
        let mut short = s.clone();
        let note = short.apply_args(&args(10, None)).expect("a note");
        assert!(note.contains("700") && note.contains("cut to 10"), "{note}");
        assert_eq!(short.warmup_steps, 10);
        short.validate(&file.model).unwrap();
        // A second application (as `train` does) says nothing more.
        assert_eq!(short.apply_args(&args(10, None)), None);
        // Long enough: nothing changes.
        let mut long = s.clone();
        assert_eq!(long.apply_args(&args(700, None)), None);
        assert_eq!(long.warmup_steps, 700);
        // Passed by the user: kept, and refused.
        let mut explicit = s.clone();
        assert_eq!(explicit.apply_args(&args(10, Some(50))), None);
        assert_eq!(explicit.warmup_steps, 50);
        let err = explicit.validate(&file.model).unwrap_err().to_string();
        assert!(
            err.contains("--warmup-steps 50 is more than the run's 10"),
            "{err}"
        );
    }

    /// `andrea train --help` states the built-in defaults these settings start from.
    #[test]
    fn train_help_states_the_built_in_defaults() {
        use clap::{CommandFactory, ValueEnum};
        let cli = crate::cli::Cli::command();
        let train = cli.find_subcommand("train").unwrap();
        let help = |id: &str| {
            let arg = train.get_arguments().find(|a| a.get_id() == id);
            arg.and_then(|a| a.get_help())
                .map_or_else(String::new, |h| h.to_string())
        };
        let d = TrainSettings::defaults(1024);
        let schedule = d.lr_schedule.to_possible_value().unwrap();
        for (id, value) in [
            ("steps", d.steps.to_string()),
            ("batch_size", d.batch_size.to_string()),
            ("grad_accum", d.grad_accum.to_string()),
            ("lr", format!("{:e}", d.lr)),
            ("lr_schedule", schedule.get_name().to_string()),
            ("weight_decay", d.weight_decay.to_string()),
            ("beta1", d.beta1.to_string()),
            ("beta2", d.beta2.to_string()),
            ("eps", format!("{:e}", d.eps)),
            ("grad_clip", d.grad_clip.to_string()),
            ("seed", d.seed.to_string()),
            ("eval_every", d.eval_every.to_string()),
            ("eval_batches", d.eval_batches.to_string()),
            ("sample_every", d.sample_every.to_string()),
            ("checkpoint_every", d.checkpoint_every.to_string()),
            ("keep_checkpoints", d.keep_checkpoints.to_string()),
            ("log_every", d.log_every.to_string()),
        ] {
            let text = help(id);
            assert!(
                text.contains(&format!("else {value}]"))
                    || text.contains(&format!("[default: {value}]")),
                "--{id}: the default is {value}, the help says: {text}"
            );
        }
        assert!(help("warmup_steps").contains(&format!("else {};", d.warmup_steps)));
        assert!(help("min_lr").contains("else --lr / 10]") && d.min_lr == d.lr * 0.1);
        assert!(help("seq_len").contains("context length up to 256]"));
        assert_eq!((d.seq_len, TrainSettings::defaults(64).seq_len), (256, 64));
    }

    #[test]
    fn unknown_training_key_is_named() {
        let err = toml::from_str::<FileConfig>(
            "[model]\nvocab_size = 10\ncontext_length = 8\nd_model = 8\nn_layer = 1\nn_head = 1\n\
             [training]\nbatch = 3\n",
        )
        .unwrap_err();
        assert!(err.to_string().contains("batch"), "{err}");
    }
}
