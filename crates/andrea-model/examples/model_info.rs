//! Prints what a config costs: the exact parameter count, the FLOPs per token of a
//! training step, and the memory a step needs at a batch and sequence length.
//!
//! `cargo run -p andrea-model --example model_info -- configs/andrea-120m.toml 4 256`

use andrea_core::Config;
use andrea_cpu::CpuBackend;
use andrea_model::MemoryPlan;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let path = args
        .next()
        .unwrap_or_else(|| "configs/andrea-120m.toml".into());
    let batch: usize = args.next().map_or(Ok(4), |s| s.parse())?;
    let seq: usize = args.next().map_or(Ok(256), |s| s.parse())?;
    let cfg = Config::from_toml_file(&path)?.model;
    let name = cfg.name.clone().unwrap_or_else(|| path.clone());
    println!("{name}: {} parameters", cfg.param_count());
    println!(
        "training FLOPs per token at seq {seq}: {:.1} M",
        cfg.training_flops_per_token(seq) / 1e6
    );
    let plan = MemoryPlan::new(&CpuBackend::new(), &cfg, batch, seq);
    println!("memory of a training step at {batch} x {seq} on the CPU backend: {plan}");
    Ok(())
}
