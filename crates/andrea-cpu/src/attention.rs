//! Fused causal attention, one task per (batch entry, head).
//!
//! Two implementations: where the kernels may use AVX2 + FMA and the head size is a
//! multiple of 16, [`AttentionProducts::Fused`] (the default there) hands the whole
//! forward and backward to `attention_fused` (operands packed once per head, six queries
//! at a time, one intrinsics tile for every product, 32 columns wide on AVX-512);
//! otherwise, and when chosen, the blocked path below runs.
//!
//! Forward, per task: `S = q·kᵀ` (`[Tq, Tk]`, into a thread-local scratch), causal
//! softmax of `S/sqrt(D)` in place, `out = P·v` (straight into the output heads). The
//! products run on the `attention_products` kernel (or the general `sgemm`, by
//! [`AttentionProducts`]). Only the row log-sum-exps `L: [B, H, Tq]` are kept for the backward
//! pass, not the `[B, H, T, T]` probabilities.
//!
//! Backward, per task: recompute `P = exp(S/sqrt(D) - L)` (masked entries 0), then
//! `dP = dO·vᵀ`, `dv = Pᵀ·dO`, `dS = P∘(dP - rowsum(P∘dP))/sqrt(D)`, `dq = dS·k`,
//! `dk = dSᵀ·q`. The scratch is two `T×T` matrices per thread, reused across calls.

use std::cell::RefCell;
use std::f32::consts::LOG2_E;

use rayon::prelude::*;

use andrea_core::check::AttentionDims;
use andrea_core::Heads;

use crate::buffer::{CpuBuffer, SendPtr};
use crate::gemm::{sgemm_strided, GemmKernel, Operand};
use crate::simd::{self, multiversion};
use crate::softmax::{softmax_row_in_place, visible};

use andrea_core::{check, fused, AttentionOps, AttentionShape, HeadsOf, LinearOf, Result, Tensor};

use crate::buffer::{read, write};
use crate::decode::Row;
use crate::CpuBackend;

/// Which implementation runs attention: the fused kernel (`attention_fused`) where it can
/// run, the blocked path below elsewhere. The product always takes [`AttentionPath::DEFAULT`];
/// the unit tests take the others to compare them with it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct AttentionPath {
    /// The fused kernel where the level has AVX2 + FMA and the head size is a multiple of
    /// 16 (else the blocked path everywhere).
    pub(crate) fused: bool,
    /// The fused kernel's 32-column tile where the level has AVX-512 and the head size is
    /// a multiple of 32 (else its 16-column tile; both give the same bits).
    pub(crate) wide: bool,
}

impl AttentionPath {
    pub(crate) const DEFAULT: AttentionPath = AttentionPath {
        fused: true,
        wide: true,
    };

    /// The fused kernel's tile for heads of `head_dim` at the kernels' level, or `None`
    /// where the blocked path runs.
    #[cfg(target_arch = "x86_64")]
    fn fused_width(self, head_dim: usize) -> Option<crate::attention_fused::Width> {
        self.fused
            .then(|| crate::attention_fused::width(head_dim, self.wide))
            .flatten()
    }

    /// The implementation that runs at the kernels' level for heads a multiple of 32.
    pub(crate) fn name(self) -> &'static str {
        if !(self.fused && simd::has_avx2_fma()) {
            "blocked"
        } else if self.wide && simd::has_avx512() {
            "fused-avx512"
        } else {
            "fused-avx2"
        }
    }
}

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

/// A heads view as plain data: base pointer and strides (the buffer reference is not
/// `Sync`, this is).
#[derive(Clone, Copy)]
pub(crate) struct HeadsPtr {
    ptr: SendPtr,
    batch_stride: usize,
    seq_stride: usize,
    head_stride: usize,
    head_dim: usize,
}

impl HeadsPtr {
    pub(crate) fn of(h: &Heads<'_, CpuBuffer>) -> Self {
        HeadsPtr {
            // SAFETY: the view's offset is inside its buffer (checked).
            ptr: SendPtr(unsafe { h.buf.ptr().add(h.offset) }),
            batch_stride: h.batch_stride,
            seq_stride: h.seq_stride,
            head_stride: h.head_stride,
            head_dim: h.head_dim,
        }
    }
}

impl HeadsPtr {
    pub(crate) fn head_dim(&self) -> usize {
        self.head_dim
    }

    /// Where each position's heads start, from position 0's head 0.
    pub(crate) fn strides(&self) -> crate::attention_decode::Strides {
        crate::attention_decode::Strides {
            pos: self.seq_stride,
            head: self.head_stride,
        }
    }

    /// Whether each position's heads lie side by side (`Heads::side_by_side`).
    pub(crate) fn side_by_side(&self) -> bool {
        self.head_stride == self.head_dim
    }

    /// Rows `0..rows` of heads `h0..h1` of batch entry `b`, as one slice from row 0's
    /// head `h0` to the end of the last row's head `h1 - 1` (row `r`'s head `h` at
    /// `r·seq_stride + (h - h0)·head_stride` in it: [`HeadsPtr::strides`]).
    ///
    /// # Safety
    /// The rows and heads must lie inside the checked view, and nothing may write them
    /// while the slice lives.
    pub(crate) unsafe fn rows<'a>(
        &self,
        b: usize,
        rows: usize,
        (h0, h1): (usize, usize),
    ) -> &'a [f32] {
        let o = head(*self, b, h0);
        let len =
            (rows.max(1) - 1) * self.seq_stride + (h1 - h0 - 1) * self.head_stride + self.head_dim;
        // SAFETY: inside the checked view (the caller's promise).
        unsafe { std::slice::from_raw_parts(o.ptr.get(), len) }
    }

    /// Element 0 of head `h` of row `r` of batch entry `b` (not dereferenced here).
    pub(crate) fn at(&self, b: usize, r: usize, h: usize) -> *mut f32 {
        self.ptr
            .get()
            .wrapping_add(b * self.batch_stride + r * self.seq_stride + h * self.head_stride)
    }

    /// Row 0 of heads `h0..h1` of batch entry `b`, to write.
    ///
    /// # Safety
    /// Inside the checked view, whose heads lie side by side, and no other reference to
    /// it while the slice lives.
    pub(crate) unsafe fn row_mut<'a>(&self, b: usize, (h0, h1): (usize, usize)) -> &'a mut [f32] {
        debug_assert!(self.side_by_side());
        let o = head(*self, b, h0);
        // SAFETY: inside the checked view, exclusive (the caller's promise).
        unsafe { std::slice::from_raw_parts_mut(o.ptr.get(), (h1 - h0) * self.head_dim) }
    }
}

/// Operand for head `hh` of batch entry `b`: `[seq, D]` with row stride `seq_stride`.
pub(crate) fn head(h: HeadsPtr, b: usize, hh: usize) -> Operand {
    // SAFETY: (b, hh) are inside the view, which the op's check put inside its buffer.
    let ptr = unsafe { h.ptr.add(b * h.batch_stride + hh * h.head_stride) };
    Operand {
        ptr,
        rs: h.seq_stride,
        cs: 1,
    }
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

/// An exponential row kernel: `(row, scale2, m2) -> Σ`, unsafe for its instruction set.
type ExpRow = unsafe fn(&mut [f32], f32, f32) -> f32;

/// Causal softmax of `s / sqrt(D)` for rows `first_row..` (rows of stride `tk`),
/// keeping each row's log-sum-exp, in base 2 (the `avx512` or `avx2` module's kernel where
/// the CPU has it, same bits).
pub(crate) fn causal_softmax(
    s: &mut [f32],
    lse: &mut [f32],
    first_row: usize,
    tq: usize,
    tk: usize,
    pos_offset: usize,
    scale: f32,
) {
    // The intrinsics kernel for this CPU, if any (each gives the base-2 lse).
    #[cfg(target_arch = "x86_64")]
    let vis = |r: usize| visible(first_row + r, tq, tk, Some(pos_offset));
    #[cfg(target_arch = "x86_64")]
    if scale >= 0.0 && simd::has_avx512() {
        // SAFETY: the CPU has AVX-512; scale >= 0; 1 <= visible <= tk.
        unsafe { crate::avx512::softmax_rows(None, s, tk, vis, scale, |r, l| lse[r] = l) };
        return;
    } else if scale >= 0.0 && simd::has_avx2_fma() {
        // SAFETY: the CPU has AVX2 and FMA; scale >= 0; 1 <= visible <= tk.
        unsafe { crate::avx2::softmax_rows(None, s, tk, vis, scale, |r, l| lse[r] = l) };
        return;
    }
    causal_softmax_rows(s, lse, first_row, tq, tk, pos_offset, scale)
}

/// `P = 2^(S·scale·log2 e - L)` (L in base 2) on the causal part of rows `first_row..` (stride `t`, `width`
/// computed columns), 0 elsewhere among those columns (the intrinsics kernels where the
/// CPU has AVX-512 or AVX2).
fn recompute(p: &mut [f32], lse: &[f32], first_row: usize, t: usize, width: usize, scale: f32) {
    #[cfg(target_arch = "x86_64")]
    let row_kernel: Option<ExpRow> = if simd::has_avx512() {
        Some(crate::avx512::exp_shifted_row)
    } else if simd::has_avx2_fma() {
        Some(crate::avx2::exp_shifted_row)
    } else {
        None
    };
    #[cfg(target_arch = "x86_64")]
    if let Some(kernel) = row_kernel {
        for (r, (row, &l)) in p.chunks_exact_mut(t).zip(lse).enumerate() {
            let (vis, masked) = row[..width].split_at_mut(first_row + r + 1);
            // SAFETY: the CPU has the kernel's instruction set.
            unsafe { kernel(vis, scale * LOG2_E, l) };
            masked.fill(0.0);
        }
        return;
    }
    recompute_probs(p, lse, first_row, t, width, scale)
}

multiversion! {
    fn causal_softmax_rows(s: &mut [f32], lse: &mut [f32], first_row: usize, tq: usize, tk: usize, pos_offset: usize, scale: f32) {
        for (r, (row, l)) in s.chunks_exact_mut(tk).zip(lse.iter_mut()).enumerate() {
            let n = visible(first_row + r, tq, tk, Some(pos_offset));
            *l = softmax_row_in_place::<M>(row, n, scale);
        }
    }
}

multiversion! {
    fn recompute_probs(p: &mut [f32], lse: &[f32], first_row: usize, t: usize, width: usize, scale: f32) {
        for (r, (row, &l)) in p.chunks_exact_mut(t).zip(lse).enumerate() {
            let (vis, masked) = row[..width].split_at_mut(first_row + r + 1);
            simd::pow2_shifted::<M>(vis, scale * LOG2_E, l);
            masked.fill(0.0);
        }
    }
}

multiversion! {
    /// `dS = scale · P ∘ (dP - rowsum(P ∘ dP))` in place of `dP`, over `width` columns of
    /// rows of stride `t`.
    fn softmax_grad_rows(p: &[f32], dp: &mut [f32], t: usize, width: usize, scale: f32) {
        for (prow, drow) in p.chunks_exact(t).zip(dp.chunks_exact_mut(t)) {
            let (prow, drow) = (&prow[..width], &mut drow[..width]);
            let s = simd::dot(prow, drow);
            for (o, &pv) in drow.iter_mut().zip(prow) {
                *o = scale * pv * (*o - s);
            }
        }
    }
}

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
        // A decoded token: one score row per head, no GEMM (`attention_decode`; the cache
        // may keep its heads apart, the query and output side by side).
        // SAFETY: the views were checked by the op; `lse` is B·H long.
        return unsafe {
            crate::attention_decode::forward([q, k, v, out], lse, d.heads, tk, pos_offset, scale)
        };
    }
    #[cfg(target_arch = "x86_64")]
    if let Some(w) = path.fused_width(hd) {
        // SAFETY: the width is this CPU's for `hd`; the views were checked by the op.
        return unsafe { crate::attention_fused::forward(w, [q, k, v, out], lse, pos_offset, d) };
    }
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
        return unsafe { crate::attention_fused::backward(w, heads, lse, d) };
    }
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
    /// row apart and the L2 streamer brings the other heads' lines along (see
    /// benches/results/20261206T1250Z-emr-decode-stack/attention_kv_findings.txt).
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
        let Some((qkv_weight, proj_weight)) =
            crate::decode::takes(rows, &qkv_w.weight, &proj.weight)
        else {
            return fused::decode_attention(
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
