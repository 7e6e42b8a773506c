//! The BF16-operand GEMM kernels (kernels/matmul_bf16.cu, the default for BF16 products)
//! against the float64 reference, with the bound of cpu_vs_cuda.rs for operands rounded to
//! BF16 (u_op = 2⁻⁸) and FP32 sums (`common::matmul::check`): the products of an
//! ANDREA-120M step scaled down (d 128, 260 token rows, vocabulary 323), each in the layout
//! the model runs it in (x·W, x·Wᵀ, Xᵀ·dY: three of the four kernels; the fourth, Aᵀ·Bᵀ,
//! on odd sizes), with K remainders (K mod 64 ≠ 0, so the masked first tile), odd M and N
//! (M of x·W, N of x·Wᵀ: the rows of a K-contiguous operand), bias and accumulate; the plan's
//! fallback to matmul_mma.cu where the kernel cannot take a shape (K mod 8 ≠ 0 with a
//! K-contiguous operand; a row stride not a multiple of 8); split-K; and the planted faults (wrong swizzle, skipped pipeline
//! stage, wrong `ldmatrix.trans` row), which must fail.

andrea_testkit::tests_need_feature!("cuda", "a device or the emulator: see .ci/run");

#[cfg(feature = "cuda")]
mod common;

/// The tests, which need the `cuda` feature.
#[cfg(feature = "cuda")]
mod tests {
    use crate::common;

    use andrea_cuda::plan::matmul::{self as mm, GemmLayout, MatmulKernel};
    use andrea_cuda::{CudaBackend, MatmulImpl, Precision, SplitK};
    use common::cuda;
    use common::matmul::{check, Case};

    const U_BF16: f64 = 1.0 / 256.0;

    /// The kernel the plan runs `c` with, from the operands' strides as `run` lays them
    /// out (`a` stored `[K, M]` when transposed, `b` stored `[N, K]`).
    fn kernel_of(be: &CudaBackend, c: &Case) -> MatmulKernel {
        let op = |rows, cols, t: bool| mm::Operand {
            offset: 0,
            batch: 1,
            rows,
            cols,
            bs: 0,
            rs: if t { 1 } else { cols },
            cs: if t { rows } else { 1 },
        };
        let (a, b) = (op(c.m, c.k, c.transpose_a), op(c.k, c.n, c.transpose_b));
        mm::choose_for(
            &a,
            &b,
            1,
            Precision::BF16.matmul,
            be.matmul_impl(),
            be.matmul_gpu(),
        )
    }

    fn case(m: usize, n: usize, k: usize, ta: bool, tb: bool, bias: bool, acc: bool) -> Case {
        Case {
            m,
            n,
            k,
            transpose_a: ta,
            transpose_b: tb,
            bias,
            accumulate: acc,
        }
    }

    /// `(what, case, the BF16 kernel's layout or None for the fallback)`.
    fn model_products() -> Vec<(&'static str, Case, Option<GemmLayout>)> {
        let (d, rows, vocab) = (128, 260, 323);
        let l = |a_k, b_k| Some(GemmLayout { a_k, b_k });
        vec![
            (
                "qkv x·W + b",
                case(rows, 3 * d, d, false, false, true, false),
                l(true, false),
            ),
            (
                "attn_proj x·W + b",
                case(rows, d, d, false, false, true, false),
                l(true, false),
            ),
            (
                "fc x·W + b",
                case(rows, 4 * d, d, false, false, true, false),
                l(true, false),
            ),
            (
                "fc_proj x·W + b",
                case(rows, d, 4 * d, false, false, true, false),
                l(true, false),
            ),
            (
                "lm_head x·wteᵀ",
                case(rows, vocab, d, false, true, false, false),
                l(true, true),
            ),
            (
                "qkv dX = dY·Wᵀ",
                case(rows, d, 3 * d, false, true, false, false),
                l(true, true),
            ),
            (
                "qkv dW += Xᵀ·dY",
                case(d, 3 * d, rows, true, false, false, true),
                l(false, false),
            ),
            (
                "dwte += dlogitsᵀ·x (dlogits rows of 323: the fallback)",
                case(vocab, d, rows, true, false, false, true),
                None,
            ),
            (
                "Aᵀ·Bᵀ, odd sizes",
                case(136, 194, 200, true, true, true, false),
                l(false, true),
            ),
            // K = 323 is not a multiple of 8 and A is K-contiguous: matmul_mma.cu runs it.
            (
                "lm_head dX = dlogits·wte",
                case(rows, d, vocab, false, false, false, false),
                None,
            ),
        ]
    }

    #[test]
    fn bf16_gemm_model_products() {
        let name = "bf16_gemm_model_products";
        let Some(be) = cuda(name, Precision::BF16) else {
            return;
        };
        assert_eq!(be.matmul_impl(), MatmulImpl::Bf16, "the default for BF16");
        for (i, (what, c, layout)) in model_products().into_iter().enumerate() {
            let kernel = kernel_of(&be, &c);
            match layout {
                Some(l) => assert_eq!(kernel, MatmulKernel::Bf16(l), "{what}: {c:?}"),
                None => assert!(
                    matches!(kernel, MatmulKernel::MmaBf16(_)),
                    "{what}: {kernel:?}"
                ),
            }
            check(
                &be,
                &format!("{name} {what} {c:?}"),
                &c,
                U_BF16,
                11 + i as u64,
            )
            .unwrap();
        }
    }

    /// Split-K (grid z is the K slice, slices of a multiple of 64, the last one short) in
    /// the two layouts the dW and forward products use.
    #[test]
    fn bf16_gemm_split_k() {
        let name = "bf16_gemm_split_k";
        let Some(mut be) = cuda(name, Precision::BF16) else {
            return;
        };
        be.set_split_k(SplitK::Fixed(3));
        for (i, c) in [
            case(128, 200, 420, true, false, false, true),
            case(130, 128, 400, false, false, true, false),
        ]
        .into_iter()
        .enumerate()
        {
            assert!(matches!(kernel_of(&be, &c), MatmulKernel::Bf16(_)), "{c:?}");
            check(&be, &format!("{name} {c:?}"), &c, U_BF16, 31 + i as u64).unwrap();
        }
    }

    /// Each planted fault (compiled only into the emulator's build of the kernels) fails the
    /// comparison: on x·W (the `.trans` B operand) and on Xᵀ·dY (both operands `.trans`),
    /// and the wrong swizzle and the skipped stage also on x·wteᵀ (no `.trans`).
    #[test]
    fn bf16_gemm_planted_faults_are_caught() {
        let name = "bf16_gemm_planted_faults_are_caught";
        let Some(mut be) = cuda(name, Precision::BF16) else {
            return;
        };
        let cases = [
            (case(130, 200, 200, false, false, false, false), true),
            (case(136, 136, 260, true, false, false, false), true),
            (case(130, 194, 200, false, true, false, false), false),
        ];
        for (c, trans) in cases {
            assert!(matches!(kernel_of(&be, &c), MatmulKernel::Bf16(_)), "{c:?}");
            be.plant_gemm_fault(0);
            check(&be, name, &c, U_BF16, 5).unwrap();
            let faults: &[(u8, &str)] = match trans {
                true => &[
                    (1, "wrong swizzle"),
                    (2, "skipped pipeline stage"),
                    (3, "wrong ldmatrix.trans row"),
                ],
                false => &[(1, "wrong swizzle"), (2, "skipped pipeline stage")],
            };
            for &(fault, what) in faults {
                be.plant_gemm_fault(fault);
                assert!(
                    check(&be, name, &c, U_BF16, 5).is_err(),
                    "{c:?}: planted fault ({what}) not caught"
                );
            }
        }
        be.plant_gemm_fault(0);
    }
}
