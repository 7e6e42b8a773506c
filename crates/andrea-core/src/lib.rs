//! # andrea-core
//!
//! What every part of andrea agrees on: the [`Backend`] trait (the ops of a GPT-2
//! training step and of generation, one trait per op family in [`ops`], bundled), the
//! views through which ops read and write backend memory ([`View`], [`Matrix`],
//! [`Heads`]), argument validation shared by all backends ([`check`]), the default
//! implementations of the fused ops ([`fused`]), a decorator that times every op
//! ([`timed::Timed`]), errors, and the configs of the model, the optimizer and the
//! schedule, read from TOML ([`config`]).
//!
//! The model (`andrea-model`) is generic over `B: Backend` and never names a concrete
//! backend; backends (`andrea-cpu`, `andrea-cuda`) never know the model. Code that calls
//! ops on a concrete backend imports the op traits with `use andrea_core::prelude::*`.

pub mod check;
pub mod config;
pub mod error;
pub mod fused;
pub mod ops;
pub mod precision;
pub mod tensor;
pub mod timed;

pub use config::{Config, ConfigError, ModelConfig, OptimizerConfig, ScheduleConfig};
pub use error::{Error, Result};
pub use ops::{
    clip_stats, AdamWStep, AttentionOps, AttentionShape, Backend, Bf16Mat, Bf16Tensor, DecodeBlock,
    DecodeBlockOf, DecodeOps, DeviceRegion, ElementwiseOps, EmbeddingOps, HeadsOf, Ids,
    LayerNormOps, LinalgOps, LinearOf, LinearParams, LossOps, Mat, MemoryOps, NormOutputs,
    NormParams, OptimOps, SoftmaxOps, Tensor, IGNORE_INDEX,
};
pub use precision::{bf16, round_bf16, MatmulPrecision};
pub use tensor::{DeviceMemory, Heads, Matrix, Shape, View};

/// The [`Backend`] supertrait and its ten op-family traits (so that the ops of a
/// concrete backend are callable), with the types their signatures use.
pub mod prelude {
    pub use crate::ops::{
        AdamWStep, AttentionOps, AttentionShape, Backend, Bf16Mat, Bf16Tensor, DecodeBlock,
        DecodeBlockOf, DecodeOps, DeviceRegion, ElementwiseOps, EmbeddingOps, HeadsOf, Ids,
        LayerNormOps, LinalgOps, LinearOf, LinearParams, LossOps, Mat, MemoryOps, NormOutputs,
        NormParams, OptimOps, SoftmaxOps, Tensor, IGNORE_INDEX,
    };
    pub use crate::precision::{bf16, MatmulPrecision};
    pub use crate::tensor::{DeviceMemory, Heads, Matrix, Shape, View};
}
