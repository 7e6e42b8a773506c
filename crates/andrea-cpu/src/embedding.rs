//! Token + position embedding and its backward (scatter-add).

use rayon::prelude::*;

use andrea_core::check::EmbeddingDims;

use crate::buffer::SendPtr;
use crate::elementwise::add_assign;
use crate::par::{cols_per_task, rows_per_task};

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
