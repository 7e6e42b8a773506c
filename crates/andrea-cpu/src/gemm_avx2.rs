//! andrea's own single-threaded f32 GEMM for AVX2 + FMA ([`GemmKernel::Avx2`]).
//!
//! Why it exists: the `gemm` crate and matrixmultiply both pick their micro-kernel from
//! the CPU (`is_x86_feature_detected!`), so under `ANDREA_SIMD=avx2` they still run
//! AVX-512, and an "AVX2" measurement on an AVX-512 machine would time AVX-512 GEMMs.
//! This kernel is what `ANDREA_SIMD=avx2` (or an AVX2-only CPU) selects by default, so
//! the cap covers the whole step; `ANDREA_GEMM=gemm` keeps the `gemm` crate (on an
//! AVX2-only machine, its AVX2 kernel) to compare.
//!
//! The layout is the usual one of BLIS-style kernels (Goto's): `B` packed per `KC x NC`
//! block into panels of [`NR`] columns, `A` per `MC x KC` block into panels of [`MR`]
//! rows, both zero-padded to whole panels, and a register-blocked micro-kernel computing
//! an `MR x NR` tile of `C` (6 x 16: twelve 8-lane accumulators, two loads of `B` and six
//! broadcasts of `A` per step of `k`, 15 of the 16 `ymm` registers). `KC = 384` keeps a
//! `B` micro-panel (24 KB) and an `A` one (9 KB) in a 48 KB L1 and the `A` block
//! (`MC = 96` rows, 144 KB) in L2. Chosen by alternating runs of
//! `cargo run --release -p andrea-cpu --example gemm_kernels -- --threads 1 --kernels
//! avx2,gemm` on the step's 11 shapes, as the median ratio to the `gemm` crate's AVX-512
//! kernel in the same process (a loaded machine: 23:44-23:47 UTC, 2026-12-01): KC 256
//! 0.49-0.54, 320 0.52-0.54, 384 0.52-0.58; MC 144 0.52-0.54 against 96's 0.55-0.56.
//! A CPU with a 32 KB L1 may prefer `KC = 256` (not measured: no such machine here).
//!
//! **Results.** Each element of `C` is `Σ_k a·b` as one FMA chain per `KC` slice of `k`,
//! in `k` order, the slices added to `C` in order (the first with `beta`): the same
//! operations whatever the block of `C` the element falls in, so results do not depend
//! on the thread count (the callers split `C` into blocks). They differ from the other
//! kernels' in the last bits (another summation order), within the GEMM tolerance.

use std::arch::x86_64::*;
use std::cell::RefCell;

use crate::gemm::Operand;

/// Rows of `A` (and of the `C` tile) per micro-kernel call.
pub(crate) const MR: usize = 6;
/// Columns of `B` (and of the `C` tile) per micro-kernel call: two AVX vectors.
pub(crate) const NR: usize = 16;
const KC: usize = 384;
const MC: usize = 96;
const NC: usize = 3072;

thread_local! {
    /// Packed `A` and `B` blocks of this thread, reused across calls.
    static PACK: RefCell<(Vec<f32>, Vec<f32>)> = const { RefCell::new((Vec::new(), Vec::new())) };
}

/// `C = A·B + beta·C` with `beta` 0 (C not read) or 1, `A: [m, k]`, `B: [k, n]`, any
/// strides, on this thread.
///
/// # Safety
/// As [`crate::gemm::sgemm_strided`]; and the CPU has AVX2 and FMA.
#[target_feature(enable = "avx2,fma")]
pub(crate) unsafe fn sgemm(
    m: usize,
    k: usize,
    n: usize,
    a: Operand,
    b: Operand,
    beta: f32,
    c: Operand,
) {
    if m == 0 || n == 0 {
        return;
    }
    if k == 0 {
        // SAFETY: C is valid for m x n at its strides (the caller's).
        unsafe { scale_c(m, n, beta, c) };
        return;
    }
    PACK.with(|pack| {
        let (pa, pb) = &mut *pack.borrow_mut();
        let nc_max = n.min(NC).div_ceil(NR) * NR;
        pb.resize(KC * nc_max, 0.0);
        pa.resize(KC * MC.min(m.div_ceil(MR) * MR), 0.0);
        for jc in (0..n).step_by(NC) {
            let nc = (n - jc).min(NC);
            for pc in (0..k).step_by(KC) {
                let kc = (k - pc).min(KC);
                let beta = if pc == 0 { beta } else { 1.0 };
                // SAFETY: the block lies inside B (the caller's bounds).
                unsafe { pack_b(kc, nc, b, pc, jc, pb) };
                for ic in (0..m).step_by(MC) {
                    let mc = (m - ic).min(MC);
                    // SAFETY: the block lies inside A.
                    unsafe { pack_a(mc, kc, a, ic, pc, pa) };
                    for jr in (0..nc).step_by(NR) {
                        let nr = (nc - jr).min(NR);
                        let bp = &pb[jr * kc..(jr + NR) * kc];
                        for ir in (0..mc).step_by(MR) {
                            let mr = (mc - ir).min(MR);
                            let ap = &pa[ir * kc..(ir + MR) * kc];
                            // SAFETY: the tile (ic + ir, jc + jr) of mr x nr lies in C.
                            unsafe {
                                let ct = c.ptr.get().add((ic + ir) * c.rs + (jc + jr) * c.cs);
                                kernel(kc, ap, bp, beta, ct, c.rs, c.cs, mr, nr);
                            }
                        }
                    }
                }
            }
        }
    });
}

/// `C = beta·C` (the product of an empty `k`).
unsafe fn scale_c(m: usize, n: usize, beta: f32, c: Operand) {
    for i in 0..m {
        for j in 0..n {
            // SAFETY: (i, j) lies in C.
            unsafe {
                let p = c.ptr.get().add(i * c.rs + j * c.cs);
                *p = if beta == 0.0 { 0.0 } else { *p * beta };
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

/// Packs `A[ic.., pc..]` (`mc x kc`) into `out` as panels of [`MR`] rows, each panel `kc`
/// columns of `MR` contiguous values, rows past `mc` zero.
#[inline(always)]
unsafe fn pack_a(mc: usize, kc: usize, a: Operand, ic: usize, pc: usize, out: &mut [f32]) {
    let base = a.ptr.get() as *const f32;
    for (ip, panel) in out[..mc.div_ceil(MR) * MR * kc]
        .chunks_exact_mut(MR * kc)
        .enumerate()
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

/// The 6 x 16 tile: `C[..mr, ..nr] = Σ_p ap[p]·bp[p] + beta·C`, `ap` the packed rows
/// (`kc x MR`), `bp` the packed columns (`kc x NR`).
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
) {
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
        for (i, row) in acc.iter().enumerate().take(mr) {
            // SAFETY: row i of the tile holds NR contiguous values in C.
            unsafe {
                let ci = c.add(i * rs);
                let (mut r0, mut r1) = (row[0], row[1]);
                if beta != 0.0 {
                    r0 = _mm256_add_ps(r0, _mm256_loadu_ps(ci));
                    r1 = _mm256_add_ps(r1, _mm256_loadu_ps(ci.add(8)));
                }
                _mm256_storeu_ps(ci, r0);
                _mm256_storeu_ps(ci.add(8), r1);
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
    for (i, t) in tile.iter().enumerate().take(mr) {
        for (j, &v) in t.iter().enumerate().take(nr) {
            // SAFETY: (i, j) lies in the tile's valid part of C.
            unsafe {
                let p = c.add(i * rs + j * cs);
                *p = if beta != 0.0 { v + *p } else { v };
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `C (+)= A·B` through [`sgemm`] against a float64 product, on shapes the conformance
    /// suite does not reach: `k` across two and a half `KC` slices, `m` and `n` ending in
    /// ragged tiles and `n` past one `NC` block, each operand row-major or transposed.
    #[test]
    fn matches_the_f64_product_across_k_slices_and_ragged_tiles() {
        if !(is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma")) {
            eprintln!("SKIPPED: no AVX2 + FMA");
            return;
        }
        // SAFETY: the helper passes operands holding their whole matrices, C apart.
        let product = |m, k, n, a, b, beta, c| unsafe { sgemm(m, k, n, a, b, beta, c) };
        crate::gemm::check_against_f64(
            "avx2 sgemm",
            &[(13, 2 * KC + KC / 2 + 3, 37), (7, 5, NC + 21), (1, KC, 1)],
            &[&product],
        );
    }
}
