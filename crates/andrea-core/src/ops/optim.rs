//! The optimizer: the squared global gradient norm (for clipping) and the AdamW update,
//! either with a scale the host passes or with the clipping scale computed and read on
//! the device (so a GPU training step need not wait for the norm before AdamW).

use super::{MemoryOps, Tensor};
use crate::error::Result;
use crate::tensor::View;

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

    /// Global-norm gradient clipping without reading the norm on the host: from
    /// `Σ grad²` (as [`OptimOps::sum_squares`] computes it, in f64) writes
    ///
    /// ```text
    /// norm = sqrt(Σ grad²) · mean                     (f64)
    /// clip = max_norm / (norm + 1e-6)  if max_norm is given and that is < 1, else 1
    /// out  = [(mean · clip) as f32, norm as f32, clip as f32]
    /// ```
    ///
    /// (`torch.nn.utils.clip_grad_norm_`'s scale, times `mean` for gradient accumulation:
    /// exactly [`clip_stats`]). When `norm` is not finite, or any element of `guard`
    /// (the step's per-token losses) is not finite, `out[0]` is NaN instead, which makes
    /// [`OptimOps::adamw_scaled`] leave everything untouched. `out` has 3 elements and
    /// overlaps neither `grad` nor `guard`. Nothing is read back: on a GPU this queues.
    fn clip_scale(
        &self,
        grad: Tensor<'_, Self>,
        mean: f64,
        max_norm: Option<f32>,
        guard: Option<Tensor<'_, Self>>,
        out: Tensor<'_, Self>,
    ) -> Result<()> {
        check::clip_scale(&grad, mean, max_norm, guard.as_ref(), &out)?;
        let sum_squares = self.sum_squares(grad)?;
        let mut finite = true;
        if let Some(g) = guard {
            let mut host = vec![0.0; g.numel()];
            self.download(g, &mut host)?;
            finite = host.iter().all(|x| x.is_finite());
        }
        let mut stats = clip_stats(sum_squares, mean, max_norm);
        if !finite {
            stats[0] = f32::NAN;
        }
        self.upload(&stats, out)
    }

    /// [`OptimOps::adamw`] with the gradient scale read from `scale[0]` (device memory,
    /// as [`OptimOps::clip_scale`] leaves it) in place of `step.grad_scale`, which must
    /// be 1. A NaN `scale[0]` skips the update: `param`, `m` and `v` stay as they are.
    /// `scale` overlaps none of `param`, `m`, `v`.
    fn adamw_scaled(
        &self,
        param: Tensor<'_, Self>,
        grad: Tensor<'_, Self>,
        m: Tensor<'_, Self>,
        v: Tensor<'_, Self>,
        step: &AdamWStep,
        scale: Tensor<'_, Self>,
    ) -> Result<()> {
        check::adamw_scaled(&param, &grad, &m, &v, step, &scale)?;
        let mut host = [0.0f32];
        self.download(View::new(scale.buf, scale.offset, [1]), &mut host)?;
        if host[0].is_nan() {
            return Ok(());
        }
        let step = AdamWStep {
            grad_scale: host[0],
            ..*step
        };
        self.adamw(param, grad, m, v, &step)
    }
}

/// `[(mean · clip) as f32, norm as f32, clip as f32]` from `Σ grad²`, as
/// [`OptimOps::clip_scale`] specifies it (the host-side formula every backend matches
/// bit for bit: f64 arithmetic, one rounding to f32 at the end).
pub fn clip_stats(sum_squares: f64, mean: f64, max_norm: Option<f32>) -> [f32; 3] {
    let norm = sum_squares.sqrt() * mean;
    let clip = match max_norm {
        Some(max) if (max as f64) / (norm + 1e-6) < 1.0 => max as f64 / (norm + 1e-6),
        _ => 1.0,
    };
    let scale = if norm.is_finite() {
        (mean * clip) as f32
    } else {
        f32::NAN
    };
    [scale, norm as f32, clip as f32]
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

    /// [`super::OptimOps::clip_scale`].
    pub fn clip_scale<M: DeviceMemory>(
        grad: &View<'_, M>,
        mean: f64,
        max_norm: Option<f32>,
        guard: Option<&View<'_, M>>,
        out: &View<'_, M>,
    ) -> Result<ElementwiseDims> {
        const OP: &str = "clip_scale";
        view(OP, "grad", grad)?;
        numel(OP, "out", out, 3)?;
        if !(mean.is_finite() && mean > 0.0) {
            return Err(Error::invalid(
                OP,
                format!("mean must be finite and > 0, got {mean}"),
            ));
        }
        if let Some(max) = max_norm {
            if !(max.is_finite() && max > 0.0) {
                return Err(Error::invalid(
                    OP,
                    format!("max_norm must be finite and > 0, got {max}"),
                ));
            }
        }
        let mut inputs = vec![Region::of("grad", grad)];
        if let Some(g) = guard {
            view(OP, "guard", g)?;
            inputs.push(Region::of("guard", g));
        }
        disjoint(OP, &[Region::of("out", out)], &inputs, false)?;
        Ok(ElementwiseDims { len: grad.numel() })
    }

    /// [`super::OptimOps::adamw_scaled`].
    pub fn adamw_scaled<M: DeviceMemory>(
        param: &View<'_, M>,
        grad: &View<'_, M>,
        m: &View<'_, M>,
        v: &View<'_, M>,
        step: &super::AdamWStep,
        scale: &View<'_, M>,
    ) -> Result<ElementwiseDims> {
        const OP: &str = "adamw_scaled";
        let d = adamw(param, grad, m, v, step)?;
        if step.grad_scale != 1.0 {
            return Err(Error::invalid(
                OP,
                format!(
                    "the scale comes from `scale[0]`: step.grad_scale must be 1, got {}",
                    step.grad_scale
                ),
            ));
        }
        view(OP, "scale", scale)?;
        disjoint(
            OP,
            &[
                Region::of("param", param),
                Region::of("m", m),
                Region::of("v", v),
            ],
            &[Region::of("scale", scale)],
            false,
        )?;
        Ok(d)
    }
}
