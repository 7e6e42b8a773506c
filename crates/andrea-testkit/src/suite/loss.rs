//! softmax_cross_entropy over `[N, Vp]` or `[B, T, Vp]` logits with `vocab <= Vp` real
//! columns. Real logits in [-8, 8]; the padding columns hold large values (30 to 60), so
//! a kernel that reads them gets a visibly wrong loss. About one target in six is
//! `IGNORE_INDEX`. The gradient goes nowhere, to its own buffer, or over the logits.

use andrea_core::{Backend, View, IGNORE_INDEX};
use proptest::prelude::*;

use super::linalg::poison;
use super::{
    buffer, close, id_buffer, read_all, run, size, size_or_big, to_f64, view, Case, Config, OrFail,
};
use crate::random::Rand;
use crate::{reference, tol, Tol};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Grad {
    None,
    Separate,
    OverLogits,
}

#[derive(Debug, Clone)]
struct CeCase {
    dims: Vec<usize>,
    vocab: usize,
    grad: Grad,
    grad_scale: f32,
    offset: usize,
    seed: u64,
}

fn ce_case() -> impl Strategy<Value = CeCase> {
    let lead = prop_oneof![
        size(24).prop_map(|n| vec![n]),
        (size(3), size(8)).prop_map(|(b, t)| vec![b, t])
    ];
    let grad = prop::sample::select(&[Grad::None, Grad::Separate, Grad::OverLogits][..]);
    (
        lead,
        size_or_big(200, 2000),
        prop_oneof![Just(0usize), 0..9usize],
        grad,
        0.1f32..2.0,
        0..3usize,
        any::<u64>(),
    )
        .prop_map(|(mut dims, vp, pad, grad, grad_scale, offset, seed)| {
            dims.push(vp);
            CeCase {
                dims,
                vocab: vp.saturating_sub(pad).max(1),
                grad,
                grad_scale,
                offset,
                seed,
            }
        })
}

/// Losses and `dlogits`: padding columns and ignored rows get exactly 0.
pub fn softmax_cross_entropy<B: Backend>(be: &B, cfg: &Config) -> Case {
    run(cfg, "softmax_cross_entropy", ce_case(), |cs| {
        let mut r = Rand::new(cs.seed);
        let (vp, off, vocab) = (*cs.dims.last().unwrap_or(&1), cs.offset, cs.vocab);
        let n = cs.dims.iter().product::<usize>() / vp;
        let mut logits = r.vec(off, -1.0, 1.0);
        for _ in 0..n {
            logits.extend(r.vec(vocab, -8.0, 8.0));
            logits.extend(r.vec(vp - vocab, 30.0, 60.0));
        }
        logits.extend(r.vec(off, -1.0, 1.0));
        let targets: Vec<u32> = (0..n + off)
            .map(|_| {
                if r.chance(1.0 / 6.0) {
                    IGNORE_INDEX
                } else {
                    r.below(vocab) as u32
                }
            })
            .collect();
        let losses = poison(&mut r, n + 2 * off);
        let dlogits = poison(&mut r, n * vp + 2 * off);
        let (z_buf, l_buf, d_buf) = (
            buffer(be, &logits)?,
            buffer(be, &losses)?,
            buffer(be, &dlogits)?,
        );
        let t_buf = id_buffer(be, &targets)?;
        let zv = view(&z_buf, off, &cs.dims);
        let dv = match cs.grad {
            Grad::None => None,
            Grad::Separate => Some(view(&d_buf, off, &cs.dims)),
            Grad::OverLogits => Some(zv),
        };
        let (lv, tv) = (view(&l_buf, off, &[n]), View::new(&t_buf, off, [n]));
        be.softmax_cross_entropy(zv, tv, vocab, lv, dv, cs.grad_scale)
            .or_fail("softmax_cross_entropy")?;

        let mut want_l = to_f64(&losses);
        let mut grad = vec![0.0; n * vp];
        reference::softmax_cross_entropy(
            &mut want_l[off..off + n],
            Some(&mut grad),
            &to_f64(&logits[off..off + n * vp]),
            &targets[off..],
            n,
            vp,
            vocab,
            cs.grad_scale as f64,
        );
        let got_l = read_all(be, &l_buf)?;
        close(
            tol::cross_entropy_loss(vocab),
            "softmax_cross_entropy: losses",
            &got_l,
            &want_l,
        )?;
        let ignored: Vec<f32> = (0..n)
            .filter(|&i| targets[off + i] == IGNORE_INDEX)
            .map(|i| got_l[off + i])
            .collect();
        close(
            Tol::EXACT,
            "softmax_cross_entropy: ignored losses",
            &ignored,
            &vec![0.0; ignored.len()],
        )?;

        // The buffer the gradient went to; without one, the logits must be untouched.
        let (buf, mut want) = match cs.grad {
            Grad::Separate => (&d_buf, to_f64(&dlogits)),
            Grad::None | Grad::OverLogits => (&z_buf, to_f64(&logits)),
        };
        if cs.grad != Grad::None {
            want[off..off + n * vp].copy_from_slice(&grad);
        }
        let got = read_all(be, buf)?;
        let name = format!("softmax_cross_entropy ({:?}): dlogits", cs.grad);
        let t = if cs.grad == Grad::None {
            Tol::EXACT
        } else {
            tol::cross_entropy_grad(vocab)
        };
        close(t, &name, &got, &want)?;
        if cs.grad != Grad::None {
            let zeros: Vec<f32> = (0..n * vp)
                .filter(|&e| e % vp >= vocab || targets[off + e / vp] == IGNORE_INDEX)
                .map(|e| got[off + e])
                .collect();
            let name = "softmax_cross_entropy: dlogits of padding and ignored rows";
            close(Tol::EXACT, name, &zeros, &vec![0.0; zeros.len()])?;
        }
        Ok(())
    })
}
