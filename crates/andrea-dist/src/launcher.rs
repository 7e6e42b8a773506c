//! What the launcher tells a process through its environment: the world size and this
//! process's rank on its machine. Read before MPI starts, so that a build without MPI
//! can refuse to run as one of several ranks, and a GPU rank can pick its device.

/// A world size found in the environment, and who set it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LauncherSize {
    pub launcher: &'static str,
    pub var: &'static str,
    pub size: usize,
}

/// World-size variables, most specific first. `SLURM_STEP_NUM_TASKS` (set by `srun` for
/// its job step) rather than `SLURM_NTASKS`, which a batch script's own shell also has:
/// that shell is one process even when the allocation has many tasks.
const SIZE_VARS: [(&str, &str); 5] = [
    ("Open MPI's mpirun", "OMPI_COMM_WORLD_SIZE"),
    ("an MPICH or Intel MPI launcher", "PMI_SIZE"),
    ("MVAPICH's launcher", "MV2_COMM_WORLD_SIZE"),
    ("a PMIx launcher", "PMIX_SIZE"),
    ("SLURM's srun", "SLURM_STEP_NUM_TASKS"),
];

/// Local-rank variables (this process's index among the ranks on its machine).
const LOCAL_RANK_VARS: [&str; 4] = [
    "OMPI_COMM_WORLD_LOCAL_RANK",
    "MPI_LOCALRANKID",
    "MV2_COMM_WORLD_LOCAL_RANK",
    "SLURM_LOCALID",
];

fn parse(value: Option<String>) -> Option<usize> {
    value.and_then(|v| v.trim().parse().ok())
}

/// The world size a launcher set in `env` (a lookup, `std::env::var` in use), if any.
pub fn world_size_in(env: impl Fn(&str) -> Option<String>) -> Option<LauncherSize> {
    SIZE_VARS.iter().find_map(|&(launcher, var)| {
        parse(env(var)).map(|size| LauncherSize {
            launcher,
            var,
            size,
        })
    })
}

/// The world size the launcher of this process set, if any.
pub fn launcher_world_size() -> Option<LauncherSize> {
    world_size_in(|v| std::env::var(v).ok())
}

/// Local-size variables (ranks on this machine).
const LOCAL_SIZE_VARS: [&str; 3] = [
    "OMPI_COMM_WORLD_LOCAL_SIZE",
    "MPI_LOCALNRANKS",
    "MV2_COMM_WORLD_LOCAL_SIZE",
];

/// The number of ranks the launcher started on this machine, where it says so (SLURM's
/// per-node counts come in a compressed form, `2(x3)`, and are not read).
pub fn launcher_local_size() -> Option<usize> {
    local_size_in(|v| std::env::var(v).ok())
}

fn local_size_in(env: impl Fn(&str) -> Option<String>) -> Option<usize> {
    LOCAL_SIZE_VARS.iter().find_map(|var| parse(env(var)))
}

/// This process's rank on its machine: `ANDREA_LOCAL_RANK` if set, else the launcher's.
pub fn launcher_local_rank() -> Option<usize> {
    std::iter::once("ANDREA_LOCAL_RANK")
        .chain(LOCAL_RANK_VARS)
        .find_map(|var| parse(std::env::var(var).ok()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env<'a>(pairs: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<String> + 'a {
        move |k| {
            pairs
                .iter()
                .find(|(n, _)| *n == k)
                .map(|(_, v)| v.to_string())
        }
    }

    #[test]
    fn finds_the_size_of_each_launcher_and_prefers_the_mpi_one() {
        assert_eq!(world_size_in(env(&[])), None);
        let ompi = world_size_in(env(&[("OMPI_COMM_WORLD_SIZE", "4")])).unwrap();
        assert_eq!((ompi.var, ompi.size), ("OMPI_COMM_WORLD_SIZE", 4));
        let srun = world_size_in(env(&[("SLURM_STEP_NUM_TASKS", "8")])).unwrap();
        assert_eq!((srun.var, srun.size), ("SLURM_STEP_NUM_TASKS", 8));
        // mpirun inside a SLURM step: MPI's own count wins.
        let both = env(&[("SLURM_STEP_NUM_TASKS", "1"), ("PMI_SIZE", "3")]);
        assert_eq!(world_size_in(both).unwrap().size, 3);
        // A batch script's shell (SLURM_NTASKS only) is not a rank of a step.
        assert_eq!(world_size_in(env(&[("SLURM_NTASKS", "16")])), None);
        assert_eq!(world_size_in(env(&[("PMI_SIZE", "x")])), None);
    }

    #[test]
    fn finds_the_ranks_on_this_machine() {
        assert_eq!(local_size_in(env(&[])), None);
        let both = env(&[
            ("OMPI_COMM_WORLD_LOCAL_SIZE", "4"),
            ("MPI_LOCALNRANKS", "2"),
        ]);
        assert_eq!(local_size_in(both), Some(4));
        assert_eq!(local_size_in(env(&[("MPI_LOCALNRANKS", "2")])), Some(2));
    }
}
