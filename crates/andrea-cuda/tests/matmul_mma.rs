//! The mma.sync matmul kernels (kernels/matmul_mma.cu) against an exact product: every
//! tile the plan can pick, in TF32 and BF16, with the last row tile nearly empty (M =
//! BM + 2) and the last column tile half empty (N = 1.5·BN, as N = 8512 = 66·128 + 64),
//! a K tail (K ≡ 4 mod 32, past the plan's tensor-core threshold), every combination of
//! transposed A and B, both staging paths (K ≡ 4: 16-byte cp.async; K + 1: 4-byte), bias and
//! accumulate, both output stores (staged through shared memory, and direct: at the
//! first K only, as its store does not depend on the operands' staging); the GELU
//! and GELU' epilogues on every tile with both stores; then the planted faults (fragment
//! reads ignoring the swizzle, a stage read before its copies land, a staged row off by
//! one, a missing barrier around the staging) fail it.
//!
//! Tolerance, as in cpu_vs_cuda.rs: the operands are rounded to the format (unit
//! roundoff u_op: TF32 2⁻¹¹, BF16 2⁻⁸) and the products summed in FP32, so
//! `|gpu - exact| <= (2·u_op + K·2⁻²⁴)·Σ_k |a_ik|·|b_kj| + 2⁻²⁴·(|bias| + |c0|)·2 + 1e-6`,
//! times 2 for headroom; the reference is computed in f64 from the FP32 inputs.

andrea_testkit::tests_need_feature!("cuda", "a device or the emulator: see .ci/run");

#[cfg(feature = "cuda")]
mod common;

/// The tests, which need the `cuda` feature.
#[cfg(feature = "cuda")]
mod tests {
    use crate::common;

    use andrea_core::{LinalgOps, MemoryOps, View};
    use andrea_cuda::plan::matmul::{self as mm, MatmulKernel};
    use andrea_cuda::{MatmulImpl, MmaStore, MmaTile, Precision};
    use andrea_testkit::device::Skipped;
    use common::matmul::{check, Case};
    use common::{buf, compare, cuda, data, read};

    const U24: f64 = 1.0 / 16_777_216.0;

    /// The smallest K ≡ 4 (mod 32) (three or more whole K steps and a tail of 4) that takes
    /// an `[m, K]·[K, n]` product past the plan's tensor-core threshold.
    fn tail_k(m: usize, n: usize) -> usize {
        let least = mm::TENSOR_CORE_MIN_MACS.div_ceil(m * n).max(100);
        (least - 4).div_ceil(32) * 32 + 4
    }

    fn all_tiles(name: &str, precision: Precision, u_op: f64) {
        let Some(mut be) = cuda(name, precision) else {
            return;
        };
        // The staged results of the cases the direct store reruns, which must match bit for
        // bit (the BF16 bound alone would let a small slip in the staged epilogue through).
        let mut staged = std::collections::HashMap::new();
        for (tile, store) in MmaTile::ALL
            .into_iter()
            .flat_map(|t| MmaStore::ALL.map(|s| (t, s)))
        {
            be.set_matmul_impl(MatmulImpl::MmaFixed(tile));
            be.set_mma_store(store);
            let (bm, bn) = tile.dims();
            let (m, n) = (bm + 2, bn + bn / 2);
            let k = tail_k(m, n);
            // The direct store is independent of how the operands were staged: one K.
            let ks: &[usize] = match store {
                MmaStore::Staged => &[k, k + 1],
                MmaStore::Direct => &[k],
            };
            for &k in ks {
                for (ta, tb) in [(false, false), (true, false), (false, true), (true, true)] {
                    let c = Case {
                        m,
                        n,
                        k,
                        transpose_a: ta,
                        transpose_b: tb,
                        bias: ta != tb,
                        accumulate: tb,
                    };
                    let kernel = mm::choose(
                        c.m,
                        c.n,
                        c.k,
                        1,
                        precision.matmul,
                        be.matmul_impl(),
                        be.matmul_gpu(),
                    );
                    assert!(
                        matches!(kernel, MatmulKernel::MmaTf32(t) | MatmulKernel::MmaBf16(t) if t == tile),
                        "{name}: the plan runs {kernel:?} for {c:?}"
                    );
                    let seed = 1 + 10
                        * (k + 2 * m + 3 * n + 5 * usize::from(ta) + 7 * usize::from(tb)) as u64;
                    let what = format!("{name} {tile:?} {store:?} {c:?}");
                    let got = check(&be, &what, &c, u_op, seed).unwrap();
                    let key = (tile.label(), k, ta, tb);
                    match store {
                        MmaStore::Staged => {
                            staged.insert(key, got);
                        }
                        MmaStore::Direct => {
                            let same = staged[&key]
                                .iter()
                                .zip(&got)
                                .all(|(x, y)| x.to_bits() == y.to_bits());
                            assert!(same, "{what}: the staged and direct stores differ");
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn mma_tf32_every_tile() {
        all_tiles("mma_tf32_every_tile", Precision::FAST, 1.0 / 2048.0);
    }

    #[test]
    fn mma_bf16_every_tile() {
        all_tiles("mma_bf16_every_tile", Precision::BF16, 1.0 / 256.0);
    }

    /// Each planted fault fails the comparison, in both precisions and both layouts of the
    /// shared tiles (K-contiguous and M/N-contiguous).
    #[test]
    fn mma_planted_faults_are_caught() {
        for (precision, u_op) in [
            (Precision::FAST, 1.0 / 2048.0),
            (Precision::BF16, 1.0 / 256.0),
        ] {
            let name = "mma_planted_faults_are_caught";
            let Some(mut be) = cuda(name, precision) else {
                return;
            };
            be.set_matmul_impl(MatmulImpl::MmaFixed(MmaTile::T64x64));
            for (ta, tb) in [(false, false), (true, true)] {
                let c = Case {
                    m: 66,
                    n: 96,
                    k: tail_k(66, 96),
                    transpose_a: ta,
                    transpose_b: tb,
                    bias: false,
                    accumulate: false,
                };
                be.plant_mma_fault(0);
                check(&be, name, &c, u_op, 5).unwrap();
                for (fault, what) in [(1, "wrong swizzle"), (2, "skipped pipeline stage")] {
                    be.plant_mma_fault(fault);
                    assert!(
                        check(&be, name, &c, u_op, 5).is_err(),
                        "{precision:?} {c:?}: planted fault ({what}) not caught"
                    );
                }
            }
        }
    }

    const K0: f64 = 0.797_884_560_802_865_4; // sqrt(2/π)
    const K1: f64 = 0.044_715;

    /// GELU (tanh form) and its derivative in f64, with t = tanh(k0·(x + k1·x³)).
    fn gelu64(x: f64) -> (f64, f64, f64) {
        let t = (K0 * (x + K1 * x * x * x)).tanh();
        let d = 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * K0 * (1.0 + 3.0 * K1 * x * x);
        (0.5 * x * (1.0 + t), d, t)
    }

    /// The epilogues with a GELU on the staged and the direct store, on every tile, with
    /// both tanh models: `linear_gelu` (`pre = x·w + bias`, `out = GELU(pre)`: modes 1/2)
    /// and `matmul_gelu_backward` (`dpre = (dy·wᵀ) ⊙ GELU'(pre)`: modes 3/4), at M = BM + 2,
    /// N = 1.5·BN (a half-empty last column tile; the staged store's 16-byte path), and on
    /// the 64x64 tile N = 1.5·BN + 2 (rows of N ≡ 2 mod 4 floats are not 16-byte aligned, so
    /// the staged store goes element by element). Each store against the f64 reference with the bounds of
    /// cpu_vs_cuda.rs (module doc), and the two stores bit-identical (same arithmetic per
    /// element, only the path to memory differs).
    #[test]
    fn mma_gelu_epilogues_both_stores() {
        let name = "mma_gelu_epilogues_both_stores";
        let u_op = 1.0 / 256.0;
        let approx_err = 2f64.powf(-10.987);
        for approx_tanh in [false, true] {
            let precision = Precision {
                approx_tanh,
                ..Precision::BF16
            };
            let Some(mut be) = cuda(name, precision) else {
                return;
            };
            for tile in MmaTile::ALL {
                be.set_matmul_impl(MatmulImpl::MmaFixed(tile));
                let (bm, bn) = tile.dims();
                // N ≡ 2 (mod 4) on one tile: the scalar fallback of the staged store.
                let (m, n) = (
                    bm + 2,
                    bn + bn / 2 + if tile == MmaTile::T64x64 { 2 } else { 0 },
                );
                let k = tail_k(m, n);
                let seed = 7 + bm as u64 + bn as u64;
                let x = data(seed, m * k, -1.0, 1.0);
                let w = data(seed + 1, n * k, -1.0, 1.0); // [N, K], used as wᵀ / w
                let bias = data(seed + 2, n, -1.0, 1.0);
                let pre_in: Vec<f32> = data(seed + 3, m * n, -4.0, 4.0);
                let (xb, wb, biasb, preb) = (
                    buf(&be, &x),
                    buf(&be, &w),
                    buf(&be, &bias),
                    buf(&be, &pre_in),
                );
                // Σ_k x_ik·w_jk and Σ|x_ik·w_jk|.
                let mut prod = vec![0.0f64; m * n];
                let mut mag = vec![0.0f64; m * n];
                for i in 0..m {
                    for j in 0..n {
                        for kk in 0..k {
                            let p = x[i * k + kk] as f64 * w[j * k + kk] as f64;
                            prod[i * n + j] += p;
                            mag[i * n + j] += p.abs();
                        }
                    }
                }
                let mm_bound = |i: usize, extra: f64| {
                    2.0 * ((2.0 * u_op + k as f64 * U24) * mag[i] + 2.0 * U24 * extra + 1e-6)
                };
                let mut outs: Vec<Vec<Vec<f32>>> = Vec::new();
                for store in MmaStore::ALL {
                    be.set_mma_store(store);
                    let what = format!("{name} {tile:?} {store:?} approx_tanh {approx_tanh}");
                    // linear_gelu: x [M, K] · (w [N, K])ᵀ + bias.
                    let (pre, out) = (be.alloc(m * n).unwrap(), be.alloc(m * n).unwrap());
                    be.linear_gelu(
                        View::new(&xb, 0, [m, k]).mat(),
                        View::new(&wb, 0, [n, k]).mat().t(),
                        View::new(&biasb, 0, [n]),
                        View::new(&pre, 0, [m, n]),
                        View::new(&out, 0, [m, n]),
                    )
                    .unwrap();
                    let (pre_got, out_got) = (read(&be, &pre), read(&be, &out));
                    let pre_want: Vec<f64> =
                        (0..m * n).map(|i| prod[i] + bias[i % n] as f64).collect();
                    let pre_w32: Vec<f32> = pre_want.iter().map(|&v| v as f32).collect();
                    compare(
                        &format!("{what} linear_gelu pre"),
                        &pre_got,
                        &pre_w32,
                        |i| mm_bound(i, bias[i % n].abs() as f64),
                    )
                    .unwrap();
                    let out_w32: Vec<f32> = pre_want.iter().map(|&v| gelu64(v).0 as f32).collect();
                    compare(
                        &format!("{what} linear_gelu out"),
                        &out_got,
                        &out_w32,
                        |i| {
                            let xv = pre_want[i].abs();
                            let tanh_err = if approx_tanh {
                                2.0 * (0.5 * xv * approx_err + 1e-6)
                            } else {
                                2.0 * (8.0 * U24 * xv + 1e-6)
                            };
                            1.13 * mm_bound(i, bias[i % n].abs() as f64) + tanh_err
                        },
                    )
                    .unwrap();
                    // matmul_gelu_backward: dy = x [M, K], w as [K, N]ᵀ, pre_in.
                    let dpre = be.alloc(m * n).unwrap();
                    be.matmul_gelu_backward(
                        View::new(&xb, 0, [m, k]).mat(),
                        View::new(&wb, 0, [n, k]).mat().t(),
                        View::new(&preb, 0, [m, n]),
                        View::new(&dpre, 0, [m, n]),
                    )
                    .unwrap();
                    let dpre_got = read(&be, &dpre);
                    let dpre_w32: Vec<f32> = (0..m * n)
                        .map(|i| (prod[i] * gelu64(pre_in[i] as f64).1) as f32)
                        .collect();
                    compare(
                        &format!("{what} matmul_gelu_backward"),
                        &dpre_got,
                        &dpre_w32,
                        |i| {
                            let xv = pre_in[i] as f64;
                            let (_, _, t) = gelu64(xv);
                            let grad_err = if approx_tanh {
                                2.0 * (approx_err
                                    * (0.5 + xv.abs() * t.abs() * K0 * (1.0 + 3.0 * K1 * xv * xv))
                                    * prod[i].abs()
                                    + 2e-6)
                            } else {
                                2.0 * (4e-6 + 2e-5) * prod[i].abs()
                            };
                            1.13 * mm_bound(i, 0.0) + grad_err
                        },
                    )
                    .unwrap();
                    outs.push(vec![pre_got, out_got, dpre_got]);
                }
                let same = outs[0]
                    .iter()
                    .zip(&outs[1])
                    .all(|(a, b)| a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits()));
                assert!(
                    same,
                    "{name} {tile:?} approx_tanh {approx_tanh}: staged and direct stores differ"
                );
            }
        }
    }

    /// The staged store's planted faults (kernels/matmul_mma.cu) fail the comparison: 3, each
    /// staged row read from the row below, under either warp order; 4, no barrier before the
    /// staging writes overwrite the pipeline's stages, and 5, no barrier between the staging
    /// writes and the staged reads, under the emulator's serial warp order (under its default
    /// lockstep order the warps finish their main loops together, so the missing barriers go
    /// unseen there: the test prints what lockstep caught). 8 warps (128x128) and 4 (64x64).
    #[test]
    fn mma_staged_store_faults_are_caught() {
        let name = "mma_staged_store_faults_are_caught";
        let (precision, u_op) = (Precision::BF16, 1.0 / 256.0);
        let Some(mut be) = cuda(name, precision) else {
            return;
        };
        if !common::set_warp_order(false) {
            Skipped::new(name, "the warp order is the emulator's").print();
            return;
        }
        be.set_mma_store(MmaStore::Staged);
        for tile in [MmaTile::T128x128, MmaTile::T64x64] {
            be.set_matmul_impl(MatmulImpl::MmaFixed(tile));
            let (bm, bn) = tile.dims();
            let (m, n) = (bm + 2, bn + bn / 2);
            let c = Case {
                m,
                n,
                k: tail_k(m, n),
                transpose_a: false,
                transpose_b: false,
                bias: true,
                accumulate: false,
            };
            for serial in [false, true] {
                common::set_warp_order(serial);
                be.plant_mma_fault(0);
                check(&be, name, &c, u_op, 9).unwrap();
                for (fault, what) in [
                    (3, "staged row off by one"),
                    (4, "no barrier before reusing the stages"),
                    (5, "no barrier before the staged reads"),
                ] {
                    be.plant_mma_fault(fault);
                    let caught = check(&be, name, &c, u_op, 9).is_err();
                    println!(
                        "{name}: {tile:?} serial {serial}: fault {fault} ({what}) caught: {caught}"
                    );
                    if serial || fault == 3 {
                        assert!(
                            caught,
                            "{tile:?} serial {serial}: planted fault ({what}) not caught"
                        );
                    }
                }
            }
            be.plant_mma_fault(0);
            common::set_warp_order(false);
        }
    }
}
