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
/// contiguous range of at most `bucket` floats of the buffer, in order), divide it by the
/// world size and `MPI_Allreduce` it with `MPI_SUM`. Host memory (the CPU backend) is
/// sent from where it is; device memory is downloaded to host memory and the sum
/// uploaded, which is the CUDA backend's fallback without NCCL.
///
/// With the `nccl` feature and a backend whose buffers are device memory
/// ([`andrea_core::MemoryOps::device_region`]), [`GradientReducer::connect`] can switch it
/// to NCCL: each bucket is scaled by `1/W` on the device and summed in place by
/// `ncclAllReduce` on the backend's stream, with no host copy. `x·(1/W)` is `x/W` exactly
/// for W a power of two, so 2 ranks give the same bits either way.
pub struct GradientReducer {
    bucket: usize,
    send: Vec<f32>,
    recv: Vec<f32>,
    stats: ReduceStats,
    #[cfg(feature = "nccl")]
    nccl: Option<crate::nccl::NcclComm>,
}

/// When the CUDA backend's gradients go through NCCL (`ANDREA_NCCL`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NcclMode {
    /// Never: host staging and `MPI_Allreduce`.
    Off,
    /// With several ranks on a device backend, when `libnccl.so.2` loads on every rank;
    /// else host staging, with a notice.
    Auto,
    /// Also in a world of one (NCCL's path on a single GPU), and a missing NCCL is an error.
    On,
}

impl NcclMode {
    /// `ANDREA_NCCL`: `0`/`off`, `auto` (or unset), `1`/`on`.
    pub fn parse(value: Option<&str>) -> std::result::Result<NcclMode, String> {
        match value.map(|v| v.trim().to_ascii_lowercase()).as_deref() {
            None | Some("") | Some("auto") => Ok(NcclMode::Auto),
            Some("0") | Some("off") => Ok(NcclMode::Off),
            Some("1") | Some("on") => Ok(NcclMode::On),
            Some(other) => Err(format!(
                "ANDREA_NCCL={other}: give on (NCCL, also on one rank), off (host memory and \
                 MPI) or auto (NCCL on several GPU ranks where it loads), or unset it"
            )),
        }
    }
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
            #[cfg(feature = "nccl")]
            nccl: None,
        }
    }

    /// Whether the gradients go through NCCL on the device.
    pub fn on_device(&self) -> bool {
        #[cfg(feature = "nccl")]
        if self.nccl.is_some() {
            return true;
        }
        false
    }

    /// Chooses how `grads` will be reduced, on every rank at the same point (it is a
    /// collective): NCCL per `mode` where the backend's buffers are device memory, else
    /// host staging. Returns a one-line notice for the log (which path, and why).
    #[cfg_attr(not(feature = "nccl"), allow(unused_variables))]
    pub fn connect<B: Backend>(
        &mut self,
        world: &World,
        backend: &B,
        grads: &B::Buffer,
        mode: NcclMode,
    ) -> Result<Option<String>> {
        let device = backend.device_region(View::whole(grads))?.is_some();
        let wanted =
            device && (mode == NcclMode::On || (mode == NcclMode::Auto && world.size() > 1));
        if !wanted {
            if mode == NcclMode::On && !device {
                return Err(crate::DistError::NcclNeedsDevice);
            }
            return Ok(None);
        }
        #[cfg(not(feature = "nccl"))]
        {
            if mode == NcclMode::On {
                return Err(crate::DistError::NcclNotBuilt);
            }
            Ok(Some(
                "gradients: through host memory and MPI_Allreduce (this andrea was built \
                 without NCCL: add the `nccl` feature)"
                    .into(),
            ))
        }
        #[cfg(feature = "nccl")]
        {
            use crate::nccl::{Nccl, NcclComm};
            let loaded = Nccl::load();
            // Every rank takes the same path, or some would wait in NCCL for the others.
            let missing = world.any(loaded.is_err());
            let nccl =
                match loaded {
                    Ok(n) if !missing => n,
                    Ok(_) if mode == NcclMode::Auto => return Ok(Some(
                        "gradients: through host memory and MPI_Allreduce (NCCL did not load on \
                         every rank)"
                            .into(),
                    )),
                    Err(e) if mode == NcclMode::On => return Err(crate::DistError::NcclMissing(e)),
                    Err(_) if mode == NcclMode::Auto => {
                        return Ok(Some(format!(
                            "gradients: through host memory and MPI_Allreduce: {} not found (set \
                         ANDREA_NCCL_LIB to it, or to its folder, to use NCCL)",
                            crate::nccl::NCCL_SONAME
                        )))
                    }
                    _ => {
                        return Err(crate::DistError::NcclMissing(crate::nccl::NcclNotFound {
                            tried: vec!["another rank could not load NCCL".into()],
                        }))
                    }
                };
            let (major, minor, patch) = nccl.version();
            let path = nccl.path().display().to_string();
            self.nccl = Some(NcclComm::init(std::sync::Arc::new(nccl), world)?);
            Ok(Some(format!(
                "gradients: NCCL {major}.{minor}.{patch} ({path}), {} rank(s), in place on the \
                 device in buckets of {} floats",
                world.size(),
                self.bucket
            )))
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
        #[cfg(feature = "nccl")]
        if let Some(comm) = &self.nccl {
            return Self::all_reduce_nccl(
                comm,
                self.bucket,
                &mut self.stats,
                world,
                backend,
                grads,
            );
        }
        if world.size() == 1 {
            return Ok(());
        }
        let waited = Instant::now();
        world.barrier();
        self.stats.wait_seconds += waited.elapsed().as_secs_f64();
        let began = Instant::now();
        let (len, ranks) = (grads.len(), world.size() as f32);
        let staged = self.bucket.min(len);
        self.recv.resize(staged, 0.0);
        let mut start = 0;
        while start < len {
            let n = self.bucket.min(len - start);
            let range = View::new(grads, start, [n]);
            let recv = &mut self.recv[..n];
            // Host memory (the CPU backend): scaled and sent from the buffer itself, the
            // sum received into one bucket of staging and copied back (MPI forbids a send
            // buffer that is also the receive buffer, and rsmpi has no MPI_IN_PLACE).
            let mut in_place = |x: &mut [f32]| {
                scale(x, ranks);
                world.sum_f32(x, recv);
                x.copy_from_slice(recv);
            };
            if !backend.with_host_elements(range, &mut in_place)? {
                // Device memory: staged through host memory both ways.
                self.send.resize(staged, 0.0);
                let send = &mut self.send[..n];
                backend.download(range, send)?;
                scale(send, ranks);
                world.sum_f32(send, &mut self.recv[..n]);
                backend.upload(&self.recv[..n], range)?;
            }
            start += n;
        }
        self.stats.calls += 1;
        self.stats.seconds += began.elapsed().as_secs_f64();
        self.stats.bytes += 4 * len as u64;
        Ok(())
    }
}

/// Pre-scaled so the sum is the mean; `x / W` is correctly rounded (and exact for W = 2).
fn scale(x: &mut [f32], ranks: f32) {
    for g in x.iter_mut() {
        *g /= ranks;
    }
}

#[cfg(feature = "nccl")]
impl GradientReducer {
    /// The NCCL path: per bucket, `x *= 1/W` then `ncclAllReduce` in place, both queued on
    /// the backend's stream; the stream is waited for at the end, so the time is the
    /// reduction's (the step's clipping reads the gradients back to the host anyway).
    fn all_reduce_nccl<B: Backend>(
        comm: &crate::nccl::NcclComm,
        bucket: usize,
        stats: &mut ReduceStats,
        world: &World,
        backend: &B,
        grads: &B::Buffer,
    ) -> Result<()> {
        let waited = Instant::now();
        backend.synchronize()?;
        world.barrier();
        stats.wait_seconds += waited.elapsed().as_secs_f64();
        let began = Instant::now();
        let len = grads.len();
        let mut start = 0;
        while start < len {
            let n = bucket.min(len - start);
            let range = View::new(grads, start, [n]);
            if world.size() > 1 {
                backend.scale(range, 1.0 / world.size() as f32)?;
            }
            let region = backend
                .device_region(range)?
                .ok_or(crate::DistError::NcclNeedsDevice)?;
            // SAFETY: the region is `n` floats of `grads`, which outlives the stream's
            // work (synchronised below); the stream is the backend's own.
            unsafe { comm.all_reduce_sum_in_place(region.ptr, region.len, region.stream)? };
            start += n;
        }
        backend.synchronize()?;
        stats.calls += 1;
        stats.seconds += began.elapsed().as_secs_f64();
        stats.bytes += 4 * len as u64;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::NcclMode;

    #[test]
    fn nccl_mode_reads_on_off_auto_and_names_a_bad_value() {
        assert_eq!(NcclMode::parse(None), Ok(NcclMode::Auto));
        assert_eq!(NcclMode::parse(Some("auto")), Ok(NcclMode::Auto));
        assert_eq!(NcclMode::parse(Some(" ON")), Ok(NcclMode::On));
        assert_eq!(NcclMode::parse(Some("1")), Ok(NcclMode::On));
        assert_eq!(NcclMode::parse(Some("off")), Ok(NcclMode::Off));
        let e = NcclMode::parse(Some("yes")).unwrap_err();
        assert!(e.contains("ANDREA_NCCL=yes") && e.contains("auto"), "{e}");
    }
}
