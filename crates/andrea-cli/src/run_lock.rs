//! One process per run directory: `andrea train` holds an advisory lock (`flock` on
//! Unix, `LockFileEx` on Windows, through `std::fs::File::try_lock`) on `<out>/.lock`
//! for the whole run. The kernel releases it when the process ends, however it ends
//! (`kill -9` included), so a stale lock cannot block the next run. The file holds
//! the holder's pid for the message a second process prints; the lock, not the file's
//! existence, is what counts.
//!
//! Temporary names inside the run directory carry the pid and a per-process counter
//! ([`unique_suffix`]), so even processes that ignore the lock never write into each
//! other's files.

use std::fs::{File, OpenOptions, TryLockError};
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};

use anyhow::{bail, Context, Result};

/// The lock file of a run directory.
pub const LOCK_FILE: &str = ".lock";

/// Held for the run's life; dropping it (or the process ending) releases the lock.
#[derive(Debug)]
pub struct RunLock {
    _file: File,
}

impl RunLock {
    /// Takes the lock of the run directory `out` (created if missing), or says which
    /// process holds it.
    pub fn acquire(out: &Path) -> Result<RunLock> {
        std::fs::create_dir_all(out)
            .with_context(|| format!("cannot create the run directory {}", out.display()))?;
        let path = out.join(LOCK_FILE);
        let mut file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
            .with_context(|| format!("cannot open the run lock {}", path.display()))?;
        match file.try_lock() {
            Ok(()) => {}
            Err(TryLockError::WouldBlock) => {
                let mut holder = String::new();
                let _ = file.read_to_string(&mut holder);
                let mut holder = holder.trim();
                // The lock is taken before the pid is written: a process that just won
                // it leaves the previous holder's pid for a moment. A pid that is not
                // running is not named (Linux: no /proc/<pid>).
                let proc_fs = Path::new("/proc/self").exists();
                if proc_fs && !holder.is_empty() && !Path::new("/proc").join(holder).exists() {
                    holder = "";
                }
                let who = if holder.is_empty() {
                    "another process (starting up)".to_string()
                } else {
                    format!("process {holder}")
                };
                bail!(
                    "the run directory {} is in use by {who} (an `andrea train` holds {}): \
                     wait for it to finish or stop it (kill {}), or pass another --out",
                    out.display(),
                    path.display(),
                    if holder.is_empty() { "<pid>" } else { holder }
                );
            }
            Err(TryLockError::Error(e)) => {
                return Err(e).with_context(|| {
                    format!(
                        "cannot lock the run directory {} (through {}): use a local file system, or another --out",
                        out.display(),
                        path.display()
                    )
                })
            }
        }
        // Ours now: record the pid for the message of a second process.
        let pid = std::process::id().to_string();
        file.set_len(0)
            .and_then(|()| file.seek(SeekFrom::Start(0)))
            .and_then(|_| file.write_all(pid.as_bytes()))
            .and_then(|()| file.flush())
            .with_context(|| format!("cannot write the run lock {}", path.display()))?;
        Ok(RunLock { _file: file })
    }
}

/// `<pid>-<n>`, different for every call in this process and from every other live
/// process: the suffix of temporary names in a run directory.
pub fn unique_suffix() -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    format!(
        "{}-{}",
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::Relaxed)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_lock_is_refused_until_the_first_is_dropped() {
        let tmp = tempfile::tempdir().unwrap();
        let first = RunLock::acquire(tmp.path()).unwrap();
        let err = RunLock::acquire(tmp.path()).unwrap_err().to_string();
        assert!(err.contains(&std::process::id().to_string()), "{err}");
        assert!(err.contains("--out"), "{err}");
        drop(first);
        RunLock::acquire(tmp.path()).unwrap();
    }

    #[test]
    fn suffixes_differ() {
        assert_ne!(unique_suffix(), unique_suffix());
    }
}
