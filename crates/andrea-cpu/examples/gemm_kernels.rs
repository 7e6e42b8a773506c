//! The CPU backend's GEMM kernel on the training step's 13 products (ANDREA-120M, batch
//! 4 x 256; `--model tiny`: configs/tiny.toml's, batch 8 x 256), plain and with the
//! fused epilogues, in the backend's own threading. One JSON line per shape: the median
//! GFLOP/s over `--rounds` rounds. The kernel is the one the SIMD level runs
//! (`ANDREA_SIMD` caps it; the backend's name, printed in each line, says which).
//!
//! ```text
//! cargo run --release -p andrea-cpu --example gemm_kernels -- --threads 2 --rounds 5
//! ```
//!
//! `--only fwd_fc,bwd_dw_qkv` picks the shapes. `--clock cpu` times by the CPU time of
//! the process's threads (Linux: `CLOCK_PROCESS_CPUTIME_ID`) instead of the wall clock:
//! on a machine shared with other work, that counts only the time this process ran;
//! rayon's idle spinning counts as time, so the figures stay conservative. `--cold on`
//! evicts the caches (both threads write 64 MiB; `--cold N`: N MiB, for a larger
//! last-level cache) before each timed call, so the operands come from memory as in a
//! training step. Comparing against another kernel is `benches/pytorch/cpu_gemm.py`'s
//! job (same JSON lines).

use std::time::Instant;

use andrea_core::config::step_gemms;
use andrea_core::{LinalgOps, Matrix, MemoryOps, View};
use andrea_cpu::CpuBackend;

fn mat(
    buf: &andrea_cpu::CpuBuffer,
    rows: usize,
    cols: usize,
    t: bool,
) -> Matrix<'_, andrea_cpu::CpuBuffer> {
    if t {
        View::new(buf, 0, [cols, rows]).mat().t()
    } else {
        View::new(buf, 0, [rows, cols]).mat()
    }
}

fn main() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let mut threads = 2;
    let mut rounds = 5;
    let mut only: Option<Vec<String>> = None;
    let mut cpu_clock = false;
    let mut cold_mib = 0;
    // (tokens, d_model, MLP width, vocabulary) of the step's products.
    let mut dims = ANDREA_120M;
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let v = it.next().ok_or(format!("{flag} needs a value"))?;
        match flag.as_str() {
            "--threads" => threads = v.parse()?,
            "--rounds" => rounds = v.parse()?,
            "--clock" => {
                cpu_clock = match v.as_str() {
                    "wall" => false,
                    "cpu" => true,
                    _ => return Err(format!("--clock: wall or cpu, not {v:?}").into()),
                }
            }
            "--model" => {
                dims = match v.as_str() {
                    "andrea-120m" => ANDREA_120M,
                    "tiny" => TINY,
                    _ => return Err(format!("--model: andrea-120m or tiny, not {v:?}").into()),
                }
            }
            "--cold" => {
                cold_mib = match v.as_str() {
                    "on" => 64,
                    "off" => 0,
                    _ => v
                        .parse()
                        .map_err(|_| format!("--cold: on, off or MiB to write, not {v:?}"))?,
                }
            }
            "--only" => only = Some(v.split(',').map(String::from).collect()),
            _ => return Err(format!("unknown flag {flag}").into()),
        }
    }
    rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build_global()?;
    // On a worker of the pool, as the `andrea` binary runs (no hand-over per call).
    rayon::scope(|_| run(dims, rounds, only.as_deref(), cpu_clock, cold_mib))
}

/// ANDREA-120M at batch 4 x 256: (tokens, d_model, MLP width, vocabulary).
const ANDREA_120M: (usize, usize, usize, usize) = (1024, 768, 3072, 8449);
/// configs/tiny.toml at batch 8 x 256.
const TINY: (usize, usize, usize, usize) = (2048, 128, 512, 8449);

fn run(
    (tokens, d_model, mlp, vocab): (usize, usize, usize, usize),
    rounds: usize,
    only: Option<&[String]>,
    cpu_clock: bool,
    cold_mib: usize,
) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    // `--cold on`: before each timed call, every thread writes its share of a buffer of
    // twice the last-level cache's size, so the operands come from memory, as they do
    // in a training step (where each product's inputs were written long before).
    // `--cold N` writes N MiB instead (`on`: 64), for a last-level cache that holds more.
    let mut evict = vec![0u8; cold_mib << 20];
    let cold = cold_mib > 0;
    let mut flush = |round: u8| {
        use rayon::prelude::*;
        evict.par_chunks_mut(1 << 20).for_each(|c| c.fill(round));
    };
    let clock = || -> Result<f64, Box<dyn std::error::Error + Send + Sync>> {
        if cpu_clock {
            cpu_seconds()
        } else {
            Ok(Instant::now()
                .duration_since(*START.get_or_init(Instant::now))
                .as_secs_f64())
        }
    };
    let base = CpuBackend::new();
    let backends = [CpuBackend::new()];
    // The step's products, then the forward's products with their bias (`fwd_qkv`,
    // `fwd_fc_proj`) and the two fused MLP products on their shapes (`fwd_fc`'s with bias
    // and GELU, `bwd_dx_fc_proj`'s times GELU') and the weight gradients as the step
    // runs them, added into `C` (`acc_*`: `matmul_add`), to set against the plain ones.
    let mut gemms = step_gemms(tokens, d_model, mlp, vocab);
    // The two weight gradients `step_gemms` leaves out (its list stands for their dx
    // products' shapes only): the attention projection's and the MLP-up's `dW = xᵀ·dy`.
    for (name, n) in [("bwd_dw_attn_proj", d_model), ("bwd_dw_fc", mlp)] {
        gemms.push(andrea_core::config::StepGemm {
            name,
            m: d_model,
            k: tokens,
            n,
            a_transposed: true,
            b_transposed: false,
        });
    }
    let fused = [
        (Fused::Bias, "bias_fwd_qkv", "fwd_qkv"),
        (Fused::Bias, "bias_fwd_fc_proj", "fwd_fc_proj"),
        (Fused::LinearGelu, "fused_linear_gelu", "fwd_fc"),
        (
            Fused::GeluBackward,
            "fused_matmul_gelu_backward",
            "bwd_dx_fc_proj",
        ),
        (Fused::Accumulate, "acc_bwd_dw_qkv", "bwd_dw_qkv"),
        (
            Fused::Accumulate,
            "acc_bwd_dw_attn_proj",
            "bwd_dw_attn_proj",
        ),
        (Fused::Accumulate, "acc_bwd_dw_fc", "bwd_dw_fc"),
        (Fused::Accumulate, "acc_bwd_dw_fc_proj", "bwd_dw_fc_proj"),
        (
            Fused::Accumulate,
            "acc_bwd_dwte_lm_head",
            "bwd_dwte_lm_head",
        ),
    ]
    .map(|(f, name, like)| {
        let mut g = *gemms
            .iter()
            .find(|g| g.name == like)
            .expect("a step product");
        g.name = name;
        (g, f)
    });
    for (p, op) in gemms.iter().map(|&g| (g, Fused::No)).chain(fused) {
        if only.is_some_and(|o| !o.iter().any(|n| n == p.name)) {
            continue;
        }
        let (m, k, n) = (p.m, p.k, p.n);
        let fill = |len: usize, s: u32| -> Vec<f32> {
            (0..len)
                .map(|i| {
                    ((i as u32).wrapping_mul(2_654_435_761).wrapping_add(s) >> 8) as f32 / 8e6 - 1.0
                })
                .collect()
        };
        let (a, b, c) = (base.alloc(m * k)?, base.alloc(k * n)?, base.alloc(m * n)?);
        base.upload(&fill(m * k, 1), View::whole(&a))?;
        base.upload(&fill(k * n, 2), View::whole(&b))?;
        // The bias, and `out` (linear_gelu) or `pre` (matmul_gelu_backward).
        let (bias, other) = (base.alloc(n)?, base.alloc(m * n)?);
        base.upload(&fill(n, 3), View::whole(&bias))?;
        base.upload(&fill(m * n, 4), View::whole(&other))?;
        let mut times = vec![Vec::new(); backends.len()];
        for _ in 0..rounds + 1 {
            for (be, t) in backends.iter().zip(&mut times) {
                let (am, bm, cm) = (
                    mat(&a, m, k, p.a_transposed),
                    mat(&b, k, n, p.b_transposed),
                    mat(&c, m, n, false),
                );
                if cold {
                    flush(t.len() as u8);
                }
                let t0 = clock()?;
                let (bias, other, ct) = (
                    View::whole(&bias),
                    View::new(&other, 0, [m, n]),
                    View::new(&c, 0, [m, n]),
                );
                match op {
                    Fused::No => be.matmul(am, bm, None, cm)?,
                    Fused::Bias => be.matmul(am, bm, Some(bias), cm)?,
                    Fused::LinearGelu => be.linear_gelu(am, bm, bias, ct, other)?,
                    Fused::GeluBackward => be.matmul_gelu_backward(am, bm, other, ct)?,
                    Fused::Accumulate => be.matmul_add(am, bm, None, cm)?,
                }
                t.push(clock()? - t0);
            }
        }
        for (be, mut t) in backends.iter().zip(times) {
            t.remove(0); // the first round warms caches and packing buffers
            t.sort_by(f64::total_cmp);
            let med = t[t.len() / 2];
            println!(
                "{{\"bench\": \"gemm_kernels\", \"shape\": \"{}_{m}x{k}x{n}\", \"kernel\": \"andrea\", \"backend\": \"{}\", \"gflops\": {:.1}, \"median_s\": {med:.5}, \"best_gflops\": {:.1}, \"clock\": \"{}\", \"cold\": {cold}}}",
                p.name,
                be.name(),
                2.0 * (m * k * n) as f64 / med / 1e9,
                2.0 * (m * k * n) as f64 / t[0] / 1e9,
                if cpu_clock { "cpu" } else { "wall" }
            );
        }
    }
    Ok(())
}

/// Which op a measured product runs.
#[derive(Clone, Copy)]
enum Fused {
    /// `matmul`.
    No,
    /// `matmul` with a bias.
    Bias,
    /// `linear_gelu` (bias and GELU fused).
    LinearGelu,
    /// `matmul_gelu_backward` (times GELU' fused).
    GeluBackward,
    /// `matmul_add` (`C += A·B`: the step's weight gradients accumulate).
    Accumulate,
}

static START: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();

/// Seconds this process's threads have run on a CPU (`CLOCK_PROCESS_CPUTIME_ID`, which
/// brings the running threads' time up to date when read: the threads' `schedstat` files,
/// read before, lagged by up to a scheduler tick, longer than a tiny product, so a
/// 1-thread product read 0 s and the medians of `--clock cpu` were ticks, not times).
fn cpu_seconds() -> Result<f64, Box<dyn std::error::Error + Send + Sync>> {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec.
    if unsafe { libc::clock_gettime(libc::CLOCK_PROCESS_CPUTIME_ID, &mut ts) } != 0 {
        return Err("clock_gettime(CLOCK_PROCESS_CPUTIME_ID) failed".into());
    }
    Ok(ts.tv_sec as f64 + ts.tv_nsec as f64 * 1e-9)
}
