//! One writer at a time: an advisory lock (`flock` on Unix, `LockFileEx` on Windows,
//! through `std::fs::File::try_lock`) on a lock file, held while a process writes
//! something others must not write at the same time (a run directory, a shard set).
//!
//! The kernel releases the lock when the process ends, however it ends (`kill -9`
//! included), so a stale lock file never blocks the next writer: the lock, not the
//! file's existence, is what counts. The file holds the holder's pid, for the message a
//! second process prints.
//!
//! On Unix the file is removed when the lock is released normally, so nothing is left
//! next to the thing it guarded. Removing a lock file is racy unless done this way:
//!
//! * The holder unlinks the file *while it still holds the lock*, and only if the path
//!   still names the file it locked; the lock is released afterwards, when the file is
//!   closed.
//! * A process that wins the lock then checks that the path still names the file it
//!   locked (same device and inode). Between its `open` and its `try_lock` the previous
//!   holder may have unlinked that file and released it: a lock on a file no longer at
//!   the path guards nothing (a third process may already hold a new file under that
//!   name), so it lets go and starts again with whatever the path names now.
//!
//! So at any moment at most one process holds a lock on the file the path names, and
//! only that process may unlink it: two writers never both win. Where a file cannot be
//! unlinked while open (Windows) it is left in place, as a stale one is.

use std::fs::{File, OpenOptions, TryLockError};
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

/// A lock held until it is dropped (or the process ends); see the module docs.
#[derive(Debug)]
pub struct LockFile {
    file: File,
    path: PathBuf,
}

/// Why [`LockFile::try_acquire`] did not get the lock.
#[derive(Debug)]
pub enum LockError {
    /// Another process holds it: its pid, when the file names one that is running (a
    /// process that has just won the lock may not have written its pid yet).
    Held { holder: Option<u32> },
    /// The lock file could not be opened, locked or written.
    Io(io::Error),
}

impl From<io::Error> for LockError {
    fn from(e: io::Error) -> LockError {
        LockError::Io(e)
    }
}

impl LockFile {
    /// Takes the lock on `path` (creating the file), without waiting, and writes this
    /// process's pid into it.
    pub fn try_acquire(path: &Path) -> Result<LockFile, LockError> {
        let mut file = loop {
            let file = OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(false)
                .open(path)?;
            match attempt(path, file)? {
                Attempt::Won(file) => break file,
                Attempt::Held(holder) => return Err(LockError::Held { holder }),
                Attempt::Again => {}
            }
        };
        let pid = std::process::id().to_string();
        file.set_len(0)
            .and_then(|()| file.seek(SeekFrom::Start(0)))
            .and_then(|_| file.write_all(pid.as_bytes()))
            .and_then(|()| file.flush())?;
        Ok(LockFile {
            file,
            path: path.to_path_buf(),
        })
    }

    /// The lock file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for LockFile {
    fn drop(&mut self) {
        // Unlinked while still held, and only if it is still ours; the lock goes when
        // `file` closes, right after.
        if cfg!(unix) && names(&self.path, &self.file).unwrap_or(false) {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

/// What trying the lock of `file`, opened at `path`, came to.
#[derive(Debug)]
enum Attempt {
    Won(File),
    Held(Option<u32>),
    /// `file` is no longer the one at `path` (its holder unlinked it, then let go):
    /// open the path again.
    Again,
}

fn attempt(path: &Path, mut file: File) -> Result<Attempt, LockError> {
    Ok(match file.try_lock() {
        // Ours, if the path still names it (see the module docs).
        Ok(()) if names(path, &file)? => Attempt::Won(file),
        Ok(()) => Attempt::Again,
        Err(TryLockError::WouldBlock) if names(path, &file)? => Attempt::Held(holder(&mut file)),
        // A holder letting go of a file it has already unlinked.
        Err(TryLockError::WouldBlock) => Attempt::Again,
        Err(TryLockError::Error(e)) => return Err(LockError::Io(e)),
    })
}

/// Whether `path` names the file `file` has open (on Unix: the same device and inode;
/// elsewhere files are never unlinked while locked, so it always does).
fn names(path: &Path, file: &File) -> io::Result<bool> {
    #[cfg(unix)]
    {
        use std::os::unix::fs::MetadataExt;
        let at_path = match std::fs::metadata(path) {
            Ok(m) => m,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(false),
            Err(e) => return Err(e),
        };
        let open = file.metadata()?;
        Ok(at_path.dev() == open.dev() && at_path.ino() == open.ino())
    }
    #[cfg(not(unix))]
    {
        let _ = (path, file);
        Ok(true)
    }
}

/// The pid a lock file names, if that process is running (where `/proc` says).
fn holder(file: &mut File) -> Option<u32> {
    let mut text = String::new();
    file.read_to_string(&mut text).ok()?;
    let pid: u32 = text.trim().parse().ok()?;
    let proc_fs = Path::new("/proc/self").exists();
    if proc_fs && !Path::new("/proc").join(pid.to_string()).exists() {
        return None;
    }
    Some(pid)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_lock_is_refused_naming_the_holder_until_the_first_is_dropped() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join(".x.lock");
        let first = LockFile::try_acquire(&path).unwrap();
        assert_eq!(
            std::fs::read_to_string(&path).unwrap(),
            std::process::id().to_string()
        );
        match LockFile::try_acquire(&path) {
            Err(LockError::Held { holder }) => assert_eq!(holder, Some(std::process::id())),
            other => panic!("{other:?}"),
        }
        drop(first);
        #[cfg(unix)]
        assert!(!path.exists(), "released, the lock file is removed");
        let again = LockFile::try_acquire(&path).unwrap();
        assert!(path.exists());
        drop(again);
    }

    #[test]
    fn a_stale_lock_file_does_not_block() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join(".x.lock");
        std::fs::write(&path, "4000000000").unwrap(); // a killed holder's file
        let lock = LockFile::try_acquire(&path).unwrap();
        assert_eq!(lock.path(), path);
    }

    /// The race the module docs describe: a process opened the file before the holder
    /// unlinked and released it, and locks it after a third process made and locked a
    /// new file at the path. Its lock guards nothing: it must start again, and then
    /// find the lock held.
    #[cfg(unix)]
    #[test]
    fn a_lock_on_an_unlinked_file_is_not_the_lock() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join(".x.lock");
        let first = LockFile::try_acquire(&path).unwrap();
        let late = OpenOptions::new()
            .read(true)
            .write(true)
            .open(&path)
            .unwrap();
        drop(first); // unlinked, then released
        let second = LockFile::try_acquire(&path).unwrap(); // a new file at the path
        assert!(matches!(attempt(&path, late), Ok(Attempt::Again)));
        match LockFile::try_acquire(&path) {
            Err(LockError::Held { holder }) => assert_eq!(holder, Some(std::process::id())),
            other => panic!("{other:?}"),
        }
        drop(second);
    }

    /// Many threads taking and releasing one lock: never two holders at once.
    #[test]
    fn never_two_holders() {
        use std::sync::atomic::{AtomicUsize, Ordering};
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join(".x.lock");
        let inside = AtomicUsize::new(0);
        let wins = AtomicUsize::new(0);
        std::thread::scope(|s| {
            for _ in 0..8 {
                s.spawn(|| {
                    for _ in 0..300 {
                        if let Ok(lock) = LockFile::try_acquire(&path) {
                            assert_eq!(inside.fetch_add(1, Ordering::SeqCst), 0, "two holders");
                            wins.fetch_add(1, Ordering::Relaxed);
                            std::thread::yield_now();
                            inside.fetch_sub(1, Ordering::SeqCst);
                            drop(lock);
                        }
                    }
                });
            }
        });
        assert!(wins.load(Ordering::Relaxed) > 0);
    }
}
