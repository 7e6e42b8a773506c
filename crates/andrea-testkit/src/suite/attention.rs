//! attention_forward (training and generation with a KV cache) and attention_backward.
//! `q`, `k`, `v` in [-1, 1] are the three thirds of one packed `[B, T, 3·C]` activation
//! (as the model's fused QKV projection leaves them) or three `[B, T, C]` tensors; the
//! gradients go to the same two layouts. Head sizes are mostly not powers of two, now and
//! then the tensor-core sizes 32, 64, 128; under TF32 or BF16 operands
//! ([`Config::operands`]) only those, with the per-element bound of
//! [`tol::operands`] on top of the FP32 tolerance.

use andrea_core::{AttentionShape, Backend, Heads, View};
use proptest::prelude::*;

use super::linalg::poison;
use super::{
    buffer, close_plus, fail, read_all, run, size, size_or_big, to_f64, view, Case, Config,
    Operands, OrFail,
};
use crate::random::Rand;
use crate::{reference, tol};

#[derive(Debug, Clone)]
struct AttnCase {
    b: usize,
    t: usize,
    h: usize,
    d: usize,
    /// q, k, v as thirds of one `[B, T, 3C]` tensor, else three tensors.
    packed: bool,
    offset: usize,
    seed: u64,
}

/// The head sizes tensor-core kernels are written for.
const TENSOR_CORE_HEAD_DIMS: [usize; 3] = [32, 64, 128];

fn head_dim(operands: Operands) -> BoxedStrategy<usize> {
    let tc = prop::sample::select(TENSOR_CORE_HEAD_DIMS.to_vec());
    match operands {
        Operands::Fp32 => prop_oneof![6 => size(24), 1 => tc].boxed(),
        _ => tc.boxed(),
    }
}

fn attn_case(operands: Operands) -> impl Strategy<Value = AttnCase> {
    (
        size(3),
        size_or_big(20, 80),
        size(4),
        head_dim(operands),
        any::<bool>(),
        0..3usize,
        any::<u64>(),
    )
        .prop_map(|(b, t, h, d, packed, offset, seed)| AttnCase {
            b,
            t,
            h,
            d,
            packed,
            offset,
            seed,
        })
}

/// `[B, T, 3C]` host data as three dense `[B, T, C]` arrays.
fn unpack(qkv: &[f32], b: usize, t: usize, c: usize) -> [Vec<f64>; 3] {
    [0, 1, 2].map(|part| {
        (0..b * t)
            .flat_map(|row| qkv[row * 3 * c + part * c..row * 3 * c + (part + 1) * c].iter())
            .map(|&v| v as f64)
            .collect()
    })
}

/// Three dense `[B, T, C]` arrays as one packed `[B, T, 3C]`.
fn pack(parts: &[Vec<f64>; 3], b: usize, t: usize, c: usize) -> Vec<f64> {
    let mut out = Vec::with_capacity(3 * b * t * c);
    for row in 0..b * t {
        for p in parts {
            out.extend_from_slice(&p[row * c..(row + 1) * c]);
        }
    }
    out
}

/// Buffers for q, k, v (or their gradients) in either layout; `data` is `[B, T, 3C]`
/// when packed, else the concatenation of three `[B, T, C]`, after `offset` elements.
struct Qkv<Buf> {
    bufs: Vec<Buf>,
    cs: AttnCase,
}

impl<Buf: andrea_core::DeviceMemory> Qkv<Buf> {
    fn heads(&self) -> Result<[Heads<'_, Buf>; 3], proptest::test_runner::TestCaseError> {
        let cs = &self.cs;
        let c = cs.h * cs.d;
        let bad = || fail("attention: could not split heads (testkit bug)");
        if cs.packed {
            let t = View::new(&self.bufs[0], cs.offset, [cs.b, cs.t, 3 * c]);
            Heads::split_qkv(t, cs.h).ok_or_else(bad)
        } else {
            let one = |i: usize| {
                Heads::from_tensor(View::new(&self.bufs[i], cs.offset, [cs.b, cs.t, c]), cs.h)
                    .ok_or_else(bad)
            };
            Ok([one(0)?, one(1)?, one(2)?])
        }
    }
}

fn qkv_buffers<B: Backend>(
    be: &B,
    cs: &AttnCase,
    host: &[Vec<f32>],
) -> Result<Qkv<B::Buffer>, proptest::test_runner::TestCaseError> {
    let bufs = host
        .iter()
        .map(|h| buffer(be, h))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(Qkv {
        bufs,
        cs: cs.clone(),
    })
}

/// Host data for q, k, v: one packed `[B, T, 3C]` or three `[B, T, C]`, each with
/// `offset` elements before and after.
fn qkv_host(r: &mut Rand, cs: &AttnCase, poisoned: bool) -> Vec<Vec<f32>> {
    let n = cs.b * cs.t * cs.h * cs.d;
    let mut make = |len: usize| {
        if poisoned {
            poison(r, len + 2 * cs.offset)
        } else {
            r.vec(len + 2 * cs.offset, -1.0, 1.0)
        }
    };
    if cs.packed {
        vec![make(3 * n)]
    } else {
        vec![make(n), make(n), make(n)]
    }
}

/// The dense `[B, T, C]` q, k, v of host data from [`qkv_host`].
fn dense(host: &[Vec<f32>], cs: &AttnCase) -> [Vec<f64>; 3] {
    let (off, c) = (cs.offset, cs.h * cs.d);
    let n = cs.b * cs.t * c;
    if cs.packed {
        unpack(&host[0][off..off + 3 * n], cs.b, cs.t, c)
    } else {
        [0, 1, 2].map(|i| to_f64(&host[i][off..off + n]))
    }
}

/// What the buffers of [`qkv_host`] should hold after `parts` were written into them.
fn expected(host: &[Vec<f32>], cs: &AttnCase, parts: &[Vec<f64>; 3]) -> Vec<Vec<f64>> {
    let (off, c) = (cs.offset, cs.h * cs.d);
    let mut want: Vec<Vec<f64>> = host.iter().map(|h| to_f64(h)).collect();
    if cs.packed {
        let p = pack(parts, cs.b, cs.t, c);
        want[0][off..off + p.len()].copy_from_slice(&p);
    } else {
        for (w, p) in want.iter_mut().zip(parts) {
            w[off..off + p.len()].copy_from_slice(p);
        }
    }
    want
}

/// Training-time causal attention (`pos_offset = 0`).
pub fn attention_forward<B: Backend>(be: &B, cfg: &Config) -> Case {
    let u = cfg.operands.unit_roundoff();
    run(cfg, "attention_forward", attn_case(cfg.operands), |cs| {
        let mut r = Rand::new(cs.seed);
        let (off, n) = (cs.offset, cs.b * cs.t * cs.h * cs.d);
        let host = qkv_host(&mut r, &cs, false);
        let qkv = qkv_buffers(be, &cs, &host)?;
        let [q, k, v] = qkv.heads()?;
        let out = poison(&mut r, n + 2 * off);
        let o_buf = buffer(be, &out)?;
        let ov = Heads::from_tensor(view(&o_buf, off, &[cs.b, cs.t, cs.h * cs.d]), cs.h)
            .ok_or_else(|| fail("attention: heads"))?;
        let shape = AttentionShape {
            batch: cs.b,
            heads: cs.h,
            head_dim: cs.d,
            q_len: cs.t,
            k_len: cs.t,
        };
        let ws_len = be.attention_workspace_len(shape).max(1);
        let ws = buffer(be, &vec![0.0; ws_len + off])?;
        be.attention_forward(q, k, v, ov, View::new(&ws, off, [ws_len]), 0)
            .or_fail("attention_forward")?;

        let [q64, k64, v64] = dense(&host, &cs);
        let mut want = to_f64(&out);
        let dims = (cs.b, cs.t, cs.t, cs.h, cs.d);
        reference::attention_forward(&mut want[off..off + n], &q64, &k64, &v64, dims, 0);
        let mut extra = vec![0.0; want.len()];
        extra[off..off + n]
            .copy_from_slice(&tol::operands::attention_out(dims, 0, &q64, &k64, &v64, u));
        close_plus(
            tol::attention_out(cs.t, cs.d),
            &extra,
            "attention_forward: out",
            &read_all(be, &o_buf)?,
            &want,
        )
    })
}

/// One generation step: `Tq` new queries at positions `pos_offset..`, keys and values
/// the first `pos_offset + Tq` rows of `[B, T_max, C]` KV caches. The cache is often
/// short, now and then longer than a few tiles of keys (where a backend may split the
/// keys, as the CUDA backend's decode kernels do).
pub fn attention_generation<B: Backend>(be: &B, cfg: &Config) -> Case {
    let u = cfg.operands.unit_roundoff();
    let pos = prop_oneof![3 => 0..=16usize, 1 => 17..=100usize];
    let case = (attn_case(cfg.operands), size(4), pos, 0..4usize);
    run(cfg, "attention_generation", case, |(cs, tq, pos, extra)| {
        let mut r = Rand::new(cs.seed);
        let (c, tk) = (cs.h * cs.d, pos + tq);
        let t_max = tk + extra;
        let q = r.vec(cs.b * tq * c, -1.0, 1.0);
        let (kc, vc) = (
            r.vec(cs.b * t_max * c, -1.0, 1.0),
            r.vec(cs.b * t_max * c, -1.0, 1.0),
        );
        let out = poison(&mut r, cs.b * tq * c);
        let (q_buf, k_buf, v_buf, o_buf) = (
            buffer(be, &q)?,
            buffer(be, &kc)?,
            buffer(be, &vc)?,
            buffer(be, &out)?,
        );
        let heads = |buf, t: usize| {
            Heads::from_tensor(View::new(buf, 0, [cs.b, t, c]), cs.h)
                .ok_or_else(|| fail("attention: heads"))
        };
        let (qh, oh) = (heads(&q_buf, tq)?, heads(&o_buf, tq)?);
        let (kh, vh) = (
            heads(&k_buf, t_max)?.prefix(tk),
            heads(&v_buf, t_max)?.prefix(tk),
        );
        let shape = AttentionShape {
            batch: cs.b,
            heads: cs.h,
            head_dim: cs.d,
            q_len: tq,
            k_len: tk,
        };
        let ws_len = be.attention_workspace_len(shape).max(1);
        let ws = buffer(be, &vec![0.0; ws_len])?;
        be.attention_forward(qh, kh, vh, oh, View::whole(&ws), pos)
            .or_fail("attention_forward")?;

        let prefix = |cache: &[f32]| -> Vec<f64> {
            (0..cs.b)
                .flat_map(|b| to_f64(&cache[b * t_max * c..(b * t_max + tk) * c]))
                .collect()
        };
        let mut want = vec![0.0; out.len()];
        let dims = (cs.b, tq, tk, cs.h, cs.d);
        let (q64, k64, v64) = (to_f64(&q), prefix(&kc), prefix(&vc));
        reference::attention_forward(&mut want, &q64, &k64, &v64, dims, pos);
        let op_bound = tol::operands::attention_out(dims, pos, &q64, &k64, &v64, u);
        let name = "attention_forward (generation): out";
        close_plus(
            tol::attention_out(tk, cs.d),
            &op_bound,
            name,
            &read_all(be, &o_buf)?,
            &want,
        )
    })
}

/// The backward pass after the backend's own forward pass (which leaves its workspace).
pub fn attention_backward<B: Backend>(be: &B, cfg: &Config) -> Case {
    let u = cfg.operands.unit_roundoff();
    run(cfg, "attention_backward", attn_case(cfg.operands), |cs| {
        let mut r = Rand::new(cs.seed);
        let c = cs.h * cs.d;
        let n = cs.b * cs.t * c;
        let host = qkv_host(&mut r, &cs, false);
        let ghost = qkv_host(&mut r, &cs, true);
        let qkv = qkv_buffers(be, &cs, &host)?;
        let grads = qkv_buffers(be, &cs, &ghost)?;
        let [q, k, v] = qkv.heads()?;
        let [dq, dk, dv] = grads.heads()?;
        let dout_host = r.vec(n, -1.0, 1.0);
        let (o_buf, d_buf) = (buffer(be, &vec![0.0; n])?, buffer(be, &dout_host)?);
        let bad = || fail("attention: heads");
        let oh = Heads::from_tensor(
            View::whole(&o_buf)
                .reshape([cs.b, cs.t, c])
                .ok_or_else(bad)?,
            cs.h,
        )
        .ok_or_else(bad)?;
        let dh = Heads::from_tensor(
            View::whole(&d_buf)
                .reshape([cs.b, cs.t, c])
                .ok_or_else(bad)?,
            cs.h,
        )
        .ok_or_else(bad)?;
        let shape = AttentionShape {
            batch: cs.b,
            heads: cs.h,
            head_dim: cs.d,
            q_len: cs.t,
            k_len: cs.t,
        };
        let (ws_len, sc_len) = (
            be.attention_workspace_len(shape),
            be.attention_backward_scratch_len(shape),
        );
        let ws = buffer(be, &vec![0.0; ws_len.max(1)])?;
        let sc = buffer(be, &poison(&mut r, sc_len.max(1)))?;
        be.attention_forward(q, k, v, oh, View::whole(&ws), 0)
            .or_fail("attention_forward")?;
        be.attention_backward(
            q,
            k,
            v,
            oh,
            dh,
            dq,
            dk,
            dv,
            View::whole(&ws),
            View::whole(&sc),
        )
        .or_fail("attention_backward")?;

        let [q64, k64, v64] = dense(&host, &cs);
        let mut out = vec![0.0; n];
        reference::attention_forward(
            &mut out,
            &q64,
            &k64,
            &v64,
            (cs.b, cs.t, cs.t, cs.h, cs.d),
            0,
        );
        close_plus(
            tol::attention_out(cs.t, cs.d),
            &tol::operands::attention_out((cs.b, cs.t, cs.t, cs.h, cs.d), 0, &q64, &k64, &v64, u),
            "attention_forward: out",
            &read_all(be, &o_buf)?,
            &out,
        )?;
        let mut g = [vec![0.0; n], vec![0.0; n], vec![0.0; n]];
        let [gq, gk, gv] = &mut g;
        let dout = to_f64(&dout_host);
        reference::attention_backward(
            gq,
            gk,
            gv,
            &dout,
            &q64,
            &k64,
            &v64,
            (cs.b, cs.t, cs.h, cs.d),
        );
        let want = expected(&ghost, &cs, &g);
        // The operand bounds, laid out as the gradients (0 around them).
        let zeros: Vec<Vec<f32>> = ghost.iter().map(|g| vec![0.0; g.len()]).collect();
        let dims = (cs.b, cs.t, cs.h, cs.d);
        let bounds = tol::operands::attention_grads(dims, &q64, &k64, &v64, &dout, u);
        let extra = expected(&zeros, &cs, &bounds);
        let t = tol::attention_grad(cs.t, cs.d);
        for (i, ((buf, want), extra)) in grads.bufs.iter().zip(&want).zip(&extra).enumerate() {
            let name = if cs.packed {
                "attention_backward: d(qkv)".to_string()
            } else {
                format!("attention_backward: {}", ["dq", "dk", "dv"][i])
            };
            close_plus(t, extra, &name, &read_all(be, buf)?, want)?;
        }
        Ok(())
    })
}
