//! Continuing runs: exact resume (in order and shuffled), fine-tuning from weights, and
//! Ctrl-C writing a checkpoint the run continues from.

mod common;

use common::*;
use std::process::Command;

/// Trains 20 steps in one run, and 10 + 10 with a stop and `--resume`; the weights,
/// optimizer state and every logged loss must be identical.
fn check_resume(extra: &[&str]) {
    let tmp = prepared("50");
    let dir = tmp.path();
    let base = [
        "train",
        "--config",
        "tiny.toml",
        "--data",
        "data",
        "--steps",
        "20",
    ];
    let common = [&base[..], extra].concat();
    ok(dir, &[&common[..], &["--out", "whole"]].concat());
    ok(
        dir,
        &[&common[..], &["--out", "split", "--stop-at", "10"]].concat(),
    );
    assert!(dir.join("split/step-00000010").exists());
    ok(dir, &["train", "--resume", "split/latest"]);
    let (a, b) = (metrics(&dir.join("whole")), metrics(&dir.join("split")));
    assert_eq!(a.len(), b.len());
    for (x, y) in a.iter().zip(&b) {
        assert_eq!(x["train_loss"], y["train_loss"], "at step {}", x["step"]);
        assert_eq!(x["grad_norm"], y["grad_norm"], "at step {}", x["step"]);
    }
    for f in ["model.safetensors", "optimizer.safetensors"] {
        let (x, y) = (
            bytes(dir.join("whole/latest").join(f)),
            bytes(dir.join("split/latest").join(f)),
        );
        assert!(
            x == y,
            "{f} differs (byte for byte) between the whole run and the resumed one"
        );
    }
}

#[test]
fn resume_gives_bit_identical_weights() {
    check_resume(&[]);
}

#[test]
fn shuffled_resume_gives_bit_identical_weights() {
    check_resume(&["--shuffle", "--grad-accum", "2"]);
}

#[test]
fn init_fine_tunes_from_weights() {
    let tmp = prepared("50");
    let dir = tmp.path();
    let base = [
        "--data",
        "data",
        "--steps",
        "5",
        "--batch-size",
        "2",
        "--seq-len",
        "16",
    ];
    ok(
        dir,
        &[
            &["train", "--config", "tiny.toml", "--out", "base"],
            &base[..],
        ]
        .concat(),
    );
    // One step at learning rate 0: the weights stay exactly the base's, and the
    // moments are AdamW's after one step from zero: m = (1-β1)·g, v = (1-β2)·g², so
    // m² / v = (1-β1)² / (1-β2) in every element (moments carried over from the base's
    // 5 steps would not be in that ratio).
    let tune = [
        "train",
        "--init",
        "base/latest",
        "--out",
        "tuned",
        "--lr",
        "0",
        "--steps",
        "1",
    ];
    ok(dir, &[&tune[..], &base[..2], &base[4..]].concat());
    let tensors = |p: &str| -> Vec<(String, Vec<f32>)> {
        let b = bytes(dir.join(p));
        let st = safetensors::SafeTensors::deserialize(&b).unwrap();
        let mut out: Vec<(String, Vec<f32>)> = st
            .tensors()
            .into_iter()
            .map(|(n, v)| {
                let vals = v
                    .data()
                    .chunks_exact(4)
                    .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                    .collect();
                (n, vals)
            })
            .collect();
        out.sort_by(|a, b| a.0.cmp(&b.0));
        out
    };
    assert_eq!(
        tensors("tuned/latest/model.safetensors"),
        tensors("base/latest/model.safetensors"),
        "--init must start from the base's weights"
    );
    let moments = tensors("tuned/latest/optimizer.safetensors");
    let (b1, b2) = (0.9f64, 0.95f64);
    let want = (1.0 - b1).powi(2) / (1.0 - b2);
    let mut checked = 0;
    for (name, m) in moments.iter().filter(|(n, _)| n.starts_with("exp_avg.")) {
        let v_name = name.replacen("exp_avg.", "exp_avg_sq.", 1);
        let v = &moments.iter().find(|(n, _)| *n == v_name).unwrap().1;
        for (m, v) in m.iter().zip(v) {
            if *v > 1e-30 {
                let ratio = (*m as f64).powi(2) / *v as f64;
                assert!(
                    (ratio - want).abs() <= 1e-3 * want,
                    "{name}: m²/v = {ratio}, want {want}"
                );
                checked += 1;
            }
        }
    }
    assert!(checked > 1000, "only {checked} moments checked");
}

#[cfg(unix)]
#[test]
fn ctrl_c_writes_a_loadable_checkpoint() {
    let tmp = prepared("50");
    let dir = tmp.path();
    let mut child = Command::new(env!("CARGO_BIN_EXE_andrea"))
        .current_dir(dir)
        .args([
            "train",
            "--config",
            "tiny.toml",
            "--data",
            "data",
            "--out",
            "run",
        ])
        .args(["--steps", "1000000", "--eval-every", "0"])
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    wait_for_steps(&dir.join("run"), 3);
    signal(child.id(), "INT");
    let status = child.wait().unwrap();
    assert_eq!(status.code(), Some(130));
    let out = ok(
        dir,
        &[
            "eval",
            "--checkpoint",
            "run/latest",
            "--data",
            "data",
            "--seq-len",
            "32",
            "--batch-size",
            "2",
            "--json",
        ],
    );
    let e: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(e["loss"].as_f64().unwrap().is_finite());
    // And the run continues from it.
    let state: serde_json::Value =
        serde_json::from_slice(&bytes(dir.join("run/latest/training_state.json"))).unwrap();
    let step = state["step"].as_u64().unwrap();
    let next = (step + 2).to_string();
    ok(dir, &["train", "--resume", "run/latest", "--steps", &next]);
}
