//! Broken results, crashes and misleading messages: a model whose output overflows is
//! an error naming the tensor, not a printed NaN; bench counts are bounded; each message
//! names what is really there (a run directory, a pickle, a Unigram tokenizer, damaged
//! optimizer moments, a run that never wrote a checkpoint).

mod common;

use common::*;
use std::path::Path;

/// Rewrites the safetensors file `path`, `edit` changing tensor `name`'s values.
fn edit_tensor(path: &Path, name: &str, edit: impl FnOnce(&mut [f32])) {
    let raw = bytes(path);
    let st = safetensors::SafeTensors::deserialize(&raw).unwrap();
    let (_, meta) = safetensors::SafeTensors::read_metadata(&raw).unwrap();
    let mut tensors: Vec<(String, Vec<usize>, Vec<f32>)> = st
        .tensors()
        .into_iter()
        .map(|(n, v)| {
            let vals = v
                .data()
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
                .collect();
            (n, v.shape().to_vec(), vals)
        })
        .collect();
    let t = tensors
        .iter_mut()
        .find(|t| t.0 == name)
        .expect("the tensor");
    edit(&mut t.2);
    let data: Vec<Vec<u8>> = tensors
        .iter()
        .map(|t| t.2.iter().flat_map(|v| v.to_le_bytes()).collect())
        .collect();
    let views: Vec<(String, safetensors::tensor::TensorView)> = tensors
        .iter()
        .zip(&data)
        .map(|(t, d)| {
            let view =
                safetensors::tensor::TensorView::new(safetensors::Dtype::F32, t.1.clone(), d)
                    .unwrap();
            (t.0.clone(), view)
        })
        .collect();
    let out = safetensors::serialize(views, meta.metadata().clone()).unwrap();
    std::fs::write(path, out).unwrap();
}

/// Records `name`'s new size and checksum in the checkpoint's `training_state.json`, as
/// if andrea had written it (a file edited on purpose, past the checksum).
fn rerecord(ckpt: &Path, name: &str) {
    let file = bytes(ckpt.join(name));
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in &file {
        h ^= b as u64;
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    let state_path = ckpt.join("training_state.json");
    let mut state: serde_json::Value = serde_json::from_slice(&bytes(&state_path)).unwrap();
    for f in state["files"].as_array_mut().unwrap() {
        if f["name"] == name {
            f["bytes"] = file.len().into();
            f["fnv1a64"] = format!("{h:016x}").into();
        }
    }
    std::fs::write(&state_path, state.to_string()).unwrap();
}

#[test]
fn overflowing_weights_are_an_error_naming_the_tensor() {
    let tmp = trained("50");
    let dir = tmp.path();
    let plain = plain_model(dir);
    let tensor = "transformer.h.1.mlp.c_fc.weight";
    // Finite, so it loads as a number; every forward through it overflows.
    edit_tensor(&plain.join("model.safetensors"), tensor, |v| v[7] = 3e38);
    for args in [
        &[
            "eval",
            "--checkpoint",
            "plain",
            "--data",
            "data",
            "--seq-len",
            "32",
        ][..],
        &["generate", "--checkpoint", "plain", "--max-new-tokens", "4"][..],
    ] {
        let err = fails_with(dir, args, tensor);
        assert!(err.contains("3e38") || err.contains("300000"), "{err}");
    }
}

#[test]
fn bench_counts_are_bounded() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    std::fs::write(dir.join("tiny.toml"), TINY).unwrap();
    let huge = u64::MAX.to_string();
    for args in [
        &["bench", "train", "--config", "tiny.toml", "--steps", &huge][..],
        &["bench", "train", "--config", "tiny.toml", "--warmup", &huge],
        &[
            "bench",
            "decode",
            "--config",
            "tiny.toml",
            "--steps",
            "1000000000000",
        ],
        &[
            "bench",
            "decode",
            "--config",
            "tiny.toml",
            "--warmup",
            "1000000000000",
        ],
    ] {
        fails_with(dir, args, "at most 1000000");
    }
}

#[test]
fn messages_name_what_is_there() {
    let tmp = trained("50");
    let dir = tmp.path();
    // A run directory where a checkpoint is expected.
    for args in [
        &["info", "--checkpoint", "run"][..],
        &["generate", "--checkpoint", "run", "--max-new-tokens", "2"],
    ] {
        fails_with(dir, args, "run/latest");
    }
    // A transformers folder with only the pickle.
    let plain = plain_model(dir);
    std::fs::rename(
        plain.join("model.safetensors"),
        plain.join("pytorch_model.bin"),
    )
    .unwrap();
    let err = fails_with(
        dir,
        &["generate", "--checkpoint", "plain"],
        "pytorch_model.bin",
    );
    assert!(err.contains("safe_serialization=True"), "{err}");
    // A Unigram tokenizer.json.
    let unigram = serde_json::json!({
        "version": "1.0", "truncation": null, "padding": null, "added_tokens": [],
        "normalizer": null, "pre_tokenizer": null, "post_processor": null, "decoder": null,
        "model": {"type": "Unigram", "unk_id": 0, "vocab": [["<unk>", 0.0], ["a", -1.5]]}
    });
    std::fs::write(dir.join("unigram.json"), unigram.to_string()).unwrap();
    fails_with(
        dir,
        &[
            "tokenizer",
            "encode",
            "--tokenizer",
            "unigram.json",
            "--text",
            "a",
        ],
        "only byte-level BPE is supported",
    );
    // Damaged optimizer moments (recorded as written): refused at load, by name.
    let ckpt = dir.join("run/latest");
    let good = bytes(ckpt.join("optimizer.safetensors"));
    let good_state = bytes(ckpt.join("training_state.json"));
    for (moment, value) in [("exp_avg", f32::NAN), ("exp_avg_sq", -1.0)] {
        let name = format!("{moment}.transformer.h.0.attn.c_attn.weight");
        edit_tensor(&ckpt.join("optimizer.safetensors"), &name, |v| v[3] = value);
        rerecord(&ckpt, "optimizer.safetensors");
        fails_with(
            dir,
            &["train", "--resume", "run/latest", "--steps", "3"],
            &name,
        );
        std::fs::write(ckpt.join("optimizer.safetensors"), &good).unwrap();
        std::fs::write(ckpt.join("training_state.json"), &good_state).unwrap();
    }
    // A resumed run with changed settings says so, and the next checkpoint records them;
    // leftovers of killed runs' metrics and plot writes are removed.
    std::fs::write(dir.join("run/.loss.svg.tmp-99999"), "x").unwrap();
    std::fs::write(dir.join("run/.metrics.jsonl.tmp-99999"), "x").unwrap();
    let out = ok(
        dir,
        &[
            "train",
            "--resume",
            "run/latest",
            "--steps",
            "3",
            "--lr",
            "0.002",
            "--batch-size",
            "2",
        ],
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("--resume changes lr from 0.003 to 0.002"),
        "{err}"
    );
    assert!(
        err.contains("--resume changes batch_size from 4 to 2"),
        "{err}"
    );
    let state: serde_json::Value =
        serde_json::from_slice(&bytes(dir.join("run/latest/training_state.json"))).unwrap();
    assert_eq!(state["settings"]["batch_size"], 2);
    let names = file_names(&dir.join("run"));
    assert!(!names.iter().any(|n| n.contains(".tmp-")), "{names:?}");
}

#[test]
fn a_run_stopped_before_its_first_checkpoint_is_started_again() {
    let tmp = prepared("50");
    let dir = tmp.path();
    // What a kill -9 before the first checkpoint leaves: metrics and no `latest`.
    std::fs::create_dir_all(dir.join("run")).unwrap();
    std::fs::write(
        dir.join("run/metrics.jsonl"),
        "{\"step\":1,\"train_loss\":5.0,\"lr\":0.001,\"grad_norm\":1.0,\"tokens_per_s\":1.0}\n",
    )
    .unwrap();
    let train = [TRAIN_TINY, &["--out", "run", "--steps", "2"]].concat();
    let err = fails_with(dir, &train, "--overwrite");
    assert!(!err.contains("--resume"), "{err}");
    ok(dir, &[&train[..], &["--overwrite"]].concat());
}
