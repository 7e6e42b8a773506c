//! Float64 references for every op of [`andrea_core::Backend`].
//!
//! Plain loops over host slices, one op family per file, each function opening with the
//! shapes it takes. They follow the op's documented semantics exactly, including the
//! conventions of the trait (parameter gradients `+=`, activation gradients `=`, except
//! the `dx` of [`layernorm_backward`], which adds). Outputs are `&mut` slices; the
//! references assume valid arguments (validation is the backend's job, checked by the
//! suite's bad-input tests) and panic on out-of-range indices.
//!
//! Every backward reference is checked against central differences of its forward
//! reference in the tests of its file.
//!
//! [`gpt2`] composes them into the whole model: the float64 GPT-2 forward pass and loss
//! that `andrea-model` is specified (and gradient-checked) by.

mod attention;
mod elementwise;
mod embedding;
pub mod gpt2;
mod layernorm;
mod loss;
mod matmul;
mod optim;
mod softmax;

#[cfg(test)]
mod fd;

pub use attention::{attention_backward, attention_forward};
pub use elementwise::{add, gelu, gelu_backward, gelu_scalar, round_bf16, scale};
pub use embedding::{embedding, embedding_backward};
pub use layernorm::{layernorm, layernorm_backward};
pub use loss::softmax_cross_entropy;
pub use matmul::{bias_backward, copy, matmul, matmul_gelu_backward, Layout};
pub use optim::{adamw, sum_squares};
pub use softmax::{softmax, softmax_backward};

/// Widens f32 data for a reference.
pub fn to_f64(x: &[f32]) -> Vec<f64> {
    x.iter().map(|&v| v as f64).collect()
}
