//! andrea's own f32 GEMM for AVX-512: `matmul_gelu_backward`'s kernel at small `k` on
//! the AVX-512 level ([`GemmKernel::for_gelu_grad`](super::GemmKernel::for_gelu_grad)).
//!
//! The layout is the AVX2 kernel's (BLIS/Goto): `B` packed per `KC x NC` block into
//! panels of 32 columns, `A` per `MC x KC` block into panels of `MR` rows, both
//! zero-padded to whole panels, and a register-blocked micro-kernel computing a 14 x 32
//! tile of `C` with 512-bit FMAs (28 accumulators and 2 `B` vectors of the 32 `zmm`
//! registers: per step of `k`, 2 aligned loads, 14 broadcasts folded into 28 FMAs, no
//! spills). `KC = 384`, `MC = 140`, `NC = 3072`; `B`'s micro-panel stays in L1 while
//! `A`'s stream from L2, and `C`'s tile is prefetched before its `k` loop. Edge tiles
//! store through lane masks; padded rows and columns are computed and dropped.
//!
//! **One packed `B` for all threads.** [`sgemm_threads`] packs each `KC x NC` block of
//! `B` once, its panels shared out among the threads, then splits the rows of `C` into
//! `MC`-sized blocks the threads take (rayon, work-stealing), each packing its own block
//! of `A`: no operand is packed twice. The caller's hooks run on each block of rows
//! while it is in cache (the bias before, `GELU'` after).
//!
//! **Results.** Each element of `C` is `Σ_k a·b` as one FMA chain per `KC` slice of `k`,
//! in `k` order, the slices added to `C` in order (the first with `beta`): the same
//! operations whatever tile, block or thread the element falls in, so the result does not
//! depend on the thread count or on the split. It differs from the other kernels' in the
//! last bits (another summation order), within the GEMM tolerance.

use std::arch::x86_64::*;
use std::cell::RefCell;

use rayon::prelude::*;

use crate::buffer::SendPtr;
use crate::views::Operand;

/// The micro-tile: `MR` rows by 16·`NV` columns of `C` (28 accumulators and 2 `B`
/// vectors of the 32 `zmm` registers).
const MR: usize = 14;
const NV: usize = 2;

/// The block sizes of one product.
#[derive(Clone, Copy, Debug)]
struct Blocking {
    /// Depth of one packed slice of `k`.
    kc: usize,
    /// Rows of `A` per packed block (rounded down to whole tiles).
    mc: usize,
    /// Columns of `B` per packed block.
    nc: usize,
}

/// The blocking (the module doc says why).
const BLOCKING: Blocking = Blocking {
    kc: 384,
    mc: 140,
    nc: 3072,
};

/// 16 floats on a 64-byte boundary: the unit pack buffers are allocated in.
#[repr(C, align(64))]
#[derive(Clone, Copy)]
struct Line([f32; 16]);

/// A growable 64-byte-aligned float buffer.
#[derive(Default)]
struct Aligned(Vec<Line>);

impl Aligned {
    /// At least `n` floats (contents unspecified), 64-byte aligned.
    fn floats(&mut self, n: usize) -> SendPtr {
        if self.0.len() * 16 < n {
            self.0.resize(n.div_ceil(16), Line([0.0; 16]));
        }
        SendPtr(self.0.as_mut_ptr().cast::<f32>())
    }
}

thread_local! {
    /// This thread's packed `B` block (shared with the helpers of [`sgemm_threads`]).
    static PACK_B: RefCell<Aligned> = RefCell::default();
    /// This thread's packed `A` block.
    static PACK_A: RefCell<Aligned> = RefCell::default();
}

/// Runs `f` on this thread's buffer in `cell` (a fresh one if it is in use further up
/// the stack, which a rayon wait could in principle cause).
fn with_buffer<R>(
    cell: &'static std::thread::LocalKey<RefCell<Aligned>>,
    f: impl FnOnce(&mut Aligned) -> R,
) -> R {
    cell.with(|c| match c.try_borrow_mut() {
        Ok(mut b) => f(&mut b),
        Err(_) => f(&mut Aligned::default()),
    })
}

/// What the caller runs around the product on each thread: `before(r0, r1)` on rows
/// `r0..r1` before any of their products (the bias), `after(r0, r1, c0, c1)` on a block
/// once it is final (the fused GELU epilogues), while it is in cache.
pub(crate) struct Hooks<'a> {
    pub before: &'a (dyn Fn(usize, usize) + Sync),
    pub after: &'a (dyn Fn(usize, usize, usize, usize) + Sync),
}

/// `C = A·B + beta·C` with `beta` 0 (C not read) or 1, `A: [m, k]`, `B: [k, n]`, any
/// strides, on this thread.
///
/// # Safety
/// As [`crate::gemm::sgemm_strided`]; and the CPU has AVX-512 F.
pub(crate) unsafe fn sgemm(
    m: usize,
    k: usize,
    n: usize,
    a: Operand,
    b: Operand,
    beta: f32,
    c: Operand,
) {
    // SAFETY: forwarded.
    unsafe { sgemm_threads(m, k, n, a, b, beta, c, 1, None) }
}

/// Whether [`sgemm_threads`] can give `threads` threads a share of `m` rows.
pub(crate) fn splits(m: usize, threads: usize) -> bool {
    m >= threads * MR * 2
}

/// [`sgemm`] on `threads` threads of the current rayon pool (1: this thread only), `B`
/// packed once per block for all of them; `hooks` run on each thread's rows.
///
/// # Safety
/// As [`sgemm`]; and the hooks are safe to run concurrently on disjoint blocks of `C`.
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn sgemm_threads(
    m: usize,
    k: usize,
    n: usize,
    a: Operand,
    b: Operand,
    beta: f32,
    c: Operand,
    threads: usize,
    hooks: Option<&Hooks<'_>>,
) {
    if m == 0 || n == 0 {
        return;
    }
    let bl = BLOCKING;
    let job = Job {
        m,
        k,
        n,
        a,
        b,
        beta,
        c,
        bl,
        threads: threads.max(1),
        hooks,
    };
    // SAFETY: forwarded; the CPU has AVX-512 F.
    unsafe { run::<MR, NV>(&job) }
}

struct Job<'a> {
    m: usize,
    k: usize,
    n: usize,
    a: Operand,
    b: Operand,
    beta: f32,
    c: Operand,
    bl: Blocking,
    threads: usize,
    hooks: Option<&'a Hooks<'a>>,
}

/// The driver for an `MR x 16·NV` tile.
#[target_feature(enable = "avx512f")]
unsafe fn run<const MR: usize, const NV: usize>(job: &Job<'_>) {
    let nr = 16 * NV;
    let Job {
        m,
        k,
        n,
        a,
        b,
        beta,
        c,
        bl,
        threads,
        hooks,
    } = *job;
    // Row blocks of whole tiles, at most `mc` rows each, their count a multiple of the
    // thread count so that an even split exists (work stealing evens out the rest).
    let tiles = m.div_ceil(MR);
    let mc_tiles = (bl.mc / MR).max(1);
    let nblocks = (threads * tiles.div_ceil(threads * mc_tiles)).min(tiles);
    let rows = |bi: usize| {
        let (t0, t1) = (bi * tiles / nblocks, (bi + 1) * tiles / nblocks);
        (t0 * MR, (t1 * MR).min(m))
    };
    if k == 0 {
        let each = |bi: usize| {
            let (r0, r1) = rows(bi);
            if let Some(h) = hooks {
                (h.before)(r0, r1);
            }
            // SAFETY: rows r0..r1 lie in C.
            unsafe { scale_c(r0, r1, n, beta, c) };
            if let Some(h) = hooks {
                (h.after)(r0, r1, 0, n);
            }
        };
        for_blocks(threads, nblocks, each);
        return;
    }
    let (kc_max, nc_max) = (bl.kc.min(k), bl.nc.min(n).div_ceil(nr) * nr);
    with_buffer(&PACK_B, |pb| {
        let pb = pb.floats(kc_max * nc_max);
        for jc in (0..n).step_by(bl.nc) {
            let nc = (n - jc).min(bl.nc);
            let panels = nc.div_ceil(nr);
            for pc in (0..k).step_by(bl.kc) {
                let kc = (k - pc).min(bl.kc);
                let beta = if pc == 0 { beta } else { 1.0 };
                let last = pc + kc == k;
                // The panels of B, shared out among the threads.
                let parts = threads.min(panels);
                for_blocks(threads, parts, |t| {
                    let (p0, p1) = (t * panels / parts, (t + 1) * panels / parts);
                    // SAFETY: the block lies inside B; the panel ranges are disjoint.
                    unsafe { pack_b::<NV>(kc, nc, b, pc, jc, p0, p1, pb) };
                });
                for_blocks(threads, nblocks, |bi| {
                    let (r0, r1) = rows(bi);
                    if let Some(h) = hooks.filter(|_| jc == 0 && pc == 0) {
                        (h.before)(r0, r1);
                    }
                    with_buffer(&PACK_A, |pa| {
                        let mc = r1 - r0;
                        let pa = pa.floats(mc.div_ceil(MR) * MR * kc);
                        // SAFETY: the block lies inside A, its pack inside `pa`, its
                        // tiles inside C (rows r0..r1 are this task's alone).
                        unsafe {
                            pack_a::<MR>(mc, kc, a, r0, pc, pa);
                            let tile = |jr: usize, ir: usize| {
                                let (w, h) = ((nc - jr * nr).min(nr), (mc - ir).min(MR));
                                let bp = pb.get().add(jr * kc * nr);
                                let ap = pa.get().add(ir * kc);
                                let ct = c.ptr.get().add((r0 + ir) * c.rs + (jc + jr * nr) * c.cs);
                                kernel::<MR, NV>(kc, ap, bp, beta, ct, c.rs, c.cs, h, w);
                            };
                            // `B`'s micro-panel stays in L1 while `A`'s stream from L2.
                            for jr in 0..panels {
                                for ir in (0..mc).step_by(MR) {
                                    tile(jr, ir);
                                }
                            }
                        }
                    });
                    if let Some(h) = hooks.filter(|_| last) {
                        (h.after)(r0, r1, jc, jc + nc);
                    }
                });
            }
        }
    });
}

/// `f(0..count)`, on this thread when `threads == 1`, else spread over the rayon pool.
fn for_blocks(threads: usize, count: usize, f: impl Fn(usize) + Sync + Send) {
    if threads == 1 || count == 1 {
        (0..count).for_each(f);
    } else {
        (0..count).into_par_iter().with_max_len(1).for_each(f);
    }
}

/// Rows `r0..r1` of `C` (`n` columns) times `beta` (the product of an empty `k`).
unsafe fn scale_c(r0: usize, r1: usize, n: usize, beta: f32, c: Operand) {
    for i in r0..r1 {
        for j in 0..n {
            // SAFETY: (i, j) lies in C.
            unsafe {
                let p = c.ptr.get().add(i * c.rs + j * c.cs);
                *p = if beta == 0.0 { 0.0 } else { *p * beta };
            }
        }
    }
}

/// Packs panels `p0..p1` of `B[pc.., jc..]` (`kc x nc`) into `out`: panel `jp` at
/// `jp·kc·NR`, `kc` rows of `NR = 16·NV` contiguous values, columns past `nc` zero.
#[inline]
#[target_feature(enable = "avx512f")]
#[allow(clippy::too_many_arguments)]
unsafe fn pack_b<const NV: usize>(
    kc: usize,
    nc: usize,
    b: Operand,
    pc: usize,
    jc: usize,
    p0: usize,
    p1: usize,
    out: SendPtr,
) {
    let nr = 16 * NV;
    let base = b.ptr.get() as *const f32;
    for jp in p0..p1 {
        let j0 = jc + jp * nr;
        let w = (nc - jp * nr).min(nr);
        // SAFETY: rows pc..pc + kc and columns j0..j0 + w lie in B; the panel lies in
        // `out` (sized for every panel of the block).
        unsafe {
            let panel = out.get().add(jp * kc * nr);
            if b.cs == 1 {
                for p in 0..kc {
                    let src = base.add((pc + p) * b.rs + j0);
                    let dst = panel.add(p * nr);
                    for v in 0..NV {
                        let lanes = w.saturating_sub(16 * v).min(16);
                        let mask = lanes_mask(lanes);
                        let x = _mm512_maskz_loadu_ps(mask, src.add(16 * v));
                        _mm512_store_ps(dst.add(16 * v), x);
                    }
                }
            } else if b.rs == 1 {
                // B transposed: each column is contiguous along k; 16 columns at a time
                // through a 16 x 16 transpose.
                for v in 0..NV {
                    let cols = w.saturating_sub(16 * v).min(16);
                    let src = base.add(pc + (j0 + 16 * v) * b.cs);
                    transpose_pack(src, b.cs, cols, kc, panel.add(16 * v), nr, 0xFFFF);
                }
            } else {
                // Strided both ways: one element at a time.
                for j in 0..nr {
                    for p in 0..kc {
                        *panel.add(p * nr + j) = if j < w {
                            *base.add((pc + p) * b.rs + (j0 + j) * b.cs)
                        } else {
                            0.0
                        };
                    }
                }
            }
        }
    }
}

/// Packs `A[i0.., pc..]` (`mc x kc`) into `out` as panels of `MR` rows, each `kc`
/// columns of `MR` contiguous values, rows past `mc` zero.
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn pack_a<const MR: usize>(
    mc: usize,
    kc: usize,
    a: Operand,
    i0: usize,
    pc: usize,
    out: SendPtr,
) {
    const { assert!(MR <= 16) };
    let base = a.ptr.get() as *const f32;
    for ip in 0..mc.div_ceil(MR) {
        let r = i0 + ip * MR;
        let h = (mc - ip * MR).min(MR);
        // SAFETY: rows r..r + h and columns pc..pc + kc lie in A; the panel lies in `out`.
        unsafe {
            let panel = out.get().add(ip * MR * kc);
            if a.rs == 1 {
                // A transposed (column-major): each column of the panel is contiguous.
                let mask = lanes_mask(h);
                for p in 0..kc {
                    let src = base.add(r + (pc + p) * a.cs);
                    let x = _mm512_maskz_loadu_ps(mask, src);
                    _mm512_mask_storeu_ps(panel.add(p * MR), lanes_mask(MR), x);
                }
                continue;
            }
            if a.cs == 1 {
                // A row-major: each row is contiguous along k; through a 16 x 16 transpose.
                transpose_pack(
                    base.add(r * a.rs + pc),
                    a.rs,
                    h,
                    kc,
                    panel,
                    MR,
                    lanes_mask(MR),
                );
                continue;
            }
            for i in 0..MR {
                for p in 0..kc {
                    *panel.add(p * MR + i) = if i < h {
                        *base.add((r + i) * a.rs + (pc + p) * a.cs)
                    } else {
                        0.0
                    };
                }
            }
        }
    }
}

/// Packs `lines` (at most 16) lines of `kc` contiguous floats, line `i` at `src + i·ld`,
/// across: `dst[p·stride + i] = line i [p]` for the lanes of `keep`, zero for `i >=
/// lines`. Blocks of 16 x 16 go through [`transpose16`].
///
/// # Safety
/// The lines lie in memory; `dst` holds `kc` rows of `stride` floats (aligned to 64
/// bytes where `keep` is full and `stride` a multiple of 16, as the `B` panels are).
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn transpose_pack(
    src: *const f32,
    ld: usize,
    lines: usize,
    kc: usize,
    dst: *mut f32,
    stride: usize,
    keep: __mmask16,
) {
    for p0 in (0..kc).step_by(16) {
        let len = (kc - p0).min(16);
        let kmask = lanes_mask(len);
        let mut r = [_mm512_setzero_ps(); 16];
        for (i, x) in r.iter_mut().enumerate().take(lines) {
            // SAFETY: line i holds kc floats; lanes past `len` are masked off.
            *x = unsafe { _mm512_maskz_loadu_ps(kmask, src.add(i * ld + p0)) };
        }
        let o = transpose16(r);
        for (q, x) in o.iter().enumerate().take(len) {
            // SAFETY: row p0 + q of `dst` holds `stride` floats, the lanes of `keep`.
            unsafe { _mm512_mask_storeu_ps(dst.add((p0 + q) * stride), keep, *x) };
        }
    }
}

/// The transpose of a 16 x 16 block held as 16 rows: `out[j][i] = r[i][j]`, in four
/// rounds of shuffles (pairs of elements, of pairs, of 128-bit lanes, of 256-bit halves).
#[inline]
#[target_feature(enable = "avx512f")]
fn transpose16(r: [__m512; 16]) -> [__m512; 16] {
    let z = _mm512_setzero_ps();
    // t[2i], t[2i+1]: rows 2i and 2i+1 interleaved (columns 4L+0,1 and 4L+2,3 of lane L).
    let mut t = [z; 16];
    for i in 0..8 {
        t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
    }
    // u[4g + q], lane L: column 4L + q of rows 4g..4g + 4.
    let mut u = [z; 16];
    for g in 0..4 {
        let (a, b, c, d) = (t[4 * g], t[4 * g + 1], t[4 * g + 2], t[4 * g + 3]);
        u[4 * g] = _mm512_shuffle_ps::<0x44>(a, c);
        u[4 * g + 1] = _mm512_shuffle_ps::<0xEE>(a, c);
        u[4 * g + 2] = _mm512_shuffle_ps::<0x44>(b, d);
        u[4 * g + 3] = _mm512_shuffle_ps::<0xEE>(b, d);
    }
    // v[8h + q]: columns q, 8 + q of rows 8h..8h + 4, then of rows 8h + 4..8h + 8;
    // v[8h + 4 + q]: the same for columns 4 + q, 12 + q.
    let mut v = [z; 16];
    for h in 0..2 {
        for q in 0..4 {
            let (a, b) = (u[8 * h + q], u[8 * h + 4 + q]);
            v[8 * h + q] = _mm512_shuffle_f32x4::<0x88>(a, b);
            v[8 * h + 4 + q] = _mm512_shuffle_f32x4::<0xDD>(a, b);
        }
    }
    let mut o = [z; 16];
    for q in 0..4 {
        o[q] = _mm512_shuffle_f32x4::<0x88>(v[q], v[8 + q]);
        o[8 + q] = _mm512_shuffle_f32x4::<0xDD>(v[q], v[8 + q]);
        o[4 + q] = _mm512_shuffle_f32x4::<0x88>(v[4 + q], v[12 + q]);
        o[12 + q] = _mm512_shuffle_f32x4::<0xDD>(v[4 + q], v[12 + q]);
    }
    o
}

/// Mask of the first `n` of 16 lanes.
#[inline(always)]
fn lanes_mask(n: usize) -> __mmask16 {
    if n >= 16 {
        0xFFFF
    } else {
        ((1u32 << n) - 1) as __mmask16
    }
}

/// The `MR x 16·NV` tile: `C[..h, ..w] = Σ_p ap[p]·bp[p] + beta·C`, `ap` the packed rows
/// (`kc x MR`), `bp` the packed columns (`kc x 16·NV`, 64-byte aligned).
#[inline]
#[target_feature(enable = "avx512f")]
#[allow(clippy::too_many_arguments)]
unsafe fn kernel<const MR: usize, const NV: usize>(
    kc: usize,
    ap: *const f32,
    bp: *const f32,
    beta: f32,
    c: *mut f32,
    rs: usize,
    cs: usize,
    h: usize,
    w: usize,
) {
    // `C`'s tile fetched into L1 before the `k` loop.
    if cs == 1 {
        for i in 0..h {
            let row = c.wrapping_add(i * rs) as *const i8;
            // A prefetch is a hint that never faults; the addresses are the first and
            // last of the tile's row i.
            _mm_prefetch::<_MM_HINT_T0>(row);
            _mm_prefetch::<_MM_HINT_T0>(row.wrapping_add(4 * (w - 1)));
        }
    }
    let mut acc = [[_mm512_setzero_ps(); NV]; MR];
    // SAFETY: the panels hold kc packed rows of MR and 16·NV floats.
    unsafe {
        let (mut a, mut b) = (ap, bp);
        for _ in 0..kc {
            let mut bv = [_mm512_setzero_ps(); NV];
            for (v, x) in bv.iter_mut().enumerate() {
                *x = _mm512_load_ps(b.add(16 * v));
            }
            for (i, row) in acc.iter_mut().enumerate() {
                let ai = _mm512_set1_ps(*a.add(i));
                for (r, &x) in row.iter_mut().zip(&bv) {
                    *r = _mm512_fmadd_ps(ai, x, *r);
                }
            }
            a = a.add(MR);
            b = b.add(16 * NV);
        }
    }
    // Every loop over `acc` runs a constant count (rows past `h` skipped inside), so
    // that the compiler unrolls them all and keeps the accumulators in registers.
    if cs == 1 {
        let mut masks = [0 as __mmask16; NV];
        for (v, mk) in masks.iter_mut().enumerate() {
            *mk = lanes_mask(w.saturating_sub(16 * v));
        }
        for (i, row) in acc.iter().enumerate() {
            if i >= h {
                break;
            }
            // SAFETY: row i of the tile holds w contiguous values in C; lanes past w are
            // masked off.
            unsafe {
                let ci = c.add(i * rs);
                for (v, (&x, &mk)) in row.iter().zip(&masks).enumerate() {
                    let mut x = x;
                    if beta != 0.0 {
                        x = _mm512_add_ps(x, _mm512_maskz_loadu_ps(mk, ci.add(16 * v)));
                    }
                    _mm512_mask_storeu_ps(ci.add(16 * v), mk, x);
                }
            }
        }
        return;
    }
    let mut t = [[0.0f32; 64]; MR];
    for (ti, row) in t.iter_mut().zip(&acc) {
        for (v, &x) in row.iter().enumerate() {
            // SAFETY: `ti` holds 64 >= 16·NV floats.
            unsafe { _mm512_storeu_ps(ti.as_mut_ptr().add(16 * v), x) };
        }
    }
    for (i, ti) in t.iter().enumerate().take(h) {
        for (j, &x) in ti.iter().enumerate().take(w) {
            // SAFETY: (i, j) lies in the tile's valid part of C.
            unsafe {
                let p = c.add(i * rs + j * cs);
                *p = if beta != 0.0 { x + *p } else { x };
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `C (+)= A·B` through [`sgemm_threads`] on 1 and 2 threads against a float64
    /// product, on shapes the conformance suite does not reach: `k` across two and a
    /// half `KC` slices, `m` and `n` ending in ragged tiles (masked edges), `n` past one
    /// `NC` block, each operand row-major or transposed, `beta` 0 and 1; the two thread
    /// counts bit-identical.
    #[test]
    fn matches_the_f64_product_across_k_slices_nc_blocks_and_ragged_tiles() {
        if !crate::simd::has_avx512() {
            eprintln!("SKIPPED: no AVX-512 (or ANDREA_SIMD caps it)");
            return;
        }
        let (kc, nc, mr) = (BLOCKING.kc, BLOCKING.nc, MR);
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(2)
            .build()
            .unwrap();
        let pool = &pool;
        let on = |threads| {
            move |m, k, n, a, b, beta, c| {
                // SAFETY: the helper passes operands holding their whole matrices, C apart.
                pool.install(|| unsafe { sgemm_threads(m, k, n, a, b, beta, c, threads, None) })
            }
        };
        let (one, two) = (on(1), on(2));
        crate::gemm::check_against_f64(
            "avx512 sgemm",
            &[
                (2 * mr + 5, 2 * kc + kc / 2 + 3, 37),
                (3 * mr + 1, 5, nc + 21),
                (1, kc, 1),
            ],
            &[&one, &two],
        );
    }

    #[test]
    fn transpose16_transposes() {
        if !crate::simd::has_avx512() {
            return;
        }
        let m: Vec<f32> = (0..256).map(|x| x as f32).collect();
        let mut out = [0.0f32; 256];
        // SAFETY: 16 lines of 16 floats in, 16 rows of 16 out; the CPU has AVX-512.
        unsafe { transpose_pack(m.as_ptr(), 16, 16, 16, out.as_mut_ptr(), 16, 0xFFFF) };
        for (e, &x) in out.iter().enumerate() {
            assert_eq!(x, ((e % 16) * 16 + e / 16) as f32, "element {e}");
        }
    }
}
