//! andrea against Hugging Face `tokenizers`, through fixtures written by
//! `scripts/make_fixtures.py` (see there to regenerate them).

use andrea_tokenizer::{pretokenize, train_from_files, Tokenizer, TrainConfig};
use serde_json::Value;
use std::path::PathBuf;

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name)
}

fn cases(name: &str) -> Vec<Value> {
    let text = std::fs::read_to_string(fixture(name)).unwrap();
    let v: Value = serde_json::from_str(&text).unwrap();
    v["cases"].as_array().unwrap().clone()
}

fn ids(v: &Value) -> Vec<u32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect()
}

#[test]
fn encodes_like_tokenizers_with_its_vocabulary() {
    let tok = Tokenizer::load(fixture("hf_tokenizer.json")).unwrap();
    assert_eq!(tok.vocab_size(), 1 + 256 + 1000);
    assert_eq!(tok.eot_id(), Some(0));
    let cases = cases("hf_encodings.json");
    assert!(cases.len() >= 25);
    for case in &cases {
        let text = case["text"].as_str().unwrap();
        assert_eq!(
            tok.encode_with_special_tokens(text),
            ids(&case["ids"]),
            "{text:?}"
        );
        assert_eq!(
            tok.encode(text),
            ids(&case["ids_plain"]),
            "{text:?} (plain)"
        );
        assert_eq!(tok.decode(&ids(&case["ids"])).unwrap(), text);
    }
}

#[test]
fn pre_tokenizes_like_tokenizers() {
    let cases = cases("hf_pretokenize.json");
    assert!(cases.len() >= 400);
    for case in &cases {
        let text = case["text"].as_str().unwrap();
        let want: Vec<&str> = case["pieces"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| p.as_str().unwrap())
            .collect();
        let got: Vec<&str> = pretokenize::pieces(text).collect();
        assert_eq!(got, want, "{text:?}");
    }
}

#[test]
fn trains_the_same_merges_as_tokenizers() {
    let hf = Tokenizer::load(fixture("hf_tokenizer.json")).unwrap();
    let config = TrainConfig {
        merges: 1000,
        show_progress: false,
        ..TrainConfig::default()
    };
    let (ours, report) = train_from_files(&[fixture("train.txt")], &config).unwrap();
    assert_eq!(report.merges, 1000);
    let theirs: Vec<(&[u8], &[u8])> = hf.merges().collect();
    let mine: Vec<(&[u8], &[u8])> = ours.merges().collect();
    assert_eq!(mine.len(), theirs.len());
    for (i, (m, t)) in mine.iter().zip(&theirs).enumerate() {
        assert_eq!(m, t, "merge {i} differs");
    }
    // Same tokens, ids shifted by one: `tokenizers` puts the special token first.
    for id in 0..ours.vocab_size() as u32 - 1 {
        let bytes = ours.token_bytes(id).unwrap();
        assert_eq!(hf.token_id(bytes), Some(id + 1), "token {id}");
    }
    let text = std::fs::read_to_string(fixture("train.txt")).unwrap();
    let a: Vec<u32> = ours.encode(&text).iter().map(|&i| i + 1).collect();
    assert_eq!(a, hf.encode(&text));
}

#[test]
fn reads_gpt2_files_written_by_tokenizers() {
    let json = Tokenizer::load(fixture("hf_tokenizer.json")).unwrap();
    let files =
        Tokenizer::from_gpt2_files(fixture("hf-vocab.json"), fixture("hf-merges.txt")).unwrap();
    assert_eq!(files.vocab_size(), json.vocab_size());
    assert_eq!(files.eot_id(), json.eot_id());
    for case in &cases("hf_encodings.json") {
        let text = case["text"].as_str().unwrap();
        assert_eq!(
            files.encode_with_special_tokens(text),
            ids(&case["ids"]),
            "{text:?}"
        );
    }
}
