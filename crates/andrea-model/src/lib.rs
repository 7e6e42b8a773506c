//! # andrea-model
//!
//! ANDREA-120M, the GPT of `DESIGN.md`, generic over `B: `[`andrea_core::Backend`]: the
//! forward pass, the loss, the backward pass and AdamW for training, a KV cache for
//! generation, and safetensors I/O in the layout of Hugging Face transformers'
//! `GPT2LMHeadModel`, which it computes exactly (checked against it, see below). The
//! crate never names a concrete backend: every computation is a backend op.
//!
//! ```
//! use andrea_cpu::CpuBackend;
//! use andrea_model::{Model, ModelConfig, OptimizerConfig, Sampler, Trainer};
//!
//! let config = ModelConfig::new(64, 16, 32, 2, 4); // vocab, context, d_model, layers, heads
//! let model = Model::new(CpuBackend::new(), config, 0)?; // GPT-2 init from a seed
//! let mut trainer = Trainer::new(model, OptimizerConfig::default(), 2, 16)?; // batch 2 x 16
//! let tokens: Vec<u32> = (0..32).map(|i| i % 64).collect();
//! let targets: Vec<u32> = tokens.iter().map(|t| (t + 1) % 64).collect();
//! let first = trainer.forward(&tokens, &targets)?; // mean cross-entropy, ≈ ln 64
//! trainer.backward()?;
//! let stats = trainer.step(1e-3)?; // clipping + AdamW, then the gradients are zeroed
//! assert!((first - 64f32.ln()).abs() < 0.1 && stats.step == 1);
//!
//! let model = trainer.into_model();
//! let next = model.generate(&[1, 2, 3], 5, &mut Sampler::greedy())?;
//! assert_eq!(next.len(), 5);
//! # Ok::<(), andrea_model::ModelError>(())
//! ```
//!
//! ## Pieces
//!
//! * **Config** ([`ModelConfig`], from `andrea_core::config`): TOML with unknown keys
//!   rejected by name (`configs/andrea-120m.toml`, `configs/tiny.toml`);
//!   [`ModelConfig::param_count`] (92,331,264 for ANDREA-120M),
//!   [`ModelConfig::training_flops_per_token`] and [`MemoryPlan`] (the bytes training,
//!   evaluation and generation hold, from the same code that sizes the buffers).
//! * **Parameters** ([`Model`]): one contiguous buffer; [`Model::params`] lists every
//!   tensor with its transformers name and shape (`transformer.h.{i}.attn.c_attn.weight`
//!   is `[d, 3d]`, `[in, out]` as transformers' `Conv1D`), [`Model::param`] is a view,
//!   [`Model::read_param`] / [`Model::write_param`] copy to and from the host. GPT-2's
//!   initialisation from a seed ([`Model::new`]). The vocabulary is padded to a multiple
//!   of 64 inside (8449 -> 8512 rows of `wte`: the output GEMM runs faster); the padding
//!   rows are zero, get zero gradient and never appear outside.
//! * **The forward pass** (`src/gpt.rs`, `src/block.rs`): one function owns the stack
//!   (embedding, the first `ln_1`, the blocks, `ln_f`, the tied logits) for training and
//!   generation alike; each residual add is fused with the LayerNorm after it, across
//!   blocks as llm.c does. A block is its diagram over named parameter groups
//!   (`Norm`, `Linear`) and activation groups (`LayerNormOut`, `Qkv`). What differs
//!   (where activations live, the attention over the block's keys or a KV cache) is a
//!   small trait. The float64 `andrea_testkit::reference::gpt2` is its specification.
//! * **Training** ([`Trainer`]): gradient buffer, AdamW moments and an activation arena
//!   sized once from (batch, seq); [`Trainer::forward`] → mean loss,
//!   [`Trainer::backward`] (gradients accumulate, so calling it after several forwards
//!   accumulates micro-batches), [`Trainer::step`] (global-norm clipping as
//!   `clip_grad_norm_`, AdamW as `torch.optim.AdamW`, weight decay on 2-D tensors only).
//!   The learning-rate schedule (warmup + cosine to a floor) is
//!   [`ScheduleConfig::lr`]. [`Trainer::save_optimizer_state`] and
//!   [`Trainer::load_optimizer_state`] resume exactly.
//! * **Evaluation** ([`Evaluator`], [`Model::loss`]): the mean loss of a batch with only
//!   an activation arena (one block's scratch reused by every block, and the logits),
//!   bit for bit [`Trainer::forward`]'s; [`Trainer::evaluate`] runs the same pass in a
//!   trainer's own arena.
//! * **Inference** ([`KvCache`], [`Model::extend`], [`Model::generate`], [`Sampler`]):
//!   prefill a prompt, then one token at a time, for a batch of equal-length sequences;
//!   logits of the last position ([`Model::extend_with`]: sampled where they lie).
//!   Greedy, temperature, top-k and top-p sampling, seeded.
//! * **I/O** ([`io`]): `model.safetensors` + `config.json` that
//!   `GPT2LMHeadModel.from_pretrained(dir)` loads; [`Model::load`] reads a directory
//!   transformers saved (any vocabulary and context). Files are written atomically.
//! * **Benchmarks** ([`mod@bench`]): tokens per second of full training steps and of
//!   KV-cache decoding, median over timed iterations after warm-up, as JSON
//!   (`examples/bench.rs`; figures against PyTorch in `benches/README.md`).
//!
//! ## Conventions
//!
//! Token batches are `[batch, seq]` row-major `u32` slices; targets use
//! [`IGNORE_INDEX`] for positions without a loss, and the loss is the mean over the
//! others. Everything a user can get wrong is an error ([`ModelError`]) that names the
//! value and the limit: a token id past the vocabulary, a sequence past the context, a
//! batch that does not fit the arena, a checkpoint of another shape, a NaN or infinite
//! loss or gradient norm (with the step number).
//!
//! ## Correctness
//!
//! * `tests/gradcheck.rs`: every parameter tensor's gradient (CPU backend, float32)
//!   against central differences of the loss computed in float64 by
//!   `andrea_testkit::reference::gpt2`, the executable specification of the model built
//!   from the reference ops.
//! * `tests/hf_fixtures.rs`: logits, loss, every gradient, and three AdamW steps against
//!   transformers (fixtures from `scripts/make_fixtures.py`).
//! * `tests/training.rs`, `tests/inference.rs`, `tests/io.rs`: loss at init ≈ ln V,
//!   overfitting one batch, accumulation, AdamW against a host reference, resume, the KV
//!   cache against the full forward pass at every position, checkpoint variants and
//!   errors; the same step on the naive backend.

mod arena;
pub mod bench;
mod block;
mod error;
mod eval;
mod gpt;
mod infer;
pub mod io;
mod layout;
mod memory;
mod model;
pub mod rng;
mod scratch;
mod train;

pub use andrea_core::{Config, ModelConfig, OptimizerConfig, ScheduleConfig, IGNORE_INDEX};
pub use error::{ModelError, Result};
pub use eval::Evaluator;
pub use infer::{KvCache, Sampler, PREFILL_CHUNK};
pub use layout::ParamInfo;
pub use memory::MemoryPlan;
pub use model::Model;
pub use train::{StepStats, Trainer};
