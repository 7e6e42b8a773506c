//! Correctness at production shapes and speed of the CUDA backend, for the GPU bundle's
//! `run.sh` (`cargo xtask gpu-bundle`). Every result is one JSON line on stdout:
//!
//! ```text
//! gpu_check gemm      [--tokens 16384] [--d-model 768] [--vocab 8512] [--reps 10]
//! gpu_check attention [--batch 16] [--seq 1024] [--heads 12] [--head-dim 64] [--reps 5]
//! gpu_check decode    [--batch 16] [--keys 1024] [--heads 12] [--head-dim 64] [--reps 5] [--inner 20]
//! gpu_check train     [--config andrea-120m.toml] [--batch 16] [--seq 1024] [--steps 2]
//! gpu_check loads
//! gpu_check agree     --checkpoint DIR --data SHARD [--prompt 16] [--tokens 48]
//! ```
//!
//! * `gemm`: the 11 products of an ANDREA-120M training step at `tokens = B·T` rows
//!   (forward, dX, dW with K = tokens, the LM head at the padded vocabulary 8512 whose last
//!   tile is half empty), timed in FP32, TF32 and BF16; TF32 and BF16 are checked against
//!   the FP32 kernel on the same GPU with the bound of `tests/cpu_vs_cuda.rs`:
//!   `|fast - fp32| <= 2·((2·u_op + 2·K·2⁻²⁴)·Σ_k |a_ik|·|b_kj| + 1e-6)`, where the
//!   magnitudes `Σ|a|·|b|` come from one more FP32 product of `|a|` and `|b|`. Each row
//!   says how many K slices the product ran in (`split_k`, as `ANDREA_CUDA_SPLIT_K`
//!   plans it, default auto) and, for a split product, its time unsplit
//!   (`unsplit_median_ms`). Then, per precision, the MLP's dX product with the GELU
//!   backward fused into its epilogue against the product + separate `gelu_backward`
//!   (`phase: gemm_epilogue`, `median_ms` fused, `unfused_median_ms`).
//!   TF32 and BF16 run twice, once per tensor-core kernel family
//!   (`kernel_impl`: `mma`, the default, and `wmma`), each row naming its `kernel`. An
//!   mma row also times the product with the direct fragment stores
//!   (`direct_median_ms`, against the default staged store's `median_ms`), which must
//!   give the same bits (`direct_bit_identical`).
//! * `attention`: forward and backward at `[B, T, 3C]`, timed per precision; every
//!   precision against the FP32 path, and the FP32 path against the CPU backend on the
//!   first sequence. Bounds below, at [`attention_tol`]. Each row names its kernels
//!   (`kernel`: `mma`, the tensor-core kernels TF32 and BF16 select, or `simt`); TF32 and
//!   BF16 are timed a second time on the SIMT kernels (`ANDREA_CUDA_ATTENTION=simt`), so
//!   one run compares old and new.
//! * `decode`: one generation step's attention (1 query over `--keys` cached keys) at batch
//!   1 and `--batch`, in BF16 and FP32, on the split-KV decode kernels
//!   (kernels/attention_decode.cu; `chunks` says into how many the keys were cut) and with
//!   them off (`ANDREA_CUDA_DECODE=off`: the row-tiled forward), `gb_per_s` the K/V
//!   bytes read per second; the two outputs checked against each other.
//! * `train`: training steps of a model from the same seed on the same synthetic batch in
//!   FP32, TF32 and BF16: loss and gradient norm per step side by side, and the first
//!   TF32 step repeated on a fresh model, which must give the same bits (the backend is
//!   deterministic by design).
//! * `loads`: how the kernel modules were loaded (embedded machine code or JIT-compiled
//!   PTX) and the driver's time for each.
//! * `agree`: a checkpoint's argmax on the CPU and on the GPU at each position of the same
//!   token sequence, teacher-forced, near-ties aside (`agree.rs`).
//!
//! Exit status 0 when every check passed, 1 when one failed, 2 on a usage or device error.
//! Needs `--features cuda`; the sizes are flags so the same binary runs on the emulator.

mod agree;

use std::collections::HashMap;
use std::process::ExitCode;
use std::time::Instant;

use andrea_core::config::{step_gemms, StepGemm};
use andrea_core::prelude::*;
use andrea_cpu::CpuBackend;
use andrea_cuda::plan::attention as att_plan;
use andrea_cuda::plan::decode as att_decode;
use andrea_cuda::plan::matmul as split_plan;
use andrea_cuda::{
    AttentionKernels, CudaBackend, DecodeAttention, MatmulImpl, MatmulPrecision, MmaStore,
    Precision, SplitK,
};
use andrea_model::{Config, Model, Trainer};
use andrea_testkit::tol::{self, Tol};

type Res<T> = Result<T, String>;

const PRECISIONS: [(&str, Precision); 3] = [
    ("fp32", Precision::FP32),
    ("tf32", Precision::FAST),
    ("bf16", Precision::BF16),
];
const U24: f64 = 1.0 / 16_777_216.0;

fn unit_roundoff(p: MatmulPrecision) -> f64 {
    match p {
        MatmulPrecision::Fp32 => U24,
        MatmulPrecision::Tf32 => 1.0 / 2048.0,
        MatmulPrecision::Bf16 => 1.0 / 256.0,
    }
}

/// Command-line flags `--name value`, read as numbers or text.
struct Flags(HashMap<String, String>);

impl Flags {
    fn parse(args: &[String]) -> Res<Self> {
        let mut map = HashMap::new();
        let mut it = args.iter();
        while let Some(a) = it.next() {
            let key = a
                .strip_prefix("--")
                .ok_or_else(|| format!("unexpected argument `{a}` (flags are --name value)"))?;
            let value = it.next().ok_or_else(|| format!("--{key} needs a value"))?;
            map.insert(key.to_string(), value.clone());
        }
        Ok(Flags(map))
    }
    fn usize(&self, key: &str, default: usize) -> Res<usize> {
        match self.0.get(key) {
            None => Ok(default),
            Some(v) => v
                .parse()
                .map_err(|_| format!("--{key} {v}: expected a whole number")),
        }
    }
    fn text(&self, key: &str, default: &str) -> String {
        self.0.get(key).cloned().unwrap_or_else(|| default.into())
    }
}

/// One JSON result line.
fn emit(v: serde_json::Value) {
    println!("{v}");
}

fn device<T>(what: &str) -> impl Fn(T) -> String + '_
where
    T: std::fmt::Display,
{
    move |e| format!("{what}: {e}")
}

fn backend(precision: Precision) -> Res<CudaBackend> {
    CudaBackend::with_precision(precision).map_err(device("starting the CUDA backend"))
}

/// Uniform values in `[-1, 1)` from a seed.
fn data(seed: u64, n: usize) -> Vec<f32> {
    andrea_testkit::random::Rand::new(seed).vec(n, -1.0, 1.0)
}

fn upload<B: Backend>(be: &B, host: &[f32]) -> Res<B::Buffer> {
    let b = be.alloc(host.len()).map_err(device("alloc"))?;
    be.upload(host, View::whole(&b)).map_err(device("upload"))?;
    Ok(b)
}

fn download<B: Backend>(be: &B, t: View<'_, B::Buffer>) -> Res<Vec<f32>> {
    let mut host = vec![0.0; t.numel()];
    be.download(t, &mut host).map_err(device("download"))?;
    Ok(host)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Median seconds of `reps` calls of `f` after 2 warm-ups, each ending with a synchronize.
fn time<B: Backend>(be: &B, reps: usize, mut f: impl FnMut() -> Res<()>) -> Res<f64> {
    let mut times = Vec::with_capacity(reps);
    for i in 0..reps + 2 {
        let t0 = Instant::now();
        f()?;
        be.synchronize().map_err(device("synchronize"))?;
        if i >= 2 {
            times.push(t0.elapsed().as_secs_f64());
        }
    }
    Ok(median(times))
}

/// The worst `|got - want| / bound(i)` and where; NaN where `want` is finite is infinite.
fn worst(got: &[f32], want: &[f32], bound: impl Fn(usize) -> f64) -> (f64, usize, f64) {
    let mut w = (0.0f64, 0usize, 0.0f64);
    for (i, (&g, &r)) in got.iter().zip(want).enumerate() {
        let err = (g as f64 - r as f64).abs();
        let ratio = if err.is_nan() {
            f64::INFINITY
        } else {
            err / bound(i)
        };
        if ratio > w.0 || (i == 0 && ratio.is_infinite()) {
            w = (ratio, i, err);
        }
    }
    w
}

// ---- GEMMs ----------------------------------------------------------------------------

fn mat<M: andrea_core::DeviceMemory>(buf: &M, rows: usize, cols: usize, t: bool) -> Matrix<'_, M> {
    if t {
        View::new(buf, 0, [cols, rows]).mat().t()
    } else {
        View::new(buf, 0, [rows, cols]).mat()
    }
}

fn gemm(flags: &Flags) -> Res<bool> {
    let bt = flags.usize("tokens", 16 * 1024)?;
    let reps = flags.usize("reps", 10)?.max(1);
    // The LM head at the padded vocabulary (8449 rounded up to a multiple of 64), as the
    // model runs it: its last column tile is half empty.
    let c = flags.usize("d-model", 768)?;
    let shapes = step_gemms(bt, c, 4 * c, flags.usize("vocab", 8512)?);
    // FP32 results and magnitudes, kept on the host for the fast precisions.
    let mut reference: Vec<(Vec<f32>, Vec<f32>)> = Vec::new();
    let mut ok = true;
    // FP32 first (the reference), then each fast precision with each kernel family.
    let runs = PRECISIONS.iter().flat_map(|&(label, precision)| {
        let imps: &[(&str, MatmulImpl)] = if precision == Precision::FP32 {
            &[("simt", MatmulImpl::Mma)]
        } else if precision.matmul == MatmulPrecision::Bf16 {
            // kernels/matmul_bf16.cu (the default) next to the kernels it replaces.
            &[
                ("bf16", MatmulImpl::Bf16),
                ("mma", MatmulImpl::Mma),
                ("wmma", MatmulImpl::Wmma),
            ]
        } else {
            &[("mma", MatmulImpl::Mma), ("wmma", MatmulImpl::Wmma)]
        };
        imps.iter()
            .map(move |&(il, imp)| (label, precision, il, imp))
    });
    for (label, precision, imp_label, imp) in runs {
        let mut be = backend(precision)?;
        be.set_matmul_impl(imp);
        for (idx, g) in shapes.iter().enumerate() {
            let StepGemm {
                name,
                m,
                k,
                n,
                a_transposed: ta,
                b_transposed: tb,
            } = *g;
            let a_host = data(2 * idx as u64 + 1, m * k);
            let b_host = data(2 * idx as u64 + 2, k * n);
            let (a, b) = (upload(&be, &a_host)?, upload(&be, &b_host)?);
            let c = be.alloc(m * n).map_err(device("alloc"))?;
            // The product on `be` (borrowed per call: the settings change between runs).
            let product = |be: &CudaBackend| {
                be.matmul(
                    mat(&a, m, k, ta),
                    mat(&b, k, n, tb),
                    None,
                    View::new(&c, 0, [m, n]).mat(),
                )
                .map_err(device(name))
            };
            let secs = time(&be, reps, || product(&be))?;
            let got = download(&be, View::whole(&c))?;
            let flops = 2.0 * (m * k * n) as f64;
            // Split-K as the backend plans it (ANDREA_CUDA_SPLIT_K, default auto); a split
            // product is timed unsplit too, so one run compares both.
            // The operands as `mat` lays them out (transposed: stored the other way round).
            let operand = |rows: usize, cols: usize, t: bool| split_plan::Operand {
                offset: 0,
                batch: 1,
                rows,
                cols,
                bs: 0,
                rs: if t { 1 } else { cols },
                cs: if t { rows } else { 1 },
            };
            let kernel = split_plan::choose_for(
                &operand(m, k, ta),
                &operand(k, n, tb),
                1,
                precision.matmul,
                imp,
                be.matmul_gpu(),
            );
            let slices = match be.split_k() {
                SplitK::Off => 1,
                SplitK::Auto => split_plan::split_count(m, n, k, 1, kernel, be.matmul_gpu()),
                SplitK::Fixed(s) => split_plan::split(m, n, k, kernel, s)
                    .map_err(device(name))?
                    .map_or(1, |s| s.slices),
            };
            let unsplit_ms = if slices > 1 {
                let policy = be.split_k();
                be.set_split_k(SplitK::Off);
                let t = time(&be, reps, || product(&be))?;
                be.set_split_k(policy);
                Some(t * 1e3)
            } else {
                None
            };
            // The mma kernels store their tile staged through shared memory (the default);
            // the same product with the direct fragment stores, timed in the same run,
            // must give the same bits (kernels/matmul_mma.cu: the expected gain).
            let direct = if matches!(
                kernel,
                split_plan::MatmulKernel::MmaTf32(_) | split_plan::MatmulKernel::MmaBf16(_)
            ) {
                let store = be.mma_store();
                be.set_mma_store(MmaStore::Direct);
                let t = time(&be, reps, || product(&be))?;
                let bits = download(&be, View::whole(&c))?;
                be.set_mma_store(store);
                let same = bits
                    .iter()
                    .zip(&got)
                    .all(|(x, y)| x.to_bits() == y.to_bits());
                Some((t * 1e3, same))
            } else {
                None
            };
            let mut row = serde_json::json!({
                "phase": "gemm", "name": name, "m": m, "k": k, "n": n,
                "precision": label, "backend": be.name(),
                "median_ms": secs * 1e3, "tflop_per_s": flops / secs / 1e12,
                "split_k": slices, "unsplit_median_ms": unsplit_ms,
                "kernel": kernel.launch_name(be.mma_store()), "kernel_impl": imp_label,
                "mma_store": be.mma_store().label(),
                "direct_median_ms": direct.map(|d| d.0),
                "direct_bit_identical": direct.map(|d| d.1),
            });
            if let Some((_, same)) = direct {
                ok &= same;
            }
            if precision == Precision::FP32 {
                let abs = |v: &[f32]| v.iter().map(|x| x.abs()).collect::<Vec<_>>();
                let (aa, ab) = (upload(&be, &abs(&a_host))?, upload(&be, &abs(&b_host))?);
                be.matmul(
                    mat(&aa, m, k, ta),
                    mat(&ab, k, n, tb),
                    None,
                    View::new(&c, 0, [m, n]).mat(),
                )
                .map_err(device(name))?;
                let mag = download(&be, View::whole(&c))?;
                let finite = got.iter().all(|x| x.is_finite());
                row["check"] = "finite".into();
                row["pass"] = finite.into();
                ok &= finite;
                reference.push((got, mag));
            } else {
                let (want, mag) = &reference[idx];
                let u = unit_roundoff(precision.matmul);
                let bound =
                    |i: usize| 2.0 * ((2.0 * u + 2.0 * k as f64 * U24) * mag[i] as f64 + 1e-6);
                let (ratio, at, err) = worst(&got, want, bound);
                let pass = ratio <= 1.0;
                ok &= pass;
                row["check"] = "vs fp32, 2((2u+2K·2^-24)Σ|a||b|+1e-6)".into();
                row["worst_err_over_bound"] = ratio.into();
                row["worst_abs_err"] = err.into();
                row["worst_at"] = serde_json::json!([at / n, at % n]);
                row["pass"] = pass.into();
            }
            emit(row);
        }
        // The fused-epilogue rows once per precision, on the default kernels.
        if imp_label != "wmma" {
            ok &= gelu_backward_epilogue(&mut be, label, bt, c, reps)?;
        }
    }
    Ok(ok)
}

/// The MLP's dX product through the GELU, `d_fc = (dy·W_projᵀ) ⊙ GELU'(fc_pre)` at
/// `[tokens, 4C]`, fused (GELU' in the epilogue) against the product + separate
/// `gelu_backward` it replaces, timed both ways; the two must agree to a few ulp (the
/// same product, GELU' applied in registers or after a round trip through memory).
fn gelu_backward_epilogue(
    be: &mut CudaBackend,
    label: &str,
    bt: usize,
    c: usize,
    reps: usize,
) -> Res<bool> {
    let name = "bwd_dx_fc_proj+gelu";
    let (m, k, n) = (bt, c, 4 * c);
    let (dy, w) = (upload(be, &data(91, m * k))?, upload(be, &data(92, n * k))?);
    let pre_host: Vec<f32> = data(93, m * n).iter().map(|x| 4.0 * x).collect();
    let pre = upload(be, &pre_host)?;
    let out = be.alloc(m * n).map_err(device("alloc"))?;
    let result = |be: &mut CudaBackend, fused: bool| -> Res<(f64, Vec<f32>)> {
        be.set_fused_gelu_backward(fused);
        let run = || {
            be.matmul_gelu_backward(
                View::new(&dy, 0, [m, k]).mat(),
                View::new(&w, 0, [n, k]).mat().t(),
                View::new(&pre, 0, [m, n]),
                View::new(&out, 0, [m, n]),
            )
            .map_err(device(name))
        };
        let secs = time(be, reps, run)?;
        Ok((secs, download(be, View::whole(&out))?))
    };
    let (unfused_s, want) = result(be, false)?;
    let (fused_s, got) = result(be, true)?;
    let (ratio, at, err) = worst(&got, &want, |i| 1e-6 + 8.0 * U24 * (want[i].abs() as f64));
    let pass = ratio <= 1.0;
    let flops = 2.0 * (m * k * n) as f64;
    emit(serde_json::json!({
        "phase": "gemm_epilogue", "name": name, "m": m, "k": k, "n": n,
        "precision": label, "backend": be.name(),
        "median_ms": fused_s * 1e3, "unfused_median_ms": unfused_s * 1e3,
        "fused_tflops": flops / fused_s / 1e12,
        "check": "fused vs product + gelu_backward, 1e-6 + 8·2^-24·|ref|",
        "worst_err_over_bound": ratio, "worst_abs_err": err,
        "worst_at": [at / n, at % n], "pass": pass,
    }));
    Ok(pass)
}

// ---- attention ------------------------------------------------------------------------

/// What one attention pass returns: `out`, then `d(qkv)` (dq, dk, dv interleaved as the
/// model stores them).
struct AttentionRun {
    out: Vec<f32>,
    dqkv: Vec<f32>,
    forward_s: f64,
    backward_s: f64,
}

fn attention_pass<B: Backend>(
    be: &B,
    shape: [usize; 4],
    qkv_host: &[f32],
    dout_host: &[f32],
    reps: usize,
) -> Res<AttentionRun> {
    let [b, t, h, d] = shape;
    let c = h * d;
    let qkv = upload(be, qkv_host)?;
    let dout = upload(be, dout_host)?;
    let out = be.alloc(b * t * c).map_err(device("alloc"))?;
    let dqkv = be.alloc(b * t * 3 * c).map_err(device("alloc"))?;
    let ashape = AttentionShape {
        batch: b,
        heads: h,
        head_dim: d,
        q_len: t,
        k_len: t,
    };
    let ws = be
        .alloc(be.attention_workspace_len(ashape).max(1))
        .map_err(device("alloc"))?;
    let scratch = be
        .alloc(be.attention_backward_scratch_len(ashape).max(1))
        .map_err(device("alloc"))?;
    let bad = |what: &str| format!("{what}: [{b}, {t}, {c}] does not split into {h} heads");
    let split =
        |buf| Heads::split_qkv(View::new(buf, 0, [b, t, 3 * c]), h).ok_or_else(|| bad("qkv"));
    let [q, k, v] = split(&qkv)?;
    let [dq, dk, dv] = split(&dqkv)?;
    let o = Heads::from_tensor(View::new(&out, 0, [b, t, c]), h).ok_or_else(|| bad("out"))?;
    let dov = Heads::from_tensor(View::new(&dout, 0, [b, t, c]), h).ok_or_else(|| bad("dout"))?;
    let forward_s = time(be, reps, || {
        be.attention_forward(q, k, v, o, View::whole(&ws), 0)
            .map_err(device("attention_forward"))
    })?;
    let backward_s = time(be, reps, || {
        be.attention_backward(
            q,
            k,
            v,
            o,
            dov,
            dq,
            dk,
            dv,
            View::whole(&ws),
            View::whole(&scratch),
        )
        .map_err(device("attention_backward"))
    })?;
    Ok(AttentionRun {
        out: download(be, View::whole(&out))?,
        dqkv: download(be, View::whole(&dqkv))?,
        forward_s,
        backward_s,
    })
}

/// The bound on the difference of two attention implementations, for the output and for
/// the gradients, at `t` keys and head size `d`, inputs in [-1, 1]:
///
/// * both in FP32: each is within `tol::attention_out` / `tol::attention_grad` of the
///   exact result (the conformance suite holds both backends to those), so they are
///   within twice that of each other;
/// * one with operands rounded to a format of unit roundoff `u` (TF32, BF16 tensor
///   cores): a score `q·k/sqrt(d)` moves by at most `2u·Σ_d|q||k|/sqrt(d) <= 2u·sqrt(d)`,
///   which moves each probability by at most `2·that` relative and the output (a convex
///   combination of values in [-1, 1]) by at most `4u·sqrt(d)`, plus `2u` from rounding P
///   and V; the gradients chain t- and d-term sums of the same terms, bounded coarsely by
///   `(1 + sqrt(d))` times the output's bound.
fn attention_tol(t: usize, d: usize, u: f64) -> (Tol, Tol) {
    let fp32_out = tol::attention_out(t, d);
    let fp32_grad = tol::attention_grad(t, d);
    let base_out = Tol::new(2.0 * fp32_out.abs, 2.0 * fp32_out.rel);
    let base_grad = Tol::new(2.0 * fp32_grad.abs, 2.0 * fp32_grad.rel);
    if u <= U24 {
        return (base_out, base_grad);
    }
    let sd = (d as f64).sqrt();
    let fast = 4.0 * u * sd + 2.0 * u;
    (
        Tol::new(base_out.abs + fast, base_out.rel),
        Tol::new(base_grad.abs + fast * (1.0 + sd), base_grad.rel),
    )
}

fn compare_row(
    name: &str,
    what: &str,
    got: &[f32],
    want: &[f32],
    tol: Tol,
) -> (serde_json::Value, bool) {
    let (ratio, at, err) = worst(got, want, |i| tol.bound(want[i] as f64));
    let pass = ratio <= 1.0;
    (
        serde_json::json!({
            "phase": "attention", "name": name, "check": what,
            "tol_abs": tol.abs, "tol_rel": tol.rel,
            "worst_err_over_bound": ratio, "worst_abs_err": err, "worst_at": at, "pass": pass,
        }),
        pass,
    )
}

fn attention(flags: &Flags) -> Res<bool> {
    let b = flags.usize("batch", 16)?;
    let t = flags.usize("seq", 1024)?;
    let h = flags.usize("heads", 12)?;
    let d = flags.usize("head-dim", 64)?;
    let reps = flags.usize("reps", 5)?.max(1);
    let c = h * d;
    let qkv = data(101, b * t * 3 * c);
    let dout = data(102, b * t * c);
    // Causal attention FLOPs as the kernels count them (full T×T): QKᵀ and PV forward,
    // 2.5x that backward.
    let flops = 4.0 * (b * h * t * t * d) as f64;
    let mut ok = true;
    let mut fp32: Option<AttentionRun> = None;
    for (label, precision) in PRECISIONS {
        let mut be = backend(precision)?;
        let dims = andrea_core::check::AttentionDims {
            batch: b,
            heads: h,
            head_dim: d,
            q_len: t,
            k_len: t,
        };
        let kernels = |be: &CudaBackend| -> Res<(&'static str, String)> {
            let ops = be.attention_kernels().operands(be.precision().matmul);
            let fwd = match ops {
                Some(o) => att_plan::mma_forward(&dims, o).map_err(device("plan"))?,
                None => None,
            };
            let bwd = match ops {
                Some(o) => att_plan::mma_backward(&dims, o).map_err(device("plan"))?,
                None => None,
            };
            let tag = if fwd.is_some() { "mma" } else { "simt" };
            let names = match (fwd, bwd) {
                (Some(f), Some([_, dkdv, dq])) => {
                    format!("{} {} {}", f.kernel, dkdv.kernel, dq.kernel)
                }
                (Some(f), None) => format!("{} (backward simt)", f.kernel),
                _ => "simt".into(),
            };
            Ok((tag, names))
        };
        let rows = |r: &AttentionRun, tag: &str, names: &str| {
            emit(serde_json::json!({
                "phase": "attention", "name": format!("forward_{b}x{t}x{h}x{d}"), "precision": label,
                "kernel": tag, "kernels": names,
                "median_ms": r.forward_s * 1e3, "tflop_per_s": flops / r.forward_s / 1e12,
            }));
            emit(serde_json::json!({
                "phase": "attention", "name": format!("backward_{b}x{t}x{h}x{d}"), "precision": label,
                "kernel": tag, "kernels": names,
                "median_ms": r.backward_s * 1e3, "tflop_per_s": 2.5 * flops / r.backward_s / 1e12,
            }));
        };
        let (tag, names) = kernels(&be)?;
        let r = attention_pass(&be, [b, t, h, d], &qkv, &dout, reps)?;
        rows(&r, tag, &names);
        if tag == "mma" {
            // The old kernels on the same GPU, for the comparison.
            be.set_attention_kernels(AttentionKernels::Simt);
            let old = attention_pass(&be, [b, t, h, d], &qkv, &dout, reps)?;
            rows(&old, "simt", "simt");
            be.set_attention_kernels(AttentionKernels::Auto);
        }
        match &fp32 {
            None => {
                // The FP32 path against the CPU backend on the first sequence.
                let cpu = CpuBackend::new();
                let per = t * 3 * c;
                let want = attention_pass(&cpu, [1, t, h, d], &qkv[..per], &dout[..t * c], 1)?;
                let (to, tg) = attention_tol(t, d, U24);
                for (what, got, want, tol) in [
                    ("fp32 out vs cpu", &r.out[..t * c], &want.out[..], to),
                    ("fp32 d(qkv) vs cpu", &r.dqkv[..per], &want.dqkv[..], tg),
                ] {
                    let (row, pass) = compare_row("attention_first_sequence", what, got, want, tol);
                    ok &= pass;
                    emit(row);
                }
                fp32 = Some(r);
            }
            Some(want) => {
                let (to, tg) = attention_tol(t, d, unit_roundoff(precision.matmul));
                for (what, got, want, tol) in [
                    (format!("{label} out vs fp32"), &r.out, &want.out, to),
                    (format!("{label} d(qkv) vs fp32"), &r.dqkv, &want.dqkv, tg),
                ] {
                    let (row, pass) = compare_row("attention", &what, got, want, tol);
                    ok &= pass;
                    emit(row);
                }
            }
        }
    }
    Ok(ok)
}

// ---- decode attention -----------------------------------------------------------------

/// One generation step's attention: 1 new query row per sequence over a cache of `tk`
/// keys, `[B, Tk, C]` keys and values, timed over `inner` back-to-back calls (a call is
/// microseconds; one synchronize per batch of calls). Returns out and seconds per call.
fn decode_pass(
    be: &CudaBackend,
    [b, tk, h, d]: [usize; 4],
    host: &[Vec<f32>; 3],
    reps: usize,
    inner: usize,
) -> Res<(Vec<f32>, f64)> {
    let c = h * d;
    let [q, k, v] = [
        upload(be, &host[0])?,
        upload(be, &host[1])?,
        upload(be, &host[2])?,
    ];
    let out = be.alloc(b * c).map_err(device("alloc"))?;
    let shape = AttentionShape {
        batch: b,
        heads: h,
        head_dim: d,
        q_len: 1,
        k_len: tk,
    };
    let ws = be
        .alloc(be.attention_workspace_len(shape).max(1))
        .map_err(device("alloc"))?;
    let bad = || format!("[{b}, {tk}, {c}] does not split into {h} heads");
    let hv = |buf, t: usize| Heads::from_tensor(View::new(buf, 0, [b, t, c]), h).ok_or_else(bad);
    let (qh, kh, vh, oh) = (hv(&q, 1)?, hv(&k, tk)?, hv(&v, tk)?, hv(&out, 1)?);
    let s = time(be, reps, || {
        for _ in 0..inner {
            be.attention_forward(qh, kh, vh, oh, View::whole(&ws), tk - 1)
                .map_err(device("attention_forward"))?;
        }
        Ok(())
    })?;
    Ok((download(be, View::whole(&out))?, s / inner as f64))
}

/// `decode`: the split-KV decode kernels against the row-tiled forward they replace
/// (`ANDREA_CUDA_DECODE=off`: the mma forward in BF16, the SIMT one in FP32) at batch 1
/// and `--batch`, 1 query over `--keys` cached keys: time, K/V bytes per second, and the
/// two outputs against each other (the split is FP32: within twice the FP32 tolerance of
/// the SIMT forward, within the operand bound of [`attention_tol`] of the mma one).
fn decode(flags: &Flags) -> Res<bool> {
    let batches = [1, flags.usize("batch", 16)?];
    let tk = flags.usize("keys", 1024)?.max(1);
    let h = flags.usize("heads", 12)?;
    let d = flags.usize("head-dim", 64)?;
    let reps = flags.usize("reps", 5)?.max(1);
    let inner = flags.usize("inner", 20)?.max(1);
    let mut ok = true;
    for (label, precision) in [("bf16", Precision::BF16), ("fp32", Precision::FP32)] {
        let mut be = backend(precision)?;
        for b in batches {
            let c = h * d;
            let host = [
                data(201, b * c),
                data(202, b * tk * c),
                data(203, b * tk * c),
            ];
            let dims = andrea_core::check::AttentionDims {
                batch: b,
                heads: h,
                head_dim: d,
                q_len: 1,
                k_len: tk,
            };
            let plan = att_decode::decode(&dims, be.multiprocessors()).map_err(device("plan"))?;
            let bytes = (2 * b * h * tk * d * 4) as f64;
            be.set_decode_attention(DecodeAttention::Split);
            let (split, split_s) = decode_pass(&be, [b, tk, h, d], &host, reps, inner)?;
            be.set_decode_attention(DecodeAttention::Off);
            let (off, off_s) = decode_pass(&be, [b, tk, h, d], &host, reps, inner)?;
            be.set_decode_attention(DecodeAttention::Split);
            let name = format!("decode_{b}x{tk}x{h}x{d}");
            let chunks = plan.map(|p| p.chunks);
            for (kernel, secs) in [("split", split_s), ("off", off_s)] {
                emit(serde_json::json!({
                    "phase": "decode_attention", "name": name, "precision": label,
                    "kernel": kernel, "chunks": if kernel == "split" { chunks } else { None },
                    "median_ms": secs * 1e3, "gb_per_s": bytes / secs / 1e9,
                }));
            }
            let u = match precision.matmul {
                MatmulPrecision::Fp32 => U24,
                m => unit_roundoff(m),
            };
            let (tol, _) = attention_tol(tk, d, u);
            let (mut row, pass) =
                compare_row("decode_attention", "split vs off", &split, &off, tol);
            row["phase"] = "decode_attention".into();
            row["precision"] = label.into();
            row["name"] = name.into();
            ok &= pass;
            emit(row);
        }
    }
    Ok(ok)
}

// ---- training steps -------------------------------------------------------------------

/// One training step: (loss, gradient norm before clipping, seconds).
type StepRow = (f32, f32, f64);

/// `steps` steps from seed 1 on one synthetic batch; returns the backend's name too.
fn train_steps(
    config: &Config,
    precision: Precision,
    batch: usize,
    seq: usize,
    steps: usize,
) -> Res<(String, Vec<StepRow>)> {
    let be = backend(precision)?;
    let name = be.name();
    let model = Model::new(be, config.model.clone(), 1).map_err(device("Model::new"))?;
    let optimizer = config.optimizer.clone();
    let lr = optimizer.lr;
    let mut trainer = Trainer::new(model, optimizer, batch, seq).map_err(device("Trainer"))?;
    let (tokens, targets) =
        andrea_model::bench::synthetic_batch(config.model.vocab_size, batch, seq, 1);
    let mut out = Vec::new();
    for _ in 0..steps {
        let t0 = Instant::now();
        // `train_step`: the path `andrea train` takes, one host wait per step (the
        // clipping scale on the device); the synchronize below adds the AdamW tail.
        let (loss, stats) = trainer
            .train_step(&[(&tokens, &targets)], lr)
            .map_err(device("train_step"))?;
        let norm = stats.grad_norm;
        trainer
            .model()
            .backend()
            .synchronize()
            .map_err(device("synchronize"))?;
        out.push((loss, norm, t0.elapsed().as_secs_f64()));
    }
    Ok((name, out))
}

fn train(flags: &Flags) -> Res<bool> {
    let path = flags.text("config", "configs/andrea-120m.toml");
    let config = Config::from_toml_file(&path).map_err(device(&path))?;
    let batch = flags.usize("batch", 16)?;
    let seq = flags.usize("seq", 1024)?;
    let steps = flags.usize("steps", 2)?.max(1);
    // Sanity bounds, not derived: relative differences from FP32 that a correct TF32 or
    // BF16 step stays well inside at initialisation (operand roundoff 2⁻¹¹ / 2⁻⁸ enters
    // the loss through sums that average it).
    let bounds = |p: MatmulPrecision| match p {
        MatmulPrecision::Fp32 => (0.0, 0.0),
        MatmulPrecision::Tf32 => (2e-3, 2e-2),
        MatmulPrecision::Bf16 => (2e-2, 1e-1),
    };
    let mut ok = true;
    let mut fp32: Vec<StepRow> = Vec::new();
    for (label, precision) in PRECISIONS {
        let (name, rows) = train_steps(&config, precision, batch, seq, steps)?;
        for (i, &(loss, norm, secs)) in rows.iter().enumerate() {
            let mut row = serde_json::json!({
                "phase": "train_step", "precision": label, "backend": name,
                "config": path, "batch": batch, "seq": seq, "step": i + 1,
                "loss": loss, "grad_norm": norm, "seconds": secs,
            });
            let finite = loss.is_finite() && norm.is_finite();
            let mut pass = finite;
            if precision != Precision::FP32 {
                let (bl, bn) = bounds(precision.matmul);
                let (l0, n0, _) = fp32[i];
                let dl = ((loss - l0) / l0).abs() as f64;
                let dn = ((norm - n0) / n0).abs() as f64;
                row["loss_rel_diff_vs_fp32"] = dl.into();
                row["grad_norm_rel_diff_vs_fp32"] = dn.into();
                row["bounds"] = serde_json::json!([bl, bn]);
                pass &= dl <= bl && dn <= bn;
            }
            row["pass"] = pass.into();
            ok &= pass;
            emit(row);
        }
        if precision == Precision::FP32 {
            fp32 = rows;
        } else if precision == Precision::FAST {
            // Determinism: the same first step on a fresh model gives the same bits.
            let (_, again) = train_steps(&config, precision, batch, seq, 1)?;
            let same = again[0].0.to_bits() == rows[0].0.to_bits()
                && again[0].1.to_bits() == rows[0].1.to_bits();
            ok &= same;
            emit(serde_json::json!({
                "phase": "train_step", "precision": label, "check": "repeat step 1: same bits",
                "loss": again[0].0, "grad_norm": again[0].1, "pass": same,
            }));
        }
    }
    Ok(ok)
}

fn loads() -> Res<bool> {
    let t0 = Instant::now();
    let be = backend(Precision::FAST)?;
    let start_s = t0.elapsed().as_secs_f64();
    for l in be.module_loads() {
        emit(serde_json::json!({
            "phase": "loads", "module": l.module, "image": l.image, "driver_ms": l.millis,
        }));
    }
    let all_fatbin = be.module_loads().iter().all(|l| l.image == "fatbin");
    emit(serde_json::json!({
        "phase": "loads", "backend": be.name(), "start_s": start_s,
        "all_fatbin": all_fatbin, "pass": true,
    }));
    Ok(true)
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let Some(cmd) = args.first() else {
        eprintln!("usage: gpu_check gemm|attention|decode|train|loads|agree [--flag value ...]");
        return ExitCode::from(2);
    };
    let result = Flags::parse(&args[1..]).and_then(|f| match cmd.as_str() {
        "gemm" => gemm(&f),
        "attention" => attention(&f),
        "decode" => decode(&f),
        "train" => train(&f),
        "loads" => loads(),
        "agree" => agree::agree(&f),
        other => Err(format!("unknown check `{other}`")),
    });
    match result {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("gpu_check {cmd}: {e}");
            emit(serde_json::json!({"phase": cmd, "error": e, "pass": false}));
            ExitCode::from(2)
        }
    }
}
