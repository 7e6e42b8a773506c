//! # andrea-cpu
//!
//! [`CpuBackend`]: andrea's [`andrea_core::Backend`] on the host, with ndarray-style row
//! kernels, rayon for threads, and one strided GEMM function behind every matrix product.
//!
//! * **GEMM**: single-threaded kernels on blocks of C that rayon spreads over the
//!   threads (row blocks; column blocks when there are few rows), except andrea's AVX2
//!   kernel, which runs each product as one queue of tasks the threads take as they free
//!   up, every operand packed once (`gemm_avx2::sgemm_threads`; the block split stays
//!   selectable as `ANDREA_GEMM=avx2-blocks`). At the AVX-512 level
//!   the default is the `gemm` crate's kernel, which chooses its micro-kernel from the
//!   CPU, not from `ANDREA_SIMD`; at the AVX2 level (the cap `ANDREA_SIMD=avx2`, or an
//!   AVX2-only CPU), andrea's AVX2 + FMA kernel ([`GemmKernel::Avx2`]). andrea's own
//!   AVX-512 kernel ([`GemmKernel::Avx512`], `gemm_avx512` module: BLIS-style packing, a
//!   512-bit register-blocked micro-kernel, masked edges) packs each block of `B` once
//!   and shares the rows of `C` out among the threads; it is selectable, not the default
//!   (it measured behind the `gemm` crate). [`GemmKernel::Avx512Queue`] runs the AVX2
//!   kernel's packing, task queue and in-register epilogues with a 12 x 32 micro-kernel
//!   on 512-bit registers; also selectable, not the default (level with the `gemm` crate
//!   on ANDREA-120M, behind on the tiny model). `ANDREA_GEMM=avx512-queue|avx512|
//!   avx512-blocks|avx2|avx2-blocks|gemm|matrixmultiply` or
//!   [`CpuBackend::with_gemm_kernel`] picks a kernel
//!   ([`GemmKernel::from_env`]); the figures behind the choice are in
//!   `benches/README.md`. Transposes are strides.
//! * **Fused GEMM epilogues**: andrea's AVX2 kernel adds the bias, writes `GELU` and
//!   multiplies by `GELU'` in its micro-kernel, on each tile of C in registers before
//!   its one store (`gemm_avx2::Epilogue`; the same bits as the separate passes): on
//!   ANDREA-120M's products it took the forward's biased products from 149-160 to
//!   167-179 GFLOP/s and `linear_gelu` from 140-150 to 166-167 on two Zen 3 cores
//!   (plain products 176-180), and `linear_gelu` in the training step from 144-151 to
//!   158-159 (benches/results/20261202T2150Z-zen3-epilogue). With the other
//!   kernels a product with a bias or GELU (`linear_gelu`) is cut into
//!   fixed 256 x 128 tiles of C, each given its bias and GELU right after its product,
//!   while it is in L2; `matmul_gelu_backward` at small `k` (at most 256) runs on
//!   andrea's AVX-512 kernel, whose row blocks take `GELU'` in cache
//!   ([`GemmKernel::for_gelu_grad`]). Both fused products of the tiny model's MLP ran
//!   25-45% faster for it (benches/results/20261202T0630Z-train-tiny).
//! * **Few rows** (generation: one token per sequence, up to 8 sequences): a
//!   bandwidth-bound path that streams each weight matrix once in long contiguous runs
//!   on every thread, with no packing (`gemv` module). The tied output layer's
//!   dot-product form runs sixteen rows of the embedding at a time with AVX-512
//!   intrinsics (`gemv_avx512`: sixteen independent FMA chains and one shared
//!   transposing reduction instead of one chain and a horizontal sum per row; the same
//!   bits), and the weights' row form has an AVX-512 copy. A decoded token's attention
//!   (one query per sequence) skips the per-head GEMM calls: dot products, the softmax
//!   row and a weighted sum of the values, on the calling thread when the whole call is
//!   below 2^12 multiply-adds (`attention_decode`). Both share their work out through a
//!   spinning team rather than rayon's fork/join (`team`: ~0.1 µs a handoff against
//!   ~1.4; `ANDREA_TEAM=off` to compare).
//! * **Huge pages**: every buffer of 8 MiB or more is advised transparent huge pages
//!   (`madvise(MADV_HUGEPAGE)`, Linux) before its first write, so streaming the weights,
//!   gradients and optimizer moments takes no TLB miss and no prefetcher restart every
//!   4 KiB. Measured on the build machine (THP in `madvise` mode): decoding ANDREA-120M
//!   +26%, its training step +4%. `ANDREA_HUGEPAGES=0` turns the advice off.
//! * **Threads**: every op starts its parallel work on the calling thread; run a whole
//!   step or generation loop inside [`CpuBackend::install`] so that start costs nothing
//!   (the `andrea` binary does).
//! * **Fused ops**: attention runs one task per (batch, head) and keeps only the
//!   log-sum-exp per row for the backward pass; with AVX2 + FMA and heads a multiple
//!   of 16 it is one intrinsics kernel (`attention_fused`: operands packed once per head,
//!   six queries at a time over the keys they see, tiles of 16 columns, or 32 on
//!   AVX-512; 1.3-1.5x the blocked path on the Zen 3,
//!   benches/results/20261203T0418Z-zen3-fused-attention, 1.2-1.5x on the AVX-512 Zen 5,
//!   benches/results/20261203T1650Z-zen5-attention-zmm), elsewhere blocks of 64
//!   queries with a thread-local scratch and their products on `sgemm`
//!   ([`AttentionProducts`], `ANDREA_ATTENTION_PRODUCTS`);
//!   LayerNorm is one pass per row after its statistics; softmax + cross-entropy
//!   computes loss and gradient with one write per element, optionally overwriting the
//!   logits.
//! * **SIMD**: the crate builds for baseline x86-64; hot loops are compiled a second time
//!   for AVX2 + FMA, some (measured faster) a third time for AVX-512, and the copy the CPU
//!   supports is chosen at run time (the `simd` module docs). Softmax, softmax +
//!   cross-entropy and GELU have AVX-512 kernels written with intrinsics (`avx512`
//!   module: masked tails, `vscalefps`, tree sums), and softmax and softmax +
//!   cross-entropy AVX2 + FMA ones too (`avx2` module). The copies give the same bits. The
//!   environment variable `ANDREA_SIMD=avx2` (or `baseline`, `avx512`) caps the level
//!   the kernels use, read once per process, to test or measure the narrower copies on a
//!   wider CPU; [`andrea_core::MemoryOps::name`] reports the level in use.
//! * **Layout**: each op family of `andrea_core::ops` is implemented in the module that
//!   holds its kernels: `buffer` (memory), `gemm` (linalg: matmul, bias gradient,
//!   `linear_gelu`), `elementwise`, `layernorm`, `softmax` (softmax and the loss),
//!   `embedding`, `optim` and `attention` (with `attention_fused` for the fused AVX2 /
//!   AVX-512 kernel and `attention_decode` for one query per sequence), and `decode`
//!   for generation's decoder stack (`decode_blocks`: one team job for a token of a small
//!   model, its argument checks remembered in `check_memo`) and its two fused halves of a
//!   block (`decode_attention`, `mlp_forward`: one job each where called alone;
//!   `ANDREA_DECODE_FUSED=halves|off` to compare).
//!   This file is the backend's set-up.
//! * **Determinism**: results are bit-identical from run to run *and for any thread
//!   count*: work is cut into pieces whose boundaries depend only on the sizes, every
//!   reduction adds in an order fixed by the sizes, and GEMM blocks never split the
//!   inner dimension. Tests check this with 1 and 2 threads.
//!
//! ```
//! use andrea_core::prelude::*;
//! use andrea_cpu::CpuBackend;
//!
//! let be = CpuBackend::new();
//! let x = be.alloc(4)?;
//! be.upload(&[-1.0, 0.0, 1.0, 2.0], View::whole(&x))?;
//! be.gelu(View::whole(&x), View::whole(&x))?; // in place
//! let mut y = [0.0; 4];
//! be.download(View::whole(&x), &mut y)?;
//! assert!((y[3] - 1.9546).abs() < 1e-4);
//! # Ok::<(), andrea_core::Error>(())
//! ```

// The ground floor: what every op may use, and which uses none of them.
mod buffer;
mod par;
mod simd;
mod team;
mod views;

// The ops, by what they compute.
mod attention;
mod decode;
mod elementwise;
mod embedding;
mod gemm;
mod interop;
mod memory;
mod norm_softmax_loss;
mod optim;
mod reduce;

use andrea_core::{Error, Result};

pub use buffer::{CpuBuffer, CpuIds};

/// The CPU backend. Cheap to create; [`CpuBackend::with_threads`] gives it its own
/// thread pool, [`CpuBackend::new`] uses rayon's global pool (`RAYON_NUM_THREADS` or
/// one thread per core).
pub struct CpuBackend {
    pool: Option<rayon::ThreadPool>,
    /// The GEMM kernel of the kernels' level ([`gemm::GemmKernel::for_level`]).
    kernel: gemm::GemmKernel,
    /// [`attention::path::AttentionPath::DEFAULT`] (tests compare the others with it).
    attention: attention::path::AttentionPath,
    /// What the decoder stack's checks passed (`check_memo`).
    decode_checks: std::sync::Mutex<decode::check_memo::CheckMemo>,
}

impl Default for CpuBackend {
    fn default() -> Self {
        Self::new()
    }
}

impl CpuBackend {
    /// A backend on rayon's global thread pool.
    pub fn new() -> Self {
        CpuBackend {
            pool: None,
            kernel: gemm::GemmKernel::for_level(),
            attention: attention::path::AttentionPath::DEFAULT,
            decode_checks: Default::default(),
        }
    }

    /// A backend with its own pool of `threads` threads (`threads >= 1`).
    pub fn with_threads(threads: usize) -> Result<Self> {
        if threads == 0 {
            return Err(Error::invalid(
                "CpuBackend::with_threads",
                "threads must be >= 1",
            ));
        }
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .thread_name(|i| format!("andrea-cpu-{i}"))
            .build()
            .map_err(|e| Error::Device {
                context: "CpuBackend::with_threads".into(),
                message: e.to_string(),
            })?;
        Ok(CpuBackend {
            pool: Some(pool),
            kernel: gemm::GemmKernel::for_level(),
            attention: attention::path::AttentionPath::DEFAULT,
            decode_checks: Default::default(),
        })
    }

    /// The same backend with another GEMM kernel (unit tests: same-bits comparisons).
    #[cfg(test)]
    pub(crate) fn with_gemm_kernel(mut self, kernel: gemm::GemmKernel) -> Self {
        self.kernel = kernel;
        self
    }

    /// The same backend with another attention path (unit tests: comparisons with the
    /// default).
    #[cfg(test)]
    pub(crate) fn with_attention(mut self, path: attention::path::AttentionPath) -> Self {
        self.attention = path;
        self
    }

    /// What the attention kernels need to know of the products' kernels.
    fn products(&self) -> (gemm::GemmKernel, attention::path::AttentionPath) {
        (self.kernel, self.attention)
    }

    /// Number of threads ops run on.
    pub fn threads(&self) -> usize {
        match &self.pool {
            Some(p) => p.current_num_threads(),
            None => rayon::current_num_threads(),
        }
    }

    /// Runs `f`, typically a whole training step or generation loop, on one of this
    /// backend's worker threads, and returns its result.
    ///
    /// Every op spreads its work over the backend's threads. Called from a thread outside
    /// the pool (say, `main`), each op hands its work over to the pool and sleeps until
    /// it is done: two thread wake-ups, about 10-20 µs, per op. That is nothing next to a
    /// 120M-parameter GEMM but most of the time of a tiny model's step or of one decoded
    /// token. Inside `install`, the ops start on a worker, split their work in place and
    /// take back any part no other worker has picked up, so nothing waits on a wake-up.
    /// The results are the same bit for bit; only the overhead goes.
    ///
    /// ```
    /// use andrea_core::prelude::*;
    /// use andrea_cpu::CpuBackend;
    ///
    /// let be = CpuBackend::with_threads(2)?;
    /// // Buffers are not `Sync`: make them inside, or move them in (`move ||`).
    /// let sum = be.install(|| -> andrea_core::Result<f64> {
    ///     let x = be.alloc(1024)?;
    ///     be.fill(View::whole(&x), 0.5)?; // both ops run inside the pool
    ///     be.sum_squares(View::whole(&x))
    /// })?;
    /// assert_eq!(sum, 256.0);
    /// # Ok::<(), andrea_core::Error>(())
    /// ```
    pub fn install<R: Send>(&self, f: impl FnOnce() -> R + Send) -> R {
        match &self.pool {
            Some(p) => p.install(f),
            // `scope` runs its closure on a worker of the global pool (in place when this
            // thread already is one).
            None => rayon::scope(|_| f()),
        }
    }

    /// Runs `f` on this backend's threads.
    fn run<R: Send>(&self, f: impl FnOnce() -> R + Send) -> R {
        match &self.pool {
            Some(p) => p.install(f),
            None => f(),
        }
    }
}
