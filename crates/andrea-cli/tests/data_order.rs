//! The order training reads its data in: shuffled by default (every row its own window,
//! each window once per epoch, resumed exactly), `--data-order sequential` as llm.c.

mod common;

use common::*;
use std::path::Path;

/// A corpus of two very different halves: English-like sentences, then sums of numbers
/// (other characters, other tokens). Read in order, a model learns the first half, then
/// forgets it for the second; validation text that mixes both shows it. About 42k
/// tokens: the 300 steps of 128 tokens below are one epoch.
fn write_two_halves(dir: &Path) {
    let words = [
        "the", "model", "learns", "a", "small", "story", "about", "trains", "and", "rivers",
        "every", "day", "it", "reads", "text", "slowly", "then", "quickly", "writes", "new",
    ];
    let mut state = 0x2545_f491_4f6c_dd1du64;
    let mut next = move |n: u64| {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state % n
    };
    let mut english = |count: usize| {
        let mut s = String::new();
        for _ in 0..count {
            let len = 4 + next(5) as usize;
            let w: Vec<&str> = (0..len).map(|_| words[next(20) as usize]).collect();
            s.push_str(&w.join(" "));
            s.push_str(".\n");
        }
        s
    };
    let (a, a_val) = (english(800), english(40));
    let mut sums = |count: usize| {
        let mut s = String::new();
        for _ in 0..count {
            let (x, y) = (next(10_000), next(10_000));
            s.push_str(&format!("{x}+{y}={};{}-{}\n", x + y, x.max(y), x.min(y)));
        }
        s
    };
    let (b, b_val) = (sums(1200), sums(60));
    std::fs::create_dir_all(dir.join("halves")).unwrap();
    std::fs::create_dir_all(dir.join("mixed")).unwrap();
    std::fs::write(dir.join("halves/a.txt"), a).unwrap();
    std::fs::write(dir.join("halves/b.txt"), b).unwrap();
    // Validation text of both kinds, interleaved line by line.
    let mixed: String = a_val
        .lines()
        .zip(b_val.lines())
        .map(|(x, y)| format!("{x}\n{y}\n"))
        .collect();
    std::fs::write(dir.join("mixed/val.txt"), mixed).unwrap();
}

/// The validation losses a run logged, in order.
fn val_losses(run: &Path) -> Vec<f64> {
    metrics(run)
        .iter()
        .filter_map(|m| m["val_loss"].as_f64())
        .collect()
}

#[test]
fn shuffled_order_learns_a_corpus_of_two_halves_where_sequential_drifts() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    write_two_halves(dir);
    std::fs::write(dir.join("tiny.toml"), TINY).unwrap();
    let tok = [
        "tokenizer",
        "train",
        "halves",
        "--merges",
        "50",
        "--out",
        "tok.json",
    ];
    ok(dir, &tok);
    let prep = |input: &str, out: &str, val: &str| {
        let args = [
            "prepare",
            input,
            "--tokenizer",
            "tok.json",
            "--out",
            out,
            "--val-fraction",
            val,
        ];
        ok(dir, &args);
    };
    prep("halves", "train", "0");
    prep("mixed", "val", "0.99");
    let run = |order: &str| {
        let args = [
            TRAIN_TINY[0],
            "--config",
            "tiny.toml",
            "--data",
            "train",
            "--val-data",
            "val",
            "--out",
            order,
            "--steps",
            "300",
            "--eval-every",
            "50",
            "--eval-batches",
            "8",
            "--lr",
            "1e-3",
            "--data-order",
            order,
        ];
        let out = ok(dir, &args);
        let log = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(log.contains(&format!("data order: {order}")), "{log}");
        val_losses(&dir.join(order))
    };
    let shuffled = run("shuffle");
    let sequential = run("sequential");
    println!("validation loss, shuffled:   {shuffled:.3?}");
    println!("validation loss, sequential: {sequential:.3?}");
    assert_eq!(shuffled.len(), 6);
    assert!(
        shuffled.windows(2).all(|w| w[1] < w[0]),
        "the shuffled run's validation loss rose: {shuffled:?}"
    );
    assert!(
        shuffled.last() < sequential.last(),
        "shuffled ends at {shuffled:?}, sequential at {sequential:?}"
    );
}

/// A run that passes several epochs says where each ends, and stopping in the middle of
/// an epoch and resuming gives the weights of the run that went straight through.
#[test]
fn epochs_are_logged_and_resume_in_the_middle_of_one_is_exact() {
    let tmp = prepared("50");
    let dir = tmp.path();
    for order in ["shuffle", "sequential"] {
        // The training shard holds about 20k tokens; a step reads 3 x 16 x 32.
        let base = [
            "--steps",
            "40",
            "--seq-len",
            "32",
            "--batch-size",
            "16",
            "--grad-accum",
            "3",
            "--data-order",
            order,
        ];
        let whole = format!("whole-{order}");
        let log = ok(dir, &[TRAIN_TINY, &base, &["--out", &whole]].concat());
        let log = String::from_utf8_lossy(&log.stderr).into_owned();
        assert!(log.contains("epoch 1 done"), "{order}: {log}");
        let split = format!("split-{order}");
        ok(
            dir,
            &[TRAIN_TINY, &base, &["--out", &split, "--stop-at", "17"]].concat(),
        );
        ok(dir, &["train", "--resume", &format!("{split}/latest")]);
        for f in ["model.safetensors", "optimizer.safetensors"] {
            let (x, y) = (
                bytes(dir.join(&whole).join("latest").join(f)),
                bytes(dir.join(&split).join("latest").join(f)),
            );
            assert!(
                x == y,
                "{order}: {f} differs between the whole and the resumed run"
            );
        }
    }
}
