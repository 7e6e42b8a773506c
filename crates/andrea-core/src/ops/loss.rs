//! The loss: fused softmax + cross-entropy over the (padded) vocabulary.

use super::{Ids, MemoryOps, Tensor};
use crate::error::Result;

/// A target id that contributes neither loss nor gradient (padding).
pub const IGNORE_INDEX: u32 = u32::MAX;

/// The loss of next-token prediction.
pub trait LossOps: MemoryOps {
    /// Fused softmax + cross-entropy over `logits: [N, Vp]`, of which only the first
    /// `vocab` columns are real (the rest is padding and gets gradient 0):
    /// `losses[n] = logsumexp(logits[n, ..vocab]) - logits[n, targets[n]]` and, if
    /// `dlogits` is given, `dlogits[n] = grad_scale · (softmax(logits[n]) - onehot)`.
    /// A target equal to [`IGNORE_INDEX`] gives loss 0 and gradient 0. `dlogits` may
    /// be exactly `logits` (the logits are overwritten by their gradient).
    fn softmax_cross_entropy(
        &self,
        logits: Tensor<'_, Self>,
        targets: Ids<'_, Self>,
        vocab: usize,
        losses: Tensor<'_, Self>,
        dlogits: Option<Tensor<'_, Self>>,
        grad_scale: f32,
    ) -> Result<()>;
}

/// Argument checks of the loss.
pub mod check {
    use super::IGNORE_INDEX;
    use crate::check::{disjoint, numel, same_shape, view, Region};
    use crate::error::{Error, Result};
    use crate::tensor::{DeviceMemory, View};

    /// Sizes of a validated cross-entropy: `rows` rows of `padded_vocab` logits.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub struct CrossEntropyDims {
        pub rows: usize,
        pub padded_vocab: usize,
    }

    /// Checks targets of a cross-entropy: each `< vocab` or [`IGNORE_INDEX`].
    pub fn target_values(op: &'static str, targets: &[u32], vocab: usize) -> Result<()> {
        match targets
            .iter()
            .position(|&t| t != IGNORE_INDEX && t as usize >= vocab)
        {
            None => Ok(()),
            Some(index) => Err(Error::IndexOutOfRange {
                op,
                arg: "targets",
                index,
                value: targets[index],
                limit: vocab,
            }),
        }
    }

    /// [`super::LossOps::softmax_cross_entropy`].
    pub fn softmax_cross_entropy<M: DeviceMemory, I: DeviceMemory>(
        logits: &View<'_, M>,
        targets: &View<'_, I>,
        vocab: usize,
        losses: &View<'_, M>,
        dlogits: Option<&View<'_, M>>,
    ) -> Result<CrossEntropyDims> {
        const OP: &str = "softmax_cross_entropy";
        view(OP, "logits", logits)?;
        let (n, vp) = (logits.shape.rows(), logits.shape.last());
        if vocab == 0 || vocab > vp {
            return Err(Error::invalid(
                OP,
                format!("vocab must be in 1..={vp} (the logits' last dimension), got {vocab}"),
            ));
        }
        view(OP, "targets", targets)?;
        if targets.numel() != n {
            return Err(Error::SizeMismatch {
                op: OP,
                what: "row count",
                a: "targets",
                a_size: targets.numel(),
                b: "logits",
                b_size: n,
            });
        }
        numel(OP, "losses", losses, n)?;
        let mut outputs = vec![Region::of("losses", losses)];
        if let Some(d) = dlogits {
            same_shape(OP, "dlogits", d, logits)?;
            disjoint(
                OP,
                &[Region::of("dlogits", d)],
                &[Region::of("logits", logits)],
                true,
            )?;
            outputs.push(Region::of("dlogits", d));
        }
        disjoint(OP, &outputs, &[], false)?;
        disjoint(
            OP,
            &[Region::of("losses", losses)],
            &[Region::of("logits", logits)],
            false,
        )?;
        Ok(CrossEntropyDims {
            rows: n,
            padded_vocab: vp,
        })
    }
}
