//! One matmul case on the CUDA backend (split_k.rs, matmul_mma.rs): random inputs,
//! transposes by strides, bias and accumulate.

use andrea_core::{LinalgOps, Matrix, View};
use andrea_cuda::CudaBackend;

use super::{buf, compare, data, read};

const U24: f64 = 1.0 / 16_777_216.0;

#[derive(Debug, Clone, Copy)]
pub struct Case {
    pub m: usize,
    pub n: usize,
    pub k: usize,
    pub transpose_a: bool,
    pub transpose_b: bool,
    pub bias: bool,
    pub accumulate: bool,
}

pub struct Inputs {
    pub a: Vec<f32>,
    pub b: Vec<f32>,
    pub bias: Vec<f32>,
    pub c0: Vec<f32>,
}

pub fn inputs(c: &Case, seed: u64) -> Inputs {
    Inputs {
        a: data(seed, c.m * c.k, -1.0, 1.0),
        b: data(seed + 1, c.k * c.n, -1.0, 1.0),
        bias: data(seed + 2, c.n, -1.0, 1.0),
        c0: data(seed + 3, c.m * c.n, -1.0, 1.0),
    }
}

/// `c (+)= a·b (+ bias)`; `a` stored `[K, M]` when transposed (as xᵀ in dW = xᵀ·dy),
/// `b` stored `[N, K]`.
pub fn run(be: &CudaBackend, c: &Case, x: &Inputs) -> Vec<f32> {
    let (ab, bb, biasb, cb) = (
        buf(be, &x.a),
        buf(be, &x.b),
        buf(be, &x.bias),
        buf(be, &x.c0),
    );
    let am: Matrix<'_, _> = if c.transpose_a {
        View::new(&ab, 0, [c.k, c.m]).mat().t()
    } else {
        View::new(&ab, 0, [c.m, c.k]).mat()
    };
    let bm: Matrix<'_, _> = if c.transpose_b {
        View::new(&bb, 0, [c.n, c.k]).mat().t()
    } else {
        View::new(&bb, 0, [c.k, c.n]).mat()
    };
    let bias_v = c.bias.then(|| View::new(&biasb, 0, [c.n]));
    let out = View::new(&cb, 0, [c.m, c.n]).mat();
    if c.accumulate {
        be.matmul_add(am, bm, bias_v, out)
    } else {
        be.matmul(am, bm, bias_v, out)
    }
    .expect("matmul");
    read(be, &cb)
}

pub fn a_at(c: &Case, x: &Inputs, i: usize, kk: usize) -> f64 {
    (if c.transpose_a {
        x.a[kk * c.m + i]
    } else {
        x.a[i * c.k + kk]
    }) as f64
}

pub fn b_at(c: &Case, x: &Inputs, kk: usize, j: usize) -> f64 {
    (if c.transpose_b {
        x.b[j * c.k + kk]
    } else {
        x.b[kk * c.n + j]
    }) as f64
}

pub fn exact(c: &Case, x: &Inputs) -> (Vec<f32>, Vec<f64>) {
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

/// The product of `c` on `be` against the exact one, within the bound of cpu_vs_cuda.rs
/// for operands rounded to a format of unit roundoff `u_op` (TF32 2⁻¹¹, BF16 2⁻⁸) and
/// FP32 sums: `2·((2·u_op + (K + 2)·2⁻²⁴)·Σ_k |a_ik·b_kj| + 1e-6)`; the result, when
/// within it.
pub fn check(
    be: &CudaBackend,
    name: &str,
    c: &Case,
    u_op: f64,
    seed: u64,
) -> Result<Vec<f32>, String> {
    let x = inputs(c, seed);
    let got = run(be, c, &x);
    let (want, mag) = exact(c, &x);
    let k = c.k as f64;
    compare(name, &got, &want, |i| {
        2.0 * ((2.0 * u_op + k * U24) * mag[i] + 2.0 * U24 * mag[i] + 1e-6)
    })?;
    Ok(got)
}
