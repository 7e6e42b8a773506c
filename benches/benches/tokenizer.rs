//! The tokenizer: encode throughput (MB/s) on 1 and 2 threads, and training time for
//! 8192 merges on 10 MB.
//!
//! Text: andrea's deterministic synthetic mixed text (`andrea_tokenizer::sample_text`,
//! the same that `crates/andrea-tokenizer/scripts/compare_tokenizers.py` gives the
//! Hugging Face `tokenizers` package), 10 MB (seed 1) to train on, 4 MB (seed 2) to
//! encode with the vocabulary trained on the first. `ANDREA_TOK_BENCH_TEXT=<file>` uses
//! a file instead: its first 10 MB for training, the next 4 MB for encoding (the first
//! 4 MB if the file is shorter than 14 MB). `compare_tokenizers.py --local-text --keep`
//! leaves such a file (`local.txt`) of real text.
//!
//! `cargo bench -p andrea-benches --bench tokenizer` (all), or a filter such as
//! `cargo bench -p andrea-benches --bench tokenizer -- encode`.

use std::hint::black_box;
use std::time::Duration;

use andrea_tokenizer::{rayon, sample_text, train_from_texts, Tokenizer, TrainConfig};
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};

const TRAIN_BYTES: usize = 10_000_000;
const ENCODE_BYTES: usize = 4_000_000;

/// (training text, encoding text).
fn texts() -> (String, String) {
    match std::env::var_os("ANDREA_TOK_BENCH_TEXT") {
        Some(path) => {
            let text = std::fs::read_to_string(&path)
                .unwrap_or_else(|e| panic!("ANDREA_TOK_BENCH_TEXT={path:?}: {e}"));
            let boundary = |n: usize| {
                let mut end = n.min(text.len());
                while !text.is_char_boundary(end) {
                    end -= 1;
                }
                end
            };
            let train_end = boundary(TRAIN_BYTES);
            let (lo, hi) = if text.len() >= TRAIN_BYTES + ENCODE_BYTES {
                (train_end, boundary(TRAIN_BYTES + ENCODE_BYTES))
            } else {
                (0, boundary(ENCODE_BYTES))
            };
            (text[..train_end].to_string(), text[lo..hi].to_string())
        }
        None => (
            sample_text::mixed_text(TRAIN_BYTES, 1),
            sample_text::mixed_text(ENCODE_BYTES, 2),
        ),
    }
}

fn config(merges: usize) -> TrainConfig {
    TrainConfig {
        merges,
        show_progress: false,
        ..TrainConfig::default()
    }
}

fn pool(threads: usize) -> rayon::ThreadPool {
    rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .expect("thread pool")
}

fn benches(c: &mut Criterion) {
    let (train_text, encode_text) = texts();
    let tokenizer: Tokenizer = train_from_texts(&[&train_text], &config(8192))
        .expect("training")
        .0;
    let docs: Vec<&str> = encode_text.split_inclusive("\n\n").collect();

    let mut g = c.benchmark_group("tokenizer/encode");
    g.sample_size(20)
        .warm_up_time(Duration::from_secs(2))
        .measurement_time(Duration::from_secs(8))
        .throughput(Throughput::Bytes(encode_text.len() as u64));
    for threads in [1, 2] {
        let p = pool(threads);
        g.bench_function(BenchmarkId::new("text", format!("{threads}t")), |b| {
            b.iter(|| p.install(|| black_box(tokenizer.encode(black_box(&encode_text)))))
        });
        g.bench_function(BenchmarkId::new("docs", format!("{threads}t")), |b| {
            b.iter(|| p.install(|| black_box(tokenizer.encode_batch(black_box(&docs)))))
        });
    }
    g.finish();

    let mut g = c.benchmark_group("tokenizer/train");
    g.sample_size(10)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(20))
        .throughput(Throughput::Bytes(train_text.len() as u64));
    for threads in [1, 2] {
        let p = pool(threads);
        g.bench_function(
            BenchmarkId::new("8192_merges_10MB", format!("{threads}t")),
            |b| b.iter(|| p.install(|| black_box(train_from_texts(&[&train_text], &config(8192))))),
        );
    }
    g.finish();
}

criterion_group!(tokenizer, benches);
criterion_main!(tokenizer);
