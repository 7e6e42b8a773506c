//! Batches from token shards, as llm.c's loader makes them: a window of `B·T + 1`
//! consecutive tokens gives the inputs (the first `B·T`) and the targets (the last
//! `B·T`, shifted by one); the next window starts `B·T` tokens further. A window that
//! would run past the end of a shard moves to the start of the next shard (after the
//! last, back to the first), so every window lies inside one shard.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use andrea::model::rng::Rng;
use andrea_tokenizer::{parse_shard_name, shard_name, TokenShard};
use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};

/// Where the next window starts.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DataPosition {
    pub shard: usize,
    pub offset: usize,
}

/// One or more shards read in order.
pub struct ShardSet {
    shards: Vec<TokenShard>,
    vocab_size: Option<u32>,
}

/// The shards a path names: the file itself, or the `split` ("train" or "val") shards
/// of a directory, by the exact names `andrea prepare` writes
/// (`<prefix>_<split>_000000.bin`, see [`parse_shard_name`]), in index order. A directory
/// holding shards of more than one prefix is refused: which of them is meant is a guess.
pub fn shard_paths(path: &Path, split: &str) -> Result<Vec<PathBuf>> {
    let meta = std::fs::metadata(path).with_context(|| {
        format!(
            "cannot open the token data {}: check the path (make shards with `andrea prepare`)",
            path.display()
        )
    })?;
    if !meta.is_dir() {
        return Ok(vec![path.to_path_buf()]);
    }
    let entries = std::fs::read_dir(path)
        .with_context(|| format!("cannot list the directory {}", path.display()))?;
    let mut prefixes = BTreeSet::new();
    let mut found = Vec::new();
    for entry in entries {
        let entry = entry.with_context(|| format!("cannot list {}", path.display()))?;
        let name = entry.file_name();
        let Some((prefix, s, index)) = name.to_str().and_then(parse_shard_name) else {
            continue;
        };
        prefixes.insert(prefix.to_string());
        if s == split {
            found.push((index, entry.path()));
        }
    }
    if prefixes.len() > 1 {
        let names: Vec<String> = prefixes.iter().map(|p| format!("{p}_*")).collect();
        bail!(
            "the directory {} holds shards of {} prefixes ({}): which are meant is ambiguous; \
             pass one shard file, or keep each set of shards in its own directory",
            path.display(),
            prefixes.len(),
            names.join(", ")
        );
    }
    found.sort();
    if found.is_empty() {
        bail!(
            "the directory {} holds no `<prefix>_{split}_000000.bin` shards: make them with \
             `andrea prepare`, or pass a shard file",
            path.display()
        );
    }
    Ok(found.into_iter().map(|(_, p)| p).collect())
}

/// Refuses shards made with another tokenizer than `tokenizer`, when the shards say
/// which: `andrea prepare` copies its tokenizer next to them (`tokenizer.json`), and a
/// tokenizer of the same vocabulary size but other merges would otherwise train or
/// evaluate on ids that mean other text. Shards without one (llm.c's) are not checked.
pub fn check_tokenizer(
    data: &Path,
    tokenizer: &andrea_tokenizer::Tokenizer,
    what: &str,
) -> Result<()> {
    let dir = if data.is_dir() {
        data.to_path_buf()
    } else {
        data.parent().map(Path::to_path_buf).unwrap_or_default()
    };
    let theirs_path = dir.join("tokenizer.json");
    if !theirs_path.is_file() {
        return Ok(());
    }
    let theirs = andrea_tokenizer::Tokenizer::load(&theirs_path).with_context(|| {
        format!(
            "cannot read {}, the tokenizer of the {what} shards",
            theirs_path.display()
        )
    })?;
    if theirs.to_json_string() != tokenizer.to_json_string() {
        bail!(
            "the {what} shards in {} were made with the tokenizer {}, which differs from the model's \
             (same vocabulary size or not, the ids mean other text): encode the text again with the \
             model's tokenizer (`andrea prepare --tokenizer <checkpoint>/tokenizer.json`)",
            dir.display(),
            theirs_path.display()
        );
    }
    Ok(())
}

/// The validation shard next to a training shard file, by the naming scheme
/// (`x_train_000003.bin` -> `x_val_000000.bin`), if it exists.
pub fn val_sibling(train: &Path) -> Option<PathBuf> {
    let name = train.file_name()?.to_str()?;
    let (prefix, "train", _) = parse_shard_name(name)? else {
        return None;
    };
    let sibling = train.with_file_name(shard_name(prefix, "val", 0));
    sibling.is_file().then_some(sibling)
}

impl ShardSet {
    pub fn open(path: &Path, split: &str) -> Result<ShardSet> {
        let mut shards = Vec::new();
        let mut vocab_size = None;
        for p in shard_paths(path, split)? {
            let shard = TokenShard::open(&p).with_context(|| {
                format!(
                    "cannot read the token shard {} (is it a shard made by `andrea prepare`?)",
                    p.display()
                )
            })?;
            if let (Some(a), Some(b)) = (vocab_size, shard.vocab_size()) {
                if a != b {
                    bail!(
                        "{} was made with a vocabulary of {b} ids, the shards before it with {a}: \
                         encode all of them with one tokenizer",
                        p.display()
                    );
                }
            }
            vocab_size = vocab_size.or(shard.vocab_size());
            shards.push(shard);
        }
        Ok(ShardSet { shards, vocab_size })
    }

    pub fn total_tokens(&self) -> usize {
        self.shards.iter().map(|s| s.len()).sum()
    }

    /// Refuses shards made with another vocabulary than the model's, shards holding an id
    /// outside it (each shard read once, here, so a bad id is not found only when its
    /// batch comes), and shards of which none holds one window of `window` tokens.
    pub fn check(&self, model_vocab: usize, window: usize, what: &str) -> Result<()> {
        if let Some(v) = self.vocab_size {
            if v as usize != model_vocab {
                bail!(
                    "the {what} shards ({}) were made with a vocabulary of {v} ids, but the model has {model_vocab}: \
                     encode the text again with the model's tokenizer (`andrea prepare --tokenizer <checkpoint>/tokenizer.json`)",
                    self.shards[0].path().display()
                );
            }
        }
        let limit = u32::try_from(model_vocab).unwrap_or(u32::MAX);
        for shard in &self.shards {
            if let Some((at, id)) = shard.first_id_at_least(limit) {
                bail!(
                    "the {what} shard {} holds token id {id} at position {at}, outside the model's \
                     vocabulary of {model_vocab} ids: it was made with another tokenizer or is damaged; \
                     encode the text again with the model's tokenizer (`andrea prepare --tokenizer <checkpoint>/tokenizer.json`)",
                    shard.path().display()
                );
            }
        }
        if !self.shards.iter().any(|s| s.len() >= window) {
            bail!(
                "the {what} shards ({}) hold {} tokens, fewer than one batch window of {window} \
                 (batch size · sequence length + 1): use more text, or a smaller --batch-size or --seq-len",
                self.shards[0].path().display(),
                self.total_tokens()
            );
        }
        Ok(())
    }

    /// Refuses a saved data position that does not lie in these shards (a resumed run
    /// whose data changed, or a damaged `training_state.json`).
    pub fn check_position(&self, pos: DataPosition) -> Result<()> {
        let Some(shard) = self.shards.get(pos.shard) else {
            bail!(
                "the saved data position is shard {} but the training data has {} shard(s): \
                 resume with the data the run was started on (--data)",
                pos.shard,
                self.shards.len()
            );
        };
        if pos.offset > shard.len() {
            bail!(
                "the saved data position is token {} of {}, which holds {} tokens: \
                 resume with the data the run was started on (--data)",
                pos.offset,
                shard.path().display(),
                shard.len()
            );
        }
        Ok(())
    }

    /// Reads the window of `window` tokens at `pos` (moving to the next shard that holds
    /// one if it does not fit), then advances `pos` by `stride`. Returns the tokens as ids.
    pub fn next_window(
        &self,
        pos: &mut DataPosition,
        window: usize,
        stride: usize,
        out: &mut Vec<u32>,
    ) -> Result<()> {
        self.fit(pos, window)?;
        let shard = &self.shards[pos.shard];
        let mut buf = vec![0u16; window];
        shard
            .read(pos.offset, &mut buf)
            .with_context(|| format!("reading {}", shard.path().display()))?;
        out.clear();
        out.extend(buf.iter().map(|&t| t as u32));
        pos.offset += stride;
        Ok(())
    }

    /// Advances `pos` as [`ShardSet::next_window`] does, without reading the window
    /// (another data-parallel rank's).
    pub fn skip_window(&self, pos: &mut DataPosition, window: usize, stride: usize) -> Result<()> {
        self.fit(pos, window)?;
        pos.offset += stride;
        Ok(())
    }

    /// Moves `pos` to the next start that holds a window of `window` tokens.
    fn fit(&self, pos: &mut DataPosition, window: usize) -> Result<()> {
        if pos.shard >= self.shards.len() {
            *pos = DataPosition::default();
        }
        let mut tries = 0;
        while pos.offset.saturating_add(window) > self.shards[pos.shard].len() {
            *pos = DataPosition {
                shard: (pos.shard + 1) % self.shards.len(),
                offset: 0,
            };
            tries += 1;
            if tries > self.shards.len() {
                bail!("no shard holds a window of {window} tokens");
            }
        }
        Ok(())
    }

    /// A window at a random start (`--shuffle`): a shard drawn in proportion to the
    /// windows it holds, then an offset uniform over them.
    pub fn random_window(&self, rng: &mut Rng, window: usize, out: &mut Vec<u32>) -> Result<()> {
        let mut pos = self.random_start(rng, window)?;
        self.next_window(&mut pos, window, 0, out)
    }

    /// Where [`ShardSet::random_window`] would read (it draws the same numbers).
    pub fn random_start(&self, rng: &mut Rng, window: usize) -> Result<DataPosition> {
        let starts: Vec<usize> = self
            .shards
            .iter()
            .map(|s| (s.len() + 1).saturating_sub(window))
            .collect();
        let total: usize = starts.iter().sum();
        if total == 0 {
            bail!("no shard holds a window of {window} tokens");
        }
        let mut r = (rng.next_u64() % total as u64) as usize;
        let mut shard = 0;
        while r >= starts[shard] {
            r -= starts[shard];
            shard += 1;
        }
        Ok(DataPosition { shard, offset: r })
    }

    /// Every full window of each shard, in order: `(shard, offset)` starts.
    pub fn all_windows(&self, window: usize, stride: usize) -> Vec<DataPosition> {
        let mut out = Vec::new();
        for (i, s) in self.shards.iter().enumerate() {
            let mut offset = 0;
            while offset + window <= s.len() {
                out.push(DataPosition { shard: i, offset });
                offset += stride;
            }
        }
        out
    }
}

/// Splits a window of `B·T + 1` tokens into inputs and next-token targets.
pub fn inputs_and_targets(window: &[u32]) -> (&[u32], &[u32]) {
    let n = window.len() - 1;
    (&window[..n], &window[1..])
}
