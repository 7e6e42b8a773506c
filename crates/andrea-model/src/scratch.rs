//! The activations of a forward pass that keeps nothing for a backward pass
//! (evaluation, generation): one set of block activations that every block reuses, and
//! two residual streams that the blocks read and write in turn.

use andrea_core::{Backend, Mat, ModelConfig, Tensor};

use crate::arena::{Act, Arena, NormSlots};
use crate::block::{BlockActs, HeadsView, LayerNormOut, Qkv};
use crate::error::Result;
use crate::gpt::Activations;
use crate::infer::KvAppend;

/// Where the scratch activations of up to `rows` tokens live.
#[derive(Debug, Clone)]
pub(crate) struct ScratchSlots {
    /// Residual streams `[rows, C]`: block `l` reads `x[l % 2]`, writes the other.
    x: [Act; 2],
    /// One LayerNorm output serves every block: a block reads its ln_1 (the QKV
    /// projection) before it writes the next block's there, and the last block writes
    /// ln_f there.
    ln_1: NormSlots,
    qkv: Act,
    atty: Act,
    proj: Act,
    ln_2: NormSlots,
    fc_pre: Act,
    fc: Act,
    attn_workspace: Act,
    /// The floats `attn_workspace` holds.
    pub workspace_len: usize,
    n_head: usize,
}

impl ScratchSlots {
    /// Takes the regions for `rows` tokens from `a`, with `workspace_len` floats of
    /// attention workspace.
    pub fn new(a: &mut Arena, cfg: &ModelConfig, rows: usize, workspace_len: usize) -> Self {
        let (c, m) = (cfg.d_model, cfg.mlp_dim());
        ScratchSlots {
            x: [a.take(rows, c), a.take(rows, c)],
            ln_1: NormSlots::take(a, rows, c),
            qkv: a.take(rows, 3 * c),
            atty: a.take(rows, c),
            proj: a.take(rows, c),
            ln_2: NormSlots::take(a, rows, c),
            fc_pre: a.take(rows, m),
            fc: a.take(rows, m),
            attn_workspace: a.take(workspace_len, 1),
            workspace_len,
            n_head: cfg.n_head,
        }
    }

    /// The scratch of `batch` sequences of `t` tokens in `buf`, with `workspace_len`
    /// floats of attention workspace (at most [`ScratchSlots::workspace_len`]).
    pub fn on<'a, B: Backend>(
        &'a self,
        buf: &'a B::Buffer,
        batch: usize,
        t: usize,
        workspace_len: usize,
    ) -> ScratchActs<'a, B> {
        ScratchActs {
            slots: self,
            buf,
            batch,
            t,
            workspace_len,
            logits: None,
            kv: None,
        }
    }
}

/// [`ScratchSlots`] over its buffer for `batch` sequences of `t` tokens.
pub(crate) struct ScratchActs<'a, B: Backend> {
    slots: &'a ScratchSlots,
    buf: &'a B::Buffer,
    batch: usize,
    t: usize,
    workspace_len: usize,
    /// The rows of ln_f that get logits and where they go (none by default).
    pub logits: Option<(Mat<'a, B>, Mat<'a, B>)>,
    /// The attention over a KV cache (generation); by default over the block's own keys.
    pub kv: Option<KvAppend<'a, B>>,
}

impl<'a, B: Backend> ScratchActs<'a, B> {
    fn n(&self) -> usize {
        self.batch * self.t
    }
}

impl<'a, B: Backend> Activations<'a, B> for ScratchActs<'a, B> {
    /// `[b, t, C]`: block 0's input.
    fn encoded(&self) -> Tensor<'a, B> {
        self.slots.x[0].btc(self.buf, self.batch, self.t)
    }

    fn block(&self, l: usize) -> Result<BlockActs<'a, B>> {
        let (s, buf) = (self.slots, self.buf);
        let (batch, t, n, h) = (self.batch, self.t, self.n(), s.n_head);
        let (x, y) = (s.x[l % 2].rows(buf, n), s.x[(l + 1) % 2].rows(buf, n));
        Ok(BlockActs {
            x,
            ln_1: s.ln_1.on::<B>(buf, n),
            qkv: Qkv::new(s.qkv.btc(buf, batch, t), h)?,
            atty: HeadsView::new(s.atty.btc(buf, batch, t), h)?,
            attn_workspace: s.attn_workspace.flat(buf, self.workspace_len),
            proj: s.proj.rows(buf, n),
            residual_2: y,
            ln_2: s.ln_2.on::<B>(buf, n),
            fc_pre: s.fc_pre.rows(buf, n),
            fc: s.fc.rows(buf, n),
            residual_3: y,
        })
    }

    /// Where ln_f writes (the shared LayerNorm output), `[N, C]`.
    fn ln_f(&self) -> LayerNormOut<'a, B> {
        self.slots.ln_1.on::<B>(self.buf, self.n())
    }

    fn logits(&self) -> Option<(Mat<'a, B>, Mat<'a, B>)> {
        self.logits
    }

    fn kv(&self) -> Option<&KvAppend<'a, B>> {
        self.kv.as_ref()
    }
}
