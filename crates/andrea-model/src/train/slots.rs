//! The activation arena of a training step: one buffer, sized once from (batch, seq),
//! holding everything the forward pass keeps for the backward pass plus the backward
//! pass's scratch.

use andrea_core::{AttentionShape, Backend, Mat, ModelConfig, Tensor, View};

use crate::arena::{Act, Arena, NormSlots};
use crate::block::{BlockActs, BlockGrads, HeadsView, LayerNormOut, Qkv};
use crate::error::Result;
use crate::gpt::Activations;

/// The floats [`andrea_core::OptimOps::clip_scale`] writes.
pub(crate) const STEP_STATS: usize = 3;

/// One block's activations.
#[derive(Debug, Clone, Copy)]
pub(crate) struct BlockSlots {
    ln_1: NormSlots,
    qkv: Act,
    atty: Act,
    /// The attention's saved state for the backward pass (a flat region).
    attn_workspace: Act,
    residual_2: Act,
    ln_2: NormSlots,
    fc_pre: Act,
    fc: Act,
    pub residual_3: Act,
}

/// Where every activation of a training step lives.
#[derive(Debug, Clone)]
pub(crate) struct TrainSlots {
    pub batch: usize,
    pub seq: usize,
    n_head: usize,
    d_model: usize,
    mlp_dim: usize,
    pub encoded: Act,
    pub blocks: Vec<BlockSlots>,
    proj: Act,
    pub ln_f: NormSlots,
    /// `[N, Vp]`: logits, then (in place) their gradient.
    pub logits: Act,
    pub losses: Act,
    pub d_res: Act,
    pub d_ln: Act,
    d_hidden: Act,
    attn_scratch: Act,
    pub len: usize,
}

impl TrainSlots {
    pub fn new<B: Backend>(be: &B, cfg: &ModelConfig, batch: usize, seq: usize) -> Self {
        let (n, c, m) = (batch * seq, cfg.d_model, cfg.mlp_dim());
        let shape = AttentionShape {
            batch,
            heads: cfg.n_head,
            head_dim: cfg.head_dim(),
            q_len: seq,
            k_len: seq,
        };
        let (workspace_len, scratch_len) = (
            be.attention_workspace_len(shape),
            be.attention_backward_scratch_len(shape),
        );
        let mut a = Arena::default();
        let encoded = a.take(n, c);
        let blocks = (0..cfg.n_layer)
            .map(|_| BlockSlots {
                ln_1: NormSlots::take(&mut a, n, c),
                qkv: a.take(n, 3 * c),
                atty: a.take(n, c),
                attn_workspace: a.take(workspace_len, 1),
                residual_2: a.take(n, c),
                ln_2: NormSlots::take(&mut a, n, c),
                fc_pre: a.take(n, m),
                fc: a.take(n, m),
                residual_3: a.take(n, c),
            })
            .collect();
        TrainSlots {
            batch,
            seq,
            n_head: cfg.n_head,
            d_model: c,
            mlp_dim: m,
            encoded,
            blocks,
            proj: a.take(n, c),
            ln_f: NormSlots::take(&mut a, n, c),
            logits: a.take(n, cfg.padded_vocab_size()),
            // The per-token losses, then the 3 floats of `clip_scale` (read together).
            losses: a.take(n + STEP_STATS, 1),
            d_res: a.take(n, c),
            d_ln: a.take(n, c),
            d_hidden: a.take(n, m.max(3 * c)),
            attn_scratch: a.take(scratch_len.max(1), 1),
            len: a.len,
        }
    }

    /// The attention shape of `batch` sequences.
    fn attention_shape(&self, batch: usize) -> AttentionShape {
        AttentionShape {
            batch,
            heads: self.n_head,
            head_dim: self.d_model / self.n_head,
            q_len: self.seq,
            k_len: self.seq,
        }
    }

    /// The activations of a batch of `batch` sequences in `buf`.
    pub fn on<'a, B: Backend>(
        &'a self,
        be: &B,
        buf: &'a B::Buffer,
        batch: usize,
    ) -> TrainActs<'a, B> {
        let shape = self.attention_shape(batch);
        TrainActs {
            slots: self,
            buf,
            batch,
            workspace_len: be.attention_workspace_len(shape).max(1),
        }
    }

    /// The backward pass's scratch gradients for `batch` sequences.
    pub fn grads<'a, B: Backend>(
        &self,
        buf: &'a B::Buffer,
        batch: usize,
    ) -> Result<BlockGrads<'a, B>> {
        let n = batch * self.seq;
        let (c, at) = (self.d_model, self.d_hidden.offset());
        Ok(BlockGrads {
            d_res: self.d_res.rows(buf, n),
            d_ln: self.d_ln.rows(buf, n),
            d_atty: HeadsView::new(self.d_ln.btc(buf, batch, self.seq), self.n_head)?,
            d_fc: View::new(buf, at, [n, self.mlp_dim]),
            d_qkv: Qkv::new(View::new(buf, at, [batch, self.seq, 3 * c]), self.n_head)?,
        })
    }

    /// The attention backward's scratch for `batch` sequences.
    pub fn attn_scratch<'a, B: Backend>(
        &self,
        be: &B,
        buf: &'a B::Buffer,
        batch: usize,
    ) -> Tensor<'a, B> {
        let len = be.attention_backward_scratch_len(self.attention_shape(batch));
        self.attn_scratch.flat(buf, len.max(1))
    }
}

/// [`TrainSlots`] over its buffer for a batch of `batch` sequences: every block keeps its
/// activations for the backward pass.
pub(crate) struct TrainActs<'a, B: Backend> {
    slots: &'a TrainSlots,
    buf: &'a B::Buffer,
    batch: usize,
    workspace_len: usize,
}

impl<'a, B: Backend> TrainActs<'a, B> {
    fn n(&self) -> usize {
        self.batch * self.slots.seq
    }

    /// `[N, Vp]`
    pub fn logits_rows(&self) -> Tensor<'a, B> {
        self.slots.logits.rows(self.buf, self.n())
    }

    /// `[N]`
    pub fn losses(&self) -> Tensor<'a, B> {
        self.slots.losses.flat(self.buf, self.n())
    }

    /// `[3]`: what [`andrea_core::OptimOps::clip_scale`] writes, after the losses of a
    /// full batch, so one download reads the losses and the step's statistics.
    pub fn step_stats(&self) -> Tensor<'a, B> {
        let full = self.slots.batch * self.slots.seq;
        View::new(self.buf, self.slots.losses.offset() + full, [STEP_STATS])
    }

    /// `[full batch + 3]`: the losses slot and the step's statistics after it.
    pub fn losses_and_stats(&self) -> Tensor<'a, B> {
        let full = self.slots.batch * self.slots.seq;
        View::new(self.buf, self.slots.losses.offset(), [full + STEP_STATS])
    }
}

impl<'a, B: Backend> Activations<'a, B> for TrainActs<'a, B> {
    fn encoded(&self) -> Tensor<'a, B> {
        self.slots.encoded.btc(self.buf, self.batch, self.slots.seq)
    }

    fn block(&self, l: usize) -> Result<BlockActs<'a, B>> {
        let (s, buf) = (self.slots, self.buf);
        let (batch, t, n, h) = (self.batch, s.seq, self.n(), s.n_head);
        let k = &s.blocks[l];
        let x = if l == 0 {
            s.encoded
        } else {
            s.blocks[l - 1].residual_3
        };
        Ok(BlockActs {
            x: x.rows(buf, n),
            ln_1: k.ln_1.on::<B>(buf, n),
            qkv: Qkv::new(k.qkv.btc(buf, batch, t), h)?,
            atty: HeadsView::new(k.atty.btc(buf, batch, t), h)?,
            attn_workspace: k.attn_workspace.flat(buf, self.workspace_len),
            proj: s.proj.rows(buf, n),
            residual_2: k.residual_2.rows(buf, n),
            ln_2: k.ln_2.on::<B>(buf, n),
            fc_pre: k.fc_pre.rows(buf, n),
            fc: k.fc.rows(buf, n),
            residual_3: k.residual_3.rows(buf, n),
        })
    }

    fn ln_f(&self) -> LayerNormOut<'a, B> {
        self.slots.ln_f.on::<B>(self.buf, self.n())
    }

    fn logits(&self) -> Option<(Mat<'a, B>, Mat<'a, B>)> {
        Some((self.ln_f().out.mat(), self.logits_rows().mat()))
    }
}
