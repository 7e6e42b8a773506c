//! Fused causal attention: forward (online softmax, keeps only the row log-sum-exps)
//! and backward (recomputes the probabilities), on the SIMT kernels (kernels/attention.cu)
//! or the tensor-core ones (kernels/attention_mma.cu), as
//! [`crate::plan::attention::AttentionKernels`] and the precision decide; generation's
//! few-row forwards on the split-KV kernels (kernels/attention_decode.cu) where
//! [`crate::plan::decode::decode`] says so and [`crate::DecodeAttention`] allows.

use andrea_core::{check, AttentionOps, AttentionShape, HeadsOf, Result, Tensor};

use super::buffer::{addr, ptr};
use super::launch::Args;
use super::CudaBackend;
use crate::plan::attention::MmaOperands;
use crate::plan::decode::{self, DecodeAttention, DecodePlan};
use crate::plan::{attention, int, long};

impl CudaBackend {
    /// The tensor-core operands attention runs with, or `None` for the SIMT kernels.
    fn attention_mma(&self) -> Option<MmaOperands> {
        self.attention_kernels().operands(self.precision().matmul)
    }
}

/// Whether every view's rows start 16-byte aligned (the kernels' 16-byte cp.async).
fn vectorized(views: &[&HeadsOf<'_, CudaBackend>]) -> i32 {
    let v: Vec<usize> = views
        .iter()
        .flat_map(|h| [h.offset, h.batch_stride, h.seq_stride, h.head_dim])
        .collect();
    attention::mma_vectorized(&v) as i32
}

/// The kernels index a position's heads side by side (`h·D` from the position's start):
/// a view whose heads lie apart (`Heads::head_stride` other than `D`) is refused by name.
/// This backend's KV caches keep the default layout (`AttentionOps::kv_heads_apart`).
fn side_by_side(
    op: &'static str,
    views: &[(&'static str, &HeadsOf<'_, CudaBackend>)],
) -> Result<()> {
    match views.iter().find(|(_, h)| !h.side_by_side()) {
        None => Ok(()),
        Some((name, h)) => Err(andrea_core::Error::invalid(
            op,
            format!(
                "{name}: heads {} apart (head size {}); the CUDA kernels take each position's \
                 heads side by side (head stride = head size): lay the view out that way",
                h.head_stride, h.head_dim
            ),
        )),
    }
}

/// Base address and `(batch, seq)` strides of a heads view.
fn heads(h: &HeadsOf<'_, CudaBackend>) -> (u64, i64, i64) {
    (
        addr(h.buf, h.offset),
        long(h.batch_stride),
        long(h.seq_stride),
    )
}

impl CudaBackend {
    /// The split-KV forward: partials per key chunk into the workspace after the lse,
    /// then the combine into `out` and the lse (kernels/attention_decode.cu).
    fn attention_decode(
        &self,
        p: &DecodePlan,
        [q, k, v, out]: [&HeadsOf<'_, Self>; 4],
        workspace: &Tensor<'_, Self>,
        pos_offset: usize,
    ) -> Result<()> {
        const OP: &str = "attention_forward";
        let ws = ptr(workspace);
        let (ml, po) = (ws + 4 * p.ml_offset as u64, ws + 4 * p.o_offset as u64);
        let (h, tq) = (int(OP, "heads", q.heads)?, int(OP, "queries", q.seq)?);
        let hd = int(OP, "head_dim", q.head_dim)?;
        let fault = self.decode_fault as i32;
        let mut a = Args::new();
        for x in [q, k, v] {
            a = a.ptr(heads(x).0);
        }
        a = a
            .ptr(ml)
            .ptr(po)
            .int(h)
            .int(tq)
            .int(int(OP, "keys", k.seq)?)
            .int(hd);
        for x in [q, k, v] {
            let (_, bs, ss) = heads(x);
            a = a.long(bs).long(ss);
        }
        a = a
            .int(int(OP, "position offset", pos_offset)?)
            .float(1.0 / (q.head_dim as f32).sqrt())
            .int(int(OP, "keys per chunk", p.chunk)?)
            .int(int(OP, "chunks", p.chunks)?)
            .int(fault);
        self.launch(&p.split, a)?;
        let (_, o_bs, o_ss) = heads(out);
        let rows = q.batch * q.heads * q.seq;
        let a = Args::new()
            .ptr(ml)
            .ptr(po)
            .ptr(heads(out).0)
            .ptr(ws)
            .int(h)
            .int(tq)
            .int(hd)
            .int(int(OP, "chunks", p.chunks)?)
            .long(o_bs)
            .long(o_ss)
            .int(int(OP, "query rows", rows)?)
            .int(fault);
        self.launch(&p.combine, a)
    }
}

impl AttentionOps for CudaBackend {
    /// The row log-sum-exps, [`AttentionShape::lse_len`], then for the few-row shapes of
    /// generation the split-KV partials ([`decode::workspace_len`]; counted whether or not
    /// the split is switched on, so switching never changes buffer sizes).
    fn attention_workspace_len(&self, s: AttentionShape) -> usize {
        decode::workspace_len(s, self.sms)
    }

    /// One float per query row (`D_t = dO_t·O_t` of the tensor-core backward; the same
    /// for the SIMT kernels, so that switching kernels never changes buffer sizes).
    fn attention_backward_scratch_len(&self, s: AttentionShape) -> usize {
        s.lse_len()
    }

    fn attention_forward(
        &self,
        q: HeadsOf<'_, Self>,
        k: HeadsOf<'_, Self>,
        v: HeadsOf<'_, Self>,
        out: HeadsOf<'_, Self>,
        workspace: Tensor<'_, Self>,
        pos_offset: usize,
    ) -> Result<()> {
        const OP: &str = "attention_forward";
        let d = check::attention_forward(&q, &k, &v, &out, &workspace, pos_offset, |s| {
            self.attention_workspace_len(s)
        })?;
        side_by_side(OP, &[("q", &q), ("k", &k), ("v", &v), ("out", &out)])?;
        if self.decode == DecodeAttention::Split {
            if let Some(p) = decode::decode(&d, self.sms)? {
                return self.attention_decode(&p, [&q, &k, &v, &out], &workspace, pos_offset);
            }
        }
        let mma = match self.attention_mma() {
            Some(ops) => attention::mma_forward(&d, ops)?,
            None => None,
        };
        let l = match mma {
            Some(l) => l,
            None => attention::forward(&d)?,
        };
        let mut args = Args::new();
        for h in [&q, &k, &v, &out] {
            args = args.ptr(heads(h).0);
        }
        args = args
            .ptr(ptr(&workspace))
            .int(int(OP, "heads", d.heads)?)
            .int(int(OP, "queries", d.q_len)?)
            .int(int(OP, "keys", d.k_len)?)
            .int(int(OP, "head_dim", d.head_dim)?);
        for h in [&q, &k, &v, &out] {
            let (_, bs, ss) = heads(h);
            args = args.long(bs).long(ss);
        }
        let scale = 1.0 / (d.head_dim as f32).sqrt();
        let fault = (mma.is_some() && self.attention_fault) as usize;
        args = args
            .int(int(OP, "position offset", pos_offset + fault)?)
            .float(scale);
        if mma.is_some() {
            args = args.int(vectorized(&[&q, &k, &v]));
        }
        self.launch(&l, args)
    }

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
        const OP: &str = "attention_backward";
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
            |s| self.attention_workspace_len(s),
            |s| self.attention_backward_scratch_len(s),
        )?;
        let views = [
            ("q", &q),
            ("k", &k),
            ("v", &v),
            ("out", &out),
            ("dout", &dout),
        ];
        side_by_side(OP, &views)?;
        side_by_side(OP, &[("dq", &dq), ("dk", &dk), ("dv", &dv)])?;
        let scale = 1.0 / (d.head_dim as f32).sqrt();
        if let Some(ops) = self.attention_mma() {
            if let Some([dot, dkdv, dqk]) = attention::mma_backward(&d, ops)? {
                let hd = int(OP, "head_dim", d.head_dim)?;
                let (h, t) = (int(OP, "heads", d.heads)?, int(OP, "positions", d.q_len)?);
                let vec = vectorized(&[&q, &k, &v, &dout]);
                let (_, o_bs, o_ss) = heads(&out);
                let (_, do_bs, do_ss) = heads(&dout);
                let a = Args::new()
                    .ptr(heads(&out).0)
                    .ptr(heads(&dout).0)
                    .ptr(ptr(&scratch))
                    .int(h)
                    .int(t)
                    .int(hd)
                    .long(o_bs)
                    .long(o_ss)
                    .long(do_bs)
                    .long(do_ss);
                self.launch(&dot, a)?;
                // (q, k, v, dout, lse, dt, outputs.., H, T, strides of q, k, v, dout,
                // outputs.., scale, vec).
                let inputs = [&q, &k, &v, &dout];
                for (l, outs) in [(dkdv, vec![&dk, &dv]), (dqk, vec![&dq])] {
                    let mut a = Args::new();
                    for x in inputs {
                        a = a.ptr(heads(x).0);
                    }
                    a = a.ptr(ptr(&workspace)).ptr(ptr(&scratch));
                    for x in &outs {
                        a = a.ptr(heads(x).0);
                    }
                    a = a.int(h).int(t);
                    for x in inputs.into_iter().chain(outs) {
                        let (_, bs, ss) = heads(x);
                        a = a.long(bs).long(ss);
                    }
                    self.launch(&l, a.float(scale).int(vec))?;
                }
                return Ok(());
            }
        }
        let (dq_l, dkdv_l) = attention::backward(&d)?;
        let sizes = |a: Args| -> Result<Args> {
            Ok(a.int(int(OP, "heads", d.heads)?)
                .int(int(OP, "positions", d.q_len)?)
                .int(int(OP, "head_dim", d.head_dim)?))
        };
        let inputs = [&q, &k, &v, &out, &dout];

        let mut a = Args::new();
        for h in inputs {
            a = a.ptr(heads(h).0);
        }
        a = sizes(a.ptr(ptr(&workspace)).ptr(heads(&dq).0))?;
        for h in inputs.into_iter().chain([&dq]) {
            let (_, bs, ss) = heads(h);
            a = a.long(bs).long(ss);
        }
        self.launch(&dq_l, a.float(scale))?;

        let mut a = Args::new();
        for h in inputs {
            a = a.ptr(heads(h).0);
        }
        a = sizes(a.ptr(ptr(&workspace)).ptr(heads(&dk).0).ptr(heads(&dv).0))?;
        for h in inputs.into_iter().chain([&dk, &dv]) {
            let (_, bs, ss) = heads(h);
            a = a.long(bs).long(ss);
        }
        self.launch(&dkdv_l, a.float(scale))
    }
}

/// Generation's decoder stack: the default, every block as its four ops (the fused
/// halves above, and the residual LayerNorms).
impl andrea_core::DecodeOps for CudaBackend {}
