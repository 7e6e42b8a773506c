//! LayerNorm: forward (saving the row statistics), backward, and the fused residual add
//! + LayerNorm that joins one block to the next.

use super::{ElementwiseOps, MemoryOps, Tensor};
use crate::error::Result;

/// LayerNorm over the last dimension.
pub trait LayerNormOps: MemoryOps {
    /// LayerNorm over the last dimension of `x: [N, C]`:
    /// `out = γ·(x - mean)·rstd + β` with biased variance and `rstd = 1/sqrt(var + eps)`.
    /// Saves `mean: [N]` and `rstd: [N]` for the backward pass.
    fn layernorm(
        &self,
        x: Tensor<'_, Self>,
        gamma: Tensor<'_, Self>,
        beta: Tensor<'_, Self>,
        out: Tensor<'_, Self>,
        mean: Tensor<'_, Self>,
        rstd: Tensor<'_, Self>,
        eps: f32,
    ) -> Result<()>;

    /// Backward of [`LayerNormOps::layernorm`]: `dx += ∂L/∂x` (note: adds, see the
    /// [`crate::ops`] conventions), `dgamma += Σ_n dout·x̂`, `dbeta += Σ_n dout`.
    fn layernorm_backward(
        &self,
        x: Tensor<'_, Self>,
        gamma: Tensor<'_, Self>,
        mean: Tensor<'_, Self>,
        rstd: Tensor<'_, Self>,
        dout: Tensor<'_, Self>,
        dx: Tensor<'_, Self>,
        dgamma: Tensor<'_, Self>,
        dbeta: Tensor<'_, Self>,
    ) -> Result<()>;

    /// Fused: `residual = a + b`, then `out = LayerNorm(residual)` saving `mean` and
    /// `rstd`. `residual` may be exactly `a` or `b`. Default:
    /// [`fused::residual_layernorm`].
    fn residual_layernorm(
        &self,
        a: Tensor<'_, Self>,
        b: Tensor<'_, Self>,
        residual: Tensor<'_, Self>,
        gamma: Tensor<'_, Self>,
        beta: Tensor<'_, Self>,
        out: Tensor<'_, Self>,
        mean: Tensor<'_, Self>,
        rstd: Tensor<'_, Self>,
        eps: f32,
    ) -> Result<()>
    where
        Self: ElementwiseOps,
    {
        fused::residual_layernorm(self, a, b, residual, gamma, beta, out, mean, rstd, eps)
    }
}

/// Argument checks of the LayerNorm ops.
pub mod check {
    use crate::check::{disjoint, elementwise, numel, same_shape, view, Region};
    use crate::error::{Error, Result};
    use crate::tensor::{DeviceMemory, View};

    /// Sizes of a validated LayerNorm: `rows` rows of `channels`.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub struct LayerNormDims {
        pub rows: usize,
        pub channels: usize,
    }

    /// [`super::LayerNormOps::layernorm`].
    pub fn layernorm<M: DeviceMemory>(
        x: &View<'_, M>,
        gamma: &View<'_, M>,
        beta: &View<'_, M>,
        out: &View<'_, M>,
        mean: &View<'_, M>,
        rstd: &View<'_, M>,
        eps: f32,
    ) -> Result<LayerNormDims> {
        const OP: &str = "layernorm";
        view(OP, "x", x)?;
        let (n, c) = (x.shape.rows(), x.shape.last());
        numel(OP, "gamma", gamma, c)?;
        numel(OP, "beta", beta, c)?;
        same_shape(OP, "out", out, x)?;
        numel(OP, "mean", mean, n)?;
        numel(OP, "rstd", rstd, n)?;
        if !(eps > 0.0 && eps.is_finite()) {
            return Err(Error::invalid(
                OP,
                format!("eps must be a positive finite number, got {eps}"),
            ));
        }
        disjoint(
            OP,
            &[
                Region::of("out", out),
                Region::of("mean", mean),
                Region::of("rstd", rstd),
            ],
            &[
                Region::of("x", x),
                Region::of("gamma", gamma),
                Region::of("beta", beta),
            ],
            false,
        )?;
        Ok(LayerNormDims {
            rows: n,
            channels: c,
        })
    }

    /// [`super::LayerNormOps::layernorm_backward`].
    pub fn layernorm_backward<M: DeviceMemory>(
        x: &View<'_, M>,
        gamma: &View<'_, M>,
        mean: &View<'_, M>,
        rstd: &View<'_, M>,
        dout: &View<'_, M>,
        dx: &View<'_, M>,
        dgamma: &View<'_, M>,
        dbeta: &View<'_, M>,
    ) -> Result<LayerNormDims> {
        const OP: &str = "layernorm_backward";
        view(OP, "x", x)?;
        let (n, c) = (x.shape.rows(), x.shape.last());
        numel(OP, "gamma", gamma, c)?;
        numel(OP, "mean", mean, n)?;
        numel(OP, "rstd", rstd, n)?;
        same_shape(OP, "dout", dout, x)?;
        same_shape(OP, "dx", dx, x)?;
        numel(OP, "dgamma", dgamma, c)?;
        numel(OP, "dbeta", dbeta, c)?;
        disjoint(
            OP,
            &[
                Region::of("dx", dx),
                Region::of("dgamma", dgamma),
                Region::of("dbeta", dbeta),
            ],
            &[
                Region::of("x", x),
                Region::of("gamma", gamma),
                Region::of("mean", mean),
                Region::of("rstd", rstd),
                Region::of("dout", dout),
            ],
            false,
        )?;
        Ok(LayerNormDims {
            rows: n,
            channels: c,
        })
    }

    /// [`super::LayerNormOps::residual_layernorm`]: the add (`residual` may be exactly
    /// `a` or `b`), the LayerNorm of `residual` (errors named `layernorm`), and the
    /// LayerNorm's outputs disjoint from `a` and `b`.
    pub fn residual_layernorm<M: DeviceMemory>(
        a: &View<'_, M>,
        b: &View<'_, M>,
        residual: &View<'_, M>,
        gamma: &View<'_, M>,
        beta: &View<'_, M>,
        out: &View<'_, M>,
        mean: &View<'_, M>,
        rstd: &View<'_, M>,
        eps: f32,
    ) -> Result<LayerNormDims> {
        const OP: &str = "residual_layernorm";
        elementwise(OP, &[("a", a), ("b", b)], ("residual", residual), true)?;
        let d = layernorm(residual, gamma, beta, out, mean, rstd, eps)?;
        disjoint(
            OP,
            &[
                Region::of("out", out),
                Region::of("mean", mean),
                Region::of("rstd", rstd),
            ],
            &[Region::of("a", a), Region::of("b", b)],
            false,
        )?;
        Ok(d)
    }
}

/// Default implementations of the fused LayerNorm ops, from the fine ops.
pub mod fused {
    use super::super::{ElementwiseOps, Tensor};
    use super::LayerNormOps;
    use crate::error::Result;

    /// Default [`LayerNormOps::residual_layernorm`]: an add, then a LayerNorm.
    pub fn residual_layernorm<B: LayerNormOps + ElementwiseOps>(
        be: &B,
        a: Tensor<'_, B>,
        b: Tensor<'_, B>,
        residual: Tensor<'_, B>,
        gamma: Tensor<'_, B>,
        beta: Tensor<'_, B>,
        out: Tensor<'_, B>,
        mean: Tensor<'_, B>,
        rstd: Tensor<'_, B>,
        eps: f32,
    ) -> Result<()> {
        be.add(a, b, residual)?;
        be.layernorm(residual, gamma, beta, out, mean, rstd, eps)
    }
}
