//! matmul, bias_backward, copy, linear_gelu and matmul_gelu_backward. Operands in [-1, 1]; every matrix is
//! stored row-major or transposed (a [`Matrix::t`](andrea_core::Matrix::t) view), with
//! padded rows and an offset, and batched with gaps between batch entries.

use andrea_core::Backend;
use proptest::prelude::*;

use super::{buffer, close, read_all, run, size, size_or_big, to_f64, view, Case, Config, OrFail};
use crate::random::Rand;
use crate::reference::{self, Layout};
use crate::{tol, Tol};

/// How a logical `[rows, cols]` matrix is stored.
#[derive(Debug, Clone)]
pub(crate) struct Store {
    /// Stored as `[cols, rows]` and viewed through a transpose.
    pub transposed: bool,
    /// Extra elements after each stored row (and between batch entries).
    pub pad: usize,
    /// Elements before the first one.
    pub offset: usize,
}

pub(crate) fn store() -> impl Strategy<Value = Store> {
    (
        any::<bool>(),
        prop_oneof![2 => Just(0usize), 1 => 1..4usize],
        0..3usize,
    )
        .prop_map(|(transposed, pad, offset)| Store {
            transposed,
            pad,
            offset,
        })
}

impl Store {
    /// The layout of `batch` `[rows, cols]` matrices stored this way.
    pub fn layout(&self, batch: usize, rows: usize, cols: usize) -> Layout {
        let (sr, sc) = if self.transposed {
            (cols, rows)
        } else {
            (rows, cols)
        };
        let row_stride = sc + self.pad;
        let l = Layout {
            offset: self.offset,
            batch,
            rows: sr,
            cols: sc,
            batch_stride: if batch > 1 {
                sr * row_stride + self.pad
            } else {
                0
            },
            row_stride,
            col_stride: 1,
        };
        if self.transposed {
            l.t()
        } else {
            l
        }
    }

    /// Length of a buffer holding `l` with some slack after it.
    pub fn buffer_len(&self, l: &Layout) -> usize {
        l.span() + self.pad
    }
}

/// Memory an op overwrites: random values, or (one time in four) NaN, so an op that
/// reads its output before writing it (`0·c`) is caught.
pub(crate) fn poison(r: &mut Rand, n: usize) -> Vec<f32> {
    if r.chance(0.25) {
        vec![f32::NAN; n]
    } else {
        r.vec(n, -1.0, 1.0)
    }
}

#[derive(Debug, Clone)]
struct MatmulCase {
    batch: usize,
    m: usize,
    k: usize,
    n: usize,
    a: Store,
    b: Store,
    c: Store,
    /// Whether `a` (`b`) has `c`'s batch; otherwise batch 1, broadcast.
    a_batched: bool,
    b_batched: bool,
    bias: bool,
    accumulate: bool,
    seed: u64,
}

fn matmul_case() -> impl Strategy<Value = MatmulCase> {
    let dims = (
        prop_oneof![3 => Just(1usize), 1 => 2..=3usize],
        size_or_big(80, 300),
        size_or_big(80, 300),
        size_or_big(80, 300),
    );
    let flags = (any::<bool>(), any::<bool>(), any::<bool>(), any::<bool>());
    (dims, (store(), store(), store()), flags, any::<u64>()).prop_map(
        |((batch, m, k, n), (a, b, c), (a_batched, b_batched, bias, accumulate), seed)| {
            MatmulCase {
                batch,
                m,
                k,
                n,
                a,
                b,
                c,
                a_batched,
                b_batched,
                bias,
                accumulate,
                seed,
            }
        },
    )
}

/// `c (+)= a·b (+ bias)` over strided, transposed, batched and broadcast operands.
pub fn matmul<B: Backend>(be: &B, cfg: &Config) -> Case {
    run(cfg, "matmul", matmul_case(), |c| {
        let mut r = Rand::new(c.seed);
        let la = c.a.layout(if c.a_batched { c.batch } else { 1 }, c.m, c.k);
        let lb = c.b.layout(if c.b_batched { c.batch } else { 1 }, c.k, c.n);
        let lc = c.c.layout(c.batch, c.m, c.n);
        let a = r.vec(c.a.buffer_len(&la), -1.0, 1.0);
        let b = r.vec(c.b.buffer_len(&lb), -1.0, 1.0);
        let bias = r.vec(c.n + 2, -1.0, 1.0);
        let c0 = if c.accumulate {
            r.vec(c.c.buffer_len(&lc), -1.0, 1.0)
        } else {
            poison(&mut r, c.c.buffer_len(&lc))
        };
        let (a_buf, b_buf, c_buf) = (buffer(be, &a)?, buffer(be, &b)?, buffer(be, &c0)?);
        let bias_buf = buffer(be, &bias)?;
        let bias_view = c.bias.then(|| view(&bias_buf, 1, &[c.n]));
        if c.accumulate {
            be.matmul_add(la.on(&a_buf), lb.on(&b_buf), bias_view, lc.on(&c_buf))
        } else {
            be.matmul(la.on(&a_buf), lb.on(&b_buf), bias_view, lc.on(&c_buf))
        }
        .or_fail("matmul")?;

        let mut want = to_f64(&c0);
        let bias64 = to_f64(&bias[1..=c.n]);
        let (a64, b64) = (to_f64(&a), to_f64(&b));
        let bias_ref = c.bias.then_some(&bias64[..]);
        reference::matmul(&a64, la, &b64, lb, bias_ref, &mut want, lc, c.accumulate);
        close(tol::matmul(c.k), "matmul: c", &read_all(be, &c_buf)?, &want)
    })
}

/// `dbias += column sums of dout` for `dout` of rank 1 to 3.
pub fn bias_backward<B: Backend>(be: &B, cfg: &Config) -> Case {
    let case = (super::shape(6000), 0..3usize, any::<u64>());
    run(cfg, "bias_backward", case, |(dims, offset, seed)| {
        let mut r = Rand::new(seed);
        let m = *dims.last().unwrap_or(&1);
        let rows = dims.iter().product::<usize>() / m;
        let dout = r.vec(rows * m + offset, -1.0, 1.0);
        let dbias = r.vec(m + 2 * offset, -1.0, 1.0);
        let (dout_buf, dbias_buf) = (buffer(be, &dout)?, buffer(be, &dbias)?);
        be.bias_backward(
            view(&dout_buf, offset, &dims),
            view(&dbias_buf, offset, &[m]),
        )
        .or_fail("bias_backward")?;

        let mut want = to_f64(&dbias);
        let d64 = to_f64(&dout[offset..]);
        reference::bias_backward(&mut want[offset..offset + m], &d64, rows, m);
        close(
            tol::bias_backward(rows),
            "bias_backward: dbias",
            &read_all(be, &dbias_buf)?,
            &want,
        )
    })
}

/// `dst = src` between any two layouts of one size; bit-exact.
pub fn copy<B: Backend>(be: &B, cfg: &Config) -> Case {
    let case = (
        1..=3usize,
        size(40),
        size(40),
        store(),
        store(),
        any::<u64>(),
    );
    run(cfg, "copy", case, |(batch, rows, cols, s, d, seed)| {
        let mut r = Rand::new(seed);
        let (ls, ld) = (s.layout(batch, rows, cols), d.layout(batch, rows, cols));
        let src = r.vec(s.buffer_len(&ls), -1.0, 1.0);
        let dst = poison(&mut r, d.buffer_len(&ld));
        let (src_buf, dst_buf) = (buffer(be, &src)?, buffer(be, &dst)?);
        be.copy(ls.on(&src_buf), ld.on(&dst_buf)).or_fail("copy")?;

        let mut want = to_f64(&dst);
        reference::copy(&to_f64(&src), ls, &mut want, ld);
        close(Tol::EXACT, "copy: dst", &read_all(be, &dst_buf)?, &want)
    })
}

/// `[N, K]·[K, M]` sizes, how both operands are stored, the output's offset, a seed.
#[allow(clippy::type_complexity)]
fn product_case() -> (
    BoxedStrategy<usize>,
    BoxedStrategy<usize>,
    BoxedStrategy<usize>,
    impl Strategy<Value = Store>,
    impl Strategy<Value = Store>,
    std::ops::Range<usize>,
    proptest::num::u64::Any,
) {
    (
        size(64),
        size(64),
        size(64),
        store(),
        store(),
        0..3usize,
        any::<u64>(),
    )
}

/// `pre = x·w + bias`, `out = GELU(pre)`, with `x` and `w` in any layout.
pub fn linear_gelu<B: Backend>(be: &B, cfg: &Config) -> Case {
    run(
        cfg,
        "linear_gelu",
        product_case(),
        |(n, k, m, xs, ws, offset, seed)| {
            let mut r = Rand::new(seed);
            let (lx, lw) = (xs.layout(1, n, k), ws.layout(1, k, m));
            let x = r.vec(xs.buffer_len(&lx), -1.0, 1.0);
            let w = r.vec(ws.buffer_len(&lw), -1.0, 1.0);
            let bias = r.vec(m + offset, -1.0, 1.0);
            let pre = poison(&mut r, n * m + 2 * offset);
            let out = poison(&mut r, n * m + offset);
            let (x_buf, w_buf, bias_buf) = (buffer(be, &x)?, buffer(be, &w)?, buffer(be, &bias)?);
            let (pre_buf, out_buf) = (buffer(be, &pre)?, buffer(be, &out)?);
            let pre_view = view(&pre_buf, offset, &[n, m]);
            let out_view = view(&out_buf, offset, &[n, m]);
            be.linear_gelu(
                lx.on(&x_buf),
                lw.on(&w_buf),
                view(&bias_buf, offset, &[m]),
                pre_view,
                out_view,
            )
            .or_fail("linear_gelu")?;

            let mut want_pre = to_f64(&pre);
            let lp = Layout {
                offset,
                ..Layout::dense(1, n, m)
            };
            let (x64, w64, b64) = (to_f64(&x), to_f64(&w), to_f64(&bias[offset..]));
            reference::matmul(&x64, lx, &w64, lw, Some(&b64), &mut want_pre, lp, false);
            let mut want_out = to_f64(&out);
            reference::gelu(
                &mut want_out[offset..offset + n * m],
                &want_pre[offset..offset + n * m],
            );
            close(
                tol::matmul(k),
                "linear_gelu: pre",
                &read_all(be, &pre_buf)?,
                &want_pre,
            )?;
            // GELU' <= 1.13 carries pre's error into out.
            let out_tol = tol::gelu().plus(tol::matmul(k), 1.2);
            close(
                out_tol,
                "linear_gelu: out",
                &read_all(be, &out_buf)?,
                &want_out,
            )
        },
    )
}

/// `dpre = (dy·w) ⊙ GELU'(pre)`, with `dy` and `w` in any layout (`w` typically the
/// transposed weight), `dy` and `w` in `[-1, 1]/√k` so `|dy·w| <= 1`, `pre` in `[-8, 8]`.
pub fn matmul_gelu_backward<B: Backend>(be: &B, cfg: &Config) -> Case {
    run(
        cfg,
        "matmul_gelu_backward",
        product_case(),
        |(n, k, m, ds, ws, offset, seed)| {
            let mut r = Rand::new(seed);
            let (ld, lw) = (ds.layout(1, n, k), ws.layout(1, k, m));
            let s = 1.0 / (k as f32).sqrt();
            let dy = r.vec(ds.buffer_len(&ld), -s, s);
            let w = r.vec(ws.buffer_len(&lw), -s, s);
            let pre = r.vec(n * m + 2 * offset, -8.0, 8.0);
            let dpre = poison(&mut r, n * m + 2 * offset);
            let (dy_buf, w_buf, pre_buf) = (buffer(be, &dy)?, buffer(be, &w)?, buffer(be, &pre)?);
            let dpre_buf = buffer(be, &dpre)?;
            be.matmul_gelu_backward(
                ld.on(&dy_buf),
                lw.on(&w_buf),
                view(&pre_buf, offset, &[n, m]),
                view(&dpre_buf, offset, &[n, m]),
            )
            .or_fail("matmul_gelu_backward")?;

            let mut want = to_f64(&dpre);
            let span = offset..offset + n * m;
            reference::matmul_gelu_backward(
                &to_f64(&dy),
                ld,
                &to_f64(&w),
                lw,
                &to_f64(&pre[span.clone()]),
                &mut want[span],
            );
            close(
                tol::matmul_gelu_backward(k),
                "matmul_gelu_backward: dpre",
                &read_all(be, &dpre_buf)?,
                &want,
            )?;
            close(
                Tol::EXACT,
                "matmul_gelu_backward: pre",
                &read_all(be, &pre_buf)?,
                &to_f64(&pre),
            )
        },
    )
}
