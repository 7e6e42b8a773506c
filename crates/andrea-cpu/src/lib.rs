//! # andrea-cpu
//!
//! [`CpuBackend`]: andrea's [`Backend`] on the host, with ndarray-style row kernels,
//! rayon for threads, and one strided GEMM function behind every matrix product.
//!
//! * **GEMM**: a single-threaded kernel on blocks of C that rayon spreads over the
//!   threads (row blocks; column blocks when there are few rows). The kernel is the
//!   `gemm` crate's (AVX-512 where the CPU has it, AVX2 + FMA otherwise, picked at run
//!   time) by default and matrixmultiply's with
//!   [`CpuBackend::with_gemm_kernel`]`(GemmKernel::MatrixMultiply)`; the figures behind
//!   the choice are in `benches/README.md`. Transposes are strides.
//! * **Few rows** (generation: one token per sequence, up to 8 sequences): a
//!   bandwidth-bound path that streams each weight matrix once in long contiguous runs
//!   on every thread, with no packing (`gemv` module).
//! * **Threads**: every op starts its parallel work on the calling thread; run a whole
//!   step or generation loop inside [`CpuBackend::install`] so that start costs nothing
//!   (the `andrea` binary does).
//! * **Fused ops**: attention runs one task per (batch, head) with a thread-local
//!   `T×T` scratch and keeps only the log-sum-exp per row for the backward pass;
//!   LayerNorm is one pass per row after its statistics; softmax + cross-entropy
//!   computes loss and gradient in one pass, optionally overwriting the logits.
//! * **SIMD**: the crate builds for baseline x86-64; hot loops are compiled a second time
//!   for AVX2 + FMA, some (measured faster) a third time for AVX-512, and the copy the CPU
//!   supports is chosen at run time (the `simd` module docs). Softmax, softmax +
//!   cross-entropy and GELU have AVX-512 kernels written with intrinsics (`avx512`
//!   module: masked tails, `vscalefps`, tree sums). The copies give the same bits. The
//!   environment variable `ANDREA_SIMD=avx2` (or `baseline`, `avx512`) caps the level
//!   the kernels use, read once per process, to test or measure the narrower copies on a
//!   wider CPU; [`Backend::name`] reports the level in use.
//! * **Determinism**: results are bit-identical from run to run *and for any thread
//!   count*: work is cut into pieces whose boundaries depend only on the sizes, every
//!   reduction adds in an order fixed by the sizes, and GEMM blocks never split the
//!   inner dimension. Tests check this with 1 and 2 threads.
//!
//! ```
//! use andrea_core::{Backend, View};
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

mod attention;
#[cfg(target_arch = "x86_64")]
mod avx512;
mod buffer;
mod elementwise;
mod embedding;
mod gemm;
mod gemv;
mod interop;
mod layernorm;
mod optim;
mod par;
mod reduce;
mod simd;
mod softmax;

use andrea_core::check::{self, Region};
use andrea_core::{
    AdamWStep, AttentionShape, Backend, Error, HeadsOf, Ids, Mat, Result, Tensor, View,
};

pub use buffer::{CpuBuffer, CpuIds};
pub use gemm::GemmKernel;

use buffer::{read, write};

/// The CPU backend. Cheap to create; [`CpuBackend::with_threads`] gives it its own
/// thread pool, [`CpuBackend::new`] uses rayon's global pool (`RAYON_NUM_THREADS` or
/// one thread per core).
pub struct CpuBackend {
    pool: Option<rayon::ThreadPool>,
    kernel: GemmKernel,
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
            kernel: GemmKernel::default(),
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
            kernel: GemmKernel::default(),
        })
    }

    /// The same backend with another GEMM kernel (the default is the one measured
    /// fastest; both are exact-to-f32-rounding implementations of the same product).
    pub fn with_gemm_kernel(mut self, kernel: GemmKernel) -> Self {
        self.kernel = kernel;
        self
    }

    /// The GEMM kernel in use.
    pub fn gemm_kernel(&self) -> GemmKernel {
        self.kernel
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
    /// use andrea_core::{Backend, View};
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

impl CpuBackend {
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
        let g = gemm::Gemm::new(&a, &b, bias, &c, accumulate, d, self.kernel);
        self.run(|| g.run());
        Ok(())
    }
}

impl Backend for CpuBackend {
    type Buffer = CpuBuffer;
    type IdBuffer = CpuIds;

    fn name(&self) -> String {
        format!("cpu ({} threads, {})", self.threads(), simd::level().name())
    }

    fn alloc(&self, len: usize) -> Result<CpuBuffer> {
        Ok(CpuBuffer::zeros(len))
    }

    fn alloc_ids(&self, len: usize) -> Result<CpuIds> {
        Ok(CpuIds::zeros(len))
    }

    fn upload(&self, src: &[f32], dst: Tensor<'_, Self>) -> Result<()> {
        check::transfer("upload", &dst, src.len())?;
        // SAFETY: checked in bounds; `src` is host memory, not a backend buffer.
        unsafe { write(&dst) }.copy_from_slice(src);
        Ok(())
    }

    fn download(&self, src: Tensor<'_, Self>, dst: &mut [f32]) -> Result<()> {
        check::transfer("download", &src, dst.len())?;
        // SAFETY: checked in bounds; no op is running on this thread's buffer.
        dst.copy_from_slice(unsafe { read(&src) });
        Ok(())
    }

    fn upload_ids(&self, src: &[u32], dst: Ids<'_, Self>) -> Result<()> {
        check::transfer("upload_ids", &dst, src.len())?;
        // SAFETY: as in `upload`.
        unsafe { write(&dst) }.copy_from_slice(src);
        Ok(())
    }

    fn fill(&self, dst: Tensor<'_, Self>, value: f32) -> Result<()> {
        check::view("fill", "dst", &dst)?;
        // SAFETY: checked in bounds; the only argument.
        let y = unsafe { write(&dst) };
        self.run(|| elementwise::fill(y, value));
        Ok(())
    }

    fn copy(&self, src: Mat<'_, Self>, dst: Mat<'_, Self>) -> Result<()> {
        check::copy(&src, &dst)?;
        let (ps, pd) = (buffer::SendPtr::of(&src), buffer::SendPtr::of(&dst));
        for b in 0..src.batch {
            for i in 0..src.rows {
                for j in 0..src.cols {
                    // SAFETY: both matrices checked in bounds and disjoint.
                    unsafe {
                        *pd.0.add(dst.at(b, i, j) - dst.offset) =
                            *ps.0.add(src.at(b, i, j) - src.offset);
                    }
                }
            }
        }
        Ok(())
    }

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
        let (n, m) = check::bias_backward(&dout, &dbias)?;
        // SAFETY: checked in bounds and disjoint.
        let (g, db) = unsafe { (read(&dout), write(&dbias)) };
        self.run(|| reduce::bias_backward(g, db, n, m));
        Ok(())
    }

    fn add(&self, a: Tensor<'_, Self>, b: Tensor<'_, Self>, out: Tensor<'_, Self>) -> Result<()> {
        check::elementwise("add", &[("a", &a), ("b", &b)], ("out", &out), true)?;
        let other = if out.same_as(&a) {
            Some(b)
        } else if out.same_as(&b) {
            Some(a)
        } else {
            None
        };
        match other {
            // out is a (or b), and a == b: out = 2·out.
            Some(x) if x.same_as(&out) => {
                // SAFETY: the only distinct memory is `out`.
                let y = unsafe { write(&out) };
                self.run(|| elementwise::scale(y, 2.0));
            }
            Some(x) => {
                // SAFETY: `x` is disjoint from `out` (checked).
                let (y, x) = unsafe { (write(&out), read(&x)) };
                self.run(|| elementwise::add_in_place(y, x));
            }
            None => {
                // SAFETY: all three checked disjoint.
                let (y, a, b) = unsafe { (write(&out), read(&a), read(&b)) };
                self.run(|| elementwise::add(a, b, y));
            }
        }
        Ok(())
    }

    fn scale(&self, x: Tensor<'_, Self>, alpha: f32) -> Result<()> {
        check::view("scale", "x", &x)?;
        // SAFETY: the only argument.
        let y = unsafe { write(&x) };
        self.run(|| elementwise::scale(y, alpha));
        Ok(())
    }

    fn gelu(&self, x: Tensor<'_, Self>, out: Tensor<'_, Self>) -> Result<()> {
        check::elementwise("gelu", &[("x", &x)], ("out", &out), true)?;
        if out.same_as(&x) {
            // SAFETY: in place on one checked view.
            let y = unsafe { write(&out) };
            self.run(|| elementwise::gelu_in_place(y));
        } else {
            // SAFETY: checked disjoint.
            let (y, x) = unsafe { (write(&out), read(&x)) };
            self.run(|| elementwise::gelu(x, y));
        }
        Ok(())
    }

    fn gelu_backward(
        &self,
        x: Tensor<'_, Self>,
        dout: Tensor<'_, Self>,
        dx: Tensor<'_, Self>,
    ) -> Result<()> {
        const OP: &str = "gelu_backward";
        check::elementwise(OP, &[("x", &x), ("dout", &dout)], ("dx", &dx), true)?;
        check::disjoint(OP, &[Region::of("dx", &dx)], &[Region::of("x", &x)], false)?;
        if dx.same_as(&dout) {
            // SAFETY: `dx` is `dout` exactly and disjoint from `x`.
            let (d, x) = unsafe { (write(&dx), read(&x)) };
            self.run(|| elementwise::gelu_backward_in_place(x, d));
        } else {
            // SAFETY: checked disjoint.
            let (d, x, g) = unsafe { (write(&dx), read(&x), read(&dout)) };
            self.run(|| elementwise::gelu_backward(x, g, d));
        }
        Ok(())
    }

    fn layernorm(
        &self,
        x: Tensor<'_, Self>,
        gamma: Tensor<'_, Self>,
        beta: Tensor<'_, Self>,
        out: Tensor<'_, Self>,
        mean: Tensor<'_, Self>,
        rstd: Tensor<'_, Self>,
        eps: f32,
    ) -> Result<()> {
        check::layernorm(&x, &gamma, &beta, &out, &mean, &rstd, eps)?;
        // SAFETY: outputs checked disjoint from each other and from the inputs.
        let (x, g, b, o, m, r) = unsafe {
            (
                read(&x),
                read(&gamma),
                read(&beta),
                write(&out),
                write(&mean),
                write(&rstd),
            )
        };
        self.run(|| layernorm::forward(x, g, b, o, m, r, eps));
        Ok(())
    }

    fn layernorm_backward(
        &self,
        x: Tensor<'_, Self>,
        gamma: Tensor<'_, Self>,
        mean: Tensor<'_, Self>,
        rstd: Tensor<'_, Self>,
        dout: Tensor<'_, Self>,
        dx: Tensor<'_, Self>,
        dgamma: Tensor<'_, Self>,
        dbeta: Tensor<'_, Self>,
    ) -> Result<()> {
        check::layernorm_backward(&x, &gamma, &mean, &rstd, &dout, &dx, &dgamma, &dbeta)?;
        // SAFETY: outputs checked disjoint from each other and from the inputs.
        let (x, g, m, r, d, dx, dg, db) = unsafe {
            (
                read(&x),
                read(&gamma),
                read(&mean),
                read(&rstd),
                read(&dout),
                write(&dx),
                write(&dgamma),
                write(&dbeta),
            )
        };
        self.run(|| layernorm::backward(x, g, m, r, d, dx, dg, db));
        Ok(())
    }

    fn softmax(
        &self,
        x: Tensor<'_, Self>,
        out: Tensor<'_, Self>,
        scale: f32,
        causal_offset: Option<usize>,
    ) -> Result<()> {
        let d = check::softmax(&x, &out, scale, causal_offset)?;
        let (q, k) = (d.q_len, d.k_len);
        if out.same_as(&x) {
            // SAFETY: in place on one checked view.
            let y = unsafe { write(&out) };
            self.run(|| softmax::softmax(None, y, q, k, scale, causal_offset));
        } else {
            // SAFETY: checked disjoint.
            let (y, x) = unsafe { (write(&out), read(&x)) };
            self.run(|| softmax::softmax(Some(x), y, q, k, scale, causal_offset));
        }
        Ok(())
    }

    fn softmax_backward(
        &self,
        probs: Tensor<'_, Self>,
        dprobs: Tensor<'_, Self>,
        dx: Tensor<'_, Self>,
        scale: f32,
    ) -> Result<()> {
        let (_, k) = check::softmax_backward(&probs, &dprobs, &dx)?;
        if dx.same_as(&dprobs) {
            // SAFETY: `dx` is `dprobs` exactly, disjoint from `probs`.
            let (p, d) = unsafe { (read(&probs), write(&dx)) };
            self.run(|| softmax::softmax_backward(p, None, d, k, scale));
        } else {
            // SAFETY: checked disjoint.
            let (p, dp, d) = unsafe { (read(&probs), read(&dprobs), write(&dx)) };
            self.run(|| softmax::softmax_backward(p, Some(dp), d, k, scale));
        }
        Ok(())
    }

    fn embedding(
        &self,
        ids: Ids<'_, Self>,
        wte: Tensor<'_, Self>,
        wpe: Tensor<'_, Self>,
        out: Tensor<'_, Self>,
        pos_offset: usize,
    ) -> Result<()> {
        let d = check::embedding(&ids, &wte, &wpe, &out, pos_offset)?;
        // SAFETY: checked in bounds and disjoint.
        let (ids, wte, wpe, out) = unsafe { (read(&ids), read(&wte), read(&wpe), write(&out)) };
        check::ids_values("embedding", "ids", ids, d.vocab)?;
        self.run(|| embedding::forward(ids, wte, wpe, out, d, pos_offset));
        Ok(())
    }

    fn embedding_backward(
        &self,
        ids: Ids<'_, Self>,
        dout: Tensor<'_, Self>,
        dwte: Tensor<'_, Self>,
        dwpe: Tensor<'_, Self>,
    ) -> Result<()> {
        let d = check::embedding_backward(&ids, &dout, &dwte, &dwpe)?;
        // SAFETY: checked in bounds and disjoint.
        let (ids, g, dwte, dwpe) = unsafe { (read(&ids), read(&dout), write(&dwte), write(&dwpe)) };
        check::ids_values("embedding_backward", "ids", ids, d.vocab)?;
        self.run(|| embedding::backward(ids, g, dwte, dwpe, d));
        Ok(())
    }

    fn softmax_cross_entropy(
        &self,
        logits: Tensor<'_, Self>,
        targets: Ids<'_, Self>,
        vocab: usize,
        losses: Tensor<'_, Self>,
        dlogits: Option<Tensor<'_, Self>>,
        grad_scale: f32,
    ) -> Result<()> {
        let (_, vp) =
            check::softmax_cross_entropy(&logits, &targets, vocab, &losses, dlogits.as_ref())?;
        // SAFETY: checked in bounds; `losses` disjoint from the rest; `dlogits` either
        // disjoint from `logits` or exactly it (then only `logits` is borrowed, mutably).
        let (t, l) = unsafe { (read(&targets), write(&losses)) };
        check::target_values("softmax_cross_entropy", t, vocab)?;
        match dlogits {
            None => {
                let x = unsafe { write(&logits) };
                self.run(|| softmax::cross_entropy(x, t, vocab, vp, l, None, grad_scale));
            }
            Some(d) if d.same_as(&logits) => {
                let x = unsafe { write(&logits) };
                self.run(|| softmax::cross_entropy(x, t, vocab, vp, l, Some(None), grad_scale));
            }
            Some(d) => {
                let (x, g) = unsafe { (write(&logits), write(&d)) };
                self.run(|| softmax::cross_entropy(x, t, vocab, vp, l, Some(Some(g)), grad_scale));
            }
        }
        Ok(())
    }

    fn sum_squares(&self, x: Tensor<'_, Self>) -> Result<f64> {
        check::view("sum_squares", "x", &x)?;
        // SAFETY: checked in bounds.
        let x = unsafe { read(&x) };
        Ok(self.run(|| reduce::sum_squares(x)))
    }

    fn adamw(
        &self,
        param: Tensor<'_, Self>,
        grad: Tensor<'_, Self>,
        m: Tensor<'_, Self>,
        v: Tensor<'_, Self>,
        step: &AdamWStep,
    ) -> Result<()> {
        check::adamw(&param, &grad, &m, &v, step)?;
        // SAFETY: checked disjoint.
        let (p, g, m, v) = unsafe { (write(&param), read(&grad), write(&m), write(&v)) };
        self.run(|| optim::adamw(p, g, m, v, step));
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
        const OP: &str = "linear_gelu";
        let d = check::matmul(&x, &w, Some(&bias), &pre.mat())?;
        check::elementwise(OP, &[("pre", &pre)], ("out", &out), false)?;
        check::disjoint(
            OP,
            &[Region::of("out", &out)],
            &[
                Region::of_matrix("x", &x),
                Region::of_matrix("w", &w),
                Region::of("bias", &bias),
            ],
            false,
        )?;
        // SAFETY: `bias` checked in bounds; `out` checked disjoint from every operand.
        let bias = unsafe { read(&bias) };
        let out_ptr = buffer::SendPtr(unsafe { write(&out) }.as_mut_ptr());
        let g = unsafe {
            gemm::Gemm::new(&x, &w, Some(bias), &pre.mat(), false, d, self.kernel)
                .with_gelu_into(out_ptr)
        };
        self.run(|| g.run());
        Ok(())
    }

    fn residual_layernorm(
        &self,
        a: Tensor<'_, Self>,
        b: Tensor<'_, Self>,
        residual: Tensor<'_, Self>,
        gamma: Tensor<'_, Self>,
        beta: Tensor<'_, Self>,
        out: Tensor<'_, Self>,
        mean: Tensor<'_, Self>,
        rstd: Tensor<'_, Self>,
        eps: f32,
    ) -> Result<()> {
        const OP: &str = "residual_layernorm";
        check::elementwise(OP, &[("a", &a), ("b", &b)], ("residual", &residual), true)?;
        check::layernorm(&residual, &gamma, &beta, &out, &mean, &rstd, eps)?;
        check::disjoint(
            OP,
            &[
                Region::of("out", &out),
                Region::of("mean", &mean),
                Region::of("rstd", &rstd),
            ],
            &[Region::of("a", &a), Region::of("b", &b)],
            false,
        )?;
        // `residual` is `a`, `b`, or its own memory (checked); the add is done in place
        // when it aliases, so only `residual` is borrowed mutably.
        let other = if residual.same_as(&a) {
            Some(b)
        } else if residual.same_as(&b) {
            Some(a)
        } else {
            None
        };
        // SAFETY: outputs checked disjoint from each other and from the inputs, except
        // `residual`, which is exactly `a` or `b` when `other` is set.
        let (res, g, bt, o, m, r) = unsafe {
            (
                write(&residual),
                read(&gamma),
                read(&beta),
                write(&out),
                write(&mean),
                write(&rstd),
            )
        };
        let src = match other {
            Some(x) if x.same_as(&residual) => layernorm::ResidualSrc::Double,
            Some(x) => layernorm::ResidualSrc::AddInto(unsafe { read(&x) }),
            None => layernorm::ResidualSrc::Sum(unsafe { read(&a) }, unsafe { read(&b) }),
        };
        self.run(|| layernorm::residual_forward(src, res, g, bt, o, m, r, eps));
        Ok(())
    }

    fn attention_workspace_len(&self, s: AttentionShape) -> usize {
        s.batch * s.heads * s.q_len
    }

    fn attention_backward_scratch_len(&self, _: AttentionShape) -> usize {
        0
    }

    fn attention_forward(
        &self,
        q: HeadsOf<'_, Self>,
        k: HeadsOf<'_, Self>,
        v: HeadsOf<'_, Self>,
        out: HeadsOf<'_, Self>,
        workspace: Tensor<'_, Self>,
        pos_offset: usize,
    ) -> Result<()> {
        let d = check::attention_forward(&q, &k, &v, &out, &workspace, pos_offset, |s| {
            self.attention_workspace_len(s)
        })?;
        let lse = workspace.slice(0, [d.batch * d.heads * d.q_len]);
        // SAFETY: the workspace is checked disjoint from every other argument.
        let lse = unsafe { write(&lse) };
        let [q, k, v, out] = [q, k, v, out].map(|h| attention::HeadsPtr::of(&h));
        self.run(|| attention::forward(q, k, v, out, lse, pos_offset, d, self.kernel));
        Ok(())
    }

    fn attention_backward(
        &self,
        q: HeadsOf<'_, Self>,
        k: HeadsOf<'_, Self>,
        v: HeadsOf<'_, Self>,
        out: HeadsOf<'_, Self>,
        dout: HeadsOf<'_, Self>,
        dq: HeadsOf<'_, Self>,
        dk: HeadsOf<'_, Self>,
        dv: HeadsOf<'_, Self>,
        workspace: Tensor<'_, Self>,
        scratch: Tensor<'_, Self>,
    ) -> Result<()> {
        let shape = AttentionShape {
            batch: q.batch,
            heads: q.heads,
            q_len: q.seq,
            k_len: k.seq,
        };
        let d = check::attention_backward(
            &q,
            &k,
            &v,
            &out,
            &dout,
            &dq,
            &dk,
            &dv,
            &workspace,
            &scratch,
            self.attention_workspace_len(shape),
            0,
        )?;
        let lse: View<'_, CpuBuffer> = workspace.slice(0, [d.batch * d.heads * d.q_len]);
        // SAFETY: read-only here; outputs are checked disjoint from it.
        let lse = unsafe { read(&lse) };
        let heads = [q, k, v, dout, dq, dk, dv].map(|h| attention::HeadsPtr::of(&h));
        self.run(|| attention::backward(heads, lse, d, self.kernel));
        Ok(())
    }
}
