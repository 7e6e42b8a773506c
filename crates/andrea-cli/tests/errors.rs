//! Mistakes a user can make: each is refused with status 2 and a message saying what
//! was wrong, never a panic.

mod common;

use common::*;

#[test]
fn damaged_checkpoints_are_refused() {
    let tmp = prepared("50");
    let dir = tmp.path();
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
            "2",
        ],
    );
    let ck = dir.join("run/latest");
    let weights = ck.join("model.safetensors");
    let good = bytes(&weights);

    std::fs::write(&weights, &good[..good.len() / 2]).unwrap();
    let err = fails_with(dir, &["generate", "--checkpoint", "run/latest"], "damaged");
    assert!(
        err.contains("model.safetensors") && err.contains("bytes"),
        "{err}"
    );

    let mut flipped = good.clone();
    let i = flipped.len() - 3;
    flipped[i] ^= 0x40;
    std::fs::write(&weights, &flipped).unwrap();
    let err = fails_with(
        dir,
        &["train", "--resume", "run/latest", "--steps", "4"],
        "checksum",
    );
    assert!(err.contains("model.safetensors"), "{err}");

    std::fs::write(&weights, &good).unwrap();
    std::fs::write(ck.join("training_state.json"), "{ not json").unwrap();
    fails_with(
        dir,
        &["eval", "--checkpoint", "run/latest", "--data", "data"],
        "training_state.json",
    );
}

#[test]
fn bad_input_gives_a_clear_error() {
    let tmp = prepared("50");
    let dir = tmp.path();
    let train = ["train", "--config", "tiny.toml", "--data", "data"];
    fails_with(
        dir,
        &[
            "train",
            "--config",
            "missing.toml",
            "--data",
            "data",
            "--out",
            "r",
        ],
        "missing.toml",
    );
    fails_with(
        dir,
        &[
            "train",
            "--config",
            "tiny.toml",
            "--data",
            "nowhere.bin",
            "--out",
            "r",
        ],
        "nowhere.bin",
    );
    std::fs::write(
        dir.join("bad.toml"),
        format!("{TINY}\n[training]\nbach_size = 3\n"),
    )
    .unwrap();
    fails_with(
        dir,
        &[
            "train", "--config", "bad.toml", "--data", "data", "--out", "r",
        ],
        "training",
    );
    std::fs::write(
        dir.join("range.toml"),
        TINY.replace("n_head = 4", "n_head = 3"),
    )
    .unwrap();
    fails_with(
        dir,
        &[
            "train",
            "--config",
            "range.toml",
            "--data",
            "data",
            "--out",
            "r",
        ],
        "model.n_head",
    );
    std::fs::write(dir.join("typo.toml"), TINY.replace("n_head", "n_heads")).unwrap();
    fails_with(
        dir,
        &[
            "train",
            "--config",
            "typo.toml",
            "--data",
            "data",
            "--out",
            "r",
        ],
        "n_heads",
    );
    fails_with(
        dir,
        &[&train[..], &["--out", "r", "--seq-len", "65"]].concat(),
        "context length",
    );
    fails_with(dir, &["train", "--data", "data", "--out", "r"], "--config");
    // Built without the `cuda` feature, --backend cuda says how to build it (with the
    // feature, tests/cuda.rs covers it).
    #[cfg(not(feature = "cuda"))]
    {
        let err = fails_with(
            dir,
            &["--backend", "cuda", "info", "--config", "tiny.toml"],
            "--features cuda",
        );
        assert!(err.contains("--backend cpu"), "{err}");
    }
    fails_with(
        dir,
        &["--precision", "bf16", "info", "--config", "tiny.toml"],
        "only --backend cuda",
    );
    fails_with(dir, &["generate", "--checkpoint", "nope"], "nope");
    std::fs::create_dir(dir.join("empty")).unwrap();
    fails_with(dir, &["tokenizer", "train", "empty"], "empty");

    // A run directory holding a run is not reused without --overwrite.
    ok(dir, &[&train[..], &["--out", "r", "--steps", "1"]].concat());
    fails_with(
        dir,
        &[&train[..], &["--out", "r", "--steps", "1"]].concat(),
        "--overwrite",
    );
    ok(
        dir,
        &[&train[..], &["--out", "r", "--steps", "1", "--overwrite"]].concat(),
    );

    // Shards of another vocabulary.
    ok(
        dir,
        &[
            "tokenizer",
            "train",
            "corpus",
            "--merges",
            "20",
            "--out",
            "other.json",
        ],
    );
    ok(
        dir,
        &[
            "prepare",
            "corpus",
            "--tokenizer",
            "other.json",
            "--out",
            "other",
        ],
    );
    fails_with(
        dir,
        &[
            "eval",
            "--checkpoint",
            "r/latest",
            "--data",
            "other",
            "--seq-len",
            "8",
        ],
        "vocabulary",
    );

    // A prompt longer than the context.
    let long = "word ".repeat(200);
    fails_with(
        dir,
        &["generate", "--checkpoint", "r/latest", "--prompt", &long],
        "context",
    );
}

#[test]
fn a_diverging_run_stops_and_keeps_the_last_checkpoint() {
    let tmp = prepared("50");
    let dir = tmp.path();
    let err = fails_with(
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
            "50",
            "--lr",
            "1e4",
            "--grad-clip",
            "0",
            "--checkpoint-every",
            "1",
        ],
        "not finite",
    );
    assert!(
        err.contains("step ") && err.contains("last good checkpoint"),
        "{err}"
    );
    ok(dir, &["info", "--checkpoint", "run/latest"]);
}
