//! Generation for one new token of one sequence of a small model: the decoder stack
//! (`DecodeOps::decode_blocks`) as one job of the spinning team (`team` module), and
//! each block's two halves (`decode_attention`, `mlp_forward`) as one job each where
//! they are called alone.
//!
//! Op by op, a tiny-model token (configs/tiny.toml) is 21 parallel jobs: per block the
//! QKV product, the attention, the projection, the MLP's two products; then the output
//! layer. Each is a few microseconds of work, and each hands parts to the other core and
//! waits for the last one back (a fraction of a microsecond to a microsecond for an empty
//! job), plus whatever the slower part
//! keeps the faster waiting, and between two jobs the caller's serial steps (argument
//! checks, a residual add with its LayerNorm) while the other core spins. Here the work
//! is cut into [`Tasks`], each done once by whichever part claims it first, in stages
//! whose parts meet where every part needs all of the stage before:
//!
//! * **The first product** (`x·W_qkv`, `x·W_fc`) in chunks of `gemv::CHUNK_K` whole
//!   weight rows ([`FirstProduct`]): contiguous blocks of the weight, where a part's own
//!   columns would be short runs a row stride apart (those took the tiny model's
//!   attention half 25% longer).
//! * **Attention, one task per group of heads** at least [`HEAD_GROUP_MIN`] columns wide
//!   (`c0..c0 + w` of each third of the QKV): `q`, `k`, `v` of those heads from the first
//!   product's sums plus bias; `k`, `v` into the cache's row `pos`; the heads' attention
//!   over the cached rows `0..pos` and the new one; then their share of the projection,
//!   `atty[c0..c0 + w] · W_proj[c0..c0 + w, :]`, a partial row of `C`, summed in group
//!   order, plus the bias.
//! * **MLP, one task per band of [`MLP_BAND`] hidden columns** `j0..j1`:
//!   `h = GELU((x·W_fc)[j0..j1] + b_fc[j0..j1])`, then `h · W_proj[j0..j1, :]`, a
//!   partial row of `C`; summed in band order, plus the bias.
//! * In the stack, **after each half, one task** adds the half's output to the residual
//!   stream and takes the LayerNorm of the sum ([`residual_step`]), which the next stage
//!   reads: the block's `ln_2`, then the next block's `ln_1` (or the final LayerNorm).
//!   So a token's blocks are one job ([`run_blocks`]: 9 jobs a tiny token instead of 21,
//!   and 2 with the stack) and the caller's only serial work is the arguments' checks.
//! * A part that waits at a stage's end fetches into L2 the weight rows of its first task
//!   of the next product stage meanwhile ([`Ahead`]).
//!
//! Products run on the row form's kernel (`gemv::row_product`, with AVX-512 a partial row
//! in registers while the weight rows stream past). Tasks, chunks and the order of every
//! sum depend only on the sizes, so, like the rest of the backend, the result does not
//! depend on the thread count, and the stack has the bits of its blocks' four ops (the
//! fused halves and `residual_layernorm`). The first products (bias included) have the
//! bits of the op-by-op path; the output differs from it in the last bits (the
//! projections' partial rows are cut by heads and bands, not by `gemv::CHUNK_K` rows).
//!
//! A task reads the cache's rows `0..pos` of its heads (which no task writes) and writes
//! only its heads' row `pos`, kept in its own buffers for its attention. Views that one
//! stage writes and an earlier one read (the model's one LayerNorm output serves every
//! block's `ln_1`) are [`Row`]s: raw pointers, sliced inside a task only.
//!
//! Other shapes (more than one new position or sequence, a weight whose rows are not
//! contiguous, weights of more than [`MAX_WEIGHTS`] floats a half: ANDREA-120M's), and
//! BF16 precision (whose few-rows products read BF16 weights, `gemv::bf16`), take the
//! default composition of fine ops.

pub(crate) mod attention;
pub(crate) mod check_memo;
pub(crate) mod gemv;

use std::cell::Cell;
use std::sync::atomic::{AtomicU8, Ordering};

use andrea_core::{fused, DecodeBlockOf, Matrix, Result};

use crate::buffer::{CpuBuffer, SendPtr};
use crate::decode::attention::{scores_any, weighted_sum_any, Shape};
use crate::decode::gemv::{row_product, CHUNK_K};
use crate::norm_softmax_loss::causal::causal_softmax;
use crate::norm_softmax_loss::layernorm::{residual_forward, ResidualSrc};
use crate::views::{HeadsPtr, Row, Strides};

/// Hidden columns per part of the MLP: the tiny model's 512 in four parts, ANDREA-120M's
/// 3,072 in 24.
pub(crate) const MLP_BAND: usize = 128;
/// The fewest columns of a part of the attention: whole heads, at least this many
/// (the tiny model's 32-wide heads in pairs, ANDREA-120M's 64-wide ones one by one).
pub(crate) const HEAD_GROUP_MIN: usize = 64;

/// The buffers of a call, on the calling thread, reused across calls (grown, never
/// cleared: every row is overwritten by the task that fills it).
#[derive(Default)]
struct Scratch {
    /// Chunk partials of the first products (QKV, MLP up).
    first_qkv: Vec<f32>,
    first_fc: Vec<f32>,
    /// Partial rows of the second products (attention groups, MLP bands).
    parts_attn: Vec<f32>,
    parts_mlp: Vec<f32>,
    /// A half's output, summed from its partial rows (the stack's residual steps).
    sum: Vec<f32>,
    /// Task states ([`Tasks`]).
    states: Vec<AtomicU8>,
    /// Tasks per stage of each block ([`BlockOne::stages`]).
    stages: Vec<[usize; 6]>,
}

thread_local! {
    static SCRATCH: Cell<Scratch> = const {
        Cell::new(Scratch {
            first_qkv: Vec::new(),
            first_fc: Vec::new(),
            parts_attn: Vec::new(),
            parts_mlp: Vec::new(),
            sum: Vec::new(),
            states: Vec::new(),
            stages: Vec::new(),
        })
    };
    /// The stack's blocks of the last call, reused.
    static BLOCKS: Cell<Vec<BlockOne>> = const { Cell::new(Vec::new()) };
    /// A task's small rows (the query, the new key and value, the head's output, the
    /// MLP band's hidden values, the scores), on the thread that runs it; reused.
    static ROWS: Cell<Vec<f32>> = const { Cell::new(Vec::new()) };
}

/// Runs `f` with this thread's [`Scratch`] (taken out for the call: a nested call, which
/// nothing makes, would get empty buffers, not the same ones).
fn with_scratch<R>(f: impl FnOnce(&mut Scratch) -> R) -> R {
    let mut s = SCRATCH.take();
    let r = f(&mut s);
    SCRATCH.set(s);
    r
}

/// `v[..len]`, grown to `len` if shorter, as a pointer for the job's tasks.
fn grown(v: &mut Vec<f32>, len: usize) -> SendPtr {
    if v.len() < len {
        v.resize(len, 0.0);
    }
    SendPtr(v.as_mut_ptr())
}

/// Tasks each done once, by the first part to claim it: a part claims every unclaimed
/// task itself (state 0 -> 1, then 2 when done) and waits only for tasks another part
/// is running, which depend on nothing not already done. So the parts wait for each
/// other, but never for a part that has not started (a late or absent helper leaves
/// its tasks to the others), and no order of claims can deadlock.
struct Tasks<'a>(&'a [AtomicU8]);

impl Tasks<'_> {
    /// Runs `run(t)` for every unclaimed task `t`, from `first` on (a part's own, so
    /// that with as many parts as threads each starts on a different one), then waits
    /// until every task is done, fetching `ahead` into L2 meanwhile.
    fn ensure(&self, first: usize, run: impl Fn(usize), ahead: Ahead) {
        let n = self.0.len();
        for i in 0..n {
            let t = (first + i) % n;
            if self.0[t]
                .compare_exchange(0, 1, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
            {
                run(t);
                self.0[t].store(2, Ordering::Release);
            }
        }
        let mut lines = ahead.lines();
        for st in self.0 {
            while st.load(Ordering::Acquire) != 2 {
                match lines.next() {
                    Some(line) => crate::simd::prefetch_l2(line),
                    None => std::hint::spin_loop(),
                }
            }
        }
    }
}

/// What a part fetches into L2 while it waits at a stage's end: the weight rows of the
/// task it will most likely run next (its own first task of the next product stage).
/// A part that waits has nothing else to do, and a token's stages otherwise start on
/// weights the output layer's stream has pushed out to L3. One cache line per turn of
/// the wait, so the wait still ends as soon as the last task is done. A hint: a part
/// that then runs another task loses nothing but the fetch.
#[derive(Clone, Copy)]
struct Ahead {
    ptr: *const f32,
    len: usize,
}

impl Ahead {
    const NONE: Ahead = Ahead {
        ptr: std::ptr::null(),
        len: 0,
    };

    /// Rows `r0..r0 + rows` of `w` (as many of them as there are).
    fn rows(w: &Weight, r0: usize, rows: usize) -> Ahead {
        match rows.min(w.rows.saturating_sub(r0)) {
            0 => Ahead::NONE,
            rows => Ahead {
                ptr: w.ptr.get().wrapping_add(r0 * w.rs),
                len: (rows - 1) * w.rs + w.cols,
            },
        }
    }

    /// The address of each cache line (16 floats) of the range.
    fn lines(self) -> impl Iterator<Item = *const f32> {
        (0..self.len)
            .step_by(16)
            .map(move |i| self.ptr.wrapping_add(i))
    }
}

/// `n` unclaimed task states.
fn fresh(states: &mut Vec<AtomicU8>, n: usize) {
    states.clear();
    states.resize_with(n, || AtomicU8::new(0));
}

/// The first product of a half, `x·W` for `W: [K, N]` (the QKV or the MLP's up
/// projection), cut into chunks of [`CHUNK_K`] whole rows, one [`Tasks`] task each:
/// every chunk's partial row is computed once, and every part then reads the columns it
/// needs of their sum. A chunk is one contiguous block of the weight (where a part's own
/// columns are short runs a row stride apart: measured 25% slower for the tiny model's
/// QKV).
///
/// The chunks and the order of the sum are those of the op-by-op row form (`gemv`), so
/// these sums, bias included, have its bits.
struct FirstProduct<'a> {
    x: Row,
    w: Weight,
    /// `chunks × N` partial rows (each zeroed by the task that computes it).
    partials: SendPtr,
    tasks: Tasks<'a>,
}

impl FirstProduct<'_> {
    fn chunks(w: &Weight) -> usize {
        w.rows.div_ceil(CHUNK_K)
    }

    /// Makes sure every chunk's partial row is done ([`Tasks::ensure`]).
    fn ensure(&self, first: usize, ahead: Ahead) {
        let chunk = |p| {
            let (r0, n) = (p * CHUNK_K, self.w.cols);
            let rows = CHUNK_K.min(self.w.rows - r0);
            // SAFETY: `x` is written by no task of this stage or an earlier one (the
            // caller's order); chunk p's partial row is this task's alone; the buffer
            // outlives the job.
            let (x, part) = unsafe {
                (
                    self.x.read(),
                    std::slice::from_raw_parts_mut(self.partials.get().add(p * n), n),
                )
            };
            // Zeroed here, where it is about to be in L1, not by the caller.
            part.fill(0.0);
            row_product(
                part,
                &x[r0..r0 + rows],
                self.w.block(r0, rows, 0, n),
                self.w.rs,
            );
        };
        self.tasks.ensure(first, chunk, ahead);
    }

    /// `out = Σ_chunks partial[j0..] + bias[j0..]` over `out.len()` columns, chunks in
    /// order. Only after [`FirstProduct::ensure`].
    fn columns(&self, j0: usize, out: &mut [f32], bias: &[f32]) {
        let n = self.w.cols;
        // SAFETY: every chunk is done (acquired in `ensure`) and no longer written; the
        // buffer outlives the job.
        let all =
            unsafe { std::slice::from_raw_parts(self.partials.get(), self.tasks.0.len() * n) };
        let mut rows = all.chunks_exact(n);
        out.copy_from_slice(&rows.next().expect("at least one chunk")[j0..][..out.len()]);
        for row in rows {
            crate::elementwise::add_assign(out, &row[j0..][..out.len()]);
        }
        add_bias(out, &bias[j0..][..out.len()]);
    }
}

/// The most weights (floats) of a half this path takes: 1 MB. The tiny model's halves
/// (65k and 131k floats, in L3) run faster as one job than op by op; ANDREA-120M's (2.4M
/// and 4.7M floats, read from DRAM) gain nothing from it and keep the fine ops.
pub(crate) const MAX_WEIGHTS: usize = 1 << 18;

/// Whether a half with these weight matrices takes the fused path: one token, rows of the
/// weights contiguous, at most [`MAX_WEIGHTS`] floats in all.
pub(crate) fn takes(
    rows: usize,
    a: &Matrix<'_, CpuBuffer>,
    b: &Matrix<'_, CpuBuffer>,
) -> Option<(Weight, Weight)> {
    let small = a.rows * a.cols + b.rows * b.cols <= MAX_WEIGHTS;
    if rows != 1 || !small {
        return None;
    }
    Weight::of(a).zip(Weight::of(b))
}

/// A checked weight matrix `[rows, cols]` with contiguous rows.
#[derive(Clone, Copy)]
pub(crate) struct Weight {
    ptr: SendPtr,
    rows: usize,
    cols: usize,
    rs: usize,
}

impl Weight {
    /// `m` if it is one matrix with contiguous rows (the fused path's layout).
    pub(crate) fn of(m: &Matrix<'_, CpuBuffer>) -> Option<Self> {
        (m.batch == 1 && m.col_stride == 1 && m.rows > 0).then(|| Weight {
            ptr: SendPtr::of(m),
            rows: m.rows,
            cols: m.cols,
            rs: m.row_stride,
        })
    }

    /// Rows `r0..r0 + rows`, columns `c0..c0 + cols`, as one slice from `(r0, c0)` (rows
    /// at stride `self.rs`).
    fn block(&self, r0: usize, rows: usize, c0: usize, cols: usize) -> &[f32] {
        assert!(rows > 0 && r0 + rows <= self.rows && c0 + cols <= self.cols);
        // SAFETY: inside the checked matrix (asserted); weights are only read.
        unsafe {
            std::slice::from_raw_parts(
                self.ptr.get().add(r0 * self.rs + c0),
                (rows - 1) * self.rs + cols,
            )
        }
    }
}

/// `dst[j] += bias[j]` (the op-by-op path's epilogue, `bias + product`: one rounded
/// addition either way round).
fn add_bias(dst: &mut [f32], bias: &[f32]) {
    for (d, &b) in dst.iter_mut().zip(bias) {
        *d += b;
    }
}

/// Sums partial rows: `out = Σ_p rows[p] + bias`, the rows (`out.len()` floats each)
/// in order, then the bias.
fn sum_rows(out: &mut [f32], rows: &[f32], bias: &[f32]) {
    let c = out.len();
    let mut rows = rows.chunks_exact(c);
    out.copy_from_slice(rows.next().expect("at least one partial row"));
    for row in rows {
        crate::elementwise::add_assign(out, row);
    }
    add_bias(out, bias);
}

/// Runs `part(p, partial row p)` for `p < parts` on the team (`part` overwrites its whole
/// row: the rows hold what an earlier call left), then `out = Σ_p partial_p + bias`.
fn parts_then_sum(
    partials: &mut Vec<f32>,
    parts: usize,
    out: &mut [f32],
    bias: &[f32],
    part: &(dyn Fn(usize, &mut [f32]) + Sync),
) {
    let c = out.len();
    let pp = grown(partials, parts * c);
    crate::team::for_each(parts, &|p| {
        // SAFETY: part p's partial row, `c` floats of `partials`, disjoint from the other
        // parts' rows; `partials` outlives the job.
        let row = unsafe { std::slice::from_raw_parts_mut(pp.get().add(p * c), c) };
        part(p, row);
    });
    sum_rows(out, &partials[..parts * c], bias);
}

/// The attention half of a block for one new token of one sequence: see the module docs.
pub(crate) struct AttentionOne {
    /// `ln_1` of the token, `[C]`.
    pub x: Row,
    pub qkv_w: Weight,
    pub qkv_b: Row,
    /// The cache's keys and values (batch entry 0), rows `0..=pos`.
    pub keys: HeadsPtr,
    pub values: HeadsPtr,
    pub pos: usize,
    pub heads: usize,
    pub proj_w: Weight,
    pub proj_b: Row,
}

impl AttentionOne {
    /// Heads per group and the number of groups: whole heads, at least
    /// [`HEAD_GROUP_MIN`] columns, so that each row of a QKV third gives a group runs of
    /// at least that many floats.
    fn groups(&self) -> (usize, usize) {
        let d = self.x.len / self.heads;
        let per_group = HEAD_GROUP_MIN.div_ceil(d).clamp(1, self.heads);
        (per_group, self.heads.div_ceil(per_group))
    }

    /// Group `g`'s attention, through to its partial row of the projection
    /// (`partial`, `[C]`, overwritten). After `first.ensure`.
    ///
    /// # Safety
    /// As [`AttentionOne::run`]; and the group's heads' cache row `pos` is this call's
    /// alone, the rows before it written by nothing during the call.
    unsafe fn group(&self, first: &FirstProduct<'_>, g: usize, partial: &mut [f32]) {
        let c = self.x.len;
        let d = c / self.heads;
        let (pos, scale) = (self.pos, 1.0 / (d as f32).sqrt());
        let per_group = self.groups().0;
        let (h0, h1) = (g * per_group, ((g + 1) * per_group).min(self.heads));
        let (hg, c0) = (h1 - h0, h0 * d);
        let w = hg * d;
        // SAFETY: a parameter, written by nothing during the job.
        let qkv_b = unsafe { self.qkv_b.read() };
        let mut rows = ROWS.take();
        rows.clear();
        rows.resize(4 * w + hg * (pos + 1), 0.0);
        let (qkv, rest) = rows.split_at_mut(3 * w);
        let (o, s) = rest.split_at_mut(w);
        // q, k, v of heads h0..h1: columns c0..c0 + w of each third of x·W + b.
        for (i, t) in qkv.chunks_exact_mut(w).enumerate() {
            first.columns(i * c + c0, t, qkv_b);
        }
        let (q, kv) = qkv.split_at(w);
        let (k_new, v_new) = kv.split_at(w);
        // Head by head: the cache may keep its heads apart.
        for hh in 0..hg {
            // SAFETY (both): row `pos` of head h0 + hh, inside the checked cache views;
            // only this call touches it (the caller's contract).
            unsafe {
                let (kh, vh) = (&k_new[hh * d..][..d], &v_new[hh * d..][..d]);
                std::ptr::copy_nonoverlapping(kh.as_ptr(), self.keys.at(0, pos, h0 + hh), d);
                std::ptr::copy_nonoverlapping(vh.as_ptr(), self.values.at(0, pos, h0 + hh), d);
            }
        }
        // Per head: scores over the cached rows 0..pos, then the new one; the causal
        // softmax of all pos + 1; the weighted sum of the cached values, then the new
        // value's term, last (the order of the op-by-op path).
        let k_len = pos + 1;
        let cached = Shape {
            n: pos,
            k_len,
            heads: hg,
            d,
        };
        if pos > 0 {
            // SAFETY: rows 0..pos of heads h0..h1, inside the checked view; nothing
            // writes them during the call.
            let kr = unsafe { self.keys.rows(0, pos, (h0, h1)) };
            scores_any(q, kr, self.keys.strides(), s, cached);
        }
        for hh in 0..hg {
            let (qh, kh) = (&q[hh * d..][..d], &k_new[hh * d..][..d]);
            let one = Shape {
                n: 1,
                k_len: 1,
                heads: 1,
                d,
            };
            let new = Strides { pos: d, head: d };
            scores_any(qh, kh, new, &mut s[hh * k_len + pos..][..1], one);
            let mut lse = [0.0f32];
            causal_softmax(
                &mut s[hh * k_len..][..k_len],
                &mut lse,
                0,
                1,
                k_len,
                pos,
                scale,
            );
        }
        if pos > 0 {
            // SAFETY: as above.
            let vr = unsafe { self.values.rows(0, pos, (h0, h1)) };
            weighted_sum_any(s, vr, self.values.strides(), o, cached);
        } else {
            o.fill(0.0);
        }
        for hh in 0..hg {
            let p = s[hh * k_len + pos];
            for (oi, &vi) in o[hh * d..][..d].iter_mut().zip(&v_new[hh * d..][..d]) {
                *oi = p.mul_add(vi, *oi);
            }
        }
        // The heads' share of the projection: rows c0..c0 + w of its weight.
        partial.fill(0.0);
        row_product(partial, o, self.proj_w.block(c0, w, 0, c), self.proj_w.rs);
        ROWS.set(rows);
    }

    /// `out = attention half(x)`, `[C]`, the new key and value in the cache's row `pos`.
    ///
    /// # Safety
    /// The rows and cache views must have passed `check::decode_attention` (rows
    /// `0..=pos` of `heads` heads inside their buffer, disjoint from `out` and from every
    /// input), and nothing else may touch them during the call.
    pub(crate) unsafe fn run(&self, out: &mut [f32]) {
        let groups = self.groups().1;
        let chunks = FirstProduct::chunks(&self.qkv_w);
        with_scratch(|s| {
            fresh(&mut s.states, chunks);
            let first = FirstProduct {
                x: self.x,
                w: self.qkv_w,
                partials: grown(&mut s.first_qkv, chunks * self.qkv_w.cols),
                tasks: Tasks(&s.states),
            };
            // SAFETY: parameters, written by nothing during the call.
            let proj_b = unsafe { self.proj_b.read() };
            parts_then_sum(&mut s.parts_attn, groups, out, proj_b, &|g, partial| {
                first.ensure(g % chunks, Ahead::NONE);
                // SAFETY: group g's heads are this part's alone (the caller's contract).
                unsafe { self.group(&first, g, partial) }
            });
        });
    }
}

/// The MLP of a block for one token: see the module docs.
pub(crate) struct MlpOne {
    /// `ln_2` of the token, `[C]`.
    pub x: Row,
    pub fc_w: Weight,
    pub fc_b: Row,
    pub proj_w: Weight,
    pub proj_b: Row,
}

impl MlpOne {
    fn bands(&self) -> usize {
        self.fc_w.cols.div_ceil(MLP_BAND)
    }

    /// Band `p`: `h = GELU((x·W_fc)[j0..j1] + b_fc[j0..j1])`, then its partial row
    /// `h · W_proj[j0..j1, :]` (`partial`, `[C]`, overwritten). After `first.ensure`.
    ///
    /// # Safety
    /// As [`MlpOne::run`].
    unsafe fn band(&self, first: &FirstProduct<'_>, p: usize, partial: &mut [f32]) {
        let (c, hidden) = (self.x.len, self.fc_w.cols);
        let j0 = p * MLP_BAND;
        let w = MLP_BAND.min(hidden - j0);
        // SAFETY: a parameter, written by nothing during the job.
        let fc_b = unsafe { self.fc_b.read() };
        let mut h = ROWS.take();
        h.clear();
        h.resize(w, 0.0);
        first.columns(j0, &mut h, fc_b);
        crate::elementwise::gelu_slice(None, &mut h);
        partial.fill(0.0);
        row_product(partial, &h, self.proj_w.block(j0, w, 0, c), self.proj_w.rs);
        ROWS.set(h);
    }

    /// `out = GELU(x·W_fc + b_fc)·W_proj + b_proj`, `[C]`.
    ///
    /// # Safety
    /// The rows must have passed `check::mlp_forward` (`out` disjoint from every input)
    /// and nothing else may write them during the call.
    pub(crate) unsafe fn run(&self, out: &mut [f32]) {
        let chunks = FirstProduct::chunks(&self.fc_w);
        with_scratch(|s| {
            fresh(&mut s.states, chunks);
            let first = FirstProduct {
                x: self.x,
                w: self.fc_w,
                partials: grown(&mut s.first_fc, chunks * self.fc_w.cols),
                tasks: Tasks(&s.states),
            };
            // SAFETY: a parameter, written by nothing during the call.
            let proj_b = unsafe { self.proj_b.read() };
            parts_then_sum(
                &mut s.parts_mlp,
                self.bands(),
                out,
                proj_b,
                &|p, partial| {
                    first.ensure(p % chunks, Ahead::NONE);
                    // SAFETY: the caller's contract.
                    unsafe { self.band(&first, p, partial) }
                },
            );
        });
    }
}

/// A LayerNorm step of the stack: its parameters and outputs (`mean`, `rstd`: one float).
pub(crate) struct NormOne {
    pub gamma: Row,
    pub beta: Row,
    pub out: Row,
    pub mean: Row,
    pub rstd: Row,
}

/// One block of the decoder stack for one new token (`DecodeOps::decode_blocks`):
/// `attention.x` is `ln_1`, `mlp.x` is `ln_2.out`.
pub(crate) struct BlockOne {
    pub attention: AttentionOne,
    pub mlp: MlpOne,
    /// The block's input, the residual stream.
    pub x: Row,
    pub residual_2: Row,
    pub ln_2: NormOne,
    /// May be exactly `residual_2`.
    pub residual_3: Row,
    pub next: NormOne,
}

impl BlockOne {
    /// Tasks of each stage: QKV chunks, attention groups, the residual step after the
    /// attention (one), MLP chunks, MLP bands, the residual step after the MLP (one).
    fn stages(&self) -> [usize; 6] {
        [
            FirstProduct::chunks(&self.attention.qkv_w),
            self.attention.groups().1,
            1,
            FirstProduct::chunks(&self.mlp.fc_w),
            self.mlp.bands(),
            1,
        ]
    }
}

/// `residual = x + sum` (in place when `residual` is exactly `x`), then the LayerNorm of
/// it into `norm`: the bits of the `residual_layernorm` op on that row.
///
/// # Safety
/// `x`, `residual` and `norm`'s rows checked as that op checks them, `sum` not among
/// them; nothing else touches them during the call.
unsafe fn residual_step(x: Row, sum: &[f32], residual: Row, norm: &NormOne, eps: f32) {
    // SAFETY: the caller's contract; `x` is read before `residual` is made only where the
    // two are different rows (disjoint, checked).
    unsafe {
        let src = if residual.same_as(x) {
            ResidualSrc::AddInto(sum)
        } else {
            ResidualSrc::Sum(x.read(), sum)
        };
        residual_forward(
            src,
            residual.write(),
            norm.gamma.read(),
            norm.beta.read(),
            norm.out.write(),
            norm.mean.write(),
            norm.rstd.write(),
            eps,
        );
    }
}

/// `blocks` one after the other for one new token, as one job of the team: every part
/// (one per thread) walks all the blocks' stages ([`BlockOne::stages`]), each stage's
/// tasks claimed as [`Tasks`] (each done once, by whichever part claims it first), and
/// waits at each stage's end for the rest of its tasks. A stage reads only what earlier
/// stages wrote, in the order of the default's ops, so the result is that of the four
/// ops per block, bit for bit, on any number of threads: the fused halves' sums, then
/// the residual steps on one row as `residual_layernorm` computes it.
///
/// # Safety
/// Every block's views must have passed `check::decode_block` (with the cache rows
/// `0..=pos` of one sequence and one new row); nothing else may touch them during the
/// call.
pub(crate) unsafe fn run_blocks(blocks: &[BlockOne], eps: f32) {
    if blocks.is_empty() {
        return;
    }
    with_scratch(|s| {
        let mut stages = std::mem::take(&mut s.stages);
        stages.clear();
        stages.extend(blocks.iter().map(BlockOne::stages));
        fresh(&mut s.states, stages.iter().flatten().sum());
        let (mut qkv_len, mut fc_len, mut attn_len, mut mlp_len, mut c_max) = (0, 0, 0, 0, 0);
        for (b, st) in blocks.iter().zip(&stages) {
            let c = b.x.len;
            qkv_len = qkv_len.max(st[0] * b.attention.qkv_w.cols);
            attn_len = attn_len.max(st[1] * c);
            fc_len = fc_len.max(st[3] * b.mlp.fc_w.cols);
            mlp_len = mlp_len.max(st[4] * c);
            c_max = c_max.max(c);
        }
        // Each stage's buffer is reused by every block: its readers are tasks of the
        // same block's next stage, all done before the next block's stages begin.
        let first_qkv = grown(&mut s.first_qkv, qkv_len);
        let first_fc = grown(&mut s.first_fc, fc_len);
        let parts_attn = grown(&mut s.parts_attn, attn_len);
        let parts_mlp = grown(&mut s.parts_mlp, mlp_len);
        let sum = grown(&mut s.sum, c_max);
        let states = &s.states[..];
        let threads = rayon::current_num_threads().max(1);
        crate::team::for_each(threads, &|part| {
            let mut at = 0;
            for (i, (b, st)) in blocks.iter().zip(&stages).enumerate() {
                // What this part fetches while it waits at the end of a stage: its first
                // task of the next product stage (see `Ahead`).
                let group_rows =
                    b.attention.groups().0 * b.attention.proj_w.rows / b.attention.heads;
                let proj_ahead =
                    Ahead::rows(&b.attention.proj_w, part % st[1] * group_rows, group_rows);
                let fc_ahead = Ahead::rows(&b.mlp.fc_w, part % st[3] * CHUNK_K, CHUNK_K);
                let band_ahead = Ahead::rows(&b.mlp.proj_w, part % st[4] * MLP_BAND, MLP_BAND);
                let qkv_ahead = blocks.get(i + 1).map_or(Ahead::NONE, |nb| {
                    let chunks = FirstProduct::chunks(&nb.attention.qkv_w);
                    Ahead::rows(&nb.attention.qkv_w, part % chunks * CHUNK_K, CHUNK_K)
                });
                let mut next = |n: usize| {
                    let t = Tasks(&states[at..at + n]);
                    at += n;
                    t
                };
                let c = b.x.len;
                // SAFETY (the partial rows): row g of a stage's buffer is written by its
                // task alone, then read by the next stage's one task; the buffers
                // outlive the job.
                let row = |p: SendPtr, g: usize| unsafe {
                    std::slice::from_raw_parts_mut(p.get().add(g * c), c)
                };
                let first = FirstProduct {
                    x: b.attention.x,
                    w: b.attention.qkv_w,
                    partials: first_qkv,
                    tasks: next(st[0]),
                };
                first.ensure(part, proj_ahead);
                // SAFETY: each group's heads are its task's alone.
                let group = |g| unsafe { b.attention.group(&first, g, row(parts_attn, g)) };
                next(st[1]).ensure(part, group, fc_ahead);
                let residual = |_| {
                    // SAFETY: the groups' rows are done; `sum` is this task's alone.
                    unsafe {
                        let (out, rows) = (
                            row(sum, 0),
                            std::slice::from_raw_parts(parts_attn.get(), st[1] * c),
                        );
                        sum_rows(out, rows, b.attention.proj_b.read());
                        residual_step(b.x, out, b.residual_2, &b.ln_2, eps);
                    }
                };
                next(1).ensure(0, residual, fc_ahead);
                let first = FirstProduct {
                    x: b.mlp.x,
                    w: b.mlp.fc_w,
                    partials: first_fc,
                    tasks: next(st[3]),
                };
                first.ensure(part, band_ahead);
                // SAFETY: the caller's contract.
                let band = |p| unsafe { b.mlp.band(&first, p, row(parts_mlp, p)) };
                next(st[4]).ensure(part, band, qkv_ahead);
                let residual = |_| {
                    // SAFETY: the bands' rows are done; `sum` is this task's alone.
                    unsafe {
                        let (out, rows) = (
                            row(sum, 0),
                            std::slice::from_raw_parts(parts_mlp.get(), st[4] * c),
                        );
                        sum_rows(out, rows, b.mlp.proj_b.read());
                        residual_step(b.residual_2, out, b.residual_3, &b.next, eps);
                    }
                };
                next(1).ensure(0, residual, qkv_ahead);
            }
        });
        s.stages = stages;
    });
}

/// One new token of one sequence through a small model's blocks as one team job
/// (`run_blocks`); anything else (more rows, weights over `MAX_WEIGHTS` a half) block by
/// block as the default's four ops.
impl andrea_core::DecodeOps for crate::CpuBackend {
    fn decode_blocks(&self, blocks: &[DecodeBlockOf<'_, Self>], eps: f32) -> Result<()> {
        use andrea_core::AttentionOps;
        // A panic while the lock was held left the memo as it was: still sound.
        let mut memo = self.decode_checks.lock().unwrap_or_else(|e| e.into_inner());
        let norm = |p: &andrea_core::NormParams<'_, CpuBuffer>,
                    o: &andrea_core::NormOutputs<'_, CpuBuffer>| NormOne {
            gamma: Row::of(&p.gamma),
            beta: Row::of(&p.beta),
            out: Row::of(&o.out),
            mean: Row::of(&o.mean),
            rstd: Row::of(&o.rstd),
        };
        // Every block is checked before any runs. If all of them take the one-job path,
        // their task structs go into this thread's list (reused: a token allocates
        // nothing here).
        let mut ones = BLOCKS.take();
        ones.clear();
        // BF16 precision takes the fine ops, whose products read the BF16 weights.
        let mut one_job = self.precision == andrea_core::MatmulPrecision::Fp32;
        let checked = blocks.iter().enumerate().try_for_each(|(i, b)| {
            let d = memo.check(i, b, eps, |s| self.attention_workspace_len(s))?;
            let rows = d.batch * d.q_len;
            let w = takes(rows, &b.c_attn.weight, &b.attn_proj.weight).zip(takes(
                rows,
                &b.c_fc.weight,
                &b.mlp_proj.weight,
            ));
            match w {
                Some(((qkv_w, attn_proj_w), (fc_w, mlp_proj_w))) if one_job => {
                    ones.push(BlockOne {
                        attention: AttentionOne {
                            x: Row::of(&b.ln_1),
                            qkv_w,
                            qkv_b: Row::of(&b.c_attn.bias),
                            keys: HeadsPtr::of(&b.keys),
                            values: HeadsPtr::of(&b.values),
                            pos: d.pos,
                            heads: d.heads,
                            proj_w: attn_proj_w,
                            proj_b: Row::of(&b.attn_proj.bias),
                        },
                        mlp: MlpOne {
                            x: Row::of(&b.ln_2_out.out),
                            fc_w,
                            fc_b: Row::of(&b.c_fc.bias),
                            proj_w: mlp_proj_w,
                            proj_b: Row::of(&b.mlp_proj.bias),
                        },
                        x: Row::of(&b.x),
                        residual_2: Row::of(&b.residual_2),
                        ln_2: norm(&b.ln_2, &b.ln_2_out),
                        residual_3: Row::of(&b.residual_3),
                        next: norm(&b.next, &b.next_out),
                    })
                }
                _ => one_job = false,
            }
            Ok::<_, andrea_core::Error>(())
        });
        let result = checked.and_then(|()| {
            if one_job {
                // SAFETY: every block passed `check::decode_block` (one row, its cache
                // rows 0..=pos inside the views); `&self` ops run one at a time.
                self.run(|| unsafe { run_blocks(&ones, eps) });
                Ok(())
            } else {
                blocks
                    .iter()
                    .try_for_each(|b| fused::decode_block_steps(self, b, eps))
            }
        });
        ones.clear();
        BLOCKS.set(ones);
        result
    }
}
