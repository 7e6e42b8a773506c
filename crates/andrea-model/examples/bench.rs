//! Tokens per second of full training steps, or of greedy KV-cache decoding, on the CPU
//! backend: one JSON object per measurement on stdout (see `andrea_model::bench`).
//!
//! ```text
//! cargo run --release -p andrea-model --example bench -- \
//!     --config configs/andrea-120m.toml --batch-size 4 --seq-len 256 --steps 5
//! cargo run --release -p andrea-model --example bench -- \
//!     --config configs/andrea-120m.toml --decode --batch-size 1 --seq-len 256 --steps 64
//! ```
//!
//! Flags: `--threads N` (default 2), `--warmup N` (default 2 steps for training, 8
//! tokens for decoding), `--prompt-len N` (decoding, default 16; `--seq-len` is then the
//! KV cache's capacity), `--seed N`, `--repeat N` (that many measurements, each its own
//! JSON line), `--handoff-per-op` (call the ops from the main thread, each handing its
//! work over to the pool, instead of running the whole measurement on a pool worker as
//! `CpuBackend::install` and the `andrea` binary do).

use andrea_core::Config;
use andrea_cpu::CpuBackend;
use andrea_model::bench::{self, BenchReport, DecodeBench, TrainBench};

struct Args {
    config: String,
    batch: usize,
    seq: usize,
    steps: Option<usize>,
    warmup: Option<usize>,
    prompt_len: usize,
    threads: usize,
    seed: u64,
    repeat: usize,
    decode: bool,
    in_pool: bool,
}

fn parse() -> Result<Args, String> {
    let mut a = Args {
        config: "configs/andrea-120m.toml".into(),
        batch: 4,
        seq: 256,
        steps: None,
        warmup: None,
        prompt_len: 16,
        threads: 2,
        seed: 0,
        repeat: 1,
        decode: false,
        in_pool: true,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        if flag == "--decode" {
            a.decode = true;
            continue;
        }
        if flag == "--handoff-per-op" {
            a.in_pool = false;
            continue;
        }
        let value = it.next().ok_or(format!("{flag} needs a value"))?;
        let num = |v: &str| {
            v.parse::<usize>()
                .map_err(|e| format!("{flag} {v}: {e} (need a whole number)"))
        };
        match flag.as_str() {
            "--config" => a.config = value,
            "--batch-size" => a.batch = num(&value)?,
            "--seq-len" => a.seq = num(&value)?,
            "--steps" => a.steps = Some(num(&value)?),
            "--warmup" => a.warmup = Some(num(&value)?),
            "--prompt-len" => a.prompt_len = num(&value)?,
            "--threads" => a.threads = num(&value)?,
            "--seed" => a.seed = num(&value)? as u64,
            "--repeat" => a.repeat = num(&value)?,
            _ => return Err(format!("unknown flag {flag}")),
        }
    }
    Ok(a)
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let a = parse()?;
    let cfg = Config::from_toml_file(&a.config)?;
    // By default the whole measurement runs on a worker of the backend's pool
    // (`CpuBackend::install`), where a backend on the current pool starts each op's
    // parallel work in place; `--handoff-per-op` measures the hand-over from the calling
    // thread that every op pays otherwise (see benches/README.md).
    let pool = CpuBackend::with_threads(a.threads)?;
    for _ in 0..a.repeat {
        let report = if a.in_pool {
            pool.install(|| measure(&a, &cfg, CpuBackend::new()))?
        } else {
            let mut r = measure(&a, &cfg, CpuBackend::with_threads(a.threads)?)?;
            r.backend.push_str(", ops called from the main thread");
            r
        };
        println!("{}", report.to_json());
    }
    Ok(())
}

fn measure(a: &Args, cfg: &Config, backend: CpuBackend) -> andrea_model::Result<BenchReport> {
    if a.decode {
        let plan = DecodeBench {
            batch: a.batch,
            prompt_len: a.prompt_len,
            capacity: a.seq,
            warmup: a.warmup.unwrap_or(8),
            steps: a.steps.unwrap_or(64),
            seed: a.seed,
        };
        bench::decode(backend, cfg.model.clone(), &plan)
    } else {
        let plan = TrainBench {
            batch: a.batch,
            seq: a.seq,
            warmup: a.warmup.unwrap_or(2),
            steps: a.steps.unwrap_or(5),
            seed: a.seed,
        };
        bench::train(backend, cfg.model.clone(), cfg.optimizer.clone(), &plan)
    }
}
