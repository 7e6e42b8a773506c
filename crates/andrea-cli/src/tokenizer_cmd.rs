//! `andrea tokenizer train|encode|decode`.
//!
//! `encode` takes its text from `--text`, a file or stdin, and `decode` its ids from
//! `--ids` or stdin, each at most [`limits::MAX_TEXT_BYTES`]: they print what they
//! make, for looking at and for scripts; `andrea prepare` encodes a corpus of any size.

use std::io::{IsTerminal, Read};
use std::path::Path;

use andrea_tokenizer::{train_from_files, Tokenizer, TrainConfig};
use anyhow::{bail, Context, Result};

use crate::cli::{DecodeArgs, EncodeArgs, TokenizerCommand, TokenizerTrainArgs};
use crate::limits;

pub fn run(cmd: &TokenizerCommand) -> Result<()> {
    match cmd {
        TokenizerCommand::Train(a) => train(a),
        TokenizerCommand::Encode(a) => encode(a),
        TokenizerCommand::Decode(a) => decode(a),
    }
}

/// `tokenizer encode --input`: a text held in memory with its ids (4 bytes per token).
const MAX_ENCODE_INPUT_BYTES: u64 = 1 << 30;

pub fn train(args: &TokenizerTrainArgs) -> Result<()> {
    // Before the work: the output must be a regular file or new, the inputs regular files
    // or directories (a FIFO would block, a device never end).
    andrea_fs::check_output_file(&args.out)
        .with_context(|| format!("cannot write the tokenizer to {}", args.out.display()))?;
    for input in &args.inputs {
        andrea_fs::check_input(input)
            .with_context(|| format!("cannot read the corpus input {}", input.display()))?;
    }
    let config = TrainConfig {
        merges: args.merges,
        min_frequency: args.min_frequency,
        text_field: args.text_field.clone(),
        ..TrainConfig::default()
    };
    let (tokenizer, report) = train_from_files(&args.inputs, &config)
        .context("cannot train the tokenizer (give text files or directories holding some)")?;
    if let Some(dir) = args.out.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir)
            .with_context(|| format!("cannot create the directory {}", dir.display()))?;
    }
    tokenizer
        .save(&args.out)
        .with_context(|| format!("cannot write {}", args.out.display()))?;
    errln!(
        "learned {} merges (of {} asked) from {} files, {} bytes; vocabulary {} ids -> {}",
        report.merges,
        report.requested_merges,
        report.files,
        report.bytes,
        tokenizer.vocab_size(),
        args.out.display()
    );
    Ok(())
}

fn load(path: &std::path::Path) -> Result<Tokenizer> {
    Tokenizer::load(path).with_context(|| {
        format!(
            "cannot load the tokenizer {} (make one with `andrea tokenizer train`)",
            path.display()
        )
    })
}

fn encode(args: &EncodeArgs) -> Result<()> {
    let tokenizer = load(&args.tokenizer)?;
    let fix = "encode a corpus into token shards with `andrea prepare`, or encode it in parts";
    let text = match (&args.text, args.input.as_deref()) {
        (Some(t), _) => t.clone(),
        (None, Some(p)) if p != Path::new("-") => {
            andrea_fs::read_regular_text(p, MAX_ENCODE_INPUT_BYTES).with_context(|| {
                format!(
                    "cannot read {} as UTF-8 text (larger corpora: `andrea prepare`)",
                    p.display()
                )
            })?
        }
        (None, _) => read_stdin("the text to encode", "--text <text> or --input <file>", fix)?,
    };
    let ids = if args.special_tokens {
        tokenizer.encode_with_special_tokens(&text)
    } else {
        tokenizer.encode(&text)
    };
    if args.json {
        outln!("{}", serde_json::to_string(&ids)?)?;
    } else {
        let words: Vec<String> = ids.iter().map(u32::to_string).collect();
        outln!("{}", words.join(" "))?;
    }
    Ok(())
}

/// Ids as a JSON array or separated by commas and whitespace.
pub fn parse_ids(text: &str) -> Result<Vec<u32>> {
    let t = text.trim();
    if t.starts_with('[') {
        return serde_json::from_str(t)
            .context("the ids are not a JSON array of non-negative integers");
    }
    t.split(|c: char| c == ',' || c.is_whitespace())
        .filter(|s| !s.is_empty())
        .map(|s| {
            s.parse::<u32>()
                .with_context(|| format!("`{s}` is not a token id (a non-negative integer)"))
        })
        .collect()
}

fn decode(args: &DecodeArgs) -> Result<()> {
    let tokenizer = load(&args.tokenizer)?;
    let text = match &args.ids {
        Some(s) => s.clone(),
        None => read_stdin("the ids to decode", "--ids <ids>", "decode them in parts")?,
    };
    let ids = parse_ids(&text)?;
    let decoded = tokenizer.decode(&ids)?;
    if args.json {
        outln!("{}", serde_json::to_string(&decoded)?)?;
    } else {
        outln!("{decoded}")?;
    }
    Ok(())
}

/// Stdin's text, `what` being read; on a terminal, first a line saying how to end it
/// (or what to pass instead: `instead`), so a forgotten flag is not a silent wait.
fn read_stdin(what: &str, instead: &str, fix: &str) -> Result<String> {
    let stdin = std::io::stdin();
    if stdin.is_terminal() {
        errln!("reading {what} from stdin (end with Ctrl-D), or pass {instead}");
    }
    read_text(stdin.lock(), "stdin", fix)
}

/// At most [`limits::MAX_TEXT_BYTES`] of UTF-8 text from `source` (named `name` in the
/// errors); more is refused with `fix`, never cut short.
fn read_text(source: impl Read, name: &str, fix: &str) -> Result<String> {
    let max = limits::MAX_TEXT_BYTES;
    let mut bytes = Vec::new();
    source
        .take(max + 1)
        .read_to_end(&mut bytes)
        .with_context(|| format!("cannot read {name}"))?;
    if bytes.len() as u64 > max {
        bail!(
            "{name} holds more than {}, the most `andrea tokenizer` reads at once: {fix}",
            limits::human(max as u128)
        );
    }
    String::from_utf8(bytes).map_err(|e| {
        anyhow::anyhow!(
            "{name} is not UTF-8 text (an invalid byte at offset {}): pass UTF-8 text",
            e.utf8_error().valid_up_to()
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_past_the_bound_is_refused_not_cut() {
        let max = limits::MAX_TEXT_BYTES as usize;
        let fits = vec![b'a'; max];
        assert_eq!(read_text(&fits[..], "x", "fix").unwrap().len(), max);
        let over = vec![b'a'; max + 1];
        let err = read_text(&over[..], "stdin", "split it")
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("stdin holds more than 64") && err.contains("split it"),
            "{err}"
        );
        let err = read_text(&b"ok \xff"[..], "f.txt", "")
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("f.txt is not UTF-8 text") && err.contains("offset 3"),
            "{err}"
        );
    }
}
