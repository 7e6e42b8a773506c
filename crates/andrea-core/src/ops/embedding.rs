//! Token and position embedding, forward and the deterministic backward.

use super::{Ids, MemoryOps, Tensor};
use crate::error::Result;

/// The input layer.
pub trait EmbeddingOps: MemoryOps {
    /// `out[b, t] = wte[ids[b·T + t]] + wpe[pos_offset + t]` for `out: [B, T, C]`,
    /// `ids: [B·T]`, `wte: [V, C]`, `wpe: [T_ctx, C]`. An id `>= V` or a position
    /// `>= T_ctx` is an error.
    fn embedding(
        &self,
        ids: Ids<'_, Self>,
        wte: Tensor<'_, Self>,
        wpe: Tensor<'_, Self>,
        out: Tensor<'_, Self>,
        pos_offset: usize,
    ) -> Result<()>;

    /// Backward of [`EmbeddingOps::embedding`] (positions from 0): scatter-adds
    /// `dwte[ids[n]] += dout[n]` and `dwpe[t] += Σ_b dout[b, t]`. Deterministic: the
    /// additions into a row happen in the order of `n`.
    fn embedding_backward(
        &self,
        ids: Ids<'_, Self>,
        dout: Tensor<'_, Self>,
        dwte: Tensor<'_, Self>,
        dwpe: Tensor<'_, Self>,
    ) -> Result<()>;
}

/// Argument checks of the embedding ops.
pub mod check {
    use crate::check::{disjoint, ids_in_range, view, Region};
    use crate::error::{Error, Result};
    use crate::tensor::{DeviceMemory, Shape, View};

    /// Sizes of a validated embedding: `out: [B, T, C]`, `wte: [V, C]`, `wpe: [T_ctx, C]`.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub struct EmbeddingDims {
        pub batch: usize,
        pub seq: usize,
        pub channels: usize,
        pub vocab: usize,
        pub context: usize,
    }

    fn embedding_dims<M: DeviceMemory, I: DeviceMemory>(
        op: &'static str,
        ids: &View<'_, I>,
        wte: &View<'_, M>,
        wpe: &View<'_, M>,
        out: &View<'_, M>,
        out_name: &'static str,
        pos_offset: usize,
    ) -> Result<EmbeddingDims> {
        view(op, out_name, out)?;
        let d = out.shape.dims();
        if d.len() != 3 {
            return Err(Error::invalid(
                op,
                format!("`{out_name}` must be [B, T, C], got {}", out.shape),
            ));
        }
        let (batch, seq, channels) = (d[0], d[1], d[2]);
        view(op, "ids", ids)?;
        if ids.numel() != batch * seq {
            return Err(Error::SizeMismatch {
                op,
                what: "token count (B·T)",
                a: "ids",
                a_size: ids.numel(),
                b: out_name,
                b_size: batch * seq,
            });
        }
        view(op, "wte", wte)?;
        view(op, "wpe", wpe)?;
        for (name, w) in [("wte", wte), ("wpe", wpe)] {
            if w.shape.rank() != 2 || w.shape.last() != channels {
                return Err(Error::ShapeMismatch {
                    op,
                    arg: name,
                    expected: Shape::new(&[w.shape.rows(), channels]),
                    got: w.shape,
                });
            }
        }
        let context = wpe.shape.rows();
        if pos_offset.saturating_add(seq) > context {
            return Err(Error::invalid(
                op,
                format!(
                    "positions {pos_offset}..{} exceed the context length {context} of `wpe`",
                    pos_offset.saturating_add(seq)
                ),
            ));
        }
        Ok(EmbeddingDims {
            batch,
            seq,
            channels,
            vocab: wte.shape.rows(),
            context,
        })
    }

    /// [`super::EmbeddingOps::embedding`] (shapes only; the backend checks id values).
    pub fn embedding<M: DeviceMemory, I: DeviceMemory>(
        ids: &View<'_, I>,
        wte: &View<'_, M>,
        wpe: &View<'_, M>,
        out: &View<'_, M>,
        pos_offset: usize,
    ) -> Result<EmbeddingDims> {
        const OP: &str = "embedding";
        let dims = embedding_dims(OP, ids, wte, wpe, out, "out", pos_offset)?;
        disjoint(
            OP,
            &[Region::of("out", out)],
            &[Region::of("wte", wte), Region::of("wpe", wpe)],
            false,
        )?;
        Ok(dims)
    }

    /// [`super::EmbeddingOps::embedding_backward`] (shapes only; the backend checks id values).
    pub fn embedding_backward<M: DeviceMemory, I: DeviceMemory>(
        ids: &View<'_, I>,
        dout: &View<'_, M>,
        dwte: &View<'_, M>,
        dwpe: &View<'_, M>,
    ) -> Result<EmbeddingDims> {
        const OP: &str = "embedding_backward";
        let dims = embedding_dims(OP, ids, dwte, dwpe, dout, "dout", 0)?;
        disjoint(
            OP,
            &[Region::of("dwte", dwte), Region::of("dwpe", dwpe)],
            &[Region::of("dout", dout)],
            false,
        )?;
        Ok(dims)
    }

    /// Checks ids that a backend has in host-visible memory.
    pub fn ids_values(
        op: &'static str,
        arg: &'static str,
        ids: &[u32],
        limit: usize,
    ) -> Result<()> {
        ids_in_range(op, arg, ids, limit)
    }
}
