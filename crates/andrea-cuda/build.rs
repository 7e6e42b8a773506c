//! Only for `--features cuda` builds against the link stub or the CPU emulator of
//! `cargo xtask cuda-stub` / `cuda-emu`: when `CUDA_LIBRARY_PATH` is such a folder (it
//! holds the marker file `ANDREA_LINK_STUB`), the crate's test and bench binaries get that
//! `lib64` as a run path, so they start on a machine without a CUDA driver (cargo does
//! not put the path on the loader's path itself). On a GPU machine that folder does not
//! exist and the driver's own `libcuda.so.1` is loaded. Nothing is compiled here: the PTX
//! is committed.
//!
//! andrea-cli (the `andrea` binary) and andrea-benches use this same file as their build
//! script (`build = ...` in their manifests): a library's `rustc-link-arg` reaches only
//! its own binaries, not those of the crates that depend on it.

use std::path::Path;

fn main() {
    println!("cargo:rerun-if-env-changed=CUDA_LIBRARY_PATH");
    // `cargo xtask gpu-bundle` builds for another machine: no run path to this one's stub.
    println!("cargo:rerun-if-env-changed=ANDREA_CUDA_NO_RPATH");
    if std::env::var_os("CARGO_FEATURE_CUDA").is_none()
        || std::env::var_os("ANDREA_CUDA_NO_RPATH").is_some()
    {
        return;
    }
    let Some(dir) = std::env::var_os("CUDA_LIBRARY_PATH") else {
        return;
    };
    let marker = Path::new(&dir).join("ANDREA_LINK_STUB");
    println!("cargo:rerun-if-changed={}", marker.display());
    if marker.exists() {
        let lib = Path::new(&dir).join("lib64");
        println!("cargo:rustc-link-arg=-Wl,-rpath,{}", lib.display());
    }
}
