//! Whole-model throughput on the CPU backend at 2 threads: one full training step
//! (forward, loss, backward, clipping + AdamW through `andrea_model::Trainer`) and
//! greedy KV-cache decoding at batch 1, for ANDREA-120M and the tiny config. Elements
//! are tokens, so criterion's `elem/s` is tokens per second.
//!
//! `cargo bench -p andrea-benches --bench model` (all; the 120M step takes seconds, so
//! about 2 minutes), or a filter such as `-- train_step/cpu-2t/tiny`. The same
//! measurements as plain JSON, and PyTorch's side: benches/README.md, "Model".

use std::hint::black_box;
use std::time::{Duration, Instant};

use andrea_core::Config;
use andrea_cpu::CpuBackend;
use andrea_model::bench::{synthetic_batch, Decoder};
use andrea_model::{Model, Trainer};
use criterion::{criterion_group, BenchmarkId, Criterion, SamplingMode, Throughput};

const LABEL: &str = "cpu-2t";
const THREADS: usize = 2;

/// (config file, training batch, training seq, seconds of training measurement).
const CASES: &[(&str, usize, usize, u64)] = &[
    ("configs/andrea-120m.toml", 4, 256, 40),
    ("configs/tiny.toml", 8, 256, 5),
];

/// Decoding: prompt prefilled once (and again whenever the cache is full), cache capacity.
const PROMPT: usize = 16;
const CAPACITY: usize = 256;

fn config(path: &str) -> Config {
    // Benches run with the package directory as the working directory.
    let path = format!("{}/../{path}", env!("CARGO_MANIFEST_DIR"));
    Config::from_toml_file(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// A backend on the current pool: `main` runs every benchmark on a worker of a 2-thread
/// pool, as `CpuBackend::install` and the `andrea` binary run a whole loop, so the ops
/// start their parallel work without a hand-over from the main thread.
fn backend() -> CpuBackend {
    CpuBackend::new()
}

fn train_step(c: &mut Criterion) {
    let mut g = c.benchmark_group("train_step");
    g.sample_size(10)
        .sampling_mode(SamplingMode::Flat)
        .warm_up_time(Duration::from_secs(1));
    for &(path, batch, seq, secs) in CASES {
        let cfg = config(path);
        let name = cfg.model.name.clone().unwrap_or_default();
        let (tokens, targets) = synthetic_batch(cfg.model.vocab_size, batch, seq, 0);
        let model = Model::new(backend(), cfg.model, 0).unwrap();
        let lr = cfg.optimizer.lr;
        let mut trainer = Trainer::new(model, cfg.optimizer, batch, seq).unwrap();
        g.throughput(Throughput::Elements((batch * seq) as u64))
            .measurement_time(Duration::from_secs(secs));
        g.bench_function(
            BenchmarkId::new(LABEL, format!("{name}_{batch}x{seq}")),
            |b| {
                b.iter(|| {
                    let loss = trainer.forward_train(&tokens, &targets).unwrap();
                    trainer.backward().unwrap();
                    trainer.step(lr).unwrap();
                    black_box(loss)
                })
            },
        );
    }
    g.finish();
}

fn decode(c: &mut Criterion) {
    let mut g = c.benchmark_group("decode");
    g.sample_size(20)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(8))
        .throughput(Throughput::Elements(1));
    for &(path, ..) in CASES {
        let cfg = config(path);
        let name = cfg.model.name.clone().unwrap_or_default();
        let model = Model::new(backend(), cfg.model, 0).unwrap();
        let mut decoder = Decoder::new(&model, 1, PROMPT, CAPACITY, 0).unwrap();
        g.bench_function(BenchmarkId::new(LABEL, format!("{name}_b1")), |b| {
            // Only the single-token extends are timed; refilling a full cache is not.
            b.iter_custom(|iters| {
                let mut timed = Duration::ZERO;
                for _ in 0..iters {
                    decoder.ensure_room().unwrap();
                    let start = Instant::now();
                    decoder.step().unwrap();
                    timed += start.elapsed();
                }
                black_box(decoder.next_tokens());
                timed
            })
        });
    }
    g.finish();
}

criterion_group!(benches, train_step, decode);

// `criterion_main!`, inside the pool.
fn main() {
    CpuBackend::with_threads(THREADS)
        .expect("a thread pool")
        .install(|| {
            benches();
            Criterion::default().configure_from_args().final_summary();
        });
}
