//! Interchange: Hugging Face `tokenizer.json`, and GPT-2's `vocab.json` + `merges.txt`.
//!
//! Written: a `tokenizer.json` with a BPE model, the ByteLevel pre-tokenizer,
//! post-processor and decoder, no normalizer, and the special tokens as added tokens;
//! merges in the `"left right"` string form, which every version of `tokenizers` reads.
//! `tokenizers.Tokenizer.from_file` and `transformers.PreTrainedTokenizerFast` load it
//! and give the same ids.
//!
//! Read: the same, as written by `tokenizers` (either form of merges). Anything that would
//! make `tokenizers` produce other ids than andrea is refused with an error naming the
//! field: a normalizer, a pre-tokenizer other than ByteLevel with its regex, a
//! post-processor that adds template tokens, BPE dropout, subword prefixes or suffixes,
//! byte fallback. Padding and truncation settings are ignored (they are batch settings,
//! not the vocabulary). Every added token becomes one of andrea's special tokens,
//! recognised by [`Tokenizer::encode_with_special_tokens`].

use crate::byte_level::{bytes_to_string, string_to_bytes};
use crate::error::{Error, Result};
use crate::special::{SpecialToken, END_OF_TEXT};
use crate::tokenizer::{Options, Tokenizer};
use rustc_hash::FxHashMap;
use serde::ser::SerializeMap;
use serde::{Deserialize, Serialize, Serializer};
use serde_json::Value;
use std::collections::HashMap;
use std::path::Path;

// ------------------------------------------------------------------------- writing

#[derive(Serialize)]
struct FileOut<'a> {
    version: &'static str,
    truncation: Option<()>,
    padding: Option<()>,
    added_tokens: Vec<AddedTokenOut<'a>>,
    normalizer: Option<()>,
    pre_tokenizer: ByteLevelOut,
    post_processor: ByteLevelOut,
    decoder: ByteLevelOut,
    model: ModelOut<'a>,
}

#[derive(Serialize)]
struct AddedTokenOut<'a> {
    id: u32,
    content: &'a str,
    single_word: bool,
    lstrip: bool,
    rstrip: bool,
    normalized: bool,
    special: bool,
}

#[derive(Serialize)]
struct ByteLevelOut {
    #[serde(rename = "type")]
    kind: &'static str,
    add_prefix_space: bool,
    trim_offsets: bool,
    use_regex: bool,
}

#[derive(Serialize)]
struct ModelOut<'a> {
    #[serde(rename = "type")]
    kind: &'static str,
    dropout: Option<f64>,
    unk_token: Option<String>,
    continuing_subword_prefix: Option<String>,
    end_of_word_suffix: Option<String>,
    fuse_unk: bool,
    byte_fallback: bool,
    ignore_merges: bool,
    vocab: VocabOut<'a>,
    merges: Vec<String>,
}

/// The vocabulary as a JSON object in id order (what `tokenizers` writes, and easier to
/// read than sorted by string).
struct VocabOut<'a>(&'a [(String, u32)]);

impl Serialize for VocabOut<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        let mut map = s.serialize_map(Some(self.0.len()))?;
        for (token, id) in self.0 {
            map.serialize_entry(token, id)?;
        }
        map.end()
    }
}

/// How a token is spelled in the vocabulary: a special token as its text, any other in
/// byte-level characters.
fn spelling(tok: &Tokenizer, id: u32) -> Option<String> {
    let bytes = tok.token_bytes(id)?;
    if let Some(s) = tok.special_tokens().iter().find(|s| s.id == id) {
        return Some(s.content.clone());
    }
    Some(bytes_to_string(bytes))
}

/// The `tokenizer.json` text of a tokenizer.
pub(crate) fn to_json(tok: &Tokenizer) -> String {
    let vocab: Vec<(String, u32)> = (0..tok.vocab_size() as u32)
        .filter_map(|id| spelling(tok, id).map(|s| (s, id)))
        .collect();
    let merges = tok
        .merge_ids()
        .iter()
        .map(|&[a, b, _]| {
            format!(
                "{} {}",
                spelling(tok, a).unwrap_or_default(),
                spelling(tok, b).unwrap_or_default()
            )
        })
        .collect();
    let options = tok.options();
    let byte_level = |trim_offsets| ByteLevelOut {
        kind: "ByteLevel",
        add_prefix_space: options.add_prefix_space,
        trim_offsets,
        use_regex: true,
    };
    let file = FileOut {
        version: "1.0",
        truncation: None,
        padding: None,
        added_tokens: tok
            .special_tokens()
            .iter()
            .map(|s| AddedTokenOut {
                id: s.id,
                content: &s.content,
                single_word: false,
                lstrip: false,
                rstrip: false,
                normalized: false,
                special: true,
            })
            .collect(),
        normalizer: None,
        pre_tokenizer: byte_level(true),
        post_processor: byte_level(false),
        decoder: byte_level(true),
        model: ModelOut {
            kind: "BPE",
            dropout: None,
            unk_token: options.unk.and_then(|id| spelling(tok, id)),
            continuing_subword_prefix: None,
            end_of_word_suffix: None,
            fuse_unk: false,
            byte_fallback: false,
            ignore_merges: options.ignore_merges,
            vocab: VocabOut(&vocab),
            merges,
        },
    };
    // Serializing plain strings and numbers cannot fail.
    serde_json::to_string_pretty(&file).unwrap_or_default()
}

// ------------------------------------------------------------------------- reading

#[derive(Deserialize)]
struct FileIn {
    #[serde(default)]
    added_tokens: Vec<AddedTokenIn>,
    #[serde(default)]
    normalizer: Option<Value>,
    #[serde(default)]
    pre_tokenizer: Option<Value>,
    #[serde(default)]
    post_processor: Option<Value>,
    #[serde(default)]
    decoder: Option<Value>,
    model: ModelIn,
}

#[derive(Deserialize)]
struct AddedTokenIn {
    id: u32,
    content: String,
}

#[derive(Deserialize)]
struct ModelIn {
    #[serde(rename = "type", default)]
    kind: Option<String>,
    #[serde(default)]
    dropout: Option<f64>,
    #[serde(default)]
    unk_token: Option<String>,
    #[serde(default)]
    continuing_subword_prefix: Option<String>,
    #[serde(default)]
    end_of_word_suffix: Option<String>,
    #[serde(default)]
    byte_fallback: bool,
    #[serde(default)]
    ignore_merges: bool,
    vocab: HashMap<String, u32>,
    #[serde(default)]
    merges: Vec<MergeIn>,
}

#[derive(Deserialize)]
#[serde(untagged)]
enum MergeIn {
    Joined(String),
    Pair([String; 2]),
}

/// Reads a `tokenizer.json` text.
pub(crate) fn from_json(json: &str) -> Result<Tokenizer> {
    let de = &mut serde_json::Deserializer::from_str(json);
    let file: FileIn = serde_path_to_error::deserialize(de).map_err(|e| {
        // Another model (Unigram, WordPiece, WordLevel) fails on its own `vocab` before
        // its `type` is looked at: say what is wrong, not where serde stopped.
        let kind = serde_json::from_str::<Value>(json)
            .ok()
            .and_then(|v| v["model"]["type"].as_str().map(str::to_string));
        if let Some(kind) = kind.filter(|k| k != "BPE") {
            return Error::format(
                "model.type",
                format!("only byte-level BPE is supported, found a {kind:?} model"),
            );
        }
        let path = e.path().to_string();
        let field = if path == "." {
            "(top level)".to_string()
        } else {
            path
        };
        Error::format(field, e.into_inner().to_string())
    })?;

    if let Some(n) = file.normalizer.as_ref().filter(|v| !v.is_null()) {
        return Err(Error::format(
            "normalizer",
            format!(
                "andrea implements no normalizer (found {}); it must be null",
                type_of(n)
            ),
        ));
    }
    let add_prefix_space =
        check_byte_level(file.pre_tokenizer.as_ref(), "pre_tokenizer", true)?.unwrap_or(false);
    check_byte_level(file.decoder.as_ref(), "decoder", false)?;
    check_byte_level(file.post_processor.as_ref(), "post_processor", false)?;

    let m = &file.model;
    if let Some(kind) = m.kind.as_deref().filter(|k| *k != "BPE") {
        return Err(Error::format(
            "model.type",
            format!("only byte-level BPE is supported, found a {kind:?} model"),
        ));
    }
    if m.dropout.is_some_and(|d| d > 0.0) {
        return Err(Error::format(
            "model.dropout",
            "BPE dropout is not supported",
        ));
    }
    for (field, v) in [
        (
            "model.continuing_subword_prefix",
            &m.continuing_subword_prefix,
        ),
        ("model.end_of_word_suffix", &m.end_of_word_suffix),
    ] {
        if v.as_deref().is_some_and(|s| !s.is_empty()) {
            return Err(Error::format(field, "not supported by byte-level BPE"));
        }
    }
    if m.byte_fallback {
        return Err(Error::format(
            "model.byte_fallback",
            "not supported by byte-level BPE",
        ));
    }

    let merges = file
        .model
        .merges
        .into_iter()
        .enumerate()
        .map(|(i, m)| {
            let field = format!("model.merges[{i}]");
            match m {
                MergeIn::Pair([a, b]) => Ok((a, b, field)),
                MergeIn::Joined(s) => split_merge(&s)
                    .map(|(a, b)| (a, b, field.clone()))
                    .ok_or_else(|| {
                        Error::format(field, format!("expected \"left right\", found {s:?}"))
                    }),
            }
        })
        .collect::<Result<Vec<_>>>()?;
    let added = file
        .added_tokens
        .into_iter()
        .map(|t| (t.content, t.id))
        .collect();
    build(
        file.model.vocab,
        merges,
        added,
        "model.vocab",
        m_options(add_prefix_space, file.model.ignore_merges),
        file.model.unk_token,
    )
}

fn m_options(add_prefix_space: bool, ignore_merges: bool) -> Options {
    Options {
        add_prefix_space,
        ignore_merges,
        unk: None,
    }
}

fn type_of(v: &Value) -> String {
    match v.get("type").and_then(Value::as_str) {
        Some(t) => format!("type {t:?}"),
        None => v.to_string().chars().take(60).collect(),
    }
}

/// Checks that a component is absent or ByteLevel (possibly alone in a Sequence);
/// returns its `add_prefix_space`. `regex_matters`: the pre-tokenizer's `use_regex` must
/// be true (the default).
fn check_byte_level(v: Option<&Value>, field: &str, regex_matters: bool) -> Result<Option<bool>> {
    let Some(v) = v.filter(|v| !v.is_null()) else {
        if regex_matters {
            return Err(Error::format(
                field,
                "missing: andrea's BPE is byte-level and needs the ByteLevel pre-tokenizer",
            ));
        }
        return Ok(None);
    };
    let kind = v.get("type").and_then(Value::as_str).unwrap_or("");
    match kind {
        "ByteLevel" => {
            if regex_matters && v.get("use_regex").and_then(Value::as_bool) == Some(false) {
                return Err(Error::format(
                    format!("{field}.use_regex"),
                    "false is not supported: andrea splits with GPT-2's pattern",
                ));
            }
            Ok(Some(
                v.get("add_prefix_space")
                    .and_then(Value::as_bool)
                    .unwrap_or(false),
            ))
        }
        "Sequence" => {
            let key = match field {
                "pre_tokenizer" => "pretokenizers",
                "decoder" => "decoders",
                _ => "processors",
            };
            match v.get(key).and_then(Value::as_array).map(Vec::as_slice) {
                Some([one]) => {
                    check_byte_level(Some(one), &format!("{field}.{key}[0]"), regex_matters)
                }
                Some([]) if !regex_matters => Ok(None),
                _ => Err(Error::format(
                    format!("{field}.{key}"),
                    "only a Sequence holding one ByteLevel is supported",
                )),
            }
        }
        other => Err(Error::format(
            format!("{field}.type"),
            format!(
                "expected \"ByteLevel\", found {other:?}{}",
                if field == "post_processor" {
                    " (andrea adds no template tokens; set post_processor to null)"
                } else {
                    ""
                }
            ),
        )),
    }
}

fn split_merge(s: &str) -> Option<(String, String)> {
    let (a, b) = s.split_once(' ')?;
    if a.is_empty() || b.is_empty() || b.contains(' ') {
        return None;
    }
    Some((a.to_string(), b.to_string()))
}

/// Builds a tokenizer from a spelled vocabulary, spelled merges (with the field each came
/// from) and added tokens.
fn build(
    vocab: HashMap<String, u32>,
    merges: Vec<(String, String, String)>,
    added: Vec<(String, u32)>,
    vocab_field: &str,
    mut options: Options,
    unk_token: Option<String>,
) -> Result<Tokenizer> {
    let added_ids: FxHashMap<u32, &str> = added.iter().map(|(s, id)| (*id, s.as_str())).collect();
    let max_id = vocab
        .values()
        .chain(added.iter().map(|(_, id)| id))
        .copied()
        .max()
        .ok_or_else(|| Error::format(vocab_field, "the vocabulary is empty"))?;
    if max_id >= 1 << 24 {
        return Err(Error::format(
            vocab_field,
            format!("id {max_id} is too large for a vocabulary"),
        ));
    }
    let mut tokens: Vec<Option<Box<[u8]>>> = vec![None; max_id as usize + 1];
    let mut owner: Vec<Option<&str>> = vec![None; max_id as usize + 1];
    let mut entries: Vec<(&String, &u32)> = vocab.iter().collect();
    entries.sort_by_key(|(_, &id)| id);
    for (s, &id) in entries {
        if let Some(prev) = owner[id as usize] {
            return Err(Error::format(
                vocab_field,
                format!("id {id} is given to both {prev:?} and {s:?}"),
            ));
        }
        owner[id as usize] = Some(s);
        let bytes = match added_ids.get(&id) {
            Some(content) => content.as_bytes().to_vec(),
            None => string_to_bytes(s).map_err(|c| {
                Error::format(
                    vocab_field,
                    format!(
                        "token {s:?} (id {id}) has {c:?} (U+{:04X}), which is not a byte-level \
                         character",
                        c as u32
                    ),
                )
            })?,
        };
        tokens[id as usize] = Some(bytes.into());
    }
    let mut specials = Vec::new();
    for (content, id) in &added {
        if content.is_empty() {
            return Err(Error::format(
                "added_tokens",
                format!("token {id} has empty content"),
            ));
        }
        tokens[*id as usize] = Some(content.as_bytes().into());
        if !specials.iter().any(|s: &SpecialToken| s.id == *id) {
            specials.push(SpecialToken {
                content: content.clone(),
                id: *id,
            });
        }
    }
    let mut list = Vec::with_capacity(merges.len());
    for (a, b, field) in merges {
        let id = |s: &str| {
            vocab.get(s).copied().ok_or_else(|| {
                Error::format(
                    &field,
                    format!("{s:?} (in \"{a} {b}\") is not in the vocabulary"),
                )
            })
        };
        let (ia, ib) = (id(&a)?, id(&b)?);
        let merged = format!("{a}{b}");
        let ic = vocab.get(&merged).copied().ok_or_else(|| {
            Error::format(
                &field,
                format!("the merged token {merged:?} of \"{a} {b}\" is not in the vocabulary"),
            )
        })?;
        list.push([ia, ib, ic]);
    }
    if let Some(unk) = unk_token {
        options.unk = Some(vocab.get(&unk).copied().ok_or_else(|| {
            Error::format(
                "model.unk_token",
                format!("{unk:?} is not in the vocabulary"),
            )
        })?);
    }
    Tokenizer::from_parts(tokens, list, specials, options)
}

/// The largest tokenizer file read: GPT-2's `tokenizer.json` is 1.4 MB, those of 250k-id
/// vocabularies about 20 MB.
const MAX_TOKENIZER_FILE_BYTES: u64 = 256 << 20;

/// Reads a text file that must be a regular file of at most 256 MiB (a FIFO or device
/// under a tokenizer file's name would block or never end): [`andrea_fs::read_regular_text`].
pub(crate) fn read_regular_text(path: &Path) -> Result<String> {
    andrea_fs::read_regular_text(path, MAX_TOKENIZER_FILE_BYTES).map_err(|e| Error::io(path, e))
}

/// Reads GPT-2's `vocab.json` and `merges.txt`. `<|endoftext|>`, if in the vocabulary,
/// is the special token.
pub(crate) fn from_gpt2_files(vocab_path: &Path, merges_path: &Path) -> Result<Tokenizer> {
    let text = read_regular_text(vocab_path)?;
    let de = &mut serde_json::Deserializer::from_str(&text);
    let vocab: HashMap<String, u32> = serde_path_to_error::deserialize(de).map_err(|e| {
        let path = e.path().to_string();
        Error::format(
            if path == "." {
                "(top level)".into()
            } else {
                path
            },
            e.into_inner().to_string(),
        )
        .in_file(vocab_path)
    })?;
    let merges_text = read_regular_text(merges_path)?;
    let mut merges = Vec::new();
    for (n, line) in merges_text.lines().enumerate() {
        let line = line.trim_end_matches('\r');
        if line.is_empty() || (n == 0 && line.starts_with("#version")) {
            continue;
        }
        let field = format!("line {}", n + 1);
        match split_merge(line) {
            Some((a, b)) => merges.push((a, b, field)),
            None => {
                return Err(Error::format(
                    field,
                    format!("expected \"left right\", found {line:?}"),
                )
                .in_file(merges_path))
            }
        }
    }
    let added: Vec<(String, u32)> = vocab
        .get(END_OF_TEXT)
        .map(|&id| (END_OF_TEXT.to_string(), id))
        .into_iter()
        .collect();
    // Field names of vocabulary problems refer to vocab.json, of merges to merges.txt.
    build(
        vocab,
        merges,
        added,
        "(vocabulary)",
        Options::default(),
        None,
    )
    .map_err(|e| match &e {
        Error::Format { field, .. } if field.starts_with("line ") => e.in_file(merges_path),
        _ => e.in_file(vocab_path),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn small() -> Tokenizer {
        Tokenizer::from_merges(&[(" ", "t"), ("h", "e"), (" t", "he")], &[END_OF_TEXT]).unwrap()
    }

    #[test]
    fn roundtrip_through_json() {
        let tok = small();
        let json = to_json(&tok);
        let back = from_json(&json).unwrap();
        assert_eq!(back.vocab_size(), tok.vocab_size());
        let text = "the then <|endoftext|> théâtre\n\n";
        assert_eq!(back.encode(text), tok.encode(text));
        assert_eq!(
            back.encode_with_special_tokens(text),
            tok.encode_with_special_tokens(text)
        );
        assert_eq!(to_json(&back), json);
        assert!(json.contains("\"Ġt he\""));
        assert!(json.contains("\"<|endoftext|>\": 259"));
    }

    fn error_field(json: &str) -> String {
        match from_json(json) {
            Err(Error::Format { field, .. }) => field,
            Err(e) => panic!("unexpected error {e}"),
            Ok(_) => panic!("accepted"),
        }
    }

    #[test]
    fn malformed_files_name_the_field() {
        let good = to_json(&small());
        let v: Value = serde_json::from_str(&good).unwrap();
        let edit = |f: &dyn Fn(&mut Value)| {
            let mut v = v.clone();
            f(&mut v);
            v.to_string()
        };
        assert_eq!(error_field("{}"), "(top level)");
        assert_eq!(error_field("not json"), "(top level)");
        assert_eq!(
            error_field(&edit(&|v| v["model"]["vocab"] = Value::Null)),
            "model.vocab"
        );
        assert_eq!(
            error_field(&edit(&|v| v["model"]["vocab"]["!"] = "x".into())),
            "model.vocab.!"
        );
        assert_eq!(
            error_field(&edit(&|v| v["model"]["merges"][1] = 5.into())),
            "model.merges[1]"
        );
        assert_eq!(
            error_field(&edit(&|v| v["model"]["merges"][1] = "Ġt".into())),
            "model.merges[1]"
        );
        assert_eq!(
            error_field(&edit(&|v| v["model"]["merges"][0] = "Ġ zz".into())),
            "model.merges[0]"
        );
        assert_eq!(
            error_field(&edit(&|v| v["model"]["type"] = "WordPiece".into())),
            "model.type"
        );
        assert_eq!(
            error_field(&edit(&|v| v["pre_tokenizer"]["type"] = "Whitespace".into())),
            "pre_tokenizer.type"
        );
        assert_eq!(
            error_field(&edit(&|v| v["pre_tokenizer"]["use_regex"] = false.into())),
            "pre_tokenizer.use_regex"
        );
        assert_eq!(
            error_field(&edit(&|v| v["pre_tokenizer"] = Value::Null)),
            "pre_tokenizer"
        );
        assert_eq!(
            error_field(&edit(
                &|v| v["normalizer"] = serde_json::json!({"type": "NFC"})
            )),
            "normalizer"
        );
        assert_eq!(
            error_field(&edit(
                &|v| v["post_processor"]["type"] = "TemplateProcessing".into()
            )),
            "post_processor.type"
        );
        assert_eq!(
            error_field(&edit(&|v| v["model"]["vocab"]["a b"] = 300.into())),
            "model.vocab"
        );
        assert_eq!(
            error_field(&edit(&|v| v["model"]["vocab"]["zz"] = 0.into())),
            "model.vocab"
        );
        assert_eq!(
            error_field(&edit(&|v| v["added_tokens"][0]["id"] = "x".into())),
            "added_tokens[0].id"
        );
        assert_eq!(
            error_field(&edit(&|v| v["model"]["dropout"] = 0.1.into())),
            "model.dropout"
        );
    }

    #[test]
    fn accepts_the_newer_merges_form_and_sequences() {
        let good = to_json(&small());
        let mut v: Value = serde_json::from_str(&good).unwrap();
        v["model"]["merges"] = serde_json::json!([["Ġ", "t"], ["h", "e"], ["Ġt", "he"]]);
        v["decoder"] = serde_json::json!({"type": "Sequence", "decoders": [v["decoder"].clone()]});
        v["post_processor"] = Value::Null;
        let tok = from_json(&v.to_string()).unwrap();
        assert_eq!(tok.encode(" the"), small().encode(" the"));
    }

    #[test]
    fn gpt2_files() {
        let dir = tempfile::tempdir().unwrap();
        let tok = small();
        let v: Value = serde_json::from_str(&to_json(&tok)).unwrap();
        let vocab = dir.path().join("vocab.json");
        std::fs::write(&vocab, v["model"]["vocab"].to_string()).unwrap();
        let merges = dir.path().join("merges.txt");
        let lines: Vec<String> = v["model"]["merges"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| m.as_str().unwrap().to_string())
            .collect();
        std::fs::write(&merges, format!("#version: 0.2\n{}\n", lines.join("\n"))).unwrap();
        let back = from_gpt2_files(&vocab, &merges).unwrap();
        assert_eq!(
            back.encode(" the<|endoftext|>"),
            tok.encode(" the<|endoftext|>")
        );
        assert_eq!(back.eot_id(), tok.eot_id());
        std::fs::write(&merges, "#version: 0.2\nĠ t\nbad\n").unwrap();
        match from_gpt2_files(&vocab, &merges) {
            Err(Error::Format { path, field, .. }) => {
                assert_eq!(field, "line 3");
                assert_eq!(path.as_deref(), Some(merges.as_path()));
            }
            other => panic!("{other:?}"),
        }
    }
}
