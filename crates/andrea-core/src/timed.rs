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
use crate::prelude::*;

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

    /// Runs one op between two synchronisations and records it under `op` and `shape` (a
    /// product's, else empty) if it succeeded.
    fn time<R>(
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

/// Implements the ten op families for `Timed<B>` from the op list
/// ([`crate::for_each_op!`]): each op runs through [`Timed::time`] under its name,
/// with the work `@work` counts (none for an op without an arm there) and, for a
/// product, the shape `@shape` names. The arms ahead of the last `@op` one are the
/// exceptions.
macro_rules! timed_ops {
    ($($family:ident { $(fn $op:ident $args:tt -> $ret:ty;)* })*) => {
        $(impl<B: Backend> $family for Timed<B> {
            timed_ops!(@types $family);
            $(timed_ops!(@op $op $args -> $ret);)*
        })*
    };
    (@types MemoryOps) => {
        type Buffer = B::Buffer;
        type IdBuffer = B::IdBuffer;
        type Bf16Buffer = B::Bf16Buffer;
    };
    (@types $family:ident) => {};

    (@op name () -> $ret:ty) => {
        fn name(&self) -> String {
            format!("timed {}", self.inner.name())
        }
    };
    // Not work on the device: asked of `B`, untimed.
    (@op synchronize $($sig:tt)*) => { timed_ops!(@untimed synchronize $($sig)*); };
    (@op keep_bf16_weights $($sig:tt)*) => { timed_ops!(@untimed keep_bf16_weights $($sig)*); };
    (@op matmul_scratch_len $($sig:tt)*) => { timed_ops!(@untimed matmul_scratch_len $($sig)*); };
    (@op kv_heads_apart $($sig:tt)*) => { timed_ops!(@untimed kv_heads_apart $($sig)*); };
    (@op attention_workspace_len $($sig:tt)*) => {
        timed_ops!(@untimed attention_workspace_len $($sig)*);
    };
    (@op attention_backward_scratch_len $($sig:tt)*) => {
        timed_ops!(@untimed attention_backward_scratch_len $($sig)*);
    };
    // The traits' defaults: a collective then goes through `download` and `upload`,
    // which are timed.
    (@op device_region $($sig:tt)*) => {};
    (@op with_host_elements $($sig:tt)*) => {};
    (@op $op:ident ($($arg:ident: $ty:ty),* $(,)?) -> $ret:ty) => {
        fn $op(&self, $($arg: $ty),*) -> $ret {
            let shape = timed_ops!(@shape $op $($arg)*);
            let work = timed_ops!(@work $op $($arg)*);
            self.time(stringify!($op), shape, work, || self.inner.$op($($arg),*))
        }
    };
    (@untimed $op:ident ($($arg:ident: $ty:ty),* $(,)?) -> $ret:ty) => {
        fn $op(&self, $($arg: $ty),*) -> $ret {
            self.inner.$op($($arg),*)
        }
    };

    // The products, counted per shape.
    (@shape matmul $a:ident $b:ident $bias:ident $c:ident) => { product_shape(&$a, &$b, &$c) };
    (@shape matmul_add $a:ident $b:ident $bias:ident $c:ident) => { product_shape(&$a, &$b, &$c) };
    (@shape linear_gelu $x:ident $w:ident $bias:ident $pre:ident $out:ident) => {
        product_shape(&$x, &$w, &$pre.mat())
    };
    (@shape matmul_gelu_backward $dy:ident $w:ident $pre:ident $dpre:ident) => {
        product_shape(&$dy, &$w, &$dpre.mat())
    };
    (@shape $op:ident $($arg:ident)*) => { String::new() };

    // Memory.
    (@work upload $src:ident $dst:ident) => { floats($src.len()) };
    (@work download $src:ident $dst:ident) => { floats($dst.len()) };
    (@work upload_ids $src:ident $dst:ident) => { floats($src.len()) };
    (@work fill $dst:ident $value:ident) => { floats($dst.numel()) };
    (@work copy $src:ident $dst:ident) => { floats(2 * $src.batch * $src.rows * $src.cols) };
    // Four bytes read or written and two the other way per element.
    (@work to_bf16 $src:ident $dst:ident) => { Work::Bytes(6.0 * $src.numel() as f64) };
    (@work to_f32 $src:ident $dst:ident) => { Work::Bytes(6.0 * $src.numel() as f64) };
    // Products: `2·M·N·K`.
    (@work matmul $a:ident $b:ident $bias:ident $c:ident) => { matmul_flops(&$a, &$c) };
    (@work matmul_add $a:ident $b:ident $bias:ident $c:ident) => { matmul_flops(&$a, &$c) };
    (@work linear_gelu $x:ident $w:ident $bias:ident $pre:ident $out:ident) => {
        matmul_flops(&$x, &$pre.mat())
    };
    (@work matmul_gelu_backward $dy:ident $w:ident $pre:ident $dpre:ident) => {
        matmul_flops(&$dy, &$dpre.mat())
    };
    (@work mlp_forward $x:ident $fc:ident $pre:ident $act:ident $proj:ident $out:ident) => {
        // Two products of x's rows: C·M and M·C multiply-adds each.
        Work::Flops(4.0 * ($x.shape.rows() * $x.shape.last() * $pre.shape.last()) as f64)
    };
    (@work bias_backward $dout:ident $dbias:ident) => {
        floats($dout.numel() + 2 * $dbias.numel())
    };
    // Elementwise, normalisation, softmax: each operand once, an accumulated one twice.
    (@work add $a:ident $b:ident $out:ident) => { floats(3 * $out.numel()) };
    (@work scale $x:ident $alpha:ident) => { floats(2 * $x.numel()) };
    (@work gelu $x:ident $out:ident) => { floats(2 * $x.numel()) };
    (@work gelu_backward $x:ident $dout:ident $dx:ident) => { floats(3 * $x.numel()) };
    (@work layernorm $x:ident $gamma:ident $beta:ident $out:ident $mean:ident $rstd:ident
        $eps:ident) => {
        floats(2 * $x.numel() + 2 * $mean.numel() + 2 * $gamma.numel())
    };
    (@work layernorm_backward $x:ident $gamma:ident $mean:ident $rstd:ident $dout:ident
        $dx:ident $dgamma:ident $dbeta:ident) => {
        floats(4 * $x.numel() + 2 * $mean.numel() + 5 * $gamma.numel())
    };
    (@work residual_layernorm $a:ident $b:ident $residual:ident $gamma:ident $beta:ident
        $out:ident $mean:ident $rstd:ident $eps:ident) => {
        floats(4 * $a.numel() + 2 * $mean.numel() + 2 * $gamma.numel())
    };
    (@work softmax $x:ident $out:ident $scale:ident $causal_offset:ident) => {
        floats(2 * $x.numel())
    };
    (@work softmax_backward $probs:ident $dprobs:ident $dx:ident $scale:ident) => {
        floats(3 * $probs.numel())
    };
    // Embedding: the rows gathered (or scattered into) and the ids.
    (@work embedding $ids:ident $wte:ident $wpe:ident $out:ident $pos_offset:ident) => {
        floats(3 * $out.numel() + $ids.numel())
    };
    (@work embedding_backward $ids:ident $dout:ident $dwte:ident $dwpe:ident) => {
        floats(3 * $dout.numel() + $ids.numel())
    };
    (@work softmax_cross_entropy $logits:ident $targets:ident $vocab:ident $losses:ident
        $dlogits:ident $grad_scale:ident) => {{
        let passes = if $dlogits.is_some() { 2 } else { 1 };
        floats(passes * $logits.numel() + 2 * $losses.numel())
    }};
    // Optimizer.
    (@work sum_squares $x:ident) => { floats($x.numel()) };
    (@work adamw $param:ident $grad:ident $m:ident $v:ident $step:ident) => {
        // Reads p, g, m, v; writes p, m, v.
        floats(7 * $param.numel())
    };
    (@work clip_scale $grad:ident $mean:ident $max_norm:ident $guard:ident $out:ident) => {
        // Reads the gradient (its Σ g²) and the guard; writes 3 floats.
        floats($grad.numel() + $guard.as_ref().map_or(0, |g| g.numel()) + 3)
    };
    (@work adamw_scaled $param:ident $grad:ident $m:ident $v:ident $step:ident
        $scale:ident) => {
        floats(7 * $param.numel())
    };
    // Attention: the visible scores.
    (@work attention_forward $q:ident $k:ident $v:ident $out:ident $workspace:ident
        $pos_offset:ident) => {
        Work::Flops(4.0 * $q.head_dim as f64 * visible_scores(&$q, $pos_offset))
    };
    (@work attention_backward $q:ident $k:ident $v:ident $out:ident $dout:ident $dq:ident
        $dk:ident $dv:ident $workspace:ident $scratch:ident) => {
        Work::Flops(8.0 * $q.head_dim as f64 * visible_scores(&$q, 0))
    };
    (@work decode_attention $x:ident $qkv_w:ident $qkv:ident $keys:ident $values:ident
        $atty:ident $workspace:ident $proj:ident $out:ident) => {{
        // The two products, and the attention of the new positions (the sizes as the
        // op's check will see them; a call it refuses is timed with what they give).
        let (n, c) = ($x.shape.rows(), $x.shape.last());
        let t = n / $keys.batch.max(1);
        let q = HeadsOf::<'_, Self> { seq: t, ..$keys };
        let attention =
            4.0 * $keys.head_dim as f64 * visible_scores(&q, $keys.seq.saturating_sub(t));
        let products = 2.0 * (n * c * 4 * c) as f64;
        Work::Flops(products + attention)
    }};
    (@work decode_blocks $blocks:ident $eps:ident) => {{
        // Per block the six products (`x·W` of the QKV, the attention's projection and
        // the MLP's two: 24·N·C² FLOPs) and the attention of the new positions, as
        // `decode_attention` counts them.
        let flops = $blocks
            .iter()
            .map(|b| {
                let (n, c) = (b.x.shape.rows(), b.x.shape.last());
                let t = n / b.keys.batch.max(1);
                let q = HeadsOf::<'_, Self> { seq: t, ..b.keys };
                let past = b.keys.seq.saturating_sub(t);
                24.0 * (n * c * c) as f64 + 4.0 * b.keys.head_dim as f64 * visible_scores(&q, past)
            })
            .sum();
        Work::Flops(flops)
    }};
    // An op without a count: timed only.
    (@work $op:ident $($arg:ident)*) => { Work::None };
}

crate::for_each_op!(timed_ops);
