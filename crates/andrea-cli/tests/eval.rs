//! `andrea eval` and the training log agree: with the run's batch shape and the windows
//! the log read, the same loss; bits per byte and tokens reported beside it.

mod common;

use common::*;

fn eval_json(dir: &std::path::Path, extra: &[&str]) -> serde_json::Value {
    let args = [
        &[
            "eval",
            "--checkpoint",
            "run/latest",
            "--data",
            "data",
            "--json",
        ][..],
        extra,
    ]
    .concat();
    serde_json::from_slice(&ok(dir, &args).stdout).unwrap()
}

#[test]
fn eval_reads_what_the_log_reads_and_reports_bits_per_byte() {
    let tmp = prepared("50");
    let dir = tmp.path();
    let train = [
        TRAIN_TINY,
        &["--out", "run", "--steps", "20", "--eval-batches", "3"],
    ]
    .concat();
    let log = String::from_utf8_lossy(&ok(dir, &train).stderr).into_owned();
    assert!(log.contains("validation: the first 3 of the"), "{log}");
    let logged = metrics(&dir.join("run")).last().unwrap()["val_loss"]
        .as_f64()
        .unwrap();
    // The run's shape (4 x 32) by default; its first 3 windows: the logged figure.
    let same = eval_json(dir, &["--windows", "3"]);
    assert_eq!(
        (same["batch_size"].as_u64(), same["seq_len"].as_u64()),
        (Some(4), Some(32))
    );
    assert_eq!(same["tokens"], 3 * 4 * 32);
    let loss = same["loss"].as_f64().unwrap();
    assert!(
        (loss - logged).abs() <= 1e-6 * logged,
        "eval {loss} vs log {logged}"
    );
    // Bits per byte: the loss in bits per token times tokens per byte.
    let (tokens, bytes) = (
        same["tokens"].as_f64().unwrap(),
        same["bytes"].as_f64().unwrap(),
    );
    assert!(
        bytes > tokens && bytes < 8.0 * tokens,
        "{bytes} bytes for {tokens} tokens"
    );
    let bpb = loss * tokens / (bytes * std::f64::consts::LN_2);
    assert!((same["bits_per_byte"].as_f64().unwrap() - bpb).abs() < 1e-9);
    // By default every window, and the text says how that relates to the log.
    let all = eval_json(dir, &[]);
    assert!(all["windows"].as_u64().unwrap() > 3, "{all}");
    let args = ["eval", "--checkpoint", "run/latest", "--data", "data"];
    let text = String::from_utf8_lossy(&ok(dir, &args).stdout).into_owned();
    assert!(
        text.contains("bits per byte") && text.contains("--windows 3 reads the same"),
        "{text}"
    );
}

#[test]
fn eval_reads_the_runs_validation_data_by_default() {
    let tmp = prepared("50");
    let dir = tmp.path();
    ok(
        dir,
        &[TRAIN_TINY, &["--out", "run", "--steps", "2"]].concat(),
    );
    let given = eval_json(dir, &[]);
    let args = ["eval", "--checkpoint", "run/latest", "--json"];
    let out = ok(dir, &args);
    let recorded: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(recorded["loss"], given["loss"]);
    assert_eq!(recorded["windows"], given["windows"]);
    let note = String::from_utf8_lossy(&out.stderr);
    assert!(
        note.contains("evaluating on data, the run's validation data"),
        "{note}"
    );

    // Run from elsewhere, the recorded relative path names nothing.
    std::fs::create_dir(dir.join("elsewhere")).unwrap();
    let from_elsewhere = ["eval", "--checkpoint", "../run/latest"];
    fails_with(
        &dir.join("elsewhere"),
        &from_elsewhere,
        "validated on data, which is not there from this directory",
    );

    // A run without validation data recorded none.
    let no_val = [
        &prepare_args("train-only", "data")[..],
        &["--val-fraction", "0"],
    ]
    .concat();
    ok(dir, &no_val);
    let train = [
        "train",
        "--config",
        "tiny.toml",
        "--data",
        "train-only",
        "--out",
        "run2",
        "--steps",
        "1",
    ];
    ok(dir, &train);
    let err = fails_with(
        dir,
        &["eval", "--checkpoint", "run2/latest"],
        "recorded no validation data",
    );
    assert!(err.contains("pass --data"), "{err}");

    // A model without a training state (as transformers saves one) has no run to ask.
    std::fs::create_dir(dir.join("bare")).unwrap();
    for f in ["model.safetensors", "config.json", "tokenizer.json"] {
        std::fs::copy(dir.join("run/latest").join(f), dir.join("bare").join(f)).unwrap();
    }
    fails_with(
        dir,
        &["eval", "--checkpoint", "bare"],
        "has no training state, so no run recorded the data",
    );
}
