//! The CPU backend in BF16 precision (`CpuBackend::with_precision`): products on BF16
//! operands (round to nearest even) with FP32 sums, decoding's few-row products reading a
//! BF16 copy of the weights (`keep_bf16_weights`).
//!
//! The reference rounds the same operands (`round_bf16`) and sums their products in f64.
//! A product of two BF16 values is exact in FP32 (8 + 8 significand bits), so the only
//! error left is the FP32 sum's: `k` additions (plus one for a bias), each rounding by at
//! most `2⁻²⁴` of the partial sum, bound by `(k + 1)·2⁻²⁴·(Σ|a·b| + |bias|)`, the
//! tolerance used, with no headroom needed. A product that rounded an operand wrongly
//! misses it: one operand off by one BF16 step moves the product by about `2⁻⁸` of a term.

use andrea_core::prelude::*;
use andrea_core::{round_bf16, MatmulPrecision, View};
use andrea_cpu::CpuBackend;

fn values(n: usize, seed: u64) -> Vec<f32> {
    andrea_testkit::random::Rand::new(seed).vec(n, -1.0, 1.0)
}

const U24: f64 = 1.0 / 16_777_216.0;

/// `c = a·b (+ bias)` on `be` for `a` `[m, k]` and `b` `[k, n]` (`column`: `b = wᵀ` with
/// `w` `[n, k]` row-major, the tied output layer's form), the weights offered to
/// `keep_bf16_weights` when `keep`. Returns `c`.
#[allow(clippy::too_many_arguments)]
fn product(
    be: &CpuBackend,
    a: &[f32],
    w: &[f32],
    bias: Option<&[f32]>,
    (m, k, n): (usize, usize, usize),
    column: bool,
    keep: bool,
) -> Vec<f32> {
    let up = |data: &[f32]| {
        let buf = be.alloc(data.len()).unwrap();
        be.upload(data, View::whole(&buf)).unwrap();
        buf
    };
    let (ab, wb) = (up(a), up(w));
    let bb = bias.map(up);
    if keep {
        be.keep_bf16_weights(View::whole(&wb)).unwrap();
    }
    let c = be.alloc(m * n).unwrap();
    let b = if column {
        View::new(&wb, 0, [n, k]).mat().t()
    } else {
        View::new(&wb, 0, [k, n]).mat()
    };
    be.matmul(
        View::new(&ab, 0, [m, k]).mat(),
        b,
        bb.as_ref().map(View::whole),
        View::new(&c, 0, [m, n]).mat(),
    )
    .unwrap();
    let mut out = vec![0.0; m * n];
    be.download(View::whole(&c), &mut out).unwrap();
    out
}

fn bf16_backend(threads: usize) -> CpuBackend {
    CpuBackend::with_threads(threads)
        .unwrap()
        .with_precision(MatmulPrecision::Bf16)
        .unwrap()
}

/// Few rows (the decode path, both forms, from the copy and without it) and many (the
/// GEMM on rounded copies), with and without a bias, against the f64 sum of the rounded
/// operands' products; and the same bits on 1, 2 and 3 threads, with the copy or without.
#[test]
fn bf16_products_match_the_rounded_operands_on_any_thread_count() {
    for &(m, k, n) in &[
        (1, 5, 3),
        (1, 256, 300),
        (3, 300, 257),
        (8, 130, 700),
        (40, 96, 70),
    ] {
        for column in [false, true] {
            for with_bias in [false, true] {
                let a = values(m * k, 1);
                let w = values(k * n, 2);
                let bias = values(n, 3);
                let bias = with_bias.then_some(&bias[..]);
                let runs: Vec<Vec<f32>> = [(1, true), (2, true), (3, true), (2, false)]
                    .iter()
                    .map(|&(t, keep)| {
                        product(&bf16_backend(t), &a, &w, bias, (m, k, n), column, keep)
                    })
                    .collect();
                let what = format!("{m}x{k}x{n} column={column} bias={with_bias}");
                for (r, run) in runs.iter().enumerate().skip(1) {
                    let same = run
                        .iter()
                        .zip(&runs[0])
                        .all(|(x, y)| x.to_bits() == y.to_bits());
                    assert!(same, "{what}: run {r} differs in its bits from run 0");
                }
                let got = &runs[0];
                for i in 0..m {
                    for j in 0..n {
                        let wat = |kk: usize| if column { w[j * k + kk] } else { w[kk * n + j] };
                        let terms = (0..k).map(|kk| {
                            round_bf16(a[i * k + kk]) as f64 * round_bf16(wat(kk)) as f64
                        });
                        let (mut want, mut mag) =
                            terms.fold((0.0, 0.0), |(s, g), p: f64| (s + p, g + p.abs()));
                        if let Some(b) = bias {
                            want += b[j] as f64;
                            mag += (b[j] as f64).abs();
                        }
                        let tol = (k + 1) as f64 * U24 * mag;
                        let g = got[i * n + j] as f64;
                        assert!(
                            (g - want).abs() <= tol,
                            "{what}: c[{i},{j}] = {g}, want {want} (tolerance {tol:e})"
                        );
                    }
                }
            }
        }
    }
}

/// BF16 is not FP32: the test above can tell them apart. On the same operands the FP32
/// backend misses the BF16 reference's tolerance, and the BF16 backend gives other bits.
#[test]
fn bf16_products_differ_from_fp32() {
    let (m, k, n) = (1, 256, 300);
    let (a, w) = (values(m * k, 1), values(k * n, 2));
    let fp32 = CpuBackend::with_threads(2).unwrap();
    let want = product(&fp32, &a, &w, None, (m, k, n), false, true);
    let got = product(&bf16_backend(2), &a, &w, None, (m, k, n), false, true);
    let differ = got.iter().zip(&want).filter(|(x, y)| x != y).count();
    assert!(differ > n / 2, "only {differ} of {n} products differ");
}

/// A kept copy goes stale when its weights are written: `upload` drops it, and the next
/// product reads the new weights, rounded.
#[test]
fn a_copy_is_dropped_when_its_weights_are_written() {
    let be = bf16_backend(2);
    let (k, n) = (64, 40);
    let a = be.alloc(k).unwrap();
    be.upload(&values(k, 1), View::whole(&a)).unwrap();
    let w = be.alloc(k * n).unwrap();
    be.upload(&values(k * n, 2), View::whole(&w)).unwrap();
    be.keep_bf16_weights(View::whole(&w)).unwrap();
    let fresh = values(k * n, 3);
    be.upload(&fresh, View::whole(&w)).unwrap();
    let c = be.alloc(n).unwrap();
    be.matmul(
        View::new(&a, 0, [1, k]).mat(),
        View::new(&w, 0, [k, n]).mat(),
        None,
        View::new(&c, 0, [1, n]).mat(),
    )
    .unwrap();
    let mut got = vec![0.0; n];
    be.download(View::whole(&c), &mut got).unwrap();
    let mut av = vec![0.0; k];
    be.download(View::whole(&a), &mut av).unwrap();
    let want = product(&bf16_backend(2), &av, &fresh, None, (1, k, n), false, false);
    assert_eq!(got, want, "the product read a stale copy");
}

#[test]
fn tf32_is_refused_and_the_name_says_bf16() {
    assert!(CpuBackend::new()
        .with_precision(MatmulPrecision::Tf32)
        .is_err());
    let name = bf16_backend(1).name();
    assert!(name.contains("bf16"), "{name}");
    assert!(!CpuBackend::new().name().contains("bf16"));
}
