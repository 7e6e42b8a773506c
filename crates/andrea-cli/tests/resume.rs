//! Continuing runs: exact resume (in order and shuffled), fine-tuning from weights, and
//! Ctrl-C writing a checkpoint the run continues from.

mod common;

use common::*;
use std::path::PathBuf;
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
    ok(
        dir,
        &[
            &[
                "train",
                "--init",
                "base/latest",
                "--out",
                "tuned",
                "--lr",
                "1e-4",
            ],
            &base[..],
        ]
        .concat(),
    );
    assert!(dir.join("tuned/latest/model.safetensors").exists());
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
    let metrics_file: PathBuf = dir.join("run/metrics.jsonl");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while std::fs::read_to_string(&metrics_file).map_or(true, |t| t.lines().count() < 3) {
        assert!(
            std::time::Instant::now() < deadline,
            "training did not start"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let killed = Command::new("kill")
        .args(["-INT", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
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
