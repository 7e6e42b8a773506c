//! Signals always end a run with a checkpoint at its last step: SIGTERM however often it
//! comes (as `timeout` sends it: to the process, then to its group), and two SIGINTs in
//! quick succession (one interrupt delivered twice). Only a second Ctrl-C a second or
//! more after the first may quit without one.
#![cfg(unix)]

mod common;

use common::*;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Stdio};

/// The step of `run/latest`'s checkpoint and the last step in `run/metrics.jsonl`.
fn checkpoint_and_last_step(run: &Path) -> (u64, u64) {
    let state: serde_json::Value =
        serde_json::from_slice(&bytes(run.join("latest/training_state.json")))
            .expect("a checkpoint at run/latest");
    let last = metrics(run).last().unwrap()["step"].as_u64().unwrap();
    (state["step"].as_u64().unwrap(), last)
}

const LONG_RUN: &[&str] = &[
    "--out",
    "run",
    "--steps",
    "1000000",
    "--eval-every",
    "0",
    "--checkpoint-every",
    "0",
];

#[test]
fn sigterm_from_timeout_always_ends_with_a_checkpoint() {
    let tmp = prepared("50");
    let dir = tmp.path();
    for round in 0..3 {
        let _ = std::fs::remove_dir_all(dir.join("run"));
        // `timeout` sends SIGTERM to andrea, then to its whole process group: two
        // SIGTERMs within microseconds. `--preserve-status`: andrea's own status.
        let out = Command::new("timeout")
            .current_dir(dir)
            .args(["--preserve-status", "4"])
            .arg(binary())
            .args(TRAIN_TINY)
            .args(LONG_RUN)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(130), "round {round}: {err}");
        assert!(
            !err.contains("without a checkpoint"),
            "round {round}: {err}"
        );
        let (saved, last) = checkpoint_and_last_step(&dir.join("run"));
        assert_eq!(
            saved, last,
            "round {round}: the work after step {saved} was lost"
        );
    }
}

/// Sends `signals` to the child's process and group alternately, `gap_ms` apart, once it
/// has logged a few steps.
fn stop_with(
    signals: &[&str],
    gap_ms: u64,
) -> (tempfile::TempDir, std::process::ExitStatus, String) {
    let tmp = prepared("50");
    let dir = tmp.path();
    let child = Command::new(binary())
        .current_dir(dir)
        .args(TRAIN_TINY)
        .args(LONG_RUN)
        .stderr(Stdio::piped())
        .process_group(0)
        .spawn()
        .unwrap();
    wait_for_steps(&dir.join("run"), 3);
    for (i, s) in signals.iter().enumerate() {
        let pid = child.id() as i32;
        // Odd signals go to the group (`kill -- -pgid`), as a terminal or `timeout` does.
        let target = if i % 2 == 0 { pid } else { -pid };
        let sent = Command::new("kill")
            .args([format!("-{s}"), "--".into(), target.to_string()])
            .status()
            .unwrap();
        assert!(sent.success());
        std::thread::sleep(std::time::Duration::from_millis(gap_ms));
    }
    let out = child.wait_with_output().unwrap();
    (
        tmp,
        out.status,
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn repeated_sigterms_and_a_doubled_sigint_end_with_a_checkpoint() {
    for signals in [
        &["TERM", "TERM", "TERM"][..],
        &["INT", "INT"][..],
        &["HUP", "TERM"][..],
    ] {
        let (tmp, status, err) = stop_with(signals, 0);
        assert_eq!(status.code(), Some(130), "{signals:?}: {err}");
        assert!(!err.contains("without a checkpoint"), "{signals:?}: {err}");
        let (saved, last) = checkpoint_and_last_step(&tmp.path().join("run"));
        assert_eq!(
            saved, last,
            "{signals:?}: the work after step {saved} was lost"
        );
    }
}

/// `tokenizer train` and `prepare` stopped by SIGTERM, SIGINT or SIGKILL at a random
/// moment: every output they leave is whole (byte-identical to an uninterrupted run's),
/// never half-written, and a second run completes them.
#[test]
fn tokenizer_train_and_prepare_stopped_at_any_moment_leave_whole_files() {
    let tmp = prepared("50");
    let dir = tmp.path();
    let reference = |p: &str| bytes(dir.join(p));
    let mut state: u64 = 0x2545_f491_4f6c_dd1d;
    let mut next = move |n: u64| {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state % n
    };
    let jobs: [(&[&str], &str, &str); 2] = [
        (
            &[
                "tokenizer",
                "train",
                "corpus",
                "--merges",
                "50",
                "--out",
                "t/tokenizer.json",
            ],
            "t",
            "",
        ),
        (
            &[
                "prepare",
                "corpus",
                "--tokenizer",
                "tokenizer.json",
                "--out",
                "p",
            ],
            "p",
            "data",
        ),
    ];
    for round in 0..9 {
        let signal = ["TERM", "INT", "KILL"][round % 3];
        for (args, out, reference_dir) in jobs {
            std::fs::create_dir_all(dir.join("t")).unwrap();
            let child = Command::new(binary())
                .current_dir(dir)
                .args(args)
                .stderr(Stdio::null())
                .spawn()
                .unwrap();
            std::thread::sleep(std::time::Duration::from_millis(next(400)));
            let _ = Command::new("kill")
                .args([format!("-{signal}"), child.id().to_string()])
                .status();
            let _ = child.wait_with_output();
            // Stopped before its first set was in place, `prepare` leaves no `p` at all.
            let names = if dir.join(out).is_dir() {
                file_names(&dir.join(out))
            } else {
                Vec::new()
            };
            for name in names {
                if name.starts_with('.') {
                    continue; // a temporary file, never a result
                }
                let made = bytes(dir.join(out).join(&name));
                let want = if reference_dir.is_empty() {
                    reference(&name)
                } else {
                    reference(&format!("{reference_dir}/{name}"))
                };
                assert!(
                    made == want,
                    "round {round}, {args:?} stopped by SIG{signal}: {out}/{name} is not whole"
                );
            }
        }
    }
    // A last run of each completes what was stopped.
    for (args, _, _) in jobs {
        ok(dir, args);
    }
    assert_eq!(
        bytes(dir.join("t/tokenizer.json")),
        reference("tokenizer.json")
    );
}
