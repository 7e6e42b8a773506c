//! Matrix multiplication: `matmul`, `matmul_add`, `linear_gelu`, `matmul_gelu_backward`
//! and `bias_backward` (`andrea_core::LinalgOps`), on the GEMM kernel of the SIMD level
//! ([`GemmKernel`]).
//!
//! Every product of the model goes through [`sgemm_strided`] (one thread, one block of
//! `C`) or a kernel's own threaded form, so transposes cost nothing (they are strides).
//! Products with at most a few rows (generation) take the bandwidth-bound path of
//! `decode::gemv` instead.
//!
//! How a product is shared out: andrea's AVX2 kernel (`avx2`) runs each product as one
//! queue of tasks on all threads, with the bias and GELU epilogues in its micro-kernel;
//! andrea's AVX-512 kernel (`avx512`) packs `B` once for all threads and shares out the
//! rows of `C`; the `gemm` crate gets one single-threaded call per block of `C` (row
//! blocks, or column blocks when `A` is row-major or there are few rows), and a product
//! with a bias or a GELU epilogue is cut into fixed tiles of [`FUSED_TILE`], each given
//! its bias and GELU while it is in cache. Each element of `C` is computed by the same
//! sequence of floating-point operations whatever block, tile or thread it falls in, so
//! the result is bit-identical for any thread count.

#[cfg(target_arch = "x86_64")]
pub(crate) mod avx2;
#[cfg(target_arch = "x86_64")]
pub(crate) mod avx512;

use andrea_core::check::MatmulDims;
use andrea_core::Matrix;
use rayon::prelude::*;

use crate::buffer::{CpuBuffer, SendPtr};
use crate::views::{Operand, Row};

use andrea_core::{check, fused, LinalgOps, LinearOf, Mat, Result, Tensor};

use crate::buffer::read;
use crate::buffer::write;
use crate::CpuBackend;

/// Rows (or columns) per block are rounded to this, so blocks do not end in ragged
/// micro-tiles.
const BLOCK_ALIGN: usize = 16;

/// The deepest slice of `k` one call of the `gemm` crate gets (`sgemm_strided`): at or
/// below it the crate never cuts `k` itself.
const GEMM_CRATE_KC: usize = 512;

/// Elements of `C` at or below which the `gemm` crate computes a product of a row-major
/// `A` and a column-major `B` by horizontal dot products (its `m·n <= 16·16` path), in
/// another order than its tiled kernel: no block of a product larger than that is cut
/// this small (`blocks`), so whether a product takes that path depends on its sizes
/// alone, not on the thread count.
const GEMM_CRATE_SMALL: usize = 16 * 16;

/// Rows and columns of the tiles of C a product with a bias or GELU epilogue is cut
/// into: the same tiles whatever the thread count (so each element sees the same
/// operations), each small enough that its product, bias and GELU run in a 1 MB L2:
/// C's tile 128 KB, `out`'s 128 KB, `A`'s rows 128 KB at `k` 128.
const FUSED_TILE: (usize, usize) = (256, 128);

/// The f32 GEMM kernel behind the crate's one strided GEMM function, one per SIMD level
/// ([`GemmKernel::for_level`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum GemmKernel {
    /// The `gemm` crate: the kernel at the baseline and AVX-512 levels and on other
    /// architectures. It picks its own micro-kernel from the CPU (AVX-512 where present,
    /// NEON on aarch64), whatever `ANDREA_SIMD` says.
    GemmCrate,
    /// andrea's own AVX2 + FMA kernel (`avx2` module): the kernel at the AVX2 level,
    /// so that a measurement under `ANDREA_SIMD=avx2` times AVX2 GEMMs too, with the bias
    /// and GELU epilogues in its micro-kernel.
    Avx2,
    /// andrea's own AVX-512 kernel (`avx512` module): only `matmul_gelu_backward`
    /// at small `k` on the AVX-512 level ([`GemmKernel::for_gelu_grad`]).
    Avx512,
}

impl GemmKernel {
    /// The kernel of every product at the kernels' level ([`crate::simd::level`]): the
    /// `gemm` crate at AVX-512 and below AVX2, andrea's AVX2 kernel at AVX2.
    pub(crate) fn for_level() -> Self {
        #[cfg(target_arch = "x86_64")]
        if crate::simd::level() == crate::simd::Level::Avx2 {
            return GemmKernel::Avx2;
        }
        GemmKernel::GemmCrate
    }

    /// The kernel's name, as the backend's name reports it.
    pub(crate) fn name(self) -> &'static str {
        match self {
            GemmKernel::GemmCrate => "crate",
            GemmKernel::Avx2 => "avx2",
            GemmKernel::Avx512 => "avx512",
        }
    }

    /// The kernel of `matmul_gelu_backward` with inner size `k`: andrea's AVX-512 kernel
    /// where the `gemm` crate's products would run, the kernels' level has AVX-512 and
    /// `k <= 256`. At small `k` the product is short (`2k` flops per element of C) beside
    /// the epilogue's reads of `pre`, and the AVX-512 kernel's shared split multiplies
    /// each `MC`-row block by `GELU'(pre)` while it is in cache, where the `gemm` crate's
    /// column blocks are read back from memory; at large `k` the product dominates and
    /// the `gemm` crate is the faster.
    pub(crate) fn for_gelu_grad(self, k: usize) -> Self {
        match self {
            GemmKernel::GemmCrate if k <= 256 && crate::simd::has_avx512() => GemmKernel::Avx512,
            k => k,
        }
    }

    /// The kernel that runs: andrea's own kernels step down to what the kernels' level
    /// allows (AVX-512, then AVX2, then the `gemm` crate).
    pub(crate) fn effective(self) -> Self {
        use crate::simd::{has_avx2_fma, has_avx512};
        match self {
            GemmKernel::Avx512 if !has_avx512() => GemmKernel::Avx2.effective(),
            GemmKernel::Avx2 if !has_avx2_fma() => GemmKernel::GemmCrate,
            k => k,
        }
    }
}

/// `C = A·B + beta·C` on one thread, `A: [m, k]`, `B: [k, n]`, `C: [m, n]`, any strides;
/// `beta` is 0 (overwrite; C is not read) or 1 (accumulate).
///
/// # Safety
/// The three operands must lie inside their allocations for the given sizes, and `c`
/// must not overlap `a`, `b` or any memory another thread touches meanwhile.
pub(crate) unsafe fn sgemm_strided(
    kernel: GemmKernel,
    m: usize,
    k: usize,
    n: usize,
    a: Operand,
    b: Operand,
    beta: f32,
    c: Operand,
) {
    // Other architectures have only the `gemm` crate.
    #[cfg(not(target_arch = "x86_64"))]
    let _ = kernel;
    #[cfg(target_arch = "x86_64")]
    match kernel.effective() {
        GemmKernel::Avx512 => {
            // SAFETY: forwarded from the caller; the CPU has AVX-512 (`effective`).
            unsafe { crate::gemm::avx512::sgemm(m, k, n, a, b, beta, c) };
            return;
        }
        GemmKernel::Avx2 => {
            // SAFETY: forwarded from the caller; the CPU has AVX2 and FMA (`effective`).
            unsafe { crate::gemm::avx2::sgemm(m, k, n, a, b, beta, c) };
            return;
        }
        GemmKernel::GemmCrate => {}
    }
    // The `gemm` crate picks its depth of `k` per call from the call's `m` and `n`
    // (`k.min(512)` when both are at most 64, a cache-derived depth of at least 512
    // otherwise), and a call's `m` and `n` are a block's, which depend on the thread count
    // (`blocks`): so would the order of each sum. Slices of `k` fixed by `k` alone, each of
    // at most 512 (`k` cut evenly), are each one depth for the crate whatever the block,
    // so the sums' order depends on `k` alone.
    let kc = k.div_ceil(k.div_ceil(GEMM_CRATE_KC).max(1)).max(1);
    for p0 in (0..k.max(1)).step_by(kc) {
        let kb = (k - p0).min(kc);
        let (read_c, alpha) = if p0 == 0 {
            (beta != 0.0, beta)
        } else {
            (true, 1.0)
        };
        // SAFETY: forwarded from the caller (columns p0..p0 + kb of A, rows of B). gemm
        // computes dst = α·dst + β·lhs·rhs and reads dst only when asked to.
        unsafe {
            gemm::gemm(
                m,
                n,
                kb,
                c.ptr.get(),
                c.cs as isize,
                c.rs as isize,
                read_c,
                a.ptr.get().add(p0 * a.cs),
                a.cs as isize,
                a.rs as isize,
                b.ptr.get().add(p0 * b.rs),
                b.cs as isize,
                b.rs as isize,
                alpha,
                1.0,
                false,
                false,
                false,
                gemm::Parallelism::None,
            )
        };
    }
}

/// One block of work: rows `r0..r1` and columns `c0..c1` of batch entry `batch`.
#[derive(Clone, Copy)]
struct Block {
    batch: usize,
    r0: usize,
    r1: usize,
    c0: usize,
    c1: usize,
}

/// `0..len` in about `parts` pieces of a multiple of [`BLOCK_ALIGN`]; a last piece
/// shorter than that joins the one before it, so no piece is a row or column or a few of
/// its own (the `gemm` crate takes a product of one row or column by another path, in
/// another order, unless the whole product is one).
fn split(len: usize, parts: usize) -> Vec<(usize, usize)> {
    let parts = parts.max(1);
    let step = len.div_ceil(parts).div_ceil(BLOCK_ALIGN) * BLOCK_ALIGN;
    let mut pieces: Vec<(usize, usize)> = (0..len)
        .step_by(step.max(1))
        .map(|s| (s, (s + step).min(len)))
        .collect();
    if pieces.len() > 1 && pieces[pieces.len() - 1].1 - pieces[pieces.len() - 1].0 < BLOCK_ALIGN {
        let (_, end) = pieces.pop().expect("two pieces");
        pieces.last_mut().expect("one piece").1 = end;
    }
    pieces
}

/// Cuts the product into blocks for `threads` threads: column blocks when `A` is
/// row-major (`a_row_major`) and C is wide enough, row blocks otherwise (and column
/// blocks again when there are too few rows). The split of the `gemm` crate's and the
/// AVX-512 kernel's products and of batched products (one block per batch); andrea's
/// AVX2 kernel shares each product out task by task instead (`avx2::sgemm_threads`).
///
/// Each block's kernel call packs its own copy of the operand the blocks share: all of
/// `B` for row blocks, all of `A` for column blocks. Column blocks are the faster when
/// `A` is row-major (the activations of every forward and `dx` product), row blocks when
/// `A` is transposed (the `dW = xᵀ·dy` products, whose `A` must be packed from a strided
/// read).
fn blocks(d: &MatmulDims, threads: usize, a_row_major: bool) -> Vec<Block> {
    let mut out = Vec::new();
    let whole = |out: &mut Vec<Block>| {
        out.clear();
        for batch in 0..d.batch {
            out.push(Block {
                batch,
                r0: 0,
                r1: d.m,
                c0: 0,
                c1: d.n,
            });
        }
    };
    if d.batch >= threads || threads == 1 {
        whole(&mut out);
        return out;
    }
    let per_batch = threads.div_ceil(d.batch);
    let wide = d.n >= per_batch * 2 * BLOCK_ALIGN;
    for batch in 0..d.batch {
        let columns = wide && a_row_major;
        if d.m >= per_batch * 2 * BLOCK_ALIGN && !columns {
            for (r0, r1) in split(d.m, per_batch) {
                out.push(Block {
                    batch,
                    r0,
                    r1,
                    c0: 0,
                    c1: d.n,
                });
            }
        } else {
            for (c0, c1) in split(d.n, per_batch) {
                out.push(Block {
                    batch,
                    r0: 0,
                    r1: d.m,
                    c0,
                    c1,
                });
            }
        }
    }
    // A block the `gemm` crate would multiply by its small-product path while the whole
    // product is larger: the product stays whole (see [`GEMM_CRATE_SMALL`]).
    let small = |b: &Block| (b.r1 - b.r0) * (b.c1 - b.c0) <= GEMM_CRATE_SMALL;
    if d.m * d.n > GEMM_CRATE_SMALL && out.iter().any(small) {
        whole(&mut out);
    }
    out
}

/// The strides of a matrix, without the buffer reference (which is not `Sync`).
#[derive(Clone, Copy)]
pub(crate) struct Layout {
    batch: usize,
    batch_stride: usize,
    row_stride: usize,
    col_stride: usize,
}

impl Layout {
    fn of(m: &Matrix<'_, CpuBuffer>) -> Self {
        Layout {
            batch: m.batch,
            batch_stride: m.batch_stride,
            row_stride: m.row_stride,
            col_stride: m.col_stride,
        }
    }
}

/// A validated product as plain data, ready to run on any thread.
pub(crate) struct Gemm<'a> {
    pa: SendPtr,
    pb: SendPtr,
    pc: SendPtr,
    a: Layout,
    b: Layout,
    c: Layout,
    bias: Option<&'a [f32]>,
    accumulate: bool,
    d: MatmulDims,
    kernel: GemmKernel,
    /// If set, `out = GELU(c)` block by block after each block's product.
    gelu_out: Option<SendPtr>,
    /// If set, `c ⊙= GELU'(pre)` block by block after each block's product.
    gelu_grad_of: Option<SendPtr>,
    /// BF16 precision: operands rounded to BF16, FP32 sums ([`Gemm::in_bf16`]).
    bf16: bool,
    /// A BF16 copy of `b` from its first element on, in `b`'s layout.
    b_copy: Option<&'a [andrea_core::bf16]>,
}

impl<'a> Gemm<'a> {
    /// `c (+)= a·b (+ bias)` for operands that passed `check::matmul` (which gave `d`).
    pub(crate) fn new(
        a: &Matrix<'_, CpuBuffer>,
        b: &Matrix<'_, CpuBuffer>,
        bias: Option<&'a [f32]>,
        c: &Matrix<'_, CpuBuffer>,
        accumulate: bool,
        d: MatmulDims,
        kernel: GemmKernel,
    ) -> Self {
        Gemm {
            pa: SendPtr::of(a),
            pb: SendPtr::of(b),
            pc: SendPtr::of(c),
            a: Layout::of(a),
            b: Layout::of(b),
            c: Layout::of(c),
            bias,
            accumulate,
            d,
            kernel,
            gelu_out: None,
            gelu_grad_of: None,
            bf16: false,
            b_copy: None,
        }
    }

    /// The product in BF16 precision: `a` and `b` rounded to BF16 (nearest even), FP32
    /// sums. A few-rows product (decoding) reads `b` from `b_copy` where given (half the
    /// bytes; `decode::gemv::bf16`); a larger one rounds both operands into contiguous
    /// copies and runs the FP32 GEMM on them (the products of BF16 values are exact in
    /// FP32, so this is the BF16 product with the GEMM's FP32 sums).
    pub(crate) fn in_bf16(mut self, b_copy: Option<&'a [andrea_core::bf16]>) -> Self {
        self.bf16 = true;
        self.b_copy = b_copy;
        self
    }

    /// Also writes `GELU(c)` into `out` (same contiguous `[m, n]` layout as `c`), one
    /// block at a time right after the block's product, while it is in cache.
    ///
    /// # Safety
    /// `out` must point at `m·n` floats disjoint from every operand.
    pub(crate) unsafe fn with_gelu_into(mut self, out: SendPtr) -> Self {
        self.gelu_out = Some(out);
        self
    }

    /// Also multiplies `c` by `GELU'(pre)` (`pre` in `c`'s contiguous `[m, n]` layout),
    /// one block at a time right after the block's product, while it is in cache.
    ///
    /// # Safety
    /// `c` must be contiguous and `pre` must point at `m·n` floats disjoint from `c`.
    pub(crate) unsafe fn with_gelu_grad_of(mut self, pre: SendPtr) -> Self {
        self.gelu_grad_of = Some(pre);
        self
    }

    /// Runs the product on the current rayon pool.
    pub(crate) fn run(&self) {
        matmul(self)
    }
}

fn matmul(g: &Gemm<'_>) {
    let Gemm {
        pa,
        pb,
        pc,
        a,
        b,
        c,
        bias,
        accumulate,
        d,
        kernel,
        gelu_out,
        gelu_grad_of,
        bf16,
        b_copy,
    } = *g;
    let few_rows = d.batch == 1
        && crate::decode::gemv::Gemv::applies(d.m, d.n, b.row_stride, b.col_stride, c.col_stride);
    if bf16 && !few_rows {
        let (a16, a) = rounded(pa, a, d.m, d.k);
        let (b16, b) = rounded(pb, b, d.k, d.n);
        let g = Gemm {
            pa: SendPtr(a16.as_ptr() as *mut f32),
            pb: SendPtr(b16.as_ptr() as *mut f32),
            a,
            b,
            bf16: false,
            b_copy: None,
            ..*g
        };
        return matmul(&g);
    }
    if few_rows {
        let v = crate::decode::gemv::Gemv {
            m: d.m,
            k: d.k,
            n: d.n,
            a: pa,
            a_rs: a.row_stride,
            a_cs: a.col_stride,
            b: pb,
            b_rs: b.row_stride,
            b_cs: b.col_stride,
            c: pc,
            c_rs: c.row_stride,
            bias,
            accumulate,
            gelu_out,
            gelu_grad_of,
            bf16,
            b_copy,
        };
        // SAFETY: the operands passed `check::matmul`; `gelu_out` and `gelu_grad_of` are
        // as `with_gelu_into` and `with_gelu_grad_of` promised.
        unsafe { v.run() };
        return;
    }
    // Outside the tiled path below (batched, strided C, or the AVX-512 kernel's shared
    // split): the bias (written first, then accumulated onto: `beta` 1) and the fused
    // GELU epilogues, on rows r0..r1 and columns c0..c1 of batch entry `batch`.
    let beta = if accumulate || bias.is_some() {
        1.0
    } else {
        0.0
    };
    let fill_bias = |batch: usize, r0: usize, r1: usize, c0: usize, c1: usize| {
        let Some(bias) = bias else { return };
        for i in r0..r1 {
            for (j, &bj) in bias.iter().enumerate().take(c1).skip(c0) {
                // SAFETY: the check proved `c` in bounds; the caller owns this block.
                unsafe {
                    let p = pc
                        .get()
                        .add(batch * c.batch_stride + i * c.row_stride + j * c.col_stride);
                    *p = if accumulate { *p + bj } else { bj };
                }
            }
        }
    };
    // `c` and `out` (and `pre`) are contiguous here (checked by `Backend::linear_gelu`
    // and `matmul_gelu_backward`), with batch 1.
    let epilogue = |r0: usize, r1: usize, c0: usize, c1: usize| {
        let n = c1 - c0;
        for i in r0..r1 {
            let off = i * c.row_stride + c0;
            // SAFETY: the block lies in `c`, `out` and `pre` (same layout), which the
            // caller owns.
            unsafe {
                if let Some(out) = gelu_out {
                    let src = std::slice::from_raw_parts(pc.get().add(off), n);
                    let dst = std::slice::from_raw_parts_mut(out.get().add(off), n);
                    crate::elementwise::gelu_slice(Some(src), dst);
                }
                if let Some(pre) = gelu_grad_of {
                    let x = std::slice::from_raw_parts(pre.get().add(off), n);
                    let dc = std::slice::from_raw_parts_mut(pc.get().add(off), n);
                    crate::elementwise::gelu_backward_slice(x, None, dc);
                }
            }
        }
    };
    let threads = rayon::current_num_threads();
    // andrea's AVX2 kernel applies the bias and the GELU epilogues to each tile of C in
    // its registers (`avx2::Epilogue`), so its products keep the plain split below.
    let in_kernel = cfg!(target_arch = "x86_64") && matches!(kernel.effective(), GemmKernel::Avx2);
    // A bias or GELU epilogue on the other kernels: fixed tiles of C, each finished
    // while in cache. Not `matmul_gelu_backward`'s GELU': its cost is the read of `pre`
    // from memory, which tiles do not save.
    if !in_kernel
        && (bias.is_some() || gelu_out.is_some())
        && gelu_grad_of.is_none()
        && d.batch == 1
        && c.col_stride == 1
    {
        let tile = |r0: usize, r1: usize, c0: usize, c1: usize| {
            let n = c1 - c0;
            // SAFETY: the check proved every operand in bounds and `c` injective and
            // disjoint from `a`, `b` and `bias`; tiles cover disjoint parts of `c` (and
            // of `out`, in `c`'s layout).
            unsafe {
                sgemm_strided(
                    kernel,
                    r1 - r0,
                    d.k,
                    n,
                    Operand {
                        ptr: pa.add(r0 * a.row_stride),
                        rs: a.row_stride,
                        cs: a.col_stride,
                    },
                    Operand {
                        ptr: pb.add(c0 * b.col_stride),
                        rs: b.row_stride,
                        cs: b.col_stride,
                    },
                    if accumulate { 1.0 } else { 0.0 },
                    Operand {
                        ptr: pc.add(r0 * c.row_stride + c0),
                        rs: c.row_stride,
                        cs: 1,
                    },
                );
                if let Some(bias) = bias {
                    let bias = &bias[c0..c1];
                    for i in r0..r1 {
                        let row =
                            std::slice::from_raw_parts_mut(pc.get().add(i * c.row_stride + c0), n);
                        for (x, &bj) in row.iter_mut().zip(bias) {
                            *x += bj;
                        }
                    }
                }
            }
            epilogue(r0, r1, c0, c1);
        };
        let (rows, cols) = FUSED_TILE;
        let (rt, ct) = (d.m.div_ceil(rows), d.n.div_ceil(cols));
        let run = |t: usize| {
            let (r0, c0) = (t / ct * rows, t % ct * cols);
            tile(r0, (r0 + rows).min(d.m), c0, (c0 + cols).min(d.n));
        };
        if rt * ct == 1 || threads == 1 {
            (0..rt * ct).for_each(run);
        } else {
            (0..rt * ct).into_par_iter().for_each(run);
        }
        return;
    }
    #[cfg(target_arch = "x86_64")]
    if kernel.effective() == GemmKernel::Avx512
        && d.batch == 1
        && threads > 1
        && crate::gemm::avx512::splits(d.m, threads)
    {
        // One product on all threads, `B` packed once per block for all of them.
        let before = |r0: usize, r1: usize| fill_bias(0, r0, r1, 0, d.n);
        let hooks = crate::gemm::avx512::Hooks {
            before: &before,
            after: &epilogue,
        };
        let fused = bias.is_some() || gelu_out.is_some() || gelu_grad_of.is_some();
        // SAFETY: the check proved every operand in bounds and `c` injective and
        // disjoint from `a`, `b` and `bias`; the hooks touch only their own block.
        unsafe {
            crate::gemm::avx512::sgemm_threads(
                d.m,
                d.k,
                d.n,
                Operand {
                    ptr: pa,
                    rs: a.row_stride,
                    cs: a.col_stride,
                },
                Operand {
                    ptr: pb,
                    rs: b.row_stride,
                    cs: b.col_stride,
                },
                beta,
                Operand {
                    ptr: pc,
                    rs: c.row_stride,
                    cs: c.col_stride,
                },
                threads,
                fused.then_some(&hooks),
            )
        };
        return;
    }
    // andrea's AVX2 kernel on several threads: each product one queue of tasks, every
    // operand packed once, each thread taking the next task as it frees up
    // (`avx2::sgemm_threads`). Products in batches of at least one per thread keep
    // the per-batch blocks below.
    #[cfg(target_arch = "x86_64")]
    if kernel.effective() == GemmKernel::Avx2 && threads > 1 && d.batch < threads {
        let beta = if accumulate { 1.0 } else { 0.0 };
        for batch in 0..d.batch {
            let at = |l: &Layout| {
                if l.batch == 1 {
                    0
                } else {
                    batch * l.batch_stride
                }
            };
            let off = batch * c.batch_stride;
            // SAFETY: the check proved every operand in bounds and `c` injective and
            // disjoint from `a`, `b` and `bias`, and the fused ops `out` and `pre` in
            // `c`'s layout; the CPU has AVX2 and FMA (`effective`).
            unsafe {
                let operand = |p: SendPtr, l: &Layout, at: usize| Operand {
                    ptr: p.add(at),
                    rs: l.row_stride,
                    cs: l.col_stride,
                };
                let epi = crate::gemm::avx2::Epilogue {
                    bias: bias.map(|b| b.as_ptr()),
                    gelu_out: gelu_out.map(|o| o.get().add(off)),
                    gelu_grad_of: gelu_grad_of.map(|p| p.get().add(off) as *const f32),
                };
                crate::gemm::avx2::sgemm_threads(
                    d.m,
                    d.k,
                    d.n,
                    operand(pa, &a, at(&a)),
                    operand(pb, &b, at(&b)),
                    beta,
                    operand(pc, &c, off),
                    epi,
                    threads,
                );
            }
        }
        return;
    }
    let blocks = blocks(&d, threads, a.col_stride == 1);
    let run = |blk: &Block| {
        let ab = if a.batch == 1 {
            0
        } else {
            blk.batch * a.batch_stride
        };
        let bb = if b.batch == 1 {
            0
        } else {
            blk.batch * b.batch_stride
        };
        let off = blk.batch * c.batch_stride + blk.r0 * c.row_stride + blk.c0 * c.col_stride;
        // SAFETY: the block's operands; the check proved every operand in bounds.
        let (a_blk, b_blk, c_blk) = unsafe {
            (
                Operand {
                    ptr: pa.add(ab + blk.r0 * a.row_stride),
                    rs: a.row_stride,
                    cs: a.col_stride,
                },
                Operand {
                    ptr: pb.add(bb + blk.c0 * b.col_stride),
                    rs: b.row_stride,
                    cs: b.col_stride,
                },
                Operand {
                    ptr: pc.add(off),
                    rs: c.row_stride,
                    cs: c.col_stride,
                },
            )
        };
        let (m, n) = (blk.r1 - blk.r0, blk.c1 - blk.c0);
        #[cfg(target_arch = "x86_64")]
        if in_kernel {
            // SAFETY: `c` is injective and disjoint from `a`, `b` and `bias` (the check);
            // blocks cover disjoint parts of `c`, and of `out` and `pre` (`c`'s layout,
            // checked by the fused ops); the CPU has AVX2 and FMA (`effective`).
            unsafe {
                let epi = crate::gemm::avx2::Epilogue {
                    bias: bias.map(|b| b.as_ptr().add(blk.c0)),
                    gelu_out: gelu_out.map(|o| o.get().add(off)),
                    gelu_grad_of: gelu_grad_of.map(|p| p.get().add(off) as *const f32),
                };
                let beta = if accumulate { 1.0 } else { 0.0 };
                crate::gemm::avx2::sgemm_epilogue(m, d.k, n, a_blk, b_blk, beta, c_blk, epi);
            }
            return;
        }
        fill_bias(blk.batch, blk.r0, blk.r1, blk.c0, blk.c1);
        // SAFETY: `c` is injective and disjoint from `a`, `b` and `bias` (the check);
        // blocks cover disjoint parts of `c`.
        unsafe { sgemm_strided(kernel, m, d.k, n, a_blk, b_blk, beta, c_blk) };
        // Fused epilogue: GELU of the block while it is still in cache.
        if gelu_out.is_some() || gelu_grad_of.is_some() {
            epilogue(blk.r0, blk.r1, blk.c0, blk.c1);
        }
    };
    if blocks.len() == 1 {
        run(&blocks[0]);
    } else {
        blocks.par_iter().for_each(run);
    }
}

/// The `rows x cols` operand at `p` in `layout` (each of its batch entries, one where it
/// is broadcast with batch stride 0), rounded to BF16 into a contiguous row-major copy,
/// and the copy's layout.
fn rounded(p: SendPtr, layout: Layout, rows: usize, cols: usize) -> (Vec<f32>, Layout) {
    let entries = if layout.batch_stride == 0 {
        1
    } else {
        layout.batch
    };
    let mut out = vec![0.0f32; entries * rows * cols];
    out.par_chunks_mut(cols.max(1))
        .enumerate()
        .for_each(|(row, dst)| {
            let (e, i) = (row / rows, row % rows);
            for (j, v) in dst.iter_mut().enumerate() {
                let at = e * layout.batch_stride + i * layout.row_stride + j * layout.col_stride;
                // SAFETY: the operand passed `check::matmul`: every (e, i, j) is in bounds.
                *v = andrea_core::round_bf16(unsafe { *p.get().add(at) });
            }
        });
    let copy = Layout {
        batch: layout.batch,
        batch_stride: if entries == 1 { 0 } else { rows * cols },
        row_stride: cols,
        col_stride: 1,
    };
    (out, copy)
}

impl CpuBackend {
    /// `g` in this backend's precision: in BF16, with the BF16 copy of its weights `w`
    /// where one is kept (`bf16_copies`), which `copy` holds while the product runs.
    fn in_precision<'a>(
        &self,
        g: Gemm<'a>,
        copy: &'a Option<crate::bf16_copies::Bf16Weights>,
    ) -> Gemm<'a> {
        if self.precision == andrea_core::MatmulPrecision::Bf16 {
            g.in_bf16(copy.as_ref().map(|c| c.slice()))
        } else {
            g
        }
    }

    /// The BF16 copy of weights `w` that a product in BF16 precision reads, if kept.
    fn bf16_copy(&self, w: &Mat<'_, Self>) -> Option<crate::bf16_copies::Bf16Weights> {
        if self.precision != andrea_core::MatmulPrecision::Bf16 {
            return None;
        }
        let extent = w.extent();
        let start = SendPtr::of(w).get();
        self.bf16_copies.find(start, extent.end - extent.start)
    }

    /// `matmul` and `matmul_add`: `c (+)= a·b (+ bias)`.
    fn gemm(
        &self,
        a: Mat<'_, Self>,
        b: Mat<'_, Self>,
        bias: Option<Tensor<'_, Self>>,
        c: Mat<'_, Self>,
        accumulate: bool,
    ) -> Result<()> {
        let d = check::matmul(&a, &b, bias.as_ref(), &c)?;
        // SAFETY: checked in bounds and disjoint from `c`.
        let bias = bias.map(|t| unsafe { read(&t) });
        let copy = self.bf16_copy(&b);
        let g = self.in_precision(
            Gemm::new(&a, &b, bias, &c, accumulate, d, self.kernel),
            &copy,
        );
        self.run(|| g.run());
        Ok(())
    }
}

impl LinalgOps for CpuBackend {
    fn matmul(
        &self,
        a: Mat<'_, Self>,
        b: Mat<'_, Self>,
        bias: Option<Tensor<'_, Self>>,
        c: Mat<'_, Self>,
    ) -> Result<()> {
        self.gemm(a, b, bias, c, false)
    }

    fn matmul_add(
        &self,
        a: Mat<'_, Self>,
        b: Mat<'_, Self>,
        bias: Option<Tensor<'_, Self>>,
        c: Mat<'_, Self>,
    ) -> Result<()> {
        self.gemm(a, b, bias, c, true)
    }

    fn bias_backward(&self, dout: Tensor<'_, Self>, dbias: Tensor<'_, Self>) -> Result<()> {
        let d = check::bias_backward(&dout, &dbias)?;
        // SAFETY: checked in bounds and disjoint.
        let (g, db) = unsafe { (read(&dout), write(&dbias)) };
        self.run(|| crate::reduce::bias_backward(g, db, d.rows, d.cols));
        Ok(())
    }

    fn linear_gelu(
        &self,
        x: Mat<'_, Self>,
        w: Mat<'_, Self>,
        bias: Tensor<'_, Self>,
        pre: Tensor<'_, Self>,
        out: Tensor<'_, Self>,
    ) -> Result<()> {
        let d = check::linear_gelu(&x, &w, &bias, &pre, &out)?;
        // SAFETY: `bias` checked in bounds; `out` checked disjoint from every operand.
        let bias = unsafe { read(&bias) };
        let out_ptr = SendPtr(unsafe { write(&out) }.as_mut_ptr());
        let copy = self.bf16_copy(&w);
        let g = unsafe {
            Gemm::new(&x, &w, Some(bias), &pre.mat(), false, d, self.kernel).with_gelu_into(out_ptr)
        };
        let g = self.in_precision(g, &copy);
        self.run(|| g.run());
        Ok(())
    }

    /// One pass: each block of `dpre = dy·w` is multiplied by `GELU'(pre)` while in cache,
    /// instead of a second pass over `[N, M]` reading `dpre` and `pre` again.
    fn matmul_gelu_backward(
        &self,
        dy: Mat<'_, Self>,
        w: Mat<'_, Self>,
        pre: Tensor<'_, Self>,
        dpre: Tensor<'_, Self>,
    ) -> Result<()> {
        let d = check::matmul_gelu_backward(&dy, &w, &pre, &dpre)?;
        // SAFETY: `pre` checked in bounds and disjoint from `dpre`, both contiguous.
        let pre_ptr = SendPtr(unsafe { read(&pre) }.as_ptr() as *mut f32);
        let g = unsafe {
            Gemm::new(
                &dy,
                &w,
                None,
                &dpre.mat(),
                false,
                d,
                self.kernel.for_gelu_grad(d.k),
            )
            .with_gelu_grad_of(pre_ptr)
        };
        let copy = self.bf16_copy(&w);
        let g = self.in_precision(g, &copy);
        self.run(|| g.run());
        Ok(())
    }

    /// One token as one team job (`decode` module); more rows as the default's fine ops.
    fn mlp_forward(
        &self,
        x: Tensor<'_, Self>,
        fc: LinearOf<'_, Self>,
        pre: Tensor<'_, Self>,
        act: Tensor<'_, Self>,
        proj: LinearOf<'_, Self>,
        out: Tensor<'_, Self>,
    ) -> Result<()> {
        let d = check::mlp_forward(&x, &fc, &pre, &act, &proj, &out)?;
        let fused = self.precision == andrea_core::MatmulPrecision::Fp32;
        let Some((fc_w, proj_w)) =
            crate::decode::takes(d.rows, &fc.weight, &proj.weight).filter(|_| fused)
        else {
            return fused::mlp_forward(self, x, fc, pre, act, proj, out);
        };
        // SAFETY: checked in bounds and disjoint from every other argument.
        let out = unsafe { write(&out) };
        let mlp = crate::decode::MlpOne {
            x: Row::of(&x),
            fc_w,
            fc_b: Row::of(&fc.bias),
            proj_w,
            proj_b: Row::of(&proj.bias),
        };
        // SAFETY: the rows passed the op's check; `&self` ops run one at a time.
        self.run(|| unsafe { mlp.run(out) });
        Ok(())
    }
}

/// The products a kernel's unit test runs: `(m, k, n, a, b, beta, c)`.
#[cfg(all(test, target_arch = "x86_64"))]
pub(crate) type TestProduct<'a> = &'a dyn Fn(usize, usize, usize, Operand, Operand, f32, Operand);

/// `C (+)= A·B` through each of `variants` against a float64 product, on `shapes`, each
/// operand row-major or transposed, `beta` 0 and 1: the first variant within
/// `tol::matmul(k)` (the suite's tolerance: `k`-term f32 sums of values in [-1, 1]), the
/// others bit-identical to it.
#[cfg(all(test, target_arch = "x86_64"))]
pub(crate) fn check_against_f64(
    what: &str,
    shapes: &[(usize, usize, usize)],
    variants: &[TestProduct<'_>],
) {
    let mut r = andrea_testkit::random::Rand::new(7);
    for &(m, k, n) in shapes {
        for (ta, tb, beta) in [
            (false, false, 0.0),
            (true, false, 1.0),
            (false, true, 1.0),
            (true, true, 0.0),
        ] {
            let mut a = r.vec(m * k, -1.0, 1.0);
            let mut b = r.vec(k * n, -1.0, 1.0);
            let c0 = r.vec(m * n, -1.0, 1.0);
            // Stored row-major `[m, k]` / `[k, n]`, or transposed (`[k, m]` / `[n, k]`).
            let (ars, acs) = if ta { (1, m) } else { (k, 1) };
            let (brs, bcs) = if tb { (1, k) } else { (n, 1) };
            let op = |p: &mut [f32], rs, cs| Operand {
                ptr: SendPtr(p.as_mut_ptr()),
                rs,
                cs,
            };
            let outs: Vec<Vec<f32>> = variants
                .iter()
                .map(|product| {
                    let mut c = c0.clone();
                    product(
                        m,
                        k,
                        n,
                        op(&mut a, ars, acs),
                        op(&mut b, brs, bcs),
                        beta,
                        op(&mut c, n, 1),
                    );
                    c
                })
                .collect();
            let want: Vec<f64> = (0..m * n)
                .map(|e| {
                    let (i, j) = (e / n, e % n);
                    let dot: f64 = (0..k)
                        .map(|p| a[i * ars + p * acs] as f64 * b[p * brs + j * bcs] as f64)
                        .sum();
                    dot + beta as f64 * c0[e] as f64
                })
                .collect();
            let what = format!("{what} {m}x{k}x{n} ta={ta} tb={tb} beta={beta}");
            andrea_testkit::tol::matmul(k)
                .check(&what, &outs[0], &want)
                .unwrap();
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            for (i, o) in outs.iter().enumerate().skip(1) {
                assert_eq!(
                    bits(&outs[0]),
                    bits(o),
                    "{what}: variant {i} differs from variant 0"
                );
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use andrea_core::{DeviceMemory, MemoryOps, View};

    /// `Σ_p a[i·a_rs + p]·b[p·b_rs + j·b_cs]` in float64, `[m, n]` row-major (`a`
    /// row-major `[m, k]`, `b` at the given strides).
    fn f64_product(
        a: &[f32],
        b: &[f32],
        (m, k, n): (usize, usize, usize),
        b_rs: usize,
        b_cs: usize,
    ) -> Vec<f64> {
        (0..m * n)
            .map(|e| {
                let (i, j) = (e / n, e % n);
                (0..k)
                    .map(|p| a[i * k + p] as f64 * b[p * b_rs + j * b_cs] as f64)
                    .sum()
            })
            .collect()
    }

    fn upload(be: &CpuBackend, v: &[f32]) -> CpuBuffer {
        let buf = be.alloc(v.len()).unwrap();
        be.upload(v, View::whole(&buf)).unwrap();
        buf
    }

    fn download(be: &CpuBackend, buf: &CpuBuffer) -> Vec<f32> {
        let mut v = vec![0.0; buf.len()];
        be.download(View::whole(buf), &mut v).unwrap();
        v
    }

    /// `matmul_gelu_backward` at `k` 128, the size whose product goes to the AVX-512
    /// kernel's shared split ([`GemmKernel::for_gelu_grad`]), as the model calls it (`w`
    /// stored `[n, k]`, read transposed), against a float64 `(dy·w)·GELU'(pre)` with
    /// `GELU'(x) = (1 + tanh u)/2 + x/2·(1 - tanh² u)·√(2/π)·(1 + 3·0.044715·x²)`, `u =
    /// √(2/π)·(x + 0.044715·x³)`; on 1, 2 and 3 threads, which must agree bit for bit.
    #[test]
    fn gelu_grad_product_matches_the_f64_product_on_every_thread_count() {
        let (m, k, n) = (300, 128, 150);
        let want_kernel = if crate::simd::has_avx512() {
            GemmKernel::Avx512
        } else {
            GemmKernel::GemmCrate
        };
        assert_eq!(GemmKernel::GemmCrate.for_gelu_grad(k), want_kernel);
        assert_eq!(
            GemmKernel::GemmCrate.for_gelu_grad(768),
            GemmKernel::GemmCrate
        );
        let mut r = andrea_testkit::random::Rand::new(12);
        // `w` within ±1/k, so that |dy·w| <= 1 as `tol::matmul_gelu_backward` assumes.
        let (dy, w, pre) = (
            r.vec(m * k, -1.0, 1.0),
            r.vec(n * k, -1.0 / k as f32, 1.0 / k as f32),
            r.vec(m * n, -4.0, 4.0),
        );
        let gelu_grad = |x: f64| {
            let c = (2.0 / std::f64::consts::PI).sqrt();
            let t = (c * (x + 0.044715 * x * x * x)).tanh();
            0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * c * (1.0 + 3.0 * 0.044715 * x * x)
        };
        let want: Vec<f64> = f64_product(&dy, &w, (m, k, n), 1, k)
            .iter()
            .zip(&pre)
            .map(|(dot, &x)| dot * gelu_grad(x as f64))
            .collect();
        let run = |threads: usize| {
            let be = CpuBackend::with_threads(threads).unwrap();
            let up = |v: &[f32]| upload(&be, v);
            let (dyb, wb, preb, dpre) = (up(&dy), up(&w), up(&pre), be.alloc(m * n).unwrap());
            be.matmul_gelu_backward(
                View::new(&dyb, 0, [m, k]).mat(),
                View::new(&wb, 0, [n, k]).mat().t(),
                View::new(&preb, 0, [m, n]),
                View::new(&dpre, 0, [m, n]),
            )
            .unwrap();
            download(&be, &dpre)
        };
        let one = run(1);
        andrea_testkit::tol::matmul_gelu_backward(k)
            .check(&format!("matmul_gelu_backward {m}x{k}x{n}"), &one, &want)
            .unwrap();
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        for threads in [2, 3] {
            assert!(
                bits(&one) == bits(&run(threads)),
                "1 and {threads} threads differ"
            );
        }
    }

    /// The tiled path of products with a bias or GELU: `matmul` and `matmul_add` with a
    /// bias, and `linear_gelu`, on 2 x 2 tiles of [`FUSED_TILE`] with ragged last ones,
    /// against a float64 product (`out` against `GELU(pre) = x/2·(1 + tanh(√(2/π)·(x +
    /// 0.044715·x³)))`), on 1 and 2 threads, which must agree bit for bit.
    #[test]
    fn tiled_bias_and_gelu_match_the_f64_product_on_ragged_tiles() {
        let (rows, cols) = FUSED_TILE;
        let (m, k, n) = (rows + 37, 45, cols + 19);
        let mut r = andrea_testkit::random::Rand::new(11);
        let (a, b, bias, c0) = (
            r.vec(m * k, -1.0, 1.0),
            r.vec(k * n, -1.0, 1.0),
            r.vec(n, -1.0, 1.0),
            r.vec(m * n, -1.0, 1.0),
        );
        let product: Vec<f64> = f64_product(&a, &b, (m, k, n), n, 1)
            .iter()
            .enumerate()
            .map(|(e, dot)| dot + bias[e % n] as f64)
            .collect();
        let gelu = |x: f64| {
            let c = (2.0 / std::f64::consts::PI).sqrt();
            0.5 * x * (1.0 + (c * (x + 0.044715 * x * x * x)).tanh())
        };
        let run = |threads: usize| {
            let be = CpuBackend::with_threads(threads).unwrap();
            let up = |v: &[f32]| upload(&be, v);
            let down = |buf: &CpuBuffer| download(&be, buf);
            let (a, b, bias) = (up(&a), up(&b), up(&bias));
            let (am, bm) = (
                View::new(&a, 0, [m, k]).mat(),
                View::new(&b, 0, [k, n]).mat(),
            );
            let bias = View::whole(&bias);
            let (set, add) = (be.alloc(m * n).unwrap(), up(&c0));
            be.matmul(am, bm, Some(bias), View::new(&set, 0, [m, n]).mat())
                .unwrap();
            be.matmul_add(am, bm, Some(bias), View::new(&add, 0, [m, n]).mat())
                .unwrap();
            let (pre, out) = (be.alloc(m * n).unwrap(), be.alloc(m * n).unwrap());
            be.linear_gelu(
                am,
                bm,
                bias,
                View::new(&pre, 0, [m, n]),
                View::new(&out, 0, [m, n]),
            )
            .unwrap();
            [down(&set), down(&add), down(&pre), down(&out)]
        };
        let one = run(1);
        let what = |name: &str| format!("{name} {m}x{k}x{n}");
        let tol = andrea_testkit::tol::matmul(k);
        tol.check(&what("matmul + bias"), &one[0], &product)
            .unwrap();
        let added: Vec<f64> = product
            .iter()
            .zip(&c0)
            .map(|(p, &c)| p + c as f64)
            .collect();
        tol.check(&what("matmul_add + bias"), &one[1], &added)
            .unwrap();
        tol.check(&what("linear_gelu pre"), &one[2], &product)
            .unwrap();
        let gelu_ref: Vec<f64> = product.iter().map(|&x| gelu(x)).collect();
        andrea_testkit::tol::gelu()
            .plus(tol, 1.2)
            .check(&what("linear_gelu out"), &one[3], &gelu_ref)
            .unwrap();
        let bits =
            |v: &[Vec<f32>; 4]| -> Vec<u32> { v.iter().flatten().map(|x| x.to_bits()).collect() };
        assert!(bits(&one) == bits(&run(2)), "1 and 2 threads differ");
    }

    #[test]
    fn split_covers_everything_in_aligned_blocks() {
        for len in [1, 15, 16, 17, 100, 1024, 1025] {
            for parts in 1..5 {
                let s = split(len, parts);
                assert_eq!(s[0].0, 0);
                assert_eq!(s.last().unwrap().1, len);
                for w in s.windows(2) {
                    assert_eq!(w[0].1, w[1].0);
                    assert_eq!(w[0].0 % BLOCK_ALIGN, 0);
                }
                assert!(s.len() <= parts);
            }
        }
    }

    #[test]
    fn row_major_a_splits_by_columns_transposed_a_by_rows() {
        let d = MatmulDims {
            batch: 1,
            m: 1024,
            k: 768,
            n: 2304,
        };
        let by_cols = blocks(&d, 2, true);
        assert!(by_cols.iter().all(|b| b.r0 == 0 && b.r1 == 1024));
        assert_eq!((by_cols.len(), by_cols[1].c1), (2, 2304));
        let by_rows = blocks(&d, 2, false);
        assert!(by_rows.iter().all(|b| b.c0 == 0 && b.c1 == 2304));
        assert_eq!((by_rows.len(), by_rows[1].r1), (2, 1024));
    }

    #[test]
    fn few_rows_split_by_columns() {
        let d = MatmulDims {
            batch: 1,
            m: 1,
            k: 768,
            n: 8449,
        };
        let b = blocks(&d, 2, true);
        assert_eq!(b.len(), 2);
        assert!(b.iter().all(|b| b.r0 == 0 && b.r1 == 1));
        assert_eq!(b[1].c1, 8449);
    }
}
