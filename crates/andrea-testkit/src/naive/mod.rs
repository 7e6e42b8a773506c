//! [`NaiveBackend`]: the slowest correct backend. It exists as a check of the
//! conformance suite itself (the suite must pass on it, and must fail on a backend that
//! is subtly wrong, see `tests/suite_can_fail.rs`), and as an example of implementing
//! [`Backend`] (one `impl` per op family):
//!
//! * every op first validates its arguments with the [`andrea_core::check`] function of
//!   the same name, so all backends reject the same calls with the same messages;
//! * then copies its inputs out of "device" memory, computes in plain f32 loops
//!   (`kernels`, summing sequentially, which is about the least accurate order) and
//!   writes the outputs back. Reading every input before writing makes the documented
//!   in-place cases (`out` exactly an input) correct for free;
//! * the fused ops keep the traits' defaults ([`andrea_core::fused`]), so
//!   [`AttentionOps`] is implemented with an empty `impl`.
//!
//! Memory is a `RefCell<Vec<T>>`: `Send`, not `Sync`, which is what the trait asks of a
//! buffer. A `RefCell` borrow is never held across calls, so it cannot fail.

mod kernels;

use std::cell::RefCell;

use andrea_core::prelude::*;
use andrea_core::{check, Error, Result};

/// Host memory standing in for device memory.
#[derive(Debug)]
pub struct NaiveBuffer<T> {
    data: RefCell<Vec<T>>,
    len: usize,
}

impl<T> DeviceMemory for NaiveBuffer<T> {
    fn len(&self) -> usize {
        self.len
    }
}

/// Plain f32 loops on host memory. See the module docs.
#[derive(Debug, Clone, Copy, Default)]
pub struct NaiveBackend;

impl NaiveBackend {
    pub fn new() -> Self {
        NaiveBackend
    }
}

fn alloc_zeroed<T: Clone + Default>(len: usize) -> Result<NaiveBuffer<T>> {
    let mut data = Vec::new();
    data.try_reserve_exact(len)
        .map_err(|_| Error::OutOfMemory {
            device: "naive (host memory)".into(),
            bytes: len.saturating_mul(std::mem::size_of::<T>()),
        })?;
    data.resize(len, T::default());
    Ok(NaiveBuffer {
        data: RefCell::new(data),
        len,
    })
}

/// The elements of a (checked) view.
fn read<T: Copy>(t: &View<'_, NaiveBuffer<T>>) -> Vec<T> {
    t.buf.data.borrow()[t.range()].to_vec()
}

/// Overwrites a (checked) view.
fn write(t: &View<'_, NaiveBuffer<f32>>, values: &[f32]) {
    t.buf.data.borrow_mut()[t.range()].copy_from_slice(values);
}

/// A (checked) strided matrix as dense `[batch, rows, cols]`.
fn gather(m: &Matrix<'_, NaiveBuffer<f32>>) -> Vec<f32> {
    let data = m.buf.data.borrow();
    let mut out = Vec::with_capacity(m.batch * m.rows * m.cols);
    for b in 0..m.batch {
        for i in 0..m.rows {
            out.extend((0..m.cols).map(|j| data[m.at(b, i, j)]));
        }
    }
    out
}

/// Writes dense `[batch, rows, cols]` values through a (checked) strided matrix.
fn scatter(m: &Matrix<'_, NaiveBuffer<f32>>, values: &[f32]) {
    let mut data = m.buf.data.borrow_mut();
    let mut it = values.iter();
    for b in 0..m.batch {
        for i in 0..m.rows {
            for j in 0..m.cols {
                if let Some(&v) = it.next() {
                    data[m.at(b, i, j)] = v;
                }
            }
        }
    }
}

impl NaiveBackend {
    /// `matmul` and `matmul_add`: `c (+)= a·b (+ bias)`.
    fn gemm(
        &self,
        a: Mat<'_, Self>,
        b: Mat<'_, Self>,
        bias: Option<Tensor<'_, Self>>,
        c: Mat<'_, Self>,
        accumulate: bool,
    ) -> Result<()> {
        let d = check::matmul(&a, &b, bias.as_ref(), &c)?;
        let (av, bv) = (gather(&a), gather(&b));
        let bias = bias.map(|t| read(&t));
        let mut cv = if accumulate {
            gather(&c)
        } else {
            vec![0.0; d.batch * d.m * d.n]
        };
        let batched = (a.batch > 1, b.batch > 1);
        kernels::matmul(&mut cv, &av, &bv, bias.as_deref(), d, batched, accumulate);
        scatter(&c, &cv);
        Ok(())
    }
}

impl MemoryOps for NaiveBackend {
    type Buffer = NaiveBuffer<f32>;
    type IdBuffer = NaiveBuffer<u32>;
    type Bf16Buffer = NaiveBuffer<bf16>;

    fn name(&self) -> String {
        "naive (f32 loops on the host)".into()
    }

    fn alloc(&self, len: usize) -> Result<Self::Buffer> {
        alloc_zeroed(len)
    }

    fn alloc_ids(&self, len: usize) -> Result<Self::IdBuffer> {
        alloc_zeroed(len)
    }

    fn alloc_bf16(&self, len: usize) -> Result<Self::Bf16Buffer> {
        alloc_zeroed(len)
    }

    fn upload(&self, src: &[f32], dst: Tensor<'_, Self>) -> Result<()> {
        check::upload(&dst, src.len())?;
        write(&dst, src);
        Ok(())
    }

    fn download(&self, src: Tensor<'_, Self>, dst: &mut [f32]) -> Result<()> {
        check::download(&src, dst.len())?;
        dst.copy_from_slice(&read(&src));
        Ok(())
    }

    fn upload_ids(&self, src: &[u32], dst: Ids<'_, Self>) -> Result<()> {
        check::upload_ids(&dst, src.len())?;
        dst.buf.data.borrow_mut()[dst.range()].copy_from_slice(src);
        Ok(())
    }

    fn fill(&self, dst: Tensor<'_, Self>, value: f32) -> Result<()> {
        check::fill(&dst)?;
        write(&dst, &vec![value; dst.numel()]);
        Ok(())
    }

    fn copy(&self, src: Mat<'_, Self>, dst: Mat<'_, Self>) -> Result<()> {
        check::copy(&src, &dst)?;
        scatter(&dst, &gather(&src));
        Ok(())
    }

    fn to_bf16(&self, src: Tensor<'_, Self>, dst: Bf16Tensor<'_, Self>) -> Result<()> {
        check::convert("to_bf16", &src, &dst)?;
        let narrow: Vec<bf16> = read(&src).into_iter().map(bf16::from_f32).collect();
        dst.buf.data.borrow_mut()[dst.range()].copy_from_slice(&narrow);
        Ok(())
    }

    fn to_f32(&self, src: Bf16Tensor<'_, Self>, dst: Tensor<'_, Self>) -> Result<()> {
        check::convert("to_f32", &src, &dst)?;
        let wide: Vec<f32> = read(&src).into_iter().map(bf16::to_f32).collect();
        write(&dst, &wide);
        Ok(())
    }
}

impl LinalgOps for NaiveBackend {
    fn matmul(
        &self,
        a: Mat<'_, Self>,
        b: Mat<'_, Self>,
        bias: Option<Tensor<'_, Self>>,
        c: Mat<'_, Self>,
    ) -> Result<()> {
        self.gemm(a, b, bias, c, false)
    }

    fn matmul_add(
        &self,
        a: Mat<'_, Self>,
        b: Mat<'_, Self>,
        bias: Option<Tensor<'_, Self>>,
        c: Mat<'_, Self>,
    ) -> Result<()> {
        self.gemm(a, b, bias, c, true)
    }

    fn bias_backward(&self, dout: Tensor<'_, Self>, dbias: Tensor<'_, Self>) -> Result<()> {
        let d = check::bias_backward(&dout, &dbias)?;
        let (g, mut db) = (read(&dout), read(&dbias));
        kernels::bias_backward(&mut db, &g, d.rows, d.cols);
        write(&dbias, &db);
        Ok(())
    }
}

impl ElementwiseOps for NaiveBackend {
    fn add(&self, a: Tensor<'_, Self>, b: Tensor<'_, Self>, out: Tensor<'_, Self>) -> Result<()> {
        check::add(&a, &b, &out)?;
        let (av, bv) = (read(&a), read(&b));
        write(
            &out,
            &av.iter().zip(&bv).map(|(x, y)| x + y).collect::<Vec<_>>(),
        );
        Ok(())
    }

    fn scale(&self, x: Tensor<'_, Self>, alpha: f32) -> Result<()> {
        check::scale(&x)?;
        write(&x, &read(&x).iter().map(|v| v * alpha).collect::<Vec<_>>());
        Ok(())
    }

    fn gelu(&self, x: Tensor<'_, Self>, out: Tensor<'_, Self>) -> Result<()> {
        check::gelu(&x, &out)?;
        write(
            &out,
            &read(&x)
                .iter()
                .map(|&v| kernels::gelu(v))
                .collect::<Vec<_>>(),
        );
        Ok(())
    }

    fn gelu_backward(
        &self,
        x: Tensor<'_, Self>,
        dout: Tensor<'_, Self>,
        dx: Tensor<'_, Self>,
    ) -> Result<()> {
        check::gelu_backward(&x, &dout, &dx)?;
        let (xv, dv) = (read(&x), read(&dout));
        write(
            &dx,
            &xv.iter()
                .zip(&dv)
                .map(|(&x, &d)| d * kernels::gelu_grad(x))
                .collect::<Vec<_>>(),
        );
        Ok(())
    }
}

impl LayerNormOps for NaiveBackend {
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
        let d = check::layernorm(&x, &gamma, &beta, &out, &mean, &rstd, eps)?;
        let (n, c) = (d.rows, d.channels);
        let (xv, g, b) = (read(&x), read(&gamma), read(&beta));
        let (mut o, mut m, mut r) = (vec![0.0; n * c], vec![0.0; n], vec![0.0; n]);
        kernels::layernorm(&mut o, &mut m, &mut r, &xv, &g, &b, c, eps);
        write(&out, &o);
        write(&mean, &m);
        write(&rstd, &r);
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
        let c = check::layernorm_backward(&x, &gamma, &mean, &rstd, &dout, &dx, &dgamma, &dbeta)?
            .channels;
        let ins = [&x, &gamma, &mean, &rstd, &dout].map(read);
        let (mut dxv, mut dg, mut db) = (read(&dx), read(&dgamma), read(&dbeta));
        kernels::layernorm_backward(&mut dxv, &mut dg, &mut db, &ins, c);
        write(&dx, &dxv);
        write(&dgamma, &dg);
        write(&dbeta, &db);
        Ok(())
    }
}

impl SoftmaxOps for NaiveBackend {
    fn softmax(
        &self,
        x: Tensor<'_, Self>,
        out: Tensor<'_, Self>,
        scale: f32,
        causal_offset: Option<usize>,
    ) -> Result<()> {
        let d = check::softmax(&x, &out, scale, causal_offset)?;
        let xv = read(&x);
        let mut o = vec![0.0; xv.len()];
        kernels::softmax(&mut o, &xv, d, scale, causal_offset);
        write(&out, &o);
        Ok(())
    }

    fn softmax_backward(
        &self,
        probs: Tensor<'_, Self>,
        dprobs: Tensor<'_, Self>,
        dx: Tensor<'_, Self>,
        scale: f32,
    ) -> Result<()> {
        let cols = check::softmax_backward(&probs, &dprobs, &dx)?.cols;
        let (p, dp) = (read(&probs), read(&dprobs));
        let mut d = vec![0.0; p.len()];
        kernels::softmax_backward(&mut d, &p, &dp, cols, scale);
        write(&dx, &d);
        Ok(())
    }
}

impl EmbeddingOps for NaiveBackend {
    fn embedding(
        &self,
        ids: Ids<'_, Self>,
        wte: Tensor<'_, Self>,
        wpe: Tensor<'_, Self>,
        out: Tensor<'_, Self>,
        pos_offset: usize,
    ) -> Result<()> {
        let d = check::embedding(&ids, &wte, &wpe, &out, pos_offset)?;
        let tokens = read(&ids);
        check::ids_values("embedding", "ids", &tokens, d.vocab)?;
        let (e, p) = (read(&wte), read(&wpe));
        let c = d.channels;
        let mut o = vec![0.0; d.batch * d.seq * c];
        for (n, &tok) in tokens.iter().enumerate() {
            let (tok, pos) = (tok as usize, pos_offset + n % d.seq);
            for i in 0..c {
                o[n * c + i] = e[tok * c + i] + p[pos * c + i];
            }
        }
        write(&out, &o);
        Ok(())
    }

    fn embedding_backward(
        &self,
        ids: Ids<'_, Self>,
        dout: Tensor<'_, Self>,
        dwte: Tensor<'_, Self>,
        dwpe: Tensor<'_, Self>,
    ) -> Result<()> {
        let d = check::embedding_backward(&ids, &dout, &dwte, &dwpe)?;
        let tokens = read(&ids);
        check::ids_values("embedding_backward", "ids", &tokens, d.vocab)?;
        let (g, mut e, mut p) = (read(&dout), read(&dwte), read(&dwpe));
        let c = d.channels;
        for (n, &tok) in tokens.iter().enumerate() {
            let (tok, pos) = (tok as usize, n % d.seq);
            for i in 0..c {
                e[tok * c + i] += g[n * c + i];
                p[pos * c + i] += g[n * c + i];
            }
        }
        write(&dwte, &e);
        write(&dwpe, &p);
        Ok(())
    }
}

impl LossOps for NaiveBackend {
    fn softmax_cross_entropy(
        &self,
        logits: Tensor<'_, Self>,
        targets: Ids<'_, Self>,
        vocab: usize,
        losses: Tensor<'_, Self>,
        dlogits: Option<Tensor<'_, Self>>,
        grad_scale: f32,
    ) -> Result<()> {
        let d = check::softmax_cross_entropy(&logits, &targets, vocab, &losses, dlogits.as_ref())?;
        let (n, vp) = (d.rows, d.padded_vocab);
        let t = read(&targets);
        check::target_values("softmax_cross_entropy", &t, vocab)?;
        let z = read(&logits);
        let (mut l, mut g) = (vec![0.0; n], vec![0.0; n * vp]);
        kernels::cross_entropy(&mut l, &mut g, &z, &t, vp, vocab, grad_scale);
        write(&losses, &l);
        if let Some(d) = dlogits {
            write(&d, &g);
        }
        Ok(())
    }
}

impl OptimOps for NaiveBackend {
    fn sum_squares(&self, x: Tensor<'_, Self>) -> Result<f64> {
        check::sum_squares(&x)?;
        Ok(read(&x).iter().map(|&v| v as f64 * v as f64).sum())
    }

    fn adamw(
        &self,
        param: Tensor<'_, Self>,
        grad: Tensor<'_, Self>,
        m: Tensor<'_, Self>,
        v: Tensor<'_, Self>,
        step: &AdamWStep,
    ) -> Result<()> {
        check::adamw(&param, &grad, &m, &v, step)?;
        let (mut p, g, mut mv, mut vv) = (read(&param), read(&grad), read(&m), read(&v));
        kernels::adamw(&mut p, &g, &mut mv, &mut vv, step);
        write(&param, &p);
        write(&m, &mv);
        write(&v, &vv);
        Ok(())
    }
}

/// The defaults: attention composed of matmuls and softmaxes.
/// The defaults (products of each head's matrices, which take any head stride); KV caches
/// with heads apart, so that a comparison with the CPU backend runs the CPU's layout.
impl AttentionOps for NaiveBackend {
    fn kv_heads_apart(&self) -> bool {
        true
    }
}

/// The default: every block as its four ops.
impl andrea_core::DecodeOps for NaiveBackend {}
