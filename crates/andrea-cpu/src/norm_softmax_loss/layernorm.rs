//! LayerNorm forward (one pass over each row after its statistics) and backward.
//!
//! Forward, per row of `x: [N, C]`: `mean = Σx/C`, `var = Σ(x-mean)²/C` (two-pass, so
//! no cancellation), `rstd = 1/sqrt(var+eps)`, `out = (x-mean)·rstd·γ + β`.
//!
//! Backward, with `x̂ = (x-mean)·rstd` and `g = dout·γ`:
//! `dx += rstd·(g - mean(g) - x̂·mean(g·x̂))`, `dγ += Σ_rows dout·x̂`, `dβ += Σ_rows dout`.
//! `dx` is done row-parallel; `dγ, dβ` column-band-parallel, each band walking the rows
//! in order, so the sums do not depend on the thread count.

use std::cell::Cell;

use rayon::prelude::*;

use crate::buffer::SendPtr;
use crate::elementwise::add_assign;
use crate::par::{cols_per_task, rows_per_task};
use crate::simd::{self, multiversion};

use andrea_core::{check, LayerNormOps, Result, Tensor};

use crate::buffer::{read, write};
use crate::CpuBackend;

multiversion! {
    avx512;
    /// Rows in a pipeline: a row is three passes (its sum, then its squared deviations
    /// from the mean, then the normalised output), each waiting on the one before. The
    /// output pass is bound by its stores and leaves the adders idle, so the next row's
    /// squared deviations run in the same loop, block by block
    /// ([`simd::sum_sq_dev_beside`]); the store pass alone takes about as long as a plain
    /// copy of the row. Each row's statistics are the same operations in the same
    /// order as one row alone, so the same bits.
    fn forward_rows(
        x: &[f32],
        gamma: &[f32],
        beta: &[f32],
        out: &mut [f32],
        mean: &mut [f32],
        rstd: &mut [f32],
        eps: f32,
    ) {
        let c = gamma.len();
        let n = c as f32;
        let rows = mean.len().min(rstd.len()).min(x.len() / c).min(out.len() / c);
        if rows == 0 {
            return;
        }
        let row = |i: usize| &x[i * c..(i + 1) * c];
        let stats = |m: f32, var_sum: f32| (m, 1.0 / (var_sum / n + eps).sqrt());
        // (mean, rstd) of the row being written, and the mean of the next one.
        let m0 = simd::sum(row(0)) / n;
        let mut cur = stats(m0, simd::sum_sq_dev(row(0), m0));
        let mut next_mean = if rows > 1 { simd::sum(row(1)) / n } else { 0.0 };
        for i in 0..rows {
            let (m, r) = cur;
            let (xi, oi) = (row(i), &mut out[i * c..(i + 1) * c]);
            let mut done = 0;
            if i + 1 < rows {
                // Row i's output, a block at a time, beside row i + 1's deviations.
                let var_sum = simd::sum_sq_dev_beside(row(i + 1), next_mean, |j| {
                    let at = j * simd::SUM_LANES..(j + 1) * simd::SUM_LANES;
                    normalize(&xi[at.clone()], &gamma[at.clone()], &beta[at.clone()], &mut oi[at], m, r);
                    done = (j + 1) * simd::SUM_LANES;
                });
                cur = stats(next_mean, var_sum);
                if i + 2 < rows {
                    next_mean = simd::sum(row(i + 2)) / n;
                }
            }
            normalize(&xi[done..], &gamma[done..], &beta[done..], &mut oi[done..], m, r);
            mean[i] = m;
            rstd[i] = r;
        }
    }
}

/// `out = (x - m)·r·γ + β` over one row (or the same part of each).
#[inline(always)]
fn normalize(x: &[f32], gamma: &[f32], beta: &[f32], out: &mut [f32], m: f32, r: f32) {
    for (((o, &v), &g), &b) in out.iter_mut().zip(x).zip(gamma).zip(beta) {
        *o = (v - m) * r * g + b;
    }
}

/// LayerNorm forward over rows of `gamma.len()` elements.
pub(crate) fn forward(
    x: &[f32],
    gamma: &[f32],
    beta: &[f32],
    out: &mut [f32],
    mean: &mut [f32],
    rstd: &mut [f32],
    eps: f32,
) {
    let c = gamma.len();
    let rows = rows_per_task(c);
    if x.len() <= rows * c {
        // One task (a decoded token's row): on this thread, without rayon's set-up.
        return forward_rows(x, gamma, beta, out, mean, rstd, eps);
    }
    out.par_chunks_mut(rows * c)
        .zip(x.par_chunks(rows * c))
        .zip(mean.par_chunks_mut(rows))
        .zip(rstd.par_chunks_mut(rows))
        .for_each(|(((out, x), mean), rstd)| forward_rows(x, gamma, beta, out, mean, rstd, eps));
}

/// Where the residual sum of [`residual_forward`] comes from.
pub(crate) enum ResidualSrc<'a> {
    /// `residual = a + b` into separate memory.
    Sum(&'a [f32], &'a [f32]),
    /// `residual += x` (residual was `a` or `b`).
    AddInto(&'a [f32]),
    /// `residual += residual` (a, b and residual are one view).
    Double,
}

/// `residual = a + b`, then LayerNorm of it, one row at a time (the row is in L1 between
/// the add and the normalisation).
pub(crate) fn residual_forward(
    src: ResidualSrc<'_>,
    residual: &mut [f32],
    gamma: &[f32],
    beta: &[f32],
    out: &mut [f32],
    mean: &mut [f32],
    rstd: &mut [f32],
    eps: f32,
) {
    let c = gamma.len();
    let rows = rows_per_task(c);
    let chunk = rows * c;
    let task = |t: usize, res: &mut [f32], out: &mut [f32], mean: &mut [f32], rstd: &mut [f32]| {
        let range = t * chunk..t * chunk + res.len();
        match src {
            ResidualSrc::Sum(a, b) => add_rows(&a[range.clone()], &b[range], res),
            ResidualSrc::AddInto(x) => add_assign(res, &x[range]),
            ResidualSrc::Double => double_rows(res),
        }
        forward_rows(res, gamma, beta, out, mean, rstd, eps);
    };
    if residual.len() <= chunk {
        // One task (a decoded token's row): on this thread, without rayon's set-up.
        return task(0, residual, out, mean, rstd);
    }
    residual
        .par_chunks_mut(chunk)
        .zip(out.par_chunks_mut(chunk))
        .zip(mean.par_chunks_mut(rows).zip(rstd.par_chunks_mut(rows)))
        .enumerate()
        .for_each(|(t, ((res, out), (mean, rstd)))| task(t, res, out, mean, rstd));
}

multiversion! {
    fn add_rows(a: &[f32], b: &[f32], y: &mut [f32]) {
        for ((o, &p), &q) in y.iter_mut().zip(a).zip(b) {
            *o = p + q;
        }
    }
}

multiversion! {
    fn double_rows(y: &mut [f32]) {
        for o in y.iter_mut() {
            *o += *o;
        }
    }
}

multiversion! {
    avx512;
    /// Rows of the backward pass: `dx += ...` per row, and this chunk's partial sums of
    /// `dγ` and `dβ` into `part` (`[2, C]`: dγ then dβ).
    fn backward_rows(
        x: &[f32],
        gamma: &[f32],
        mean: &[f32],
        rstd: &[f32],
        dout: &[f32],
        dx: &mut [f32],
        part: &mut [f32],
    ) {
        let c = gamma.len();
        let (pg, pb) = part.split_at_mut(c);
        for ((((x, dout), dx), &m), &r) in x
            .chunks_exact(c)
            .zip(dout.chunks_exact(c))
            .zip(dx.chunks_exact_mut(c))
            .zip(mean)
            .zip(rstd)
        {
            // The two row sums mean(g) and mean(g·x̂) with g = dout·γ; x̂ = (x - mean)·rstd
            // is recomputed where it is used (two operations) rather than stored.
            let (mut mg, mut mgx) = simd::two_sums_of(x, dout, gamma, |v, d, g| {
                let gd = d * g;
                (gd, gd * ((v - m) * r))
            });
            mg /= c as f32;
            mgx /= c as f32;
            for ((((o, &v), &d), &g), (pg, pb)) in dx
                .iter_mut()
                .zip(x)
                .zip(dout)
                .zip(gamma)
                .zip(pg.iter_mut().zip(pb.iter_mut()))
            {
                let xh = (v - m) * r;
                *o += r * (d * g - mg - xh * mgx);
                *pg += d * xh;
                *pb += d;
            }
        }
    }
}

thread_local! {
    /// The backward pass's per-chunk partial `dγ`, `dβ`, reused across calls (a nested
    /// call on the same thread finds it empty and allocates its own).
    static PARTIALS: Cell<Vec<f32>> = const { Cell::new(Vec::new()) };
}

/// LayerNorm backward; `dx`, `dgamma`, `dbeta` are accumulated into.
///
/// One pass over the rows: each fixed-size chunk of rows updates its `dx` rows and
/// writes its partial `dγ`, `dβ`; the partials are then added in chunk order, so the
/// sums do not depend on the thread count.
pub(crate) fn backward(
    x: &[f32],
    gamma: &[f32],
    mean: &[f32],
    rstd: &[f32],
    dout: &[f32],
    dx: &mut [f32],
    dgamma: &mut [f32],
    dbeta: &mut [f32],
) {
    let c = gamma.len();
    let n = mean.len();
    let rows = rows_per_task(c);
    let chunks = n.div_ceil(rows);
    // Reused from call to call (zeroing a fresh one each time costs, see benches/README.md,
    // "Memory-bound ops"); each task zeroes its own part.
    let mut scratch = PARTIALS.take();
    if scratch.len() < chunks * 2 * c {
        scratch.resize(chunks * 2 * c, 0.0);
    }
    let partials = &mut scratch[..chunks * 2 * c];
    dx.par_chunks_mut(rows * c)
        .zip(x.par_chunks(rows * c))
        .zip(dout.par_chunks(rows * c))
        .zip(mean.par_chunks(rows).zip(rstd.par_chunks(rows)))
        .zip(partials.par_chunks_mut(2 * c))
        .for_each(|((((dx, x), dout), (mean, rstd)), part)| {
            part.fill(0.0);
            backward_rows(x, gamma, mean, rstd, dout, dx, part)
        });
    let band = cols_per_task(chunks, c);
    let (pg, pb) = (SendPtr(dgamma.as_mut_ptr()), SendPtr(dbeta.as_mut_ptr()));
    let partials = &*partials;
    (0..c.div_ceil(band)).into_par_iter().for_each(|i| {
        let (c0, c1) = (i * band, ((i + 1) * band).min(c));
        // Each column's partials are added in chunk order; a whole band at a time, so
        // the adds run across columns in vectors.
        let (mut g, mut b) = (vec![0.0f32; c1 - c0], vec![0.0f32; c1 - c0]);
        for p in partials.chunks_exact(2 * c) {
            add_assign(&mut g, &p[c0..c1]);
            add_assign(&mut b, &p[c + c0..c + c1]);
        }
        for (j, (g, b)) in (c0..c1).zip(g.into_iter().zip(b)) {
            // SAFETY: `j < c`; the column band belongs to this task alone.
            unsafe {
                *pg.get().add(j) += g;
                *pb.get().add(j) += b;
            }
        }
    });
    PARTIALS.set(scratch);
}

impl LayerNormOps for CpuBackend {
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
        self.run(|| forward(x, g, b, o, m, r, eps));
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
        self.run(|| backward(x, g, m, r, d, dx, dg, db));
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
        check::residual_layernorm(&a, &b, &residual, &gamma, &beta, &out, &mean, &rstd, eps)?;
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
            Some(x) if x.same_as(&residual) => ResidualSrc::Double,
            Some(x) => ResidualSrc::AddInto(unsafe { read(&x) }),
            None => ResidualSrc::Sum(unsafe { read(&a) }, unsafe { read(&b) }),
        };
        self.run(|| residual_forward(src, res, g, bt, o, m, r, eps));
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use andrea_testkit::random::Rand;

    /// Rows in the pipeline give each row the bits it gets alone (one row per call: no
    /// next row to run beside), for 1-5 rows and widths around the sums' 64- and
    /// 16-element blocks.
    #[test]
    fn pipelined_rows_give_each_row_its_own_bits() {
        let mut r = Rand::new(7);
        let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
        for c in [1, 15, 16, 17, 63, 64, 65, 80, 128, 768, 771] {
            for rows in 1..=5 {
                let x = r.vec(rows * c, -3.0, 5.0);
                let (g, b) = (r.vec(c, 0.5, 1.5), r.vec(c, -0.5, 0.5));
                let (mut out, mut mean, mut rstd) =
                    (vec![0.0; rows * c], vec![0.0; rows], vec![0.0; rows]);
                forward_rows(&x, &g, &b, &mut out, &mut mean, &mut rstd, 1e-5);
                for i in 0..rows {
                    let (mut o, mut m, mut s) = (vec![0.0; c], [0.0], [0.0]);
                    let xi = &x[i * c..(i + 1) * c];
                    forward_rows(xi, &g, &b, &mut o, &mut m, &mut s, 1e-5);
                    assert_eq!(bits(&out[i * c..(i + 1) * c]), bits(&o), "c {c} row {i}");
                    assert_eq!(
                        bits(&[mean[i], rstd[i]]),
                        bits(&[m[0], s[0]]),
                        "c {c} row {i}"
                    );
                }
            }
        }
    }

    /// One row alone is the two-pass formula (mean, then the mean squared deviation),
    /// against an f64 reference: the pipeline's rows are checked against this.
    #[test]
    fn one_row_is_layernorm() {
        let mut r = Rand::new(9);
        for c in [1, 17, 64, 200, 768] {
            let x = r.vec(c, 100.0, 101.0); // a large mean: a one-pass variance would cancel
            let (g, b) = (r.vec(c, 0.5, 1.5), r.vec(c, -0.5, 0.5));
            let (mut o, mut m, mut s) = (vec![0.0; c], [0.0], [0.0]);
            forward_rows(&x, &g, &b, &mut o, &mut m, &mut s, 1e-5);
            let mean = x.iter().map(|&v| v as f64).sum::<f64>() / c as f64;
            let var = x.iter().map(|&v| (v as f64 - mean).powi(2)).sum::<f64>() / c as f64;
            let rstd = 1.0 / (var + 1e-5).sqrt();
            // f32 sums of c terms: about c·2^-24 relative, on a mean of 100 and a spread of 1.
            assert!(
                (m[0] as f64 - mean).abs() <= 1e-5 * mean.abs(),
                "c {c} mean"
            );
            assert!(
                (s[0] as f64 - rstd).abs() <= 1e-3 * rstd,
                "c {c} rstd {} {rstd}",
                s[0]
            );
            for i in 0..c {
                let want = (x[i] as f64 - mean) * rstd * g[i] as f64 + b[i] as f64;
                assert!(
                    (o[i] as f64 - want).abs() <= 2e-3 + 1e-3 * want.abs(),
                    "c {c} at {i}"
                );
            }
        }
    }
}
