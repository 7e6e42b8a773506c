//! Files: training from a directory, shards, and every bad input a user can give.

use andrea_tokenizer::{
    sample_text, train_from_files, write_shards, Error, InvalidUtf8, ShardOptions, TokenShard,
    Tokenizer, TrainConfig,
};
use std::path::Path;

fn quiet(merges: usize) -> TrainConfig {
    TrainConfig {
        merges,
        show_progress: false,
        ..TrainConfig::default()
    }
}

fn corpus(dir: &Path) {
    std::fs::create_dir_all(dir.join("b")).unwrap();
    std::fs::write(dir.join("a.txt"), sample_text::mixed_text(60_000, 1)).unwrap();
    std::fs::write(
        dir.join("b/c.txt"),
        sample_text::mixed_text(40_000, 2) + "<|endoftext|>" + &sample_text::mixed_text(9_000, 3),
    )
    .unwrap();
}

#[test]
fn trains_from_a_directory_and_saves() {
    let dir = tempfile::tempdir().unwrap();
    corpus(dir.path());
    let (tok, report) = train_from_files(&[dir.path()], &quiet(200)).unwrap();
    assert_eq!(report.files, 2);
    assert_eq!(report.merges, 200);
    assert_eq!(tok.vocab_size(), 457);
    let path = dir.path().join("tokenizer.json");
    tok.save(&path).unwrap();
    let back = Tokenizer::load(&path).unwrap();
    let text = std::fs::read_to_string(dir.path().join("b/c.txt")).unwrap();
    assert_eq!(
        back.encode_with_special_tokens(&text),
        tok.encode_with_special_tokens(&text)
    );
    // Training on the files one by one in the same order gives the same vocabulary.
    let (again, _) = train_from_files(
        &[dir.path().join("a.txt"), dir.path().join("b/c.txt")],
        &quiet(200),
    )
    .unwrap();
    assert_eq!(again.to_json_string(), tok.to_json_string());
}

#[test]
fn shards_hold_the_encoded_corpus() {
    let dir = tempfile::tempdir().unwrap();
    corpus(dir.path());
    let (tok, _) = train_from_files(&[dir.path()], &quiet(300)).unwrap();
    let out = dir.path().join("shards");
    let options = ShardOptions {
        shard_tokens: 10_000,
        val_fraction: 0.2,
        show_progress: false,
        ..ShardOptions::default()
    };
    let report = write_shards(
        &tok,
        &[dir.path().join("a.txt"), dir.path().join("b")],
        &out,
        &options,
    )
    .unwrap();
    assert_eq!(report.files, 2);
    assert!(report.val_tokens > 0 && report.train_tokens > report.val_tokens * 2);
    assert!(report.train_shards.len() >= 2);

    // Reading all shards back, val then train, gives each file's tokens behind an eot.
    let eot = tok.eot_id().unwrap();
    let mut all = Vec::new();
    for path in report.val_shards.iter().chain(&report.train_shards) {
        let shard = TokenShard::open(path).unwrap();
        assert!(shard.len() <= 10_000);
        assert_eq!(shard.vocab_size(), Some(tok.vocab_size() as u32));
        let mut copy = vec![0u16; shard.len()];
        shard.read(0, &mut copy).unwrap();
        assert_eq!(shard.tokens(), &copy[..]);
        all.extend(copy.iter().map(|&t| t as u32));
    }
    let mut want = vec![eot];
    want.extend(
        tok.encode_with_special_tokens(&std::fs::read_to_string(dir.path().join("a.txt")).unwrap()),
    );
    want.push(eot);
    want.extend(
        tok.encode_with_special_tokens(
            &std::fs::read_to_string(dir.path().join("b/c.txt")).unwrap(),
        ),
    );
    assert_eq!(all, want);
    assert_eq!(report.val_tokens + report.train_tokens, want.len() as u64);

    // The header is llm.c's.
    let bytes = std::fs::read(&report.train_shards[0]).unwrap();
    let int = |i: usize| i32::from_le_bytes(bytes[4 * i..4 * i + 4].try_into().unwrap());
    assert_eq!((int(0), int(1), int(2)), (20240520, 1, 10_000));
    assert_eq!(bytes.len(), 1024 + 2 * 10_000);
}

#[test]
fn damaged_shards_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("x.txt"), "hello world, hello world").unwrap();
    let tok = Tokenizer::from_merges::<&str, &str, _>(&[], &["<|endoftext|>"]).unwrap();
    let options = ShardOptions {
        val_fraction: 0.0,
        show_progress: false,
        ..ShardOptions::default()
    };
    let report = write_shards(
        &tok,
        &[dir.path().join("x.txt")],
        &dir.path().join("s"),
        &options,
    )
    .unwrap();
    assert!(report.val_shards.is_empty());
    let path = &report.train_shards[0];
    assert_eq!(TokenShard::open(path).unwrap().len(), 25);
    let good = std::fs::read(path).unwrap();
    let bad = dir.path().join("bad.bin");
    for damage in [
        |b: &mut Vec<u8>| b.truncate(b.len() - 1),
        |b: &mut Vec<u8>| b[0] ^= 1,
        |b: &mut Vec<u8>| b[4] = 2,
        |b: &mut Vec<u8>| b.truncate(100),
    ] {
        let mut b = good.clone();
        damage(&mut b);
        std::fs::write(&bad, &b).unwrap();
        match TokenShard::open(&bad) {
            Err(Error::Shard { path, message }) => {
                assert_eq!(path, bad);
                assert!(!message.is_empty());
            }
            other => panic!("{other:?}"),
        }
    }
    // A vocabulary too large for u16 shards, and an eot that is not there.
    let no_eot = Tokenizer::from_merges::<&str, &str, &str>(&[], &[]).unwrap();
    assert!(matches!(
        write_shards(
            &no_eot,
            &[dir.path().join("x.txt")],
            &dir.path().join("s2"),
            &options
        ),
        Err(Error::Invalid(_))
    ));
}

#[test]
fn invalid_utf8_is_reported_with_file_and_offset() {
    let dir = tempfile::tempdir().unwrap();
    let mut bytes = sample_text::mixed_text(50_000, 9).into_bytes();
    let at = bytes.iter().position(|&b| b == b' ').unwrap() + 30_000;
    let at = (at..).find(|&i| bytes[i] < 0x80).unwrap();
    bytes[at] = 0xC0;
    let path = dir.path().join("bad.txt");
    std::fs::write(&path, &bytes).unwrap();

    for err in [
        train_from_files(&[&path], &quiet(10))
            .map(|_| ())
            .unwrap_err(),
        Tokenizer::from_merges::<&str, &str, &str>(&[], &[])
            .unwrap()
            .encode_file(&path, false, InvalidUtf8::Error)
            .map(|_| ())
            .unwrap_err(),
    ] {
        match &err {
            Error::InvalidUtf8 { path: p, offset } => {
                assert_eq!(p, &path);
                assert_eq!(*offset, at as u64);
            }
            other => panic!("{other:?}"),
        }
        let msg = err.to_string();
        assert!(
            msg.contains("bad.txt") && msg.contains(&at.to_string()),
            "{msg}"
        );
    }

    // Through the byte path it trains and encodes, and decodes back exactly.
    let config = TrainConfig {
        invalid_utf8: InvalidUtf8::Bytes,
        ..quiet(50)
    };
    let (tok, _) = train_from_files(&[&path], &config).unwrap();
    let ids = tok.encode_file(&path, false, InvalidUtf8::Bytes).unwrap();
    assert_eq!(tok.decode_bytes(&ids).unwrap(), bytes);
    assert!(tok.decode(&ids).unwrap().contains('\u{FFFD}'));
    let out = dir.path().join("shards");
    let options = ShardOptions {
        invalid_utf8: InvalidUtf8::Bytes,
        eot_per_document: false,
        val_fraction: 0.0,
        show_progress: false,
        ..ShardOptions::default()
    };
    let report = write_shards(&tok, &[&path], &out, &options).unwrap();
    assert_eq!(report.train_tokens, ids.len() as u64);
}

#[test]
fn unknown_ids_and_missing_files_are_errors() {
    let tok = Tokenizer::from_merges(&[("a", "b")], &["<|endoftext|>"]).unwrap();
    match tok.decode(&[1, 2, 257, 9999]) {
        Err(Error::UnknownId { id, vocab_size }) => {
            assert_eq!((id, vocab_size), (9999, 258));
        }
        other => panic!("{other:?}"),
    }
    assert!(tok.stream_decoder().push(258).is_err());
    assert!(matches!(
        Tokenizer::load("/nonexistent/tokenizer.json"),
        Err(Error::Io { .. })
    ));
    assert!(matches!(
        train_from_files(&["/nonexistent/dir"], &quiet(1)),
        Err(Error::Io { .. })
    ));
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tokenizer.json");
    std::fs::write(&path, "{\"model\": {\"vocab\": 3}}").unwrap();
    match Tokenizer::load(&path) {
        Err(e @ Error::Format { .. }) => {
            let msg = e.to_string();
            assert!(
                msg.contains("tokenizer.json") && msg.contains("model.vocab"),
                "{msg}"
            );
        }
        other => panic!("{other:?}"),
    }
    // A merge whose parts are not tokens yet.
    assert!(matches!(
        Tokenizer::from_merges(&[("ab", "c")], &[""; 0]),
        Err(Error::Invalid(_))
    ));
}
