//! A mutation fuzzer over every file andrea reads, on stable Rust (proptest drives the
//! mutations; cargo-fuzz would need nightly). Each target starts from a valid file —
//! a checkpoint andrea writes, transformers' GPT-2 `vocab.json` + `merges.txt`, a token
//! shard, a TOML config — mutates it (bit flips, truncations, splices of its own bytes,
//! insertions of hostile tokens such as huge numbers and paths outside the checkpoint,
//! 64-bit lengths written over its bytes) and runs the same code the commands run.
//! Each case must return (`Ok` or an error) without a panic; an abort (an allocation
//! that is not fallible) or a hang ends the whole test binary, which fails too.
//!
//! Reads outside the checkpoint: the fuzzer plants a FIFO next to the checkpoint and
//! inserts its name (relative and absolute) into the files; opening it would block, and
//! a watchdog fails the run when no case finishes for five minutes.
//!
//! `cargo test -p andrea-cli --bin andrea fuzz` runs a short mode (a few thousand cases
//! in all); `ANDREA_FUZZ_CASES=1000000` sets the total for a long run (split evenly
//! over the targets); the count and the time are printed.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use andrea::{Model, ModelConfig, OptimizerConfig, Trainer};
use andrea_tokenizer::Tokenizer;
use proptest::prelude::*;
use proptest::sample::Index;
use proptest::test_runner::{Config, TestCaseError, TestRunner};

use crate::checkpoint::{self, TrainingState};
use crate::data::{DataPosition, ShardSet};
use crate::settings::{FileConfig, TrainSettings};

/// Cases in all in the short mode.
const SHORT_CASES: u64 = 4000;

/// One change to a file's bytes.
#[derive(Debug, Clone)]
enum Mutation {
    Flip(Index, u8),
    Truncate(Index),
    /// Copy `len` bytes from one place over another (a splice of the file with itself).
    Splice(Index, Index, u8),
    Delete(Index, u8),
    /// Insert one of [`TOKENS`].
    Insert(Index, Index),
    /// Write a 64-bit little-endian length over 8 bytes (safetensors' header length,
    /// a shard's counts).
    Length(Index, Index),
}

/// Values that break naive parsers: huge and negative numbers, non-numbers, paths
/// leaving the checkpoint (the FIFO trap among them), odd JSON.
const TOKENS: &[&str] = &[
    "18446744073709551615",
    "9223372036854775808",
    "4294967296",
    "1099511627776",
    "-1",
    "1e400",
    "NaN",
    "-0.0",
    "null",
    "[]",
    "{}",
    "\"\"",
    "\"../trap\"",
    "\"../../trap\"",
    "\"/dev/zero\"",
    "\"model.safetensors\"",
    "\\u0000",
    "<|endoftext|>",
    "\u{1F600}",
    "\"dtype\":\"I64\"",
    "\"shape\":[4294967296,4294967296]",
    "\"data_offsets\":[0,18446744073709551615]",
    "n_layer = 4096\n",
    "d_model = 1073741824\n",
    "[training]\nbatch_size = 65536\nseq_len = 1048576\n",
];

const LENGTHS: &[u64] = &[
    u64::MAX,
    i64::MAX as u64,
    1 << 62,
    1 << 40,
    1 << 32,
    u32::MAX as u64,
    i32::MAX as u64,
    0,
    1,
];

fn mutation() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        4 => (any::<Index>(), 0u8..8).prop_map(|(i, b)| Mutation::Flip(i, b)),
        1 => any::<Index>().prop_map(Mutation::Truncate),
        1 => (any::<Index>(), any::<Index>(), 1u8..64).prop_map(|(a, b, n)| Mutation::Splice(a, b, n)),
        1 => (any::<Index>(), 1u8..32).prop_map(|(a, n)| Mutation::Delete(a, n)),
        2 => (any::<Index>(), any::<Index>()).prop_map(|(a, t)| Mutation::Insert(a, t)),
        1 => (any::<Index>(), any::<Index>()).prop_map(|(a, v)| Mutation::Length(a, v)),
    ]
}

fn apply(bytes: &mut Vec<u8>, m: &Mutation, trap: &str) {
    let at = |i: &Index, len: usize| if len == 0 { 0 } else { i.index(len) };
    match m {
        Mutation::Flip(i, bit) if !bytes.is_empty() => {
            let p = at(i, bytes.len());
            bytes[p] ^= 1 << bit;
        }
        Mutation::Truncate(i) => {
            let p = at(i, bytes.len() + 1);
            bytes.truncate(p);
        }
        Mutation::Splice(a, b, n) if !bytes.is_empty() => {
            let (from, to) = (at(a, bytes.len()), at(b, bytes.len()));
            let n = (*n as usize).min(bytes.len() - from).min(bytes.len() - to);
            let chunk = bytes[from..from + n].to_vec();
            bytes[to..to + n].copy_from_slice(&chunk);
        }
        Mutation::Delete(a, n) if !bytes.is_empty() => {
            let p = at(a, bytes.len());
            let end = (p + *n as usize).min(bytes.len());
            bytes.drain(p..end);
        }
        Mutation::Insert(a, t) => {
            let p = at(a, bytes.len() + 1);
            let token = TOKENS[t.index(TOKENS.len())].replace("/dev/zero", trap);
            bytes.splice(p..p, token.into_bytes());
        }
        Mutation::Length(a, v) if bytes.len() >= 8 => {
            // Mostly at the start, where formats keep their lengths.
            let p = if a.index(4) == 0 {
                at(a, bytes.len() - 7)
            } else {
                at(a, 16.min(bytes.len() - 7))
            };
            let v = LENGTHS[v.index(LENGTHS.len())];
            bytes[p..p + 8].copy_from_slice(&v.to_le_bytes());
        }
        _ => {}
    }
}

/// Cases finished by any target, for the watchdog.
static PROGRESS: AtomicU64 = AtomicU64::new(0);

/// Fails the run (by aborting the test binary) when no case finishes for 5 minutes: a
/// loader blocked on the FIFO trap, or one that never ends.
fn start_watchdog() {
    static STARTED: OnceLock<()> = OnceLock::new();
    STARTED.get_or_init(|| {
        std::thread::spawn(|| {
            let (mut last, mut stalled, start) = (u64::MAX, 0, Instant::now());
            loop {
                std::thread::sleep(Duration::from_secs(60));
                let now = PROGRESS.load(Ordering::Relaxed);
                // A long run reports as it goes, so a stopped one still says how far it got.
                eprintln!(
                    "fuzz: {now} cases done, 0 panics, {:.0} s",
                    start.elapsed().as_secs_f64()
                );
                // Five minutes without a case: a starved machine is slow, not that slow.
                stalled = if now == last { stalled + 1 } else { 0 };
                if stalled == 5 {
                    eprintln!(
                        "fuzz: no case finished for 60 s (a hang, or a read of the FIFO trap)"
                    );
                    std::process::abort();
                }
                last = now;
            }
        });
    });
}

/// The training state of the seed checkpoint (step 3 of a run with default settings).
fn seed_state() -> TrainingState {
    TrainingState {
        format: 1,
        step: 3,
        data_position: DataPosition::default(),
        rng_state: 7,
        settings: TrainSettings::defaults(16),
        files: Vec::new(),
    }
}

/// The valid files every target starts from, in `root/seed/`, and the FIFO trap in
/// `root/trap`.
struct Seeds {
    root: tempfile::TempDir,
    vocab: usize,
}

impl Seeds {
    fn new() -> Seeds {
        let root = tempfile::tempdir().unwrap();
        let text = "the model reads a small story about rivers and trains every day. ".repeat(40);
        let config = andrea_tokenizer::TrainConfig {
            merges: 40,
            show_progress: false,
            ..Default::default()
        };
        let (tokenizer, _) = andrea_tokenizer::train_from_texts(&[&text], &config).unwrap();
        let vocab = tokenizer.vocab_size();
        let mut cfg = ModelConfig::new(vocab, 16, 16, 1, 2);
        cfg.eos_token_id = tokenizer.eot_id();
        let model = Model::new(andrea::DefaultBackend::new(), cfg, 1).unwrap();
        let trainer = Trainer::new(model, OptimizerConfig::default(), 1, 8).unwrap();
        let run = root.path().join("run");
        let state = seed_state();
        let ck = checkpoint::save(&run, &trainer, &tokenizer, state).unwrap();
        std::fs::rename(ck, root.path().join("seed")).unwrap();
        let seed = root.path().join("seed");
        // A shard of the text, an andrea TOML config, GPT-2's vocab.json + merges.txt.
        let ids = tokenizer.encode(&text);
        let mut shard: Vec<u8> = [20240520i32, 1, ids.len() as i32, vocab as i32]
            .iter()
            .chain(std::iter::repeat_n(&0i32, 252))
            .flat_map(|v| v.to_le_bytes())
            .collect();
        shard.extend(ids.iter().flat_map(|&t| (t as u16).to_le_bytes()));
        std::fs::write(seed.join("data_train_000000.bin"), shard).unwrap();
        std::fs::write(
            seed.join("model.toml"),
            "[model]\nvocab_size = 300\ncontext_length = 16\nd_model = 16\nn_layer = 1\nn_head = 2\n\
             [optimizer]\nlr = 1e-3\n[schedule]\nwarmup_steps = 1\ntotal_steps = 10\n\
             [training]\nbatch_size = 2\nseq_len = 8\n",
        )
        .unwrap();
        let fixtures =
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../andrea-tokenizer/tests/fixtures");
        for (from, to) in [
            ("hf-vocab.json", "vocab.json"),
            ("hf-merges.txt", "merges.txt"),
        ] {
            std::fs::copy(fixtures.join(from), seed.join(to)).unwrap();
        }
        let trap = root.path().join("trap");
        let made = std::process::Command::new("mkfifo").arg(&trap).status();
        assert!(made.is_ok_and(|s| s.success()), "mkfifo {}", trap.display());
        Seeds { root, vocab }
    }

    fn seed(&self) -> PathBuf {
        self.root.path().join("seed")
    }

    fn trap(&self) -> String {
        self.root.path().join("trap").display().to_string()
    }
}

/// What a target runs on the case directory `dir` after its file was mutated.
type Loader = fn(&Path, usize) -> anyhow::Result<()>;

fn load_checkpoint(dir: &Path, _: usize) -> anyhow::Result<()> {
    let loaded = checkpoint::load(dir, andrea::DefaultBackend::new())?;
    // Run what generate runs on what loaded: two tokens.
    let tokenizer = loaded.tokenizer()?;
    let mut sampler = crate::generate::sampler(1.0, 0, 1.0, 1)?;
    let prompt = crate::generate::prompt_ids(tokenizer, "the");
    crate::generate::stream(&loaded.model, tokenizer, &prompt, 2, &mut sampler, |_| {
        Ok(())
    })?;
    Ok(())
}

fn load_model_dir(dir: &Path, _: usize) -> anyhow::Result<()> {
    Model::load(andrea::DefaultBackend::new(), dir)?;
    Ok(())
}

fn load_optimizer(dir: &Path, _: usize) -> anyhow::Result<()> {
    let model = Model::load(andrea::DefaultBackend::new(), dir)?;
    let mut trainer = Trainer::new(model, OptimizerConfig::default(), 1, 8)?;
    trainer.load_optimizer_state(dir.join(checkpoint::OPTIMIZER_FILE))?;
    Ok(())
}

fn verify_state(dir: &Path, _: usize) -> anyhow::Result<()> {
    checkpoint::verify(dir)?;
    Ok(())
}

/// A tokenizer that loads must also encode and decode.
fn use_tokenizer(t: &Tokenizer) -> anyhow::Result<()> {
    let ids = t.encode_with_special_tokens("the river <|endoftext|> caf\u{e9} \u{1F600}");
    t.decode(&ids)?;
    t.decode(&[0, 1, u32::MAX])
        .map(|_| ())
        .or(Ok::<(), anyhow::Error>(()))?;
    Ok(())
}

fn load_tokenizer(dir: &Path, _: usize) -> anyhow::Result<()> {
    use_tokenizer(&Tokenizer::load(dir.join(checkpoint::TOKENIZER_FILE))?)
}

fn load_gpt2_files(dir: &Path, _: usize) -> anyhow::Result<()> {
    use_tokenizer(&Tokenizer::from_gpt2_files(
        dir.join("vocab.json"),
        dir.join("merges.txt"),
    )?)
}

fn read_shard(dir: &Path, vocab: usize) -> anyhow::Result<()> {
    let set = ShardSet::open(dir, "train")?;
    set.check(vocab, 9, "training")?;
    let (mut pos, mut buf) = (DataPosition::default(), Vec::new());
    for _ in 0..4 {
        set.next_window(&mut pos, 9, 8, &mut buf)?;
    }
    Ok(())
}

fn read_toml(dir: &Path, _: usize) -> anyhow::Result<()> {
    let file = FileConfig::read(&dir.join("model.toml"))?;
    let mut settings = TrainSettings::defaults(file.model.context_length);
    settings.apply_file(&file);
    settings.data = dir.join("data_train_000000.bin");
    settings.validate(&file.model)?;
    crate::limits::check_step(&file.model, settings.batch_size, settings.seq_len)?;
    Ok(())
}

/// The targets: a name, the files of the case directory (the first is mutated), and
/// the loader.
const TARGETS: &[(&str, &[&str], Loader)] = &[
    (
        "checkpoint (training_state.json)",
        &[
            "training_state.json",
            "model.safetensors",
            "config.json",
            "tokenizer.json",
            "optimizer.safetensors",
        ],
        load_checkpoint,
    ),
    (
        "checkpoint (model.safetensors)",
        &[
            "model.safetensors",
            "training_state.json",
            "config.json",
            "tokenizer.json",
            "optimizer.safetensors",
        ],
        load_checkpoint,
    ),
    (
        "transformers dir (model.safetensors)",
        &["model.safetensors", "config.json"],
        load_model_dir,
    ),
    (
        "transformers dir (config.json)",
        &["config.json", "model.safetensors"],
        load_model_dir,
    ),
    (
        "optimizer.safetensors",
        &["optimizer.safetensors", "model.safetensors", "config.json"],
        load_optimizer,
    ),
    (
        "training_state.json",
        &[
            "training_state.json",
            "model.safetensors",
            "config.json",
            "tokenizer.json",
            "optimizer.safetensors",
        ],
        verify_state,
    ),
    ("tokenizer.json", &["tokenizer.json"], load_tokenizer),
    ("vocab.json", &["vocab.json", "merges.txt"], load_gpt2_files),
    ("merges.txt", &["merges.txt", "vocab.json"], load_gpt2_files),
    ("token shard", &["data_train_000000.bin"], read_shard),
    ("TOML config", &["model.toml"], read_toml),
];

/// Runs `cases` mutated cases of one target; returns the count of cases that loaded
/// (the rest were refused with an error).
fn fuzz_target(seeds: &Seeds, (name, files, loader): &(&str, &[&str], Loader), cases: u32) -> u32 {
    let dir = seeds
        .root
        .path()
        .join(format!("case-{}", name.replace([' ', '(', ')', '.'], "_")));
    std::fs::create_dir_all(&dir).unwrap();
    for f in *files {
        std::fs::copy(seeds.seed().join(f), dir.join(f)).unwrap();
    }
    let target = dir.join(files[0]);
    let original = std::fs::read(&target).unwrap();
    let trap = seeds.trap();
    let loaded = std::cell::Cell::new(0u32);
    let mut runner = TestRunner::new(Config {
        cases,
        failure_persistence: None,
        max_shrink_iters: 200,
        ..Config::default()
    });
    let strategy = proptest::collection::vec(mutation(), 1..5);
    let result = runner.run(&strategy, |mutations| {
        let mut bytes = original.clone();
        for m in &mutations {
            apply(&mut bytes, m, &trap);
        }
        std::fs::write(&target, &bytes).unwrap();
        let outcome = catch_unwind(AssertUnwindSafe(|| loader(&dir, seeds.vocab)));
        PROGRESS.fetch_add(1, Ordering::Relaxed);
        match outcome {
            Ok(Ok(())) => {
                loaded.set(loaded.get() + 1);
                Ok(())
            }
            Ok(Err(_)) => Ok(()),
            Err(_) => {
                let keep = std::env::temp_dir().join(format!("andrea-fuzz-panic-{}", files[0]));
                let _ = std::fs::write(&keep, &bytes);
                Err(TestCaseError::fail(format!(
                    "{name}: the loader panicked on {mutations:?} (input kept in {})",
                    keep.display()
                )))
            }
        }
    });
    if let Err(e) = result {
        panic!("{e}");
    }
    loaded.get()
}

#[test]
fn fuzz_every_loader() {
    let total: u64 = std::env::var("ANDREA_FUZZ_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(SHORT_CASES);
    let per_target = (total / TARGETS.len() as u64).clamp(1, u32::MAX as u64) as u32;
    start_watchdog();
    let seeds = Seeds::new();
    // The seeds themselves load: a fuzzer whose every case fails on a broken seed
    // would test nothing.
    let start = Instant::now();
    let mut done = 0u64;
    for target in TARGETS {
        let seed_dir = seeds.seed();
        (target.2)(&seed_dir, seeds.vocab)
            .unwrap_or_else(|e| panic!("the seed of {} does not load: {e:#}", target.0));
        let t = Instant::now();
        let loaded = fuzz_target(&seeds, target, per_target);
        done += per_target as u64;
        eprintln!(
            "fuzz: {:<40} {per_target} cases, {loaded} loaded, the rest refused, {:.1} s",
            target.0,
            t.elapsed().as_secs_f64()
        );
    }
    eprintln!(
        "fuzz: {done} cases over {} targets in {:.1} s, 0 panics",
        TARGETS.len(),
        start.elapsed().as_secs_f64()
    );
}

/// What can stand where andrea expects a file a user or a run left there.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Special {
    /// A FIFO: opening it for reading blocks until a writer comes.
    Fifo,
    /// A character device like `/dev/null` (1, 3), made in the case directory.
    CharDevice,
    /// A symbolic link to `/proc/self/status`: a regular file that reports size 0.
    ProcFile,
}

/// Puts `kind` at `path` (replacing what is there); `false` where this process may not
/// make one (a character device needs root or CAP_MKNOD), with the reason printed once.
fn plant(path: &Path, kind: Special) -> bool {
    let _ = std::fs::remove_file(path);
    let made = match kind {
        Special::Fifo => std::process::Command::new("mkfifo").arg(path).output(),
        Special::CharDevice => std::process::Command::new("mknod")
            .arg(path)
            .args(["c", "1", "3"])
            .output(),
        Special::ProcFile => {
            return std::os::unix::fs::symlink("/proc/self/status", path).is_ok();
        }
    };
    let ok = made.as_ref().is_ok_and(|o| o.status.success());
    if !ok {
        static SAID: OnceLock<()> = OnceLock::new();
        SAID.get_or_init(|| {
            eprintln!("fuzz: SKIPPED the {kind:?} cases: cannot make one here ({made:?})")
        });
    }
    ok
}

/// Whether `path` is still the `kind` [`plant`] put there.
fn still(path: &Path, kind: Special) -> bool {
    use std::os::unix::fs::FileTypeExt;
    let Ok(meta) = std::fs::symlink_metadata(path) else {
        return false;
    };
    match kind {
        Special::Fifo => meta.file_type().is_fifo(),
        Special::CharDevice => meta.file_type().is_char_device(),
        Special::ProcFile => meta.file_type().is_symlink(),
    }
}

const SPECIALS: [Special; 3] = [Special::Fifo, Special::CharDevice, Special::ProcFile];

/// Every file of every target replaced in turn by a FIFO, a character device and a
/// `/proc` file: each loader returns (a FIFO or a device is refused; a `/proc` file is
/// read within its bound and refused or taken as text), never blocks (the watchdog) or
/// panics, and leaves the special file as it was. Then every writer with a special file
/// at its output path: a FIFO or a device is refused and kept; a link to the `/proc`
/// file may be replaced by a regular file (the link, never the file it names).
#[test]
fn special_files_in_place_of_every_input_and_output() {
    start_watchdog();
    let seeds = Seeds::new();
    let dir = seeds.root.path().join("special");
    for (name, files, loader) in TARGETS {
        for (i, file) in files.iter().enumerate() {
            for kind in SPECIALS {
                let _ = std::fs::remove_dir_all(&dir);
                std::fs::create_dir_all(&dir).unwrap();
                for f in *files {
                    std::fs::copy(seeds.seed().join(f), dir.join(f)).unwrap();
                }
                if !plant(&dir.join(file), kind) {
                    continue;
                }
                let outcome = catch_unwind(AssertUnwindSafe(|| loader(&dir, seeds.vocab)));
                PROGRESS.fetch_add(1, Ordering::Relaxed);
                let what = format!("{name}: file {i} ({file}) a {kind:?}");
                match outcome {
                    Err(_) => panic!("{what}: the loader panicked"),
                    Ok(Ok(())) if kind != Special::ProcFile => panic!("{what}: it loaded"),
                    Ok(_) => {}
                }
                assert!(still(&dir.join(file), kind), "{what}: replaced");
            }
        }
    }
    // The writers.
    let model = Model::load(andrea::DefaultBackend::new(), seeds.seed()).unwrap();
    let tokenizer = Tokenizer::load(seeds.seed().join(checkpoint::TOKENIZER_FILE)).unwrap();
    let trainer = Trainer::new(model, OptimizerConfig::default(), 1, 8).unwrap();
    let state = seed_state;
    type Writer<'a> = (&'a str, Box<dyn Fn(&Path) -> anyhow::Result<()> + 'a>);
    let writers: Vec<Writer> = vec![
        (
            "tokenizer.json",
            Box::new(|d| Ok(tokenizer.save(d.join("tokenizer.json"))?)),
        ),
        (
            "model.safetensors",
            Box::new(|d| Ok(trainer.model().save(d)?)),
        ),
        ("config.json", Box::new(|d| Ok(trainer.model().save(d)?))),
        (
            "optimizer.safetensors",
            Box::new(|d| Ok(trainer.save_optimizer_state(d.join("optimizer.safetensors"))?)),
        ),
        (
            "latest",
            Box::new(|d| checkpoint::save(d, &trainer, &tokenizer, state()).map(|_| ())),
        ),
        (
            "step-00000003",
            Box::new(|d| checkpoint::save(d, &trainer, &tokenizer, state()).map(|_| ())),
        ),
        (
            "data_train_000000.bin",
            Box::new(|d| {
                std::fs::write(d.join("a.txt"), "the river and the train. ".repeat(50))?;
                let options = andrea_tokenizer::ShardOptions {
                    val_fraction: 0.0,
                    ..Default::default()
                };
                andrea_tokenizer::write_shards(&tokenizer, &[d.join("a.txt")], d, &options)?;
                Ok(())
            }),
        ),
    ];
    for (file, write) in &writers {
        for kind in SPECIALS {
            let _ = std::fs::remove_dir_all(&dir);
            std::fs::create_dir_all(&dir).unwrap();
            if !plant(&dir.join(file), kind) {
                continue;
            }
            let what = format!("writing {file} over a {kind:?}");
            let outcome = catch_unwind(AssertUnwindSafe(|| write(&dir)));
            match outcome {
                Err(_) => panic!("{what}: panicked"),
                Ok(Ok(())) if kind != Special::ProcFile => panic!("{what}: it was replaced"),
                Ok(_) => {}
            }
            if kind != Special::ProcFile {
                assert!(still(&dir.join(file), kind), "{what}: replaced");
            }
        }
    }
}
