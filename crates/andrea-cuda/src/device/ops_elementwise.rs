//! add, scale, GELU forward and backward.

use andrea_core::{check, ElementwiseOps, Result, Tensor};

use super::buffer::ptr;
use super::launch::Args;
use super::CudaBackend;
use crate::plan::{elementwise, long};

impl ElementwiseOps for CudaBackend {
    fn add(&self, a: Tensor<'_, Self>, b: Tensor<'_, Self>, out: Tensor<'_, Self>) -> Result<()> {
        let n = check::add(&a, &b, &out)?.len;
        let l = elementwise::launch(
            "add",
            "add_v1",
            "add_v4",
            n,
            &[a.offset, b.offset, out.offset],
        )?;
        self.launch(
            &l,
            Args::new()
                .ptr(ptr(&a))
                .ptr(ptr(&b))
                .ptr(ptr(&out))
                .long(long(n)),
        )
    }

    fn scale(&self, x: Tensor<'_, Self>, alpha: f32) -> Result<()> {
        let n = check::scale(&x)?.len;
        let l = elementwise::launch("scale", "scale_v1", "scale_v4", n, &[x.offset])?;
        self.launch(&l, Args::new().ptr(ptr(&x)).float(alpha).long(long(n)))
    }

    fn gelu(&self, x: Tensor<'_, Self>, out: Tensor<'_, Self>) -> Result<()> {
        let n = check::gelu(&x, &out)?.len;
        let (v1, v4) = if self.precision.approx_tanh {
            ("gelu_forward_approx_v1", "gelu_forward_approx_v4")
        } else {
            ("gelu_forward_exact_v1", "gelu_forward_exact_v4")
        };
        let l = elementwise::launch("gelu", v1, v4, n, &[x.offset, out.offset])?;
        self.launch(&l, Args::new().ptr(ptr(&x)).ptr(ptr(&out)).long(long(n)))
    }

    fn gelu_backward(
        &self,
        x: Tensor<'_, Self>,
        dout: Tensor<'_, Self>,
        dx: Tensor<'_, Self>,
    ) -> Result<()> {
        const OP: &str = "gelu_backward";
        let n = check::gelu_backward(&x, &dout, &dx)?.len;
        let (v1, v4) = if self.precision.approx_tanh {
            ("gelu_backward_approx_v1", "gelu_backward_approx_v4")
        } else {
            ("gelu_backward_exact_v1", "gelu_backward_exact_v4")
        };
        let l = elementwise::launch(OP, v1, v4, n, &[x.offset, dout.offset, dx.offset])?;
        self.launch(
            &l,
            Args::new()
                .ptr(ptr(&x))
                .ptr(ptr(&dout))
                .ptr(ptr(&dx))
                .long(long(n)),
        )
    }
}
