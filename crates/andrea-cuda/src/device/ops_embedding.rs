//! Token and position embedding, forward and the deterministic backward.

use andrea_core::{check, EmbeddingOps, Ids, Result, Tensor};

use super::buffer::{addr, ptr};
use super::launch::Args;
use super::CudaBackend;
use crate::plan::{embedding, int};

impl EmbeddingOps for CudaBackend {
    fn embedding(
        &self,
        ids: Ids<'_, Self>,
        wte: Tensor<'_, Self>,
        wpe: Tensor<'_, Self>,
        out: Tensor<'_, Self>,
        pos_offset: usize,
    ) -> Result<()> {
        const OP: &str = "embedding";
        let d = check::embedding(&ids, &wte, &wpe, &out, pos_offset)?;
        check::ids_values(OP, "ids", &ids.buf.host.borrow()[ids.range()], d.vocab)?;
        let l = embedding::forward(
            d.batch * d.seq,
            d.channels,
            &[wte.offset, wpe.offset, out.offset],
        )?;
        self.launch(
            &l,
            Args::new()
                .ptr(addr(ids.buf, ids.offset))
                .ptr(ptr(&wte))
                .ptr(ptr(&wpe))
                .ptr(ptr(&out))
                .int(int(OP, "sequence length", d.seq)?)
                .int(int(OP, "channels", d.channels)?)
                .int(int(OP, "position offset", pos_offset)?)
                .int(int(OP, "vocab", d.vocab)?),
        )
    }

    fn embedding_backward(
        &self,
        ids: Ids<'_, Self>,
        dout: Tensor<'_, Self>,
        dwte: Tensor<'_, Self>,
        dwpe: Tensor<'_, Self>,
    ) -> Result<()> {
        const OP: &str = "embedding_backward";
        let d = check::embedding_backward(&ids, &dout, &dwte, &dwpe)?;
        let segments = {
            let host = ids.buf.host.borrow();
            let tokens = &host[ids.range()];
            check::ids_values(OP, "ids", tokens, d.vocab)?;
            embedding::Segments::of(tokens)
        };
        let (packed, at) = segments.packed();
        let base = self.id_scratch_with(&packed)?;
        let (wte_l, wpe_l) = embedding::backward(segments.ids.len(), d.seq)?;
        let c = int(OP, "channels", d.channels)?;
        self.launch(
            &wte_l,
            Args::new()
                .ptr(base + 4 * at[0] as u64)
                .ptr(base + 4 * at[1] as u64)
                .ptr(base + 4 * at[2] as u64)
                .ptr(ptr(&dout))
                .ptr(ptr(&dwte))
                .int(c)
                .int(int(OP, "vocab", d.vocab)?),
        )?;
        self.launch(
            &wpe_l,
            Args::new()
                .ptr(ptr(&dout))
                .ptr(ptr(&dwpe))
                .int(int(OP, "batch", d.batch)?)
                .int(int(OP, "sequence length", d.seq)?)
                .int(c),
        )
    }
}
