//! `andrea demo`: the whole pipeline on a corpus the program writes itself (no download,
//! no third-party text): short stories from a small grammar, then `tokenizer train`,
//! `prepare`, `train` of a small model, and samples at the end.
//!
//! The grammar is the project's own: a few hundred words in sentence templates, drawn
//! with a seeded generator, so the corpus is the same on every machine and the model has
//! real structure to learn (agreement, word order, punctuation) within minutes.

use std::fmt::Write as _;
use std::io::Write as _;
use std::path::Path;

use andrea::model::rng::Rng;
use andrea::Backend;
use anyhow::{Context, Result};

use crate::cli::{
    DemoArgs, GenerateArgs, PrepareArgs, TokenizerTrainArgs, TrainArgs, DEFAULT_CONFIG,
};

const NAMES: &[&str] = &[
    "Ada", "Ben", "Cleo", "Dan", "Eva", "Finn", "Gus", "Hana", "Ivo", "June", "Kai", "Lena",
];
const ANIMALS: &[&str] = &[
    "cat", "dog", "fox", "owl", "horse", "rabbit", "bird", "mouse", "bear", "duck",
];
const ADJECTIVES: &[&str] = &[
    "little", "old", "happy", "quiet", "brave", "tired", "clever", "small", "big", "kind",
    "sleepy", "curious",
];
const PLACES: &[&str] = &[
    "the forest",
    "the river",
    "the garden",
    "the town",
    "the hill",
    "the old house",
    "the market",
    "the lake",
    "the school",
    "the field",
];
const THINGS: &[&str] = &[
    "a red ball",
    "a blue kite",
    "an apple",
    "a book",
    "a warm hat",
    "a small boat",
    "a map",
    "a green box",
    "some bread",
    "a lamp",
];
const VERBS: &[(&str, &str)] = &[
    ("walked to", "walks to"),
    ("ran to", "runs to"),
    ("looked at", "looks at"),
    ("went to", "goes to"),
    ("sang near", "sings near"),
    ("played in", "plays in"),
];
const FEELINGS: &[&str] = &["happy", "sad", "surprised", "sleepy", "hungry", "proud"];

/// One of `items`, uniformly (the production RNG: seeded, the same everywhere).
fn pick<'a, T>(rng: &mut Rng, items: &'a [T]) -> &'a T {
    &items[(rng.next_u64() >> 33) as usize % items.len()]
}

fn story(rng: &mut Rng) -> String {
    let name = *pick(rng, NAMES);
    let animal = *pick(rng, ANIMALS);
    let adj = *pick(rng, ADJECTIVES);
    let mut s = String::new();
    let _ = write!(
        s,
        "Once upon a time there was a {adj} {animal} named {name}. "
    );
    for _ in 0..3 + (pick(rng, &[0, 1, 2, 3]) % 4) {
        let place = *pick(rng, PLACES);
        let thing = *pick(rng, THINGS);
        let (past, _) = *pick(rng, VERBS);
        let feeling = *pick(rng, FEELINGS);
        let line = match pick(rng, &[0, 1, 2, 3, 4]) {
            0 => format!("One day {name} {past} {place}. "),
            1 => format!("There {name} found {thing}. "),
            2 => format!("The {animal} was {feeling}. "),
            3 => format!("\"Look at this!\" said {name}. "),
            _ => format!("{name} took {thing} and {past} {place}. "),
        };
        s.push_str(&line);
    }
    let friend = *pick(rng, ANIMALS);
    let _ = write!(
        s,
        "In the end {name} and the {friend} were friends, and they were {}.\n\n",
        pick(rng, FEELINGS)
    );
    s
}

/// Writes `files` text files of about `bytes` bytes in total into `dir`.
pub fn write_corpus(dir: &Path, bytes: usize, files: usize, seed: u64) -> Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let mut rng = Rng::new(seed);
    for f in 0..files {
        // Streamed story by story: memory stays small whatever --corpus-bytes is.
        let path = dir.join(format!("stories_{f:02}.txt"));
        let what = || format!("cannot write {}", path.display());
        andrea_fs::check_output_file(&path).with_context(what)?;
        let mut w = std::io::BufWriter::new(std::fs::File::create(&path).with_context(what)?);
        let mut written = 0;
        while written < bytes / files {
            let s = story(&mut rng);
            w.write_all(s.as_bytes()).with_context(what)?;
            written += s.len();
        }
        w.flush().with_context(what)?;
    }
    Ok(())
}

/// `configs/tiny.toml`, built in so that `andrea demo` runs from any directory.
const TINY_CONFIG: &str = include_str!("../../../configs/tiny.toml");

/// `backend` makes the backend the training runs on and the one the samples are drawn
/// on (the first is dropped with its trainer before the second is made).
pub fn run<B: Backend>(args: &DemoArgs, backend: &mut dyn FnMut() -> Result<B>) -> Result<i32> {
    // Made first, so that a backend that cannot start fails before any work.
    let train_backend = backend()?;
    let out = &args.out;
    andrea_fs::check_output_dir(out)
        .with_context(|| format!("--out {}: name a new or existing directory", out.display()))?;
    let mut config = args.config.clone();
    if !config.exists() && config == Path::new(DEFAULT_CONFIG) {
        std::fs::create_dir_all(out).with_context(|| format!("cannot create {}", out.display()))?;
        config = out.join("tiny.toml");
        std::fs::write(&config, TINY_CONFIG)
            .with_context(|| format!("cannot write {}", config.display()))?;
    }
    let corpus = out.join("corpus");
    errln!("1/4 writing a generated corpus to {}", corpus.display());
    write_corpus(&corpus, args.corpus_bytes, 4, 1)?;
    errln!("2/4 training a tokenizer ({} merges)", args.merges);
    let tok = out.join("tokenizer.json");
    crate::tokenizer_cmd::train(&TokenizerTrainArgs {
        inputs: vec![corpus.clone()],
        out: tok.clone(),
        merges: args.merges,
        min_frequency: 2,
        text_field: "text".into(),
    })?;
    errln!("3/4 encoding it into token shards");
    let data = out.join("data");
    crate::prepare::run(&PrepareArgs {
        inputs: vec![corpus],
        tokenizer: tok,
        out: data.clone(),
        val_fraction: 0.05,
        prefix: "stories".into(),
        shard_tokens: 100_000_000,
        text_field: "text".into(),
        no_eot: false,
    })?;
    errln!("4/4 training {} for {} steps", config.display(), args.steps);
    let train = TrainArgs {
        config: Some(config),
        data: Some(data),
        out: Some(out.join("run")),
        overwrite: true,
        steps: Some(args.steps),
        batch_size: Some(args.batch_size),
        seq_len: Some(args.seq_len),
        lr: Some(args.lr),
        warmup_steps: Some(args.steps / 10),
        eval_every: Some((args.steps / 5).max(1)),
        eval_batches: Some(8),
        sample_every: Some(0),
        checkpoint_every: Some(0),
        log_every: Some((args.steps / 20).max(1)),
        ..TrainArgs::default()
    };
    let code = crate::train::run(&train, train_backend)?;
    if code != 0 {
        return Ok(code);
    }
    let checkpoint = out.join("run/latest");
    errln!(
        "\nsamples (more with: andrea generate --checkpoint {} --prompt \"Once upon a time\"):\n",
        checkpoint.display()
    );
    let loaded = crate::checkpoint::load(&checkpoint, backend()?)?;
    for seed in 1..=3 {
        crate::generate::print(
            &GenerateArgs {
                checkpoint: checkpoint.clone(),
                prompt: "Once upon a time".into(),
                max_new_tokens: 60,
                temperature: 0.8,
                top_k: 40,
                top_p: 1.0,
                seed,
            },
            &loaded,
        )?;
        outln!()?;
    }
    Ok(0)
}
