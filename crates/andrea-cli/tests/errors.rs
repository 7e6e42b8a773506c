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
    // BF16 on the CPU is for generation; training says what the CPU lacks.
    fails_with(
        dir,
        &["--precision", "bf16", "info", "--config", "tiny.toml"],
        "for generation",
    );
    let err = fails_with(
        dir,
        &[&train[..], &["--out", "r", "--precision", "bf16"]].concat(),
        "AMX-BF16",
    );
    assert!(err.contains("drop --precision"), "{err}");
    fails_with(
        dir,
        &["--precision", "tf32", "info", "--config", "tiny.toml"],
        "TF32 is a CUDA tensor-core format",
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
    // With a checkpoint every step, the message names the last good one; with none
    // written yet, it says so (it used to name one that did not exist).
    for (every, names) in [
        ("1", "last good checkpoint"),
        ("0", "no checkpoint was written"),
    ] {
        let out = format!("run-{every}");
        let diverge = ["--steps", "50", "--lr", "1e4", "--grad-clip", "0"];
        let err = fails_with(
            dir,
            &[
                TRAIN_TINY,
                &diverge,
                &["--out", &out, "--checkpoint-every", every],
            ]
            .concat(),
            "not finite",
        );
        assert!(err.contains("step ") && err.contains(names), "{err}");
    }
    assert!(!dir.join("run-0/latest").exists());
    ok(dir, &["info", "--checkpoint", "run-1/latest"]);
}

#[test]
fn a_second_run_on_the_same_out_is_refused_and_the_first_survives_a_kill() {
    let tmp = prepared("50");
    let dir = tmp.path();
    let mut first = std::process::Command::new(binary())
        .current_dir(dir)
        .args(TRAIN_TINY)
        .args([
            "--out",
            "run",
            "--steps",
            "1000000",
            "--checkpoint-every",
            "2",
        ])
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let pid = first.id().to_string();
    wait_for("the first run's checkpoint", || {
        dir.join("run/latest/training_state.json").exists()
    });
    for args in [
        &[TRAIN_TINY, &["--out", "run", "--overwrite"]].concat()[..],
        &["train", "--resume", "run/latest", "--steps", "1000001"][..],
    ] {
        let err = fails_with(dir, args, "in use");
        assert!(err.contains(&pid), "the holder's pid {pid} in: {err}");
        assert!(err.contains("--out"), "{err}");
    }
    first.kill().unwrap();
    first.wait().unwrap();
    // The run directory is intact: its newest checkpoint loads and resumes (the kernel
    // released the lock with the killed process).
    ok(dir, &["info", "--checkpoint", "run/latest"]);
    let names = file_names(&dir.join("run"));
    // The kill may land between a checkpoint's rename and the relinking of `latest`:
    // `run/latest` then still names the one before, and resolves to the newest.
    let step: u64 = names
        .iter()
        .filter(|n| {
            dir.join("run")
                .join(n)
                .join("training_state.json")
                .is_file()
        })
        .filter_map(|n| n.strip_prefix("step-")?.parse().ok())
        .max()
        .unwrap();
    ok(
        dir,
        &[
            "train",
            "--resume",
            "run/latest",
            "--steps",
            &(step + 1).to_string(),
        ],
    );
    // The resume cleared what the kill left half-written.
    let after = file_names(&dir.join("run"));
    assert!(
        !after.iter().any(|n| n.starts_with(".tmp-")),
        "{names:?} -> {after:?}"
    );
}

/// A tiny run in `run/` with checkpoints at steps 2 and 4.
fn run_with_checkpoints_at_2_and_4() -> tempfile::TempDir {
    let tmp = prepared("50");
    let train = [TRAIN_TINY, &["--out", "run"]].concat();
    ok(
        tmp.path(),
        &[&train[..], &["--steps", "4", "--checkpoint-every", "2"]].concat(),
    );
    tmp
}

#[test]
fn resuming_from_an_older_checkpoint_does_not_overwrite_newer_ones() {
    let tmp = run_with_checkpoints_at_2_and_4();
    let dir = tmp.path();
    let newer = bytes(dir.join("run/step-00000004/model.safetensors"));
    let err = fails_with(
        dir,
        &["train", "--resume", "run/step-00000002", "--steps", "6"],
        "newer checkpoint",
    );
    assert!(err.contains("--overwrite"), "{err}");
    assert_eq!(
        bytes(dir.join("run/step-00000004/model.safetensors")),
        newer
    );
    // Into another --out, the old run stays as it is; --overwrite drops the newer
    // ones and goes on from step 2.
    let resume_old = ["train", "--resume", "run/step-00000002", "--steps", "3"];
    ok(dir, &[&resume_old[..], &["--out", "branch"]].concat());
    assert_eq!(
        bytes(dir.join("run/step-00000004/model.safetensors")),
        newer
    );
    ok(dir, &[&resume_old[..], &["--overwrite"]].concat());
    assert!(!dir.join("run/step-00000004").exists());
    assert!(dir.join("run/step-00000003").is_dir());
}

/// A kill after a checkpoint is renamed into place but before `latest` is relinked
/// leaves `latest` one checkpoint behind: `--resume run/latest` continues from the
/// newest complete checkpoint instead of refusing with "newer checkpoints".
#[cfg(unix)]
#[test]
fn latest_left_behind_by_a_kill_resolves_to_the_newest_checkpoint() {
    let tmp = run_with_checkpoints_at_2_and_4();
    let dir = tmp.path();
    let newest = bytes(dir.join("run/step-00000004/model.safetensors"));
    std::fs::remove_file(dir.join("run/latest")).unwrap();
    std::os::unix::fs::symlink("step-00000002", dir.join("run/latest")).unwrap();
    // From step 2 this would be refused (step 4 is newer); from step 4 it runs one step.
    ok(dir, &["train", "--resume", "run/latest", "--steps", "5"]);
    assert_eq!(
        bytes(dir.join("run/step-00000004/model.safetensors")),
        newest
    );
    assert_eq!(
        std::fs::read_link(dir.join("run/latest")).unwrap(),
        std::path::Path::new("step-00000005")
    );
    // A `latest` naming nothing that exists (a kill while `--overwrite` removed the
    // newer checkpoints) also resolves to the newest.
    std::fs::remove_file(dir.join("run/latest")).unwrap();
    std::os::unix::fs::symlink("step-00000009", dir.join("run/latest")).unwrap();
    ok(dir, &["train", "--resume", "run/latest", "--steps", "6"]);
    assert!(dir.join("run/step-00000006/training_state.json").is_file());
}

#[test]
fn overwrite_deletes_only_the_runs_own_files() {
    let tmp = prepared("50");
    let dir = tmp.path();
    let train = [TRAIN_TINY, &["--out", "run"]].concat();
    ok(dir, &[&train[..], &["--steps", "1"]].concat());
    std::fs::create_dir_all(dir.join("run/step-notes")).unwrap();
    std::fs::write(dir.join("run/step-notes/keep.txt"), "mine").unwrap();
    std::fs::create_dir_all(dir.join("run/step-00000099")).unwrap();
    std::fs::write(dir.join("run/step-00000099/keep.txt"), "mine").unwrap();
    ok(
        dir,
        &[
            &train[..],
            &["--steps", "1", "--overwrite", "--keep-checkpoints", "1"],
        ]
        .concat(),
    );
    assert!(dir.join("run/step-notes/keep.txt").exists());
    assert!(dir.join("run/step-00000099/keep.txt").exists());
    assert!(dir.join("run/step-00000001/training_state.json").exists());
}

#[test]
fn shards_are_chosen_by_their_exact_names() {
    let tmp = prepared("50");
    let dir = tmp.path();
    // Prefixes that hold the other split's word: each directory's train and val shards
    // must still be told apart.
    for prefix in ["retrain", "interval", "my_val_x"] {
        let d = format!("d-{prefix}");
        let prep = ok(dir, &prepare_args(&d, prefix));
        let report = String::from_utf8_lossy(&prep.stderr).into_owned();
        let (train_tokens, val_tokens) = (
            count_before(&report, "train tokens"),
            count_before(&report, "val tokens"),
        );
        let run = format!("r-{prefix}");
        let out = ok(
            dir,
            &[
                "train",
                "--config",
                "tiny.toml",
                "--data",
                &d,
                "--out",
                &run,
                "--steps",
                "1",
            ],
        );
        let log = String::from_utf8_lossy(&out.stderr).into_owned();
        assert_eq!(count_before(&log, "training tokens"), train_tokens, "{log}");
        let ev = ok(
            dir,
            &[
                "eval",
                "--checkpoint",
                &format!("{run}/latest"),
                "--data",
                &d,
                "--seq-len",
                "8",
                "--batch-size",
                "1",
                "--json",
            ],
        );
        let v: serde_json::Value = serde_json::from_slice(&ev.stdout).unwrap();
        let evaluated = v["tokens"].as_u64().unwrap();
        assert!(
            evaluated <= val_tokens && evaluated + 8 >= val_tokens,
            "{prefix}: evaluated {evaluated} of {val_tokens} val tokens"
        );
    }
    // Shards of two prefixes in one directory without a manifest (copied there by
    // hand: `prepare` replaces a set whole): ambiguous.
    ok(dir, &prepare_args("other", "other"));
    std::fs::remove_file(dir.join("data/manifest.json")).unwrap();
    for name in file_names(&dir.join("other")) {
        if name.starts_with("other_") {
            std::fs::copy(dir.join("other").join(&name), dir.join("data").join(&name)).unwrap();
        }
    }
    let err = fails_with(
        dir,
        &[TRAIN_TINY, &["--out", "amb", "--steps", "1"]].concat(),
        "ambiguous",
    );
    assert!(err.contains("data_*") && err.contains("other_*"), "{err}");
    fails_with(
        dir,
        &["eval", "--checkpoint", "r-retrain/latest", "--data", "data"],
        "ambiguous",
    );
}

#[test]
fn a_shard_prefix_cannot_leave_the_output_directory() {
    let tmp = prepared("50");
    let dir = tmp.path();
    std::fs::create_dir(dir.join("inner")).unwrap();
    let outside = dir.join("escaped");
    for prefix in ["../escaped", "/tmp/escaped", "..", "", "a/b"] {
        fails_with(dir, &prepare_args("inner/x", prefix), "--prefix");
    }
    assert!(file_names(&dir.join("inner")).is_empty());
    assert!(!outside.exists() && !dir.join("escaped_train_000000.bin").exists());
}

#[test]
fn token_ids_outside_the_vocabulary_are_found_when_the_shard_is_opened() {
    let tmp = prepared("50");
    let dir = tmp.path();
    let shard = dir.join("data/data_train_000000.bin");
    let mut b = bytes(&shard);
    // The last token: its batch would come last.
    let n = b.len();
    b[n - 2..].copy_from_slice(&60000u16.to_le_bytes());
    std::fs::write(&shard, &b).unwrap();
    let err = fails_with(
        dir,
        &[TRAIN_TINY, &["--out", "run", "--steps", "1"]].concat(),
        "60000",
    );
    assert!(err.contains("data_train_000000.bin"), "{err}");
    assert!(!dir.join("run/metrics.jsonl").exists(), "{err}");
}

/// `andrea` must refuse within a few seconds (no hang on a pipe, no endless read).
fn refuses_quickly(dir: &std::path::Path, args: &[&str], needle: &str) -> String {
    refused(args, andrea_within(dir, args, 60), needle)
}

fn edit_state(dir: &std::path::Path, edit: impl FnOnce(&mut serde_json::Value)) {
    let path = dir.join("run/latest/training_state.json");
    let mut state: serde_json::Value = serde_json::from_slice(&bytes(&path)).unwrap();
    edit(&mut state);
    std::fs::write(&path, serde_json::to_vec_pretty(&state).unwrap()).unwrap();
}

#[test]
fn the_checkpoint_manifest_is_not_trusted() {
    let tmp = trained("50");
    let dir = tmp.path();
    let state_path = dir.join("run/latest/training_state.json");
    let good_state = bytes(&state_path);
    let weights = dir.join("run/latest/model.safetensors");
    let good_weights = bytes(&weights);
    // Damaged weights, and a manifest that would no longer check them.
    let mut flipped = good_weights.clone();
    let i = flipped.len() - 5;
    flipped[i] ^= 0x10;
    std::fs::write(&weights, &flipped).unwrap();
    let generate = [
        "generate",
        "--checkpoint",
        "run/latest",
        "--max-new-tokens",
        "2",
    ];
    type Edit = Box<dyn Fn(&mut serde_json::Value)>;
    let edits: Vec<(&str, Edit)> = vec![
        (
            "empty list",
            Box::new(|s| s["files"] = serde_json::json!([])),
        ),
        (
            "partial list",
            Box::new(|s| {
                let files = s["files"].as_array_mut().unwrap();
                files.retain(|f| f["name"] != "model.safetensors");
            }),
        ),
        (
            "twice",
            Box::new(|s| {
                let files = s["files"].as_array_mut().unwrap();
                let first = files[1].clone();
                files.push(first);
            }),
        ),
    ];
    for (what, edit) in edits {
        std::fs::write(&state_path, &good_state).unwrap();
        edit_state(dir, edit);
        let err = refuses_quickly(dir, &generate, "damaged");
        assert!(err.contains("exactly once"), "{what}: {err}");
    }
    // Names outside the checkpoint are refused before anything is opened.
    std::fs::write(&weights, &good_weights).unwrap();
    for name in [
        "../../../../etc/passwd",
        "/dev/zero",
        "sub/../model.safetensors",
    ] {
        std::fs::write(&state_path, &good_state).unwrap();
        edit_state(dir, |s| {
            s["files"]
                .as_array_mut()
                .unwrap()
                .push(serde_json::json!({"name": name, "bytes": 1, "fnv1a64": "0"}))
        });
        let err = refuses_quickly(dir, &generate, "not a file of a checkpoint");
        assert!(err.contains(name), "{err}");
    }
    std::fs::write(&state_path, &good_state).unwrap();
    ok(dir, &generate);
    // Only regular files are read: a pipe under a checkpoint's file name would hang.
    let plain = plain_model(dir);
    std::fs::remove_file(&weights).unwrap();
    mkfifo(&weights);
    refuses_quickly(dir, &generate, "not a regular file");
    std::fs::remove_file(plain.join("config.json")).unwrap();
    mkfifo(&plain.join("config.json"));
    refuses_quickly(
        dir,
        &["generate", "--checkpoint", "plain", "--max-new-tokens", "2"],
        "not a regular file",
    );
}

fn mkfifo(path: &std::path::Path) {
    let st = std::process::Command::new("mkfifo")
        .arg(path)
        .status()
        .unwrap();
    assert!(st.success());
}

#[test]
fn sizes_a_user_controls_are_refused_not_crashed_on() {
    let tmp = trained("50");
    let dir = tmp.path();
    let huge = u64::MAX.to_string();
    // Flags: refused by the parser with the range.
    for args in [
        vec!["tokenizer", "train", "corpus", "--merges", "4000000000"],
        vec!["demo", "--out", "d", "--corpus-bytes", &huge],
        vec!["--threads", "5000", "info", "--config", "tiny.toml"],
        vec!["info", "--config", "tiny.toml", "--batch-size", &huge],
        vec![
            "eval",
            "--checkpoint",
            "run/latest",
            "--data",
            "data",
            "--batch-size",
            &huge,
        ],
        vec![
            "bench",
            "train",
            "--config",
            "tiny.toml",
            "--batch-size",
            &huge,
        ],
        vec!["train", "--resume", "run/latest", "--batch-size", &huge],
        vec!["train", "--resume", "run/latest", "--grad-accum", &huge],
    ] {
        let err = refuses_quickly(dir, &args, "range");
        assert!(err.contains("..="), "{err}");
    }
    // More threads than the machine can use: refused with the number to use.
    refuses_quickly(
        dir,
        &["--threads", "1000", "info", "--config", "tiny.toml"],
        "--threads",
    );
    // Config sizes, in TOML and in a transformers config.json.
    for (key, value, needle) in [
        ("d_model = 32", "d_model = 1099511627776", "model.d_model"),
        ("n_layer = 2", "n_layer = 100000000", "model.n_layer"),
        (
            "context_length = 64",
            "context_length = 18446744073709551615",
            "context_length",
        ),
        ("d_model = 32", "d_model = 4194304", "parameters"),
    ] {
        std::fs::write(dir.join("big.toml"), TINY.replace(key, value)).unwrap();
        refuses_quickly(dir, &["info", "--config", "big.toml"], needle);
        refuses_quickly(
            dir,
            &[
                "train", "--config", "big.toml", "--data", "data", "--out", "big",
            ],
            needle,
        );
    }
    // Each size within its bound, their product not: refused before it is computed.
    std::fs::write(
        dir.join("wide.toml"),
        TINY.replace("vocab_size = 8449", "vocab_size = 1073741824")
            .replace("context_length = 64", "context_length = 1048576")
            .replace("d_model = 32", "d_model = 4")
            .replace("n_layer = 2", "n_layer = 1"),
    )
    .unwrap();
    for cmd in [&["info"][..], &["bench", "train"][..]] {
        let args = [cmd, &["--config", "wide.toml", "--batch-size", "65536"]].concat();
        refuses_quickly(dir, &args, "activations");
    }
    // Within the limits, but not within this machine: refused before allocating.
    std::fs::write(
        dir.join("big.toml"),
        TINY.replace("d_model = 32", "d_model = 16384")
            .replace("n_layer = 2", "n_layer = 48"),
    )
    .unwrap();
    let err = refuses_quickly(
        dir,
        &[
            "train", "--config", "big.toml", "--data", "data", "--out", "big",
        ],
        "memory",
    );
    assert!(err.contains("GiB") && err.contains("--batch-size"), "{err}");
    let plain = plain_model(dir);
    let config: serde_json::Value =
        serde_json::from_slice(&bytes(plain.join("config.json"))).unwrap();
    let generate = ["generate", "--checkpoint", "plain", "--max-new-tokens", "2"];
    for (key, value, needle) in [
        ("n_embd", serde_json::json!(u64::MAX), "model.d_model"),
        ("n_embd", serde_json::json!(1u64 << 40), "model.d_model"),
        (
            "n_positions",
            serde_json::json!(1u64 << 62),
            "context_length",
        ),
        ("n_layer", serde_json::json!(1u64 << 30), "model.n_layer"),
        // Plausible sizes next to a small weights file: the tensors are checked
        // against the config before the model's memory is allocated.
        ("n_layer", serde_json::json!(4000), "tensor"),
        ("n_embd", serde_json::json!(16384), "tensor"),
    ] {
        let mut c = config.clone();
        c[key] = value;
        if key == "n_embd" {
            c["n_inner"] = serde_json::Value::Null;
        }
        std::fs::write(plain.join("config.json"), c.to_string()).unwrap();
        let err = refuses_quickly(dir, &generate, needle);
        assert!(
            err.contains("config.json") || err.contains("model.safetensors"),
            "{err}"
        );
        if needle != "tensor" {
            refuses_quickly(dir, &["info", "--checkpoint", "plain"], needle);
        }
    }
}

#[test]
fn wrong_results_are_refused_not_returned() {
    let tmp = trained("50");
    let dir = tmp.path();
    // --top-p outside (0, 1] (or NaN) no longer means "every token".
    for p in ["--top-p=2", "--top-p=NaN", "--top-p=0", "--top-p=-1"] {
        fails_with(
            dir,
            &["generate", "--checkpoint", "run/latest", p],
            "--top-p",
        );
    }
    // A data position outside the data.
    edit_state(dir, |s| {
        s["data_position"]["offset"] = serde_json::json!(1u64 << 40)
    });
    fails_with(
        dir,
        &["train", "--resume", "run/latest", "--steps", "3"],
        "data position",
    );
    edit_state(dir, |s| {
        s["data_position"] = serde_json::json!({"shard": 7, "offset": 0})
    });
    fails_with(
        dir,
        &["train", "--resume", "run/latest", "--steps", "3"],
        "data position",
    );
    // NaN weights: refused by name when loaded, not printed as "!!!!!" with status 0.
    let plain = plain_model(dir);
    let weights = plain.join("model.safetensors");
    let mut w = bytes(&weights);
    let n = w.len();
    w[n - 4..].copy_from_slice(&f32::NAN.to_le_bytes());
    std::fs::write(&weights, &w).unwrap();
    for args in [
        &["generate", "--checkpoint", "plain", "--max-new-tokens", "4"][..],
        &[
            "eval",
            "--checkpoint",
            "plain",
            "--data",
            "data",
            "--seq-len",
            "8",
        ][..],
    ] {
        let err = fails_with(dir, args, "non-finite");
        assert!(!err.contains("--lr"), "{err}");
    }
    // --min-frequency beyond i64: no pair is that frequent (it used to wrap to 1).
    let tokenizer_20 = ["tokenizer", "train", "corpus", "--merges", "20"];
    let min = [
        "--min-frequency",
        "9223372036854775808",
        "--out",
        "none.json",
    ];
    ok(dir, &[&tokenizer_20[..], &min].concat());
    let tok: serde_json::Value = serde_json::from_slice(&bytes(dir.join("none.json"))).unwrap();
    let merges = tok["model"]["merges"].as_array().unwrap();
    assert!(merges.is_empty(), "{} merges learned", merges.len());
}

#[test]
fn messages_name_the_real_cause() {
    let tmp = prepared("50");
    let dir = tmp.path();
    // A bad --lr is a bad --lr, not a bad --min-lr.
    for lr in ["--lr=nan", "--lr=inf", "--lr=-1"] {
        let err = fails_with(
            dir,
            &[TRAIN_TINY, &["--out", "r", lr]].concat(),
            "--lr must",
        );
        assert!(!err.contains("--min-lr"), "{err}");
    }
    // A missing --data is reported as that, not as a missing tokenizer.json.
    let err = fails_with(
        dir,
        &["train", "--config", "tiny.toml", "--out", "r"],
        "--data",
    );
    assert!(!err.contains("tokenizer.json"), "{err}");
    // Invalid UTF-8: a fix the user can apply, not a Rust name.
    std::fs::create_dir(dir.join("latin1")).unwrap();
    std::fs::write(dir.join("latin1/a.txt"), b"caf\xe9 au lait").unwrap();
    let err = fails_with(dir, &["tokenizer", "train", "latin1"], "UTF-8");
    assert!(!err.contains("InvalidUtf8"), "{err}");
}

#[test]
fn a_special_token_cannot_take_an_ordinary_tokens_id() {
    let tmp = prepared("50");
    let dir = tmp.path();
    let good: serde_json::Value =
        serde_json::from_slice(&bytes(dir.join("tokenizer.json"))).unwrap();
    // The id of a byte ("!" is 0), and the last merge's (the special token is last).
    let merged = good["model"]["vocab"].as_object().unwrap().len() - 2;
    for id in [0, merged] {
        let mut t = good.clone();
        t["added_tokens"][0]["id"] = serde_json::json!(id);
        std::fs::write(dir.join("bad.json"), t.to_string()).unwrap();
        fails_with(
            dir,
            &[
                "tokenizer",
                "encode",
                "--tokenizer",
                "bad.json",
                "--text",
                "hi!",
            ],
            "special token",
        );
    }
}

#[test]
fn shards_of_another_tokenizer_of_the_same_size_are_refused() {
    let tmp = trained("50");
    let dir = tmp.path();
    reversed_tokenizer(dir);
    let size = |p: &str| {
        let t: serde_json::Value = serde_json::from_slice(&bytes(dir.join(p))).unwrap();
        t["model"]["vocab"].as_object().unwrap().len()
    };
    assert_eq!(size("alt.json"), size("tokenizer.json"));
    let prep = [
        "prepare",
        "corpus",
        "--tokenizer",
        "alt.json",
        "--out",
        "altdata",
    ];
    ok(dir, &prep);
    let eval = ["eval", "--checkpoint", "run/latest", "--seq-len", "8"];
    let init = [
        "train",
        "--init",
        "run/latest",
        "--out",
        "ft",
        "--steps",
        "1",
    ];
    let resume = ["train", "--resume", "run/latest", "--steps", "3"];
    for args in [&eval[..], &init[..], &resume[..]] {
        let with_data = [args, &["--data", "altdata"]].concat();
        fails_with(dir, &with_data, "differs from the model's");
    }
    ok(dir, &[&eval[..], &["--data", "data"]].concat());
}

/// Started by a launcher as one of several ranks (its variables faked here): a build
/// without MPI refuses to train with the command that builds one, and no build runs
/// another command than `train` on several ranks.
#[test]
fn several_ranks_need_an_mpi_build_and_the_train_command() {
    let tmp = prepared("20");
    let dir = tmp.path();
    for (var, n) in [("OMPI_COMM_WORLD_SIZE", "4"), ("SLURM_STEP_NUM_TASKS", "2")] {
        let ranked = |args: &[&str]| {
            let out = std::process::Command::new(binary())
                .current_dir(dir)
                .env(var, n)
                .args(args)
                .output()
                .unwrap();
            let err = String::from_utf8_lossy(&out.stderr).into_owned();
            assert_eq!(
                out.status.code(),
                Some(2),
                "{args:?} under {var}={n}: {err}"
            );
            assert!(!err.contains("panicked"), "{err}");
            err
        };
        let err = ranked(&["info", "--config", "tiny.toml"]);
        assert!(
            err.contains("only `andrea train` runs on several ranks"),
            "{err}"
        );
        assert!(err.contains(&format!("{var}={n}")), "{err}");
        if cfg!(not(feature = "mpi")) {
            let args = [TRAIN_TINY, &["--out", "r"]].concat();
            let err = ranked(&args);
            assert!(err.contains("built without MPI"), "{err}");
            assert!(err.contains("--features mpi"), "{err}");
            assert!(
                !dir.join("r").exists(),
                "a refused run wrote {}",
                dir.join("r").display()
            );
        }
    }
}

/// `ANDREA_NCCL`: a value that is not on/off/auto is named; `on` with the CPU backend
/// (whose gradients are host memory) is refused, in every build: with the `nccl` feature
/// NCCL cannot reduce host memory, without it there is no NCCL.
#[test]
fn andrea_nccl_is_checked() {
    let tmp = prepared("20");
    let dir = tmp.path();
    let run = |value: &str, out: &str| {
        let args = [TRAIN_TINY, &["--steps", "1", "--out", out]].concat();
        let o = std::process::Command::new(binary())
            .current_dir(dir)
            .env("ANDREA_NCCL", value)
            .args(&args)
            .output()
            .unwrap();
        refused(&args, o, "ANDREA_NCCL")
    };
    let err = run("yes", "a");
    assert!(
        err.contains("ANDREA_NCCL=yes") && err.contains("auto"),
        "{err}"
    );
    let err = run("on", "b");
    assert!(
        err.contains("--backend cuda") || err.contains("--features nccl"),
        "{err}"
    );
}
