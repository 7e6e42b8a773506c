//! What a path names, and whether andrea may write over it or read from it.
//!
//! Outputs: a path a user names as an output is written only if it does not exist yet or
//! is a regular file (or, where a directory is expected, a directory). Anything else (a
//! FIFO, a character or block device, a socket, a directory where a file is expected) is
//! refused before any work starts and again right before the rename that would replace
//! it: `/dev/null` named as `--out` by a user running as root stays `/dev/null`.
//!
//! A symbolic link is judged by what it points to. A link to a regular file is accepted
//! and the *link* is replaced by the new file (as `mv` and every rename-based writer do);
//! the file it pointed to is left as it was, so nothing outside the named path changes.
//! A link to anything else, or to nothing, is refused: the user named something that is
//! not a plain file, and replacing the link would hide that.
//!
//! Inputs: [`open_regular`] opens a path only if it is a regular file (or a directory, for
//! [`check_input`]); a FIFO would block forever, `/dev/zero` never ends.

use std::fs::{File, FileType};
use std::io;
use std::path::Path;

/// A user-facing name for a file type: "a FIFO (named pipe)", "a character device", ...
pub fn kind_name(ft: FileType) -> &'static str {
    #[cfg(unix)]
    {
        use std::os::unix::fs::FileTypeExt;
        if ft.is_fifo() {
            return "a FIFO (named pipe)";
        }
        if ft.is_char_device() {
            return "a character device";
        }
        if ft.is_block_device() {
            return "a block device";
        }
        if ft.is_socket() {
            return "a socket";
        }
    }
    if ft.is_dir() {
        "a directory"
    } else if ft.is_symlink() {
        "a symbolic link"
    } else if ft.is_file() {
        "a regular file"
    } else {
        "not a regular file"
    }
}

/// An error of kind `InvalidInput` (a path of the wrong type) or `InvalidData` (a file
/// too large or not text). Like the standard library's errors its message does not name
/// the path: every caller adds it.
fn refused(kind: io::ErrorKind, what: String) -> io::Error {
    io::Error::new(kind, what)
}

/// `Ok` if `path` may be replaced by a new regular file: it does not exist, is a regular
/// file, or is a symbolic link to a regular file (see the module docs). Otherwise an
/// error saying what the path is.
pub fn check_output_file(path: &Path) -> io::Result<()> {
    let meta = match std::fs::symlink_metadata(path) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        other => other?,
    };
    let ft = meta.file_type();
    if ft.is_file() {
        return Ok(());
    }
    if ft.is_symlink() {
        return match std::fs::metadata(path) {
            Ok(target) if target.is_file() => Ok(()),
            Ok(target) => Err(refused(
                io::ErrorKind::InvalidInput,
                format!(
                    "a symbolic link to {}, not to a regular file: andrea writes only regular \
                     files; name a new file or a regular one",
                    kind_name(target.file_type())
                ),
            )),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Err(refused(
                io::ErrorKind::InvalidInput,
                "a symbolic link to a path that does not exist: remove the link or name \
                 another file"
                    .into(),
            )),
            Err(e) => Err(e),
        };
    }
    Err(refused(
        io::ErrorKind::InvalidInput,
        format!(
            "{}, not a regular file: andrea writes only regular files and never replaces \
             anything else; name a new file or a regular one",
            kind_name(ft)
        ),
    ))
}

/// `Ok` if `path` may be used as an output directory: it does not exist (it will be
/// created) or is a directory (or a link to one).
pub fn check_output_dir(path: &Path) -> io::Result<()> {
    match std::fs::metadata(path) {
        Ok(meta) if meta.is_dir() => Ok(()),
        Ok(meta) => Err(refused(
            io::ErrorKind::InvalidInput,
            format!(
                "{}, not a directory: name a new directory or an existing one",
                kind_name(meta.file_type())
            ),
        )),
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            if std::fs::symlink_metadata(path).is_ok() {
                return Err(refused(
                    io::ErrorKind::InvalidInput,
                    "a symbolic link to a path that does not exist: remove the link or name \
                     another directory"
                        .into(),
                ));
            }
            Ok(())
        }
        Err(e) => Err(e),
    }
}

/// `Ok` if `path` is a regular file or a directory (or a link to one): an input andrea
/// may open and read to its end.
pub fn check_input(path: &Path) -> io::Result<()> {
    let meta = std::fs::metadata(path)?;
    if meta.is_file() || meta.is_dir() {
        return Ok(());
    }
    Err(not_regular_input(meta.file_type()))
}

fn not_regular_input(ft: FileType) -> io::Error {
    refused(
        io::ErrorKind::InvalidInput,
        format!(
            "{}, not a regular file: andrea reads inputs from regular files only (a pipe \
             could block forever, a device never end); save the data to a file first",
            kind_name(ft)
        ),
    )
}

/// Opens `path` for reading if it is a regular file: the type is checked before the open
/// (a device is never opened) and again on the open file (the path cannot be swapped
/// between the two). The open does not block on a FIFO. Returns the file and its size.
pub fn open_regular(path: &Path) -> io::Result<(File, u64)> {
    let meta = std::fs::metadata(path)?;
    if !meta.is_file() {
        return Err(not_regular_input(meta.file_type()));
    }
    let mut options = std::fs::OpenOptions::new();
    options.read(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        options.custom_flags(libc::O_NONBLOCK);
    }
    let file = options.open(path)?;
    let meta = file.metadata()?;
    if !meta.is_file() {
        return Err(not_regular_input(meta.file_type()));
    }
    Ok((file, meta.len()))
}

/// Reads the whole of `path`, a regular file of at most `max_bytes` bytes ([`open_regular`]).
/// A larger file is refused before it is read; a file that reports a smaller size than
/// it holds (`/proc` files report 0) is read up to the bound and refused past it.
pub fn read_regular(path: &Path, max_bytes: u64) -> io::Result<Vec<u8>> {
    use std::io::Read;
    let (file, len) = open_regular(path)?;
    let too_large = |n: u64| {
        refused(
            io::ErrorKind::InvalidData,
            format!(
                "holds {n} bytes or more, more than the {max_bytes} this input can be: name the \
                 right file"
            ),
        )
    };
    if len > max_bytes {
        return Err(too_large(len));
    }
    let mut bytes = Vec::with_capacity(len as usize);
    file.take(max_bytes.saturating_add(1))
        .read_to_end(&mut bytes)?;
    if bytes.len() as u64 > max_bytes {
        return Err(too_large(bytes.len() as u64));
    }
    Ok(bytes)
}

/// [`read_regular`] as UTF-8 text.
pub fn read_regular_text(path: &Path, max_bytes: u64) -> io::Result<String> {
    String::from_utf8(read_regular(path, max_bytes)?).map_err(|e| {
        refused(
            io::ErrorKind::InvalidData,
            format!(
                "not UTF-8 text (invalid byte at offset {})",
                e.utf8_error().valid_up_to()
            ),
        )
    })
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    pub(crate) fn mkfifo(path: &Path) {
        let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: a valid NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0, "mkfifo");
    }

    /// A character device like `/dev/null` (1, 3) at `path`, in a test's own directory;
    /// `false` (with the reason printed) where this process may not make one.
    pub(crate) fn mknod_char(path: &Path) -> bool {
        let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: a valid NUL-terminated path.
        let made = unsafe { libc::mknod(c.as_ptr(), libc::S_IFCHR | 0o600, libc::makedev(1, 3)) };
        if made != 0 {
            eprintln!(
                "SKIPPED the character-device case: mknod {} failed ({}); needs root or CAP_MKNOD",
                path.display(),
                std::io::Error::last_os_error()
            );
        }
        made == 0
    }

    #[test]
    fn outputs_are_regular_files_or_new() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        assert!(check_output_file(&d.join("new")).is_ok());
        std::fs::write(d.join("file"), b"x").unwrap();
        assert!(check_output_file(&d.join("file")).is_ok());
        mkfifo(&d.join("fifo"));
        let err = check_output_file(&d.join("fifo")).unwrap_err().to_string();
        assert!(err.contains("FIFO"), "{err}");
        let err = check_output_file(d).unwrap_err().to_string();
        assert!(err.contains("a directory"), "{err}");
        std::os::unix::fs::symlink("file", d.join("to-file")).unwrap();
        assert!(check_output_file(&d.join("to-file")).is_ok());
        std::os::unix::fs::symlink("fifo", d.join("to-fifo")).unwrap();
        let err = check_output_file(&d.join("to-fifo"))
            .unwrap_err()
            .to_string();
        assert!(err.contains("symbolic link to a FIFO"), "{err}");
        std::os::unix::fs::symlink("nothing", d.join("dangling")).unwrap();
        assert!(check_output_file(&d.join("dangling")).is_err());
        assert!(check_output_dir(&d.join("new")).is_ok());
        assert!(check_output_dir(d).is_ok());
        assert!(check_output_dir(&d.join("fifo")).is_err());
        assert!(check_output_dir(&d.join("file")).is_err());
        if mknod_char(&d.join("null")) {
            let err = check_output_file(&d.join("null")).unwrap_err().to_string();
            assert!(err.contains("character device"), "{err}");
        }
    }

    #[test]
    fn inputs_are_regular_files_read_within_a_bound() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        mkfifo(&d.join("fifo"));
        // Refused at once: a FIFO without a writer would block an ordinary open forever.
        let err = read_regular(&d.join("fifo"), 10).unwrap_err().to_string();
        assert!(err.contains("FIFO"), "{err}");
        assert!(check_input(&d.join("fifo")).is_err());
        assert!(check_input(d).is_ok());
        if mknod_char(&d.join("null")) {
            let err = read_regular(&d.join("null"), 10).unwrap_err().to_string();
            assert!(err.contains("character device"), "{err}");
        }
        std::fs::write(d.join("f"), b"0123456789").unwrap();
        assert_eq!(read_regular(&d.join("f"), 10).unwrap(), b"0123456789");
        let err = read_regular(&d.join("f"), 9).unwrap_err().to_string();
        assert!(err.contains("more than the 9"), "{err}");
        // A regular file that reports size 0 but holds more: bounded by the read.
        let status = Path::new("/proc/self/status");
        if status.exists() {
            assert!(read_regular(status, 16).is_err());
            assert!(!read_regular(status, 1 << 20).unwrap().is_empty());
        }
    }
}
