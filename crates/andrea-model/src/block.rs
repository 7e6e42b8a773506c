//! One transformer block, forward and backward, as a sequence of backend ops. Training
//! and generation run the same forward; they differ only in the attention (over the
//! block's own keys, or over a KV cache) and in where the activations live.
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
//! [`forward`] starts from an `ln_1` its caller computed ([`ln_1`] for the first block)
//! and ends with the next one ([`Norm`]). That is one pass over the residual stream and
//! one backend call fewer per block.

use andrea_core::{Backend, Heads, Tensor};

use crate::error::Result;
use crate::layout::LayerParams;

/// The activations of one block for `N = B·T` tokens (views into an arena).
pub(crate) struct BlockActs<'a, B: Backend> {
    /// The block's input (the residual stream), `[N, C]`.
    pub x: Tensor<'a, B>,
    pub ln_1: Tensor<'a, B>,
    pub ln_1_mean: Tensor<'a, B>,
    pub ln_1_rstd: Tensor<'a, B>,
    /// `[B, T, 3C]`
    pub qkv: Tensor<'a, B>,
    /// `[B, T, C]`
    pub atty: Tensor<'a, B>,
    /// Scratch `[N, C]` for the two projections' outputs (not needed by the backward pass).
    pub proj: Tensor<'a, B>,
    pub residual_2: Tensor<'a, B>,
    pub ln_2: Tensor<'a, B>,
    pub ln_2_mean: Tensor<'a, B>,
    pub ln_2_rstd: Tensor<'a, B>,
    /// `[N, M]`: before and after the GELU.
    pub fc_pre: Tensor<'a, B>,
    pub fc: Tensor<'a, B>,
    /// The block's output, `[N, C]`; may be exactly `residual_2` (generation).
    pub residual_3: Tensor<'a, B>,
}

/// Scratch gradients of the backward pass.
pub(crate) struct BlockGrads<'a, B: Backend> {
    /// ∂L/∂(residual stream), `[N, C]`: on entry the gradient of the block's output, on
    /// exit that of its input (the residual path passes it through; both LayerNorms add
    /// into it).
    pub d_res: Tensor<'a, B>,
    /// `[N, C]`: the gradient of a LayerNorm output, and of the attention output.
    pub d_ln: Tensor<'a, B>,
    /// `[N, M]`: ∂L/∂fc; the first `N·3C` floats hold ∂L/∂qkv later.
    pub d_fc: Tensor<'a, B>,
    /// `[B, T, 3C]` over the same memory as `d_fc`.
    pub d_qkv: Tensor<'a, B>,
}

/// The LayerNorm applied to a block's output, `[N, C]`: the next block's `ln_1`, or
/// `ln_f` after the last block.
pub(crate) struct Norm<'a, B: Backend> {
    pub weight: Tensor<'a, B>,
    pub bias: Tensor<'a, B>,
    pub out: Tensor<'a, B>,
    pub mean: Tensor<'a, B>,
    pub rstd: Tensor<'a, B>,
}

impl<'a, B: Backend> Norm<'a, B> {
    /// The `ln_1` of the block with parameters `p` and activations `a`.
    pub fn ln_1(p: &LayerParams<'a, B::Buffer>, a: &BlockActs<'a, B>) -> Self {
        Norm {
            weight: p.ln_1_w,
            bias: p.ln_1_b,
            out: a.ln_1,
            mean: a.ln_1_mean,
            rstd: a.ln_1_rstd,
        }
    }
}

/// `ln_1 = LayerNorm(x)` of the first block (later blocks get theirs from the block
/// before, fused with its last residual add).
pub(crate) fn ln_1<B: Backend>(
    be: &B,
    p: &LayerParams<'_, B::Buffer>,
    a: &BlockActs<'_, B>,
    eps: f32,
) -> Result<()> {
    be.layernorm(
        a.x,
        p.ln_1_w,
        p.ln_1_b,
        a.ln_1,
        a.ln_1_mean,
        a.ln_1_rstd,
        eps,
    )?;
    Ok(())
}

/// The forward pass of one block, from `a.ln_1` (already `LayerNorm(a.x)`) to
/// `a.residual_3` and `next`, the LayerNorm of `a.residual_3`. `attention(qkv, atty)`
/// writes the attention output.
pub(crate) fn forward<'a, B: Backend>(
    be: &B,
    p: &LayerParams<'_, B::Buffer>,
    a: &BlockActs<'a, B>,
    next: &Norm<'_, B>,
    eps: f32,
    attention: impl FnOnce(Tensor<'a, B>, Tensor<'a, B>) -> Result<()>,
) -> Result<()> {
    be.matmul(
        a.ln_1.mat(),
        p.c_attn_w.mat(),
        Some(p.c_attn_b),
        a.qkv.mat(),
    )?;
    attention(a.qkv, a.atty)?;
    be.matmul(
        a.atty.mat(),
        p.attn_proj_w.mat(),
        Some(p.attn_proj_b),
        a.proj.mat(),
    )?;
    be.residual_layernorm(
        a.x,
        a.proj,
        a.residual_2,
        p.ln_2_w,
        p.ln_2_b,
        a.ln_2,
        a.ln_2_mean,
        a.ln_2_rstd,
        eps,
    )?;
    be.linear_gelu(a.ln_2.mat(), p.c_fc_w.mat(), p.c_fc_b, a.fc_pre, a.fc)?;
    be.matmul(
        a.fc.mat(),
        p.mlp_proj_w.mat(),
        Some(p.mlp_proj_b),
        a.proj.mat(),
    )?;
    be.residual_layernorm(
        a.residual_2,
        a.proj,
        a.residual_3,
        next.weight,
        next.bias,
        next.out,
        next.mean,
        next.rstd,
        eps,
    )?;
    Ok(())
}

/// The backward pass of one block (training: the attention over the block's own keys).
/// Parameter gradients in `g` are accumulated (`+=`); `d.d_res` goes from the gradient
/// of the output to that of the input. Reads `workspace` as the attention forward left it.
pub(crate) fn backward<B: Backend>(
    be: &B,
    p: &LayerParams<'_, B::Buffer>,
    g: &LayerParams<'_, B::Buffer>,
    a: &BlockActs<'_, B>,
    d: &BlockGrads<'_, B>,
    n_head: usize,
    workspace: Tensor<'_, B>,
    scratch: Tensor<'_, B>,
) -> Result<()> {
    // r3 = r2 + fc·W + b: ∂L/∂r2 = d_res (passes through) plus what the MLP adds below.
    be.matmul(d.d_res.mat(), p.mlp_proj_w.mat().t(), None, d.d_fc.mat())?;
    be.matmul_add(a.fc.mat().t(), d.d_res.mat(), None, g.mlp_proj_w.mat())?;
    be.bias_backward(d.d_res, g.mlp_proj_b)?;
    be.gelu_backward(a.fc_pre, d.d_fc, d.d_fc)?;
    be.matmul(d.d_fc.mat(), p.c_fc_w.mat().t(), None, d.d_ln.mat())?;
    be.matmul_add(a.ln_2.mat().t(), d.d_fc.mat(), None, g.c_fc_w.mat())?;
    be.bias_backward(d.d_fc, g.c_fc_b)?;
    be.layernorm_backward(
        a.residual_2,
        p.ln_2_w,
        a.ln_2_mean,
        a.ln_2_rstd,
        d.d_ln,
        d.d_res,
        g.ln_2_w,
        g.ln_2_b,
    )?;

    // r2 = x + atty·W + b.
    let d_att = d
        .d_ln
        .reshape(a.atty.shape)
        .expect("d_ln has the size of atty");
    be.matmul(d.d_res.mat(), p.attn_proj_w.mat().t(), None, d_att.mat())?;
    be.matmul_add(a.atty.mat().t(), d.d_res.mat(), None, g.attn_proj_w.mat())?;
    be.bias_backward(d.d_res, g.attn_proj_b)?;
    let [q, k, v] = Heads::split_qkv(a.qkv, n_head).expect("[B, T, 3C] view");
    let [dq, dk, dv] = Heads::split_qkv(d.d_qkv, n_head).expect("[B, T, 3C] view");
    be.attention_backward(
        q,
        k,
        v,
        Heads::from_tensor(a.atty, n_head).expect("[B, T, C] view"),
        Heads::from_tensor(d_att, n_head).expect("[B, T, C] view"),
        dq,
        dk,
        dv,
        workspace,
        scratch,
    )?;
    be.matmul(d.d_qkv.mat(), p.c_attn_w.mat().t(), None, d.d_ln.mat())?;
    be.matmul_add(a.ln_1.mat().t(), d.d_qkv.mat(), None, g.c_attn_w.mat())?;
    be.bias_backward(d.d_qkv, g.c_attn_b)?;
    be.layernorm_backward(
        a.x,
        p.ln_1_w,
        a.ln_1_mean,
        a.ln_1_rstd,
        d.d_ln,
        d.d_res,
        g.ln_1_w,
        g.ln_1_b,
    )?;
    Ok(())
}
