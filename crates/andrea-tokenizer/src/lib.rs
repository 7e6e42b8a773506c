//! # andrea-tokenizer
//!
//! Byte-level BPE, the tokenizer of ANDREA-120M: 256 byte tokens + 8192 learned merges +
//! `<|endoftext|>` = 8449 ids. It trains on a corpus, encodes and decodes, writes the
//! corpus as llm.c token shards, and reads and writes the Hugging Face `tokenizer.json`,
//! so a vocabulary trained here works in `tokenizers`/`transformers` and one trained
//! there (or GPT-2's `vocab.json` + `merges.txt`) works here, with the same ids.
//!
//! ```
//! use andrea_tokenizer::{sample_text, train_from_texts, TrainConfig, Tokenizer};
//!
//! let corpus = sample_text::mixed_text(200_000, 1);
//! let config = TrainConfig { merges: 300, show_progress: false, ..TrainConfig::default() };
//! let (tokenizer, report) = train_from_texts(&[&corpus], &config)?;
//! assert_eq!(report.merges, 300);
//! assert_eq!(tokenizer.vocab_size(), 256 + 300 + 1);
//!
//! let ids = tokenizer.encode("Hello, world! It's 2024.");
//! assert_eq!(tokenizer.decode(&ids)?, "Hello, world! It's 2024.");
//!
//! // Special tokens are text unless asked for.
//! let eot = tokenizer.eot_id().unwrap();
//! assert!(!tokenizer.encode("<|endoftext|>").contains(&eot));
//! assert_eq!(tokenizer.encode_with_special_tokens("<|endoftext|>"), [eot]);
//!
//! // tokenizer.json round trip (the file `tokenizers.Tokenizer.from_file` reads).
//! let back = Tokenizer::from_json_str(&tokenizer.to_json_string())?;
//! let sample = "Round trip: 1234 ünïcødé 👋\n\n    indented";
//! assert_eq!(back.encode(sample), tokenizer.encode(sample));
//! # Ok::<(), andrea_tokenizer::Error>(())
//! ```
//!
//! ## How it works
//!
//! - **Pre-tokenization** ([`pretokenize`]): GPT-2's split into pieces (contractions,
//!   letters, numbers, other symbols, each with an optional leading space; whitespace
//!   runs give their last space to the next word), hand-written over Unicode classes.
//!   BPE never merges across pieces.
//! - **Ids** ([`byte_level`]): ids 0..256 are the bytes in GPT-2's order, merge `i` makes
//!   id `256 + i`, special tokens follow. In JSON, tokens are spelled with GPT-2's
//!   byte-to-unicode table (space is `Ġ`).
//! - **Training** ([`train_from_files`], [`PieceCounts`]): files are streamed in blocks
//!   cut where pre-tokenization is unaffected, chunks are counted in parallel (rayon),
//!   then merges are learned with incremental pair counts and a lazy max-heap. The next
//!   merge is the most frequent pair, **ties broken by the smaller (left id, right id)**,
//!   which is also the Hugging Face trainer's rule: on the same text both learn the same
//!   merges. Deterministic: hashing, threads and input chunking do not change the result.
//! - **Encoding** ([`Tokenizer::encode`]): rank-priority merges per piece (lowest rank
//!   first, leftmost among equals), a per-thread cache of frequent pieces, and inputs of
//!   256 KiB or more cut at safe points and encoded in parallel on the current rayon pool.
//!   Set the thread count with a pool from the re-exported [`rayon`]
//!   (`pool.install(...)`) or with `RAYON_NUM_THREADS`.
//! - **Decoding** ([`Tokenizer::decode_bytes`], [`Tokenizer::decode`],
//!   [`Tokenizer::stream_decoder`]): bytes exactly, or text with invalid UTF-8 replaced by
//!   U+FFFD as `tokenizers` does.
//! - **Shards** ([`write_shards`], [`TokenShard`]): llm.c's format (DESIGN.md), train/val
//!   split by input bytes, a progress bar; [`prepare_shard_set`] writes a whole set
//!   (shards, `tokenizer.json`, a [`Manifest`]) as one unit.
//!
//! Errors ([`Error`]) name the file and byte offset of invalid UTF-8, the unknown id in
//! decode, and the field of a malformed `tokenizer.json`; nothing a user passes in
//! panics.

mod bpe;
pub mod byte_level;
mod cache;
mod documents;
mod error;
mod hf_json;
pub mod input;
mod learn;
pub mod pretokenize;
mod progress;
pub mod sample_text;
pub mod shard_set;
pub mod shards;
mod special;
mod tokenizer;
pub mod train;

/// The rayon this crate runs on: build a `rayon::ThreadPool` with it and call the
/// tokenizer inside `pool.install(..)` to choose the number of threads.
pub use rayon;

pub use error::{Error, Result};
pub use input::{collect_files, InvalidUtf8};
pub use shard_set::{
    fingerprint, prepare_shard_set, Manifest, SetReport, ShardEntry, MANIFEST_FILE,
};
pub use shards::{
    check_prefix, parse_shard_name, shard_name, write_shards, ShardOptions, ShardReport, TokenShard,
};
pub use special::{SpecialToken, END_OF_TEXT};
pub use tokenizer::{StreamDecoder, Tokenizer};
pub use train::{train_from_files, train_from_texts, PieceCounts, TrainConfig, TrainReport};
