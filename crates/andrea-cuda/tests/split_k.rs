//! Split-K against the unsplit product on the same backend and precision, for every
//! slice count the plan can choose (2..=8), with half-empty last tiles (N = 192 = 128 +
//! 64, as N = 8512 = 66·128 + 64), transposed operands, accumulate and bias; and bit for
//! bit the same from run to run.
//!
//! Tolerance: both paths round the operands identically (the same kernel stages the same
//! elements) and differ only in the order of the FP32 sums over K, each within
//! K·2⁻²⁴·Σ_k |a_ik|·|b_kj| of the exact sum of the rounded products; the bias and C
//! added once more: `|split - unsplit| <= 2·K·2⁻²⁴·(Σ|a|·|b| + 2) + 1e-6`, times 2 for
//! the operand rounding's effect on Σ|a|·|b| and headroom.

andrea_testkit::tests_need_feature!("cuda", "a device or the emulator: see .ci/run");

#[cfg(feature = "cuda")]
mod common;

/// The tests, which need the `cuda` feature.
#[cfg(feature = "cuda")]
mod tests {
    use crate::common;

    use andrea_cuda::plan::matmul::{self as mm, MatmulGpu, MatmulKernel};
    use andrea_cuda::plan::occupancy::{ptxas_table, SmLimits};
    use andrea_cuda::{MatmulImpl, MmaTile, Precision, SplitK};
    use common::matmul::{inputs, run, Case, Inputs};
    use common::{compare, cuda};

    const U24: f64 = 1.0 / 16_777_216.0;

    fn bound<'a>(c: &Case, x: &'a Inputs) -> impl Fn(usize) -> f64 + 'a {
        let c = *c;
        move |idx| {
            let (i, j) = (idx / c.n, idx % c.n);
            let a_at = |kk: usize| {
                if c.transpose_a {
                    x.a[kk * c.m + i]
                } else {
                    x.a[i * c.k + kk]
                }
            };
            let b_at = |kk: usize| {
                if c.transpose_b {
                    x.b[j * c.k + kk]
                } else {
                    x.b[kk * c.n + j]
                }
            };
            let mag: f64 = (0..c.k).map(|kk| (a_at(kk) * b_at(kk)).abs() as f64).sum();
            2.0 * (2.0 * c.k as f64 * U24 * (mag + 2.0) + 1e-6)
        }
    }

    /// For each slice count 2..=8: the plan splits into exactly that many slices, the split
    /// product is within the bound of the unsplit one, and two runs agree bit for bit.
    fn split_vs_unsplit(
        name: &str,
        precision: Precision,
        m: usize,
        n: usize,
        k: usize,
        kernel: MatmulKernel,
        imp: MatmulImpl,
    ) {
        let Some(mut gpu) = cuda(name, precision) else {
            return;
        };
        gpu.set_matmul_impl(imp);
        for slices in 2..=8usize {
            let c = Case {
                m,
                n,
                k,
                transpose_a: slices % 2 == 0,
                transpose_b: slices % 3 == 0,
                bias: slices % 2 == 1 || slices == 8,
                accumulate: slices >= 5,
            };
            let s = mm::split(m, n, k, kernel, slices).unwrap().unwrap();
            assert_eq!(s.slices, slices, "{name}: K = {k} gives every slice count");
            assert_eq!(
                mm::choose(m, n, k, 1, precision.matmul, imp, gpu.matmul_gpu()),
                kernel
            );
            let x = inputs(&c, 100 + slices as u64);
            gpu.set_split_k(SplitK::Off);
            let unsplit = run(&gpu, &c, &x);
            gpu.set_split_k(SplitK::Fixed(slices));
            let split = run(&gpu, &c, &x);
            compare(&format!("{name} {c:?}"), &split, &unsplit, bound(&c, &x)).unwrap();
            let again = run(&gpu, &c, &x);
            assert!(
                split
                    .iter()
                    .zip(&again)
                    .all(|(p, q)| p.to_bits() == q.to_bits()),
                "{name} {c:?}: two split-K runs differ"
            );
            assert_ne!(
                split, unsplit,
                "{name} {c:?}: the split path ran (sums in another order)"
            );
        }
    }

    // K = 500 / 1000 gives slices of 16 / 32 multiples for every count 2..=8, with a
    // partial last K step; N = 96 / 192 and M = 70 / 130 leave half-empty and nearly empty
    // edge tiles.
    #[test]
    fn split_k_fp32() {
        split_vs_unsplit(
            "split_k_fp32",
            Precision::FP32,
            70,
            96,
            500,
            MatmulKernel::Simt,
            MatmulImpl::Wmma,
        );
    }

    #[test]
    fn split_k_tf32() {
        split_vs_unsplit(
            "split_k_tf32",
            Precision::FAST,
            130,
            192,
            1000,
            MatmulKernel::TensorTf32,
            MatmulImpl::Wmma,
        );
    }

    #[test]
    fn split_k_bf16() {
        split_vs_unsplit(
            "split_k_bf16",
            Precision::BF16,
            130,
            192,
            1000,
            MatmulKernel::TensorBf16,
            MatmulImpl::Wmma,
        );
    }

    // The mma kernels, each split count with the 64x64 and 128x64 tiles.
    #[test]
    fn split_k_mma_tf32() {
        split_vs_unsplit(
            "split_k_mma_tf32",
            Precision::FAST,
            130,
            192,
            1000,
            MatmulKernel::MmaTf32(MmaTile::T64x64),
            MatmulImpl::MmaFixed(MmaTile::T64x64),
        );
    }

    #[test]
    fn split_k_mma_bf16() {
        split_vs_unsplit(
            "split_k_mma_bf16",
            Precision::BF16,
            130,
            192,
            1000,
            MatmulKernel::MmaBf16(MmaTile::T128x64),
            MatmulImpl::MmaFixed(MmaTile::T128x64),
        );
    }

    /// A planted fault, the reduce skipping the last slice, fails the comparison.
    #[test]
    fn split_k_skipped_slice_is_caught() {
        let name = "split_k_skipped_slice_is_caught";
        let Some(mut gpu) = cuda(name, Precision::FP32) else {
            return;
        };
        let c = Case {
            m: 70,
            n: 96,
            k: 500,
            transpose_a: true,
            transpose_b: false,
            bias: true,
            accumulate: true,
        };
        let x = inputs(&c, 7);
        gpu.set_split_k(SplitK::Off);
        let unsplit = run(&gpu, &c, &x);
        gpu.set_split_k(SplitK::Fixed(4));
        gpu.plant_split_k_fault(true);
        let faulty = run(&gpu, &c, &x);
        assert!(compare(name, &faulty, &unsplit, bound(&c, &x)).is_err());
    }

    /// `auto` on the emulator (one SM) never splits: the default path there is the unsplit one.
    #[test]
    fn split_k_auto_on_one_sm_is_unsplit() {
        let name = "split_k_auto_on_one_sm_is_unsplit";
        let Some(gpu) = cuda(name, Precision::FP32) else {
            return;
        };
        if gpu.multiprocessors() == 1 {
            assert_eq!(
                mm::split_count(768, 768, 16384, 1, MatmulKernel::Simt, gpu.matmul_gpu()),
                1
            );
        }
        if std::env::var_os("ANDREA_CUDA_SPLIT_K").is_none() {
            assert_eq!(gpu.split_k(), SplitK::Auto);
        }
    }

    /// The backend plans products with what the driver reports: the device's SM limits
    /// (`cuDeviceGetAttribute`) and each kernel's registers and static shared memory
    /// (`cuFuncGetAttribute`). On the emulator (an sm_80 device of one SM that reports
    /// ptxas's sm_80 counts) and on sm_80 and sm_90 GPUs that is exactly what
    /// `plan::occupancy` computes from an A100's or an H200's limits and the committed
    /// ptxas table; e.g. the 128x128 mma kernels (96 KiB of shared memory) fit once in an
    /// A100's SM, twice in an H200's.
    #[test]
    fn blocks_per_sm_come_from_the_device() {
        let name = "blocks_per_sm_come_from_the_device";
        let Some(gpu) = cuda(name, Precision::FP32) else {
            return;
        };
        let (limits, arch, big_tile) = match gpu.compute_capability() {
            (8, 0) => (SmLimits::A100, "sm_80", 1),
            (9, 0) => (SmLimits::H200, "sm_90", 2),
            cc => {
                eprintln!("SKIPPED {name}: no reference limits for compute capability {cc:?}");
                return;
            }
        };
        let table = ptxas_table(include_str!("../ptx/resources.tsv"));
        let limits = SmLimits {
            sms: gpu.multiprocessors(),
            ..limits
        };
        let want = MatmulGpu::new(&limits, |kernel| {
            table[&(kernel.to_string(), arch.to_string())]
        });
        assert_eq!(gpu.matmul_gpu(), &want, "{}", gpu.device_name());
        for k in [
            MatmulKernel::MmaTf32(MmaTile::T128x128),
            MatmulKernel::MmaBf16(MmaTile::T128x128),
        ] {
            assert_eq!(gpu.matmul_gpu().blocks_per_sm(k), big_tile, "{k:?}");
        }
    }
}
