//! Errors: every mistake a user can make is a value that says what and where.

use std::path::PathBuf;

/// What went wrong.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A file could not be opened, read or written.
    #[error("{}: {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },

    /// A text file is not UTF-8.
    #[error(
        "{}: invalid UTF-8 at byte offset {offset}: convert the file to UTF-8 (for example \
         `iconv -f latin1 -t utf-8`) or leave it out",
        path.display()
    )]
    InvalidUtf8 { path: PathBuf, offset: u64 },

    /// `decode` was given an id the vocabulary does not have.
    #[error("unknown token id {id}: the vocabulary has ids 0..{vocab_size}")]
    UnknownId { id: u32, vocab_size: usize },

    /// A tokenizer file (`tokenizer.json`, `vocab.json`, `merges.txt`) is malformed or
    /// asks for something andrea does not implement; `field` is where in the file.
    #[error("{}: {field}: {message}", source_name(path))]
    Format {
        path: Option<PathBuf>,
        field: String,
        message: String,
    },

    /// A token shard is malformed.
    #[error("{}: {message}", path.display())]
    Shard { path: PathBuf, message: String },

    /// An argument is out of range or inconsistent (empty input, too many merges, ...).
    #[error("{0}")]
    Invalid(String),
}

fn source_name(path: &Option<PathBuf>) -> String {
    match path {
        Some(p) => p.display().to_string(),
        None => "tokenizer JSON".to_string(),
    }
}

impl Error {
    pub(crate) fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        Error::Io {
            path: path.into(),
            source,
        }
    }

    pub(crate) fn format(field: impl Into<String>, message: impl Into<String>) -> Self {
        Error::Format {
            path: None,
            field: field.into(),
            message: message.into(),
        }
    }

    /// Attach the file a format error came from.
    pub(crate) fn in_file(self, file: impl Into<PathBuf>) -> Self {
        match self {
            Error::Format {
                path: None,
                field,
                message,
            } => Error::Format {
                path: Some(file.into()),
                field,
                message,
            },
            other => other,
        }
    }
}

/// `Result` with this crate's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;
