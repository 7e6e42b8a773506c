//! A small driver for the scripts in `scripts/` (fixtures, comparison with
//! `tokenizers`); the user-facing command line is `andrea tokenizer ...` (andrea-cli).
//!
//! ```text
//! tokenizer_tool train  --input FILE --merges N --out tokenizer.json
//! tokenizer_tool encode --tokenizer tokenizer.json --input FILE [--threads N] [--repeat R] [--docs]
//! tokenizer_tool ids    --tokenizer tokenizer.json --strings strings.json
//! ```
//!
//! `train` and `encode` print one JSON object with timings. `encode --docs` encodes the
//! file's paragraphs (split at blank lines) as a batch, otherwise the whole file as one
//! text. `ids` reads a JSON array of strings and prints, for each, the ids with special
//! tokens recognised.

use andrea_tokenizer::{train_from_files, Tokenizer, TrainConfig};
use std::time::Instant;

fn arg(args: &[String], name: &str) -> Option<String> {
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1).cloned())
}

fn need(args: &[String], name: &str) -> String {
    arg(args, name).unwrap_or_else(|| fail(&format!("missing {name}")))
}

fn fail(msg: &str) -> ! {
    eprintln!("tokenizer_tool: {msg}");
    std::process::exit(2)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let threads: usize = arg(&args, "--threads").map_or(0, |s| s.parse().unwrap_or(0));
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .unwrap_or_else(|e| fail(&e.to_string()));
    pool.install(|| run(&args))
}

fn run(args: &[String]) {
    match args.first().map(String::as_str) {
        Some("train") => {
            let input = need(args, "--input");
            let merges = need(args, "--merges")
                .parse()
                .unwrap_or_else(|_| fail("bad --merges"));
            let out = need(args, "--out");
            let config = TrainConfig {
                merges,
                show_progress: false,
                ..TrainConfig::default()
            };
            let t = Instant::now();
            let (tok, report) =
                train_from_files(&[&input], &config).unwrap_or_else(|e| fail(&e.to_string()));
            let seconds = t.elapsed().as_secs_f64();
            tok.save(&out).unwrap_or_else(|e| fail(&e.to_string()));
            println!(
                "{}",
                serde_json::json!({
                    "seconds": seconds,
                    "count_seconds": report.count_seconds,
                    "learn_seconds": report.learn_seconds,
                    "bytes": report.bytes,
                    "distinct_pieces": report.distinct_pieces,
                    "merges": report.merges,
                    "threads": rayon::current_num_threads(),
                })
            );
        }
        Some("encode") => {
            let tok =
                Tokenizer::load(need(args, "--tokenizer")).unwrap_or_else(|e| fail(&e.to_string()));
            let text = std::fs::read_to_string(need(args, "--input"))
                .unwrap_or_else(|e| fail(&e.to_string()));
            let repeat: usize = arg(args, "--repeat").map_or(5, |s| s.parse().unwrap_or(5));
            let docs_mode = args.iter().any(|a| a == "--docs");
            let docs: Vec<&str> = if docs_mode {
                text.split_inclusive("\n\n").collect()
            } else {
                vec![]
            };
            let mut times = Vec::new();
            let mut ids = Vec::new();
            for _ in 0..repeat.max(1) {
                let t = Instant::now();
                if docs_mode {
                    let batch = tok.encode_batch(&docs);
                    times.push(t.elapsed().as_secs_f64());
                    ids = batch.concat();
                } else {
                    ids = tok.encode(&text);
                    times.push(t.elapsed().as_secs_f64());
                }
            }
            // A checksum to compare with another tokenizer's ids.
            let id_sum: u64 = ids.iter().map(|&i| i as u64).sum();
            let id_sq_sum: u64 = ids.iter().map(|&i| (i as u64) * (i as u64)).sum();
            let s = median(times.clone());
            println!(
                "{}",
                serde_json::json!({
                    "median_seconds": s,
                    "mb_per_s": text.len() as f64 / s / 1e6,
                    "times": times,
                    "tokens": ids.len(),
                    "id_sum": id_sum,
                    "id_sq_sum": id_sq_sum,
                    "bytes": text.len(),
                    "threads": rayon::current_num_threads(),
                    "docs": docs.len(),
                })
            );
        }
        Some("ids") => {
            let tok =
                Tokenizer::load(need(args, "--tokenizer")).unwrap_or_else(|e| fail(&e.to_string()));
            let strings: Vec<String> = serde_json::from_str(
                &std::fs::read_to_string(need(args, "--strings"))
                    .unwrap_or_else(|e| fail(&e.to_string())),
            )
            .unwrap_or_else(|e| fail(&e.to_string()));
            let ids: Vec<Vec<u32>> = strings
                .iter()
                .map(|s| tok.encode_with_special_tokens(s))
                .collect();
            println!("{}", serde_json::to_string(&ids).unwrap_or_default());
        }
        _ => fail("usage: tokenizer_tool train|encode|ids ... (see the source)"),
    }
}
