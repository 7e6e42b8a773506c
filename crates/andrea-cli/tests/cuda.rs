//! `--backend cuda` end to end (built with `--features cuda`): train, eval, generate and
//! bench through the `andrea` binary on `CudaBackend`, and the first training losses the
//! same as on the CPU.
//!
//! * Against the link stub (`cargo xtask cuda-stub`) there is no device: the test checks
//!   that the error says so clearly (status 2, no panic, names `--backend cpu`), prints
//!   `SKIPPED` and passes.
//! * Against the CPU emulator (`cargo xtask cuda-emu`) it runs in full, in a few seconds:
//!   `CUDA_LIBRARY_PATH=$PWD/target/cuda-emu cargo test -p andrea-cli --features cuda --test cuda`.
//! * On a GPU machine (the bundle of `cargo xtask gpu-bundle`, `ANDREA_BIN` naming the
//!   binary) `ANDREA_REQUIRE_DEVICE=1` turns a missing device into a failure.
andrea_testkit::tests_need_feature!("cuda", "a device or the emulator: see .ci/run");

#[cfg(feature = "cuda")]
mod common;

#[cfg(feature = "cuda")]
#[path = "cuda/tests.rs"]
mod tests;
