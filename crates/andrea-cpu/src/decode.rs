//! The two halves of a block for one new token (batch 1): generation's
//! `decode_attention` and `mlp_forward`, each one job of the spinning team (`team`
//! module) instead of a chain of them.
//!
//! Op by op, a tiny-model token (configs/tiny.toml) is 21 parallel jobs: per block the
//! QKV product, the attention, the projection, the MLP's two products; then the output
//! layer. Each is a few microseconds of work, and each hands parts to the other core and
//! waits for the last one back: about 0.5 µs for an empty job of two parts and 1.2 µs for
//! one of eight on the Emerald Rapids host (2026-12-06), plus whatever the slower part
//! keeps the faster waiting. Here each half is one job of parts that meet twice: once
//! inside the job, where every part needs the whole first product, and once at its end,
//! in a sum of partial rows:
//!
//! * **The first product** (`x·W_qkv`, `x·W_fc`) in chunks of `gemv::CHUNK_K` whole
//!   weight rows, each computed once by the first part to claim it ([`FirstProduct`]):
//!   contiguous blocks of the weight, where a part's own columns would be short runs a row
//!   stride apart (those took the tiny model's attention half 25% longer).
//! * **Attention, one part per group of heads** at least [`HEAD_GROUP_MIN`] columns wide
//!   (`c0..c0 + w` of each third of the QKV): `q`, `k`, `v` of those heads from the first
//!   product's sums plus bias; `k`, `v` into the cache's row `pos`; the heads' attention
//!   over the cached rows `0..pos` and the new one; then their share of the projection,
//!   `atty[c0..c0 + w] · W_proj[c0..c0 + w, :]`, a partial row of `C`. The call sums the
//!   partial rows in group order and adds the bias.
//! * **MLP, one part per band of [`MLP_BAND`] hidden columns** `j0..j1`:
//!   `h = GELU((x·W_fc)[j0..j1] + b_fc[j0..j1])`, then `h · W_proj[j0..j1, :]`, a
//!   partial row of `C`; summed in band order, plus the bias.
//!
//! Products run on the row form's kernel (`gemv::row_product`, with AVX-512 a partial row
//! in registers while the weight rows stream past). Parts, chunks and the order of every
//! sum depend only on the sizes, so, like the rest of the backend, the result does not
//! depend on the thread count. The first products (bias included) have the bits of the
//! op-by-op path; the output differs from it in the last bits (the projections' partial
//! rows are cut by heads and bands, not by `gemv::CHUNK_K` rows).
//!
//! A part reads the cache's rows `0..pos` of its heads (which no part writes) and writes
//! only its heads' row `pos`, kept in its own buffers for its attention: no slice a part
//! holds covers memory another part writes.
//!
//! Other shapes (more than one new position or sequence, a weight whose rows are not
//! contiguous, weights of more than [`MAX_WEIGHTS`] floats a half: ANDREA-120M's) take
//! the default composition of fine ops, as does every call with
//! `ANDREA_DECODE_FUSED=off` (read once), kept to compare.

use std::cell::Cell;
use std::sync::atomic::{AtomicU8, Ordering};

use andrea_core::Matrix;

use crate::attention::causal_softmax;
use crate::attention::HeadsPtr;
use crate::attention_decode::{scores_any, weighted_sum_any, Shape};
use crate::buffer::{CpuBuffer, SendPtr};
use crate::gemv::{row_product, CHUNK_K};

/// Hidden columns per part of the MLP: the tiny model's 512 in four parts, ANDREA-120M's
/// 3,072 in 24.
pub(crate) const MLP_BAND: usize = 128;
/// The fewest columns of a part of the attention: whole heads, at least this many
/// (the tiny model's 32-wide heads in pairs, ANDREA-120M's 64-wide ones one by one).
pub(crate) const HEAD_GROUP_MIN: usize = 64;

thread_local! {
    /// The parts' partial rows, on the calling thread; reused across calls.
    static PARTIALS: Cell<Vec<f32>> = const { Cell::new(Vec::new()) };
    /// A part's small rows (the query, the new key and value, the head's output, the
    /// MLP band's hidden values, the scores); reused across calls.
    static ROWS: Cell<Vec<f32>> = const { Cell::new(Vec::new()) };
    /// The first product's chunk partials and their states ([`FirstProduct`]), on the
    /// calling thread; reused across calls.
    static FIRST: Cell<Vec<f32>> = const { Cell::new(Vec::new()) };
    static STATES: Cell<Vec<AtomicU8>> = const { Cell::new(Vec::new()) };
}

/// The most weights (floats) of a half this path takes. Measured on the Emerald Rapids
/// host (2026-12-06, alternating runs of `andrea bench decode`): the tiny model (halves
/// of 65k and 131k floats, in L3) 1.07-1.24x faster than op by op; ANDREA-120M (2.4M and
/// 4.7M floats, from DRAM) 2.2x slower when each part read its own columns of the first
/// weight, and with the chunked first product either level (63-77 tokens/s op by op,
/// 66-75 fused) or at half speed (31-40) from one run to the next, cause not found: it
/// keeps the fine ops. Sizes in between were not measured; the bound sits between the
/// two, at 1 MB of weights.
pub(crate) const MAX_WEIGHTS: usize = 1 << 18;

/// Whether a half with these weight matrices takes the fused path: one token, rows of the
/// weights contiguous, at most [`MAX_WEIGHTS`] floats in all, and the path on.
pub(crate) fn takes(
    rows: usize,
    a: &Matrix<'_, CpuBuffer>,
    b: &Matrix<'_, CpuBuffer>,
) -> Option<(Weight, Weight)> {
    let small = a.rows * a.cols + b.rows * b.cols <= MAX_WEIGHTS;
    if rows != 1 || !small || !enabled() {
        return None;
    }
    Weight::of(a).zip(Weight::of(b))
}

/// The first product of a half, `x·W` for `W: [K, N]` (the QKV or the MLP's up
/// projection), cut into chunks of [`CHUNK_K`] whole rows: each chunk's partial row is
/// computed once, by the first part to claim it, and every part then reads the columns
/// it needs of their sum. A chunk is one contiguous block of the weight (where a part's
/// own columns are short runs a row stride apart: measured 25% slower for the tiny
/// model's QKV). The parts wait for each other here, but never for a part that has not
/// started: a part claims each unclaimed chunk itself (state 0 -> 1) and only waits for
/// a chunk another part is computing (state 1 -> 2), which depends on nothing.
///
/// The chunks and the order of the sum are those of the op-by-op row form (`gemv`), so
/// these sums, bias included, have its bits.
struct FirstProduct<'a> {
    x: &'a [f32],
    w: Weight,
    /// `chunks × N` partial rows (each zeroed by the part that computes it).
    partials: SendPtr,
    /// Per chunk: 0 unclaimed, 1 being computed, 2 done.
    state: &'a [AtomicU8],
}

impl FirstProduct<'_> {
    /// Makes sure every chunk's partial row is done: claims and computes the unclaimed
    /// ones, from chunk `first` on (a part's own, so that with as many parts as threads
    /// each computes one), then waits for the rest.
    fn ensure(&self, first: usize) {
        let chunks = self.state.len();
        for i in 0..chunks {
            let p = (first + i) % chunks;
            if self.state[p]
                .compare_exchange(0, 1, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
            {
                let (r0, n) = (p * CHUNK_K, self.w.cols);
                let rows = CHUNK_K.min(self.w.rows - r0);
                // SAFETY: chunk p's partial row, claimed by this part alone (the state's
                // compare-and-swap); the buffer outlives the job.
                let part =
                    unsafe { std::slice::from_raw_parts_mut(self.partials.get().add(p * n), n) };
                // Zeroed here, where it is about to be in L1, not by the caller.
                part.fill(0.0);
                row_product(
                    part,
                    &self.x[r0..r0 + rows],
                    self.w.block(r0, rows, 0, n),
                    self.w.rs,
                );
                self.state[p].store(2, Ordering::Release);
            }
        }
        for st in self.state {
            while st.load(Ordering::Acquire) != 2 {
                std::hint::spin_loop();
            }
        }
    }

    /// `out = Σ_chunks partial[j0..] + bias[j0..]` over `out.len()` columns, chunks in
    /// order. Only after [`FirstProduct::ensure`].
    fn columns(&self, j0: usize, out: &mut [f32], bias: &[f32]) {
        let n = self.w.cols;
        // SAFETY: every chunk is done (state 2, acquired in `ensure`) and no longer
        // written; the buffer outlives the job.
        let all = unsafe { std::slice::from_raw_parts(self.partials.get(), self.state.len() * n) };
        let mut rows = all.chunks_exact(n);
        out.copy_from_slice(&rows.next().expect("at least one chunk")[j0..][..out.len()]);
        for row in rows {
            crate::elementwise::add_assign(out, &row[j0..][..out.len()]);
        }
        add_bias(out, &bias[j0..][..out.len()]);
    }
}

/// Runs `f` with a [`FirstProduct`] of `x·w` whose chunks are all unclaimed.
fn with_first_product<R>(x: &[f32], w: Weight, f: impl FnOnce(&FirstProduct<'_>) -> R) -> R {
    let chunks = w.rows.div_ceil(CHUNK_K);
    let mut partials = FIRST.take();
    // Grown, never cleared: each chunk's row is zeroed by the part that computes it.
    if partials.len() < chunks * w.cols {
        partials.resize(chunks * w.cols, 0.0);
    }
    let mut state = STATES.take();
    state.clear();
    state.resize_with(chunks, || AtomicU8::new(0));
    let first = FirstProduct {
        x,
        w,
        partials: SendPtr(partials.as_mut_ptr()),
        state: &state,
    };
    let r = f(&first);
    FIRST.set(partials);
    STATES.set(state);
    r
}

/// Whether the fused path is on (`ANDREA_DECODE_FUSED`, read once: `off` runs the fine
/// ops one by one, to compare).
pub(crate) fn enabled() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| match std::env::var("ANDREA_DECODE_FUSED") {
        Ok(v) if v.trim().eq_ignore_ascii_case("off") => false,
        Ok(v) if v.trim().eq_ignore_ascii_case("on") || v.trim().is_empty() => true,
        Ok(v) => {
            eprintln!(
                "andrea-cpu: ignoring ANDREA_DECODE_FUSED={v:?} (expected on or off); using on"
            );
            true
        }
        Err(_) => true,
    })
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

/// Runs `part(p, partial row p)` for `p < parts` on the team (`part` overwrites its whole
/// row: the rows hold what an earlier call left), then
/// `out = bias + Σ_p partial_p` (summed in part order).
fn parts_then_sum(
    parts: usize,
    out: &mut [f32],
    bias: &[f32],
    part: &(dyn Fn(usize, &mut [f32]) + Sync),
) {
    let c = out.len();
    let mut partials = PARTIALS.take();
    // Grown, never cleared: `part` overwrites its whole row.
    if partials.len() < parts * c {
        partials.resize(parts * c, 0.0);
    }
    let pp = SendPtr(partials.as_mut_ptr());
    crate::team::for_each(parts, &|p| {
        // SAFETY: part p's partial row, `c` floats of `partials`, disjoint from the other
        // parts' rows; `partials` outlives the job.
        let row = unsafe { std::slice::from_raw_parts_mut(pp.get().add(p * c), c) };
        part(p, row);
    });
    let (first, rest) = partials[..parts * c].split_at_mut(c);
    for row in rest.chunks_exact(c) {
        crate::elementwise::add_assign(first, row);
    }
    out.copy_from_slice(first);
    add_bias(out, bias);
    PARTIALS.set(partials);
}

/// The attention half of a block for one new token of one sequence: see the module docs.
pub(crate) struct AttentionOne<'a> {
    /// `ln_1` of the token, `[C]`.
    pub x: &'a [f32],
    pub qkv_w: Weight,
    pub qkv_b: &'a [f32],
    /// The cache's keys and values (batch entry 0), rows `0..=pos`.
    pub keys: HeadsPtr,
    pub values: HeadsPtr,
    pub pos: usize,
    pub heads: usize,
    pub proj_w: Weight,
    pub proj_b: &'a [f32],
}

impl AttentionOne<'_> {
    /// `out = attention half(x)`, `[C]`, the new key and value in the cache's row `pos`.
    ///
    /// # Safety
    /// The cache views must have passed `check::decode_attention` (rows `0..=pos` of
    /// `heads` heads inside their buffer, disjoint from `out` and from every input), and
    /// nothing else may touch them during the call.
    pub(crate) unsafe fn run(&self, out: &mut [f32]) {
        let c = self.x.len();
        let d = c / self.heads;
        let (pos, scale) = (self.pos, 1.0 / (d as f32).sqrt());
        // Parts of whole heads at least HEAD_GROUP_MIN columns wide, so that each row of
        // a QKV third gives a part runs of at least that many floats.
        let per_part = HEAD_GROUP_MIN.div_ceil(d).clamp(1, self.heads);
        let parts = self.heads.div_ceil(per_part);
        let group = |first: &FirstProduct<'_>, g: usize, partial: &mut [f32]| {
            let (h0, h1) = (g * per_part, ((g + 1) * per_part).min(self.heads));
            let (hg, c0) = (h1 - h0, h0 * d);
            let w = hg * d;
            let mut rows = ROWS.take();
            rows.clear();
            rows.resize(4 * w + hg * (pos + 1), 0.0);
            let (qkv, rest) = rows.split_at_mut(3 * w);
            let (o, s) = rest.split_at_mut(w);
            // q, k, v of heads h0..h1: columns c0..c0 + w of each third of x·W + b.
            first.ensure(g % first.state.len());
            for (i, t) in qkv.chunks_exact_mut(w).enumerate() {
                first.columns(i * c + c0, t, self.qkv_b);
            }
            let (q, kv) = qkv.split_at(w);
            let (k_new, v_new) = kv.split_at(w);
            // SAFETY (both): row `pos` of heads h0..h1, inside the checked cache views;
            // only this part touches it (the module docs).
            unsafe {
                std::ptr::copy_nonoverlapping(k_new.as_ptr(), self.keys.at(0, pos, h0), w);
                std::ptr::copy_nonoverlapping(v_new.as_ptr(), self.values.at(0, pos, h0), w);
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
            let (ks, vs) = (self.keys.seq_stride(), self.values.seq_stride());
            if pos > 0 {
                // SAFETY: rows 0..pos of heads h0..h1, inside the checked view; no part
                // writes them during the job.
                let kr = unsafe {
                    std::slice::from_raw_parts(self.keys.at(0, 0, h0), (pos - 1) * ks + w)
                };
                scores_any(q, kr, ks, s, cached);
            }
            for hh in 0..hg {
                let (qh, kh) = (&q[hh * d..][..d], &k_new[hh * d..][..d]);
                let one = Shape {
                    n: 1,
                    k_len: 1,
                    heads: 1,
                    d,
                };
                scores_any(qh, kh, d, &mut s[hh * k_len + pos..][..1], one);
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
                let vr = unsafe {
                    std::slice::from_raw_parts(self.values.at(0, 0, h0), (pos - 1) * vs + w)
                };
                weighted_sum_any(s, vr, vs, o, cached);
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
        };
        with_first_product(self.x, self.qkv_w, |first| {
            parts_then_sum(parts, out, self.proj_b, &|g, partial| {
                group(first, g, partial)
            })
        });
    }
}

/// The MLP of a block for one token: see the module docs.
pub(crate) struct MlpOne<'a> {
    /// `ln_2` of the token, `[C]`.
    pub x: &'a [f32],
    pub fc_w: Weight,
    pub fc_b: &'a [f32],
    pub proj_w: Weight,
    pub proj_b: &'a [f32],
}

impl MlpOne<'_> {
    /// `out = GELU(x·W_fc + b_fc)·W_proj + b_proj`, `[C]`.
    pub(crate) fn run(&self, out: &mut [f32]) {
        let (c, hidden) = (self.x.len(), self.fc_w.cols);
        let band = |first: &FirstProduct<'_>, p: usize, partial: &mut [f32]| {
            let j0 = p * MLP_BAND;
            let w = MLP_BAND.min(hidden - j0);
            let mut h = ROWS.take();
            h.clear();
            h.resize(w, 0.0);
            first.ensure(p % first.state.len());
            first.columns(j0, &mut h, self.fc_b);
            crate::elementwise::gelu_slice(None, &mut h);
            partial.fill(0.0);
            row_product(partial, &h, self.proj_w.block(j0, w, 0, c), self.proj_w.rs);
            ROWS.set(h);
        };
        let parts = hidden.div_ceil(MLP_BAND);
        with_first_product(self.x, self.fc_w, |first| {
            parts_then_sum(parts, out, self.proj_b, &|p, partial| {
                band(first, p, partial)
            })
        });
    }
}
