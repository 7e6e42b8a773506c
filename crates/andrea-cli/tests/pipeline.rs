//! The whole pipeline run as a user runs it: tokenizer, shards, training, evaluation,
//! generation, the demo, benchmarks and help.

mod common;

use common::*;

#[test]
fn tokenizer_prepare_train_eval_generate() {
    let tmp = prepared("50");
    let dir = tmp.path();
    assert!(dir.join("data/data_train_000000.bin").exists());
    assert!(dir.join("data/data_val_000000.bin").exists());
    assert!(dir.join("data/tokenizer.json").exists());

    ok(
        dir,
        &[
            "train",
            "--config",
            "tiny.toml",
            "--data",
            "data",
            "--out",
            "run",
            "--steps",
            "40",
            "--checkpoint-every",
            "10",
            "--keep-checkpoints",
            "2",
        ],
    );
    let kept: Vec<String> = std::fs::read_dir(dir.join("run"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("step-"))
        .collect();
    assert_eq!(kept.len(), 2, "--keep-checkpoints 2 kept {kept:?}");
    let m = metrics(&dir.join("run"));
    assert_eq!(m.len(), 40);
    let first = m[0]["train_loss"].as_f64().unwrap();
    let last = m[39]["train_loss"].as_f64().unwrap();
    assert!(last < first - 0.5, "loss did not fall: {first} -> {last}");
    assert!(m[39]["val_loss"].as_f64().is_some());
    let svg = std::fs::read_to_string(dir.join("run/loss.svg")).unwrap();
    assert!(svg.contains("<polyline"));
    assert!(
        !dir.join("run/.lock").exists(),
        "the run's lock file is removed at its end"
    );

    let latest = dir.join("run/latest");
    for f in [
        "model.safetensors",
        "config.json",
        "tokenizer.json",
        "optimizer.safetensors",
        "training_state.json",
    ] {
        assert!(latest.join(f).exists(), "{f} missing from the checkpoint");
    }
    let config: serde_json::Value =
        serde_json::from_slice(&bytes(latest.join("config.json"))).unwrap();
    assert_eq!(config["vocab_size"], 256 + 50 + 1);

    let out = ok(
        dir,
        &[
            "eval",
            "--checkpoint",
            "run/latest",
            "--data",
            "data/data_val_000000.bin",
            "--batch-size",
            "2",
            "--seq-len",
            "32",
            "--json",
        ],
    );
    let e: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let loss = e["loss"].as_f64().unwrap();
    assert!(loss > 0.0 && loss < (307f64).ln(), "eval loss {loss}");
    assert!((e["perplexity"].as_f64().unwrap() - loss.exp()).abs() < 1e-3 * loss.exp());

    let gen = |seed: &str| {
        let out = ok(
            dir,
            &[
                "generate",
                "--checkpoint",
                "run/latest",
                "--prompt",
                "the model",
                "--max-new-tokens",
                "20",
                "--seed",
                seed,
            ],
        );
        String::from_utf8(out.stdout).unwrap()
    };
    let text = gen("1");
    assert!(
        text.starts_with("the model") && text.len() > "the model".len() + 5,
        "{text:?}"
    );
    assert_eq!(text, gen("1"), "a seed must reproduce the text");

    let out = ok(dir, &["info", "--checkpoint", "run/latest", "--json"]);
    let info: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(info["n_layer"], 2);
    // --grad-accum above 1: the trainer's second gradient buffer is counted.
    let args = [
        "info",
        "--checkpoint",
        "run/latest",
        "--json",
        "--grad-accum",
        "4",
    ];
    let accum: serde_json::Value = serde_json::from_slice(&ok(dir, &args).stdout).unwrap();
    let bytes = |v: &serde_json::Value, k: &str| v["memory_bytes"][k].as_u64().unwrap();
    let grads = bytes(&info, "gradients");
    assert_eq!(bytes(&accum, "gradients"), 2 * grads);
    assert_eq!(bytes(&accum, "total"), bytes(&info, "total") + grads);
}

#[test]
fn demo_trains_and_samples() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    // No configs/ here: the demo uses its built-in copy of configs/tiny.toml.
    let out = ok(
        dir,
        &[
            "demo",
            "--out",
            "demo",
            "--corpus-bytes",
            "60000",
            "--merges",
            "60",
            "--steps",
            "6",
            "--batch-size",
            "2",
            "--seq-len",
            "32",
        ],
    );
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.matches("Once upon a time").count() >= 3, "{text}");
    assert!(dir.join("demo/run/latest/model.safetensors").exists());
    assert!(dir.join("demo/run/loss.svg").exists());
}

#[test]
fn bench_prints_tokens_per_second() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    std::fs::write(dir.join("tiny.toml"), TINY).unwrap();
    for kind in ["train", "decode"] {
        let out = ok(
            dir,
            &[
                "bench",
                kind,
                "--config",
                "tiny.toml",
                "--batch-size",
                "2",
                "--seq-len",
                "32",
                "--steps",
                "2",
                "--warmup",
                "1",
                "--json",
            ],
        );
        let r: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        assert!(r["tokens_per_s"].as_f64().unwrap() > 0.0, "{r}");
    }
}

#[test]
fn bench_train_profile_prints_every_op() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    std::fs::write(dir.join("tiny.toml"), TINY).unwrap();
    let args = [
        "bench",
        "train",
        "--config",
        "tiny.toml",
        "--batch-size",
        "2",
        "--seq-len",
        "16",
        "--steps",
        "2",
        "--warmup",
        "1",
        "--profile",
    ];
    let text = String::from_utf8(ok(dir, &args).stdout).unwrap();
    for op in [
        "matmul",
        "attention_backward",
        "adamw",
        "(outside the ops)",
        "GFLOP/s",
        "GB/s",
    ] {
        assert!(text.contains(op), "no `{op}` in:\n{text}");
    }
    let json = ok(dir, &[&args[..], &["--json"]].concat());
    let r: serde_json::Value = serde_json::from_slice(&json.stdout).unwrap();
    let ops = r["profile"].as_array().unwrap();
    let embedding = ops.iter().find(|o| o["op"] == "embedding").unwrap();
    // One embedding per step, over the 2 timed steps (the warm-up is not counted).
    assert_eq!(embedding["calls"], 2, "{r}");
}

#[test]
fn bench_decode_profile_prints_every_op() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    std::fs::write(dir.join("tiny.toml"), TINY).unwrap();
    // A cache of 8 positions after a 5-token prompt holds 3 steps: the 7 steps refill
    // it twice, and the refills' ops must not be counted.
    let args = [
        "bench",
        "decode",
        "--config",
        "tiny.toml",
        "--seq-len",
        "8",
        "--prompt-len",
        "5",
        "--steps",
        "7",
        "--warmup",
        "2",
        "--profile",
    ];
    let text = String::from_utf8(ok(dir, &args).stdout).unwrap();
    for op in ["matmul", "decode_blocks", "(outside the ops)", "GB/s"] {
        assert!(text.contains(op), "no `{op}` in:\n{text}");
    }
    assert!(
        !text.contains("backward"),
        "a decode runs no backward op:\n{text}"
    );
    let json = ok(dir, &[&args[..], &["--json"]].concat());
    let r: serde_json::Value = serde_json::from_slice(&json.stdout).unwrap();
    let ops = r["profile"].as_array().unwrap();
    let embedding = ops.iter().find(|o| o["op"] == "embedding").unwrap();
    // One embedding per step, over the 7 timed steps (neither the warm-up nor the
    // prompt refills counted).
    assert_eq!(embedding["calls"], 7, "{r}");
}

#[test]
fn every_command_has_help() {
    let tmp = tempfile::tempdir().unwrap();
    for cmd in [
        &["--help"][..],
        &["demo", "--help"],
        &["tokenizer", "train", "--help"],
        &["tokenizer", "encode", "--help"],
        &["tokenizer", "decode", "--help"],
        &["prepare", "--help"],
        &["train", "--help"],
        &["eval", "--help"],
        &["generate", "--help"],
        &["info", "--help"],
        &["bench", "--help"],
    ] {
        let out = ok(tmp.path(), cmd);
        let text = String::from_utf8(out.stdout).unwrap();
        assert!(text.contains("Usage"), "{cmd:?}: {text}");
    }
    fails_with(tmp.path(), &["train", "--stepz", "3"], "--stepz");
}

#[test]
fn tokenizer_encode_decode_json() {
    let tmp = prepared("50");
    let dir = tmp.path();
    let out = ok(
        dir,
        &[
            "tokenizer",
            "encode",
            "--tokenizer",
            "tokenizer.json",
            "--text",
            "the cat sat",
            "--json",
        ],
    );
    let ids: Vec<u32> = serde_json::from_slice(&out.stdout).unwrap();
    assert!(!ids.is_empty() && ids.len() < 11);
    let joined = serde_json::to_string(&ids).unwrap();
    let out = ok(
        dir,
        &[
            "tokenizer",
            "decode",
            "--tokenizer",
            "tokenizer.json",
            "--ids",
            &joined,
            "--json",
        ],
    );
    let text: String = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(text, "the cat sat");
    fails_with(
        dir,
        &[
            "tokenizer",
            "decode",
            "--tokenizer",
            "tokenizer.json",
            "--ids",
            "1,x",
        ],
        "`x`",
    );
}
