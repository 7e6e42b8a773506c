//! Checkpoints: a directory per save, `<out>/step-00000100/`, holding
//!
//! * `model.safetensors` + `config.json`: what `GPT2LMHeadModel.from_pretrained` loads;
//! * `tokenizer.json`: the Hugging Face tokenizers file;
//! * `optimizer.safetensors`: the AdamW moments and step count;
//! * `training_state.json`, written last: the step, the data position, the RNG state,
//!   the run's settings, and the size and FNV-1a-64 checksum of every other file.
//!
//! A checkpoint is written into `<out>/.tmp-step-…` and renamed into place when
//! complete, then `<out>/latest` (a symbolic link) is switched to it by renaming a new
//! link over the old one: an interruption at any moment leaves the previous checkpoint
//! and `latest` intact. An interruption between the two renames leaves `latest` one
//! checkpoint behind; [`resolve`] therefore reads `<out>/latest` as the run's newest
//! complete checkpoint, and the next save relinks it. On load every recorded file is checked (present, size,
//! checksum) before anything is read, and the model loader then checks every tensor's
//! name and shape; a damaged checkpoint is refused with the file and what is wrong.

use std::path::{Path, PathBuf};

use andrea::{Backend, Model, Trainer};
use andrea_tokenizer::Tokenizer;
use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};

use crate::data::DataPosition;
use crate::settings::TrainSettings;

pub const STATE_FILE: &str = "training_state.json";
pub const TOKENIZER_FILE: &str = "tokenizer.json";
pub const OPTIMIZER_FILE: &str = "optimizer.safetensors";
const CHECKED_FILES: [&str; 4] = [
    "model.safetensors",
    "config.json",
    TOKENIZER_FILE,
    OPTIMIZER_FILE,
];

/// A file of the checkpoint as recorded when it was written.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FileRecord {
    pub name: String,
    pub bytes: u64,
    /// FNV-1a 64 of the contents, as 16 hex digits.
    pub fnv1a64: String,
}

/// `training_state.json`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TrainingState {
    pub format: u32,
    /// Optimizer steps taken.
    pub step: u64,
    /// Where the next training window starts.
    pub data_position: DataPosition,
    /// State of the run's random generator (used by sampling during training).
    pub rng_state: u64,
    pub settings: TrainSettings,
    pub files: Vec<FileRecord>,
}

/// FNV-1a, 64 bits: a fast checksum that any single flipped byte changes.
pub fn fnv1a64(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in bytes {
        h ^= b as u64;
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

fn record(dir: &Path, name: &str) -> Result<FileRecord> {
    let path = dir.join(name);
    let bytes = std::fs::read(&path).with_context(|| format!("reading back {}", path.display()))?;
    Ok(FileRecord {
        name: name.to_string(),
        bytes: bytes.len() as u64,
        fnv1a64: format!("{:016x}", fnv1a64(&bytes)),
    })
}

/// Writes a checkpoint of `trainer` at its current step into `out` and points
/// `<out>/latest` at it. Returns the checkpoint's directory.
pub fn save<B: Backend>(
    out: &Path,
    trainer: &Trainer<B>,
    tokenizer: &Tokenizer,
    mut state: TrainingState,
) -> Result<PathBuf> {
    let name = format!("step-{:08}", state.step);
    // Unique per process and call (see `run_lock`): two writers never share a file.
    let suffix = crate::run_lock::unique_suffix();
    let tmp = out.join(format!(".tmp-{name}-{suffix}"));
    let fin = out.join(&name);
    let what = || format!("writing the checkpoint {}", fin.display());
    if tmp.exists() {
        std::fs::remove_dir_all(&tmp).with_context(what)?;
    }
    std::fs::create_dir_all(&tmp).with_context(what)?;
    trainer.model().save(&tmp).with_context(what)?;
    trainer
        .save_optimizer_state(tmp.join(OPTIMIZER_FILE))
        .with_context(what)?;
    tokenizer
        .save(tmp.join(TOKENIZER_FILE))
        .with_context(what)?;
    state.files = CHECKED_FILES
        .iter()
        .map(|f| record(&tmp, f))
        .collect::<Result<_>>()?;
    let json = serde_json::to_string_pretty(&state)?;
    andrea::model::io::write_atomic(&tmp.join(STATE_FILE), json.as_bytes()).with_context(what)?;
    if let Ok(meta) = std::fs::symlink_metadata(&fin) {
        if checkpoint_step(&fin).is_none() {
            bail!(
                "cannot write the checkpoint {}: the name is taken by {} that is not a checkpoint \
                 of andrea; move it away",
                fin.display(),
                andrea_fs::kind_name(meta.file_type())
            );
        }
        // Same step saved again (a resumed run stopped at once): replace it.
        let old = out.join(format!(".old-{name}-{suffix}"));
        let _ = std::fs::remove_dir_all(&old);
        std::fs::rename(&fin, &old).with_context(what)?;
        andrea_fs::rename_durable(&tmp, &fin).with_context(what)?;
        let _ = std::fs::remove_dir_all(&old);
    } else {
        andrea_fs::rename_durable(&tmp, &fin).with_context(what)?;
    }
    point_latest(out, &name).with_context(|| format!("updating {}/latest", out.display()))?;
    Ok(fin)
}

/// Removes what an interrupted save left behind (`.tmp-step-*`, `.old-step-*`,
/// `.latest.tmp-*`, and the temporaries of `metrics.jsonl` and `loss.svg`,
/// `.<name>.tmp-<pid>`). Only safe while holding the run's lock.
pub fn remove_stale_temporaries(out: &Path) -> Result<()> {
    let Ok(entries) = std::fs::read_dir(out) else {
        return Ok(());
    };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let p = entry.path();
        if name.starts_with(".tmp-step-") || name.starts_with(".old-step-") {
            std::fs::remove_dir_all(&p).with_context(|| format!("removing {}", p.display()))?;
        } else if name.starts_with(".latest.tmp")
            || name.starts_with(&format!(".{}.tmp-", crate::metrics::METRICS_FILE))
            || name.starts_with(&format!(".{}.tmp-", crate::metrics::PLOT_FILE))
        {
            std::fs::remove_file(&p).with_context(|| format!("removing {}", p.display()))?;
        }
    }
    Ok(())
}

/// The step of a checkpoint directory this andrea wrote: a name `step-` + 8 digits
/// (as [`save`] makes) and a `training_state.json` inside. Anything else in a run
/// directory (a user's `step-notes/`) is not ours to prune or replace.
pub fn checkpoint_step(p: &Path) -> Option<u64> {
    let name = p.file_name()?.to_str()?;
    let digits = name.strip_prefix("step-")?;
    if digits.len() != 8 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let meta = std::fs::symlink_metadata(p).ok()?;
    if !meta.is_dir() || !p.join(STATE_FILE).is_file() {
        return None;
    }
    digits.parse().ok()
}

/// The checkpoints of the run directory `out`, oldest first.
pub fn list(out: &Path) -> Result<Vec<(u64, PathBuf)>> {
    let mut steps: Vec<(u64, PathBuf)> = std::fs::read_dir(out)
        .with_context(|| format!("listing {}", out.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter_map(|p| checkpoint_step(&p).map(|s| (s, p)))
        .collect();
    steps.sort();
    Ok(steps)
}

/// Removes all but the newest `keep` checkpoints of `out`; 0 keeps all.
pub fn prune(out: &Path, keep: usize) -> Result<()> {
    if keep == 0 {
        return Ok(());
    }
    let steps = list(out)?;
    let old = steps.len().saturating_sub(keep);
    for (_, p) in &steps[..old] {
        std::fs::remove_dir_all(p).with_context(|| format!("removing {}", p.display()))?;
    }
    Ok(())
}

#[cfg(unix)]
pub fn point_latest(out: &Path, name: &str) -> std::io::Result<()> {
    // `latest` is ours to replace only while it is a link, a file or absent: never a FIFO,
    // a device or a directory someone put under the name.
    let latest = out.join("latest");
    if let Ok(meta) = std::fs::symlink_metadata(&latest) {
        if !meta.file_type().is_symlink() && !meta.is_file() {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                format!(
                    "{} is {}, not the link to the newest checkpoint andrea keeps there: move it away",
                    latest.display(),
                    andrea_fs::kind_name(meta.file_type())
                ),
            ));
        }
    }
    let tmp = out.join(format!(".latest.tmp-{}", crate::run_lock::unique_suffix()));
    let _ = std::fs::remove_file(&tmp);
    std::os::unix::fs::symlink(name, &tmp)?;
    andrea_fs::rename_durable(&tmp, &out.join("latest"))
}

#[cfg(not(unix))]
pub fn point_latest(out: &Path, name: &str) -> std::io::Result<()> {
    // Without symbolic links: `latest` is a file naming the newest checkpoint.
    andrea_fs::write_atomic(&out.join("latest"), name.as_bytes())
}

/// The directory a checkpoint path names. `<out>/latest` names the run's newest
/// complete checkpoint: its target, or a newer `step-*` directory when a save was
/// interrupted after renaming that checkpoint into place but before relinking `latest`
/// (a kill or power loss at that moment must not make `--resume <out>/latest` refuse
/// with "newer checkpoints", nor resume from the older one).
pub fn resolve(path: &Path) -> Result<PathBuf> {
    if path.file_name().is_some_and(|n| n == "latest") {
        if let Some(dir) = newest_behind_latest(path) {
            return Ok(dir);
        }
    }
    let meta = std::fs::metadata(path).with_context(|| {
        format!(
            "cannot open the checkpoint {}: check the path (a run's newest checkpoint is <out>/latest)",
            path.display()
        )
    })?;
    if meta.is_file() && path.file_name().is_some_and(|n| n == "latest") {
        let name = std::fs::read_to_string(path)?;
        return Ok(path.with_file_name(name.trim()));
    }
    if !meta.is_dir() {
        bail!(
            "the checkpoint {} is not a directory: pass a checkpoint directory such as <out>/latest",
            path.display()
        );
    }
    let weights = path.join(andrea::model::io::WEIGHTS_FILE);
    if std::fs::symlink_metadata(&weights).is_err()
        && std::fs::symlink_metadata(path.join("latest")).is_ok()
    {
        bail!(
            "{} is a run directory, not a checkpoint: pass {}/latest (its newest checkpoint) \
             or one of its step-* directories",
            path.display(),
            path.display()
        );
    }
    Ok(std::fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf()))
}

/// The run directory's newest checkpoint when it is newer than what `latest` names
/// (or `latest` names nothing that exists); `None` when `latest` is current or the
/// directory holds no checkpoint of ours.
fn newest_behind_latest(latest: &Path) -> Option<PathBuf> {
    let out = latest.parent().filter(|p| !p.as_os_str().is_empty());
    let out = out.unwrap_or(Path::new("."));
    let (newest, dir) = list(out).ok()?.pop()?;
    let target = match std::fs::read_link(latest) {
        Ok(t) => Some(t),
        // Without symbolic links `latest` is a file holding the checkpoint's name.
        Err(_) => std::fs::read_to_string(latest)
            .ok()
            .map(|s| PathBuf::from(s.trim())),
    };
    let named = target.and_then(|t| checkpoint_step(&out.join(t)));
    match named {
        Some(step) if step >= newest => None,
        _ => Some(std::fs::canonicalize(&dir).unwrap_or(dir)),
    }
}

/// `training_state.json` is a few KiB; a larger one is not ours.
const MAX_STATE_BYTES: u64 = 1 << 20;

/// Reads `dir/name`, which must be a regular file of at most `max` bytes (a FIFO, a
/// device or a directory is refused before it is opened; a larger file is refused
/// without being read).
fn read_regular(dir: &Path, name: &str, max: u64) -> std::io::Result<Vec<u8>> {
    use std::io::Read;
    let path = dir.join(name);
    let meta = std::fs::metadata(&path)?;
    if !meta.is_file() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            "not a regular file (a directory, device or pipe)",
        ));
    }
    if meta.len() > max {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!(
                "{} bytes, {max} were written (replaced or grown)",
                meta.len()
            ),
        ));
    }
    let mut bytes = Vec::new();
    std::fs::File::open(&path)?
        .take(max.saturating_add(1))
        .read_to_end(&mut bytes)?;
    Ok(bytes)
}

/// Checks every file the checkpoint must hold; returns its training state, or `None`
/// for a plain model directory (transformers' or `Model::save`'s) without one.
pub fn verify(dir: &Path) -> Result<Option<TrainingState>> {
    let state_path = dir.join(STATE_FILE);
    if !state_path.exists() {
        return Ok(None);
    }
    let damaged = |msg: String| {
        anyhow::anyhow!(
            "the checkpoint {} is damaged: {msg}; use an earlier checkpoint of the run (step-* in its directory)",
            dir.display()
        )
    };
    let text = read_regular(dir, STATE_FILE, MAX_STATE_BYTES)
        .map_err(|e| damaged(format!("cannot read {STATE_FILE}: {e}")))?;
    let text =
        String::from_utf8(text).map_err(|_| damaged(format!("{STATE_FILE} is not UTF-8 text")))?;
    let state: TrainingState = serde_json::from_str(&text)
        .map_err(|e| damaged(format!("{STATE_FILE} is not valid: {e}")))?;
    if state.format != 1 {
        bail!(
            "the checkpoint {} has format {}, this andrea reads format 1: use the andrea that wrote it",
            dir.display(),
            state.format
        );
    }
    // The files a checkpoint holds are fixed by the format, not by the manifest: each
    // must have exactly one record, and no other record is allowed (a manifest with
    // names of its own could point outside the checkpoint).
    if let Some(f) = state
        .files
        .iter()
        .find(|f| !CHECKED_FILES.contains(&f.name.as_str()))
    {
        return Err(damaged(format!(
            "{STATE_FILE} lists {:?}, which is not a file of a checkpoint (those are {})",
            f.name,
            CHECKED_FILES.join(", ")
        )));
    }
    let mut records = Vec::with_capacity(CHECKED_FILES.len());
    for name in CHECKED_FILES {
        let mut of_name = state.files.iter().filter(|f| f.name == name);
        let (Some(f), None) = (of_name.next(), of_name.next()) else {
            return Err(damaged(format!(
                "{STATE_FILE} must record {name} exactly once (its list of files is incomplete or edited)"
            )));
        };
        records.push((name, f));
    }
    for (name, f) in records {
        let bytes = read_regular(dir, name, f.bytes)
            .map_err(|e| damaged(format!("cannot read {name}: {e}")))?;
        if bytes.len() as u64 != f.bytes {
            return Err(damaged(format!(
                "{name} is {} bytes, {} were written (truncated or replaced)",
                bytes.len(),
                f.bytes
            )));
        }
        let sum = format!("{:016x}", fnv1a64(&bytes));
        if sum != f.fnv1a64 {
            return Err(damaged(format!(
                "{name} has checksum {sum}, {} was written (its contents changed)",
                f.fnv1a64
            )));
        }
    }
    Ok(Some(state))
}

/// A checked checkpoint loaded for inference or to continue training.
pub struct Loaded<B: Backend> {
    pub dir: PathBuf,
    pub model: Model<B>,
    pub tokenizer: Option<Tokenizer>,
    pub state: Option<TrainingState>,
}

/// Resolves, verifies and loads a checkpoint onto `backend`.
pub fn load<B: Backend>(path: &Path, backend: B) -> Result<Loaded<B>> {
    let dir = resolve(path)?;
    let state = verify(&dir)?;
    let model = Model::load(backend, &dir)
        .with_context(|| format!("cannot load the model of the checkpoint {}", dir.display()))?;
    let tok_path = dir.join(TOKENIZER_FILE);
    let tokenizer = if tok_path.exists() {
        Some(Tokenizer::load(&tok_path).with_context(|| {
            format!(
                "cannot load the checkpoint's tokenizer {}",
                tok_path.display()
            )
        })?)
    } else {
        None
    };
    if let Some(t) = &tokenizer {
        if t.vocab_size() > model.config().vocab_size {
            bail!(
                "the checkpoint {}: its tokenizer has {} ids but the model only {}: the files do not belong together",
                dir.display(),
                t.vocab_size(),
                model.config().vocab_size
            );
        }
    }
    Ok(Loaded {
        dir,
        model,
        tokenizer,
        state,
    })
}

impl<B: Backend> Loaded<B> {
    /// The tokenizer, or an error saying how to supply one.
    pub fn tokenizer(&self) -> Result<&Tokenizer> {
        self.tokenizer.as_ref().ok_or_else(|| {
            anyhow::anyhow!(
                "the checkpoint {} has no {TOKENIZER_FILE}: copy the tokenizer it was trained with into it",
                self.dir.display()
            )
        })
    }
}

#[cfg(test)]
mod tests {
    use super::fnv1a64;

    #[test]
    fn fnv_known_values() {
        assert_eq!(fnv1a64(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a64(b"a"), 0xaf63_dc4c_8601_ec8c);
    }
}
