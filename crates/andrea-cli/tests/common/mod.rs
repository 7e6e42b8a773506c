//! Helpers of the integration tests: run the `andrea` binary as a user runs it, on a
//! generated corpus and a tiny model (d_model 32, 2 layers, context 64, a tokenizer of
//! 50 merges), so that each test takes about a second in the dev profile.
#![allow(dead_code)] // each test binary uses some of the helpers

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

pub const TINY: &str = "\
[model]
name = \"micro\"
vocab_size = 8449 # replaced by the tokenizer's
context_length = 64
d_model = 32
n_layer = 2
n_head = 4

[optimizer]
lr = 3e-3

[training]
batch_size = 4
seq_len = 32
eval_every = 10
eval_batches = 4
sample_every = 0
checkpoint_every = 0
";

/// The binary under test: `ANDREA_BIN` if set (the GPU bundle runs these tests next to
/// a copied binary), else the one cargo built with this test.
pub fn binary() -> PathBuf {
    std::env::var_os("ANDREA_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_andrea")))
}

/// Runs `andrea` in `dir`.
pub fn andrea(dir: &Path, args: &[&str]) -> Output {
    Command::new(binary())
        .current_dir(dir)
        .args(args)
        .output()
        .expect("the andrea binary runs")
}

/// Runs `andrea` and requires success.
pub fn ok(dir: &Path, args: &[&str]) -> Output {
    let out = andrea(dir, args);
    assert!(
        out.status.success(),
        "andrea {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// Exit status 2, a message containing `needle`, and no panic.
pub fn fails_with(dir: &Path, args: &[&str], needle: &str) -> String {
    refused(args, andrea(dir, args), needle)
}

/// `out`, of `andrea args`, is a refusal: status 2, `needle` in the message, no panic.
pub fn refused(args: &[&str], out: Output, needle: &str) -> String {
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(2), "andrea {args:?}: {err}");
    assert!(
        err.contains(needle),
        "andrea {args:?}: expected {needle:?} in: {err}"
    );
    assert!(!err.contains("panicked"), "andrea {args:?} panicked: {err}");
    err
}

/// A deterministic corpus of simple English-like sentences (a few tens of KB).
pub fn write_corpus(dir: &Path, seed: u64) {
    let words = [
        "the", "model", "learns", "a", "small", "story", "about", "trains", "and", "rivers",
        "every", "day", "it", "reads", "text", "slowly", "then", "quickly", "writes", "new",
        "words", "in", "order", "cat", "sat", "on", "mat",
    ];
    let mut state = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    let mut next = |n: usize| {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        (state % n as u64) as usize
    };
    std::fs::create_dir_all(dir.join("corpus")).unwrap();
    for f in 0..3 {
        let mut text = String::new();
        for _ in 0..400 {
            let len = 4 + next(6);
            let sentence: Vec<&str> = (0..len).map(|_| words[next(words.len())]).collect();
            text.push_str(&sentence.join(" "));
            text.push_str(". ");
            if next(5) == 0 {
                text.push('\n');
            }
        }
        std::fs::write(dir.join(format!("corpus/doc{f}.txt")), text).unwrap();
    }
}

/// A directory with `corpus/`, `tokenizer.json`, `data/` (shards) and `tiny.toml`.
pub fn prepared(merges: &str) -> tempfile::TempDir {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    write_corpus(dir, 7);
    std::fs::write(dir.join("tiny.toml"), TINY).unwrap();
    ok(
        dir,
        &[
            "tokenizer",
            "train",
            "corpus",
            "--merges",
            merges,
            "--out",
            "tokenizer.json",
        ],
    );
    ok(dir, &prepare_args("data", "data"));
    tmp
}

/// `andrea prepare corpus` with the prepared tokenizer into `out`, shards named `prefix`.
pub fn prepare_args<'a>(out: &'a str, prefix: &'a str) -> Vec<&'a str> {
    vec![
        "prepare",
        "corpus",
        "--tokenizer",
        "tokenizer.json",
        "--out",
        out,
        "--prefix",
        prefix,
    ]
}

pub fn metrics(run: &Path) -> Vec<serde_json::Value> {
    std::fs::read_to_string(run.join("metrics.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// Waits (up to 60 s) until the run `run` has logged `steps` steps.
pub fn wait_for_steps(run: &Path, steps: usize) {
    let file = run.join("metrics.jsonl");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while std::fs::read_to_string(&file).map_or(true, |t| t.lines().count() < steps) {
        assert!(
            std::time::Instant::now() < deadline,
            "training did not start"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

/// Sends `signal` (`INT`, `KILL`, ...) to process `pid` with `kill`.
pub fn signal(pid: u32, signal: &str) {
    let sent = Command::new("kill")
        .args([format!("-{signal}"), pid.to_string()])
        .status()
        .expect("kill runs");
    assert!(sent.success(), "kill -{signal} {pid} failed");
}

pub fn bytes(p: impl AsRef<Path>) -> Vec<u8> {
    std::fs::read(p).unwrap()
}

/// `andrea train` on the prepared tiny model and data (add `--out` and the rest).
pub const TRAIN_TINY: &[&str] = &["train", "--config", "tiny.toml", "--data", "data"];

/// The names in a directory.
pub fn file_names(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect()
}

/// Runs `andrea` in `dir`, killing it after `secs` seconds (a hang fails the test
/// instead of stalling it).
pub fn andrea_within(dir: &Path, args: &[&str], secs: u64) -> Output {
    let mut child = Command::new(binary())
        .current_dir(dir)
        .args(args)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("the andrea binary runs");
    let start = std::time::Instant::now();
    while child.try_wait().unwrap().is_none() {
        if start.elapsed().as_secs() >= secs {
            child.kill().unwrap();
            panic!("andrea {args:?} still running after {secs} s");
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    child.wait_with_output().unwrap()
}

/// A tiny run `run/` of two steps with its checkpoint `run/latest`.
pub fn trained(merges: &str) -> tempfile::TempDir {
    let tmp = prepared(merges);
    ok(
        tmp.path(),
        &[TRAIN_TINY, &["--out", "run", "--steps", "2"]].concat(),
    );
    tmp
}

/// `run/latest` copied into `plain/` as a bare model directory (model.safetensors,
/// config.json, tokenizer.json; no training state, so no checksums).
pub fn plain_model(dir: &Path) -> PathBuf {
    let plain = dir.join("plain");
    std::fs::create_dir_all(&plain).unwrap();
    for f in ["model.safetensors", "config.json", "tokenizer.json"] {
        std::fs::copy(dir.join("run/latest").join(f), plain.join(f)).unwrap();
    }
    plain
}

/// Waits until `cond` holds (or fails the test after two minutes).
pub fn wait_for(what: &str, mut cond: impl FnMut() -> bool) {
    let start = std::time::Instant::now();
    while !cond() {
        assert!(
            start.elapsed() < std::time::Duration::from_secs(120),
            "timed out waiting for {what}"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

/// `alt.json` in `dir`: another tokenizer of the same vocabulary size as
/// `tokenizer.json`, learned from `corpus/` reversed (in `alt/`).
pub fn reversed_tokenizer(dir: &Path) {
    let alt = dir.join("alt");
    std::fs::create_dir_all(&alt).unwrap();
    for e in std::fs::read_dir(dir.join("corpus")).unwrap() {
        let p = e.unwrap().path();
        let text: String = std::fs::read_to_string(&p).unwrap().chars().rev().collect();
        std::fs::write(alt.join(p.file_name().unwrap()), text).unwrap();
    }
    let alt_tok = [
        "tokenizer",
        "train",
        "alt",
        "--merges",
        "50",
        "--out",
        "alt.json",
    ];
    ok(dir, &alt_tok);
}

/// The number before `word` in `text` ("123 train tokens" -> 123).
pub fn count_before(text: &str, word: &str) -> u64 {
    let at = text
        .find(word)
        .unwrap_or_else(|| panic!("{word:?} in {text}"));
    text[..at]
        .split_whitespace()
        .last()
        .unwrap()
        .parse()
        .unwrap()
}
