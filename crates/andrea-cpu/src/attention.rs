//! Fused causal attention, one task per (batch entry, head).
//!
//! Forward, per task: `S = q·kᵀ` (`[Tq, Tk]`, by `sgemm` into a thread-local scratch),
//! causal softmax of `S/sqrt(D)` in place, `out = P·v` (by `sgemm`, straight into the
//! output heads). Only the row log-sum-exps `L: [B, H, Tq]` are kept for the backward
//! pass, not the `[B, H, T, T]` probabilities.
//!
//! Backward, per task: recompute `P = exp(S/sqrt(D) - L)` (masked entries 0), then
//! `dP = dO·vᵀ`, `dv = Pᵀ·dO`, `dS = P∘(dP - rowsum(P∘dP))/sqrt(D)`, `dq = dS·k`,
//! `dk = dSᵀ·q`. The scratch is two `T×T` matrices per thread, reused across calls.

use std::cell::RefCell;

use rayon::prelude::*;

use andrea_core::check::AttentionDims;
use andrea_core::Heads;

use crate::buffer::{CpuBuffer, SendPtr};
use crate::gemm::{sgemm_strided, GemmKernel, Operand};
use crate::simd::{self, multiversion};
use crate::softmax::{softmax_row_in_place, visible};

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
    head_dim: usize,
}

impl HeadsPtr {
    pub(crate) fn of(h: &Heads<'_, CpuBuffer>) -> Self {
        HeadsPtr {
            // SAFETY: the view's offset is inside its buffer (checked).
            ptr: SendPtr(unsafe { h.buf.ptr().add(h.offset) }),
            batch_stride: h.batch_stride,
            seq_stride: h.seq_stride,
            head_dim: h.head_dim,
        }
    }
}

/// Operand for head `hh` of batch entry `b`: `[seq, D]` with row stride `seq_stride`.
fn head(h: HeadsPtr, b: usize, hh: usize) -> Operand {
    // SAFETY: (b, hh) are inside the view, which the op's check put inside its buffer.
    let ptr = unsafe { h.ptr.add(b * h.batch_stride + hh * h.head_dim) };
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

multiversion! {
    /// Causal softmax of `s / sqrt(D)` (rows of `tk`), keeping each row's log-sum-exp.
    fn causal_softmax_rows(s: &mut [f32], lse: &mut [f32], tq: usize, tk: usize, pos_offset: usize, scale: f32) {
        for (i, (row, l)) in s.chunks_exact_mut(tk).zip(lse.iter_mut()).enumerate() {
            let n = visible(i, tq, tk, Some(pos_offset));
            *l = softmax_row_in_place::<M>(row, n, scale);
        }
    }
}

multiversion! {
    /// `P = exp(S·scale - L)` on the causal part of each row of `t`, 0 above it.
    fn recompute_probs(p: &mut [f32], lse: &[f32], t: usize, scale: f32) {
        for (i, (row, &l)) in p.chunks_exact_mut(t).zip(lse).enumerate() {
            let (vis, masked) = row.split_at_mut(i + 1);
            simd::exp_shifted::<M>(vis, scale, l);
            masked.fill(0.0);
        }
    }
}

multiversion! {
    /// `dS = scale · P ∘ (dP - rowsum(P ∘ dP))`, in place of `dP`.
    fn softmax_grad_rows(p: &[f32], dp: &mut [f32], t: usize, scale: f32) {
        for (prow, drow) in p.chunks_exact(t).zip(dp.chunks_exact_mut(t)) {
            let s = simd::dot(prow, drow);
            for (o, &pv) in drow.iter_mut().zip(prow) {
                *o = scale * pv * (*o - s);
            }
        }
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
    kernel: GemmKernel,
) {
    let scale = 1.0 / (d.head_dim as f32).sqrt();
    let (tq, tk, hd) = (d.q_len, d.k_len, d.head_dim);
    lse.par_chunks_mut(tq).enumerate().for_each(|(task, lse)| {
        let (b, h) = (task / d.heads, task % d.heads);
        with_scratch(tq * tk, |s| {
            // SAFETY: operands are inside their checked views; `s` is thread-local;
            // each task writes only head `h` of batch entry `b` of `out`.
            unsafe {
                sgemm_strided(
                    kernel,
                    tq,
                    hd,
                    tk,
                    head(q, b, h),
                    transposed(head(k, b, h)),
                    0.0,
                    local(s, tk),
                );
            }
            causal_softmax_rows(s, lse, tq, tk, pos_offset, scale);
            unsafe {
                sgemm_strided(
                    kernel,
                    tq,
                    tk,
                    hd,
                    local(s, tk),
                    head(v, b, h),
                    0.0,
                    head(out, b, h),
                );
            }
        });
    });
}

/// Fused backward (training: `Tq == Tk`, offset 0), from the forward's `lse`.
pub(crate) fn backward(
    [q, k, v, dout, dq, dk, dv]: [HeadsPtr; 7],
    lse: &[f32],
    d: AttentionDims,
    kernel: GemmKernel,
) {
    let scale = 1.0 / (d.head_dim as f32).sqrt();
    let (t, hd) = (d.q_len, d.head_dim);
    lse.par_chunks(t).enumerate().for_each(|(task, lse)| {
        let (b, h) = (task / d.heads, task % d.heads);
        with_scratch(2 * t * t, |scratch| {
            let (p, dp) = scratch.split_at_mut(t * t);
            // SAFETY: as in `forward`; each task writes only its own head of dq/dk/dv,
            // which the check proved disjoint from each other and from the inputs.
            unsafe {
                sgemm_strided(
                    kernel,
                    t,
                    hd,
                    t,
                    head(q, b, h),
                    transposed(head(k, b, h)),
                    0.0,
                    local(p, t),
                );
            }
            recompute_probs(p, lse, t, scale);
            unsafe {
                // dP = dO·vᵀ
                sgemm_strided(
                    kernel,
                    t,
                    hd,
                    t,
                    head(dout, b, h),
                    transposed(head(v, b, h)),
                    0.0,
                    local(dp, t),
                );
                // dv = Pᵀ·dO
                sgemm_strided(
                    kernel,
                    t,
                    t,
                    hd,
                    transposed(local(p, t)),
                    head(dout, b, h),
                    0.0,
                    head(dv, b, h),
                );
            }
            softmax_grad_rows(p, dp, t, scale);
            unsafe {
                // dq = dS·k, dk = dSᵀ·q
                sgemm_strided(
                    kernel,
                    t,
                    t,
                    hd,
                    local(dp, t),
                    head(k, b, h),
                    0.0,
                    head(dq, b, h),
                );
                sgemm_strided(
                    kernel,
                    t,
                    t,
                    hd,
                    transposed(local(dp, t)),
                    head(q, b, h),
                    0.0,
                    head(dk, b, h),
                );
            }
        });
    });
}
