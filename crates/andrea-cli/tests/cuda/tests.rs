//! The tests of `tests/cuda.rs`, built with the `cuda` feature.

use crate::common::*;

fn train_losses(dir: &std::path::Path, run: &str) -> Vec<f64> {
    metrics(&dir.join(run))
        .iter()
        .map(|m| m["train_loss"].as_f64().unwrap())
        .collect()
}

#[test]
fn train_eval_generate_bench_on_cuda() {
    let tmp = prepared("50");
    let dir = tmp.path();
    let probe = andrea(dir, &["--backend", "cuda", "info", "--config", "tiny.toml"]);
    if !probe.status.success() {
        let err = String::from_utf8_lossy(&probe.stderr).into_owned();
        assert_eq!(probe.status.code(), Some(2), "{err}");
        assert!(!err.contains("panicked"), "{err}");
        assert!(
            err.contains("--backend cuda: no CUDA device found") && err.contains("--backend cpu"),
            "the no-device error should say what is missing and what works: {err}"
        );
        return andrea_testkit::device::skip("train_eval_generate_bench_on_cuda", err.trim());
    }

    // Two steps on each backend from the same seed: the first loss is the initial
    // weights' (FP32 on both: agree to float32 rounding over a few hundred-term sums);
    // the second follows one AdamW step, which moves near-zero gradients' weights by up
    // to 2·lr when their sign differs, so it gets ten times more room.
    let train = |backend: &[&str], out: &str| {
        let args = [
            backend,
            &[
                "train",
                "--config",
                "tiny.toml",
                "--data",
                "data",
                "--out",
                out,
                "--steps",
                "2",
            ],
        ]
        .concat();
        ok(dir, &args);
    };
    train(&[], "run-cpu");
    train(&["--backend", "cuda", "--precision", "fp32"], "run-cuda");
    let (cpu, gpu) = (train_losses(dir, "run-cpu"), train_losses(dir, "run-cuda"));
    assert_eq!((cpu.len(), gpu.len()), (2, 2));
    for (i, rel) in [(0, 1e-4), (1, 1e-3)] {
        assert!(
            (cpu[i] - gpu[i]).abs() <= 1e-6 + rel * cpu[i].abs(),
            "step {}: CPU loss {} vs CUDA loss {}",
            i + 1,
            cpu[i],
            gpu[i]
        );
    }

    // The tensor-core mode, resuming the CUDA run: a checkpoint is backend-independent.
    ok(
        dir,
        &[
            "--backend",
            "cuda",
            "train",
            "--resume",
            "run-cuda/latest",
            "--steps",
            "3",
        ],
    );
    let out = ok(
        dir,
        &[
            "--backend",
            "cuda",
            "eval",
            "--checkpoint",
            "run-cuda/latest",
            "--data",
            "data",
            "--seq-len",
            "32",
            "--json",
        ],
    );
    let eval: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let loss = eval["loss"].as_f64().unwrap();
    assert!(loss.is_finite() && loss > 0.0, "{eval}");

    let out = ok(
        dir,
        &[
            "--backend",
            "cuda",
            "generate",
            "--checkpoint",
            "run-cuda/latest",
            "--prompt",
            "the model",
            "--max-new-tokens",
            "8",
        ],
    );
    assert!(String::from_utf8_lossy(&out.stdout).starts_with("the model"));

    let out = ok(
        dir,
        &[
            "--backend",
            "cuda",
            "--precision",
            "bf16",
            "bench",
            "decode",
            "--config",
            "tiny.toml",
            "--batch-size",
            "1",
            "--seq-len",
            "32",
            "--prompt-len",
            "4",
            "--steps",
            "2",
            "--warmup",
            "1",
            "--json",
        ],
    );
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(report["tokens_per_s"].as_f64().unwrap() > 0.0, "{report}");
    assert!(
        report["backend"].as_str().unwrap_or("").starts_with("cuda"),
        "{report}"
    );
}
