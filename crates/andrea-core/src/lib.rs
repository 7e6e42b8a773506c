//! # andrea-core
//!
//! What every part of andrea agrees on: the [`Backend`] trait (the ops of a GPT-2
//! training step and of generation), the views through which ops read and write backend
//! memory ([`View`], [`Matrix`], [`Heads`]), argument validation shared by all backends
//! ([`check`]), the default implementations of the fused ops ([`fused`]), errors, and the
//! configs of the model, the optimizer and the schedule, read from TOML ([`config`]).
//!
//! The model (`andrea-model`) is generic over `B: Backend` and never names a concrete
//! backend; backends (`andrea-cpu`, `andrea-cuda`) never know the model.

pub mod backend;
pub mod check;
pub mod config;
pub mod error;
pub mod fused;
pub mod tensor;

pub use backend::{AdamWStep, AttentionShape, Backend, HeadsOf, Ids, Mat, Tensor, IGNORE_INDEX};
pub use config::{Config, ConfigError, ModelConfig, OptimizerConfig, ScheduleConfig};
pub use error::{Error, Result};
pub use tensor::{DeviceMemory, Heads, Matrix, Shape, View};
