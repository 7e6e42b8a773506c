//! Argument validation shared by every backend.
//!
//! Each op of [`crate::Backend`] has a function here with the same name that checks
//! shapes, bounds and aliasing, returns the sizes the kernel needs as a struct with named
//! fields, or the error a user should see. A backend calls it first, so the inside of a
//! kernel only ever sees valid arguments, and all backends reject the same calls with the
//! same messages. The per-op checks live beside their trait (`crate::ops::<family>::check`)
//! and are re-exported here; this module holds the building blocks they share.

pub use crate::ops::attention::check::*;
pub use crate::ops::decode::check::*;
pub use crate::ops::elementwise::check::*;
pub use crate::ops::embedding::check::*;
pub use crate::ops::layernorm::check::*;
pub use crate::ops::linalg::check::*;
pub use crate::ops::loss::check::*;
pub use crate::ops::memory::check::*;
pub use crate::ops::optim::check::*;
pub use crate::ops::softmax::check::*;

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
    // At most three dimensions: sorted in place, no allocation (ops check on every call).
    let mut dims = [(0usize, 0usize); 3];
    let mut len = 0;
    for (&s, n) in strides.iter().zip(sizes) {
        if n > 1 {
            dims[len] = (s, n);
            len += 1;
        }
    }
    let dims = &mut dims[..len];
    dims.sort_unstable();
    let mut span = 0usize;
    for &mut (s, n) in dims {
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
    if h.side_by_side() {
        // Each position one run of H·D: a `[B, T, H·D]` matrix.
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
        return if output {
            output_matrix(op, arg, &m)
        } else {
            matrix(op, arg, &m)
        };
    }
    // Heads apart: per sequence, `heads` matrices `[T, D]` at `head_stride`.
    if [h.batch, h.seq, h.heads, h.head_dim].contains(&0) {
        return Err(Error::ZeroSized {
            op,
            arg,
            shape: Shape::new(&[h.batch, h.seq, h.heads, h.head_dim]),
        });
    }
    let dims = [
        (h.batch_stride, h.batch),
        (h.head_stride, h.heads),
        (h.seq_stride, h.seq),
        (1, h.head_dim),
    ];
    let end = span_end(h.offset, &dims).unwrap_or(usize::MAX);
    if end > h.buf.len() {
        return Err(Error::OutOfBounds {
            op,
            arg,
            start: h.offset,
            end,
            len: h.buf.len(),
        });
    }
    if output {
        // Distinct addresses: sorted by stride, each stride past the span of the smaller.
        let mut sorted = dims;
        sorted.sort_unstable();
        let mut span = 0usize;
        for (s, n) in sorted {
            if n > 1 && s <= span {
                return Err(Error::invalid(
                    op,
                    format!(
                        "{arg}: heads [B {}, T {}, H {}, D {}] at strides ({}, {}, {}) share \
                         elements; an output needs every element its own",
                        h.batch,
                        h.seq,
                        h.heads,
                        h.head_dim,
                        h.batch_stride,
                        h.seq_stride,
                        h.head_stride
                    ),
                ));
            }
            if n > 1 {
                span = span.saturating_add(s.saturating_mul(n - 1));
            }
        }
    }
    Ok(())
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
            // Side by side, each position is one run of H·D; otherwise the whole extent.
            rows: h.side_by_side().then_some((
                h.seq_stride,
                h.width(),
                h.seq,
                h.batch_stride,
                h.batch,
            )),
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

pub(crate) fn ids_in_range(
    op: &'static str,
    arg: &'static str,
    ids: &[u32],
    limit: usize,
) -> Result<()> {
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
    // One output: against each input in turn (what `disjoint` does with all of them at
    // once), without collecting them.
    let out_region = [Region::of(out.0, out.1)];
    for (n, x) in inputs {
        disjoint(op, &out_region, &[Region::of(n, x)], in_place)?;
    }
    Ok(())
}
