//! The tests of `tests/mpi.rs`, built with the `mpi` feature.

use crate::common::*;
use std::path::Path;
use std::process::{Command, Output};

use andrea::{DefaultBackend, Model};

/// `mpirun -np <ranks> andrea --threads 1 <args>` in `dir`, `env` passed to every rank.
fn mpirun_command(dir: &Path, ranks: usize, env: &[(&str, &str)], args: &[&str]) -> Command {
    let launcher = std::env::var("MPIRUN").unwrap_or_else(|_| "mpirun".into());
    let mut cmd = Command::new(&launcher);
    // As root (CI containers) Open MPI wants both variables; --oversubscribe lets 3 ranks
    // run on 2 cores.
    cmd.current_dir(dir)
        .env("OMPI_ALLOW_RUN_AS_ROOT", "1")
        .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
        .args(["--oversubscribe", "-np", &ranks.to_string()]);
    for (k, v) in env {
        cmd.args(["-x", &format!("{k}={v}")]);
    }
    cmd.arg(binary()).args(["--threads", "1"]).args(args);
    cmd
}

fn cannot_start(e: std::io::Error) -> ! {
    panic!(
        "cannot start mpirun: {e}; install Open MPI (`apt-get install openmpi-bin \
         libopenmpi-dev`) or set MPIRUN"
    )
}

/// [`mpirun_command`], run to its end; it must succeed.
fn mpirun(dir: &Path, ranks: usize, env: &[(&str, &str)], args: &[&str]) -> Output {
    let out = mpirun_command(dir, ranks, env, args)
        .output()
        .unwrap_or_else(|e| cannot_start(e));
    assert!(
        out.status.success(),
        "mpirun -np {ranks} andrea {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// The flags of every run: 8 steps, validation at 4 and 8, a checkpoint at 4 and 8.
fn train(extra: &[&str]) -> Vec<String> {
    let flags = [
        "--steps",
        "8",
        "--eval-every",
        "4",
        "--checkpoint-every",
        "4",
    ];
    [TRAIN_TINY, &flags, extra]
        .concat()
        .iter()
        .map(|s| s.to_string())
        .collect()
}

fn strs(v: &[String]) -> Vec<&str> {
    v.iter().map(String::as_str).collect()
}

/// The two runs trained the same: every logged train loss and gradient norm equal, the
/// validation losses equal to rounding (summed in another order), and the newest
/// checkpoints' weights and AdamW moments byte for byte.
fn assert_same_run(dir: &Path, a: &str, b: &str) {
    let (ma, mb) = (metrics(&dir.join(a)), metrics(&dir.join(b)));
    assert_eq!(
        ma.len(),
        mb.len(),
        "{a} and {b} logged different step counts"
    );
    for (x, y) in ma.iter().zip(&mb) {
        assert_eq!(x["step"], y["step"]);
        assert_eq!(
            x["train_loss"], y["train_loss"],
            "{a} vs {b} at {}",
            x["step"]
        );
        assert_eq!(
            x["grad_norm"], y["grad_norm"],
            "{a} vs {b} at {}",
            x["step"]
        );
        if let (Some(u), Some(v)) = (x["val_loss"].as_f64(), y["val_loss"].as_f64()) {
            assert!((u - v).abs() <= 1e-6 * u.abs(), "val loss {u} vs {v}");
        }
    }
    for f in ["model.safetensors", "optimizer.safetensors"] {
        let (x, y) = (
            bytes(dir.join(a).join("latest").join(f)),
            bytes(dir.join(b).join("latest").join(f)),
        );
        assert!(x == y, "{f} differs byte for byte between {a} and {b}");
    }
}

#[test]
fn two_ranks_train_bit_for_bit_what_one_process_trains_with_twice_the_accumulation() {
    let tmp = prepared("50");
    let dir = tmp.path();
    ok(dir, &strs(&train(&["--grad-accum", "2", "--out", "one"])));
    let out = mpirun(dir, 2, &[], &strs(&train(&["--out", "two"])));
    let log = String::from_utf8_lossy(&out.stderr);
    // Rank 0 alone prints.
    assert_eq!(log.matches("done: 8 steps").count(), 1, "{log}");
    assert!(log.contains("2 ranks"), "{log}");
    assert_same_run(dir, "one", "two");
}

/// `--total-batch-tokens` is the global batch: the same flag on 1 and 2 ranks is the same
/// run, and a total that the ranks cannot split is refused on every rank.
#[test]
fn total_batch_tokens_mean_the_same_run_on_any_world_size() {
    let tmp = prepared("50");
    let dir = tmp.path();
    // The tiny config's micro-batch is 4 x 32 = 128 tokens.
    ok(
        dir,
        &strs(&train(&["--total-batch-tokens", "256", "--out", "one"])),
    );
    let two = train(&["--total-batch-tokens", "256", "--out", "two"]);
    mpirun(dir, 2, &[], &strs(&two));
    assert_same_run(dir, "one", "two");
    let odd = train(&["--total-batch-tokens", "384", "--out", "odd"]);
    let out = mpirun_command(dir, 2, &[], &strs(&odd)).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("ranks x --batch-size x --seq-len = 2 x 4 x 32 = 256"),
        "{err}"
    );
}

/// Shuffled windows, two micro-batches per rank against four in one process, and buckets
/// of 1000 floats (the tiny model's gradient is 37 buckets, the last one partial): the
/// same windows, and the sums `(g₁+g₂)+(g₃+g₄)` against `((g₁+g₂)+g₃)+g₄`, so equal to
/// rounding, checked on the weights.
#[test]
fn buckets_shuffling_and_accumulation_per_rank_read_the_same_windows() {
    let tmp = prepared("50");
    let dir = tmp.path();
    let bucket = [("ANDREA_ALLREDUCE_BUCKET_FLOATS", "1000")];
    ok(
        dir,
        &strs(&train(&["--shuffle", "--grad-accum", "2", "--out", "one"])),
    );
    mpirun(
        dir,
        2,
        &bucket,
        &strs(&train(&["--shuffle", "--out", "two"])),
    );
    assert_same_run(dir, "one", "two");
    let args = train(&["--shuffle", "--grad-accum", "2", "--out", "four"]);
    mpirun(dir, 2, &bucket, &strs(&args));
    ok(
        dir,
        &strs(&train(&["--shuffle", "--grad-accum", "4", "--out", "one4"])),
    );
    let diff = max_weight_difference(&dir.join("one4/latest"), &dir.join("four/latest"));
    println!(
        "2 ranks x accum 2 vs 1 process x accum 4: {diff:.3e} tolerances (abs 1e-5, rel 1e-4)"
    );
    assert!(diff <= 1.0, "weights differ by {diff} tolerances");
}

/// The largest `|a - b| / (abs + rel·|b|)` over every parameter, with the tolerance
/// `abs 1e-5, rel 1e-4`. AdamW normalises each update to about the learning rate (3e-3),
/// so rounding differences in a gradient that is small against its noise move a weight
/// by about 1e-6 in 8 steps (measured: 0.1 of this bound), while a wrong window, scale or
/// missing rank moves weights by about the learning rate per step, 300 times the bound.
fn max_weight_difference(a: &Path, b: &Path) -> f64 {
    let (abs, rel) = (1e-5, 1e-4);
    let ma = Model::load(DefaultBackend::new(), a).unwrap();
    let mb = Model::load(DefaultBackend::new(), b).unwrap();
    let mut worst = 0.0f64;
    for p in ma.params() {
        let (x, y) = (
            ma.read_param(p.name()).unwrap(),
            mb.read_param(p.name()).unwrap(),
        );
        for (&u, &v) in x.iter().zip(&y) {
            let d = (u as f64 - v as f64).abs() / (abs + rel * (v as f64).abs());
            worst = worst.max(d);
        }
    }
    worst
}

#[test]
fn three_ranks_agree_with_one_process_to_rounding() {
    let tmp = prepared("50");
    let dir = tmp.path();
    ok(dir, &strs(&train(&["--grad-accum", "3", "--out", "one"])));
    mpirun(dir, 3, &[], &strs(&train(&["--out", "three"])));
    let diff = max_weight_difference(&dir.join("one/latest"), &dir.join("three/latest"));
    println!("3 ranks vs 1 process x accum 3: {diff:.3e} tolerances (abs 1e-5, rel 1e-4)");
    assert!(diff <= 1.0, "weights differ by {diff} tolerances");
    // The bound can fail: two of the three ranks' windows are another run.
    ok(dir, &strs(&train(&["--grad-accum", "2", "--out", "other"])));
    let other = max_weight_difference(&dir.join("other/latest"), &dir.join("three/latest"));
    println!("3 ranks vs 1 process x accum 2: {other:.3e} tolerances");
    assert!(
        other > 10.0,
        "a run on other windows is within {other} tolerances"
    );
    let (a, b) = (metrics(&dir.join("one")), metrics(&dir.join("three")));
    for (x, y) in a.iter().zip(&b) {
        let (u, v) = (
            x["train_loss"].as_f64().unwrap(),
            y["train_loss"].as_f64().unwrap(),
        );
        assert!(
            (u - v).abs() <= 1e-5 * u,
            "train loss {u} vs {v} at {}",
            x["step"]
        );
    }
}

/// A 2-rank run stopped at step 4 resumes as 2 ranks, and as 1 rank with
/// `--grad-accum 2`: both bit-identical to the uninterrupted 2-rank run.
#[test]
fn a_two_rank_checkpoint_resumes_on_two_ranks_and_on_one() {
    let tmp = prepared("50");
    let dir = tmp.path();
    mpirun(dir, 2, &[], &strs(&train(&["--out", "whole"])));
    for run in ["again2", "again1"] {
        mpirun(
            dir,
            2,
            &[],
            &strs(&train(&["--out", run, "--stop-at", "4"])),
        );
    }
    mpirun(dir, 2, &[], &["train", "--resume", "again2/latest"]);
    ok(
        dir,
        &["train", "--resume", "again1/latest", "--grad-accum", "2"],
    );
    assert_same_run(dir, "whole", "again2");
    assert_same_run(dir, "whole", "again1");
}

/// A rank started with other settings: every rank says so, and the job exits with 2.
#[test]
fn ranks_with_different_settings_are_refused() {
    let tmp = prepared("50");
    let dir = tmp.path();
    let launcher = std::env::var("MPIRUN").unwrap_or_else(|_| "mpirun".into());
    let rank = |batch: &str| {
        let bin = binary().display().to_string();
        let flags = [&["--threads", "1"], TRAIN_TINY].concat();
        let mut v = vec!["-np".to_string(), "1".into(), bin];
        v.extend(flags.iter().map(|s| s.to_string()));
        v.extend(["--out", "run", "--steps", "2", "--batch-size", batch].map(String::from));
        v
    };
    let out = Command::new(launcher)
        .current_dir(dir)
        .env("OMPI_ALLOW_RUN_AS_ROOT", "1")
        .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
        .arg("--oversubscribe")
        .args(rank("4"))
        .arg(":")
        .args(rank("2"))
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    for r in 0..2 {
        let line = format!("rank {r} has");
        assert!(
            err.contains(&line) && err.contains("disagree on the settings"),
            "{err}"
        );
    }
    assert!(!err.contains("panicked"), "{err}");
}

/// The stand-in NCCL that `cargo xtask cuda-emu` builds next to the emulator.
#[cfg(feature = "cuda")]
fn nccl_standin() -> String {
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/cuda-emu/nccl/libnccl.so.2");
    assert!(
        p.exists(),
        "{} is missing: `cargo xtask cuda-emu` builds it",
        p.display()
    );
    p.to_string_lossy().into_owned()
}

/// `andrea --threads 1 <args>` in `dir` without a launcher (a world of one), with `env`.
#[cfg(feature = "cuda")]
fn solo(dir: &Path, env: &[(&str, &str)], args: &[&str]) -> Output {
    let out = Command::new(binary())
        .current_dir(dir)
        .envs(env.iter().copied())
        .args(["--threads", "1"])
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "andrea {args:?} with {env:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// `--backend cuda` (the emulator; both ranks on GPU 0, `ANDREA_LOCAL_RANK=0`), every run
/// bit for bit what one process without NCCL gets with `--grad-accum 2`:
/// * 2 ranks through host memory and `MPI_Allreduce` (`ANDREA_NCCL=off`, the fallback);
/// * 1 rank, no launcher, through NCCL (`ANDREA_NCCL=on`: the path a single GPU checks),
///   here the emulator's stand-in NCCL (`ANDREA_NCCL_LIB`);
/// * 2 ranks through the stand-in NCCL, whose sum goes through MPI (with the `nccl`
///   feature);
/// * and a fault planted in the stand-in (1 added to each bucket's first element) is seen.
#[cfg(feature = "cuda")]
#[test]
fn two_cuda_ranks_through_host_staging_and_nccl_equal_one_with_twice_the_accumulation() {
    let name = "two_cuda_ranks_through_host_staging_and_nccl_equal_one_with_twice_the_accumulation";
    let tmp = prepared("50");
    let dir = tmp.path();
    let probe = andrea(dir, &["--backend", "cuda", "info", "--config", "tiny.toml"]);
    if !probe.status.success() {
        return andrea_testkit::device::skip(name, String::from_utf8_lossy(&probe.stderr).trim());
    }
    // Fewer steps than the CPU tests: the emulator runs kernels on fibers.
    fn cuda<'a>(extra: &[&'a str]) -> Vec<&'a str> {
        let global = ["--backend", "cuda", "--precision", "fp32"];
        let steps = ["--steps", "4", "--checkpoint-every", "4"];
        [&global[..], TRAIN_TINY, &steps, extra].concat()
    }
    let off = [("ANDREA_NCCL", "off")];
    solo(dir, &off, &cuda(&["--grad-accum", "2", "--out", "one"]));
    let local = ("ANDREA_LOCAL_RANK", "0");
    mpirun(dir, 2, &[local, off[0]], &cuda(&["--out", "two"]));
    assert_same_run(dir, "one", "two");
    if !cfg!(feature = "nccl") {
        return eprintln!("{name}: NCCL parts SKIPPED (build with --features nccl)");
    }
    let lib = nccl_standin();
    let nccl = [("ANDREA_NCCL", "on"), ("ANDREA_NCCL_LIB", lib.as_str())];
    let out = solo(
        dir,
        &nccl,
        &cuda(&["--grad-accum", "2", "--out", "one-nccl"]),
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("gradients: NCCL 2.99.0"), "{err}");
    assert_same_run(dir, "one", "one-nccl");
    let out = mpirun(
        dir,
        2,
        &[local, nccl[0], nccl[1]],
        &cuda(&["--out", "two-nccl"]),
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("gradients: NCCL 2.99.0") && err.contains("2 rank(s)"),
        "{err}"
    );
    assert_same_run(dir, "one", "two-nccl");
    // The planted fault: the run must differ, or the comparisons above prove nothing.
    let faulty = [nccl[0], nccl[1], ("ANDREA_NCCL_STANDIN_FAULT", "1")];
    let one_step = |out: &'static str| -> Vec<&'static str> {
        let global = ["--backend", "cuda", "--precision", "fp32"];
        let rest = ["--steps", "1", "--grad-accum", "2", "--out", out];
        [&global[..], TRAIN_TINY, &rest].concat()
    };
    solo(dir, &faulty, &one_step("fault"));
    solo(dir, &nccl, &one_step("clean"));
    assert!(
        bytes(dir.join("fault/latest/model.safetensors"))
            != bytes(dir.join("clean/latest/model.safetensors")),
        "a fault planted in NCCL's sum left the weights unchanged: the test could not fail"
    );
}

/// Ctrl-C to `mpirun`: Open MPI 4.1 does not forward it; it sends every rank SIGCONT,
/// then SIGTERM `odls_base_sigkill_timeout` seconds later, then SIGKILL as long again
/// (raised to 5 s here, as the README says to, so that a step and a checkpoint fit).
/// andrea takes SIGTERM as Ctrl-C: all ranks stop after the same step, rank 0 writes one
/// checkpoint, and the run resumes from it.
#[test]
fn ctrl_c_to_mpirun_stops_every_rank_after_one_step_with_one_checkpoint() {
    signal_to_mpirun_stops_every_rank_after_one_step_with_one_checkpoint("INT");
}

/// SIGUSR1 to `mpirun`: Open MPI forwards it to every rank at once (SIGUSR1 and SIGUSR2
/// are in `ess_base_forward_signals` by default), and andrea takes it as Ctrl-C: the way
/// to stop a run on a cluster without waiting for mpirun's SIGTERM timeout.
#[test]
fn sigusr1_to_mpirun_stops_every_rank_after_one_step_with_one_checkpoint() {
    signal_to_mpirun_stops_every_rank_after_one_step_with_one_checkpoint("USR1");
}

fn signal_to_mpirun_stops_every_rank_after_one_step_with_one_checkpoint(sig: &str) {
    let tmp = prepared("50");
    let dir = tmp.path();
    let args = [TRAIN_TINY, &["--out", "run", "--steps", "1000000"]].concat();
    let mut cmd = mpirun_command(dir, 2, &[], &args);
    let child = cmd
        .args(["--eval-every", "0"])
        .env("OMPI_MCA_odls_base_sigkill_timeout", "5")
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| cannot_start(e));
    wait_for_steps(&dir.join("run"), 3);
    signal(child.id(), sig);
    let out = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    let last = metrics(&dir.join("run")).last().unwrap()["step"]
        .as_u64()
        .unwrap();
    assert_eq!(err.matches("interrupted at step").count(), 1, "{err}");
    assert!(
        err.contains(&format!("interrupted at step {last}:")),
        "{err}"
    );
    let steps: Vec<_> = std::fs::read_dir(dir.join("run"))
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|n| n.starts_with("step-"))
        .collect();
    assert_eq!(
        steps,
        [format!("step-{last:08}")],
        "one checkpoint, at the last step"
    );
    let more = (last + 2).to_string();
    mpirun(
        dir,
        2,
        &[],
        &["train", "--resume", "run/latest", "--steps", &more],
    );
    assert_eq!(metrics(&dir.join("run")).last().unwrap()["step"], last + 2);
}

/// The `andrea` processes whose parent is `parent` (the ranks mpirun started).
fn ranks_of(parent: u32) -> Vec<u32> {
    let mut pids = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else {
            continue;
        };
        // `pid (comm) state ppid ...`: the name may hold spaces, so split after the `)`.
        let (name, rest) = stat.rsplit_once(')').unwrap_or_default();
        let ppid = rest.split_whitespace().nth(1).and_then(|p| p.parse().ok());
        if name.ends_with("(andrea") && ppid == Some(parent) {
            pids.push(pid);
        }
    }
    pids.sort();
    pids
}

/// A rank killed with SIGKILL in the middle of a run: mpirun ends the job and says which
/// rank died, and the last checkpoint is intact and resumes.
#[test]
fn a_killed_rank_ends_the_job_and_the_last_checkpoint_resumes() {
    let tmp = prepared("50");
    let dir = tmp.path();
    let every = ["--checkpoint-every", "5", "--eval-every", "0"];
    let args = [TRAIN_TINY, &["--out", "run", "--steps", "1000000"], &every].concat();
    let child = mpirun_command(dir, 2, &[], &args)
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| cannot_start(e));
    wait_for_steps(&dir.join("run"), 12);
    let ranks = ranks_of(child.id());
    assert_eq!(ranks.len(), 2, "mpirun's children: {ranks:?}");
    signal(ranks[1], "KILL");
    let out = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(
        err.contains("signal 9"),
        "mpirun should say a rank was killed: {err}"
    );
    let latest = std::fs::canonicalize(dir.join("run/latest")).unwrap();
    let name = latest.file_name().unwrap().to_string_lossy().into_owned();
    let step: u64 = name.trim_start_matches("step-").parse().unwrap();
    let more = (step + 2).to_string();
    mpirun(
        dir,
        2,
        &[],
        &["train", "--resume", "run/latest", "--steps", &more],
    );
    assert!(dir.join(format!("run/step-{:08}", step + 2)).exists());
}

/// Started by another MPI's launcher (MPICH's `PMI_SIZE` faked here): Open MPI sees a
/// world of one, and andrea refuses rather than train as one of several copies.
#[test]
fn a_launcher_of_another_mpi_is_refused() {
    let tmp = prepared("20");
    let dir = tmp.path();
    let out = Command::new(binary())
        .current_dir(dir)
        .env("PMI_SIZE", "2")
        .args([TRAIN_TINY, &["--out", "run"]].concat())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("the launcher says 2 ranks (PMI_SIZE), MPI's world has 1"),
        "{err}"
    );
    assert!(
        !dir.join("run").exists(),
        "the refused run wrote its directory"
    );
}
