//! Data-parallel training (`mpirun -np W andrea train ...`, build with `--features mpi`):
//! what each rank of a [`Ranks`] world does in the training loop. Without a launcher (or
//! in a world of one) every function here is the single-process path, unchanged.
//!
//! * The global batch is `W × --batch-size × --grad-accum` windows. A step's windows are
//!   numbered as one process with `--grad-accum W·A` reads them (`A = --grad-accum`);
//!   rank r reads micro-batches `r·A .. r·A + A` and skips the others' (the data
//!   position advances over all of them, on every rank: [`crate::data::DataStream`]). So
//!   the data position is global and a checkpoint resumes on any world size with the
//!   same global batch.
//! * Each rank accumulates its own micro-batches, then [`GradientReducer`] averages the
//!   gradients (bucketed `MPI_Allreduce`, pre-scaled by `1/W`); the step then clips by
//!   the norm of that global mean gradient, identically on every rank. The logged loss
//!   is the global mean; evaluation windows are dealt round-robin and their losses summed.
//! * Rank 0 alone prints, logs and writes checkpoints; the others wait at a barrier after
//!   each checkpoint. Ctrl-C (mpirun forwards it to every rank) is reduced each step, so
//!   all ranks stop after the same step.
//! * Settings are compared at the start by a hash; an error on one rank ends the job
//!   (`MPI_Abort`, status 2), since the others would wait for it forever.
//!
//! * With `--backend cuda` each rank takes the GPU of its local rank
//!   (`crate::backend::start_cuda`), and in a build with the `nccl` feature the
//!   gradients are summed by NCCL in place on the device (the NCCL id broadcast over MPI);
//!   where `libnccl.so.2` does not load, through host memory and MPI, with a notice.
//!   `ANDREA_NCCL=off` forces host staging; `ANDREA_NCCL=on` makes a missing NCCL an
//!   error and uses NCCL in a world of one too (without any launcher), which is how a
//!   single GPU checks the path.
//!
//! `ANDREA_ALLREDUCE_BUCKET_FLOATS` sets the bucket size (default
//! [`andrea_dist::DEFAULT_BUCKET_FLOATS`]).

use andrea::{Backend, StepStats, Trainer};
use andrea_dist::{GradientReducer, NcclMode, World, DEFAULT_BUCKET_FLOATS};
use anyhow::{Context, Result};

use crate::checkpoint::fnv1a64;
use crate::data::{DataPosition, ShardSet};
use crate::eval::loss_sum;

/// Whether `e` is an error that every rank of the world finds at once (the ranks
/// disagree on their settings), so that each can return it and MPI ends cleanly.
pub fn found_by_every_rank(e: &anyhow::Error) -> bool {
    matches!(
        e.downcast_ref::<andrea_dist::DistError>(),
        Some(andrea_dist::DistError::Mismatch { .. })
    )
}

/// The world of this run and its gradient reducer.
pub struct Ranks {
    pub world: World,
    reducer: GradientReducer,
    nccl: NcclMode,
    /// Whether [`GradientReducer::connect`] has run (at the first step).
    connected: bool,
}

impl Ranks {
    /// The launcher's world (see [`World::init`]).
    pub fn init() -> Result<Ranks> {
        let world = World::init()?;
        let var = "ANDREA_ALLREDUCE_BUCKET_FLOATS";
        let bucket = match std::env::var(var) {
            Ok(v) => v.trim().parse().ok().filter(|&n| n > 0).with_context(|| {
                format!("{var}={v}: give a number of floats of at least 1, or unset it")
            })?,
            Err(_) => DEFAULT_BUCKET_FLOATS,
        };
        let nccl = NcclMode::parse(std::env::var("ANDREA_NCCL").ok().as_deref())
            .map_err(anyhow::Error::msg)?;
        Ok(Ranks {
            world,
            reducer: GradientReducer::new(bucket),
            nccl,
            connected: false,
        })
    }

    pub fn is_root(&self) -> bool {
        self.world.is_root()
    }

    pub fn size(&self) -> usize {
        self.world.size()
    }

    /// Fails on every rank unless all ranks hash the same `what` (settings, config, step).
    pub fn agree(&self, what: &str, value: &impl serde::Serialize) -> Result<()> {
        let json = serde_json::to_vec(value)?;
        Ok(self.world.agree(what, fnv1a64(&json))?)
    }

    /// One optimizer step over this rank's `micro_batches` and every other rank's:
    /// returns the global mean loss and the step's statistics (the same on every rank).
    pub fn train_step<B: Backend>(
        &mut self,
        trainer: &mut Trainer<B>,
        micro_batches: &[(&[u32], &[u32])],
        lr: f32,
    ) -> Result<(f32, StepStats)> {
        if !self.connected {
            let be = trainer.model().backend();
            let grads = trainer.gradients();
            if let Some(line) = self.reducer.connect(&self.world, be, grads, self.nccl)? {
                if self.is_root() {
                    errln!("note: {line}");
                }
            }
            self.connected = true;
        }
        if self.size() == 1 && !self.reducer.on_device() {
            return Ok(trainer.train_step(micro_batches, lr)?);
        }
        trainer.zero_grad()?;
        let mut loss = [0.0f64];
        for (tokens, targets) in micro_batches {
            loss[0] += trainer.forward_train(tokens, targets)? as f64;
            trainer.backward()?;
        }
        let be = trainer.model().backend();
        self.reducer
            .all_reduce(&self.world, be, trainer.gradients())?;
        self.world.sum_f64(&mut loss);
        let stats = trainer.step(lr)?;
        let count = (micro_batches.len() * self.size()) as f64;
        Ok(((loss[0] / count) as f32, stats))
    }

    /// Whether any rank was asked to stop.
    pub fn any(&self, flag: bool) -> bool {
        self.world.any(flag)
    }

    /// The mean loss over the windows at `starts`, each rank evaluating every W-th one.
    pub fn mean_loss(
        &self,
        shape: (usize, usize),
        shards: &ShardSet,
        starts: &[DataPosition],
        loss: impl FnMut(&[u32], &[u32]) -> andrea::Result<f32>,
    ) -> Result<f32> {
        let (rank, size) = (self.world.rank(), self.size());
        let mine: Vec<DataPosition> = starts.iter().skip(rank).step_by(size).copied().collect();
        let mut sum = [loss_sum(shape, shards, &mine, loss)?];
        self.world.sum_f64(&mut sum);
        Ok((sum[0] / starts.len().max(1) as f64) as f32)
    }

    /// The all-reduce's share of the time since the start, for the end of the run.
    pub fn summary(&self, seconds: f64) -> Option<String> {
        let s = self.reducer.stats();
        let share = |t: f64| 100.0 * t / seconds.max(1e-9);
        (s.calls > 0).then(|| {
            format!(
                "all-reduce: {} rank(s), {:.1}% of {seconds:.1} s reducing ({:.3} s per step, {:.2} GB/s of \
                 gradient per rank, buckets of {} floats), {:.1}% waiting for the slowest rank",
                self.size(),
                share(s.seconds),
                s.seconds / s.calls as f64,
                s.bytes as f64 / s.seconds.max(1e-9) / 1e9,
                self.reducer.bucket(),
                share(s.wait_seconds),
            )
        })
    }
}
