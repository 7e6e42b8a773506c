//! Number formats: what a product's operands are rounded to, and the one storage format
//! besides `f32` that backends share, `bf16`.
//!
//! # Operand precision
//!
//! [`MatmulPrecision`] means the same on every backend: `Fp32` multiplies FP32 operands
//! (the exact reference); `Tf32` and `Bf16` round each product operand to that format
//! (TF32 on CUDA tensor cores only; BF16 round to nearest, ties to even) and accumulate in
//! FP32. Master weights, the optimizer's moments and step, and checkpoints stay FP32 in
//! every precision; reductions (LayerNorm statistics, softmax sums, cross-entropy, the
//! gradient norm) accumulate in FP32.
//!
//! # Storage: the element type is the buffer type
//!
//! A backend's memory comes in one buffer type per element type
//! ([`crate::MemoryOps`]): `Buffer` holds `f32`, `IdBuffer` token ids (`u32`), and
//! `Bf16Buffer` holds [`bf16`] — a weight copy that decoding streams at half the bytes, or
//! activations a backend keeps in BF16. A view ([`crate::View`], [`crate::Matrix`],
//! [`crate::Heads`]) is generic over the buffer, so a BF16 view is the same struct over
//! the other buffer type ([`crate::Bf16Tensor`], [`crate::Bf16Mat`]) and an op's
//! signature says which format each operand has. The compiler then refuses a BF16 view
//! where an op reads FP32, no op dispatches on a run-time type tag inside its loops, and
//! the FP32 path keeps its bits and its speed. (candle carries a run-time dtype per
//! tensor and converts on mismatch; burn types the element statically, as here. A model
//! of a few fixed tensors gains nothing from run-time dtypes and would lose the check.)
//!
//! Conversions between the two are ops of their own ([`crate::MemoryOps::to_bf16`],
//! [`crate::MemoryOps::to_f32`]); a kernel that reads FP32 and wants BF16 operands
//! rounds them where it packs them, with the same rounding as [`round_bf16`].

pub use half::bf16;

/// The number format of the large products' operands (accumulation is always FP32).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum MatmulPrecision {
    /// FP32 operands: the exact reference.
    #[default]
    Fp32,
    /// Operands rounded to TF32 (10-bit mantissa, ties away from zero as `cvt.rna`):
    /// CUDA tensor cores.
    Tf32,
    /// Operands rounded to BF16 (7-bit mantissa, ties to even).
    Bf16,
}

impl MatmulPrecision {
    /// The name the command line uses: `fp32`, `tf32`, `bf16`.
    pub fn name(self) -> &'static str {
        match self {
            MatmulPrecision::Fp32 => "fp32",
            MatmulPrecision::Tf32 => "tf32",
            MatmulPrecision::Bf16 => "bf16",
        }
    }

    /// The unit roundoff of rounding an operand to this format, from which error bounds
    /// of products are derived: 0 for FP32 (no rounding beyond FP32's own), 2⁻¹¹ for
    /// TF32, 2⁻⁸ for BF16.
    pub fn unit_roundoff(self) -> f64 {
        match self {
            MatmulPrecision::Fp32 => 0.0,
            MatmulPrecision::Tf32 => 2f64.powi(-11),
            MatmulPrecision::Bf16 => 2f64.powi(-8),
        }
    }
}

/// `x` rounded to the nearest BF16 value (ties to even), as an `f32`: the rounding of
/// every BF16 operand and of [`crate::MemoryOps::to_bf16`]. Finite values beyond BF16's
/// largest round to infinity; NaN stays NaN (its payload is not kept).
#[inline]
pub fn round_bf16(x: f32) -> f32 {
    bf16::from_f32(x).to_f32()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Ties go to the even neighbour, everything else to the nearest; the bits are
    /// written out by hand, independently of `half`.
    #[test]
    fn bf16_rounds_to_nearest_even() {
        let cases: &[(u32, u32)] = &[
            (0x3f80_0000, 0x3f80_0000), // 1.0 exact
            (0x3f80_8000, 0x3f80_0000), // tie, even below
            (0x3f81_8000, 0x3f82_0000), // tie, even above
            (0x3f80_8001, 0x3f81_0000), // just above the tie
            (0x3f80_7fff, 0x3f80_0000), // just below the tie
            (0x7f7f_ffff, 0x7f80_0000), // f32::MAX rounds to infinity
            (0x0000_8001, 0x0001_0000), // subnormal rounds up
            (0x8000_0000, 0x8000_0000), // -0.0
        ];
        for &(x, want) in cases {
            let got = round_bf16(f32::from_bits(x)).to_bits();
            assert_eq!(
                got, want,
                "{x:#010x} rounded to {got:#010x}, want {want:#010x}"
            );
        }
        assert!(round_bf16(f32::NAN).is_nan());
        assert_eq!(round_bf16(f32::NEG_INFINITY), f32::NEG_INFINITY);
    }
}
