//! [`Timed<B>`]: a backend that wraps any backend and times every op.
//!
//! A decorator (burn's pattern): `Timed<B>` implements every op family by calling `B`'s
//! op between two [`MemoryOps::synchronize`] calls, so the clock measures the op and
//! nothing queued before it, and adds the time to the op's [`OpStats`] together with
//! the op's work: FLOPs for the products and attention, bytes moved for the
//! memory-bound ops. The model runs on it unchanged (`Trainer<Timed<B>>`), which is what
//! `andrea bench train --profile` does to print where a real training step spends its
//! time (`andrea_model::bench::train_profile`), and `andrea bench decode --profile` for a
//! decoded token (`decode_profile`, which pauses the counts over the untimed prompt
//! refills between tokens: [`Timed::pause`]).
//!
//! It lives here, in the crate every layer depends on, because it needs nothing but the
//! traits: the model's bench and the CLI use it without a new crate and without knowing
//! a concrete backend. (The other decorator, `Compare<A, B>`, needs the tolerances of
//! `andrea-testkit` and lives there.)
//!
//! Synchronising around every op serialises a GPU's queue, so the step under `Timed` is
//! slower than without it (on the CPU, where ops are synchronous, the cost is two clock
//! reads per op); the per-op times are what each op costs alone.
//!
//! Work is the math's, not a kernel's: a matmul is `2·M·N·K` FLOPs; causal attention
//! counts the visible scores (`4·D` FLOPs per score forward, `8·D` backward; a fused
//! backward that recomputes the probabilities does 25% more); a memory-bound op moves
//! each operand once (an accumulated output is read and written).

use std::cell::{Cell, RefCell};
use std::fmt::Write as _;
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::error::Result;
use crate::ops::{
    AdamWStep, AttentionOps, AttentionShape, DecodeBlockOf, DecodeOps, ElementwiseOps,
    EmbeddingOps, HeadsOf, Ids, LayerNormOps, LinalgOps, LinearOf, LossOps, Mat, MemoryOps,
    OptimOps, SoftmaxOps, Tensor,
};

/// What one op has cost since the last [`Timed::reset`]; the products are counted per
/// shape, each shape a row of its own.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct OpStats {
    pub op: &'static str,
    /// A product's shape, `MxKxN` and the layouts of `A` and `B` (`n` as stored, `t`
    /// transposed: `tn` is `Aᵀ·B`), after `[B] ` for a batch of `B` products; empty for
    /// the other ops.
    pub shape: String,
    pub calls: u64,
    pub seconds: f64,
    /// Floating-point operations of all calls (0 for a memory-bound op).
    pub flops: f64,
    /// Bytes moved by all calls (0 where FLOPs are counted instead).
    pub bytes: f64,
}

/// Every op's [`OpStats`], slowest first, and the wall time they fall in.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Profile {
    pub ops: Vec<OpStats>,
    /// Seconds from [`Timed::reset`] (or creation) to [`Timed::profile`].
    pub wall_s: f64,
}

/// Floats to bytes.
const F32: f64 = 4.0;

#[derive(Clone, Copy)]
enum Work {
    None,
    Flops(f64),
    Bytes(f64),
}

fn floats(n: usize) -> Work {
    Work::Bytes(F32 * n as f64)
}

fn matmul_flops<M>(a: &crate::Matrix<'_, M>, c: &crate::Matrix<'_, M>) -> Work {
    Work::Flops(2.0 * (c.batch * c.rows * c.cols) as f64 * a.cols as f64)
}

/// The [`OpStats::shape`] of the product `C = A·B`: `MxKxN`, then `n` or `t` for each
/// operand (`n`: its rows are contiguous, it is used as stored).
fn product_shape<M>(
    a: &crate::Matrix<'_, M>,
    b: &crate::Matrix<'_, M>,
    c: &crate::Matrix<'_, M>,
) -> String {
    let layout = |m: &crate::Matrix<'_, M>| if m.col_stride == 1 { 'n' } else { 't' };
    let batch = if c.batch > 1 {
        format!("[{}] ", c.batch)
    } else {
        String::new()
    };
    format!(
        "{batch}{}x{}x{} {}{}",
        c.rows,
        a.cols,
        c.cols,
        layout(a),
        layout(b)
    )
}

/// Scores a causal attention computes: query `i` sees `pos_offset + i + 1` keys.
fn visible_scores<M>(q: &crate::Heads<'_, M>, pos_offset: usize) -> f64 {
    let t = q.seq as f64;
    (q.batch * q.heads) as f64 * (t * pos_offset as f64 + t * (t + 1.0) / 2.0)
}

/// A backend that times every op of `B`; see the module docs.
pub struct Timed<B> {
    inner: B,
    stats: RefCell<Vec<OpStats>>,
    since: Cell<Instant>,
    /// When [`Timed::pause`] was called, while paused.
    paused_at: Cell<Option<Instant>>,
    /// Time spent paused since `since`, left out of the wall time.
    paused: Cell<Duration>,
}

impl<B: MemoryOps> Timed<B> {
    /// `inner`, timed from now.
    pub fn new(inner: B) -> Self {
        Timed {
            inner,
            stats: RefCell::new(Vec::new()),
            since: Cell::new(Instant::now()),
            paused_at: Cell::new(None),
            paused: Cell::new(Duration::ZERO),
        }
    }

    /// The wrapped backend.
    pub fn inner(&self) -> &B {
        &self.inner
    }

    /// The wrapped backend, given back.
    pub fn into_inner(self) -> B {
        self.inner
    }

    /// Forgets every count (after warm-up steps, say) and restarts the wall clock.
    pub fn reset(&self) {
        self.stats.borrow_mut().clear();
        let now = Instant::now();
        self.since.set(now);
        self.paused.set(Duration::ZERO);
        if self.paused_at.get().is_some() {
            self.paused_at.set(Some(now));
        }
    }

    /// Stops counting until [`Timed::resume`]: ops still run (between the same
    /// synchronisations) but are not recorded, and the time until `resume` is left out
    /// of the wall time. For work between the measured iterations, such as the prompt
    /// refill of a decode benchmark whose cache is full. Pausing twice is pausing once.
    pub fn pause(&self) {
        if self.paused_at.get().is_none() {
            self.paused_at.set(Some(Instant::now()));
        }
    }

    /// Counts again after [`Timed::pause`] (nothing if not paused).
    pub fn resume(&self) {
        if let Some(at) = self.paused_at.take() {
            self.paused.set(self.paused.get() + at.elapsed());
        }
    }

    /// The counts so far, slowest op first. The wall time runs from the last reset (or
    /// creation) to now, less the time paused.
    pub fn profile(&self) -> Profile {
        let mut ops = self.stats.borrow().clone();
        ops.sort_by(|a, b| b.seconds.total_cmp(&a.seconds));
        let mut paused = self.paused.get();
        if let Some(at) = self.paused_at.get() {
            paused += at.elapsed();
        }
        Profile {
            ops,
            wall_s: self
                .since
                .get()
                .elapsed()
                .saturating_sub(paused)
                .as_secs_f64(),
        }
    }

    /// Runs one op between two synchronisations and records it if it succeeded.
    fn time<R>(&self, op: &'static str, work: Work, f: impl FnOnce() -> Result<R>) -> Result<R> {
        self.time_shaped(op, String::new(), work, f)
    }

    /// [`Timed::time`] for a product, counted under its shape.
    fn time_shaped<R>(
        &self,
        op: &'static str,
        shape: String,
        work: Work,
        f: impl FnOnce() -> Result<R>,
    ) -> Result<R> {
        self.inner.synchronize()?;
        let start = Instant::now();
        let r = f()?;
        self.inner.synchronize()?;
        self.record(op, shape, start.elapsed(), work);
        Ok(r)
    }

    fn record(&self, op: &'static str, shape: String, dt: Duration, work: Work) {
        if self.paused_at.get().is_some() {
            return;
        }
        let mut stats = self.stats.borrow_mut();
        let i = match stats.iter().position(|s| s.op == op && s.shape == shape) {
            Some(i) => i,
            None => {
                stats.push(OpStats {
                    op,
                    shape,
                    calls: 0,
                    seconds: 0.0,
                    flops: 0.0,
                    bytes: 0.0,
                });
                stats.len() - 1
            }
        };
        let s = &mut stats[i];
        s.calls += 1;
        s.seconds += dt.as_secs_f64();
        match work {
            Work::None => {}
            Work::Flops(f) => s.flops += f,
            Work::Bytes(b) => s.bytes += b,
        }
    }
}

impl Profile {
    /// The sum of the ops' times.
    pub fn op_seconds(&self) -> f64 {
        self.ops.iter().map(|s| s.seconds).sum()
    }

    /// A table of the ops per step (the counts divided by `steps`): op (a product with
    /// its shape), calls, ms, % of the wall time, and GFLOP/s or GB/s; then the time
    /// outside the ops and the total.
    pub fn table(&self, steps: usize) -> String {
        let per = 1.0 / steps.max(1) as f64;
        let pct = |s: f64| 100.0 * s / self.wall_s.max(f64::MIN_POSITIVE);
        let name = |s: &OpStats| {
            if s.shape.is_empty() {
                s.op.to_string()
            } else {
                format!("{} {}", s.op, s.shape)
            }
        };
        let w = self
            .ops
            .iter()
            .map(|s| name(s).len())
            .max()
            .unwrap_or(0)
            .max(24);
        let mut out = format!(
            "{:<w$} {:>9} {:>10} {:>9} {:>14}\n",
            "op", "calls", "ms", "% of step", "rate"
        );
        for s in &self.ops {
            let rate = if s.flops > 0.0 {
                format!("{:.1} GFLOP/s", s.flops / s.seconds / 1e9)
            } else if s.bytes > 0.0 {
                format!("{:.1} GB/s", s.bytes / s.seconds / 1e9)
            } else {
                String::new()
            };
            let _ = writeln!(
                out,
                "{:<w$} {:>9} {:>10.3} {:>8.1}% {:>14}",
                name(s),
                s.calls as f64 * per,
                s.seconds * per * 1e3,
                pct(s.seconds),
                rate
            );
        }
        let outside = (self.wall_s - self.op_seconds()).max(0.0);
        let _ = writeln!(
            out,
            "{:<w$} {:>9} {:>10.3} {:>8.1}%",
            "(outside the ops)",
            "",
            outside * per * 1e3,
            pct(outside)
        );
        let _ = write!(
            out,
            "{:<w$} {:>9} {:>10.3} {:>8.1}%",
            "step",
            "",
            self.wall_s * per * 1e3,
            100.0
        );
        out
    }
}

impl<B: MemoryOps> MemoryOps for Timed<B> {
    type Buffer = B::Buffer;
    type IdBuffer = B::IdBuffer;

    fn name(&self) -> String {
        format!("timed {}", self.inner.name())
    }
    fn alloc(&self, len: usize) -> Result<Self::Buffer> {
        self.time("alloc", Work::None, || self.inner.alloc(len))
    }
    fn alloc_ids(&self, len: usize) -> Result<Self::IdBuffer> {
        self.time("alloc_ids", Work::None, || self.inner.alloc_ids(len))
    }
    fn upload(&self, src: &[f32], dst: Tensor<'_, Self>) -> Result<()> {
        self.time("upload", floats(src.len()), || self.inner.upload(src, dst))
    }
    fn download(&self, src: Tensor<'_, Self>, dst: &mut [f32]) -> Result<()> {
        let work = floats(dst.len());
        self.time("download", work, || self.inner.download(src, dst))
    }
    fn upload_ids(&self, src: &[u32], dst: Ids<'_, Self>) -> Result<()> {
        self.time("upload_ids", floats(src.len()), || {
            self.inner.upload_ids(src, dst)
        })
    }
    fn synchronize(&self) -> Result<()> {
        self.inner.synchronize()
    }
    fn fill(&self, dst: Tensor<'_, Self>, value: f32) -> Result<()> {
        self.time("fill", floats(dst.numel()), || self.inner.fill(dst, value))
    }
    fn copy(&self, src: Mat<'_, Self>, dst: Mat<'_, Self>) -> Result<()> {
        let work = floats(2 * src.batch * src.rows * src.cols);
        self.time("copy", work, || self.inner.copy(src, dst))
    }
}

impl<B: LinalgOps + ElementwiseOps> LinalgOps for Timed<B> {
    fn matmul(
        &self,
        a: Mat<'_, Self>,
        b: Mat<'_, Self>,
        bias: Option<Tensor<'_, Self>>,
        c: Mat<'_, Self>,
    ) -> Result<()> {
        let shape = product_shape(&a, &b, &c);
        self.time_shaped("matmul", shape, matmul_flops(&a, &c), || {
            self.inner.matmul(a, b, bias, c)
        })
    }
    fn matmul_add(
        &self,
        a: Mat<'_, Self>,
        b: Mat<'_, Self>,
        bias: Option<Tensor<'_, Self>>,
        c: Mat<'_, Self>,
    ) -> Result<()> {
        let shape = product_shape(&a, &b, &c);
        self.time_shaped("matmul_add", shape, matmul_flops(&a, &c), || {
            self.inner.matmul_add(a, b, bias, c)
        })
    }
    fn matmul_scratch_len(&self, m: usize, k: usize, n: usize) -> usize {
        self.inner.matmul_scratch_len(m, k, n)
    }
    fn bias_backward(&self, dout: Tensor<'_, Self>, dbias: Tensor<'_, Self>) -> Result<()> {
        let work = floats(dout.numel() + 2 * dbias.numel());
        self.time("bias_backward", work, || {
            self.inner.bias_backward(dout, dbias)
        })
    }
    fn linear_gelu(
        &self,
        x: Mat<'_, Self>,
        w: Mat<'_, Self>,
        bias: Tensor<'_, Self>,
        pre: Tensor<'_, Self>,
        out: Tensor<'_, Self>,
    ) -> Result<()> {
        let shape = product_shape(&x, &w, &pre.mat());
        self.time_shaped("linear_gelu", shape, matmul_flops(&x, &pre.mat()), || {
            self.inner.linear_gelu(x, w, bias, pre, out)
        })
    }
    fn matmul_gelu_backward(
        &self,
        dy: Mat<'_, Self>,
        w: Mat<'_, Self>,
        pre: Tensor<'_, Self>,
        dpre: Tensor<'_, Self>,
    ) -> Result<()> {
        self.time_shaped(
            "matmul_gelu_backward",
            product_shape(&dy, &w, &dpre.mat()),
            matmul_flops(&dy, &dpre.mat()),
            || self.inner.matmul_gelu_backward(dy, w, pre, dpre),
        )
    }
    fn mlp_forward(
        &self,
        x: Tensor<'_, Self>,
        fc: LinearOf<'_, Self>,
        pre: Tensor<'_, Self>,
        act: Tensor<'_, Self>,
        proj: LinearOf<'_, Self>,
        out: Tensor<'_, Self>,
    ) -> Result<()> {
        // Two products of x's rows: C·M and M·C multiply-adds each.
        let flops = 4.0 * (x.shape.rows() * x.shape.last() * pre.shape.last()) as f64;
        self.time("mlp_forward", Work::Flops(flops), || {
            self.inner.mlp_forward(x, fc, pre, act, proj, out)
        })
    }
}

impl<B: ElementwiseOps> ElementwiseOps for Timed<B> {
    fn add(&self, a: Tensor<'_, Self>, b: Tensor<'_, Self>, out: Tensor<'_, Self>) -> Result<()> {
        self.time("add", floats(3 * out.numel()), || self.inner.add(a, b, out))
    }
    fn scale(&self, x: Tensor<'_, Self>, alpha: f32) -> Result<()> {
        self.time("scale", floats(2 * x.numel()), || {
            self.inner.scale(x, alpha)
        })
    }
    fn gelu(&self, x: Tensor<'_, Self>, out: Tensor<'_, Self>) -> Result<()> {
        self.time("gelu", floats(2 * x.numel()), || self.inner.gelu(x, out))
    }
    fn gelu_backward(
        &self,
        x: Tensor<'_, Self>,
        dout: Tensor<'_, Self>,
        dx: Tensor<'_, Self>,
    ) -> Result<()> {
        self.time("gelu_backward", floats(3 * x.numel()), || {
            self.inner.gelu_backward(x, dout, dx)
        })
    }
}

impl<B: LayerNormOps + ElementwiseOps> LayerNormOps for Timed<B> {
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
        let work = floats(2 * x.numel() + 2 * mean.numel() + 2 * gamma.numel());
        self.time("layernorm", work, || {
            self.inner.layernorm(x, gamma, beta, out, mean, rstd, eps)
        })
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
        let work = floats(4 * x.numel() + 2 * mean.numel() + 5 * gamma.numel());
        self.time("layernorm_backward", work, || {
            self.inner
                .layernorm_backward(x, gamma, mean, rstd, dout, dx, dgamma, dbeta)
        })
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
        let work = floats(4 * a.numel() + 2 * mean.numel() + 2 * gamma.numel());
        self.time("residual_layernorm", work, || {
            self.inner
                .residual_layernorm(a, b, residual, gamma, beta, out, mean, rstd, eps)
        })
    }
}

impl<B: SoftmaxOps> SoftmaxOps for Timed<B> {
    fn softmax(
        &self,
        x: Tensor<'_, Self>,
        out: Tensor<'_, Self>,
        scale: f32,
        causal_offset: Option<usize>,
    ) -> Result<()> {
        self.time("softmax", floats(2 * x.numel()), || {
            self.inner.softmax(x, out, scale, causal_offset)
        })
    }
    fn softmax_backward(
        &self,
        probs: Tensor<'_, Self>,
        dprobs: Tensor<'_, Self>,
        dx: Tensor<'_, Self>,
        scale: f32,
    ) -> Result<()> {
        self.time("softmax_backward", floats(3 * probs.numel()), || {
            self.inner.softmax_backward(probs, dprobs, dx, scale)
        })
    }
}

impl<B: EmbeddingOps> EmbeddingOps for Timed<B> {
    fn embedding(
        &self,
        ids: Ids<'_, Self>,
        wte: Tensor<'_, Self>,
        wpe: Tensor<'_, Self>,
        out: Tensor<'_, Self>,
        pos_offset: usize,
    ) -> Result<()> {
        let work = floats(3 * out.numel() + ids.numel());
        self.time("embedding", work, || {
            self.inner.embedding(ids, wte, wpe, out, pos_offset)
        })
    }
    fn embedding_backward(
        &self,
        ids: Ids<'_, Self>,
        dout: Tensor<'_, Self>,
        dwte: Tensor<'_, Self>,
        dwpe: Tensor<'_, Self>,
    ) -> Result<()> {
        let work = floats(3 * dout.numel() + ids.numel());
        self.time("embedding_backward", work, || {
            self.inner.embedding_backward(ids, dout, dwte, dwpe)
        })
    }
}

impl<B: LossOps> LossOps for Timed<B> {
    fn softmax_cross_entropy(
        &self,
        logits: Tensor<'_, Self>,
        targets: Ids<'_, Self>,
        vocab: usize,
        losses: Tensor<'_, Self>,
        dlogits: Option<Tensor<'_, Self>>,
        grad_scale: f32,
    ) -> Result<()> {
        let passes = if dlogits.is_some() { 2 } else { 1 };
        let work = floats(passes * logits.numel() + 2 * losses.numel());
        self.time("softmax_cross_entropy", work, || {
            self.inner
                .softmax_cross_entropy(logits, targets, vocab, losses, dlogits, grad_scale)
        })
    }
}

impl<B: OptimOps> OptimOps for Timed<B> {
    fn sum_squares(&self, x: Tensor<'_, Self>) -> Result<f64> {
        self.time("sum_squares", floats(x.numel()), || {
            self.inner.sum_squares(x)
        })
    }
    fn adamw(
        &self,
        param: Tensor<'_, Self>,
        grad: Tensor<'_, Self>,
        m: Tensor<'_, Self>,
        v: Tensor<'_, Self>,
        step: &AdamWStep,
    ) -> Result<()> {
        // Reads p, g, m, v; writes p, m, v.
        self.time("adamw", floats(7 * param.numel()), || {
            self.inner.adamw(param, grad, m, v, step)
        })
    }
    fn clip_scale(
        &self,
        grad: Tensor<'_, Self>,
        mean: f64,
        max_norm: Option<f32>,
        guard: Option<Tensor<'_, Self>>,
        out: Tensor<'_, Self>,
    ) -> Result<()> {
        // Reads the gradient (its Σ g²) and the guard; writes 3 floats.
        let n = grad.numel() + guard.as_ref().map_or(0, |g| g.numel()) + 3;
        self.time("clip_scale", floats(n), || {
            self.inner.clip_scale(grad, mean, max_norm, guard, out)
        })
    }
    fn adamw_scaled(
        &self,
        param: Tensor<'_, Self>,
        grad: Tensor<'_, Self>,
        m: Tensor<'_, Self>,
        v: Tensor<'_, Self>,
        step: &AdamWStep,
        scale: Tensor<'_, Self>,
    ) -> Result<()> {
        self.time("adamw_scaled", floats(7 * param.numel()), || {
            self.inner.adamw_scaled(param, grad, m, v, step, scale)
        })
    }
}

impl<B: DecodeOps> DecodeOps for Timed<B> {
    fn decode_blocks(&self, blocks: &[DecodeBlockOf<'_, Self>], eps: f32) -> Result<()> {
        // Per block the six products (`x·W` of the QKV, the attention's projection and
        // the MLP's two: 24·N·C² FLOPs) and the attention of the new positions, as
        // `decode_attention` counts them.
        let flops = blocks
            .iter()
            .map(|b| {
                let (n, c) = (b.x.shape.rows(), b.x.shape.last());
                let t = n / b.keys.batch.max(1);
                let q = HeadsOf::<'_, Self> { seq: t, ..b.keys };
                let past = b.keys.seq.saturating_sub(t);
                24.0 * (n * c * c) as f64 + 4.0 * b.keys.head_dim as f64 * visible_scores(&q, past)
            })
            .sum();
        self.time("decode_blocks", Work::Flops(flops), || {
            self.inner.decode_blocks(blocks, eps)
        })
    }
}

impl<B: AttentionOps + LinalgOps + SoftmaxOps> AttentionOps for Timed<B> {
    fn kv_heads_apart(&self) -> bool {
        self.inner.kv_heads_apart()
    }
    fn attention_workspace_len(&self, shape: AttentionShape) -> usize {
        self.inner.attention_workspace_len(shape)
    }
    fn attention_backward_scratch_len(&self, shape: AttentionShape) -> usize {
        self.inner.attention_backward_scratch_len(shape)
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
        let work = Work::Flops(4.0 * q.head_dim as f64 * visible_scores(&q, pos_offset));
        self.time("attention_forward", work, || {
            self.inner
                .attention_forward(q, k, v, out, workspace, pos_offset)
        })
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
        let work = Work::Flops(8.0 * q.head_dim as f64 * visible_scores(&q, 0));
        self.time("attention_backward", work, || {
            self.inner
                .attention_backward(q, k, v, out, dout, dq, dk, dv, workspace, scratch)
        })
    }
    fn decode_attention(
        &self,
        x: Tensor<'_, Self>,
        qkv_w: LinearOf<'_, Self>,
        qkv: Tensor<'_, Self>,
        keys: HeadsOf<'_, Self>,
        values: HeadsOf<'_, Self>,
        atty: Tensor<'_, Self>,
        workspace: Tensor<'_, Self>,
        proj: LinearOf<'_, Self>,
        out: Tensor<'_, Self>,
    ) -> Result<()> {
        // The two products, and the attention of the new positions (the sizes as the
        // op's check will see them; a call it refuses is timed with what they give).
        let (n, c) = (x.shape.rows(), x.shape.last());
        let t = n / keys.batch.max(1);
        let q = HeadsOf::<'_, Self> { seq: t, ..keys };
        let attention = 4.0 * keys.head_dim as f64 * visible_scores(&q, keys.seq.saturating_sub(t));
        let products = 2.0 * (n * c * 4 * c) as f64;
        self.time(
            "decode_attention",
            Work::Flops(products + attention),
            || {
                self.inner
                    .decode_attention(x, qkv_w, qkv, keys, values, atty, workspace, proj, out)
            },
        )
    }
}
