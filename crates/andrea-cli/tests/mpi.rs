//! Data parallelism under `mpirun` (build with `--features mpi`; needs Open MPI's
//! `mpirun` on PATH, or `MPIRUN`): W ranks must train what one process trains with
//! `--grad-accum` W times larger — bit for bit with 2 ranks, to rounding with 3 — and
//! checkpoints resume on any world size with the same global batch. One thread per
//! rank, so the tests mean the same on any machine.
andrea_testkit::tests_need_feature!("mpi", "Open MPI: see .ci/run");

#[cfg(feature = "mpi")]
mod common;

#[cfg(feature = "mpi")]
#[path = "mpi/tests.rs"]
mod tests;
