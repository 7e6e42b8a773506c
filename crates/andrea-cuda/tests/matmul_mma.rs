//! The mma.sync matmul kernels (kernels/matmul_mma.cu) against an exact product: every
//! tile the plan can pick, in TF32 and BF16, with the last row tile nearly empty (M =
//! BM + 2) and the last column tile half empty (N = 1.5·BN, as N = 8512 = 66·128 + 64),
//! a K tail (K ≡ 4 mod 32, past the plan's tensor-core threshold), every combination of
//! transposed A and B, both staging paths (K ≡ 4: 16-byte cp.async; K + 1: 4-byte), bias and
//! accumulate; then the planted faults (fragment reads ignoring the swizzle, a stage read
//! before its copies land) fail it.
//!
//! Tolerance, as in cpu_vs_cuda.rs: the operands are rounded to the format (unit
//! roundoff u_op: TF32 2⁻¹¹, BF16 2⁻⁸) and the products summed in FP32, so
//! `|gpu - exact| <= (2·u_op + K·2⁻²⁴)·Σ_k |a_ik|·|b_kj| + 2⁻²⁴·(|bias| + |c0|)·2 + 1e-6`,
//! times 2 for headroom; the reference is computed in f64 from the FP32 inputs.
#![cfg(feature = "cuda")]

mod common;

use andrea_cuda::plan::matmul::{self as mm, MatmulKernel};
use andrea_cuda::{CudaBackend, MatmulImpl, MmaTile, Precision};
use common::matmul::{inputs, run, Case, Inputs};
use common::{compare, cuda};

const U24: f64 = 1.0 / 16_777_216.0;

fn a_at(c: &Case, x: &Inputs, i: usize, kk: usize) -> f64 {
    (if c.transpose_a {
        x.a[kk * c.m + i]
    } else {
        x.a[i * c.k + kk]
    }) as f64
}

fn b_at(c: &Case, x: &Inputs, kk: usize, j: usize) -> f64 {
    (if c.transpose_b {
        x.b[j * c.k + kk]
    } else {
        x.b[kk * c.n + j]
    }) as f64
}

fn exact(c: &Case, x: &Inputs) -> (Vec<f32>, Vec<f64>) {
    let mut want = Vec::with_capacity(c.m * c.n);
    let mut mag = Vec::with_capacity(c.m * c.n);
    for i in 0..c.m {
        for j in 0..c.n {
            let mut s = 0.0;
            let mut m = 0.0;
            for kk in 0..c.k {
                let p = a_at(c, x, i, kk) * b_at(c, x, kk, j);
                s += p;
                m += p.abs();
            }
            let extra = if c.bias { x.bias[j] as f64 } else { 0.0 }
                + if c.accumulate {
                    x.c0[i * c.n + j] as f64
                } else {
                    0.0
                };
            want.push((s + extra) as f32);
            mag.push(m + 2.0 * extra.abs());
        }
    }
    (want, mag)
}

fn check(be: &CudaBackend, name: &str, c: &Case, u_op: f64, seed: u64) -> Result<(), String> {
    let x = inputs(c, seed);
    let got = run(be, c, &x);
    let (want, mag) = exact(c, &x);
    let k = c.k as f64;
    compare(name, &got, &want, |i| {
        2.0 * ((2.0 * u_op + k * U24) * mag[i] + 2.0 * U24 * mag[i] + 1e-6)
    })
}

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
    let mut seed = 1;
    for tile in MmaTile::ALL {
        be.set_matmul_impl(MatmulImpl::MmaFixed(tile));
        let (bm, bn) = tile.dims();
        let (m, n) = (bm + 2, bn + bn / 2);
        let k = tail_k(m, n);
        for k in [k, k + 1] {
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
                    be.multiprocessors(),
                );
                assert!(
                    matches!(kernel, MatmulKernel::MmaTf32(t) | MatmulKernel::MmaBf16(t) if t == tile),
                    "{name}: the plan runs {kernel:?} for {c:?}"
                );
                seed += 10;
                check(&be, &format!("{name} {tile:?} {c:?}"), &c, u_op, seed).unwrap();
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
