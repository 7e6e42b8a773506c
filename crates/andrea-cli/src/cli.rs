//! The command line: every subcommand and flag, with its help text. Flags are named in
//! full and stable: scripts drive them.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand, ValueEnum};

#[derive(Debug, Parser)]
#[command(
    name = "andrea",
    version,
    about = "Train a GPT-2-style model (ANDREA-120M or smaller) on your own text and generate from it",
    long_about = "Train a byte-level BPE tokenizer and a GPT-2-style language model on your own \
                  text, watch it learn, resume after an interruption, evaluate it and sample from it.",
    after_help = "Typical session:\n  \
        andrea tokenizer train corpus/ --merges 8192 --out tokenizer.json\n  \
        andrea prepare corpus/ --tokenizer tokenizer.json --out data/\n  \
        andrea train --config configs/tiny.toml --data data/ --out runs/tiny --steps 1000\n  \
        andrea generate --checkpoint runs/tiny/latest --prompt \"Once upon a time\"\n\n\
        Every error exits with status 2 and a message saying what was wrong and how to fix it."
)]
pub struct Cli {
    #[command(flatten)]
    pub global: GlobalArgs,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Args)]
pub struct GlobalArgs {
    /// Number of CPU threads for training, inference and tokenization [default: all cores].
    #[arg(long, global = true, value_name = "N", value_parser = crate::limits::in_range::<1, { crate::limits::MAX_THREADS }>)]
    pub threads: Option<usize>,
    /// `andrea --backend cuda train ...`: the same flags before the command's name.
    #[command(flatten)]
    pub backend: BackendArgs,
}

/// `--backend` and `--precision`, listed by the commands that run a model and accepted
/// before any command's name (`andrea --backend cuda train ...`, the form scripts use);
/// `tokenizer` and `prepare` never run one and do not list them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Args)]
pub struct BackendArgs {
    /// Where the model runs [default: cpu].
    #[arg(long, value_enum)]
    pub backend: Option<BackendKind>,
    /// Arithmetic of --backend cuda [default: tf32] (the CPU backend always computes in FP32).
    #[arg(long, value_enum, value_name = "MODE")]
    pub precision: Option<PrecisionKind>,
}

/// A command's own flags, then `--backend` and `--precision` under their own heading.
#[derive(Debug, Args)]
pub struct WithBackend<T: Args> {
    #[command(flatten)]
    pub args: T,
    #[command(flatten, next_help_heading = "Backend")]
    pub backend: BackendArgs,
}

/// The command's own flags, so a command's `run` takes `&TrainArgs` as before.
impl<T: Args> std::ops::Deref for WithBackend<T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.args
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum BackendKind {
    /// The CPU backend (rayon + SIMD GEMM).
    Cpu,
    /// GPU 0 (NVIDIA, compute capability 8.0+, driver 580+); needs an andrea built with
    /// `--features cuda`.
    Cuda,
}

/// The CUDA backend's arithmetic (`andrea_cuda::Precision`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum PrecisionKind {
    /// FP32 throughout (no tensor cores, exact tanh): agrees with the CPU to f32 rounding.
    Fp32,
    /// Tensor cores with TF32 operands, FP32 accumulation, hardware tanh (the default).
    #[value(alias = "fast")]
    Tf32,
    /// BF16 operands, FP32 accumulation: tensor cores and the hardware tanh on CUDA; on
    /// the CPU, `generate` and `bench decode` from a BF16 copy of the weights.
    Bf16,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// The whole pipeline on a corpus andrea generates (no download): tokenizer, shards,
    /// a small model trained in minutes, samples.
    #[command(after_help = "Example:\n  andrea demo --out runs/demo")]
    Demo(WithBackend<DemoArgs>),
    /// Train, inspect or apply a BPE tokenizer.
    #[command(subcommand)]
    Tokenizer(TokenizerCommand),
    /// Encode text files into train/val token shards (llm.c's format) with a tokenizer.
    #[command(
        after_help = "Example:\n  andrea prepare corpus/ --tokenizer tokenizer.json --out data/ --val-fraction 0.1"
    )]
    Prepare(PrepareArgs),
    /// Train a model from scratch (--config), from weights (--init) or continue a run (--resume).
    #[command(
        after_help = "A setting left out comes from the config file or, with --resume, from \
        the run's saved settings; the [default] after \"else\" applies where neither sets it.\n\n\
        Examples:\n  \
        andrea train --config configs/tiny.toml --data data/ --out runs/tiny --steps 1000\n  \
        andrea train --resume runs/tiny/latest --steps 2000\n  \
        andrea train --init runs/tiny/latest --data mydata/ --out runs/finetune --lr 1e-4"
    )]
    Train(WithBackend<Box<TrainArgs>>),
    /// Mean cross-entropy loss, perplexity and bits per byte of a checkpoint over token shards.
    #[command(
        after_help = "Example:\n  andrea eval --checkpoint runs/tiny/latest --data data/data_val_000000.bin --json"
    )]
    Eval(WithBackend<EvalArgs>),
    /// Generate text from a checkpoint, streaming tokens as they are produced.
    #[command(
        after_help = "Example:\n  andrea generate --checkpoint runs/tiny/latest --prompt \"The\" --max-new-tokens 100 --top-k 40"
    )]
    Generate(WithBackend<GenerateArgs>),
    /// Parameter count, FLOPs per token and training memory of a model.
    #[command(
        after_help = "Examples:\n  andrea info --config configs/andrea-120m.toml --batch-size 8 --seq-len 1024\n  andrea info --checkpoint runs/tiny/latest --json"
    )]
    Info(WithBackend<InfoArgs>),
    /// Tokens per second of training steps or KV-cache decoding (median after warm-up).
    #[command(
        after_help = "Examples:\n  andrea bench train --config configs/tiny.toml --batch-size 8 --seq-len 256 --json\n  andrea bench decode --config configs/andrea-120m.toml --batch-size 1 --seq-len 256 --steps 64"
    )]
    Bench(WithBackend<BenchArgs>),
}

impl Command {
    /// `--backend`/`--precision` as given after the command's name (`None`: the command
    /// runs no model and takes neither).
    pub fn backend_args(&self) -> Option<BackendArgs> {
        match self {
            Command::Demo(a) => Some(a.backend),
            Command::Train(a) => Some(a.backend),
            Command::Eval(a) => Some(a.backend),
            Command::Generate(a) => Some(a.backend),
            Command::Info(a) => Some(a.backend),
            Command::Bench(a) => Some(a.backend),
            Command::Tokenizer(_) | Command::Prepare(_) => None,
        }
    }
}

#[derive(Debug, Subcommand)]
pub enum TokenizerCommand {
    /// Learn BPE merges from text files or directories; writes tokenizer.json.
    #[command(
        after_help = "Example:\n  andrea tokenizer train corpus/ notes.txt --merges 8192 --out tokenizer.json"
    )]
    Train(TokenizerTrainArgs),
    /// Encode text into token ids.
    #[command(
        after_help = "Examples:\n  andrea tokenizer encode --tokenizer tokenizer.json --text \"Hello\" --json\n  \
                      echo Hello | andrea tokenizer encode --tokenizer tokenizer.json"
    )]
    Encode(EncodeArgs),
    /// Decode token ids into text.
    #[command(
        after_help = "Example:\n  andrea tokenizer decode --tokenizer tokenizer.json --ids 72,101,108 "
    )]
    Decode(DecodeArgs),
}

#[derive(Debug, Args)]
pub struct TokenizerTrainArgs {
    /// Text files or directories (read recursively) to learn from.
    #[arg(required = true, value_name = "INPUT")]
    pub inputs: Vec<PathBuf>,
    /// Where to write tokenizer.json.
    #[arg(long, default_value = "tokenizer.json")]
    pub out: PathBuf,
    /// Number of merges (new tokens) to learn; ANDREA-120M uses 8192 (vocabulary 8449).
    #[arg(long, default_value_t = 8192, value_parser = crate::limits::in_range::<0, { crate::limits::MAX_MERGES }>)]
    pub merges: usize,
    /// Merge a pair only if it occurs at least this often.
    #[arg(long, default_value_t = 1)]
    pub min_frequency: u64,
    /// The JSON Lines field or Parquet column that holds the text.
    #[arg(long, default_value = "text")]
    pub text_field: String,
}

#[derive(Debug, Args)]
pub struct EncodeArgs {
    /// The tokenizer.json to use.
    #[arg(long)]
    pub tokenizer: PathBuf,
    /// The text to encode.
    #[arg(long, conflicts_with = "input")]
    pub text: Option<String>,
    /// A file whose text to encode; `-` is stdin [default: stdin when --text is absent too].
    #[arg(long, value_name = "FILE")]
    pub input: Option<PathBuf>,
    /// Recognise `<|endoftext|>` in the text as the special token.
    #[arg(long)]
    pub special_tokens: bool,
    /// Print the ids as one JSON array instead of separated by spaces.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct DecodeArgs {
    /// The tokenizer.json to use.
    #[arg(long)]
    pub tokenizer: PathBuf,
    /// Ids separated by commas or spaces, or a JSON array [default: read from stdin].
    #[arg(long)]
    pub ids: Option<String>,
    /// Print the text as one JSON string.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct PrepareArgs {
    /// Files or directories (read recursively) to encode. By name: `.jsonl`/`.ndjson`
    /// (JSON Lines, the text under --text-field: Hugging Face's `ds.to_json("x.jsonl")`),
    /// `.parquet` (the string column --text-field: `ds.to_parquet("x.parquet")`), any
    /// other file plain text; each may be compressed, named `.gz` or `.zst` after that
    /// (`x.jsonl.gz`).
    #[arg(required = true, value_name = "INPUT")]
    pub inputs: Vec<PathBuf>,
    /// The tokenizer.json to encode with (copied into --out so `train` finds it).
    #[arg(long)]
    pub tokenizer: PathBuf,
    /// Directory for the shard set: `<prefix>_train_000000.bin`, `<prefix>_val_000000.bin`,
    /// `tokenizer.json` and `manifest.json` (shard names, token counts, the tokenizer's
    /// fingerprint). Written next to it as `.<name>.tmp-<pid>` and renamed into place
    /// whole, replacing an earlier set there; refused while another prepare writes it,
    /// and if it holds files that are not a shard set's.
    #[arg(long)]
    pub out: PathBuf,
    /// Fraction of the input bytes, from the start, that goes to the validation shard.
    #[arg(long, default_value_t = 0.1)]
    pub val_fraction: f64,
    /// File name prefix of the shards: a plain name (no `/`, not starting with `.`).
    #[arg(long, default_value = "data")]
    pub prefix: String,
    /// At most this many tokens per shard.
    #[arg(long, default_value_t = 100_000_000)]
    pub shard_tokens: usize,
    /// The JSON Lines field or Parquet column that holds the text.
    #[arg(long, default_value = "text")]
    pub text_field: String,
    /// Do not start each document (a text file, a JSON line, a Parquet row) with
    /// `<|endoftext|>` (GPT-2's and llm.c's separator, written by default).
    #[arg(long)]
    pub no_eot: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LrSchedule {
    /// Linear warmup, then the peak rate.
    Constant,
    /// Linear warmup, then cosine decay to --min-lr at the last step.
    Cosine,
}

/// The order training reads its windows in (see `andrea train --help`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DataOrder {
    /// Every row of every micro-batch its own window of seq_len + 1 tokens, drawn from a
    /// seeded permutation of all windows, a new one each epoch.
    Shuffle,
    /// llm.c's order: the shards front to back, a micro-batch B·T + 1 consecutive tokens.
    Sequential,
}

/// Every training setting; `None` means "from the config file, the resumed run, or the
/// default", in that order.
#[derive(Debug, Default, Args)]
pub struct TrainArgs {
    /// Config in TOML: `[model]`, and optionally `[optimizer]`, `[schedule]`, `[training]`.
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Start from the weights of this checkpoint (fine-tuning); the optimizer starts fresh.
    #[arg(long, conflicts_with = "resume")]
    pub init: Option<PathBuf>,
    /// Continue this checkpoint's run exactly where it stopped (weights, optimizer, data
    /// position).
    #[arg(long)]
    pub resume: Option<PathBuf>,
    /// Training shard, or a directory of `<prefix>_train_NNNNNN.bin` shards of one prefix
    /// [default with --resume: the run's].
    #[arg(long)]
    pub data: Option<PathBuf>,
    /// Validation shard, or a directory of `<prefix>_val_NNNNNN.bin` shards [default: the
    /// --data directory's val shards; with --resume: the run's].
    #[arg(long)]
    pub val_data: Option<PathBuf>,
    /// tokenizer.json [default: the checkpoint's, or tokenizer.json next to the data].
    #[arg(long)]
    pub tokenizer: Option<PathBuf>,
    /// Run directory: checkpoints, metrics.jsonl and `latest` [default with --resume: the
    /// run's].
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Replace a run already in --out.
    #[arg(long)]
    pub overwrite: bool,
    /// Total optimizer steps of the run [default: the config's [training] steps or
    /// [schedule] total_steps, else 1000].
    #[arg(long)]
    pub steps: Option<u64>,
    /// Sequences per micro-batch (B) [default: the config's [training] batch_size, else 8].
    #[arg(long, value_parser = crate::limits::in_range::<1, { crate::limits::MAX_BATCH }>)]
    pub batch_size: Option<usize>,
    /// Tokens per sequence (T, at most the model's context length) [default: the config's
    /// [training] seq_len, else the context length up to 256].
    #[arg(long, value_parser = crate::limits::in_range::<1, { crate::limits::MAX_SEQ }>)]
    pub seq_len: Option<usize>,
    /// Micro-batches per optimizer step: an optimizer step sees B·T·grad_accum tokens (per
    /// rank under mpirun: W ranks see W times as many) [default: the config's [training]
    /// grad_accum, else 1].
    #[arg(long, value_parser = crate::limits::in_range::<1, { crate::limits::MAX_GRAD_ACCUM }>)]
    pub grad_accum: Option<usize>,
    /// Tokens per optimizer step: sets --grad-accum to this / (B·T), which must divide it
    /// (under mpirun the global batch: this / (ranks·B·T) per rank).
    #[arg(long, conflicts_with = "grad_accum")]
    pub total_batch_tokens: Option<usize>,
    /// Peak learning rate [default: the config's [optimizer] lr, else 6e-4].
    #[arg(long)]
    pub lr: Option<f32>,
    /// Learning-rate schedule after the warmup [default: the config's [training]
    /// lr_schedule, else cosine].
    #[arg(long, value_enum)]
    pub lr_schedule: Option<LrSchedule>,
    /// Steps of linear warmup [default: the config's [schedule] warmup_steps, else 0; cut
    /// to --steps when longer].
    #[arg(long)]
    pub warmup_steps: Option<u64>,
    /// Learning rate at the end of the cosine decay [default: --lr times the config's
    /// [schedule] min_lr_ratio, else --lr / 10].
    #[arg(long)]
    pub min_lr: Option<f32>,
    /// AdamW decoupled weight decay, on 2-D tensors only [default: the config's [optimizer]
    /// weight_decay, else 0.1].
    #[arg(long)]
    pub weight_decay: Option<f32>,
    /// AdamW beta1 [default: the config's [optimizer] beta1, else 0.9].
    #[arg(long)]
    pub beta1: Option<f32>,
    /// AdamW beta2 [default: the config's [optimizer] beta2, else 0.95].
    #[arg(long)]
    pub beta2: Option<f32>,
    /// AdamW epsilon [default: the config's [optimizer] eps, else 1e-8].
    #[arg(long)]
    pub eps: Option<f32>,
    /// Clip the global gradient norm to this value; 0 disables clipping [default: the
    /// config's [optimizer] grad_clip, else 1].
    #[arg(long)]
    pub grad_clip: Option<f32>,
    /// Seed of the initialisation and of the samples printed during training [default: the
    /// config's [training] seed, else 1337].
    #[arg(long)]
    pub seed: Option<u64>,
    /// Evaluate on the validation data every N steps (0: only at the end) [default: the
    /// config's [training] eval_every, else 100].
    #[arg(long)]
    pub eval_every: Option<u64>,
    /// Batches per evaluation [default: the config's [training] eval_batches, else 20].
    #[arg(long)]
    pub eval_batches: Option<usize>,
    /// Print a generated sample every N steps (0: only at the end) [default: the config's
    /// [training] sample_every, else 500].
    #[arg(long)]
    pub sample_every: Option<u64>,
    /// Write a checkpoint every N steps (0: only at the end); one is always written at the
    /// end [default: the config's [training] checkpoint_every, else 500].
    #[arg(long)]
    pub checkpoint_every: Option<u64>,
    /// Keep only the newest N checkpoints of the run (0: keep all) [default: 0].
    #[arg(long)]
    pub keep_checkpoints: Option<usize>,
    /// The order of the training data. `shuffle`: every row of every micro-batch is its
    /// own window of seq_len + 1 tokens, and each epoch reads all windows once, in a new
    /// seeded permutation (resumed exactly). `sequential`: the shards front to back as
    /// llm.c reads them (the rows of a batch are neighbours; a corpus of sections trains
    /// on one section after another) [default: the resumed run's order, else shuffle].
    #[arg(long, value_enum)]
    pub data_order: Option<DataOrder>,
    /// The same as --data-order shuffle.
    #[arg(long, conflicts_with = "data_order")]
    pub shuffle: bool,
    /// Stop after this step with a checkpoint, as Ctrl-C would, without changing the
    /// schedule (which still runs to --steps): `--resume` continues from there.
    #[arg(long, value_name = "STEP")]
    pub stop_at: Option<u64>,
    /// Print a log line every N steps when stderr is not a terminal (no progress bar)
    /// [default: 10].
    #[arg(long)]
    pub log_every: Option<u64>,
}

#[derive(Debug, Args)]
pub struct EvalArgs {
    /// Checkpoint directory (a run's `latest` works).
    #[arg(long)]
    pub checkpoint: PathBuf,
    /// Token shard to evaluate on (or a shard set's directory: its val shards) [default:
    /// the validation data the checkpoint's run recorded, as its path was given to `train`].
    #[arg(long)]
    pub data: Option<PathBuf>,
    /// Sequences per batch [default: the run's --batch-size, as its log's validation
    /// loss reads them; 8 for a model without a training state].
    #[arg(long, value_parser = crate::limits::in_range::<1, { crate::limits::MAX_BATCH }>)]
    pub batch_size: Option<usize>,
    /// Tokens per sequence [default: the run's --seq-len; the model's context length for
    /// a model without a training state].
    #[arg(long, value_parser = crate::limits::in_range::<1, { crate::limits::MAX_SEQ }>)]
    pub seq_len: Option<usize>,
    /// Read only the first N windows (the training log reads the first --eval-batches)
    /// [default: every full window of the data].
    #[arg(long, value_name = "N")]
    pub windows: Option<usize>,
    /// Print one JSON object: {"loss", "perplexity", "bits_per_byte", "tokens", "bytes", "windows", ...}.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct GenerateArgs {
    /// Checkpoint directory (a run's `latest` works).
    #[arg(long)]
    pub checkpoint: PathBuf,
    /// Text to continue (`<|endoftext|>` in it is the special token); empty: start a new document.
    #[arg(long, default_value = "")]
    pub prompt: String,
    /// Most tokens to generate (fewer if `<|endoftext|>` comes or the context is full).
    #[arg(long, default_value_t = 256)]
    pub max_new_tokens: usize,
    /// Sampling temperature; 0 is greedy.
    #[arg(long, default_value_t = 0.8)]
    pub temperature: f32,
    /// Sample among the K most likely tokens only (0: all).
    #[arg(long, default_value_t = 200)]
    pub top_k: usize,
    /// Sample among the most likely tokens whose probabilities add up to P (1: all).
    #[arg(long, default_value_t = 1.0)]
    pub top_p: f32,
    /// Seed of the sampler: the same seed gives the same text.
    #[arg(long, default_value_t = 1337)]
    pub seed: u64,
}

#[derive(Debug, Args)]
pub struct InfoArgs {
    /// A model config in TOML.
    #[arg(
        long,
        conflicts_with = "checkpoint",
        required_unless_present = "checkpoint"
    )]
    pub config: Option<PathBuf>,
    /// A checkpoint directory.
    #[arg(long)]
    pub checkpoint: Option<PathBuf>,
    /// Sequences per batch for the memory estimate.
    #[arg(long, default_value_t = 8, value_parser = crate::limits::in_range::<1, { crate::limits::MAX_BATCH }>)]
    pub batch_size: usize,
    /// Tokens per sequence for FLOPs and memory [default: the model's context length].
    #[arg(long, value_parser = crate::limits::in_range::<1, { crate::limits::MAX_SEQ }>)]
    pub seq_len: Option<usize>,
    /// Micro-batches per step, as `train --grad-accum`: above 1 training holds a second
    /// gradient buffer (whole micro-batch gradients are added, see `andrea train`).
    #[arg(long, default_value_t = 1, value_parser = crate::limits::in_range::<1, { crate::limits::MAX_GRAD_ACCUM }>)]
    pub grad_accum: usize,
    /// Print one JSON object.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum BenchKind {
    /// Full training steps: forward, loss, backward, clipping, AdamW.
    Train,
    /// One token at a time through a KV cache.
    Decode,
}

#[derive(Debug, Args)]
pub struct BenchArgs {
    /// What to measure.
    #[arg(value_enum)]
    pub kind: BenchKind,
    /// A model config in TOML.
    #[arg(long)]
    pub config: PathBuf,
    /// Sequences per batch.
    #[arg(long, default_value_t = 4, value_parser = crate::limits::in_range::<1, { crate::limits::MAX_BATCH }>)]
    pub batch_size: usize,
    /// Training: tokens per sequence. Decode: the KV cache's capacity [default: the model's
    /// context length up to 256].
    #[arg(long, value_parser = crate::limits::in_range::<1, { crate::limits::MAX_SEQ }>)]
    pub seq_len: Option<usize>,
    /// Timed steps (the median is reported).
    #[arg(long, default_value_t = 5)]
    pub steps: usize,
    /// Untimed steps first [default: 2 for training, 8 for decoding].
    #[arg(long)]
    pub warmup: Option<usize>,
    /// Decode: the prompt's length.
    #[arg(long, default_value_t = 16)]
    pub prompt_len: usize,
    /// Seed of the initialisation and the synthetic tokens.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Print one JSON object (with `tokens_per_s`).
    #[arg(long)]
    pub json: bool,
    /// Time every op of the timed steps (the backend synchronised around each) and print
    /// a per-op table per step (per token of each sequence when decoding): calls, ms,
    /// % of the step, GFLOP/s or GB/s; each product shape its own row (`MxKxN` and the
    /// operands' layouts: `tn` is Aᵀ·B). With --json, the table's rows go into the
    /// object as `profile`.
    #[arg(long)]
    pub profile: bool,
}

/// The demo's model config (built in when the file is absent).
pub const DEFAULT_CONFIG: &str = "configs/tiny.toml";

#[derive(Debug, Args)]
pub struct DemoArgs {
    /// Directory for the corpus, tokenizer, shards and run (replaced if it holds a demo).
    #[arg(long, default_value = "runs/demo")]
    pub out: PathBuf,
    /// The model config.
    #[arg(long, default_value = DEFAULT_CONFIG)]
    pub config: PathBuf,
    /// Bytes of generated text.
    #[arg(long, default_value_t = 2_000_000, value_parser = crate::limits::in_range::<1, { crate::limits::MAX_CORPUS_BYTES }>)]
    pub corpus_bytes: usize,
    /// Tokenizer merges.
    #[arg(long, default_value_t = 512, value_parser = crate::limits::in_range::<0, { crate::limits::MAX_MERGES }>)]
    pub merges: usize,
    /// Training steps.
    #[arg(long, default_value_t = 300)]
    pub steps: u64,
    /// Sequences per batch.
    #[arg(long, default_value_t = 8, value_parser = crate::limits::in_range::<1, { crate::limits::MAX_BATCH }>)]
    pub batch_size: usize,
    /// Tokens per sequence.
    #[arg(long, default_value_t = 128, value_parser = crate::limits::in_range::<1, { crate::limits::MAX_SEQ }>)]
    pub seq_len: usize,
    /// Peak learning rate.
    #[arg(long, default_value_t = 2e-3)]
    pub lr: f32,
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    use super::Cli;

    /// Flags that take a value and have no default: required, or acting only when given.
    const NO_DEFAULT: &[&str] = &[
        "tokenizer encode --tokenizer",
        "tokenizer encode --text",
        "tokenizer decode --tokenizer",
        "prepare --tokenizer",
        "prepare --out",
        "train --config",
        "train --init",
        "train --resume",
        "train --total-batch-tokens",
        "train --stop-at",
        "eval --checkpoint",
        "generate --checkpoint",
        "info --config",
        "info --checkpoint",
        "bench --config",
    ];

    /// Every flag that takes a value shows its default in `--help` (clap's own, or a
    /// `[default: ...]` in the text where it comes from a config or the data), and the
    /// flags of `NO_DEFAULT` claim none.
    #[test]
    fn every_flag_with_a_default_shows_it() {
        fn walk(cmd: &clap::Command, path: &str, wrong: &mut Vec<String>) {
            for arg in cmd.get_arguments() {
                let Some(long) = arg.get_long() else { continue };
                if !arg.get_action().takes_values() {
                    continue;
                }
                let name = format!("{path} --{long}").trim().to_string();
                let help = arg.get_help().map(|h| h.to_string()).unwrap_or_default();
                let shown = !arg.get_default_values().is_empty() || help.contains("[default");
                if shown == NO_DEFAULT.contains(&name.as_str()) {
                    wrong.push(name);
                }
            }
            for sub in cmd.get_subcommands() {
                walk(sub, &format!("{path} {}", sub.get_name()), wrong);
            }
        }
        let mut wrong = Vec::new();
        walk(&Cli::command(), "", &mut wrong);
        assert!(
            wrong.is_empty(),
            "these flags show no default but have one, or are listed in NO_DEFAULT and show \
             one: {wrong:?}"
        );
    }

    /// `--backend` and `--precision` are listed by the commands that run a model (and
    /// before the command's name), not by `tokenizer` or `prepare`.
    #[test]
    fn backend_flags_only_where_a_model_runs() {
        let cli = Cli::command();
        let has = |cmd: &clap::Command, long: &str| {
            cmd.get_arguments().any(|a| a.get_long() == Some(long))
        };
        for long in ["backend", "precision"] {
            assert!(has(&cli, long));
            for sub in cli.get_subcommands() {
                let runs_a_model = !matches!(sub.get_name(), "tokenizer" | "prepare");
                assert_eq!(has(sub, long), runs_a_model, "{} --{long}", sub.get_name());
                for leaf in sub.get_subcommands() {
                    assert!(
                        !has(leaf, long),
                        "{} {} --{long}",
                        sub.get_name(),
                        leaf.get_name()
                    );
                }
            }
        }
    }
}
