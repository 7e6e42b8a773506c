//! Property tests: round trips, and ids that depend on the merges only.

use andrea_tokenizer::{pretokenize, sample_text, train_from_texts, Tokenizer, TrainConfig};
use proptest::prelude::*;
use std::sync::OnceLock;

/// A vocabulary trained once on synthetic mixed text.
fn trained() -> &'static Tokenizer {
    static TOK: OnceLock<Tokenizer> = OnceLock::new();
    TOK.get_or_init(|| {
        let text = sample_text::mixed_text(300_000, 11);
        let config = TrainConfig {
            merges: 600,
            show_progress: false,
            ..TrainConfig::default()
        };
        train_from_texts(&[text], &config).unwrap().0
    })
}

/// Strings that stress pre-tokenization: mixes of every character class.
fn tricky_string() -> impl Strategy<Value = String> {
    let atoms = prop::sample::select(vec![
        "a",
        "Z",
        "é",
        "ж",
        "日",
        "한",
        "ب",
        "न",
        "\u{94d}",
        "\u{301}",
        "0",
        "7",
        "٣",
        "½",
        " ",
        "  ",
        "\t",
        "\n",
        "\r\n",
        "\u{a0}",
        "\u{3000}",
        "'",
        "'s",
        "'ll",
        "'T",
        ".",
        ",",
        "!?",
        "(",
        "\"",
        "😀",
        "👍🏽",
        "\u{200d}",
        "<|endoftext|>",
        "<|",
        "|>",
        "the",
        " the",
        "ing",
    ]);
    prop::collection::vec(atoms, 0..40).prop_map(|v| v.concat())
}

fn spelled(tok: &Tokenizer, ids: &[u32]) -> Vec<Vec<u8>> {
    ids.iter()
        .map(|&i| tok.token_bytes(i).unwrap().to_vec())
        .collect()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 200, ..ProptestConfig::default() })]

    #[test]
    fn decode_inverts_encode(s in any::<String>()) {
        let tok = trained();
        prop_assert_eq!(tok.decode(&tok.encode(&s)).unwrap(), s.clone());
        prop_assert_eq!(tok.decode(&tok.encode_with_special_tokens(&s)).unwrap(), s);
    }

    #[test]
    fn decode_inverts_encode_on_tricky_text(s in tricky_string()) {
        let tok = trained();
        prop_assert_eq!(tok.decode(&tok.encode(&s)).unwrap(), s.clone());
        prop_assert_eq!(tok.decode(&tok.encode_with_special_tokens(&s)).unwrap(), s);
    }

    #[test]
    fn byte_path_inverts_for_any_bytes(b in prop::collection::vec(any::<u8>(), 0..200)) {
        let tok = trained();
        prop_assert_eq!(tok.decode_bytes(&tok.encode_bytes(&b)).unwrap(), b.clone());
        // On valid UTF-8 the byte path is the text path.
        if let Ok(s) = std::str::from_utf8(&b) {
            prop_assert_eq!(tok.encode_bytes(&b), tok.encode(s));
        }
    }

    #[test]
    fn ids_depend_on_the_merges_only(s in tricky_string()) {
        let tok = trained();
        // The same merges, rebuilt from their byte strings, and through tokenizer.json.
        let merges: Vec<(Vec<u8>, Vec<u8>)> =
            tok.merges().map(|(a, b)| (a.to_vec(), b.to_vec())).collect();
        let rebuilt = Tokenizer::from_merges(&merges, &["<|endoftext|>"]).unwrap();
        let reloaded = Tokenizer::from_json_str(&tok.to_json_string()).unwrap();
        let ids = tok.encode_with_special_tokens(&s);
        prop_assert_eq!(&rebuilt.encode_with_special_tokens(&s), &ids);
        prop_assert_eq!(&reloaded.encode_with_special_tokens(&s), &ids);
        // With other ids (special token first, as tokenizers numbers them) the tokens are
        // the same strings.
        let mut json: serde_json::Value = serde_json::from_str(&tok.to_json_string()).unwrap();
        let vocab = json["model"]["vocab"].as_object_mut().unwrap();
        for v in vocab.values_mut() {
            let id = v.as_u64().unwrap();
            *v = ((id + 1) % tok.vocab_size() as u64).into();
        }
        json["added_tokens"][0]["id"] = 0.into();
        let shifted = Tokenizer::from_json_str(&json.to_string()).unwrap();
        prop_assert_eq!(spelled(&shifted, &shifted.encode(&s)), spelled(tok, &tok.encode(&s)));
    }

    #[test]
    fn stream_decoding_equals_decoding(b in prop::collection::vec(any::<u8>(), 0..100)) {
        let tok = trained();
        let ids = tok.encode_bytes(&b);
        let mut dec = tok.stream_decoder();
        let mut text = String::new();
        for &id in &ids {
            text.push_str(&dec.push(id).unwrap());
        }
        text.push_str(&dec.finish());
        prop_assert_eq!(text, tok.decode(&ids).unwrap());
    }

    #[test]
    fn pieces_concatenate_to_the_text(s in any::<String>()) {
        prop_assert_eq!(pretokenize::pieces(&s).collect::<String>(), s);
    }
}

#[test]
fn parallel_encoding_equals_sequential() {
    let tok = trained();
    let text = sample_text::mixed_text(1_200_000, 5);
    let one = rayon::ThreadPoolBuilder::new()
        .num_threads(1)
        .build()
        .unwrap();
    let two = rayon::ThreadPoolBuilder::new()
        .num_threads(2)
        .build()
        .unwrap();
    let a = one.install(|| tok.encode(&text));
    let b = two.install(|| tok.encode(&text));
    assert_eq!(a, b);
    // Same as encoding piece by piece.
    let mut c = Vec::new();
    for piece in pretokenize::pieces(&text) {
        c.extend(tok.encode(piece));
    }
    assert_eq!(a, c);
    let docs: Vec<&str> = text.split_inclusive("\n\n").collect();
    let batch: Vec<u32> = two.install(|| tok.encode_batch(&docs)).concat();
    let each: Vec<u32> = docs.iter().flat_map(|d| tok.encode(d)).collect();
    assert_eq!(batch, each);
}

#[test]
fn training_is_deterministic_across_thread_counts() {
    let text = sample_text::mixed_text(400_000, 3);
    let config = TrainConfig {
        merges: 300,
        show_progress: false,
        ..TrainConfig::default()
    };
    let run = |threads| {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .unwrap();
        pool.install(|| {
            train_from_texts(&[&text], &config)
                .unwrap()
                .0
                .to_json_string()
        })
    };
    assert_eq!(run(1), run(2));
}
