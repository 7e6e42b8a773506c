//! add, scale, GELU forward/backward, AdamW and the sum of squares.

use andrea_core::check::{self, Region};
use andrea_core::{AdamWStep, Result, Tensor};

use super::buffer::ptr;
use super::launch::Args;
use super::CudaBackend;
use crate::plan::{elementwise, long, reduce};

impl CudaBackend {
    pub(super) fn op_add(
        &self,
        a: Tensor<'_, Self>,
        b: Tensor<'_, Self>,
        out: Tensor<'_, Self>,
    ) -> Result<()> {
        check::elementwise("add", &[("a", &a), ("b", &b)], ("out", &out), true)?;
        let n = out.numel();
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

    pub(super) fn op_scale(&self, x: Tensor<'_, Self>, alpha: f32) -> Result<()> {
        check::view("scale", "x", &x)?;
        let n = x.numel();
        let l = elementwise::launch("scale", "scale_v1", "scale_v4", n, &[x.offset])?;
        self.launch(&l, Args::new().ptr(ptr(&x)).float(alpha).long(long(n)))
    }

    pub(super) fn op_gelu(&self, x: Tensor<'_, Self>, out: Tensor<'_, Self>) -> Result<()> {
        check::elementwise("gelu", &[("x", &x)], ("out", &out), true)?;
        let (v1, v4) = if self.precision.approx_tanh {
            ("gelu_forward_approx_v1", "gelu_forward_approx_v4")
        } else {
            ("gelu_forward_exact_v1", "gelu_forward_exact_v4")
        };
        let n = x.numel();
        let l = elementwise::launch("gelu", v1, v4, n, &[x.offset, out.offset])?;
        self.launch(&l, Args::new().ptr(ptr(&x)).ptr(ptr(&out)).long(long(n)))
    }

    pub(super) fn op_gelu_backward(
        &self,
        x: Tensor<'_, Self>,
        dout: Tensor<'_, Self>,
        dx: Tensor<'_, Self>,
    ) -> Result<()> {
        const OP: &str = "gelu_backward";
        check::elementwise(OP, &[("x", &x), ("dout", &dout)], ("dx", &dx), true)?;
        check::disjoint(OP, &[Region::of("dx", &dx)], &[Region::of("x", &x)], false)?;
        let (v1, v4) = if self.precision.approx_tanh {
            ("gelu_backward_approx_v1", "gelu_backward_approx_v4")
        } else {
            ("gelu_backward_exact_v1", "gelu_backward_exact_v4")
        };
        let n = x.numel();
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

    pub(super) fn op_adamw(
        &self,
        param: Tensor<'_, Self>,
        grad: Tensor<'_, Self>,
        m: Tensor<'_, Self>,
        v: Tensor<'_, Self>,
        s: &AdamWStep,
    ) -> Result<()> {
        check::adamw(&param, &grad, &m, &v, s)?;
        // Bias corrections in f64, then f32: the values the CPU backend uses.
        let t = s.step as f64;
        let bc1 = 1.0 - (s.beta1 as f64).powf(t);
        let bc2 = 1.0 - (s.beta2 as f64).powf(t);
        let n = param.numel();
        let l = elementwise::launch(
            "adamw",
            "adamw_v1",
            "adamw_v4",
            n,
            &[param.offset, grad.offset, m.offset, v.offset],
        )?;
        self.launch(
            &l,
            Args::new()
                .ptr(ptr(&param))
                .ptr(ptr(&grad))
                .ptr(ptr(&m))
                .ptr(ptr(&v))
                .long(long(n))
                .float(s.lr)
                .float(s.beta1)
                .float(s.beta2)
                .float(s.eps)
                .float(1.0 - s.lr * s.weight_decay)
                .float((1.0 / bc1) as f32)
                .float((1.0 / bc2.sqrt()) as f32)
                .float(s.grad_scale),
        )
    }

    pub(super) fn op_sum_squares(&self, x: Tensor<'_, Self>) -> Result<f64> {
        check::view("sum_squares", "x", &x)?;
        let n = x.numel();
        let p = reduce::sum_squares(n, x.offset)?;
        let partials = self.sq_partials.as_device_ptr().as_raw();
        let total = self.sq_total.as_device_ptr().as_raw();
        self.launch(
            &p.partials,
            Args::new()
                .ptr(ptr(&x))
                .long(long(n))
                .long(long(p.chunk))
                .ptr(partials),
        )?;
        self.launch(
            &p.finish,
            Args::new()
                .ptr(partials)
                .int(p.partials.grid[0] as i32)
                .ptr(total),
        )?;
        let mut host = [0.0f64];
        self.copy_to_host(&mut host, total, "sum_squares")?;
        Ok(host[0])
    }
}
