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
//! it the list is empty and the PTX is loaded as before. With `ANDREA_CUDA_FATBIN_EXTERNAL`
//! set as well (the GPU bundle does it), the fatbins are not embedded but only named
//! (`EXTERNAL`): the binary reads `<module>.fatbin` at run time from the bundle's
//! `kernels/` folder, so a dozen binaries share one copy of the machine code.
//!
//! And for andrea-cuda itself `$OUT_DIR/ptx/<module>.ptx`, what [`ptx`](src/ptx.rs)
//! embeds: the committed PTX, except for a module that has a fatbin, whose text is cut to
//! its header and `.entry` lines (the names and the ISA version are all that is read of
//! it; the fatbin carries the same PTX for JIT). Every binary embeds every module, so this
//! keeps the GPU bundle inside the lease's 64 MiB.
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
    println!("cargo:rerun-if-env-changed=ANDREA_CUDA_FATBIN_EXTERNAL");
    let external = std::env::var_os("ANDREA_CUDA_FATBIN_EXTERNAL").is_some();
    let Some(out) = std::env::var_os("OUT_DIR") else {
        return;
    };
    let mut entries = Vec::new();
    let mut with_fatbin = Vec::new();
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
            with_fatbin.push(name.clone());
            if !external {
                let path = std::fs::canonicalize(&f).unwrap_or(f);
                entries.push(format!(
                    "    ({name:?}, include_bytes!({:?})),\n",
                    path.display().to_string()
                ));
            }
        }
    }
    let named: Vec<String> = if external {
        with_fatbin.iter().map(|n| format!("{n:?}, ")).collect()
    } else {
        Vec::new()
    };
    let text = format!(
        "/// Machine code embedded at build time (`ANDREA_CUDA_FATBIN_DIR`), by module name.\n\
         pub const FATBINS: &[(&str, &[u8])] = &[\n{}];\n\
         /// Modules whose fatbin is read at run time (`ANDREA_CUDA_FATBIN_EXTERNAL`).\n\
         pub const EXTERNAL: &[&str] = &[{}];\n",
        entries.concat(),
        named.concat()
    );
    let _ = std::fs::write(Path::new(&out).join("fatbins.rs"), text);
    if std::env::var("CARGO_PKG_NAME").as_deref() == Ok("andrea-cuda") {
        ptx_sources(Path::new(&out), &with_fatbin);
    }
}

/// `$OUT_DIR/ptx/<module>.ptx` for every committed `ptx/<module>.ptx`: the whole text, or
/// for a module in `with_fatbin` only its header (`.version`, `.target`, `.address_size`)
/// and its `.entry` lines.
fn ptx_sources(out: &Path, with_fatbin: &[String]) {
    let src = Path::new("ptx");
    println!("cargo:rerun-if-changed=ptx");
    let dst = out.join("ptx");
    std::fs::create_dir_all(&dst).unwrap_or_else(|e| panic!("{}: {e}", dst.display()));
    let files = std::fs::read_dir(src).unwrap_or_else(|e| panic!("ptx/: {e}"));
    for f in files.flatten().map(|e| e.path()) {
        if f.extension().is_none_or(|x| x != "ptx") {
            continue;
        }
        println!("cargo:rerun-if-changed={}", f.display());
        let name = f
            .file_stem()
            .unwrap_or_default()
            .to_string_lossy()
            .into_owned();
        let text = std::fs::read_to_string(&f).unwrap_or_else(|e| panic!("{}: {e}", f.display()));
        let text = if with_fatbin.contains(&name) {
            let keep = |l: &&str| {
                let l = l.trim_start();
                [
                    ".version ",
                    ".target ",
                    ".address_size ",
                    ".visible .entry ",
                ]
                .iter()
                .any(|p| l.starts_with(p))
            };
            let mut t =
                String::from("// header and entries only: the embedded fatbin has the code\n");
            for l in text.lines().filter(keep) {
                t.push_str(l);
                t.push('\n');
            }
            t
        } else {
            text
        };
        let path = dst.join(format!("{name}.ptx"));
        // Unchanged files keep their time stamps (no needless rebuilds of the crate).
        if std::fs::read_to_string(&path).ok().as_deref() != Some(text.as_str()) {
            std::fs::write(&path, text).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        }
    }
}
