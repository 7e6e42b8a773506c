//! Token shards: a corpus encoded into llm.c's file format, split into train and val.
//!
//! A shard is a header of 256 little-endian `i32` — `[0]` magic 20240520, `[1]` version
//! 1, `[2]` the number of tokens; andrea also writes the vocabulary size in `[3]` (llm.c
//! leaves it 0, and readers that ignore it are unaffected) — followed by the tokens as
//! little-endian `u16`. Shards are named `<prefix>_val_000000.bin`,
//! `<prefix>_train_000000.bin`, ... and hold at most [`ShardOptions::shard_tokens`]
//! tokens each. Each file is written to a temporary name and renamed when complete.
//!
//! The inputs are text files, JSON Lines and Parquet files, compressed or not (see
//! [`crate::documents`]), streamed: memory does not grow with the corpus.
//!
//! The split: the first [`ShardOptions::val_fraction`] of the input bytes on disk go to
//! val, the rest to train, so the split is deterministic and needs one streaming pass. A
//! text file is cut at a position that does not change tokenization; a JSON line or a
//! Parquet value (a document) goes whole to the side where it starts. As in llm.c, every
//! document (a text file, a JSON line, a Parquet value) starts with `<|endoftext|>` when
//! [`ShardOptions::eot_per_document`] is set, and `<|endoftext|>` written in the text is
//! recognised as the token when [`ShardOptions::special_tokens_in_text`] is set.

use crate::documents::{read_documents, Piece, ReadOptions};
use crate::error::{Error, Result};
use crate::input::{chunk_ends, collect_files, find_cut_in, total_size, InvalidUtf8};
use crate::progress::bytes_bar;
use crate::tokenizer::Tokenizer;
use rayon::prelude::*;
use std::fs::File;
use std::io::{BufWriter, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

/// `header[0]` of a shard.
pub const SHARD_MAGIC: i32 = 20240520;
/// `header[1]` of a shard.
pub const SHARD_VERSION: i32 = 1;
/// Header length in `i32`s.
pub const SHARD_HEADER_INTS: usize = 256;
const HEADER_BYTES: usize = SHARD_HEADER_INTS * 4;

const BLOCK_BYTES: usize = 16 << 20;
const CHUNK_BYTES: usize = 256 << 10;

/// The file name of shard `index` of `split` ("train" or "val"):
/// `<prefix>_<split>_<index, 6 digits>.bin`, the one scheme [`write_shards`] writes and
/// [`parse_shard_name`] reads back.
pub fn shard_name(prefix: &str, split: &str, index: usize) -> String {
    format!("{prefix}_{split}_{index:06}.bin")
}

/// A shard file name split into `(prefix, split, index)` when it follows the scheme of
/// [`shard_name`] exactly, read from the right (so a prefix may itself hold `_train`,
/// `val` or underscores: `retrain_val_000000.bin` is validation data of `retrain`).
/// Anything else is `None`.
pub fn parse_shard_name(name: &str) -> Option<(&str, &str, usize)> {
    let stem = name.strip_suffix(".bin")?;
    let (rest, index) = stem.rsplit_once('_')?;
    if index.len() != 6 || !index.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let (prefix, split) = rest.rsplit_once('_')?;
    if prefix.is_empty() || !matches!(split, "train" | "val") {
        return None;
    }
    Some((prefix, split, index.parse().ok()?))
}

/// Refuses a shard prefix that is not a plain file name (a path such as `../x` or
/// `/tmp/x` would write outside the output directory).
pub fn check_prefix(prefix: &str) -> Result<()> {
    let plain = !prefix.is_empty()
        && prefix != "."
        && prefix != ".."
        && !prefix.contains(['/', '\\', '\0', ':'])
        && !prefix.starts_with('.');
    if !plain {
        return Err(Error::Invalid(format!(
            "the shard prefix {prefix:?} is not a plain file name: use letters, digits, `-` or `_` \
             (the shards go into the output directory)"
        )));
    }
    Ok(())
}

/// How to write shards.
#[derive(Clone, Debug, PartialEq)]
pub struct ShardOptions {
    /// File names start with this (`<prefix>_train_000000.bin`).
    pub prefix: String,
    /// At most this many tokens per shard (llm.c: 100M).
    pub shard_tokens: usize,
    /// The fraction of input bytes, from the start, that goes to val (0 for none).
    pub val_fraction: f64,
    /// Start every document (a text file, a JSON line, a Parquet value) with
    /// `<|endoftext|>`.
    pub eot_per_document: bool,
    /// The JSON Lines field or Parquet column holding the text.
    pub text_field: String,
    /// Recognise special-token strings in the text.
    pub special_tokens_in_text: bool,
    pub invalid_utf8: InvalidUtf8,
    pub show_progress: bool,
}

impl Default for ShardOptions {
    fn default() -> Self {
        ShardOptions {
            prefix: "data".into(),
            shard_tokens: 100_000_000,
            val_fraction: 0.1,
            eot_per_document: true,
            text_field: "text".into(),
            special_tokens_in_text: true,
            invalid_utf8: InvalidUtf8::Error,
            show_progress: true,
        }
    }
}

/// What [`write_shards`] wrote.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ShardReport {
    pub files: usize,
    pub bytes: u64,
    pub train_tokens: u64,
    pub val_tokens: u64,
    pub train_shards: Vec<PathBuf>,
    pub val_shards: Vec<PathBuf>,
}

/// Writes one split's shards, one at a time, streaming.
struct SplitWriter {
    dir: PathBuf,
    prefix: String,
    split: &'static str,
    max_tokens: usize,
    vocab_size: u32,
    current: Option<(BufWriter<File>, PathBuf, PathBuf, usize)>,
    done: Vec<PathBuf>,
    total: u64,
}

impl SplitWriter {
    fn new(
        dir: &Path,
        prefix: &str,
        split: &'static str,
        max_tokens: usize,
        vocab_size: u32,
    ) -> Self {
        SplitWriter {
            dir: dir.to_path_buf(),
            prefix: prefix.to_string(),
            split,
            max_tokens,
            vocab_size,
            current: None,
            done: Vec::new(),
            total: 0,
        }
    }

    fn write(&mut self, mut ids: &[u32]) -> Result<()> {
        while !ids.is_empty() {
            if self.current.is_none() {
                let path = self
                    .dir
                    .join(shard_name(&self.prefix, self.split, self.done.len()));
                let tmp = andrea_fs::temp_path(&path).map_err(|e| Error::io(&path, e))?;
                let file = File::create(&tmp).map_err(|e| Error::io(&tmp, e))?;
                let mut w = BufWriter::with_capacity(1 << 20, file);
                w.write_all(&[0u8; HEADER_BYTES])
                    .map_err(|e| Error::io(&tmp, e))?;
                self.current = Some((w, tmp, path, 0));
            }
            let Some((w, tmp, _, n)) = self.current.as_mut() else {
                unreachable!()
            };
            let take = ids.len().min(self.max_tokens - *n);
            let mut bytes = Vec::with_capacity(take * 2);
            for &id in &ids[..take] {
                bytes.extend_from_slice(&(id as u16).to_le_bytes());
            }
            w.write_all(&bytes).map_err(|e| Error::io(&*tmp, e))?;
            *n += take;
            self.total += take as u64;
            ids = &ids[take..];
            if *n == self.max_tokens {
                self.finish_shard()?;
            }
        }
        Ok(())
    }

    fn finish_shard(&mut self) -> Result<()> {
        let Some((w, tmp, path, n)) = self.current.take() else {
            return Ok(());
        };
        let mut file = w
            .into_inner()
            .map_err(|e| Error::io(&tmp, e.into_error()))?;
        let mut header = [0i32; SHARD_HEADER_INTS];
        header[0] = SHARD_MAGIC;
        header[1] = SHARD_VERSION;
        header[2] = n as i32;
        header[3] = self.vocab_size as i32;
        let bytes: Vec<u8> = header.iter().flat_map(|v| v.to_le_bytes()).collect();
        file.seek(SeekFrom::Start(0))
            .and_then(|_| file.write_all(&bytes))
            .map_err(|e| Error::io(&tmp, e))?;
        andrea_fs::persist(file, &tmp, &path).map_err(|e| Error::io(&path, e))?;
        self.done.push(path);
        Ok(())
    }
}

/// Encodes files and directories into train and val shards in `out_dir` (created if
/// missing). Returns what was written.
pub fn write_shards<P: AsRef<Path>>(
    tokenizer: &Tokenizer,
    inputs: &[P],
    out_dir: &Path,
    options: &ShardOptions,
) -> Result<ShardReport> {
    if tokenizer.vocab_size() > 1 << 16 {
        return Err(Error::Invalid(format!(
            "shards store tokens as u16, but the vocabulary has {} ids",
            tokenizer.vocab_size()
        )));
    }
    check_prefix(&options.prefix)?;
    if options.shard_tokens == 0 || options.shard_tokens > i32::MAX as usize {
        return Err(Error::Invalid(format!(
            "shard_tokens must be in 1..={}, not {}",
            i32::MAX,
            options.shard_tokens
        )));
    }
    if !(0.0..1.0).contains(&options.val_fraction) {
        return Err(Error::Invalid(format!(
            "val_fraction must be in [0, 1), not {}",
            options.val_fraction
        )));
    }
    let eot =
        match (options.eot_per_document, tokenizer.eot_id()) {
            (true, Some(id)) => Some(id),
            (true, None) => return Err(Error::Invalid(
                "documents are separated by <|endoftext|>, which this vocabulary does not have: \
                 use a tokenizer with it, or write the documents without separators (--no-eot)"
                    .into(),
            )),
            (false, _) => None,
        };
    let files = collect_files(inputs)?;
    std::fs::create_dir_all(out_dir).map_err(|e| Error::io(out_dir, e))?;
    let total = total_size(&files);
    let mut val_bytes_left = (options.val_fraction * total as f64).ceil() as u64;
    let vocab = tokenizer.vocab_size() as u32;
    let mut val = SplitWriter::new(out_dir, &options.prefix, "val", options.shard_tokens, vocab);
    let mut train = SplitWriter::new(
        out_dir,
        &options.prefix,
        "train",
        options.shard_tokens,
        vocab,
    );
    let special = options.special_tokens_in_text && !tokenizer.special_tokens().is_empty();
    let matcher = special.then(|| tokenizer.matcher());
    let bar = tokens_bar(options.show_progress, total);
    let read = ReadOptions {
        text_field: &options.text_field,
        invalid_utf8: options.invalid_utf8,
        specials: matcher,
        block_bytes: BLOCK_BYTES,
    };
    let mut batch = Batch::default();
    let mut encode = |batch: &mut Batch| -> Result<()> {
        batch.encode(tokenizer, special, eot, [&mut val, &mut train])?;
        let tokens = val.total + train.total;
        let per_s = tokens as f64 / bar.elapsed().as_secs_f64().max(1e-9);
        bar.set_message(format!("{tokens} tokens, {per_s:.0} tokens/s"));
        Ok(())
    };
    let (mut bytes_read, mut done) = (0, 0);
    for path in &files {
        read_documents(path, &read, &mut |piece: Piece| {
            // The val budget may end inside this piece: cut a text block there, or
            // give a document to the side where it starts.
            let len = piece.bytes.len();
            let split = if val_bytes_left == 0 {
                0
            } else if val_bytes_left >= piece.disk || !piece.cuttable {
                len
            } else {
                let at =
                    (len as u128 * val_bytes_left as u128 / piece.disk.max(1) as u128) as usize;
                find_cut_in(&piece.bytes, at, matcher).unwrap_or(len)
            };
            val_bytes_left = val_bytes_left.saturating_sub(piece.disk);
            bytes_read += len as u64;
            bar.inc(piece.disk);
            batch.push(piece, split);
            if batch.bytes >= BLOCK_BYTES {
                encode(&mut batch)?;
            }
            Ok(())
        })?;
        done += std::fs::metadata(path).map(|m| m.len()).unwrap_or(0);
        bar.set_position(done);
    }
    encode(&mut batch)?;
    bar.finish_and_clear();
    val.finish_shard()?;
    train.finish_shard()?;
    Ok(ShardReport {
        files: files.len(),
        bytes: bytes_read,
        train_tokens: train.total,
        val_tokens: val.total,
        train_shards: train.done,
        val_shards: val.done,
    })
}

/// A progress bar over the input bytes on disk, with the tokens written and their rate.
fn tokens_bar(show: bool, total: u64) -> indicatif::ProgressBar {
    let bar = bytes_bar(show, total, "encoding");
    if show {
        if let Ok(style) = indicatif::ProgressStyle::with_template(
            "encoding [{elapsed_precise}] {wide_bar} {bytes}/{total_bytes} ({bytes_per_sec}, eta {eta}) {msg}",
        ) {
            bar.set_style(style);
        }
    }
    bar
}

/// Pieces read but not yet encoded, each split into its val and train parts: encoded
/// together, so that many short documents still fill every thread.
#[derive(Default)]
struct Batch {
    /// `(0 for val or 1 for train, bytes, starts a document)`.
    items: Vec<(usize, Vec<u8>, bool)>,
    bytes: usize,
}

impl Batch {
    fn push(&mut self, piece: Piece, split: usize) {
        self.bytes += piece.bytes.len();
        let mut bytes = piece.bytes;
        let train = bytes.split_off(split);
        let mut start = piece.document_start;
        for (side, part) in [(0, bytes), (1, train)] {
            if !part.is_empty() {
                self.items.push((side, part, start));
                start = false;
            }
        }
    }

    /// Encodes every item in parallel chunks and writes them in order: `<|endoftext|>`
    /// (`eot`) before each document's first.
    fn encode(
        &mut self,
        tok: &Tokenizer,
        special: bool,
        eot: Option<u32>,
        writers: [&mut SplitWriter; 2],
    ) -> Result<()> {
        let matcher = special.then(|| tok.matcher());
        let mut chunks = Vec::new();
        for (i, (_, bytes, _)) in self.items.iter().enumerate() {
            let mut lo = 0;
            for end in chunk_ends(bytes, CHUNK_BYTES, matcher) {
                chunks.push((i, lo, end));
                lo = end;
            }
        }
        let items = &self.items;
        let parts: Vec<Vec<u32>> = chunks
            .par_iter()
            .map(|&(i, lo, hi)| {
                let (_, bytes, start) = &items[i];
                let mut v = Vec::with_capacity((hi - lo) / 3 + 1);
                tok.encode_bytes_into(&bytes[lo..hi], special, *start && lo == 0, &mut v);
                v
            })
            .collect();
        for (&(i, lo, _), ids) in chunks.iter().zip(parts) {
            let (side, _, start) = &items[i];
            if *start && lo == 0 {
                if let Some(eot) = eot {
                    writers[*side].write(&[eot])?;
                }
            }
            writers[*side].write(&ids)?;
        }
        self.items.clear();
        self.bytes = 0;
        Ok(())
    }
}

/// A shard opened for reading, memory-mapped.
#[derive(Debug)]
pub struct TokenShard {
    map: memmap2::Mmap,
    len: usize,
    vocab_size: Option<u32>,
    path: PathBuf,
}

impl TokenShard {
    /// Opens and checks a shard: magic, version, and a size that matches the count.
    pub fn open(path: impl AsRef<Path>) -> Result<TokenShard> {
        let path = path.as_ref();
        // A regular file only: a FIFO named as a shard would block the open forever.
        let (file, _) = andrea_fs::open_regular(path).map_err(|e| Error::io(path, e))?;
        // SAFETY: the map is read-only; as with any memory map, the file must not be
        // truncated while it is open (shards are written once and renamed into place).
        let map = unsafe { memmap2::Mmap::map(&file) }.map_err(|e| Error::io(path, e))?;
        let bad = |message: String| Error::Shard {
            path: path.to_path_buf(),
            message,
        };
        if map.len() < HEADER_BYTES {
            return Err(bad(format!(
                "{} bytes is shorter than the {HEADER_BYTES}-byte header",
                map.len()
            )));
        }
        let int = |i: usize| {
            i32::from_le_bytes([map[4 * i], map[4 * i + 1], map[4 * i + 2], map[4 * i + 3]])
        };
        if int(0) != SHARD_MAGIC {
            return Err(bad(format!(
                "bad magic {} (expected {SHARD_MAGIC})",
                int(0)
            )));
        }
        if int(1) != SHARD_VERSION {
            return Err(bad(format!(
                "unsupported version {} (expected {SHARD_VERSION})",
                int(1)
            )));
        }
        let len =
            usize::try_from(int(2)).map_err(|_| bad(format!("negative token count {}", int(2))))?;
        let want = HEADER_BYTES + 2 * len;
        if map.len() != want {
            return Err(bad(format!(
                "the header says {len} tokens ({want} bytes) but the file has {} bytes",
                map.len()
            )));
        }
        let vocab_size = u32::try_from(int(3)).ok().filter(|&v| v > 0);
        Ok(TokenShard {
            map,
            len,
            vocab_size,
            path: path.to_path_buf(),
        })
    }

    /// Number of tokens.
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The vocabulary size recorded by andrea, if any (llm.c's shards have none).
    pub fn vocab_size(&self) -> Option<u32> {
        self.vocab_size
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The tokens, without copying (little-endian targets, where the file's byte order is
    /// the machine's; [`TokenShard::read`] works everywhere).
    #[cfg(target_endian = "little")]
    pub fn tokens(&self) -> &[u16] {
        let bytes = &self.map[HEADER_BYTES..];
        // SAFETY: every bit pattern is a valid u16; the map starts page-aligned and the
        // header is 1024 bytes, so the tokens are 2-aligned (checked by align_to, whose
        // prefix must then be empty); the byte order is the file's (little-endian).
        let (head, tokens, _) = unsafe { bytes.align_to::<u16>() };
        debug_assert!(head.is_empty());
        if head.is_empty() {
            tokens
        } else {
            &[]
        }
    }

    /// The first token `>= limit` (an id outside a vocabulary of `limit` ids), as
    /// `(position, id)`: one pass over the file, for a check when it is opened.
    pub fn first_id_at_least(&self, limit: u32) -> Option<(usize, u32)> {
        let bytes = &self.map[HEADER_BYTES..HEADER_BYTES + 2 * self.len];
        bytes
            .chunks_exact(2)
            .map(|b| u16::from_le_bytes([b[0], b[1]]) as u32)
            .enumerate()
            .find(|&(_, id)| id >= limit)
    }

    /// Copies tokens `start..start + out.len()` into `out` (any byte order).
    pub fn read(&self, start: usize, out: &mut [u16]) -> Result<()> {
        if start
            .checked_add(out.len())
            .is_none_or(|end| end > self.len)
        {
            return Err(Error::Shard {
                path: self.path.clone(),
                message: format!(
                    "tokens {start}..{} asked of a shard of {}",
                    start.saturating_add(out.len()),
                    self.len
                ),
            });
        }
        let bytes = &self.map[HEADER_BYTES + 2 * start..HEADER_BYTES + 2 * (start + out.len())];
        for (o, b) in out.iter_mut().zip(bytes.chunks_exact(2)) {
            *o = u16::from_le_bytes([b[0], b[1]]);
        }
        Ok(())
    }
}

#[cfg(test)]
mod naming_tests {
    use super::*;

    #[test]
    fn names_round_trip_and_are_read_from_the_right() {
        for prefix in ["data", "retrain", "interval", "a_val_b", "x_train"] {
            for split in ["train", "val"] {
                let name = shard_name(prefix, split, 12);
                assert_eq!(parse_shard_name(&name), Some((prefix, split, 12)), "{name}");
            }
        }
        for bad in [
            "data_train.bin",
            "data_train_0.bin",
            "data_test_000000.bin",
            "_train_000000.bin",
            "data_train_000000.bin.tmp",
            "data_train_00000a.bin",
        ] {
            assert_eq!(parse_shard_name(bad), None, "{bad}");
        }
    }

    #[test]
    fn prefixes_that_are_paths_are_refused() {
        for bad in ["", ".", "..", "../x", "/tmp/x", "a/b", "a\\b", ".hidden"] {
            assert!(check_prefix(bad).is_err(), "{bad:?}");
        }
        check_prefix("my-data_2").unwrap();
    }
}
