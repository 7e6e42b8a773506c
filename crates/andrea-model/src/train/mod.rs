//! Training: [`Trainer`] owns a [`Model`], the gradient buffer, the AdamW moments and the
//! activation arena, all allocated once; a step allocates nothing on the device.
//!
//! A step is `forward` (the loss), `backward` (gradients, accumulated, so several
//! micro-batches add up) and `step` (clipping and AdamW, then the gradients are
//! forgotten).
//!
//! Accumulation adds whole micro-batch gradients: the first micro-batch's backward pass
//! writes the gradient buffer, every later one a second buffer of the same size, which is
//! then added: `grads = ((g₁ + g₂) + g₃) + …`. Each backward pass writes its weight
//! matrices' gradients (`matmul`, not `matmul_add`) and zeroes only the tensors whose
//! backward ops add (biases, LayerNorms, `wpe`: about 1% of ANDREA-120M's parameters)
//! first: nothing zeroes the whole buffer between steps (a 370 MB write for ANDREA-120M,
//! ~1% of its CPU step). Adding
//! in place (`+=` inside every op) would round differently wherever an op adds several
//! terms into one gradient (the tied `wte` gets two, the GEMM adds k-blocks one by one),
//! and then no other split of the same micro-batches could reproduce the sum. With whole
//! gradients, two data-parallel ranks of one micro-batch each sum to `g₁ + g₂`, bit for
//! bit what one process gets with two micro-batches (andrea-dist relies on it). The
//! second buffer exists only once a step has accumulated (or after
//! [`Trainer::reserve_accumulation`]).

mod optim;
mod passes;
mod slots;
mod state;
#[cfg(test)]
mod tests;

pub use optim::StepStats;
pub(crate) use slots::TrainSlots;

use andrea_core::{Backend, OptimizerConfig};

use crate::error::{ModelError, Result};
use crate::eval::{EvalPass, EvalSlots};
use crate::gpt;
use crate::memory::MemoryPlan;
use crate::model::Model;

/// What the activation arena holds now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Empty,
    /// After a forward pass of `batch` sequences with `counted` non-ignored targets;
    /// `dlogits`: the logits were already replaced by their gradient
    /// ([`Trainer::forward_train`]).
    Forward {
        batch: usize,
        counted: usize,
        dlogits: bool,
    },
    /// The logits have been overwritten by their gradient.
    Backward,
}

/// A model plus everything training it needs. See the module docs.
pub struct Trainer<B: Backend> {
    model: Model<B>,
    optimizer: OptimizerConfig,
    grads: B::Buffer,
    /// One micro-batch's gradient while accumulating (see the module docs); allocated by
    /// the first backward pass that accumulates.
    micro_grads: Option<B::Buffer>,
    m: B::Buffer,
    v: B::Buffer,
    slots: TrainSlots,
    /// [`Trainer::evaluate`]'s layout over the same arena (it needs less).
    eval_slots: EvalSlots,
    acts: B::Buffer,
    tokens: B::IdBuffer,
    targets: B::IdBuffer,
    host_losses: Vec<f32>,
    phase: Phase,
    /// Backward passes accumulated in the gradient buffer since the last step.
    micro_batches: usize,
    /// Optimizer steps taken.
    steps: u64,
}

impl<B: Backend> Trainer<B> {
    /// Allocates the training state for batches of up to `batch` sequences of exactly
    /// `seq` tokens (`seq <= context_length`).
    pub fn new(
        model: Model<B>,
        optimizer: OptimizerConfig,
        batch: usize,
        seq: usize,
    ) -> Result<Self> {
        optimizer.validate()?;
        gpt::check_shape(model.config(), "Trainer::new", batch, seq)?;
        let be = model.backend();
        let slots = TrainSlots::new(be, model.config(), batch, seq);
        let eval_slots = EvalSlots::new(be, model.config(), batch, seq);
        let len = model.layout().len;
        let (grads, m, v) = (be.alloc(len)?, be.alloc(len)?, be.alloc(len)?);
        let acts = be.alloc(slots.len)?;
        let (tokens, targets) = (be.alloc_ids(batch * seq)?, be.alloc_ids(batch * seq)?);
        Ok(Trainer {
            model,
            optimizer,
            grads,
            micro_grads: None,
            m,
            v,
            slots,
            eval_slots,
            acts,
            tokens,
            targets,
            host_losses: vec![0.0; batch * seq + slots::STEP_STATS],
            phase: Phase::Empty,
            micro_batches: 0,
            steps: 0,
        })
    }

    pub fn model(&self) -> &Model<B> {
        &self.model
    }

    /// The model, to change its parameters (the optimizer state is kept).
    pub fn model_mut(&mut self) -> &mut Model<B> {
        self.phase = Phase::Empty;
        &mut self.model
    }

    pub fn into_model(self) -> Model<B> {
        self.model
    }

    pub fn optimizer(&self) -> &OptimizerConfig {
        &self.optimizer
    }

    /// Optimizer steps taken so far.
    pub fn steps(&self) -> u64 {
        self.steps
    }

    /// The largest batch and the sequence length the arena was sized for.
    pub fn shape(&self) -> (usize, usize) {
        (self.slots.batch, self.slots.seq)
    }

    /// The memory this trainer holds on the device (both gradient buffers once it
    /// accumulates).
    pub fn memory(&self) -> MemoryPlan {
        let mut plan = MemoryPlan::new(
            self.model.backend(),
            self.model.config(),
            self.slots.batch,
            self.slots.seq,
        );
        if self.micro_grads.is_some() {
            plan.gradients *= 2;
        }
        plan
    }

    /// Allocates the second gradient buffer that accumulating several micro-batches per
    /// step needs (see the module docs) now rather than in the first such step, so that
    /// [`Trainer::memory`] shows it and an out-of-memory error comes before training.
    pub fn reserve_accumulation(&mut self) -> Result<()> {
        if self.micro_grads.is_none() {
            let len = self.model.layout().len;
            self.micro_grads = Some(self.model.backend().alloc(len)?);
        }
        Ok(())
    }

    /// The accumulated gradient buffer (in the layout of the model's parameters), for a
    /// data-parallel reduction between the last backward pass and [`Trainer::step`];
    /// writes go through the backend (`upload`, `scale`). Read it only there: before the
    /// first backward pass after a step or [`Trainer::zero_grad`] it still holds the old
    /// gradients (the backward pass overwrites them).
    pub fn gradients(&self) -> &B::Buffer {
        &self.grads
    }

    /// Backward passes accumulated since the last step.
    pub fn micro_batches(&self) -> usize {
        self.micro_batches
    }

    /// The mean loss of a batch as [`Model::loss`] computes it, bit for bit the value
    /// [`Trainer::forward`] returns, in this trainer's activation arena (no memory
    /// beyond the trainer's; the activations of the last forward pass are gone
    /// afterwards). A NaN or infinite loss is returned as it is. For validation during
    /// training.
    pub fn evaluate(&mut self, tokens: &[u32], targets: &[u32]) -> Result<f32> {
        self.phase = Phase::Empty;
        if self.eval_slots.len > self.slots.len {
            return Err(ModelError::State(format!(
                "evaluate: the evaluation arena ({} floats) does not fit the trainer's ({})",
                self.eval_slots.len, self.slots.len
            )));
        }
        let pass = EvalPass {
            slots: &self.eval_slots,
            acts: &self.acts,
            tokens: &self.tokens,
            targets: &self.targets,
            host_losses: &mut self.host_losses,
        };
        self.model.eval_pass(pass, "trainer", tokens, targets)
    }

    /// A host copy of parameter `name`'s accumulated gradient (transformers shape); zeros
    /// before the first backward pass after a step or [`Trainer::zero_grad`].
    pub fn read_grad(&self, name: &str) -> Result<Vec<f32>> {
        let p = self
            .model
            .layout()
            .get(name)
            .ok_or_else(|| ModelError::UnknownParam(name.to_string()))?;
        let mut host = vec![0.0; p.numel()];
        if self.micro_batches == 0 {
            return Ok(host);
        }
        self.model
            .backend()
            .download(p.slot.on(&self.grads), &mut host)?;
        Ok(host)
    }
}

impl<B: Backend> std::fmt::Debug for Trainer<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Trainer")
            .field("model", &self.model)
            .field("optimizer", &self.optimizer)
            .field("batch", &self.slots.batch)
            .field("seq", &self.slots.seq)
            .field("steps", &self.steps)
            .finish()
    }
}
