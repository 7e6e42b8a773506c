//! Token + position embedding and its backward (scatter-add).

use rayon::prelude::*;

use andrea_core::check::EmbeddingDims;

use crate::buffer::SendPtr;
use crate::elementwise::add_assign;
use crate::par::rows_per_task;
use crate::simd;

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

/// The tokens grouped by id, in token order within each id: a counting sort (stable),
/// `O(tokens + vocab)`. Returns the token indices in that order.
fn tokens_by_id(ids: &[u32], vocab: usize) -> Vec<u32> {
    let mut start = vec![0u32; vocab + 1];
    for &id in ids {
        start[id as usize + 1] += 1;
    }
    for v in 0..vocab {
        start[v + 1] += start[v];
    }
    let mut order = vec![0u32; ids.len()];
    for (t, &id) in ids.iter().enumerate() {
        let slot = &mut start[id as usize];
        order[*slot as usize] = t as u32;
        *slot += 1;
    }
    order
}

/// `dwte[ids[n]] += dout[n]` and `dwpe[t] += Σ_b dout[b, t]`.
///
/// The tokens are grouped by id ([`tokens_by_id`]) and the groups cut into tasks of about
/// [`rows_per_task`] tokens, never inside a group: each row of `dwte` belongs to one task,
/// which adds its tokens' gradients in token order, whole rows at a time, so the sums do
/// not depend on the thread count. (Column bands of every token, the way before this,
/// gave the same bits but touched each `dwte` row once per band, a few cache lines at a
/// time at a random address: 35% of a copy's speed at AVX2, benches/README.md.)
/// `dwpe` is row-parallel over positions, batch entries in order.
pub(crate) fn backward(
    ids: &[u32],
    dout: &[f32],
    dwte: &mut [f32],
    dwpe: &mut [f32],
    d: EmbeddingDims,
) {
    let c = d.channels;
    let n = ids.len();
    let order = tokens_by_id(ids, d.vocab);
    let per = rows_per_task(c);
    // Task k runs order[cuts[k]..cuts[k + 1]].
    let mut cuts = vec![0];
    let mut i = per;
    while i < n {
        while i < n && ids[order[i] as usize] == ids[order[i - 1] as usize] {
            i += 1;
        }
        if i < n {
            cuts.push(i);
        }
        i += per;
    }
    cuts.push(n);
    let p = SendPtr(dwte.as_mut_ptr());
    let (order, ids) = (&order[..], ids);
    cuts.par_windows(2).for_each(|w| {
        let run = &order[w[0]..w[1]];
        for (k, &t) in run.iter().enumerate() {
            let t = t as usize;
            if let Some(&next) = run.get(k + 1) {
                // The next row of `dwte` is at a random address: ask for it now.
                simd::prefetch_raw(p.get().wrapping_add(ids[next as usize] as usize * c), c);
            }
            // SAFETY: `ids[t] < V` (checked), so the row is inside `dwte`; every token of
            // this id is in this task, so the row belongs to it alone.
            let dst =
                unsafe { std::slice::from_raw_parts_mut(p.get().add(ids[t] as usize * c), c) };
            add_assign(dst, &dout[t * c..][..c]);
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

#[cfg(test)]
mod tests {
    use super::*;

    /// The grouped scatter-add gives the bits of the plain loop over the tokens in order
    /// (each row's gradients added in token order), with ids that repeat, at any thread
    /// count; the grouping itself is a stable sort.
    #[test]
    fn backward_adds_each_row_in_token_order() {
        let (batch, seq, c, vocab) = (3, 40, 24, 11);
        let n = batch * seq;
        let ids: Vec<u32> = (0..n as u32)
            .map(|i| (i * i * 7 + i / 5) % vocab as u32)
            .collect();
        let dout = andrea_testkit::random::Rand::new(5).vec(n * c, -3.0, 3.0);
        let init = andrea_testkit::random::Rand::new(6).vec(vocab * c, -1.0, 1.0);
        let mut want = init.clone();
        for (t, &id) in ids.iter().enumerate() {
            for j in 0..c {
                want[id as usize * c + j] += dout[t * c + j];
            }
        }
        let mut want_pos = vec![0.5f32; seq * c];
        for b in 0..batch {
            for t in 0..seq {
                for j in 0..c {
                    want_pos[t * c + j] += dout[(b * seq + t) * c + j];
                }
            }
        }
        let d = EmbeddingDims {
            batch,
            seq,
            channels: c,
            vocab,
            context: seq,
        };
        for threads in [1, 3] {
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .build()
                .unwrap();
            let (mut dwte, mut dwpe) = (init.clone(), vec![0.5f32; seq * c]);
            pool.install(|| backward(&ids, &dout, &mut dwte, &mut dwpe, d));
            assert!(
                dwte.iter()
                    .zip(&want)
                    .all(|(a, b)| a.to_bits() == b.to_bits()),
                "{threads} threads: dwte"
            );
            assert!(
                dwpe.iter()
                    .zip(&want_pos)
                    .all(|(a, b)| a.to_bits() == b.to_bits()),
                "{threads} threads: dwpe"
            );
        }
        let order = tokens_by_id(&ids, vocab);
        assert!(order
            .windows(2)
            .all(|w| (ids[w[0] as usize], w[0]) < (ids[w[1] as usize], w[1])));
    }
}
