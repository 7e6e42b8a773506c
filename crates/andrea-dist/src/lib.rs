//! # andrea-dist
//!
//! Data parallelism for andrea: W processes (ranks) train one model, each on its own
//! share of every step's micro-batches, and add their gradients before every optimizer
//! step. Processes are started and connected by the field's launchers (`mpirun`,
//! SLURM's `srun`) and talk through MPI; andrea opens no sockets of its own.
//!
//! * [`World`]: this process's rank and the world size. With the `mpi` feature it is
//!   `MPI_COMM_WORLD` (a process started alone is a world of one); without it every
//!   process is a world of one, and [`World::init`] refuses a process that a launcher
//!   started as one of several ranks (by the variables its launcher sets), naming the build that would work,
//!   instead of letting W independent copies train.
//! * [`GradientReducer`]: the gradient all-reduce, in buckets of a fixed number of
//!   floats, each a contiguous range of the trainer's gradient buffer: staged through
//!   host memory, pre-scaled by `1/W` and summed with `MPI_Allreduce`, so every rank
//!   ends with the mean of the ranks' gradients.
//!
//! * `nccl` (feature `nccl`): NCCL found and loaded at run time, for the GPU path:
//!   [`GradientReducer::connect`] makes an NCCL communicator (the id broadcast over MPI)
//!   when the backend's buffers are device memory, and the buckets are then summed in
//!   place on the backend's stream; without NCCL, host staging and MPI as above.
//!
//! Why the sum is exact for two ranks: `andrea-model`'s trainer accumulates whole
//! micro-batch gradients (`g₁ + g₂`), so a single process with two micro-batches and
//! two ranks with one each both hold `g₁ + g₂` (float addition of two terms commutes).
//! The pre-scaling by `1/2` is exact (a power of two; only subnormal gradients, below
//! 1.2e-38, would round), so the step's gradient, norm and update are the same bits.
//! With three or more ranks MPI chooses the order of the sum, and results agree with a
//! single process to rounding.

mod launcher;
#[cfg(feature = "nccl")]
pub mod nccl;
mod reduce;
mod world;

pub use launcher::{launcher_local_rank, launcher_local_size, launcher_world_size, LauncherSize};
pub use reduce::{GradientReducer, NcclMode, ReduceStats, DEFAULT_BUCKET_FLOATS};
pub use world::World;

/// What can go wrong setting up or running the world.
#[derive(Debug, thiserror::Error)]
pub enum DistError {
    #[error(
        "this andrea was built without MPI, but {launcher} started it as one of {size} ranks \
         ({var}={size}); it would train {size} independent copies. Rebuild with MPI: \
         `apt-get install openmpi-bin libopenmpi-dev libclang-dev`, then \
         `cargo build --release -p andrea-cli --features mpi`, and launch that binary"
    )]
    NotBuiltWithMpi {
        launcher: &'static str,
        var: &'static str,
        size: usize,
    },
    #[error(
        "{what}: the launcher says {expected} ranks ({var}), MPI's world has {got}: \
         the binary and the launcher use different MPI installations; build andrea against \
         the MPI whose `mpirun` starts it"
    )]
    WorldMismatch {
        what: &'static str,
        var: &'static str,
        expected: usize,
        got: usize,
    },
    #[error(
        "MPI was already initialised in this process, or its thread support is too low \
         ({0}): andrea calls MPI from one thread at a time and needs MPI_THREAD_SERIALIZED"
    )]
    Init(String),
    #[error(
        "the ranks disagree on {what} (rank {rank} has {mine:016x}, another rank has a different \
         value): start every rank with the same binary, flags, config and data"
    )]
    Mismatch {
        what: String,
        rank: usize,
        mine: u64,
    },
    #[error(
        "ANDREA_NCCL=on: NCCL reduces device memory, and this backend's gradients are host \
         memory; use it with --backend cuda, or unset ANDREA_NCCL"
    )]
    NcclNeedsDevice,
    #[error(
        "ANDREA_NCCL=on: this andrea was built without NCCL; rebuild with `--features nccl` \
         (or unset ANDREA_NCCL to go through host memory and MPI)"
    )]
    NcclNotBuilt,
    #[cfg(feature = "nccl")]
    #[error("ANDREA_NCCL=on: {0}")]
    NcclMissing(nccl::NcclNotFound),
    #[cfg(feature = "nccl")]
    #[error("the gradient all-reduce: {0}")]
    Nccl(#[from] nccl::NcclError),
    #[error("the gradient all-reduce: {0}")]
    Backend(#[from] andrea_core::Error),
}

pub type Result<T> = std::result::Result<T, DistError>;
