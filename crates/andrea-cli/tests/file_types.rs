//! Outputs and inputs that are not regular files. Nothing a user names as an output is
//! replaced unless it is a regular file (or a directory where one is expected), and no
//! input is opened unless it is one: a FIFO or a character device under any of those
//! names is refused at once with status 2 and left as it was.
//!
//! The devices are made in the test's own directory (`mknod <dir>/null c 1 3`, what
//! `/dev/null` is); where this process may not make one (not root), that case is skipped
//! with a printed reason. Real `/dev` files are never touched.
#![cfg(unix)]

mod common;

use common::*;
use std::os::unix::fs::FileTypeExt;
use std::path::Path;

fn mkfifo(path: &Path) {
    let st = std::process::Command::new("mkfifo")
        .arg(path)
        .status()
        .unwrap();
    assert!(st.success(), "mkfifo {}", path.display());
}

/// A character device like `/dev/null` at `path`; `false` (with the reason printed)
/// where this process may not make one.
fn mknod_null(path: &Path) -> bool {
    let out = std::process::Command::new("mknod")
        .arg(path)
        .args(["c", "1", "3"])
        .output()
        .unwrap();
    if !out.status.success() {
        eprintln!(
            "SKIPPED the character-device case at {}: mknod failed ({}); needs root or CAP_MKNOD",
            path.display(),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    out.status.success()
}

/// What is at `path`: "fifo", "char", "file", "dir", "link" or "none".
fn kind(path: &Path) -> &'static str {
    match std::fs::symlink_metadata(path) {
        Err(_) => "none",
        Ok(m) if m.file_type().is_fifo() => "fifo",
        Ok(m) if m.file_type().is_char_device() => "char",
        Ok(m) if m.file_type().is_symlink() => "link",
        Ok(m) if m.is_dir() => "dir",
        Ok(_) => "file",
    }
}

/// Makes a FIFO and, where permitted, a character device in `dir`; returns their names.
fn specials(dir: &Path, stem: &str) -> Vec<(String, &'static str)> {
    let fifo = format!("{stem}-fifo");
    mkfifo(&dir.join(&fifo));
    let mut out = vec![(fifo, "FIFO")];
    let dev = format!("{stem}-dev");
    if mknod_null(&dir.join(&dev)) {
        out.push((dev, "character device"));
    }
    out
}

/// Refused within 30 s (a blocked open would hang), status 2, the message naming what
/// the path is; the path still what it was.
fn refused_and_kept(dir: &Path, args: &[&str], path: &str, needle: &str) -> String {
    let before = kind(&dir.join(path));
    let out = andrea_within(dir, args, 30);
    let err = refused(args, out, needle);
    assert_eq!(
        kind(&dir.join(path)),
        before,
        "andrea {args:?} replaced {path}"
    );
    err
}

/// `andrea tokenizer train corpus --merges 20 --out <out>`.
fn tokenizer_train(out: &str) -> Vec<&str> {
    vec![
        "tokenizer",
        "train",
        "corpus",
        "--merges",
        "20",
        "--out",
        out,
    ]
}

#[test]
fn outputs_that_are_not_regular_files_are_refused_and_kept() {
    let tmp = prepared("50");
    let dir = tmp.path();
    for (name, what) in specials(dir, "out") {
        // The tokenizer.
        let err = refused_and_kept(dir, &tokenizer_train(&name), &name, what);
        assert!(err.contains("regular file"), "{err}");
        // A symbolic link to it is judged by what it points to.
        let link = format!("{name}-link");
        std::os::unix::fs::symlink(&name, dir.join(&link)).unwrap();
        refused_and_kept(dir, &tokenizer_train(&link), &name, what);
        // The shards' directory, and files of its name inside it.
        refused_and_kept(dir, &prepare_args(&name, "data"), &name, what);
        std::fs::create_dir_all(dir.join("shards")).unwrap();
        for file in [
            "data_train_000000.bin",
            "data_val_000000.bin",
            "tokenizer.json",
        ] {
            let p = format!("shards/{file}");
            std::fs::rename(dir.join(&name), dir.join(&p)).unwrap();
            // A shard set is written elsewhere and renamed into place whole, so a folder
            // holding anything but an earlier set is refused before anything is written.
            refused_and_kept(
                dir,
                &prepare_args("shards", "data"),
                &p,
                "not part of a shard set",
            );
            std::fs::rename(dir.join(&p), dir.join(&name)).unwrap();
        }
        // The demo's directory.
        refused_and_kept(dir, &["demo", "--out", &name], &name, what);
        // The run directory, and the files andrea keeps in it under fixed names.
        fn train(out: &str) -> Vec<&str> {
            [TRAIN_TINY, &["--out", out, "--steps", "2"]].concat()
        }
        refused_and_kept(dir, &train(&name), &name, "not a directory");
        std::fs::create_dir_all(dir.join("run")).unwrap();
        for file in ["metrics.jsonl", "loss.svg", ".lock", "latest"] {
            let p = format!("run/{file}");
            std::fs::rename(dir.join(&name), dir.join(&p)).unwrap();
            refused_and_kept(dir, &train("run"), &p, what);
            std::fs::rename(dir.join(&p), dir.join(&name)).unwrap();
        }
        assert!(matches!(kind(&dir.join(&name)), "fifo" | "char"));
    }
    // The same outputs as regular files (or absent) are written as before.
    std::fs::write(dir.join("tok.json"), "old").unwrap();
    ok(dir, &tokenizer_train("tok.json"));
    assert!(std::fs::read_to_string(dir.join("tok.json"))
        .unwrap()
        .contains("\"merges\""));
    ok(
        dir,
        &[TRAIN_TINY, &["--out", "run", "--steps", "2"]].concat(),
    );
    assert_eq!(kind(&dir.join("run/latest")), "link");
}

#[test]
fn inputs_that_are_not_regular_files_are_refused_at_once() {
    let tmp = prepared("50");
    let dir = tmp.path();
    for (name, what) in specials(dir, "in") {
        for args in [
            vec!["tokenizer", "train", &name, "--out", "t.json"],
            vec![
                "tokenizer",
                "encode",
                "--tokenizer",
                "tokenizer.json",
                "--input",
                &name,
            ],
            vec!["tokenizer", "encode", "--tokenizer", &name, "--text", "a"],
            vec!["train", "--config", &name, "--data", "data", "--out", "r"],
            vec!["info", "--config", &name],
            vec![
                "train",
                "--config",
                "tiny.toml",
                "--data",
                &name,
                "--out",
                "r",
            ],
            vec!["bench", "train", "--config", &name],
            vec![
                "prepare",
                &name,
                "--tokenizer",
                "tokenizer.json",
                "--out",
                "p",
            ],
        ] {
            refused_and_kept(dir, &args, &name, what);
        }
        for out in ["t.json", "r", "p"] {
            assert!(!dir.join(out).exists(), "{out} was written");
        }
    }
}

#[test]
fn inputs_are_read_within_a_bound() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    // A config of 2 MiB (1 MiB is the bound): refused without being parsed.
    std::fs::write(dir.join("big.toml"), vec![b'#'; 2 << 20]).unwrap();
    for args in [
        &["info", "--config", "big.toml"][..],
        &["train", "--config", "big.toml", "--out", "r"][..],
    ] {
        refused_and_kept(dir, args, "big.toml", "more than the 1048576");
    }
}
