//! The AdamW update (torch.optim.AdamW semantics), one fused pass over p, g, m, v.

use rayon::prelude::*;

use andrea_core::AdamWStep;

use crate::par::MIN_TASK_ELEMS;
use crate::simd::multiversion;

use andrea_core::{check, OptimOps, Result, Tensor};

use crate::buffer::{read, write};
use crate::CpuBackend;

multiversion! {
    fn adamw_chunk(p: &mut [f32], g: &[f32], m: &mut [f32], v: &mut [f32], h: [f32; 8]) {
        let [lr, b1, b2, eps, decay, inv_bc1, inv_sqrt_bc2, gs] = h;
        for (((p, &g), m), v) in p.iter_mut().zip(g).zip(m.iter_mut()).zip(v.iter_mut()) {
            let g = g * gs;
            *m = b1 * *m + (1.0 - b1) * g;
            *v = b2 * *v + (1.0 - b2) * g * g;
            let m_hat = *m * inv_bc1;
            // sqrt(v̂) = sqrt(v)/sqrt(1-β2^t): eps is added after the correction, as torch does.
            let denom = v.sqrt() * inv_sqrt_bc2 + eps;
            *p = *p * decay - lr * m_hat / denom;
        }
    }
}

/// One AdamW step (see [`AdamWStep`]).
pub(crate) fn adamw(p: &mut [f32], g: &[f32], m: &mut [f32], v: &mut [f32], s: &AdamWStep) {
    let t = s.step as f64;
    let bc1 = 1.0 - (s.beta1 as f64).powf(t);
    let bc2 = 1.0 - (s.beta2 as f64).powf(t);
    let h = [
        s.lr,
        s.beta1,
        s.beta2,
        s.eps,
        1.0 - s.lr * s.weight_decay,
        (1.0 / bc1) as f32,
        (1.0 / bc2.sqrt()) as f32,
        s.grad_scale,
    ];
    p.par_chunks_mut(MIN_TASK_ELEMS)
        .zip(g.par_chunks(MIN_TASK_ELEMS))
        .zip(m.par_chunks_mut(MIN_TASK_ELEMS))
        .zip(v.par_chunks_mut(MIN_TASK_ELEMS))
        .for_each(|(((p, g), m), v)| adamw_chunk(p, g, m, v, h));
}

impl OptimOps for CpuBackend {
    fn sum_squares(&self, x: Tensor<'_, Self>) -> Result<f64> {
        check::sum_squares(&x)?;
        // SAFETY: checked in bounds.
        let x = unsafe { read(&x) };
        Ok(self.run(|| crate::reduce::sum_squares(x)))
    }

    fn adamw(
        &self,
        param: Tensor<'_, Self>,
        grad: Tensor<'_, Self>,
        m: Tensor<'_, Self>,
        v: Tensor<'_, Self>,
        step: &AdamWStep,
    ) -> Result<()> {
        check::adamw(&param, &grad, &m, &v, step)?;
        // SAFETY: checked disjoint.
        let (p, g, m, v) = unsafe { (write(&param), read(&grad), write(&m), write(&v)) };
        self.bf16_copies.forget(p.as_ptr(), p.len());
        self.run(|| adamw(p, g, m, v, step));
        Ok(())
    }
}
