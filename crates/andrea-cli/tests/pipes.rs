//! A closed pipe is the end of that stream, never a panic. A command whose output another
//! program reads (`andrea tokenizer encode ... | head -1`) stops quietly with status 0
//! when that program stops reading; `andrea train 2>&1 | head` keeps training and
//! checkpointing after `head` leaves, and only its lines stop.
#![cfg(unix)]

mod common;

use common::*;
use std::path::Path;
use std::process::{Command, Output, Stdio};

/// Runs `andrea <command_line>` in `dir` with stdout (and with `stderr_too`, stderr) a
/// pipe whose reader is gone from the start, as `head` is once it has its lines.
fn into_a_closed_pipe(dir: &Path, command_line: &str, stderr_too: bool) -> Output {
    let mut child = Command::new(binary())
        .current_dir(dir)
        .args(command_line.split(' '))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    drop(child.stdout.take());
    if stderr_too {
        drop(child.stderr.take());
    }
    child.wait_with_output().unwrap()
}

#[test]
fn output_into_a_closed_pipe_ends_quietly_with_status_0() {
    let tmp = prepared("50");
    let dir = tmp.path();
    // Far more ids than a pipe buffers (64 KiB), so the writes meet the closed pipe.
    let text = "the quick brown fox jumps over the lazy dog. ".repeat(20_000);
    std::fs::write(dir.join("long.txt"), text).unwrap();
    let args = "tokenizer encode --tokenizer tokenizer.json --input long.txt";
    let out = into_a_closed_pipe(dir, args, false);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{:?}: {stderr}", out.status);
    assert_eq!(stderr, "", "nothing to say about a reader that left");
}

#[test]
fn training_goes_on_when_its_lines_meet_a_closed_pipe() {
    let tmp = prepared("50");
    let dir = tmp.path();
    // A line on stderr every step, while stdout and stderr both have no reader.
    let args = concat!(
        "train --config tiny.toml --data data --out run --steps 30 ",
        "--log-every 1 --eval-every 10 --checkpoint-every 10"
    );
    let out = into_a_closed_pipe(dir, args, true);
    assert_eq!(out.status.code(), Some(0), "{:?}", out.status);
    let run = dir.join("run");
    assert_eq!(metrics(&run).len(), 30, "every step trained and logged");
    assert_eq!(
        std::fs::read_link(run.join("latest")).unwrap(),
        Path::new("step-00000030")
    );

    // Text streamed token by token stops at the first piece nobody reads.
    let generate = "generate --checkpoint run/latest --prompt the --max-new-tokens 40";
    let out = into_a_closed_pipe(dir, generate, false);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{:?}: {stderr}", out.status);
    assert!(!stderr.contains("panicked"), "{stderr}");
}
