//! # andrea
//!
//! Train and run GPT-2-style language models (ANDREA-120M) in Rust. This crate is the
//! front door: it re-exports the model ([`andrea_model`]), the configs and the
//! [`Backend`] trait ([`andrea_core`]), and picks a backend by feature:
//!
//! | feature | backend | [`DefaultBackend`] |
//! |---|---|---|
//! | `cpu` (default) | `andrea_cpu::CpuBackend`: rayon, the `gemm` crate and AVX2 / AVX-512 kernels | `CpuBackend` |
//! | `cuda` | `andrea_cuda::CudaBackend`: one NVIDIA GPU (compute capability 8.0+, driver 580+), re-exported as `andrea::CudaBackend` and `andrea::cuda` | unchanged: `CpuBackend` |
//!
//! and `mpi` adds `andrea::dist` (`andrea-dist`): data parallelism over MPI, any backend.
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
//!
//! ## Backends by feature
//!
//! `andrea = { version = "0.1", features = ["cuda"] }` builds both backends; the program
//! picks one when it creates its model (the `andrea` command line: `--backend cuda`).
//! Decisions, and why:
//!
//! * **`DefaultBackend` is the CPU backend whenever `cpu` is on, with or without `cuda`.**
//!   Cargo unifies features across a build, so a feature must only add: if `cuda` turned
//!   `DefaultBackend` into `CudaBackend`, a crate that enabled it would change the type
//!   under every other crate of the build, and `DefaultBackend::new()` would change from
//!   infallible to a `Result` that fails on every machine without a GPU. In a GPU-only
//!   build (`default-features = false, features = ["cuda"]`) there is no
//!   `DefaultBackend`: name `CudaBackend`, or write the code generic over
//!   `B: Backend` as the model is.
//! * **The GPU is named, not defaulted:** `CudaBackend::new()` returns
//!   [`core::Error::NoDevice`] without a GPU (or against the link stub), so code that
//!   runs on a GPU says so, and can fall back to the CPU on that error.
//! * `andrea::cuda::Precision` picks the CUDA arithmetic: `FAST` (TF32 tensor cores,
//!   hardware tanh; the default), `FP32` (meets the float32 tolerances of the
//!   conformance suite) or `BF16`.
//!
//! On a GPU (not part of the test run: `CudaBackend` needs a device), the same code with
//! another backend; the weights are the same for the same seed on every backend:
//!
//! ```no_run
//! # #[cfg(feature = "cuda")]
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! use andrea::cuda::{CudaBackend, Precision};
//! use andrea::{Model, ModelConfig, Sampler};
//!
//! let config = ModelConfig::new(100, 64, 32, 2, 4);
//! let gpu = CudaBackend::with_precision(Precision::FAST)?; // Err(NoDevice) without a GPU
//! let model = Model::new(gpu, config, 42)?;
//! let ids = model.generate(&[1, 2, 3], 8, &mut Sampler::greedy())?;
//! assert_eq!(ids.len(), 8);
//! # Ok(())
//! # }
//! # #[cfg(not(feature = "cuda"))]
//! # fn main() {}
//! ```

pub use andrea_core as core;
pub use andrea_core::prelude;
pub use andrea_core::{Backend, Config, ModelConfig, OptimizerConfig, ScheduleConfig};
pub use andrea_model as model;
pub use andrea_model::{
    Evaluator, KvCache, MemoryPlan, Model, ModelError, ParamInfo, Result, Sampler, StepStats,
    Trainer, IGNORE_INDEX,
};

#[cfg(feature = "cpu")]
pub use andrea_cpu::{self as cpu, CpuBackend};

#[cfg(feature = "cuda")]
pub use andrea_cuda::{self as cuda, CudaBackend};

/// Data parallelism over MPI (feature `mpi`; `nccl` adds NCCL between CUDA ranks): the
/// world of ranks and the bucketed gradient all-reduce.
#[cfg(any(feature = "mpi", feature = "nccl"))]
pub use andrea_dist as dist;

/// The backend of code that names no backend: the CPU backend, also when `cuda` is on
/// (features only add backends; see the crate docs).
#[cfg(feature = "cpu")]
pub type DefaultBackend = andrea_cpu::CpuBackend;
