//! The macro accepts a constructor returning `Result<B, E>`, and skips (visibly) when the
//! error says there is no device; other constructor errors fail.

use andrea_testkit::naive::NaiveBackend;

/// `Result<B, String>`: runs as usual.
mod result_ok {
    andrea_testkit::conformance_suite!(Ok::<_, String>(andrea_testkit::naive::NaiveBackend::new()));
}

/// No device: every test prints `SKIPPED <name> because <reason>` and passes (as CUDA tests do
/// on a machine without a GPU).
mod no_device {
    andrea_testkit::conformance_suite!(Err::<andrea_testkit::naive::NaiveBackend, _>(
        andrea_core::Error::NoDevice {
            kind: "test",
            hint: "this module checks the skip path".into(),
        }
    ));
}

#[test]
#[should_panic(expected = "could not create the backend")]
fn other_constructor_errors_fail() {
    andrea_testkit::__private::run_test(
        "other_constructor_errors_fail",
        || {
            use andrea_testkit::__private::ViaResult as _;
            andrea_testkit::__private::Probe::new(Err::<NaiveBackend, _>("PTX failed to load"))
                .make_backend()
        },
        andrea_testkit::suite::memory,
    );
}

#[test]
fn a_string_error_that_says_no_device_skips() {
    andrea_testkit::__private::run_test(
        "a_string_error_that_says_no_device_skips",
        || {
            use andrea_testkit::__private::ViaResult as _;
            let err =
                Err::<NaiveBackend, _>("CUDA: no device found (cuInit returned 100)".to_string());
            andrea_testkit::__private::Probe::new(err).make_backend()
        },
        |_: &NaiveBackend,
         _: &andrea_testkit::suite::Config|
         -> Result<(), proptest::test_runner::TestCaseError> { panic!("must not run") },
    );
}
