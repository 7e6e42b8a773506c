//! Every input format `write_shards` reads gives the same shards for the same documents:
//! text files (one document each), JSON Lines and Parquet, each uncompressed, gzip and
//! zstd; documents separated by `<|endoftext|>` unless asked not to be.

use andrea_tokenizer::{sample_text, train_from_texts, write_shards, ShardOptions, TokenShard};
use andrea_tokenizer::{Error, Tokenizer, TrainConfig};
use std::io::Write;
use std::path::{Path, PathBuf};

/// Documents of varied sizes, with quotes, newlines and non-ASCII text (JSON escapes).
fn documents() -> Vec<String> {
    let text = sample_text::mixed_text(60_000, 3);
    let mut docs = Vec::new();
    let mut rest = text.as_str();
    for (k, len) in [10usize, 5000, 1, 300, 20_000, 77]
        .into_iter()
        .cycle()
        .enumerate()
    {
        if rest.is_empty() || k > 20 {
            break;
        }
        let mut cut = len.min(rest.len());
        while !rest.is_char_boundary(cut) {
            cut += 1;
        }
        docs.push(format!("doc {k}: \"{}\"\n", &rest[..cut]));
        rest = &rest[cut..];
    }
    docs
}

fn tokenizer() -> Tokenizer {
    let config = TrainConfig {
        merges: 200,
        show_progress: false,
        ..TrainConfig::default()
    };
    train_from_texts(&[sample_text::mixed_text(100_000, 1)], &config)
        .unwrap()
        .0
}

fn compress(path: &Path, bytes: &[u8], how: &str) -> PathBuf {
    let out = PathBuf::from(format!("{}.{how}", path.display()));
    let file = std::fs::File::create(&out).unwrap();
    match how {
        "gz" => {
            let mut w = flate2::write::GzEncoder::new(file, flate2::Compression::fast());
            w.write_all(bytes).unwrap();
            w.finish().unwrap();
        }
        _ => {
            // Two frames, as `zstd -c a b` writes: the reader goes on to the second.
            let (a, b) = bytes.split_at(bytes.len() / 2);
            let mut w = file;
            for part in [a, b] {
                let level = ruzstd::encoding::CompressionLevel::Fastest;
                w.write_all(&ruzstd::encoding::compress_to_vec(part, level))
                    .unwrap();
            }
        }
    }
    out
}

fn jsonl(docs: &[String]) -> Vec<u8> {
    let mut out = Vec::new();
    for (i, d) in docs.iter().enumerate() {
        let line = serde_json::json!({"id": i, "content": d, "meta": {"n": i}});
        out.extend_from_slice(line.to_string().as_bytes());
        out.push(b'\n');
        if i == 2 {
            // A blank line and a row without text (null) are no documents.
            out.extend_from_slice(b"\n{\"id\": -1, \"content\": null}\n");
        }
    }
    out
}

/// A Parquet file with an id column and an optional string column `content` (one null),
/// in two row groups, snappy-compressed.
#[cfg(feature = "parquet")]
fn write_parquet(path: &Path, docs: &[String]) {
    write_parquet_as(path, docs, "optional")
}

/// [`write_parquet`] with `content` `optional` or `required` (then without the null).
#[cfg(feature = "parquet")]
fn write_parquet_as(path: &Path, docs: &[String], repetition: &str) {
    use parquet::basic::Compression;
    use parquet::data_type::{ByteArray, ByteArrayType, Int32Type};
    use parquet::file::properties::WriterProperties;
    use parquet::file::writer::SerializedFileWriter;
    use std::sync::Arc;
    let schema = parquet::schema::parser::parse_message_type(&format!(
        "message doc {{ required int32 id; {repetition} binary content (UTF8); }}"
    ))
    .unwrap();
    let props = WriterProperties::builder()
        .set_compression(Compression::SNAPPY)
        .build();
    let file = std::fs::File::create(path).unwrap();
    let mut writer = SerializedFileWriter::new(file, Arc::new(schema), Arc::new(props)).unwrap();
    let half = docs.len() / 2;
    for group in [&docs[..half], &docs[half..]] {
        let mut rg = writer.next_row_group().unwrap();
        let mut col = rg.next_column().unwrap().unwrap();
        let rows = group.len() + usize::from(repetition == "optional");
        let ids: Vec<i32> = (0..rows as i32).collect();
        col.typed::<Int32Type>()
            .write_batch(&ids, None, None)
            .unwrap();
        col.close().unwrap();
        let mut col = rg.next_column().unwrap().unwrap();
        let values: Vec<ByteArray> = group.iter().map(|d| ByteArray::from(d.as_str())).collect();
        // A null first, then every document.
        let mut defs = vec![0i16];
        defs.extend(std::iter::repeat_n(1, group.len()));
        let defs = (repetition == "optional").then_some(&defs[..]);
        col.typed::<ByteArrayType>()
            .write_batch(&values, defs, None)
            .unwrap();
        col.close().unwrap();
        rg.close().unwrap();
    }
    writer.close().unwrap();
}

/// The train tokens `write_shards` makes of `inputs`.
fn tokens(tok: &Tokenizer, inputs: &[PathBuf], out: &Path, options: &ShardOptions) -> Vec<u16> {
    let report = write_shards(tok, inputs, out, options).unwrap();
    assert_eq!(report.val_tokens, 0);
    report
        .train_shards
        .iter()
        .flat_map(|p| TokenShard::open(p).unwrap().tokens().to_vec())
        .collect()
}

#[test]
fn every_format_compressed_or_not_gives_the_same_tokens() {
    let tok = tokenizer();
    let eot = tok.eot_id().unwrap();
    let docs = documents();
    let mut want = Vec::new();
    for d in &docs {
        want.push(eot as u16);
        want.extend(tok.encode_with_special_tokens(d).iter().map(|&t| t as u16));
    }
    let dir = tempfile::tempdir().unwrap();
    let options = ShardOptions {
        val_fraction: 0.0,
        show_progress: false,
        text_field: "content".into(),
        ..ShardOptions::default()
    };
    let mut cases: Vec<(String, Vec<PathBuf>)> = Vec::new();
    for how in ["", "gz", "zst"] {
        // Text: one file per document, in name order.
        let text = dir.path().join(format!("text-{how}"));
        std::fs::create_dir(&text).unwrap();
        for (i, d) in docs.iter().enumerate() {
            let p = text.join(format!("{i:03}.txt"));
            if how.is_empty() {
                std::fs::write(&p, d).unwrap();
            } else {
                compress(&p, d.as_bytes(), how);
            }
        }
        cases.push((format!("text {how}"), vec![text]));
        let p = dir.path().join(format!("docs-{how}.jsonl"));
        let path = if how.is_empty() {
            std::fs::write(&p, jsonl(&docs)).unwrap();
            p
        } else {
            compress(&p, &jsonl(&docs), how)
        };
        cases.push((format!("jsonl {how}"), vec![path]));
        #[cfg(feature = "parquet")]
        {
            let p = dir.path().join(format!("docs-{how}.parquet"));
            write_parquet(&p, &docs);
            let path = if how.is_empty() {
                p
            } else {
                let c = compress(&p, &std::fs::read(&p).unwrap(), how);
                std::fs::remove_file(&p).unwrap();
                c
            };
            cases.push((format!("parquet {how}"), vec![path]));
        }
    }
    for (i, (name, inputs)) in cases.iter().enumerate() {
        let got = tokens(&tok, inputs, &dir.path().join(format!("out{i}")), &options);
        assert!(
            got == want,
            "{name}: {} tokens, want {}",
            got.len(),
            want.len()
        );
    }
    // Without separators: the same documents' tokens, no <|endoftext|>.
    let plain = ShardOptions {
        eot_per_document: false,
        ..options.clone()
    };
    let got = tokens(&tok, &cases[1].1, &dir.path().join("no-eot"), &plain);
    let without: Vec<u16> = want.iter().copied().filter(|&t| t != eot as u16).collect();
    assert_eq!(got, without);
}

#[test]
fn a_missing_or_wrong_field_is_named() {
    let tok = tokenizer();
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("a.jsonl");
    std::fs::write(&p, "{\"text\": \"hello\"}\n{\"body\": \"x\", \"id\": 1}\n").unwrap();
    let options = ShardOptions {
        show_progress: false,
        val_fraction: 0.0,
        ..ShardOptions::default()
    };
    let err = write_shards(&tok, &[&p], &dir.path().join("o"), &options).unwrap_err();
    let msg = err.to_string();
    assert!(matches!(err, Error::Invalid(_)), "{msg}");
    assert!(
        msg.contains("line 2") && msg.contains("body, id") && msg.contains("--text-field"),
        "{msg}"
    );
    std::fs::write(&p, "{\"text\": 5}\n").unwrap();
    let msg = write_shards(&tok, &[&p], &dir.path().join("o"), &options)
        .unwrap_err()
        .to_string();
    assert!(msg.contains("not a string"), "{msg}");
    std::fs::write(&p, "not json\n").unwrap();
    let msg = write_shards(&tok, &[&p], &dir.path().join("o"), &options)
        .unwrap_err()
        .to_string();
    assert!(msg.contains("line 1") && msg.contains("not JSON"), "{msg}");
    #[cfg(feature = "parquet")]
    {
        let q = dir.path().join("a.parquet");
        write_parquet(&q, &["x".to_string(), "y".to_string()]);
        let msg = write_shards(&tok, &[&q], &dir.path().join("o"), &options)
            .unwrap_err()
            .to_string();
        assert!(
            msg.contains("no column \"text\"") && msg.contains("content"),
            "{msg}"
        );
    }
}

/// The validation split of a JSON Lines file gives whole documents to val: the first
/// documents, about the fraction of the file's bytes.
#[test]
fn documents_go_whole_to_one_side_of_the_split() {
    let tok = tokenizer();
    let eot = tok.eot_id().unwrap() as u16;
    let dir = tempfile::tempdir().unwrap();
    let docs: Vec<String> = (0..200)
        .map(|i| format!("document number {i} says hello."))
        .collect();
    let p = dir.path().join("a.jsonl");
    std::fs::write(&p, jsonl(&docs)).unwrap();
    let options = ShardOptions {
        show_progress: false,
        val_fraction: 0.25,
        text_field: "content".into(),
        ..ShardOptions::default()
    };
    let report = write_shards(&tok, &[&p], &dir.path().join("o"), &options).unwrap();
    let read = |p: &PathBuf| TokenShard::open(p).unwrap().tokens().to_vec();
    let (val, train) = (read(&report.val_shards[0]), read(&report.train_shards[0]));
    let count = |t: &[u16]| t.iter().filter(|&&x| x == eot).count();
    assert_eq!(val[0], eot);
    assert_eq!(train[0], eot);
    assert_eq!(count(&val) + count(&train), 200);
    assert!(
        (40..60).contains(&count(&val)),
        "{} documents in val",
        count(&val)
    );
}

/// A required (non-nullable) string column reads as an optional one does.
#[cfg(feature = "parquet")]
#[test]
fn a_required_parquet_column_reads_the_same() {
    let tok = tokenizer();
    let docs = documents();
    let dir = tempfile::tempdir().unwrap();
    let options = ShardOptions {
        val_fraction: 0.0,
        show_progress: false,
        text_field: "content".into(),
        ..ShardOptions::default()
    };
    let (a, b) = (dir.path().join("a.parquet"), dir.path().join("b.parquet"));
    write_parquet_as(&a, &docs, "optional");
    write_parquet_as(&b, &docs, "required");
    let ta = tokens(&tok, &[a], &dir.path().join("oa"), &options);
    let tb = tokens(&tok, &[b], &dir.path().join("ob"), &options);
    assert!(!ta.is_empty() && ta == tb);
}

/// A tokenizer learned from JSON Lines learns from the documents' text, not the JSON:
/// the same merges as from the documents as text files.
#[test]
fn tokenizers_learn_the_same_from_json_lines_as_from_text_files() {
    let docs = documents();
    let dir = tempfile::tempdir().unwrap();
    let text = dir.path().join("text");
    std::fs::create_dir(&text).unwrap();
    for (i, d) in docs.iter().enumerate() {
        std::fs::write(text.join(format!("{i:03}.txt")), d).unwrap();
    }
    let jsonl_gz = compress(&dir.path().join("d.jsonl"), &jsonl(&docs), "gz");
    let config = TrainConfig {
        merges: 150,
        show_progress: false,
        text_field: "content".into(),
        ..TrainConfig::default()
    };
    let (a, _) = andrea_tokenizer::train_from_files(&[text], &config).unwrap();
    let (b, _) = andrea_tokenizer::train_from_files(&[jsonl_gz], &config).unwrap();
    assert!(a.to_json_string() == b.to_json_string(), "different merges");
}
