//! Argument validation shared by every backend.
//!
//! Each op of [`crate::Backend`] has a function here with the same name that checks
//! shapes, bounds and aliasing and returns the error a user should see. A backend calls
//! it first, so the inside of a kernel only ever sees valid arguments, and all backends
//! reject the same calls with the same messages.

use crate::error::{Error, Result};
use crate::tensor::{DeviceMemory, Heads, Matrix, Shape, View};

// ---- building blocks ----------------------------------------------------------------

/// Checks that `t` has no zero-sized dimension and lies inside its buffer.
pub fn view<M: DeviceMemory>(op: &'static str, arg: &'static str, t: &View<'_, M>) -> Result<()> {
    if t.shape.dims().contains(&0) {
        return Err(Error::ZeroSized {
            op,
            arg,
            shape: t.shape,
        });
    }
    let end = t.offset.saturating_add(t.numel());
    if end > t.buf.len() {
        return Err(Error::OutOfBounds {
            op,
            arg,
            start: t.offset,
            end,
            len: t.buf.len(),
        });
    }
    Ok(())
}

/// Checks that `t` is valid and has exactly `numel` elements (any rank).
pub fn numel<M: DeviceMemory>(
    op: &'static str,
    arg: &'static str,
    t: &View<'_, M>,
    numel: usize,
) -> Result<()> {
    view(op, arg, t)?;
    if t.numel() != numel {
        return Err(Error::ShapeMismatch {
            op,
            arg,
            expected: Shape::new(&[numel]),
            got: t.shape,
        });
    }
    Ok(())
}

/// Checks that `t` is valid and has the same shape as `like` (named `like_name`).
pub fn same_shape<M: DeviceMemory>(
    op: &'static str,
    arg: &'static str,
    t: &View<'_, M>,
    like: &View<'_, M>,
) -> Result<()> {
    view(op, arg, t)?;
    if t.shape.dims() != like.shape.dims() {
        return Err(Error::ShapeMismatch {
            op,
            arg,
            expected: like.shape,
            got: t.shape,
        });
    }
    Ok(())
}

fn span_end(offset: usize, dims: &[(usize, usize)]) -> Option<usize> {
    let mut last = offset;
    for &(stride, n) in dims {
        last = last.checked_add(stride.checked_mul(n.checked_sub(1)?)?)?;
    }
    last.checked_add(1)
}

/// Checks that every size of `m` is at least one and that it lies inside its buffer.
pub fn matrix<M: DeviceMemory>(
    op: &'static str,
    arg: &'static str,
    m: &Matrix<'_, M>,
) -> Result<()> {
    if m.batch == 0 || m.rows == 0 || m.cols == 0 {
        return Err(Error::ZeroSized {
            op,
            arg,
            shape: m.shape(),
        });
    }
    let end = span_end(
        m.offset,
        &[
            (m.batch_stride, m.batch),
            (m.row_stride, m.rows),
            (m.col_stride, m.cols),
        ],
    )
    .unwrap_or(usize::MAX);
    if end > m.buf.len() {
        return Err(Error::OutOfBounds {
            op,
            arg,
            start: m.offset,
            end,
            len: m.buf.len(),
        });
    }
    Ok(())
}

/// Checks that no two elements of a strided layout share an address: sorted by stride,
/// each stride must exceed the span of all smaller ones.
fn injective(
    op: &'static str,
    arg: &'static str,
    strides: [usize; 3],
    sizes: [usize; 3],
) -> Result<()> {
    let mut dims: Vec<(usize, usize)> = strides
        .iter()
        .zip(sizes)
        .filter(|&(_, n)| n > 1)
        .map(|(&s, n)| (s, n))
        .collect();
    dims.sort_unstable();
    let mut span = 0usize;
    for (s, n) in dims {
        if s <= span || (s == 0) {
            return Err(Error::SelfOverlap {
                op,
                arg,
                strides,
                sizes,
            });
        }
        span = span.saturating_add(s.saturating_mul(n - 1));
    }
    Ok(())
}

/// [`matrix`], plus: an output's elements must all have distinct addresses.
pub fn output_matrix<M: DeviceMemory>(
    op: &'static str,
    arg: &'static str,
    m: &Matrix<'_, M>,
) -> Result<()> {
    matrix(op, arg, m)?;
    injective(
        op,
        arg,
        [m.col_stride, m.row_stride, m.batch_stride],
        [m.cols, m.rows, m.batch],
    )
}

/// Checks that `h` has no zero size, lies inside its buffer, and (for an output)
/// has distinct addresses for all elements.
pub fn heads<M: DeviceMemory>(
    op: &'static str,
    arg: &'static str,
    h: &Heads<'_, M>,
    output: bool,
) -> Result<()> {
    let m = Matrix {
        buf: h.buf,
        offset: h.offset,
        batch: h.batch,
        rows: h.seq,
        cols: h.width(),
        batch_stride: h.batch_stride,
        row_stride: h.seq_stride,
        col_stride: 1,
    };
    if output {
        output_matrix(op, arg, &m)
    } else {
        matrix(op, arg, &m)
    }
}

/// The memory an argument touches, for overlap checks.
#[derive(Debug, Clone, Copy)]
pub struct Region {
    name: &'static str,
    buf: usize,
    start: usize,
    end: usize,
    /// Row structure `(row_stride, width, rows, batch_stride, batch)` when the region
    /// is `batch × rows` runs of `width` contiguous elements; lets interleaved views
    /// (the q, k and v thirds of one activation) be told apart.
    rows: Option<(usize, usize, usize, usize, usize)>,
}

impl Region {
    /// The contiguous range of a view.
    pub fn of<M>(name: &'static str, t: &View<'_, M>) -> Self {
        Region {
            name,
            buf: t.buf as *const M as usize,
            start: t.offset,
            end: t.offset + t.shape.numel(),
            rows: None,
        }
    }

    /// The extent of a matrix (with row structure when its columns are contiguous).
    pub fn of_matrix<M>(name: &'static str, m: &Matrix<'_, M>) -> Self {
        let e = m.extent();
        Region {
            name,
            buf: m.buf as *const M as usize,
            start: e.start,
            end: e.end,
            rows: (m.col_stride == 1).then_some((
                m.row_stride,
                m.cols,
                m.rows,
                m.batch_stride,
                m.batch,
            )),
        }
    }

    /// The extent of attention heads, with their row structure.
    pub fn of_heads<M>(name: &'static str, h: &Heads<'_, M>) -> Self {
        let e = h.extent();
        Region {
            name,
            buf: h.buf as *const M as usize,
            start: e.start,
            end: e.end,
            rows: Some((h.seq_stride, h.width(), h.seq, h.batch_stride, h.batch)),
        }
    }

    fn same_elements(&self, o: &Region) -> bool {
        self.buf == o.buf && self.start == o.start && self.end == o.end && self.rows == o.rows
    }

    fn overlaps(&self, o: &Region) -> bool {
        if self.buf != o.buf || self.end <= o.start || o.end <= self.start {
            return false;
        }
        // Interleaved row layouts with identical strides: compare the column windows.
        if let (Some(a), Some(b)) = (self.rows, o.rows) {
            let (rs, wa, rows, bs, batch) = a;
            if rs == b.0 && rows == b.2 && bs == b.3 && batch == b.4 {
                let rows_fit = batch == 1 || rows * rs <= bs;
                let (lo, wlo, hi, whi) = if self.start <= o.start {
                    (self.start, wa, o.start, b.1)
                } else {
                    (o.start, b.1, self.start, wa)
                };
                let d = hi - lo;
                if rows_fit && d < rs && wlo <= d && d + whi <= rs {
                    return false;
                }
            }
        }
        true
    }
}

/// Checks that no output overlaps another output or an input. With `in_place`, an
/// output may be *exactly* the same elements as an input.
pub fn disjoint(
    op: &'static str,
    outputs: &[Region],
    inputs: &[Region],
    in_place: bool,
) -> Result<()> {
    let err = |a: &Region, b: &Region| Error::Overlap {
        op,
        a: a.name,
        a_start: a.start,
        a_end: a.end,
        b: b.name,
        b_start: b.start,
        b_end: b.end,
    };
    for (i, o) in outputs.iter().enumerate() {
        for o2 in &outputs[i + 1..] {
            if o.overlaps(o2) {
                return Err(err(o, o2));
            }
        }
        for x in inputs {
            if o.overlaps(x) && !(in_place && o.same_elements(x)) {
                return Err(err(o, x));
            }
        }
    }
    Ok(())
}

fn ids_in_range(op: &'static str, arg: &'static str, ids: &[u32], limit: usize) -> Result<()> {
    match ids.iter().position(|&i| i as usize >= limit) {
        None => Ok(()),
        Some(index) => Err(Error::IndexOutOfRange {
            op,
            arg,
            index,
            value: ids[index],
            limit,
        }),
    }
}

/// Checks host-side token ids against a vocabulary size (for backends that cannot
/// report a bad id from inside a kernel, and for the model before an upload).
pub fn token_ids(op: &'static str, arg: &'static str, ids: &[u32], vocab: usize) -> Result<()> {
    ids_in_range(op, arg, ids, vocab)
}

// ---- one function per op ------------------------------------------------------------

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
