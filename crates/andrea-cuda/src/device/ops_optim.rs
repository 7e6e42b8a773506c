//! The optimizer: the squared global gradient norm and the AdamW update.

use andrea_core::{check, AdamWStep, OptimOps, Result, Tensor};

use super::buffer::ptr;
use super::launch::Args;
use super::CudaBackend;
use crate::plan::{elementwise, long, reduce};

impl OptimOps for CudaBackend {
    fn sum_squares(&self, x: Tensor<'_, Self>) -> Result<f64> {
        let n = check::sum_squares(&x)?.len;
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

    fn adamw(
        &self,
        param: Tensor<'_, Self>,
        grad: Tensor<'_, Self>,
        m: Tensor<'_, Self>,
        v: Tensor<'_, Self>,
        s: &AdamWStep,
    ) -> Result<()> {
        let n = check::adamw(&param, &grad, &m, &v, s)?.len;
        // Bias corrections in f64, then f32: the values the CPU backend uses.
        let t = s.step as f64;
        let bc1 = 1.0 - (s.beta1 as f64).powf(t);
        let bc2 = 1.0 - (s.beta2 as f64).powf(t);
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
}
