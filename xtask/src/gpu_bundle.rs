//! `cargo xtask gpu-bundle`: builds, on this machine (no GPU needed), the CUDA test
//! binaries of andrea-cuda against the link stub and puts them with `run.sh`
//! (`scripts/gpu-check.sh`) into `target/gpu-bundle/`. Copy that folder to a machine with
//! an NVIDIA GPU and a CUDA 13 driver (580+) but no Rust, and run `./run.sh` there: it
//! runs every binary with `ANDREA_REQUIRE_DEVICE=1` and prints a pass/fail table.
//!
//! Benches and a release `andrea` binary join the bundle when their crates have CUDA
//! columns (not yet).

use std::path::Path;
use std::process::{Command, Stdio};

pub fn run(root: &Path) -> Result<(), String> {
    crate::cuda_stub::run(root)?;
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = Command::new(&cargo)
        .args([
            "test",
            "-p",
            "andrea-cuda",
            "--features",
            "cuda",
            "--no-run",
            "--message-format=json",
            "--target-dir",
        ])
        .arg(root.join("target"))
        .env("CUDA_LIBRARY_PATH", root.join("target/cuda-stub"))
        // The binaries must load the GPU machine's driver, never a path on this machine.
        .env("ANDREA_CUDA_NO_RPATH", "1")
        .current_dir(root)
        .stderr(Stdio::inherit())
        .output()
        .map_err(|e| format!("running cargo: {e}"))?;
    if !out.status.success() {
        return Err("building the CUDA test binaries failed".into());
    }
    let bundle = root.join("target/gpu-bundle");
    let bin = bundle.join("bin");
    let _ = std::fs::remove_dir_all(&bin);
    std::fs::create_dir_all(&bin).map_err(|e| format!("{}: {e}", bin.display()))?;
    let mut total = 0u64;
    let mut count = 0;
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let Ok(msg) = serde_json::from_str::<serde_json::Value>(line) else {
            continue;
        };
        let exe = msg.get("executable").and_then(|e| e.as_str());
        let is_test = msg
            .pointer("/profile/test")
            .and_then(|t| t.as_bool())
            .unwrap_or(false);
        let name = msg.pointer("/target/name").and_then(|n| n.as_str());
        if let (Some(exe), true, Some(name)) = (exe, is_test, name) {
            let kind = msg
                .pointer("/target/kind/0")
                .and_then(|k| k.as_str())
                .unwrap_or("test");
            let dst = bin.join(format!("{kind}-{name}"));
            std::fs::copy(exe, &dst).map_err(|e| format!("copying {exe}: {e}"))?;
            // Debug info is most of a test binary; the bundle travels without it.
            let _ = Command::new("strip")
                .arg("--strip-debug")
                .arg(&dst)
                .status();
            total += std::fs::metadata(&dst).map(|m| m.len()).unwrap_or(0);
            count += 1;
        }
    }
    let script = root.join("scripts/gpu-check.sh");
    let run_sh = bundle.join("run.sh");
    std::fs::copy(&script, &run_sh).map_err(|e| format!("copying {}: {e}", script.display()))?;
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&run_sh, std::fs::Permissions::from_mode(0o755))
        .map_err(|e| format!("{}: {e}", run_sh.display()))?;
    println!(
        "{}: {count} test binaries, {:.1} MiB; copy the folder to a GPU machine and run ./run.sh",
        bundle.display(),
        total as f64 / (1024.0 * 1024.0)
    );
    Ok(())
}
