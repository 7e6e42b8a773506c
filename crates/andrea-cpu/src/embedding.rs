//! Token + position embedding and its backward (scatter-add).

use rayon::prelude::*;

use andrea_core::check::EmbeddingDims;

use crate::buffer::SendPtr;
use crate::elementwise::add_assign;
use crate::par::{cols_per_task, rows_per_task};

use andrea_core::{check, EmbeddingOps, Ids, Result, Tensor};

use crate::buffer::{read, write};
use crate::CpuBackend;

/// `out[b, t] = wte[ids[b·T + t]] + wpe[pos_offset + t]`; ids already checked `< V`.
pub(crate) fn forward(
    ids: &[u32],
    wte: &[f32],
    wpe: &[f32],
    out: &mut [f32],
    d: EmbeddingDims,
    pos_offset: usize,
) {
    let c = d.channels;
    let rows = rows_per_task(c);
    out.par_chunks_mut(rows * c)
        .zip(ids.par_chunks(rows))
        .enumerate()
        .for_each(|(task, (out, ids))| {
            for (i, (o, &id)) in out.chunks_exact_mut(c).zip(ids).enumerate() {
                let t = (task * rows + i) % d.seq + pos_offset;
                let tok = &wte[id as usize * c..][..c];
                let pos = &wpe[t * c..][..c];
                for ((o, &a), &b) in o.iter_mut().zip(tok).zip(pos) {
                    *o = a + b;
                }
            }
        });
}

/// `dwte[ids[n]] += dout[n]` and `dwpe[t] += Σ_b dout[b, t]`.
///
/// `dwte` is cut into column bands; each band walks the tokens in order, so a row of
/// `dwte` that several tokens hit receives their gradients in token order whatever the
/// thread count. `dwpe` is row-parallel over positions, batch entries in order.
pub(crate) fn backward(
    ids: &[u32],
    dout: &[f32],
    dwte: &mut [f32],
    dwpe: &mut [f32],
    d: EmbeddingDims,
) {
    let c = d.channels;
    let n = ids.len();
    let band = cols_per_task(n, c);
    let p = SendPtr(dwte.as_mut_ptr());
    (0..c.div_ceil(band)).into_par_iter().for_each(|i| {
        let c0 = i * band;
        let c1 = (c0 + band).min(c);
        for (row, &id) in dout.chunks_exact(c).zip(ids) {
            // SAFETY: `id < V` (checked) so the row's band is inside `dwte`; the column
            // band `c0..c1` belongs to this task alone.
            let dst = unsafe {
                std::slice::from_raw_parts_mut(p.get().add(id as usize * c + c0), c1 - c0)
            };
            add_assign(dst, &row[c0..c1]);
        }
    });
    let t_len = d.seq;
    dwpe[..t_len * c]
        .par_chunks_mut(c)
        .enumerate()
        .for_each(|(t, dst)| {
            for b in 0..d.batch {
                add_assign(dst, &dout[(b * t_len + t) * c..][..c]);
            }
        });
}

impl EmbeddingOps for CpuBackend {
    fn embedding(
        &self,
        ids: Ids<'_, Self>,
        wte: Tensor<'_, Self>,
        wpe: Tensor<'_, Self>,
        out: Tensor<'_, Self>,
        pos_offset: usize,
    ) -> Result<()> {
        let d = check::embedding(&ids, &wte, &wpe, &out, pos_offset)?;
        // SAFETY: checked in bounds and disjoint.
        let (ids, wte, wpe, out) = unsafe { (read(&ids), read(&wte), read(&wpe), write(&out)) };
        check::ids_values("embedding", "ids", ids, d.vocab)?;
        self.run(|| forward(ids, wte, wpe, out, d, pos_offset));
        Ok(())
    }

    fn embedding_backward(
        &self,
        ids: Ids<'_, Self>,
        dout: Tensor<'_, Self>,
        dwte: Tensor<'_, Self>,
        dwpe: Tensor<'_, Self>,
    ) -> Result<()> {
        let d = check::embedding_backward(&ids, &dout, &dwte, &dwpe)?;
        // SAFETY: checked in bounds and disjoint.
        let (ids, g, dwte, dwpe) = unsafe { (read(&ids), read(&dout), write(&dwte), write(&dwpe)) };
        check::ids_values("embedding_backward", "ids", ids, d.vocab)?;
        self.run(|| backward(ids, g, dwte, dwpe, d));
        Ok(())
    }
}
