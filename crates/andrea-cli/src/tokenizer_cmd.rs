//! `andrea tokenizer train|encode|decode`.

use std::io::Read;

use andrea_tokenizer::{train_from_files, Tokenizer, TrainConfig};
use anyhow::{bail, Context, Result};

use crate::cli::{DecodeArgs, EncodeArgs, TokenizerCommand, TokenizerTrainArgs};

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
    eprintln!(
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
    let text = match (&args.text, &args.input) {
        (Some(t), _) => t.clone(),
        (None, Some(p)) => {
            andrea_fs::read_regular_text(p, MAX_ENCODE_INPUT_BYTES).with_context(|| {
                format!(
                    "cannot read {} as UTF-8 text (larger corpora: `andrea prepare`)",
                    p.display()
                )
            })?
        }
        (None, None) => bail!("pass --text <text> or --input <file>"),
    };
    let ids = if args.special_tokens {
        tokenizer.encode_with_special_tokens(&text)
    } else {
        tokenizer.encode(&text)
    };
    if args.json {
        println!("{}", serde_json::to_string(&ids)?);
    } else {
        let words: Vec<String> = ids.iter().map(u32::to_string).collect();
        println!("{}", words.join(" "));
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
        None => {
            let mut s = String::new();
            std::io::stdin()
                .read_to_string(&mut s)
                .context("cannot read ids from stdin")?;
            s
        }
    };
    let ids = parse_ids(&text)?;
    let decoded = tokenizer.decode(&ids)?;
    if args.json {
        println!("{}", serde_json::to_string(&decoded)?);
    } else {
        println!("{decoded}");
    }
    Ok(())
}
