//! [`GradientReducer`]: the data-parallel gradient all-reduce, bucket by bucket.

use std::time::Instant;

use andrea_core::{Backend, DeviceMemory, View};

use crate::world::World;
use crate::Result;

/// Floats per bucket by default: 4 Mi floats, 16 MiB (large enough that MPI runs at its
/// bandwidth, small enough that two staging buffers cost little next to the model).
pub const DEFAULT_BUCKET_FLOATS: usize = 1 << 22;

/// Time and volume of the all-reduces since the reducer was made.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct ReduceStats {
    pub calls: u64,
    /// Wall time waiting for the slowest rank to finish its backward pass (a barrier
    /// before the first bucket, so that `seconds` is the reduction alone).
    pub wait_seconds: f64,
    /// Wall time reducing, staging included.
    pub seconds: f64,
    /// Bytes of gradient each rank contributed (4 per float).
    pub bytes: u64,
}

/// Averages a gradient buffer across the ranks of a [`World`]: for each bucket (a
/// contiguous range of at most `bucket` floats of the buffer, in order), download it to
/// host memory, divide by the world size, `MPI_Allreduce` it with `MPI_SUM`, upload the
/// result. The host staging works for every backend: the CPU's memory copy is cheap next
/// to a step, and it is the CUDA backend's fallback without NCCL.
pub struct GradientReducer {
    bucket: usize,
    send: Vec<f32>,
    recv: Vec<f32>,
    stats: ReduceStats,
}

impl GradientReducer {
    /// A reducer with buckets of `bucket` floats (at least 1).
    pub fn new(bucket: usize) -> GradientReducer {
        let bucket = bucket.max(1);
        GradientReducer {
            bucket,
            send: Vec::new(),
            recv: Vec::new(),
            stats: ReduceStats::default(),
        }
    }

    pub fn bucket(&self) -> usize {
        self.bucket
    }

    pub fn stats(&self) -> ReduceStats {
        self.stats
    }

    /// Replaces `grads` on every rank by the mean over the ranks of their `grads` (all
    /// ranks call this with buffers of the same length). A world of one leaves it as
    /// it is.
    pub fn all_reduce<B: Backend>(
        &mut self,
        world: &World,
        backend: &B,
        grads: &B::Buffer,
    ) -> Result<()> {
        if world.size() == 1 {
            return Ok(());
        }
        let waited = Instant::now();
        world.barrier();
        self.stats.wait_seconds += waited.elapsed().as_secs_f64();
        let began = Instant::now();
        let (len, ranks) = (grads.len(), world.size() as f32);
        let staged = self.bucket.min(len);
        self.send.resize(staged, 0.0);
        self.recv.resize(staged, 0.0);
        let mut start = 0;
        while start < len {
            let n = self.bucket.min(len - start);
            let range = View::new(grads, start, [n]);
            let (send, recv) = (&mut self.send[..n], &mut self.recv[..n]);
            backend.download(range, send)?;
            // Pre-scaled so the sum is the mean; x / W is correctly rounded (and exact
            // for W = 2).
            for g in send.iter_mut() {
                *g /= ranks;
            }
            world.sum_f32(send, recv);
            backend.upload(recv, range)?;
            start += n;
        }
        self.stats.calls += 1;
        self.stats.seconds += began.elapsed().as_secs_f64();
        self.stats.bytes += 4 * len as u64;
        Ok(())
    }
}
