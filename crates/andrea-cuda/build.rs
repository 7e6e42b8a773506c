//! Only for `--features cuda` builds against the link stub or the CPU emulator of
//! `cargo xtask cuda-stub` / `cuda-emu`: when `CUDA_LIBRARY_PATH` is such a folder (it
//! holds the marker file `ANDREA_LINK_STUB`), the crate's test and bench binaries get that
//! `lib64` as a run path, so they start on a machine without a CUDA driver (cargo does
//! not put the path on the loader's path itself). On a GPU machine that folder does not
//! exist and the driver's own `libcuda.so.1` is loaded. Nothing is compiled here: the PTX
//! is committed.
//!
//! It also writes `$OUT_DIR/fatbins.rs` for [`ptx`](src/ptx.rs): when
//! `ANDREA_CUDA_FATBIN_DIR` names a folder of `<module>.fatbin` files (machine code for
//! sm_80 and sm_90 next to the PTX, made by `cargo xtask build-kernels`), the crate embeds
//! them, and the driver loads that machine code instead of JIT-compiling the PTX. Without
//! it the list is empty and the PTX is loaded as before.
//!
//! andrea-cli (the `andrea` binary) and andrea-benches use this same file as their build
//! script (`build = ...` in their manifests): a library's `rustc-link-arg` reaches only
//! its own binaries, not those of the crates that depend on it.

use std::path::Path;

fn main() {
    fatbins();
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

/// `$OUT_DIR/fatbins.rs`: `(module, bytes)` for every `*.fatbin` of `ANDREA_CUDA_FATBIN_DIR`.
/// andrea-cli and andrea-benches run this file too; only andrea-cuda includes the output.
fn fatbins() {
    println!("cargo:rerun-if-env-changed=ANDREA_CUDA_FATBIN_DIR");
    let Some(out) = std::env::var_os("OUT_DIR") else {
        return;
    };
    let mut entries = Vec::new();
    if let Some(dir) = std::env::var_os("ANDREA_CUDA_FATBIN_DIR") {
        println!("cargo:rerun-if-changed={}", Path::new(&dir).display());
        let mut files: Vec<_> = std::fs::read_dir(&dir)
            .unwrap_or_else(|e| panic!("ANDREA_CUDA_FATBIN_DIR={}: {e}", Path::new(&dir).display()))
            .flatten()
            .map(|e| e.path())
            .filter(|p| p.extension().is_some_and(|x| x == "fatbin"))
            .collect();
        files.sort();
        for f in files {
            println!("cargo:rerun-if-changed={}", f.display());
            let name = f
                .file_stem()
                .unwrap_or_default()
                .to_string_lossy()
                .into_owned();
            let path = std::fs::canonicalize(&f).unwrap_or(f);
            entries.push(format!(
                "    ({name:?}, include_bytes!({:?})),\n",
                path.display().to_string()
            ));
        }
    }
    let text = format!(
        "/// Machine code embedded at build time (`ANDREA_CUDA_FATBIN_DIR`), by module name.\n\
         pub const FATBINS: &[(&str, &[u8])] = &[\n{}];\n",
        entries.concat()
    );
    let _ = std::fs::write(Path::new(&out).join("fatbins.rs"), text);
}
