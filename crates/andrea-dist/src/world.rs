//! [`World`]: the ranks of a data-parallel run and the few collectives training needs.

use crate::launcher::{launcher_world_size, LauncherSize};
use crate::{DistError, Result};

/// This process's place among the ranks: `MPI_COMM_WORLD` with the `mpi` feature when a
/// launcher started several ranks, else a world of one (every collective is then the
/// identity and costs nothing).
///
/// MPI is initialised with `MPI_THREAD_SERIALIZED`: andrea calls it from whichever
/// thread runs the command (a worker of the CPU backend's pool), one call at a time.
pub struct World {
    rank: usize,
    size: usize,
    #[cfg(feature = "mpi")]
    mpi: Option<Mpi>,
}

/// The communicator, then the universe: dropped in this order, the universe last
/// (its drop is `MPI_Finalize`).
#[cfg(feature = "mpi")]
struct Mpi {
    comm: mpi::topology::SimpleCommunicator,
    _universe: mpi::environment::Universe,
}

impl World {
    /// A world of one, whatever the environment says.
    pub fn solo() -> World {
        World {
            rank: 0,
            size: 1,
            #[cfg(feature = "mpi")]
            mpi: None,
        }
    }

    /// The world the launcher started this process in (see the type's docs). Without the
    /// `mpi` feature a launcher's world of several ranks is refused
    /// ([`DistError::NotBuiltWithMpi`]). A process started alone does not start MPI.
    pub fn init() -> Result<World> {
        match launcher_world_size() {
            Some(l) if l.size > 1 => Self::init_mpi(l),
            _ => Ok(World::solo()),
        }
    }

    #[cfg(not(feature = "mpi"))]
    fn init_mpi(l: LauncherSize) -> Result<World> {
        Err(DistError::NotBuiltWithMpi {
            launcher: l.launcher,
            var: l.var,
            size: l.size,
        })
    }

    #[cfg(feature = "mpi")]
    fn init_mpi(l: LauncherSize) -> Result<World> {
        use mpi::traits::Communicator;
        use mpi::Threading;
        let (universe, provided) = mpi::initialize_with_threading(Threading::Serialized)
            .ok_or_else(|| DistError::Init("already initialised".into()))?;
        if provided < Threading::Serialized {
            return Err(DistError::Init(format!("it provides {provided:?}")));
        }
        let comm = universe.world();
        let (rank, size) = (comm.rank() as usize, comm.size() as usize);
        if size != l.size {
            return Err(DistError::WorldMismatch {
                what: "MPI's world size",
                var: l.var,
                expected: l.size,
                got: size,
            });
        }
        Ok(World {
            rank,
            size,
            mpi: Some(Mpi {
                comm,
                _universe: universe,
            }),
        })
    }

    pub fn rank(&self) -> usize {
        self.rank
    }

    pub fn size(&self) -> usize {
        self.size
    }

    /// Rank 0, the one that prints, logs and writes checkpoints.
    pub fn is_root(&self) -> bool {
        self.rank == 0
    }

    /// `recv = Σ_ranks send`, element by element (`MPI_Allreduce` with `MPI_SUM`).
    pub fn sum_f32(&self, send: &[f32], recv: &mut [f32]) {
        assert_eq!(send.len(), recv.len(), "sum_f32: buffer lengths differ");
        #[cfg(feature = "mpi")]
        if let Some(m) = &self.mpi {
            use mpi::collective::SystemOperation;
            use mpi::traits::CommunicatorCollectives;
            m.comm.all_reduce_into(send, recv, SystemOperation::sum());
            return;
        }
        recv.copy_from_slice(send);
    }

    /// `values = Σ_ranks values`, in place (losses, counts: a few numbers). A world of
    /// one leaves them as they are.
    #[cfg_attr(not(feature = "mpi"), allow(unused_variables))]
    pub fn sum_f64(&self, values: &mut [f64]) {
        #[cfg(feature = "mpi")]
        if let Some(m) = &self.mpi {
            use mpi::collective::SystemOperation;
            use mpi::traits::CommunicatorCollectives;
            let send = values.to_vec();
            m.comm
                .all_reduce_into(&send[..], values, SystemOperation::sum());
        }
    }

    /// Rank 0's `bytes` on every rank (`MPI_Bcast`; all ranks pass the same length).
    #[cfg_attr(not(feature = "mpi"), allow(unused_variables))]
    pub fn broadcast_bytes(&self, bytes: &mut [u8]) {
        #[cfg(feature = "mpi")]
        if let Some(m) = &self.mpi {
            use mpi::traits::{Communicator, Root};
            m.comm.process_at_rank(0).broadcast_into(bytes);
        }
    }

    /// The smallest and the largest of the ranks' `value`s.
    fn min_max(&self, value: u64) -> (u64, u64) {
        #[cfg(feature = "mpi")]
        if let Some(m) = &self.mpi {
            use mpi::collective::SystemOperation;
            use mpi::traits::CommunicatorCollectives;
            let (mut lo, mut hi) = (0u64, 0u64);
            m.comm
                .all_reduce_into(&value, &mut lo, SystemOperation::min());
            m.comm
                .all_reduce_into(&value, &mut hi, SystemOperation::max());
            return (lo, hi);
        }
        (value, value)
    }

    /// Whether any rank's `flag` is set (a stop request seen by one rank stops all of
    /// them after the same step).
    pub fn any(&self, flag: bool) -> bool {
        self.min_max(flag as u64).1 == 1
    }

    /// Checks that every rank has the same `value` (a hash of its settings): a clear
    /// error on every rank otherwise, before any work is wasted.
    pub fn agree(&self, what: &str, value: u64) -> Result<()> {
        let (lo, hi) = self.min_max(value);
        if lo != hi {
            return Err(DistError::Mismatch {
                what: what.to_string(),
                rank: self.rank,
                mine: value,
            });
        }
        Ok(())
    }

    /// Waits until every rank has come here (after rank 0's checkpoint, so that it is
    /// complete before anyone goes on).
    pub fn barrier(&self) {
        #[cfg(feature = "mpi")]
        if let Some(m) = &self.mpi {
            use mpi::traits::CommunicatorCollectives;
            m.comm.barrier();
        }
    }

    /// Ends every rank of the job with exit status `code` (`MPI_Abort`): what a rank does
    /// after an error the others cannot know about, instead of leaving them waiting in a
    /// collective. A world of one just exits.
    pub fn abort(&self, code: i32) -> ! {
        #[cfg(feature = "mpi")]
        if let Some(m) = &self.mpi {
            use mpi::traits::Communicator;
            m.comm.abort(code);
        }
        std::process::exit(code)
    }
}

impl std::fmt::Debug for World {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "World {{ rank: {}, size: {} }}", self.rank, self.size)
    }
}
