//! The optimizer step: global-norm clipping and AdamW (`torch.optim.AdamW` semantics,
//! weight decay on the 2-D tensors only), over the accumulated gradients.

use andrea_core::{AdamWStep, Backend, View};

use super::slots::STEP_STATS;
use super::Trainer;
use crate::error::{ModelError, Result};
use crate::gpt;

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
    /// Forgets the accumulated gradients, as `zero_grad(set_to_none=True)` does in
    /// PyTorch: the next [`Trainer::backward`] writes the gradient buffer afresh, so
    /// nothing is zeroed now. Until then [`Trainer::read_grad`] reads zeros and
    /// [`Trainer::grad_norm`] 0, while the raw [`Trainer::gradients`] buffer still holds
    /// the old values. [`Trainer::step`] ends with this.
    pub fn zero_grad(&mut self) -> Result<()> {
        self.micro_batches = 0;
        Ok(())
    }

    /// Global L2 norm of the gradient of the mean loss over the micro-batches
    /// accumulated so far (`sqrt(Σ g²) / micro_batches`; 0 before the first).
    pub fn grad_norm(&self) -> Result<f32> {
        if self.micro_batches == 0 {
            return Ok(0.0);
        }
        let ss = self.model.backend().sum_squares(View::whole(&self.grads))?;
        Ok((ss.sqrt() / self.micro_batches.max(1) as f64) as f32)
    }

    /// One optimizer step at learning rate `lr` over the gradients of every
    /// [`Trainer::backward`] since the last step (their mean: gradient accumulation),
    /// then forgets them ([`Trainer::zero_grad`]).
    ///
    /// With `grad_clip = Some(c)`, the gradient is scaled by `c / (norm + 1e-6)` when
    /// that is below 1, as `torch.nn.utils.clip_grad_norm_` does. A NaN or infinite
    /// gradient norm is an error and leaves the parameters untouched.
    ///
    /// The scale is computed on the device ([`andrea_core::OptimOps::clip_scale`]) and
    /// AdamW reads it there, so a GPU backend waits once, after AdamW is queued, to read
    /// the norm for [`StepStats`].
    pub fn step(&mut self, lr: f32) -> Result<StepStats> {
        if self.micro_batches == 0 {
            return Err(ModelError::State(
                "step: no gradients accumulated (call backward first)".into(),
            ));
        }
        check_lr(lr)?;
        self.queue_step(lr, None)?;
        let be = self.model.backend();
        let acts = self.slots.on(be, &self.acts, self.slots.batch);
        let mut stats = [0.0f32; STEP_STATS];
        be.download(acts.step_stats(), &mut stats)?;
        self.finish_step(lr, stats)
    }

    /// Queues the clipping scale (into the step-statistics slot) and AdamW reading it.
    /// With `guard = Some(batch)`, a non-finite loss of the last queued forward pass (of
    /// `batch` sequences) also skips AdamW.
    fn queue_step(&self, lr: f32, guard: Option<usize>) -> Result<()> {
        let step = self.steps + 1;
        let be = self.model.backend();
        let mean = 1.0 / self.micro_batches as f64;
        let acts = self
            .slots
            .on(be, &self.acts, guard.unwrap_or(self.slots.batch));
        let guard = guard.map(|_| acts.losses());
        let out = acts.step_stats();
        be.clip_scale(
            View::whole(&self.grads),
            mean,
            self.optimizer.grad_clip,
            guard,
            out,
        )?;
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
            be.adamw_scaled(
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
                    grad_scale: 1.0,
                },
                out,
            )?;
        }
        Ok(())
    }

    /// After [`Trainer::queue_step`]'s statistics are read: the error AdamW skipped on,
    /// or the step counted and the gradients forgotten.
    fn finish_step(&mut self, lr: f32, stats: [f32; STEP_STATS]) -> Result<StepStats> {
        let step = self.steps + 1;
        let [scale, norm, clip] = stats;
        if scale.is_nan() {
            return Err(ModelError::NonFinite {
                step,
                what: "gradient norm",
                value: norm as f64,
            });
        }
        self.steps = step;
        self.zero_grad()?;
        Ok(StepStats {
            step,
            lr,
            grad_norm: norm,
            clip_scale: clip,
        })
    }

    /// Forward, backward and step over `micro_batches` (each `(tokens, targets)` as
    /// [`Trainer::forward`] takes them): one optimizer step on their mean gradient.
    /// Returns the mean loss and the step's statistics.
    ///
    /// On a GPU backend the host waits for the device once per micro-batch: for the last
    /// one only after the whole forward and backward pass, the clipping scale and AdamW
    /// are queued, reading the losses and the step's statistics in one download. The
    /// separate `forward_train` / `backward` / `step` calls wait twice (the loss after
    /// the forward pass, the statistics in `step`).
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
        // Earlier micro-batches read their loss after their backward pass is queued,
        // before the next forward pass overwrites it. The last one queues the clipping
        // scale and AdamW too, which read the norm on the device and skip the update if
        // it or the last losses are not finite; then one download reads the losses and
        // the statistics. A non-finite loss is still an error with the parameters
        // untouched (its gradient stays in the buffer; the next train_step zeroes it).
        let mut loss = 0.0;
        let last = micro_batches.len() - 1;
        for (i, (tokens, targets)) in micro_batches.iter().enumerate() {
            let (batch, counted) = self.queue_forward(tokens, targets, true)?;
            self.backward()?;
            if i < last {
                loss += self.read_loss(batch, counted)? as f64;
                continue;
            }
            self.queue_step(lr, Some(batch))?;
            let be = self.model.backend();
            let acts = self.slots.on(be, &self.acts, batch);
            be.download(acts.losses_and_stats(), &mut self.host_losses)?;
            let n = batch * self.slots.seq;
            let full = self.slots.batch * self.slots.seq;
            let mean = gpt::mean_loss(&self.host_losses[..n], counted);
            self.check_loss(mean)?;
            loss += mean as f32 as f64;
            let mut stats = [0.0f32; STEP_STATS];
            stats.copy_from_slice(&self.host_losses[full..]);
            let stats = self.finish_step(lr, stats)?;
            return Ok(((loss / micro_batches.len() as f64) as f32, stats));
        }
        unreachable!("the last micro-batch returns")
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
