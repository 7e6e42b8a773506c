//! LayerNorm, its residual-fused form and its backward (`kernels/layernorm.cu`,
//! `kernels/norm.cu`).

use andrea_core::{check, LayerNormOps, Result, Tensor};

use super::buffer::ptr;
use super::launch::Args;
use super::CudaBackend;
use crate::plan::{int, reduce, rows};

impl LayerNormOps for CudaBackend {
    fn layernorm(
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
        let d = check::layernorm(&x, &gamma, &beta, &out, &mean, &rstd, eps)?;
        let (n, c) = (d.rows, d.channels);
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
    ) -> Result<()> {
        const OP: &str = "layernorm_backward";
        let d = check::layernorm_backward(&x, &gamma, &mean, &rstd, &dout, &dx, &dgamma, &dbeta)?;
        let (n, c) = (d.rows, d.channels);
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
        const OP: &str = "residual_layernorm";
        let d =
            check::residual_layernorm(&a, &b, &residual, &gamma, &beta, &out, &mean, &rstd, eps)?;
        let (n, c) = (d.rows, d.channels);
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
}
