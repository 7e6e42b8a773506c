//! Fused causal multi-head attention, forward and backward, and the workspace it keeps
//! between them. The defaults ([`fused`]) compose matmuls and softmaxes and keep the
//! probabilities; a fused kernel keeps only one log-sum-exp per query row.

use super::{HeadsOf, LinalgOps, LinearOf, MemoryOps, SoftmaxOps, Tensor};
use crate::error::Result;

/// The attention problem a workspace is sized for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AttentionShape {
    pub batch: usize,
    pub heads: usize,
    /// Size of each head's query, key and value vectors.
    pub head_dim: usize,
    /// Number of query positions.
    pub q_len: usize,
    /// Number of key positions (`>= q_len`; more in generation with a KV cache).
    pub k_len: usize,
}

impl AttentionShape {
    /// `[B, H, Tq]`: one log-sum-exp per query row, the workspace of a fused
    /// (online-softmax) forward, from which the backward recomputes the probabilities.
    pub fn lse_len(&self) -> usize {
        self.batch * self.heads * self.q_len
    }

    /// `[H, Tq, Tk]`: the attention probabilities of one batch entry.
    pub fn probs_per_batch(&self) -> usize {
        self.heads * self.q_len * self.k_len
    }

    /// `[B, H, Tq, Tk]`: all attention probabilities, the default forward's workspace.
    pub fn probs_len(&self) -> usize {
        self.batch * self.probs_per_batch()
    }
}

/// Causal multi-head self-attention. Every method has a default built from
/// [`LinalgOps`] and [`SoftmaxOps`] ([`fused`]); a backend overrides all four together
/// with its fused kernels.
pub trait AttentionOps: MemoryOps {
    /// Floats of workspace [`AttentionOps::attention_forward`] needs for `shape`; the
    /// forward pass leaves there what [`AttentionOps::attention_backward`] reads. The
    /// default keeps the attention probabilities ([`AttentionShape::probs_len`]). A
    /// backend's answer must not decrease as `k_len` grows (a KV cache sizes it once at
    /// its longest), but may depend on `q_len` in any way (a cache asks for every
    /// `q_len` it will run).
    fn attention_workspace_len(&self, shape: AttentionShape) -> usize {
        shape.probs_len()
    }

    /// Whether a KV cache for this backend keeps each head's positions one after the
    /// other (`true`) rather than each position's heads side by side (`false`, the
    /// default): see [`crate::Heads`]. Every backend's attention takes both layouts but
    /// the CUDA kernels, which take heads side by side only (and refuse others by name);
    /// the CPU's attention of one new token reads a head's cached keys and values as one
    /// run that way (the hardware prefetchers follow it; side by side, each position's
    /// few lines of a head sit a row apart).
    fn kv_heads_apart(&self) -> bool {
        false
    }

    /// Floats of scratch [`AttentionOps::attention_backward`] needs (the default keeps
    /// `dP` of one batch entry, [`AttentionShape::probs_per_batch`]).
    fn attention_backward_scratch_len(&self, shape: AttentionShape) -> usize {
        shape.probs_per_batch()
    }

    /// Causal multi-head attention: for every batch entry and head,
    /// `out = softmax(q·kᵀ / sqrt(D), causal) · v`, where query `i` sits at absolute
    /// position `pos_offset + i` and sees keys `0..=pos_offset + i`. In training
    /// `pos_offset = 0` and `k.seq == q.seq`; in generation `k` and `v` are the KV cache
    /// and `k.seq == pos_offset + q.seq`. `workspace` has at least
    /// [`AttentionOps::attention_workspace_len`] floats.
    fn attention_forward(
        &self,
        q: HeadsOf<'_, Self>,
        k: HeadsOf<'_, Self>,
        v: HeadsOf<'_, Self>,
        out: HeadsOf<'_, Self>,
        workspace: Tensor<'_, Self>,
        pos_offset: usize,
    ) -> Result<()>
    where
        Self: LinalgOps + SoftmaxOps,
    {
        fused::attention_forward(self, q, k, v, out, workspace, pos_offset)
    }

    /// Backward of [`AttentionOps::attention_forward`] (training: `pos_offset = 0`,
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
    ) -> Result<()>
    where
        Self: LinalgOps + SoftmaxOps,
    {
        fused::attention_backward(self, q, k, v, out, dout, dq, dk, dv, workspace, scratch)
    }

    /// Fused: the attention half of a block for `T` new positions of each of `B`
    /// sequences over a KV cache (generation). With `x, out: [B·T, C]` (sequence-major),
    /// `keys`, `values` the cache's `[B, pos + T, H, D]` views (`H·D = C`):
    ///
    /// 1. `qkv = x·qkv_w.weight + qkv_w.bias` (`[B·T, 3C]`: queries, keys, values);
    /// 2. its keys and values are written to positions `pos..pos + T` of `keys` and
    ///    `values` (positions before `pos` are only read);
    /// 3. `atty` = [`AttentionOps::attention_forward`] of its queries over all `pos + T`
    ///    cached positions (`pos_offset = pos`);
    /// 4. `out = atty·proj.weight + proj.bias`.
    ///
    /// `qkv` (`B·T·3C` floats), `atty` (`B·T·C`) and `workspace` (at least
    /// [`AttentionOps::attention_workspace_len`] of the step's shape) are scratch whose
    /// contents afterwards are unspecified: the default leaves each step's result there,
    /// a fused kernel may not write them. Outputs are disjoint from each other and from
    /// the inputs (`keys` and `values` may interleave, as one cache's halves do).
    /// Default: [`fused::decode_attention`].
    fn decode_attention(
        &self,
        x: Tensor<'_, Self>,
        qkv_w: LinearOf<'_, Self>,
        qkv: Tensor<'_, Self>,
        keys: HeadsOf<'_, Self>,
        values: HeadsOf<'_, Self>,
        atty: Tensor<'_, Self>,
        workspace: Tensor<'_, Self>,
        proj: LinearOf<'_, Self>,
        out: Tensor<'_, Self>,
    ) -> Result<()>
    where
        Self: LinalgOps + SoftmaxOps,
    {
        fused::decode_attention(
            self, x, qkv_w, qkv, keys, values, atty, workspace, proj, out,
        )
    }
}

/// Argument checks of the attention ops.
pub mod check {
    use crate::check::{disjoint, heads, numel, view, Region};
    use crate::error::{Error, Result};
    use crate::ops::linalg::{check::matmul, LinearParams};
    use crate::tensor::{DeviceMemory, Heads, Shape, View};

    /// Sizes of a validated attention call.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub struct AttentionDims {
        pub batch: usize,
        pub heads: usize,
        pub head_dim: usize,
        pub q_len: usize,
        pub k_len: usize,
    }

    impl AttentionDims {
        /// As the workspace-sizing shape.
        pub fn shape(&self) -> super::AttentionShape {
            super::AttentionShape {
                batch: self.batch,
                heads: self.heads,
                head_dim: self.head_dim,
                q_len: self.q_len,
                k_len: self.k_len,
            }
        }
    }

    fn attention_dims<M: DeviceMemory>(
        op: &'static str,
        q: &Heads<'_, M>,
        k: &Heads<'_, M>,
        v: &Heads<'_, M>,
        pos_offset: usize,
    ) -> Result<AttentionDims> {
        heads(op, "q", q, false)?;
        heads(op, "k", k, false)?;
        heads(op, "v", v, false)?;
        for (name, h) in [("k", k), ("v", v)] {
            if h.batch != q.batch || h.heads != q.heads || h.head_dim != q.head_dim {
                return Err(Error::ShapeMismatch {
                    op,
                    arg: name,
                    expected: Shape::new(&[q.batch, h.seq, q.heads, q.head_dim]),
                    got: Shape::new(&[h.batch, h.seq, h.heads, h.head_dim]),
                });
            }
        }
        if v.seq != k.seq {
            return Err(Error::SizeMismatch {
                op,
                what: "key positions",
                a: "v",
                a_size: v.seq,
                b: "k",
                b_size: k.seq,
            });
        }
        if pos_offset.checked_add(q.seq) != Some(k.seq) {
            return Err(Error::invalid(
                op,
                format!(
                    "queries at positions {pos_offset}..{} need exactly {} keys, k has {}",
                    pos_offset.saturating_add(q.seq),
                    pos_offset.saturating_add(q.seq),
                    k.seq
                ),
            ));
        }
        Ok(AttentionDims {
            batch: q.batch,
            heads: q.heads,
            head_dim: q.head_dim,
            q_len: q.seq,
            k_len: k.seq,
        })
    }

    fn same_heads<M>(
        op: &'static str,
        arg: &'static str,
        h: &Heads<'_, M>,
        like: &Heads<'_, M>,
    ) -> Result<()> {
        let got = Shape::new(&[h.batch, h.seq, h.heads, h.head_dim]);
        let expected = Shape::new(&[like.batch, like.seq, like.heads, like.head_dim]);
        if got != expected {
            return Err(Error::ShapeMismatch {
                op,
                arg,
                expected,
                got,
            });
        }
        Ok(())
    }

    /// [`super::AttentionOps::attention_forward`]; `workspace_len` is what the backend asks
    /// for (its [`super::AttentionOps::attention_workspace_len`]).
    pub fn attention_forward<M: DeviceMemory>(
        q: &Heads<'_, M>,
        k: &Heads<'_, M>,
        v: &Heads<'_, M>,
        out: &Heads<'_, M>,
        workspace: &View<'_, M>,
        pos_offset: usize,
        workspace_len: impl FnOnce(super::AttentionShape) -> usize,
    ) -> Result<AttentionDims> {
        const OP: &str = "attention_forward";
        let dims = attention_dims(OP, q, k, v, pos_offset)?;
        heads(OP, "out", out, true)?;
        same_heads(OP, "out", out, q)?;
        view(OP, "workspace", workspace)?;
        let need = workspace_len(dims.shape());
        if workspace.numel() < need {
            return Err(Error::SizeMismatch {
                op: OP,
                what: "workspace floats (at least)",
                a: "needed",
                a_size: need,
                b: "workspace",
                b_size: workspace.numel(),
            });
        }
        disjoint(
            OP,
            &[
                Region::of_heads("out", out),
                Region::of("workspace", workspace),
            ],
            &[
                Region::of_heads("q", q),
                Region::of_heads("k", k),
                Region::of_heads("v", v),
            ],
            false,
        )?;
        Ok(dims)
    }

    /// [`super::AttentionOps::attention_backward`]; `workspace_len` and `scratch_len` are
    /// what the backend asks for.
    pub fn attention_backward<M: DeviceMemory>(
        q: &Heads<'_, M>,
        k: &Heads<'_, M>,
        v: &Heads<'_, M>,
        out: &Heads<'_, M>,
        dout: &Heads<'_, M>,
        dq: &Heads<'_, M>,
        dk: &Heads<'_, M>,
        dv: &Heads<'_, M>,
        workspace: &View<'_, M>,
        scratch: &View<'_, M>,
        workspace_len: impl FnOnce(super::AttentionShape) -> usize,
        scratch_len: impl FnOnce(super::AttentionShape) -> usize,
    ) -> Result<AttentionDims> {
        const OP: &str = "attention_backward";
        let dims = attention_dims(OP, q, k, v, 0)?;
        let (workspace_len, scratch_len) = (workspace_len(dims.shape()), scratch_len(dims.shape()));
        heads(OP, "out", out, false)?;
        same_heads(OP, "out", out, q)?;
        heads(OP, "dout", dout, false)?;
        same_heads(OP, "dout", dout, q)?;
        for (name, g, like) in [("dq", dq, q), ("dk", dk, k), ("dv", dv, v)] {
            heads(OP, name, g, true)?;
            same_heads(OP, name, g, like)?;
        }
        for (name, t, need) in [
            ("workspace", workspace, workspace_len),
            ("scratch", scratch, scratch_len),
        ] {
            if need > 0 {
                view(OP, name, t)?;
            }
            if t.numel() < need {
                return Err(Error::SizeMismatch {
                    op: OP,
                    what: "floats (at least)",
                    a: "needed",
                    a_size: need,
                    b: name,
                    b_size: t.numel(),
                });
            }
        }
        let mut outputs = vec![
            Region::of_heads("dq", dq),
            Region::of_heads("dk", dk),
            Region::of_heads("dv", dv),
        ];
        // A backend that needs no scratch ignores the view it is given.
        if scratch_len > 0 {
            outputs.push(Region::of("scratch", scratch));
        }
        disjoint(
            OP,
            &outputs,
            &[
                Region::of_heads("q", q),
                Region::of_heads("k", k),
                Region::of_heads("v", v),
                Region::of_heads("out", out),
                Region::of_heads("dout", dout),
                Region::of("workspace", workspace),
            ],
            false,
        )?;
        Ok(dims)
    }

    /// Sizes of a validated [`super::AttentionOps::decode_attention`]: `batch`
    /// sequences of `q_len` new positions from `pos`, `heads` heads of `head_dim`.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub struct DecodeAttentionDims {
        pub batch: usize,
        pub q_len: usize,
        pub pos: usize,
        pub heads: usize,
        pub head_dim: usize,
    }

    /// The views [`super::AttentionOps::decode_attention`] works through, derived from
    /// its arguments (and checked by [`decode_attention`]).
    #[derive(Debug)]
    pub struct DecodeAttentionViews<'a, M> {
        /// `x`, `qkv`, `atty` and `out` as `[B·T, ·]` matrices.
        pub x: crate::tensor::Matrix<'a, M>,
        pub qkv: crate::tensor::Matrix<'a, M>,
        pub atty: crate::tensor::Matrix<'a, M>,
        pub out: crate::tensor::Matrix<'a, M>,
        /// The queries, keys and values of `qkv`, and `atty`, as heads `[B, T, H, D]`.
        pub q: Heads<'a, M>,
        pub k_new: Heads<'a, M>,
        pub v_new: Heads<'a, M>,
        pub atty_heads: Heads<'a, M>,
        /// Positions `pos..pos + T` of the cache's keys and values.
        pub k_rows: Heads<'a, M>,
        pub v_rows: Heads<'a, M>,
    }

    /// [`super::AttentionOps::decode_attention`]: `x`'s rows a whole number `T` per
    /// sequence of the cache, `C` splitting into the cache's heads, then the three steps
    /// as [`matmul`], [`attention_forward`] and [`matmul`] check them (errors named after
    /// those ops), and the outputs disjoint from each other and the inputs.
    /// `workspace_len` is what the backend asks for.
    #[allow(clippy::too_many_arguments)]
    pub fn decode_attention<'a, M: DeviceMemory>(
        x: &View<'a, M>,
        qkv_w: &LinearParams<'a, M>,
        qkv: &View<'a, M>,
        keys: &Heads<'a, M>,
        values: &Heads<'a, M>,
        atty: &View<'a, M>,
        workspace: &View<'a, M>,
        proj: &LinearParams<'a, M>,
        out: &View<'a, M>,
        workspace_len: impl FnOnce(super::AttentionShape) -> usize,
    ) -> Result<(DecodeAttentionDims, DecodeAttentionViews<'a, M>)> {
        const OP: &str = "decode_attention";
        view(OP, "x", x)?;
        heads(OP, "keys", keys, true)?;
        heads(OP, "values", values, true)?;
        let (n, c, b) = (x.shape.rows(), x.shape.last(), keys.batch);
        if !n.is_multiple_of(b) {
            return Err(Error::invalid(
                OP,
                format!(
                    "x has {n} rows: not the same number for each of the cache's {b} sequences"
                ),
            ));
        }
        let t = n / b;
        if keys.seq < t {
            return Err(Error::invalid(
                OP,
                format!(
                    "the cache views hold {} positions, fewer than the {t} new ones",
                    keys.seq
                ),
            ));
        }
        if keys.heads * keys.head_dim != c {
            return Err(Error::SizeMismatch {
                op: OP,
                what: "channels",
                a: "x",
                a_size: c,
                b: "keys (heads x head size)",
                b_size: keys.heads * keys.head_dim,
            });
        }
        numel(OP, "qkv", qkv, n * 3 * c)?;
        numel(OP, "atty", atty, n * c)?;
        numel(OP, "out", out, n * c)?;
        let pos = keys.seq - t;
        let shaped = |v: &View<'a, M>, w: usize| v.reshape([b, t, w]).expect("numel checked");
        let [q, k_new, v_new] =
            Heads::split_qkv(shaped(qkv, 3 * c), keys.heads).expect("C = H·D checked");
        let atty_heads = Heads::from_tensor(shaped(atty, c), keys.heads).expect("C = H·D checked");
        let views = DecodeAttentionViews {
            x: x.mat(),
            qkv: shaped(qkv, 3 * c).mat(),
            atty: shaped(atty, c).mat(),
            out: shaped(out, c).mat(),
            q,
            k_new,
            v_new,
            atty_heads,
            k_rows: Heads {
                offset: keys.offset + pos * keys.seq_stride,
                seq: t,
                ..*keys
            },
            v_rows: Heads {
                offset: values.offset + pos * values.seq_stride,
                seq: t,
                ..*values
            },
        };
        matmul(&views.x, &qkv_w.weight, Some(&qkv_w.bias), &views.qkv)?;
        let dims = attention_forward(&q, keys, values, &atty_heads, workspace, pos, workspace_len)?;
        matmul(&views.atty, &proj.weight, Some(&proj.bias), &views.out)?;
        disjoint(
            OP,
            &[
                Region::of("out", out),
                Region::of_heads("keys", keys),
                Region::of_heads("values", values),
                Region::of("qkv", qkv),
                Region::of("atty", atty),
                Region::of("workspace", workspace),
            ],
            &[
                Region::of("x", x),
                Region::of_matrix("qkv_w.weight", &qkv_w.weight),
                Region::of("qkv_w.bias", &qkv_w.bias),
                Region::of_matrix("proj.weight", &proj.weight),
                Region::of("proj.bias", &proj.bias),
            ],
            false,
        )?;
        Ok((
            DecodeAttentionDims {
                batch: b,
                q_len: t,
                pos,
                heads: dims.heads,
                head_dim: dims.head_dim,
            },
            views,
        ))
    }
}

/// Default implementations of the attention ops, from matmuls and softmaxes.
pub mod fused {
    use super::super::{HeadsOf, LinalgOps, LinearOf, Mat, SoftmaxOps, Tensor};
    use super::{check, AttentionOps, AttentionShape};
    use crate::error::Result;
    use crate::tensor::{Heads, Matrix};

    /// Floats of workspace the default attention keeps: the probabilities
    /// `[B, H, Tq, Tk]`.
    pub fn default_attention_workspace_len(s: AttentionShape) -> usize {
        s.probs_len()
    }

    /// `[H, Tq, Tk]` scores of one batch entry, at `offset` in `t`'s buffer.
    fn scores<'a, B: LinalgOps>(
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

    /// Default [`super::AttentionOps::attention_forward`]: per batch entry, `S = q·kᵀ`
    /// by a batched matmul over the heads, a causal softmax in place, then `out = P·v`.
    /// Keeps `P` in the workspace for the backward pass (`[B, H, Tq, Tk]`, which is what
    /// the fused kernels avoid).
    pub fn attention_forward<B: LinalgOps + SoftmaxOps>(
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
        let per_batch = d.shape().probs_per_batch();
        for b in 0..d.batch {
            let (s, s_mat) = scores::<B>(workspace, b * per_batch, d.heads, d.q_len, d.k_len);
            be.matmul(q.heads_of(b), k.heads_of(b).t(), None, s_mat)?;
            be.softmax(s, s, scale, Some(pos_offset))?;
            be.matmul(s_mat, v.heads_of(b), None, out.heads_of(b))?;
        }
        Ok(())
    }

    /// Default [`super::AttentionOps::attention_backward`], from the probabilities `P`
    /// the default forward left in `workspace`, per batch entry:
    ///
    /// ```text
    /// dP = dO·vᵀ     dv = Pᵀ·dO     dS = softmax_backward(P, dP)·scale
    /// dq = dS·k      dk = dSᵀ·q
    /// ```
    pub fn attention_backward<B: LinalgOps + SoftmaxOps>(
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
            default_attention_workspace_len,
            |s| s.probs_per_batch(),
        )?;
        let t = d.q_len;
        let scale = 1.0 / (d.head_dim as f32).sqrt();
        let per_batch = d.shape().probs_per_batch();
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

    /// Heads `[B, T, H, D]` as a batch of `[T, H·D]` matrices.
    fn rows_of<'a, M>(h: &Heads<'a, M>, cols: usize) -> Matrix<'a, M> {
        Matrix {
            buf: h.buf,
            offset: h.offset,
            batch: h.batch,
            rows: h.seq,
            cols,
            batch_stride: h.batch_stride,
            row_stride: h.seq_stride,
            col_stride: 1,
        }
    }

    /// Default [`AttentionOps::decode_attention`]: the QKV matmul, copies of its keys and
    /// values into the cache (one copy where the cache keeps each position's values right
    /// after its keys, as the `[k | v]` halves of one row), [`AttentionOps::attention_forward`]
    /// and the projection's matmul. The reference of the fused kernels.
    #[allow(clippy::too_many_arguments)]
    pub fn decode_attention<B: AttentionOps + LinalgOps + SoftmaxOps>(
        be: &B,
        x: Tensor<'_, B>,
        qkv_w: LinearOf<'_, B>,
        qkv: Tensor<'_, B>,
        keys: HeadsOf<'_, B>,
        values: HeadsOf<'_, B>,
        atty: Tensor<'_, B>,
        workspace: Tensor<'_, B>,
        proj: LinearOf<'_, B>,
        out: Tensor<'_, B>,
    ) -> Result<()> {
        let (d, v) = check::decode_attention(
            &x,
            &qkv_w,
            &qkv,
            &keys,
            &values,
            &atty,
            &workspace,
            &proj,
            &out,
            |s| be.attention_workspace_len(s),
        )?;
        be.matmul(v.x, qkv_w.weight, Some(qkv_w.bias), v.qkv)?;
        let c = d.heads * d.head_dim;
        let k_then_v = keys.side_by_side()
            && values.side_by_side()
            && std::ptr::eq(keys.buf, values.buf)
            && values.offset == keys.offset + c
            && (values.batch_stride, values.seq_stride) == (keys.batch_stride, keys.seq_stride);
        if k_then_v {
            be.copy(rows_of(&v.k_new, 2 * c), rows_of(&v.k_rows, 2 * c))?;
        } else {
            for (new, rows) in [(&v.k_new, &v.k_rows), (&v.v_new, &v.v_rows)] {
                if rows.side_by_side() {
                    be.copy(rows_of(new, c), rows_of(rows, c))?;
                } else {
                    // Heads apart: per sequence, its heads as a batch of [T, D] matrices.
                    for b in 0..d.batch {
                        be.copy(new.heads_of(b), rows.heads_of(b))?;
                    }
                }
            }
        }
        be.attention_forward(v.q, keys, values, v.atty_heads, workspace, d.pos)?;
        be.matmul(v.atty, proj.weight, Some(proj.bias), v.out)
    }
}
