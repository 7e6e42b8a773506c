//! `andrea info`: parameter count, training FLOPs per token and the memory that
//! training, evaluation and generation hold, from the same code that sizes the model's
//! buffers.

use andrea::{Backend, MemoryPlan, ModelConfig};
use anyhow::{bail, Context, Result};

use crate::cli::InfoArgs;
use crate::settings::FileConfig;

pub fn run<B: Backend>(args: &InfoArgs, backend: &B) -> Result<()> {
    let config: ModelConfig = match (&args.config, &args.checkpoint) {
        (Some(p), _) => FileConfig::read(p)?.model,
        (None, Some(dir)) => {
            let dir = crate::checkpoint::resolve(dir)?;
            andrea::model::io::read_config(&dir)
                .with_context(|| format!("cannot read the config of {}", dir.display()))?
        }
        (None, None) => bail!("pass --config <toml> or --checkpoint <dir>"),
    };
    let seq = args.seq_len.unwrap_or(config.context_length);
    if seq == 0 || seq > config.context_length || args.batch_size == 0 {
        bail!(
            "--seq-len must be in 1..={} and --batch-size at least 1",
            config.context_length
        );
    }
    let b = args.batch_size;
    crate::limits::check_step(&config, b, seq)?;
    let mut plan = MemoryPlan::new(backend, &config, b, seq);
    // The trainer's second gradient buffer (`Trainer::reserve_accumulation`), which
    // `Trainer::memory` counts the same way.
    if args.grad_accum > 1 {
        plan.gradients *= 2;
    }
    let eval = MemoryPlan::evaluation(backend, &config, b, seq);
    let gen = MemoryPlan::generation(backend, &config, b, seq);
    let json = |p: &MemoryPlan| {
        serde_json::json!({
            "parameters": p.parameters,
            "gradients": p.gradients,
            "optimizer": p.optimizer,
            "activations": p.activations,
            "kv_cache": p.kv_cache,
            "ids": p.ids,
            "scratch": p.scratch,
            "total": p.total(),
        })
    };
    let flops = config.training_flops_per_token(seq);
    if args.json {
        let obj = serde_json::json!({
            "name": config.name,
            "parameters": config.param_count(),
            "vocab_size": config.vocab_size,
            "context_length": config.context_length,
            "d_model": config.d_model,
            "n_layer": config.n_layer,
            "n_head": config.n_head,
            "seq_len": seq,
            "batch_size": args.batch_size,
            "grad_accum": args.grad_accum,
            "training_flops_per_token": flops,
            "memory_bytes": json(&plan),
            "evaluation_memory_bytes": json(&eval),
            "generation_memory_bytes": json(&gen),
        });
        outln!("{obj}")?;
    } else {
        outln!("model: {}", config.name.as_deref().unwrap_or("(unnamed)"))?;
        outln!(
            "shape: {} layers, d_model {}, {} heads, mlp {}, context {}, vocabulary {}",
            config.n_layer,
            config.d_model,
            config.n_head,
            config.mlp_dim(),
            config.context_length,
            config.vocab_size
        )?;
        outln!("parameters: {}", config.param_count())?;
        outln!("training FLOPs per token at seq {seq}: {:.3e}", flops)?;
        let accum = if args.grad_accum > 1 {
            format!(
                " x accum {} (gradients: two buffers, the step's sum and a micro-batch's)",
                args.grad_accum
            )
        } else {
            String::new()
        };
        outln!("training memory for batch {b}x{seq}{accum}: {plan}")?;
        outln!("evaluation memory (`andrea eval`) for batch {b}x{seq}: {eval}")?;
        outln!("generation memory (KV cache) for {b} sequences of {seq}: {gen}")?;
    }
    Ok(())
}
