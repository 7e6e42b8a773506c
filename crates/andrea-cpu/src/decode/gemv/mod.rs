//! Products with a handful of rows, `C[m, n] = A[m, k]·B[k, n]` for `m <= MAX_ROWS`:
//! generation, where each step multiplies one token per sequence by every weight matrix.
//!
//! Such a product reads each weight once and does two flops per weight it reads, so it is
//! bound by memory bandwidth, and what matters is streaming `B` from memory in long
//! contiguous runs on every core. A GEMM kernel packs `B` into panels first (one more
//! pass over it) and cuts it into column bands (short runs, one per row). Here:
//!
//! * **Row form** (`B`'s rows contiguous, the `[k, n]` layout of transformers' `Conv1D`
//!   weights): `B` is cut into chunks of [`CHUNK_K`] whole rows, one contiguous block of
//!   memory each. A task walks its chunk four rows at a time,
//!   `p += a0·b0 + a1·b1 + a2·b2 + a3·b3`, into a partial row `p[m, n]` of its own; the
//!   partials are then added in chunk order. For one row of `A` (batch-1 decoding) and
//!   rows of at most [`ROW_REGISTERS_MAX_N`] floats, the partial row stays in registers
//!   instead while the chunk's rows stream past, up to 384 columns at a time with
//!   AVX-512 (`avx512::row_chunk_one`), 96 with AVX2 (`avx2::row_chunk_one`) or NEON
//!   (`row_registers`); same bits.
//! * **Column form** (`B = Wᵀ` with `W`'s rows contiguous: the tied output projection
//!   `x·wteᵀ`): `C[i, j]` is the dot product of `A`'s row `i` with row `j` of `W`; tasks
//!   take bands of [`BAND_N`] rows of `W`, again one contiguous block each, sixteen
//!   rows at a time with AVX-512 (`avx512`), four with AVX2 or NEON (`avx2`, `neon`);
//!   same bits.
//!
//! **The bound.** A tiny-model token (configs/tiny.toml) reads 7.47 MB of weights: 4
//! layers × (128·384 + 128·128 + 128·512 + 512·128) floats = 3.15 MB, plus the tied
//! output layer's 8449 × 128 floats = 4.33 MB. That is more than two 1 MB L2 caches, so
//! every token streams them from L3, and the L3 read stream (`peaks --read-mb 8`) bounds
//! the token's products; ANDREA-120M's 366 MB come from DRAM, whose read stream bounds
//! them. The rest of a token's time is attention, the small ops and the handoffs between
//! threads (the spinning team's, `team`).
//!
//! Chunks and bands are fixed by the sizes and every sum runs in a fixed order, so, like
//! the GEMM, the result does not depend on the thread count. It may differ from the GEMM
//! path's in the last bits (another summation order): prefill and decode agree to f32
//! rounding, as the KV-cache tests check.

#[cfg(target_arch = "x86_64")]
pub(crate) mod avx2;
#[cfg(target_arch = "x86_64")]
pub(crate) mod avx512;
pub(crate) mod band;
pub(crate) mod bf16;
#[cfg(target_arch = "x86_64")]
pub(crate) mod bf16_avx2;
#[cfg(target_arch = "aarch64")]
pub(crate) mod neon;
#[cfg(target_arch = "aarch64")]
pub(crate) mod row_registers;

use std::cell::Cell;

use crate::buffer::SendPtr;
use crate::simd::{multiversion, MulAdd};
use band::Band;

/// The most rows of `A` (sequences decoded together) this path takes.
pub(crate) const MAX_ROWS: usize = 8;
/// Rows of `B` per task in the row form.
pub(crate) const CHUNK_K: usize = 64;
/// Columns per block of the row form's inner loop: each block reads four whole cache
/// lines of each of the four rows of `B` it combines, a fixed-length loop the compiler
/// unrolls, which keeps more loads in flight than one loop over the row (the same
/// operations, the same bits).
const ROW_BLOCK: usize = 64;
/// The widest product whose row-form chunks take `avx512::row_chunk_one`,
/// `avx2::row_chunk_one` or `row_registers` (the partial row in registers) at batch 1:
/// a chunk of 64 rows of at most 512 floats is at most 128 KB, so the passes over its
/// column blocks after the first read it from L2. That pays on the tiny model's products (n = 128 to 512,
/// weights in L3); ANDREA-120M's (n >= 768, from DRAM) gain nothing, so they keep the
/// four-rows-per-pass loop.
#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
const ROW_REGISTERS_MAX_N: usize = 512;
/// Columns of `C` (rows of `W`) per task in the column form.
pub(crate) const BAND_N: usize = 32;
/// Products reading fewer weights than this run on the calling thread; larger ones are
/// shared out through the spinning team (`team` module), whose cheap handoff takes even
/// the tiny model's QKV (49k weights) to two threads.
const MIN_PARALLEL: usize = 1 << 14;

/// One validated product with few rows. Pointers are to element (0, 0); `c` has unit
/// column stride; `b` has a unit column stride (row form) or a unit row stride (column
/// form).
pub(crate) struct Gemv<'a> {
    pub m: usize,
    pub k: usize,
    pub n: usize,
    pub a: SendPtr,
    pub a_rs: usize,
    pub a_cs: usize,
    pub b: SendPtr,
    pub b_rs: usize,
    pub b_cs: usize,
    pub c: SendPtr,
    pub c_rs: usize,
    pub bias: Option<&'a [f32]>,
    pub accumulate: bool,
    /// If set, also `out = GELU(C)` (contiguous `[m, n]`).
    pub gelu_out: Option<SendPtr>,
    /// If set, `C ⊙= GELU'(pre)` (contiguous `[m, n]`).
    pub gelu_grad_of: Option<SendPtr>,
    /// BF16 precision (`bf16` module): `A` rounded to BF16, and `B` read from
    /// `b_copy`, a BF16 copy from `B`'s first element on in `B`'s layout, or else rounded
    /// as it is read.
    pub bf16: bool,
    pub b_copy: Option<&'a [andrea_core::bf16]>,
}

thread_local! {
    /// Gathered rows of `A` and the row form's partials, reused across calls so a
    /// decoding step allocates nothing.
    static SCRATCH: Cell<Vec<f32>> = const { Cell::new(Vec::new()) };
}

impl Gemv<'_> {
    /// Whether this path takes a product of these sizes and strides.
    pub(crate) fn applies(m: usize, n: usize, b_rs: usize, b_cs: usize, c_cs: usize) -> bool {
        m <= MAX_ROWS && c_cs == 1 && (b_cs == 1 || b_rs == 1) && n > 0
    }

    /// Runs the product on the current rayon pool.
    ///
    /// # Safety
    /// The operands must have passed `check::matmul` (in bounds, `c` disjoint from the
    /// rest) and `gelu_out`, if any, must point at `m·n` floats disjoint from them.
    pub(crate) unsafe fn run(&self) {
        let (m, k, n) = (self.m, self.k, self.n);
        let row_form = self.b_cs == 1;
        let partials = if row_form {
            k.div_ceil(CHUNK_K) * m * n
        } else {
            0
        };
        let mut scratch = SCRATCH.take();
        scratch.clear();
        scratch.resize(m * k + partials, 0.0);
        let (x, p) = scratch.split_at_mut(m * k);
        for i in 0..m {
            for (kk, xv) in x[i * k..(i + 1) * k].iter_mut().enumerate() {
                // SAFETY: A is `[m, k]` in bounds (checked).
                *xv = unsafe { *self.a.get().add(i * self.a_rs + kk * self.a_cs) };
            }
        }
        if self.bf16 {
            for xv in x.iter_mut() {
                *xv = bf16::Operand::operand(*xv);
            }
        }
        let x = &*x;
        if row_form {
            let chunk = |(ci, part): (usize, &mut [f32])| {
                let k0 = ci * CHUNK_K;
                let rows = CHUNK_K.min(k - k0);
                // SAFETY: rows k0..k0+rows of B, each n long at stride b_rs, are in
                // bounds (checked); B is only read.
                let w = unsafe {
                    std::slice::from_raw_parts(
                        self.b.get().add(k0 * self.b_rs),
                        (rows - 1) * self.b_rs + n,
                    )
                };
                if self.bf16 {
                    let w = self.weights_bf16(w, k0 * self.b_rs);
                    return bf16::row_chunk_any(part, x, k, k0, rows, w, self.b_rs, m, n);
                }
                #[cfg(target_arch = "x86_64")]
                if m == 1 && n <= ROW_REGISTERS_MAX_N && crate::simd::has_avx512() {
                    // SAFETY: the CPU has AVX-512 F.
                    return unsafe {
                        crate::decode::gemv::avx512::row_chunk_one(
                            part,
                            &x[k0..k0 + rows],
                            w,
                            self.b_rs,
                        )
                    };
                }
                #[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
                if let Some(kernel) = row_registers().filter(|_| m == 1 && n <= ROW_REGISTERS_MAX_N)
                {
                    // SAFETY: the level has the kernel's instruction set.
                    return unsafe { kernel(part, &x[k0..k0 + rows], w, self.b_rs) };
                }
                row_chunk(part, x, k, k0, rows, w, self.b_rs, m, n);
            };
            if k * n >= MIN_PARALLEL {
                let pp = SendPtr(p.as_mut_ptr());
                crate::team::for_each(k.div_ceil(CHUNK_K), &|ci| {
                    // SAFETY: chunk ci's partial row, `m·n` floats of `p`, disjoint from
                    // the other chunks'.
                    let part =
                        unsafe { std::slice::from_raw_parts_mut(pp.get().add(ci * m * n), m * n) };
                    chunk((ci, part));
                });
            } else {
                p.chunks_mut(m * n).enumerate().for_each(chunk);
            }
            let (first, rest) = p.split_at_mut(m * n);
            for part in rest.chunks_exact(m * n) {
                crate::elementwise::add_assign(first, part);
            }
            for i in 0..m {
                // SAFETY: row i of C, n long, in bounds and exclusive to this op.
                let c = unsafe { std::slice::from_raw_parts_mut(self.c_row(i), n) };
                self.finish(c, &first[i * n..(i + 1) * n], i, 0);
            }
        } else {
            let bands = n.div_ceil(BAND_N);
            let run_band = |band: usize| {
                let j0 = band * BAND_N;
                let cols = BAND_N.min(n - j0);
                // SAFETY: rows j0..j0+cols of W (B's columns), each k long at stride b_cs.
                let w = unsafe {
                    std::slice::from_raw_parts(
                        self.b.get().add(j0 * self.b_cs),
                        (cols - 1) * self.b_cs + k,
                    )
                };
                if self.bf16 {
                    let w = self.weights_bf16(w, j0 * self.b_cs);
                    let mut dots = [0.0f32; BAND_N * MAX_ROWS];
                    bf16::column_band_any(&mut dots, x, w, self.b_cs, m, k, cols);
                    for i in 0..m {
                        // SAFETY: columns j0..j0+cols of row i of C; bands are disjoint.
                        let c =
                            unsafe { std::slice::from_raw_parts_mut(self.c_row(i).add(j0), cols) };
                        self.finish(c, &dots[i * cols..(i + 1) * cols], i, j0);
                    }
                    return;
                }
                let band = Band {
                    x,
                    w,
                    ws: self.b_cs,
                    m,
                    k,
                    cols,
                };
                if m == 1 && self.plain() {
                    // The bare product of one row (the output layer's logits): straight
                    // into C, without the band's scratch and the copy out of it.
                    // SAFETY: columns j0..j0+cols of row 0 of C; bands are disjoint.
                    let c = unsafe { std::slice::from_raw_parts_mut(self.c_row(0).add(j0), cols) };
                    return column_band_any(c, band);
                }
                let mut dots = [0.0f32; BAND_N * MAX_ROWS];
                column_band_any(&mut dots, band);
                for i in 0..m {
                    // SAFETY: columns j0..j0+cols of row i of C; bands are disjoint.
                    let c = unsafe { std::slice::from_raw_parts_mut(self.c_row(i).add(j0), cols) };
                    self.finish(c, &dots[i * cols..(i + 1) * cols], i, j0);
                }
            };
            if k * n >= MIN_PARALLEL {
                crate::team::for_each(bands, &run_band);
            } else {
                (0..bands).for_each(run_band);
            }
        }
        SCRATCH.set(scratch);
    }

    /// `w`, the FP32 weights from `B`'s element `at` on, as BF16 precision reads them:
    /// from the copy at the same element where there is one.
    fn weights_bf16<'w>(&'w self, w: &'w [f32], at: usize) -> bf16::Weights<'w> {
        match self.b_copy {
            Some(copy) => bf16::Weights::Copy(&copy[at..][..w.len()]),
            None => bf16::Weights::Round(w),
        }
    }

    fn c_row(&self, i: usize) -> *mut f32 {
        // SAFETY: row i of the checked C.
        unsafe { self.c.get().add(i * self.c_rs) }
    }

    /// `c = (c if accumulating) + bias + product`, then the GELU epilogue, for columns
    /// `j0..j0 + c.len()` of row `i`.
    /// Whether `C` is the bare product: no accumulation, bias or GELU epilogue.
    fn plain(&self) -> bool {
        !self.accumulate
            && self.bias.is_none()
            && self.gelu_out.is_none()
            && self.gelu_grad_of.is_none()
    }

    fn finish(&self, c: &mut [f32], product: &[f32], i: usize, j0: usize) {
        for (j, (cv, &pv)) in c.iter_mut().zip(product).enumerate() {
            let mut base = if self.accumulate { *cv } else { 0.0 };
            if let Some(bias) = self.bias {
                base += bias[j0 + j];
            }
            *cv = if self.accumulate || self.bias.is_some() {
                base + pv
            } else {
                pv
            };
        }
        if let Some(out) = self.gelu_out {
            // SAFETY: `out` mirrors C's contiguous layout (checked by linear_gelu) and is
            // disjoint from every operand; each call owns its columns.
            let dst = unsafe {
                std::slice::from_raw_parts_mut(out.get().add(i * self.c_rs + j0), c.len())
            };
            crate::elementwise::gelu_slice(Some(c), dst);
        }
        if let Some(pre) = self.gelu_grad_of {
            // SAFETY: `pre` mirrors C's contiguous layout (checked by
            // matmul_gelu_backward) and is disjoint from `c`.
            let x =
                unsafe { std::slice::from_raw_parts(pre.get().add(i * self.c_rs + j0), c.len()) };
            crate::elementwise::gelu_backward_slice(x, None, c);
        }
    }
}

/// A register kernel of the row form's chunk at batch 1, unsafe for its instruction set.
#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
type RowChunkOne = unsafe fn(&mut [f32], &[f32], &[f32], usize);

/// The register kernel a batch-1 row-form chunk takes after AVX-512's
/// (`avx2::row_chunk_one`, `row_registers`):
/// with AVX2 and FMA, or NEON, on a pool of two threads or more; on one thread the
/// generic chunk's four rows per pass are faster (measured on x86). Both give the same
/// bits.
#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
fn row_registers() -> Option<RowChunkOne> {
    if rayon::current_num_threads() < 2 {
        return None;
    }
    #[cfg(target_arch = "x86_64")]
    let kernel = crate::simd::has_avx2_fma().then_some(avx2::row_chunk_one as RowChunkOne);
    #[cfg(target_arch = "aarch64")]
    let kernel =
        crate::simd::has_neon().then_some(row_registers::row_chunk_one_neon as RowChunkOne);
    kernel
}

/// `part[j] += Σ_r a[r]·w[r·ws + j]` over the rows of `w` in order (one row of `A`
/// against `a.len()` rows of `part.len()` columns): a chunk of the row form at batch 1,
/// in registers with AVX-512, AVX2 or NEON (`avx512::row_chunk_one`,
/// `avx2::row_chunk_one`, `row_registers`), otherwise [`row_chunk`]: the same bits.
pub(crate) fn row_product(part: &mut [f32], a: &[f32], w: &[f32], ws: usize) {
    if a.is_empty() || part.is_empty() {
        return;
    }
    assert!(w.len() >= (a.len() - 1) * ws + part.len());
    #[cfg(target_arch = "x86_64")]
    if crate::simd::has_avx512() {
        // SAFETY: the CPU has AVX-512 F.
        return unsafe { crate::decode::gemv::avx512::row_chunk_one(part, a, w, ws) };
    }
    #[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
    if let Some(kernel) = row_registers() {
        // SAFETY: the level has the kernel's instruction set.
        return unsafe { kernel(part, a, w, ws) };
    }
    let (rows, n) = (a.len(), part.len());
    row_chunk(part, a, rows, 0, rows, w, ws, 1, n);
}

multiversion! {
    avx512;
    /// `part[i] = Σ_{r < rows} x[i, k0 + r] · w[r]` for each of the `m` rows, `w[r]` the
    /// `r`-th row (at stride `ws`) of the chunk, four rows of `w` per pass.
    #[allow(clippy::too_many_arguments)]
    fn row_chunk(
        part: &mut [f32],
        x: &[f32],
        k: usize,
        k0: usize,
        rows: usize,
        w: &[f32],
        ws: usize,
        m: usize,
        n: usize,
    ) {
        /// `p[j] += a[0]·w[0][j0 + j] + ... + a[3]·w[3][j0 + j]` (four fused steps, in
        /// that order) for `j < p.len()`.
        #[inline(always)]
        fn step<M: MulAdd>(p: &mut [f32], w: [&[f32]; 4], a: [f32; 4], j0: usize) {
            let len = p.len();
            let (x0, x1) = (&w[0][j0..][..len], &w[1][j0..][..len]);
            let (x2, x3) = (&w[2][j0..][..len], &w[3][j0..][..len]);
            for j in 0..len {
                let mut s = p[j];
                s = M::mul_add(a[0], x0[j], s);
                s = M::mul_add(a[1], x1[j], s);
                s = M::mul_add(a[2], x2[j], s);
                s = M::mul_add(a[3], x3[j], s);
                p[j] = s;
            }
        }
        let mut r = 0;
        while r + 4 <= rows {
            let w0 = &w[r * ws..][..n];
            let w1 = &w[(r + 1) * ws..][..n];
            let w2 = &w[(r + 2) * ws..][..n];
            let w3 = &w[(r + 3) * ws..][..n];
            for i in 0..m {
                let a = &x[i * k + k0 + r..][..4];
                let (a0, a1, a2, a3) = (a[0], a[1], a[2], a[3]);
                let p = &mut part[i * n..][..n];
                let (w4, a4) = ([w0, w1, w2, w3], [a0, a1, a2, a3]);
                // Blocks of ROW_BLOCK columns, then the rest.
                let mut blocks = p.chunks_exact_mut(ROW_BLOCK);
                for (b, pb) in (&mut blocks).enumerate() {
                    step::<M>(pb, w4, a4, b * ROW_BLOCK);
                }
                let done = n - n % ROW_BLOCK;
                step::<M>(blocks.into_remainder(), w4, a4, done);
            }
            r += 4;
        }
        while r < rows {
            let w0 = &w[r * ws..][..n];
            for i in 0..m {
                let a0 = x[i * k + k0 + r];
                let p = &mut part[i * n..][..n];
                for j in 0..n {
                    p[j] = M::mul_add(a0, w0[j], p[j]);
                }
            }
            r += 1;
        }
    }
}

/// [`column_band`], sixteen rows of `W` at a time with AVX-512 where the CPU has it
/// (`avx512` module), four at a time with AVX2 (`avx2`) or NEON (`neon`): the same bits.
fn column_band_any(dots: &mut [f32], band: Band<'_>) {
    #[cfg(target_arch = "x86_64")]
    if crate::simd::has_avx512() {
        // SAFETY: the CPU has AVX-512 F.
        return unsafe { crate::decode::gemv::avx512::column_band(dots, band) };
    }
    #[cfg(target_arch = "x86_64")]
    if crate::simd::has_avx2_fma() {
        // SAFETY: the CPU has AVX2 and FMA.
        return unsafe { crate::decode::gemv::avx2::column_band(dots, band) };
    }
    #[cfg(target_arch = "aarch64")]
    if crate::simd::has_neon() {
        // SAFETY: the level has NEON.
        return unsafe { crate::decode::gemv::neon::column_band(dots, band) };
    }
    column_band(dots, band)
}

multiversion! {
    /// `dots[i·cols + j] = x[i, :] · w[j]` for the `cols` rows `w[j]` of a band.
    fn column_band(dots: &mut [f32], band: Band<'_>) {
        let Band { x, w, ws, m, k, cols } = band;
        for j in 0..cols {
            let wj = &w[j * ws..][..k];
            for i in 0..m {
                dots[i * cols + j] = dot::<M>(&x[i * k..][..k], wj);
            }
        }
    }
}

/// `x · w` with 16 running sums (two AVX2 vectors, so loads are not waiting on one FMA
/// chain), summed in a fixed tree at the end.
#[inline(always)]
pub(crate) fn dot<M: MulAdd>(x: &[f32], w: &[f32]) -> f32 {
    dot_with::<M, f32>(x, w, |v| v)
}

/// [`dot`] of `x` with weights of another element type, each taken as `load(w)`
/// (BF16 precision's widened weights, `bf16` module).
#[inline(always)]
pub(crate) fn dot_with<M: MulAdd, E: Copy>(x: &[f32], w: &[E], load: impl Fn(E) -> f32) -> f32 {
    const L: usize = 16;
    let mut acc = [0.0f32; L];
    let (xc, wc) = (x.chunks_exact(L), w.chunks_exact(L));
    let (xt, wt) = (xc.remainder(), wc.remainder());
    for (xs, ws) in xc.zip(wc) {
        for l in 0..L {
            acc[l] = M::mul_add(xs[l], load(ws[l]), acc[l]);
        }
    }
    let mut tail = 0.0;
    for (&a, &b) in xt.iter().zip(wt) {
        tail = M::mul_add(a, load(b), tail);
    }
    let mut half = L / 2;
    while half > 0 {
        for l in 0..half {
            acc[l] += acc[l + half];
        }
        half /= 2;
    }
    acc[0] + tail
}

#[cfg(test)]
mod tests {
    use super::*;

    fn values(n: usize, seed: u64) -> Vec<f32> {
        andrea_testkit::random::Rand::new(seed).vec(n, -1.0, 1.0)
    }

    /// The row form for one row of `A` with the partial row in registers, AVX-512, AVX2
    /// and NEON (whichever this CPU and `ANDREA_SIMD` allow), gives the bits of the
    /// generic chunk (four rows per pass), at widths that take every block size of each
    /// and their tails, and chunks of one, three and 64 rows.
    #[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
    #[test]
    fn row_chunk_one_has_the_bits_of_the_generic_chunk() {
        let mut kernels: Vec<(&str, RowChunkOne)> = Vec::new();
        #[cfg(target_arch = "x86_64")]
        if crate::simd::has_avx512() {
            kernels.push(("avx512", crate::decode::gemv::avx512::row_chunk_one));
        }
        #[cfg(target_arch = "x86_64")]
        if crate::simd::has_avx2_fma() {
            kernels.push(("avx2", avx2::row_chunk_one));
        }
        #[cfg(target_arch = "aarch64")]
        if crate::simd::has_neon() {
            kernels.push(("neon", row_registers::row_chunk_one_neon));
        }
        if kernels.is_empty() {
            // The generic chunk then runs unfused (two roundings): no bits to match.
            eprintln!("SKIPPED: no AVX2 + FMA or NEON at this level (ANDREA_SIMD=baseline?)");
        }
        for (name, kernel) in kernels {
            for &n in &[
                1, 7, 8, 9, 15, 16, 17, 24, 40, 95, 96, 97, 128, 200, 384, 400, 512, 769,
            ] {
                for &rows in &[1, 3, 64] {
                    let (k, k0, ws) = (rows + 5, 5, n + 3);
                    let x = values(k, 7);
                    let w = values((rows - 1) * ws + n, 8);
                    let start = values(n, 9);
                    let mut want = start.clone();
                    row_chunk(&mut want, &x, k, k0, rows, &w, ws, 1, n);
                    let mut got = start.clone();
                    // SAFETY: the CPU has the kernel's instructions (checked above).
                    unsafe { kernel(&mut got, &x[k0..k0 + rows], &w, ws) };
                    for j in 0..n {
                        assert_eq!(
                            got[j].to_bits(),
                            want[j].to_bits(),
                            "{name}: n {n} rows {rows}: part[{j}] = {}, want {}",
                            got[j],
                            want[j]
                        );
                    }
                }
            }
        }
    }

    /// The AVX-512 column form gives the bits of the generic dot product, at lengths
    /// with and without a tail and bands with a short last block of rows.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn avx512_column_band_has_the_bits_of_the_generic_dot() {
        if !crate::simd::has_avx512() {
            return;
        }
        for &(m, k, cols, ws) in &[
            (1, 128, 32, 128),
            (1, 5, 3, 7),
            (2, 131, 17, 140),
            (3, 16, 1, 16),
            (8, 768, 32, 768),
            (1, 47, 40, 50),
            (2, 64, 16, 64),
            (1, 112, 33, 120),
            (1, 144, 16, 144),
        ] {
            let x = values(m * k, 5);
            let w = values((cols - 1) * ws + k, 6);
            let mut got = vec![f32::NAN; m * cols];
            // SAFETY: the CPU has AVX-512 F (checked above).
            let band = Band {
                x: &x,
                w: &w,
                ws,
                m,
                k,
                cols,
            };
            unsafe { crate::decode::gemv::avx512::column_band(&mut got, band) };
            for i in 0..m {
                for j in 0..cols {
                    let want = dot::<crate::simd::Fused>(&x[i * k..][..k], &w[j * ws..][..k]);
                    assert_eq!(
                        got[i * cols + j].to_bits(),
                        want.to_bits(),
                        "m {m} k {k} cols {cols}: dots[{i}, {j}] = {}, want {want}",
                        got[i * cols + j]
                    );
                }
            }
        }
    }

    /// Both forms, with and without bias, accumulation and the GELU epilogue, at sizes
    /// that run on one thread and on several, against an f64 sum.
    #[test]
    fn matches_an_f64_reference_in_both_forms() {
        for &(m, k, n) in &[
            (1, 5, 3),
            (3, 67, 129),
            (1, 256, 300),
            (8, 300, 257),
            (2, 130, 700),
            // One row, bare, in the column form (straight into C), on the parallel path.
            (1, 130, 1061),
        ] {
            for column_form in [false, true] {
                for (bias_on, acc, gelu_on) in [
                    (false, false, false),
                    (true, true, false),
                    (true, false, true),
                ] {
                    let a = values(m * k, 1);
                    let w = values(k * n, 2); // row form: [k, n]; column form: Wᵀ = [n, k]
                    let bias = values(n, 3);
                    let mut c = values(m * n, 4);
                    let c0 = c.clone();
                    let mut out = vec![0.0f32; m * n];
                    let (b_rs, b_cs) = if column_form { (1, k) } else { (n, 1) };
                    let g = Gemv {
                        m,
                        k,
                        n,
                        a: SendPtr(a.as_ptr() as *mut f32),
                        a_rs: k,
                        a_cs: 1,
                        b: SendPtr(w.as_ptr() as *mut f32),
                        b_rs,
                        b_cs,
                        c: SendPtr(c.as_mut_ptr()),
                        c_rs: n,
                        bias: bias_on.then_some(&bias[..]),
                        accumulate: acc,
                        gelu_out: gelu_on.then_some(SendPtr(out.as_mut_ptr())),
                        gelu_grad_of: None,
                        bf16: false,
                        b_copy: None,
                    };
                    // SAFETY: every operand is a live Vec of the sizes given.
                    unsafe { g.run() };
                    for i in 0..m {
                        for j in 0..n {
                            let mut want: f64 = (0..k)
                                .map(|kk| a[i * k + kk] as f64 * w[kk * b_rs + j * b_cs] as f64)
                                .sum();
                            if bias_on {
                                want += bias[j] as f64;
                            }
                            if acc {
                                want += c0[i * n + j] as f64;
                            }
                            // k rounded multiply-adds of terms below 1, then two adds.
                            let tol = 1e-6 * (k as f64).sqrt() + 1e-6 * want.abs();
                            let got = c[i * n + j] as f64;
                            assert!(
                                (got - want).abs() <= tol,
                                "{m}x{k}x{n} column_form={column_form}: c[{i},{j}] = {got}, want {want}"
                            );
                            if gelu_on {
                                let x = got;
                                let t = (0.797_884_560_8 * (x + 0.044715 * x * x * x)).tanh();
                                let gw = 0.5 * x * (1.0 + t);
                                assert!(
                                    (out[i * n + j] as f64 - gw).abs() <= 1e-5 + 1e-5 * gw.abs()
                                );
                            }
                        }
                    }
                }
            }
        }
    }
}
