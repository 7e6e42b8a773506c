//! The decoder stack's argument checks, remembered between calls.
//!
//! Generation calls `decode_blocks` once a token with the same views every time but for
//! the KV cache's, which grow by one position. Checking a block's two dozen views
//! (`check::decode_block`: shapes, bounds, every pair that must not overlap) costs
//! microseconds of the caller's time, with the other cores spinning: a few percent of a
//! tiny-model token. So the backend
//! keeps, per block, what the check passed: the geometry of every argument (each view's
//! buffer, the buffer's length, the view's offset and shape or strides; `eps`) and the
//! cache length it passed at. A call whose block has the same geometry and a cache no
//! longer than that is valid without a new check, by monotonicity: the cache views of a
//! shorter length cover a subset of the elements (inside the buffer, overlapping nothing
//! the longer ones did not), and the other checks do not depend on the length, but for one: the cache must hold at least
//! the new positions. Where it
//! must check, it first tries [`AHEAD`] positions past the call's length (capped where the
//! cache views would leave their buffers), so the next calls are free, and if that fails,
//! the call's own length, whose error is the one returned: a call passes or fails exactly
//! as if checked in full.
//!
//! A buffer's address and length together stand for its identity: a buffer freed and
//! another allocated at the same address with the same length is, for every check, the
//! same memory.

use andrea_core::check::{decode_block, DecodeAttentionDims};
use andrea_core::{AttentionShape, DecodeBlock, DeviceMemory, Heads, Matrix, Result, View};

use crate::buffer::CpuBuffer;

/// Cache positions past a call's length that a check is tried at (one check every this
/// many tokens of a generation).
pub(crate) const AHEAD: usize = 64;

/// What the check passed, per block of the last calls.
#[derive(Default)]
pub(crate) struct CheckMemo {
    /// Per block index of a call.
    passed: Vec<Option<Passed>>,
    /// A call's signature, built here to compare without allocating.
    scratch: Vec<usize>,
}

struct Passed {
    /// The block's geometry (see [`signature`]).
    signature: Vec<usize>,
    /// The cache length (`keys.seq`, `values.seq`) the check passed at.
    seq: usize,
    dims: DecodeAttentionDims,
}

impl CheckMemo {
    /// `check::decode_block` of block `i` of a call: remembered, or run (and
    /// remembered); see the module docs.
    pub(crate) fn check(
        &mut self,
        i: usize,
        b: &DecodeBlock<'_, CpuBuffer>,
        eps: f32,
        workspace_len: impl Fn(AttentionShape) -> usize,
    ) -> Result<DecodeAttentionDims> {
        let seq = b.keys.seq;
        let at = |d: DecodeAttentionDims| DecodeAttentionDims {
            pos: seq - d.q_len,
            ..d
        };
        signature(b, eps, &mut self.scratch);
        let same = b.values.seq == seq;
        if let Some(Some(p)) = self.passed.get(i) {
            if same && p.signature == self.scratch && seq <= p.seq && seq >= p.dims.q_len {
                return Ok(at(p.dims));
            }
        }
        let ahead = (seq + AHEAD).min(fits(&b.keys)).min(fits(&b.values));
        let wide = (same && ahead > seq)
            .then(|| {
                let (keys, values) = (b.keys.prefix(ahead), b.values.prefix(ahead));
                let wide = DecodeBlock { keys, values, ..*b };
                decode_block(&wide, eps, &workspace_len).ok()
            })
            .flatten();
        // A cache shorter than the new positions passes no check (the wider one says
        // nothing about it).
        let (checked, dims) = match wide {
            Some(d) if seq >= d.q_len => (ahead, d),
            _ => (seq, decode_block(b, eps, &workspace_len)?),
        };
        if same {
            let p = Passed {
                signature: self.scratch.clone(),
                seq: checked,
                dims,
            };
            if self.passed.len() <= i {
                self.passed.resize_with(i + 1, || None);
            }
            self.passed[i] = Some(p);
        }
        Ok(at(dims))
    }
}

/// The longest cache `h` could be a view of inside its buffer (`h.seq` where that is
/// already past the end: the check then fails on it).
fn fits(h: &Heads<'_, CpuBuffer>) -> usize {
    let used = h.offset
        + (h.batch.max(1) - 1) * h.batch_stride
        + (h.heads.max(1) - 1) * h.head_stride
        + h.head_dim;
    match h.buf.len().checked_sub(used) {
        Some(room) if h.seq_stride > 0 => room / h.seq_stride + 1,
        _ => h.seq,
    }
}

/// Every argument's geometry but the cache views' length, into `out`.
fn signature(b: &DecodeBlock<'_, CpuBuffer>, eps: f32, out: &mut Vec<usize>) {
    out.clear();
    let buffer = |out: &mut Vec<usize>, m: &CpuBuffer| {
        out.extend([m as *const CpuBuffer as usize, m.len()]);
    };
    let view = |out: &mut Vec<usize>, v: &View<'_, CpuBuffer>| {
        buffer(out, v.buf);
        out.extend([v.offset, v.shape.rank()]);
        out.extend_from_slice(v.shape.dims());
    };
    let matrix = |out: &mut Vec<usize>, m: &Matrix<'_, CpuBuffer>| {
        buffer(out, m.buf);
        out.extend([
            m.offset,
            m.batch,
            m.rows,
            m.cols,
            m.batch_stride,
            m.row_stride,
            m.col_stride,
        ]);
    };
    let heads = |out: &mut Vec<usize>, h: &Heads<'_, CpuBuffer>| {
        buffer(out, h.buf);
        out.extend([
            h.offset,
            h.batch,
            h.heads,
            h.head_dim,
            h.batch_stride,
            h.seq_stride,
            h.head_stride,
        ]);
    };
    for v in [
        &b.x,
        &b.ln_1,
        &b.qkv,
        &b.atty,
        &b.workspace,
        &b.proj,
        &b.fc_pre,
        &b.fc,
    ] {
        view(out, v);
    }
    for v in [&b.residual_2, &b.residual_3] {
        view(out, v);
    }
    for n in [&b.ln_2_out, &b.next_out] {
        for v in [&n.out, &n.mean, &n.rstd] {
            view(out, v);
        }
    }
    for n in [&b.ln_2, &b.next] {
        view(out, &n.gamma);
        view(out, &n.beta);
    }
    for l in [&b.c_attn, &b.attn_proj, &b.c_fc, &b.mlp_proj] {
        matrix(out, &l.weight);
        view(out, &l.bias);
    }
    heads(out, &b.keys);
    heads(out, &b.values);
    out.push(eps.to_bits() as usize);
}

#[cfg(test)]
mod tests {
    use super::*;
    use andrea_core::{check, LinearParams, NormOutputs, NormParams};

    /// The remembered check agrees with the full one on every cache length, in rising,
    /// falling and scattered order, where the cache's buffer also holds the block's input
    /// `x` after 10 positions (so lengths past 10 overlap it and must fail, whatever
    /// passed before), and after the geometry changes (another `x`).
    #[test]
    fn agrees_with_the_full_check_on_every_length() {
        let (c, h, m, cap) = (8, 2, 32, 10);
        let z = |len: usize| CpuBuffer::try_zeros(len).unwrap();
        // Rows of [keys | values], 10 positions, then x (one row of C) in the same buffer.
        let kv = z(cap * 2 * c + c);
        let other_x = z(c);
        let (w_attn, w_proj, w_fc, w_mlp) = (z(c * 3 * c), z(c * c), z(c * m), z(m * c));
        let (b3, b1, bm, b1b) = (z(3 * c), z(c), z(m), z(c));
        let norms = [z(c), z(c), z(c), z(c)];
        let acts: Vec<CpuBuffer> = (0..8).map(|_| z(c)).collect();
        let stats: Vec<CpuBuffer> = (0..4).map(|_| z(1)).collect();
        let (qkv, atty, ws, proj, fc_pre, fc) = (z(3 * c), z(c), z(64), z(c), z(m), z(m));
        fn at(buf: &CpuBuffer, off: usize, c: usize) -> View<'_, CpuBuffer> {
            View::new(buf, off, [1, c])
        }
        fn lin<'a>(
            w: &'a CpuBuffer,
            b: &'a CpuBuffer,
            k: usize,
            n: usize,
        ) -> LinearParams<'a, CpuBuffer> {
            LinearParams {
                weight: View::new(w, 0, [k, n]).mat(),
                bias: View::whole(b),
            }
        }
        let row = |buf, off| at(buf, off, c);
        let block = |seq: usize, other: bool| DecodeBlock {
            x: if other {
                row(&other_x, 0)
            } else {
                row(&kv, cap * 2 * c)
            },
            ln_1: row(&acts[0], 0),
            keys: Heads {
                buf: &kv,
                offset: 0,
                batch: 1,
                seq,
                heads: h,
                head_dim: c / h,
                batch_stride: cap * 2 * c,
                seq_stride: 2 * c,
                head_stride: c / h,
            },
            values: Heads {
                buf: &kv,
                offset: c,
                batch: 1,
                seq,
                heads: h,
                head_dim: c / h,
                batch_stride: cap * 2 * c,
                seq_stride: 2 * c,
                head_stride: c / h,
            },
            c_attn: lin(&w_attn, &b3, c, 3 * c),
            attn_proj: lin(&w_proj, &b1, c, c),
            ln_2: NormParams {
                gamma: View::whole(&norms[0]),
                beta: View::whole(&norms[1]),
            },
            c_fc: lin(&w_fc, &bm, c, m),
            mlp_proj: lin(&w_mlp, &b1b, m, c),
            next: NormParams {
                gamma: View::whole(&norms[2]),
                beta: View::whole(&norms[3]),
            },
            qkv: View::whole(&qkv),
            atty: View::whole(&atty),
            workspace: View::whole(&ws),
            proj: row(&proj, 0),
            fc_pre: View::new(&fc_pre, 0, [1, m]),
            fc: View::new(&fc, 0, [1, m]),
            residual_2: row(&acts[1], 0),
            ln_2_out: NormOutputs {
                out: row(&acts[2], 0),
                mean: View::whole(&stats[0]),
                rstd: View::whole(&stats[1]),
            },
            residual_3: row(&acts[1], 0),
            next_out: NormOutputs {
                out: row(&acts[0], 0),
                mean: View::whole(&stats[2]),
                rstd: View::whole(&stats[3]),
            },
        };
        let ws_len = |s: AttentionShape| s.lse_len();
        let mut memo = CheckMemo::default();
        let mut lengths: Vec<usize> = (0..=cap + 4).collect();
        lengths.extend((0..=cap + 4).rev());
        lengths.extend([3, 12, 1, 10, 11, 2, 14, 9, 0, 5]);
        let mut passes = 0;
        for (round, other) in [false, true].into_iter().enumerate() {
            for &seq in &lengths {
                let b = block(seq, other);
                let want = check::decode_block(&b, 1e-5, ws_len);
                let got = memo.check(0, &b, 1e-5, ws_len);
                match (&got, &want) {
                    (Ok(g), Ok(w)) => {
                        assert_eq!(g, w, "round {round}, length {seq}");
                        passes += 1;
                    }
                    (Err(g), Err(w)) => assert_eq!(g.to_string(), w.to_string()),
                    _ => panic!("round {round}, length {seq}: memo {got:?}, full {want:?}"),
                }
            }
        }
        // Both verdicts happen: lengths 1..=10 pass (with `x` elsewhere too: the values
        // then end at the buffer's end), 0 and 11.. fail; 10 + 10 + 6 of the lengths a
        // round.
        assert_eq!(passes, 2 * (10 + 10 + 6));
    }
}
