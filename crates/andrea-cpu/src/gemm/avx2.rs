//! andrea's own f32 GEMM for AVX2 + FMA: the products' kernel at the AVX2 level.
//!
//! Why it exists: the `gemm` crate picks its micro-kernel from the CPU
//! (`is_x86_feature_detected!`), so under `ANDREA_SIMD=avx2` it would still run AVX-512,
//! and an AVX2 measurement on an AVX-512 machine would time AVX-512 GEMMs. With this
//! kernel the AVX2 level covers the whole step, and AVX2-only CPUs get a kernel whose
//! fused epilogues cost no extra pass.
//!
//! The layout is the usual one of BLIS-style kernels (Goto's): `B` packed per `KC x NC`
//! block into panels of [`NR`] columns, `A` per `MC x KC` block into panels of [`MR`]
//! rows, both zero-padded to whole panels, and a register-blocked micro-kernel computing
//! an `MR x NR` tile of `C` (6 x 16: twelve 8-lane accumulators, two loads of `B` and six
//! broadcasts of `A` per step of `k`, 15 of the 16 `ymm` registers). `KC = 256` keeps a
//! `B` micro-panel (16 KB) and an `A` one (6 KB) in a 32 KB L1 (the L1 of AVX2-only
//! CPUs) and the `A` block (`MC = 96` rows, 96 KB) in L2; the micro-kernel prefetches its
//! `C` tile's rows before the `k` loop, so that the tile's read (`beta` 1) or its
//! write-allocate is not a cache miss at the end of each call.
//!
//! Packing: a row-major `A` and a transposed `B` (the backward's `dy·Wᵀ`, the output
//! layer's `x·wteᵀ`) go through 8 x 8 register transposes ([`transpose8`]) rather than
//! one strided float at a time; a transposed `A` whose columns lie 16 KB or more apart
//! (the output layer's `dwte`) is packed a whole column at a time across the panels
//! ([`BY_COLUMNS_STRIDE`]). The fused ops' bias, `GELU` and `GELU'` run in the
//! micro-kernel on the last `KC` slice ([`Epilogue`]).
//!
//! **Several threads** ([`sgemm_threads`]): one queue of tasks per product, taken by the
//! threads in order as they free up ([`Queue`]): each `KC x NC` slice of `B` packed once
//! for all threads, then the slice's products in tasks of `MC` rows, then the next
//! slice's packing, which may start while the last products of this one still run. No
//! operand is packed twice, and a thread the machine slows down leaves its tasks to the
//! others instead of holding up a fixed share of the product.
//!
//! **Results.** Each element of `C` is `Σ_k a·b` as one FMA chain per `KC` slice of `k`,
//! in `k` order, the slices added to `C` in order (the first with `beta`): the same
//! operations whatever the block of `C` the element falls in and whichever thread
//! computes it, so results do not depend on the thread count or on the split. They
//! differ from the other kernels' in the last bits (another summation order), within the
//! GEMM tolerance.

use std::arch::x86_64::*;
use std::cell::RefCell;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use rayon::prelude::*;

use crate::simd::lanes::transpose8;
use crate::views::Operand;

/// Rows of `A` (and of the `C` tile) per micro-kernel call.
pub(crate) const MR: usize = 6;
/// Columns of `B` (and of the `C` tile) per micro-kernel call: two AVX vectors.
pub(crate) const NR: usize = 16;
const KC: usize = 256;
const MC: usize = 96;
const NC: usize = 3072;

/// The blocking: `KC`, `MC`, `NC` (see the module doc).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Blocking {
    kc: usize,
    mc: usize,
    nc: usize,
}

/// The 6 x 16 micro-kernel's blocking (the module doc says why).
const BLOCKING: Blocking = Blocking {
    kc: KC,
    mc: MC,
    nc: NC,
};

thread_local! {
    /// Packed `A` and `B` blocks of this thread, reused across calls.
    static PACK: RefCell<(Vec<f32>, Vec<f32>)> = const { RefCell::new((Vec::new(), Vec::new())) };
}

/// What the product does to each element of `C` once its sum is complete, in registers,
/// before the one store of the last `KC` slice: the fused epilogues of `linear` (bias),
/// `linear_gelu` (bias, then `GELU` into a second matrix) and `matmul_gelu_backward`
/// (times `GELU'`). Applied in the micro-kernel, they cost no pass over `C` and no cut of
/// the product into cache-sized tiles (each re-packing its operands), which is what the
/// other kernels do (`gemm::FUSED_TILE`). Per element of `C`, in this order:
///
/// `r = Σ_k a·b (+ C)` (as without an epilogue), `r += bias[j]`, `out[i, j] = GELU(r)`,
/// `r ·= GELU'(pre[i, j])`, `C[i, j] = r`: the operations of a plain product followed by
/// the separate passes, so the same bits as them.
#[derive(Clone, Copy, Default)]
pub(crate) struct Epilogue {
    /// `bias[j]` for column `j` of this call's `C` (contiguous).
    pub bias: Option<*const f32>,
    /// `GELU(r)` goes to `out + i·rs + j·cs` (`C`'s strides).
    pub gelu_out: Option<*mut f32>,
    /// `r` is multiplied by `GELU'(pre[i·rs + j·cs])` (`C`'s strides).
    pub gelu_grad_of: Option<*const f32>,
}

impl Epilogue {
    fn is_empty(&self) -> bool {
        self.bias.is_none() && self.gelu_out.is_none() && self.gelu_grad_of.is_none()
    }

    /// The epilogue of the tile whose element (0, 0) is `C`'s (`i0`, `j0`).
    ///
    /// # Safety
    /// The tile lies inside the matrices the pointers address.
    unsafe fn at(&self, i0: usize, j0: usize, rs: usize, cs: usize) -> Epilogue {
        let off = i0 * rs + j0 * cs;
        // SAFETY: forwarded from the caller.
        unsafe {
            Epilogue {
                bias: self.bias.map(|b| b.add(j0)),
                gelu_out: self.gelu_out.map(|o| o.add(off)),
                gelu_grad_of: self.gelu_grad_of.map(|p| p.add(off)),
            }
        }
    }

    /// The epilogue on one element `r` of `C` at tile position (`i`, `j`) (the ragged
    /// tiles' scalar path, and `k` 0): same operations as the vector path.
    ///
    /// # Safety
    /// (`i`, `j`) lies in the tile [`Epilogue::at`] gave.
    #[inline(always)]
    unsafe fn scalar(&self, mut r: f32, i: usize, j: usize, rs: usize, cs: usize) -> f32 {
        use crate::simd::{gelu, gelu_grad, Fused};
        // SAFETY: forwarded from the caller.
        unsafe {
            if let Some(b) = self.bias {
                r += *b.add(j);
            }
            if let Some(o) = self.gelu_out {
                *o.add(i * rs + j * cs) = gelu::<Fused>(r);
            }
            if let Some(p) = self.gelu_grad_of {
                r *= gelu_grad::<Fused>(*p.add(i * rs + j * cs));
            }
        }
        r
    }
}

/// `C = A·B + beta·C` with `beta` 0 (C not read) or 1, `A: [m, k]`, `B: [k, n]`, any
/// strides, on this thread.
///
/// # Safety
/// As [`crate::gemm::sgemm_strided`]; and the CPU has AVX2 and FMA.
#[target_feature(enable = "avx2,fma")]
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn sgemm(
    m: usize,
    k: usize,
    n: usize,
    a: Operand,
    b: Operand,
    beta: f32,
    c: Operand,
) {
    // SAFETY: forwarded; no epilogue.
    unsafe { sgemm_epilogue(m, k, n, a, b, beta, c, Epilogue::default()) }
}

/// [`sgemm`] followed by `epi` on each element of `C` ([`Epilogue`]).
///
/// # Safety
/// As [`sgemm`]; the epilogue's pointers address `n` bias values and `m x n` elements at
/// `C`'s strides, disjoint from every operand and from memory other threads touch.
#[target_feature(enable = "avx2,fma")]
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn sgemm_epilogue(
    m: usize,
    k: usize,
    n: usize,
    a: Operand,
    b: Operand,
    beta: f32,
    c: Operand,
    epi: Epilogue,
) {
    if m == 0 || n == 0 {
        return;
    }
    if k == 0 {
        // SAFETY: C is valid for m x n at its strides (the caller's), and the epilogue's
        // matrices with it.
        unsafe { scale_c(m, n, beta, c, &epi) };
        return;
    }
    PACK.with(|pack| {
        let (pa, pb) = &mut *pack.borrow_mut();
        let Blocking {
            kc: kcm,
            mc: mcm,
            nc: ncm,
            ..
        } = BLOCKING;
        let nc_max = n.min(ncm).div_ceil(NR) * NR;
        let pb = aligned(pb, kcm * nc_max);
        let pa = aligned(pa, kcm * mcm.min(m.div_ceil(MR) * MR));
        for jc in (0..n).step_by(ncm) {
            let nc = (n - jc).min(ncm);
            for pc in (0..k).step_by(kcm) {
                let kc = (k - pc).min(kcm);
                let beta = if pc == 0 { beta } else { 1.0 };
                let last = pc + kc == k && !epi.is_empty();
                // SAFETY: the block lies inside B (the caller's bounds).
                unsafe { pack_b(kc, nc, b, pc, jc, pb) };
                for ic in (0..m).step_by(mcm) {
                    let mc = (m - ic).min(mcm);
                    // SAFETY: the block lies inside A; the tiles of rows ic..ic + mc
                    // lie in C (and in the epilogue's matrices).
                    unsafe {
                        pack_a(mc, kc, a, ic, pc, pa);
                        let block = Block {
                            kc,
                            beta,
                            last,
                            rows: (ic, mc),
                            jc,
                            nc,
                        };
                        let panels = (0, nc.div_ceil(NR));
                        tiles(&block, panels, pa.as_ptr(), pb.as_ptr(), c, epi);
                    }
                }
            }
        }
    });
}

/// `v` grown to hold `len` floats from its first 64-byte boundary, and those `len`
/// floats: the packed panels start on a cache line, so that no aligned-width load of
/// `B` (8 floats at a time) straddles
/// two lines. Grown, never shrunk: the packing writes every value the kernel reads
/// (padding included), and a `resize` down and back up would zero megabytes on each
/// large product that follows a small one (the attention's, in a training step).
fn aligned(v: &mut Vec<f32>, len: usize) -> &mut [f32] {
    if v.len() < len + 15 {
        v.resize(len + 15, 0.0);
    }
    let skip = v.as_ptr().align_offset(64);
    &mut v[skip..skip + len]
}

/// One block of tiles: `rows.1` rows of `C` from `rows.0` and the columns of a packed
/// `KC x NC` slice (`jc`, `nc` wide), with the slice's depth `kc` and `beta`, and whether
/// it is the last slice of `k` (the epilogue runs on it).
struct Block {
    kc: usize,
    beta: f32,
    last: bool,
    rows: (usize, usize),
    jc: usize,
    nc: usize,
}

/// The tiles of `blk` in `B`'s panels `q0..q1`: `ap` the rows' packed `A` panels, `pb`
/// the slice's packed `B` (panel `q` at `pb + q·NR·kc`). The `B` panel (or pair of
/// panels) outside, so that it stays in L1 while `A`'s panels stream from L2.
///
/// # Safety
/// The packed panels hold the slice's values; the tiles lie in `C` (and in the
/// epilogue's matrices) and no other thread touches them meanwhile; the CPU has what
/// `micro` needs.
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn tiles(
    blk: &Block,
    (q0, q1): (usize, usize),
    ap: *const f32,
    pb: *const f32,
    c: Operand,
    epi: Epilogue,
) {
    let (kc, (r0, mc)) = (blk.kc, blk.rows);
    let with_epi = blk.last && !epi.is_empty();
    for jr in (q0 * NR..q1 * NR).step_by(NR) {
        let nr = (blk.nc - jr).min(NR);
        for ir in (0..mc).step_by(MR) {
            let mr = (mc - ir).min(MR);
            // SAFETY: as the caller promises.
            unsafe {
                let bp = std::slice::from_raw_parts(pb.add(jr * kc), NR * kc);
                let ap = std::slice::from_raw_parts(ap.add(ir * kc), MR * kc);
                let (i0, j0) = (r0 + ir, blk.jc + jr);
                let ct = c.ptr.get().add(i0 * c.rs + j0 * c.cs);
                let e = with_epi.then(|| epi.at(i0, j0, c.rs, c.cs));
                kernel(kc, ap, bp, blk.beta, ct, c.rs, c.cs, mr, nr, e);
            }
        }
    }
}

/// `C = beta·C` (the product of an empty `k`), then the epilogue.
unsafe fn scale_c(m: usize, n: usize, beta: f32, c: Operand, epi: &Epilogue) {
    for i in 0..m {
        for j in 0..n {
            // SAFETY: (i, j) lies in C and in the epilogue's matrices.
            unsafe {
                let p = c.ptr.get().add(i * c.rs + j * c.cs);
                let r = if beta == 0.0 { 0.0 } else { *p * beta };
                *p = epi.scalar(r, i, j, c.rs, c.cs);
            }
        }
    }
}

/// Packs `B[pc.., jc..]` (`kc x nc`) into `out` as panels of [`NR`] columns, each panel
/// `kc` rows of `NR` contiguous values, columns past `nc` zero.
#[inline(always)]
unsafe fn pack_b(kc: usize, nc: usize, b: Operand, pc: usize, jc: usize, out: &mut [f32]) {
    let base = b.ptr.get() as *const f32;
    for (jp, panel) in out[..nc.div_ceil(NR) * NR * kc]
        .chunks_exact_mut(NR * kc)
        .enumerate()
    {
        let j0 = jc + jp * NR;
        let w = (nc - jp * NR).min(NR);
        if w == NR && b.rs == 1 {
            // B transposed (each column contiguous along `k`): 8 x 8 blocks through
            // registers instead of one strided float at a time.
            // SAFETY: columns j0..j0 + NR, rows pc..pc + kc lie in B; the panel holds
            // kc x NR values.
            unsafe { pack_b_cols(kc, base.add(j0 * b.cs + pc), b.cs, panel) };
            continue;
        }
        for (p, row) in panel.chunks_exact_mut(NR).enumerate() {
            // SAFETY: rows pc..pc + kc and columns j0..j0 + w lie in B.
            unsafe {
                let src = base.add((pc + p) * b.rs + j0 * b.cs);
                if b.cs == 1 && w == NR {
                    std::ptr::copy_nonoverlapping(src, row.as_mut_ptr(), NR);
                } else {
                    for (j, r) in row.iter_mut().enumerate() {
                        *r = if j < w { *src.add(j * b.cs) } else { 0.0 };
                    }
                }
            }
        }
    }
}

/// Packs one panel of [`NR`] columns of a transposed `B` (column `j` at `src + j·cs`,
/// contiguous along `k`) over `kc` rows into `panel` (`kc` rows of `NR` values): 8 rows
/// of 8 columns per step through [`transpose8`]. The backward's `dx = dy·Wᵀ` products
/// and the output layer's `x·wteᵀ` have such a `B`; the scalar gather it replaces
/// stored one float at a time.
///
/// # Safety
/// The `NR` columns hold `kc` readable floats at `src + j·cs`; `panel.len() >= kc·NR`.
#[target_feature(enable = "avx2,fma")]
unsafe fn pack_b_cols(kc: usize, src: *const f32, cs: usize, panel: &mut [f32]) {
    let panel = &mut panel[..kc * NR];
    let out = panel.as_mut_ptr();
    let mut p = 0;
    while p + 8 <= kc {
        for half in 0..NR / 8 {
            // SAFETY: rows p..p + 8 of columns 8·half..8·half + 8 are in bounds; the
            // stores write rows p..p + 8 of the panel, 8 values each.
            unsafe {
                let col = |j: usize| _mm256_loadu_ps(src.add((8 * half + j) * cs + p));
                let rows = transpose8([
                    col(0),
                    col(1),
                    col(2),
                    col(3),
                    col(4),
                    col(5),
                    col(6),
                    col(7),
                ]);
                for (i, r) in rows.iter().enumerate() {
                    _mm256_storeu_ps(out.add((p + i) * NR + 8 * half), *r);
                }
            }
        }
        p += 8;
    }
    for p in p..kc {
        for j in 0..NR {
            // SAFETY: row p of column j is in bounds.
            panel[p * NR + j] = unsafe { *src.add(j * cs + p) };
        }
    }
}

/// Column stride of a transposed `A` (floats, 16 KB) from which [`pack_a`] walks whole
/// columns rather than panels.
const BY_COLUMNS_STRIDE: usize = 4096;

/// Packs `A[ic.., pc..]` (`mc x kc`) into `out` as panels of [`MR`] rows, each panel `kc`
/// columns of `MR` contiguous values, rows past `mc` zero.
#[inline(always)]
unsafe fn pack_a(mc: usize, kc: usize, a: Operand, ic: usize, pc: usize, out: &mut [f32]) {
    let base = a.ptr.get() as *const f32;
    let full = mc / MR;
    let by_columns = a.rs == 1 && full > 1 && a.cs >= BY_COLUMNS_STRIDE;
    if by_columns {
        // A transposed (column-major, the `dW = xᵀ·dy` products): column `pc + p` of the
        // block is `mc` contiguous floats. Walk the columns once, each spread over all the
        // whole panels, rather than panel by panel: one long contiguous read per column
        // (several cache lines in flight) instead of `kc` reads of 6 floats at a stride
        // of a whole row of the matrix per panel, which left the packing waiting on
        // memory where A comes from DRAM (the output layer's `dwte`); products whose
        // columns are closer together gain nothing from it, so they keep the panel walk.
        for p in 0..kc {
            // SAFETY: rows ic..ic + full·MR of column pc + p lie in A; each panel holds
            // kc groups of MR.
            unsafe {
                let col = base.add(ic + (pc + p) * a.cs);
                for ip in 0..full {
                    std::ptr::copy_nonoverlapping(
                        col.add(ip * MR),
                        out.as_mut_ptr().add(ip * MR * kc + p * MR),
                        MR,
                    );
                }
            }
        }
        if full * MR == mc {
            return;
        }
    }
    let skip = if by_columns { full } else { 0 };
    for (ip, panel) in out[..mc.div_ceil(MR) * MR * kc]
        .chunks_exact_mut(MR * kc)
        .enumerate()
        .skip(skip)
    {
        let i0 = ic + ip * MR;
        let h = (mc - ip * MR).min(MR);
        if h == MR && a.rs == 1 {
            // A transposed (column-major): each column of the panel is contiguous.
            for (p, col) in panel.chunks_exact_mut(MR).enumerate() {
                // SAFETY: the MR rows at column pc + p lie in A.
                unsafe {
                    std::ptr::copy_nonoverlapping(
                        base.add(i0 + (pc + p) * a.cs),
                        col.as_mut_ptr(),
                        MR,
                    )
                };
            }
            continue;
        }
        if h == MR && a.cs == 1 {
            // A row-major: 8 columns of the 6 rows at a time, transposed in registers.
            // SAFETY: rows i0..i0 + MR, columns pc..pc + kc lie in A; the panel holds
            // kc x MR values.
            unsafe { pack_a_rows(kc, base.add(i0 * a.rs + pc), a.rs, panel) };
            continue;
        }
        for i in 0..MR {
            if i < h {
                // SAFETY: row i0 + i, columns pc..pc + kc lie in A.
                let row = unsafe { base.add((i0 + i) * a.rs + pc * a.cs) };
                for p in 0..kc {
                    // SAFETY: as above.
                    panel[p * MR + i] = unsafe { *row.add(p * a.cs) };
                }
            } else {
                for p in 0..kc {
                    panel[p * MR + i] = 0.0;
                }
            }
        }
    }
}

/// Packs the `MR` rows at `src` (row stride `rs`, columns contiguous) over `kc` columns
/// into `panel` (`kc` groups of `MR` values). For a row-major `A` the scalar copy writes
/// one float at a time at a stride of `MR`; this moves 8 columns per step through an
/// 8 x 8 transpose (rows 6 and 7 are copies of row 5, never stored), which matters where
/// `n` is small and `A`'s packing is a large share of the work (the tiny model's `dx` of
/// the output layer: `k` 8449, `n` 128).
///
/// # Safety
/// The `MR` rows hold `kc` readable floats at `src + i·rs`; `panel.len() >= kc·MR`.
#[target_feature(enable = "avx2,fma")]
unsafe fn pack_a_rows(kc: usize, src: *const f32, rs: usize, panel: &mut [f32]) {
    let panel = &mut panel[..kc * MR];
    let out = panel.as_mut_ptr();
    let mut p = 0;
    while p + 8 <= kc {
        // SAFETY: columns p..p + 8 of each row are in bounds; the stores below write
        // groups p..p + 8 of the panel, each MR floats (the 8-wide stores' last two
        // lanes land in the next group, which the next store overwrites; the last
        // group's are written 4 + 2 wide).
        unsafe {
            let r = |i: usize| _mm256_loadu_ps(src.add(i * rs + p));
            // Column j of the 8: rows 0..6 in lanes 0..6.
            let cols = transpose8([r(0), r(1), r(2), r(3), r(4), r(5), r(5), r(5)]);
            for (j, c) in cols.iter().enumerate().take(7) {
                _mm256_storeu_ps(out.add((p + j) * MR), *c);
            }
            let last = out.add((p + 7) * MR);
            _mm_storeu_ps(last, _mm256_castps256_ps128(cols[7]));
            let hi = _mm_castps_si128(_mm256_extractf128_ps::<1>(cols[7]));
            _mm_storel_epi64(last.add(4) as *mut __m128i, hi);
        }
        p += 8;
    }
    for p in p..kc {
        for i in 0..MR {
            // SAFETY: column p of row i is in bounds.
            panel[p * MR + i] = unsafe { *src.add(i * rs + p) };
        }
    }
}

/// The 6 x 16 tile: `C[..mr, ..nr] = Σ_p ap[p]·bp[p] + beta·C`, `ap` the packed rows
/// (`kc x MR`), `bp` the packed columns (`kc x NR`), then `epi` if given (the last `KC`
/// slice of a product with an [`Epilogue`], already placed at this tile).
#[inline]
#[target_feature(enable = "avx2,fma")]
#[allow(clippy::too_many_arguments)]
unsafe fn kernel(
    kc: usize,
    ap: &[f32],
    bp: &[f32],
    beta: f32,
    c: *mut f32,
    rs: usize,
    cs: usize,
    mr: usize,
    nr: usize,
    epi: Option<Epilogue>,
) {
    prefetch_tile(c, rs, cs, mr, nr, &epi);
    let mut acc = [[_mm256_setzero_ps(); 2]; MR];
    let (ap, bp) = (&ap[..kc * MR], &bp[..kc * NR]);
    for p in 0..kc {
        // SAFETY: p < kc and the slices hold kc packed rows.
        unsafe {
            let b0 = _mm256_loadu_ps(bp.as_ptr().add(p * NR));
            let b1 = _mm256_loadu_ps(bp.as_ptr().add(p * NR + 8));
            let a = ap.as_ptr().add(p * MR);
            for (i, row) in acc.iter_mut().enumerate() {
                let ai = _mm256_broadcast_ss(&*a.add(i));
                row[0] = _mm256_fmadd_ps(ai, b0, row[0]);
                row[1] = _mm256_fmadd_ps(ai, b1, row[1]);
            }
        }
    }
    if cs == 1 && nr == NR {
        // SAFETY: the bias holds the tile's NR columns.
        let bias = epi
            .and_then(|e| e.bias)
            .map(|b| unsafe { [_mm256_loadu_ps(b), _mm256_loadu_ps(b.add(8))] });
        for (i, row) in acc.iter().enumerate().take(mr) {
            // SAFETY: row i of the tile holds NR contiguous values in C (and in the
            // epilogue's matrices, which share C's strides).
            unsafe {
                let ci = c.add(i * rs);
                let mut r = *row;
                if beta != 0.0 {
                    r[0] = _mm256_add_ps(r[0], _mm256_loadu_ps(ci));
                    r[1] = _mm256_add_ps(r[1], _mm256_loadu_ps(ci.add(8)));
                }
                if let Some(e) = &epi {
                    if let Some(b) = bias {
                        r[0] = _mm256_add_ps(r[0], b[0]);
                        r[1] = _mm256_add_ps(r[1], b[1]);
                    }
                    if let Some(o) = e.gelu_out {
                        let o = o.add(i * rs);
                        _mm256_storeu_ps(o, crate::elementwise::gelu::gelu::<__m256>(r[0]));
                        _mm256_storeu_ps(o.add(8), crate::elementwise::gelu::gelu::<__m256>(r[1]));
                    }
                    if let Some(p) = e.gelu_grad_of {
                        let p = p.add(i * rs);
                        r[0] =
                            crate::elementwise::gelu::gelu_grad::<__m256>(_mm256_loadu_ps(p), r[0]);
                        r[1] = crate::elementwise::gelu::gelu_grad::<__m256>(
                            _mm256_loadu_ps(p.add(8)),
                            r[1],
                        );
                    }
                }
                _mm256_storeu_ps(ci, r[0]);
                _mm256_storeu_ps(ci.add(8), r[1]);
            }
        }
        return;
    }
    let mut tile = [[0.0f32; NR]; MR];
    for (t, row) in tile.iter_mut().zip(&acc) {
        // SAFETY: `t` holds NR floats.
        unsafe {
            _mm256_storeu_ps(t.as_mut_ptr(), row[0]);
            _mm256_storeu_ps(t.as_mut_ptr().add(8), row[1]);
        }
    }
    // SAFETY: forwarded from the caller.
    unsafe { store_scalar(&tile, beta, (c, rs, cs, mr, nr), &epi) };
}

/// Prefetches the first and last element of each row of the `mr x nr` tile at `c` (its
/// one or two cache lines per row), and of the rows the epilogue reads or writes, so
/// that the tile's read (`beta` 1) or its write-allocate is no cache miss at the end of
/// the micro-kernel.
#[inline(always)]
fn prefetch_tile(
    c: *const f32,
    rs: usize,
    cs: usize,
    mr: usize,
    nr: usize,
    epi: &Option<Epilogue>,
) {
    let lines = |p: *const f32| {
        for i in 0..mr {
            // SAFETY: a prefetch does not fault (`wrapping_add`: nothing is dereferenced).
            unsafe {
                _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(i * rs) as *const i8);
                _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(i * rs + (nr - 1) * cs) as *const i8);
            }
        }
    };
    lines(c);
    if let Some(e) = epi {
        if let Some(p) = e.gelu_grad_of {
            lines(p);
        }
        if let Some(o) = e.gelu_out {
            lines(o);
        }
    }
}

/// The scalar end of a micro-kernel (ragged tiles, or `C` with a column stride): the
/// sums in `tile` (row `i`, column `j` at `tile[i][j]`) added to the `mr x nr` tile of
/// `C` if `beta` is 1, through the epilogue, one element at a time.
///
/// # Safety
/// The tile lies in `C` (and in the epilogue's matrices); `tile` holds `mr` rows of at
/// least `nr` sums.
#[inline(always)]
unsafe fn store_scalar<const W: usize>(
    tile: &[[f32; W]],
    beta: f32,
    (c, rs, cs, mr, nr): (*mut f32, usize, usize, usize, usize),
    epi: &Option<Epilogue>,
) {
    for (i, t) in tile.iter().enumerate().take(mr) {
        for (j, &v) in t.iter().enumerate().take(nr) {
            // SAFETY: (i, j) lies in the tile's valid part of C (and of the epilogue's
            // matrices).
            unsafe {
                let p = c.add(i * rs + j * cs);
                let r = if beta != 0.0 { v + *p } else { v };
                *p = match epi {
                    Some(e) => e.scalar(r, i, j, rs, cs),
                    None => r,
                };
            }
        }
    }
}

/// The epilogue's pointers, shared by the threads of [`sgemm_threads`] (each writes only
/// its own tiles of the matrices they address).
#[derive(Clone, Copy)]
struct SharedEpilogue(Epilogue);
// SAFETY: the pointers address the caller's matrices; the queue gives every tile of `C`
// (and of the epilogue's matrices) to one task at a time.
unsafe impl Send for SharedEpilogue {}
unsafe impl Sync for SharedEpilogue {}

impl SharedEpilogue {
    /// The epilogue (a method, so closures capture the `Sync` wrapper, not the field).
    fn get(self) -> Epilogue {
        self.0
    }
}

thread_local! {
    /// The packed blocks [`sgemm_threads`] shares among its threads, owned by the
    /// calling thread and reused across calls.
    static SHARED: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

/// Panels of `B` per packing task (256 columns).
const PACK_PANELS: usize = 16;
/// Tasks of products per thread and `KC` slice below which `A` is packed once for all
/// threads and the products are cut by columns as well as rows (few rows: the tiny
/// model's weight gradients, `128 x 2048 x 384`).
const UNITS_PER_THREAD: usize = 4;

/// One `KC x NC` slice of the product and its tasks, which are numbered from `start`:
/// first the packing of `B` (`packs_b` tasks of [`PACK_PANELS`] panels), then, if `A`
/// is shared, of `A` (one task per `MC` rows), then the products (`units`).
struct Slice {
    jc: usize,
    nc: usize,
    pc: usize,
    kc: usize,
    beta: f32,
    /// The last slice of its column block: the epilogue runs on it.
    last: bool,
    /// The first slice of its column block: its products wait on no earlier slice.
    first: bool,
    panels: usize,
    start: usize,
    packs_b: usize,
    packs_a: usize,
    units: usize,
    /// Where this column block's product tasks start in [`Queue::progress`].
    progress: usize,
}

/// The work of one product on several threads, as a queue of tasks in an order that
/// respects their dependencies: each task waits only on tasks before it, which a
/// running thread has already taken, so the threads can never wait on each other in a
/// circle, whichever of them rayon starts and when.
///
/// Each `KC x NC` slice of the product (column block `jc`, slice `pc` of `k`, in the
/// single-threaded order) is packed once for all threads into one of two shared
/// buffers (alternating, so the next slice's packing can start while the last products
/// of this one run) and then multiplied in tasks of up to `MC` rows of `C` (each packing
/// its own block of `A` into its thread's buffer, as the single-threaded kernel does),
/// or, where `m` gives fewer than [`UNITS_PER_THREAD`] such tasks per thread, of `MC`
/// rows by a share of the columns, `A`'s slice packed once into a shared buffer too.
/// The dependencies: packing slice `s` waits until the products of slice `s - 2` (the
/// last readers of its buffer) are done; a product task waits until its slice is
/// packed and, after the first slice of a column block, until the same task of the
/// slice before it has added its part to the same tiles of `C`.
struct Queue {
    kc: usize,
    mc: usize,
    m: usize,
    slices: Vec<Slice>,
    total: usize,
    shared_a: bool,
    /// Column chunks per row block (shared `A` only; 1 otherwise).
    chunks: usize,
    b_len: usize,
    a_len: usize,
    next: AtomicUsize,
    packed: Vec<AtomicUsize>,
    computed: Vec<AtomicUsize>,
    /// Per product task of each column block (its tiles of `C`): 1 + the index of the
    /// last slice it finished.
    progress: Vec<AtomicUsize>,
    /// Set when a thread panics in a task, so that the others stop waiting for it.
    poisoned: AtomicBool,
}

impl Queue {
    fn new(m: usize, k: usize, n: usize, threads: usize, beta: f32) -> Queue {
        let Blocking {
            kc: kcm,
            mc: mcm,
            nc: ncm,
            ..
        } = BLOCKING;
        let row_blocks = m.div_ceil(mcm);
        let shared_a = row_blocks < UNITS_PER_THREAD * threads;
        let max_panels = n.min(ncm).div_ceil(NR);
        let chunks = if shared_a {
            (UNITS_PER_THREAD * threads)
                .div_ceil(row_blocks)
                .min(max_panels)
        } else {
            1
        };
        let mut slices = Vec::new();
        let (mut start, mut progress) = (0, 0);
        for jc in (0..n).step_by(ncm) {
            let nc = (n - jc).min(ncm);
            let panels = nc.div_ceil(NR);
            let units = row_blocks * chunks.min(panels);
            for pc in (0..k).step_by(kcm) {
                let kc = (k - pc).min(kcm);
                let packs_b = panels.div_ceil(PACK_PANELS);
                let packs_a = if shared_a { row_blocks } else { 0 };
                slices.push(Slice {
                    jc,
                    nc,
                    pc,
                    kc,
                    beta: if pc == 0 { beta } else { 1.0 },
                    last: pc + kc == k,
                    first: pc == 0,
                    panels,
                    start,
                    packs_b,
                    packs_a,
                    units,
                    progress,
                });
                start += packs_b + packs_a + units;
            }
            progress += units;
        }
        let counters = |len: usize| (0..len).map(|_| AtomicUsize::new(0)).collect();
        Queue {
            kc: kcm,
            mc: mcm,
            m,
            total: start,
            shared_a,
            chunks,
            b_len: kcm * max_panels * NR,
            a_len: if shared_a {
                kcm * m.div_ceil(MR) * MR
            } else {
                0
            },
            next: AtomicUsize::new(0),
            packed: counters(slices.len()),
            computed: counters(slices.len()),
            progress: counters(progress),
            poisoned: AtomicBool::new(false),
            slices,
        }
    }

    /// Floats of the shared buffer: two `B` slices, then two `A` slices if shared.
    fn shared_len(&self) -> usize {
        2 * (self.b_len + self.a_len)
    }

    /// Takes tasks until the queue is empty.
    ///
    /// # Safety
    /// As [`sgemm_epilogue`] for the operands and `epi`; `buf` holds
    /// [`Queue::shared_len`] floats that nothing else touches during the product.
    #[target_feature(enable = "avx2,fma")]
    unsafe fn work(
        &self,
        a: Operand,
        b: Operand,
        c: Operand,
        epi: SharedEpilogue,
        buf: crate::buffer::SendPtr,
    ) {
        // Marks the queue poisoned if this thread unwinds out of a task.
        struct Poison<'q>(&'q AtomicBool);
        impl Drop for Poison<'_> {
            fn drop(&mut self) {
                if std::thread::panicking() {
                    self.0.store(true, Ordering::Release);
                }
            }
        }
        let _poison = Poison(&self.poisoned);
        loop {
            let i = self.next.fetch_add(1, Ordering::Relaxed);
            if i >= self.total {
                return;
            }
            let s = self.slices.partition_point(|sl| sl.start <= i) - 1;
            let sl = &self.slices[s];
            let (kc, which) = (sl.kc, s % 2);
            // SAFETY (all pointer arithmetic below): the buffer holds two B slices of
            // `b_len` floats, then two A slices of `a_len`; the tasks of one slice write
            // disjoint parts of them, and the dependencies order every write after the
            // last read of the same part by the products two slices earlier.
            let (pb, pa) = unsafe {
                (
                    buf.get().add(which * self.b_len),
                    buf.get().add(2 * self.b_len + which * self.a_len),
                )
            };
            let task = i - sl.start;
            let packs = sl.packs_b + sl.packs_a;
            if task < packs {
                if s >= 2 {
                    let before = &self.slices[s - 2];
                    self.wait_for(&self.computed[s - 2], before.units);
                }
                if task < sl.packs_b {
                    let p0 = task * PACK_PANELS;
                    let p1 = (p0 + PACK_PANELS).min(sl.panels);
                    let cols = (sl.nc - p0 * NR).min((p1 - p0) * NR);
                    // SAFETY: panels p0..p1 of this slice's B lie in B (the caller's
                    // bounds) and in the buffer.
                    unsafe {
                        let out = std::slice::from_raw_parts_mut(
                            pb.add(p0 * NR * kc),
                            (p1 - p0) * NR * kc,
                        );
                        pack_b(kc, cols, b, sl.pc, sl.jc + p0 * NR, out);
                    }
                } else {
                    let r0 = (task - sl.packs_b) * self.mc;
                    let mc = (self.m - r0).min(self.mc);
                    // SAFETY: rows r0..r0 + mc of this slice's A lie in A and their
                    // panels in the buffer.
                    unsafe {
                        let out = std::slice::from_raw_parts_mut(
                            pa.add(r0 * kc),
                            mc.div_ceil(MR) * MR * kc,
                        );
                        pack_a(mc, kc, a, r0, sl.pc, out);
                    }
                }
                self.packed[s].fetch_add(1, Ordering::Release);
                continue;
            }
            let unit = task - packs;
            self.wait_for(&self.packed[s], packs);
            let progress = &self.progress[sl.progress + unit];
            if !sl.first {
                self.wait_for(progress, s);
            }
            let chunks = self.chunks.min(sl.panels);
            let (rb, chunk) = (unit / chunks, unit % chunks);
            let r0 = rb * self.mc;
            let mc = (self.m - r0).min(self.mc);
            let (q0, q1) = (chunk * sl.panels / chunks, (chunk + 1) * sl.panels / chunks);
            let cols = (q0, q1);
            let block = Block {
                kc,
                beta: sl.beta,
                last: sl.last,
                rows: (r0, mc),
                jc: sl.jc,
                nc: sl.nc,
            };
            if self.shared_a {
                // SAFETY: the slice's A panels of rows r0.. (packed above); the tiles
                // are this task's alone.
                unsafe { tiles(&block, cols, pa.add(r0 * kc), pb, c, epi.get()) };
            } else {
                PACK.with(|pack| {
                    let mut pack = pack.borrow_mut();
                    let pa_own = aligned(&mut pack.0, self.kc * self.mc);
                    // SAFETY: rows r0..r0 + mc of the slice's A lie in A, and the tiles
                    // are this task's alone.
                    unsafe {
                        pack_a(mc, kc, a, r0, sl.pc, pa_own);
                        tiles(&block, cols, pa_own.as_ptr(), pb, c, epi.get());
                    }
                });
            }
            progress.store(s + 1, Ordering::Release);
            self.computed[s].fetch_add(1, Ordering::Release);
        }
    }
}

impl Queue {
    /// Waits until `counter` reaches `value` (it only grows): spins briefly, then yields.
    /// Panics if another thread panicked in a task (which would never count).
    fn wait_for(&self, counter: &AtomicUsize, value: usize) {
        let mut spins = 0u32;
        while counter.load(Ordering::Acquire) < value {
            assert!(
                !self.poisoned.load(Ordering::Acquire),
                "andrea-cpu: another thread's GEMM task panicked"
            );
            if spins < 2000 {
                std::hint::spin_loop();
                spins += 1;
            } else {
                std::thread::yield_now();
            }
        }
    }
}

/// [`sgemm_epilogue`] on `threads` threads of the current rayon pool, every operand
/// packed once ([`Queue`]). The same operations on every element of `C` as the
/// single-threaded kernel, so the same bits on any number of threads.
///
/// # Safety
/// As [`sgemm_epilogue`].
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn sgemm_threads(
    m: usize,
    k: usize,
    n: usize,
    a: Operand,
    b: Operand,
    beta: f32,
    c: Operand,
    epi: Epilogue,
    threads: usize,
) {
    if threads <= 1 || m == 0 || n == 0 || k == 0 {
        // SAFETY: forwarded.
        unsafe { sgemm_epilogue(m, k, n, a, b, beta, c, epi) };
        return;
    }
    let queue = Queue::new(m, k, n, threads, beta);
    let epi = SharedEpilogue(epi);
    let go = |buf: &mut Vec<f32>| {
        // Every B slice (`b_len`, a multiple of 16 floats) starts on a cache line.
        let ptr = crate::buffer::SendPtr(aligned(buf, queue.shared_len()).as_mut_ptr());
        // SAFETY: forwarded; the buffer is this call's alone.
        (0..threads)
            .into_par_iter()
            .for_each(|_| unsafe { queue.work(a, b, c, epi, ptr) });
    };
    SHARED.with(|cell| match cell.try_borrow_mut() {
        Ok(mut buf) => go(&mut buf),
        // In use further up this thread's stack (rayon ran this product inside another's
        // wait): a buffer of its own.
        Err(_) => go(&mut Vec::new()),
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The operand over `p` at strides `rs`, `cs`.
    fn op(p: &mut [f32], rs: usize, cs: usize) -> Operand {
        Operand {
            ptr: crate::buffer::SendPtr(p.as_mut_ptr()),
            rs,
            cs,
        }
    }

    /// `C (+)= A·B` through [`sgemm`] against a float64 product, on shapes the conformance
    /// suite does not reach: `k` across two and a half `KC` slices, `m` and `n` ending in
    /// ragged tiles and `n` past one `NC` block, a transposed `A` whose columns lie far
    /// enough apart to be packed column by column, each operand row-major or transposed.
    #[test]
    fn matches_the_f64_product_across_k_slices_and_ragged_tiles() {
        if !(is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma")) {
            eprintln!("SKIPPED: no AVX2 + FMA");
            return;
        }
        // SAFETY: the helper passes operands holding their whole matrices, C apart.
        {
            let Blocking { kc, nc, .. } = BLOCKING;
            let product = |m, k, n, a, b, beta, c| unsafe { sgemm(m, k, n, a, b, beta, c) };
            crate::gemm::check_against_f64(
                "sgemm",
                &[
                    (13, 2 * kc + kc / 2 + 3, 37),
                    (7, 5, nc + 21),
                    (1, kc, 1),
                    // A transposed with columns BY_COLUMNS_STRIDE or more apart: packed
                    // by columns, whole panels and a ragged last one, across a k slice.
                    (BY_COLUMNS_STRIDE + 4, kc + 44, 9),
                ],
                &[&product],
            );
        }
    }

    /// The epilogues in the micro-kernel give the bits of the plain product followed by
    /// the separate passes (`c += bias`, `out = GELU(c)`, `c ·= GELU'(pre)`), on whole
    /// and ragged tiles (the vector and the scalar path), across `KC` slices (only the
    /// last applies it), with `beta` 0 and 1, C row-major or with a column stride of 1
    /// and a row stride wider than `n`; and `out`, `pre` and `C` outside the product
    /// untouched.
    #[test]
    fn epilogues_give_the_bits_of_the_separate_passes() {
        use crate::simd::{gelu, gelu_grad, Fused};
        if !(is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma")) {
            eprintln!("SKIPPED: no AVX2 + FMA");
            return;
        }
        let mut r = andrea_testkit::random::Rand::new(11);
        let shapes = [
            (13, 2 * KC + 7, 37),
            (12, 5, 32),
            (7, 0, 9),
            (1, 3, 16),
            (25, 9, 70),
            (6, 3, 48),
        ];
        for &(m, k, n) in &shapes {
            for (beta, pad) in [(0.0f32, 0), (1.0, 3)] {
                // C, out and pre are [m, n] at row stride n + pad; the pad is a guard.
                let rs = n + pad;
                let mut a = r.vec(m * k, -1.0, 1.0);
                let mut b = r.vec(k * n, -1.0, 1.0);
                let bias = r.vec(n, -1.0, 1.0);
                let c0 = r.vec(m * rs, -3.0, 3.0);
                let pre = r.vec(m * rs, -4.0, 4.0);
                // The plain product, then each pass on its own.
                let mut want = c0.clone();
                // SAFETY: every operand holds its whole matrix; AVX2 + FMA checked.
                unsafe {
                    sgemm(
                        m,
                        k,
                        n,
                        op(&mut a, k, 1),
                        op(&mut b, n, 1),
                        beta,
                        op(&mut want, rs, 1),
                    )
                };
                for (case, (with_bias, with_out, with_grad)) in [
                    (true, false, false),
                    (true, true, false),
                    (false, false, true),
                    (true, true, true),
                ]
                .into_iter()
                .enumerate()
                {
                    let mut want_c = want.clone();
                    let mut want_out = vec![-9.0f32; m * rs];
                    for i in 0..m {
                        for j in 0..n {
                            let x = &mut want_c[i * rs + j];
                            if with_bias {
                                *x += bias[j];
                            }
                            if with_out {
                                want_out[i * rs + j] = gelu::<Fused>(*x);
                            }
                            if with_grad {
                                *x *= gelu_grad::<Fused>(pre[i * rs + j]);
                            }
                        }
                    }
                    let mut c = c0.clone();
                    let mut out = vec![-9.0f32; m * rs];
                    let epi = Epilogue {
                        bias: with_bias.then_some(bias.as_ptr()),
                        gelu_out: with_out.then_some(out.as_mut_ptr()),
                        gelu_grad_of: with_grad.then_some(pre.as_ptr()),
                    };
                    // SAFETY: as above; out and pre hold C's layout.
                    unsafe {
                        sgemm_epilogue(
                            m,
                            k,
                            n,
                            op(&mut a, k, 1),
                            op(&mut b, n, 1),
                            beta,
                            op(&mut c, rs, 1),
                            epi,
                        )
                    };
                    let what = format!("{m}x{k}x{n} beta {beta} pad {pad} case {case}");
                    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                    assert_eq!(bits(&c), bits(&want_c), "C of {what}");
                    assert_eq!(bits(&out), bits(&want_out), "out of {what}");
                }
            }
        }
    }

    /// Each micro-kernel's scalar path (`C`, and the epilogue's matrices, stored
    /// transposed) gives the bits of its vector path (row-major): for the 512-bit one in
    /// every tile form (2 x 2, 2 x 1, 1 x 2, 1 x 1 panels), with the epilogues, `beta` 0
    /// and 1, across `KC` slices.
    #[test]
    fn transposed_c_gives_the_bits_of_row_major_c() {
        if !(is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma")) {
            eprintln!("SKIPPED: no AVX2 + FMA");
            return;
        }
        let mut r = andrea_testkit::random::Rand::new(17);
        {
            let kc = KC;
            for &(m, k, n) in &[(19, kc + 3, 41), (4, 7, 20)] {
                for beta in [0.0f32, 1.0] {
                    let mut a = r.vec(m * k, -1.0, 1.0);
                    let mut b = r.vec(k * n, -1.0, 1.0);
                    let bias = r.vec(n, -1.0, 1.0);
                    let pre = r.vec(m * n, -3.0, 3.0);
                    let c0 = r.vec(m * n, -2.0, 2.0);
                    // (row stride, column stride) of C, out and pre: row-major [m, n] or
                    // transposed ([n, m] in memory); the results are read back as [m, n].
                    let mut run = |(rs, cs): (usize, usize)| {
                        let at = |v: &[f32]| {
                            let mut t = vec![0.0f32; m * n];
                            for i in 0..m {
                                for j in 0..n {
                                    t[i * rs + j * cs] = v[i * n + j];
                                }
                            }
                            t
                        };
                        let back = |t: &[f32]| {
                            let mut v = vec![0.0f32; m * n];
                            for i in 0..m {
                                for j in 0..n {
                                    v[i * n + j] = t[i * rs + j * cs];
                                }
                            }
                            v
                        };
                        let (mut c, mut out, pre) = (at(&c0), vec![-9.0f32; m * n], at(&pre));
                        let epi = Epilogue {
                            bias: Some(bias.as_ptr()),
                            gelu_out: Some(out.as_mut_ptr()),
                            gelu_grad_of: Some(pre.as_ptr()),
                        };
                        // SAFETY: every operand holds its whole matrix, out and pre in
                        // C's layout; AVX2 + FMA checked.
                        unsafe {
                            let (a, b) = (op(&mut a, k, 1), op(&mut b, n, 1));
                            sgemm_epilogue(m, k, n, a, b, beta, op(&mut c, rs, cs), epi);
                        }
                        (back(&c), back(&out))
                    };
                    let want = run((n, 1));
                    let got = run((1, m));
                    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                    let what = format!("{m}x{k}x{n} beta {beta}");
                    assert_eq!(bits(&got.0), bits(&want.0), "C of {what}");
                    assert_eq!(bits(&got.1), bits(&want.1), "out of {what}");
                }
            }
        }
    }

    /// [`sgemm_threads`] gives the bits of the single-threaded [`sgemm_epilogue`] on 2 and
    /// 3 threads, in both of its forms (`A` packed per task: `m` of many `MC` blocks; `A`
    /// packed once and the columns cut too: few rows), across four `KC` slices (both
    /// shared buffers reused), two `NC` blocks and ragged tiles, with and without the
    /// epilogues, `beta` 0 and 1.
    #[test]
    fn threads_give_the_bits_of_one_thread() {
        if !(is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma")) {
            eprintln!("SKIPPED: no AVX2 + FMA");
            return;
        }
        let mut r = andrea_testkit::random::Rand::new(5);
        for threads in [2, 3] {
            let Blocking { kc, mc, nc } = BLOCKING;
            let shapes = [
                // Many row blocks: A packed per task (2 and 3 threads).
                (13 * mc + 5, 3 * kc + 17, 45),
                // Few rows, two NC blocks, the last ragged: A shared, columns cut.
                (mc + 7, 2 * kc + 1, nc + 40),
                (5, 4 * kc, 70),
                (1, 9, 1),
            ];
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .build()
                .unwrap();
            for &(m, k, n) in &shapes {
                for (beta, with_epi) in [(0.0f32, false), (1.0, true), (0.0, true)] {
                    let mut a = r.vec(m * k, -1.0, 1.0);
                    let mut b = r.vec(k * n, -1.0, 1.0);
                    let bias = r.vec(n, -1.0, 1.0);
                    let pre = r.vec(m * n, -3.0, 3.0);
                    let c0 = r.vec(m * n, -2.0, 2.0);
                    let run = |c: &mut Vec<f32>,
                               out: &mut Vec<f32>,
                               a: &mut [f32],
                               b: &mut [f32],
                               t: usize| {
                        let epi = Epilogue {
                            bias: with_epi.then_some(bias.as_ptr()),
                            gelu_out: with_epi.then_some(out.as_mut_ptr()),
                            gelu_grad_of: with_epi.then_some(pre.as_ptr()),
                        };
                        // A transposed when `m` is small (the weight gradients' layout),
                        // row-major otherwise.
                        let a_op = if m < 2 * mc { op(a, 1, m) } else { op(a, k, 1) };
                        // SAFETY: every operand holds its whole matrix; AVX2 + FMA checked.
                        // One thread: `sgemm_threads` is `sgemm_epilogue` itself.
                        let epi = SharedEpilogue(epi);
                        pool.install(|| unsafe {
                            let (b, c) = (op(b, n, 1), op(c, n, 1));
                            sgemm_threads(m, k, n, a_op, b, beta, c, epi.get(), t)
                        })
                    };
                    let (mut want, mut want_out) = (c0.clone(), vec![-9.0f32; m * n]);
                    run(&mut want, &mut want_out, &mut a, &mut b, 1);
                    let (mut got, mut got_out) = (c0.clone(), vec![-9.0f32; m * n]);
                    run(&mut got, &mut got_out, &mut a, &mut b, threads);
                    let what = format!(
                        "{m}x{k}x{n} on {threads} threads, beta {beta}, epilogue {with_epi}"
                    );
                    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                    assert!(bits(&got) == bits(&want), "C of {what}");
                    assert!(bits(&got_out) == bits(&want_out), "out of {what}");
                }
            }
        }
    }
}
