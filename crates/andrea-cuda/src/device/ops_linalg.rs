//! matmul, linear_gelu (matmul with the GELU epilogue), matmul_gelu_backward (matmul
//! with the GELU' epilogue), bias_backward.

use andrea_core::{check, LinalgOps, Mat, Result, Tensor};

use super::buffer::addr;
use super::driver;
use super::launch::Args;
use super::CudaBackend;
use crate::plan::{self, int, long, matmul, reduce};
use crate::MatmulPrecision;

fn operand<M>(m: &andrea_core::Matrix<'_, M>) -> matmul::Operand {
    matmul::Operand {
        offset: m.offset,
        batch: m.batch,
        rows: m.rows,
        cols: m.cols,
        bs: if m.batch == 1 { 0 } else { m.batch_stride },
        rs: m.row_stride,
        cs: m.col_stride,
    }
}

/// The GELU part of a product's epilogue (kernels/matmul_epilogue.cuh), on a tensor
/// with `c`'s layout.
#[derive(Clone, Copy)]
enum Gelu<'a> {
    None,
    /// `out = GELU(c)` (linear_gelu).
    Forward(Tensor<'a, CudaBackend>),
    /// `c ⊙= GELU'(pre)` (matmul_gelu_backward).
    Backward(Tensor<'a, CudaBackend>),
}

impl Gelu<'_> {
    /// The epilogue's `gelu_mode`: 0 none, 1/2 forward, 3/4 backward (tanhf / tanh.approx).
    fn mode(self, approx_tanh: bool) -> i32 {
        let approx = i32::from(approx_tanh);
        match self {
            Gelu::None => 0,
            Gelu::Forward(_) => 1 + approx,
            Gelu::Backward(_) => 3 + approx,
        }
    }

    /// `(gelu_out, gelu_in)` for batch entry `b0` of a `c` with batch stride `bs`.
    fn ptrs(self, b0: usize, bs: usize) -> (u64, u64) {
        match self {
            Gelu::None => (0, 0),
            Gelu::Forward(t) => (addr(t.buf, t.offset + b0 * bs), 0),
            Gelu::Backward(t) => (0, addr(t.buf, t.offset + b0 * bs)),
        }
    }
}

impl CudaBackend {
    /// The kernels' `a_mode` argument: the load mode, and for the mma kernels a planted
    /// fault in bits 4.. (tests only, see [`CudaBackend::plant_mma_fault`]).
    fn a_mode_arg(&self, p: &matmul::MatmulPlan) -> i32 {
        let fault = match p.kernel {
            matmul::MatmulKernel::MmaTf32(_) | matmul::MatmulKernel::MmaBf16(_) => self.mma_fault,
            matmul::MatmulKernel::Bf16(_) => self.gemm_fault,
            _ => 0,
        };
        p.a_mode as i32 | (fault as i32) << 4
    }

    /// `c (+)= a·b (+ bias)` with `gelu`'s epilogue.
    #[allow(clippy::too_many_arguments)]
    fn matmul_launch(
        &self,
        a: Mat<'_, Self>,
        b: Mat<'_, Self>,
        bias: Option<Tensor<'_, Self>>,
        c: Mat<'_, Self>,
        accumulate: bool,
        gelu: Gelu<'_>,
        precision: MatmulPrecision,
    ) -> Result<()> {
        let (ao, bo, co) = (operand(&a), operand(&b), operand(&c));
        let p = matmul::plan(
            &ao,
            &bo,
            c.batch,
            precision,
            self.matmul_impl,
            self.mma_store,
            self.split_k,
            &self.matmul_gpu,
        )?;
        let gelu_mode = gelu.mode(self.precision.approx_tanh);
        let (a_at, b_at, ws) = self.matmul_operands(&p, c.batch, (a, &ao), (b, &bo))?;
        if let Some(s) = &p.split {
            return self.matmul_split_launch(
                &p,
                s,
                ws,
                (a_at(0), &ao),
                (b_at(0), &bo),
                bias,
                (c, &co),
                accumulate,
                gelu,
                gelu_mode,
            );
        }
        for (b0, l) in &p.launches {
            let (gelu_out, gelu_in) = gelu.ptrs(*b0, co.bs);
            self.launch(
                l,
                Args::new()
                    .ptr(a_at(b0 * ao.bs))
                    .ptr(b_at(b0 * bo.bs))
                    .ptr(bias.map(|t| addr(t.buf, t.offset)).unwrap_or(0))
                    .ptr(addr(c.buf, co.offset + b0 * co.bs))
                    .ptr(gelu_out)
                    .ptr(gelu_in)
                    .int(p.m)
                    .int(p.n)
                    .int(p.k)
                    .long(long(ao.bs))
                    .long(long(ao.rs))
                    .long(long(ao.cs))
                    .long(long(bo.bs))
                    .long(long(bo.rs))
                    .long(long(bo.cs))
                    .long(long(co.bs))
                    .long(long(co.rs))
                    .long(long(co.cs))
                    .int(self.a_mode_arg(&p))
                    .int(p.b_mode as i32)
                    .int(accumulate as i32)
                    .int(gelu_mode)
                    .int(0),
            )?;
        }
        Ok(())
    }

    /// Where the product kernel reads its operands, as functions of an element offset
    /// from the operand's first element, and the split-K workspace (0 without a split),
    /// all in one scratch request: `[A in BF16 | B in BF16 | workspace]`. The BF16 kernels
    /// (kernels/matmul_bf16.cu) read BF16 copies made here by f32_to_bf16 (the to_bf16
    /// kernel) over each operand's span, strides kept, each copy starting 16-byte aligned;
    /// the other kernels read the FP32 operands in place. The copies go once activations
    /// are stored in BF16.
    #[allow(clippy::type_complexity)]
    fn matmul_operands(
        &self,
        p: &matmul::MatmulPlan,
        batch: usize,
        (a, ao): (Mat<'_, Self>, &matmul::Operand),
        (b, bo): (Mat<'_, Self>, &matmul::Operand),
    ) -> Result<(
        impl Fn(usize) -> u64,
        impl Fn(usize) -> u64,
        driver::CuDevicePtr,
    )> {
        let bf16 = matches!(p.kernel, matmul::MatmulKernel::Bf16(_));
        let (a_span, b_span) = match bf16 {
            true => (matmul::span(ao, batch), matmul::span(bo, batch)),
            false => (0, 0),
        };
        let (a_len, b_len) = (matmul::bf16_scratch(a_span), matmul::bf16_scratch(b_span));
        let ws_len = p.split.map_or(0, |s| s.workspace);
        let base = match a_len + b_len + ws_len {
            0 => 0,
            len => self.scratch(len)?,
        };
        let (a_copy, b_copy) = (base, base + 4 * a_len as u64);
        if bf16 {
            self.convert(
                "matmul",
                "f32_to_bf16",
                addr(a.buf, ao.offset),
                a_copy,
                a_span,
            )?;
            self.convert(
                "matmul",
                "f32_to_bf16",
                addr(b.buf, bo.offset),
                b_copy,
                b_span,
            )?;
        }
        let at = move |buf: u64, copy: u64, offset: usize| {
            move |rel: usize| match bf16 {
                true => copy + 2 * rel as u64,
                false => buf + 4 * (offset + rel) as u64,
            }
        };
        Ok((
            at(addr(a.buf, 0), a_copy, ao.offset),
            at(addr(b.buf, 0), b_copy, bo.offset),
            base + 4 * (a_len + b_len) as u64,
        ))
    }

    /// Split-K: the product kernel over each K slice (grid z) into the workspace `ws`,
    /// then the reduce summing the slices in order into `c` with the epilogue. Only
    /// planned for a single batch entry; `a` and `b` are the operands' device addresses.
    #[allow(clippy::too_many_arguments)]
    fn matmul_split_launch(
        &self,
        p: &matmul::MatmulPlan,
        s: &matmul::Split,
        ws: driver::CuDevicePtr,
        (a, ao): (u64, &matmul::Operand),
        (b, bo): (u64, &matmul::Operand),
        bias: Option<Tensor<'_, Self>>,
        (c, co): (Mat<'_, Self>, &matmul::Operand),
        accumulate: bool,
        gelu: Gelu<'_>,
        gelu_mode: i32,
    ) -> Result<()> {
        let (gelu_out, gelu_in) = gelu.ptrs(0, 0);
        let ks = s.k_slice as usize;
        let (m, n) = (co.rows, co.cols);
        for (_, l) in &p.launches {
            self.launch(
                l,
                Args::new()
                    .ptr(a)
                    .ptr(b)
                    .ptr(0)
                    .ptr(ws)
                    .ptr(0)
                    .ptr(0)
                    .int(p.m)
                    .int(p.n)
                    .int(p.k)
                    .long(long(ks * ao.cs))
                    .long(long(ao.rs))
                    .long(long(ao.cs))
                    .long(long(ks * bo.rs))
                    .long(long(bo.rs))
                    .long(long(bo.cs))
                    .long(long(m * n))
                    .long(long(n))
                    .long(1)
                    .int(self.a_mode_arg(p))
                    .int(p.b_mode as i32)
                    .int(0)
                    .int(0)
                    .int(s.k_slice),
            )?;
        }
        self.launch(
            &s.reduce,
            Args::new()
                .ptr(ws)
                .int(plan::int(
                    "matmul",
                    "slices",
                    s.slices - usize::from(self.split_k_fault),
                )?)
                .int(p.m)
                .int(p.n)
                .ptr(bias.map(|t| addr(t.buf, t.offset)).unwrap_or(0))
                .ptr(addr(c.buf, co.offset))
                .ptr(gelu_out)
                .ptr(gelu_in)
                .long(long(co.rs))
                .long(long(co.cs))
                .int(accumulate as i32)
                .int(gelu_mode),
        )
    }

    /// `matmul` and `matmul_add`: `c (+)= a·b (+ bias)`.
    fn op_matmul(
        &self,
        a: Mat<'_, Self>,
        b: Mat<'_, Self>,
        bias: Option<Tensor<'_, Self>>,
        c: Mat<'_, Self>,
        accumulate: bool,
    ) -> Result<()> {
        check::matmul(&a, &b, bias.as_ref(), &c)?;
        self.matmul_launch(a, b, bias, c, accumulate, Gelu::None, self.precision.matmul)
    }

    /// `out[j] += Σ_c partial[c·stride + j]` (bias.cu's column_finish).
    pub(super) fn column_finish(
        &self,
        p: &reduce::ColumnSums,
        partial: u64,
        cols: usize,
        stride: usize,
        out: u64,
    ) -> Result<()> {
        const OP: &str = "column_finish";
        self.launch(
            &p.finish,
            Args::new()
                .ptr(partial)
                .int(plan::int(OP, "chunks", p.chunks)?)
                .int(plan::int(OP, "columns", cols)?)
                .long(long(stride))
                .ptr(out),
        )
    }
}

impl LinalgOps for CudaBackend {
    fn matmul(
        &self,
        a: Mat<'_, Self>,
        b: Mat<'_, Self>,
        bias: Option<Tensor<'_, Self>>,
        c: Mat<'_, Self>,
    ) -> Result<()> {
        self.op_matmul(a, b, bias, c, false)
    }

    fn matmul_add(
        &self,
        a: Mat<'_, Self>,
        b: Mat<'_, Self>,
        bias: Option<Tensor<'_, Self>>,
        c: Mat<'_, Self>,
    ) -> Result<()> {
        self.op_matmul(a, b, bias, c, true)
    }

    /// The scratch the plan gives this product: the split-K workspace (0 when it does not
    /// split) and, for the BF16 kernels, the operands' BF16 copies.
    fn matmul_scratch_len(&self, m: usize, k: usize, n: usize) -> usize {
        let kernel = matmul::choose(
            m,
            n,
            k,
            1,
            self.precision.matmul,
            self.matmul_impl,
            &self.matmul_gpu,
        );
        let copies = match kernel {
            matmul::MatmulKernel::Bf16(_) => {
                matmul::bf16_scratch(m * k) + matmul::bf16_scratch(k * n)
            }
            _ => 0,
        };
        copies
            + match matmul::split_of(m, n, k, 1, kernel, self.split_k, &self.matmul_gpu) {
                Ok(Some(s)) => s.workspace,
                _ => 0,
            }
    }

    fn bias_backward(&self, dout: Tensor<'_, Self>, dbias: Tensor<'_, Self>) -> Result<()> {
        const OP: &str = "bias_backward";
        let d = check::bias_backward(&dout, &dbias)?;
        let (n, m) = (d.rows, d.cols);
        let p = reduce::column_sums(OP, "column_partials", n, m)?;
        let scratch = self.scratch(p.scratch_len(m, 1))?;
        self.launch(
            &p.partials,
            Args::new()
                .ptr(addr(dout.buf, dout.offset))
                .int(int(OP, "rows", n)?)
                .int(int(OP, "columns", m)?)
                .int(int(OP, "rows per chunk", p.rows_per_chunk)?)
                .ptr(scratch),
        )?;
        self.column_finish(&p, scratch, m, m, addr(dbias.buf, dbias.offset))
    }

    fn linear_gelu(
        &self,
        x: Mat<'_, Self>,
        w: Mat<'_, Self>,
        bias: Tensor<'_, Self>,
        pre: Tensor<'_, Self>,
        out: Tensor<'_, Self>,
    ) -> Result<()> {
        check::linear_gelu(&x, &w, &bias, &pre, &out)?;
        self.matmul_launch(
            x,
            w,
            Some(bias),
            pre.mat(),
            false,
            Gelu::Forward(out),
            self.precision.matmul,
        )
    }

    /// The product with the GELU' epilogue (kernels/matmul_epilogue.cuh, modes 3/4): no
    /// separate gelu_backward pass. Split-K products apply it once in the reduce. The
    /// bias gradient of the first linear stays a separate deterministic `bias_backward`
    /// (kernels/matmul_epilogue.cuh says why it is not fused).
    fn matmul_gelu_backward(
        &self,
        dy: Mat<'_, Self>,
        w: Mat<'_, Self>,
        pre: Tensor<'_, Self>,
        dpre: Tensor<'_, Self>,
    ) -> Result<()> {
        check::matmul_gelu_backward(&dy, &w, &pre, &dpre)?;
        let gelu = match (self.unfused_gelu_backward, self.gelu_backward_fault) {
            (true, _) => Gelu::None,
            (false, false) => Gelu::Backward(pre),
            (false, true) => Gelu::Backward(andrea_core::View {
                offset: pre.offset + 1,
                ..pre
            }),
        };
        self.matmul_launch(dy, w, None, dpre.mat(), false, gelu, self.precision.matmul)?;
        if self.unfused_gelu_backward {
            andrea_core::ElementwiseOps::gelu_backward(self, pre, dpre, dpre)?;
        }
        Ok(())
    }
}
