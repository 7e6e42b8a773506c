//! Writes a random model with ANDREA-120M's vocabulary to a directory, with the logits
//! andrea computes for a fixed token sequence, so that `scripts/check_transformers_load.py`
//! can check that `GPT2LMHeadModel.from_pretrained` loads it and computes the same:
//!
//! ```text
//! cargo run -p andrea-model --example export_check -- /tmp/andrea-export
//! python crates/andrea-model/scripts/check_transformers_load.py /tmp/andrea-export
//! ```

use andrea_core::{ModelConfig, OptimizerConfig};
use andrea_cpu::CpuBackend;
use andrea_model::{Model, Trainer};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dir = std::env::args().nth(1).ok_or("usage: export_check DIR")?;
    let config = ModelConfig {
        init_std: 0.1,
        eos_token_id: Some(8448),
        ..ModelConfig::new(8449, 64, 48, 3, 4)
    };
    let model = Model::new(CpuBackend::new(), config, 42)?;
    model.save(&dir)?;
    let tokens: Vec<u32> = (0..16u32).map(|i| (i * 977 + 13) % 8449).collect();
    let mut trainer = Trainer::new(model, OptimizerConfig::default(), 1, tokens.len())?;
    let loss = trainer.forward(&tokens, &tokens)?;
    let logits = trainer.logits()?;
    let json = serde_json::json!({ "tokens": tokens, "logits": logits, "loss": loss });
    std::fs::write(format!("{dir}/andrea_logits.json"), json.to_string())?;
    println!("wrote {dir} (loss {loss})");
    Ok(())
}
