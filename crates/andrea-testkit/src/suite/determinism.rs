//! The same inputs give bit-identical outputs: every op that reduces (and so could
//! depend on a thread schedule or atomics) runs twice from fresh buffers, at shapes
//! large enough to be split across threads or blocks, and with odd sizes.

use andrea_core::{AdamWStep, AttentionShape, Backend, Heads, View};
use proptest::test_runner::TestCaseError;

use super::view as v;
use super::{buffer, fail, id_buffer, read_all, Case, Config, OrFail};
use crate::random::Rand;

type Outputs = Result<Vec<f32>, TestCaseError>;

fn twice(name: &str, run: impl Fn() -> Outputs) -> Case {
    let (first, second) = (run()?, run()?);
    match first
        .iter()
        .zip(&second)
        .position(|(a, b)| a.to_bits() != b.to_bits())
    {
        None if first.len() == second.len() => Ok(()),
        None => Err(fail(format!("determinism: {name}: output lengths differ"))),
        Some(i) => Err(fail(format!(
            "determinism: {name}: element {i} differs between two runs on the same inputs: \
             {:e} vs {:e}",
            first[i], second[i]
        ))),
    }
}

/// Every reducing op, twice each.
pub fn determinism<B: Backend>(be: &B, _cfg: &Config) -> Case {
    let data = |seed: u64, n: usize| Rand::new(seed).vec(n, -1.0, 1.0);
    let (m, k, n) = (131, 333, 67);

    twice("matmul", || {
        let (a, b, c) = (
            buffer(be, &data(1, m * k))?,
            buffer(be, &data(2, n * k))?,
            buffer(be, &data(3, m * n))?,
        );
        let bias = buffer(be, &data(4, n))?;
        let bt = v(&b, 0, &[n, k]).mat().t();
        be.matmul_add(
            v(&a, 0, &[m, k]).mat(),
            bt,
            Some(v(&bias, 0, &[n])),
            v(&c, 0, &[m, n]).mat(),
        )
        .or_fail("matmul")?;
        read_all(be, &c)
    })?;
    twice("matmul_gelu_backward", || {
        let (dy, w, pre) = (
            buffer(be, &data(21, m * k))?,
            buffer(be, &data(22, n * k))?,
            buffer(be, &data(23, m * n))?,
        );
        let dpre = buffer(be, &vec![0.0; m * n])?;
        be.matmul_gelu_backward(
            v(&dy, 0, &[m, k]).mat(),
            v(&w, 0, &[n, k]).mat().t(),
            v(&pre, 0, &[m, n]),
            v(&dpre, 0, &[m, n]),
        )
        .or_fail("matmul_gelu_backward")?;
        read_all(be, &dpre)
    })?;
    twice("bias_backward", || {
        let (d, db) = (buffer(be, &data(5, m * k))?, buffer(be, &data(6, k))?);
        be.bias_backward(v(&d, 0, &[m, k]), v(&db, 0, &[k]))
            .or_fail("bias_backward")?;
        read_all(be, &db)
    })?;
    let (rows, c) = (97, 771);
    twice("layernorm and layernorm_backward", || {
        let (x, g, bt) = (
            buffer(be, &data(7, rows * c))?,
            buffer(be, &data(8, c))?,
            buffer(be, &data(9, c))?,
        );
        let (o, s) = (
            buffer(be, &vec![0.0; rows * c])?,
            buffer(be, &vec![0.0; 2 * rows])?,
        );
        let (mean, rstd) = (v(&s, 0, &[rows]), v(&s, rows, &[rows]));
        be.layernorm(
            v(&x, 0, &[rows, c]),
            v(&g, 0, &[c]),
            v(&bt, 0, &[c]),
            v(&o, 0, &[rows, c]),
            mean,
            rstd,
            1e-5,
        )
        .or_fail("layernorm")?;
        let (d, dx, dp) = (
            buffer(be, &data(10, rows * c))?,
            buffer(be, &data(11, rows * c))?,
            buffer(be, &data(12, 2 * c))?,
        );
        be.layernorm_backward(
            v(&x, 0, &[rows, c]),
            v(&g, 0, &[c]),
            mean,
            rstd,
            v(&d, 0, &[rows, c]),
            v(&dx, 0, &[rows, c]),
            v(&dp, 0, &[c]),
            v(&dp, c, &[c]),
        )
        .or_fail("layernorm_backward")?;
        Ok([
            read_all(be, &o)?,
            read_all(be, &s)?,
            read_all(be, &dx)?,
            read_all(be, &dp)?,
        ]
        .concat())
    })?;
    twice("softmax and softmax_backward", || {
        let dims = [3, 45, 301];
        let (x, dp) = (
            buffer(be, &data(13, 3 * 45 * 301))?,
            buffer(be, &data(14, 3 * 45 * 301))?,
        );
        be.softmax(v(&x, 0, &dims), v(&x, 0, &dims), 0.3, Some(7))
            .or_fail("softmax")?;
        be.softmax_backward(v(&x, 0, &dims), v(&dp, 0, &dims), v(&dp, 0, &dims), 0.3)
            .or_fail("softmax_backward")?;
        Ok([read_all(be, &x)?, read_all(be, &dp)?].concat())
    })?;
    twice("softmax_cross_entropy", || {
        let (rows, vp) = (61, 1031);
        let z = buffer(be, &Rand::new(15).vec(rows * vp, -8.0, 8.0))?;
        let targets: Vec<u32> = (0..rows as u32).map(|i| (i * 37) % 1000).collect();
        let (t, l) = (id_buffer(be, &targets)?, buffer(be, &vec![0.0; rows])?);
        let zv = v(&z, 0, &[rows, vp]);
        be.softmax_cross_entropy(zv, View::whole(&t), 1000, View::whole(&l), Some(zv), 0.01)
            .or_fail("softmax_cross_entropy")?;
        Ok([read_all(be, &z)?, read_all(be, &l)?].concat())
    })?;
    twice("embedding_backward", || {
        let (b, t, c, vocab) = (5, 97, 129, 7);
        let ids: Vec<u32> = (0..(b * t) as u32)
            .map(|i| (i * i) % vocab as u32)
            .collect();
        let (i, d) = (id_buffer(be, &ids)?, buffer(be, &data(16, b * t * c))?);
        let (e, p) = (
            buffer(be, &data(17, vocab * c))?,
            buffer(be, &data(18, t * c))?,
        );
        be.embedding_backward(
            View::whole(&i),
            v(&d, 0, &[b, t, c]),
            v(&e, 0, &[vocab, c]),
            v(&p, 0, &[t, c]),
        )
        .or_fail("embedding_backward")?;
        Ok([read_all(be, &e)?, read_all(be, &p)?].concat())
    })?;
    let len = 100_003;
    let g = buffer(be, &data(20, len))?;
    let first = be.sum_squares(View::whole(&g)).or_fail("sum_squares")?;
    let second = be.sum_squares(View::whole(&g)).or_fail("sum_squares")?;
    if first.to_bits() != second.to_bits() {
        return Err(fail(format!(
            "determinism: sum_squares differs between two runs on the same input: \
             {first:e} vs {second:e}"
        )));
    }
    twice("adamw", || {
        let (p, g) = (buffer(be, &data(19, len))?, buffer(be, &data(20, len))?);
        let (mm, vv) = (buffer(be, &data(21, len))?, buffer(be, &vec![0.01; len])?);
        let step = AdamWStep {
            lr: 1e-3,
            beta1: 0.9,
            beta2: 0.95,
            eps: 1e-8,
            weight_decay: 0.1,
            step: 3,
            grad_scale: 0.5,
        };
        be.adamw(
            View::whole(&p),
            View::whole(&g),
            View::whole(&mm),
            View::whole(&vv),
            &step,
        )
        .or_fail("adamw")?;
        Ok([read_all(be, &p)?, read_all(be, &mm)?, read_all(be, &vv)?].concat())
    })?;
    twice("attention_forward and attention_backward", || {
        let (b, t, h, d) = (2, 37, 3, 21);
        let c = h * d;
        let (qkv, dqkv) = (
            buffer(be, &data(22, b * t * 3 * c))?,
            buffer(be, &vec![0.0; b * t * 3 * c])?,
        );
        let (o, dout) = (
            buffer(be, &vec![0.0; b * t * c])?,
            buffer(be, &data(23, b * t * c))?,
        );
        let shape = AttentionShape {
            batch: b,
            heads: h,
            head_dim: d,
            q_len: t,
            k_len: t,
        };
        let ws = buffer(be, &vec![0.0; be.attention_workspace_len(shape).max(1)])?;
        let sc = buffer(
            be,
            &vec![0.0; be.attention_backward_scratch_len(shape).max(1)],
        )?;
        let bad = || fail("attention: heads");
        let [q, k, vh] = Heads::split_qkv(v(&qkv, 0, &[b, t, 3 * c]), h).ok_or_else(bad)?;
        let [dq, dk, dv] = Heads::split_qkv(v(&dqkv, 0, &[b, t, 3 * c]), h).ok_or_else(bad)?;
        let oh = Heads::from_tensor(v(&o, 0, &[b, t, c]), h).ok_or_else(bad)?;
        let dh = Heads::from_tensor(v(&dout, 0, &[b, t, c]), h).ok_or_else(bad)?;
        be.attention_forward(q, k, vh, oh, View::whole(&ws), 0)
            .or_fail("attention_forward")?;
        be.attention_backward(
            q,
            k,
            vh,
            oh,
            dh,
            dq,
            dk,
            dv,
            View::whole(&ws),
            View::whole(&sc),
        )
        .or_fail("attention_backward")?;
        Ok([read_all(be, &o)?, read_all(be, &dqkv)?].concat())
    })
}
