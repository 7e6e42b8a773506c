//! The backend conformance suite (andrea-testkit) on the CUDA backend in FP32 mode, the
//! mode whose results meet the suite's float32 tolerances (the tensor-core mode is
//! compared with the CPU backend in `cpu_vs_cuda.rs`, with its own tolerances).
//!
//! Without a GPU (or against the link stub from `cargo xtask cuda-stub`) the backend
//! cannot start and every test prints `SKIPPED <name> because no CUDA device found: ...`.
//! Set `ANDREA_REQUIRE_DEVICE=1` on a GPU machine to make a missing device a failure.
//! Against the CPU emulator of `cargo xtask cuda-emu` the suite runs in full.
#![cfg(feature = "cuda")]

mod common;

/// One visible line for the whole suite when there is no device (the suite's own
/// `SKIPPED` lines are `eprintln!`s, which libtest shows only with `--nocapture`).
#[test]
fn cuda_device_present() {
    if let Some(be) = common::cuda(
        "conformance suite (all tests in this binary)",
        andrea_cuda::Precision::FP32,
    ) {
        use andrea_core::MemoryOps;
        eprintln!("conformance suite on {}", be.name());
    }
}

andrea_testkit::conformance_suite!(andrea_cuda::CudaBackend::with_precision(
    andrea_cuda::Precision::FP32
));
