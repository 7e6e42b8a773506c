//! The model's errors: values with messages that name the value and the limit.

use std::path::PathBuf;

use andrea_core::{ConfigError, Shape};

/// The result type of the model crate.
pub type Result<T, E = ModelError> = std::result::Result<T, E>;

/// What went wrong in a model call.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    /// A backend op failed (bad arguments, out of memory, no device, a driver error).
    #[error(transparent)]
    Backend(#[from] andrea_core::Error),

    #[error(transparent)]
    Config(#[from] ConfigError),

    #[error("token id {value} at position {index} of `{arg}` is out of range: the vocabulary has {vocab} ids")]
    TokenOutOfRange {
        arg: &'static str,
        index: usize,
        value: u32,
        vocab: usize,
    },

    #[error("sequence of {len} tokens is longer than the model's context length {context}")]
    SequenceTooLong { len: usize, context: usize },

    /// A batch that does not fit the buffers sized when the trainer or cache was made.
    #[error("{what}: {message}")]
    BadBatch { what: &'static str, message: String },

    /// An operation called out of order (backward before forward, ...).
    #[error("{0}")]
    State(String),

    /// A NaN or infinite loss or gradient norm.
    #[error("step {step}: the {what} is {value} (not finite): lower the learning rate, enable gradient clipping, or check the data")]
    NonFinite {
        step: u64,
        what: &'static str,
        value: f64,
    },

    #[error("no parameter named `{0}`")]
    UnknownParam(String),

    #[error("`{name}`: got {got} values, the parameter has shape {shape} ({expected} values)")]
    ParamSize {
        name: String,
        shape: Shape,
        expected: usize,
        got: usize,
    },

    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },

    /// A malformed file (`config.json`, safetensors header, ...).
    #[error("{path}: {message}")]
    Format { path: PathBuf, message: String },

    #[error("{path}: missing tensor `{name}`")]
    MissingTensor { path: PathBuf, name: String },

    #[error("{path}: unexpected tensor `{name}` (not a parameter of this model)")]
    UnexpectedTensor { path: PathBuf, name: String },

    #[error("{path}: tensor `{name}` has shape {got:?}, the model expects {expected:?}")]
    TensorShape {
        path: PathBuf,
        name: String,
        expected: Vec<usize>,
        got: Vec<usize>,
    },

    /// A checkpoint for another model shape.
    #[error("{path}: the checkpoint has {key} = {got}, this model has {expected}")]
    ConfigMismatch {
        path: PathBuf,
        key: &'static str,
        expected: String,
        got: String,
    },
}

impl ModelError {
    pub(crate) fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        ModelError::Io {
            path: path.into(),
            source,
        }
    }

    pub(crate) fn format(path: impl Into<PathBuf>, message: impl Into<String>) -> Self {
        ModelError::Format {
            path: path.into(),
            message: message.into(),
        }
    }

    pub(crate) fn batch(what: &'static str, message: impl Into<String>) -> Self {
        ModelError::BadBatch {
            what,
            message: message.into(),
        }
    }
}
