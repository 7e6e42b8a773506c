//! Views into backend memory.
//!
//! Backend memory behaves like a device pointer: a `Tensor` ([`crate::Tensor`]) is a buffer, an offset and
//! a shape, and it is `Copy`. Ops read their inputs and write their outputs through such
//! views, so the model can keep parameters, gradients and activations in a few large
//! buffers (as llm.c does) and a training step allocates nothing.
//!
//! Because views are plain handles, the borrow checker cannot stop an op's output from
//! overlapping its input. Every op therefore checks at run time (see [`crate::check`])
//! that each view lies inside its buffer and that no output overlaps an input or another
//! output, except where an op documents that it works in place on *exactly* the same
//! view. Buffers are `Send` but not required to be `Sync`, so a buffer (and every view
//! into it) is used by one thread at a time.

use std::fmt;

/// Memory owned by a backend: a fixed-length array of elements.
pub trait DeviceMemory {
    /// Number of elements the buffer holds.
    fn len(&self) -> usize;

    /// Whether the buffer holds no elements.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// The dimensions of a tensor, row-major, at most [`Shape::MAX_RANK`] of them.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Shape {
    dims: [usize; Shape::MAX_RANK],
    rank: u8,
}

impl Shape {
    /// The largest rank a view may have.
    pub const MAX_RANK: usize = 4;

    /// A shape from its dimensions. Panics if `dims` has more than [`Shape::MAX_RANK`]
    /// entries: shapes are written in the model's code, never read from user input.
    pub fn new(dims: &[usize]) -> Self {
        assert!(
            dims.len() <= Self::MAX_RANK,
            "a shape has at most {} dimensions, got {dims:?}",
            Self::MAX_RANK
        );
        let mut d = [1; Self::MAX_RANK];
        d[..dims.len()].copy_from_slice(dims);
        Shape {
            dims: d,
            rank: dims.len() as u8,
        }
    }

    /// The dimensions.
    pub fn dims(&self) -> &[usize] {
        &self.dims[..self.rank as usize]
    }

    /// Number of dimensions.
    pub fn rank(&self) -> usize {
        self.rank as usize
    }

    /// Number of elements.
    pub fn numel(&self) -> usize {
        self.dims().iter().product()
    }

    /// The last dimension (1 for a scalar).
    pub fn last(&self) -> usize {
        self.dims().last().copied().unwrap_or(1)
    }

    /// The product of every dimension but the last: the number of rows when the tensor
    /// is seen as a matrix whose rows are its last dimension.
    pub fn rows(&self) -> usize {
        let d = self.dims();
        match d.len() {
            0 => 1,
            n => d[..n - 1].iter().product(),
        }
    }
}

impl From<&[usize]> for Shape {
    fn from(d: &[usize]) -> Self {
        Shape::new(d)
    }
}

impl<const N: usize> From<[usize; N]> for Shape {
    fn from(d: [usize; N]) -> Self {
        Shape::new(&d)
    }
}

impl fmt::Display for Shape {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "[")?;
        for (i, d) in self.dims().iter().enumerate() {
            if i > 0 {
                write!(f, ", ")?;
            }
            write!(f, "{d}")?;
        }
        write!(f, "]")
    }
}

impl fmt::Debug for Shape {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

/// A contiguous, row-major view of `shape` elements starting at `offset` in `buf`.
pub struct View<'a, M> {
    pub buf: &'a M,
    pub offset: usize,
    pub shape: Shape,
}

impl<M> Clone for View<'_, M> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<M> Copy for View<'_, M> {}

impl<M> fmt::Debug for View<'_, M> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "View {{ offset: {}, shape: {} }}",
            self.offset, self.shape
        )
    }
}

impl<'a, M: DeviceMemory> View<'a, M> {
    /// Whether two views are the very same elements (same buffer, offset and size):
    /// the in-place case some ops allow.
    pub fn same_as(&self, other: &Self) -> bool {
        std::ptr::eq(self.buf, other.buf)
            && self.offset == other.offset
            && self.numel() == other.numel()
    }

    /// A view of `shape` at `offset` in `buf` (checked by the op that uses it).
    pub fn new(buf: &'a M, offset: usize, shape: impl Into<Shape>) -> Self {
        View {
            buf,
            offset,
            shape: shape.into(),
        }
    }

    /// The whole buffer as a 1-D view.
    pub fn whole(buf: &'a M) -> Self {
        View::new(buf, 0, [buf.len()])
    }

    /// Number of elements.
    pub fn numel(&self) -> usize {
        self.shape.numel()
    }

    /// Element range `[offset, offset + numel)` in the buffer.
    pub fn range(&self) -> std::ops::Range<usize> {
        self.offset..self.offset + self.numel()
    }

    /// The same elements with another shape of the same size, or `None` if the sizes
    /// differ.
    pub fn reshape(&self, shape: impl Into<Shape>) -> Option<Self> {
        let shape = shape.into();
        (shape.numel() == self.numel()).then_some(View { shape, ..*self })
    }

    /// A sub-view: `shape` elements starting `start` elements into this view. Bounds are
    /// checked against the buffer by the op that uses it.
    pub fn slice(&self, start: usize, shape: impl Into<Shape>) -> Self {
        View::new(self.buf, self.offset + start, shape)
    }

    /// Row `i` (along the first dimension) of this view.
    pub fn index(&self, i: usize) -> Self {
        let d = self.shape.dims();
        let inner = Shape::new(&d[1.min(d.len())..]);
        View::new(self.buf, self.offset + i * inner.numel(), inner)
    }

    /// This tensor as a row-major matrix: rows are its last dimension.
    pub fn mat(&self) -> Matrix<'a, M> {
        let cols = self.shape.last();
        Matrix {
            buf: self.buf,
            offset: self.offset,
            batch: 1,
            rows: self.shape.rows(),
            cols,
            batch_stride: 0,
            row_stride: cols,
            col_stride: 1,
        }
    }
}

/// A (batch of) strided matrices: element `(b, i, j)` is at
/// `offset + b·batch_stride + i·row_stride + j·col_stride` in `buf`.
///
/// Transposes are expressed by swapping strides ([`Matrix::t`]), so a GEMM never needs a
/// transposed copy, and views of one attention head inside a packed `[B, T, 3·C]`
/// activation are matrices with `row_stride = 3·C`.
pub struct Matrix<'a, M> {
    pub buf: &'a M,
    pub offset: usize,
    pub batch: usize,
    pub rows: usize,
    pub cols: usize,
    pub batch_stride: usize,
    pub row_stride: usize,
    pub col_stride: usize,
}

impl<M> Clone for Matrix<'_, M> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<M> Copy for Matrix<'_, M> {}

impl<M> fmt::Debug for Matrix<'_, M> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "Matrix {{ offset: {}, {}x[{}x{}], strides ({}, {}, {}) }}",
            self.offset,
            self.batch,
            self.rows,
            self.cols,
            self.batch_stride,
            self.row_stride,
            self.col_stride
        )
    }
}

impl<M> Matrix<'_, M> {
    /// The transpose: rows and columns (and their strides) swapped.
    pub fn t(&self) -> Self {
        Matrix {
            rows: self.cols,
            cols: self.rows,
            row_stride: self.col_stride,
            col_stride: self.row_stride,
            ..*self
        }
    }

    /// The same matrices repeated `batch` times, `batch_stride` elements apart.
    pub fn batched(&self, batch: usize, batch_stride: usize) -> Self {
        Matrix {
            batch,
            batch_stride,
            ..*self
        }
    }

    /// `[batch, rows, cols]` as a shape, for messages.
    pub fn shape(&self) -> Shape {
        Shape::new(&[self.batch, self.rows, self.cols])
    }

    /// Offset of element `(b, i, j)`.
    #[inline]
    pub fn at(&self, b: usize, i: usize, j: usize) -> usize {
        self.offset + b * self.batch_stride + i * self.row_stride + j * self.col_stride
    }

    /// The element range the matrix spans, `[first, last + 1)`; empty when any size is 0.
    pub fn extent(&self) -> std::ops::Range<usize> {
        if self.batch == 0 || self.rows == 0 || self.cols == 0 {
            return self.offset..self.offset;
        }
        self.offset..self.at(self.batch - 1, self.rows - 1, self.cols - 1) + 1
    }

    /// Whether the matrix is stored row-major with no gaps between rows or batches.
    pub fn is_contiguous(&self) -> bool {
        self.col_stride == 1
            && self.row_stride == self.cols
            && (self.batch == 1 || self.batch_stride == self.rows * self.cols)
    }
}

/// The heads of a multi-head attention operand: element `(b, t, h, d)` is at
/// `offset + b·batch_stride + t·seq_stride + h·head_stride + d`.
///
/// In training, `q`, `k` and `v` are the three thirds of the fused QKV projection
/// `[B, T, 3·C]` ([`Heads::split_qkv`]), each position's heads side by side
/// (`head_stride == head_dim`); in generation, `k` and `v` are KV-cache views of a longer
/// sequence, laid out as the backend prefers ([`crate::AttentionOps::kv_heads_apart`]):
/// side by side, or each head's positions one after the other (`seq_stride == head_dim`,
/// `head_stride` the cache's length times that), so that the attention of one head reads
/// one contiguous run.
pub struct Heads<'a, M> {
    pub buf: &'a M,
    pub offset: usize,
    pub batch: usize,
    pub seq: usize,
    pub heads: usize,
    pub head_dim: usize,
    pub batch_stride: usize,
    pub seq_stride: usize,
    pub head_stride: usize,
}

impl<M> Clone for Heads<'_, M> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<M> Copy for Heads<'_, M> {}

impl<M> fmt::Debug for Heads<'_, M> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "Heads {{ offset: {}, [B {}, T {}, H {}, D {}], strides ({}, {}, {}) }}",
            self.offset,
            self.batch,
            self.seq,
            self.heads,
            self.head_dim,
            self.batch_stride,
            self.seq_stride,
            self.head_stride
        )
    }
}

impl<'a, M: DeviceMemory> Heads<'a, M> {
    /// Heads of a contiguous `[B, T, H·D]` tensor.
    pub fn from_tensor(t: View<'a, M>, heads: usize) -> Option<Self> {
        let d = t.shape.dims();
        if d.len() != 3 || heads == 0 || !d[2].is_multiple_of(heads) {
            return None;
        }
        Some(Heads {
            buf: t.buf,
            offset: t.offset,
            batch: d[0],
            seq: d[1],
            heads,
            head_dim: d[2] / heads,
            batch_stride: d[1] * d[2],
            seq_stride: d[2],
            head_stride: d[2] / heads,
        })
    }

    /// Splits the fused QKV activation `[B, T, 3·C]` into query, key and value heads.
    pub fn split_qkv(qkv: View<'a, M>, heads: usize) -> Option<[Self; 3]> {
        let d = qkv.shape.dims();
        if d.len() != 3 || heads == 0 || !d[2].is_multiple_of(3 * heads) {
            return None;
        }
        let c = d[2] / 3;
        let h = |i: usize| Heads {
            buf: qkv.buf,
            offset: qkv.offset + i * c,
            batch: d[0],
            seq: d[1],
            heads,
            head_dim: c / heads,
            batch_stride: d[1] * d[2],
            seq_stride: d[2],
            head_stride: c / heads,
        };
        Some([h(0), h(1), h(2)])
    }
}

impl<'a, M> Heads<'a, M> {
    /// Model width `H·D`.
    pub fn width(&self) -> usize {
        self.heads * self.head_dim
    }

    /// Whether each position's heads lie side by side (`head_stride == head_dim`): a
    /// position is then one run of [`Heads::width`] elements.
    pub fn side_by_side(&self) -> bool {
        self.head_stride == self.head_dim
    }

    /// The first `seq` positions only.
    pub fn prefix(&self, seq: usize) -> Self {
        Heads { seq, ..*self }
    }

    /// Head `h` of batch entry `b` as a `[seq, head_dim]` matrix.
    pub fn head(&self, b: usize, h: usize) -> Matrix<'a, M> {
        Matrix {
            buf: self.buf,
            offset: self.offset + b * self.batch_stride + h * self.head_stride,
            batch: 1,
            rows: self.seq,
            cols: self.head_dim,
            batch_stride: 0,
            row_stride: self.seq_stride,
            col_stride: 1,
        }
    }

    /// All heads of batch entry `b` as a batch of `heads` `[seq, head_dim]` matrices.
    pub fn heads_of(&self, b: usize) -> Matrix<'a, M> {
        self.head(b, 0).batched(self.heads, self.head_stride)
    }

    /// The element range the view spans.
    pub fn extent(&self) -> std::ops::Range<usize> {
        if self.batch == 0 || self.seq == 0 || self.heads == 0 || self.head_dim == 0 {
            return self.offset..self.offset;
        }
        let last = self.offset
            + (self.batch - 1) * self.batch_stride
            + (self.seq - 1) * self.seq_stride
            + (self.heads - 1) * self.head_stride
            + self.head_dim;
        self.offset..last
    }
}
