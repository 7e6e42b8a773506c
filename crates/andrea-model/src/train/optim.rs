//! The optimizer step: global-norm clipping and AdamW (`torch.optim.AdamW` semantics,
//! weight decay on the 2-D tensors only), over the accumulated gradients.

use andrea_core::{AdamWStep, Backend, View};

use super::Trainer;
use crate::error::{ModelError, Result};

/// What an optimizer step did.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StepStats {
    /// The step's number (1-based).
    pub step: u64,
    pub lr: f32,
    /// Global L2 norm of the gradient of the mean loss, before clipping.
    pub grad_norm: f32,
    /// The factor clipping multiplied the gradient by (1: not clipped).
    pub clip_scale: f32,
}

impl<B: Backend> Trainer<B> {
    /// Zeroes the gradient buffer (and forgets accumulated micro-batches).
    pub fn zero_grad(&mut self) -> Result<()> {
        self.model.backend().fill(View::whole(&self.grads), 0.0)?;
        self.micro_batches = 0;
        Ok(())
    }

    /// Global L2 norm of the gradient of the mean loss over the micro-batches
    /// accumulated so far (`sqrt(Σ g²) / micro_batches`).
    pub fn grad_norm(&self) -> Result<f32> {
        let ss = self.model.backend().sum_squares(View::whole(&self.grads))?;
        Ok((ss.sqrt() / self.micro_batches.max(1) as f64) as f32)
    }

    /// One optimizer step at learning rate `lr` over the gradients of every
    /// [`Trainer::backward`] since the last step (their mean: gradient accumulation),
    /// then zeroes the gradients.
    ///
    /// With `grad_clip = Some(c)`, the gradient is scaled by `c / (norm + 1e-6)` when
    /// that is below 1, as `torch.nn.utils.clip_grad_norm_` does. A NaN or infinite
    /// gradient norm is an error and leaves the parameters untouched.
    pub fn step(&mut self, lr: f32) -> Result<StepStats> {
        if self.micro_batches == 0 {
            return Err(ModelError::State(
                "step: no gradients accumulated (call backward first)".into(),
            ));
        }
        check_lr(lr)?;
        let sum_squares = self.model.backend().sum_squares(View::whole(&self.grads))?;
        self.step_with(lr, sum_squares)
    }

    /// [`Trainer::step`] given `Σ g²` of the gradient buffer (read by the caller).
    fn step_with(&mut self, lr: f32, sum_squares: f64) -> Result<StepStats> {
        let step = self.steps + 1;
        let be = self.model.backend();
        let mean = 1.0 / self.micro_batches as f64;
        let norm = sum_squares.sqrt() * mean;
        if !norm.is_finite() {
            return Err(ModelError::NonFinite {
                step,
                what: "gradient norm",
                value: norm,
            });
        }
        let clip = match self.optimizer.grad_clip {
            Some(max) if (max as f64) / (norm + 1e-6) < 1.0 => max as f64 / (norm + 1e-6),
            _ => 1.0,
        };
        let o = &self.optimizer;
        let layout = self.model.layout();
        let groups = [
            (0, layout.decay_len, o.weight_decay),
            (layout.decay_len, layout.len, 0.0),
        ];
        for (start, end, weight_decay) in groups {
            if start == end {
                continue;
            }
            let range = |buf| View::new(buf, start, [end - start]);
            be.adamw(
                range(self.model.buffer()),
                range(&self.grads),
                range(&self.m),
                range(&self.v),
                &AdamWStep {
                    lr,
                    beta1: o.beta1,
                    beta2: o.beta2,
                    eps: o.eps,
                    weight_decay,
                    step,
                    grad_scale: (mean * clip) as f32,
                },
            )?;
        }
        self.steps = step;
        self.zero_grad()?;
        Ok(StepStats {
            step,
            lr,
            grad_norm: norm as f32,
            clip_scale: clip as f32,
        })
    }

    /// Forward, backward and step over `micro_batches` (each `(tokens, targets)` as
    /// [`Trainer::forward`] takes them): one optimizer step on their mean gradient.
    /// Returns the mean loss and the step's statistics.
    ///
    /// On a GPU backend the host waits for the device once per micro-batch: with one
    /// micro-batch, only after the whole forward and backward pass and the gradient norm
    /// are queued (then it reads the norm and the loss); the AdamW update is left queued.
    /// The separate `forward_train` / `backward` / `step` calls wait twice (the loss
    /// after the forward pass, the norm in `step`).
    pub fn train_step(
        &mut self,
        micro_batches: &[(&[u32], &[u32])],
        lr: f32,
    ) -> Result<(f32, StepStats)> {
        if micro_batches.is_empty() {
            return Err(ModelError::batch("train_step", "no micro-batches given"));
        }
        if self.micro_batches != 0 {
            self.zero_grad()?;
        }
        check_lr(lr)?;
        // The host waits for the device once per micro-batch, and for the last one only
        // after its backward pass and the gradient norm are queued: the norm's read and
        // then the loss's (the stream is idle by then) are one drain of the queue, and
        // AdamW runs while the caller prepares the next step. Earlier micro-batches read
        // their loss after their backward pass is queued, before the next forward pass
        // overwrites it. A non-finite loss is still an error before AdamW touches the
        // parameters (its gradient stays in the buffer; the next train_step zeroes it).
        let mut loss = 0.0;
        let last = micro_batches.len() - 1;
        let mut sum_squares = 0.0;
        for (i, (tokens, targets)) in micro_batches.iter().enumerate() {
            let (batch, counted) = self.queue_forward(tokens, targets, true)?;
            self.backward()?;
            if i == last {
                let be = self.model.backend();
                sum_squares = be.sum_squares(View::whole(&self.grads))?;
            }
            loss += self.read_loss(batch, counted)? as f64;
        }
        let stats = self.step_with(lr, sum_squares)?;
        Ok(((loss / micro_batches.len() as f64) as f32, stats))
    }
}

/// The learning rate [`Trainer::step`] takes: a non-negative number.
fn check_lr(lr: f32) -> Result<()> {
    if lr >= 0.0 && lr.is_finite() {
        return Ok(());
    }
    Err(ModelError::batch(
        "step",
        format!("the learning rate must be a non-negative number, got {lr}"),
    ))
}
