//! # andrea
//!
//! Train and run GPT-2-style language models (ANDREA-120M) in Rust. This crate is the
//! front door: it re-exports the model ([`andrea_model`]), the configs and the
//! [`Backend`] trait ([`andrea_core`]), and picks a backend by feature:
//!
//! | feature | backend | [`DefaultBackend`] |
//! |---|---|---|
//! | `cpu` (default) | `andrea_cpu::CpuBackend`: rayon + matrixmultiply | `CpuBackend` |
//! | `cuda` | not yet: the CUDA backend is issue 6; enabling it stops the build with a message saying so | |
//!
//! Save a random tiny model, load it back and generate (ids in, ids out; text needs a
//! tokenizer from `andrea-tokenizer`):
//!
//! ```
//! use andrea::{DefaultBackend, Model, ModelConfig, Sampler};
//!
//! let dir = tempfile::tempdir()?;
//! let config = ModelConfig::new(100, 64, 32, 2, 4); // vocab, context, d_model, layers, heads
//! Model::new(DefaultBackend::new(), config, 42)?.save(dir.path())?;
//!
//! let model = Model::load(DefaultBackend::new(), dir.path())?; // or a transformers GPT-2 dir
//! let prompt = [1, 2, 3];
//! let greedy = model.generate(&prompt, 8, &mut Sampler::greedy())?;
//! let mut sampler = Sampler::new(0.8, 7)?.with_top_k(40)?.with_top_p(0.95)?;
//! let sampled = model.generate(&prompt, 8, &mut sampler)?;
//! assert_eq!((greedy.len(), sampled.len()), (8, 8));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! Training is [`Trainer`]: `forward`, `backward`, `step` (see [`andrea_model`]).

#[cfg(feature = "cuda")]
compile_error!(
    "the `cuda` feature of `andrea` is not available yet: the CUDA backend is issue 6 \
     (crates/andrea-cuda). Build without `--features cuda` to use the CPU backend."
);

pub use andrea_core as core;
pub use andrea_core::{Backend, Config, ModelConfig, OptimizerConfig, ScheduleConfig};
pub use andrea_model as model;
pub use andrea_model::{
    KvCache, MemoryPlan, Model, ModelError, ParamInfo, Result, Sampler, StepStats, Trainer,
    IGNORE_INDEX,
};

#[cfg(feature = "cpu")]
pub use andrea_cpu::{self as cpu, CpuBackend};

/// The backend the enabled features select: the CPU backend.
#[cfg(feature = "cpu")]
pub type DefaultBackend = andrea_cpu::CpuBackend;
