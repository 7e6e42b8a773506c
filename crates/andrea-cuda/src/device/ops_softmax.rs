//! Row softmax with scale and causal mask, and its backward (`kernels/softmax.cu`).

use andrea_core::{check, Result, SoftmaxOps, Tensor};

use super::buffer::ptr;
use super::launch::Args;
use super::CudaBackend;
use crate::plan::{int, rows};

impl SoftmaxOps for CudaBackend {
    fn softmax(
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

    fn softmax_backward(
        &self,
        probs: Tensor<'_, Self>,
        dprobs: Tensor<'_, Self>,
        dx: Tensor<'_, Self>,
        scale: f32,
    ) -> Result<()> {
        const OP: &str = "softmax_backward";
        let d = check::softmax_backward(&probs, &dprobs, &dx)?;
        let (n, k) = (d.rows, d.cols);
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
}
