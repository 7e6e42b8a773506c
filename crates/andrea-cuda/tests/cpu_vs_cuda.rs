//! CPU vs CUDA, op by op, in the CUDA backend's fast modes (TF32 or BF16 tensor cores,
//! hardware tanh), with tolerances derived from those formats; the FP32 mode is held to
//! the float64 references by `conformance.rs`. Inputs are in [-1, 1] unless stated.
//!
//! Tolerances (`u_op` is the operand format's unit roundoff: TF32 2⁻¹¹, BF16 2⁻⁸):
//!
//! * matmul: each product `a·b` has relative error <= 2·u_op from rounding both operands,
//!   and the FP32 sums (on both backends) add <= K·2⁻²⁴ relative to `Σ|a|·|b|`, so
//!   `|gpu - cpu| <= (2·u_op + 2·K·2⁻²⁴)·Σ_k |a_ik|·|b_kj| + 1e-6`, times 2 for headroom.
//! * GELU with tanh.approx.f32: the instruction's relative error is <= 2⁻¹⁰·⁹⁸⁷ (PTX
//!   ISA), so `|Δgelu| <= 0.5·|x|·2⁻¹⁰·⁹⁸⁷ + 1e-6`, and `|Δgelu'| <= 2⁻¹⁰·⁹⁸⁷·(0.5 +
//!   |x|·|t|·k0·(1 + 3·k1·x²))·|dout| + 2e-6` (t = tanh(u), |t| <= 1); times 2.
//!
//! * matmul_gelu_backward `dpre = (dy·w) ⊙ GELU'(pre)`: the matmul bound times
//!   `max |GELU'| <= 1.13`, plus GELU''s bound with `dout = dy·w` (above for tanh.approx;
//!   `2·(4e-6 + 2e-5)·|dy·w|` for tanhf, the suite's `tol::gelu_backward`, times 2).
//!
//! Without a device every test prints SKIPPED and passes (ANDREA_REQUIRE_DEVICE=1 makes it
//! fail). The whole model (a training step and a generation step) is compared in
//! `model_vs_cpu.rs`.

andrea_testkit::tests_need_feature!("cuda", "a device or the emulator: see .ci/run");

#[cfg(feature = "cuda")]
mod common;

/// The tests, which need the `cuda` feature.
#[cfg(feature = "cuda")]
mod tests {
    use crate::common;

    use andrea_core::{Backend, Matrix, View};
    use andrea_cuda::{CudaBackend, MatmulPrecision, Precision, SplitK};
    use common::{attention_pass, buf, compare, cpu, cuda, data, read};
    use proptest::prelude::*;
    use proptest::test_runner::{Config, TestRunner};

    const U24: f64 = 1.0 / 16_777_216.0;

    fn unit_roundoff(p: MatmulPrecision) -> f64 {
        match p {
            MatmulPrecision::Fp32 => U24,
            MatmulPrecision::Tf32 => 1.0 / 2048.0,
            MatmulPrecision::Bf16 => 1.0 / 256.0,
        }
    }

    #[derive(Debug, Clone, Copy)]
    struct MatmulCase {
        m: usize,
        n: usize,
        k: usize,
        transpose_b: bool,
        bias: bool,
        accumulate: bool,
        seed: u64,
    }

    fn matmul_case() -> impl Strategy<Value = MatmulCase> {
        // Small odd shapes (edge tiles, the FP32 fallback) and shapes past the tensor-core
        // threshold (2^22 multiply-adds, M and N >= 64).
        let small = (1usize..90, 1usize..90, 1usize..90);
        let big = (64usize..400, 64usize..400, 100usize..300);
        (
            prop_oneof![small, big],
            any::<bool>(),
            any::<bool>(),
            any::<bool>(),
            any::<u64>(),
        )
            .prop_map(
                |((m, n, k), transpose_b, bias, accumulate, seed)| MatmulCase {
                    m,
                    n,
                    k,
                    transpose_b,
                    bias,
                    accumulate,
                    seed,
                },
            )
    }

    /// `c (+)= a·b (+ bias)` on `be`; returns the whole `c` buffer.
    fn run_matmul<B: Backend>(
        be: &B,
        c: &MatmulCase,
        a: &[f32],
        b: &[f32],
        bias: &[f32],
        c0: &[f32],
    ) -> Vec<f32> {
        let (ab, bb, biasb, cb) = (buf(be, a), buf(be, b), buf(be, bias), buf(be, c0));
        let am = View::new(&ab, 0, [c.m, c.k]).mat();
        let bm: Matrix<'_, B::Buffer> = if c.transpose_b {
            View::new(&bb, 0, [c.n, c.k]).mat().t()
        } else {
            View::new(&bb, 0, [c.k, c.n]).mat()
        };
        let bias_v = c.bias.then(|| View::new(&biasb, 0, [c.n]));
        if c.accumulate {
            be.matmul_add(am, bm, bias_v, View::new(&cb, 0, [c.m, c.n]).mat())
        } else {
            be.matmul(am, bm, bias_v, View::new(&cb, 0, [c.m, c.n]).mat())
        }
        .expect("matmul");
        read(be, &cb)
    }

    fn matmul_vs_cpu(name: &str, precision: Precision) {
        let Some(gpu) = cuda(name, precision) else {
            return;
        };
        let host = cpu();
        let u = unit_roundoff(precision.matmul);
        let mut runner = TestRunner::new(Config {
            cases: 48,
            failure_persistence: None,
            ..Config::default()
        });
        runner
            .run(&matmul_case(), |c| {
                let a = data(c.seed, c.m * c.k, -1.0, 1.0);
                let b = data(c.seed + 1, c.k * c.n, -1.0, 1.0);
                let bias = data(c.seed + 2, c.n, -1.0, 1.0);
                let c0 = data(c.seed + 3, c.m * c.n, -1.0, 1.0);
                let want = run_matmul(&host, &c, &a, &b, &bias, &c0);
                let got = run_matmul(&gpu, &c, &a, &b, &bias, &c0);
                let b_at = |kk: usize, j: usize| {
                    if c.transpose_b {
                        b[j * c.k + kk]
                    } else {
                        b[kk * c.n + j]
                    }
                };
                let bound = |idx: usize| {
                    let (i, j) = (idx / c.n, idx % c.n);
                    let mag: f64 = (0..c.k)
                        .map(|kk| (a[i * c.k + kk] * b_at(kk, j)).abs() as f64)
                        .sum();
                    2.0 * ((2.0 * u + 2.0 * c.k as f64 * U24) * (mag + 2.0) + 1e-6)
                };
                compare(name, &got, &want, bound).map_err(TestCaseError::fail)
            })
            .unwrap();
    }

    #[test]
    fn matmul_tf32_vs_cpu() {
        matmul_vs_cpu("matmul_tf32_vs_cpu", Precision::FAST);
    }

    #[test]
    fn matmul_bf16_vs_cpu() {
        matmul_vs_cpu("matmul_bf16_vs_cpu", Precision::BF16);
    }

    #[test]
    fn matmul_fp32_vs_cpu() {
        matmul_vs_cpu("matmul_fp32_vs_cpu", Precision::FP32);
    }

    const TANH_APPROX_REL: f64 = 4.97e-4; // 2^-10.987
    const K0: f64 = 0.797_884_560_802_865_4;
    const K1: f64 = 0.044715;

    fn gelu_bound(x: f32) -> f64 {
        let x = x.abs() as f64;
        2.0 * (0.5 * x * TANH_APPROX_REL + 1e-6)
    }

    fn gelu_grad_bound(x: f32, dout: f32) -> f64 {
        let x = x.abs() as f64;
        let du = K0 * (1.0 + 3.0 * K1 * x * x);
        2.0 * (TANH_APPROX_REL * (0.5 + x * du) * dout.abs() as f64 + 2e-6)
    }

    fn run_gelu<B: Backend>(be: &B, x: &[f32], dout: &[f32]) -> (Vec<f32>, Vec<f32>) {
        let (xb, ob, db, gb) = (
            buf(be, x),
            buf(be, &vec![0.0; x.len()]),
            buf(be, dout),
            buf(be, &vec![0.0; x.len()]),
        );
        be.gelu(View::whole(&xb), View::whole(&ob)).expect("gelu");
        be.gelu_backward(View::whole(&xb), View::whole(&db), View::whole(&gb))
            .expect("gelu_backward");
        (read(be, &ob), read(be, &gb))
    }

    #[test]
    fn gelu_tanh_approx_vs_cpu() {
        let Some(gpu) = cuda("gelu_tanh_approx_vs_cpu", Precision::FAST) else {
            return;
        };
        let host = cpu();
        for (seed, n) in [(1u64, 1usize), (2, 7), (3, 1000), (4, 100_003)] {
            let x = data(seed, n, -8.0, 8.0);
            let dout = data(seed + 10, n, -1.0, 1.0);
            let (want_y, want_d) = run_gelu(&host, &x, &dout);
            let (got_y, got_d) = run_gelu(&gpu, &x, &dout);
            compare("gelu (tanh.approx)", &got_y, &want_y, |i| gelu_bound(x[i])).unwrap();
            compare("gelu_backward (tanh.approx)", &got_d, &want_d, |i| {
                gelu_grad_bound(x[i], dout[i])
            })
            .unwrap();
        }
    }

    /// linear_gelu = matmul with bias, then GELU: `pre` within the matmul bound, `out`
    /// within the GELU bound applied to the GPU's own `pre` plus the matmul error times
    /// max |gelu'| (<= 1.13).
    #[test]
    fn linear_gelu_fast_vs_cpu() {
        linear_gelu_vs_cpu("linear_gelu_fast_vs_cpu", Precision::FAST, 300);
    }

    /// N = 304: W's rows are a multiple of 8 elements, so kernels/matmul_bf16.cu runs it.
    #[test]
    fn linear_gelu_bf16_vs_cpu() {
        linear_gelu_vs_cpu("linear_gelu_bf16_vs_cpu", Precision::BF16, 304);
    }

    /// `linear_gelu` (x [256, 192]·W [192, n] + bias, GELU by tanh.approx) against the CPU.
    fn linear_gelu_vs_cpu(name: &str, precision: Precision, n: usize) {
        let Some(gpu) = cuda(name, precision) else {
            return;
        };
        let host = cpu();
        let u = unit_roundoff(precision.matmul);
        let (m, k) = (256usize, 192usize);
        let x = data(1, m * k, -1.0, 1.0);
        let w = data(2, k * n, -1.0, 1.0);
        let bias = data(3, n, -1.0, 1.0);
        fn go<B: Backend>(
            be: &B,
            x: &[f32],
            w: &[f32],
            bias: &[f32],
            m: usize,
            k: usize,
            n: usize,
        ) -> (Vec<f32>, Vec<f32>) {
            let (xb, wb, bb) = (buf(be, x), buf(be, w), buf(be, bias));
            let (pre, out) = (buf(be, &vec![0.0; m * n]), buf(be, &vec![0.0; m * n]));
            be.linear_gelu(
                View::new(&xb, 0, [m, k]).mat(),
                View::new(&wb, 0, [k, n]).mat(),
                View::whole(&bb),
                View::new(&pre, 0, [m, n]),
                View::new(&out, 0, [m, n]),
            )
            .expect("linear_gelu");
            (read(be, &pre), read(be, &out))
        }
        let (want_pre, want_out) = go(&host, &x, &w, &bias, m, k, n);
        let (got_pre, got_out) = go(&gpu, &x, &w, &bias, m, k, n);
        let mm = |idx: usize| {
            let (i, j) = (idx / n, idx % n);
            let mag: f64 = (0..k)
                .map(|kk| (x[i * k + kk] * w[kk * n + j]).abs() as f64)
                .sum();
            2.0 * ((2.0 * u + 2.0 * k as f64 * U24) * (mag + 1.0) + 1e-6)
        };
        compare(&format!("{name} pre"), &got_pre, &want_pre, mm).unwrap();
        compare(
            &format!("{name} out (tanh.approx)"),
            &got_out,
            &want_out,
            |i| 1.13 * mm(i) + gelu_bound(got_pre[i]),
        )
        .unwrap();
    }

    /// `dpre = (dy·w) ⊙ GELU'(pre)` with `w` the transposed `[n, k]` weight, as the MLP's
    /// backward passes it; `pre` and `dpre` with one float of room after them.
    fn run_matmul_gelu_backward<B: Backend>(
        be: &B,
        (dy, w, pre): (&[f32], &[f32], &[f32]),
        (m, k, n): (usize, usize, usize),
    ) -> Vec<f32> {
        let (db, wb, pb) = (buf(be, dy), buf(be, w), buf(be, pre));
        let out = buf(be, &vec![f32::NAN; m * n + 1]);
        be.matmul_gelu_backward(
            View::new(&db, 0, [m, k]).mat(),
            View::new(&wb, 0, [n, k]).mat().t(),
            View::new(&pb, 0, [m, n]),
            View::new(&out, 0, [m, n]),
        )
        .expect("matmul_gelu_backward");
        let mut got = read(be, &out);
        got.truncate(m * n);
        got
    }

    /// The fused GELU backward against the CPU in every matmul precision and both GELU
    /// modes (tanhf, tanh.approx), with split-K off and on (3 slices), fused and as product +
    /// separate gelu_backward (`set_fused_gelu_backward(false)`, what it replaces). 130 × 192
    /// × 1000: a half-empty last row and column tile. Returns an error instead of panicking
    /// so the planted fault below can show it fails.
    fn matmul_gelu_backward_case(
        gpu: &mut CudaBackend,
        label: &str,
        splits: &[SplitK],
        fused_modes: &[bool],
    ) -> Result<(), String> {
        let (m, k, n) = (130usize, 1000usize, 192usize);
        let s = 1.0 / (k as f32).sqrt();
        let dy = data(21, m * k, -s, s);
        let w = data(22, n * k, -s, s);
        let mut pre = data(23, m * n + 1, -8.0, 8.0);
        pre[m * n] = 0.0;
        let want = run_matmul_gelu_backward(&cpu(), (&dy, &w, &pre), (m, k, n));
        let p = gpu.precision();
        let u_op = unit_roundoff(p.matmul);
        let product = |idx: usize| -> (f64, f64) {
            let (i, j) = (idx / n, idx % n);
            let terms = (0..k).map(|kk| (dy[i * k + kk] as f64, w[j * k + kk] as f64));
            terms.fold((0.0, 0.0), |(g, mag), (a, b)| {
                (g + a * b, mag + (a * b).abs())
            })
        };
        let bound = |idx: usize| {
            let (g, mag) = product(idx);
            let mm = 2.0 * ((2.0 * u_op + 2.0 * k as f64 * U24) * mag + 1e-6);
            let gelu = if p.approx_tanh {
                gelu_grad_bound(pre[idx], g as f32)
            } else {
                2.0 * (4e-6 + 2e-5) * g.abs()
            };
            1.13 * mm + gelu
        };
        for &split in splits {
            for &fused in fused_modes {
                gpu.set_split_k(split);
                gpu.set_fused_gelu_backward(fused);
                let got = run_matmul_gelu_backward(&*gpu, (&dy, &w, &pre), (m, k, n));
                let name = format!("matmul_gelu_backward {label} {split:?} fused {fused}");
                compare(&name, &got, &want, bound)?;
            }
        }
        Ok(())
    }

    #[test]
    fn matmul_gelu_backward_vs_cpu() {
        let tf32_exact = Precision {
            matmul: MatmulPrecision::Tf32,
            approx_tanh: false,
        };
        for (label, precision) in [
            ("FP32, tanhf", Precision::FP32),
            ("TF32, tanh.approx", Precision::FAST),
            ("TF32, tanhf", tf32_exact),
            ("BF16, tanh.approx", Precision::BF16),
        ] {
            let Some(mut gpu) = cuda("matmul_gelu_backward_vs_cpu", precision) else {
                return;
            };
            let splits = [SplitK::Off, SplitK::Fixed(3)];
            matmul_gelu_backward_case(&mut gpu, label, &splits, &[true, false]).unwrap();
        }
    }

    /// A planted fault (the epilogue reads GELU' of the next element of `pre`) fails the
    /// same comparison, split and unsplit.
    #[test]
    fn matmul_gelu_backward_planted_fault_is_caught() {
        let Some(mut gpu) = cuda(
            "matmul_gelu_backward_planted_fault_is_caught",
            Precision::FAST,
        ) else {
            return;
        };
        gpu.plant_gelu_backward_fault(true);
        for split in [SplitK::Off, SplitK::Fixed(3)] {
            let err =
                matmul_gelu_backward_case(&mut gpu, "with a planted fault", &[split], &[true])
                    .expect_err("the misplaced GELU' must fail the comparison");
            assert!(err.contains("out of tolerance"), "{err}");
        }
    }

    // ---- attention on tensor cores ----------------------------------------------------------
    //
    // The tensor-core attention kernels (kernels/attention_mma.cu) against the float64
    // reference, with a bound derived per element from the operand format (u = 2⁻¹¹ TF32,
    // 2⁻⁸ BF16): `andrea_testkit::tol::operands` (the derivation is in its docs; the
    // conformance suite's TF32 / BF16 attention runs use the same), plus the FP32 tolerance
    // of the suite (`tol::attention_out` / `attention_grad`) for the FP32 sums. Shapes: head sizes 32, 64
    // and 128, T not a multiple of any tile, pos_offset > 0 (a KV cache), views at an offset
    // that is not 16-byte aligned (the 4-byte cp.async path), strided q/k/v (split from one
    // [B, T, 3C] buffer) in the backward. Small: the emulator runs these.

    use andrea_core::{AttentionShape, Heads};
    use andrea_cuda::AttentionKernels;
    use andrea_testkit::{reference, tol};

    struct AttCase {
        b: usize,
        tq: usize,
        h: usize,
        d: usize,
        pos: usize,
    }

    /// `(batch, query positions, heads, head size, pos_offset)`.
    fn att(b: usize, tq: usize, h: usize, d: usize, pos: usize) -> AttCase {
        AttCase { b, tq, h, d, pos }
    }

    impl AttCase {
        fn tk(&self) -> usize {
            self.pos + self.tq
        }
    }

    fn f64s(x: &[f32]) -> Vec<f64> {
        x.iter().map(|&v| v as f64).collect()
    }

    /// Runs the forward on `be` with q [B, Tq, H, D] and k, v [B, Tk, H, D], each view at
    /// element `offset` of its buffer; returns out and the lse workspace.
    fn att_forward_on<B: Backend>(
        be: &B,
        c: &AttCase,
        q: &[f32],
        k: &[f32],
        v: &[f32],
        offset: usize,
    ) -> (Vec<f32>, Vec<f32>) {
        let cc = c.h * c.d;
        let pad = |x: &[f32]| [vec![0.5; offset], x.to_vec()].concat();
        let (qb, kb, vb) = (buf(be, &pad(q)), buf(be, &pad(k)), buf(be, &pad(v)));
        let ob = buf(be, &vec![0.0; offset + c.b * c.tq * cc]);
        let shape = AttentionShape {
            batch: c.b,
            heads: c.h,
            head_dim: c.d,
            q_len: c.tq,
            k_len: c.tk(),
        };
        let ws = buf(be, &vec![0.0; be.attention_workspace_len(shape)]);
        fn hv<M: andrea_core::DeviceMemory>(
            b: &M,
            offset: usize,
            dims: [usize; 3],
            heads: usize,
        ) -> Heads<'_, M> {
            Heads::from_tensor(View::new(b, offset, dims), heads).unwrap()
        }
        let (dq_, dk_) = ([c.b, c.tq, cc], [c.b, c.tk(), cc]);
        be.attention_forward(
            hv(&qb, offset, dq_, c.h),
            hv(&kb, offset, dk_, c.h),
            hv(&vb, offset, dk_, c.h),
            hv(&ob, offset, dq_, c.h),
            View::whole(&ws),
            c.pos,
        )
        .expect("attention_forward");
        (read(be, &ob)[offset..].to_vec(), read(be, &ws))
    }

    /// Inputs of a forward case from `seed` (q [B, Tq, H, D], k, v [B, Tk, H, D] in
    /// [-1, 1]), as f64, and the reference out.
    type AttInputs = ([Vec<f32>; 3], [Vec<f64>; 3], Vec<f64>);

    fn att_inputs(c: &AttCase, seed: u64) -> AttInputs {
        let nq = c.b * c.tq * c.h * c.d;
        let nk = c.b * c.tk() * c.h * c.d;
        let x = [
            data(seed, nq, -1.0, 1.0),
            data(seed + 1, nk, -1.0, 1.0),
            data(seed + 2, nk, -1.0, 1.0),
        ];
        let xd = [f64s(&x[0]), f64s(&x[1]), f64s(&x[2])];
        let mut want = vec![0.0; nq];
        let dims = (c.b, c.tq, c.tk(), c.h, c.d);
        reference::attention_forward(&mut want, &xd[0], &xd[1], &xd[2], dims, c.pos);
        (x, xd, want)
    }

    fn att_forward_check(
        name: &str,
        gpu: &andrea_cuda::CudaBackend,
        c: &AttCase,
        u: f64,
        offset: usize,
        seed: u64,
    ) -> Result<(), String> {
        let ([q, k, v], [qd, kd, vd], want) = att_inputs(c, seed);
        let dims = (c.b, c.tq, c.tk(), c.h, c.d);
        let bound = tol::operands::attention_out(dims, c.pos, &qd, &kd, &vd, u);
        let (got, _) = att_forward_on(gpu, c, &q, &k, &v, offset);
        let want32: Vec<f32> = want.iter().map(|&x| x as f32).collect();
        let t32 = tol::attention_out(c.tk(), c.d);
        compare(name, &got, &want32, |i| bound[i] + t32.bound(want[i]))
    }

    fn att_backward_check(
        name: &str,
        gpu: &andrea_cuda::CudaBackend,
        c: &AttCase,
        u: f64,
        seed: u64,
    ) -> Result<Vec<f32>, String> {
        let (b, t, h, d) = (c.b, c.tq, c.h, c.d);
        let cc = h * d;
        let qkv = data(seed, b * t * 3 * cc, -1.0, 1.0);
        let dout = data(seed + 1, b * t * cc, -1.0, 1.0);
        // Dense [B, T, H, D] copies of q, k, v for the reference.
        let part = |s: usize| -> Vec<f64> {
            (0..b * t)
                .flat_map(|r| qkv[r * 3 * cc + s * cc..r * 3 * cc + (s + 1) * cc].to_vec())
                .map(|x| x as f64)
                .collect()
        };
        let (q, k, v, g) = (part(0), part(1), part(2), f64s(&dout));
        let n = b * t * cc;
        let (mut dq, mut dk, mut dv) = (vec![0.0; n], vec![0.0; n], vec![0.0; n]);
        reference::attention_backward(&mut dq, &mut dk, &mut dv, &g, &q, &k, &v, (b, t, h, d));
        let [bq, bk, bv] = tol::operands::attention_grads((b, t, h, d), &q, &k, &v, &g, u);
        let got = attention_pass(gpu, &qkv, &dout, b, t, h, d).swap_remove(1);
        // d(qkv) rows are [dq | dk | dv] per position.
        let mut want = vec![0.0f64; b * t * 3 * cc];
        let mut bound = vec![0.0f64; b * t * 3 * cc];
        for r in 0..b * t {
            for (s, (w, bb)) in [(&dq, &bq), (&dk, &bk), (&dv, &bv)].into_iter().enumerate() {
                for x in 0..cc {
                    want[r * 3 * cc + s * cc + x] = w[r * cc + x];
                    bound[r * 3 * cc + s * cc + x] = bb[r * cc + x];
                }
            }
        }
        let want32: Vec<f32> = want.iter().map(|&x| x as f32).collect();
        let t32 = tol::attention_grad(t, d);
        compare(name, &got, &want32, |i| bound[i] + t32.bound(want[i]))?;
        Ok(got)
    }

    fn attention_mma_vs_reference(name: &str, precision: Precision) {
        let Some(gpu) = cuda(name, precision) else {
            return;
        };
        assert_eq!(gpu.attention_kernels(), AttentionKernels::Auto);
        let u = unit_roundoff(precision.matmul);
        let fwd = [
            // (case, view offset): D = 64 past two key tiles; D = 128 with a KV cache
            // (pos_offset 29, Tk = 66); D = 32 at an unaligned offset, two batch entries.
            (att(1, 70, 2, 64, 0), 0),
            (att(1, 37, 1, 128, 29), 0),
            (att(2, 45, 1, 32, 3), 2),
        ];
        for (i, (c, off)) in fwd.iter().enumerate() {
            att_forward_check(
                &format!("{name} forward {i}"),
                &gpu,
                c,
                u,
                *off,
                40 + i as u64,
            )
            .unwrap();
        }
        let bwd = [
            att(1, 70, 2, 64, 0),
            att(1, 37, 1, 128, 0),
            att(2, 45, 1, 32, 0),
        ];
        for (i, c) in bwd.iter().enumerate() {
            let first =
                att_backward_check(&format!("{name} backward {i}"), &gpu, c, u, 50 + i as u64)
                    .unwrap();
            if i == 0 {
                // Deterministic: a second run is bit-identical.
                let again =
                    att_backward_check(&format!("{name} backward again"), &gpu, c, u, 50).unwrap();
                assert!(
                    first
                        .iter()
                        .zip(&again)
                        .all(|(a, b)| a.to_bits() == b.to_bits()),
                    "{name}: runs differ"
                );
            }
        }
    }

    #[test]
    fn attention_mma_tf32_vs_reference() {
        attention_mma_vs_reference("attention_mma_tf32_vs_reference", Precision::FAST);
    }

    #[test]
    fn attention_mma_bf16_vs_reference() {
        attention_mma_vs_reference("attention_mma_bf16_vs_reference", Precision::BF16);
    }

    /// A causal mask shifted by one key (query t also sees key t + 1) fails the forward
    /// check, and the SIMT kernels forced under BF16 pass it (they are FP32).
    #[test]
    fn attention_mma_planted_mask_fault_is_caught() {
        let name = "attention_mma_planted_mask_fault_is_caught";
        let Some(mut gpu) = cuda(name, Precision::BF16) else {
            return;
        };
        let u = unit_roundoff(MatmulPrecision::Bf16);
        let c = att(1, 40, 1, 64, 0);
        att_forward_check(name, &gpu, &c, u, 0, 7).unwrap();
        gpu.plant_attention_fault(true);
        let e = att_forward_check(name, &gpu, &c, u, 0, 7).unwrap_err();
        assert!(e.contains("out of tolerance"), "{e}");
        gpu.set_attention_kernels(AttentionKernels::Simt);
        att_forward_check(name, &gpu, &c, u, 0, 7).unwrap();
    }

    // ---- the split-KV decode forward ------------------------------------------------------
    //
    // kernels/attention_decode.cu, which generation's few-row steps run in every precision
    // (FP32 arithmetic), against the float64 reference within the suite's FP32 tolerance
    // (`tol::attention_out`), out and the lse it leaves in the workspace. The lse bound:
    // each score is a D-term sum of products of values in [-1, 1] scaled by 1/sqrt(D)
    // (absolute error <= D·sqrt(D)·2⁻²⁴), the sum over Tk keys adds Tk·2⁻²⁴ relative, which
    // the log turns absolute, plus a few roundings of exp and log: 4·(D·sqrt(D) + Tk + 8)·2⁻²⁴
    // (×4 headroom). On the emulator's one SM the plan splits these caches into 3 or 4
    // chunks (asserted), the last one partial, and in the third case one the first two
    // rows cannot see at all.

    use andrea_cuda::plan::decode;
    use andrea_cuda::DecodeAttention;

    /// Reference lse of every query row, in `[B, H, Tq]` order.
    fn att_lse(c: &AttCase, q: &[f64], k: &[f64]) -> Vec<f64> {
        let (h, d, scale) = (c.h, c.d, 1.0 / (c.d as f64).sqrt());
        let mut lse = Vec::new();
        for bi in 0..c.b {
            for hi in 0..h {
                for i in 0..c.tq {
                    let qi = ((bi * c.tq + i) * h + hi) * d;
                    let s: Vec<f64> = (0..=c.pos + i)
                        .map(|j| {
                            let kj = ((bi * c.tk() + j) * h + hi) * d;
                            scale * (0..d).map(|e| q[qi + e] * k[kj + e]).sum::<f64>()
                        })
                        .collect();
                    let m = s.iter().fold(f64::NEG_INFINITY, |a, &b| a.max(b));
                    lse.push(m + s.iter().map(|x| (x - m).exp()).sum::<f64>().ln());
                }
            }
        }
        lse
    }

    /// The decode forward of case `c` checked against the reference; returns out.
    fn decode_check(
        name: &str,
        gpu: &CudaBackend,
        c: &AttCase,
        offset: usize,
        seed: u64,
    ) -> Result<Vec<f32>, String> {
        let dims = andrea_core::check::AttentionDims {
            batch: c.b,
            heads: c.h,
            head_dim: c.d,
            q_len: c.tq,
            k_len: c.tk(),
        };
        // Split when switched on (the cases are chosen so), whatever the precision.
        let plan = decode::decode(&dims, gpu.multiprocessors()).unwrap();
        assert!(plan.is_some_and(|p| p.chunks >= 3), "{name}: {plan:?}");
        let ([q, k, v], [qd, kd, _], want) = att_inputs(c, seed);
        let (got, ws) = att_forward_on(gpu, c, &q, &k, &v, offset);
        let t = tol::attention_out(c.tk(), c.d);
        t.check(&format!("{name}: out"), &got, &want)?;
        let lse = att_lse(c, &qd, &kd);
        let sd = (c.d as f64).sqrt();
        let tl = tol::Tol::new(4.0 * U24 * (c.d as f64 * sd + c.tk() as f64 + 8.0), 0.0);
        tl.check(&format!("{name}: lse"), &ws[..lse.len()], &lse)?;
        Ok(got)
    }

    /// (case, view offset): Tq 1 over 70 keys (3 chunks of 32, the last of 6), D 64;
    /// Tq 3 over 100 keys (4 chunks, the last of 4), D 32, two batch entries, views at an
    /// odd offset; Tq 3 over 65 keys, whose last chunk (one key) rows 0 and 1 cannot see.
    fn decode_cases() -> [(AttCase, usize); 3] {
        [
            (att(1, 1, 2, 64, 69), 0),
            (att(2, 3, 1, 32, 97), 3),
            (att(1, 3, 1, 32, 62), 0),
        ]
    }

    /// In BF16 (the precision generation runs in on a GPU) the decode kernels meet the FP32
    /// tolerance; a rerun is bit-identical; with the split off the row-tiled kernels run.
    #[test]
    fn attention_decode_split_vs_reference() {
        let name = "attention_decode_split_vs_reference";
        let Some(gpu) = cuda(name, Precision::BF16) else {
            return;
        };
        assert_eq!(gpu.decode_attention(), DecodeAttention::Split);
        for (i, (c, off)) in decode_cases().iter().enumerate() {
            let first = decode_check(&format!("{name} {i}"), &gpu, c, *off, 60 + i as u64).unwrap();
            let again = decode_check(&format!("{name} {i} again"), &gpu, c, *off, 60 + i as u64);
            assert!(
                first
                    .iter()
                    .zip(&again.unwrap())
                    .all(|(a, b)| a.to_bits() == b.to_bits()),
                "{name}: runs differ"
            );
        }
        // Off: the same cases on the SIMT kernels (FP32) pass the FP32 bound as well.
        let mut fp32 = cuda(name, Precision::FP32).unwrap();
        fp32.set_decode_attention(DecodeAttention::Off);
        for (i, (c, off)) in decode_cases().iter().enumerate() {
            decode_check(&format!("{name} off {i}"), &fp32, c, *off, 60 + i as u64).unwrap();
        }
    }

    /// A chunk boundary off by one (each chunk reads one key past its end) and a combine
    /// that drops the last chunk each fail the check.
    #[test]
    fn attention_decode_planted_faults_are_caught() {
        let name = "attention_decode_planted_faults_are_caught";
        let Some(mut gpu) = cuda(name, Precision::FP32) else {
            return;
        };
        let (c, off) = &decode_cases()[0];
        decode_check(name, &gpu, c, *off, 7).unwrap();
        for fault in [1, 2] {
            gpu.plant_decode_fault(fault);
            let e = decode_check(name, &gpu, c, *off, 7).unwrap_err();
            assert!(e.contains("out of tolerance"), "fault {fault}: {e}");
        }
        gpu.plant_decode_fault(0);
        decode_check(name, &gpu, c, *off, 7).unwrap();
    }
}
