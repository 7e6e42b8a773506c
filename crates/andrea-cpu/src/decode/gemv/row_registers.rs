//! The row form's chunk for one row of `A` (`m = 1`, a decoded token) with the partial
//! row held in registers on NEON, written over the width ([`F32Mem`]) as `avx2`'s
//! `row_chunk_one` is for AVX2 (an AVX2 instance of this body gives that kernel's bits,
//! not its speed, so x86 keeps it); AVX-512 has its own (`avx512::row_chunk_one`).
//!
//! `part[j] += Σ_r a[r]·w[r·ws + j]` over the chunk's rows in order: a block of the
//! partial row stays in registers (up to 24 vectors, 96 columns, of NEON's 32 registers,
//! beside the weights and the broadcast) while the rows' pieces of that block stream
//! past, block after block. The same fused steps in the same row order as the generic
//! `row_chunk` (same bits). On x86 the AVX2 kernel beats the generic chunk (four rows per
//! pass, the partial row loaded and stored every pass) on two threads or more and loses
//! to it on one, so `gemv` takes it on two threads or more; NEON follows the same rule,
//! unmeasured.

use crate::simd::lanes::F32Mem;

/// See the module docs.
///
/// # Safety
/// The CPU has `V`'s instruction set. (Bounds are asserted.)
#[inline(always)]
unsafe fn row_chunk_one<V: F32Mem>(part: &mut [f32], a: &[f32], w: &[f32], ws: usize) {
    let (n, rows, l) = (part.len(), a.len(), V::LANES);
    assert!(rows > 0 && w.len() >= (rows - 1) * ws + n);
    let mut j0 = 0;
    // SAFETY (all calls): columns j0.. of each row and of `part` are in bounds (asserted);
    // the instruction set is the caller's.
    unsafe {
        while n - j0 >= l {
            // Blocks of at most 96 columns.
            j0 += match (n - j0) / l {
                24.. => row_block::<V, 24>(part, a, w, ws, j0),
                16.. => row_block::<V, 16>(part, a, w, ws, j0),
                12.. => row_block::<V, 12>(part, a, w, ws, j0),
                8.. => row_block::<V, 8>(part, a, w, ws, j0),
                4.. => row_block::<V, 4>(part, a, w, ws, j0),
                2.. => row_block::<V, 2>(part, a, w, ws, j0),
                _ => row_block::<V, 1>(part, a, w, ws, j0),
            };
        }
    }
    // The last n mod LANES columns, one fused step a row.
    for (j, p) in part.iter_mut().enumerate().skip(j0) {
        *p = a
            .iter()
            .enumerate()
            .fold(*p, |s, (r, &ar)| ar.mul_add(w[r * ws + j], s));
    }
}

/// Columns `j0..j0 + NV·LANES` of [`row_chunk_one`]; returns `NV·LANES`.
///
/// # Safety
/// As [`row_chunk_one`], with those columns in bounds.
#[inline(always)]
unsafe fn row_block<V: F32Mem, const NV: usize>(
    part: &mut [f32],
    a: &[f32],
    w: &[f32],
    ws: usize,
    j0: usize,
) -> usize {
    let l = V::LANES;
    // SAFETY: columns j0..j0 + NV·LANES of `part` and of each row are in bounds (the
    // caller's promise).
    unsafe {
        let p = part.as_mut_ptr().add(j0);
        let mut acc: [V; NV] = std::array::from_fn(|v| V::load(p.add(v * l)));
        for (r, &ar) in a.iter().enumerate() {
            let av = V::splat(ar);
            let wr = w.as_ptr().add(r * ws + j0);
            for (v, acc) in acc.iter_mut().enumerate() {
                *acc = V::fmadd(av, V::load(wr.add(v * l)), *acc);
            }
        }
        for (v, acc) in acc.iter().enumerate() {
            V::store(p.add(v * l), *acc);
        }
    }
    NV * l
}

/// [`row_chunk_one`] with NEON.
///
/// # Safety
/// None beyond NEON, which aarch64 always has. (Bounds are asserted.)
#[cfg(target_arch = "aarch64")]
#[target_feature(enable = "neon")]
pub(crate) unsafe fn row_chunk_one_neon(part: &mut [f32], a: &[f32], w: &[f32], ws: usize) {
    // SAFETY: the caller's.
    unsafe { row_chunk_one::<std::arch::aarch64::float32x4_t>(part, a, w, ws) }
}
