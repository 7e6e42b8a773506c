//! [`Compare<A, B>`]: two backends in lockstep, every op's outputs compared.
//!
//! A decorator (burn's pattern). Every buffer is a [`Pair`], one allocation on each
//! backend of the same size, so a view means the same elements on both sides. Each op
//! runs on `A` (the reference) and then on `B` with the mirrored views; then each of its
//! outputs is downloaded from both and compared with the op's tolerance
//! (`abs + rel·|A's value|`, a [`Tol`]). The first op whose outputs differ, or that
//! succeeds on one side and fails on the other, is recorded as a [`Divergence`] naming
//! the op, the output and its worst element; later ops are not compared (their inputs
//! already differ). Results returned to the caller are `A`'s.
//!
//! So a whole training step on a GPU can be checked against the CPU and a difference
//! traced to the op that made it, not to the loss at the end:
//!
//! ```
//! use andrea_core::prelude::*;
//! use andrea_testkit::compare::Compare;
//! use andrea_testkit::naive::NaiveBackend;
//! use andrea_testkit::Tol;
//!
//! let be = Compare::new(NaiveBackend::new(), NaiveBackend::new(), Tol::new(1e-6, 1e-6));
//! let x = be.alloc(4)?;
//! be.upload(&[-1.0, 0.0, 1.0, 2.0], View::whole(&x))?;
//! be.gelu(View::whole(&x), View::whole(&x))?;
//! assert!(be.first_divergence().is_none());
//! # Ok::<(), andrea_core::Error>(())
//! ```
//!
//! It lives in the testkit because it needs [`Tol`]; it is a tool for tests (the GPU
//! bundle runs `andrea-cuda`'s, which use it), never for a production path: it downloads
//! every output.
//!
//! Not compared: the attention workspace and scratch (each backend keeps its own form in
//! them), and the steps inside a fused op (it is compared as one op, by its outputs).

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::fmt;

use andrea_core::prelude::*;
use andrea_core::Result;

use crate::Tol;

/// One allocation on each of two backends, of the same length.
pub struct Pair<X, Y> {
    pub a: X,
    pub b: Y,
}

impl<X: DeviceMemory, Y> DeviceMemory for Pair<X, Y> {
    fn len(&self) -> usize {
        self.a.len()
    }
}

/// The first op whose results differ between the two backends.
#[derive(Debug, Clone, PartialEq)]
pub struct Divergence {
    /// The op, as the trait names it (`"matmul"`, `"attention_backward"`).
    pub op: &'static str,
    /// The output that differs (`"c"`, `"dq"`), or `"result"` when one side failed.
    pub output: &'static str,
    /// Which call it was, counting every op from 0.
    pub call: u64,
    /// The comparison's message: how many elements, the worst one, its bound.
    pub message: String,
}

impl fmt::Display for Divergence {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "first divergence at op #{} `{}`, output `{}`: {}",
            self.call, self.op, self.output, self.message
        )
    }
}

/// Runs `A` and `B` in lockstep; see the module docs.
pub struct Compare<A, B> {
    a: A,
    b: B,
    tol: Tol,
    per_op: HashMap<&'static str, Tol>,
    /// `abs` is a fraction of each output's largest `|a|` ([`Compare::abs_of_scale`]).
    abs_of_scale: bool,
    calls: Cell<u64>,
    first: RefCell<Option<Divergence>>,
}

/// A view of a pair, as the same view of each side.
trait Split {
    type A;
    type B;
    fn split(self) -> (Self::A, Self::B);
}

impl<'a, X, Y> Split for View<'a, Pair<X, Y>> {
    type A = View<'a, X>;
    type B = View<'a, Y>;
    fn split(self) -> (View<'a, X>, View<'a, Y>) {
        let (offset, shape) = (self.offset, self.shape);
        (
            View {
                buf: &self.buf.a,
                offset,
                shape,
            },
            View {
                buf: &self.buf.b,
                offset,
                shape,
            },
        )
    }
}

impl<'a, X, Y> Split for Matrix<'a, Pair<X, Y>> {
    type A = Matrix<'a, X>;
    type B = Matrix<'a, Y>;
    fn split(self) -> (Matrix<'a, X>, Matrix<'a, Y>) {
        let m = self;
        (
            Matrix {
                buf: &m.buf.a,
                offset: m.offset,
                batch: m.batch,
                rows: m.rows,
                cols: m.cols,
                batch_stride: m.batch_stride,
                row_stride: m.row_stride,
                col_stride: m.col_stride,
            },
            Matrix {
                buf: &m.buf.b,
                offset: m.offset,
                batch: m.batch,
                rows: m.rows,
                cols: m.cols,
                batch_stride: m.batch_stride,
                row_stride: m.row_stride,
                col_stride: m.col_stride,
            },
        )
    }
}

impl<'a, X, Y> Split for Heads<'a, Pair<X, Y>> {
    type A = Heads<'a, X>;
    type B = Heads<'a, Y>;
    fn split(self) -> (Heads<'a, X>, Heads<'a, Y>) {
        let h = self;
        (
            Heads {
                buf: &h.buf.a,
                offset: h.offset,
                batch: h.batch,
                seq: h.seq,
                heads: h.heads,
                head_dim: h.head_dim,
                batch_stride: h.batch_stride,
                seq_stride: h.seq_stride,
                head_stride: h.head_stride,
            },
            Heads {
                buf: &h.buf.b,
                offset: h.offset,
                batch: h.batch,
                seq: h.seq,
                heads: h.heads,
                head_dim: h.head_dim,
                batch_stride: h.batch_stride,
                seq_stride: h.seq_stride,
                head_stride: h.head_stride,
            },
        )
    }
}

impl<'a, X, Y> Split for LinearParams<'a, Pair<X, Y>> {
    type A = LinearParams<'a, X>;
    type B = LinearParams<'a, Y>;
    fn split(self) -> (LinearParams<'a, X>, LinearParams<'a, Y>) {
        let ((wa, wb), (ba, bb)) = (self.weight.split(), self.bias.split());
        (
            LinearParams {
                weight: wa,
                bias: ba,
            },
            LinearParams {
                weight: wb,
                bias: bb,
            },
        )
    }
}

impl<'a, X, Y> Split for NormParams<'a, Pair<X, Y>> {
    type A = NormParams<'a, X>;
    type B = NormParams<'a, Y>;
    fn split(self) -> (NormParams<'a, X>, NormParams<'a, Y>) {
        let ((ga, gb), (ba, bb)) = (self.gamma.split(), self.beta.split());
        (
            NormParams {
                gamma: ga,
                beta: ba,
            },
            NormParams {
                gamma: gb,
                beta: bb,
            },
        )
    }
}

impl<'a, X, Y> Split for NormOutputs<'a, Pair<X, Y>> {
    type A = NormOutputs<'a, X>;
    type B = NormOutputs<'a, Y>;
    fn split(self) -> (NormOutputs<'a, X>, NormOutputs<'a, Y>) {
        let ((oa, ob), (ma, mb), (ra, rb)) =
            (self.out.split(), self.mean.split(), self.rstd.split());
        (
            NormOutputs {
                out: oa,
                mean: ma,
                rstd: ra,
            },
            NormOutputs {
                out: ob,
                mean: mb,
                rstd: rb,
            },
        )
    }
}

impl<'a, X, Y> Split for DecodeBlock<'a, Pair<X, Y>> {
    type A = DecodeBlock<'a, X>;
    type B = DecodeBlock<'a, Y>;
    fn split(self) -> (DecodeBlock<'a, X>, DecodeBlock<'a, Y>) {
        let b = self;
        let ((xa, xb), (la, lb)) = (b.x.split(), b.ln_1.split());
        let ((ka, kb), (va, vb)) = (b.keys.split(), b.values.split());
        let ((caa, cab), (apa, apb)) = (b.c_attn.split(), b.attn_proj.split());
        let ((n2a, n2b), (cfa, cfb), (mpa, mpb)) =
            (b.ln_2.split(), b.c_fc.split(), b.mlp_proj.split());
        let (na, nb) = b.next.split();
        let ((qa, qb), (ata, atb), (wa, wb)) = (b.qkv.split(), b.atty.split(), b.workspace.split());
        let ((pa, pb), (fpa, fpb), (fa, fb)) = (b.proj.split(), b.fc_pre.split(), b.fc.split());
        let ((r2a, r2b), (o2a, o2b)) = (b.residual_2.split(), b.ln_2_out.split());
        let ((r3a, r3b), (o3a, o3b)) = (b.residual_3.split(), b.next_out.split());
        (
            DecodeBlock {
                x: xa,
                ln_1: la,
                keys: ka,
                values: va,
                c_attn: caa,
                attn_proj: apa,
                ln_2: n2a,
                c_fc: cfa,
                mlp_proj: mpa,
                next: na,
                qkv: qa,
                atty: ata,
                workspace: wa,
                proj: pa,
                fc_pre: fpa,
                fc: fa,
                residual_2: r2a,
                ln_2_out: o2a,
                residual_3: r3a,
                next_out: o3a,
            },
            DecodeBlock {
                x: xb,
                ln_1: lb,
                keys: kb,
                values: vb,
                c_attn: cab,
                attn_proj: apb,
                ln_2: n2b,
                c_fc: cfb,
                mlp_proj: mpb,
                next: nb,
                qkv: qb,
                atty: atb,
                workspace: wb,
                proj: pb,
                fc_pre: fpb,
                fc: fb,
                residual_2: r2b,
                ln_2_out: o2b,
                residual_3: r3b,
                next_out: o3b,
            },
        )
    }
}

/// A value on the host (a size, a scale, a host slice, the AdamW step): the same on
/// both sides.
macro_rules! same_on_both_sides {
    ($($t:ty),*) => {$(
        impl Split for $t {
            type A = $t;
            type B = $t;
            fn split(self) -> ($t, $t) {
                (self, self)
            }
        }
    )*};
}

same_on_both_sides!(usize, f32, f64);

impl<'a, T: ?Sized> Split for &'a T {
    type A = &'a T;
    type B = &'a T;
    fn split(self) -> (&'a T, &'a T) {
        (self, self)
    }
}

impl<T: Split> Split for Option<T> {
    type A = Option<T::A>;
    type B = Option<T::B>;
    fn split(self) -> (Option<T::A>, Option<T::B>) {
        match self.map(Split::split) {
            Some((a, b)) => (Some(a), Some(b)),
            None => (None, None),
        }
    }
}

/// The contiguous elements an output spans (a strided matrix's gaps included: they must
/// be left alike on both sides too).
fn span<'a, M: DeviceMemory>(buf: &'a M, range: std::ops::Range<usize>) -> View<'a, M> {
    View::new(buf, range.start, [range.len()])
}

type Buf<A, B> = Pair<<A as MemoryOps>::Buffer, <B as MemoryOps>::Buffer>;

impl<A: Backend, B: Backend> Compare<A, B> {
    /// `a` (the reference) and `b` in lockstep, every output within `tol` of `a`'s.
    pub fn new(a: A, b: B, tol: Tol) -> Self {
        Compare {
            a,
            b,
            tol,
            per_op: HashMap::new(),
            abs_of_scale: false,
            calls: Cell::new(0),
            first: RefCell::new(None),
        }
    }

    /// Another tolerance for the outputs of `op` (a trait method's name).
    pub fn with_tol(mut self, op: &'static str, tol: Tol) -> Self {
        self.per_op.insert(op, tol);
        self
    }

    /// Reads each tolerance's `abs` as a fraction of the largest `|a|` of the output
    /// compared: for sums, whose rounding errors scale with the terms, not the result,
    /// so an element that cancels to near zero carries the error of the large ones.
    pub fn abs_of_scale(mut self) -> Self {
        self.abs_of_scale = true;
        self
    }

    /// The reference backend.
    pub fn a(&self) -> &A {
        &self.a
    }

    /// The backend under test.
    pub fn b(&self) -> &B {
        &self.b
    }

    /// The first op whose results differed, if any did.
    pub fn first_divergence(&self) -> Option<Divergence> {
        self.first.borrow().clone()
    }

    /// `Ok` while the two backends agree, else the first [`Divergence`].
    pub fn agreement(&self) -> std::result::Result<(), Divergence> {
        self.first_divergence().map_or(Ok(()), Err)
    }

    /// Forgets a recorded divergence and restarts the call count.
    pub fn reset(&self) {
        self.first.replace(None);
        self.calls.set(0);
    }

    fn diverged(&self, op: &'static str, output: &'static str, call: u64, message: String) {
        let mut first = self.first.borrow_mut();
        if first.is_none() {
            *first = Some(Divergence {
                op,
                output,
                call,
                message,
            });
        }
    }

    /// Runs one op on both sides; on success, compares the outputs `outputs()` names.
    fn op<R>(
        &self,
        op: &'static str,
        run_a: impl FnOnce() -> Result<R>,
        run_b: impl FnOnce() -> Result<R>,
        outputs: &[(&'static str, View<'_, Buf<A, B>>)],
    ) -> Result<R> {
        let call = self.calls.get();
        self.calls.set(call + 1);
        let (ra, rb) = (run_a(), run_b());
        let compare = self.first.borrow().is_none();
        match (ra, rb) {
            (Ok(r), Ok(_)) => {
                if compare {
                    self.compare_outputs(op, call, outputs)?;
                }
                Ok(r)
            }
            (Err(e), Ok(_)) => {
                self.diverged(
                    op,
                    "result",
                    call,
                    format!("`a` failed ({e}), `b` succeeded"),
                );
                Err(e)
            }
            (Ok(_), Err(e)) => {
                self.diverged(
                    op,
                    "result",
                    call,
                    format!("`a` succeeded, `b` failed ({e})"),
                );
                Err(e)
            }
            (Err(ea), Err(eb)) => {
                if ea.to_string() != eb.to_string() {
                    self.diverged(
                        op,
                        "result",
                        call,
                        format!("both failed, differently: `a`: {ea}; `b`: {eb}"),
                    );
                }
                Err(ea)
            }
        }
    }

    fn compare_outputs(
        &self,
        op: &'static str,
        call: u64,
        outputs: &[(&'static str, View<'_, Buf<A, B>>)],
    ) -> Result<()> {
        let tol = self.per_op.get(op).copied().unwrap_or(self.tol);
        for &(name, t) in outputs {
            if t.numel() == 0 {
                continue;
            }
            let (ta, tb) = t.split();
            let (mut ha, mut hb) = (vec![0.0f32; t.numel()], vec![0.0f32; t.numel()]);
            self.a.download(ta, &mut ha)?;
            self.b.download(tb, &mut hb)?;
            let want: Vec<f64> = ha.iter().map(|&v| v as f64).collect();
            let tol = match self.abs_of_scale {
                true => Tol::new(
                    tol.abs * want.iter().fold(0.0, |m, w| w.abs().max(m)),
                    tol.rel,
                ),
                false => tol,
            };
            if let Err(message) = tol.check(&format!("{op}: {name}"), &hb, &want) {
                self.diverged(op, name, call, message);
                break;
            }
        }
        Ok(())
    }
}

/// Implements the ten op families for `Compare<A, B>` from the op list
/// ([`andrea_core::for_each_op!`]): each op's arguments are split into `A`'s and `B`'s
/// ([`Split`]), the op runs on both ([`Compare::op`]), and the outputs `@outputs` names
/// are compared. The arms ahead of the last `@op` one are the exceptions. A new op needs
/// its `@outputs` line (there is no default: an op compared by nothing would pass).
macro_rules! compare_ops {
    ($($family:ident { $(fn $op:ident $args:tt -> $ret:ty;)* })*) => {
        $(impl<A: Backend, B: Backend> $family for Compare<A, B> {
            compare_ops!(@types $family);
            $(compare_ops!(@op $op $args -> $ret);)*
        })*
    };
    (@types MemoryOps) => {
        type Buffer = Pair<A::Buffer, B::Buffer>;
        type IdBuffer = Pair<A::IdBuffer, B::IdBuffer>;
        type Bf16Buffer = Pair<A::Bf16Buffer, B::Bf16Buffer>;
    };
    (@types $family:ident) => {};

    (@op name () -> $ret:ty) => {
        fn name(&self) -> String {
            format!("compare({} vs {})", self.a.name(), self.b.name())
        }
    };
    (@op alloc ($len:ident: $ty:ty) -> $ret:ty) => {
        fn alloc(&self, $len: $ty) -> $ret {
            Ok(Pair { a: self.a.alloc($len)?, b: self.b.alloc($len)? })
        }
    };
    (@op alloc_ids ($len:ident: $ty:ty) -> $ret:ty) => {
        fn alloc_ids(&self, $len: $ty) -> $ret {
            Ok(Pair { a: self.a.alloc_ids($len)?, b: self.b.alloc_ids($len)? })
        }
    };
    (@op alloc_bf16 ($len:ident: $ty:ty) -> $ret:ty) => {
        fn alloc_bf16(&self, $len: $ty) -> $ret {
            Ok(Pair { a: self.a.alloc_bf16($len)?, b: self.b.alloc_bf16($len)? })
        }
    };
    // A BF16 output, compared widened: each side converts its result back to FP32 in a
    // buffer of its own, and those are compared.
    (@op to_bf16 ($src:ident: $s:ty, $dst:ident: $d:ty) -> $ret:ty) => {
        fn to_bf16(&self, $src: $s, $dst: $d) -> $ret {
            let wide = self.alloc($dst.numel())?;
            let ((sa, sb), (da, db)) = ($src.split(), $dst.split());
            let (wa, wb) = View::whole(&wide).split();
            self.op(
                "to_bf16",
                || self.a.to_bf16(sa, da).and_then(|()| self.a.to_f32(da, wa)),
                || self.b.to_bf16(sb, db).and_then(|()| self.b.to_f32(db, wb)),
                &[("dst (widened)", View::whole(&wide))],
            )
        }
    };
    // `A`'s elements go to the caller; `B`'s to a buffer of their own. The device-side
    // source is what is compared.
    (@op download ($src:ident: $s:ty, $dst:ident: $d:ty) -> $ret:ty) => {
        fn download(&self, $src: $s, $dst: $d) -> $ret {
            let (sa, sb) = $src.split();
            let mut other = vec![0.0; $dst.len()];
            self.op(
                "download",
                || self.a.download(sa, $dst),
                || self.b.download(sb, &mut other),
                &[("src", $src)],
            )
        }
    };
    (@op synchronize () -> $ret:ty) => {
        fn synchronize(&self) -> $ret {
            self.a.synchronize()?;
            self.b.synchronize()
        }
    };
    // The traits' defaults: a collective goes through `download` and `upload`.
    (@op device_region $($sig:tt)*) => {};
    (@op with_host_elements $($sig:tt)*) => {};
    // Sizes: room for either side (each keeps its own form in the attention workspace).
    (@op matmul_scratch_len ($($arg:ident: $ty:ty),*) -> $ret:ty) => {
        fn matmul_scratch_len(&self, $($arg: $ty),*) -> $ret {
            self.a.matmul_scratch_len($($arg),*).max(self.b.matmul_scratch_len($($arg),*))
        }
    };
    (@op attention_workspace_len ($shape:ident: $ty:ty) -> $ret:ty) => {
        fn attention_workspace_len(&self, $shape: $ty) -> $ret {
            self.a.attention_workspace_len($shape).max(self.b.attention_workspace_len($shape))
        }
    };
    (@op attention_backward_scratch_len ($shape:ident: $ty:ty) -> $ret:ty) => {
        fn attention_backward_scratch_len(&self, $shape: $ty) -> $ret {
            self.a
                .attention_backward_scratch_len($shape)
                .max(self.b.attention_backward_scratch_len($shape))
        }
    };
    // Heads apart only where both sides take that layout.
    (@op kv_heads_apart () -> $ret:ty) => {
        fn kv_heads_apart(&self) -> $ret {
            self.a.kv_heads_apart() && self.b.kv_heads_apart()
        }
    };
    // A result on the host, compared as it is.
    (@op sum_squares ($x:ident: $ty:ty) -> $ret:ty) => {
        fn sum_squares(&self, $x: $ty) -> $ret {
            let (xa, xb) = $x.split();
            let other = Cell::new(0.0);
            let sum = self.op(
                "sum_squares",
                || self.a.sum_squares(xa),
                || self.b.sum_squares(xb).inspect(|&s| other.set(s)),
                &[],
            )?;
            let tol = self.per_op.get("sum_squares").copied().unwrap_or(self.tol);
            if self.first.borrow().is_none() {
                if let Err(message) = tol.check("sum_squares", &[other.get()], &[sum]) {
                    self.diverged("sum_squares", "result", self.calls.get() - 1, message);
                }
            }
            Ok(sum)
        }
    };
    // A slice of blocks, split block by block.
    (@op decode_blocks ($blocks:ident: $ty:ty, $eps:ident: $e:ty) -> $ret:ty) => {
        fn decode_blocks(&self, $blocks: $ty, $eps: $e) -> $ret {
            let (blocks_a, blocks_b): (Vec<_>, Vec<_>) =
                $blocks.iter().map(|b| Split::split(*b)).unzip();
            // The scratch views aside, every output: the blocks' residual streams and
            // LayerNorms, and the caches.
            let mut outputs = Vec::with_capacity(10 * $blocks.len());
            for b in $blocks {
                outputs.extend([
                    ("residual_2", b.residual_2),
                    ("ln_2_out.out", b.ln_2_out.out),
                    ("ln_2_out.mean", b.ln_2_out.mean),
                    ("ln_2_out.rstd", b.ln_2_out.rstd),
                    ("residual_3", b.residual_3),
                    ("next_out.out", b.next_out.out),
                    ("next_out.mean", b.next_out.mean),
                    ("next_out.rstd", b.next_out.rstd),
                    ("keys", span(b.keys.buf, b.keys.extent())),
                    ("values", span(b.values.buf, b.values.extent())),
                ]);
            }
            self.op(
                "decode_blocks",
                || self.a.decode_blocks(&blocks_a, $eps),
                || self.b.decode_blocks(&blocks_b, $eps),
                &outputs,
            )
        }
    };
    (@op $op:ident ($($arg:ident: $ty:ty),* $(,)?) -> $ret:ty) => {
        fn $op(&self, $($arg: $ty),*) -> $ret {
            let outputs: &[(&'static str, Tensor<'_, Self>)] =
                &compare_ops!(@outputs $op $($arg)*);
            $(let $arg = Split::split($arg);)*
            self.op(
                stringify!($op),
                || self.a.$op($($arg.0),*),
                || self.b.$op($($arg.1),*),
                outputs,
            )
        }
    };

    // What each op writes (a strided matrix or heads as the span of elements it covers).
    (@outputs upload $src:ident $dst:ident) => { [("dst", $dst)] };
    (@outputs upload_ids $src:ident $dst:ident) => { [] };
    (@outputs fill $dst:ident $value:ident) => { [("dst", $dst)] };
    (@outputs copy $src:ident $dst:ident) => { [("dst", span($dst.buf, $dst.extent()))] };
    (@outputs to_f32 $src:ident $dst:ident) => { [("dst", $dst)] };
    (@outputs keep_bf16_weights $weights:ident) => { [] };
    (@outputs matmul $a:ident $b:ident $bias:ident $c:ident) => {
        [("c", span($c.buf, $c.extent()))]
    };
    (@outputs matmul_add $a:ident $b:ident $bias:ident $c:ident) => {
        [("c", span($c.buf, $c.extent()))]
    };
    (@outputs bias_backward $dout:ident $dbias:ident) => { [("dbias", $dbias)] };
    (@outputs linear_gelu $x:ident $w:ident $bias:ident $pre:ident $out:ident) => {
        [("pre", $pre), ("out", $out)]
    };
    (@outputs matmul_gelu_backward $dy:ident $w:ident $pre:ident $dpre:ident) => {
        [("dpre", $dpre)]
    };
    // `pre` and `act` are scratch (a fused kernel need not write them): `out` only.
    (@outputs mlp_forward $x:ident $fc:ident $pre:ident $act:ident $proj:ident $out:ident) => {
        [("out", $out)]
    };
    (@outputs add $a:ident $b:ident $out:ident) => { [("out", $out)] };
    (@outputs scale $x:ident $alpha:ident) => { [("x", $x)] };
    (@outputs gelu $x:ident $out:ident) => { [("out", $out)] };
    (@outputs gelu_backward $x:ident $dout:ident $dx:ident) => { [("dx", $dx)] };
    (@outputs layernorm $x:ident $gamma:ident $beta:ident $out:ident $mean:ident $rstd:ident
        $eps:ident) => {
        [("out", $out), ("mean", $mean), ("rstd", $rstd)]
    };
    (@outputs layernorm_backward $x:ident $gamma:ident $mean:ident $rstd:ident $dout:ident
        $dx:ident $dgamma:ident $dbeta:ident) => {
        [("dx", $dx), ("dgamma", $dgamma), ("dbeta", $dbeta)]
    };
    (@outputs residual_layernorm $a:ident $b:ident $residual:ident $gamma:ident $beta:ident
        $out:ident $mean:ident $rstd:ident $eps:ident) => {
        [("residual", $residual), ("out", $out), ("mean", $mean), ("rstd", $rstd)]
    };
    (@outputs softmax $x:ident $out:ident $scale:ident $causal_offset:ident) => {
        [("out", $out)]
    };
    (@outputs softmax_backward $probs:ident $dprobs:ident $dx:ident $scale:ident) => {
        [("dx", $dx)]
    };
    (@outputs embedding $ids:ident $wte:ident $wpe:ident $out:ident $pos_offset:ident) => {
        [("out", $out)]
    };
    (@outputs embedding_backward $ids:ident $dout:ident $dwte:ident $dwpe:ident) => {
        [("dwte", $dwte), ("dwpe", $dwpe)]
    };
    (@outputs softmax_cross_entropy $logits:ident $targets:ident $vocab:ident $losses:ident
        $dlogits:ident $grad_scale:ident) => {{
        let mut outputs = vec![("losses", $losses)];
        outputs.extend($dlogits.map(|d| ("dlogits", d)));
        outputs
    }};
    (@outputs adamw $param:ident $grad:ident $m:ident $v:ident $step:ident) => {
        [("param", $param), ("m", $m), ("v", $v)]
    };
    (@outputs clip_scale $grad:ident $mean:ident $max_norm:ident $guard:ident $out:ident) => {
        [("out", $out)]
    };
    (@outputs adamw_scaled $param:ident $grad:ident $m:ident $v:ident $step:ident
        $scale:ident) => {
        [("param", $param), ("m", $m), ("v", $v)]
    };
    (@outputs attention_forward $q:ident $k:ident $v:ident $out:ident $workspace:ident
        $pos_offset:ident) => {
        [("out", span($out.buf, $out.extent()))]
    };
    (@outputs attention_backward $q:ident $k:ident $v:ident $out:ident $dout:ident $dq:ident
        $dk:ident $dv:ident $workspace:ident $scratch:ident) => {
        [
            ("dq", span($dq.buf, $dq.extent())),
            ("dk", span($dk.buf, $dk.extent())),
            ("dv", span($dv.buf, $dv.extent())),
        ]
    };
    // `qkv`, `atty` and `workspace` are scratch: `out` and the cache.
    (@outputs decode_attention $x:ident $qkv_w:ident $qkv:ident $keys:ident $values:ident
        $atty:ident $workspace:ident $proj:ident $out:ident) => {
        [
            ("out", $out),
            ("keys", span($keys.buf, $keys.extent())),
            ("values", span($values.buf, $values.extent())),
        ]
    };
}

andrea_core::for_each_op!(compare_ops);
