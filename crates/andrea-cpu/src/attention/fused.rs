//! Fused causal attention for AVX2 + FMA and AVX-512, the default attention path where
//! the level has AVX2 + FMA:
//! the training forward and backward of one (batch entry, head) per task with no call to
//! a general GEMM, for head sizes that are a multiple of 16 (the tiny model's 32,
//! ANDREA-120M's 64).
//!
//! Why: the `attention` module's blocked path runs its seven per-head products through
//! `sgemm_strided`, which packs both operands on every call and re-packs `kᵀ` and `vᵀ`
//! for each block of 64 queries; its products have an inner dimension of 32 or 64 and
//! skip only whole 64 x 64 blocks of the masked triangle (62.5% of `T x T` computed at
//! `T` 256), so it ran at a third of the rate of the step's large GEMMs.
//!
//! Here every operand is packed at most once per head, and one micro-kernel ([`tile`],
//! a 6 x 16 tile of the result in twelve 8-lane accumulators, two loads of `B` and six
//! broadcasts of `A` per step, the layout of `gemm::avx2`'s) computes every product,
//! reading `A` where it lies (its six rows through six pointers, at any stride). Where
//! the kernels may use AVX-512 and the head size is a multiple of 32, the tile is 6 x 32
//! in twelve 16-lane accumulators ([`Width::Zmm`]: the same loads for twice the FMAs),
//! the panels are 32 wide and the row passes run at 16 lanes; it runs the same chains,
//! so both widths give the same bits (a unit test compares them on an AVX-512 CPU):
//!
//! * forward, six queries at a time (16 columns) or blocks of 64 (32 columns): `S = q·kᵀ`
//!   over the keys each six see, rounded up to the tile's width (`kᵀ` packed once into
//!   16- or 32-key panels by 8 x 8 register transposes), the row softmax of `S/sqrt(D)`
//!   in place (`avx2::softmax_rows`, or `avx512::softmax_row` row by row, keeping each
//!   row's base-2 log-sum-exp), then `out = P·v` (`v` packed once into panels), written
//!   once. Computed: `T(T+1)/2` rounded up to tiles, 53% of `T x T` at 256 with 16
//!   columns.
//! * backward, blocks of 64 queries: `S` and `dP = dO·vᵀ` for six rows at a time,
//!   `P = 2^(S·scale·log2 e - L)` and `dS = scale·P∘(dP - rowsum(P∘dP))` row by row,
//!   `dq = dS·k` (six rows at a time, `k` packed once into panels), then
//!   `dv += Pᵀ·dO` and `dk += dSᵀ·q` six keys at a time over the block's rows that see
//!   them (`Pᵀ` read in place: six adjacent columns of `P`, a row stride per step; the
//!   block's rows of `dO` and `q` copied side by side first).
//!
//! The order of the tiles is what the memory allows ([`each_tile`]): a 32-column tile
//! reads its `B` panel twice as fast per FMA as a 16-column one, faster than L2 streams
//! it, so at 32 columns the tiles go panel by panel over a block's rows, each panel in L1
//! while they pass; rows a head's stride apart (`q`, `dO`: 2-9 kB, one to three rows of
//! the model) share a few L1 sets, so a block's rows that are read again and again are
//! copied side by side, and the backward's `P` and `dS` rows are 16 floats longer than
//! their keys for the same reason (their columns are read).
//!
//! **Results.** Each output element is one FMA chain in the inner index's order (keys
//! for `P·v` and `dS·k`, the head dimension for `S` and `dP`, queries for `dv`, `dk`),
//! the chains of `dv`, `dk` added to the running sum block by block, in block order.
//! The operations depend on the shapes alone, never on the thread count. The forward
//! gives the blocked path's bits (the same chains; the blocked path's extra terms are
//! exact zeros) up to 256 keys, one `k` slice of `gemm::avx2`; the backward differs in
//! the last bits (the order of `rowsum(P∘dP)`, the rows of zeros `dv`, `dk` skip),
//! within the suite's attention tolerance, which `tests/conformance.rs` runs on this
//! kernel (the default backend's attention).

use std::arch::x86_64::*;
use std::cell::RefCell;
use std::f32::consts::LOG2_E;

use rayon::prelude::*;

use andrea_core::check::AttentionDims;

use crate::simd;
use crate::simd::lanes::transpose8;
use crate::views::Operand;
use crate::views::{head, HeadsPtr};

/// Rows of a tile (queries in `S`, `dP`, `out`, `dq`; keys in `dv`, `dk`).
const MR: usize = 6;
/// Queries per block of the backward pass: the block's `P` and `dS` (`64 x T`) stay in
/// L2 while `dv` and `dk` take their sums over it.
const QUERY_BLOCK: usize = 64;
/// Rows of the backward's block buffers: the last six-row tile of a block may run past
/// its 64 rows (rows past the block repeat its last row and are never read).
const BLOCK_ROWS: usize = QUERY_BLOCK.next_multiple_of(MR);
/// Floats past the keys in each row of the backward's block buffers (`P`, `dS`): the
/// `dv` and `dk` tiles read those buffers down their columns, and rows a multiple of
/// 1 kB apart would fall into a few sets of the L1 cache.
const ROW_PAD: usize = 16;

/// The tile's columns: two vectors of 8 lanes (AVX2 + FMA) or of 16 (AVX-512 F). Every
/// operand is packed in panels of that many columns, and head sizes must be a multiple
/// of it.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Width {
    /// 16 columns in two `ymm` registers per row.
    Ymm,
    /// 32 columns in two `zmm` registers per row.
    Zmm,
}

impl Width {
    /// Columns of a tile.
    pub(crate) const fn nr(self) -> usize {
        match self {
            Width::Ymm => 16,
            Width::Zmm => 32,
        }
    }
}

/// The tile this kernel runs attention with for heads of `head_dim` on this CPU, or
/// `None` where it cannot (no AVX2 + FMA, or a head size not a multiple of 16): the
/// 32-column tile where the kernels may use AVX-512 ([`simd::has_avx512`]), `wide` is
/// set and the head size is a multiple of 32, the 16-column one otherwise.
pub(crate) fn width(head_dim: usize, wide: bool) -> Option<Width> {
    let fits = |w: Width| head_dim > 0 && head_dim.is_multiple_of(w.nr());
    if wide && simd::has_avx512() && fits(Width::Zmm) {
        Some(Width::Zmm)
    } else if simd::has_avx2_fma() && fits(Width::Ymm) {
        Some(Width::Ymm)
    } else {
        None
    }
}

thread_local! {
    /// Per-thread packed operands and score rows, grown on first use, then reused.
    static SCRATCH: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

/// Runs `f` on `N` disjoint thread-local buffers of the given lengths.
fn with_buffers<const N: usize, R>(lens: [usize; N], f: impl FnOnce([&mut [f32]; N]) -> R) -> R {
    SCRATCH.with_borrow_mut(|s| {
        let total = lens.iter().sum();
        if s.len() < total {
            s.resize(total, 0.0);
        }
        let mut rest = &mut s[..total];
        let parts = lens.map(|n| {
            let (part, tail) = std::mem::take(&mut rest).split_at_mut(n);
            rest = tail;
            part
        });
        f(parts)
    })
}

/// Every tile of a block's product as `f(panel, r0)`: `panels` panels of the `B`
/// operand by the six-row groups of rows `i0..i1`. At 32 columns (AVX-512) panel by panel,
/// so that each panel stays in L1 while the block's rows pass over it; at 16 columns
/// group by group (a panel is then half the size and its stream from L2 costs less than
/// revisiting the rows).
#[inline(always)]
fn each_tile(
    width: Width,
    panels: usize,
    (i0, i1): (usize, usize),
    mut f: impl FnMut(usize, usize),
) {
    let groups = (i0..i1).step_by(MR);
    if width == Width::Zmm {
        for c in 0..panels {
            groups.clone().for_each(|r0| f(c, r0));
        }
    } else {
        for r0 in groups {
            (0..panels).for_each(|c| f(c, r0));
        }
    }
}

/// Row stride, base pointer, and the `MR` row pointers of rows `r0..r0 + mr` of `o`
/// (the rows past `mr` repeat row `r0 + mr - 1`, so that a ragged tile reads only rows
/// that exist).
///
/// # Safety
/// Rows `r0..r0 + mr` lie in `o`'s matrix; `mr >= 1`.
#[inline(always)]
unsafe fn rows(o: Operand, r0: usize, mr: usize) -> [*const f32; MR] {
    // SAFETY: row r0 + min(r, mr - 1) is inside (the caller's).
    std::array::from_fn(|r| unsafe { o.ptr.get().add((r0 + r.min(mr - 1)) * o.rs).cast_const() })
}

/// The product tile: for `r < rows`, `C[r, 0..nr] (+)= Σ_{kk < k} a[r][kk·aks] ·
/// b[kk·bks + 0..nr]` (`nr` = `width.nr()`), one FMA chain per element in `kk` order
/// from zero, then stored (`add` false) or added to `C` (`add` true). `C` row `r` is at
/// `c + r·crs`. Both widths run the same chains, so they give the same bits.
///
/// # Safety
/// The CPU has the width's instructions ([`width`]); `a[r] + kk·aks` for `r < MR`,
/// `kk < k` and the `nr` floats at `b + kk·bks` are readable; rows `r < rows <= MR` of
/// `C` hold `nr` writable floats that overlap neither operand.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn tile(
    width: Width,
    a: [*const f32; MR],
    aks: usize,
    b: *const f32,
    bks: usize,
    k: usize,
    c: *mut f32,
    crs: usize,
    rows: usize,
    add: bool,
) {
    // SAFETY: the caller's.
    unsafe {
        match width {
            Width::Ymm => tile_ymm(a, aks, b, bks, k, c, crs, rows, add),
            Width::Zmm => tile_zmm(a, aks, b, bks, k, c, crs, rows, add),
        }
    }
}

/// [`tile`] with 16 columns: twelve 8-lane accumulators, two loads of `B` and six
/// broadcasts of `A` a step.
///
/// # Safety
/// As [`tile`]; the CPU has AVX2 and FMA.
#[inline]
#[target_feature(enable = "avx2,fma")]
#[allow(clippy::too_many_arguments)]
unsafe fn tile_ymm(
    a: [*const f32; MR],
    aks: usize,
    b: *const f32,
    bks: usize,
    k: usize,
    c: *mut f32,
    crs: usize,
    rows: usize,
    add: bool,
) {
    let mut acc = [[_mm256_setzero_ps(); 2]; MR];
    // SAFETY (whole body): the reads and writes the caller promised.
    unsafe {
        for kk in 0..k {
            let b0 = _mm256_loadu_ps(b.add(kk * bks));
            let b1 = _mm256_loadu_ps(b.add(kk * bks + 8));
            for (row, &ar) in acc.iter_mut().zip(&a) {
                let x = _mm256_broadcast_ss(&*ar.add(kk * aks));
                row[0] = _mm256_fmadd_ps(x, b0, row[0]);
                row[1] = _mm256_fmadd_ps(x, b1, row[1]);
            }
        }
        for (r, row) in acc.iter().enumerate().take(rows) {
            let c = c.add(r * crs);
            if add {
                _mm256_storeu_ps(c, _mm256_add_ps(_mm256_loadu_ps(c), row[0]));
                _mm256_storeu_ps(c.add(8), _mm256_add_ps(_mm256_loadu_ps(c.add(8)), row[1]));
            } else {
                _mm256_storeu_ps(c, row[0]);
                _mm256_storeu_ps(c.add(8), row[1]);
            }
        }
    }
}

/// [`tile`] with 32 columns: twelve 16-lane accumulators (12 of the 32 `zmm`
/// registers), two loads of `B` and six broadcasts of `A` a step, twice the FMAs of
/// [`tile_ymm`] per load.
///
/// # Safety
/// As [`tile`]; the CPU has AVX-512 F.
#[inline]
#[target_feature(enable = "avx512f,avx2,fma")]
#[allow(clippy::too_many_arguments)]
unsafe fn tile_zmm(
    a: [*const f32; MR],
    aks: usize,
    b: *const f32,
    bks: usize,
    k: usize,
    c: *mut f32,
    crs: usize,
    rows: usize,
    add: bool,
) {
    let mut acc = [[_mm512_setzero_ps(); 2]; MR];
    // SAFETY (whole body): the reads and writes the caller promised.
    unsafe {
        for kk in 0..k {
            let b0 = _mm512_loadu_ps(b.add(kk * bks));
            let b1 = _mm512_loadu_ps(b.add(kk * bks + 16));
            for (row, &ar) in acc.iter_mut().zip(&a) {
                let x = _mm512_set1_ps(*ar.add(kk * aks));
                row[0] = _mm512_fmadd_ps(x, b0, row[0]);
                row[1] = _mm512_fmadd_ps(x, b1, row[1]);
            }
        }
        for (r, row) in acc.iter().enumerate().take(rows) {
            let c = c.add(r * crs);
            if add {
                _mm512_storeu_ps(c, _mm512_add_ps(_mm512_loadu_ps(c), row[0]));
                _mm512_storeu_ps(c.add(16), _mm512_add_ps(_mm512_loadu_ps(c.add(16)), row[1]));
            } else {
                _mm512_storeu_ps(c, row[0]);
                _mm512_storeu_ps(c.add(16), row[1]);
            }
        }
    }
}

/// Packs rows `0..t` of `src` (`d` floats each, `d` a multiple of 8) transposed, in
/// panels of `nr` rows (a multiple of 8): `dst[(j / nr)·d·nr + c·nr + j % nr] =
/// src[j, c]`, zero for `t <= j < t` rounded up to `nr`. Eight rows by eight columns at
/// a time, transposed in registers.
///
/// # Safety
/// The CPU has AVX2; rows `0..t` of `src` hold `d` readable floats; `dst` holds
/// `t.next_multiple_of(nr)·d` floats.
#[target_feature(enable = "avx2,fma")]
unsafe fn pack_transposed(src: Operand, t: usize, d: usize, nr: usize, dst: &mut [f32]) {
    let tp = t.next_multiple_of(nr);
    assert!(d.is_multiple_of(8) && nr.is_multiple_of(8) && dst.len() >= tp * d);
    let out = dst.as_mut_ptr();
    for j in (0..tp).step_by(8) {
        // SAFETY: panel j / nr, lanes j % nr.. of each of its d rows, inside `dst`.
        let panel = unsafe { out.add((j / nr) * d * nr + j % nr) };
        for c in (0..d).step_by(8) {
            // SAFETY: rows below t, columns c..c + 8 < d: inside `src`.
            let row = |i: usize| unsafe {
                if j + i < t {
                    _mm256_loadu_ps(src.ptr.get().add((j + i) * src.rs + c))
                } else {
                    _mm256_setzero_ps()
                }
            };
            let cols = transpose8([
                row(0),
                row(1),
                row(2),
                row(3),
                row(4),
                row(5),
                row(6),
                row(7),
            ]);
            for (x, v) in cols.iter().enumerate() {
                // SAFETY: row c + x < d of the panel, 8 lanes from j % nr (a multiple of
                // 8 below nr).
                unsafe { _mm256_storeu_ps(panel.add((c + x) * nr), *v) };
            }
        }
    }
}

/// Packs rows `0..t` of `src` (`d` floats each, `d` a multiple of `nr`, `nr` of 8) into
/// `d / nr` panels of `nr` columns: `dst[(c / nr)·t·nr + j·nr + c % nr] = src[j, c]`, so
/// that a product reading `nr` columns per step walks contiguous memory.
///
/// # Safety
/// The CPU has AVX2; rows `0..t` of `src` hold `d` readable floats; `dst` holds `t·d`.
#[target_feature(enable = "avx2,fma")]
unsafe fn pack_panels(src: Operand, t: usize, d: usize, nr: usize, dst: &mut [f32]) {
    assert!(d.is_multiple_of(nr) && nr.is_multiple_of(8) && dst.len() >= t * d);
    let out = dst.as_mut_ptr();
    for p in 0..d / nr {
        for j in 0..t {
            for l in (0..nr).step_by(8) {
                // SAFETY: row j, columns p·nr + l..+ 8 of `src`; the panel's row j.
                unsafe {
                    let s = src.ptr.get().add(j * src.rs + p * nr + l);
                    _mm256_storeu_ps(out.add((p * t + j) * nr + l), _mm256_loadu_ps(s));
                }
            }
        }
    }
}

/// Horizontal sum of the 8 lanes.
#[inline]
#[target_feature(enable = "avx2,fma")]
fn hsum(v: __m256) -> f32 {
    let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)))
}

/// `dS = scale·P∘(dP - Σ_j P∘dP)` in place of `dp[..n]`, zero in `dp[n..]`.
///
/// # Safety
/// The CPU has AVX2 and FMA; `p.len() >= n`, `dp.len() >= n`.
#[target_feature(enable = "avx2,fma")]
unsafe fn softmax_grad_row(p: &[f32], dp: &mut [f32], n: usize, scale: f32) {
    let (p, (d, zeros)) = (&p[..n], dp.split_at_mut(n));
    let full = n - n % 8;
    let mut acc = _mm256_setzero_ps();
    // SAFETY (both loops): indices below `full <= n`, inside both slices.
    unsafe {
        for j in (0..full).step_by(8) {
            let pv = _mm256_loadu_ps(p.as_ptr().add(j));
            acc = _mm256_fmadd_ps(pv, _mm256_loadu_ps(d.as_ptr().add(j)), acc);
        }
    }
    let mut s = hsum(acc);
    for j in full..n {
        s = p[j].mul_add(d[j], s);
    }
    let (vs, vscale) = (_mm256_set1_ps(s), _mm256_set1_ps(scale));
    unsafe {
        for j in (0..full).step_by(8) {
            let pv = _mm256_mul_ps(vscale, _mm256_loadu_ps(p.as_ptr().add(j)));
            let x = _mm256_sub_ps(_mm256_loadu_ps(d.as_ptr().add(j)), vs);
            _mm256_storeu_ps(d.as_mut_ptr().add(j), _mm256_mul_ps(pv, x));
        }
    }
    for j in full..n {
        d[j] = scale * p[j] * (d[j] - s);
    }
    zeros.fill(0.0);
}

/// Fused forward; `lse` receives `L: [B, H, Tq]` (base 2), as the blocked path's.
///
/// # Safety
/// `width` came from [`width`] for `d.head_dim`; the views were checked by the op (`q`,
/// `k`, `v` readable, `out` writable and disjoint from them).
pub(crate) unsafe fn forward(
    width: Width,
    [q, k, v, out]: [HeadsPtr; 4],
    lse: &mut [f32],
    pos_offset: usize,
    d: AttentionDims,
) {
    let (tq, tk, hd) = (d.q_len, d.k_len, d.head_dim);
    let tkp = tk.next_multiple_of(width.nr());
    lse.par_chunks_mut(tq).enumerate().for_each(|(task, lse)| {
        let (b, h) = (task / d.heads, task % d.heads);
        let heads = [q, k, v, out].map(|x| head(x, b, h));
        let lens = [hd * tkp, hd * tk, BLOCK_ROWS * tkp, QUERY_BLOCK * hd];
        with_buffers(lens, |[kt, vp, s, qb]| {
            // SAFETY: the CPU has the tile's instructions (`width`); the heads are inside
            // their checked views; this task alone writes head `h` of entry `b` of `out`.
            let buffers = [kt, vp, s, qb];
            unsafe { forward_head_for(width, heads, lse, (tq, tk, hd), pos_offset, buffers) }
        })
    });
}

/// [`forward_head`] compiled for the width's instruction set (AVX2 + FMA, or AVX-512),
/// so that its tiles and row passes inline into it.
///
/// # Safety
/// As [`forward_head`].
unsafe fn forward_head_for(
    width: Width,
    heads: [Operand; 4],
    lse: &mut [f32],
    dims: Dims3,
    pos_offset: usize,
    buffers: [&mut [f32]; 4],
) {
    #[target_feature(enable = "avx2,fma")]
    unsafe fn ymm(h: [Operand; 4], l: &mut [f32], d: Dims3, o: usize, b: [&mut [f32]; 4]) {
        // SAFETY: the caller's.
        unsafe { forward_head(Width::Ymm, h, l, d, o, b) }
    }
    #[target_feature(enable = "avx512f,avx512dq,avx2,fma")]
    unsafe fn zmm(h: [Operand; 4], l: &mut [f32], d: Dims3, o: usize, b: [&mut [f32]; 4]) {
        // SAFETY: the caller's.
        unsafe { forward_head(Width::Zmm, h, l, d, o, b) }
    }
    // SAFETY: the caller's; the width's instruction set is the CPU's.
    unsafe {
        match width {
            Width::Ymm => ymm(heads, lse, dims, pos_offset, buffers),
            Width::Zmm => zmm(heads, lse, dims, pos_offset, buffers),
        }
    }
}

/// `(Tq, Tk, D)`.
type Dims3 = (usize, usize, usize);

/// One head's forward (see the module docs).
///
/// # Safety
/// As [`forward`], for one head; the buffers hold `d·Tk'`, `d·Tk`, `66·Tk'` and `64·d`
/// floats (`Tk'` = `Tk` rounded up to the tile's width); the CPU has the width's
/// instructions.
#[inline(always)]
unsafe fn forward_head(
    width: Width,
    [q, k, v, out]: [Operand; 4],
    lse: &mut [f32],
    (tq, tk, hd): (usize, usize, usize),
    pos_offset: usize,
    [kt, vp, s, qb]: [&mut [f32]; 4],
) {
    let (scale, nr) = (1.0 / (hd as f32).sqrt(), width.nr());
    let visible = |i: usize| (pos_offset + i + 1).min(tk);
    // SAFETY (whole body): every read is in rows `< tq` of `q`, `< tk` of `k`, `v` and the
    // packed buffers sized by the caller; writes go to rows `< tq` of `out` and to `s`.
    unsafe {
        pack_transposed(k, tk, hd, nr, kt);
        pack_panels(v, tk, hd, nr, vp);
        // Queries per pass: at 32 columns (AVX-512) a block of 64, so that each panel of
        // `kᵀ` and `v` serves all of the block's rows from L1 (a tile then reads a panel
        // faster than L2 streams it); at 16 columns six, whose scores stay in L1 from
        // their product through their softmax to `P·v`.
        let pass = if width == Width::Zmm { QUERY_BLOCK } else { MR };
        for i0 in (0..tq).step_by(pass) {
            let i1 = (i0 + pass).min(tq);
            // A block's queries side by side (see `backward_head`); six rows are read
            // where they lie.
            let qb = if pass == MR {
                Operand {
                    ptr: crate::buffer::SendPtr(q.ptr.get().add(i0 * q.rs)),
                    ..q
                }
            } else {
                for i in i0..i1 {
                    let row = std::slice::from_raw_parts(q.ptr.get().add(i * q.rs), hd);
                    qb[(i - i0) * hd..][..hd].copy_from_slice(row);
                }
                Operand {
                    ptr: crate::buffer::SendPtr(qb.as_mut_ptr()),
                    rs: hd,
                    cs: 1,
                }
            };
            let ld = visible(i1 - 1).next_multiple_of(nr);
            let s = &mut s[..BLOCK_ROWS * ld];
            // The keys that the six queries from `r0` see.
            let kend = |r0: usize| visible(r0 + (i1 - r0).min(MR) - 1);
            // S = q·kᵀ, six queries by a panel of keys at a time, over the keys they see.
            each_tile(width, ld / nr, (i0, i1), |c, r0| {
                if kend(r0).next_multiple_of(nr) > c * nr {
                    let b = kt.as_ptr().add(c * hd * nr);
                    let at = s.as_mut_ptr().add((r0 - i0) * ld + c * nr);
                    let mr = (i1 - r0).min(MR);
                    tile(
                        width,
                        rows(qb, r0 - i0, mr),
                        1,
                        b,
                        nr,
                        hd,
                        at,
                        ld,
                        MR,
                        false,
                    );
                }
            });
            // The softmax of each row over the keys it sees, zeros past them.
            for r0 in (i0..i1).step_by(MR) {
                let mr = (i1 - r0).min(MR);
                let group = &mut s[(r0 - i0) * ld..][..MR * ld];
                let vis = |r: usize| visible(r0 + r.min(mr - 1));
                let mut keep = |r: usize, l: f32| {
                    if r < mr {
                        lse[r0 + r] = l;
                    }
                };
                match width {
                    Width::Ymm => crate::norm_softmax_loss::softmax_avx2::softmax_rows(
                        None, group, ld, vis, scale, keep,
                    ),
                    // The same bits, row by row at 16 lanes, each row zeroed past its keys
                    // up to the group's tile width only.
                    Width::Zmm => {
                        let w = kend(r0).next_multiple_of(nr);
                        for (r, row) in group.chunks_exact_mut(ld).enumerate() {
                            let row = &mut row[..w];
                            let (m2, sum) = crate::norm_softmax_loss::softmax_avx512::softmax_row(
                                None,
                                row,
                                vis(r),
                                scale,
                            );
                            keep(r, m2 + sum.log2());
                        }
                    }
                }
            }
            // out = P·v, a panel of `v`'s columns at a time.
            each_tile(width, hd / nr, (i0, i1), |c, r0| {
                let b = vp.as_ptr().add(c * tk * nr);
                let mr = (i1 - r0).min(MR);
                let at = s.as_ptr().add((r0 - i0) * ld);
                let prows = std::array::from_fn(|r| at.add(r * ld));
                let o = out.ptr.get().add(r0 * out.rs + c * nr);
                tile(width, prows, 1, b, nr, kend(r0), o, out.rs, mr, false);
            });
        }
    }
}

/// Fused backward (training: `Tq == Tk`, offset 0) from the forward's `lse`.
///
/// # Safety
/// `width` came from [`width`] for `d.head_dim`; the views were checked by the op (`dq`,
/// `dk`, `dv` writable, disjoint from each other and from the inputs).
pub(crate) unsafe fn backward(width: Width, heads: [HeadsPtr; 7], lse: &[f32], d: AttentionDims) {
    let (t, hd) = (d.q_len, d.head_dim);
    let tp = t.next_multiple_of(width.nr());
    lse.par_chunks(t).enumerate().for_each(|(task, lse)| {
        let (b, h) = (task / d.heads, task % d.heads);
        let heads = heads.map(|x| head(x, b, h));
        let lens = [
            hd * tp,
            hd * tp,
            hd * t,
            BLOCK_ROWS * (tp + ROW_PAD),
            BLOCK_ROWS * (tp + ROW_PAD),
            2 * QUERY_BLOCK * hd,
        ];
        with_buffers(lens, |bufs| {
            // SAFETY: the CPU has the tile's instructions (`width`); the heads are inside
            // their checked views; this task alone writes head `h` of entry `b` of `dq`,
            // `dk`, `dv`.
            unsafe { backward_head_for(width, heads, lse, (t, hd), bufs) }
        })
    });
}

/// [`backward_head`] compiled for the width's instruction set, as [`forward_head_for`].
///
/// # Safety
/// As [`backward_head`].
unsafe fn backward_head_for(
    width: Width,
    heads: [Operand; 7],
    lse: &[f32],
    dims: (usize, usize),
    buffers: [&mut [f32]; 6],
) {
    #[target_feature(enable = "avx2,fma")]
    unsafe fn ymm(h: [Operand; 7], l: &[f32], d: (usize, usize), b: [&mut [f32]; 6]) {
        // SAFETY: the caller's.
        unsafe { backward_head(Width::Ymm, h, l, d, b) }
    }
    #[target_feature(enable = "avx512f,avx512dq,avx2,fma")]
    unsafe fn zmm(h: [Operand; 7], l: &[f32], d: (usize, usize), b: [&mut [f32]; 6]) {
        // SAFETY: the caller's.
        unsafe { backward_head(Width::Zmm, h, l, d, b) }
    }
    // SAFETY: the caller's; the width's instruction set is the CPU's.
    unsafe {
        match width {
            Width::Ymm => ymm(heads, lse, dims, buffers),
            Width::Zmm => zmm(heads, lse, dims, buffers),
        }
    }
}

/// One head's backward (see the module docs).
///
/// # Safety
/// As [`backward`], for one head; the buffers hold `d·T'`, `d·T'`, `d·T`, `66·(T' + 16)`
/// twice and `128·d` floats (`T'` = `T` rounded up to the tile's width); the CPU has the
/// width's instructions.
#[inline(always)]
unsafe fn backward_head(
    width: Width,
    [q, k, v, dout, dq, dk, dv]: [Operand; 7],
    lse: &[f32],
    (t, hd): (usize, usize),
    [kt, vt, kp, p, dp, block]: [&mut [f32]; 6],
) {
    let (scale, nr) = (1.0 / (hd as f32).sqrt(), width.nr());
    let (qb, dob) = block.split_at_mut(QUERY_BLOCK * hd);
    // The block's rows of `q` and `dO`, side by side: they are the `B` operand of the
    // `dk` and `dv` tiles, read again for every six keys, and rows a head's stride apart
    // (three or one rows of the model, 2-9 kB) fall into a few sets of the L1 cache,
    // which then cannot hold them.
    let packed = |m: &[f32]| Operand {
        ptr: crate::buffer::SendPtr(m.as_ptr().cast_mut()),
        rs: hd,
        cs: 1,
    };
    // SAFETY (whole body): every read is in rows `< t` of the heads and inside the
    // buffers sized by the caller; writes go to rows `< t` of `dq`, `dk`, `dv` (this
    // task's) and to the buffers.
    unsafe {
        pack_transposed(k, t, hd, nr, kt);
        pack_transposed(v, t, hd, nr, vt);
        pack_panels(k, t, hd, nr, kp);
        for g in [dk, dv] {
            for j in 0..t {
                std::slice::from_raw_parts_mut(g.ptr.get().add(j * g.rs), hd).fill(0.0);
            }
        }
        for i0 in (0..t).step_by(QUERY_BLOCK) {
            let i1 = (i0 + QUERY_BLOCK).min(t);
            for (m, src) in [(&mut *qb, q), (&mut *dob, dout)] {
                for i in i0..i1 {
                    let row = std::slice::from_raw_parts(src.ptr.get().add(i * src.rs), hd);
                    m[(i - i0) * hd..][..hd].copy_from_slice(row);
                }
            }
            let (qb, dob) = (packed(qb), packed(dob));
            // Keys the block sees, and the block buffers' row stride.
            let kend = i1;
            let ld = kend.next_multiple_of(nr) + ROW_PAD;
            let (p, dp) = (&mut p[..BLOCK_ROWS * ld], &mut dp[..BLOCK_ROWS * ld]);
            // S = q·kᵀ (into `p`), then dP = dO·vᵀ, six queries by a panel of keys at a
            // time, over the keys they see.
            for (a, bt, m) in [(qb, &*kt, p.as_mut_ptr()), (dob, &*vt, dp.as_mut_ptr())] {
                each_tile(width, kend.div_ceil(nr), (i0, i1), |c, r0| {
                    let mr = (i1 - r0).min(MR);
                    if (r0 + mr).next_multiple_of(nr) > c * nr {
                        let b = bt.as_ptr().add(c * hd * nr);
                        let out = m.add((r0 - i0) * ld + c * nr);
                        tile(
                            width,
                            rows(a, r0 - i0, mr),
                            1,
                            b,
                            nr,
                            hd,
                            out,
                            ld,
                            MR,
                            false,
                        );
                    }
                });
            }
            // P = 2^(S·scale·log2 e - L) and dS, row by row; zeros past each row's keys.
            for i in i0..i1 {
                let n = i + 1;
                let (prow, dprow) = (
                    &mut p[(i - i0) * ld..][..ld],
                    &mut dp[(i - i0) * ld..][..ld],
                );
                let exp_row = match width {
                    Width::Ymm => crate::norm_softmax_loss::softmax_avx2::exp_shifted_row,
                    Width::Zmm => crate::norm_softmax_loss::softmax_avx512::exp_shifted_row,
                };
                exp_row(&mut prow[..n], scale * LOG2_E, lse[i]);
                prow[n..].fill(0.0);
                softmax_grad_row(prow, dprow, n, scale);
            }
            // dq = dS·k, six rows at a time over the keys they see, a panel of `k`'s
            // columns at a time.
            let ds = Operand {
                ptr: crate::buffer::SendPtr(dp.as_mut_ptr()),
                rs: ld,
                cs: 1,
            };
            each_tile(width, hd / nr, (i0, i1), |c, r0| {
                let mr = (i1 - r0).min(MR);
                let b = kp.as_ptr().add(c * t * nr);
                let out = dq.ptr.get().add(r0 * dq.rs + c * nr);
                let dsrows = rows(ds, r0 - i0, mr);
                tile(width, dsrows, 1, b, nr, r0 + mr, out, dq.rs, mr, false);
            });
            // dv += Pᵀ·dO, dk += dSᵀ·q, six keys at a time, over the block's queries that
            // can see them (the rows before key j0 hold zeros there).
            for j0 in (0..kend).step_by(MR) {
                let mr = (kend - j0).min(MR);
                let first = i0.max(j0);
                let cols = |m: &[f32]| -> [*const f32; MR] {
                    std::array::from_fn(|r| m.as_ptr().add((first - i0) * ld + j0 + r.min(mr - 1)))
                };
                let (pcols, dscols) = (cols(p), cols(dp));
                for c in 0..hd / nr {
                    let at = (first - i0) * hd + c * nr;
                    let dob = dob.ptr.get().add(at);
                    let dvc = dv.ptr.get().add(j0 * dv.rs + c * nr);
                    tile(width, pcols, ld, dob, hd, i1 - first, dvc, dv.rs, mr, true);
                    let qb = qb.ptr.get().add(at);
                    let dkc = dk.ptr.get().add(j0 * dk.rs + c * nr);
                    tile(width, dscols, ld, qb, hd, i1 - first, dkc, dk.rs, mr, true);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Width;
    use crate::attention::path::AttentionPath;
    use crate::gemm::GemmKernel;
    use crate::CpuBackend;

    const WIDE: AttentionPath = AttentionPath::DEFAULT;
    const NARROW: AttentionPath = AttentionPath {
        fused: true,
        wide: false,
    };
    const BLOCKED: AttentionPath = AttentionPath {
        fused: false,
        wide: false,
    };
    use andrea_core::{AttentionOps, AttentionShape, Heads, MemoryOps, View};
    use andrea_testkit::random::Rand;
    use andrea_testkit::{reference, tol};

    fn skipped() -> bool {
        let skip = super::width(16, false).is_none();
        if skip {
            eprintln!("skipped: this CPU (or ANDREA_SIMD) lacks AVX2 + FMA, so the fused kernel never runs");
        }
        skip
    }

    fn backend(path: AttentionPath) -> CpuBackend {
        CpuBackend::with_threads(2)
            .unwrap()
            .with_gemm_kernel(GemmKernel::Avx2)
            .with_attention(path)
    }

    /// `[B, T, 3C]` as the model lays out q, k, v (rows of stride `3C`) to dense
    /// `[B, T, C]` f64 parts.
    fn unpack(qkv: &[f32], rows: usize, c: usize) -> [Vec<f64>; 3] {
        [0, 1, 2].map(|p| {
            (0..rows)
                .flat_map(|r| &qkv[r * 3 * c + p * c..r * 3 * c + (p + 1) * c])
                .map(|&x| x as f64)
                .collect()
        })
    }

    /// Forward and backward of a training step (packed `[B, T, 3C]` q, k, v, as the
    /// model's), outputs and gradients downloaded.
    fn train(
        be: &CpuBackend,
        qkv: &[f32],
        dout: &[f32],
        (b, t, h, d): (usize, usize, usize, usize),
    ) -> [Vec<f32>; 2] {
        let c = h * d;
        let x = be.alloc(qkv.len()).unwrap();
        be.upload(qkv, View::whole(&x)).unwrap();
        let g = be.alloc(qkv.len()).unwrap();
        let (o, dob) = (be.alloc(b * t * c).unwrap(), be.alloc(b * t * c).unwrap());
        be.upload(dout, View::whole(&dob)).unwrap();
        let shape = AttentionShape {
            batch: b,
            heads: h,
            head_dim: d,
            q_len: t,
            k_len: t,
        };
        let ws = be.alloc(be.attention_workspace_len(shape)).unwrap();
        let sc = be
            .alloc(be.attention_backward_scratch_len(shape).max(1))
            .unwrap();
        let [q, k, v] = Heads::split_qkv(View::new(&x, 0, [b, t, 3 * c]), h).unwrap();
        let [dq, dk, dv] = Heads::split_qkv(View::new(&g, 0, [b, t, 3 * c]), h).unwrap();
        let oh = Heads::from_tensor(View::new(&o, 0, [b, t, c]), h).unwrap();
        let dh = Heads::from_tensor(View::new(&dob, 0, [b, t, c]), h).unwrap();
        be.attention_forward(q, k, v, oh, View::whole(&ws), 0)
            .unwrap();
        be.attention_backward(
            q,
            k,
            v,
            oh,
            dh,
            dq,
            dk,
            dv,
            View::whole(&ws),
            View::whole(&sc),
        )
        .unwrap();
        let mut out = vec![0.0; b * t * c];
        be.download(View::whole(&o), &mut out).unwrap();
        let mut grads = vec![0.0; qkv.len()];
        be.download(View::whole(&g), &mut grads).unwrap();
        [out, grads]
    }

    /// Training shapes: one tile and less, ragged six-row tiles, one query block and
    /// one past it, several blocks, keys past one of the GEMM kernel's 256-wide `k` slices; heads of 16, 32 (tiny), 48 and 64 (ANDREA-120M).
    /// Against the f64 reference within the suite's attention tolerances
    /// (`tol::attention_out`, `tol::attention_grad`: the t- and d-term f32 chains of the
    /// products and the softmax, see `andrea_testkit::tol`).
    #[test]
    fn training_matches_the_f64_reference() {
        if skipped() {
            return;
        }
        for path in [WIDE, NARROW] {
            training_matches_the_f64_reference_with(path);
        }
    }

    fn training_matches_the_f64_reference_with(path: AttentionPath) {
        let be = backend(path);
        let tile = if path.wide { "wide" } else { "narrow" };
        let mut r = Rand::new(17);
        for (b, t, h, d) in [
            (1, 2, 1, 16),
            (2, 7, 3, 32),
            (1, 64, 2, 64),
            (2, 65, 2, 16),
            (1, 150, 2, 48),
            (1, 200, 1, 64),
            (1, 300, 1, 32),
        ] {
            let c = h * d;
            let qkv = r.vec(b * t * 3 * c, -1.0, 1.0);
            let dout = r.vec(b * t * c, -1.0, 1.0);
            let [out, grads] = train(&be, &qkv, &dout, (b, t, h, d));
            let [q, k, v] = unpack(&qkv, b * t, c);
            let mut want = vec![0.0; b * t * c];
            reference::attention_forward(&mut want, &q, &k, &v, (b, t, t, h, d), 0);
            let name = format!("{tile} out B {b} T {t} H {h} D {d}");
            tol::attention_out(t, d).check(&name, &out, &want).unwrap();
            let dout64: Vec<f64> = dout.iter().map(|&x| x as f64).collect();
            let mut g: [Vec<f64>; 3] = std::array::from_fn(|_| vec![0.0; b * t * c]);
            let [dq, dk, dv] = &mut g;
            reference::attention_backward(dq, dk, dv, &dout64, &q, &k, &v, (b, t, h, d));
            let got = unpack(&grads, b * t, c);
            for (name, (got, want)) in ["dq", "dk", "dv"].iter().zip(got.iter().zip(&g)) {
                let got: Vec<f32> = got.iter().map(|&x| x as f32).collect();
                let name = format!("{tile} {name} B {b} T {t} H {h} D {d}");
                tol::attention_grad(t, d).check(&name, &got, want).unwrap();
            }
        }
    }

    /// The 32-column tile runs the 16-column tile's FMA chains (each element one chain
    /// over the same inner index, the same row passes between the products): the same
    /// bits, forward and backward, at ragged sizes, several query blocks, heads of 32
    /// (tiny) and 64 (ANDREA-120M), and 96.
    #[test]
    fn both_tiles_give_the_same_bits() {
        if super::width(32, true) != Some(Width::Zmm) {
            eprintln!(
                "skipped: no AVX-512 here (or ANDREA_SIMD caps it), so only the 16-column \
                 tile runs"
            );
            return;
        }
        let (wide, narrow) = (backend(WIDE), backend(NARROW));
        let mut r = Rand::new(23);
        for (b, t, h, d) in [
            (1, 1, 1, 32),
            (2, 7, 3, 32),
            (1, 33, 2, 64),
            (2, 65, 2, 32),
            (1, 150, 1, 96),
            (1, 300, 1, 64),
        ] {
            let c = h * d;
            let qkv = r.vec(b * t * 3 * c, -1.0, 1.0);
            let dout = r.vec(b * t * c, -1.0, 1.0);
            let [o1, g1] = train(&wide, &qkv, &dout, (b, t, h, d));
            let [o2, g2] = train(&narrow, &qkv, &dout, (b, t, h, d));
            let same =
                |x: &[f32], y: &[f32]| x.iter().zip(y).all(|(x, y)| x.to_bits() == y.to_bits());
            assert!(same(&o1, &o2), "out B {b} T {t} H {h} D {d}");
            assert!(same(&g1, &g2), "grads B {b} T {t} H {h} D {d}");
        }
    }

    /// The forward computes what the blocked path computes in the same order (`S` over
    /// the head dimension, the same softmax row kernel, `P·v` over keys from zero; the
    /// blocked path's extra terms are exact zeros): the same bits, for keys up to one
    /// `KC` slice of `gemm::avx2` (256), here including KV-cache offsets (`Tk > Tq`).
    /// The backward's sums run in another order (the dot product of `dS`, the rows of
    /// zeros `dv`, `dk` skip): within the suite's tolerance of each other (twice the
    /// bound against the reference, both sides carrying it).
    #[test]
    fn matches_the_blocked_path() {
        if skipped() {
            return;
        }
        let (fused, blocked) = (backend(WIDE), backend(BLOCKED));
        let mut r = Rand::new(5);
        for (b, t, h, d) in [
            (2, 9, 2, 32),
            (1, 64, 3, 64),
            (1, 129, 2, 32),
            (1, 256, 1, 64),
        ] {
            let c = h * d;
            let qkv = r.vec(b * t * 3 * c, -1.0, 1.0);
            let dout = r.vec(b * t * c, -1.0, 1.0);
            let [o1, g1] = train(&fused, &qkv, &dout, (b, t, h, d));
            let [o2, g2] = train(&blocked, &qkv, &dout, (b, t, h, d));
            assert!(
                o1.iter().zip(&o2).all(|(x, y)| x.to_bits() == y.to_bits()),
                "out T {t} D {d}"
            );
            let g2: Vec<f64> = g2.iter().map(|&x| x as f64).collect();
            let tol = tol::attention_grad(t, d);
            let tol = andrea_testkit::tol::Tol::new(2.0 * tol.abs, 2.0 * tol.rel);
            tol.check(&format!("grads T {t} D {d}"), &g1, &g2).unwrap();
        }
        // Prefill into a KV cache: Tq rows at positions pos.., keys 0..pos + Tq.
        for (tq, pos, d) in [(5, 3, 16), (40, 17, 64), (70, 100, 32)] {
            let (h, tk) = (2, pos + tq);
            let c = h * d;
            let (q, kv) = (r.vec(tq * c, -1.0, 1.0), r.vec(2 * tk * c, -1.0, 1.0));
            let run = |be: &CpuBackend| {
                let (qb, kvb, ob) = (
                    be.alloc(q.len()).unwrap(),
                    be.alloc(kv.len()).unwrap(),
                    be.alloc(q.len()).unwrap(),
                );
                be.upload(&q, View::whole(&qb)).unwrap();
                be.upload(&kv, View::whole(&kvb)).unwrap();
                let shape = AttentionShape {
                    batch: 1,
                    heads: h,
                    head_dim: d,
                    q_len: tq,
                    k_len: tk,
                };
                let ws = be.alloc(be.attention_workspace_len(shape)).unwrap();
                let heads =
                    |buf, off, t| Heads::from_tensor(View::new(buf, off, [1, t, c]), h).unwrap();
                let (qh, kh, vh, oh) = (
                    heads(&qb, 0, tq),
                    heads(&kvb, 0, tk),
                    heads(&kvb, tk * c, tk),
                    heads(&ob, 0, tq),
                );
                be.attention_forward(qh, kh, vh, oh, View::whole(&ws), pos)
                    .unwrap();
                let mut out = vec![0.0; q.len()];
                be.download(View::whole(&ob), &mut out).unwrap();
                out
            };
            let (o1, o2) = (run(&fused), run(&blocked));
            assert!(
                o1.iter().zip(&o2).all(|(x, y)| x.to_bits() == y.to_bits()),
                "prefill Tq {tq} pos {pos}"
            );
        }
    }
}
