//! The conformance suite on the naive backend: a check of the suite itself (and the
//! one-line instantiation every backend uses).

andrea_testkit::conformance_suite!(andrea_testkit::naive::NaiveBackend::new());
