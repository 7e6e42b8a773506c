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

    /// Views the model's contiguous tensors never make: batched, at offsets that are not
    /// 16-byte aligned (the BF16 copies start aligned), rows padded (stride > size), and
    /// an M- or N-contiguous dimension that is not a multiple of 8 (M = 130 and N = 194
    /// inside rows of 136 and 200: the last 16-byte chunk partly zero-filled).
    #[test]
    fn bf16_gemm_strided_views() {
        use andrea_core::{LinalgOps, Matrix, MemoryOps};
        let name = "bf16_gemm_strided_views";
        let Some(be) = cuda(name, Precision::BF16) else {
            return;
        };
        let (m, n, k, batch) = (130, 194, 200, 2);
        // (offset, batch stride, row stride, column stride) of B [K, N] and of A [M, K].
        let b_st = (2, 200 * 200, 200, 1);
        for a_t in [false, true] {
            let a_st = match a_t {
                true => (3, 200 * 136, 1, 136),
                false => (5, 130 * 208, 208, 1),
            };
            let len = |s: (usize, usize, usize, usize), rows: usize, cols: usize| {
                s.0 + (batch - 1) * s.1 + (rows - 1) * s.2 + (cols - 1) * s.3 + 1
            };
            let a = common::data(41, len(a_st, m, k), -1.0, 1.0);
            let b = common::data(42, len(b_st, k, n), -1.0, 1.0);
            let (ab, bb) = (common::buf(&be, &a), common::buf(&be, &b));
            let cb = be.alloc(batch * m * n).unwrap();
            let view = |buf, s: (usize, usize, usize, usize), rows, cols| Matrix {
                buf,
                offset: s.0,
                batch,
                rows,
                cols,
                batch_stride: s.1,
                row_stride: s.2,
                col_stride: s.3,
            };
            let op = |s: (usize, usize, usize, usize), rows, cols| mm::Operand {
                offset: s.0,
                batch,
                rows,
                cols,
                bs: s.1,
                rs: s.2,
                cs: s.3,
            };
            let kernel = mm::choose_for(
                &op(a_st, m, k),
                &op(b_st, k, n),
                batch,
                Precision::BF16.matmul,
                be.matmul_impl(),
                be.matmul_gpu(),
            );
            let layout = GemmLayout {
                a_k: !a_t,
                b_k: false,
            };
            assert_eq!(kernel, MatmulKernel::Bf16(layout));
            be.matmul(
                view(&ab, a_st, m, k),
                view(&bb, b_st, k, n),
                None,
                view(&cb, (0, m * n, n, 1), m, n),
            )
            .unwrap();
            let got = common::read(&be, &cb);
            let at = |h: &[f32], s: (usize, usize, usize, usize), bi, r, c| {
                h[s.0 + bi * s.1 + r * s.2 + c * s.3] as f64
            };
            let (mut want, mut mag) = (Vec::new(), Vec::new());
            for bi in 0..batch {
                for i in 0..m {
                    for j in 0..n {
                        let p = (0..k).map(|kk| at(&a, a_st, bi, i, kk) * at(&b, b_st, bi, kk, j));
                        let (sum, abs) = p.fold((0.0, 0.0), |(s, m), v| (s + v, m + v.abs()));
                        want.push(sum as f32);
                        mag.push(abs);
                    }
                }
            }
            let u24 = 1.0 / 16_777_216.0;
            common::compare(&format!("{name} {layout:?}"), &got, &want, |i| {
                2.0 * ((2.0 * U_BF16 + (k + 2) as f64 * u24) * mag[i] + 1e-6)
            })
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

    /// Each planted fault (compiled only into the emulator's build of the kernels, so the
    /// test skips on a GPU) fails the
    /// comparison: on x·W (the `.trans` B operand) and on Xᵀ·dY (both operands `.trans`),
    /// and the wrong swizzle and the skipped stage also on x·wteᵀ (no `.trans`).
    #[test]
    fn bf16_gemm_planted_faults_are_caught() {
        let name = "bf16_gemm_planted_faults_are_caught";
        let Some(mut be) = cuda(name, Precision::BF16) else {
            return;
        };
        if !common::set_warp_order(false) {
            let why = "the faults are compiled only into the emulator's build of the kernels";
            andrea_testkit::device::Skipped::new(name, why).print();
            return;
        }
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
