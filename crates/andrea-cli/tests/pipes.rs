//! A command whose output another program reads ends quietly when that program stops
//! reading (`andrea tokenizer encode ... | head -1`): killed by `SIGPIPE` as Unix tools
//! are, with no panic message.
#![cfg(unix)]

mod common;

use common::*;
use std::os::unix::process::ExitStatusExt;
use std::process::{Command, Stdio};

#[test]
fn a_closed_pipe_ends_the_output_without_a_panic() {
    let tmp = prepared("50");
    let dir = tmp.path();
    // Far more ids than a pipe buffers (64 KiB), so the writes meet the closed pipe.
    let text = "the quick brown fox jumps over the lazy dog. ".repeat(20_000);
    std::fs::write(dir.join("long.txt"), text).unwrap();
    let mut child = Command::new(binary())
        .current_dir(dir)
        .args(["tokenizer", "encode", "--tokenizer", "tokenizer.json"])
        .args(["--input", "long.txt"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    drop(child.stdout.take()); // the reader stops at once
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert_eq!(
        out.status.signal(),
        Some(libc::SIGPIPE),
        "{:?}: {stderr}",
        out.status
    );
}
