//! The whole model on `CudaBackend` against `CpuBackend`: one training step (the loss,
//! the logits, every parameter's gradient, every parameter after the AdamW step) and a
//! generation step (KV-cache prefill of a prompt, then decoding one token at a time), from
//! the same seed, in FP32 and in the tensor-core precisions (TF32 or BF16, hardware tanh;
//! attention on the tensor-core kernels, head size 32).
//!
//! The model: vocabulary 500 (padded to 512), context 64, d_model 128, 2 blocks of 4
//! heads, batch 2 × 64 tokens. Small enough for the CPU emulator (a few seconds), large
//! enough that in the TF32 precision the QKV, MLP, output-layer and weight-gradient
//! products cross the tensor-core threshold (M, N >= 64 and 2²² multiply-adds): 128
//! tokens × 128 × 384 is 6.3M.
//!
//! Tolerances are `abs + rel·|cpu|`, with `abs` a fraction of the largest `|cpu|` of the
//! tensor compared (`scale`): errors here are rounding errors of sums, which are relative
//! to the sizes of the terms, not to the result, so a gradient element that cancels to
//! near zero carries the error of the tensor's large elements. Why these values:
//!
//! * FP32 (`u = 2⁻²⁴`): both backends round the same math in different orders (the GPU's
//!   tiled sums, its warp reductions and its online softmax versus the CPU's blocked GEMM
//!   and sequential rows), so the difference is about twice either side's error. The
//!   longest sums are 512 terms (the MLP's second product, the softmax over the padded
//!   vocabulary), whose worst case is `512·u ≈ 3e-5` of the terms' magnitude; rounding
//!   errors of random sign grow like `√K·u`, which leaves room for the backward pass
//!   feeding each layer's error into the next. `abs = 3e-5·scale`, `rel = 3e-5`; the loss
//!   (a mean over 128 tokens, summed in f64 on the host) to `1e-6` relative.
//! * BF16 (8-bit significands, `u_op = 2⁻⁸`, 8× TF32's): the same reasoning, 8× the
//!   TF32 tolerances: `abs = 4e-2·scale`, `rel = 4e-2`, the loss to `1.6e-3`.
//! * TF32 (operands rounded to 10-bit mantissas, `u_op = 2⁻¹¹`): each tensor-core product
//!   has relative error up to `2·u_op ≈ 1e-3` of `Σ|a|·|b|`, on top of FP32 sums, and
//!   `tanh.approx.f32` adds 2⁻¹¹ relative in every GELU; the backward pass goes through
//!   twice as many products as the forward. `abs = 5e-3·scale`, `rel = 5e-3` (5× one
//!   product's worst case); the loss, a mean whose errors average out, to `2e-4`.
//! * Parameters after the AdamW step: the first step moves every weight by
//!   `lr·g/(|g| + eps)` (bias correction makes `m̂ = g`, `v̂ = g²`), which flips sign with
//!   `g`, so two gradients that agree within tolerance but straddle zero give weights
//!   `2·lr` apart. The comparison therefore takes the CPU's new weights, moves them by
//!   `lr·(u(g_cuda) − u(g_cpu))` (`u(g) = g/(|g| + eps)`, in float64, from the gradients
//!   both backends produced, which were compared above), and then allows only the
//!   step's own f32 roundings: the update goes through about 8 of them on each side (m,
//!   v, two bias corrections, sqrt, eps, the division, lr), `abs = 32·u·lr` (×2 headroom),
//!   and the decay and the subtraction round the weight, `rel = 8·u`.
//!
//! Measured on the CPU emulator (`ANDREA_TOL_REPORT=1`, see `andrea_testkit::tol`;
//! `CUDA_LIBRARY_PATH=$PWD/target/cuda-emu ANDREA_TOL_REPORT=1 cargo test -p andrea-cuda
//! --features cuda --test model_vs_cpu -- --nocapture`), the worst `|diff| / bound`: FP32
//! gradients and logits 0.02, TF32 gradients and logits 0.16, weights after AdamW 0.25
//! (where `|p|` is near 0 and the update's roundings dominate). A GPU rounds its sums in
//! yet another order (and its tensor cores' internal sums are not modelled), hence the
//! headroom; the emulator cannot show how much of it a GPU uses: `cargo xtask gpu-bundle`.
//! The tests do fail on small faults (planted in `kernels/` by hand, emulator rebuilt, not
//! committed): GELU's derivative 0.1% off fails the FP32 training step (24 gradients),
//! AdamW's eps doubled fails both training steps, GELU's forward 0.1% off fails the FP32
//! generation.
//!
//! `training_step_fp32_op_by_op` runs the same forward and backward on
//! `andrea_testkit::compare::Compare<CpuBackend, CudaBackend>`, which compares every op's
//! outputs as they are made, with the FP32 tolerances, and names the first op that
//! differs: where the whole-step test says that something differs, it says where.
//!
//! `training_step_waits_for_the_device_once` counts, on the emulator, the driver calls a
//! whole `Trainer::train_step` makes once warm (see its doc).
//!
//! With the link stub (no device) every test prints `SKIPPED` and passes
//! (`ANDREA_REQUIRE_DEVICE=1` makes it fail).

andrea_testkit::tests_need_feature!("cuda", "a device or the emulator: see .ci/run");

#[cfg(feature = "cuda")]
mod common;

/// The tests, which need the `cuda` feature.
#[cfg(feature = "cuda")]
mod tests {
    use crate::common;

    use andrea_core::{Backend, ModelConfig, OptimizerConfig, IGNORE_INDEX};
    use andrea_cuda::{MatmulImpl, Precision, SplitK};
    use andrea_model::{MemoryPlan, Model, Trainer};
    use andrea_testkit::compare::Compare;
    use andrea_testkit::device::Skipped;
    use andrea_testkit::Tol;
    use common::{cpu, cuda, data};

    const U: f64 = 1.0 / 16_777_216.0;
    const SEED: u64 = 11;
    const BATCH: usize = 2;
    const SEQ: usize = 64;
    const LR: f32 = 1e-3;

    /// vocabulary, context, d_model, blocks, heads.
    fn config() -> ModelConfig {
        ModelConfig::new(500, 64, 128, 2, 4)
    }

    fn optimizer() -> OptimizerConfig {
        // No clipping: its scale would depend on the global norm, which differs slightly;
        // the comparison of the weights after the step is derived without it.
        OptimizerConfig {
            lr: LR,
            grad_clip: None,
            ..OptimizerConfig::default()
        }
    }

    /// Tolerances of one precision (see the module docs).
    struct Tols {
        loss_rel: f64,
        /// `abs` as a fraction of the tensor's largest |cpu| value.
        abs_of_scale: f64,
        rel: f64,
    }

    const FP32_TOLS: Tols = Tols {
        loss_rel: 1e-6,
        abs_of_scale: 3e-5,
        rel: 3e-5,
    };

    const TF32_TOLS: Tols = Tols {
        loss_rel: 2e-4,
        abs_of_scale: 5e-3,
        rel: 5e-3,
    };

    const BF16_TOLS: Tols = Tols {
        loss_rel: 1.6e-3,
        abs_of_scale: 4e-2,
        rel: 4e-2,
    };

    impl Tols {
        fn of(&self, reference: &[f32]) -> Tol {
            let scale = reference.iter().fold(0.0f32, |m, x| m.max(x.abs())) as f64;
            Tol::new(self.abs_of_scale * scale.max(1e-30), self.rel)
        }
    }

    fn to_f64(x: &[f32]) -> Vec<f64> {
        x.iter().map(|&v| v as f64).collect()
    }

    /// Token ids in `0..vocab` from `seed`.
    fn ids(seed: u64, n: usize, vocab: usize) -> Vec<u32> {
        data(seed, n, 0.0, vocab as f32)
            .into_iter()
            .map(|x| (x as u32).min(vocab as u32 - 1))
            .collect()
    }

    struct StepResult {
        loss: f32,
        logits: Vec<f32>,
        /// Per parameter, in transformers' order: (name, gradient, value after the step).
        params: Vec<(String, Vec<f32>, Vec<f32>)>,
    }

    fn train_step<B: Backend>(be: B) -> StepResult {
        let cfg = config();
        let tokens = ids(1, BATCH * SEQ, cfg.vocab_size);
        let mut targets = ids(2, BATCH * SEQ, cfg.vocab_size);
        // Some positions without a target: their rows must add nothing.
        for t in targets.iter_mut().step_by(17) {
            *t = IGNORE_INDEX;
        }
        let model = Model::new(be, cfg, SEED).expect("model");
        let mut tr = Trainer::new(model, optimizer(), BATCH, SEQ).expect("trainer");
        let loss = tr.forward(&tokens, &targets).expect("forward");
        let logits = tr.logits().expect("logits");
        tr.backward().expect("backward");
        let names: Vec<String> = tr
            .model()
            .params()
            .iter()
            .map(|p| p.name().to_string())
            .collect();
        let grads: Vec<Vec<f32>> = names
            .iter()
            .map(|n| tr.read_grad(n).expect("read_grad"))
            .collect();
        tr.step(LR).expect("step");
        let params = names
            .into_iter()
            .zip(grads)
            .map(|(n, g)| {
                let p = tr.model().read_param(&n).expect("read_param");
                (n, g, p)
            })
            .collect();
        StepResult {
            loss,
            logits,
            params,
        }
    }

    /// The first AdamW step's normalised update `m̂/(sqrt(v̂) + eps) = g/(|g| + eps)`.
    fn adam_direction(g: f32, eps: f64) -> f64 {
        let g = g as f64;
        g / (g.abs() + eps)
    }

    fn training_step_vs_cpu(name: &str, precision: Precision, tols: &Tols) {
        let Some(gpu) = cuda(name, precision) else {
            return;
        };
        let want = train_step(cpu());
        let got = train_step(gpu);
        let mut failures = Vec::new();
        let loss_tol = Tol::new(1e-6, tols.loss_rel);
        if let Err(e) = loss_tol.check(&format!("{name}: loss"), &[got.loss], &[want.loss as f64]) {
            failures.push(e);
        }
        if let Err(e) = tols.of(&want.logits).check(
            &format!("{name}: logits"),
            &got.logits,
            &to_f64(&want.logits),
        ) {
            failures.push(e);
        }
        let eps = optimizer().eps as f64;
        let step_tol = Tol::new(32.0 * U * LR as f64, 8.0 * U);
        for ((pname, g_gpu, p_gpu), (_, g_cpu, p_cpu)) in got.params.iter().zip(&want.params) {
            if let Err(e) = tols.of(g_cpu).check(
                &format!("{name}: gradient of {pname}"),
                g_gpu,
                &to_f64(g_cpu),
            ) {
                failures.push(e);
            }
            // The CPU's new weights moved by the difference the two gradients make.
            let expected: Vec<f64> = (0..p_cpu.len())
                .map(|i| {
                    p_cpu[i] as f64
                        - LR as f64
                            * (adam_direction(g_gpu[i], eps) - adam_direction(g_cpu[i], eps))
                })
                .collect();
            if let Err(e) =
                step_tol.check(&format!("{name}: {pname} after AdamW"), p_gpu, &expected)
            {
                failures.push(e);
            }
        }
        assert!(
            failures.is_empty(),
            "{} checks failed:\n{}",
            failures.len(),
            failures.join("\n")
        );
    }

    #[test]
    fn training_step_fp32_vs_cpu() {
        training_step_vs_cpu("training_step_fp32_vs_cpu", Precision::FP32, &FP32_TOLS);
    }

    #[test]
    fn training_step_tf32_vs_cpu() {
        training_step_vs_cpu("training_step_tf32_vs_cpu", Precision::FAST, &TF32_TOLS);
    }

    #[test]
    fn training_step_bf16_vs_cpu() {
        training_step_vs_cpu("training_step_bf16_vs_cpu", Precision::BF16, &BF16_TOLS);
    }

    /// The forward and backward pass of `train_step` in lockstep on both backends: no op's
    /// outputs may differ beyond the FP32 tolerances (each op's inputs are its own backend's
    /// earlier outputs, so the step's accumulated rounding is allowed for, as above). The
    /// AdamW step is left out: its sign flips for gradients near zero (see the module docs).
    #[test]
    fn training_step_fp32_op_by_op() {
        let name = "training_step_fp32_op_by_op";
        let Some(gpu) = cuda(name, Precision::FP32) else {
            return;
        };
        let tol = Tol::new(FP32_TOLS.abs_of_scale, FP32_TOLS.rel);
        let be = Compare::new(cpu(), gpu, tol).abs_of_scale();
        let cfg = config();
        let tokens = ids(1, BATCH * SEQ, cfg.vocab_size);
        let targets = ids(2, BATCH * SEQ, cfg.vocab_size);
        let model = Model::new(be, cfg, SEED).expect("model");
        let mut tr = Trainer::new(model, optimizer(), BATCH, SEQ).expect("trainer");
        tr.forward(&tokens, &targets).expect("forward");
        tr.backward().expect("backward");
        if let Err(d) = tr.model().backend().agreement() {
            panic!("{name}: {d}");
        }
    }

    const PROMPT: usize = 40;
    const DECODE_STEPS: usize = 4;

    /// Prefill of a `[BATCH, PROMPT]` prompt, then `DECODE_STEPS` single tokens per
    /// sequence (fixed ids, so both backends see the same inputs): the logits after each.
    fn generation<B: Backend>(be: B) -> Vec<Vec<f32>> {
        let cfg = config();
        let vocab = cfg.vocab_size;
        let model = Model::new(be, cfg, SEED).expect("model");
        let mut cache = model
            .kv_cache(BATCH, PROMPT + DECODE_STEPS)
            .expect("kv_cache");
        let mut out = vec![model
            .extend(&mut cache, &ids(3, BATCH * PROMPT, vocab))
            .expect("prefill")
            .to_vec()];
        for step in 0..DECODE_STEPS {
            let next = ids(10 + step as u64, BATCH, vocab);
            out.push(model.extend(&mut cache, &next).expect("decode").to_vec());
        }
        out
    }

    fn generation_vs_cpu(name: &str, precision: Precision, tols: &Tols) {
        let Some(gpu) = cuda(name, precision) else {
            return;
        };
        let want = generation(cpu());
        let got = generation(gpu);
        let mut failures = Vec::new();
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            let what = if i == 0 {
                "prefill".to_string()
            } else {
                format!("decode step {i}")
            };
            if let Err(e) = tols
                .of(w)
                .check(&format!("{name}: logits after {what}"), g, &to_f64(w))
            {
                failures.push(e);
            }
        }
        assert!(failures.is_empty(), "{}", failures.join("\n"));
    }

    #[test]
    fn generation_fp32_vs_cpu() {
        generation_vs_cpu("generation_fp32_vs_cpu", Precision::FP32, &FP32_TOLS);
    }

    #[test]
    fn generation_tf32_vs_cpu() {
        generation_vs_cpu("generation_tf32_vs_cpu", Precision::FAST, &TF32_TOLS);
    }

    /// The calling thread's driver-call counts from the emulator (`andrea_emu_driver_counts`
    /// in xtask/cuda-emu/emu_runtime.cpp): synchronisations, device-to-host copies,
    /// host-to-device copies, allocations, frees, launches, and the launch count at the
    /// second-to-last and at the last synchronisation. `None` on a real driver, which has no
    /// such symbol.
    fn driver_counts() -> Option<[u64; 9]> {
        use std::ffi::{c_char, c_int, c_void};
        extern "C" {
            fn dlsym(handle: *mut c_void, symbol: *const c_char) -> *mut c_void;
        }
        // SAFETY: dlsym with RTLD_DEFAULT (null on glibc) and a NUL-terminated name.
        let f = unsafe { dlsym(std::ptr::null_mut(), c"andrea_emu_driver_counts".as_ptr()) };
        if f.is_null() {
            return None;
        }
        // SAFETY: the emulator defines it as `int (unsigned long long*, int)`.
        let f: extern "C" fn(*mut u64, c_int) -> c_int = unsafe { std::mem::transmute(f) };
        let mut out = [0u64; 9];
        f(out.as_mut_ptr(), 9);
        Some(out)
    }

    /// A warm `train_step` (one micro-batch, clipping on) waits for the device once, after
    /// everything it launches is queued: the forward and backward pass, the gradient norm,
    /// the clipping scale computed from it on the device (`clip_scale`) and AdamW reading
    /// that scale from device memory (`adamw_scaled`, one launch per weight-decay group).
    /// Then one device-to-host copy reads the losses and the step's statistics together:
    /// 1 stream synchronisation, 1 copy, no launch after the wait, and the previous wait is
    /// the warm-up step's. Reading the norm on the host before AdamW (as the step did before
    /// `clip_scale`) or the loss straight after the forward pass (as `forward_train` does)
    /// fails it. The host-to-device copies are the tokens, the targets and the embedding
    /// backward's sorted positions (3), all asynchronous from page-locked staging (uploading
    /// any of them from pageable memory fails it); nothing is allocated or freed (the scratch, the
    /// split-K workspace included, has grown in the warm-up step). Counted on the emulator;
    /// skipped on a real driver, where `ANDREA_CUDA_SYNC` is the tool.
    #[test]
    fn training_step_waits_for_the_device_once() {
        let name = "training_step_waits_for_the_device_once";
        let Some(gpu) = cuda(name, Precision::FAST) else {
            return;
        };
        if driver_counts().is_none() {
            Skipped::new(name, "the counts need the emulator's driver").print();
            return;
        }
        let cfg = config();
        let tokens = ids(1, BATCH * SEQ, cfg.vocab_size);
        let targets = ids(2, BATCH * SEQ, cfg.vocab_size);
        let model = Model::new(gpu, cfg, SEED).expect("model");
        let opt = OptimizerConfig {
            grad_clip: Some(1.0),
            ..optimizer()
        };
        let mut tr = Trainer::new(model, opt, BATCH, SEQ).expect("trainer");
        let batch: &[(&[u32], &[u32])] = &[(&tokens, &targets)];
        tr.train_step(batch, LR).expect("warm-up step");
        let before = driver_counts().unwrap();
        let (loss, _) = tr.train_step(batch, LR).expect("step");
        let after = driver_counts().unwrap();
        assert!(loss.is_finite());
        let d: Vec<u64> = after[..6].iter().zip(&before).map(|(a, b)| a - b).collect();
        let what = ["syncs", "DtoH", "HtoD", "allocs", "frees"];
        let want = [1, 1, 3, 0, 0];
        for i in 0..5 {
            assert_eq!(
                d[i], want[i],
                "{}: {d:?} (syncs, DtoH, HtoD, allocs, frees, launches)",
                what[i]
            );
        }
        assert_eq!(
            after[8] - before[8],
            3,
            "the token, target and sorted-position uploads should be async copies from \
             page-locked memory"
        );
        let (launches, at_prev, at_last) = (after[5], after[6], after[7]);
        assert_eq!(
            launches, at_last,
            "launches after the wait: it came before the step was queued"
        );
        assert_eq!(
            at_last - at_prev,
            d[5],
            "the previous wait should be the warm-up step's"
        );
        println!("{name}: one train_step = {} launches, {d:?}", d[5]);
    }

    /// The training memory plan counts the split-K workspace, the largest any of the step's
    /// products takes: planned as on an H200 (132 SMs) at ANDREA-120M, 16 × 1024 tokens, the
    /// LM head's weight gradient in slices of `[8512, 768]`: 8 with the WMMA kernels (one
    /// block per SM), 209 MB; 7 with the mma kernels (128x128 tiles, two per SM), 183 MB;
    /// nothing without split-K. Only sizes are computed: nothing runs.
    #[test]
    fn memory_plan_counts_the_split_k_workspace() {
        let Some(mut gpu) = cuda("memory_plan_counts_the_split_k_workspace", Precision::BF16)
        else {
            return;
        };
        let cfg = ModelConfig::new(8449, 1024, 768, 12, 12);
        gpu.plan_for_multiprocessors(132);
        gpu.set_matmul_impl(MatmulImpl::Mma);
        let mma = MemoryPlan::new(&gpu, &cfg, 16, 1024);
        assert_eq!(mma.scratch, 7 * 8512 * 768 * 4, "{mma}");
        gpu.set_matmul_impl(MatmulImpl::Wmma);
        let plan = MemoryPlan::new(&gpu, &cfg, 16, 1024);
        assert_eq!(plan.scratch, 8 * 8512 * 768 * 4, "{plan}");
        assert!(plan.to_string().contains("product scratch 199.5"), "{plan}");
        gpu.set_split_k(SplitK::Off);
        let unsplit = MemoryPlan::new(&gpu, &cfg, 16, 1024);
        assert_eq!(unsplit.scratch, 0);
        assert_eq!(plan.total() - unsplit.total(), plan.scratch);
    }

    /// The evaluation and generation plans count the split-K workspace of their forward
    /// products: planned as on an H200 (132 SMs) at ANDREA-120M, one sequence of 64
    /// positions, the MLP's second linear `[64, 3072]·[3072, 768]` (12 tiles of 64x64 on 528
    /// block slots) splits K into 3 slices of `[64, 768]`, the largest forward workspace
    /// (K = 768 never splits: under two 1024-long slices); generation meets it at the
    /// 64-position prefill chunk, and 3 slices of `[1, 768]` at each decode step. Nothing
    /// without split-K. Only sizes are computed: nothing runs.
    #[test]
    fn evaluation_and_generation_plans_count_the_split_k_workspace() {
        let name = "evaluation_and_generation_plans_count_the_split_k_workspace";
        let Some(mut gpu) = cuda(name, Precision::BF16) else {
            return;
        };
        let cfg = ModelConfig::new(8449, 1024, 768, 12, 12);
        gpu.plan_for_multiprocessors(132);
        gpu.set_matmul_impl(MatmulImpl::Mma);
        let want = 3 * 64 * 768 * 4;
        let eval = MemoryPlan::evaluation(&gpu, &cfg, 1, 64);
        let gen = MemoryPlan::generation(&gpu, &cfg, 1, 64);
        assert_eq!(eval.scratch, want, "{eval}");
        assert_eq!(gen.scratch, want, "{gen}");
        assert!(gen.to_string().contains("product scratch 0.6"), "{gen}");
        gpu.set_split_k(SplitK::Off);
        let (eval0, gen0) = (
            MemoryPlan::evaluation(&gpu, &cfg, 1, 64),
            MemoryPlan::generation(&gpu, &cfg, 1, 64),
        );
        assert_eq!((eval0.scratch, gen0.scratch), (0, 0));
        assert_eq!(eval.total() - eval0.total(), want);
        assert_eq!(gen.total() - gen0.total(), want);
    }

    #[test]
    fn generation_bf16_vs_cpu() {
        generation_vs_cpu("generation_bf16_vs_cpu", Precision::BF16, &BF16_TOLS);
    }

    /// `upload_ids` copies asynchronously from its page-locked staging, so a second upload
    /// into the same id buffer with no stream wait since the first must wait before it
    /// rewrites the staging (the first copy may still be reading it); after a wait it need
    /// not. Counted on the emulator. Dropping the wait (the staging rewritten while a copy
    /// may be in flight) fails it.
    #[test]
    fn upload_ids_waits_before_reusing_its_staging() {
        let name = "upload_ids_waits_before_reusing_its_staging";
        let Some(gpu) = cuda(name, Precision::FAST) else {
            return;
        };
        if driver_counts().is_none() {
            Skipped::new(name, "the counts need the emulator's driver").print();
            return;
        }
        use andrea_core::MemoryOps;
        let ids = gpu.alloc_ids(8).expect("ids");
        let view = andrea_core::View::whole(&ids);
        let syncs = || driver_counts().unwrap()[0];
        let s0 = syncs();
        gpu.upload_ids(&[1; 8], view).expect("first upload");
        assert_eq!(syncs(), s0, "the first upload waits for nothing");
        gpu.upload_ids(&[2; 8], view).expect("second upload");
        assert_eq!(
            syncs(),
            s0 + 1,
            "the second upload must wait for the first copy"
        );
        gpu.synchronize().expect("sync");
        gpu.upload_ids(&[3; 8], view).expect("after a wait");
        assert_eq!(
            syncs(),
            s0 + 2,
            "after a wait the staging is free: no second wait"
        );
    }

    /// Greedy text through the KV cache with the split-KV decode kernels: planned as on a
    /// GPU of 16 SMs, so that at batch 1 × 4 heads every step's cache (41 to 47 keys) splits
    /// into 2 chunks (asserted), the CUDA backend in FP32 picks the CPU's tokens; with the
    /// split off (the SIMT forward) too.
    #[test]
    fn greedy_text_with_split_decode_equals_cpu() {
        use andrea_cuda::plan::decode;
        use andrea_cuda::DecodeAttention;
        use andrea_model::Sampler;
        let name = "greedy_text_with_split_decode_equals_cpu";
        let Some(mut split) = cuda(name, Precision::FP32) else {
            return;
        };
        let cfg = config();
        let dims = andrea_core::check::AttentionDims {
            batch: 1,
            heads: cfg.n_head,
            head_dim: cfg.head_dim(),
            q_len: 1,
            k_len: PROMPT + 1,
        };
        split.plan_for_multiprocessors(16);
        assert_eq!(
            decode::decode(&dims, 16).unwrap().map(|p| p.chunks),
            Some(2)
        );
        let mut off = cuda(name, Precision::FP32).unwrap();
        off.plan_for_multiprocessors(16);
        off.set_decode_attention(DecodeAttention::Off);
        let prompt = ids(3, PROMPT, cfg.vocab_size);
        fn text<B: Backend>(be: B, prompt: &[u32]) -> Vec<u32> {
            let model = Model::new(be, config(), SEED).expect("model");
            model
                .generate(prompt, 8, &mut Sampler::greedy())
                .expect("generate")
        }
        let want = text(cpu(), &prompt);
        assert_eq!(text(split, &prompt), want, "split decode");
        assert_eq!(text(off, &prompt), want, "decode off");
    }

    /// The generation memory plan counts the decode partials (the KV cache's scratch holds
    /// the largest workspace of any row count it runs), whether or not the split is on:
    /// ANDREA-120M at batch 1 over 1024 positions, planned as on an H200 (132 SMs): 4 rows ×
    /// 12 heads × 32 chunks × (64 + 2) floats of partials past the lse.
    #[test]
    fn memory_plan_counts_the_decode_workspace() {
        use andrea_cuda::DecodeAttention;
        let name = "memory_plan_counts_the_decode_workspace";
        let Some(mut gpu) = cuda(name, Precision::BF16) else {
            return;
        };
        let cfg = ModelConfig::new(8449, 1024, 768, 12, 12);
        gpu.plan_for_multiprocessors(132);
        let on_cpu = MemoryPlan::generation(&cpu(), &cfg, 1, 1024);
        let plan = MemoryPlan::generation(&gpu, &cfg, 1, 1024);
        // The CPU's workspace is the lse of a 256-row prefill chunk, 12 × 256 floats.
        let decode = 4 * 12 * (1 + 32 * 66);
        assert!(
            plan.activations >= on_cpu.activations + 4 * (decode - 12 * 256),
            "{plan}\n{on_cpu}"
        );
        gpu.set_decode_attention(DecodeAttention::Off);
        assert_eq!(MemoryPlan::generation(&gpu, &cfg, 1, 1024), plan);
    }
}
