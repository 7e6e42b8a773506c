//! A shard set: the shards of one corpus, the tokenizer that made them and a manifest,
//! in one directory written as a unit.
//!
//! [`prepare_shard_set`] writes the set into `.<name>.tmp-<pid>` next to the output
//! directory and renames it into place whole only when every shard, `tokenizer.json` and
//! `manifest.json` (last) are written, so the output directory holds either the old set
//! or the new one, never a mix of the two or a partial set: shards of an earlier corpus
//! are never read beside a new one. A lock (`.<name>.lock` next to it, `flock`, released
//! by the kernel however the process ends, removed when released) refuses a second writer of the same directory
//! while one runs. What a killed writer left (`.<name>.tmp-<pid>`, `.<name>.old-<pid>`
//! of a process no longer running) is removed by the next one.
//!
//! `manifest.json` ([`Manifest`]) names every shard with its token count, and the
//! tokenizer's [`fingerprint`], so a reader can refuse a set that is incomplete, damaged
//! or made with another tokenizer, even without the `tokenizer.json` beside it.

use crate::error::{Error, Result};
use crate::shards::{write_shards, ShardOptions, ShardReport, TokenShard};
use crate::tokenizer::Tokenizer;
use andrea_fs::{LockError, LockFile};
use serde::{Deserialize, Serialize};
use std::fs::File;
use std::io::Read;
use std::path::{Path, PathBuf};

/// The manifest's file name in a shard set.
pub const MANIFEST_FILE: &str = "manifest.json";
/// The tokenizer's file name in a shard set.
pub const TOKENIZER_FILE: &str = "tokenizer.json";
/// [`Manifest::format`] of this andrea.
pub const MANIFEST_FORMAT: u32 = 1;

/// A shard of the set and its token count.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShardEntry {
    pub name: String,
    pub tokens: u64,
}

/// `manifest.json`: what a complete shard set holds.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Manifest {
    pub format: u32,
    /// [`fingerprint`] of the tokenizer the shards were encoded with.
    pub tokenizer_fingerprint: String,
    pub vocab_size: u32,
    pub train: Vec<ShardEntry>,
    pub val: Vec<ShardEntry>,
    /// Input files and bytes read.
    pub input_files: u64,
    pub input_bytes: u64,
}

/// FNV-1a, 64 bits.
fn fnv1a64(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ b as u64).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

/// The identity of a tokenizer: FNV-1a-64 of its `tokenizer.json` text (which is
/// written deterministically), as `fnv1a64:<16 hex digits>`. Two tokenizers with the
/// same ids for the same text have the same fingerprint.
pub fn fingerprint(tokenizer: &Tokenizer) -> String {
    format!(
        "fnv1a64:{:016x}",
        fnv1a64(tokenizer.to_json_string().as_bytes())
    )
}

impl Manifest {
    /// The manifest of the set in `dir`, or `None` if it has none (shards of an older
    /// andrea, or llm.c's).
    pub fn read(dir: &Path) -> Result<Option<Manifest>> {
        let path = dir.join(MANIFEST_FILE);
        let mut text = String::new();
        match File::open(&path) {
            Ok(f) => f
                .take(16 << 20)
                .read_to_string(&mut text)
                .map_err(|e| Error::io(&path, e))?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(Error::io(&path, e)),
        };
        let manifest: Manifest = serde_json::from_str(&text).map_err(|e| Error::Shard {
            path: path.clone(),
            message: format!(
                "not a shard set manifest ({e}): make the set again with `andrea prepare`"
            ),
        })?;
        if manifest.format != MANIFEST_FORMAT {
            return Err(Error::Shard {
                path,
                message: format!(
                    "manifest format {}, this andrea reads {MANIFEST_FORMAT}: use the andrea that wrote it, \
                     or make the set again with `andrea prepare`",
                    manifest.format
                ),
            });
        }
        Ok(Some(manifest))
    }

    /// The shards of `split` ("train" or "val").
    pub fn shards(&self, split: &str) -> &[ShardEntry] {
        match split {
            "train" => &self.train,
            _ => &self.val,
        }
    }

    /// Checks that every shard the manifest lists is in `dir` with its token count;
    /// an interrupted copy or a damaged file is refused by name.
    pub fn verify(&self, dir: &Path) -> Result<()> {
        for entry in self.train.iter().chain(&self.val) {
            let path = dir.join(&entry.name);
            let incomplete = |what: String| Error::Shard {
                path: dir.to_path_buf(),
                message: format!(
                    "the shard set is incomplete or damaged: {} {what} (its {MANIFEST_FILE} lists \
                     {} tokens); make the set again with `andrea prepare`",
                    entry.name, entry.tokens
                ),
            };
            if !path.is_file() {
                return Err(incomplete("is missing".into()));
            }
            let shard =
                TokenShard::open(&path).map_err(|e| incomplete(format!("is unreadable ({e})")))?;
            if shard.len() as u64 != entry.tokens {
                return Err(incomplete(format!("holds {} tokens", shard.len())));
            }
        }
        Ok(())
    }
}

/// Where the set `out` and its companions live: (parent directory, `out`'s name).
fn place(out: &Path) -> Result<(PathBuf, String)> {
    let invalid = || {
        Error::Invalid(format!(
            "{} does not name a directory to write the shard set into: name a new or empty \
             directory, such as `data`",
            out.display()
        ))
    };
    let name = out
        .file_name()
        .and_then(|n| n.to_str())
        .filter(|n| !n.is_empty() && *n != "." && *n != "..")
        .ok_or_else(invalid)?;
    let parent = match out.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    Ok((parent, name.to_string()))
}

/// Whether process `pid` runs (on Linux, its `/proc` entry; elsewhere taken as running,
/// so nothing of a live writer is ever removed).
fn alive(pid: u32) -> bool {
    if cfg!(target_os = "linux") {
        Path::new("/proc").join(pid.to_string()).exists()
    } else {
        true
    }
}

/// Removes `.<name>.tmp-<pid>` and `.<name>.old-<pid>` of processes no longer running.
fn remove_leftovers(parent: &Path, name: &str) -> Result<Vec<PathBuf>> {
    let mut removed = Vec::new();
    let entries = std::fs::read_dir(parent).map_err(|e| Error::io(parent, e))?;
    for entry in entries.flatten() {
        let file = entry.file_name();
        let Some(rest) = file
            .to_str()
            .and_then(|f| f.strip_prefix(&format!(".{name}.")))
        else {
            continue;
        };
        let pid = rest
            .strip_prefix("tmp-")
            .or_else(|| rest.strip_prefix("old-"))
            .and_then(|p| p.parse::<u32>().ok());
        if pid.is_some_and(|p| p != std::process::id() && !alive(p)) {
            let path = entry.path();
            std::fs::remove_dir_all(&path).map_err(|e| Error::io(&path, e))?;
            removed.push(path);
        }
    }
    Ok(removed)
}

/// Refuses an `out` that exists and is not a shard set (a file, or a directory holding
/// anything but shards, `tokenizer.json` and `manifest.json`): replacing it would lose
/// the user's files.
fn check_replaceable(out: &Path) -> Result<()> {
    let meta = match std::fs::symlink_metadata(out) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(Error::io(out, e)),
    };
    if !meta.is_dir() {
        return Err(Error::Invalid(format!(
            "--out {} exists and is not a directory: name a new or empty directory for the shard set",
            out.display()
        )));
    }
    let mut others = Vec::new();
    for entry in std::fs::read_dir(out).map_err(|e| Error::io(out, e))? {
        let entry = entry.map_err(|e| Error::io(out, e))?;
        let name = entry.file_name().to_string_lossy().into_owned();
        let ours = name == MANIFEST_FILE
            || name == TOKENIZER_FILE
            || crate::shards::parse_shard_name(&name).is_some()
            // A temporary file of an older andrea's shard writer.
            || (name.starts_with('.') && name.contains(".tmp-"));
        if !ours || !entry.file_type().map_err(|e| Error::io(out, e))?.is_file() {
            others.push(name);
        }
    }
    if !others.is_empty() {
        others.sort();
        let shown: Vec<&str> = others.iter().take(5).map(String::as_str).collect();
        return Err(Error::Invalid(format!(
            "--out {} holds {} file(s) that are not part of a shard set ({}{}): `andrea prepare` \
             replaces the whole directory, so name a new or empty one",
            out.display(),
            others.len(),
            shown.join(", "),
            if others.len() > shown.len() {
                ", ..."
            } else {
                ""
            }
        )));
    }
    Ok(())
}

/// Held while a set is written ([`LockFile`]: the kernel releases it however the
/// process ends; removed when released).
fn lock(parent: &Path, name: &str, out: &Path) -> Result<LockFile> {
    let path = parent.join(format!(".{name}.lock"));
    LockFile::try_acquire(&path).map_err(|e| match e {
        LockError::Held { holder } => Error::Invalid(format!(
            "another `andrea prepare` ({}) is writing the shard set {} (it holds {}): \
             wait for it to finish, or write into another --out",
            holder.map_or("starting up".to_string(), |pid| format!("process {pid}")),
            out.display(),
            path.display()
        )),
        LockError::Io(e) => Error::io(&path, e),
    })
}

/// What [`prepare_shard_set`] did.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct SetReport {
    pub shards: ShardReport,
    /// Leftovers of killed writers that were removed.
    pub removed: Vec<PathBuf>,
}

/// Encodes `inputs` into a complete shard set at `out` (see the module docs), replacing
/// the set there. Fails, leaving `out` as it was, if the input holds no training text.
pub fn prepare_shard_set<P: AsRef<Path>>(
    tokenizer: &Tokenizer,
    inputs: &[P],
    out: &Path,
    options: &ShardOptions,
) -> Result<SetReport> {
    let (parent, name) = place(out)?;
    std::fs::create_dir_all(&parent).map_err(|e| Error::io(&parent, e))?;
    let _lock = lock(&parent, &name, out)?;
    let removed = remove_leftovers(&parent, &name)?;
    check_replaceable(out)?;
    let tmp = parent.join(format!(".{name}.tmp-{}", std::process::id()));
    if tmp.exists() {
        std::fs::remove_dir_all(&tmp).map_err(|e| Error::io(&tmp, e))?;
    }
    let written = write_set(tokenizer, inputs, &tmp, options).and_then(|report| {
        install(&tmp, out, &parent, &name)?;
        Ok(report)
    });
    match written {
        Ok(shards) => Ok(SetReport { shards, removed }),
        Err(e) => {
            let _ = std::fs::remove_dir_all(&tmp);
            Err(e)
        }
    }
}

/// The whole set into `dir`, the manifest last.
fn write_set<P: AsRef<Path>>(
    tokenizer: &Tokenizer,
    inputs: &[P],
    dir: &Path,
    options: &ShardOptions,
) -> Result<ShardReport> {
    let report = write_shards(tokenizer, inputs, dir, options)?;
    if report.train_tokens == 0 {
        return Err(Error::Invalid(if report.val_tokens > 0 {
            format!(
                "the validation split took all the text ({} files, {} bytes, {} tokens, all in \
                 validation): --val-fraction {} of the input ends where the text cannot be cut \
                 without changing its tokens, or leaves too little; give more text, or a smaller \
                 --val-fraction (0 for none)",
                report.files, report.bytes, report.val_tokens, options.val_fraction
            )
        } else {
            format!(
                "the input holds no text to train on ({} files, {} bytes): give text files or \
                 directories holding some",
                report.files, report.bytes
            )
        }));
    }
    tokenizer.save(dir.join(TOKENIZER_FILE))?;
    let entries = |paths: &[PathBuf]| -> Result<Vec<ShardEntry>> {
        paths
            .iter()
            .map(|p| {
                Ok(ShardEntry {
                    name: p
                        .file_name()
                        .map(|n| n.to_string_lossy().into_owned())
                        .unwrap_or_default(),
                    tokens: TokenShard::open(p)?.len() as u64,
                })
            })
            .collect()
    };
    let manifest = Manifest {
        format: MANIFEST_FORMAT,
        tokenizer_fingerprint: fingerprint(tokenizer),
        vocab_size: tokenizer.vocab_size() as u32,
        train: entries(&report.train_shards)?,
        val: entries(&report.val_shards)?,
        input_files: report.files as u64,
        input_bytes: report.bytes,
    };
    let json =
        serde_json::to_string_pretty(&manifest).map_err(|e| Error::Invalid(e.to_string()))?;
    let path = dir.join(MANIFEST_FILE);
    andrea_fs::write_atomic(&path, json.as_bytes()).map_err(|e| Error::io(&path, e))?;
    Ok(report)
}

/// Puts the complete set `tmp` in the place of `out`: the old set is renamed aside, the
/// new one renamed in, the old one removed. An interruption between the two renames
/// leaves no `out` and the old set in `.<name>.old-<pid>` (removed by the next prepare),
/// never a mix.
fn install(tmp: &Path, out: &Path, parent: &Path, name: &str) -> Result<()> {
    let old = parent.join(format!(".{name}.old-{}", std::process::id()));
    let had_old = out.exists();
    if had_old {
        if old.exists() {
            std::fs::remove_dir_all(&old).map_err(|e| Error::io(&old, e))?;
        }
        std::fs::rename(out, &old).map_err(|e| Error::io(out, e))?;
    }
    andrea_fs::rename_durable(tmp, out).map_err(|e| Error::io(out, e))?;
    if had_old {
        std::fs::remove_dir_all(&old).map_err(|e| Error::io(&old, e))?;
    }
    Ok(())
}
