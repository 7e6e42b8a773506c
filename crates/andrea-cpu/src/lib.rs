//! # andrea-cpu
//!
//! [`CpuBackend`]: andrea's [`andrea_core::Backend`] on the host. Rayon spreads the work
//! over threads, the `gemm` crate and andrea's own kernels compute the matrix products,
//! and the row ops (LayerNorm, softmax, the loss, GELU, AdamW) are loops compiled once per
//! instruction set and chosen at run time. This page explains how it works; the
//! measurements behind each choice are in `benches/README.md`.
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
//!
//! ## One kernel per job per instruction set
//!
//! The crate builds for baseline x86-64 (or aarch64), so its binaries run anywhere. At
//! start it reads what the CPU supports, its *SIMD level* (`baseline`, `avx2` = AVX2 +
//! FMA, `avx512` = AVX-512 F, VL, DQ, BW; on aarch64 `neon`, NEON with its fused
//! multiply-add, which every aarch64 CPU has), and every job runs the one kernel written
//! for that level. The environment variable `ANDREA_SIMD` caps the level (read once per
//! process: `baseline|avx2|avx512` on x86-64, `baseline|neon` on aarch64), to test or
//! measure the narrower kernels on a wider CPU; `.ci/run` runs the CPU tests under each
//! x86 cap. [`andrea_core::MemoryOps::name`] reports the level and the kernels in use,
//! e.g. `cpu (2 threads, avx2, gemm avx2, attention fused-avx2)`, or `cpu (8 threads,
//! neon, gemm crate, attention blocked)` on ARM.
//!
//! | job | `baseline` | `avx2` | `avx512` | `neon` (aarch64) |
//! |---|---|---|---|---|
//! | matrix products | `gemm` crate | andrea's AVX2 GEMM (`gemm::avx2`) | `gemm` crate | `gemm` crate (NEON) |
//! | `matmul_gelu_backward`, `k` <= 256 | `gemm` crate | andrea's AVX2 GEMM | andrea's AVX-512 GEMM (`gemm::avx512`) | `gemm` crate |
//! | training attention, heads a multiple of 16 | blocked path | fused, 6 x 16 tile | fused, 6 x 32 tile (heads a multiple of 32) | blocked path |
//! | few-row products (generation) | row / column forms | + 4-row AVX2 dot products, the row form in registers | + 16-row AVX-512 dot products | + 4-row NEON dot products, the row form in registers (`F32Mem`) |
//! | few-row products in BF16 (generation) | row / column forms on BF16 weights (`decode::gemv::bf16`) | the same, compiled for AVX2 + FMA | the same as `avx2` | the generic forms |
//! | larger products in BF16 | operands rounded into copies, then the level's FP32 GEMM | the same | the same | the same |
//! | decode attention | generic | 4-row AVX2 dots, AVX2 weighted sum (`F32Mem`) | 16-row AVX-512 dots, AVX-512 weighted sum | 4-row NEON dots, NEON weighted sum (`F32Mem`) |
//! | softmax, softmax + cross-entropy | generic rows | AVX2 intrinsics | AVX-512 intrinsics | NEON rows (`F32Rows`), the AVX2 kernel's passes |
//! | GELU, GELU' | generic blocks | generic blocks (FMA) | AVX-512 intrinsics (`F32s`) | NEON slices (`F32s`) |
//! | LayerNorm, AdamW, sums, embedding | generic | generic (FMA) | generic (AVX-512 where it pays) | generic (NEON) |
//!
//! "Generic" is one body that `simd::multiversion!` compiles once per level and the
//! compiler vectorises (on aarch64 with NEON, the baseline target's vectors, and fused
//! multiply-adds at the `neon` level); the intrinsics kernels are written once over the
//! vector width where the widths compute the same bits (`simd::lanes::F32s`, implemented
//! for `__m256`, `__m512` and `float32x4_t`; `F32Mem` adds the loads and stores of the
//! kernels whose AVX2 and NEON instances share a body, `F32Rows` the partial vectors and
//! lane sums of NEON's softmax rows). The NEON kernels give the AVX2 kernels' bits
//! wherever both run the same operations (softmax, the loss, GELU, the decode
//! attention, the few-row products): what differs between an x86 and an ARM run is the
//! GEMM. The `gemm` crate
//! picks its micro-kernel from the CPU, not from `ANDREA_SIMD`: that is why the AVX2
//! level has a GEMM of its own, so that an AVX2 measurement times AVX2 products.
//!
//! ## The modules
//!
//! The ground floor, which every op may use and which uses none of them: `buffer` (host
//! memory as backend memory), `views` (checked views as plain pointers that tasks on any
//! thread can address), `simd` (the levels, `multiversion!`, the shared math: `2^z`,
//! GELU, sums in a fixed order; `lanes`: one vector over the widths), `par` (task sizes)
//! and `team` (the spinning team). Above it, one module per job: `gemm`, `attention`,
//! `decode` (generation: the few-row products, one query's attention, a token's whole
//! decoder stack), `norm_softmax_loss`, `elementwise`, `embedding`, `optim`, `reduce`
//! (bias gradient, sum of squares), `memory` (allocation, upload, download) and
//! `interop` (ndarray in and out). This file is the backend's set-up.
//!
//! ## Matrix products
//!
//! Every product goes through one strided GEMM function, so a transpose is a pair of
//! strides and costs nothing. Each element of `C` is computed by the same sequence of
//! floating-point operations whatever block or thread it falls in.
//!
//! * **andrea's AVX2 GEMM** (`gemm::avx2`): BLIS-style packing (`B` in `256 x 3072`
//!   slices, `A` in blocks of 96 rows) and a 6 x 16 register-blocked micro-kernel sized
//!   for a 32 KB L1. On several threads each product is one queue of tasks in dependency
//!   order: each slice of `B` is packed once for all threads into one of two shared
//!   buffers, then multiplied in tasks of 96 rows of `C` that the threads take as they
//!   free up, the next slice's packing starting while this one's last tasks run. No
//!   operand is packed twice, and no thread waits on a fixed share of another's work.
//!   The bias, `GELU` and `GELU'` of the fused ops are applied to each register tile of
//!   `C` before its one store, with the bits of separate passes.
//! * **The `gemm` crate** runs one single-threaded call per block of `C`, one block per
//!   thread: column blocks when `A` is row-major, row blocks when it is transposed (the
//!   `dW = xᵀ·dy` products). A product with a bias or a GELU is cut instead into fixed
//!   256 x 128 tiles of `C`, each given its bias and GELU while it is in cache.
//! * **andrea's AVX-512 GEMM** (`gemm::avx512`, a 14 x 32 micro-kernel, `B` packed once
//!   per block for all threads) runs `matmul_gelu_backward` at small `k` on the AVX-512
//!   level: there the product is short beside the reads of `pre`, and its row blocks
//!   multiply by `GELU'(pre)` while they are in cache.
//! * **Few rows** (generation: one token per sequence, up to 8 sequences): a
//!   bandwidth-bound path streams each weight matrix once in long contiguous runs on
//!   every thread, without packing (`decode::gemv`). The tied output layer's dot-product
//!   form runs sixteen rows of the embedding at a time with AVX-512 (four with AVX2):
//!   independent FMA chains and one shared transposing reduction that keeps each dot
//!   product's bits.
//!
//! ## BF16 precision
//!
//! [`CpuBackend::with_precision`]`(MatmulPrecision::Bf16)` gives `--precision bf16` its
//! meaning on every backend (`andrea_core::precision`): each product's operands rounded
//! to BF16 (nearest even), FP32 sums. What it is for on a CPU today is **decoding**,
//! which is bound by streaming the weights: the model offers its parameters to
//! `keep_bf16_weights` when it makes a KV cache, the backend keeps a BF16 copy
//! (`bf16_copies`, made once, dropped by any op that writes the weights), and the
//! few-row products (`decode::gemv::bf16`) read it, half the bytes of the FP32 weights.
//! Widening a BF16 weight is exact and costs a zero-extending load and a shift, which the
//! compiler vectorises on every x86-64 level (AVX2: eight weights per instruction), so
//! this needs no BF16 instruction. A product of two BF16 values is exact in FP32, so the
//! only rounding is the FP32 sums': every level gives the same bits, for any thread
//! count, with or without the copy (a product whose weights have no copy rounds them as
//! it reads them).
//!
//! In BF16 the decode paths that fuse a block's half into one job (`decode` module) step
//! aside for the fine ops, whose products read the copy. A product of more rows (the
//! prompt's prefill) rounds both operands into contiguous copies and runs the FP32 GEMM
//! on them: the same BF16 products, at FP32 speed plus a pass over the operands. The
//! attention's own products (`q·kᵀ`, `P·v`) stay FP32. Training in BF16 needs BF16
//! matrix instructions (AMX's `tdpbf16ps`, AVX512-BF16's `vdpbf16ps`), for which this
//! crate has no kernels yet: the `andrea` binary refuses `train --precision bf16` on the
//! CPU, saying what the CPU has ([`bf16_hardware`]).
//!
//! ## Attention
//!
//! One task per batch entry and head; only a log-sum-exp per query row is kept for the
//! backward pass, not the `[B, H, T, T]` probabilities. Where the level has AVX2 + FMA and
//! the head size is a multiple of 16, the fused kernel (`attention::fused`) packs `kᵀ`,
//! `vᵀ`, `v` and `k` once per head, takes six queries at a time over only the keys they
//! see (`S = q·kᵀ`, the softmax in place, `out = P·v`), and in the backward pass keeps
//! the probabilities and `dS` of 64 queries while `dv` and `dk` sum over them, all on one
//! register tile: 6 x 16, or 6 x 32 on AVX-512 with the same chains and the same bits.
//! Its forward gives the blocked path's bits. Elsewhere the blocked path runs: blocks of
//! 64 queries, their products on the GEMM. A decoded token's attention (one query per
//! sequence) is dot products, a softmax row and a weighted sum of the values per head,
//! with no GEMM call (`decode::attention`).
//!
//! ## Generation
//!
//! Decoding's small parallel ops go through a spinning team (`team`) instead of rayon's
//! fork/join: the pool's other workers, once called, spin on one shared word between ops
//! for up to 300 µs, so a part reaches them in the time a cache line takes to cross
//! cores. For a model whose block halves hold at most 2^18 weights each, one token's
//! blocks are one team job (`decode`, `DecodeOps::decode_blocks`): each stage's tasks
//! (the QKV product's row chunks, the heads' attention, the residual add with its
//! LayerNorm, the MLP's bands) are claimed by whichever thread comes first, and a thread
//! waits only where the next stage needs all of the last. What the stack's argument
//! checks passed is remembered (`decode::check_memo`): a generation's views are checked
//! in full once every 64 tokens, and a call passes or fails exactly as a full check
//! would.
//!
//! ## Row ops
//!
//! Every exponential is `2^z` by a degree-6 polynomial (relative error below 2.5e-7),
//! with `log2 e` folded into the caller's constants. Softmax and softmax + cross-entropy
//! take a task's rows at once and overlap them: the next row's maximum runs before this
//! row's exponentials. LayerNorm is one pass per row after its statistics, and sums the
//! next row's squared deviations in the loop that writes this row's output. Softmax +
//! cross-entropy computes the loss and the gradient with one write per element,
//! optionally overwriting the logits.
//!
//! ## Memory and threads
//!
//! * **Huge pages**: every buffer of 8 MiB or more is advised transparent huge pages
//!   (`madvise(MADV_HUGEPAGE)`, Linux) before its first write, so streaming the weights,
//!   gradients and optimizer moments takes no TLB miss and no prefetcher restart every
//!   4 KiB. `ANDREA_HUGEPAGES=0` turns the advice off.
//! * **Threads**: [`CpuBackend::new`] uses rayon's global pool, [`CpuBackend::with_threads`]
//!   its own. Every op starts its parallel work on the calling thread; run a whole step
//!   or generation loop inside [`CpuBackend::install`] so that starting costs nothing
//!   (the `andrea` binary does).
//!
//! ## Determinism
//!
//! Results are bit-identical from run to run *and for any thread count*: work is cut
//! into pieces whose boundaries depend only on the sizes (and, in the embedding backward,
//! on the token ids), every reduction adds in an order fixed by the sizes, and GEMM
//! blocks and tasks never split the inner dimension. `tests/determinism.rs` checks 1, 2
//! and 3 threads. The levels agree with each other up to the last bits of the
//! transcendental functions (FMA where the level has it) and of the products (each GEMM
//! sums in its own order); within a level, every copy of a kernel gives the same bits,
//! which the unit tests check against the generic forms.

// The ground floor: what every op may use, and which uses none of them.
mod buffer;
mod par;
mod simd;
mod team;
mod views;

// The ops, by what they compute.
mod attention;
mod bf16_copies;
mod decode;
mod elementwise;
mod embedding;
mod gemm;
mod interop;
mod memory;
mod norm_softmax_loss;
mod optim;
mod reduce;

use andrea_core::{Error, MatmulPrecision, Result};

pub use buffer::{CpuBuffer, CpuIds};

/// What this CPU has of the BF16 matrix instructions (AMX-BF16's `tdpbf16ps`,
/// AVX512-BF16's `vdpbf16ps`), in words, for a message that refuses BF16 training:
/// e.g. "this CPU has neither AMX-BF16 nor AVX512-BF16".
pub fn bf16_hardware() -> String {
    #[cfg(target_arch = "x86_64")]
    let (amx, avx512) = (
        // CPUID leaf 7, EDX bit 22: AMX-BF16 (its detection macro is unstable in Rust).
        {
            #[allow(unused_unsafe)]
            // SAFETY: CPUID exists on every x86-64 CPU.
            let leaf7 = unsafe { std::arch::x86_64::__cpuid_count(7, 0) };
            leaf7.edx & (1 << 22) != 0
        },
        std::arch::is_x86_feature_detected!("avx512bf16"),
    );
    #[cfg(not(target_arch = "x86_64"))]
    let (amx, avx512) = (false, false);
    match (amx, avx512) {
        (false, false) => "this CPU has neither AMX-BF16 nor AVX512-BF16".into(),
        (true, true) => "this CPU has AMX-BF16 and AVX512-BF16".into(),
        (true, false) => "this CPU has AMX-BF16".into(),
        (false, true) => "this CPU has AVX512-BF16 but not AMX-BF16".into(),
    }
}

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
    /// The products' operand precision ([`CpuBackend::with_precision`]).
    precision: MatmulPrecision,
    /// BF16 copies of weights that products in BF16 precision read (`bf16_copies`).
    bf16_copies: bf16_copies::Bf16Copies,
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
            precision: MatmulPrecision::Fp32,
            bf16_copies: Default::default(),
        }
    }

    /// The same backend with its products' operands in `precision`: `Fp32` (the
    /// default, the exact reference) or `Bf16` (operands rounded to BF16, nearest even,
    /// FP32 sums; see "BF16 precision" in the crate doc). `Tf32` is a CUDA tensor-core
    /// format and is refused.
    pub fn with_precision(mut self, precision: MatmulPrecision) -> Result<Self> {
        if precision == MatmulPrecision::Tf32 {
            return Err(Error::invalid(
                "CpuBackend::with_precision",
                "tf32 is a CUDA tensor-core format: the CPU backend computes in fp32 or bf16",
            ));
        }
        self.precision = precision;
        Ok(self)
    }

    /// The products' operand precision.
    pub fn precision(&self) -> MatmulPrecision {
        self.precision
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
            precision: MatmulPrecision::Fp32,
            bf16_copies: Default::default(),
        })
    }

    /// The same backend with another GEMM kernel (unit tests: same-bits comparisons).
    #[cfg(all(test, target_arch = "x86_64"))]
    pub(crate) fn with_gemm_kernel(mut self, kernel: gemm::GemmKernel) -> Self {
        self.kernel = kernel;
        self
    }

    /// The same backend with another attention path (unit tests: comparisons with the
    /// default).
    #[cfg(all(test, target_arch = "x86_64"))]
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
