//! add, scale, gelu and gelu_backward on views of rank 1 to 3 at an offset inside a
//! larger buffer, in place (`out` exactly an input) or not. Values in [-1, 1]; GELU
//! inputs in [-8, 8].

use andrea_core::Backend;
use proptest::prelude::*;

use super::linalg::poison;
use super::{buffer, close, read_all, run, to_f64, view, Case, Config, OrFail};
use crate::random::Rand;
use crate::{reference, tol};

/// Where an elementwise op writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Out {
    /// Its own buffer.
    Separate,
    /// Exactly the first input (`out == a`, `out == x`, `dx == dout`).
    First,
    /// Exactly the second input (`out == b`).
    Second,
}

fn case(modes: &'static [Out]) -> impl Strategy<Value = (Vec<usize>, usize, Out, u64)> {
    (
        super::shape(5000),
        0..3usize,
        prop::sample::select(modes),
        any::<u64>(),
    )
}

/// Host data for a view of `n` elements at `offset` in a buffer with slack after it.
fn data(r: &mut Rand, n: usize, offset: usize, lo: f32, hi: f32) -> Vec<f32> {
    r.vec(n + 2 * offset, lo, hi)
}

/// `out = a + b`, with `out` separate, `a` or `b`.
pub fn add<B: Backend>(be: &B, cfg: &Config) -> Case {
    let modes = &[Out::Separate, Out::First, Out::Second];
    run(cfg, "add", case(modes), |(dims, off, mode, seed)| {
        let mut r = Rand::new(seed);
        let n: usize = dims.iter().product();
        let (a, b) = (
            data(&mut r, n, off, -1.0, 1.0),
            data(&mut r, n, off, -1.0, 1.0),
        );
        let out = poison(&mut r, n + 2 * off);
        let (a_buf, b_buf, o_buf) = (buffer(be, &a)?, buffer(be, &b)?, buffer(be, &out)?);
        let (av, bv) = (view(&a_buf, off, &dims), view(&b_buf, off, &dims));
        let (ov, written, before) = match mode {
            Out::Separate => (view(&o_buf, off, &dims), &o_buf, &out),
            Out::First => (av, &a_buf, &a),
            Out::Second => (bv, &b_buf, &b),
        };
        be.add(av, bv, ov).or_fail("add")?;

        let mut want = to_f64(before);
        let (a64, b64) = (to_f64(&a[off..off + n]), to_f64(&b[off..off + n]));
        reference::add(&mut want[off..off + n], &a64, &b64);
        close(
            tol::one_rounding(),
            &format!("add ({mode:?}): out"),
            &read_all(be, written)?,
            &want,
        )
    })
}

/// `x *= alpha` in place.
pub fn scale<B: Backend>(be: &B, cfg: &Config) -> Case {
    let case = (super::shape(5000), 0..3usize, -3.0f32..3.0, any::<u64>());
    run(cfg, "scale", case, |(dims, off, alpha, seed)| {
        let mut r = Rand::new(seed);
        let n: usize = dims.iter().product();
        let x = data(&mut r, n, off, -1.0, 1.0);
        let x_buf = buffer(be, &x)?;
        be.scale(view(&x_buf, off, &dims), alpha).or_fail("scale")?;

        let mut want = to_f64(&x);
        reference::scale(&mut want[off..off + n], alpha as f64);
        close(
            tol::one_rounding(),
            "scale: x",
            &read_all(be, &x_buf)?,
            &want,
        )
    })
}

/// `out = GELU(x)` (tanh form), in place or not.
pub fn gelu<B: Backend>(be: &B, cfg: &Config) -> Case {
    run(
        cfg,
        "gelu",
        case(&[Out::Separate, Out::First]),
        |(dims, off, mode, seed)| {
            let mut r = Rand::new(seed);
            let n: usize = dims.iter().product();
            let x = data(&mut r, n, off, -8.0, 8.0);
            let out = poison(&mut r, n + 2 * off);
            let (x_buf, o_buf) = (buffer(be, &x)?, buffer(be, &out)?);
            let xv = view(&x_buf, off, &dims);
            let (ov, written, before) = match mode {
                Out::Separate => (view(&o_buf, off, &dims), &o_buf, &out),
                _ => (xv, &x_buf, &x),
            };
            be.gelu(xv, ov).or_fail("gelu")?;

            let mut want = to_f64(before);
            reference::gelu(&mut want[off..off + n], &to_f64(&x[off..off + n]));
            close(
                tol::gelu(),
                &format!("gelu ({mode:?}): out"),
                &read_all(be, written)?,
                &want,
            )
        },
    )
}

/// `dx = dout·GELU'(x)`, with `dx` separate or exactly `dout`.
pub fn gelu_backward<B: Backend>(be: &B, cfg: &Config) -> Case {
    let modes = &[Out::Separate, Out::First];
    run(
        cfg,
        "gelu_backward",
        case(modes),
        |(dims, off, mode, seed)| {
            let mut r = Rand::new(seed);
            let n: usize = dims.iter().product();
            let x = data(&mut r, n, off, -8.0, 8.0);
            let dout = data(&mut r, n, off, -1.0, 1.0);
            let dx = poison(&mut r, n + 2 * off);
            let (x_buf, d_buf, dx_buf) = (buffer(be, &x)?, buffer(be, &dout)?, buffer(be, &dx)?);
            let (xv, dv) = (view(&x_buf, off, &dims), view(&d_buf, off, &dims));
            let (dxv, written, before) = match mode {
                Out::Separate => (view(&dx_buf, off, &dims), &dx_buf, &dx),
                _ => (dv, &d_buf, &dout),
            };
            be.gelu_backward(xv, dv, dxv).or_fail("gelu_backward")?;

            let mut want = to_f64(before);
            let (x64, d64) = (to_f64(&x[off..off + n]), to_f64(&dout[off..off + n]));
            reference::gelu_backward(&mut want[off..off + n], &x64, &d64);
            let name = format!("gelu_backward ({mode:?}): dx");
            close(tol::gelu_backward(), &name, &read_all(be, written)?, &want)
        },
    )
}
