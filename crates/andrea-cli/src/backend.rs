//! Choosing the backend, its precision and the thread count.
//!
//! The commands are generic over `B: Backend`; `main` calls them with the CPU backend or,
//! in a build with the `cuda` feature, with `CudaBackend`. Without the feature
//! `--backend cuda` is refused here, before any work, with the command that builds it.

use anyhow::{bail, Result};

use andrea::core::MatmulPrecision;

use crate::cli::{BackendArgs, BackendKind, BenchKind, Command, GlobalArgs, PrecisionKind};

/// The backend the flags ask for (checked; the CUDA backend itself starts when the
/// command needs it, see `start_cuda`, in a build with the `cuda` feature).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Selected {
    /// `andrea::DefaultBackend`, the CPU backend on the global thread pool, its products
    /// in this precision (`Fp32` or `Bf16`).
    Cpu(MatmulPrecision),
    /// `CudaBackend` on GPU 0 in this precision.
    #[cfg(feature = "cuda")]
    Cuda(andrea::cuda::Precision),
}

/// Checks the flags and sizes the thread pool. `--threads` sizes the pool the CPU
/// backend and the tokenizer run on (the tokenizer also with `--backend cuda`).
/// `command`: the command, whose `--backend`/`--precision` are given after its name.
pub fn select(global: &GlobalArgs, command: &Command) -> Result<Selected> {
    let flags = merge(global.backend, command.backend_args().unwrap_or_default())?;
    // Ranks of a data-parallel run on one machine share its cores: by default each
    // takes its share (2 ranks on 8 cores: 4 threads each), not all of them.
    let share = andrea_dist::launcher_local_size()
        .filter(|&ranks| ranks > 1)
        .map(|ranks| {
            let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
            (cores / ranks).max(1)
        });
    let threads = global.threads.or(share).unwrap_or(0);
    let most = crate::limits::max_threads();
    if threads > most {
        bail!(
            "--threads {threads} is more than this machine can use ({} cores, at most {most} threads): \
             pass --threads {} or leave it out (all cores)",
            std::thread::available_parallelism().map_or(1, |n| n.get()),
            most.min(std::thread::available_parallelism().map_or(1, |n| n.get()))
        );
    }
    // Built here, once, so a pool that cannot start (a process or thread limit) is an
    // error now rather than a panic at the pool's first use. 0 means one per core.
    andrea_tokenizer::rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build_global()
        .map_err(|e| {
            anyhow::anyhow!(
                "cannot start {} CPU threads: {e}: pass a smaller --threads (the system's \
                 limit on threads or memory, `ulimit -u` or `ulimit -v`, may be low)",
                if threads == 0 {
                    "one per core".to_string()
                } else {
                    threads.to_string()
                }
            )
        })?;
    match flags.backend.unwrap_or(BackendKind::Cpu) {
        BackendKind::Cpu => match flags.precision {
            None | Some(PrecisionKind::Fp32) => Ok(Selected::Cpu(MatmulPrecision::Fp32)),
            Some(PrecisionKind::Bf16) => cpu_bf16(command),
            Some(p) => bail!(
                "--precision {}: TF32 is a CUDA tensor-core format; the CPU backend computes \
                 in fp32 (the default) or, for generation, bf16 (drop --precision, pass \
                 --precision bf16, or pass --backend cuda)",
                precision_name(p)
            ),
        },
        BackendKind::Cuda => cuda(flags.precision),
    }
}

/// `--precision bf16` on the CPU: decoding (`generate`, `bench decode`) reads a BF16 copy
/// of the weights, on any CPU. Training and evaluation would need BF16 matrix kernels
/// (AMX or AVX512-BF16), which the CPU backend does not have: refused, saying what this
/// CPU has and what to use instead.
fn cpu_bf16(command: &Command) -> Result<Selected> {
    let decoding = match command {
        Command::Generate(_) => true,
        Command::Bench(b) => matches!(b.kind, BenchKind::Decode),
        _ => false,
    };
    if !decoding {
        bail!(
            "--precision bf16 on the CPU backend is for generation (`generate`, `bench decode`) \
             only: training and evaluating in BF16 need BF16 matrix kernels (AMX or \
             AVX512-BF16), which andrea's CPU backend does not have yet ({}); drop \
             --precision (fp32, the default on the CPU), or pass --backend cuda --precision bf16",
            andrea::cpu::bf16_hardware()
        );
    }
    Ok(Selected::Cpu(MatmulPrecision::Bf16))
}

/// The flags given before the command's name and after it: each flag from where it was
/// given; given in both places, the values must agree.
fn merge(before: BackendArgs, after: BackendArgs) -> Result<BackendArgs> {
    fn one<T: clap::ValueEnum + PartialEq>(
        flag: &str,
        before: Option<T>,
        after: Option<T>,
    ) -> Result<Option<T>> {
        let name = |v: &T| v.to_possible_value().map(|p| p.get_name().to_string());
        match (before, after) {
            (Some(a), Some(b)) if a != b => bail!(
                "{flag} is given twice with different values, {} before the command's name and \
                 {} after it: give it once",
                name(&a).unwrap_or_default(),
                name(&b).unwrap_or_default()
            ),
            (a, b) => Ok(b.or(a)),
        }
    }
    Ok(BackendArgs {
        backend: one("--backend", before.backend, after.backend)?,
        precision: one("--precision", before.precision, after.precision)?,
    })
}

fn precision_name(p: PrecisionKind) -> &'static str {
    match p {
        PrecisionKind::Fp32 => "fp32",
        PrecisionKind::Tf32 => "tf32",
        PrecisionKind::Bf16 => "bf16",
    }
}

#[cfg(not(feature = "cuda"))]
fn cuda(_: Option<PrecisionKind>) -> Result<Selected> {
    bail!(
        "--backend cuda: this andrea was built without the CUDA backend; rebuild it with \
         `cargo build --release -p andrea-cli --features cuda` (needs an NVIDIA driver \
         580+ where it runs; see the README), or use --backend cpu"
    )
}

#[cfg(feature = "cuda")]
fn cuda(precision: Option<PrecisionKind>) -> Result<Selected> {
    use andrea::cuda::Precision;
    Ok(Selected::Cuda(match precision {
        None | Some(PrecisionKind::Tf32) => Precision::FAST,
        Some(PrecisionKind::Fp32) => Precision::FP32,
        Some(PrecisionKind::Bf16) => Precision::BF16,
    }))
}

/// Starts the CUDA backend on GPU 0; the error says what is missing and that
/// `--backend cpu` works without a GPU.
#[cfg(feature = "cuda")]
///
/// The GPU is the rank's local rank on its machine (`ANDREA_LOCAL_RANK`, else the
/// launcher's, else 0): one GPU per rank under `mpirun`/`srun`.
pub fn start_cuda(precision: andrea::cuda::Precision) -> Result<andrea::CudaBackend> {
    let gpu = andrea_dist::launcher_local_rank().unwrap_or(0);
    andrea::CudaBackend::on_device(gpu as u32, precision).map_err(|e| match e {
        andrea::core::Error::NoDevice { .. } if gpu > 0 => anyhow::anyhow!(
            "--backend cuda: {e}; this rank's local rank is {gpu}: start as many ranks per \
             machine as it has GPUs, or set ANDREA_LOCAL_RANK to the GPU each rank takes"
        ),
        andrea::core::Error::NoDevice { .. } => {
            anyhow::anyhow!("--backend cuda: {e}; --backend cpu needs no GPU")
        }
        other => anyhow::Error::new(other).context("--backend cuda: cannot start the CUDA backend"),
    })
}
