//! Starting a device backend in a test, or skipping visibly: the one place that decides
//! what a missing device means. Without a device a test prints
//! `SKIPPED <name> because <reason>` straight to stderr (libtest hides the `eprintln!`
//! of a passing test; `scripts/gpu-check.sh` counts these lines) and passes; with
//! `ANDREA_REQUIRE_DEVICE=1` (a GPU machine, where a skip would hide a failure) it fails.

use std::any::Any;
use std::fmt::Display;

/// The environment variable that turns a skip into a failure.
pub const REQUIRE_DEVICE: &str = "ANDREA_REQUIRE_DEVICE";

/// Whether [`REQUIRE_DEVICE`] is set (to anything but `0`).
pub fn device_required() -> bool {
    std::env::var_os(REQUIRE_DEVICE).is_some_and(|v| v != "0")
}

/// Reports that `name` did not run because of `reason`: a visible `SKIPPED` line, or a
/// panic when [`device_required`].
pub fn skip(name: &str, reason: impl Display) {
    if device_required() {
        panic!("{name}: {REQUIRE_DEVICE} is set, but {reason}");
    }
    Skipped::new(name, reason).print();
}

/// A test that found no device, not yet reported: the testkit's own tests check this
/// value, so that only real skips print `SKIPPED`.
#[derive(Debug, Clone, PartialEq, Eq)]
#[must_use = "a skip is reported (`Skipped::report`) or checked, never dropped"]
pub struct Skipped {
    pub name: String,
    pub reason: String,
}

impl Skipped {
    pub fn new(name: &str, reason: impl Display) -> Self {
        Skipped {
            name: name.to_string(),
            reason: reason.to_string(),
        }
    }

    /// [`skip`]: the `SKIPPED` line, or a panic when [`device_required`].
    pub fn report(self) {
        skip(&self.name, &self.reason)
    }

    /// The `SKIPPED` line alone, for a skip that is not a missing device (a test that
    /// needs the emulator, on a GPU): written straight to stderr, which libtest does not
    /// capture, so that it shows for a passing test too, and in one write, so that
    /// libtest's own output from other threads does not split it.
    pub fn print(&self) {
        use std::io::Write;
        let _ = std::io::stderr().write_all(format!("{self}\n").as_bytes());
    }
}

/// The line [`skip`] prints: `SKIPPED <name> because <reason>`.
impl Display for Skipped {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "SKIPPED {} because {}", self.name, self.reason)
    }
}

/// The backend `make` starts; `None` after [`skip`] when its error says there is no
/// device ([`says_no_device`]). Any other error panics: a backend that is there but
/// fails to start is a failure, not a skip.
pub fn start_or_skip<T, E: Display + 'static>(
    name: &str,
    make: impl FnOnce() -> Result<T, E>,
) -> Option<T> {
    start(name, make).map_err(Skipped::report).ok()
}

/// [`start_or_skip`] without the report: the backend, or the [`Skipped`] to report.
pub fn start<T, E: Display + 'static>(
    name: &str,
    make: impl FnOnce() -> Result<T, E>,
) -> Result<T, Skipped> {
    match make() {
        Ok(be) => Ok(be),
        Err(e) if says_no_device(&e) => Err(Skipped::new(name, e)),
        Err(e) => panic!("{name}: could not create the backend: {e}"),
    }
}

/// Whether a constructor error means "no device here" rather than a broken backend:
/// [`andrea_core::Error::NoDevice`], or a message containing "no device" or
/// "no ... device found".
pub fn says_no_device<E: Display + 'static>(e: &E) -> bool {
    if let Some(e) = (e as &dyn Any).downcast_ref::<andrea_core::Error>() {
        return matches!(e, andrea_core::Error::NoDevice { .. });
    }
    let msg = e.to_string().to_lowercase();
    msg.contains("no device") || (msg.contains("no ") && msg.contains("device found"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_no_device_errors_skip() {
        let no_device = andrea_core::Error::NoDevice {
            kind: "test",
            hint: "none here".into(),
        };
        assert!(says_no_device(&no_device));
        assert!(says_no_device(
            &"CUDA: no CUDA device found (cuInit returned 100)"
        ));
        assert!(!says_no_device(&"PTX failed to load"));
        let skipped = start("only_no_device_errors_skip", || Err::<(), _>(no_device)).unwrap_err();
        assert_eq!(
            skipped.to_string(),
            "SKIPPED only_no_device_errors_skip because no test device found: none here"
        );
        assert_eq!(start_or_skip("ok", || Ok::<_, String>(3)), Some(3));
    }

    #[test]
    #[should_panic(expected = "could not create the backend")]
    fn other_errors_fail() {
        start_or_skip("other_errors_fail", || Err::<(), _>("PTX failed to load"));
    }
}
