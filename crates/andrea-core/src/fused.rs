//! Default implementations of the coarse ops, written with the fine ops only.
//!
//! They are correct on any backend and are what a backend falls back to; a backend
//! overrides the trait method with a fused kernel when that is faster. They are free
//! functions so an override can still call them (for shapes it does not specialise).

use crate::backend::{Backend, HeadsOf, Mat, Tensor};
use crate::check;
use crate::error::Result;
use crate::tensor::Matrix;

/// Default [`Backend::linear_gelu`]: a matmul with bias into `pre`, then GELU.
pub fn linear_gelu<B: Backend>(
    be: &B,
    x: Mat<'_, B>,
    w: Mat<'_, B>,
    bias: Tensor<'_, B>,
    pre: Tensor<'_, B>,
    out: Tensor<'_, B>,
) -> Result<()> {
    be.matmul(x, w, Some(bias), pre.mat())?;
    be.gelu(pre, out)
}

/// Default [`Backend::residual_layernorm`]: an add, then a LayerNorm.
pub fn residual_layernorm<B: Backend>(
    be: &B,
    a: Tensor<'_, B>,
    b: Tensor<'_, B>,
    residual: Tensor<'_, B>,
    gamma: Tensor<'_, B>,
    beta: Tensor<'_, B>,
    out: Tensor<'_, B>,
    mean: Tensor<'_, B>,
    rstd: Tensor<'_, B>,
    eps: f32,
) -> Result<()> {
    be.add(a, b, residual)?;
    be.layernorm(residual, gamma, beta, out, mean, rstd, eps)
}

/// Floats of workspace the default attention keeps: the probabilities `[B, H, Tq, Tk]`.
pub fn default_attention_workspace_len(s: crate::AttentionShape) -> usize {
    s.batch * s.heads * s.q_len * s.k_len
}

/// `[H, Tq, Tk]` scores of one batch entry, at `offset` in `t`'s buffer.
fn scores<'a, B: Backend>(
    t: Tensor<'a, B>,
    offset: usize,
    heads: usize,
    q_len: usize,
    k_len: usize,
) -> (Tensor<'a, B>, Mat<'a, B>) {
    let view = t.slice(offset, [heads, q_len, k_len]);
    let mat = Matrix {
        buf: t.buf,
        offset: view.offset,
        batch: heads,
        rows: q_len,
        cols: k_len,
        batch_stride: q_len * k_len,
        row_stride: k_len,
        col_stride: 1,
    };
    (view, mat)
}

/// Default [`Backend::attention_forward`]: per batch entry, `S = q·kᵀ` by a batched
/// matmul over the heads, a causal softmax in place, then `out = P·v`. Keeps `P` in the
/// workspace for the backward pass (`[B, H, Tq, Tk]`, which is what the fused kernels
/// avoid).
pub fn attention_forward<B: Backend>(
    be: &B,
    q: HeadsOf<'_, B>,
    k: HeadsOf<'_, B>,
    v: HeadsOf<'_, B>,
    out: HeadsOf<'_, B>,
    workspace: Tensor<'_, B>,
    pos_offset: usize,
) -> Result<()> {
    let d = check::attention_forward(
        &q,
        &k,
        &v,
        &out,
        &workspace,
        pos_offset,
        default_attention_workspace_len,
    )?;
    let scale = 1.0 / (d.head_dim as f32).sqrt();
    let per_batch = d.heads * d.q_len * d.k_len;
    for b in 0..d.batch {
        let (s, s_mat) = scores::<B>(workspace, b * per_batch, d.heads, d.q_len, d.k_len);
        be.matmul(q.heads_of(b), k.heads_of(b).t(), None, s_mat)?;
        be.softmax(s, s, scale, Some(pos_offset))?;
        be.matmul(s_mat, v.heads_of(b), None, out.heads_of(b))?;
    }
    Ok(())
}

/// Default [`Backend::attention_backward`], from the probabilities `P` the default
/// forward left in `workspace`, per batch entry:
///
/// ```text
/// dP = dO·vᵀ     dv = Pᵀ·dO     dS = softmax_backward(P, dP)·scale
/// dq = dS·k      dk = dSᵀ·q
/// ```
pub fn attention_backward<B: Backend>(
    be: &B,
    q: HeadsOf<'_, B>,
    k: HeadsOf<'_, B>,
    v: HeadsOf<'_, B>,
    out: HeadsOf<'_, B>,
    dout: HeadsOf<'_, B>,
    dq: HeadsOf<'_, B>,
    dk: HeadsOf<'_, B>,
    dv: HeadsOf<'_, B>,
    workspace: Tensor<'_, B>,
    scratch: Tensor<'_, B>,
) -> Result<()> {
    let t = q.seq;
    let ws_len = q.batch * q.heads * t * t;
    let scratch_len = q.heads * t * t;
    let d = check::attention_backward(
        &q,
        &k,
        &v,
        &out,
        &dout,
        &dq,
        &dk,
        &dv,
        &workspace,
        &scratch,
        ws_len,
        scratch_len,
    )?;
    let scale = 1.0 / (d.head_dim as f32).sqrt();
    let per_batch = d.heads * t * t;
    for b in 0..d.batch {
        let (p, p_mat) = scores::<B>(workspace, b * per_batch, d.heads, t, t);
        let (dp, dp_mat) = scores::<B>(scratch, 0, d.heads, t, t);
        be.matmul(dout.heads_of(b), v.heads_of(b).t(), None, dp_mat)?;
        be.matmul(p_mat.t(), dout.heads_of(b), None, dv.heads_of(b))?;
        be.softmax_backward(p, dp, dp, scale)?;
        be.matmul(dp_mat, k.heads_of(b), None, dq.heads_of(b))?;
        be.matmul(dp_mat.t(), q.heads_of(b), None, dk.heads_of(b))?;
    }
    Ok(())
}
