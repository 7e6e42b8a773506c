//! `andrea prepare` writes a shard set as one unit: the four ways runs used to mix (an
//! old corpus's shards beside a new one's, two writers at once, a killed writer's
//! partial set, shards checked against no tokenizer) reproduced, now refused or
//! impossible.

mod common;

use common::*;
use std::path::Path;
use std::process::{Child, Command, Stdio};

fn stderr(out: &std::process::Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// A corpus large enough (75 MB, over a second to encode) that `prepare` is still
/// encoding it well after its temporary directory appears; the test stops or kills it as
/// soon as it sees that directory (polled every 20 ms). A FIFO would hold it
/// deterministically, but inputs that are not regular files are refused.
fn large_corpus(dir: &Path) -> &'static str {
    let mut text = String::new();
    for i in 0..2_000_000 {
        text.push_str(&format!("the first writer's text, line {i}. "));
    }
    std::fs::write(dir.join("large.txt"), text).unwrap();
    "large.txt"
}

/// `andrea prepare <input> ... --out data`, started in the background.
fn spawn_prepare(dir: &Path, input: &str) -> Child {
    Command::new(binary())
        .current_dir(dir)
        .args([
            "prepare",
            input,
            "--tokenizer",
            "tokenizer.json",
            "--out",
            "data",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// The temporary directories of sets being written next to `data`.
fn temporaries(dir: &Path) -> Vec<String> {
    file_names(dir)
        .into_iter()
        .filter(|n| n.starts_with(".data.tmp-"))
        .collect()
}

/// Waits until a prepare is writing into a temporary directory.
fn wait_for_temporary(dir: &Path) {
    wait_for("prepare to start", || !temporaries(dir).is_empty());
}

/// Defect 1: a small corpus prepared over a large one's `--out` left the large one's
/// shards 1..9 beside the new shard 0, and `train` read them all.
#[test]
fn a_new_corpus_replaces_the_old_set_whole() {
    let tmp = prepared("50");
    let dir = tmp.path();
    let many = [
        &prepare_args("data", "data")[..],
        &["--shard-tokens", "2000"],
    ]
    .concat();
    ok(dir, &many);
    assert!(!dir.join(".data.lock").exists(), "the lock file is removed");
    let old = file_names(&dir.join("data"));
    assert!(
        old.contains(&"data_train_000005.bin".to_string()),
        "{old:?}"
    );
    std::fs::create_dir(dir.join("small")).unwrap();
    std::fs::write(
        dir.join("small/a.txt"),
        "the cat sat on the mat. ".repeat(200),
    )
    .unwrap();
    let prep = [
        "prepare",
        "small",
        "--tokenizer",
        "tokenizer.json",
        "--out",
        "data",
    ];
    let report = stderr(&ok(dir, &prep));
    let mut names = file_names(&dir.join("data"));
    names.sort();
    assert_eq!(
        names,
        [
            "data_train_000000.bin",
            "data_val_000000.bin",
            "manifest.json",
            "tokenizer.json"
        ]
    );
    let train = [
        TRAIN_TINY,
        &["--out", "run", "--steps", "1", "--seq-len", "8"],
    ]
    .concat();
    let log = stderr(&ok(dir, &train));
    assert_eq!(
        count_before(&log, "training tokens"),
        count_before(&report, "train tokens"),
        "{log}"
    );
}

/// Defect 2: two prepares into one `--out` at once both exited 0 and mixed their shards.
/// The first here is stopped (SIGSTOP) while it holds the set's lock.
#[cfg(unix)]
#[test]
fn a_second_prepare_into_the_same_out_is_refused_while_the_first_runs() {
    let tmp = prepared("50");
    let dir = tmp.path();
    let first = spawn_prepare(dir, large_corpus(dir));
    wait_for_temporary(dir);
    signal(first.id(), "STOP");
    let second = prepare_args("data", "data");
    let err = refused(&second, andrea(dir, &second), "another `andrea prepare`");
    assert!(err.contains(&first.id().to_string()), "{err}");
    // The first goes on and installs its set.
    signal(first.id(), "CONT");
    let out = first.wait_with_output().unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let report = stderr(&out);
    let log = stderr(&ok(
        dir,
        &[
            TRAIN_TINY,
            &["--out", "r", "--steps", "1", "--seq-len", "8"],
        ]
        .concat(),
    ));
    assert_eq!(
        count_before(&log, "training tokens"),
        count_before(&report, "train tokens")
    );
}

/// Defect 3: a `kill -9` left a partial set that `train` read without a word, and
/// temporary files nothing removed. Now the old set stays whole, the leftover is removed
/// by the next prepare, and a set missing a shard (a partial copy) is refused.
#[cfg(unix)]
#[test]
fn a_killed_prepare_leaves_the_old_set_and_the_next_removes_its_leftovers() {
    let tmp = prepared("50");
    let dir = tmp.path();
    let manifest = bytes(dir.join("data/manifest.json"));
    let mut first = spawn_prepare(dir, large_corpus(dir));
    wait_for_temporary(dir);
    signal(first.id(), "KILL");
    first.wait().unwrap();
    assert_eq!(temporaries(dir).len(), 1);
    assert!(
        dir.join(".data.lock").exists(),
        "a killed holder leaves its lock file"
    );
    assert_eq!(
        bytes(dir.join("data/manifest.json")),
        manifest,
        "the old set changed"
    );
    ok(dir, &[TRAIN_TINY, &["--out", "r", "--steps", "1"]].concat());
    let report = stderr(&ok(dir, &prepare_args("data", "data")));
    assert!(report.contains("did not finish"), "{report}");
    assert!(temporaries(dir).is_empty(), "{:?}", file_names(dir));
    assert!(
        !dir.join(".data.lock").exists(),
        "and the next one removes it"
    );

    // A set whose manifest lists a shard that is not there, or not whole.
    let shard = dir.join("data/data_train_000000.bin");
    let whole = bytes(&shard);
    std::fs::write(&shard, &whole[..whole.len() - 2]).unwrap();
    let train = [TRAIN_TINY, &["--out", "r2", "--steps", "1"]].concat();
    fails_with(dir, &train, "incomplete or damaged");
    std::fs::remove_file(&shard).unwrap();
    let err = fails_with(dir, &train, "incomplete or damaged");
    assert!(err.contains("data_train_000000.bin is missing"), "{err}");
    let eval = [
        "eval",
        "--checkpoint",
        "r/latest",
        "--data",
        "data",
        "--seq-len",
        "8",
    ];
    fails_with(dir, &eval, "incomplete or damaged");
}

/// Defect 4: shards without their `tokenizer.json` were checked against nothing; the
/// manifest's fingerprint now refuses another tokenizer of the same size.
#[test]
fn shards_without_their_tokenizer_are_checked_by_the_manifest() {
    let tmp = trained("50");
    let dir = tmp.path();
    reversed_tokenizer(dir);
    ok(
        dir,
        &[
            "prepare",
            "corpus",
            "--tokenizer",
            "alt.json",
            "--out",
            "altdata",
        ],
    );
    std::fs::remove_file(dir.join("altdata/tokenizer.json")).unwrap();
    let eval = [
        "eval",
        "--checkpoint",
        "run/latest",
        "--seq-len",
        "8",
        "--data",
        "altdata",
    ];
    let err = fails_with(dir, &eval, "differs from the model's");
    assert!(err.contains("manifest.json"), "{err}");
    let init = [
        "train",
        "--init",
        "run/latest",
        "--out",
        "ft",
        "--steps",
        "1",
        "--data",
        "altdata",
    ];
    fails_with(dir, &init, "differs from the model's");
    // One shard file of a set is checked the same way.
    let file = [
        "eval",
        "--checkpoint",
        "run/latest",
        "--seq-len",
        "8",
        "--data",
        "altdata/data_val_000000.bin",
    ];
    fails_with(dir, &file, "differs from the model's");
}

/// The validation split taking all of a small input is said as that, and nothing is
/// written; an `--out` holding other files is not replaced.
#[test]
fn what_prepare_cannot_do_is_said_and_nothing_is_replaced() {
    let tmp = prepared("50");
    let dir = tmp.path();
    std::fs::create_dir(dir.join("word")).unwrap();
    // One word of 3000 bytes: no place to cut it, so the validation tenth takes it all.
    std::fs::write(dir.join("word/a.txt"), "a".repeat(3000)).unwrap();
    let args = [
        "prepare",
        "word",
        "--tokenizer",
        "tokenizer.json",
        "--out",
        "w",
    ];
    let err = fails_with(
        dir,
        &args,
        "the validation split took all the text (1 files, 3000 bytes",
    );
    assert!(err.contains("--val-fraction"), "{err}");
    assert!(!dir.join("w").exists());
    assert!(temporaries(dir).is_empty());
    // --out holding the user's files.
    let args = [
        "prepare",
        "corpus",
        "--tokenizer",
        "tokenizer.json",
        "--out",
        "corpus",
    ];
    let err = fails_with(dir, &args, "not part of a shard set");
    assert!(err.contains("doc0.txt"), "{err}");
    assert_eq!(file_names(&dir.join("corpus")).len(), 3);
}

/// `--text-field` names the JSON Lines field; `--no-eot` drops the separator before
/// each of the documents; a wrong field is named with the fields there are.
#[test]
fn json_lines_with_a_text_field_and_without_separators() {
    let tmp = prepared("50");
    let dir = tmp.path();
    let lines: String = (0..50)
        .map(|i| format!("{{\"id\": {i}, \"content\": \"the cat sat on mat {i}.\"}}\n"))
        .collect();
    std::fs::write(dir.join("docs.jsonl"), lines).unwrap();
    let base = [
        "prepare",
        "docs.jsonl",
        "--tokenizer",
        "tokenizer.json",
        "--val-fraction",
        "0",
    ];
    let with = stderr(&ok(
        dir,
        &[&base[..], &["--out", "a", "--text-field", "content"]].concat(),
    ));
    let without = stderr(&ok(
        dir,
        &[
            &base[..],
            &["--out", "b", "--text-field", "content", "--no-eot"],
        ]
        .concat(),
    ));
    assert_eq!(
        count_before(&with, "train tokens"),
        count_before(&without, "train tokens") + 50
    );
    let err = fails_with(
        dir,
        &[&base[..], &["--out", "c"]].concat(),
        "no field \"text\"",
    );
    assert!(
        err.contains("id, content") || err.contains("content, id"),
        "{err}"
    );
}
