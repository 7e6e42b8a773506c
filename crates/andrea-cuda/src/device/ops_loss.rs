//! The fused softmax + cross-entropy of the output layer (`kernels/loss.cu`).

use andrea_core::{check, Ids, LossOps, Result, Tensor};

use super::buffer::{addr, ptr};
use super::launch::Args;
use super::CudaBackend;
use crate::plan::{int, rows};

impl LossOps for CudaBackend {
    fn softmax_cross_entropy(
        &self,
        logits: Tensor<'_, Self>,
        targets: Ids<'_, Self>,
        vocab: usize,
        losses: Tensor<'_, Self>,
        dlogits: Option<Tensor<'_, Self>>,
        grad_scale: f32,
    ) -> Result<()> {
        const OP: &str = "softmax_cross_entropy";
        let d = check::softmax_cross_entropy(&logits, &targets, vocab, &losses, dlogits.as_ref())?;
        let (n, vp) = (d.rows, d.padded_vocab);
        check::target_values(OP, &targets.buf.host.borrow()[targets.range()], vocab)?;
        let l = rows::cross_entropy(n)?;
        self.launch(
            &l,
            Args::new()
                .ptr(ptr(&logits))
                .ptr(addr(targets.buf, targets.offset))
                .ptr(ptr(&losses))
                .ptr(dlogits.map(|d| ptr(&d)).unwrap_or(0))
                .int(int(OP, "vocab", vocab)?)
                .int(int(OP, "padded vocab", vp)?)
                .float(grad_scale),
        )
    }
}
