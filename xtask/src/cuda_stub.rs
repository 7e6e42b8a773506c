//! `cargo xtask cuda-stub`: builds `target/cuda-stub/lib64/libcuda.so{,.1}` from
//! `xtask/cuda-stub/libcuda_stub.c` with the system C compiler (`$CC` or `cc`).
//!
//! With `CUDA_LIBRARY_PATH=$PWD/target/cuda-stub`, cust's build script finds a "CUDA
//! install" and `cargo build/test -p andrea-cuda --features cuda` link on a machine with
//! no CUDA; at run time every driver call returns CUDA_ERROR_NO_DEVICE and the tests
//! report SKIPPED. The marker file `ANDREA_LINK_STUB` beside `lib64` makes andrea-cuda's
//! build script give its test binaries a run path to the stub, so they start without
//! LD_LIBRARY_PATH.

use std::path::Path;
use std::process::Command;

pub fn run(root: &Path) -> Result<(), String> {
    let src = root.join("xtask/cuda-stub/libcuda_stub.c");
    let dir = root.join("target/cuda-stub/lib64");
    std::fs::create_dir_all(&dir).map_err(|e| format!("creating {}: {e}", dir.display()))?;
    let lib = dir.join("libcuda.so.1");
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let status = Command::new(&cc)
        .args([
            "-shared",
            "-fPIC",
            "-O2",
            "-Wall",
            "-Wl,-soname,libcuda.so.1",
            "-o",
        ])
        .arg(&lib)
        .arg(&src)
        .status()
        .map_err(|e| format!("running `{cc}` (install gcc or set CC): {e}"))?;
    if !status.success() {
        return Err(format!("`{cc}` failed on {}", src.display()));
    }
    let link = dir.join("libcuda.so");
    let _ = std::fs::remove_file(&link);
    std::os::unix::fs::symlink("libcuda.so.1", &link)
        .map_err(|e| format!("linking {}: {e}", link.display()))?;
    // Tells andrea-cuda's build script that this CUDA_LIBRARY_PATH is the stub (it then
    // adds the run path that lets test binaries start without a driver).
    let marker = root.join("target/cuda-stub/ANDREA_LINK_STUB");
    std::fs::write(
        &marker,
        "libcuda link stub built by `cargo xtask cuda-stub`\n",
    )
    .map_err(|e| format!("writing {}: {e}", marker.display()))?;
    println!("built {}", lib.display());
    println!(
        "use: CUDA_LIBRARY_PATH={} cargo test -p andrea-cuda --features cuda",
        root.join("target/cuda-stub").display()
    );
    Ok(())
}
