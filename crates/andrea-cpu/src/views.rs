//! Checked views as plain data: a pointer and its strides, `Copy` and `Sync`, so that
//! an op's tasks on any thread can address the memory its check proved in bounds (the
//! buffer references of `andrea_core`'s views are not `Sync`). Creating one reads no
//! memory; every dereference is an `unsafe` promise of the caller that the element lies
//! inside the checked view and that no other task touches it meanwhile.

use andrea_core::{Heads, View};

use crate::buffer::{CpuBuffer, SendPtr};

/// A strided operand: pointer to element (0, 0) and (row, column) strides.
#[derive(Clone, Copy)]
pub(crate) struct Operand {
    pub ptr: SendPtr,
    pub rs: usize,
    pub cs: usize,
}

/// A checked row of backend memory (`len` floats) as a raw pointer. Slices of it are
/// made inside a task and dropped at its end: which task may read or write it is the
/// order of the tasks' stages (a view one step writes may be one an earlier step read,
/// as the model's shared LayerNorm output is), never a borrow held across the job.
#[derive(Clone, Copy)]
pub(crate) struct Row {
    ptr: SendPtr,
    pub(crate) len: usize,
}

impl Row {
    /// The elements of a checked view.
    pub(crate) fn of(v: &View<'_, CpuBuffer>) -> Self {
        Row {
            // SAFETY: the view lies inside its buffer (checked by the op).
            ptr: SendPtr(unsafe { v.buf.ptr().add(v.offset) }),
            len: v.numel(),
        }
    }

    pub(crate) fn same_as(self, other: Row) -> bool {
        std::ptr::eq(self.ptr.get(), other.ptr.get()) && self.len == other.len
    }

    /// # Safety
    /// Nothing may write these elements while the slice lives.
    pub(crate) unsafe fn read<'s>(self) -> &'s [f32] {
        // SAFETY: in bounds (checked view); no writer by the caller's contract.
        unsafe { std::slice::from_raw_parts(self.ptr.get(), self.len) }
    }

    /// # Safety
    /// Nothing else may read or write these elements while the slice lives.
    #[allow(clippy::mut_from_ref)]
    pub(crate) unsafe fn write<'s>(self) -> &'s mut [f32] {
        // SAFETY: in bounds (checked view); exclusive by the caller's contract.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.get(), self.len) }
    }
}

/// A heads view as plain data: base pointer and strides (the buffer reference is not
/// `Sync`, this is).
#[derive(Clone, Copy)]
pub(crate) struct HeadsPtr {
    pub(crate) ptr: SendPtr,
    pub(crate) batch_stride: usize,
    pub(crate) seq_stride: usize,
    pub(crate) head_stride: usize,
    pub(crate) head_dim: usize,
}

impl HeadsPtr {
    pub(crate) fn of(h: &Heads<'_, CpuBuffer>) -> Self {
        HeadsPtr {
            // SAFETY: the view's offset is inside its buffer (checked).
            ptr: SendPtr(unsafe { h.buf.ptr().add(h.offset) }),
            batch_stride: h.batch_stride,
            seq_stride: h.seq_stride,
            head_stride: h.head_stride,
            head_dim: h.head_dim,
        }
    }
}

impl HeadsPtr {
    pub(crate) fn head_dim(&self) -> usize {
        self.head_dim
    }

    /// Where each position's heads start, from position 0's head 0.
    pub(crate) fn strides(&self) -> Strides {
        Strides {
            pos: self.seq_stride,
            head: self.head_stride,
        }
    }

    /// Whether each position's heads lie side by side (`Heads::side_by_side`).
    pub(crate) fn side_by_side(&self) -> bool {
        self.head_stride == self.head_dim
    }

    /// Rows `0..rows` of heads `h0..h1` of batch entry `b`, as one slice from row 0's
    /// head `h0` to the end of the last row's head `h1 - 1` (row `r`'s head `h` at
    /// `r·seq_stride + (h - h0)·head_stride` in it: [`HeadsPtr::strides`]).
    ///
    /// # Safety
    /// The rows and heads must lie inside the checked view, and nothing may write them
    /// while the slice lives.
    pub(crate) unsafe fn rows<'a>(
        &self,
        b: usize,
        rows: usize,
        (h0, h1): (usize, usize),
    ) -> &'a [f32] {
        let o = head(*self, b, h0);
        let len =
            (rows.max(1) - 1) * self.seq_stride + (h1 - h0 - 1) * self.head_stride + self.head_dim;
        // SAFETY: inside the checked view (the caller's promise).
        unsafe { std::slice::from_raw_parts(o.ptr.get(), len) }
    }

    /// Element 0 of head `h` of row `r` of batch entry `b` (not dereferenced here).
    pub(crate) fn at(&self, b: usize, r: usize, h: usize) -> *mut f32 {
        self.ptr
            .get()
            .wrapping_add(b * self.batch_stride + r * self.seq_stride + h * self.head_stride)
    }

    /// Row 0 of heads `h0..h1` of batch entry `b`, to write.
    ///
    /// # Safety
    /// Inside the checked view, whose heads lie side by side, and no other reference to
    /// it while the slice lives.
    pub(crate) unsafe fn row_mut<'a>(&self, b: usize, (h0, h1): (usize, usize)) -> &'a mut [f32] {
        debug_assert!(self.side_by_side());
        let o = head(*self, b, h0);
        // SAFETY: inside the checked view, exclusive (the caller's promise).
        unsafe { std::slice::from_raw_parts_mut(o.ptr.get(), (h1 - h0) * self.head_dim) }
    }
}

/// Operand for head `hh` of batch entry `b`: `[seq, D]` with row stride `seq_stride`.
pub(crate) fn head(h: HeadsPtr, b: usize, hh: usize) -> Operand {
    // SAFETY: (b, hh) are inside the view, which the op's check put inside its buffer.
    let ptr = unsafe { h.ptr.add(b * h.batch_stride + hh * h.head_stride) };
    Operand {
        ptr,
        rs: h.seq_stride,
        cs: 1,
    }
}

/// Where position `j`'s head `h` starts in a slice of cached keys or values:
/// `j·pos + h·head` (`head` is the head size where a position's heads lie side by side).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Strides {
    pub pos: usize,
    pub head: usize,
}

impl Strides {
    /// Floats from the first element of position 0's head 0 to the end of position
    /// `n - 1`'s head `heads - 1` (`n`, `heads` at least 1).
    #[cfg(any(test, target_arch = "x86_64", target_arch = "aarch64"))]
    pub(crate) fn span(self, n: usize, heads: usize, d: usize) -> usize {
        (n - 1) * self.pos + (heads - 1) * self.head + d
    }
}
