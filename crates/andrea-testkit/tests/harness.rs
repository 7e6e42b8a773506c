//! The macro accepts a constructor returning `Result<B, E>`, and skips (visibly) when the
//! error says there is no device; other constructor errors fail. The skips here are
//! simulated: they are checked as the values the harness returns ([`Skipped`]), not
//! printed, so that every `SKIPPED` line in a test run is a real skip.

use andrea_testkit::__private::{run_test, try_run_test, Probe, ViaResult as _};
use andrea_testkit::device::Skipped;
use andrea_testkit::naive::NaiveBackend;
use andrea_testkit::suite::{self, Config};
use proptest::test_runner::TestCaseError;

/// `Result<B, String>`: runs as usual.
mod result_ok {
    andrea_testkit::conformance_suite!(Ok::<_, String>(andrea_testkit::naive::NaiveBackend::new()));
}

/// A suite function that must not run (the backend is not there).
fn must_not_run(_: &NaiveBackend, _: &Config) -> Result<(), TestCaseError> {
    panic!("must not run")
}

/// No device: the test is skipped, with the constructor's error as the reason, and its
/// function is not run (as CUDA tests on a machine without a GPU, where
/// `conformance_suite!`'s tests then report the skip).
#[test]
fn a_no_device_error_skips() {
    let name = "a_no_device_error_skips";
    let skipped = try_run_test(
        name,
        || {
            Probe::new(Err::<NaiveBackend, _>(andrea_core::Error::NoDevice {
                kind: "test",
                hint: "this test checks the skip path".into(),
            }))
            .make_backend()
        },
        must_not_run,
    );
    let reason = "no test device found: this test checks the skip path";
    assert_eq!(skipped, Err(Skipped::new(name, reason)));
    assert_eq!(
        skipped.unwrap_err().to_string(),
        format!("SKIPPED {name} because {reason}")
    );
}

/// A backend that is there runs: the suite function's result is the test's.
#[test]
fn a_backend_runs_its_suite_function() {
    let ran = std::cell::Cell::new(false);
    let result = try_run_test(
        "a_backend_runs_its_suite_function",
        || Probe::new(Ok::<_, String>(NaiveBackend::new())).make_backend(),
        |be: &NaiveBackend, cfg: &Config| {
            ran.set(true);
            suite::memory(be, cfg)
        },
    );
    assert_eq!(result, Ok(()));
    assert!(ran.get());
}

#[test]
#[should_panic(expected = "could not create the backend")]
fn other_constructor_errors_fail() {
    run_test(
        "other_constructor_errors_fail",
        || Probe::new(Err::<NaiveBackend, _>("PTX failed to load")).make_backend(),
        suite::memory,
    );
}

#[test]
fn a_string_error_that_says_no_device_skips() {
    let err = Err::<NaiveBackend, _>("CUDA: no device found (cuInit returned 100)".to_string());
    let skipped = try_run_test(
        "a_string_error_that_says_no_device_skips",
        || Probe::new(err).make_backend(),
        must_not_run,
    );
    assert_eq!(
        skipped.map_err(|s| s.reason),
        Err("CUDA: no device found (cuInit returned 100)".to_string())
    );
}
