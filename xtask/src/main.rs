//! `cargo xtask <task>`: developer tasks that are not part of the library.
//!
//! * `bench-report [DIR]`: a markdown table of the criterion results under
//!   `target/criterion` (or DIR): the median throughput of every benchmark, one column
//!   per backend or peer, and the share of this machine's measured peak (the `peak/*`
//!   benchmarks of the same run).
//! * `build-kernels [--check]`: kernels/*.cu to the committed PTX of andrea-cuda, with
//!   ptxas register/spill reports for sm_80 and sm_90 ([`build_kernels`]).
//! * `sass-report [--json] [--check]`: registers, spills, shared memory and the
//!   tensor-core main loops' instructions per HMMA, read from the kernels' machine code
//!   ([`sass_report`]).
//! * `cuda-stub`: a libcuda link stub so the `cuda` feature builds and tests without
//!   CUDA ([`cuda_stub`]).
//! * `cuda-emu`: a libcuda that runs the kernels on the CPU, so the backend's tests run
//!   without a GPU ([`cuda_emu`]).
//! * `gpu-bundle`: the CUDA test binaries and `run.sh`, for a GPU machine without Rust
//!   ([`gpu_bundle`]).

mod bench_report;
mod build_kernels;
mod cuda_emu;
mod cuda_stub;
mod fatbin;
mod gpu_bundle;
mod nvcc;
mod sass;
mod sass_loops;
mod sass_report;
mod sass_thresholds;

use std::path::PathBuf;
use std::process::ExitCode;

const HELP: &str = "usage: cargo xtask <task>

tasks:
  bench-report [DIR]      table of criterion medians (default DIR: target/criterion)
  build-kernels [--check] compile kernels/*.cu to crates/andrea-cuda/ptx (--check: verify only)
  sass-report [--json] [--check]
                          per kernel (sm_90, sm_80): registers, spills, shared memory, and the
                          tensor-core main loop's instructions per HMMA, from the machine code
                          (--check: hold them to kernels/sass-thresholds.tsv)
  cuda-stub               build target/cuda-stub/lib64/libcuda.so (CUDA_LIBRARY_PATH=target/cuda-stub)
  cuda-emu                build target/cuda-emu/lib64/libcuda.so: kernels emulated on the CPU
  gpu-bundle [--ptx-only] [--dev]
                          CUDA test binaries, checks, benches + run.sh in target/gpu-bundle
                          (--dev: dev profile, for the emulator dry run only)";

/// The workspace root (the xtask crate's parent folder).
fn root() -> PathBuf {
    let here = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    here.parent().map(PathBuf::from).unwrap_or(here)
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let result = match args.first().map(String::as_str) {
        Some("bench-report") => bench_report::run(args.get(1).map(String::as_str)),
        Some("build-kernels") => match args.get(1).map(String::as_str) {
            None => build_kernels::run(&root(), false),
            Some("--check") => build_kernels::run(&root(), true),
            Some(other) => Err(format!("build-kernels: unknown argument `{other}`")),
        },
        Some("sass-report") => sass_report::Options::parse(&args[1..]).and_then(sass_report::run),
        Some("cuda-stub") => cuda_stub::run(&root()),
        Some("cuda-emu") => cuda_emu::run_task(&root()),
        Some("gpu-bundle") => {
            gpu_bundle::Options::parse(&args[1..]).and_then(|o| gpu_bundle::run(&root(), o))
        }
        Some("help") | Some("--help") | None => {
            println!("{HELP}");
            Ok(())
        }
        Some(other) => Err(format!("unknown task `{other}`; run `cargo xtask help`")),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("xtask: {e}");
            ExitCode::FAILURE
        }
    }
}
