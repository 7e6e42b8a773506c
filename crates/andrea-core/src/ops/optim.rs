//! The optimizer: the squared global gradient norm (for clipping) and the AdamW update.

use super::{MemoryOps, Tensor};
use crate::error::Result;

/// Hyper-parameters of one AdamW step, with `torch.optim.AdamW` semantics:
///
/// ```text
/// g  = grad · grad_scale
/// m  = β1·m + (1-β1)·g          v = β2·v + (1-β2)·g²
/// m̂  = m / (1-β1^step)           v̂ = v / (1-β2^step)
/// p  = p - lr·weight_decay·p - lr·m̂ / (sqrt(v̂) + eps)
/// ```
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AdamWStep {
    pub lr: f32,
    pub beta1: f32,
    pub beta2: f32,
    pub eps: f32,
    /// Decoupled weight decay; the model passes 0 for biases and LayerNorm parameters.
    pub weight_decay: f32,
    /// 1-based step count, for bias correction.
    pub step: u64,
    /// Multiplies the gradient before use: gradient clipping and loss scaling.
    pub grad_scale: f32,
}

/// The optimizer's ops.
pub trait OptimOps: MemoryOps {
    /// `Σ x²`, accumulated in f64 in an order that does not depend on the thread count
    /// (the squared global gradient norm, for clipping).
    fn sum_squares(&self, x: Tensor<'_, Self>) -> Result<f64>;

    /// One AdamW step over `param`, `grad`, `m`, `v` (equal sizes), see [`AdamWStep`].
    fn adamw(
        &self,
        param: Tensor<'_, Self>,
        grad: Tensor<'_, Self>,
        m: Tensor<'_, Self>,
        v: Tensor<'_, Self>,
        step: &AdamWStep,
    ) -> Result<()>;
}

/// Argument checks of the optimizer's ops.
pub mod check {
    use crate::check::{disjoint, numel, view, ElementwiseDims, Region};
    use crate::error::{Error, Result};
    use crate::tensor::{DeviceMemory, View};

    /// [`super::OptimOps::sum_squares`].
    pub fn sum_squares<M: DeviceMemory>(x: &View<'_, M>) -> Result<ElementwiseDims> {
        view("sum_squares", "x", x)?;
        Ok(ElementwiseDims { len: x.numel() })
    }

    /// [`super::OptimOps::adamw`].
    pub fn adamw<M: DeviceMemory>(
        param: &View<'_, M>,
        grad: &View<'_, M>,
        m: &View<'_, M>,
        v: &View<'_, M>,
        step: &super::AdamWStep,
    ) -> Result<ElementwiseDims> {
        const OP: &str = "adamw";
        view(OP, "param", param)?;
        let n = param.numel();
        numel(OP, "grad", grad, n)?;
        numel(OP, "m", m, n)?;
        numel(OP, "v", v, n)?;
        if step.step == 0 {
            return Err(Error::invalid(
                OP,
                "step is 1-based (bias correction divides by 1 - β^step)",
            ));
        }
        for (name, b) in [("beta1", step.beta1), ("beta2", step.beta2)] {
            if !(0.0..1.0).contains(&b) {
                return Err(Error::invalid(
                    OP,
                    format!("{name} must be in [0, 1), got {b}"),
                ));
            }
        }
        if step.eps.is_nan()
            || step.eps <= 0.0
            || !step.lr.is_finite()
            || !step.weight_decay.is_finite()
        {
            return Err(Error::invalid(
                OP,
                format!(
                    "need eps > 0 and finite lr and weight_decay, got eps {}, lr {}, weight_decay {}",
                    step.eps, step.lr, step.weight_decay
                ),
            ));
        }
        disjoint(
            OP,
            &[
                Region::of("param", param),
                Region::of("m", m),
                Region::of("v", v),
            ],
            &[Region::of("grad", grad)],
            false,
        )?;
        Ok(ElementwiseDims { len: n })
    }
}
