//! What [`crate::conformance_suite!`] expands to: making the backend (or deciding to
//! skip), then running one suite function and turning its error into a test failure.

use std::cell::Cell;
use std::fmt::Display;

use andrea_core::Backend;
use proptest::test_runner::TestCaseError;

use crate::device::{says_no_device, Skipped};
use crate::suite::Config;

/// Why a backend is not there to test.
#[derive(Debug)]
pub enum Setup {
    /// No device of this kind on this machine: the test is skipped.
    Skip(String),
    /// The constructor failed for another reason: the test fails.
    Fail(String),
}

/// Holds the constructor's value so that one method call accepts both `B` and
/// `Result<B, E>` (autoref specialisation: [`ViaResult`] matches first when it applies).
pub struct Probe<T>(Cell<Option<T>>);

impl<T> Probe<T> {
    pub fn new(value: T) -> Self {
        Probe(Cell::new(Some(value)))
    }

    fn take(&self) -> Result<T, Setup> {
        self.0
            .take()
            .ok_or_else(|| Setup::Fail("the backend value was already taken".into()))
    }
}

/// The constructor returned `Result<B, E>`.
pub trait ViaResult {
    type Backend;
    fn make_backend(&self) -> Result<Self::Backend, Setup>;
}

impl<B: Backend, E: Display + 'static> ViaResult for Probe<Result<B, E>> {
    type Backend = B;
    fn make_backend(&self) -> Result<B, Setup> {
        self.take()?.map_err(|e| {
            if says_no_device(&e) {
                Setup::Skip(e.to_string())
            } else {
                Setup::Fail(e.to_string())
            }
        })
    }
}

/// The constructor returned the backend itself.
pub trait ViaValue {
    type Backend;
    fn make_backend(&self) -> Result<Self::Backend, Setup>;
}

impl<B: Backend> ViaValue for &Probe<B> {
    type Backend = B;
    fn make_backend(&self) -> Result<B, Setup> {
        self.take()
    }
}

/// Runs suite function `test` named `name` on the backend `make` returns; panics (fails
/// the `#[test]`) with the suite's message if it returns an error. Without a device it
/// reports the skip ([`Skipped::report`]).
pub fn run_test<B: Backend>(
    name: &str,
    make: impl FnOnce() -> Result<B, Setup>,
    test: impl FnOnce(&B, &Config) -> Result<(), TestCaseError>,
) {
    if let Err(skipped) = try_run_test(name, make, test) {
        skipped.report();
    }
}

/// [`run_test`] that returns a skip instead of reporting it.
pub fn try_run_test<B: Backend>(
    name: &str,
    make: impl FnOnce() -> Result<B, Setup>,
    test: impl FnOnce(&B, &Config) -> Result<(), TestCaseError>,
) -> Result<(), Skipped> {
    let be = match make() {
        Ok(be) => be,
        Err(Setup::Skip(reason)) => return Err(Skipped::new(name, reason)),
        Err(Setup::Fail(msg)) => panic!("{name}: could not create the backend: {msg}"),
    };
    match test(&be, &Config::from_env()) {
        Ok(()) => {}
        Err(TestCaseError::Fail(why)) => panic!("{name} on {}: {}", be.name(), why.message()),
        Err(TestCaseError::Reject(why)) => {
            panic!("{name} on {}: rejected: {}", be.name(), why.message())
        }
    }
    Ok(())
}
