//! # andrea-testkit
//!
//! What every andrea backend is checked against:
//!
//! * [`reference`](mod@reference): a plain float64 implementation of every op of
//!   [`andrea_core::Backend`], on host slices, written for clarity (llm.c style: each
//!   function opens with the shapes it takes). Every backward reference is checked
//!   against central differences of its own forward reference (`cargo test -p
//!   andrea-testkit`), so forward/backward pairs cannot drift apart.
//! * [`Tol`] and [`tol`]: tolerances as `abs + rel·|ref|`, one per op with the reason.
//! * [`suite`]: the conformance suite, one generic function per op
//!   (`suite::matmul(&backend, &Config)`), driven by proptest with random shapes
//!   (sizes that are not multiples of any tile width, 1-sized dimensions), strided and
//!   transposed operands and random values; plus bad-input groups (each bad call must
//!   return an error that names the op, never panic) and a determinism check.
//! * [`conformance_suite!`]: stamps out one `#[test]` per suite function, so a backend
//!   crate runs everything with one line in `tests/conformance.rs`:
//!
//! ```ignore
//! andrea_testkit::conformance_suite!(andrea_cpu::CpuBackend::new());
//! ```
//!
//! * [`naive::NaiveBackend`]: the slowest correct backend, which validates the suite
//!   itself and shows how to implement the trait.
//! * [`compare::Compare`]: two backends in lockstep, naming the first op whose outputs
//!   differ beyond its tolerance (the CPU-vs-CUDA model tests use it).
//!
//! The number of proptest cases per op is [`suite::Config::DEFAULT_CASES`] (32) unless
//! the `PROPTEST_CASES` environment variable is set; `PROPTEST_RNG_SEED` fixes the seed.

pub mod compare;
pub mod device;
pub mod naive;
pub mod random;
pub mod reference;
pub mod suite;
pub mod tol;

mod harness;

pub use tol::Tol;

#[doc(hidden)]
pub mod __private {
    pub use crate::harness::{run_test, try_run_test, Probe, ViaResult, ViaValue};
}

/// Instantiates the whole conformance suite for one backend: one `#[test]` per
/// function of [`suite`], named after it.
///
/// The argument is an expression evaluated afresh in every test. It yields either the
/// backend `B` itself or `Result<B, E>` with `E: Display`. When it returns an error that
/// says no device is present ([`device::says_no_device`]), each test prints
/// `SKIPPED <name> because <reason>` to stderr and passes, unless
/// `ANDREA_REQUIRE_DEVICE=1` is set (then it fails): [`device::skip`], which device tests
/// outside the suite call through [`device::start_or_skip`]. Any other error fails the
/// test.
///
/// ```ignore
/// // crates/andrea-cpu/tests/conformance.rs
/// andrea_testkit::conformance_suite!(andrea_cpu::CpuBackend::new());
/// ```
///
/// Call it once per module (it defines functions named `matmul`, `gelu`, ...). The
/// functions come from the suite's one list (`__suite_functions!`, also
/// [`suite::NAMES`]); a test checks that list against what [`suite`] exports.
#[macro_export]
macro_rules! conformance_suite {
    ($make:expr $(,)?) => {
        $crate::__suite_functions!(__conformance_tests!($make));
    };
}

/// The suite's functions, written once: calls `$crate::$callback! { (args) names... }`.
/// A new suite function is exported from [`suite`] and added here.
#[doc(hidden)]
#[macro_export]
macro_rules! __suite_functions {
    ($callback:ident ! ($($args:tt)*)) => {
        $crate::$callback! {
            ($($args)*)
            memory bf16_conversion copy
            matmul bias_backward linear_gelu matmul_gelu_backward
            add scale gelu gelu_backward
            layernorm layernorm_backward residual_layernorm
            softmax softmax_backward
            embedding embedding_backward
            softmax_cross_entropy
            sum_squares adamw clip_scale adamw_scaled
            attention_forward attention_generation attention_backward
            mlp_forward decode_attention decode_blocks
            determinism
            bad_input_memory bad_input_linalg bad_input_elementwise bad_input_layernorm
            bad_input_softmax bad_input_embedding bad_input_loss bad_input_optim
            bad_input_attention
        }
    };
}

/// [`suite::NAMES`] from the list.
#[doc(hidden)]
#[macro_export]
macro_rules! __suite_names {
    (() $($name:ident)*) => {
        /// The name of every suite function, from the list [`crate::conformance_suite!`]
        /// stamps out.
        pub const NAMES: &[&str] = &[$(stringify!($name)),*];
    };
}

#[doc(hidden)]
#[macro_export]
macro_rules! __conformance_tests {
    (($make:expr) $($name:ident)*) => {
        $(
            #[test]
            fn $name() {
                #[allow(unused_imports)]
                use $crate::__private::{ViaResult as _, ViaValue as _};
                $crate::__private::run_test(
                    stringify!($name),
                    || (&$crate::__private::Probe::new($make)).make_backend(),
                    $crate::suite::$name,
                );
            }
        )*
    };
}

/// For a test binary whose tests all need a cargo feature (a device's backend): built
/// without it, the binary holds one test, `needs_the_feature`, that reports the skip
/// ([`device::skip`]) as `SKIPPED <binary> because its tests need --features <feature>
/// (<what else>)`, so that it does not run nothing without a word.
///
/// ```ignore
/// // crates/andrea-cuda/tests/split_k.rs
/// andrea_testkit::tests_need_feature!("cuda", "a device or the emulator: see .ci/run");
/// ```
#[macro_export]
macro_rules! tests_need_feature {
    ($feature:literal, $what_else:literal $(,)?) => {
        #[cfg(not(feature = $feature))]
        #[test]
        fn needs_the_feature() {
            $crate::device::skip(
                env!("CARGO_CRATE_NAME"),
                concat!(
                    "its tests need --features ",
                    $feature,
                    " (",
                    $what_else,
                    ")"
                ),
            );
        }
    };
}
