//! Training a vocabulary: count the pieces of a corpus, then learn merges.
//!
//! Each merge is the most frequent adjacent pair of tokens within pieces, **ties broken
//! by the smaller (left id, right id)** in andrea's id layout (bytes in GPT-2's order,
//! then merges in the order learned). That is also the rule of the Hugging Face
//! `BpeTrainer`, so both learn the same merges from the same pieces (checked on 10 MB
//! by `scripts/compare_tokenizers.py`, on the fixtures by `tests/hf_fixtures.rs`). The
//! pair counts are updated incrementally after each merge (only the words containing
//! the pair are touched) and the best pair comes from a lazy max-heap; the result does
//! not depend on hashing, thread count or how the input was chunked. Like that trainer,
//! a merge whose result is already a token (two merges can spell the same string)
//! reuses the token's id and does not count toward [`TrainConfig::merges`] new tokens.
//!
//! Counting streams the files block by block and counts each block's chunks in
//! parallel on the current rayon pool; memory is bounded by the number of distinct
//! pieces, not the corpus size. Every file (or text) is pre-tokenized as one whole text,
//! so the pieces counted are exactly those that encoding the file would see. Special-token
//! strings in the text (`<|endoftext|>` between documents) are document boundaries, not
//! text, unless [`TrainConfig::split_special_tokens`] is off.

use crate::byte_level::{BYTE_ID, BYTE_ORDER};
use crate::documents::{read_documents, ReadOptions};
use crate::error::{Error, Result};
use crate::input::{chunk_ends, collect_files, total_size, InvalidUtf8};
use crate::learn::{learn, Word};
use crate::pretokenize::pieces;
use crate::progress::{bytes_bar, count_bar};
use crate::special::{Segment, SpecialMatcher, SpecialToken, END_OF_TEXT};
use crate::tokenizer::{Options, Tokenizer};
use rayon::prelude::*;
use rustc_hash::FxHashMap;
use std::path::Path;
use std::time::Instant;

/// How files are read: blocks of this many bytes.
const BLOCK_BYTES: usize = 16 << 20;
/// Chunks counted in parallel.
const CHUNK_BYTES: usize = 256 << 10;

/// Settings of a training run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TrainConfig {
    /// How many merges (new tokens) to learn; ANDREA-120M uses 8192.
    pub merges: usize,
    /// Special tokens, appended after the merges (default `<|endoftext|>`).
    pub special_tokens: Vec<String>,
    /// A pair must occur at least this often to be merged (values below 1 mean 1).
    pub min_frequency: u64,
    /// Special-token strings in the corpus are boundaries between documents, not text.
    pub split_special_tokens: bool,
    /// What to do with bytes that are not UTF-8.
    pub invalid_utf8: InvalidUtf8,
    /// Show progress bars on stderr (only drawn when stderr is a terminal).
    pub show_progress: bool,
    /// The JSON Lines field or Parquet column holding the text (see
    /// [`crate::write_shards`] for the formats read).
    pub text_field: String,
}

impl Default for TrainConfig {
    fn default() -> Self {
        TrainConfig {
            merges: 8192,
            special_tokens: vec![END_OF_TEXT.to_string()],
            min_frequency: 1,
            split_special_tokens: true,
            invalid_utf8: InvalidUtf8::Error,
            show_progress: true,
            text_field: "text".into(),
        }
    }
}

/// What a training run saw and did.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct TrainReport {
    /// Files read (0 when training on in-memory texts).
    pub files: usize,
    /// Bytes of text read.
    pub bytes: u64,
    /// Pieces counted, and how many were distinct.
    pub pieces: u64,
    pub distinct_pieces: usize,
    /// Merges asked for, and merges learned (fewer if the corpus ran out of pairs).
    pub requested_merges: usize,
    pub merges: usize,
    /// Seconds spent counting and learning.
    pub count_seconds: f64,
    pub learn_seconds: f64,
}

/// The distinct pieces of a corpus with their counts: the state between counting and
/// learning. Add texts or files, then [`PieceCounts::train`].
#[derive(Clone, Debug, Default)]
pub struct PieceCounts {
    counts: FxHashMap<Box<[u8]>, u64>,
    pieces: u64,
    bytes: u64,
    files: usize,
    seconds: f64,
}

impl PieceCounts {
    pub fn new() -> Self {
        Self::default()
    }

    /// Number of distinct pieces.
    pub fn len(&self) -> usize {
        self.counts.len()
    }

    pub fn is_empty(&self) -> bool {
        self.counts.is_empty()
    }

    /// How often `piece` was seen.
    pub fn count(&self, piece: &[u8]) -> u64 {
        self.counts.get(piece).copied().unwrap_or(0)
    }

    /// Counts the pieces of one text (one document).
    pub fn add_text(&mut self, text: &str, config: &TrainConfig) {
        let matcher = matcher(config);
        self.add_block(text.as_bytes(), matcher.as_ref());
    }

    /// Counts the pieces of one file, streaming it.
    pub fn add_file(&mut self, path: &Path, config: &TrainConfig) -> Result<()> {
        self.add_file_with(path, config, &indicatif::ProgressBar::hidden())
    }

    fn add_file_with(
        &mut self,
        path: &Path,
        config: &TrainConfig,
        bar: &indicatif::ProgressBar,
    ) -> Result<()> {
        let matcher = matcher(config);
        let options = ReadOptions {
            text_field: &config.text_field,
            invalid_utf8: config.invalid_utf8,
            specials: matcher.as_ref(),
            block_bytes: BLOCK_BYTES,
        };
        // A text file's blocks, or one JSON line's or Parquet value's document at a time.
        read_documents(path, &options, &mut |piece| {
            self.add_block(&piece.bytes, matcher.as_ref());
            bar.inc(piece.disk);
            Ok(())
        })?;
        self.files += 1;
        Ok(())
    }

    fn add_block(&mut self, bytes: &[u8], matcher: Option<&SpecialMatcher>) {
        let start = Instant::now();
        let ends = chunk_ends(bytes, CHUNK_BYTES, matcher);
        let (local, n) = (0..ends.len())
            .into_par_iter()
            .fold(
                || (FxHashMap::<&[u8], u64>::default(), 0u64),
                |(mut map, mut n), k| {
                    let lo = if k == 0 { 0 } else { ends[k - 1] };
                    for_each_piece(&bytes[lo..ends[k]], matcher, |p| {
                        *map.entry(p).or_insert(0) += 1;
                        n += 1;
                    });
                    (map, n)
                },
            )
            .reduce(
                || (FxHashMap::default(), 0),
                |(mut a, na), (b, nb)| {
                    let (big, small) = if a.len() >= b.len() {
                        (&mut a, b)
                    } else {
                        let mut b = b;
                        std::mem::swap(&mut a, &mut b);
                        (&mut a, b)
                    };
                    for (k, v) in small {
                        *big.entry(k).or_insert(0) += v;
                    }
                    (a, na + nb)
                },
            );
        self.counts.reserve(local.len() / 4);
        for (k, v) in local {
            match self.counts.get_mut(k) {
                Some(c) => *c += v,
                None => {
                    self.counts.insert(k.into(), v);
                }
            }
        }
        self.pieces += n;
        self.bytes += bytes.len() as u64;
        self.seconds += start.elapsed().as_secs_f64();
    }

    /// Learns merges from these counts.
    pub fn train(&self, config: &TrainConfig) -> Result<(Tokenizer, TrainReport)> {
        if self.counts.is_empty() {
            return Err(Error::Invalid(
                "the training corpus is empty: no text to learn merges from".into(),
            ));
        }
        let start = Instant::now();
        let words: Vec<Word> = self
            .counts
            .iter()
            .filter(|(k, _)| k.len() > 1)
            .map(|(k, &v)| Word {
                ids: k.iter().map(|&b| BYTE_ID[b as usize]).collect(),
                count: v as i64,
            })
            .collect();
        let mut tokens: Vec<Box<[u8]>> = BYTE_ORDER
            .iter()
            .map(|&b| Box::from([b].as_slice()))
            .collect();
        let bar = count_bar(config.show_progress, config.merges as u64, "merges");
        let merges = learn(
            words,
            &mut tokens,
            config.merges,
            config.min_frequency,
            &bar,
        );
        bar.finish_and_clear();

        let mut all: Vec<Option<Box<[u8]>>> = tokens.into_iter().map(Some).collect();
        let mut specials: Vec<SpecialToken> = Vec::new();
        for s in &config.special_tokens {
            if s.is_empty() {
                return Err(Error::Invalid("a special token cannot be empty".into()));
            }
            if specials.iter().any(|t| &t.content == s) {
                continue;
            }
            specials.push(SpecialToken {
                content: s.clone(),
                id: all.len() as u32,
            });
            all.push(Some(s.as_bytes().into()));
        }
        let merged = merges.len();
        let tokenizer = Tokenizer::from_parts(all, merges, specials, Options::default())?;
        let report = TrainReport {
            files: self.files,
            bytes: self.bytes,
            pieces: self.pieces,
            distinct_pieces: self.counts.len(),
            requested_merges: config.merges,
            merges: merged,
            count_seconds: self.seconds,
            learn_seconds: start.elapsed().as_secs_f64(),
        };
        Ok((tokenizer, report))
    }
}

fn matcher(config: &TrainConfig) -> Option<SpecialMatcher> {
    if !config.split_special_tokens || config.special_tokens.is_empty() {
        return None;
    }
    let specials: Vec<SpecialToken> = config
        .special_tokens
        .iter()
        .map(|s| SpecialToken {
            content: s.clone(),
            id: 0,
        })
        .collect();
    Some(SpecialMatcher::new(&specials))
}

/// Calls `f` on every piece of `bytes`: pieces of the valid text between special tokens,
/// and each invalid UTF-8 sequence as a piece.
pub(crate) fn for_each_piece<'a>(
    bytes: &'a [u8],
    matcher: Option<&SpecialMatcher>,
    mut f: impl FnMut(&'a [u8]),
) {
    for chunk in bytes.utf8_chunks() {
        let valid = chunk.valid();
        match matcher {
            Some(m) => {
                for seg in m.segments(valid) {
                    if let Segment::Text(t) = seg {
                        pieces(t).for_each(|p| f(p.as_bytes()));
                    }
                }
            }
            None => pieces(valid).for_each(|p| f(p.as_bytes())),
        }
        if !chunk.invalid().is_empty() {
            f(chunk.invalid());
        }
    }
}

/// Trains on files and directories (see [`crate::input::collect_files`]): a text file is
/// one text, a JSON Lines or Parquet file (compressed or not, as [`crate::write_shards`]
/// reads them) one text per document.
///
/// ```no_run
/// use andrea_tokenizer::{train_from_files, TrainConfig};
/// let (tokenizer, report) = train_from_files(&["corpus/"], &TrainConfig::default())?;
/// assert_eq!(tokenizer.vocab_size(), 8449);
/// tokenizer.save("tokenizer.json")?;
/// # Ok::<(), andrea_tokenizer::Error>(())
/// ```
pub fn train_from_files<P: AsRef<Path>>(
    paths: &[P],
    config: &TrainConfig,
) -> Result<(Tokenizer, TrainReport)> {
    let files = collect_files(paths)?;
    let bar = bytes_bar(config.show_progress, total_size(&files), "counting");
    let mut counts = PieceCounts::new();
    for f in &files {
        counts.add_file_with(f, config, &bar)?;
    }
    bar.finish_and_clear();
    counts.train(config)
}

/// Trains on texts in memory, each one document.
pub fn train_from_texts<S: AsRef<str>>(
    texts: &[S],
    config: &TrainConfig,
) -> Result<(Tokenizer, TrainReport)> {
    let mut counts = PieceCounts::new();
    for t in texts {
        counts.add_text(t.as_ref(), config);
    }
    counts.train(config)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn quiet(merges: usize) -> TrainConfig {
        TrainConfig {
            merges,
            show_progress: false,
            ..TrainConfig::default()
        }
    }

    #[test]
    fn layout_is_bytes_merges_specials() {
        let text = "the cat sat on the mat with the hat. ".repeat(50);
        let (tok, report) = train_from_texts(&[&text], &quiet(10)).unwrap();
        assert_eq!(report.merges, 10);
        assert_eq!(tok.vocab_size(), 256 + 10 + 1);
        assert_eq!(tok.eot_id(), Some(266));
        assert_eq!(tok.token_bytes(0), Some(&b"!"[..]));
        // "t h" (the, with) and "a t" (cat, sat, mat, hat) both occur 200 times: the tie
        // goes to the smaller ids, and 'a' < 't'.
        let (a, b) = tok.merges().next().unwrap();
        assert_eq!([a, b], [b"a", b"t"]);
        assert_eq!(tok.decode(&tok.encode(&text)).unwrap(), text);
        assert!(tok.encode(&text).len() < text.len() / 2);
    }

    #[test]
    fn special_tokens_in_text_are_boundaries() {
        let text = "ab<|endoftext|>".repeat(10);
        let counts = {
            let mut c = PieceCounts::new();
            c.add_text(&text, &quiet(1));
            c
        };
        assert_eq!(counts.count(b"<|"), 0);
        assert_eq!(counts.count(b"ab"), 10);
        let mut c = PieceCounts::new();
        c.add_text(
            &text,
            &TrainConfig {
                split_special_tokens: false,
                ..quiet(1)
            },
        );
        assert!(c.count(b"<|") > 0);
    }

    #[test]
    fn empty_corpus_is_an_error() {
        assert!(matches!(
            train_from_texts(&[""], &quiet(10)),
            Err(Error::Invalid(_))
        ));
    }

    #[test]
    fn runs_out_of_pairs_gracefully() {
        let (tok, report) = train_from_texts(&["abc abc"], &quiet(100)).unwrap();
        assert!(report.merges < 100);
        assert_eq!(tok.vocab_size(), 256 + tok.num_merges() + 1);
    }
}
