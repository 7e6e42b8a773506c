//! Conversions between FP32 and BF16 storage (`andrea_core::MemoryOps::to_bf16` and
//! `to_f32`): one pass, memory-bound, in fixed chunks.
//!
//! The rounding is written on the bits so the compiler vectorises it at any SIMD level:
//! adding `0x7fff` plus the lowest kept bit to the FP32 pattern and keeping the upper 16
//! bits rounds to nearest with ties to even (a carry into the exponent is the correct
//! result, up to infinity); NaN is kept apart so that it stays NaN (quiet, sign kept).

use andrea_core::bf16;
use rayon::prelude::*;

use crate::par::MIN_TASK_ELEMS;

/// `x` rounded to BF16, nearest with ties to even.
#[inline(always)]
pub(crate) fn narrow(x: f32) -> bf16 {
    let u = x.to_bits();
    let bits = if x.is_nan() {
        (u >> 16) | 0x40
    } else {
        (u + 0x7fff + ((u >> 16) & 1)) >> 16
    };
    bf16::from_bits(bits as u16)
}

/// `y[i] = bf16(x[i])`.
pub(crate) fn to_bf16(x: &[f32], y: &mut [bf16]) {
    y.par_chunks_mut(MIN_TASK_ELEMS)
        .zip(x.par_chunks(MIN_TASK_ELEMS))
        .for_each(|(y, x)| {
            for (y, &x) in y.iter_mut().zip(x) {
                *y = narrow(x);
            }
        });
}

/// `y[i] = f32(x[i])` (exact).
pub(crate) fn to_f32(x: &[bf16], y: &mut [f32]) {
    y.par_chunks_mut(MIN_TASK_ELEMS)
        .zip(x.par_chunks(MIN_TASK_ELEMS))
        .for_each(|(y, x)| {
            for (y, &x) in y.iter_mut().zip(x) {
                *y = f32::from_bits((x.to_bits() as u32) << 16);
            }
        });
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The bit formula agrees with `half`'s rounding on every upper half and a spread
    /// of lower halves (ties, either side of them, the extremes), NaN aside.
    #[test]
    fn narrowing_matches_round_to_nearest_even() {
        for upper in 0..=0xffffu32 {
            for lower in [0, 1, 0x7fff, 0x8000, 0x8001, 0xffff] {
                let x = f32::from_bits((upper << 16) | lower);
                let (got, want) = (narrow(x), bf16::from_f32(x));
                if x.is_nan() {
                    assert!(got.is_nan(), "{x:?}");
                } else {
                    assert_eq!(got.to_bits(), want.to_bits(), "{:#010x}", x.to_bits());
                }
            }
        }
    }
}
