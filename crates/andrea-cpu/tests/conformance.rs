//! The backend conformance suite (andrea-testkit) on the CPU backend: every op against
//! its float64 reference, with random shapes and values, plus bad-input and determinism
//! checks. The default backend runs the kernels of the CPU's SIMD level (the fused
//! attention with AVX2 + FMA, its blocked path below); `.ci/run` runs this suite under
//! each `ANDREA_SIMD` cap too.

andrea_testkit::conformance_suite!(andrea_cpu::CpuBackend::new());

mod one_thread {
    andrea_testkit::conformance_suite!(andrea_cpu::CpuBackend::with_threads(1));
}
