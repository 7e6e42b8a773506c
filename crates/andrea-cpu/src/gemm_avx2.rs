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
//! broadcasts of `A` per step of `k`, 15 of the 16 `ymm` registers). `KC = 256` keeps a
//! `B` micro-panel (16 KB) and an `A` one (6 KB) in a 32 KB L1 (AVX2-only CPUs: Zen 2
//! and 3, Intel before Ice Lake) and the `A` block (`MC = 96` rows, 96 KB) in L2; the
//! micro-kernel prefetches its `C` tile's rows before the `k` loop, so that the tile's
//! read (`beta` 1) or its write-allocate is not a cache miss at the end of each call.
//!
//! Chosen on an AVX2-only AMD EPYC (Zen 3, 32 KB L1, 512 KB L2; 2026-12-02) by
//! `cargo run --release -p andrea-cpu --example gemm_kernels -- --threads 1 --rounds 9
//! --clock cpu --kernels avx2 --only fwd_fc,fwd_fc_proj,bwd_dw_qkv,bwd_dx_lm_head`,
//! variants alternated, two sittings each (one thread's FMA probe: 80-94 GFLOP/s on that
//! noisy host): `KC = 384` without the prefetch 47-72 GFLOP/s median (the previous
//! choice, made on a 48 KB-L1 Intel machine where a 24 KB micro-panel fits), `KC = 256`
//! 46-72, `KC = 384` + prefetch 53-76, `KC = 256` + prefetch 64-83 (78-83 in the quieter
//! sitting: 87-92% of the probe); `MC` 144 measured level with 96, 192 behind.
//! Raw outputs: benches/results/20261202T1155Z-zen3-gemm-avx2/.
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
const KC: usize = 256;
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
            let (r0, r1, r2, r3, r4, r5) = (r(0), r(1), r(2), r(3), r(4), r(5));
            let t0 = _mm256_unpacklo_ps(r0, r1);
            let t1 = _mm256_unpackhi_ps(r0, r1);
            let t2 = _mm256_unpacklo_ps(r2, r3);
            let t3 = _mm256_unpackhi_ps(r2, r3);
            let t4 = _mm256_unpacklo_ps(r4, r5);
            let t5 = _mm256_unpackhi_ps(r4, r5);
            let t6 = _mm256_unpacklo_ps(r5, r5);
            let t7 = _mm256_unpackhi_ps(r5, r5);
            let s0 = _mm256_shuffle_ps::<0x44>(t0, t2);
            let s1 = _mm256_shuffle_ps::<0xEE>(t0, t2);
            let s2 = _mm256_shuffle_ps::<0x44>(t1, t3);
            let s3 = _mm256_shuffle_ps::<0xEE>(t1, t3);
            let s4 = _mm256_shuffle_ps::<0x44>(t4, t6);
            let s5 = _mm256_shuffle_ps::<0xEE>(t4, t6);
            let s6 = _mm256_shuffle_ps::<0x44>(t5, t7);
            let s7 = _mm256_shuffle_ps::<0xEE>(t5, t7);
            // Column j of the 8: rows 0..6 in lanes 0..6.
            let cols = [
                _mm256_permute2f128_ps::<0x20>(s0, s4),
                _mm256_permute2f128_ps::<0x20>(s1, s5),
                _mm256_permute2f128_ps::<0x20>(s2, s6),
                _mm256_permute2f128_ps::<0x20>(s3, s7),
                _mm256_permute2f128_ps::<0x31>(s0, s4),
                _mm256_permute2f128_ps::<0x31>(s1, s5),
                _mm256_permute2f128_ps::<0x31>(s2, s6),
                _mm256_permute2f128_ps::<0x31>(s3, s7),
            ];
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
    // The tile's first and last element of each row: its one or two cache lines.
    for i in 0..mr {
        // SAFETY: a prefetch does not fault; the addresses lie in the tile anyway.
        unsafe {
            _mm_prefetch::<_MM_HINT_T0>(c.add(i * rs) as *const i8);
            _mm_prefetch::<_MM_HINT_T0>(c.add(i * rs + (nr - 1) * cs) as *const i8);
        }
    }
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
