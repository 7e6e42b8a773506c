//! Writes the deterministic synthetic text of `andrea_tokenizer::sample_text` (what the
//! tokenizer benchmark and `scripts/compare_tokenizers.py` measure on).
//!
//! ```text
//! cargo run --release -p andrea-tokenizer --example mixed_text -- BYTES [SEED] > text.txt
//! ```

use std::io::Write;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let parse = |i: usize, default: u64| -> u64 {
        args.get(i).map_or(default, |s| {
            s.replace('_', "").parse().unwrap_or_else(|_| {
                eprintln!("usage: mixed_text BYTES [SEED]  (not a number: {s:?})");
                std::process::exit(2)
            })
        })
    };
    let bytes = parse(0, 10_000_000) as usize;
    let seed = parse(1, 1);
    let text = andrea_tokenizer::sample_text::mixed_text(bytes, seed);
    let mut out = std::io::stdout().lock();
    if let Err(e) = out.write_all(text.as_bytes()).and_then(|_| out.flush()) {
        eprintln!("mixed_text: {e}");
        std::process::exit(1);
    }
}
