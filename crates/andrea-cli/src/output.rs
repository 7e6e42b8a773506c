//! The two streams every command writes, and what a closed pipe means for each.
//!
//! Rust ignores `SIGPIPE`, so writing to a pipe whose reader has gone (`andrea ... | head
//! -1`) is an `EPIPE` error, on which `println!` panics. Every line of the CLI goes through
//! here instead, and a closed pipe is the end of that stream, not a failure:
//!
//! * stdout holds what a command is run for (ids, text, a loss, a report): `outln!`
//!   returns [`Closed`] once its reader has gone, the command passes it up with `?` and
//!   stops, and `main` ends it quietly with status 0 ([`is_closed`]): the reader has what
//!   it wanted, and `set -o pipefail` scripts do not see a failure. Any other write error
//!   (a full disk under `> file`) stays an error.
//! * stderr holds notes, progress and errors: `errln!` drops a line it cannot write and
//!   the work goes on, so `andrea train 2>&1 | head` keeps training and checkpointing
//!   after `head` leaves; only its lines stop.

use std::fmt;
use std::io::{self, Write};

/// Stdout's reader has gone (`EPIPE`): the command's output is over.
#[derive(Debug)]
pub struct Closed;

impl fmt::Display for Closed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("the program reading the output closed the pipe")
    }
}

impl std::error::Error for Closed {}

/// Writes `args` to stdout and flushes, so a streamed piece of text shows at once.
pub fn write_out(args: fmt::Arguments<'_>) -> anyhow::Result<()> {
    let mut out = io::stdout().lock();
    out.write_fmt(args)
        .and_then(|()| out.flush())
        .map_err(|e| match e.kind() {
            io::ErrorKind::BrokenPipe => anyhow::Error::new(Closed),
            _ => anyhow::Error::new(e).context("cannot write to stdout"),
        })
}

/// Writes `args` to stderr; a line that cannot be written is dropped (there is nowhere
/// left to report it).
pub fn write_err(args: fmt::Arguments<'_>) {
    let _ = io::stderr().lock().write_fmt(args);
}

/// Whether `e` is (or was caused by) the end of stdout: the command stopped because
/// nobody reads its output any more.
pub fn is_closed(e: &anyhow::Error) -> bool {
    e.chain().any(|cause| cause.is::<Closed>())
}

/// `println!` to stdout, returning `anyhow::Result<()>`: `Err(Closed)` once the reader
/// has gone.
macro_rules! outln {
    () => {
        $crate::output::write_out(format_args!("\n"))
    };
    ($($arg:tt)*) => {
        $crate::output::write_out(format_args!("{}\n", format_args!($($arg)*)))
    };
}

/// `print!` to stdout (flushed), returning `anyhow::Result<()>` as `outln!` does.
macro_rules! out {
    ($($arg:tt)*) => {
        $crate::output::write_out(format_args!($($arg)*))
    };
}

/// `eprintln!` that never panics: a line stderr cannot take is dropped.
macro_rules! errln {
    ($($arg:tt)*) => {
        $crate::output::write_err(format_args!("{}\n", format_args!($($arg)*)))
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_end_of_stdout_is_found_under_context() {
        let e = anyhow::Error::new(Closed).context("printing the ids");
        assert!(is_closed(&e));
        let other = anyhow::Error::new(io::Error::from(io::ErrorKind::StorageFull));
        assert!(!is_closed(&other.context("printing the ids")));
    }
}
