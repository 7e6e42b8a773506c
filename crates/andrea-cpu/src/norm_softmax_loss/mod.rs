//! The row ops: LayerNorm, softmax and the softmax + cross-entropy loss, and the causal
//! softmax rows of attention's scores.

pub(crate) mod causal;
pub(crate) mod layernorm;
pub(crate) mod rows;
pub(crate) mod softmax;
#[cfg(target_arch = "x86_64")]
pub(crate) mod softmax_avx2;
#[cfg(target_arch = "x86_64")]
pub(crate) mod softmax_avx512;
#[cfg(target_arch = "aarch64")]
pub(crate) mod softmax_lanes;
