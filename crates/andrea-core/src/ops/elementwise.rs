//! Elementwise ops: the residual add, scaling, GELU and its backward.

use super::{MemoryOps, Tensor};
use crate::error::Result;

/// Ops applied to each element independently.
pub trait ElementwiseOps: MemoryOps {
    /// `out = a + b` (the residual connection). `out` may be exactly `a` or `b`.
    fn add(&self, a: Tensor<'_, Self>, b: Tensor<'_, Self>, out: Tensor<'_, Self>) -> Result<()>;

    /// `x *= alpha`, in place.
    fn scale(&self, x: Tensor<'_, Self>, alpha: f32) -> Result<()>;

    /// `out = GELU(x)`, tanh form: `0.5·x·(1 + tanh(sqrt(2/π)·(x + 0.044715·x³)))`.
    /// `out` may be exactly `x`.
    fn gelu(&self, x: Tensor<'_, Self>, out: Tensor<'_, Self>) -> Result<()>;

    /// `dx = dout · GELU'(x)` (the derivative of the same tanh form). `dx` may be
    /// exactly `dout`.
    fn gelu_backward(
        &self,
        x: Tensor<'_, Self>,
        dout: Tensor<'_, Self>,
        dx: Tensor<'_, Self>,
    ) -> Result<()>;
}

/// Argument checks of the elementwise ops.
pub mod check {
    use crate::check::{disjoint, elementwise, view, ElementwiseDims, Region};
    use crate::error::Result;
    use crate::tensor::{DeviceMemory, View};

    /// [`super::ElementwiseOps::add`].
    pub fn add<M: DeviceMemory>(
        a: &View<'_, M>,
        b: &View<'_, M>,
        out: &View<'_, M>,
    ) -> Result<ElementwiseDims> {
        elementwise("add", &[("a", a), ("b", b)], ("out", out), true)?;
        Ok(ElementwiseDims { len: out.numel() })
    }

    /// [`super::ElementwiseOps::scale`].
    pub fn scale<M: DeviceMemory>(x: &View<'_, M>) -> Result<ElementwiseDims> {
        view("scale", "x", x)?;
        Ok(ElementwiseDims { len: x.numel() })
    }

    /// [`super::ElementwiseOps::gelu`].
    pub fn gelu<M: DeviceMemory>(x: &View<'_, M>, out: &View<'_, M>) -> Result<ElementwiseDims> {
        elementwise("gelu", &[("x", x)], ("out", out), true)?;
        Ok(ElementwiseDims { len: x.numel() })
    }

    /// [`super::ElementwiseOps::gelu_backward`]: `dx` may be `dout`, never `x`.
    pub fn gelu_backward<M: DeviceMemory>(
        x: &View<'_, M>,
        dout: &View<'_, M>,
        dx: &View<'_, M>,
    ) -> Result<ElementwiseDims> {
        const OP: &str = "gelu_backward";
        elementwise(OP, &[("x", x), ("dout", dout)], ("dx", dx), true)?;
        disjoint(OP, &[Region::of("dx", dx)], &[Region::of("x", x)], false)?;
        Ok(ElementwiseDims { len: x.numel() })
    }
}
