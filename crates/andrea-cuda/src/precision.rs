//! How exact the CUDA backend's arithmetic is.
//!
//! Two modes, because the fast kernels do not meet the float32 tolerances of the
//! conformance suite (they are not meant to):
//!
//! * [`Precision::FP32`]: every product on FP32 FMA units (`matmul_simt`), GELU with
//!   `tanhf`. Results agree with the float64 references to f32 rounding; this is what the
//!   conformance suite runs.
//! * [`Precision::FAST`] (the default): large products and attention on tensor cores with
//!   TF32 operands and FP32 accumulation, GELU with the hardware `tanh.approx.f32`. What
//!   training uses; `tests/cpu_vs_cuda.rs` states its tolerances against the CPU backend.
//!
//! [`MatmulPrecision::Bf16`] rounds operands to bfloat16 (8-bit significand) instead:
//! twice the tensor-core rate of TF32 on Ampere and Hopper, and eight times the error.
//! Its products run kernels/matmul_bf16.cu on BF16 copies of the operands that each
//! product makes first (`f32_to_bf16`, 6 bytes per element; they go once activations are
//! stored in BF16), where the operands' layout allows it, else kernels/matmul_mma.cu
//! ([`crate::plan::matmul::gemm_layout`]).
//!
//! Attention follows the same operand precision (kernels/attention_mma.cu for TF32 and
//! BF16, kernels/attention.cu for FP32) unless `ANDREA_CUDA_ATTENTION=simt|mma` or
//! `CudaBackend::set_attention_kernels` forces one: [`crate::plan::attention`].

/// Operand precision of the large matrix products: the same type, and meaning, on every
/// backend ([`andrea_core::precision`]).
pub use andrea_core::MatmulPrecision;

/// The arithmetic the backend's kernels use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Precision {
    pub matmul: MatmulPrecision,
    /// GELU's tanh from `tanh.approx.f32` (relative error about 2⁻¹¹) instead of `tanhf`.
    pub approx_tanh: bool,
}

impl Precision {
    /// FP32 throughout: the conformance suite's tolerances hold.
    pub const FP32: Precision = Precision {
        matmul: MatmulPrecision::Fp32,
        approx_tanh: false,
    };
    /// TF32 tensor cores and the hardware tanh: the training default.
    pub const FAST: Precision = Precision {
        matmul: MatmulPrecision::Tf32,
        approx_tanh: true,
    };
    /// BF16 tensor cores and the hardware tanh.
    pub const BF16: Precision = Precision {
        matmul: MatmulPrecision::Bf16,
        approx_tanh: true,
    };
}

impl Default for Precision {
    fn default() -> Self {
        Precision::FAST
    }
}
