//! Text in, text out: load a checkpoint (an andrea run's `latest`, or a transformers GPT-2
//! directory with a `tokenizer.json`) and continue a prompt.
//!
//! ```sh
//! cargo run --release -p andrea-cli -- demo --out runs/demo       # a small trained model
//! cargo run --release -p andrea --example generate_text -- runs/demo/run/latest "Once upon a time"
//! ```

use andrea::{DefaultBackend, Model, Sampler, Tokenizer};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let (Some(dir), Some(prompt)) = (args.next(), args.next()) else {
        eprintln!("usage: generate_text <checkpoint dir> <prompt>");
        std::process::exit(2);
    };
    let tokenizer = Tokenizer::load(format!("{dir}/tokenizer.json"))?;
    let model = Model::load(DefaultBackend::new(), &dir)?;

    let mut sampler = Sampler::new(0.8, 42)?.with_top_k(40)?; // temperature, seed
    let ids = model.generate(&tokenizer.encode(&prompt), 100, &mut sampler)?;
    println!("{prompt}{}", tokenizer.decode(&ids)?);
    Ok(())
}
