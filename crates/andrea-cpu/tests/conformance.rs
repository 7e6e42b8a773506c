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

/// The suite's products on one GEMM kernel: every product, the fused bias + GELU and
/// GELU-backward ones, attention (whose small per-head products go through the same
/// kernel) and determinism.
macro_rules! products_on {
    ($kernel:expr; $($name:ident)*) => {$(
        #[test]
        fn $name() {
            #[allow(unused_imports)]
            use andrea_testkit::__private::{ViaResult as _, ViaValue as _};
            andrea_testkit::__private::run_test(
                stringify!($name),
                || (&andrea_testkit::__private::Probe::new(
                    andrea_cpu::CpuBackend::new().with_gemm_kernel($kernel),
                ))
                    .make_backend(),
                andrea_testkit::suite::$name,
            );
        }
    )*};
}

mod avx2_gemm_kernel {
    //! andrea's own AVX2 + FMA GEMM kernel (the default under `ANDREA_SIMD=avx2`, which
    //! `.ci/run` also runs the whole suite with). The suite's shapes (up to 300) leave
    //! ragged 6 x 16 tiles and take the general packing of strided and transposed
    //! operands; the kernel's `k` slices (256) and `n` blocks are crossed by the unit
    //! test in `src/gemm_avx2.rs`.
    products_on!(andrea_cpu::GemmKernel::Avx2;
        matmul linear_gelu matmul_gelu_backward attention_forward attention_backward determinism);
}

mod avx512_gemm_kernel {
    //! andrea's own AVX-512 GEMM kernel, `B` packed once for all threads (under
    //! `ANDREA_SIMD=avx2` it falls back to the AVX2 kernel). Ragged tiles, masked edges
    //! and transposed operands come from the suite's shapes; the `k` slices and `n`
    //! blocks from the unit test in `src/gemm_avx512.rs`.
    products_on!(andrea_cpu::GemmKernel::Avx512;
        matmul linear_gelu matmul_gelu_backward attention_forward attention_backward determinism);
}

mod avx512_queue_gemm_kernel {
    //! The AVX2 kernel's packing and task queue with its 512-bit micro-kernel (12 x 32
    //! tiles, masked ragged columns; under `ANDREA_SIMD=avx2` or without AVX-512 it falls
    //! back to the AVX2 kernel). The `k` slices and `n` blocks are crossed by the unit
    //! tests in `src/gemm_avx2.rs`.
    products_on!(andrea_cpu::GemmKernel::Avx512Queue;
        matmul linear_gelu matmul_gelu_backward attention_forward attention_backward determinism);
}

mod avx512_blocks_gemm_kernel {
    //! The AVX-512 kernel in the per-block split (each block packs its own operands).
    products_on!(andrea_cpu::GemmKernel::Avx512Blocks;
        matmul linear_gelu matmul_gelu_backward determinism);
}

mod small_attention_products {
    //! The suite's attention cases with the register-tiled kernel of attention's per-head
    //! products (`AttentionProducts::Small`, not the default): its packing of strided
    //! and transposed operands, ragged row and column tiles, and accumulation into
    //! `dk`/`dv` over query blocks. Sizes past the suite's are in the unit test of
    //! `src/attention_products.rs`.
    use andrea_cpu::{AttentionProducts, CpuBackend};

    macro_rules! attention {
        ($($name:ident)*) => {$(
            #[test]
            fn $name() {
                #[allow(unused_imports)]
                use andrea_testkit::__private::{ViaResult as _, ViaValue as _};
                andrea_testkit::__private::run_test(
                    stringify!($name),
                    || (&andrea_testkit::__private::Probe::new(
                        CpuBackend::new().with_attention_products(AttentionProducts::Small),
                    ))
                        .make_backend(),
                    andrea_testkit::suite::$name,
                );
            }
        )*};
    }
    attention!(attention_forward attention_backward determinism);
}

mod fused_attention {
    //! The suite's attention cases with the fused attention
    //! (`AttentionProducts::Fused`, the default with AVX2 + FMA; its 32-column AVX-512
    //! tile where the level allows it and the head size is a multiple of 32, so `.ci/run`'s
    //! passes under `ANDREA_SIMD` caps run both tiles): ragged six-row tiles, keys past
    //! the last full panel, offsets into a KV cache, `dk`/`dv` summed over query blocks.
    //! Head sizes that are not a multiple of 16 take the blocked path (the suite has
    //! both). On a CPU without AVX2 and FMA every case takes the blocked path, and the
    //! test says so on stderr. Sizes past the suite's (several query blocks, T up to
    //! 300) and the bit-equality of the two tiles are in the unit tests of
    //! `src/attention_fused.rs`.
    use andrea_cpu::{AttentionProducts, CpuBackend};

    macro_rules! attention {
        ($($name:ident)*) => {$(
            #[test]
            fn $name() {
                #[cfg(target_arch = "x86_64")]
                let fused = std::arch::is_x86_feature_detected!("avx2")
                    && std::arch::is_x86_feature_detected!("fma");
                #[cfg(not(target_arch = "x86_64"))]
                let fused = false;
                if !fused {
                    eprintln!("no AVX2 + FMA here: the fused kernel is not run, only its fallback");
                }
                #[allow(unused_imports)]
                use andrea_testkit::__private::{ViaResult as _, ViaValue as _};
                andrea_testkit::__private::run_test(
                    stringify!($name),
                    || (&andrea_testkit::__private::Probe::new(
                        CpuBackend::new().with_attention_products(AttentionProducts::Fused),
                    ))
                        .make_backend(),
                    andrea_testkit::suite::$name,
                );
            }
        )*};
    }
    attention!(attention_forward attention_backward determinism);
}
