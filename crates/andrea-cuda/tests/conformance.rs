//! The backend conformance suite (andrea-testkit) on the CUDA backend in FP32 mode, the
//! mode whose results meet the suite's float32 tolerances (the tensor-core mode is
//! compared with the CPU backend in `cpu_vs_cuda.rs`, with its own tolerances).
//!
//! Without a GPU (or against the link stub from `cargo xtask cuda-stub`) the backend
//! cannot start and every test prints `SKIPPED <name> because no CUDA device found: ...`.
//! Set `ANDREA_REQUIRE_DEVICE=1` on a GPU machine to make a missing device a failure.
//! Against the CPU emulator of `cargo xtask cuda-emu` the suite runs in full.
//!
//! The test names stay at the top level (`gpu-check.sh` runs `cuda_device_present` by its
//! exact name), so each item here is built with the `cuda` feature only.

andrea_testkit::tests_need_feature!("cuda", "a device or the emulator: see .ci/run");

#[cfg(feature = "cuda")]
mod common;

/// Whether the suite has a device: one line for the whole suite (on the device's name,
/// or the skip), next to each suite test's own.
#[cfg(feature = "cuda")]
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

#[cfg(feature = "cuda")]
andrea_testkit::conformance_suite!(andrea_cuda::CudaBackend::with_precision(
    andrea_cuda::Precision::FP32
));

/// The suite's attention functions on the tensor-core kernels: the backend in TF32 and
/// BF16 (`ANDREA_CUDA_ATTENTION=auto` selects kernels/attention_mma.cu there), the suite
/// told the operand format ([`Operands`]) so that it draws head sizes 32, 64 and 128 and
/// adds the bound derived from the operand unit roundoff (`andrea_testkit::tol::operands`)
/// to its FP32 tolerances. The generation cases with at most 4 new rows and a long
/// cache run the split-KV decode kernels (FP32, so well inside that bound); the rest,
/// T not a multiple of the tiles and `pos_offset > 0` included, the mma kernels. Fewer
/// cases than the FP32 suite: the emulator runs the mma kernels lane by lane.
#[cfg(feature = "cuda")]
mod tensor_cores {
    use andrea_cuda::{CudaBackend, Precision};
    use andrea_testkit::suite::{self, Config, Operands};

    /// Cases per function (`PROPTEST_CASES` does not apply: the emulator runs the mma
    /// kernels lane by lane; 12 cases of the three functions take ~1 s there).
    const CASES: u32 = 12;

    fn run(name: &str, precision: Precision, operands: Operands) {
        let Some(be) = super::common::cuda(name, precision) else {
            return;
        };
        let cfg = Config::with_cases(CASES).with_operands(operands);
        for (f, check) in [
            (
                "attention_forward",
                suite::attention_forward::<CudaBackend> as fn(_, _) -> _,
            ),
            (
                "attention_generation",
                suite::attention_generation::<CudaBackend>,
            ),
            (
                "attention_backward",
                suite::attention_backward::<CudaBackend>,
            ),
        ] {
            if let Err(e) = check(&be, &cfg) {
                panic!("{name}: {f}: {e}");
            }
        }
    }

    #[test]
    fn attention_tf32() {
        run(
            "tensor_cores::attention_tf32",
            Precision::FAST,
            Operands::Tf32,
        );
    }

    #[test]
    fn attention_bf16() {
        run(
            "tensor_cores::attention_bf16",
            Precision::BF16,
            Operands::Bf16,
        );
    }

    /// The operand bound leaves the suite able to fail: the tensor-core forward's causal
    /// mask shifted by one key (a planted fault) fails `attention_forward` in BF16.
    #[test]
    fn planted_mask_fault_fails_the_suite() {
        let name = "tensor_cores::planted_mask_fault_fails_the_suite";
        let Some(mut be) = super::common::cuda(name, Precision::BF16) else {
            return;
        };
        be.plant_attention_fault(true);
        let cfg = Config::with_cases(CASES).with_operands(Operands::Bf16);
        let e = suite::attention_forward(&be, &cfg).unwrap_err().to_string();
        assert!(e.contains("out of tolerance"), "{e}");
    }
}
