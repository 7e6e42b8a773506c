//! What a user meets first: the help's defaults, where `--backend` is accepted,
//! `tokenizer encode` from stdin, a trial run shorter than the config's warmup, and the
//! resume mark in `metrics.jsonl` and `loss.svg`.

mod common;

use std::io::Write;
use std::path::Path;
use std::process::{Command, Output, Stdio};

use common::*;

/// Runs `andrea` in `dir` with `input` on its stdin.
fn andrea_with_stdin(dir: &Path, args: &[&str], input: &[u8]) -> Output {
    let mut child = Command::new(binary())
        .current_dir(dir)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the andrea binary runs");
    let mut stdin = child.stdin.take().unwrap();
    // andrea stops reading past its bound: a broken pipe then is expected.
    let _ = stdin.write_all(input);
    drop(stdin);
    child.wait_with_output().unwrap()
}

fn stdout(out: &Output) -> String {
    String::from_utf8(out.stdout.clone()).unwrap()
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn help_shows_defaults_and_backend_flags_only_where_a_model_runs() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let train = stdout(&ok(dir, &["train", "--help"]));
    for default in [
        "[default: the config's [training] batch_size, else 8]",
        "[default: the config's [optimizer] lr, else 6e-4]",
        "[default: cpu]",
    ] {
        assert!(train.contains(default), "no {default:?} in: {train}");
    }
    for cmd in [
        &["tokenizer", "train", "--help"][..],
        &["tokenizer", "encode", "--help"],
        &["tokenizer", "decode", "--help"],
        &["prepare", "--help"],
    ] {
        let help = stdout(&ok(dir, cmd));
        assert!(
            !help.contains("--backend") && !help.contains("--precision"),
            "{cmd:?} lists the backend flags: {help}"
        );
        assert!(help.contains("--threads"), "{cmd:?}: {help}");
    }
    fails_with(
        dir,
        &["tokenizer", "encode", "--backend", "cpu", "--text", "a"],
        "--backend",
    );

    // Before the command's name (as scripts pass it) and after it both work.
    std::fs::write(dir.join("tiny.toml"), TINY).unwrap();
    let info = ["info", "--config", "tiny.toml", "--json"];
    let before = ok(dir, &[&["--backend", "cpu"][..], &info].concat());
    let after = ok(dir, &[&info[..], &["--backend", "cpu"]].concat());
    assert_eq!(before.stdout, after.stdout);
    fails_with(
        dir,
        &[&["--backend", "cpu"][..], &info, &["--backend", "cuda"]].concat(),
        "--backend is given twice with different values",
    );
}

#[test]
fn tokenizer_encode_reads_stdin() {
    let tmp = prepared("50");
    let dir = tmp.path();
    let encode = [
        "tokenizer",
        "encode",
        "--tokenizer",
        "tokenizer.json",
        "--json",
    ];
    let text = "the cat sat on the mat";
    let given = ok(dir, &[&encode[..], &["--text", text]].concat());
    let ids: Vec<u32> = serde_json::from_slice(&given.stdout).unwrap();
    assert!(!ids.is_empty());
    for args in [&encode[..], &[&encode[..], &["--input", "-"]].concat()] {
        let piped = andrea_with_stdin(dir, args, text.as_bytes());
        assert!(piped.status.success(), "{args:?}: {}", stderr(&piped));
        assert_eq!(piped.stdout, given.stdout, "{args:?}");
    }
    // Past the bound: refused, nothing printed.
    let big = vec![b'a'; (64 << 20) + 1];
    let out = andrea_with_stdin(dir, &encode, &big);
    let err = refused(&encode, out.clone(), "stdin holds more than 64.0 MiB");
    assert!(err.contains("andrea prepare"), "{err}");
    assert!(out.stdout.is_empty());
    let out = andrea_with_stdin(dir, &encode, b"caf\xc3");
    refused(&encode, out, "stdin is not UTF-8 text");
}

/// `tiny.toml` with a warmup of 20 steps.
fn with_warmup(dir: &Path) {
    let config = format!("{TINY}\n[schedule]\nwarmup_steps = 20\ntotal_steps = 100\n");
    std::fs::write(dir.join("warm.toml"), config).unwrap();
}

#[test]
fn a_trial_run_shorter_than_the_configs_warmup_cuts_it_and_says_so() {
    let tmp = prepared("50");
    let dir = tmp.path();
    with_warmup(dir);
    let train = ["train", "--config", "warm.toml", "--data", "data"];
    let out = ok(
        dir,
        &[&train[..], &["--out", "run", "--steps", "2"]].concat(),
    );
    let err = stderr(&out);
    let note = "note: the warmup of 20 steps is longer than the run's 2: it is cut to 2";
    assert_eq!(err.matches(note).count(), 1, "{err}");
    // Warming up over 2 steps: half the peak rate (3e-3), then the peak.
    let lrs: Vec<f64> = metrics(&dir.join("run"))
        .iter()
        .map(|m| m["lr"].as_f64().unwrap())
        .collect();
    assert_eq!(lrs.len(), 2);
    assert!(
        (lrs[0] - 1.5e-3).abs() < 1e-9 && (lrs[1] - 3e-3).abs() < 1e-9,
        "{lrs:?}"
    );

    // A warmup the user passes is theirs: longer than the run, it is refused.
    fails_with(
        dir,
        &[
            &train[..],
            &["--out", "run2", "--steps", "2", "--warmup-steps", "5"],
        ]
        .concat(),
        "--warmup-steps 5 is more than the run's 2 steps",
    );
    // Long enough: no note.
    let out = ok(
        dir,
        &[&train[..], &["--out", "run3", "--steps", "20"]].concat(),
    );
    assert!(!stderr(&out).contains("warmup"), "{}", stderr(&out));
}

#[test]
fn a_resume_is_recorded_and_marked_on_the_plot() {
    let tmp = prepared("50");
    let dir = tmp.path();
    let run = dir.join("run");
    ok(
        dir,
        &[
            TRAIN_TINY,
            &["--out", "run", "--steps", "8", "--stop-at", "5"],
        ]
        .concat(),
    );
    let svg = std::fs::read_to_string(run.join("loss.svg")).unwrap();
    assert!(!svg.contains("resumed"));
    ok(dir, &["train", "--resume", "run/latest"]);
    let lines = metrics(&run);
    let resumed: Vec<(u64, u64)> = lines
        .iter()
        .filter_map(|m| Some((m["step"].as_u64()?, m["resumed_from"].as_u64()?)))
        .collect();
    assert_eq!(lines.len(), 8);
    assert_eq!(resumed, [(6, 5)]);
    let svg = std::fs::read_to_string(run.join("loss.svg")).unwrap();
    for label in ["resumed from step 5", "validation", "step", "loss (nats)"] {
        assert!(svg.contains(label), "no {label:?} in loss.svg");
    }
}
