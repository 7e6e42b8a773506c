//! Causal attention for training and prefill, one task per (batch entry, head), and
//! `andrea_core::AttentionOps` (the decode half's one-job path is `decode`'s).
//!
//! Two implementations ([`path::AttentionPath`]): where the level has AVX2 + FMA and the
//! head size is a multiple of 16, the fused kernel (`fused`: operands packed once per
//! head, six queries at a time, one intrinsics tile for every product, 32 columns wide on
//! AVX-512) runs the whole forward and backward; elsewhere the blocked path below.
//!
//! Forward, per task: `S = q·kᵀ` (`[Tq, Tk]`, into a thread-local scratch), causal
//! softmax of `S/sqrt(D)` in place, `out = P·v` (straight into the output heads), block
//! by block of [`QUERY_BLOCK`] queries, the products on the backend's GEMM. Only the row
//! log-sum-exps `L: [B, H, Tq]` are kept for the backward pass, not the `[B, H, T, T]`
//! probabilities. One query per sequence (a decoded token) takes `decode::attention`.
//!
//! Backward, per task: recompute `P = exp(S/sqrt(D) - L)` (masked entries 0), then
//! `dP = dO·vᵀ`, `dv = Pᵀ·dO`, `dS = P∘(dP - rowsum(P∘dP))/sqrt(D)`, `dq = dS·k`,
//! `dk = dSᵀ·q`. The scratch is two `T×T` matrices per thread, reused across calls.

#[cfg(target_arch = "x86_64")]
pub(crate) mod fused;
pub(crate) mod path;

use std::cell::RefCell;

use rayon::prelude::*;

use andrea_core::check::AttentionDims;

use crate::buffer::SendPtr;
use crate::gemm::{sgemm_strided, GemmKernel};
use crate::norm_softmax_loss::causal::{causal_softmax, recompute, softmax_grad_rows};
use crate::views::{head, HeadsPtr, Operand, Row};
use path::AttentionPath;

use andrea_core::{check, AttentionOps, AttentionShape, HeadsOf, LinearOf, Result, Tensor};

use crate::buffer::{read, write};
use crate::CpuBackend;

thread_local! {
    /// Per-thread scratch: `[S | dP]`, grown on first use, then reused.
    static SCRATCH: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

fn with_scratch<R>(len: usize, f: impl FnOnce(&mut [f32]) -> R) -> R {
    SCRATCH.with_borrow_mut(|s| {
        if s.len() < len {
            s.resize(len, 0.0);
        }
        f(&mut s[..len])
    })
}

fn transposed(o: Operand) -> Operand {
    Operand {
        ptr: o.ptr,
        rs: o.cs,
        cs: o.rs,
    }
}

fn local(s: &mut [f32], cols: usize) -> Operand {
    Operand {
        ptr: SendPtr(s.as_mut_ptr()),
        rs: cols,
        cs: 1,
    }
}

/// Query rows per block. Keys past a block's last query are never computed, which
/// skips most of the masked upper triangle (for T = 256, 62.5% of the full T×T work).
const QUERY_BLOCK: usize = 64;

/// Operand for rows `r0..` of head `hh` of batch entry `b`.
fn head_rows(h: HeadsPtr, b: usize, hh: usize, r0: usize) -> Operand {
    let o = head(h, b, hh);
    // SAFETY: r0 < seq, inside the checked view.
    Operand {
        ptr: unsafe { o.ptr.add(r0 * o.rs) },
        ..o
    }
}

/// Fused forward; `lse` receives `L: [B, H, Tq]`.
pub(crate) fn forward(
    q: HeadsPtr,
    k: HeadsPtr,
    v: HeadsPtr,
    out: HeadsPtr,
    lse: &mut [f32],
    pos_offset: usize,
    d: AttentionDims,
    (kernel, path): (GemmKernel, AttentionPath),
) {
    let scale = 1.0 / (d.head_dim as f32).sqrt();
    let (tq, tk, hd) = (d.q_len, d.k_len, d.head_dim);
    if tq == 1 && q.side_by_side() && out.side_by_side() {
        // A decoded token: one score row per head, no GEMM (`decode::attention`; the cache
        // may keep its heads apart, the query and output side by side).
        // SAFETY: the views were checked by the op; `lse` is B·H long.
        return unsafe {
            crate::decode::attention::forward([q, k, v, out], lse, d.heads, tk, pos_offset, scale)
        };
    }
    #[cfg(target_arch = "x86_64")]
    if let Some(w) = path.fused_width(hd) {
        // SAFETY: the width is this CPU's for `hd`; the views were checked by the op.
        return unsafe { crate::attention::fused::forward(w, [q, k, v, out], lse, pos_offset, d) };
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (path, hd); // no fused kernel for this architecture: the blocked path only
    lse.par_chunks_mut(tq).enumerate().for_each(|(task, lse)| {
        let (b, h) = (task / d.heads, task % d.heads);
        with_scratch(tq * tk, |s| {
            for i0 in (0..tq).step_by(QUERY_BLOCK) {
                let i1 = (i0 + QUERY_BLOCK).min(tq);
                let rows = i1 - i0;
                // Keys any row of this block can see.
                let kend = (pos_offset + i1).min(tk);
                let s_blk = &mut s[i0 * tk..i1 * tk];
                // SAFETY: operands inside their checked views; `s` is thread-local; each
                // task writes only rows of head `h` of batch entry `b` of `out`.
                unsafe {
                    let qb = head_rows(q, b, h, i0);
                    let kt = transposed(head(k, b, h));
                    sgemm_strided(kernel, rows, hd, kend, qb, kt, 0.0, local(s_blk, tk));
                }
                causal_softmax(s_blk, &mut lse[i0..i1], i0, tq, tk, pos_offset, scale);
                unsafe {
                    let ob = head_rows(out, b, h, i0);
                    sgemm_strided(
                        kernel,
                        rows,
                        kend,
                        hd,
                        local(s_blk, tk),
                        head(v, b, h),
                        0.0,
                        ob,
                    );
                }
            }
        });
    });
}

/// Sets rows `0..t` of head `hh` of batch entry `b` to zero.
///
/// # Safety
/// The head must be inside its checked view and owned by the calling task.
unsafe fn zero_head(h: HeadsPtr, b: usize, hh: usize, t: usize) {
    let o = head(h, b, hh);
    for r in 0..t {
        // SAFETY: row r of the head, inside the view, owned by the caller.
        unsafe { std::slice::from_raw_parts_mut(o.ptr.add(r * o.rs).get(), h.head_dim) }.fill(0.0);
    }
}

/// Fused backward (training: `Tq == Tk`, offset 0), from the forward's `lse`, block by
/// block of queries: `dq` rows are written once; `dk`, `dv` rows accumulate over the
/// query blocks that see them, in block order.
pub(crate) fn backward(
    [q, k, v, dout, dq, dk, dv]: [HeadsPtr; 7],
    lse: &[f32],
    d: AttentionDims,
    (kernel, path): (GemmKernel, AttentionPath),
) {
    let scale = 1.0 / (d.head_dim as f32).sqrt();
    let (t, hd) = (d.q_len, d.head_dim);
    #[cfg(target_arch = "x86_64")]
    if let Some(w) = path.fused_width(hd) {
        let heads = [q, k, v, dout, dq, dk, dv];
        // SAFETY: the width is this CPU's for `hd`; the views were checked by the op.
        return unsafe { crate::attention::fused::backward(w, heads, lse, d) };
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (path, hd); // no fused kernel for this architecture: the blocked path only
    lse.par_chunks(t).enumerate().for_each(|(task, lse)| {
        let (b, h) = (task / d.heads, task % d.heads);
        with_scratch(2 * t * t, |scratch| {
            let (p, dp) = scratch.split_at_mut(t * t);
            // SAFETY (whole task): operands inside their checked views; each task writes
            // only its own head of dq/dk/dv, which the check proved disjoint from each
            // other and from the inputs; `p`, `dp` are thread-local.
            unsafe {
                zero_head(dk, b, h, t);
                zero_head(dv, b, h, t);
            }
            for i0 in (0..t).step_by(QUERY_BLOCK) {
                let i1 = (i0 + QUERY_BLOCK).min(t);
                let (rows, kend) = (i1 - i0, i1);
                let (p_blk, dp_blk) = (&mut p[i0 * t..i1 * t], &mut dp[i0 * t..i1 * t]);
                let (qb, dob) = (head_rows(q, b, h, i0), head_rows(dout, b, h, i0));
                unsafe {
                    let kt = transposed(head(k, b, h));
                    sgemm_strided(kernel, rows, hd, kend, qb, kt, 0.0, local(p_blk, t));
                }
                recompute(p_blk, &lse[i0..i1], i0, t, kend, scale);
                unsafe {
                    // dP = dO·vᵀ
                    let vt = transposed(head(v, b, h));
                    sgemm_strided(kernel, rows, hd, kend, dob, vt, 0.0, local(dp_blk, t));
                    // dv[..kend] += Pᵀ·dO
                    let pt = transposed(local(p_blk, t));
                    sgemm_strided(kernel, kend, rows, hd, pt, dob, 1.0, head(dv, b, h));
                }
                softmax_grad_rows(p_blk, dp_blk, t, kend, scale);
                unsafe {
                    // dq[block] = dS·k[..kend], dk[..kend] += dSᵀ·q[block]
                    let dqb = head_rows(dq, b, h, i0);
                    sgemm_strided(
                        kernel,
                        rows,
                        kend,
                        hd,
                        local(dp_blk, t),
                        head(k, b, h),
                        0.0,
                        dqb,
                    );
                    let dst = transposed(local(dp_blk, t));
                    sgemm_strided(kernel, kend, rows, hd, dst, qb, 1.0, head(dk, b, h));
                }
            }
        });
    });
}

impl AttentionOps for CpuBackend {
    /// Heads apart: a decoded token's attention reads each of its heads' cached keys and
    /// values as one run, where side by side a head's 32 floats of a position sit a cache
    /// row apart and the L2 streamer brings the other heads' lines along.
    fn kv_heads_apart(&self) -> bool {
        true
    }

    /// The row log-sum-exps, [`AttentionShape::lse_len`].
    fn attention_workspace_len(&self, s: AttentionShape) -> usize {
        s.lse_len()
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
        let d = check::attention_forward(&q, &k, &v, &out, &workspace, pos_offset, |s| {
            self.attention_workspace_len(s)
        })?;
        let lse = workspace.slice(0, [d.batch * d.heads * d.q_len]);
        // SAFETY: the workspace is checked disjoint from every other argument.
        let lse = unsafe { write(&lse) };
        let [q, k, v, out] = [q, k, v, out].map(|h| HeadsPtr::of(&h));
        self.run(|| forward(q, k, v, out, lse, pos_offset, d, self.products()));
        Ok(())
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
        let d = check::attention_backward(
            &q,
            &k,
            &v,
            &out,
            &dout,
            &dq,
            &dk,
            &dv,
            &workspace,
            &scratch,
            |s| self.attention_workspace_len(s),
            |_| 0,
        )?;
        let lse = workspace.slice(0, [d.batch * d.heads * d.q_len]);
        // SAFETY: read-only here; outputs are checked disjoint from it.
        let lse = unsafe { read(&lse) };
        let heads = [q, k, v, dout, dq, dk, dv].map(|h| HeadsPtr::of(&h));
        self.run(|| backward(heads, lse, d, self.products()));
        Ok(())
    }

    /// One new token of one sequence as one team job (`decode` module); other shapes as
    /// the default's fine ops.
    fn decode_attention(
        &self,
        x: Tensor<'_, Self>,
        qkv_w: LinearOf<'_, Self>,
        qkv: Tensor<'_, Self>,
        keys: HeadsOf<'_, Self>,
        values: HeadsOf<'_, Self>,
        atty: Tensor<'_, Self>,
        workspace: Tensor<'_, Self>,
        proj: LinearOf<'_, Self>,
        out: Tensor<'_, Self>,
    ) -> Result<()> {
        let (d, _) = check::decode_attention(
            &x,
            &qkv_w,
            &qkv,
            &keys,
            &values,
            &atty,
            &workspace,
            &proj,
            &out,
            |s| self.attention_workspace_len(s),
        )?;
        let rows = d.batch * d.q_len;
        // BF16 precision takes the fine ops, whose products read the BF16 weights.
        let fused = self.precision == andrea_core::MatmulPrecision::Fp32;
        let Some((qkv_weight, proj_weight)) =
            crate::decode::takes(rows, &qkv_w.weight, &proj.weight).filter(|_| fused)
        else {
            return andrea_core::fused::decode_attention(
                self, x, qkv_w, qkv, keys, values, atty, workspace, proj, out,
            );
        };
        // SAFETY: checked in bounds and disjoint from every other argument.
        let out = unsafe { write(&out) };
        let half = crate::decode::AttentionOne {
            x: Row::of(&x),
            qkv_w: qkv_weight,
            qkv_b: Row::of(&qkv_w.bias),
            keys: HeadsPtr::of(&keys),
            values: HeadsPtr::of(&values),
            pos: d.pos,
            heads: d.heads,
            proj_w: proj_weight,
            proj_b: Row::of(&proj.bias),
        };
        // SAFETY: the cache views passed the op's check (rows 0..=pos inside their
        // buffer, disjoint from `out` and the inputs); `&self` ops run one at a time.
        self.run(|| unsafe { half.run(out) });
        Ok(())
    }
}
