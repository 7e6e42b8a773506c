//! The [`Backend`] trait: everything a GPT-2 training step and generation need from a
//! device, as one trait per op family bundled by a supertrait.
//!
//! | family | trait | ops |
//! |---|---|---|
//! | [`memory`] | [`MemoryOps`] | buffers (`f32`, token ids, `bf16`), `upload`/`download`, `synchronize`, `fill`, `copy`, `to_bf16`/`to_f32` |
//! | [`linalg`] | [`LinalgOps`] | `matmul`, `matmul_add`, `bias_backward`; fused `linear_gelu`, `matmul_gelu_backward`, `mlp_forward` (generation) |
//! | [`elementwise`] | [`ElementwiseOps`] | `add`, `scale`, `gelu`, `gelu_backward` |
//! | [`layernorm`] | [`LayerNormOps`] | `layernorm`, `layernorm_backward`; fused `residual_layernorm` |
//! | [`softmax`] | [`SoftmaxOps`] | `softmax`, `softmax_backward` |
//! | [`embedding`] | [`EmbeddingOps`] | `embedding`, `embedding_backward` |
//! | [`loss`] | [`LossOps`] | `softmax_cross_entropy` |
//! | [`optim`] | [`OptimOps`] | `sum_squares`, `adamw`, `clip_scale`, `adamw_scaled` |
//! | [`attention`] | [`AttentionOps`] | fused `attention_forward`, `attention_backward` and their workspace; `decode_attention` (generation: QKV, cache append, attention, projection) |
//! | [`decode`] | [`DecodeOps`] | fused `decode_blocks` (generation: every block over the KV cache, with the LayerNorms between) |
//!
//! Each family's module holds its trait, the argument check of each of its ops
//! (`check`, re-exported as [`crate::check`]) and the default implementations of its
//! fused ops built from finer ops (`fused`, re-exported as [`crate::fused`]). A backend
//! implements the ten traits (each in the file that holds that family's kernels) and is
//! then a [`Backend`] by the blanket impl; model code asks for `B: Backend` and calls
//! `be.matmul(..)` as if it were one trait. Code holding a concrete backend brings the
//! methods into scope with `use andrea_core::prelude::*`.
//!
//! The traits are the specification; `andrea-testkit` holds a float64 reference for
//! every op and a conformance suite that any backend runs with one line. Each op's
//! signature is written once more, in the op list [`crate::for_each_op!`], from which the
//! types that wrap a backend (the decorators, test backends with a planted fault)
//! implement every op.
//!
//! # Conventions
//!
//! * Shapes are row-major; `[B, T, C]` is batch, time (sequence), channels.
//! * Every op validates its arguments with the [`crate::check`] function of the same
//!   name and returns an error naming the op, the argument and the sizes; no op panics or
//!   writes out of bounds.
//! * **Outputs never overlap inputs**, except where an op says it may work in place on
//!   exactly the same view.
//! * **Gradients:** parameter gradients (`dweight`, `dbias`, `dgamma`, `dbeta`, `dwte`,
//!   `dwpe`) are always accumulated (`+=`), so micro-batches accumulate for free.
//!   Activation gradients are overwritten (`=`), except `dx` of
//!   [`LayerNormOps::layernorm_backward`], which adds into the residual stream's gradient
//!   (pre-norm blocks: the residual path and the LayerNorm path meet there).
//! * Ops are issued in order on one queue; results are visible to later ops at once.
//!   Host reads ([`MemoryOps::download`], [`OptimOps::sum_squares`]) wait for earlier work.

pub mod attention;
pub mod decode;
pub mod elementwise;
pub mod embedding;
pub mod layernorm;
pub mod linalg;
mod list;
pub mod loss;
pub mod memory;
pub mod optim;
pub mod softmax;

pub use attention::{AttentionOps, AttentionShape};
pub use decode::{DecodeBlock, DecodeBlockOf, DecodeOps, NormOutputs, NormParams};
pub use elementwise::ElementwiseOps;
pub use embedding::EmbeddingOps;
pub use layernorm::LayerNormOps;
pub use linalg::{LinalgOps, LinearOf, LinearParams};
pub use loss::{LossOps, IGNORE_INDEX};
pub use memory::{DeviceRegion, MemoryOps};
pub use optim::{clip_stats, AdamWStep, OptimOps};
pub use softmax::SoftmaxOps;

use crate::tensor::{Heads, Matrix, View};

/// An `f32` tensor view into backend `B`'s memory.
pub type Tensor<'a, B> = View<'a, <B as MemoryOps>::Buffer>;
/// A `u32` token-id view into backend `B`'s memory.
pub type Ids<'a, B> = View<'a, <B as MemoryOps>::IdBuffer>;
/// A `bf16` tensor view into backend `B`'s memory ([`crate::precision`]).
pub type Bf16Tensor<'a, B> = View<'a, <B as MemoryOps>::Bf16Buffer>;
/// A strided `bf16` matrix in backend `B`'s memory.
pub type Bf16Mat<'a, B> = Matrix<'a, <B as MemoryOps>::Bf16Buffer>;
/// A strided `f32` matrix in backend `B`'s memory.
pub type Mat<'a, B> = Matrix<'a, <B as MemoryOps>::Buffer>;
/// Attention heads in backend `B`'s memory.
pub type HeadsOf<'a, B> = Heads<'a, <B as MemoryOps>::Buffer>;

/// A device that runs every op of a GPT-2 training step and of generation: the ten op
/// families together. Implemented for every type that implements them all; there is
/// nothing else to implement.
pub trait Backend:
    MemoryOps
    + LinalgOps
    + ElementwiseOps
    + LayerNormOps
    + SoftmaxOps
    + EmbeddingOps
    + LossOps
    + OptimOps
    + AttentionOps
    + DecodeOps
{
}

impl<T> Backend for T where
    T: MemoryOps
        + LinalgOps
        + ElementwiseOps
        + LayerNormOps
        + SoftmaxOps
        + EmbeddingOps
        + LossOps
        + OptimOps
        + AttentionOps
        + DecodeOps
{
}
