//! sum_squares and adamw.
//!
//! AdamW state is drawn consistent with training: per element a gradient scale `s` in
//! `10^[-3, 0]`, `grad = s·[-1, 1]`, `m = s·[-1, 1]`, `v = s²·[0.5, 1.5]` (zero at step 1),
//! so `|m̂/√v̂|` stays O(1) as it does in practice. Hyper-parameters: lr in
//! `10^[-4, -1]`, β1 in [0.8, 0.95], β2 in [0.9, 0.999], eps in `10^[-8, -1]` (large eps
//! tells `sqrt(v̂) + eps` from `sqrt(v̂ + eps)`), weight decay in [0, 0.5], grad_scale
//! in [0.2, 1.5], step 1 or up to 1000.

use andrea_core::{AdamWStep, Backend};
use proptest::prelude::*;

use super::{buffer, close, read_all, run, to_f64, view, Case, Config, OrFail};
use crate::random::Rand;
use crate::{reference, tol};

/// `Σ x²` (an f64) over views of up to 20000 elements.
pub fn sum_squares<B: Backend>(be: &B, cfg: &Config) -> Case {
    let case = (super::shape(20_000), 0..3usize, any::<u64>());
    run(cfg, "sum_squares", case, |(dims, off, seed)| {
        let mut r = Rand::new(seed);
        let n: usize = dims.iter().product();
        let x = r.vec(n + 2 * off, -2.0, 2.0);
        let x_buf = buffer(be, &x)?;
        let got = be
            .sum_squares(view(&x_buf, off, &dims))
            .or_fail("sum_squares")?;
        let want = reference::sum_squares(&to_f64(&x[off..off + n]));
        close_f64(tol::sum_squares(), "sum_squares", got, want)
    })
}

fn close_f64(t: crate::Tol, name: &str, got: f64, want: f64) -> Case {
    t.check(name, &[got], &[want]).map_err(super::fail)
}

#[derive(Debug, Clone)]
struct AdamCase {
    n: usize,
    step: AdamWStep,
    offset: usize,
    seed: u64,
}

fn adam_case() -> impl Strategy<Value = AdamCase> {
    let step = prop_oneof![Just(1u64), 1..=1000u64];
    let hyper = (
        -4.0f32..-1.0,
        0.8f32..0.95,
        0.9f32..0.999,
        -8.0f32..-1.0,
        0.0f32..0.5,
        0.2f32..1.5,
    );
    (1..=3000usize, step, hyper, 0..3usize, any::<u64>()).prop_map(
        |(n, step, (lr, beta1, beta2, eps, weight_decay, grad_scale), offset, seed)| AdamCase {
            n,
            step: AdamWStep {
                lr: 10f32.powf(lr),
                beta1,
                beta2,
                eps: 10f32.powf(eps),
                weight_decay,
                step,
                grad_scale,
            },
            offset,
            seed,
        },
    )
}

/// One AdamW step; `m` and `v` side by side in one buffer.
pub fn adamw<B: Backend>(be: &B, cfg: &Config) -> Case {
    run(cfg, "adamw", adam_case(), |cs| {
        let mut r = Rand::new(cs.seed);
        let (n, off) = (cs.n, cs.offset);
        let s: Vec<f32> = (0..n).map(|_| 10f32.powf(r.uniform(-3.0, 0.0))).collect();
        let first = cs.step.step == 1;
        let mut param = r.vec(off, -1.0, 1.0);
        param.extend(r.vec(n, -1.0, 1.0));
        let mut grad = r.vec(off, -1.0, 1.0);
        grad.extend(s.iter().map(|&s| s * r.uniform(-1.0, 1.0)));
        let mut mv = r.vec(off, -1.0, 1.0);
        mv.extend(
            s.iter()
                .map(|&s| if first { 0.0 } else { s * r.uniform(-1.0, 1.0) }),
        );
        mv.extend(r.vec(off, -1.0, 1.0));
        mv.extend(s.iter().map(|&s| {
            if first {
                0.0
            } else {
                s * s * r.uniform(0.5, 1.5)
            }
        }));
        param.extend(r.vec(off, -1.0, 1.0));
        grad.extend(r.vec(off, -1.0, 1.0));
        mv.extend(r.vec(off, -1.0, 1.0));
        let (p_buf, g_buf, mv_buf) = (buffer(be, &param)?, buffer(be, &grad)?, buffer(be, &mv)?);
        let (m_at, v_at) = (off, n + 2 * off);
        be.adamw(
            view(&p_buf, off, &[n]),
            view(&g_buf, off, &[n]),
            view(&mv_buf, m_at, &[n]),
            view(&mv_buf, v_at, &[n]),
            &cs.step,
        )
        .or_fail("adamw")?;

        let (mut want_p, mut want_mv) = (to_f64(&param), to_f64(&mv));
        let (m, v) = want_mv.split_at_mut(v_at);
        reference::adamw(
            &mut want_p[off..off + n],
            &to_f64(&grad[off..off + n]),
            &mut m[m_at..m_at + n],
            &mut v[..n],
            &cs.step,
        );
        close(
            tol::adamw_param(cs.step.lr),
            "adamw: param",
            &read_all(be, &p_buf)?,
            &want_p,
        )?;
        let got = read_all(be, &mv_buf)?;
        close(tol::adamw_m(), "adamw: m", &got[..v_at], &want_mv[..v_at])?;
        close(tol::adamw_v(), "adamw: v", &got[v_at..], &want_mv[v_at..])
    })
}
