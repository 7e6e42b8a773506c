//! One transformer block, forward and backward, as a sequence of backend ops over named
//! parameter groups ([`Norm`], [`Linear`]) and activation groups ([`LayerNormOut`],
//! [`Qkv`], [`HeadsView`]). [`crate::gpt`] runs the blocks in order; training,
//! evaluation and generation differ only in the attention (over the block's own keys,
//! or over a KV cache) and in where the activations live.
//!
//! ```text
//! ln_1 = LayerNorm(x)                      x, ln_1:          [N, C]
//! qkv  = ln_1 · c_attn.weight + bias       c_attn.weight:    [C, 3C]
//! atty = Attention(qkv)                    qkv: [B, T, 3C], atty: [B, T, C]
//! r2   = x + atty · attn.c_proj.weight + b attn.c_proj:      [C, C]
//! ln_2 = LayerNorm(r2)
//! fc   = GELU(ln_2 · mlp.c_fc.weight + b)  fc_pre, fc:       [N, M]
//! r3   = r2 + fc · mlp.c_proj.weight + b   mlp.c_proj:       [M, C]
//! ```
//!
//! Each residual add is fused with the LayerNorm that reads its result: `r2` with
//! `ln_2`, and `r3` with the *next* block's `ln_1` (or `ln_f` after the last block), so
//! [`forward`] starts from an `ln_1` its caller computed and ends with the next one.
//! That is one pass over the residual stream and one backend call fewer per block.
//!
//! The executable specification of all this is the float64 GPT
//! `andrea_testkit::reference::gpt2` (written plainly, one reference op per line); the
//! model's gradients are checked against its finite differences (`tests/gradcheck.rs`).

use andrea_core::{
    Backend, DecodeBlock, DecodeBlockOf, DeviceMemory, Heads, HeadsOf, LinearParams, NormOutputs,
    NormParams, Tensor,
};

use crate::error::{ModelError, Result};
use crate::layout::{LayerParams, Linear, Norm};

/// What a LayerNorm writes: `out: [N, C]`, and `mean`, `rstd: [N]` for its backward pass.
pub(crate) struct LayerNormOut<'a, B: Backend> {
    pub out: Tensor<'a, B>,
    pub mean: Tensor<'a, B>,
    pub rstd: Tensor<'a, B>,
}

/// The fused QKV activation `[B, T, 3C]` (or its gradient), with the query, key and
/// value heads it holds. Made once per view by [`Qkv::new`], which checks the shape.
pub(crate) struct Qkv<'a, B: Backend> {
    pub rows: Tensor<'a, B>,
    pub q: HeadsOf<'a, B>,
    pub k: HeadsOf<'a, B>,
    pub v: HeadsOf<'a, B>,
}

impl<'a, B: Backend> Qkv<'a, B> {
    /// `qkv: [B, T, 3C]` split into `n_head` heads of `C / n_head`.
    pub fn new(qkv: Tensor<'a, B>, n_head: usize) -> Result<Self> {
        let [q, k, v] = Heads::split_qkv(qkv, n_head).ok_or_else(|| {
            ModelError::State(format!(
                "a QKV activation must be [B, T, 3C] with C a multiple of {n_head} heads, got {}",
                qkv.shape
            ))
        })?;
        Ok(Qkv { rows: qkv, q, k, v })
    }
}

/// A `[B, T, C]` activation (the attention's output, or its gradient) both as a tensor
/// and as `n_head` heads.
pub(crate) struct HeadsView<'a, B: Backend> {
    pub rows: Tensor<'a, B>,
    pub heads: HeadsOf<'a, B>,
}

impl<'a, B: Backend> HeadsView<'a, B> {
    pub fn new(t: Tensor<'a, B>, n_head: usize) -> Result<Self> {
        let heads = Heads::from_tensor(t, n_head).ok_or_else(|| {
            ModelError::State(format!(
                "an attention activation must be [B, T, C] with C a multiple of {n_head} heads, got {}",
                t.shape
            ))
        })?;
        Ok(HeadsView { rows: t, heads })
    }
}

/// The activations of one block for `N = B·T` tokens (views into an arena).
pub(crate) struct BlockActs<'a, B: Backend> {
    /// The block's input (the residual stream), `[N, C]`.
    pub x: Tensor<'a, B>,
    pub ln_1: LayerNormOut<'a, B>,
    pub qkv: Qkv<'a, B>,
    pub atty: HeadsView<'a, B>,
    /// What the attention keeps for its backward pass (a flat region).
    pub attn_workspace: Tensor<'a, B>,
    /// Scratch `[N, C]` for the two projections' outputs (not needed by the backward pass).
    pub proj: Tensor<'a, B>,
    pub residual_2: Tensor<'a, B>,
    pub ln_2: LayerNormOut<'a, B>,
    /// `[N, M]`: before and after the GELU.
    pub fc_pre: Tensor<'a, B>,
    pub fc: Tensor<'a, B>,
    /// The block's output, `[N, C]`; may be exactly `residual_2` (evaluation,
    /// generation).
    pub residual_3: Tensor<'a, B>,
}

/// Scratch gradients of the backward pass.
pub(crate) struct BlockGrads<'a, B: Backend> {
    /// ∂L/∂(residual stream), `[N, C]`: on entry the gradient of the block's output, on
    /// exit that of its input (the residual path passes it through; both LayerNorms add
    /// into it).
    pub d_res: Tensor<'a, B>,
    /// `[N, C]`: the gradient of a LayerNorm output.
    pub d_ln: Tensor<'a, B>,
    /// ∂L/∂atty, `[B, T, C]` over the same memory as `d_ln`.
    pub d_atty: HeadsView<'a, B>,
    /// `[N, M]`: ∂L/∂fc.
    pub d_fc: Tensor<'a, B>,
    /// ∂L/∂qkv, `[B, T, 3C]` over the first `N·3C` floats of `d_fc`'s memory.
    pub d_qkv: Qkv<'a, B>,
}

impl<'p, M: DeviceMemory> Norm<'p, M> {
    /// `out = LayerNorm(x)`.
    pub fn forward<B: Backend<Buffer = M>>(
        &self,
        be: &B,
        x: Tensor<'_, B>,
        out: &LayerNormOut<'_, B>,
        eps: f32,
    ) -> Result<()> {
        let (gamma, beta) = (self.gamma, self.beta);
        Ok(be.layernorm(x, gamma, beta, out.out, out.mean, out.rstd, eps)?)
    }

    /// `residual = a + b`, then `out = LayerNorm(residual)`, in one pass.
    pub fn residual_forward<B: Backend<Buffer = M>>(
        &self,
        be: &B,
        a: Tensor<'_, B>,
        b: Tensor<'_, B>,
        residual: Tensor<'_, B>,
        out: &LayerNormOut<'_, B>,
        eps: f32,
    ) -> Result<()> {
        let (gamma, beta) = (self.gamma, self.beta);
        let (y, mean, rstd) = (out.out, out.mean, out.rstd);
        Ok(be.residual_layernorm(a, b, residual, gamma, beta, y, mean, rstd, eps)?)
    }

    /// From `dout = ∂L/∂out`: `dx += ∂L/∂x`, and `grad`'s gamma and beta `+=`.
    pub fn backward<B: Backend<Buffer = M>>(
        &self,
        be: &B,
        x: Tensor<'_, B>,
        saved: &LayerNormOut<'_, B>,
        dout: Tensor<'_, B>,
        dx: Tensor<'_, B>,
        grad: &Norm<'_, M>,
    ) -> Result<()> {
        let (mean, rstd) = (saved.mean, saved.rstd);
        let (gamma, dgamma, dbeta) = (self.gamma, grad.gamma, grad.beta);
        Ok(be.layernorm_backward(x, gamma, mean, rstd, dout, dx, dgamma, dbeta)?)
    }
}

impl<'p, M: DeviceMemory> Linear<'p, M> {
    /// The weight and bias as fused ops take them.
    pub fn params(&self) -> LinearParams<'p, M> {
        LinearParams {
            weight: self.weight.mat(),
            bias: self.bias,
        }
    }

    /// `y = x · weight + bias`.
    pub fn forward<B: Backend<Buffer = M>>(
        &self,
        be: &B,
        x: Tensor<'_, B>,
        y: Tensor<'_, B>,
    ) -> Result<()> {
        Ok(be.matmul(x.mat(), self.weight.mat(), Some(self.bias), y.mat())?)
    }

    /// `pre = x · weight + bias`, `y = GELU(pre)` (`pre` is kept for the backward pass).
    pub fn gelu_forward<B: Backend<Buffer = M>>(
        &self,
        be: &B,
        x: Tensor<'_, B>,
        pre: Tensor<'_, B>,
        y: Tensor<'_, B>,
    ) -> Result<()> {
        Ok(be.linear_gelu(x.mat(), self.weight.mat(), self.bias, pre, y)?)
    }

    /// From `dy = ∂L/∂y`: `dx = dy · weightᵀ`, `grad.weight = xᵀ · dy` (written, see
    /// [`backward`]), `grad.bias += Σ_rows dy`.
    pub fn backward<B: Backend<Buffer = M>>(
        &self,
        be: &B,
        x: Tensor<'_, B>,
        dy: Tensor<'_, B>,
        dx: Tensor<'_, B>,
        grad: &Linear<'_, M>,
    ) -> Result<()> {
        be.matmul(dy.mat(), self.weight.mat().t(), None, dx.mat())?;
        be.matmul(x.mat().t(), dy.mat(), None, grad.weight.mat())?;
        Ok(be.bias_backward(dy, grad.bias)?)
    }

    /// [`Linear::backward`] of a linear whose input is `x = GELU(pre)`, carried through
    /// the GELU in the same product: `dpre = (dy · weightᵀ) ⊙ GELU'(pre)`,
    /// `grad.weight = xᵀ · dy` (written), `grad.bias += Σ_rows dy`.
    pub fn backward_through_gelu<B: Backend<Buffer = M>>(
        &self,
        be: &B,
        x: Tensor<'_, B>,
        pre: Tensor<'_, B>,
        dy: Tensor<'_, B>,
        dpre: Tensor<'_, B>,
        grad: &Linear<'_, M>,
    ) -> Result<()> {
        be.matmul_gelu_backward(dy.mat(), self.weight.mat().t(), pre, dpre)?;
        be.matmul(x.mat().t(), dy.mat(), None, grad.weight.mat())?;
        Ok(be.bias_backward(dy, grad.bias)?)
    }
}

/// The forward pass of one block, from `a.ln_1` (already `LayerNorm(a.x)`) to
/// `a.residual_3` and `next_out = next(a.residual_3)`, the LayerNorm after the block.
/// `attention(qkv, atty, workspace)` writes the attention output.
pub(crate) fn forward<'a, B: Backend>(
    be: &B,
    p: &LayerParams<'_, B::Buffer>,
    a: &BlockActs<'a, B>,
    (next, next_out): (&Norm<'_, B::Buffer>, &LayerNormOut<'_, B>),
    eps: f32,
    attention: impl FnOnce(&Qkv<'a, B>, &HeadsView<'a, B>, Tensor<'a, B>) -> Result<()>,
) -> Result<()> {
    p.c_attn.forward(be, a.ln_1.out, a.qkv.rows)?;
    attention(&a.qkv, &a.atty, a.attn_workspace)?;
    p.attn_proj.forward(be, a.atty.rows, a.proj)?;
    p.ln_2
        .residual_forward(be, a.x, a.proj, a.residual_2, &a.ln_2, eps)?;
    p.c_fc.gelu_forward(be, a.ln_2.out, a.fc_pre, a.fc)?;
    p.mlp_proj.forward(be, a.fc, a.proj)?;
    next.residual_forward(be, a.residual_2, a.proj, a.residual_3, next_out, eps)
}

/// [`forward`] of a chunk of new positions over a KV cache (generation: nothing is kept
/// for a backward pass), as the backend's decoder-stack op takes it
/// ([`andrea_core::DecodeOps::decode_blocks`], which [`crate::gpt::forward`] calls once
/// for all the blocks): the attention half appends its keys and values to the cache's
/// `keys` and `values` and reads them back; `a.qkv`, `a.atty`, `a.attn_workspace`,
/// `a.proj`, `a.fc_pre` and `a.fc` are scratch.
pub(crate) fn decode_block<'a, B: Backend>(
    p: &LayerParams<'a, B::Buffer>,
    a: &BlockActs<'a, B>,
    (keys, values): (HeadsOf<'a, B>, HeadsOf<'a, B>),
    (next, next_out): (&Norm<'a, B::Buffer>, &LayerNormOut<'a, B>),
) -> DecodeBlockOf<'a, B> {
    let norm = |n: &Norm<'a, B::Buffer>| NormParams {
        gamma: n.gamma,
        beta: n.beta,
    };
    let outputs = |o: &LayerNormOut<'a, B>| NormOutputs {
        out: o.out,
        mean: o.mean,
        rstd: o.rstd,
    };
    DecodeBlock {
        x: a.x,
        ln_1: a.ln_1.out,
        keys,
        values,
        c_attn: p.c_attn.params(),
        attn_proj: p.attn_proj.params(),
        ln_2: norm(&p.ln_2),
        c_fc: p.c_fc.params(),
        mlp_proj: p.mlp_proj.params(),
        next: norm(next),
        qkv: a.qkv.rows,
        atty: a.atty.rows,
        workspace: a.attn_workspace,
        proj: a.proj,
        fc_pre: a.fc_pre,
        fc: a.fc,
        residual_2: a.residual_2,
        ln_2_out: outputs(&a.ln_2),
        residual_3: a.residual_3,
        next_out: outputs(next_out),
    }
}

/// The backward pass of one block (training: the attention over the block's own keys).
/// The weight matrices' gradients in `g` are written (`g` holds one backward pass's
/// gradient, never a sum: the trainer adds whole gradients, see `train`'s module docs,
/// so writing saves zeroing nearly all of the buffer first and each product's first read
/// of it); the biases' and LayerNorms' are added (`+=`) onto zeros. `d.d_res` goes from
/// the gradient of the output to that of the input. Reads `a.attn_workspace` as the attention
/// forward left it; `scratch` is the attention backward's.
pub(crate) fn backward<B: Backend>(
    be: &B,
    p: &LayerParams<'_, B::Buffer>,
    g: &LayerParams<'_, B::Buffer>,
    a: &BlockActs<'_, B>,
    d: &BlockGrads<'_, B>,
    scratch: Tensor<'_, B>,
) -> Result<()> {
    // r3 = r2 + MLP(ln_2): ∂L/∂r2 = d_res (passes through) plus what ln_2 adds.
    // fc = GELU(fc_pre): d_fc is ∂L/∂fc_pre, GELU' applied in the product's epilogue.
    p.mlp_proj
        .backward_through_gelu(be, a.fc, a.fc_pre, d.d_res, d.d_fc, &g.mlp_proj)?;
    p.c_fc.backward(be, a.ln_2.out, d.d_fc, d.d_ln, &g.c_fc)?;
    p.ln_2
        .backward(be, a.residual_2, &a.ln_2, d.d_ln, d.d_res, &g.ln_2)?;

    // r2 = x + Attention(ln_1): ∂L/∂x = d_res plus what ln_1 adds.
    p.attn_proj
        .backward(be, a.atty.rows, d.d_res, d.d_atty.rows, &g.attn_proj)?;
    let (q, k, v, dq) = (a.qkv.q, a.qkv.k, a.qkv.v, &d.d_qkv);
    let (out, dout) = (a.atty.heads, d.d_atty.heads);
    let ws = a.attn_workspace;
    be.attention_backward(q, k, v, out, dout, dq.q, dq.k, dq.v, ws, scratch)?;
    p.c_attn
        .backward(be, a.ln_1.out, d.d_qkv.rows, d.d_ln, &g.c_attn)?;
    p.ln_1.backward(be, a.x, &a.ln_1, d.d_ln, d.d_res, &g.ln_1)
}
