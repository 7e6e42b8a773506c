//! Fused softmax + cross-entropy over a padded vocabulary.

use andrea_core::IGNORE_INDEX;

/// Cross-entropy of `logits: [N, Vp]`, of which the first `vocab` columns are real,
/// against `targets: [N]`:
///
/// ```text
/// losses[n]  = logsumexp(logits[n, ..vocab]) - logits[n, targets[n]]
/// dlogits[n] = grad_scale·(softmax(logits[n, ..vocab]) - onehot(targets[n]))
/// ```
///
/// Padding columns `vocab..Vp` get gradient 0; a target equal to [`IGNORE_INDEX`] gives
/// loss 0 and a zero gradient row.
pub fn softmax_cross_entropy(
    losses: &mut [f64],
    mut dlogits: Option<&mut [f64]>,
    logits: &[f64],
    targets: &[u32],
    n: usize,
    vp: usize,
    vocab: usize,
    grad_scale: f64,
) {
    for row in 0..n {
        let z = &logits[row * vp..row * vp + vocab];
        let target = targets[row];
        let ignored = target == IGNORE_INDEX;
        let max = z.iter().fold(f64::NEG_INFINITY, |m, &v| m.max(v));
        let sum: f64 = z.iter().map(|&v| (v - max).exp()).sum();
        let lse = max + sum.ln();
        losses[row] = if ignored {
            0.0
        } else {
            lse - z[target as usize]
        };
        if let Some(d) = dlogits.as_deref_mut() {
            let d = &mut d[row * vp..(row + 1) * vp];
            for j in 0..vp {
                d[j] = if ignored || j >= vocab {
                    0.0
                } else {
                    let onehot = if j == target as usize { 1.0 } else { 0.0 };
                    grad_scale * ((z[j] - lse).exp() - onehot)
                };
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::random::Rand;
    use crate::reference::fd;

    #[test]
    fn dlogits_match_finite_differences() {
        let mut r = Rand::new(6);
        // 4 rows over 5 real columns padded to 7; row 2 is ignored.
        let (n, vp, vocab, scale) = (4, 7, 5, 0.25);
        let targets = [3, 0, IGNORE_INDEX, 4];
        let logits = fd::values(&mut r, n * vp, -4.0, 4.0);
        let mut losses = vec![0.0; n];
        let mut d = vec![7.0; n * vp];
        softmax_cross_entropy(
            &mut losses,
            Some(&mut d),
            &logits,
            &targets,
            n,
            vp,
            vocab,
            scale,
        );
        let numeric = fd::grad(&logits, |z| {
            let mut l = vec![0.0; n];
            softmax_cross_entropy(&mut l, None, z, &targets, n, vp, vocab, scale);
            scale * l.iter().sum::<f64>()
        });
        fd::assert_grad("dlogits", &d, &numeric);
        assert_eq!(losses[2], 0.0);
        assert!(d[2 * vp..3 * vp].iter().all(|&g| g == 0.0));
        assert!((0..n).all(|row| d[row * vp + vocab..(row + 1) * vp]
            .iter()
            .all(|&g| g == 0.0)));
    }

    #[test]
    fn uniform_logits_give_log_vocab() {
        let mut l = [0.0];
        softmax_cross_entropy(&mut l, None, &[0.0, 0.0, 0.0, 0.0, 1e9], &[1], 1, 5, 4, 1.0);
        assert!((l[0] - 4f64.ln()).abs() < 1e-15);
    }
}
