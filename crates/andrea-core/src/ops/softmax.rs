//! Softmax over the last dimension, with an optional causal mask, and its backward.

use super::{MemoryOps, Tensor};
use crate::error::Result;

/// Row-wise softmax.
pub trait SoftmaxOps: MemoryOps {
    /// Row-wise `out = softmax(scale · x)` over the last dimension of `x: [.., Tq, Tk]`.
    /// With `causal_offset = Some(o)`, row `i` (query `i` of the last-but-one
    /// dimension) sees only columns `j <= o + i`; masked entries of `out` are 0.
    /// `out` may be exactly `x`.
    fn softmax(
        &self,
        x: Tensor<'_, Self>,
        out: Tensor<'_, Self>,
        scale: f32,
        causal_offset: Option<usize>,
    ) -> Result<()>;

    /// Backward of [`SoftmaxOps::softmax`] given its output `probs`:
    /// `dx = scale · probs ∘ (dprobs - Σ_j probs·dprobs)`. `dx` may be exactly `dprobs`.
    fn softmax_backward(
        &self,
        probs: Tensor<'_, Self>,
        dprobs: Tensor<'_, Self>,
        dx: Tensor<'_, Self>,
        scale: f32,
    ) -> Result<()>;
}

/// Argument checks of the softmax ops.
pub mod check {
    use crate::check::{disjoint, elementwise, same_shape, view, Region};
    use crate::error::{Error, Result};
    use crate::tensor::{DeviceMemory, View};

    /// Sizes of a validated softmax: `rows` rows of `k_len` columns, the query index of
    /// a row being `row % q_len`.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub struct SoftmaxDims {
        pub rows: usize,
        pub q_len: usize,
        pub k_len: usize,
    }

    /// [`super::SoftmaxOps::softmax`].
    pub fn softmax<M: DeviceMemory>(
        x: &View<'_, M>,
        out: &View<'_, M>,
        scale: f32,
        causal_offset: Option<usize>,
    ) -> Result<SoftmaxDims> {
        const OP: &str = "softmax";
        elementwise(OP, &[("x", x)], ("out", out), true)?;
        if !scale.is_finite() {
            return Err(Error::invalid(
                OP,
                format!("scale must be finite, got {scale}"),
            ));
        }
        let d = x.shape.dims();
        let k_len = x.shape.last();
        let q_len = if d.len() >= 2 { d[d.len() - 2] } else { 1 };
        if let Some(o) = causal_offset {
            if o.saturating_add(q_len) > k_len {
                return Err(Error::invalid(
                    OP,
                    format!(
                        "causal mask: offset {o} + {q_len} queries needs at least {} key columns, x has {k_len}",
                        o.saturating_add(q_len)
                    ),
                ));
            }
        }
        Ok(SoftmaxDims {
            rows: x.shape.rows(),
            q_len,
            k_len,
        })
    }

    /// Sizes of a validated softmax backward: `rows` rows of `cols`.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub struct RowsDims {
        pub rows: usize,
        pub cols: usize,
    }

    /// [`super::SoftmaxOps::softmax_backward`].
    pub fn softmax_backward<M: DeviceMemory>(
        probs: &View<'_, M>,
        dprobs: &View<'_, M>,
        dx: &View<'_, M>,
    ) -> Result<RowsDims> {
        const OP: &str = "softmax_backward";
        view(OP, "probs", probs)?;
        same_shape(OP, "dprobs", dprobs, probs)?;
        same_shape(OP, "dx", dx, probs)?;
        disjoint(
            OP,
            &[Region::of("dx", dx)],
            &[Region::of("probs", probs)],
            false,
        )?;
        disjoint(
            OP,
            &[Region::of("dx", dx)],
            &[Region::of("dprobs", dprobs)],
            true,
        )?;
        Ok(RowsDims {
            rows: probs.shape.rows(),
            cols: probs.shape.last(),
        })
    }
}
