//! Batches from token shards. Two orders ([`DataOrder`]):
//!
//! * **shuffled** (the default): the training data is cut into *windows* of `T + 1`
//!   consecutive tokens, `T` apart in each shard (inputs the first `T`, targets the last
//!   `T`; a shard's last partial window is dropped). Each epoch reads every window once,
//!   in the order of a seeded permutation ([`Permutation`]) of all of them, and every row
//!   of every micro-batch is its own window, so the rows of a batch are independent draws.
//!   The permutation is a function of (seed, epoch), computed per index: the position in
//!   it ([`DataPosition::drawn`]) is all a checkpoint saves.
//! * **sequential**, llm.c's order: a micro-batch is one window of `B·T + 1`
//!   consecutive tokens (the rows are neighbours); the next window starts `B·T` tokens
//!   further. A window that would run past the end of a shard moves to the start of the
//!   next shard (after the last, back to the first: the next epoch), so every window
//!   lies inside one shard and each shard's last partial window is dropped.
//!
//! In both orders a step's micro-batches are numbered as one process with
//! `--grad-accum W·A` reads them ([`DataStream::read_step`]), so W data-parallel ranks
//! read exactly what one process reads with W times the accumulation.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use andrea::model::rng::Rng;
use andrea_tokenizer::{
    fingerprint, parse_shard_name, shard_name, Manifest, TokenShard, MANIFEST_FILE,
};
use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};

pub use crate::cli::DataOrder;

/// Where the training data's next window is: saved in checkpoints, so a resumed run
/// reads on exactly where the run stopped.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DataPosition {
    /// Sequential order: the shard and token offset of the next window.
    pub shard: usize,
    pub offset: usize,
    /// Passes over the training data completed.
    #[serde(default)]
    pub epoch: u64,
    /// Shuffled order: windows of this epoch's permutation already read.
    #[serde(default)]
    pub drawn: u64,
}

/// One or more shards read in order.
pub struct ShardSet {
    shards: Vec<TokenShard>,
    vocab_size: Option<u32>,
}

/// The directory a `--data` path names the shards of (the path itself, or a shard
/// file's directory).
fn set_dir(path: &Path) -> PathBuf {
    if path.is_dir() {
        path.to_path_buf()
    } else {
        match path.parent() {
            Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
            _ => PathBuf::from("."),
        }
    }
}

/// The manifest of the shard set `path` names, checked complete: every shard it lists
/// present with its token count (`None` for shards without one: llm.c's, or an older
/// andrea's).
pub fn manifest(path: &Path) -> Result<Option<Manifest>> {
    let dir = set_dir(path);
    let Some(manifest) = Manifest::read(&dir)? else {
        return Ok(None);
    };
    manifest.verify(&dir)?;
    Ok(Some(manifest))
}

/// The shards a path names: the file itself, or the `split` ("train" or "val") shards
/// of a directory. A directory with a `manifest.json` (a shard set `andrea prepare`
/// wrote) gives the shards it lists, after checking that each is there whole; a file of
/// such a directory must be one of them. A directory without one gives its shards by
/// the exact names `andrea prepare` writes (`<prefix>_<split>_000000.bin`, see
/// [`parse_shard_name`]), in index order; one holding shards of more than one prefix is
/// refused: which of them is meant is a guess.
pub fn shard_paths(path: &Path, split: &str) -> Result<Vec<PathBuf>> {
    let meta = std::fs::metadata(path).with_context(|| {
        format!(
            "cannot open the token data {}: check the path (make shards with `andrea prepare`)",
            path.display()
        )
    })?;
    if let Some(m) = manifest(path)? {
        let dir = set_dir(path);
        if !meta.is_dir() {
            let name = path.file_name().map(|n| n.to_string_lossy().into_owned());
            let listed = m
                .train
                .iter()
                .chain(&m.val)
                .any(|e| Some(&e.name) == name.as_ref());
            if !listed {
                bail!(
                    "{} is not a shard of the set in {} (its {MANIFEST_FILE} does not list it): \
                     it is left from another corpus; pass the directory, or a shard it lists",
                    path.display(),
                    dir.display()
                );
            }
            return Ok(vec![path.to_path_buf()]);
        }
        if m.shards(split).is_empty() {
            bail!(
                "the shard set {} holds no {split} shards{}",
                dir.display(),
                if split == "val" {
                    " (it was prepared with --val-fraction 0): pass --val-data, or prepare with --val-fraction above 0"
                } else {
                    ""
                }
            );
        }
        return Ok(m.shards(split).iter().map(|e| dir.join(&e.name)).collect());
    }
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

/// Refuses shards made with another tokenizer than `tokenizer`: a tokenizer of the same
/// vocabulary size but other merges would train or evaluate on ids that mean other text.
/// A shard set says which tokenizer made it by the fingerprint in its manifest; shards
/// of an older andrea by the `tokenizer.json` copied next to them; llm.c's shards, with
/// neither, are not checked.
pub fn check_tokenizer(
    data: &Path,
    tokenizer: &andrea_tokenizer::Tokenizer,
    what: &str,
) -> Result<()> {
    let dir = set_dir(data);
    let differs = |theirs: &str| {
        anyhow::anyhow!(
            "the {what} shards in {} were made with the tokenizer {theirs}, which differs from the model's \
             (same vocabulary size or not, the ids mean other text): encode the text again with the \
             model's tokenizer (`andrea prepare --tokenizer <checkpoint>/tokenizer.json`)",
            dir.display(),
        )
    };
    if let Some(m) = manifest(data)? {
        if m.tokenizer_fingerprint != fingerprint(tokenizer) {
            return Err(differs(&format!(
                "of fingerprint {} (their {MANIFEST_FILE})",
                m.tokenizer_fingerprint
            )));
        }
        return Ok(());
    }
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
        return Err(differs(&theirs_path.display().to_string()));
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
            (pos.shard, pos.offset) = (0, 0);
        }
        let mut tries = 0;
        while pos.offset.saturating_add(window) > self.shards[pos.shard].len() {
            (pos.shard, pos.offset) = ((pos.shard + 1) % self.shards.len(), 0);
            if pos.shard == 0 {
                pos.epoch += 1;
            }
            tries += 1;
            if tries > self.shards.len() {
                bail!("no shard holds a window of {window} tokens");
            }
        }
        Ok(())
    }

    /// Every full window of each shard, in order: `(shard, offset)` starts.
    pub fn all_windows(&self, window: usize, stride: usize) -> Vec<DataPosition> {
        let mut out = Vec::new();
        for (i, s) in self.shards.iter().enumerate() {
            let mut offset = 0;
            while offset + window <= s.len() {
                out.push(DataPosition {
                    shard: i,
                    offset,
                    ..DataPosition::default()
                });
                offset += stride;
            }
        }
        out
    }
}

/// A seeded permutation of `0..n`, computed one index at a time in O(1) memory: a
/// Feistel network on the smallest even number of bits that holds `n - 1` (a bijection
/// of `0..4^h` for any round function), restricted to `0..n` by cycle walking (an index
/// that lands outside is encrypted again until it lands inside; the domain is below
/// `4n`, so about 4 rounds trips at most on average). The keys come from (seed, epoch), so
/// every epoch has its own order and no order is ever stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Permutation {
    n: u64,
    half_bits: u32,
    keys: [u64; 8],
}

/// SplitMix64's finaliser: a bijective mix of 64 bits.
fn mix64(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

impl Permutation {
    /// The permutation of `0..n` (`n >= 1`) of `epoch` under `seed`.
    pub fn new(n: u64, seed: u64, epoch: u64) -> Permutation {
        let bits = 64 - n.max(2).saturating_sub(1).leading_zeros();
        let mut rng = Rng::new(mix64(seed ^ 0xDA7A_0DE5) ^ mix64(epoch.wrapping_add(1)));
        Permutation {
            n,
            half_bits: bits.div_ceil(2),
            keys: std::array::from_fn(|_| rng.next_u64()),
        }
    }

    /// The `i`-th element (`i < n`).
    pub fn at(&self, i: u64) -> u64 {
        debug_assert!(i < self.n);
        let mut x = i;
        loop {
            x = self.encrypt(x);
            if x < self.n {
                return x;
            }
        }
    }

    fn encrypt(&self, x: u64) -> u64 {
        let mask = (1u64 << self.half_bits) - 1;
        let (mut left, mut right) = (x >> self.half_bits, x & mask);
        for &key in &self.keys {
            let f = mix64(right ^ key) & mask;
            (left, right) = (right, left ^ f);
        }
        (left << self.half_bits) | right
    }
}

/// The windows of the shuffled order: `t + 1` tokens, starting `t` apart in each shard.
#[derive(Debug, Clone)]
struct WindowGrid {
    t: usize,
    /// `ends[s]`: windows in shards `0..=s`.
    ends: Vec<u64>,
}

impl WindowGrid {
    fn new(shards: &ShardSet, t: usize) -> WindowGrid {
        let mut total = 0u64;
        let ends = shards
            .shards
            .iter()
            .map(|s| {
                total += (s.len().saturating_sub(1) / t) as u64;
                total
            })
            .collect();
        WindowGrid { t, ends }
    }

    fn len(&self) -> u64 {
        self.ends.last().copied().unwrap_or(0)
    }

    /// The shard and token offset of window `index`.
    fn locate(&self, index: u64) -> (usize, usize) {
        let shard = self.ends.partition_point(|&e| e <= index);
        let before = if shard == 0 { 0 } else { self.ends[shard - 1] };
        (shard, (index - before) as usize * self.t)
    }
}

/// One micro-batch: `B·T` inputs and their `B·T` next-token targets, row by row.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MicroBatch {
    pub inputs: Vec<u32>,
    pub targets: Vec<u32>,
}

impl MicroBatch {
    pub fn pair(&self) -> (&[u32], &[u32]) {
        (&self.inputs, &self.targets)
    }
}

/// The training data read in a [`DataOrder`], step by step.
pub struct DataStream<'a> {
    shards: &'a ShardSet,
    order: DataOrder,
    /// `(B, T)`.
    shape: (usize, usize),
    seed: u64,
    grid: WindowGrid,
    /// The permutation of epoch `perm_epoch`.
    perm: Permutation,
    perm_epoch: u64,
    tokens: Vec<u16>,
    window: Vec<u32>,
}

impl<'a> DataStream<'a> {
    /// Micro-batches of `b` rows of `t` tokens from `shards` (already [`ShardSet::check`]ed
    /// for one window of `b·t + 1` tokens); `seed` chooses the shuffled order.
    pub fn new(
        shards: &'a ShardSet,
        order: DataOrder,
        (b, t): (usize, usize),
        seed: u64,
    ) -> Result<Self> {
        let grid = WindowGrid::new(shards, t);
        if grid.len() == 0 {
            bail!("no training shard holds a window of {} tokens", t + 1);
        }
        Ok(DataStream {
            shards,
            order,
            shape: (b, t),
            seed,
            perm: Permutation::new(grid.len(), seed, 0),
            perm_epoch: 0,
            grid,
            tokens: vec![0; t + 1],
            window: Vec::with_capacity(b * t + 1),
        })
    }

    /// Windows per epoch: rows of `T + 1` tokens (shuffled) or micro-batches of
    /// `B·T + 1` (sequential).
    pub fn windows_per_epoch(&self) -> u64 {
        match self.order {
            DataOrder::Shuffle => self.grid.len(),
            DataOrder::Sequential => {
                let (b, t) = self.shape;
                self.shards.all_windows(b * t + 1, b * t).len() as u64
            }
        }
    }

    /// One line for the log: the order and the size of an epoch.
    pub fn describe(&self) -> String {
        let (b, t) = self.shape;
        match self.order {
            DataOrder::Shuffle => format!(
                "data order: shuffle (each epoch a new seeded permutation of the {} windows of {} tokens, \
                 one window per row; --data-order sequential reads the shards in order)",
                self.grid.len(),
                t + 1
            ),
            DataOrder::Sequential => format!(
                "data order: sequential (llm.c's: {} micro-batches of {} consecutive tokens per epoch, \
                 each shard's last partial one dropped; --data-order shuffle draws the rows at random)",
                self.windows_per_epoch(),
                b * t + 1
            ),
        }
    }

    /// Refuses a saved position that does not lie in this data (a resumed run whose data
    /// or sequence length changed, or a damaged `training_state.json`).
    pub fn check_position(&self, pos: DataPosition) -> Result<()> {
        // The shuffled order keeps shard and offset at 0: checked all the same.
        self.shards.check_position(pos)?;
        match self.order {
            DataOrder::Sequential => Ok(()),
            DataOrder::Shuffle if pos.drawn < self.grid.len() => Ok(()),
            DataOrder::Shuffle => bail!(
                "the saved data position is window {} of an epoch, but the training data has {} \
                 windows of {} tokens: resume with the data and --seq-len the run was started on",
                pos.drawn,
                self.grid.len(),
                self.shape.1 + 1
            ),
        }
    }

    /// Rank `rank` of `world`'s micro-batches of the next step into `batches` (one per
    /// micro-batch it accumulates, `A`). The step's `world·A` micro-batches are numbered
    /// as one process with `--grad-accum world·A` reads them, and rank r takes numbers
    /// `r·A .. r·A + A`; `pos` advances over all of them, on every rank.
    pub fn read_step(
        &mut self,
        pos: &mut DataPosition,
        (rank, world): (usize, usize),
        batches: &mut [MicroBatch],
    ) -> Result<()> {
        let accum = batches.len();
        let (b, t) = self.shape;
        let window = b * t + 1;
        for global in 0..world * accum {
            let mine = (global / accum == rank).then(|| &mut batches[global % accum]);
            match (self.order, mine) {
                (DataOrder::Sequential, Some(batch)) => {
                    self.shards
                        .next_window(pos, window, window - 1, &mut self.window)?;
                    batch.inputs.clear();
                    batch.inputs.extend_from_slice(&self.window[..b * t]);
                    batch.targets.clear();
                    batch.targets.extend_from_slice(&self.window[1..]);
                }
                (DataOrder::Sequential, None) => {
                    self.shards.skip_window(pos, window, window - 1)?
                }
                (DataOrder::Shuffle, mut batch) => {
                    if let Some(batch) = batch.as_mut() {
                        batch.inputs.clear();
                        batch.targets.clear();
                    }
                    for _ in 0..b {
                        if let Some(batch) = batch.as_mut() {
                            self.read_row(pos, batch)?;
                        }
                        self.advance(pos);
                    }
                }
            }
        }
        Ok(())
    }

    /// Appends window `pos.drawn` of the epoch's permutation as a row of `batch`.
    fn read_row(&mut self, pos: &DataPosition, batch: &mut MicroBatch) -> Result<()> {
        if self.perm_epoch != pos.epoch {
            self.perm = Permutation::new(self.grid.len(), self.seed, pos.epoch);
            self.perm_epoch = pos.epoch;
        }
        let (shard, offset) = self.grid.locate(self.perm.at(pos.drawn));
        let shard = &self.shards.shards[shard];
        shard
            .read(offset, &mut self.tokens)
            .with_context(|| format!("reading {}", shard.path().display()))?;
        let t = self.shape.1;
        batch
            .inputs
            .extend(self.tokens[..t].iter().map(|&x| x as u32));
        batch
            .targets
            .extend(self.tokens[1..].iter().map(|&x| x as u32));
        Ok(())
    }

    /// Past one window of the shuffled order; after the last of an epoch, to the next.
    fn advance(&self, pos: &mut DataPosition) {
        pos.drawn += 1;
        if pos.drawn == self.grid.len() {
            pos.drawn = 0;
            pos.epoch += 1;
        }
    }
}

/// Splits a window of `B·T + 1` tokens into inputs and next-token targets.
pub fn inputs_and_targets(window: &[u32]) -> (&[u32], &[u32]) {
    let n = window.len() - 1;
    (&window[..n], &window[1..])
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Shards in `dir` whose token at position `p` is `p + base` (so a row names its start).
    fn shards(dir: &Path, lens: &[usize]) -> ShardSet {
        let mut base = 0;
        for (i, &len) in lens.iter().enumerate() {
            let mut bytes = Vec::new();
            for (k, v) in [20240520i32, 1, len as i32].into_iter().enumerate() {
                assert_eq!(bytes.len(), 4 * k);
                bytes.extend_from_slice(&v.to_le_bytes());
            }
            bytes.resize(1024, 0);
            for p in 0..len {
                bytes.extend_from_slice(&((base + p) as u16).to_le_bytes());
            }
            base += len;
            std::fs::write(dir.join(shard_name("d", "train", i)), bytes).unwrap();
        }
        ShardSet::open(dir, "train").unwrap()
    }

    /// The first input token of each row of `batch`: where its window starts.
    fn row_starts(batch: &MicroBatch, t: usize) -> Vec<u32> {
        batch.inputs.chunks(t).map(|r| r[0]).collect()
    }

    #[test]
    fn permutations_are_bijections_and_differ_by_epoch_and_seed() {
        for n in [1u64, 2, 3, 5, 64, 1000, 4097] {
            let p = Permutation::new(n, 7, 0);
            let mut seen: Vec<u64> = (0..n).map(|i| p.at(i)).collect();
            seen.sort();
            assert_eq!(seen, (0..n).collect::<Vec<_>>(), "n = {n}");
        }
        let order = |seed, epoch| -> Vec<u64> {
            let p = Permutation::new(1000, seed, epoch);
            (0..1000).map(|i| p.at(i)).collect()
        };
        assert_eq!(order(7, 3), order(7, 3));
        assert_ne!(order(7, 3), order(7, 4));
        assert_ne!(order(7, 3), order(8, 3));
        // Not close to the identity: few elements stay near their index.
        let near = order(7, 0)
            .iter()
            .enumerate()
            .filter(|&(i, &x)| (i as i64 - x as i64).abs() < 10)
            .count();
        assert!(near < 50, "{near} of 1000 within 10 of their index");
    }

    #[test]
    fn shuffled_rows_are_independent_windows_each_read_once_per_epoch() {
        let dir = tempfile::tempdir().unwrap();
        // Windows of 9 tokens, 8 apart: (100-1)/8 = 12 + (61-1)/8 = 7 + (9-1)/8 = 1 = 20.
        let set = shards(dir.path(), &[100, 61, 9]);
        let (b, t) = (4, 8);
        let mut data = DataStream::new(&set, DataOrder::Shuffle, (b, t), 1).unwrap();
        assert_eq!(data.windows_per_epoch(), 20);
        let mut pos = DataPosition::default();
        let mut batches = vec![MicroBatch::default(); 1];
        let mut starts = Vec::new();
        let mut neighbours = 0;
        for _ in 0..5 {
            data.read_step(&mut pos, (0, 1), &mut batches).unwrap();
            let batch = &batches[0];
            assert_eq!((batch.inputs.len(), batch.targets.len()), (b * t, b * t));
            for row in 0..b {
                let (x, y) = (
                    &batch.inputs[row * t..][..t],
                    &batch.targets[row * t..][..t],
                );
                // Every row one window: consecutive tokens, targets shifted by one.
                assert!(x.windows(2).all(|w| w[1] == w[0] + 1), "{x:?}");
                assert_eq!(&x[1..], &y[..t - 1]);
                assert_eq!(y[t - 1], x[t - 1] + 1);
            }
            let s = row_starts(batch, t);
            neighbours += s.windows(2).filter(|w| w[1] == w[0] + t as u32).count();
            starts.extend(s);
        }
        assert_eq!(
            pos,
            DataPosition {
                epoch: 1,
                ..DataPosition::default()
            }
        );
        // 20 windows, each once: the starts of the grid of every shard.
        let mut want: Vec<u32> = (0..12).map(|k| k * 8).collect();
        want.extend((0..7).map(|k| 100 + k * 8));
        want.push(161);
        starts.sort();
        assert_eq!(starts, want);
        // In order, 15 of the 15 pairs of rows would be neighbours.
        assert!(
            neighbours <= 3,
            "{neighbours} of 15 row pairs are neighbours"
        );
        // The next epoch: the same windows in another order.
        let mut next = Vec::new();
        for _ in 0..5 {
            data.read_step(&mut pos, (0, 1), &mut batches).unwrap();
            next.extend(row_starts(&batches[0], t));
        }
        let mut sorted = next.clone();
        sorted.sort();
        assert_eq!(sorted, want);
        assert_ne!(next[..4], starts[..4]);
    }

    /// Two ranks of two micro-batches read, between them, what one process reads with
    /// four, and both reach the same position; so does a resumed stream.
    #[test]
    fn ranks_and_resumes_read_what_one_process_reads() {
        let dir = tempfile::tempdir().unwrap();
        let set = shards(dir.path(), &[300, 77]);
        for order in [DataOrder::Shuffle, DataOrder::Sequential] {
            let one_stream = |steps: usize, pos: &mut DataPosition| {
                let mut data = DataStream::new(&set, order, (2, 8), 5).unwrap();
                let mut out = Vec::new();
                for _ in 0..steps {
                    let mut batches = vec![MicroBatch::default(); 4];
                    data.read_step(pos, (0, 1), &mut batches).unwrap();
                    out.extend(batches);
                }
                out
            };
            let mut pos = DataPosition::default();
            let whole = one_stream(7, &mut pos);
            assert!(pos.epoch >= 1, "{order:?}: the run passes an epoch's end");
            let mut ranked = Vec::new();
            let mut ends = Vec::new();
            for rank in 0..2 {
                let mut data = DataStream::new(&set, order, (2, 8), 5).unwrap();
                let mut p = DataPosition::default();
                let mut mine = Vec::new();
                for _ in 0..7 {
                    let mut batches = vec![MicroBatch::default(); 2];
                    data.read_step(&mut p, (rank, 2), &mut batches).unwrap();
                    mine.push(batches);
                }
                ranked.push(mine);
                ends.push(p);
            }
            assert_eq!(ends, [pos, pos], "{order:?}");
            let joined: Vec<MicroBatch> = (0..7)
                .flat_map(|s| [ranked[0][s].clone(), ranked[1][s].clone()].concat())
                .collect();
            assert!(joined == whole, "{order:?}: 2 ranks x 2 differ from 1 x 4");
            // Stopped after 3 steps and resumed from the saved position: the same.
            let mut p = DataPosition::default();
            let mut split = one_stream(3, &mut p);
            let saved: DataPosition =
                serde_json::from_str(&serde_json::to_string(&p).unwrap()).unwrap();
            let mut p = saved;
            split.extend(one_stream(4, &mut p));
            assert!(split == whole, "{order:?}: resumed stream differs");
            assert_eq!(p, pos);
        }
    }

    #[test]
    fn sequential_keeps_llm_c_order() {
        let dir = tempfile::tempdir().unwrap();
        let set = shards(dir.path(), &[40, 30]);
        let mut data = DataStream::new(&set, DataOrder::Sequential, (2, 8), 0).unwrap();
        let mut pos = DataPosition::default();
        let mut batches = vec![MicroBatch::default()];
        let mut starts = Vec::new();
        for _ in 0..5 {
            data.read_step(&mut pos, (0, 1), &mut batches).unwrap();
            // One window of 17 tokens: rows are neighbours.
            assert_eq!(
                batches[0].inputs,
                (0..16)
                    .map(|k| batches[0].inputs[0] + k)
                    .collect::<Vec<_>>()
            );
            starts.push(batches[0].inputs[0]);
        }
        // Shard 0 holds windows at 0 and 16 (32 + 17 > 40), shard 1 one at 40.
        assert_eq!(starts, [0, 16, 40, 0, 16]);
        assert_eq!(pos.epoch, 1);
    }

    #[test]
    fn old_positions_load_and_bad_ones_are_refused() {
        let old: DataPosition = serde_json::from_str(r#"{"shard":1,"offset":64}"#).unwrap();
        assert_eq!((old.shard, old.offset, old.epoch, old.drawn), (1, 64, 0, 0));
        let dir = tempfile::tempdir().unwrap();
        let set = shards(dir.path(), &[100]);
        let data = DataStream::new(&set, DataOrder::Shuffle, (2, 8), 0).unwrap();
        let beyond = DataPosition {
            drawn: 12,
            ..DataPosition::default()
        };
        assert!(data.check_position(beyond).is_err());
        data.check_position(DataPosition {
            drawn: 11,
            ..beyond
        })
        .unwrap();
    }
}
