//! The tokenizer: a vocabulary (id -> bytes), its merges, its special tokens; encoding
//! and decoding.

use crate::bpe::MergeTable;
use crate::byte_level::BYTE_ORDER;
use crate::cache::{with_cache, PieceCache, KEY_MAX};
use crate::error::{Error, Result};
use crate::input::chunk_ends;
use crate::input::InvalidUtf8;
use crate::pretokenize::pieces;
use crate::special::{Segment, SpecialMatcher, SpecialToken};
use rayon::prelude::*;
use rustc_hash::FxHashMap;
use std::sync::atomic::{AtomicU64, Ordering};

/// Inputs at least this long are cut into chunks and encoded in parallel.
const PARALLEL_MIN_BYTES: usize = 256 * 1024;
/// The smallest chunk of a parallel encode.
const MIN_CHUNK_BYTES: usize = 64 * 1024;
const NO_ID: u32 = u32::MAX;

static NEXT_INSTANCE: AtomicU64 = AtomicU64::new(1);

/// A byte-level BPE tokenizer.
///
/// Ids index a vocabulary of byte strings: single bytes, merged tokens and special
/// tokens. A tokenizer trained by andrea ([`crate::train`]) or built with
/// [`Tokenizer::from_merges`] has andrea's layout: ids 0..256 are the bytes in GPT-2's
/// order ([`crate::byte_level::BYTE_ORDER`]), merge `i` makes id `256 + i`, and the special
/// tokens come last (`<|endoftext|>` is 8448 with 8192 merges). A tokenizer loaded from a
/// file keeps the file's ids.
///
/// A `Tokenizer` never changes after it is built, is `Send + Sync`, and is cheap to share
/// behind a reference. Encoding keeps a small cache of encoded pieces per thread.
pub struct Tokenizer {
    /// id -> bytes; `None` for an id the vocabulary does not use.
    tokens: Vec<Option<Box<[u8]>>>,
    /// id of each single byte (`NO_ID` if the vocabulary lacks it).
    byte_ids: [u32; 256],
    /// Merges in rank order: (left, right, merged).
    merge_list: Vec<[u32; 3]>,
    merges: MergeTable,
    specials: Vec<SpecialToken>,
    matcher: SpecialMatcher,
    /// Bytes of every ordinary (non-special) token -> id.
    index: FxHashMap<Box<[u8]>, u32>,
    options: Options,
    instance: u64,
}

/// Options that loaded vocabularies may carry (defaults: GPT-2's).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Options {
    /// `ByteLevel.add_prefix_space`: a space is put before text that does not start with
    /// one.
    pub add_prefix_space: bool,
    /// BPE `ignore_merges`: a piece that is itself a token is that token.
    pub ignore_merges: bool,
    /// BPE `unk_token`: the id given to a byte the vocabulary lacks (otherwise such a byte
    /// is dropped, as `tokenizers` does).
    pub unk: Option<u32>,
}

impl std::fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokenizer")
            .field("vocab_size", &self.vocab_size())
            .field("merges", &self.merge_list.len())
            .field("special_tokens", &self.specials)
            .field("options", &self.options)
            .finish_non_exhaustive()
    }
}

impl Clone for Tokenizer {
    fn clone(&self) -> Self {
        Tokenizer {
            tokens: self.tokens.clone(),
            byte_ids: self.byte_ids,
            merge_list: self.merge_list.clone(),
            merges: self.merges.clone(),
            specials: self.specials.clone(),
            matcher: self.matcher.clone(),
            index: self.index.clone(),
            options: self.options,
            instance: self.instance,
        }
    }
}

impl Tokenizer {
    /// A tokenizer in andrea's layout from merges given as byte strings, in rank order,
    /// with `special_tokens` after them.
    ///
    /// Each merge's two sides must already be tokens (bytes or earlier merges). A merge
    /// whose result is already a token reuses that token's id, as the trainers of
    /// `tokenizers` and andrea do; so the vocabulary is `256 + merges.len()` tokens plus
    /// the special tokens unless two merges spell the same string.
    pub fn from_merges<A, B, S>(merges: &[(A, B)], special_tokens: &[S]) -> Result<Tokenizer>
    where
        A: AsRef<[u8]>,
        B: AsRef<[u8]>,
        S: AsRef<str>,
    {
        let mut tokens: Vec<Option<Box<[u8]>>> = BYTE_ORDER
            .iter()
            .map(|&b| Some(Box::from([b].as_slice())))
            .collect();
        let mut index: FxHashMap<Box<[u8]>, u32> = tokens
            .iter()
            .enumerate()
            .map(|(i, t)| (t.clone().unwrap(), i as u32))
            .collect();
        let mut list = Vec::with_capacity(merges.len());
        for (rank, (a, b)) in merges.iter().enumerate() {
            let (a, b) = (a.as_ref(), b.as_ref());
            let side = |s: &[u8]| {
                index.get(s).copied().ok_or_else(|| {
                    Error::Invalid(format!(
                        "merge {rank} ({:?} + {:?}): {:?} is not a token made by an earlier merge",
                        String::from_utf8_lossy(a),
                        String::from_utf8_lossy(b),
                        String::from_utf8_lossy(s)
                    ))
                })
            };
            let (ia, ib) = (side(a)?, side(b)?);
            let merged: Box<[u8]> = [a, b].concat().into();
            let id = match index.get(&merged) {
                Some(&id) => id,
                None => {
                    let id = tokens.len() as u32;
                    tokens.push(Some(merged.clone()));
                    index.insert(merged, id);
                    id
                }
            };
            list.push([ia, ib, id]);
        }
        let mut specials = Vec::new();
        for s in special_tokens {
            let content = s.as_ref().to_string();
            if specials.iter().any(|t: &SpecialToken| t.content == content) {
                continue;
            }
            specials.push(SpecialToken {
                content: content.clone(),
                id: tokens.len() as u32,
            });
            tokens.push(Some(content.into_bytes().into()));
        }
        Tokenizer::from_parts(tokens, list, specials, Options::default())
    }

    /// Assembles a tokenizer; `merges` and `specials` refer to ids of `tokens`.
    pub(crate) fn from_parts(
        tokens: Vec<Option<Box<[u8]>>>,
        merge_list: Vec<[u32; 3]>,
        specials: Vec<SpecialToken>,
        options: Options,
    ) -> Result<Tokenizer> {
        if tokens.len() > u32::MAX as usize - 1 {
            return Err(Error::Invalid("vocabulary too large".into()));
        }
        let special_ids: rustc_hash::FxHashSet<u32> = specials.iter().map(|s| s.id).collect();
        let mut index = FxHashMap::default();
        for (id, t) in tokens.iter().enumerate() {
            if let Some(t) = t {
                if !special_ids.contains(&(id as u32)) {
                    index.entry(t.clone()).or_insert(id as u32);
                }
            }
        }
        let mut byte_ids = [NO_ID; 256];
        for (b, slot) in byte_ids.iter_mut().enumerate() {
            if let Some(&id) = index.get([b as u8].as_slice()) {
                *slot = id;
            }
        }
        // A special token's id must be its own: one that a byte or a merge also uses
        // would make ordinary text encode to the special token, or a byte unspellable.
        if let Some(b) = byte_ids.iter().position(|&id| id == NO_ID) {
            return Err(Error::Invalid(format!(
                "byte {b:#04x} has no token of its own (is its id taken by a special token?): \
                 a byte-level vocabulary spells all 256 bytes"
            )));
        }
        if special_ids.len() != specials.len() {
            return Err(Error::Invalid(
                "two special tokens share one id: each needs its own".into(),
            ));
        }
        if let Some(m) = merge_list
            .iter()
            .find(|m| m.iter().any(|id| special_ids.contains(id)))
        {
            return Err(Error::Invalid(format!(
                "the merge {:?} uses the id of a special token: special tokens need ids of their own",
                m
            )));
        }
        for s in &specials {
            if tokens.get(s.id as usize).is_none_or(|t| t.is_none()) {
                return Err(Error::Invalid(format!(
                    "special token {:?} has id {} outside the vocabulary",
                    s.content, s.id
                )));
            }
        }
        Ok(Tokenizer {
            merges: MergeTable::new(&merge_list),
            matcher: SpecialMatcher::new(&specials),
            tokens,
            byte_ids,
            merge_list,
            specials,
            index,
            options,
            instance: NEXT_INSTANCE.fetch_add(1, Ordering::Relaxed),
        })
    }

    // ---------------------------------------------------------------- vocabulary

    /// The number of ids: one more than the largest id.
    pub fn vocab_size(&self) -> usize {
        self.tokens.len()
    }

    /// The bytes of token `id` (a special token's are its text).
    pub fn token_bytes(&self, id: u32) -> Option<&[u8]> {
        self.tokens.get(id as usize)?.as_deref()
    }

    /// The id of the ordinary token spelled by `bytes`, or of the special token with this
    /// text.
    pub fn token_id(&self, bytes: &[u8]) -> Option<u32> {
        self.index.get(bytes).copied().or_else(|| {
            self.specials
                .iter()
                .find(|s| s.content.as_bytes() == bytes)
                .map(|s| s.id)
        })
    }

    /// The special tokens.
    pub fn special_tokens(&self) -> &[SpecialToken] {
        &self.specials
    }

    /// The id of the special token with this text.
    pub fn special_token_id(&self, content: &str) -> Option<u32> {
        self.specials
            .iter()
            .find(|s| s.content == content)
            .map(|s| s.id)
    }

    /// The id of `<|endoftext|>`, if the vocabulary has it.
    pub fn eot_id(&self) -> Option<u32> {
        self.special_token_id(crate::special::END_OF_TEXT)
    }

    /// Is `id` a special token?
    pub fn is_special(&self, id: u32) -> bool {
        self.specials.iter().any(|s| s.id == id)
    }

    /// The number of merges.
    pub fn num_merges(&self) -> usize {
        self.merge_list.len()
    }

    /// The merges in rank order, as (left, right) byte strings.
    pub fn merges(&self) -> impl ExactSizeIterator<Item = (&[u8], &[u8])> + '_ {
        self.merge_list.iter().map(|&[a, b, _]| {
            (
                self.token_bytes(a).unwrap_or_default(),
                self.token_bytes(b).unwrap_or_default(),
            )
        })
    }

    pub(crate) fn merge_ids(&self) -> &[[u32; 3]] {
        &self.merge_list
    }

    pub(crate) fn options(&self) -> Options {
        self.options
    }

    // ---------------------------------------------------------------- encoding

    /// Encodes text, treating special-token strings as ordinary text. Inputs of 256 KiB
    /// or more are encoded in parallel on the current rayon pool (same ids).
    pub fn encode(&self, text: &str) -> Vec<u32> {
        let mut out = Vec::with_capacity(text.len() / 3 + 1);
        self.encode_text_into(text, true, &mut out);
        out
    }

    /// Encodes text, recognising the special tokens (`<|endoftext|>`) in it.
    pub fn encode_with_special_tokens(&self, text: &str) -> Vec<u32> {
        let mut out = Vec::with_capacity(text.len() / 3 + 1);
        self.encode_with_special_tokens_into(text, true, &mut out);
        out
    }

    /// `at_start`: `text` starts a segment (for `add_prefix_space`); so does the text after
    /// each special token, as in `tokenizers`.
    pub(crate) fn encode_with_special_tokens_into(
        &self,
        text: &str,
        at_start: bool,
        out: &mut Vec<u32>,
    ) {
        if self.matcher.is_empty() {
            return self.encode_text_into(text, at_start, out);
        }
        let mut starts = at_start;
        for seg in self.matcher.segments(text) {
            match seg {
                Segment::Text(t) => self.encode_text_into(t, starts, out),
                Segment::Special(id) => out.push(id),
            }
            starts = true;
        }
    }

    pub(crate) fn matcher(&self) -> &SpecialMatcher {
        &self.matcher
    }

    /// Encodes bytes that need not be UTF-8: valid stretches are encoded as text, each
    /// invalid sequence (as [`<[u8]>::utf8_chunks`] delimits them) as a piece of its own.
    /// `decode_bytes(encode_bytes(b)) == b` for every `b`.
    pub fn encode_bytes(&self, bytes: &[u8]) -> Vec<u32> {
        let mut out = Vec::with_capacity(bytes.len() / 3 + 1);
        self.encode_bytes_into(bytes, false, true, &mut out);
        out
    }

    pub(crate) fn encode_bytes_into(
        &self,
        bytes: &[u8],
        special: bool,
        at_start: bool,
        out: &mut Vec<u32>,
    ) {
        let mut first = at_start;
        for chunk in bytes.utf8_chunks() {
            if special {
                self.encode_with_special_tokens_into(chunk.valid(), first, out);
            } else {
                self.encode_text_into(chunk.valid(), first, out);
            }
            first = false;
            if !chunk.invalid().is_empty() {
                with_cache(self.instance, |cache| {
                    self.encode_piece(chunk.invalid(), cache, &mut Vec::new(), out)
                });
            }
        }
    }

    /// Encodes many texts in parallel (ordinary text, as [`Tokenizer::encode`]).
    pub fn encode_batch<S: AsRef<str> + Sync>(&self, texts: &[S]) -> Vec<Vec<u32>> {
        texts.par_iter().map(|t| self.encode(t.as_ref())).collect()
    }

    /// Encodes a text with no special tokens in it; `starts_segment` says whether
    /// `add_prefix_space` applies.
    pub(crate) fn encode_text_into(&self, text: &str, starts_segment: bool, out: &mut Vec<u32>) {
        if text.is_empty() {
            return;
        }
        if self.options.add_prefix_space && starts_segment && !text.starts_with(' ') {
            let spaced = format!(" {text}");
            return self.encode_text_into(&spaced, false, out);
        }
        if text.len() >= PARALLEL_MIN_BYTES && rayon::current_num_threads() > 1 {
            let target = (text.len() / (rayon::current_num_threads() * 8)).max(MIN_CHUNK_BYTES);
            let ends = chunk_ends(text.as_bytes(), target, None);
            if ends.len() > 1 {
                let starts: Vec<usize> = std::iter::once(0).chain(ends.iter().copied()).collect();
                let parts: Vec<Vec<u32>> = (0..ends.len())
                    .into_par_iter()
                    .map(|k| {
                        let mut v = Vec::new();
                        self.encode_ordinary_chunk(&text[starts[k]..ends[k]], &mut v);
                        v
                    })
                    .collect();
                out.reserve(parts.iter().map(Vec::len).sum());
                for p in parts {
                    out.extend_from_slice(&p);
                }
                return;
            }
        }
        self.encode_ordinary_chunk(text, out);
    }

    /// Pre-tokenizes and encodes on the calling thread.
    pub(crate) fn encode_ordinary_chunk(&self, text: &str, out: &mut Vec<u32>) {
        with_cache(self.instance, |cache| {
            let mut scratch = Vec::with_capacity(64);
            for piece in pieces(text) {
                self.encode_piece(piece.as_bytes(), cache, &mut scratch, out);
            }
        })
    }

    /// Encodes one piece: its byte tokens, merged.
    #[inline]
    fn encode_piece(
        &self,
        piece: &[u8],
        cache: &mut PieceCache,
        scratch: &mut Vec<u32>,
        out: &mut Vec<u32>,
    ) {
        if piece.len() == 1 {
            match self.byte_ids[piece[0] as usize] {
                NO_ID => out.extend(self.options.unk),
                id => out.push(id),
            }
            return;
        }
        let cacheable = piece.len() <= KEY_MAX;
        if cacheable {
            if let Some(ids) = cache.get(piece) {
                out.extend_from_slice(ids);
                return;
            }
        }
        scratch.clear();
        if self.options.ignore_merges {
            if let Some(&id) = self.index.get(piece) {
                scratch.push(id);
            }
        }
        if scratch.is_empty() {
            for &b in piece {
                match self.byte_ids[b as usize] {
                    NO_ID => scratch.extend(self.options.unk),
                    id => scratch.push(id),
                }
            }
            self.merges.apply(scratch);
        }
        if cacheable {
            cache.insert(piece, scratch);
        }
        out.extend_from_slice(scratch);
    }

    // ---------------------------------------------------------------- decoding

    /// The bytes of a sequence of ids (special tokens give their text).
    pub fn decode_bytes(&self, ids: &[u32]) -> Result<Vec<u8>> {
        let mut out = Vec::with_capacity(ids.len() * 4);
        for &id in ids {
            out.extend_from_slice(self.bytes_of(id)?);
        }
        Ok(out)
    }

    /// The text of a sequence of ids. Bytes that are not valid UTF-8 (a character whose
    /// tokens were cut off, say) become U+FFFD, as `tokenizers`' ByteLevel decoder does;
    /// use [`Tokenizer::decode_bytes`] to get them exactly. Unlike the Python
    /// `tokenizers.Tokenizer.decode`, special tokens are kept (filter with
    /// [`Tokenizer::is_special`] to drop them).
    pub fn decode(&self, ids: &[u32]) -> Result<String> {
        let bytes = self.decode_bytes(ids)?;
        Ok(match String::from_utf8(bytes) {
            Ok(s) => s,
            Err(e) => String::from_utf8_lossy(e.as_bytes()).into_owned(),
        })
    }

    fn bytes_of(&self, id: u32) -> Result<&[u8]> {
        self.token_bytes(id).ok_or(Error::UnknownId {
            id,
            vocab_size: self.tokens.len(),
        })
    }

    /// A decoder for ids that arrive one at a time (sampling): it returns text as soon
    /// as it is complete UTF-8 and holds back a character whose bytes are still coming.
    pub fn stream_decoder(&self) -> StreamDecoder<'_> {
        StreamDecoder {
            tokenizer: self,
            pending: Vec::new(),
        }
    }
}

/// Incremental decoding (see [`Tokenizer::stream_decoder`]). The concatenation of what
/// [`StreamDecoder::push`] and [`StreamDecoder::finish`] return equals
/// [`Tokenizer::decode`] of all the ids.
#[derive(Debug)]
pub struct StreamDecoder<'t> {
    tokenizer: &'t Tokenizer,
    pending: Vec<u8>,
}

impl StreamDecoder<'_> {
    /// Adds one id; returns the text it completes (often empty mid-character).
    pub fn push(&mut self, id: u32) -> Result<String> {
        self.pending.extend_from_slice(self.tokenizer.bytes_of(id)?);
        let mut text = String::new();
        let mut rest: &[u8] = &self.pending;
        loop {
            match std::str::from_utf8(rest) {
                Ok(s) => {
                    text.push_str(s);
                    rest = &[];
                    break;
                }
                Err(e) => {
                    let (good, bad) = rest.split_at(e.valid_up_to());
                    // `good` is valid by construction.
                    text.push_str(std::str::from_utf8(good).unwrap_or_default());
                    match e.error_len() {
                        None => {
                            rest = bad;
                            break;
                        }
                        Some(n) => {
                            text.push(char::REPLACEMENT_CHARACTER);
                            rest = &bad[n..];
                        }
                    }
                }
            }
        }
        self.pending = rest.to_vec();
        Ok(text)
    }

    /// Whatever is still held back, lossily.
    pub fn finish(self) -> String {
        String::from_utf8_lossy(&self.pending).into_owned()
    }
}

/// Files: `tokenizer.json`, GPT-2's `vocab.json` + `merges.txt`, text files.
impl Tokenizer {
    /// Writes `tokenizer.json` (the Hugging Face format, see the crate docs), atomically.
    pub fn save(&self, path: impl AsRef<std::path::Path>) -> Result<()> {
        let path = path.as_ref();
        andrea_fs::write_atomic(path, self.to_json_string().as_bytes())
            .map_err(|e| Error::io(path, e))
    }

    /// Reads a `tokenizer.json` written by andrea or by `tokenizers` (byte-level BPE).
    pub fn load(path: impl AsRef<std::path::Path>) -> Result<Tokenizer> {
        let path = path.as_ref();
        let text = crate::hf_json::read_regular_text(path)?;
        Tokenizer::from_json_str(&text).map_err(|e| e.in_file(path))
    }

    /// The `tokenizer.json` text.
    pub fn to_json_string(&self) -> String {
        crate::hf_json::to_json(self)
    }

    /// Parses a `tokenizer.json` text.
    pub fn from_json_str(json: &str) -> Result<Tokenizer> {
        crate::hf_json::from_json(json)
    }

    /// Reads GPT-2's `vocab.json` and `merges.txt`; `<|endoftext|>`, if in the
    /// vocabulary, is the special token.
    pub fn from_gpt2_files(
        vocab_json: impl AsRef<std::path::Path>,
        merges_txt: impl AsRef<std::path::Path>,
    ) -> Result<Tokenizer> {
        crate::hf_json::from_gpt2_files(vocab_json.as_ref(), merges_txt.as_ref())
    }

    /// Encodes a whole file; `special_tokens`: recognise them in the text. Invalid UTF-8
    /// is an error naming the byte offset, or goes through the byte path
    /// ([`Tokenizer::encode_bytes`]) with [`InvalidUtf8::Bytes`].
    pub fn encode_file(
        &self,
        path: impl AsRef<std::path::Path>,
        special_tokens: bool,
        invalid_utf8: InvalidUtf8,
    ) -> Result<Vec<u32>> {
        let path = path.as_ref();
        let bytes = std::fs::read(path).map_err(|e| Error::io(path, e))?;
        match std::str::from_utf8(&bytes) {
            Ok(text) if special_tokens => Ok(self.encode_with_special_tokens(text)),
            Ok(text) => Ok(self.encode(text)),
            Err(e) if invalid_utf8 == InvalidUtf8::Error => Err(Error::InvalidUtf8 {
                path: path.to_path_buf(),
                offset: e.valid_up_to() as u64,
            }),
            Err(_) => {
                let mut out = Vec::with_capacity(bytes.len() / 3 + 1);
                self.encode_bytes_into(&bytes, special_tokens, true, &mut out);
                Ok(out)
            }
        }
    }
}
