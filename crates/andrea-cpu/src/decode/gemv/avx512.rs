//! The column form of the few-rows product (`gemv` module) with AVX-512 intrinsics:
//! `dots[i, j] = x[i, :] · w[j]` for a band of rows `w[j]` of `W`, sixteen rows of `W`
//! at a time. This is the tied output projection of a decoded token (`x · wteᵀ`, 128 ×
//! 8449 in the tiny model), the largest product of a decode step.
//!
//! The generic form ([`gemv::dot`](super::dot)) takes one row of `W` at a time: 16
//! running sums (one 512-bit vector) over `k`, then a tree of adds down to one lane,
//! `acc[l] += acc[l + h]` for `h = 8, 4, 2, 1`, then `+ tail` (the `k mod 16` last
//! products, summed on their own). At `k = 128` that is 8 FMAs on one dependency chain
//! and a 4-level horizontal reduction per dot, so the pipes sit idle on latency. Here
//! sixteen rows run together: 16 independent chains of FMAs, and the sixteen
//! reductions share their shuffles, each level adding the halves of two rows' vectors
//! at once (a transpose as it reduces), so sixteen dots end in one vector. Rows of at
//! most 128 floats are read one after another with `x` in registers
//! ([`rows_in_turn`]: the band's block is read in memory order, one load per FMA);
//! longer rows advance together, one `x` vector at a time ([`rows_together`]).
//!
//! **Same bits as the generic form.** Each row's lanes get the same fused
//! multiply-adds in the same `k` order, each level of the tree adds the same pairs of
//! lanes (`acc[l] + acc[l + h]`, addition being commutative), and the tail is the same
//! serial sum added last. A unit test compares the bits with [`crate::decode::gemv::dot`].
//!
//! Requires AVX-512 F (the caller checks [`simd::has_avx512`](crate::simd::has_avx512)).

use std::arch::x86_64::*;

use crate::decode::gemv::band::Band;

/// Lanes of one vector, and rows of `W` per pass.
const L: usize = 16;

/// `dots[i·cols + j] = x[i, :] · w[j]` for the band's `m` rows of `x` and `cols` rows
/// of `w`; the bits of `gemv::dot::<Fused>`.
///
/// # Safety
/// The CPU must have AVX-512 F. (Bounds are asserted.)
#[target_feature(enable = "avx512f,avx2,fma")]
pub(crate) unsafe fn column_band(dots: &mut [f32], band: Band<'_>) {
    let Band {
        x,
        w,
        ws,
        m,
        k,
        cols,
    } = band;
    assert!(cols > 0 && dots.len() >= m * cols && x.len() >= m * k);
    assert!(w.len() >= (cols - 1) * ws + k);
    for j0 in (0..cols).step_by(L) {
        let rows = L.min(cols - j0);
        // SAFETY: row j0 + r, r < rows, starts inside `w` and has k floats (asserted).
        let first = unsafe { w.as_ptr().add(j0 * ws) };
        for i in 0..m {
            let xi = &x[i * k..][..k];
            let out = &mut dots[i * cols + j0..][..rows];
            // Row r at a fixed stride in a full block (the compiler keeps one pointer and
            // the stride, not sixteen pointers); a short last block repeats its last
            // row, whose dots are not stored.
            // SAFETY: rows j0..j0 + rows of `w` have k floats each (asserted); the CPU
            // has AVX-512 F (this function's contract).
            unsafe {
                if rows == L {
                    sixteen_dots(xi, |r| first.wrapping_add(r * ws), out);
                } else {
                    sixteen_dots(xi, |r| first.wrapping_add(r.min(rows - 1) * ws), out);
                }
            }
        }
    }
}

/// `acc[r] += x[c..c + 16] · row(r)[c..c + 16]` for `c` from 0 to `NV·16` in steps of
/// 16, with `x` held in `NV` registers and each row read front to back before the next:
/// a block of sixteen rows of `k = NV·16` floats, contiguous in `wteᵀ`'s band, is read
/// in memory order with one load per FMA: faster than [`rows_together`] where the rows
/// are short (`k` = 128, the tiny model's output layer, weights in L3).
///
/// # Safety
/// As [`sixteen_dots`], with `x.len() >= NV·16`.
#[inline]
#[target_feature(enable = "avx512f,avx2,fma")]
unsafe fn rows_in_turn<const NV: usize>(
    x: &[f32],
    row: &impl Fn(usize) -> *const f32,
    acc: &mut [__m512; L],
) {
    // SAFETY: x has NV·16 floats (the caller's promise).
    let xv: [__m512; NV] =
        std::array::from_fn(|v| unsafe { _mm512_loadu_ps(x.as_ptr().add(v * L)) });
    for (r, a) in acc.iter_mut().enumerate() {
        let w = row(r);
        for (v, &xx) in xv.iter().enumerate() {
            // SAFETY: row r has at least NV·16 floats (the caller's promise).
            *a = _mm512_fmadd_ps(xx, unsafe { _mm512_loadu_ps(w.add(v * L)) }, *a);
        }
    }
}

/// `acc[r] += x[c..c + 16] · row(r)[c..c + 16]` for `c` from 0 to `body` in steps of
/// 16, the sixteen rows advancing together: one load of `x` per sixteen FMAs, for rows
/// too long for `x` to stay in registers. On ANDREA-120M's output layer (`k` = 768,
/// read from DRAM) 3-4% ahead of reading the rows in turn with `x` in 8-vector blocks.
///
/// # Safety
/// As [`sixteen_dots`], with `body <= x.len()` a multiple of 16.
#[inline]
#[target_feature(enable = "avx512f,avx2,fma")]
unsafe fn rows_together(
    x: &[f32],
    body: usize,
    row: &impl Fn(usize) -> *const f32,
    acc: &mut [__m512; L],
) {
    let mut c = 0;
    while c < body {
        // SAFETY: c + 16 <= body <= k, the length of x and of every row.
        let xv = unsafe { _mm512_loadu_ps(x.as_ptr().add(c)) };
        for (r, a) in acc.iter_mut().enumerate() {
            // SAFETY: row r has k floats (the caller's promise); c + 16 <= k.
            let wv = unsafe { _mm512_loadu_ps(row(r).add(c)) };
            *a = _mm512_fmadd_ps(xv, wv, *a);
        }
        c += L;
    }
}

/// The dots of `x` with the sixteen rows `row(0..16)`, the first `out.len()` stored.
///
/// # Safety
/// `row(r)` must point at `x.len()` readable floats for every `r < 16`; the CPU must have
/// AVX-512 F.
#[inline]
#[target_feature(enable = "avx512f,avx2,fma")]
pub(crate) unsafe fn sixteen_dots(x: &[f32], row: impl Fn(usize) -> *const f32, out: &mut [f32]) {
    let k = x.len();
    let body = k - k % L;
    let mut acc = [_mm512_setzero_ps(); L];
    // SAFETY (all arms): `body` floats of x and of every row are readable (the caller's
    // promise), and each arm reads `body` of them.
    unsafe {
        match body / L {
            1 => rows_in_turn::<1>(x, &row, &mut acc),
            2 => rows_in_turn::<2>(x, &row, &mut acc),
            3 => rows_in_turn::<3>(x, &row, &mut acc),
            4 => rows_in_turn::<4>(x, &row, &mut acc),
            5 => rows_in_turn::<5>(x, &row, &mut acc),
            6 => rows_in_turn::<6>(x, &row, &mut acc),
            7 => rows_in_turn::<7>(x, &row, &mut acc),
            8 => rows_in_turn::<8>(x, &row, &mut acc),
            _ => rows_together(x, body, &row, &mut acc),
        }
    }
    // Level h = 8: rows (2p, 2p+1) into one vector, the low 256 bits row 2p's
    // `acc[l] + acc[l + 8]`, the high row 2p+1's.
    let s1: [__m512; 8] = std::array::from_fn(|p| {
        let (a, b) = (acc[2 * p], acc[2 * p + 1]);
        let lo = _mm512_shuffle_f32x4::<0x44>(a, b); // a.0 a.1 b.0 b.1 (128-bit blocks)
        let hi = _mm512_shuffle_f32x4::<0xEE>(a, b); // a.2 a.3 b.2 b.3
        _mm512_add_ps(lo, hi)
    });
    // h = 4: block j of s2[q] holds row 4q + j's `acc[l] + acc[l + 4]`, l < 4.
    let s2: [__m512; 4] = std::array::from_fn(|q| {
        let (a, b) = (s1[2 * q], s1[2 * q + 1]);
        let lo = _mm512_shuffle_f32x4::<0x88>(a, b); // a.0 a.2 b.0 b.2
        let hi = _mm512_shuffle_f32x4::<0xDD>(a, b); // a.1 a.3 b.1 b.3
        _mm512_add_ps(lo, hi)
    });
    // h = 2: block j of s3[r] holds rows 8r + j (lanes 0, 1) and 8r + 4 + j (2, 3).
    let s3: [__m512; 2] = std::array::from_fn(|r| {
        let (a, b) = (s2[2 * r], s2[2 * r + 1]);
        let lo = _mm512_shuffle_ps::<0x44>(a, b); // per block: a0 a1 b0 b1
        let hi = _mm512_shuffle_ps::<0xEE>(a, b); // a2 a3 b2 b3
        _mm512_add_ps(lo, hi)
    });
    // h = 1: lane 4j + e holds row j + 4e's dot.
    let lo = _mm512_shuffle_ps::<0x88>(s3[0], s3[1]); // per block: a0 a2 b0 b2
    let hi = _mm512_shuffle_ps::<0xDD>(s3[0], s3[1]); // a1 a3 b1 b3
    let mixed = _mm512_add_ps(lo, hi);
    // Lane r of the result takes row r from lane 4·(r mod 4) + r / 4.
    let order = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
    let sums = _mm512_permutexvar_ps(order, mixed);
    // The tail: the last k mod 16 products of each row, a serial fused sum from 0.
    let mut tail = [0.0f32; L];
    for (r, t) in tail.iter_mut().enumerate() {
        for (c, &a) in x.iter().enumerate().skip(body) {
            // SAFETY: row r has k floats; c < k.
            *t = a.mul_add(unsafe { *row(r).add(c) }, *t);
        }
    }
    // SAFETY: `tail` is 16 floats.
    let tail = unsafe { _mm512_loadu_ps(tail.as_ptr()) };
    let dots = _mm512_add_ps(sums, tail);
    // Straight into `out` through a lane mask (a copy through a 16-float array became a
    // call to the C library's memcpy per block: ~2% of a tiny decode step's samples).
    assert!(out.len() <= L);
    // SAFETY: the mask covers `out.len()` lanes, all inside `out`.
    unsafe {
        _mm512_mask_storeu_ps(
            out.as_mut_ptr(),
            crate::simd::lanes::first16(out.len()),
            dots,
        )
    };
}

/// The row form's chunk for one row of `A` (`m = 1`, a decoded token):
/// `part[j] += Σ_r a[r]·w[r·ws + j]` over the chunk's rows in order, with the partial
/// row held in registers, up to 24 vectors (384 columns) at a time: each row's block is
/// read front to back, one load per FMA, and the partial row is loaded and stored once
/// per block rather than once per four rows. Each element gets the same fused steps in
/// the same row order as the generic `row_chunk`: the same bits.
///
/// # Safety
/// The CPU must have AVX-512 F. (Bounds are asserted.)
#[target_feature(enable = "avx512f,avx2,fma")]
pub(crate) unsafe fn row_chunk_one(part: &mut [f32], a: &[f32], w: &[f32], ws: usize) {
    let (n, rows) = (part.len(), a.len());
    assert!(rows > 0 && w.len() >= (rows - 1) * ws + n);
    let mut j0 = 0;
    // SAFETY (all calls): columns j0.. of each of the `rows` rows of `w` and of `part`
    // are in bounds (asserted), each call covering what is left of them or less.
    unsafe {
        while n - j0 >= 16 {
            j0 += match (n - j0) / 16 {
                24.. => row_block::<24>(part, a, w, ws, j0),
                16.. => row_block::<16>(part, a, w, ws, j0),
                8.. => row_block::<8>(part, a, w, ws, j0),
                4.. => row_block::<4>(part, a, w, ws, j0),
                2.. => row_block::<2>(part, a, w, ws, j0),
                _ => row_block::<1>(part, a, w, ws, j0),
            };
        }
        if j0 < n {
            let k = crate::simd::lanes::first16(n - j0);
            let p = part.as_mut_ptr().add(j0);
            let mut acc = _mm512_maskz_loadu_ps(k, p);
            for (r, &ar) in a.iter().enumerate() {
                let wv = _mm512_maskz_loadu_ps(k, w.as_ptr().add(r * ws + j0));
                acc = _mm512_fmadd_ps(_mm512_set1_ps(ar), wv, acc);
            }
            _mm512_mask_storeu_ps(p, k, acc);
        }
    }
}

/// Columns `j0..j0 + NV·16` of [`row_chunk_one`]; returns `NV·16`.
///
/// # Safety
/// As [`row_chunk_one`], with those columns in bounds.
#[inline]
#[target_feature(enable = "avx512f,avx2,fma")]
unsafe fn row_block<const NV: usize>(
    part: &mut [f32],
    a: &[f32],
    w: &[f32],
    ws: usize,
    j0: usize,
) -> usize {
    // SAFETY: columns j0..j0 + NV·16 of `part` and of each row are in bounds (the
    // caller's promise).
    unsafe {
        let p = part.as_mut_ptr().add(j0);
        let mut acc: [__m512; NV] = std::array::from_fn(|v| _mm512_loadu_ps(p.add(v * L)));
        for (r, &ar) in a.iter().enumerate() {
            let av = _mm512_set1_ps(ar);
            let wr = w.as_ptr().add(r * ws + j0);
            for (v, acc) in acc.iter_mut().enumerate() {
                *acc = _mm512_fmadd_ps(av, _mm512_loadu_ps(wr.add(v * L)), *acc);
            }
        }
        for (v, acc) in acc.iter().enumerate() {
            _mm512_storeu_ps(p.add(v * L), *acc);
        }
    }
    NV * L
}
