//! The per-head matrix products of the blocked attention path (`attention` module; the
//! fused kernel, `attention_fused`, has its own), sized for
//! small heads: `S = q·kᵀ` and `dP = dO·vᵀ` (`[64, kend]`, inner dimension the head size
//! `D`, 32 in the tiny model), `out = P·v` and `dq = dS·k` (`[64, D]`, inner `kend`), and
//! `dv += Pᵀ·dO`, `dk += dSᵀ·q` (`[kend, D]`, inner 64).
//!
//! `sgemm_strided` (the crate's general product) packs both operands into panels on
//! every call and blocks for products thousands wide; each of these is at most
//! `64 × 256 × 64` and is called 7 times per query block and head. Here only `B` is
//! packed, into zero-padded rows of whole register tiles (`[k, n']`, `n'` a multiple of
//! `NR`, a few KB), and `A` is read where it lies, one broadcast per row and step: an
//! `MR × NR` tile of `C` stays in registers over the whole inner dimension, then is
//! written (or added) once. `MR × NR` is 8 × 32 with AVX-512 (16 of its 32 vector
//! registers hold the tile), 6 × 16 with AVX2 (12 of 16, two more for the row of `B`
//! and one for the broadcast), from one generic body that the compiler vectorises; both
//! keep at least 8 independent chains of FMAs, what two pipes of latency 4 need. The
//! benches compare it with `sgemm` (`attention/cpu-*` in `benches/benches/ops.rs`;
//! `ANDREA_ATTENTION_PRODUCTS` below chooses).
//!
//! Every element of `C` is `Σ_k a·b` added in `k` order by fused multiply-adds (plain
//! multiplies and adds in the baseline copy), then `+ C` when accumulating: the order
//! depends on the sizes alone, so the bits do not depend on the thread count, and the
//! AVX2 and AVX-512 copies agree.
//!
//! Expected time (an estimate): the tiny model's attention at `B 8, T 256, 4 heads of
//! 32` does `7 × 2 × 8·4 × 32 × Σ_blocks 64·kend` ≈ 0.9 GFLOP per layer forward and
//! backward together, about 8 ms at this machine's 115 GFLOP/s 256-bit FMA peak (2
//! vCPUs) if the tiles ran at peak. Measured (tiny step, `andrea bench train`, loaded
//! machine): not faster than the `gemm` crate's AVX-512 kernel or andrea's AVX2 one
//! behind `sgemm_strided`, so `Sgemm` stays the default. The tiles are what the
//! compiler makes of the generic body; intrinsics and the packing of `A` are what is
//! left to try.

use std::cell::RefCell;

use crate::gemm::{sgemm_strided, GemmKernel, Operand};
use crate::simd::{self, multiversion, MulAdd};

/// Which kernel the attention's per-head products run on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AttentionProducts {
    /// This module's register-tiled kernel. Not the default: on the tiny model's step
    /// it was not faster than `Sgemm` (measured, benches/README.md "Memory-bound ops and
    /// attention, issue 17 second session"); kept selectable to compare on other CPUs.
    Small,
    /// The crate's general `sgemm_strided` with the backend's [`GemmKernel`] (the
    /// default where the CPU lacks AVX2).
    Sgemm,
    /// Not a kernel for the blocked path's products but a whole fused attention
    /// (`attention_fused`): every operand packed once per head, six queries at a time,
    /// in tiles of 32 columns on AVX-512 (head sizes a multiple of 32) or of 16 with
    /// AVX2 and FMA. The default where the CPU has AVX2 and FMA; where it lacks them, or
    /// the head size is not a multiple of 16, attention runs the blocked path with
    /// `Sgemm` instead.
    Fused,
    /// [`Self::Fused`] with its 16-column AVX2 tile even where the CPU has AVX-512
    /// (`fused-avx2`), to compare the two tiles on one machine; they give the same bits.
    FusedAvx2,
}

impl AttentionProducts {
    /// `ANDREA_ATTENTION_PRODUCTS` (`small`, `sgemm`, `fused` or `fused-avx2`) if set, else
    /// [`Self::default_for_cpu`]. An unknown value is reported on stderr and ignored.
    pub fn from_env() -> Self {
        static CHOICE: std::sync::OnceLock<AttentionProducts> = std::sync::OnceLock::new();
        *CHOICE.get_or_init(|| {
            let fallback = Self::default_for_cpu();
            let Ok(want) = std::env::var("ANDREA_ATTENTION_PRODUCTS") else {
                return fallback;
            };
            match want.trim().to_ascii_lowercase().as_str() {
                "small" => AttentionProducts::Small,
                "sgemm" => AttentionProducts::Sgemm,
                "fused" => AttentionProducts::Fused,
                "fused-avx2" => AttentionProducts::FusedAvx2,
                _ => {
                    eprintln!(
                        "andrea-cpu: ignoring ANDREA_ATTENTION_PRODUCTS={want:?} (expected \
                         small, sgemm, fused or fused-avx2); using {}",
                        fallback.name()
                    );
                    fallback
                }
            }
        })
    }

    /// [`Self::Fused`] where the kernels may use AVX2 + FMA, with its 32-column tile
    /// where they may use AVX-512: measured faster than the blocked path on both (the
    /// AVX2-only Zen 3 and the AVX-512 Zen 5, benches/README.md); [`Self::Sgemm`] on CPUs
    /// without AVX2.
    pub fn default_for_cpu() -> Self {
        if simd::has_avx2_fma() {
            AttentionProducts::Fused
        } else {
            AttentionProducts::Sgemm
        }
    }

    /// The name as `ANDREA_ATTENTION_PRODUCTS` spells it.
    pub fn name(self) -> &'static str {
        match self {
            AttentionProducts::Small => "small",
            AttentionProducts::Sgemm => "sgemm",
            AttentionProducts::Fused => "fused",
            AttentionProducts::FusedAvx2 => "fused-avx2",
        }
    }

    /// The fused kernel's tile for heads of `head_dim` on this CPU, or `None` where
    /// attention takes the blocked path (not a fused choice, or the kernel cannot run).
    #[cfg(target_arch = "x86_64")]
    pub(crate) fn fused_width(self, head_dim: usize) -> Option<crate::attention_fused::Width> {
        match self {
            AttentionProducts::Fused => crate::attention_fused::width(head_dim, true),
            AttentionProducts::FusedAvx2 => crate::attention_fused::width(head_dim, false),
            AttentionProducts::Small | AttentionProducts::Sgemm => None,
        }
    }
}

/// `C = A·B + beta·C`, `A: [m, k]`, `B: [k, n]` (any strides), `C: [m, n]` with unit
/// column stride; `beta` is 0 (overwrite; C is not read) or 1 (accumulate). Runs on the
/// calling thread, by `products`' kernel.
///
/// # Safety
/// As [`sgemm_strided`]: the operands lie inside their allocations for these sizes, and
/// `c` overlaps neither `a`, `b` nor memory another thread touches meanwhile.
pub(crate) unsafe fn product(
    products: AttentionProducts,
    kernel: GemmKernel,
    m: usize,
    k: usize,
    n: usize,
    a: Operand,
    b: Operand,
    beta: f32,
    c: Operand,
) {
    if products != AttentionProducts::Small {
        // `Fused` reaches here only where the fused kernel does not run (no AVX2, or a
        // head size it does not take): the blocked path's products on `sgemm`.
        // SAFETY: the caller's.
        unsafe { sgemm_strided(kernel, m, k, n, a, b, beta, c) };
        return;
    }
    assert_eq!(c.cs, 1, "attention products write rows of unit stride");
    if m == 0 || n == 0 {
        return;
    }
    let p = Product {
        m,
        k,
        n,
        a: a.ptr.get(),
        ars: a.rs,
        acs: a.cs,
        c: c.ptr.get(),
        crs: c.rs,
        accumulate: beta != 0.0,
    };
    let wide = simd::has_avx512();
    let nr = if wide { NR_WIDE } else { NR };
    with_packed(k, n, nr, b, |packed| {
        let pp = Packed {
            ptr: packed.as_ptr(),
            ld: n.next_multiple_of(nr),
        };
        if wide {
            tiles_wide(p, pp);
        } else {
            tiles(p, pp);
        }
    });
}

/// Tile of the AVX-512 copy: 8 rows × 32 columns (two vectors a row).
const MR_WIDE: usize = 8;
const NR_WIDE: usize = 32;
/// Tile of the AVX2 (and baseline) copy: 6 rows × 16 columns.
const MR: usize = 6;
const NR: usize = 16;

/// `A`, `C` and the sizes of one product, as plain data.
#[derive(Clone, Copy)]
struct Product {
    m: usize,
    k: usize,
    n: usize,
    a: *const f32,
    ars: usize,
    acs: usize,
    c: *mut f32,
    crs: usize,
    accumulate: bool,
}

/// `B` packed: `k` rows of `ld` (a multiple of the tile width), zero past column `n`.
#[derive(Clone, Copy)]
struct Packed {
    ptr: *const f32,
    ld: usize,
}

thread_local! {
    /// Per-thread packing buffer for `B`, grown on first use, then reused.
    static PACK: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

/// Packs `b: [k, n]` into zero-padded rows of `n.next_multiple_of(nr)` and runs `f` on
/// them.
fn with_packed<R>(k: usize, n: usize, nr: usize, b: Operand, f: impl FnOnce(&[f32]) -> R) -> R {
    let ld = n.next_multiple_of(nr);
    PACK.with_borrow_mut(|buf| {
        if buf.len() < k * ld {
            buf.resize(k * ld, 0.0);
        }
        let dst = &mut buf[..k * ld];
        let src = b.ptr.get().cast_const();
        // SAFETY: every (kk, j) with kk < k, j < n is inside `b` (the caller's).
        let at = |kk: usize, j: usize| unsafe { *src.add(kk * b.rs + j * b.cs) };
        if b.cs == 1 || b.rs != 1 {
            for (kk, row) in dst.chunks_exact_mut(ld).enumerate() {
                for (j, o) in row[..n].iter_mut().enumerate() {
                    *o = at(kk, j);
                }
                row[n..].fill(0.0);
            }
        } else {
            // `B` is a transposed row-major matrix (`kᵀ`, `vᵀ`): read its rows
            // (contiguous) and scatter them into the packed columns.
            for j in 0..n {
                for kk in 0..k {
                    dst[kk * ld + j] = at(kk, j);
                }
            }
            for row in dst.chunks_exact_mut(ld) {
                row[n..].fill(0.0);
            }
        }
        f(dst)
    })
}

/// One `ROWS × W` tile of `C` at rows `i0..`, columns `j0..j0 + cols` (`cols <= W`):
/// `acc[r][j] = Σ_kk a[i0 + r, kk]·b[kk, j0 + j]` in `kk` order, then written.
///
/// # Safety
/// `p` and `b` describe valid operands; `i0 + ROWS <= m`; `j0 + W <= b.ld`.
#[inline(always)]
unsafe fn tile<M: MulAdd, const ROWS: usize, const W: usize>(
    p: Product,
    b: Packed,
    i0: usize,
    j0: usize,
    cols: usize,
) {
    let mut acc = [[0.0f32; W]; ROWS];
    // SAFETY (whole function): rows i0..i0 + ROWS of `A` and `C`, columns below `n` of
    // `C` and below `b.ld` of the packed `B`, all inside their buffers (the caller's).
    unsafe {
        let a = p.a.add(i0 * p.ars);
        for kk in 0..p.k {
            let bv: [f32; W] = *b.ptr.add(kk * b.ld + j0).cast::<[f32; W]>();
            for (r, acc) in acc.iter_mut().enumerate() {
                let av = *a.add(r * p.ars + kk * p.acs);
                for j in 0..W {
                    acc[j] = M::mul_add(av, bv[j], acc[j]);
                }
            }
        }
        for (r, acc) in acc.iter().enumerate() {
            let c = p.c.add((i0 + r) * p.crs + j0);
            if cols == W {
                let c = &mut *c.cast::<[f32; W]>();
                for j in 0..W {
                    c[j] = if p.accumulate { c[j] + acc[j] } else { acc[j] };
                }
            } else {
                let c = std::slice::from_raw_parts_mut(c, cols);
                for (o, &v) in c.iter_mut().zip(acc) {
                    *o = if p.accumulate { *o + v } else { v };
                }
            }
        }
    }
}

/// Every tile of one product: column tiles of `W` outer (one `k × W` panel of the packed
/// `B` stays in L1), row tiles of `MR_` inner, then the last `m mod MR_` rows by a tile
/// of that height.
#[inline(always)]
unsafe fn all_tiles<M: MulAdd, const MR_: usize, const W: usize>(p: Product, b: Packed) {
    for j0 in (0..p.n).step_by(W) {
        let cols = (p.n - j0).min(W);
        let full = p.m - p.m % MR_;
        // SAFETY (all calls): rows and columns inside the product (the caller's).
        for i0 in (0..full).step_by(MR_) {
            unsafe { tile::<M, MR_, W>(p, b, i0, j0, cols) };
        }
        let i0 = full;
        match p.m - full {
            0 => {}
            1 => unsafe { tile::<M, 1, W>(p, b, i0, j0, cols) },
            2 => unsafe { tile::<M, 2, W>(p, b, i0, j0, cols) },
            3 => unsafe { tile::<M, 3, W>(p, b, i0, j0, cols) },
            4 => unsafe { tile::<M, 4, W>(p, b, i0, j0, cols) },
            5 => unsafe { tile::<M, 5, W>(p, b, i0, j0, cols) },
            6 => unsafe { tile::<M, 6, W>(p, b, i0, j0, cols) },
            7 => unsafe { tile::<M, 7, W>(p, b, i0, j0, cols) },
            r => unreachable!("{r} rows left of tiles of {MR_}"),
        }
    }
}

// `Product` and `Packed` hold raw pointers; `multiversion!` wants plain arguments.
multiversion! {
    avx512;
    fn tiles_wide(p: Product, b: Packed) {
        // SAFETY: the operands are valid (`product`'s caller).
        unsafe { all_tiles::<M, MR_WIDE, NR_WIDE>(p, b) }
    }
}

multiversion! {
    fn tiles(p: Product, b: Packed) {
        // SAFETY: the operands are valid (`product`'s caller).
        unsafe { all_tiles::<M, MR, NR>(p, b) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::buffer::SendPtr;
    use andrea_testkit::random::Rand;

    /// Every layout the attention uses (row-major and transposed `A` and `B`, padded
    /// row strides), sizes with row tails of every height below a tile (1-7 rows past
    /// the last full tile), column counts not a multiple of either tile width, inner
    /// dimensions of 1 to 70, overwrite and accumulate: against an f64 product, within
    /// `tol::matmul(k)` (the suite's: `k`-term f32 sums of values in [-1, 1]).
    #[test]
    fn products_match_an_f64_product() {
        let mut r = Rand::new(32);
        let mut cases = Vec::new();
        for m in [1usize, 3, 4, 7, 8, 13, 64] {
            for (k, n) in [(32usize, 40usize), (1, 1), (70, 33), (64, 32), (5, 17)] {
                cases.push((m, k, n));
            }
        }
        for (case, &(m, k, n)) in cases.iter().enumerate() {
            let (at, bt, acc) = (case % 2 == 1, case % 3 == 1, case % 4 >= 2);
            let (pad_a, pad_b, pad_c) = (3, 5, 2);
            // A stored [m, k + pad] or, transposed, [k, m + pad].
            let (a_rs, a_cs, a_len) = if at {
                (1, m + pad_a, k * (m + pad_a))
            } else {
                (k + pad_a, 1, m * (k + pad_a))
            };
            let (b_rs, b_cs, b_len) = if bt {
                (1, k + pad_b, n * (k + pad_b))
            } else {
                (n + pad_b, 1, k * (n + pad_b))
            };
            let mut a = r.vec(a_len, -1.0, 1.0);
            let mut b = r.vec(b_len, -1.0, 1.0);
            let mut c = r.vec(m * (n + pad_c), -1.0, 1.0);
            let mut want: Vec<f64> = c.iter().map(|&v| v as f64).collect();
            for i in 0..m {
                for j in 0..n {
                    let s: f64 = (0..k)
                        .map(|kk| a[i * a_rs + kk * a_cs] as f64 * b[kk * b_rs + j * b_cs] as f64)
                        .sum();
                    let w = &mut want[i * (n + pad_c) + j];
                    *w = if acc { *w + s } else { s };
                }
            }
            let op = |v: &mut Vec<f32>, rs, cs| Operand {
                ptr: SendPtr(v.as_mut_ptr()),
                rs,
                cs,
            };
            let (ao, bo, co) = (
                op(&mut a, a_rs, a_cs),
                op(&mut b, b_rs, b_cs),
                op(&mut c, n + pad_c, 1),
            );
            // SAFETY: the operands were sized for these strides above.
            unsafe {
                product(
                    AttentionProducts::Small,
                    GemmKernel::GemmCrate,
                    m,
                    k,
                    n,
                    ao,
                    bo,
                    if acc { 1.0 } else { 0.0 },
                    co,
                )
            };
            andrea_testkit::tol::matmul(k)
                .check(
                    &format!("m {m} k {k} n {n} at {at} bt {bt} acc {acc}"),
                    &c,
                    &want,
                )
                .unwrap();
        }
    }
}
