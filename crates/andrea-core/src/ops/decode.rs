//! Generation's decoder stack as one op: every block of the model for new positions over
//! a KV cache, from the first block's input to the LayerNorm after the last.
//!
//! Op by op, a block for one new token is four calls (the attention half, a residual add
//! with LayerNorm, the MLP half, another), each a few microseconds for a small model, and
//! each ends where the next begins: on a CPU a parallel job per call, a thread's return
//! to the caller and the caller's small serial steps between. [`DecodeOps::decode_blocks`]
//! hands the whole chain to the backend at once, so that one can run it as one job
//! (the CPU backend does, for one token of a small model); the default runs the four ops
//! block by block.

use std::fmt;

use super::attention::check::DecodeAttentionDims;
use super::ElementwiseOps;
use super::{AttentionOps, LayerNormOps, LinalgOps, LinearParams, MemoryOps, SoftmaxOps};
use crate::error::Result;
use crate::tensor::{DeviceMemory, Heads, View};

/// A LayerNorm's parameters: `γ` and `β`, `[C]` each.
pub struct NormParams<'a, M> {
    pub gamma: View<'a, M>,
    pub beta: View<'a, M>,
}

/// What a LayerNorm writes: the normalised rows `[N, C]` and, for a backward pass, each
/// row's mean and `1/sqrt(var + eps)`, `[N]` each.
pub struct NormOutputs<'a, M> {
    pub out: View<'a, M>,
    pub mean: View<'a, M>,
    pub rstd: View<'a, M>,
}

/// One pre-norm block for `T` new positions of each of `B` sequences, and the LayerNorm
/// after it, as [`DecodeOps::decode_blocks`] runs it:
///
/// ```text
/// a          = decode_attention(ln_1, c_attn, keys, values, attn_proj)   appends to the cache
/// residual_2 = x + a;           ln_2_out  = LayerNorm_ln_2(residual_2)
/// m          = mlp_forward(ln_2_out.out, c_fc, mlp_proj)
/// residual_3 = residual_2 + m;  next_out  = LayerNorm_next(residual_3)
/// ```
///
/// `x`, `ln_1`, `residual_2`, `residual_3` and the LayerNorm outputs are `[B·T, C]`
/// (sequence-major), the cache views `[B, pos + T, H, D]`. `next` is the next block's
/// `ln_1` (its `next_out.out` is that block's `ln_1`) or, after the last block, the final
/// LayerNorm.
pub struct DecodeBlock<'a, M> {
    /// The block's input, the residual stream.
    pub x: View<'a, M>,
    /// `LayerNorm_ln_1(x)`, which the previous block (or a LayerNorm before the first)
    /// wrote.
    pub ln_1: View<'a, M>,
    pub keys: Heads<'a, M>,
    pub values: Heads<'a, M>,
    pub c_attn: LinearParams<'a, M>,
    pub attn_proj: LinearParams<'a, M>,
    pub ln_2: NormParams<'a, M>,
    pub c_fc: LinearParams<'a, M>,
    pub mlp_proj: LinearParams<'a, M>,
    pub next: NormParams<'a, M>,
    /// Scratch: what [`AttentionOps::decode_attention`] and [`LinalgOps::mlp_forward`]
    /// take as such (`proj`, `[B·T, C]`, receives both halves' outputs). Their contents
    /// afterwards are unspecified.
    pub qkv: View<'a, M>,
    pub atty: View<'a, M>,
    pub workspace: View<'a, M>,
    pub proj: View<'a, M>,
    pub fc_pre: View<'a, M>,
    pub fc: View<'a, M>,
    /// Outputs. `residual_3` may be exactly `residual_2` (added in place), and
    /// `next_out.out` exactly `ln_1` (read before it is written).
    pub residual_2: View<'a, M>,
    pub ln_2_out: NormOutputs<'a, M>,
    pub residual_3: View<'a, M>,
    pub next_out: NormOutputs<'a, M>,
}

/// [`DecodeBlock`] in backend `B`'s memory.
pub type DecodeBlockOf<'a, B> = DecodeBlock<'a, <B as MemoryOps>::Buffer>;

macro_rules! copy_debug {
    ($ty:ident { $($field:ident),* }) => {
        impl<M> Clone for $ty<'_, M> {
            fn clone(&self) -> Self {
                *self
            }
        }
        impl<M> Copy for $ty<'_, M> {}
        impl<M> fmt::Debug for $ty<'_, M> {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.debug_struct(stringify!($ty))
                    $(.field(stringify!($field), &self.$field))*
                    .finish()
            }
        }
    };
}
copy_debug!(NormParams { gamma, beta });
copy_debug!(NormOutputs { out, mean, rstd });
copy_debug!(DecodeBlock {
    x,
    ln_1,
    keys,
    values,
    c_attn,
    attn_proj,
    ln_2,
    c_fc,
    mlp_proj,
    next,
    qkv,
    atty,
    workspace,
    proj,
    fc_pre,
    fc,
    residual_2,
    ln_2_out,
    residual_3,
    next_out
});

/// Generation's decoder stack.
pub trait DecodeOps: AttentionOps + LinalgOps + LayerNormOps + SoftmaxOps + ElementwiseOps {
    /// Fused: `blocks` one after the other (see [`DecodeBlock`]), each block's output
    /// the next one's input as the caller's views say. Every block is checked
    /// ([`check::decode_block`]) before any is run: a refused call writes nothing.
    /// Default: [`fused::decode_blocks`].
    fn decode_blocks(&self, blocks: &[DecodeBlockOf<'_, Self>], eps: f32) -> Result<()> {
        fused::decode_blocks(self, blocks, eps)
    }
}

/// Argument checks of the decoder-stack op.
pub mod check {
    use super::*;
    use crate::check::{disjoint, Region};
    use crate::ops::attention::check::decode_attention;
    use crate::ops::attention::AttentionShape;
    use crate::ops::layernorm::check::residual_layernorm;
    use crate::ops::linalg::check::mlp_forward;

    /// One block of [`super::DecodeOps::decode_blocks`]: its four steps as
    /// [`decode_attention`], [`residual_layernorm`], [`mlp_forward`] and
    /// [`residual_layernorm`] check them (errors named after those ops), and the scratch
    /// views disjoint from every other argument, so that a backend may keep the steps'
    /// intermediate results wherever it likes. Returns the attention's sizes.
    pub fn decode_block<M: DeviceMemory>(
        b: &DecodeBlock<'_, M>,
        eps: f32,
        workspace_len: impl FnOnce(AttentionShape) -> usize,
    ) -> Result<DecodeAttentionDims> {
        let (d, _) = decode_attention(
            &b.ln_1,
            &b.c_attn,
            &b.qkv,
            &b.keys,
            &b.values,
            &b.atty,
            &b.workspace,
            &b.attn_proj,
            &b.proj,
            workspace_len,
        )?;
        let (n2, n3) = (&b.ln_2_out, &b.next_out);
        residual_layernorm(
            &b.x,
            &b.proj,
            &b.residual_2,
            &b.ln_2.gamma,
            &b.ln_2.beta,
            &n2.out,
            &n2.mean,
            &n2.rstd,
            eps,
        )?;
        mlp_forward(&n2.out, &b.c_fc, &b.fc_pre, &b.fc, &b.mlp_proj, &b.proj)?;
        residual_layernorm(
            &b.residual_2,
            &b.proj,
            &b.residual_3,
            &b.next.gamma,
            &b.next.beta,
            &n3.out,
            &n3.mean,
            &n3.rstd,
            eps,
        )?;
        disjoint(
            "decode_blocks",
            &[
                Region::of("qkv", &b.qkv),
                Region::of("atty", &b.atty),
                Region::of("workspace", &b.workspace),
                Region::of("proj", &b.proj),
                Region::of("fc_pre", &b.fc_pre),
                Region::of("fc", &b.fc),
            ],
            &[
                Region::of("x", &b.x),
                Region::of("ln_1", &b.ln_1),
                Region::of_heads("keys", &b.keys),
                Region::of_heads("values", &b.values),
                Region::of("residual_2", &b.residual_2),
                Region::of("ln_2_out.out", &n2.out),
                Region::of("ln_2_out.mean", &n2.mean),
                Region::of("ln_2_out.rstd", &n2.rstd),
                Region::of("residual_3", &b.residual_3),
                Region::of("next_out.out", &n3.out),
                Region::of("next_out.mean", &n3.mean),
                Region::of("next_out.rstd", &n3.rstd),
            ],
            false,
        )?;
        Ok(d)
    }
}

/// The default implementation of the decoder-stack op, from the finer fused ops.
pub mod fused {
    use super::{DecodeBlockOf, DecodeOps};
    use crate::error::Result;

    /// Default [`DecodeOps::decode_blocks`]: every block checked, then each run as its
    /// four ops ([`decode_block_steps`]). The reference of the fused kernels.
    pub fn decode_blocks<B: DecodeOps>(
        be: &B,
        blocks: &[DecodeBlockOf<'_, B>],
        eps: f32,
    ) -> Result<()> {
        for b in blocks {
            super::check::decode_block(b, eps, |s| be.attention_workspace_len(s))?;
        }
        for b in blocks {
            decode_block_steps(be, b, eps)?;
        }
        Ok(())
    }

    /// One block as its four ops, one after the other (each checks its own arguments).
    pub fn decode_block_steps<B: DecodeOps>(
        be: &B,
        b: &DecodeBlockOf<'_, B>,
        eps: f32,
    ) -> Result<()> {
        be.decode_attention(
            b.ln_1,
            b.c_attn,
            b.qkv,
            b.keys,
            b.values,
            b.atty,
            b.workspace,
            b.attn_proj,
            b.proj,
        )?;
        let (n2, n3) = (&b.ln_2_out, &b.next_out);
        let (g2, b2) = (b.ln_2.gamma, b.ln_2.beta);
        be.residual_layernorm(
            b.x,
            b.proj,
            b.residual_2,
            g2,
            b2,
            n2.out,
            n2.mean,
            n2.rstd,
            eps,
        )?;
        be.mlp_forward(n2.out, b.c_fc, b.fc_pre, b.fc, b.mlp_proj, b.proj)?;
        let (g3, b3) = (b.next.gamma, b.next.beta);
        be.residual_layernorm(
            b.residual_2,
            b.proj,
            b.residual_3,
            g3,
            b3,
            n3.out,
            n3.mean,
            n3.rstd,
            eps,
        )
    }
}
