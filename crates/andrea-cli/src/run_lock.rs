//! One process per run directory: `andrea train` holds the lock of `<out>/.lock`
//! ([`andrea_fs::LockFile`]: released by the kernel however the process ends, removed
//! when the run ends) for the whole run.
//!
//! Temporary names inside the run directory carry the pid and a per-process counter
//! ([`unique_suffix`]), so even processes that ignore the lock never write into each
//! other's files.

use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};

use andrea_fs::{LockError, LockFile};
use anyhow::{bail, Context, Result};

/// The lock file of a run directory.
pub const LOCK_FILE: &str = ".lock";

/// Held for the run's life; dropping it (or the process ending) releases the lock.
#[derive(Debug)]
pub struct RunLock {
    _lock: LockFile,
}

impl RunLock {
    /// Takes the lock of the run directory `out` (created if missing), or says which
    /// process holds it.
    pub fn acquire(out: &Path) -> Result<RunLock> {
        std::fs::create_dir_all(out)
            .with_context(|| format!("cannot create the run directory {}", out.display()))?;
        let path = out.join(LOCK_FILE);
        match LockFile::try_acquire(&path) {
            Ok(lock) => Ok(RunLock { _lock: lock }),
            Err(LockError::Held { holder }) => {
                let who = match holder {
                    Some(pid) => format!("process {pid}"),
                    None => "another process (starting up)".to_string(),
                };
                bail!(
                    "the run directory {} is in use by {who} (an `andrea train` holds {}): \
                     wait for it to finish or stop it (kill {}), or pass another --out",
                    out.display(),
                    path.display(),
                    holder.map_or("<pid>".to_string(), |pid| pid.to_string())
                );
            }
            Err(LockError::Io(e)) => Err(e).with_context(|| {
                format!(
                    "cannot lock the run directory {} (through {}): use a local file system, or another --out",
                    out.display(),
                    path.display()
                )
            }),
        }
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
