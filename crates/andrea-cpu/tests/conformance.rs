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

mod avx2_gemm_kernel {
    //! The suite's products with andrea's own AVX2 + FMA GEMM kernel (the default under
    //! `ANDREA_SIMD=avx2`, which `.ci/run` also runs the whole suite with): every
    //! product, the fused bias + GELU and GELU-backward ones, and attention, whose small
    //! per-head products go through the same kernel. The suite's shapes (up to 300)
    //! leave ragged 6 x 16 tiles and take the general packing of strided and transposed
    //! operands; the kernel's `k` slices (384) and `n` blocks are crossed by the unit
    //! test in `src/gemm_avx2.rs`.
    use andrea_cpu::{CpuBackend, GemmKernel};

    macro_rules! products {
        ($($name:ident)*) => {$(
            #[test]
            fn $name() {
                #[allow(unused_imports)]
                use andrea_testkit::__private::{ViaResult as _, ViaValue as _};
                andrea_testkit::__private::run_test(
                    stringify!($name),
                    || (&andrea_testkit::__private::Probe::new(
                        CpuBackend::new().with_gemm_kernel(GemmKernel::Avx2),
                    ))
                        .make_backend(),
                    andrea_testkit::suite::$name,
                );
            }
        )*};
    }
    products!(matmul linear_gelu matmul_gelu_backward attention_forward attention_backward determinism);
}
