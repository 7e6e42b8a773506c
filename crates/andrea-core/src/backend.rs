//! The [`Backend`] trait: everything a GPT-2 training step and generation need from a
//! device. The trait is the specification; `andrea-testkit` holds a float64 reference
//! for every op and a conformance suite that any backend runs with one line.
//!
//! # Conventions
//!
//! * Shapes are row-major; `[B, T, C]` is batch, time (sequence), channels.
//! * Every op validates its arguments with [`crate::check`] and returns an error naming
//!   the op, the argument and the sizes; no op panics or writes out of bounds.
//! * **Outputs never overlap inputs**, except where an op says it may work in place on
//!   exactly the same view.
//! * **Gradients:** parameter gradients (`dweight`, `dbias`, `dgamma`, `dbeta`, `dwte`,
//!   `dwpe`) are always accumulated (`+=`), so micro-batches accumulate for free.
//!   Activation gradients are overwritten (`=`), except `dx` of
//!   [`Backend::layernorm_backward`], which adds into the residual stream's gradient
//!   (pre-norm blocks: the residual path and the LayerNorm path meet there).
//! * Ops are issued in order on one queue; results are visible to later ops at once.
//!   Host reads ([`Backend::download`], [`Backend::sum_squares`]) wait for earlier work.

use crate::error::Result;
use crate::fused;
use crate::tensor::{DeviceMemory, Heads, Matrix, View};

/// An `f32` tensor view into backend `B`'s memory.
pub type Tensor<'a, B> = View<'a, <B as Backend>::Buffer>;
/// A `u32` token-id view into backend `B`'s memory.
pub type Ids<'a, B> = View<'a, <B as Backend>::IdBuffer>;
/// A strided `f32` matrix in backend `B`'s memory.
pub type Mat<'a, B> = Matrix<'a, <B as Backend>::Buffer>;
/// Attention heads in backend `B`'s memory.
pub type HeadsOf<'a, B> = Heads<'a, <B as Backend>::Buffer>;

/// A target id that contributes neither loss nor gradient (padding).
pub const IGNORE_INDEX: u32 = u32::MAX;

/// Hyper-parameters of one AdamW step, with `torch.optim.AdamW` semantics:
///
/// ```text
/// g  = grad · grad_scale
/// m  = β1·m + (1-β1)·g          v = β2·v + (1-β2)·g²
/// m̂  = m / (1-β1^step)           v̂ = v / (1-β2^step)
/// p  = p - lr·weight_decay·p - lr·m̂ / (sqrt(v̂) + eps)
/// ```
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AdamWStep {
    pub lr: f32,
    pub beta1: f32,
    pub beta2: f32,
    pub eps: f32,
    /// Decoupled weight decay; the model passes 0 for biases and LayerNorm parameters.
    pub weight_decay: f32,
    /// 1-based step count, for bias correction.
    pub step: u64,
    /// Multiplies the gradient before use: gradient clipping and loss scaling.
    pub grad_scale: f32,
}

/// The attention problem a workspace is sized for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AttentionShape {
    pub batch: usize,
    pub heads: usize,
    /// Number of query positions.
    pub q_len: usize,
    /// Number of key positions (`>= q_len`; more in generation with a KV cache).
    pub k_len: usize,
}

/// A device that runs the ops of a GPT-2 training step and of generation.
pub trait Backend: Sized {
    /// Device memory holding `f32` elements.
    type Buffer: DeviceMemory + Send;
    /// Device memory holding `u32` token ids.
    type IdBuffer: DeviceMemory + Send;

    /// A short human-readable description ("cpu (2 threads, avx512)", "cuda: NVIDIA H200").
    fn name(&self) -> String;

    // ---- memory -------------------------------------------------------------------

    /// A zero-filled buffer of `len` floats.
    fn alloc(&self, len: usize) -> Result<Self::Buffer>;
    /// A zero-filled buffer of `len` token ids.
    fn alloc_ids(&self, len: usize) -> Result<Self::IdBuffer>;
    /// Copies host floats into `dst` (`src.len()` must equal `dst.numel()`).
    fn upload(&self, src: &[f32], dst: Tensor<'_, Self>) -> Result<()>;
    /// Copies `src` to host memory (`dst.len()` must equal `src.numel()`).
    fn download(&self, src: Tensor<'_, Self>, dst: &mut [f32]) -> Result<()>;
    /// Copies host token ids into `dst`.
    fn upload_ids(&self, src: &[u32], dst: Ids<'_, Self>) -> Result<()>;
    /// Waits until every op issued so far has finished.
    fn synchronize(&self) -> Result<()> {
        Ok(())
    }
    /// `dst[i] = value`.
    fn fill(&self, dst: Tensor<'_, Self>, value: f32) -> Result<()>;
    /// `dst[b,i,j] = src[b,i,j]` for matrices of equal sizes and any strides
    /// (appending keys and values to a KV cache, gathering a row of logits).
    fn copy(&self, src: Mat<'_, Self>, dst: Mat<'_, Self>) -> Result<()>;

    // ---- linear algebra -----------------------------------------------------------

    /// `c[b] = a[b] · b[b] (+ bias)` for `a[b]: [M, K]`, `b[b]: [K, N]`, `c[b]: [M, N]`,
    /// `bias: [N]` added to every row. Any strides: a transposed operand is
    /// [`Matrix::t`], never a copy. `a` and `b` have batch 1 (broadcast) or `c`'s batch.
    fn matmul(
        &self,
        a: Mat<'_, Self>,
        b: Mat<'_, Self>,
        bias: Option<Tensor<'_, Self>>,
        c: Mat<'_, Self>,
    ) -> Result<()>;

    /// [`Backend::matmul`] that adds into `c` instead of overwriting it:
    /// `c[b] += a[b] · b[b] (+ bias)` (weight gradients, gradient accumulation).
    fn matmul_add(
        &self,
        a: Mat<'_, Self>,
        b: Mat<'_, Self>,
        bias: Option<Tensor<'_, Self>>,
        c: Mat<'_, Self>,
    ) -> Result<()>;

    /// Column sums `dbias[j] += Σ_i dout[i, j]` of `dout: [N, M]` into `dbias: [M]`.
    fn bias_backward(&self, dout: Tensor<'_, Self>, dbias: Tensor<'_, Self>) -> Result<()>;

    // ---- elementwise --------------------------------------------------------------

    /// `out = a + b` (the residual connection). `out` may be exactly `a` or `b`.
    fn add(&self, a: Tensor<'_, Self>, b: Tensor<'_, Self>, out: Tensor<'_, Self>) -> Result<()>;

    /// `x *= alpha`, in place.
    fn scale(&self, x: Tensor<'_, Self>, alpha: f32) -> Result<()>;

    /// `out = GELU(x)`, tanh form: `0.5·x·(1 + tanh(sqrt(2/π)·(x + 0.044715·x³)))`.
    /// `out` may be exactly `x`.
    fn gelu(&self, x: Tensor<'_, Self>, out: Tensor<'_, Self>) -> Result<()>;

    /// `dx = dout · GELU'(x)` (the derivative of the same tanh form). `dx` may be
    /// exactly `dout`.
    fn gelu_backward(
        &self,
        x: Tensor<'_, Self>,
        dout: Tensor<'_, Self>,
        dx: Tensor<'_, Self>,
    ) -> Result<()>;

    // ---- normalisation ------------------------------------------------------------

    /// LayerNorm over the last dimension of `x: [N, C]`:
    /// `out = γ·(x - mean)·rstd + β` with biased variance and `rstd = 1/sqrt(var + eps)`.
    /// Saves `mean: [N]` and `rstd: [N]` for the backward pass.
    fn layernorm(
        &self,
        x: Tensor<'_, Self>,
        gamma: Tensor<'_, Self>,
        beta: Tensor<'_, Self>,
        out: Tensor<'_, Self>,
        mean: Tensor<'_, Self>,
        rstd: Tensor<'_, Self>,
        eps: f32,
    ) -> Result<()>;

    /// Backward of [`Backend::layernorm`]: `dx += ∂L/∂x` (note: adds, see the module
    /// docs), `dgamma += Σ_n dout·x̂`, `dbeta += Σ_n dout`.
    fn layernorm_backward(
        &self,
        x: Tensor<'_, Self>,
        gamma: Tensor<'_, Self>,
        mean: Tensor<'_, Self>,
        rstd: Tensor<'_, Self>,
        dout: Tensor<'_, Self>,
        dx: Tensor<'_, Self>,
        dgamma: Tensor<'_, Self>,
        dbeta: Tensor<'_, Self>,
    ) -> Result<()>;

    // ---- softmax ------------------------------------------------------------------

    /// Row-wise `out = softmax(scale · x)` over the last dimension of `x: [.., Tq, Tk]`.
    /// With `causal_offset = Some(o)`, row `i` (query `i` of the last-but-one
    /// dimension) sees only columns `j <= o + i`; masked entries of `out` are 0.
    /// `out` may be exactly `x`.
    fn softmax(
        &self,
        x: Tensor<'_, Self>,
        out: Tensor<'_, Self>,
        scale: f32,
        causal_offset: Option<usize>,
    ) -> Result<()>;

    /// Backward of [`Backend::softmax`] given its output `probs`:
    /// `dx = scale · probs ∘ (dprobs - Σ_j probs·dprobs)`. `dx` may be exactly `dprobs`.
    fn softmax_backward(
        &self,
        probs: Tensor<'_, Self>,
        dprobs: Tensor<'_, Self>,
        dx: Tensor<'_, Self>,
        scale: f32,
    ) -> Result<()>;

    // ---- embedding ----------------------------------------------------------------

    /// `out[b, t] = wte[ids[b·T + t]] + wpe[pos_offset + t]` for `out: [B, T, C]`,
    /// `ids: [B·T]`, `wte: [V, C]`, `wpe: [T_ctx, C]`. An id `>= V` or a position
    /// `>= T_ctx` is an error.
    fn embedding(
        &self,
        ids: Ids<'_, Self>,
        wte: Tensor<'_, Self>,
        wpe: Tensor<'_, Self>,
        out: Tensor<'_, Self>,
        pos_offset: usize,
    ) -> Result<()>;

    /// Backward of [`Backend::embedding`] (positions from 0): scatter-adds
    /// `dwte[ids[n]] += dout[n]` and `dwpe[t] += Σ_b dout[b, t]`. Deterministic: the
    /// additions into a row happen in the order of `n`.
    fn embedding_backward(
        &self,
        ids: Ids<'_, Self>,
        dout: Tensor<'_, Self>,
        dwte: Tensor<'_, Self>,
        dwpe: Tensor<'_, Self>,
    ) -> Result<()>;

    // ---- loss ---------------------------------------------------------------------

    /// Fused softmax + cross-entropy over `logits: [N, Vp]`, of which only the first
    /// `vocab` columns are real (the rest is padding and gets gradient 0):
    /// `losses[n] = logsumexp(logits[n, ..vocab]) - logits[n, targets[n]]` and, if
    /// `dlogits` is given, `dlogits[n] = grad_scale · (softmax(logits[n]) - onehot)`.
    /// A target equal to [`IGNORE_INDEX`] gives loss 0 and gradient 0. `dlogits` may
    /// be exactly `logits` (the logits are overwritten by their gradient).
    fn softmax_cross_entropy(
        &self,
        logits: Tensor<'_, Self>,
        targets: Ids<'_, Self>,
        vocab: usize,
        losses: Tensor<'_, Self>,
        dlogits: Option<Tensor<'_, Self>>,
        grad_scale: f32,
    ) -> Result<()>;

    // ---- optimizer ----------------------------------------------------------------

    /// `Σ x²`, accumulated in f64 in an order that does not depend on the thread count
    /// (the squared global gradient norm, for clipping).
    fn sum_squares(&self, x: Tensor<'_, Self>) -> Result<f64>;

    /// One AdamW step over `param`, `grad`, `m`, `v` (equal sizes), see [`AdamWStep`].
    fn adamw(
        &self,
        param: Tensor<'_, Self>,
        grad: Tensor<'_, Self>,
        m: Tensor<'_, Self>,
        v: Tensor<'_, Self>,
        step: &AdamWStep,
    ) -> Result<()>;

    // ---- fused ops: defaults built from the ops above, overridable ----------------

    /// `pre = x · w + bias`, `out = GELU(pre)` (the MLP's first half). `pre` is kept
    /// for the backward pass.
    fn linear_gelu(
        &self,
        x: Mat<'_, Self>,
        w: Mat<'_, Self>,
        bias: Tensor<'_, Self>,
        pre: Tensor<'_, Self>,
        out: Tensor<'_, Self>,
    ) -> Result<()> {
        fused::linear_gelu(self, x, w, bias, pre, out)
    }

    /// `residual = a + b`, then `out = LayerNorm(residual)` saving `mean` and `rstd`.
    fn residual_layernorm(
        &self,
        a: Tensor<'_, Self>,
        b: Tensor<'_, Self>,
        residual: Tensor<'_, Self>,
        gamma: Tensor<'_, Self>,
        beta: Tensor<'_, Self>,
        out: Tensor<'_, Self>,
        mean: Tensor<'_, Self>,
        rstd: Tensor<'_, Self>,
        eps: f32,
    ) -> Result<()> {
        fused::residual_layernorm(self, a, b, residual, gamma, beta, out, mean, rstd, eps)
    }

    /// Floats of workspace [`Backend::attention_forward`] needs for `shape`; the forward
    /// pass leaves there what [`Backend::attention_backward`] reads. The default keeps
    /// the attention probabilities `[B, H, Tq, Tk]`.
    fn attention_workspace_len(&self, shape: AttentionShape) -> usize {
        shape.batch * shape.heads * shape.q_len * shape.k_len
    }

    /// Floats of scratch [`Backend::attention_backward`] needs (the default keeps
    /// `dP` of one batch entry, `[H, T, T]`).
    fn attention_backward_scratch_len(&self, shape: AttentionShape) -> usize {
        shape.heads * shape.q_len * shape.k_len
    }

    /// Causal multi-head attention: for every batch entry and head,
    /// `out = softmax(q·kᵀ / sqrt(D), causal) · v`, where query `i` sits at absolute
    /// position `pos_offset + i` and sees keys `0..=pos_offset + i`. In training
    /// `pos_offset = 0` and `k.seq == q.seq`; in generation `k` and `v` are the KV cache
    /// and `k.seq == pos_offset + q.seq`. `workspace` has at least
    /// [`Backend::attention_workspace_len`] floats.
    fn attention_forward(
        &self,
        q: HeadsOf<'_, Self>,
        k: HeadsOf<'_, Self>,
        v: HeadsOf<'_, Self>,
        out: HeadsOf<'_, Self>,
        workspace: Tensor<'_, Self>,
        pos_offset: usize,
    ) -> Result<()> {
        fused::attention_forward(self, q, k, v, out, workspace, pos_offset)
    }

    /// Backward of [`Backend::attention_forward`] (training: `pos_offset = 0`,
    /// `q.seq == k.seq`), given the forward's `out` and `workspace`: writes `dq`, `dk`,
    /// `dv` (`=`; typically the three thirds of `d(qkv)`).
    fn attention_backward(
        &self,
        q: HeadsOf<'_, Self>,
        k: HeadsOf<'_, Self>,
        v: HeadsOf<'_, Self>,
        out: HeadsOf<'_, Self>,
        dout: HeadsOf<'_, Self>,
        dq: HeadsOf<'_, Self>,
        dk: HeadsOf<'_, Self>,
        dv: HeadsOf<'_, Self>,
        workspace: Tensor<'_, Self>,
        scratch: Tensor<'_, Self>,
    ) -> Result<()> {
        fused::attention_backward(self, q, k, v, out, dout, dq, dk, dv, workspace, scratch)
    }
}

impl<M: DeviceMemory> View<'_, M> {
    /// Whether two views are the very same elements (same buffer, offset and size):
    /// the in-place case some ops allow.
    pub fn same_as(&self, other: &Self) -> bool {
        std::ptr::eq(self.buf, other.buf)
            && self.offset == other.offset
            && self.numel() == other.numel()
    }
}
