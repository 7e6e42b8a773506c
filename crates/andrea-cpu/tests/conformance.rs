//! The backend conformance suite (andrea-testkit) on the CPU backend: every op against
//! its float64 reference, with random shapes and values, plus bad-input and determinism
//! checks.

andrea_testkit::conformance_suite!(andrea_cpu::CpuBackend::new());

mod one_thread {
    andrea_testkit::conformance_suite!(andrea_cpu::CpuBackend::with_threads(1));
}

mod matrixmultiply_kernel {
    //! The same suite with the matrixmultiply GEMM kernel.
    andrea_testkit::conformance_suite!(
        andrea_cpu::CpuBackend::new().with_gemm_kernel(andrea_cpu::GemmKernel::MatrixMultiply)
    );
}
