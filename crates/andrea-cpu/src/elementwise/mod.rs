//! Elementwise kernels: GELU and its backward, the residual add, scaling, the BF16
//! conversions.
//! Memory-bound: each is one pass over its operands, cut into fixed-size chunks.

pub(crate) mod convert;
#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
pub(crate) mod gelu;

use rayon::prelude::*;

use crate::par::MIN_TASK_ELEMS;
use crate::simd::{self, multiversion};

use andrea_core::{check, ElementwiseOps, Result, Tensor};

use crate::buffer::{read, write};
use crate::CpuBackend;

// The AVX-512 and NEON copies of GELU and its backward are `gelu`'s kernels.
multiversion! {
    fn gelu_chunk(x: &[f32], y: &mut [f32]) {
        simd::gelu_slice::<M, { simd::BLOCK }>(x, y);
    }
}

multiversion! {
    fn gelu_chunk_in_place(y: &mut [f32]) {
        let mut block = [0.0f32; 1024];
        for c in y.chunks_mut(1024) {
            let x = &mut block[..c.len()];
            x.copy_from_slice(c);
            simd::gelu_slice::<M, { simd::BLOCK }>(x, c);
        }
    }
}

multiversion! {
    fn gelu_backward_chunk(x: &[f32], dy: &[f32], dx: &mut [f32]) {
        simd::gelu_grad_slice::<M, { simd::BLOCK }>(x, Some(dy), dx);
    }
}

multiversion! {
    fn gelu_backward_chunk_in_place(x: &[f32], dydx: &mut [f32]) {
        simd::gelu_grad_slice::<M, { simd::BLOCK }>(x, None, dydx);
    }
}

multiversion! {
    fn add_chunk(a: &[f32], b: &[f32], y: &mut [f32]) {
        for ((o, &p), &q) in y.iter_mut().zip(a).zip(b) {
            *o = p + q;
        }
    }
}

multiversion! {
    /// `y += b` on the calling thread (the one vectorised copy the crate's row sums,
    /// scatter-adds and partials use).
    pub(crate) fn add_assign(y: &mut [f32], b: &[f32]) {
        for (o, &q) in y.iter_mut().zip(b) {
            *o += q;
        }
    }
}

multiversion! {
    fn scale_chunk(y: &mut [f32], alpha: f32) {
        for o in y.iter_mut() {
            *o *= alpha;
        }
    }
}

/// `y = GELU(x)` on the calling thread (`x == None`: in place).
pub(crate) fn gelu_slice(x: Option<&[f32]>, y: &mut [f32]) {
    #[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
    if simd::has_avx512() || simd::has_neon() {
        // SAFETY: the CPU has AVX-512 (x86-64) or NEON (aarch64).
        return unsafe { crate::elementwise::gelu::gelu_slice(x, y) };
    }
    match x {
        Some(x) => gelu_chunk(x, y),
        None => gelu_chunk_in_place(y),
    }
}

/// `dx = dy · GELU'(x)` on the calling thread (`dy == None`: `dx` holds `dy`).
pub(crate) fn gelu_backward_slice(x: &[f32], dy: Option<&[f32]>, dx: &mut [f32]) {
    #[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
    if simd::has_avx512() || simd::has_neon() {
        // SAFETY: the CPU has AVX-512 (x86-64) or NEON (aarch64).
        return unsafe { crate::elementwise::gelu::gelu_grad_slice(x, dy, dx) };
    }
    match dy {
        Some(dy) => gelu_backward_chunk(x, dy, dx),
        None => gelu_backward_chunk_in_place(x, dx),
    }
}

/// `y = GELU(x)`.
pub(crate) fn gelu(x: &[f32], y: &mut [f32]) {
    y.par_chunks_mut(MIN_TASK_ELEMS)
        .zip(x.par_chunks(MIN_TASK_ELEMS))
        .for_each(|(y, x)| gelu_slice(Some(x), y));
}

/// `y = GELU(y)`.
pub(crate) fn gelu_in_place(y: &mut [f32]) {
    y.par_chunks_mut(MIN_TASK_ELEMS)
        .for_each(|y| gelu_slice(None, y));
}

/// `dx = dy · GELU'(x)`.
pub(crate) fn gelu_backward(x: &[f32], dy: &[f32], dx: &mut [f32]) {
    dx.par_chunks_mut(MIN_TASK_ELEMS)
        .zip(x.par_chunks(MIN_TASK_ELEMS))
        .zip(dy.par_chunks(MIN_TASK_ELEMS))
        .for_each(|((dx, x), dy)| gelu_backward_slice(x, Some(dy), dx));
}

/// `dydx = dydx · GELU'(x)`.
pub(crate) fn gelu_backward_in_place(x: &[f32], dydx: &mut [f32]) {
    dydx.par_chunks_mut(MIN_TASK_ELEMS)
        .zip(x.par_chunks(MIN_TASK_ELEMS))
        .for_each(|(d, x)| gelu_backward_slice(x, None, d));
}

/// `y = a + b`.
pub(crate) fn add(a: &[f32], b: &[f32], y: &mut [f32]) {
    y.par_chunks_mut(MIN_TASK_ELEMS)
        .zip(a.par_chunks(MIN_TASK_ELEMS))
        .zip(b.par_chunks(MIN_TASK_ELEMS))
        .for_each(|((y, a), b)| add_chunk(a, b, y));
}

/// `y += b`.
pub(crate) fn add_in_place(y: &mut [f32], b: &[f32]) {
    y.par_chunks_mut(MIN_TASK_ELEMS)
        .zip(b.par_chunks(MIN_TASK_ELEMS))
        .for_each(|(y, b)| add_assign(y, b));
}

/// `y *= alpha`.
pub(crate) fn scale(y: &mut [f32], alpha: f32) {
    y.par_chunks_mut(MIN_TASK_ELEMS)
        .for_each(|y| scale_chunk(y, alpha));
}

/// `y = value`.
pub(crate) fn fill(y: &mut [f32], value: f32) {
    y.par_chunks_mut(MIN_TASK_ELEMS).for_each(|y| y.fill(value));
}

impl ElementwiseOps for CpuBackend {
    fn add(&self, a: Tensor<'_, Self>, b: Tensor<'_, Self>, out: Tensor<'_, Self>) -> Result<()> {
        check::add(&a, &b, &out)?;
        let other = if out.same_as(&a) {
            Some(b)
        } else if out.same_as(&b) {
            Some(a)
        } else {
            None
        };
        match other {
            // out is a (or b), and a == b: out = 2·out.
            Some(x) if x.same_as(&out) => {
                // SAFETY: the only distinct memory is `out`.
                let y = unsafe { write(&out) };
                self.run(|| scale(y, 2.0));
            }
            Some(x) => {
                // SAFETY: `x` is disjoint from `out` (checked).
                let (y, x) = unsafe { (write(&out), read(&x)) };
                self.run(|| add_in_place(y, x));
            }
            None => {
                // SAFETY: all three checked disjoint.
                let (y, a, b) = unsafe { (write(&out), read(&a), read(&b)) };
                self.run(|| add(a, b, y));
            }
        }
        Ok(())
    }

    fn scale(&self, x: Tensor<'_, Self>, alpha: f32) -> Result<()> {
        check::scale(&x)?;
        // SAFETY: the only argument.
        let y = unsafe { write(&x) };
        self.run(|| scale(y, alpha));
        Ok(())
    }

    fn gelu(&self, x: Tensor<'_, Self>, out: Tensor<'_, Self>) -> Result<()> {
        check::gelu(&x, &out)?;
        if out.same_as(&x) {
            // SAFETY: in place on one checked view.
            let y = unsafe { write(&out) };
            self.run(|| gelu_in_place(y));
        } else {
            // SAFETY: checked disjoint.
            let (y, x) = unsafe { (write(&out), read(&x)) };
            self.run(|| gelu(x, y));
        }
        Ok(())
    }

    fn gelu_backward(
        &self,
        x: Tensor<'_, Self>,
        dout: Tensor<'_, Self>,
        dx: Tensor<'_, Self>,
    ) -> Result<()> {
        check::gelu_backward(&x, &dout, &dx)?;
        if dx.same_as(&dout) {
            // SAFETY: `dx` is `dout` exactly and disjoint from `x`.
            let (d, x) = unsafe { (write(&dx), read(&x)) };
            self.run(|| gelu_backward_in_place(x, d));
        } else {
            // SAFETY: checked disjoint.
            let (d, x, g) = unsafe { (write(&dx), read(&x), read(&dout)) };
            self.run(|| gelu_backward(x, g, d));
        }
        Ok(())
    }
}
