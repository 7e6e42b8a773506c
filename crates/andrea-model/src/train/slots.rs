//! The activation arena of a training step: one buffer, sized once from (batch, seq),
//! holding everything the forward pass keeps for the backward pass plus the backward
//! pass's scratch; and [`MemoryPlan`], the memory a step needs.

use andrea_core::{AttentionShape, Backend, ModelConfig, Tensor, View};

use crate::arena::{Act, Arena};
use crate::block::{BlockActs, BlockGrads};

/// One block's activations.
#[derive(Debug, Clone, Copy)]
pub(crate) struct BlockSlots {
    ln_1: Act,
    ln_1_mean: Act,
    ln_1_rstd: Act,
    qkv: Act,
    atty: Act,
    /// The attention's saved state for the backward pass (a flat region).
    pub attn_workspace: Act,
    residual_2: Act,
    ln_2: Act,
    ln_2_mean: Act,
    ln_2_rstd: Act,
    fc_pre: Act,
    fc: Act,
    pub residual_3: Act,
}

/// Where every activation of a training step lives.
#[derive(Debug, Clone)]
pub(crate) struct TrainSlots {
    pub batch: usize,
    pub seq: usize,
    pub encoded: Act,
    pub blocks: Vec<BlockSlots>,
    proj: Act,
    pub ln_f: Act,
    pub ln_f_mean: Act,
    pub ln_f_rstd: Act,
    /// `[N, Vp]`: logits, then (in place) their gradient.
    pub logits: Act,
    pub losses: Act,
    pub d_res: Act,
    pub d_ln: Act,
    d_hidden: Act,
    pub attn_scratch: Act,
    pub len: usize,
}

impl TrainSlots {
    pub fn new<B: Backend>(be: &B, cfg: &ModelConfig, batch: usize, seq: usize) -> Self {
        let (n, c, m) = (batch * seq, cfg.d_model, cfg.mlp_dim());
        let shape = AttentionShape {
            batch,
            heads: cfg.n_head,
            q_len: seq,
            k_len: seq,
        };
        let mut a = Arena::default();
        let encoded = a.take(n, c);
        let blocks = (0..cfg.n_layer)
            .map(|_| BlockSlots {
                ln_1: a.take(n, c),
                ln_1_mean: a.take(n, 1),
                ln_1_rstd: a.take(n, 1),
                qkv: a.take(n, 3 * c),
                atty: a.take(n, c),
                attn_workspace: a.take(be.attention_workspace_len(shape), 1),
                residual_2: a.take(n, c),
                ln_2: a.take(n, c),
                ln_2_mean: a.take(n, 1),
                ln_2_rstd: a.take(n, 1),
                fc_pre: a.take(n, m),
                fc: a.take(n, m),
                residual_3: a.take(n, c),
            })
            .collect();
        TrainSlots {
            batch,
            seq,
            encoded,
            blocks,
            proj: a.take(n, c),
            ln_f: a.take(n, c),
            ln_f_mean: a.take(n, 1),
            ln_f_rstd: a.take(n, 1),
            logits: a.take(n, cfg.padded_vocab_size()),
            losses: a.take(n, 1),
            d_res: a.take(n, c),
            d_ln: a.take(n, c),
            d_hidden: a.take(n, m.max(3 * c)),
            attn_scratch: a.take(be.attention_backward_scratch_len(shape).max(1), 1),
            len: a.len,
        }
    }

    /// Block `l`'s activations for a batch of `b` sequences of `seq` tokens.
    pub fn block<'a, B: Backend>(
        &self,
        buf: &'a B::Buffer,
        l: usize,
        b: usize,
    ) -> BlockActs<'a, B> {
        let (s, n, t) = (&self.blocks[l], b * self.seq, self.seq);
        let x = if l == 0 {
            self.encoded
        } else {
            self.blocks[l - 1].residual_3
        };
        BlockActs {
            x: x.rows(buf, n),
            ln_1: s.ln_1.rows(buf, n),
            ln_1_mean: s.ln_1_mean.flat(buf, n),
            ln_1_rstd: s.ln_1_rstd.flat(buf, n),
            qkv: s.qkv.btc(buf, b, t),
            atty: s.atty.btc(buf, b, t),
            proj: self.proj.rows(buf, n),
            residual_2: s.residual_2.rows(buf, n),
            ln_2: s.ln_2.rows(buf, n),
            ln_2_mean: s.ln_2_mean.flat(buf, n),
            ln_2_rstd: s.ln_2_rstd.flat(buf, n),
            fc_pre: s.fc_pre.rows(buf, n),
            fc: s.fc.rows(buf, n),
            residual_3: s.residual_3.rows(buf, n),
        }
    }

    /// The backward pass's scratch gradients for `b` sequences.
    pub fn grads<'a, B: Backend>(
        &self,
        buf: &'a B::Buffer,
        cfg: &ModelConfig,
        b: usize,
    ) -> BlockGrads<'a, B> {
        let n = b * self.seq;
        let d_fc: Tensor<'a, B> = View::new(buf, self.d_hidden.offset(), [n, cfg.mlp_dim()]);
        BlockGrads {
            d_res: self.d_res.rows(buf, n),
            d_ln: self.d_ln.rows(buf, n),
            d_fc,
            d_qkv: View::new(buf, self.d_hidden.offset(), [b, self.seq, 3 * cfg.d_model]),
        }
    }
}

/// The memory a training step needs, in bytes, by role.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemoryPlan {
    pub parameters: usize,
    pub gradients: usize,
    /// AdamW's two moment buffers.
    pub optimizer: usize,
    /// The activation arena (everything the backward pass reads, and its scratch).
    pub activations: usize,
    /// Token and target ids.
    pub ids: usize,
}

impl MemoryPlan {
    /// The plan for `config` at `batch × seq` on `backend` (its attention workspace
    /// sizes are part of the arena).
    pub fn new<B: Backend>(backend: &B, config: &ModelConfig, batch: usize, seq: usize) -> Self {
        let params = crate::layout::ParamLayout::new(config).len * 4;
        MemoryPlan {
            parameters: params,
            gradients: params,
            optimizer: 2 * params,
            activations: TrainSlots::new(backend, config, batch, seq).len * 4,
            ids: 2 * batch * seq * 4,
        }
    }

    pub fn total(&self) -> usize {
        self.parameters + self.gradients + self.optimizer + self.activations + self.ids
    }
}

impl std::fmt::Display for MemoryPlan {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mib = |b: usize| b as f64 / (1024.0 * 1024.0);
        write!(
            f,
            "{:.1} MiB (parameters {:.1}, gradients {:.1}, AdamW moments {:.1}, activations {:.1})",
            mib(self.total()),
            mib(self.parameters),
            mib(self.gradients),
            mib(self.optimizer),
            mib(self.activations + self.ids),
        )
    }
}
