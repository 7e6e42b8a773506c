//! One validation function per op of [`crate::Backend`], built from the blocks in the
//! parent module.

use super::{
    disjoint, heads, ids_in_range, matrix, numel, output_matrix, same_shape, view, Region,
};
use crate::error::{Error, Result};
use crate::tensor::{DeviceMemory, Heads, Matrix, Shape, View};

/// [`crate::Backend::upload`] / [`crate::Backend::download`]: `host_len == t.numel()`.
pub fn transfer<M: DeviceMemory>(op: &'static str, t: &View<'_, M>, host_len: usize) -> Result<()> {
    view(op, "device", t)?;
    if host_len != t.numel() {
        return Err(Error::SizeMismatch {
            op,
            what: "element count",
            a: "host",
            a_size: host_len,
            b: "device",
            b_size: t.numel(),
        });
    }
    Ok(())
}

/// [`crate::Backend::copy`].
pub fn copy<M: DeviceMemory>(src: &Matrix<'_, M>, dst: &Matrix<'_, M>) -> Result<()> {
    const OP: &str = "copy";
    matrix(OP, "src", src)?;
    output_matrix(OP, "dst", dst)?;
    if src.shape() != dst.shape() {
        return Err(Error::ShapeMismatch {
            op: OP,
            arg: "dst",
            expected: src.shape(),
            got: dst.shape(),
        });
    }
    disjoint(
        OP,
        &[Region::of_matrix("dst", dst)],
        &[Region::of_matrix("src", src)],
        false,
    )
}

/// Sizes of a validated matmul.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MatmulDims {
    pub batch: usize,
    pub m: usize,
    pub k: usize,
    pub n: usize,
}

/// [`crate::Backend::matmul`].
pub fn matmul<M: DeviceMemory>(
    a: &Matrix<'_, M>,
    b: &Matrix<'_, M>,
    bias: Option<&View<'_, M>>,
    c: &Matrix<'_, M>,
) -> Result<MatmulDims> {
    const OP: &str = "matmul";
    matrix(OP, "a", a)?;
    matrix(OP, "b", b)?;
    output_matrix(OP, "c", c)?;
    if a.cols != b.rows {
        return Err(Error::SizeMismatch {
            op: OP,
            what: "inner dimension",
            a: "a (columns)",
            a_size: a.cols,
            b: "b (rows)",
            b_size: b.rows,
        });
    }
    if c.rows != a.rows {
        return Err(Error::SizeMismatch {
            op: OP,
            what: "rows",
            a: "c",
            a_size: c.rows,
            b: "a",
            b_size: a.rows,
        });
    }
    if c.cols != b.cols {
        return Err(Error::SizeMismatch {
            op: OP,
            what: "columns",
            a: "c",
            a_size: c.cols,
            b: "b",
            b_size: b.cols,
        });
    }
    for (name, x) in [("a", a), ("b", b)] {
        if x.batch != 1 && x.batch != c.batch {
            return Err(Error::SizeMismatch {
                op: OP,
                what: "batch (1 or equal to c's)",
                a: name,
                a_size: x.batch,
                b: "c",
                b_size: c.batch,
            });
        }
    }
    let mut inputs = vec![Region::of_matrix("a", a), Region::of_matrix("b", b)];
    if let Some(bias) = bias {
        numel(OP, "bias", bias, c.cols)?;
        inputs.push(Region::of("bias", bias));
    }
    disjoint(OP, &[Region::of_matrix("c", c)], &inputs, false)?;
    Ok(MatmulDims {
        batch: c.batch,
        m: c.rows,
        k: a.cols,
        n: c.cols,
    })
}

/// [`crate::Backend::bias_backward`]: returns `(N, M)`.
pub fn bias_backward<M: DeviceMemory>(
    dout: &View<'_, M>,
    dbias: &View<'_, M>,
) -> Result<(usize, usize)> {
    const OP: &str = "bias_backward";
    view(OP, "dout", dout)?;
    let m = dout.shape.last();
    numel(OP, "dbias", dbias, m)?;
    disjoint(
        OP,
        &[Region::of("dbias", dbias)],
        &[Region::of("dout", dout)],
        false,
    )?;
    Ok((dout.shape.rows(), m))
}

/// An elementwise op `out = f(inputs...)`, all of one shape; `in_place` allows `out`
/// to be exactly one of the inputs.
pub fn elementwise<M: DeviceMemory>(
    op: &'static str,
    inputs: &[(&'static str, &View<'_, M>)],
    out: (&'static str, &View<'_, M>),
    in_place: bool,
) -> Result<()> {
    let (first_name, first) = inputs[0];
    view(op, first_name, first)?;
    for (name, x) in &inputs[1..] {
        same_shape(op, name, x, first)?;
    }
    same_shape(op, out.0, out.1, first)?;
    let regions: Vec<Region> = inputs.iter().map(|(n, x)| Region::of(n, x)).collect();
    disjoint(op, &[Region::of(out.0, out.1)], &regions, in_place)
}

/// [`crate::Backend::layernorm`]: returns `(N, C)`.
pub fn layernorm<M: DeviceMemory>(
    x: &View<'_, M>,
    gamma: &View<'_, M>,
    beta: &View<'_, M>,
    out: &View<'_, M>,
    mean: &View<'_, M>,
    rstd: &View<'_, M>,
    eps: f32,
) -> Result<(usize, usize)> {
    const OP: &str = "layernorm";
    view(OP, "x", x)?;
    let (n, c) = (x.shape.rows(), x.shape.last());
    numel(OP, "gamma", gamma, c)?;
    numel(OP, "beta", beta, c)?;
    same_shape(OP, "out", out, x)?;
    numel(OP, "mean", mean, n)?;
    numel(OP, "rstd", rstd, n)?;
    if !(eps > 0.0 && eps.is_finite()) {
        return Err(Error::invalid(
            OP,
            format!("eps must be a positive finite number, got {eps}"),
        ));
    }
    disjoint(
        OP,
        &[
            Region::of("out", out),
            Region::of("mean", mean),
            Region::of("rstd", rstd),
        ],
        &[
            Region::of("x", x),
            Region::of("gamma", gamma),
            Region::of("beta", beta),
        ],
        false,
    )?;
    Ok((n, c))
}

/// [`crate::Backend::layernorm_backward`]: returns `(N, C)`.
pub fn layernorm_backward<M: DeviceMemory>(
    x: &View<'_, M>,
    gamma: &View<'_, M>,
    mean: &View<'_, M>,
    rstd: &View<'_, M>,
    dout: &View<'_, M>,
    dx: &View<'_, M>,
    dgamma: &View<'_, M>,
    dbeta: &View<'_, M>,
) -> Result<(usize, usize)> {
    const OP: &str = "layernorm_backward";
    view(OP, "x", x)?;
    let (n, c) = (x.shape.rows(), x.shape.last());
    numel(OP, "gamma", gamma, c)?;
    numel(OP, "mean", mean, n)?;
    numel(OP, "rstd", rstd, n)?;
    same_shape(OP, "dout", dout, x)?;
    same_shape(OP, "dx", dx, x)?;
    numel(OP, "dgamma", dgamma, c)?;
    numel(OP, "dbeta", dbeta, c)?;
    disjoint(
        OP,
        &[
            Region::of("dx", dx),
            Region::of("dgamma", dgamma),
            Region::of("dbeta", dbeta),
        ],
        &[
            Region::of("x", x),
            Region::of("gamma", gamma),
            Region::of("mean", mean),
            Region::of("rstd", rstd),
            Region::of("dout", dout),
        ],
        false,
    )?;
    Ok((n, c))
}

/// Sizes of a validated softmax: `rows` rows of `k_len` columns, the query index of a
/// row being `row % q_len`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SoftmaxDims {
    pub rows: usize,
    pub q_len: usize,
    pub k_len: usize,
}

/// [`crate::Backend::softmax`].
pub fn softmax<M: DeviceMemory>(
    x: &View<'_, M>,
    out: &View<'_, M>,
    scale: f32,
    causal_offset: Option<usize>,
) -> Result<SoftmaxDims> {
    const OP: &str = "softmax";
    elementwise(OP, &[("x", x)], ("out", out), true)?;
    if !scale.is_finite() {
        return Err(Error::invalid(
            OP,
            format!("scale must be finite, got {scale}"),
        ));
    }
    let d = x.shape.dims();
    let k_len = x.shape.last();
    let q_len = if d.len() >= 2 { d[d.len() - 2] } else { 1 };
    if let Some(o) = causal_offset {
        if o.saturating_add(q_len) > k_len {
            return Err(Error::invalid(
                OP,
                format!(
                    "causal mask: offset {o} + {q_len} queries needs at least {} key columns, x has {k_len}",
                    o.saturating_add(q_len)
                ),
            ));
        }
    }
    Ok(SoftmaxDims {
        rows: x.shape.rows(),
        q_len,
        k_len,
    })
}

/// [`crate::Backend::softmax_backward`]: returns `(rows, cols)`.
pub fn softmax_backward<M: DeviceMemory>(
    probs: &View<'_, M>,
    dprobs: &View<'_, M>,
    dx: &View<'_, M>,
) -> Result<(usize, usize)> {
    const OP: &str = "softmax_backward";
    view(OP, "probs", probs)?;
    same_shape(OP, "dprobs", dprobs, probs)?;
    same_shape(OP, "dx", dx, probs)?;
    disjoint(
        OP,
        &[Region::of("dx", dx)],
        &[Region::of("probs", probs)],
        false,
    )?;
    disjoint(
        OP,
        &[Region::of("dx", dx)],
        &[Region::of("dprobs", dprobs)],
        true,
    )?;
    Ok((probs.shape.rows(), probs.shape.last()))
}

/// Sizes of a validated embedding: `out: [B, T, C]`, `wte: [V, C]`, `wpe: [T_ctx, C]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EmbeddingDims {
    pub batch: usize,
    pub seq: usize,
    pub channels: usize,
    pub vocab: usize,
    pub context: usize,
}

fn embedding_dims<M: DeviceMemory, I: DeviceMemory>(
    op: &'static str,
    ids: &View<'_, I>,
    wte: &View<'_, M>,
    wpe: &View<'_, M>,
    out: &View<'_, M>,
    out_name: &'static str,
    pos_offset: usize,
) -> Result<EmbeddingDims> {
    view(op, out_name, out)?;
    let d = out.shape.dims();
    if d.len() != 3 {
        return Err(Error::invalid(
            op,
            format!("`{out_name}` must be [B, T, C], got {}", out.shape),
        ));
    }
    let (batch, seq, channels) = (d[0], d[1], d[2]);
    view(op, "ids", ids)?;
    if ids.numel() != batch * seq {
        return Err(Error::SizeMismatch {
            op,
            what: "token count (B·T)",
            a: "ids",
            a_size: ids.numel(),
            b: out_name,
            b_size: batch * seq,
        });
    }
    view(op, "wte", wte)?;
    view(op, "wpe", wpe)?;
    for (name, w) in [("wte", wte), ("wpe", wpe)] {
        if w.shape.rank() != 2 || w.shape.last() != channels {
            return Err(Error::ShapeMismatch {
                op,
                arg: name,
                expected: Shape::new(&[w.shape.rows(), channels]),
                got: w.shape,
            });
        }
    }
    let context = wpe.shape.rows();
    if pos_offset.saturating_add(seq) > context {
        return Err(Error::invalid(
            op,
            format!(
                "positions {pos_offset}..{} exceed the context length {context} of `wpe`",
                pos_offset.saturating_add(seq)
            ),
        ));
    }
    Ok(EmbeddingDims {
        batch,
        seq,
        channels,
        vocab: wte.shape.rows(),
        context,
    })
}

/// [`crate::Backend::embedding`] (shapes only; the backend checks id values).
pub fn embedding<M: DeviceMemory, I: DeviceMemory>(
    ids: &View<'_, I>,
    wte: &View<'_, M>,
    wpe: &View<'_, M>,
    out: &View<'_, M>,
    pos_offset: usize,
) -> Result<EmbeddingDims> {
    const OP: &str = "embedding";
    let dims = embedding_dims(OP, ids, wte, wpe, out, "out", pos_offset)?;
    disjoint(
        OP,
        &[Region::of("out", out)],
        &[Region::of("wte", wte), Region::of("wpe", wpe)],
        false,
    )?;
    Ok(dims)
}

/// [`crate::Backend::embedding_backward`] (shapes only; the backend checks id values).
pub fn embedding_backward<M: DeviceMemory, I: DeviceMemory>(
    ids: &View<'_, I>,
    dout: &View<'_, M>,
    dwte: &View<'_, M>,
    dwpe: &View<'_, M>,
) -> Result<EmbeddingDims> {
    const OP: &str = "embedding_backward";
    let dims = embedding_dims(OP, ids, dwte, dwpe, dout, "dout", 0)?;
    disjoint(
        OP,
        &[Region::of("dwte", dwte), Region::of("dwpe", dwpe)],
        &[Region::of("dout", dout)],
        false,
    )?;
    Ok(dims)
}

/// Checks ids that a backend has in host-visible memory.
pub fn ids_values(op: &'static str, arg: &'static str, ids: &[u32], limit: usize) -> Result<()> {
    ids_in_range(op, arg, ids, limit)
}

/// Checks targets of a cross-entropy: each `< vocab` or [`crate::IGNORE_INDEX`].
pub fn target_values(op: &'static str, targets: &[u32], vocab: usize) -> Result<()> {
    match targets
        .iter()
        .position(|&t| t != crate::IGNORE_INDEX && t as usize >= vocab)
    {
        None => Ok(()),
        Some(index) => Err(Error::IndexOutOfRange {
            op,
            arg: "targets",
            index,
            value: targets[index],
            limit: vocab,
        }),
    }
}

/// [`crate::Backend::softmax_cross_entropy`]: returns `(N, Vp)`.
pub fn softmax_cross_entropy<M: DeviceMemory, I: DeviceMemory>(
    logits: &View<'_, M>,
    targets: &View<'_, I>,
    vocab: usize,
    losses: &View<'_, M>,
    dlogits: Option<&View<'_, M>>,
) -> Result<(usize, usize)> {
    const OP: &str = "softmax_cross_entropy";
    view(OP, "logits", logits)?;
    let (n, vp) = (logits.shape.rows(), logits.shape.last());
    if vocab == 0 || vocab > vp {
        return Err(Error::invalid(
            OP,
            format!("vocab must be in 1..={vp} (the logits' last dimension), got {vocab}"),
        ));
    }
    view(OP, "targets", targets)?;
    if targets.numel() != n {
        return Err(Error::SizeMismatch {
            op: OP,
            what: "row count",
            a: "targets",
            a_size: targets.numel(),
            b: "logits",
            b_size: n,
        });
    }
    numel(OP, "losses", losses, n)?;
    let mut outputs = vec![Region::of("losses", losses)];
    if let Some(d) = dlogits {
        same_shape(OP, "dlogits", d, logits)?;
        disjoint(
            OP,
            &[Region::of("dlogits", d)],
            &[Region::of("logits", logits)],
            true,
        )?;
        outputs.push(Region::of("dlogits", d));
    }
    disjoint(OP, &outputs, &[], false)?;
    disjoint(
        OP,
        &[Region::of("losses", losses)],
        &[Region::of("logits", logits)],
        false,
    )?;
    Ok((n, vp))
}

/// [`crate::Backend::adamw`].
pub fn adamw<M: DeviceMemory>(
    param: &View<'_, M>,
    grad: &View<'_, M>,
    m: &View<'_, M>,
    v: &View<'_, M>,
    step: &crate::AdamWStep,
) -> Result<()> {
    const OP: &str = "adamw";
    view(OP, "param", param)?;
    let n = param.numel();
    numel(OP, "grad", grad, n)?;
    numel(OP, "m", m, n)?;
    numel(OP, "v", v, n)?;
    if step.step == 0 {
        return Err(Error::invalid(
            OP,
            "step is 1-based (bias correction divides by 1 - β^step)",
        ));
    }
    for (name, b) in [("beta1", step.beta1), ("beta2", step.beta2)] {
        if !(0.0..1.0).contains(&b) {
            return Err(Error::invalid(
                OP,
                format!("{name} must be in [0, 1), got {b}"),
            ));
        }
    }
    if step.eps.is_nan()
        || step.eps <= 0.0
        || !step.lr.is_finite()
        || !step.weight_decay.is_finite()
    {
        return Err(Error::invalid(
            OP,
            format!(
                "need eps > 0 and finite lr and weight_decay, got eps {}, lr {}, weight_decay {}",
                step.eps, step.lr, step.weight_decay
            ),
        ));
    }
    disjoint(
        OP,
        &[
            Region::of("param", param),
            Region::of("m", m),
            Region::of("v", v),
        ],
        &[Region::of("grad", grad)],
        false,
    )
}

/// Sizes of a validated attention call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AttentionDims {
    pub batch: usize,
    pub heads: usize,
    pub head_dim: usize,
    pub q_len: usize,
    pub k_len: usize,
}

impl AttentionDims {
    /// As the workspace-sizing shape.
    pub fn shape(&self) -> crate::AttentionShape {
        crate::AttentionShape {
            batch: self.batch,
            heads: self.heads,
            q_len: self.q_len,
            k_len: self.k_len,
        }
    }
}

fn attention_dims<M: DeviceMemory>(
    op: &'static str,
    q: &Heads<'_, M>,
    k: &Heads<'_, M>,
    v: &Heads<'_, M>,
    pos_offset: usize,
) -> Result<AttentionDims> {
    heads(op, "q", q, false)?;
    heads(op, "k", k, false)?;
    heads(op, "v", v, false)?;
    for (name, h) in [("k", k), ("v", v)] {
        if h.batch != q.batch || h.heads != q.heads || h.head_dim != q.head_dim {
            return Err(Error::ShapeMismatch {
                op,
                arg: name,
                expected: Shape::new(&[q.batch, h.seq, q.heads, q.head_dim]),
                got: Shape::new(&[h.batch, h.seq, h.heads, h.head_dim]),
            });
        }
    }
    if v.seq != k.seq {
        return Err(Error::SizeMismatch {
            op,
            what: "key positions",
            a: "v",
            a_size: v.seq,
            b: "k",
            b_size: k.seq,
        });
    }
    if pos_offset.checked_add(q.seq) != Some(k.seq) {
        return Err(Error::invalid(
            op,
            format!(
                "queries at positions {pos_offset}..{} need exactly {} keys, k has {}",
                pos_offset.saturating_add(q.seq),
                pos_offset.saturating_add(q.seq),
                k.seq
            ),
        ));
    }
    Ok(AttentionDims {
        batch: q.batch,
        heads: q.heads,
        head_dim: q.head_dim,
        q_len: q.seq,
        k_len: k.seq,
    })
}

fn same_heads<M>(
    op: &'static str,
    arg: &'static str,
    h: &Heads<'_, M>,
    like: &Heads<'_, M>,
) -> Result<()> {
    let got = Shape::new(&[h.batch, h.seq, h.heads, h.head_dim]);
    let expected = Shape::new(&[like.batch, like.seq, like.heads, like.head_dim]);
    if got != expected {
        return Err(Error::ShapeMismatch {
            op,
            arg,
            expected,
            got,
        });
    }
    Ok(())
}

/// [`crate::Backend::attention_forward`]; `workspace_len` is what the backend asks for.
pub fn attention_forward<M: DeviceMemory>(
    q: &Heads<'_, M>,
    k: &Heads<'_, M>,
    v: &Heads<'_, M>,
    out: &Heads<'_, M>,
    workspace: &View<'_, M>,
    pos_offset: usize,
    workspace_len: impl FnOnce(crate::AttentionShape) -> usize,
) -> Result<AttentionDims> {
    const OP: &str = "attention_forward";
    let dims = attention_dims(OP, q, k, v, pos_offset)?;
    heads(OP, "out", out, true)?;
    same_heads(OP, "out", out, q)?;
    view(OP, "workspace", workspace)?;
    let need = workspace_len(dims.shape());
    if workspace.numel() < need {
        return Err(Error::SizeMismatch {
            op: OP,
            what: "workspace floats (at least)",
            a: "needed",
            a_size: need,
            b: "workspace",
            b_size: workspace.numel(),
        });
    }
    disjoint(
        OP,
        &[
            Region::of_heads("out", out),
            Region::of("workspace", workspace),
        ],
        &[
            Region::of_heads("q", q),
            Region::of_heads("k", k),
            Region::of_heads("v", v),
        ],
        false,
    )?;
    Ok(dims)
}

/// [`crate::Backend::attention_backward`].
pub fn attention_backward<M: DeviceMemory>(
    q: &Heads<'_, M>,
    k: &Heads<'_, M>,
    v: &Heads<'_, M>,
    out: &Heads<'_, M>,
    dout: &Heads<'_, M>,
    dq: &Heads<'_, M>,
    dk: &Heads<'_, M>,
    dv: &Heads<'_, M>,
    workspace: &View<'_, M>,
    scratch: &View<'_, M>,
    workspace_len: usize,
    scratch_len: usize,
) -> Result<AttentionDims> {
    const OP: &str = "attention_backward";
    let dims = attention_dims(OP, q, k, v, 0)?;
    heads(OP, "out", out, false)?;
    same_heads(OP, "out", out, q)?;
    heads(OP, "dout", dout, false)?;
    same_heads(OP, "dout", dout, q)?;
    for (name, g, like) in [("dq", dq, q), ("dk", dk, k), ("dv", dv, v)] {
        heads(OP, name, g, true)?;
        same_heads(OP, name, g, like)?;
    }
    for (name, t, need) in [
        ("workspace", workspace, workspace_len),
        ("scratch", scratch, scratch_len),
    ] {
        if need > 0 {
            view(OP, name, t)?;
        }
        if t.numel() < need {
            return Err(Error::SizeMismatch {
                op: OP,
                what: "floats (at least)",
                a: "needed",
                a_size: need,
                b: name,
                b_size: t.numel(),
            });
        }
    }
    let mut outputs = vec![
        Region::of_heads("dq", dq),
        Region::of_heads("dk", dk),
        Region::of_heads("dv", dv),
    ];
    // A backend that needs no scratch ignores the view it is given.
    if scratch_len > 0 {
        outputs.push(Region::of("scratch", scratch));
    }
    disjoint(
        OP,
        &outputs,
        &[
            Region::of_heads("q", q),
            Region::of_heads("k", k),
            Region::of_heads("v", v),
            Region::of_heads("out", out),
            Region::of_heads("dout", dout),
            Region::of("workspace", workspace),
        ],
        false,
    )?;
    Ok(dims)
}
