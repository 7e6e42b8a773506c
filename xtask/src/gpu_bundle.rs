//! `cargo xtask gpu-bundle [--ptx-only] [--dev]`: builds, on this machine (no GPU needed, against
//! the link stub), everything that checks and measures andrea on a GPU, and puts it with
//! `run.sh` (`scripts/gpu-check.sh`) into `target/gpu-bundle/`:
//!
//! ```text
//! target/gpu-bundle/
//!   run.sh          the one script: phases under a time budget, results under $OUT
//!   summary.py      the summary table of run.sh's rows (scripts/gpu-summary.py)
//!   bin/            test binaries: andrea-cuda's (conformance, CPU-vs-CUDA op by op and
//!                   the whole model) and andrea-cli's `--backend cuda` test
//!   andrea          the release `andrea` binary with `--features cuda,nccl` (NCCL
//!                   loaded at run time: the 1-rank NCCL row)
//!   gpu_check       production-shape checks and timings (andrea-cuda/examples/gpu_check/)
//!   bench/ops       the ops bench with its CUDA columns (criterion, release profile)
//!   peers/          the PyTorch peer scripts (benches/pytorch)
//!   configs/        tiny.toml and andrea-120m.toml
//!   kernels/        <module>.fatbin, the machine code every binary above loads
//! ```
//!
//! The kernels travel as fatbins (sm_80 and sm_90 machine code plus the PTX, from
//! `cargo xtask build-kernels`, which needs nvcc: see kernels/README.md), once, in
//! `kernels/`, which each binary reads at start (`andrea_cuda::ptx::KERNEL_DIR_ENV`, else
//! `kernels/` next to it or one folder up), so nothing is JIT-compiled on the GPU machine; `--ptx-only` builds without them (the driver then
//! compiles the PTX at start). Copy the folder to a machine with an NVIDIA GPU and a
//! CUDA 13 driver (580+) but no Rust, and run `./run.sh` there. The binaries are built
//! with `ANDREA_CUDA_NO_RPATH`, so they load that machine's driver, never a path on this
//! one (`LD_LIBRARY_PATH=target/cuda-emu/lib64 target/gpu-bundle/run.sh --emulator` runs
//! the bundle on the emulator). Debug info is stripped. Builds into `$CARGO_TARGET_DIR`
//! when set, else `target/`. Fails when the bundle passes 60 MiB (the GPU lease carries
//! 64 MiB).
//!
//! `--dev` is for the emulator dry run (.ci/run), where only that every phase runs
//! matters: everything is built in the dev profile (its dependencies and hot crates are
//! optimised as in release, see the workspace Cargo.toml) with the packages and features
//! of .ci/run's CUDA + MPI + NCCL build ([`DEV_SELECTION`]: `andrea` then has the `mpi`
//! feature too), which reuses CI's build instead of compiling the whole tree again in
//! release (about 15 minutes on 2 cores), and the PTX-against-sources check is left to
//! `cargo xtask build-kernels --check`. The bundle then holds a `DEV-BUILD` file and
//! `run.sh` warns that its timings are not release timings. Never carry it to a GPU.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// An artifact of a cargo build: (executable, target kind, target name).
type Artifact = (PathBuf, String, String);

/// Runs `cargo <args> --message-format=json` against the stub and returns the
/// executables it built, with their package.
fn cargo_build_in(
    root: &Path,
    target_dir: &Path,
    fatbins: Option<&Path>,
    args: &[&str],
) -> Result<Vec<(PathBuf, String, String, String)>, String> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let mut cmd = Command::new(&cargo);
    match fatbins {
        // Named, not embedded: the binaries read them from the bundle's kernels/.
        Some(dir) => cmd
            .env("ANDREA_CUDA_FATBIN_DIR", dir)
            .env("ANDREA_CUDA_FATBIN_EXTERNAL", "1"),
        None => cmd
            .env_remove("ANDREA_CUDA_FATBIN_DIR")
            .env_remove("ANDREA_CUDA_FATBIN_EXTERNAL"),
    };
    let out = cmd
        .args(args)
        .args(["--message-format=json", "--target-dir"])
        .arg(target_dir)
        .env("CUDA_LIBRARY_PATH", root.join("target/cuda-stub"))
        // The binaries must load the GPU machine's driver, never a path on this machine.
        .env("ANDREA_CUDA_NO_RPATH", "1")
        .current_dir(root)
        .stderr(Stdio::inherit())
        .output()
        .map_err(|e| format!("running cargo: {e}"))?;
    if !out.status.success() {
        return Err(format!("`cargo {}` failed", args.join(" ")));
    }
    let mut found = Vec::new();
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let Ok(msg) = serde_json::from_str::<serde_json::Value>(line) else {
            continue;
        };
        let exe = msg.get("executable").and_then(|e| e.as_str());
        let name = msg.pointer("/target/name").and_then(|n| n.as_str());
        let kind = msg.pointer("/target/kind/0").and_then(|k| k.as_str());
        let package = msg
            .get("package_id")
            .and_then(|p| p.as_str())
            .map(package_of);
        if let (Some(exe), Some(name), Some(kind)) = (exe, name, kind) {
            let package = package.unwrap_or_default().to_string();
            found.push((
                PathBuf::from(exe),
                kind.to_string(),
                name.to_string(),
                package,
            ));
        }
    }
    Ok(found)
}

/// [`cargo_build_in`] without the packages.
fn cargo_build(
    root: &Path,
    target_dir: &Path,
    fatbins: Option<&Path>,
    args: &[&str],
) -> Result<Vec<Artifact>, String> {
    Ok(cargo_build_in(root, target_dir, fatbins, args)?
        .into_iter()
        .map(|(exe, kind, name, _)| (exe, kind, name))
        .collect())
}

/// The bundle's binaries in release: andrea-cuda's tests and andrea-cli's `cuda` test,
/// then `andrea`, `gpu_check` and the ops bench, one build each. Returns (test binaries,
/// bytes installed).
fn release_binaries(
    root: &Path,
    target_dir: &Path,
    fatbins: Option<&Path>,
    bundle: &Path,
) -> Result<(usize, u64), String> {
    let (mut tests, mut bytes) = (0, 0u64);
    // Test binaries: every one of andrea-cuda's, and andrea-cli's `--backend cuda` test
    // (its other tests need no GPU).
    let cuda_tests = cargo_build(
        root,
        target_dir,
        fatbins,
        &[
            "test",
            "-p",
            "andrea-cuda",
            "--features",
            "cuda",
            "--no-run",
        ],
    )?;
    let cli_tests = cargo_build(
        root,
        target_dir,
        fatbins,
        &[
            "test",
            "-p",
            "andrea-cli",
            "--features",
            "cuda",
            "--test",
            "cuda",
            "--no-run",
        ],
    )?;
    // `cargo test --no-run` also builds the examples; only the test binaries travel here.
    for (exe, kind, name) in cuda_tests
        .into_iter()
        .filter(|(_, k, _)| k == "test" || k == "lib")
    {
        bytes += install(&exe, &bundle.join(format!("bin/{kind}-{name}")))?;
        tests += 1;
    }
    for (exe, kind, name) in cli_tests.into_iter().filter(|(_, k, _)| k == "test") {
        bytes += install(&exe, &bundle.join(format!("bin/{kind}-andrea-cli-{name}")))?;
        tests += 1;
    }

    // Release builds of one target each: (cargo command, package, features, target flag,
    // target kind, target name, where it goes in the bundle).
    let singles = [
        (
            "build",
            "andrea-cli",
            "cuda,nccl",
            "--bin",
            "bin",
            "andrea",
            "andrea",
        ),
        (
            "build",
            "andrea-cuda",
            "cuda",
            "--example",
            "example",
            "gpu_check",
            "gpu_check",
        ),
        (
            "build",
            "andrea-benches",
            "cuda",
            "--bench",
            "bench",
            "ops",
            "bench/ops",
        ),
    ];
    for (command, package, features, flag, kind, name, dst) in singles {
        // All three in the release profile, so they share one build of their dependencies
        // (`cargo bench --no-run` would build the bench profile's own copy: +2 minutes).
        let args = [
            command,
            "-p",
            package,
            "--features",
            features,
            flag,
            name,
            "--release",
        ];
        let built = cargo_build(root, target_dir, fatbins, &args)?;
        let (exe, _, _) = built
            .iter()
            .find(|(_, k, n)| k == kind && n == name)
            .ok_or_else(|| format!("cargo built no `{name}` {kind}"))?;
        bytes += install(exe, &bundle.join(dst))?;
    }

    Ok((tests, bytes))
}

/// The packages and features of `--dev`: the same as .ci/run's CUDA + MPI + NCCL build
/// (`ALL` and `FEATURES` there), so that cargo resolves the dependencies' features the
/// same way and the dry run's bundle reuses what CI already built (another selection
/// rebuilds most of the tree). Keep the two in step; a difference costs time, not results.
const DEV_SELECTION: [&str; 12] = [
    "-p",
    "andrea-cuda",
    "-p",
    "andrea",
    "-p",
    "andrea-cli",
    "-p",
    "andrea-benches",
    "-p",
    "andrea-dist",
    "--features",
    "andrea-cuda/cuda,andrea/cuda,andrea-cli/cuda,andrea-cli/mpi,andrea-cli/nccl,andrea-benches/cuda",
];

/// The package an artifact's `package_id` names (`path+file:///.../andrea-cuda#0.1.0`, or
/// `...#name@0.1.0` where the folder has another name).
fn package_of(id: &str) -> &str {
    let (path, rest) = id.rsplit_once('#').unwrap_or((id, ""));
    match rest.split_once('@') {
        Some((name, _)) => name,
        None => path.rsplit('/').next().unwrap_or(path),
    }
}

/// The bundle's binaries in the dev profile, from two cargo runs over [`DEV_SELECTION`]
/// (see `--dev` in the module docs). Returns (test binaries, bytes installed).
fn dev_binaries(
    root: &Path,
    target_dir: &Path,
    fatbins: Option<&Path>,
    bundle: &Path,
) -> Result<(usize, u64), String> {
    let (mut tests, mut bytes) = (0, 0u64);
    let mut args = vec!["test", "--no-run", "--lib", "--tests"];
    args.extend(DEV_SELECTION);
    for (exe, kind, name, package) in cargo_build_in(root, target_dir, fatbins, &args)? {
        let wanted = match package.as_str() {
            "andrea-cuda" => kind == "test" || kind == "lib",
            "andrea-cli" => kind == "test" && name == "cuda",
            _ => false,
        };
        if !wanted {
            continue;
        }
        let dst = if package == "andrea-cli" {
            format!("bin/{kind}-andrea-cli-{name}")
        } else {
            format!("bin/{kind}-{name}")
        };
        bytes += install(&exe, &bundle.join(dst))?;
        tests += 1;
    }
    let mut args = vec![
        "build",
        "--bin",
        "andrea",
        "--example",
        "gpu_check",
        "--bench",
        "ops",
    ];
    args.extend(DEV_SELECTION);
    let built = cargo_build_in(root, target_dir, fatbins, &args)?;
    for (kind, name, dst) in [
        ("bin", "andrea", "andrea"),
        ("example", "gpu_check", "gpu_check"),
        ("bench", "ops", "bench/ops"),
    ] {
        let (exe, ..) = built
            .iter()
            .find(|(_, k, n, _)| k == kind && n == name)
            .ok_or_else(|| format!("cargo built no `{name}` {kind}"))?;
        bytes += install(exe, &bundle.join(dst))?;
    }
    Ok((tests, bytes))
}

/// Copies `exe` to `dst` without its debug info; returns the copy's size.
fn install(exe: &Path, dst: &Path) -> Result<u64, String> {
    if let Some(dir) = dst.parent() {
        std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    }
    std::fs::copy(exe, dst).map_err(|e| format!("copying {}: {e}", exe.display()))?;
    // Debug info is most of a test binary; the bundle travels without it.
    let _ = Command::new("strip").arg("--strip-debug").arg(dst).status();
    Ok(std::fs::metadata(dst).map(|m| m.len()).unwrap_or(0))
}

/// Bundles bigger than this do not travel with the GPU lease (64 MiB with the tree).
const MAX_BUNDLE_MIB: f64 = 60.0;

fn copy(src: &Path, dst: &Path) -> Result<u64, String> {
    if let Some(dir) = dst.parent() {
        std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    }
    std::fs::copy(src, dst).map_err(|e| format!("copying {}: {e}", src.display()))
}

fn executable(p: &Path) -> Result<(), String> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(p, std::fs::Permissions::from_mode(0o755))
        .map_err(|e| format!("{}: {e}", p.display()))
}

/// How `gpu-bundle` was asked to build.
#[derive(Debug, Clone, Copy, Default)]
pub struct Options {
    /// No fatbins: the driver JIT-compiles the PTX at start.
    pub ptx_only: bool,
    /// Dev profile, no PTX check: the emulator dry run only (see the module docs).
    pub dev: bool,
}

impl Options {
    pub fn parse(args: &[String]) -> Result<Options, String> {
        let mut o = Options::default();
        for a in args {
            match a.as_str() {
                "--ptx-only" => o.ptx_only = true,
                "--dev" => o.dev = true,
                other => return Err(format!("gpu-bundle: unknown argument `{other}`")),
            }
        }
        Ok(o)
    }
}

pub fn run(root: &Path, opts: Options) -> Result<(), String> {
    crate::cuda_stub::run(root)?;
    let fat_dir = root.join(crate::build_kernels::FATBIN_DIR);
    let fatbins = if opts.ptx_only {
        None
    } else {
        if !opts.dev {
            crate::build_kernels::run(root, true).map_err(|e| {
                format!("{e}\n(the bundle embeds machine code built by nvcc; install it as kernels/README.md says, or pass --ptx-only)")
            })?;
        }
        // From the committed PTX; those `build-kernels` (or its `--check`) made from the same
        // PTX are reused.
        crate::build_kernels::fatbins_only(root, &fat_dir)?;
        Some(fat_dir.as_path())
    };
    let target_dir = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| root.join("target"));
    let bundle = root.join("target/gpu-bundle");
    let _ = std::fs::remove_dir_all(&bundle);
    let mut total = 0u64;
    let mut tests = 0;

    if opts.dev {
        let (n, bytes) = dev_binaries(root, &target_dir, fatbins, &bundle)?;
        tests += n;
        total += bytes;
    } else {
        let (n, bytes) = release_binaries(root, &target_dir, fatbins, &bundle)?;
        tests += n;
        total += bytes;
    }

    if let Some(dir) = fatbins {
        let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
            .map_err(|e| format!("{}: {e}", dir.display()))?
            .flatten()
            .map(|e| e.path())
            .filter(|p| p.extension().is_some_and(|x| x == "fatbin"))
            .collect();
        files.sort();
        if files.is_empty() {
            return Err(format!("{}: no .fatbin files", dir.display()));
        }
        for f in files {
            let name = f.file_name().unwrap_or_default();
            total += copy(&f, &bundle.join("kernels").join(name))?;
        }
    }

    let configs = bundle.join("configs");
    std::fs::create_dir_all(&configs).map_err(|e| format!("{}: {e}", configs.display()))?;
    for c in ["tiny.toml", "andrea-120m.toml"] {
        let src = root.join("configs").join(c);
        std::fs::copy(&src, configs.join(c))
            .map_err(|e| format!("copying {}: {e}", src.display()))?;
    }

    for (src, dst) in [
        ("scripts/gpu-check.sh", "run.sh"),
        ("scripts/gpu-summary.py", "summary.py"),
        ("benches/pytorch/gpu_peers.py", "peers/gpu_peers.py"),
        ("benches/pytorch/train_step.py", "peers/train_step.py"),
    ] {
        total += copy(&root.join(src), &bundle.join(dst))?;
    }
    executable(&bundle.join("run.sh"))?;
    if opts.dev {
        let note = bundle.join("DEV-BUILD");
        std::fs::write(
            &note,
            "built with `cargo xtask gpu-bundle --dev`: the dev profile, for the emulator \
             dry run; its timings are not release timings\n",
        )
        .map_err(|e| format!("{}: {e}", note.display()))?;
    }
    let mib = total as f64 / (1024.0 * 1024.0);
    if mib > MAX_BUNDLE_MIB {
        return Err(format!(
            "{}: {mib:.1} MiB, more than the {MAX_BUNDLE_MIB} MiB a GPU lease carries",
            bundle.display()
        ));
    }
    println!(
        "{}: {tests} test binaries, andrea, gpu_check, the ops bench and the peer scripts, \
         {mib:.1} MiB, kernels as {}; copy the folder to a GPU machine and run ./run.sh",
        bundle.display(),
        if fatbins.is_some() {
            "fatbins (sm_80, sm_90 + PTX)"
        } else {
            "PTX only (JIT at start)"
        }
    );
    if opts.dev {
        println!("(--dev: dev-profile binaries, for the emulator dry run only)");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::package_of;

    #[test]
    fn package_ids_name_their_package() {
        assert_eq!(
            package_of("path+file:///w/crates/andrea-cuda#0.1.0"),
            "andrea-cuda"
        );
        assert_eq!(
            package_of("path+file:///w/benches#andrea-benches@0.1.0"),
            "andrea-benches"
        );
        assert_eq!(
            package_of("registry+https://github.com/rust-lang/crates.io-index#serde@1.0.0"),
            "serde"
        );
    }
}
