//! `impl Backend for CudaBackend`: memory ops here, every other op forwarded to the
//! module of its family.

use andrea_core::{check, AdamWStep, AttentionShape, Backend, HeadsOf, Ids, Mat, Result, Tensor};

use super::buffer::{CudaBuffer, CudaIds};
use super::CudaBackend;

impl Backend for CudaBackend {
    type Buffer = CudaBuffer;
    type IdBuffer = CudaIds;

    fn name(&self) -> String {
        let (major, minor) = self.compute_capability;
        format!(
            "cuda: {} (sm_{major}{minor}, matmul {:?}, {} tanh)",
            self.device_name,
            self.precision.matmul,
            if self.precision.approx_tanh {
                "approx"
            } else {
                "exact"
            }
        )
    }

    fn alloc(&self, len: usize) -> Result<CudaBuffer> {
        Ok(CudaBuffer {
            buf: self.alloc_buffer(len)?,
        })
    }

    fn alloc_ids(&self, len: usize) -> Result<CudaIds> {
        Ok(CudaIds {
            buf: self.alloc_buffer(len)?,
            host: std::cell::RefCell::new(vec![0; len]),
        })
    }

    fn upload(&self, src: &[f32], dst: Tensor<'_, Self>) -> Result<()> {
        check::transfer("upload", &dst, src.len())?;
        self.copy_to_device(Self::view_ptr(&dst), src, "upload")
    }

    fn download(&self, src: Tensor<'_, Self>, dst: &mut [f32]) -> Result<()> {
        check::transfer("download", &src, dst.len())?;
        self.copy_to_host(dst, Self::view_ptr(&src), "download")
    }

    fn upload_ids(&self, src: &[u32], dst: Ids<'_, Self>) -> Result<()> {
        check::transfer("upload_ids", &dst, src.len())?;
        self.copy_to_device(Self::view_ptr(&dst), src, "upload_ids")?;
        dst.buf.host.borrow_mut()[dst.range()].copy_from_slice(src);
        Ok(())
    }

    fn synchronize(&self) -> Result<()> {
        self.sync("synchronize")
    }

    fn fill(&self, dst: Tensor<'_, Self>, value: f32) -> Result<()> {
        check::view("fill", "dst", &dst)?;
        self.memset32(Self::view_ptr(&dst), value.to_bits(), dst.numel(), "fill")
    }

    fn copy(&self, src: Mat<'_, Self>, dst: Mat<'_, Self>) -> Result<()> {
        self.op_copy(src, dst)
    }

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

    fn bias_backward(&self, dout: Tensor<'_, Self>, dbias: Tensor<'_, Self>) -> Result<()> {
        self.op_bias_backward(dout, dbias)
    }

    fn add(&self, a: Tensor<'_, Self>, b: Tensor<'_, Self>, out: Tensor<'_, Self>) -> Result<()> {
        self.op_add(a, b, out)
    }

    fn scale(&self, x: Tensor<'_, Self>, alpha: f32) -> Result<()> {
        self.op_scale(x, alpha)
    }

    fn gelu(&self, x: Tensor<'_, Self>, out: Tensor<'_, Self>) -> Result<()> {
        self.op_gelu(x, out)
    }

    fn gelu_backward(
        &self,
        x: Tensor<'_, Self>,
        dout: Tensor<'_, Self>,
        dx: Tensor<'_, Self>,
    ) -> Result<()> {
        self.op_gelu_backward(x, dout, dx)
    }

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
        self.op_layernorm(x, gamma, beta, out, mean, rstd, eps)
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
        self.op_layernorm_backward(x, gamma, mean, rstd, dout, dx, dgamma, dbeta)
    }

    fn softmax(
        &self,
        x: Tensor<'_, Self>,
        out: Tensor<'_, Self>,
        scale: f32,
        causal_offset: Option<usize>,
    ) -> Result<()> {
        self.op_softmax(x, out, scale, causal_offset)
    }

    fn softmax_backward(
        &self,
        probs: Tensor<'_, Self>,
        dprobs: Tensor<'_, Self>,
        dx: Tensor<'_, Self>,
        scale: f32,
    ) -> Result<()> {
        self.op_softmax_backward(probs, dprobs, dx, scale)
    }

    fn embedding(
        &self,
        ids: Ids<'_, Self>,
        wte: Tensor<'_, Self>,
        wpe: Tensor<'_, Self>,
        out: Tensor<'_, Self>,
        pos_offset: usize,
    ) -> Result<()> {
        self.op_embedding(ids, wte, wpe, out, pos_offset)
    }

    fn embedding_backward(
        &self,
        ids: Ids<'_, Self>,
        dout: Tensor<'_, Self>,
        dwte: Tensor<'_, Self>,
        dwpe: Tensor<'_, Self>,
    ) -> Result<()> {
        self.op_embedding_backward(ids, dout, dwte, dwpe)
    }

    fn softmax_cross_entropy(
        &self,
        logits: Tensor<'_, Self>,
        targets: Ids<'_, Self>,
        vocab: usize,
        losses: Tensor<'_, Self>,
        dlogits: Option<Tensor<'_, Self>>,
        grad_scale: f32,
    ) -> Result<()> {
        self.op_softmax_cross_entropy(logits, targets, vocab, losses, dlogits, grad_scale)
    }

    fn sum_squares(&self, x: Tensor<'_, Self>) -> Result<f64> {
        self.op_sum_squares(x)
    }

    fn adamw(
        &self,
        param: Tensor<'_, Self>,
        grad: Tensor<'_, Self>,
        m: Tensor<'_, Self>,
        v: Tensor<'_, Self>,
        step: &AdamWStep,
    ) -> Result<()> {
        self.op_adamw(param, grad, m, v, step)
    }

    fn linear_gelu(
        &self,
        x: Mat<'_, Self>,
        w: Mat<'_, Self>,
        bias: Tensor<'_, Self>,
        pre: Tensor<'_, Self>,
        out: Tensor<'_, Self>,
    ) -> Result<()> {
        self.op_linear_gelu(x, w, bias, pre, out)
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
        self.op_residual_layernorm(a, b, residual, gamma, beta, out, mean, rstd, eps)
    }

    fn attention_workspace_len(&self, s: AttentionShape) -> usize {
        crate::plan::attention::workspace_len(s)
    }

    fn attention_backward_scratch_len(&self, _: AttentionShape) -> usize {
        0
    }

    fn attention_forward(
        &self,
        q: HeadsOf<'_, Self>,
        k: HeadsOf<'_, Self>,
        v: HeadsOf<'_, Self>,
        out: HeadsOf<'_, Self>,
        workspace: Tensor<'_, Self>,
        pos_offset: usize,
    ) -> Result<()> {
        self.op_attention_forward(q, k, v, out, workspace, pos_offset)
    }

    fn attention_backward(
        &self,
        q: HeadsOf<'_, Self>,
        k: HeadsOf<'_, Self>,
        v: HeadsOf<'_, Self>,
        out: HeadsOf<'_, Self>,
        dout: HeadsOf<'_, Self>,
        dq: HeadsOf<'_, Self>,
        dk: HeadsOf<'_, Self>,
        dv: HeadsOf<'_, Self>,
        workspace: Tensor<'_, Self>,
        scratch: Tensor<'_, Self>,
    ) -> Result<()> {
        self.op_attention_backward(q, k, v, out, dout, dq, dk, dv, workspace, scratch)
    }
}
