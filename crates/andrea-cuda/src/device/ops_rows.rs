//! Row ops: LayerNorm (and its residual-fused form and backward), softmax and its
//! backward, the fused softmax-cross-entropy.

use andrea_core::check::{self, Region};
use andrea_core::{Ids, Result, Tensor};

use super::buffer::{addr, ptr};
use super::launch::Args;
use super::CudaBackend;
use crate::plan::{int, reduce, rows};

impl CudaBackend {
    pub(super) fn op_layernorm(
        &self,
        x: Tensor<'_, Self>,
        gamma: Tensor<'_, Self>,
        beta: Tensor<'_, Self>,
        out: Tensor<'_, Self>,
        mean: Tensor<'_, Self>,
        rstd: Tensor<'_, Self>,
        eps: f32,
    ) -> Result<()> {
        const OP: &str = "layernorm";
        let (n, c) = check::layernorm(&x, &gamma, &beta, &out, &mean, &rstd, eps)?;
        let offsets = [x.offset, gamma.offset, beta.offset, out.offset];
        let l = rows::layernorm(
            OP,
            "layernorm_forward_v1",
            "layernorm_forward_v4",
            n,
            c,
            &offsets,
        )?;
        self.launch(
            &l,
            Args::new()
                .ptr(ptr(&x))
                .ptr(ptr(&gamma))
                .ptr(ptr(&beta))
                .ptr(ptr(&out))
                .ptr(ptr(&mean))
                .ptr(ptr(&rstd))
                .int(int(OP, "rows", n)?)
                .int(int(OP, "channels", c)?)
                .float(eps),
        )
    }

    pub(super) fn op_residual_layernorm(
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
        const OP: &str = "residual_layernorm";
        check::elementwise(OP, &[("a", &a), ("b", &b)], ("residual", &residual), true)?;
        let (n, c) = check::layernorm(&residual, &gamma, &beta, &out, &mean, &rstd, eps)?;
        check::disjoint(
            OP,
            &[
                Region::of("out", &out),
                Region::of("mean", &mean),
                Region::of("rstd", &rstd),
            ],
            &[Region::of("a", &a), Region::of("b", &b)],
            false,
        )?;
        let offsets = [
            a.offset,
            b.offset,
            residual.offset,
            gamma.offset,
            beta.offset,
            out.offset,
        ];
        let l = rows::layernorm(
            OP,
            "residual_layernorm_forward_v1",
            "residual_layernorm_forward_v4",
            n,
            c,
            &offsets,
        )?;
        self.launch(
            &l,
            Args::new()
                .ptr(ptr(&a))
                .ptr(ptr(&b))
                .ptr(ptr(&residual))
                .ptr(ptr(&gamma))
                .ptr(ptr(&beta))
                .ptr(ptr(&out))
                .ptr(ptr(&mean))
                .ptr(ptr(&rstd))
                .int(int(OP, "rows", n)?)
                .int(int(OP, "channels", c)?)
                .float(eps),
        )
    }

    pub(super) fn op_layernorm_backward(
        &self,
        x: Tensor<'_, Self>,
        gamma: Tensor<'_, Self>,
        mean: Tensor<'_, Self>,
        rstd: Tensor<'_, Self>,
        dout: Tensor<'_, Self>,
        dx: Tensor<'_, Self>,
        dgamma: Tensor<'_, Self>,
        dbeta: Tensor<'_, Self>,
    ) -> Result<()> {
        const OP: &str = "layernorm_backward";
        let (n, c) =
            check::layernorm_backward(&x, &gamma, &mean, &rstd, &dout, &dx, &dgamma, &dbeta)?;
        let (rows_i, c_i) = (int(OP, "rows", n)?, int(OP, "channels", c)?);
        let offsets = [x.offset, gamma.offset, dout.offset, dx.offset];
        let l = rows::layernorm(
            OP,
            "layernorm_backward_dx_v1",
            "layernorm_backward_dx_v4",
            n,
            c,
            &offsets,
        )?;
        self.launch(
            &l,
            Args::new()
                .ptr(ptr(&x))
                .ptr(ptr(&gamma))
                .ptr(ptr(&mean))
                .ptr(ptr(&rstd))
                .ptr(ptr(&dout))
                .ptr(ptr(&dx))
                .int(rows_i)
                .int(c_i),
        )?;
        // dγ and dβ: per-chunk column sums interleaved as [chunk][γ | β][C], then summed
        // in chunk order.
        let p = reduce::column_sums(OP, "layernorm_param_partials", n, c)?;
        let scratch = self.scratch(p.scratch_len(c, 2))?;
        self.launch(
            &p.partials,
            Args::new()
                .ptr(ptr(&x))
                .ptr(ptr(&mean))
                .ptr(ptr(&rstd))
                .ptr(ptr(&dout))
                .int(rows_i)
                .int(c_i)
                .int(int(OP, "rows per chunk", p.rows_per_chunk)?)
                .ptr(scratch),
        )?;
        self.column_finish(&p, scratch, c, 2 * c, ptr(&dgamma))?;
        self.column_finish(&p, scratch + 4 * c as u64, c, 2 * c, ptr(&dbeta))
    }

    pub(super) fn op_softmax(
        &self,
        x: Tensor<'_, Self>,
        out: Tensor<'_, Self>,
        scale: f32,
        causal_offset: Option<usize>,
    ) -> Result<()> {
        const OP: &str = "softmax";
        let d = check::softmax(&x, &out, scale, causal_offset)?;
        let l = rows::warp_per_row(OP, "softmax_forward", d.rows)?;
        self.launch(
            &l,
            Args::new()
                .ptr(ptr(&x))
                .ptr(ptr(&out))
                .int(int(OP, "rows", d.rows)?)
                .int(int(OP, "queries", d.q_len)?)
                .int(int(OP, "keys", d.k_len)?)
                .float(scale)
                .int(causal_offset.is_some() as i32)
                .int(int(OP, "causal offset", causal_offset.unwrap_or(0))?),
        )
    }

    pub(super) fn op_softmax_backward(
        &self,
        probs: Tensor<'_, Self>,
        dprobs: Tensor<'_, Self>,
        dx: Tensor<'_, Self>,
        scale: f32,
    ) -> Result<()> {
        const OP: &str = "softmax_backward";
        let (n, k) = check::softmax_backward(&probs, &dprobs, &dx)?;
        let l = rows::warp_per_row(OP, "softmax_backward", n)?;
        self.launch(
            &l,
            Args::new()
                .ptr(ptr(&probs))
                .ptr(ptr(&dprobs))
                .ptr(ptr(&dx))
                .int(int(OP, "rows", n)?)
                .int(int(OP, "columns", k)?)
                .float(scale),
        )
    }

    pub(super) fn op_softmax_cross_entropy(
        &self,
        logits: Tensor<'_, Self>,
        targets: Ids<'_, Self>,
        vocab: usize,
        losses: Tensor<'_, Self>,
        dlogits: Option<Tensor<'_, Self>>,
        grad_scale: f32,
    ) -> Result<()> {
        const OP: &str = "softmax_cross_entropy";
        let (n, vp) =
            check::softmax_cross_entropy(&logits, &targets, vocab, &losses, dlogits.as_ref())?;
        check::target_values(OP, &targets.buf.host.borrow()[targets.range()], vocab)?;
        let l = rows::cross_entropy(n)?;
        self.launch(
            &l,
            Args::new()
                .ptr(ptr(&logits))
                .ptr(addr(targets.buf, targets.offset))
                .ptr(ptr(&losses))
                .ptr(dlogits.map(|d| ptr(&d)).unwrap_or(0))
                .int(int(OP, "vocab", vocab)?)
                .int(int(OP, "padded vocab", vp)?)
                .float(grad_scale),
        )
    }
}
