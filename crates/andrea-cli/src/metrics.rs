//! What a run reports as it goes: a progress bar on a terminal (log lines otherwise),
//! and `metrics.jsonl` in the run directory, one JSON object per logged step.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use serde::{Deserialize, Serialize};

use crate::plot::LossSeries;

pub const METRICS_FILE: &str = "metrics.jsonl";

/// One line of `metrics.jsonl`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Metric {
    pub step: u64,
    pub train_loss: f32,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub val_loss: Option<f32>,
    pub lr: f32,
    pub grad_norm: f32,
    pub tokens_per_s: f64,
    /// On the first step of a resumed run: the step of the checkpoint it resumed from
    /// (set by [`Metrics::write`]).
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub resumed_from: Option<u64>,
}

pub const PLOT_FILE: &str = "loss.svg";

pub struct Metrics {
    path: PathBuf,
    file: File,
    /// Every line of the run so far (for the plot).
    history: Vec<Metric>,
    /// The step resumed from, until the first line after it is written.
    resumed_from: Option<u64>,
}

impl Metrics {
    /// Opens `<out>/metrics.jsonl` for appending, first dropping lines past `keep_until`
    /// (a resumed run repeats the steps after its checkpoint). `keep_until` above 0 is
    /// the step of the checkpoint a run resumes from: the next line written records it.
    pub fn open(out: &Path, keep_until: u64) -> Result<Metrics> {
        let path = out.join(METRICS_FILE);
        let mut history = Vec::new();
        if let Ok(text) = std::fs::read_to_string(&path) {
            let mut kept = String::new();
            for line in text.lines() {
                if let Ok(m) = serde_json::from_str::<Metric>(line) {
                    if m.step <= keep_until {
                        kept.push_str(line);
                        kept.push('\n');
                        history.push(m);
                    }
                }
            }
            andrea_fs::write_atomic(&path, kept.as_bytes())
                .with_context(|| format!("writing {}", path.display()))?;
        }
        let file = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .with_context(|| format!("cannot open {} for writing", path.display()))?;
        Ok(Metrics {
            path,
            file,
            history,
            resumed_from: (keep_until > 0).then_some(keep_until),
        })
    }

    /// Appends `m` (with `resumed_from` on the first line after a resume).
    pub fn write(&mut self, m: &Metric) -> Result<()> {
        let m = Metric {
            resumed_from: self.resumed_from.take().or(m.resumed_from),
            ..m.clone()
        };
        let line = serde_json::to_string(&m)?;
        self.history.push(m);
        writeln!(self.file, "{line}")
            .and_then(|()| self.file.flush())
            .with_context(|| format!("writing {}", self.path.display()))
    }
}

impl Metrics {
    /// Rewrites `loss.svg` next to `metrics.jsonl` from the whole history.
    pub fn write_plot(&self) -> Result<()> {
        let path = self.path.with_file_name(PLOT_FILE);
        let svg = crate::plot::loss_svg(&loss_series(&self.history))?;
        andrea::model::io::write_atomic(&path, svg.as_bytes())
            .with_context(|| format!("writing {}", path.display()))
    }
}

/// What `loss.svg` shows of a run's lines.
pub fn loss_series(history: &[Metric]) -> LossSeries {
    LossSeries {
        train: history.iter().map(|m| (m.step, m.train_loss)).collect(),
        val: history
            .iter()
            .filter_map(|m| Some((m.step, m.val_loss?)))
            .collect(),
        resumed_from: history.iter().filter_map(|m| m.resumed_from).collect(),
    }
}

/// The progress bar, or plain lines when stderr is not a terminal.
pub struct Progress {
    bar: ProgressBar,
    log_every: u64,
    /// Prints nothing (a data-parallel rank other than 0).
    quiet: bool,
}

impl Progress {
    pub fn new(start: u64, total: u64, log_every: u64) -> Progress {
        let bar = ProgressBar::with_draw_target(Some(total), ProgressDrawTarget::stderr());
        bar.set_style(
            ProgressStyle::with_template(
                "{bar:30.cyan/blue} step {pos}/{len} {msg} [{elapsed_precise}, ETA {eta}]",
            )
            .expect("a valid template")
            .progress_chars("=> "),
        );
        bar.set_position(start);
        Progress {
            bar,
            log_every,
            quiet: false,
        }
    }

    /// With `quiet`, this progress prints nothing at all.
    pub fn quiet(mut self, quiet: bool) -> Progress {
        if quiet {
            self.bar = ProgressBar::hidden();
            self.quiet = true;
        }
        self
    }

    pub fn step(&self, m: &Metric, total: u64) {
        let msg = format!(
            "loss {:.4} lr {:.2e} {:.0} tok/s",
            m.train_loss, m.lr, m.tokens_per_s
        );
        self.bar.set_position(m.step);
        if self.quiet {
        } else if self.bar.is_hidden() {
            if self.log_every > 0 && (m.step.is_multiple_of(self.log_every) || m.step == total) {
                errln!(
                    "step {}/{total} | {msg} | grad norm {:.3}",
                    m.step,
                    m.grad_norm
                );
            }
        } else {
            self.bar.set_message(msg);
        }
    }

    /// A line above the bar (or on stderr without one).
    pub fn println(&self, line: &str) {
        if self.quiet {
        } else if self.bar.is_hidden() {
            errln!("{line}");
        } else {
            self.bar.println(line);
        }
    }

    pub fn finish(&self) {
        self.bar.finish_and_clear();
    }
}
