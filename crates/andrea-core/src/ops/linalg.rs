//! Linear algebra: the strided batched matmul (overwriting or accumulating), the bias
//! gradient, the fused matmul + GELU of the MLP's first half, the fused matmul +
//! GELU backward that gives its gradient, and the whole MLP forward of generation.

use std::fmt;

use super::{ElementwiseOps, Mat, MemoryOps, Tensor};
use crate::error::Result;
use crate::tensor::{Matrix, View};

/// A linear layer's parameters as an op reads them: `y = x·weight + bias`, `weight:
/// [K, N]` (any strides), `bias: [N]`.
pub struct LinearParams<'a, M> {
    pub weight: Matrix<'a, M>,
    pub bias: View<'a, M>,
}

impl<M> Clone for LinearParams<'_, M> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<M> Copy for LinearParams<'_, M> {}

impl<M> fmt::Debug for LinearParams<'_, M> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "LinearParams {{ weight: {:?}, bias: {:?} }}",
            self.weight, self.bias
        )
    }
}

/// [`LinearParams`] in backend `B`'s memory.
pub type LinearOf<'a, B> = LinearParams<'a, <B as MemoryOps>::Buffer>;

/// Matrix products.
pub trait LinalgOps: MemoryOps {
    /// `c[b] = a[b] · b[b] (+ bias)` for `a[b]: [M, K]`, `b[b]: [K, N]`, `c[b]: [M, N]`,
    /// `bias: [N]` added to every row. Any strides: a transposed operand is
    /// [`crate::Matrix::t`], never a copy. `a` and `b` have batch 1 (broadcast) or `c`'s
    /// batch.
    fn matmul(
        &self,
        a: Mat<'_, Self>,
        b: Mat<'_, Self>,
        bias: Option<Tensor<'_, Self>>,
        c: Mat<'_, Self>,
    ) -> Result<()>;

    /// [`LinalgOps::matmul`] that adds into `c` instead of overwriting it:
    /// `c[b] += a[b] · b[b] (+ bias)` (weight gradients, gradient accumulation).
    fn matmul_add(
        &self,
        a: Mat<'_, Self>,
        b: Mat<'_, Self>,
        bias: Option<Tensor<'_, Self>>,
        c: Mat<'_, Self>,
    ) -> Result<()>;

    /// Floats of backend-owned scratch a `[M, K]·[K, N]` product (batch 1) uses besides
    /// its operands, e.g. a split-K workspace; the backend allocates it on first use and
    /// reuses it, so a memory plan counts the largest. Default 0.
    fn matmul_scratch_len(&self, m: usize, k: usize, n: usize) -> usize {
        let _ = (m, k, n);
        0
    }

    /// Column sums `dbias[j] += Σ_i dout[i, j]` of `dout: [N, M]` into `dbias: [M]`.
    fn bias_backward(&self, dout: Tensor<'_, Self>, dbias: Tensor<'_, Self>) -> Result<()>;

    /// Fused: `pre = x · w + bias`, `out = GELU(pre)` (the MLP's first half). `pre` is
    /// kept for the backward pass. Default: [`fused::linear_gelu`].
    fn linear_gelu(
        &self,
        x: Mat<'_, Self>,
        w: Mat<'_, Self>,
        bias: Tensor<'_, Self>,
        pre: Tensor<'_, Self>,
        out: Tensor<'_, Self>,
    ) -> Result<()>
    where
        Self: ElementwiseOps,
    {
        fused::linear_gelu(self, x, w, bias, pre, out)
    }

    /// Fused: `dpre = (dy · w) ⊙ GELU'(pre)` for `dy: [N, K]`, `w: [K, M]` (any strides),
    /// `pre, dpre: [N, M]` contiguous views: the MLP's backward from `dy = ∂L/∂y` of its
    /// second linear (`w` = that linear's weight transposed) through the GELU to
    /// `dpre = ∂L/∂pre`, `pre` being what [`LinalgOps::linear_gelu`] kept. GELU' is the
    /// derivative of the same tanh form as [`ElementwiseOps::gelu_backward`]. `dpre` is
    /// overwritten (an activation gradient) and disjoint from every input. Default:
    /// [`fused::matmul_gelu_backward`].
    fn matmul_gelu_backward(
        &self,
        dy: Mat<'_, Self>,
        w: Mat<'_, Self>,
        pre: Tensor<'_, Self>,
        dpre: Tensor<'_, Self>,
    ) -> Result<()>
    where
        Self: ElementwiseOps,
    {
        fused::matmul_gelu_backward(self, dy, w, pre, dpre)
    }

    /// Fused: the whole MLP of a block, `out = GELU(x·fc.weight + fc.bias)·proj.weight +
    /// proj.bias`, for `x, out: [N, C]` and a hidden width `M` (`fc.weight: [C, M]`,
    /// `proj.weight: [M, C]`): generation, where nothing is kept for a backward pass.
    /// `pre` and `act` (`[N, M]`) are scratch whose contents afterwards are unspecified
    /// (the default leaves `x·fc.weight + fc.bias` and its GELU there; a fused kernel may
    /// not write them). `out` is disjoint from every other argument. Default:
    /// [`fused::mlp_forward`].
    fn mlp_forward(
        &self,
        x: Tensor<'_, Self>,
        fc: LinearOf<'_, Self>,
        pre: Tensor<'_, Self>,
        act: Tensor<'_, Self>,
        proj: LinearOf<'_, Self>,
        out: Tensor<'_, Self>,
    ) -> Result<()>
    where
        Self: ElementwiseOps,
    {
        fused::mlp_forward(self, x, fc, pre, act, proj, out)
    }
}

/// Argument checks of the linear-algebra ops.
pub mod check {
    use crate::check::{disjoint, elementwise, matrix, numel, output_matrix, view, Region};
    use crate::error::{Error, Result};
    use crate::tensor::{DeviceMemory, Matrix, View};

    /// Sizes of a validated matmul.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub struct MatmulDims {
        pub batch: usize,
        pub m: usize,
        pub k: usize,
        pub n: usize,
    }

    /// [`super::LinalgOps::matmul`] and [`super::LinalgOps::matmul_add`].
    pub fn matmul<M: DeviceMemory>(
        a: &Matrix<'_, M>,
        b: &Matrix<'_, M>,
        bias: Option<&View<'_, M>>,
        c: &Matrix<'_, M>,
    ) -> Result<MatmulDims> {
        const OP: &str = "matmul";
        matrix(OP, "a", a)?;
        matrix(OP, "b", b)?;
        output_matrix(OP, "c", c)?;
        if a.cols != b.rows {
            return Err(Error::SizeMismatch {
                op: OP,
                what: "inner dimension",
                a: "a (columns)",
                a_size: a.cols,
                b: "b (rows)",
                b_size: b.rows,
            });
        }
        if c.rows != a.rows {
            return Err(Error::SizeMismatch {
                op: OP,
                what: "rows",
                a: "c",
                a_size: c.rows,
                b: "a",
                b_size: a.rows,
            });
        }
        if c.cols != b.cols {
            return Err(Error::SizeMismatch {
                op: OP,
                what: "columns",
                a: "c",
                a_size: c.cols,
                b: "b",
                b_size: b.cols,
            });
        }
        for (name, x) in [("a", a), ("b", b)] {
            if x.batch != 1 && x.batch != c.batch {
                return Err(Error::SizeMismatch {
                    op: OP,
                    what: "batch (1 or equal to c's)",
                    a: name,
                    a_size: x.batch,
                    b: "c",
                    b_size: c.batch,
                });
            }
        }
        let (a_region, b_region) = (Region::of_matrix("a", a), Region::of_matrix("b", b));
        let inputs = match bias {
            Some(bias) => {
                numel(OP, "bias", bias, c.cols)?;
                &[a_region, b_region, Region::of("bias", bias)][..]
            }
            None => &[a_region, b_region][..],
        };
        disjoint(OP, &[Region::of_matrix("c", c)], inputs, false)?;
        Ok(MatmulDims {
            batch: c.batch,
            m: c.rows,
            k: a.cols,
            n: c.cols,
        })
    }

    /// Sizes of a validated bias gradient: `dout: [rows, cols]`, `dbias: [cols]`.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub struct BiasDims {
        pub rows: usize,
        pub cols: usize,
    }

    /// [`super::LinalgOps::bias_backward`].
    pub fn bias_backward<M: DeviceMemory>(
        dout: &View<'_, M>,
        dbias: &View<'_, M>,
    ) -> Result<BiasDims> {
        const OP: &str = "bias_backward";
        view(OP, "dout", dout)?;
        let m = dout.shape.last();
        numel(OP, "dbias", dbias, m)?;
        disjoint(
            OP,
            &[Region::of("dbias", dbias)],
            &[Region::of("dout", dout)],
            false,
        )?;
        Ok(BiasDims {
            rows: dout.shape.rows(),
            cols: m,
        })
    }

    /// [`super::LinalgOps::linear_gelu`]: the matmul into `pre` (errors named
    /// `matmul`), then `out` of `pre`'s shape and disjoint from every operand.
    pub fn linear_gelu<M: DeviceMemory>(
        x: &Matrix<'_, M>,
        w: &Matrix<'_, M>,
        bias: &View<'_, M>,
        pre: &View<'_, M>,
        out: &View<'_, M>,
    ) -> Result<MatmulDims> {
        const OP: &str = "linear_gelu";
        let d = matmul(x, w, Some(bias), &pre.mat())?;
        elementwise(OP, &[("pre", pre)], ("out", out), false)?;
        disjoint(
            OP,
            &[Region::of("out", out)],
            &[
                Region::of_matrix("x", x),
                Region::of_matrix("w", w),
                Region::of("bias", bias),
            ],
            false,
        )?;
        Ok(d)
    }

    /// [`super::LinalgOps::matmul_gelu_backward`]: the matmul into `dpre` (errors named
    /// `matmul`), then `pre` of `dpre`'s shape; `dpre` disjoint from `pre` too.
    pub fn matmul_gelu_backward<M: DeviceMemory>(
        dy: &Matrix<'_, M>,
        w: &Matrix<'_, M>,
        pre: &View<'_, M>,
        dpre: &View<'_, M>,
    ) -> Result<MatmulDims> {
        const OP: &str = "matmul_gelu_backward";
        let d = matmul(dy, w, None, &dpre.mat())?;
        elementwise(OP, &[("pre", pre)], ("dpre", dpre), false)?;
        Ok(d)
    }

    /// Sizes of a validated [`super::LinalgOps::mlp_forward`]: `rows` of `c` in, `m`
    /// hidden.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub struct MlpDims {
        pub rows: usize,
        pub c: usize,
        pub m: usize,
    }

    /// [`super::LinalgOps::mlp_forward`]: the first half as [`linear_gelu`] into `pre`
    /// and `act`, the second as a [`matmul`] of `act` into `out` (errors named after
    /// those ops), `out` as wide as `x` and disjoint from every other argument.
    pub fn mlp_forward<M: DeviceMemory>(
        x: &View<'_, M>,
        fc: &super::LinearParams<'_, M>,
        pre: &View<'_, M>,
        act: &View<'_, M>,
        proj: &super::LinearParams<'_, M>,
        out: &View<'_, M>,
    ) -> Result<MlpDims> {
        const OP: &str = "mlp_forward";
        view(OP, "x", x)?;
        view(OP, "out", out)?;
        let first = linear_gelu(&x.mat(), &fc.weight, &fc.bias, pre, act)?;
        let second = matmul(&act.mat(), &proj.weight, Some(&proj.bias), &out.mat())?;
        if second.n != first.k {
            return Err(Error::SizeMismatch {
                op: OP,
                what: "columns",
                a: "out",
                a_size: second.n,
                b: "x",
                b_size: first.k,
            });
        }
        disjoint(
            OP,
            &[Region::of("out", out)],
            &[
                Region::of("x", x),
                Region::of_matrix("fc.weight", &fc.weight),
                Region::of("fc.bias", &fc.bias),
                Region::of("pre", pre),
                Region::of("act", act),
                Region::of_matrix("proj.weight", &proj.weight),
                Region::of("proj.bias", &proj.bias),
            ],
            false,
        )?;
        Ok(MlpDims {
            rows: first.m,
            c: first.k,
            m: first.n,
        })
    }
}

/// Default implementations of the fused linear-algebra ops, from the fine ops.
pub mod fused {
    use super::super::{ElementwiseOps, Mat, Tensor};
    use super::{LinalgOps, LinearOf};
    use crate::error::Result;

    /// Default [`LinalgOps::linear_gelu`]: a matmul with bias into `pre`, then GELU.
    pub fn linear_gelu<B: LinalgOps + ElementwiseOps>(
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

    /// Default [`LinalgOps::matmul_gelu_backward`]: a matmul into `dpre`, then the GELU
    /// backward in place (`dpre` is both `dout` and `dx`). The reference of the fused
    /// kernels.
    pub fn matmul_gelu_backward<B: LinalgOps + ElementwiseOps>(
        be: &B,
        dy: Mat<'_, B>,
        w: Mat<'_, B>,
        pre: Tensor<'_, B>,
        dpre: Tensor<'_, B>,
    ) -> Result<()> {
        super::check::matmul_gelu_backward(&dy, &w, &pre, &dpre)?;
        be.matmul(dy, w, None, dpre.mat())?;
        be.gelu_backward(pre, dpre, dpre)
    }

    /// Default [`LinalgOps::mlp_forward`]: [`LinalgOps::linear_gelu`] into `pre` and
    /// `act`, then a matmul with bias of `act` into `out`. The reference of the fused
    /// kernels.
    pub fn mlp_forward<B: LinalgOps + ElementwiseOps>(
        be: &B,
        x: Tensor<'_, B>,
        fc: LinearOf<'_, B>,
        pre: Tensor<'_, B>,
        act: Tensor<'_, B>,
        proj: LinearOf<'_, B>,
        out: Tensor<'_, B>,
    ) -> Result<()> {
        super::check::mlp_forward(&x, &fc, &pre, &act, &proj, &out)?;
        be.linear_gelu(x.mat(), fc.weight, fc.bias, pre, act)?;
        be.matmul(act.mat(), proj.weight, Some(proj.bias), out.mat())
    }
}
