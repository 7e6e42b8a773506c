//! Evaluation: the loss of a batch with only an activation arena, no gradients and no
//! optimizer moments. [`Evaluator`] holds that arena, sized once from (batch, seq);
//! [`Model::loss`] runs the forward pass of [`crate::gpt`] into it, every block reusing
//! one scratch set (nothing is kept for a backward pass), and returns the mean
//! cross-entropy. The loss is bit for bit the one [`crate::Trainer::forward`] computes
//! on the same batch: the same ops on the same shapes.

use andrea_core::{AttentionShape, Backend, Mat, ModelConfig, Tensor, View};

use crate::arena::{Act, Arena};
use crate::block::{BlockActs, LayerNormOut};
use crate::error::{ModelError, Result};
use crate::gpt::{self, Activations};
use crate::memory::MemoryPlan;
use crate::model::Model;
use crate::scratch::{ScratchActs, ScratchSlots};

/// Where the activations of an evaluation pass live.
#[derive(Debug, Clone)]
pub(crate) struct EvalSlots {
    pub batch: usize,
    pub seq: usize,
    blocks: ScratchSlots,
    /// `[N, Vp]`
    logits: Act,
    /// `[N]`
    losses: Act,
    pub len: usize,
    /// Floats of product scratch the backend takes (`crate::memory::forward_scratch`).
    pub scratch: usize,
}

impl EvalSlots {
    pub fn new<B: Backend>(be: &B, cfg: &ModelConfig, batch: usize, seq: usize) -> Self {
        let n = batch * seq;
        let workspace_len = be
            .attention_workspace_len(attention_shape(cfg, batch, seq))
            .max(1);
        let mut a = Arena::default();
        let blocks = ScratchSlots::new(&mut a, cfg, n, workspace_len);
        let logits = a.take(n, cfg.padded_vocab_size());
        let losses = a.take(n, 1);
        EvalSlots {
            batch,
            seq,
            blocks,
            logits,
            losses,
            len: a.len,
            // A batch of 1..=batch sequences.
            scratch: crate::memory::forward_scratch(
                be,
                cfg,
                (1..=batch).map(|b| b * seq),
                (1..=batch).map(|b| b * seq),
            ),
        }
    }
}

fn attention_shape(cfg: &ModelConfig, batch: usize, seq: usize) -> AttentionShape {
    AttentionShape {
        batch,
        heads: cfg.n_head,
        head_dim: cfg.head_dim(),
        q_len: seq,
        k_len: seq,
    }
}

/// [`EvalSlots`] over a buffer for `batch` sequences: the shared scratch, and logits for
/// every position.
struct EvalActs<'a, B: Backend> {
    scratch: ScratchActs<'a, B>,
    logits: Tensor<'a, B>,
}

impl<'a, B: Backend> Activations<'a, B> for EvalActs<'a, B> {
    fn encoded(&self) -> Tensor<'a, B> {
        self.scratch.encoded()
    }

    fn block(&self, l: usize) -> Result<BlockActs<'a, B>> {
        self.scratch.block(l)
    }

    fn ln_f(&self) -> LayerNormOut<'a, B> {
        self.scratch.ln_f()
    }

    fn logits(&self) -> Option<(Mat<'a, B>, Mat<'a, B>)> {
        Some((self.ln_f().out.mat(), self.logits.mat()))
    }
}

/// What one evaluation pass reads and writes: the arena's slots and buffer, the id
/// buffers and the host copy of the per-token losses.
pub(crate) struct EvalPass<'a, B: Backend> {
    pub slots: &'a EvalSlots,
    pub acts: &'a B::Buffer,
    pub tokens: &'a B::IdBuffer,
    pub targets: &'a B::IdBuffer,
    pub host_losses: &'a mut [f32],
}

impl<B: Backend> Model<B> {
    /// An evaluator for batches of up to `batch` sequences of exactly `seq` tokens
    /// (`seq <= context_length`).
    pub fn evaluator(&self, batch: usize, seq: usize) -> Result<Evaluator<B>> {
        gpt::check_shape(self.config(), "Model::evaluator", batch, seq)?;
        let be = self.backend();
        let slots = EvalSlots::new(be, self.config(), batch, seq);
        Ok(Evaluator {
            config: self.config().clone(),
            acts: be.alloc(slots.len)?,
            tokens: be.alloc_ids(batch * seq)?,
            targets: be.alloc_ids(batch * seq)?,
            host_losses: vec![0.0; batch * seq],
            slots,
        })
    }

    /// The mean cross-entropy, in nats, of next-token `targets` after `tokens` (both
    /// `[b, seq]` row-major, `b <= batch` of `evaluator`; [`crate::IGNORE_INDEX`]
    /// skips a position), the value [`crate::Trainer::forward`] returns for the same
    /// batch. A NaN or infinite loss is returned as it is.
    pub fn loss(
        &self,
        evaluator: &mut Evaluator<B>,
        tokens: &[u32],
        targets: &[u32],
    ) -> Result<f32> {
        if evaluator.config != *self.config() {
            return Err(ModelError::State(
                "loss: the evaluator was made for a model of another config".into(),
            ));
        }
        let ev = evaluator;
        let pass = EvalPass {
            slots: &ev.slots,
            acts: &ev.acts,
            tokens: &ev.tokens,
            targets: &ev.targets,
            host_losses: &mut ev.host_losses,
        };
        self.eval_pass(pass, "evaluator", tokens, targets)
    }

    /// The evaluation pass over `pass` (also run by [`crate::Trainer::evaluate`] over
    /// the trainer's own arena); `owner` names the arena in messages.
    pub(crate) fn eval_pass(
        &self,
        pass: EvalPass<'_, B>,
        owner: &str,
        tokens: &[u32],
        targets: &[u32],
    ) -> Result<f32> {
        let (be, cfg, s) = (self.backend(), self.config(), pass.slots);
        let (batch, counted) = gpt::check_batch(cfg, owner, (s.batch, s.seq), tokens, targets)?;
        let n = batch * s.seq;
        let (ids, target_ids) = (
            View::new(pass.tokens, 0, [n]),
            View::new(pass.targets, 0, [n]),
        );
        be.upload_ids(tokens, ids)?;
        be.upload_ids(targets, target_ids)?;
        let workspace_len = be
            .attention_workspace_len(attention_shape(cfg, batch, s.seq))
            .max(1);
        let acts = EvalActs {
            scratch: s.blocks.on(pass.acts, batch, s.seq, workspace_len),
            logits: s.logits.rows(pass.acts, n),
        };
        gpt::forward(self, ids, 0, &acts)?;
        let losses = s.losses.flat(pass.acts, n);
        let host = &mut pass.host_losses[..n];
        let vocab = cfg.vocab_size;
        gpt::queue_loss(be, vocab, acts.logits, target_ids, losses, counted, false)?;
        Ok(gpt::read_mean_loss(be, losses, counted, host)? as f32)
    }
}

/// An activation arena for [`Model::loss`]: a few `[N, C]` and `[N, M]` regions that
/// every block reuses and the `[N, Vp]` logits, where a [`crate::Trainer`] keeps every
/// block's activations and adds gradients and AdamW moments. Made by
/// [`Model::evaluator`].
pub struct Evaluator<B: Backend> {
    config: ModelConfig,
    slots: EvalSlots,
    acts: B::Buffer,
    tokens: B::IdBuffer,
    targets: B::IdBuffer,
    host_losses: Vec<f32>,
}

impl<B: Backend> Evaluator<B> {
    /// The largest batch and the sequence length the arena was sized for.
    pub fn shape(&self) -> (usize, usize) {
        (self.slots.batch, self.slots.seq)
    }

    /// The memory this evaluator holds on the device, with the model's parameters.
    pub fn memory(&self) -> MemoryPlan {
        MemoryPlan::evaluation_of(&self.config, &self.slots)
    }
}

impl<B: Backend> std::fmt::Debug for Evaluator<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Evaluator")
            .field("batch", &self.slots.batch)
            .field("seq", &self.slots.seq)
            .finish()
    }
}
