//! # andrea-fs
//!
//! Every file andrea writes for later (checkpoints, `tokenizer.json`, token shards,
//! metrics, plots) is written the one way of this crate, so a crash or a full disk
//! leaves either the old file or the new one, never a half-written one:
//!
//! 1. write to a temporary file in the *same directory* (a rename is atomic only within
//!    one file system), named `.<name>.tmp-<pid>` so concurrent writers never share it;
//! 2. `fsync` the file (its bytes are on disk before its name is);
//! 3. rename it over the destination;
//! 4. `fsync` the directory (the rename itself is on disk; best effort where a platform
//!    cannot sync a directory).
//!
//! On an error the temporary file is removed and the destination is untouched. Errors
//! are `std::io::Error`s; callers add the path to their own error type.
//!
//! The destination must not exist or be a regular file ([`check_output_file`], checked
//! before the temporary file is made and again right before the rename): a FIFO, a
//! device or a directory under the destination's name is never replaced. The inputs'
//! side, [`read_regular`], reads only regular files and only up to a bound. One writer at
//! a time: [`LockFile`].
//!
//! ```
//! let dir = tempfile::tempdir()?;
//! let path = dir.path().join("state.json");
//! andrea_fs::write_atomic(&path, b"{\"step\": 1}")?;
//! assert_eq!(std::fs::read(&path)?, b"{\"step\": 1}");
//! # Ok::<(), std::io::Error>(())
//! ```

mod kind;
mod lock;

use std::fs::File;
use std::io::{self, Write};
use std::path::{Path, PathBuf};

pub use kind::{
    check_input, check_output_dir, check_output_file, kind_name, open_regular, read_regular,
    read_regular_text,
};
pub use lock::{LockError, LockFile};

/// Writes `bytes` to `path` atomically and durably (see the crate docs).
pub fn write_atomic(path: &Path, bytes: &[u8]) -> io::Result<()> {
    check_output_file(path)?;
    let tmp = temp_path(path)?;
    let result = File::create(&tmp).and_then(|mut f| {
        f.write_all(bytes)?;
        Ok(f)
    });
    match result {
        Ok(file) => persist(file, &tmp, path),
        Err(e) => {
            let _ = std::fs::remove_file(&tmp);
            Err(e)
        }
    }
}

/// The temporary path [`write_atomic`] uses for `path`: `.<name>.tmp-<pid>` in the same
/// directory. For files written in pieces: create it, write, then [`persist`].
pub fn temp_path(path: &Path) -> io::Result<PathBuf> {
    let name = path.file_name().ok_or_else(|| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{} is not a file path", path.display()),
        )
    })?;
    let tmp = format!(".{}.tmp-{}", name.to_string_lossy(), std::process::id());
    Ok(parent(path).join(tmp))
}

/// Steps 2-4 for a file written at `tmp` (from [`temp_path`]): fsync `file`, rename
/// `tmp` to `path`, fsync the directory. Removes `tmp` on an error. Refuses, right
/// before the rename, a `path` that is neither absent nor a regular file
/// ([`check_output_file`]).
pub fn persist(file: File, tmp: &Path, path: &Path) -> io::Result<()> {
    let result = file.sync_all().and_then(|()| {
        drop(file);
        check_output_file(path)?;
        std::fs::rename(tmp, path)
    });
    if let Err(e) = result {
        let _ = std::fs::remove_file(tmp);
        return Err(e);
    }
    sync_dir(parent(path));
    Ok(())
}

/// Renames `from` to `to` (a directory or a link built in the same directory) and syncs
/// the directory, so the rename survives a crash.
pub fn rename_durable(from: &Path, to: &Path) -> io::Result<()> {
    std::fs::rename(from, to)?;
    sync_dir(parent(to));
    Ok(())
}

/// `fsync` of a directory, best effort (not every platform can open one).
pub fn sync_dir(dir: &Path) {
    if let Ok(d) = File::open(dir) {
        let _ = d.sync_all();
    }
}

/// The directory holding `path` (`.` for a bare name).
fn parent(path: &Path) -> &Path {
    match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replaces_the_file_and_leaves_no_temporary() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a.json");
        write_atomic(&path, b"old").unwrap();
        write_atomic(&path, b"new").unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"new");
        let names: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, ["a.json"]);
    }

    #[test]
    fn a_failed_write_keeps_the_old_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a.json");
        write_atomic(&path, b"old").unwrap();
        // The destination is a non-empty directory: the rename fails.
        let blocked = dir.path().join("d");
        std::fs::create_dir(&blocked).unwrap();
        std::fs::write(blocked.join("x"), b"x").unwrap();
        assert!(write_atomic(&blocked, b"new").is_err());
        assert!(!temp_path(&blocked).unwrap().exists());
        assert_eq!(std::fs::read(&path).unwrap(), b"old");
        assert!(write_atomic(Path::new("/"), b"x").is_err());
    }

    #[test]
    fn never_replaces_a_fifo_or_a_device() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("fifo");
        kind::tests::mkfifo(&fifo);
        let err = write_atomic(&fifo, b"new").unwrap_err().to_string();
        assert!(err.contains("FIFO"), "{err}");
        assert!(is_fifo(&fifo));
        // Made a FIFO between the first check and the rename: still refused.
        let late = dir.path().join("late");
        let tmp = temp_path(&late).unwrap();
        let file = File::create(&tmp).unwrap();
        kind::tests::mkfifo(&late);
        assert!(persist(file, &tmp, &late).is_err());
        assert!(is_fifo(&late) && !tmp.exists());
        let null = dir.path().join("null");
        if kind::tests::mknod_char(&null) {
            assert!(write_atomic(&null, b"new").is_err());
            use std::os::unix::fs::FileTypeExt;
            let ft = std::fs::symlink_metadata(&null).unwrap().file_type();
            assert!(ft.is_char_device());
        }
        // A link to a regular file: the link is replaced, its target left as it was.
        std::fs::write(dir.path().join("target"), b"old").unwrap();
        let link = dir.path().join("link");
        std::os::unix::fs::symlink("target", &link).unwrap();
        write_atomic(&link, b"new").unwrap();
        assert_eq!(std::fs::read(dir.path().join("target")).unwrap(), b"old");
        assert_eq!(std::fs::read(&link).unwrap(), b"new");
        assert!(std::fs::symlink_metadata(&link).unwrap().is_file());
    }

    fn is_fifo(p: &Path) -> bool {
        use std::os::unix::fs::FileTypeExt;
        std::fs::symlink_metadata(p).unwrap().file_type().is_fifo()
    }
}
