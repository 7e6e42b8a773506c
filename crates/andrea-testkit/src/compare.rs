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

impl<A: Backend, B: Backend> MemoryOps for Compare<A, B> {
    type Buffer = Pair<A::Buffer, B::Buffer>;
    type IdBuffer = Pair<A::IdBuffer, B::IdBuffer>;

    fn name(&self) -> String {
        format!("compare({} vs {})", self.a.name(), self.b.name())
    }
    fn alloc(&self, len: usize) -> Result<Self::Buffer> {
        Ok(Pair {
            a: self.a.alloc(len)?,
            b: self.b.alloc(len)?,
        })
    }
    fn alloc_ids(&self, len: usize) -> Result<Self::IdBuffer> {
        Ok(Pair {
            a: self.a.alloc_ids(len)?,
            b: self.b.alloc_ids(len)?,
        })
    }
    fn upload(&self, src: &[f32], dst: Tensor<'_, Self>) -> Result<()> {
        let (da, db) = dst.split();
        self.op(
            "upload",
            || self.a.upload(src, da),
            || self.b.upload(src, db),
            &[("dst", dst)],
        )
    }
    fn download(&self, src: Tensor<'_, Self>, dst: &mut [f32]) -> Result<()> {
        let (sa, sb) = src.split();
        let mut other = vec![0.0; dst.len()];
        self.op(
            "download",
            || self.a.download(sa, dst),
            || self.b.download(sb, &mut other),
            &[("src", src)],
        )
    }
    fn upload_ids(&self, src: &[u32], dst: Ids<'_, Self>) -> Result<()> {
        let (da, db) = dst.split();
        self.op(
            "upload_ids",
            || self.a.upload_ids(src, da),
            || self.b.upload_ids(src, db),
            &[],
        )
    }
    fn synchronize(&self) -> Result<()> {
        self.a.synchronize()?;
        self.b.synchronize()
    }
    fn fill(&self, dst: Tensor<'_, Self>, value: f32) -> Result<()> {
        let (da, db) = dst.split();
        self.op(
            "fill",
            || self.a.fill(da, value),
            || self.b.fill(db, value),
            &[("dst", dst)],
        )
    }
    fn copy(&self, src: Mat<'_, Self>, dst: Mat<'_, Self>) -> Result<()> {
        let ((sa, sb), (da, db)) = (src.split(), dst.split());
        self.op(
            "copy",
            || self.a.copy(sa, da),
            || self.b.copy(sb, db),
            &[("dst", span(dst.buf, dst.extent()))],
        )
    }
}

impl<A: Backend, B: Backend> LinalgOps for Compare<A, B> {
    fn matmul(
        &self,
        a: Mat<'_, Self>,
        b: Mat<'_, Self>,
        bias: Option<Tensor<'_, Self>>,
        c: Mat<'_, Self>,
    ) -> Result<()> {
        let ((aa, ab), (ba, bb), (biasa, biasb), (ca, cb)) =
            (a.split(), b.split(), bias.split(), c.split());
        self.op(
            "matmul",
            || self.a.matmul(aa, ba, biasa, ca),
            || self.b.matmul(ab, bb, biasb, cb),
            &[("c", span(c.buf, c.extent()))],
        )
    }
    fn matmul_add(
        &self,
        a: Mat<'_, Self>,
        b: Mat<'_, Self>,
        bias: Option<Tensor<'_, Self>>,
        c: Mat<'_, Self>,
    ) -> Result<()> {
        let ((aa, ab), (ba, bb), (biasa, biasb), (ca, cb)) =
            (a.split(), b.split(), bias.split(), c.split());
        self.op(
            "matmul_add",
            || self.a.matmul_add(aa, ba, biasa, ca),
            || self.b.matmul_add(ab, bb, biasb, cb),
            &[("c", span(c.buf, c.extent()))],
        )
    }
    fn bias_backward(&self, dout: Tensor<'_, Self>, dbias: Tensor<'_, Self>) -> Result<()> {
        let ((ga, gb), (da, db)) = (dout.split(), dbias.split());
        self.op(
            "bias_backward",
            || self.a.bias_backward(ga, da),
            || self.b.bias_backward(gb, db),
            &[("dbias", dbias)],
        )
    }
    fn matmul_scratch_len(&self, m: usize, k: usize, n: usize) -> usize {
        let (a, b) = (
            self.a.matmul_scratch_len(m, k, n),
            self.b.matmul_scratch_len(m, k, n),
        );
        a.max(b)
    }
    fn linear_gelu(
        &self,
        x: Mat<'_, Self>,
        w: Mat<'_, Self>,
        bias: Tensor<'_, Self>,
        pre: Tensor<'_, Self>,
        out: Tensor<'_, Self>,
    ) -> Result<()> {
        let ((xa, xb), (wa, wb), (ba, bb), (pa, pb), (oa, ob)) =
            (x.split(), w.split(), bias.split(), pre.split(), out.split());
        self.op(
            "linear_gelu",
            || self.a.linear_gelu(xa, wa, ba, pa, oa),
            || self.b.linear_gelu(xb, wb, bb, pb, ob),
            &[("pre", pre), ("out", out)],
        )
    }
    fn matmul_gelu_backward(
        &self,
        dy: Mat<'_, Self>,
        w: Mat<'_, Self>,
        pre: Tensor<'_, Self>,
        dpre: Tensor<'_, Self>,
    ) -> Result<()> {
        let ((da, db), (wa, wb), (pa, pb), (ga, gb)) =
            (dy.split(), w.split(), pre.split(), dpre.split());
        self.op(
            "matmul_gelu_backward",
            || self.a.matmul_gelu_backward(da, wa, pa, ga),
            || self.b.matmul_gelu_backward(db, wb, pb, gb),
            &[("dpre", dpre)],
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
        let ((xa, xb), (fa, fb), (pa, pb)) = (x.split(), fc.split(), pre.split());
        let ((aa, ab), (ja, jb), (oa, ob)) = (act.split(), proj.split(), out.split());
        // `pre` and `act` are scratch (a fused kernel need not write them): `out` only.
        self.op(
            "mlp_forward",
            || self.a.mlp_forward(xa, fa, pa, aa, ja, oa),
            || self.b.mlp_forward(xb, fb, pb, ab, jb, ob),
            &[("out", out)],
        )
    }
}

impl<A: Backend, B: Backend> ElementwiseOps for Compare<A, B> {
    fn add(&self, a: Tensor<'_, Self>, b: Tensor<'_, Self>, out: Tensor<'_, Self>) -> Result<()> {
        let ((aa, ab), (ba, bb), (oa, ob)) = (a.split(), b.split(), out.split());
        self.op(
            "add",
            || self.a.add(aa, ba, oa),
            || self.b.add(ab, bb, ob),
            &[("out", out)],
        )
    }
    fn scale(&self, x: Tensor<'_, Self>, alpha: f32) -> Result<()> {
        let (xa, xb) = x.split();
        self.op(
            "scale",
            || self.a.scale(xa, alpha),
            || self.b.scale(xb, alpha),
            &[("x", x)],
        )
    }
    fn gelu(&self, x: Tensor<'_, Self>, out: Tensor<'_, Self>) -> Result<()> {
        let ((xa, xb), (oa, ob)) = (x.split(), out.split());
        self.op(
            "gelu",
            || self.a.gelu(xa, oa),
            || self.b.gelu(xb, ob),
            &[("out", out)],
        )
    }
    fn gelu_backward(
        &self,
        x: Tensor<'_, Self>,
        dout: Tensor<'_, Self>,
        dx: Tensor<'_, Self>,
    ) -> Result<()> {
        let ((xa, xb), (ga, gb), (da, db)) = (x.split(), dout.split(), dx.split());
        self.op(
            "gelu_backward",
            || self.a.gelu_backward(xa, ga, da),
            || self.b.gelu_backward(xb, gb, db),
            &[("dx", dx)],
        )
    }
}

impl<A: Backend, B: Backend> LayerNormOps for Compare<A, B> {
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
        let ((xa, xb), (ga, gb), (ba, bb)) = (x.split(), gamma.split(), beta.split());
        let ((oa, ob), (ma, mb), (ra, rb)) = (out.split(), mean.split(), rstd.split());
        self.op(
            "layernorm",
            || self.a.layernorm(xa, ga, ba, oa, ma, ra, eps),
            || self.b.layernorm(xb, gb, bb, ob, mb, rb, eps),
            &[("out", out), ("mean", mean), ("rstd", rstd)],
        )
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
        let ((xa, xb), (ga, gb), (ma, mb), (ra, rb)) =
            (x.split(), gamma.split(), mean.split(), rstd.split());
        let ((oa, ob), (dxa, dxb), (dga, dgb), (dba, dbb)) =
            (dout.split(), dx.split(), dgamma.split(), dbeta.split());
        self.op(
            "layernorm_backward",
            || self.a.layernorm_backward(xa, ga, ma, ra, oa, dxa, dga, dba),
            || self.b.layernorm_backward(xb, gb, mb, rb, ob, dxb, dgb, dbb),
            &[("dx", dx), ("dgamma", dgamma), ("dbeta", dbeta)],
        )
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
        let ((aa, ab), (ba, bb), (sa, sb)) = (a.split(), b.split(), residual.split());
        let ((ga, gb), (ta, tb)) = (gamma.split(), beta.split());
        let ((oa, ob), (ma, mb), (ra, rb)) = (out.split(), mean.split(), rstd.split());
        self.op(
            "residual_layernorm",
            || {
                self.a
                    .residual_layernorm(aa, ba, sa, ga, ta, oa, ma, ra, eps)
            },
            || {
                self.b
                    .residual_layernorm(ab, bb, sb, gb, tb, ob, mb, rb, eps)
            },
            &[
                ("residual", residual),
                ("out", out),
                ("mean", mean),
                ("rstd", rstd),
            ],
        )
    }
}

impl<A: Backend, B: Backend> SoftmaxOps for Compare<A, B> {
    fn softmax(
        &self,
        x: Tensor<'_, Self>,
        out: Tensor<'_, Self>,
        scale: f32,
        causal_offset: Option<usize>,
    ) -> Result<()> {
        let ((xa, xb), (oa, ob)) = (x.split(), out.split());
        self.op(
            "softmax",
            || self.a.softmax(xa, oa, scale, causal_offset),
            || self.b.softmax(xb, ob, scale, causal_offset),
            &[("out", out)],
        )
    }
    fn softmax_backward(
        &self,
        probs: Tensor<'_, Self>,
        dprobs: Tensor<'_, Self>,
        dx: Tensor<'_, Self>,
        scale: f32,
    ) -> Result<()> {
        let ((pa, pb), (ga, gb), (da, db)) = (probs.split(), dprobs.split(), dx.split());
        self.op(
            "softmax_backward",
            || self.a.softmax_backward(pa, ga, da, scale),
            || self.b.softmax_backward(pb, gb, db, scale),
            &[("dx", dx)],
        )
    }
}

impl<A: Backend, B: Backend> EmbeddingOps for Compare<A, B> {
    fn embedding(
        &self,
        ids: Ids<'_, Self>,
        wte: Tensor<'_, Self>,
        wpe: Tensor<'_, Self>,
        out: Tensor<'_, Self>,
        pos_offset: usize,
    ) -> Result<()> {
        let ((ia, ib), (ea, eb), (pa, pb), (oa, ob)) =
            (ids.split(), wte.split(), wpe.split(), out.split());
        self.op(
            "embedding",
            || self.a.embedding(ia, ea, pa, oa, pos_offset),
            || self.b.embedding(ib, eb, pb, ob, pos_offset),
            &[("out", out)],
        )
    }
    fn embedding_backward(
        &self,
        ids: Ids<'_, Self>,
        dout: Tensor<'_, Self>,
        dwte: Tensor<'_, Self>,
        dwpe: Tensor<'_, Self>,
    ) -> Result<()> {
        let ((ia, ib), (ga, gb), (ea, eb), (pa, pb)) =
            (ids.split(), dout.split(), dwte.split(), dwpe.split());
        self.op(
            "embedding_backward",
            || self.a.embedding_backward(ia, ga, ea, pa),
            || self.b.embedding_backward(ib, gb, eb, pb),
            &[("dwte", dwte), ("dwpe", dwpe)],
        )
    }
}

impl<A: Backend, B: Backend> LossOps for Compare<A, B> {
    fn softmax_cross_entropy(
        &self,
        logits: Tensor<'_, Self>,
        targets: Ids<'_, Self>,
        vocab: usize,
        losses: Tensor<'_, Self>,
        dlogits: Option<Tensor<'_, Self>>,
        grad_scale: f32,
    ) -> Result<()> {
        let ((za, zb), (ta, tb), (la, lb), (da, db)) = (
            logits.split(),
            targets.split(),
            losses.split(),
            dlogits.split(),
        );
        let mut outputs = vec![("losses", losses)];
        outputs.extend(dlogits.map(|d| ("dlogits", d)));
        self.op(
            "softmax_cross_entropy",
            || {
                self.a
                    .softmax_cross_entropy(za, ta, vocab, la, da, grad_scale)
            },
            || {
                self.b
                    .softmax_cross_entropy(zb, tb, vocab, lb, db, grad_scale)
            },
            &outputs,
        )
    }
}

impl<A: Backend, B: Backend> OptimOps for Compare<A, B> {
    fn sum_squares(&self, x: Tensor<'_, Self>) -> Result<f64> {
        let (xa, xb) = x.split();
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
    fn adamw(
        &self,
        param: Tensor<'_, Self>,
        grad: Tensor<'_, Self>,
        m: Tensor<'_, Self>,
        v: Tensor<'_, Self>,
        step: &AdamWStep,
    ) -> Result<()> {
        let ((pa, pb), (ga, gb), (ma, mb), (va, vb)) =
            (param.split(), grad.split(), m.split(), v.split());
        self.op(
            "adamw",
            || self.a.adamw(pa, ga, ma, va, step),
            || self.b.adamw(pb, gb, mb, vb, step),
            &[("param", param), ("m", m), ("v", v)],
        )
    }
    fn clip_scale(
        &self,
        grad: Tensor<'_, Self>,
        mean: f64,
        max_norm: Option<f32>,
        guard: Option<Tensor<'_, Self>>,
        out: Tensor<'_, Self>,
    ) -> Result<()> {
        let ((ga, gb), (oa, ob)) = (grad.split(), out.split());
        let (qa, qb) = match guard {
            Some(g) => {
                let (a, b) = g.split();
                (Some(a), Some(b))
            }
            None => (None, None),
        };
        self.op(
            "clip_scale",
            || self.a.clip_scale(ga, mean, max_norm, qa, oa),
            || self.b.clip_scale(gb, mean, max_norm, qb, ob),
            &[("out", out)],
        )
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
        let ((pa, pb), (ga, gb), (ma, mb), (va, vb), (sa, sb)) = (
            param.split(),
            grad.split(),
            m.split(),
            v.split(),
            scale.split(),
        );
        self.op(
            "adamw_scaled",
            || self.a.adamw_scaled(pa, ga, ma, va, step, sa),
            || self.b.adamw_scaled(pb, gb, mb, vb, step, sb),
            &[("param", param), ("m", m), ("v", v)],
        )
    }
}

impl<A: Backend, B: Backend> DecodeOps for Compare<A, B> {
    fn decode_blocks(&self, blocks: &[DecodeBlockOf<'_, Self>], eps: f32) -> Result<()> {
        let (blocks_a, blocks_b): (Vec<_>, Vec<_>) = blocks.iter().map(|b| b.split()).unzip();
        // The scratch views aside, every output: the blocks' residual streams and
        // LayerNorms, and the caches.
        let mut outputs = Vec::with_capacity(10 * blocks.len());
        for b in blocks {
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
            || self.a.decode_blocks(&blocks_a, eps),
            || self.b.decode_blocks(&blocks_b, eps),
            &outputs,
        )
    }
}

impl<A: Backend, B: Backend> AttentionOps for Compare<A, B> {
    /// Heads apart only where both sides take that layout.
    fn kv_heads_apart(&self) -> bool {
        self.a.kv_heads_apart() && self.b.kv_heads_apart()
    }
    /// Room for either side's workspace (each keeps its own form in it).
    fn attention_workspace_len(&self, shape: AttentionShape) -> usize {
        self.a
            .attention_workspace_len(shape)
            .max(self.b.attention_workspace_len(shape))
    }
    fn attention_backward_scratch_len(&self, shape: AttentionShape) -> usize {
        self.a
            .attention_backward_scratch_len(shape)
            .max(self.b.attention_backward_scratch_len(shape))
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
        let ((qa, qb), (ka, kb), (va, vb)) = (q.split(), k.split(), v.split());
        let ((oa, ob), (wa, wb)) = (out.split(), workspace.split());
        self.op(
            "attention_forward",
            || self.a.attention_forward(qa, ka, va, oa, wa, pos_offset),
            || self.b.attention_forward(qb, kb, vb, ob, wb, pos_offset),
            &[("out", span(out.buf, out.extent()))],
        )
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
        let ((xa, xb), (qwa, qwb), (qa, qb)) = (x.split(), qkv_w.split(), qkv.split());
        let ((ka, kb), (va, vb), (aa, ab)) = (keys.split(), values.split(), atty.split());
        let ((wa, wb), (pa, pb), (oa, ob)) = (workspace.split(), proj.split(), out.split());
        // `qkv`, `atty` and `workspace` are scratch: `out` and the cache.
        self.op(
            "decode_attention",
            || self.a.decode_attention(xa, qwa, qa, ka, va, aa, wa, pa, oa),
            || self.b.decode_attention(xb, qwb, qb, kb, vb, ab, wb, pb, ob),
            &[
                ("out", out),
                ("keys", span(keys.buf, keys.extent())),
                ("values", span(values.buf, values.extent())),
            ],
        )
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
        let ((qa, qb), (ka, kb), (va, vb), (oa, ob)) =
            (q.split(), k.split(), v.split(), out.split());
        let ((ga, gb), (dqa, dqb), (dka, dkb), (dva, dvb)) =
            (dout.split(), dq.split(), dk.split(), dv.split());
        let ((wa, wb), (sa, sb)) = (workspace.split(), scratch.split());
        self.op(
            "attention_backward",
            || {
                self.a
                    .attention_backward(qa, ka, va, oa, ga, dqa, dka, dva, wa, sa)
            },
            || {
                self.b
                    .attention_backward(qb, kb, vb, ob, gb, dqb, dkb, dvb, wb, sb)
            },
            &[
                ("dq", span(dq.buf, dq.extent())),
                ("dk", span(dk.buf, dk.extent())),
                ("dv", span(dv.buf, dv.extent())),
            ],
        )
    }
}
