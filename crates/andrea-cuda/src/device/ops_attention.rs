//! Fused causal attention: forward (online softmax, keeps only the row log-sum-exps)
//! and backward (recomputes the probabilities; no scratch).

use andrea_core::{check, AttentionOps, AttentionShape, HeadsOf, Result, Tensor};

use super::buffer::{addr, ptr};
use super::launch::Args;
use super::CudaBackend;
use crate::plan::{attention, int, long};

/// Base address and `(batch, seq)` strides of a heads view.
fn heads(h: &HeadsOf<'_, CudaBackend>) -> (u64, i64, i64) {
    (
        addr(h.buf, h.offset),
        long(h.batch_stride),
        long(h.seq_stride),
    )
}

impl AttentionOps for CudaBackend {
    /// The row log-sum-exps, [`AttentionShape::lse_len`].
    fn attention_workspace_len(&self, s: AttentionShape) -> usize {
        s.lse_len()
    }

    fn attention_backward_scratch_len(&self, _: AttentionShape) -> usize {
        0
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
        let l = attention::forward(&d)?;
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
        self.launch(
            &l,
            args.int(int(OP, "position offset", pos_offset)?)
                .float(scale),
        )
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
            |_| 0,
        )?;
        let (dq_l, dkdv_l) = attention::backward(&d)?;
        let scale = 1.0 / (d.head_dim as f32).sqrt();
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
