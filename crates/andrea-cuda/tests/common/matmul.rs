//! One matmul case on the CUDA backend (split_k.rs, matmul_mma.rs): random inputs,
//! transposes by strides, bias and accumulate.

use andrea_core::{LinalgOps, Matrix, View};
use andrea_cuda::CudaBackend;

use super::{buf, data, read};

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
