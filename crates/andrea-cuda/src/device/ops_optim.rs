//! The optimizer: the squared global gradient norm and the AdamW update.

use andrea_core::{check, AdamWStep, OptimOps, Result, Tensor};

use super::buffer::ptr;
use super::driver;
use super::launch::Args;
use super::CudaBackend;
use crate::plan::{elementwise, long, reduce};

impl OptimOps for CudaBackend {
    fn sum_squares(&self, x: Tensor<'_, Self>) -> Result<f64> {
        self.queue_sum_squares(x)?;
        let mut host = [0.0f64];
        let total = self.sq_total.as_device_ptr().as_raw();
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
        self.launch_adamw(
            ("adamw_v1", "adamw_v4"),
            n,
            [param, grad, m, v],
            s,
            s.grad_scale,
            None,
        )
    }

    fn clip_scale(
        &self,
        grad: Tensor<'_, Self>,
        mean: f64,
        max_norm: Option<f32>,
        guard: Option<Tensor<'_, Self>>,
        out: Tensor<'_, Self>,
    ) -> Result<()> {
        check::clip_scale(&grad, mean, max_norm, guard.as_ref(), &out)?;
        self.queue_sum_squares(grad)?;
        let (guard_ptr, guard_n) = guard.map_or((0, 0), |g| (ptr(&g), g.numel()));
        self.launch(
            &reduce::CLIP_SCALE,
            Args::new()
                .ptr(self.sq_total.as_device_ptr().as_raw())
                .double(mean)
                .float(max_norm.unwrap_or(0.0))
                .ptr(guard_ptr)
                .long(long(guard_n))
                .ptr(ptr(&out)),
        )
    }

    fn adamw_scaled(
        &self,
        param: Tensor<'_, Self>,
        grad: Tensor<'_, Self>,
        m: Tensor<'_, Self>,
        v: Tensor<'_, Self>,
        s: &AdamWStep,
        scale: Tensor<'_, Self>,
    ) -> Result<()> {
        let n = check::adamw_scaled(&param, &grad, &m, &v, s, &scale)?.len;
        let names = ("adamw_scaled_v1", "adamw_scaled_v4");
        self.launch_adamw(names, n, [param, grad, m, v], s, 1.0, Some(ptr(&scale)))
    }
}

impl CudaBackend {
    /// `Σ x²` into `sq_total` (f64, on the device), not read back.
    fn queue_sum_squares(&self, x: Tensor<'_, Self>) -> Result<()> {
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
        )
    }

    /// An AdamW kernel (`names`: the scalar and the float4 form) over checked views;
    /// `scale`: the device scalar of `adamw_scaled_*` (then `grad_scale` is not passed).
    fn launch_adamw(
        &self,
        names: (&'static str, &'static str),
        n: usize,
        [param, grad, m, v]: [Tensor<'_, Self>; 4],
        s: &AdamWStep,
        grad_scale: f32,
        scale: Option<driver::CuDevicePtr>,
    ) -> Result<()> {
        // Bias corrections in f64, then f32: the values the CPU backend uses.
        let t = s.step as f64;
        let bc1 = 1.0 - (s.beta1 as f64).powf(t);
        let bc2 = 1.0 - (s.beta2 as f64).powf(t);
        let l = elementwise::launch(
            "adamw",
            names.0,
            names.1,
            n,
            &[param.offset, grad.offset, m.offset, v.offset],
        )?;
        let args = Args::new()
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
            .float((1.0 / bc2.sqrt()) as f32);
        let args = match scale {
            Some(p) => args.ptr(p),
            None => args.float(grad_scale),
        };
        self.launch(&l, args)
    }
}
