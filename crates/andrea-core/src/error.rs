//! Errors are values: every op validates its arguments and returns an [`Error`] that
//! names the op, the argument and the sizes involved, so a caller can fix the call
//! without reading the backend's source.

use crate::tensor::Shape;

/// The result type of every backend operation.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// What went wrong in a backend call.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum Error {
    /// An argument has the wrong shape.
    #[error("{op}: argument `{arg}` has shape {got}, expected {expected}")]
    ShapeMismatch {
        op: &'static str,
        arg: &'static str,
        expected: Shape,
        got: Shape,
    },

    /// Two arguments disagree on a dimension they must share.
    #[error("{op}: {what}: `{a}` has {a_size} but `{b}` has {b_size}")]
    SizeMismatch {
        op: &'static str,
        what: &'static str,
        a: &'static str,
        a_size: usize,
        b: &'static str,
        b_size: usize,
    },

    /// A dimension that must be at least one is zero.
    #[error("{op}: argument `{arg}` has a zero-sized dimension (shape {shape}); every dimension must be >= 1")]
    ZeroSized {
        op: &'static str,
        arg: &'static str,
        shape: Shape,
    },

    /// A view reaches past the end of its buffer.
    #[error("{op}: argument `{arg}` needs elements [{start}, {end}) but its buffer holds {len}")]
    OutOfBounds {
        op: &'static str,
        arg: &'static str,
        start: usize,
        end: usize,
        len: usize,
    },

    /// An output overlaps an input or another output of the same op.
    #[error("{op}: output `{a}` overlaps `{b}` in the same buffer ([{a_start}, {a_end}) and [{b_start}, {b_end})); give each output its own memory")]
    Overlap {
        op: &'static str,
        a: &'static str,
        a_start: usize,
        a_end: usize,
        b: &'static str,
        b_start: usize,
        b_end: usize,
    },

    /// A strided output whose layout maps two elements to the same address.
    #[error("{op}: output `{arg}` has a self-overlapping layout (strides {strides:?} for sizes {sizes:?})")]
    SelfOverlap {
        op: &'static str,
        arg: &'static str,
        strides: [usize; 3],
        sizes: [usize; 3],
    },

    /// A token id is outside the vocabulary (or a position outside the context).
    #[error("{op}: `{arg}`[{index}] = {value} is out of range (must be < {limit})")]
    IndexOutOfRange {
        op: &'static str,
        arg: &'static str,
        index: usize,
        value: u32,
        limit: usize,
    },

    /// Any other invalid argument: the message says which and why.
    #[error("{op}: {message}")]
    InvalidArgument { op: &'static str, message: String },

    /// The device ran out of memory.
    #[error("out of device memory allocating {bytes} bytes on {device}: reduce the batch size or sequence length")]
    OutOfMemory { device: String, bytes: usize },

    /// No device of the requested kind is present.
    #[error("no {kind} device found: {hint}")]
    NoDevice { kind: &'static str, hint: String },

    /// A failure reported by the device runtime (a driver call, a kernel launch).
    #[error("{context}: {message}")]
    Device { context: String, message: String },
}

impl Error {
    /// Shorthand for [`Error::InvalidArgument`].
    pub fn invalid(op: &'static str, message: impl Into<String>) -> Self {
        Error::InvalidArgument {
            op,
            message: message.into(),
        }
    }
}
