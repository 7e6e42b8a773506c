//! layernorm, layernorm_backward and residual_layernorm over `[N, C]` or `[B, T, C]`.
//!
//! Rows are `offset + u` with a per-row offset in [-2, 2] and `u` in [-1, 1], and every
//! row of two or more channels holds `offset - 1` and `offset + 1`: the variance is then
//! at least `2/C`, so `rstd` stays moderate and the tolerances need not cover
//! ill-conditioned rows (where any f32 implementation loses digits). `γ` in [-1.5, 1.5],
//! `β` and `dout` in [-1, 1]; `eps` is 1e-5 or drawn from [1e-6, 1e-2].

use andrea_core::Backend;
use proptest::prelude::*;

use super::linalg::poison;
use super::{buffer, close, read_all, run, size, size_or_big, to_f64, view, Case, Config, OrFail};
use crate::random::Rand;
use crate::{reference, tol};

#[derive(Debug, Clone)]
struct LnCase {
    /// `[N, C]` or `[B, T, C]`.
    dims: Vec<usize>,
    eps: f32,
    offset: usize,
    seed: u64,
}

fn ln_case() -> impl Strategy<Value = LnCase> {
    let lead = prop_oneof![
        size_or_big(24, 300).prop_map(|n| vec![n]),
        (size(4), size(8)).prop_map(|(b, t)| vec![b, t])
    ];
    let eps = prop_oneof![3 => Just(1e-5f32), 1 => 1e-6f32..1e-2];
    (lead, size_or_big(130, 800), eps, 0..3usize, any::<u64>()).prop_map(
        |(mut dims, c, eps, offset, seed)| {
            dims.push(c);
            LnCase {
                dims,
                eps,
                offset,
                seed,
            }
        },
    )
}

/// Rows as described in the module docs, `[n, c]`.
fn rows(r: &mut Rand, n: usize, c: usize) -> Vec<f32> {
    let mut x = Vec::with_capacity(n * c);
    for _ in 0..n {
        let shift = r.uniform(-2.0, 2.0);
        let mut row: Vec<f32> = (0..c).map(|_| shift + r.uniform(-1.0, 1.0)).collect();
        if c >= 2 {
            let i = r.below(c);
            let j = (i + 1 + r.below(c - 1)) % c;
            row[i] = shift - 1.0;
            row[j] = shift + 1.0;
        }
        x.extend(row);
    }
    x
}

/// `data` with `offset` random elements before it and after it.
fn padded(r: &mut Rand, data: &[f32], offset: usize) -> Vec<f32> {
    let mut v = r.vec(offset, -1.0, 1.0);
    v.extend_from_slice(data);
    v.extend(r.vec(offset, -1.0, 1.0));
    v
}

/// A buffer holding `data` with `offset` random elements on either side.
fn padded_buffer<B: Backend>(
    be: &B,
    r: &mut Rand,
    data: &[f32],
    offset: usize,
) -> Result<B::Buffer, proptest::test_runner::TestCaseError> {
    buffer(be, &padded(r, data, offset))
}

/// Reference forward: `(out, mean, rstd)`.
fn forward(x: &[f64], gamma: &[f64], beta: &[f64], n: usize, c: usize, eps: f32) -> [Vec<f64>; 3] {
    let (mut out, mut mean, mut rstd) = (vec![0.0; n * c], vec![0.0; n], vec![0.0; n]);
    reference::layernorm(
        &mut out, &mut mean, &mut rstd, x, gamma, beta, n, c, eps as f64,
    );
    [out, mean, rstd]
}

/// LayerNorm forward: `out`, and the saved `mean` and `rstd` (one buffer, side by side).
pub fn layernorm<B: Backend>(be: &B, cfg: &Config) -> Case {
    run(cfg, "layernorm", ln_case(), |cs| {
        let mut r = Rand::new(cs.seed);
        let (c, off) = (*cs.dims.last().unwrap_or(&1), cs.offset);
        let n = cs.dims.iter().product::<usize>() / c;
        let x = rows(&mut r, n, c);
        let x = padded(&mut r, &x, off);
        let gamma = r.vec(c, -1.5, 1.5);
        let gamma = padded(&mut r, &gamma, off);
        let beta = r.vec(c + off, -1.0, 1.0);
        let out = poison(&mut r, n * c + 2 * off);
        let stats = poison(&mut r, 2 * n + 3 * off);
        let (x_buf, g_buf, b_buf) = (buffer(be, &x)?, buffer(be, &gamma)?, buffer(be, &beta)?);
        let (o_buf, s_buf) = (buffer(be, &out)?, buffer(be, &stats)?);
        be.layernorm(
            view(&x_buf, off, &cs.dims),
            view(&g_buf, off, &[c]),
            view(&b_buf, off, &[c]),
            view(&o_buf, off, &cs.dims),
            view(&s_buf, off, &[n]),
            view(&s_buf, n + 2 * off, &[n]),
            cs.eps,
        )
        .or_fail("layernorm")?;

        let (x64, g64, b64) = (
            to_f64(&x[off..]),
            to_f64(&gamma[off..]),
            to_f64(&beta[off..]),
        );
        let [o, mean, rstd] = forward(&x64, &g64, &b64, n, c, cs.eps);
        let mut want_out = to_f64(&out);
        want_out[off..off + n * c].copy_from_slice(&o);
        close(
            tol::layernorm_out(c),
            "layernorm: out",
            &read_all(be, &o_buf)?,
            &want_out,
        )?;
        let got = read_all(be, &s_buf)?;
        let mut want = to_f64(&stats);
        want[off..off + n].copy_from_slice(&mean);
        want[n + 2 * off..2 * n + 2 * off].copy_from_slice(&rstd);
        let stats_tol = tol::layernorm_stats(c);
        close(
            stats_tol,
            "layernorm: mean",
            &got[..n + 2 * off],
            &want[..n + 2 * off],
        )?;
        close(
            stats_tol,
            "layernorm: rstd",
            &got[n + 2 * off..],
            &want[n + 2 * off..],
        )
    })
}

/// LayerNorm backward from the forward's saved statistics: `dx` adds, `dgamma` and
/// `dbeta` (one buffer) add.
pub fn layernorm_backward<B: Backend>(be: &B, cfg: &Config) -> Case {
    run(cfg, "layernorm_backward", ln_case(), |cs| {
        let mut r = Rand::new(cs.seed);
        let (c, off) = (*cs.dims.last().unwrap_or(&1), cs.offset);
        let n = cs.dims.iter().product::<usize>() / c;
        let x = rows(&mut r, n, c);
        let gamma = r.vec(c, -1.5, 1.5);
        let [_, mean, rstd] = forward(&to_f64(&x), &to_f64(&gamma), &vec![0.0; c], n, c, cs.eps);
        // What a forward pass saves: the statistics in f32.
        let mean: Vec<f32> = mean.iter().map(|&v| v as f32).collect();
        let rstd: Vec<f32> = rstd.iter().map(|&v| v as f32).collect();
        let dout = r.vec(n * c, -1.0, 1.0);
        let dx = r.vec(n * c + 2 * off, -1.0, 1.0);
        let dparams = r.vec(2 * c + 3 * off, -1.0, 1.0);
        let x_buf = padded_buffer(be, &mut r, &x, off)?;
        let g_buf = padded_buffer(be, &mut r, &gamma, off)?;
        let m_buf = padded_buffer(be, &mut r, &mean, off)?;
        let s_buf = padded_buffer(be, &mut r, &rstd, off)?;
        let d_buf = padded_buffer(be, &mut r, &dout, off)?;
        let (dx_buf, p_buf) = (buffer(be, &dx)?, buffer(be, &dparams)?);
        be.layernorm_backward(
            view(&x_buf, off, &cs.dims),
            view(&g_buf, off, &[c]),
            view(&m_buf, off, &[n]),
            view(&s_buf, off, &[n]),
            view(&d_buf, off, &cs.dims),
            view(&dx_buf, off, &cs.dims),
            view(&p_buf, off, &[c]),
            view(&p_buf, c + 2 * off, &[c]),
        )
        .or_fail("layernorm_backward")?;

        let (mut want_dx, mut want_p) = (to_f64(&dx), to_f64(&dparams));
        let (dg, db) = want_p[off..].split_at_mut(c + off);
        reference::layernorm_backward(
            &mut want_dx[off..off + n * c],
            &mut dg[..c],
            &mut db[..c],
            &to_f64(&dout),
            &to_f64(&x),
            &to_f64(&gamma),
            &to_f64(&mean),
            &to_f64(&rstd),
            n,
            c,
        );
        let dx_tol = tol::layernorm_dx(c);
        close(
            dx_tol,
            "layernorm_backward: dx",
            &read_all(be, &dx_buf)?,
            &want_dx,
        )?;
        let p_tol = tol::layernorm_dparams(n);
        close(
            p_tol,
            "layernorm_backward: dgamma, dbeta",
            &read_all(be, &p_buf)?,
            &want_p,
        )
    })
}

/// `residual = a + b`, then LayerNorm of it.
pub fn residual_layernorm<B: Backend>(be: &B, cfg: &Config) -> Case {
    run(cfg, "residual_layernorm", ln_case(), |cs| {
        let mut r = Rand::new(cs.seed);
        let (c, off) = (*cs.dims.last().unwrap_or(&1), cs.offset);
        let n = cs.dims.iter().product::<usize>() / c;
        let x = rows(&mut r, n, c);
        let b = r.vec(n * c, -1.0, 1.0);
        let a: Vec<f32> = x.iter().zip(&b).map(|(x, b)| x - b).collect();
        let (gamma, beta) = (r.vec(c, -1.5, 1.5), r.vec(c, -1.0, 1.0));
        let a_buf = padded_buffer(be, &mut r, &a, off)?;
        let b_buf = padded_buffer(be, &mut r, &b, off)?;
        let g_buf = padded_buffer(be, &mut r, &gamma, off)?;
        let be_buf = padded_buffer(be, &mut r, &beta, off)?;
        let res = poison(&mut r, n * c + 2 * off);
        let out = poison(&mut r, n * c + 2 * off);
        let stats = poison(&mut r, 2 * n);
        let (res_buf, o_buf, s_buf) = (buffer(be, &res)?, buffer(be, &out)?, buffer(be, &stats)?);
        be.residual_layernorm(
            view(&a_buf, off, &cs.dims),
            view(&b_buf, off, &cs.dims),
            view(&res_buf, off, &cs.dims),
            view(&g_buf, off, &[c]),
            view(&be_buf, off, &[c]),
            view(&o_buf, off, &cs.dims),
            view(&s_buf, 0, &[n]),
            view(&s_buf, n, &[n]),
            cs.eps,
        )
        .or_fail("residual_layernorm")?;

        let mut residual = vec![0.0; n * c];
        reference::add(&mut residual, &to_f64(&a), &to_f64(&b));
        let [o, mean, rstd] = forward(&residual, &to_f64(&gamma), &to_f64(&beta), n, c, cs.eps);
        let (mut want_res, mut want_out) = (to_f64(&res), to_f64(&out));
        want_res[off..off + n * c].copy_from_slice(&residual);
        want_out[off..off + n * c].copy_from_slice(&o);
        let res_name = "residual_layernorm: residual";
        close(
            tol::one_rounding(),
            res_name,
            &read_all(be, &res_buf)?,
            &want_res,
        )?;
        close(
            tol::layernorm_out(c),
            "residual_layernorm: out",
            &read_all(be, &o_buf)?,
            &want_out,
        )?;
        let stats_want = [mean, rstd].concat();
        close(
            tol::layernorm_stats(c),
            "residual_layernorm: mean, rstd",
            &read_all(be, &s_buf)?,
            &stats_want,
        )
    })
}
