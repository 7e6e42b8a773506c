//! Finding nvcc: `$NVCC`, `$CUDA_PATH/bin/nvcc`, `nvcc` on `PATH`, or the PyPI wheel layout
//! `<site-packages>/nvidia/cu13/bin/nvcc` (`pip install nvidia-cuda-nvcc==13.0.*` and the
//! other wheels the README lists) of the active virtual environment, of `./.venv`, or of
//! `python3`'s site directories. `ptxas` and `fatbinary` are taken from the same folder.

use std::path::{Path, PathBuf};
use std::process::Command;

/// The CUDA compiler, its PTX assembler and its fatbin packer.
pub struct Toolchain {
    pub nvcc: PathBuf,
    pub ptxas: PathBuf,
    pub fatbinary: PathBuf,
}

fn is_file(p: &Path) -> bool {
    p.is_file()
}

/// Site-packages folders worth searching for the nvidia wheels.
fn site_dirs(root: &Path) -> Vec<PathBuf> {
    let mut dirs = Vec::new();
    let mut venvs: Vec<PathBuf> = Vec::new();
    if let Some(v) = std::env::var_os("VIRTUAL_ENV") {
        venvs.push(v.into());
    }
    venvs.push(root.join(".venv"));
    for v in venvs {
        if let Ok(entries) = std::fs::read_dir(v.join("lib")) {
            for e in entries.flatten() {
                dirs.push(e.path().join("site-packages"));
            }
        }
    }
    let out = Command::new("python3")
        .args([
            "-c",
            "import site; print('\\n'.join(site.getsitepackages() + [site.getusersitepackages()]))",
        ])
        .output();
    if let Ok(out) = out {
        dirs.extend(
            String::from_utf8_lossy(&out.stdout)
                .lines()
                .map(PathBuf::from),
        );
    }
    dirs
}

/// Looks for nvcc in the documented places, in order.
pub fn find(root: &Path) -> Result<Toolchain, String> {
    let mut tried = Vec::new();
    let mut candidates: Vec<PathBuf> = Vec::new();
    if let Some(p) = std::env::var_os("NVCC") {
        candidates.push(p.into());
    }
    if let Some(p) = std::env::var_os("CUDA_PATH") {
        candidates.push(Path::new(&p).join("bin/nvcc"));
    }
    if let Some(path) = std::env::var_os("PATH") {
        candidates.extend(std::env::split_paths(&path).map(|d| d.join("nvcc")));
    }
    for d in site_dirs(root) {
        for cu in ["cu13", "cu12"] {
            candidates.push(d.join("nvidia").join(cu).join("bin/nvcc"));
        }
        candidates.push(d.join("nvidia/cuda_nvcc/bin/nvcc"));
    }
    for nvcc in candidates {
        if is_file(&nvcc) {
            let ptxas = nvcc.with_file_name("ptxas");
            let fatbinary = nvcc.with_file_name("fatbinary");
            if is_file(&ptxas) && is_file(&fatbinary) {
                return Ok(Toolchain {
                    nvcc,
                    ptxas,
                    fatbinary,
                });
            }
        }
        tried.push(nvcc.display().to_string());
    }
    Err(format!(
        "nvcc not found (set NVCC, or install it from PyPI: python3 -m venv .venv && \
         .venv/bin/pip install \"nvidia-cuda-nvcc==13.0.*\" \"nvidia-cuda-runtime==13.0.*\" \
         \"nvidia-cuda-crt==13.0.*\" \"nvidia-nvvm==13.0.*\" \"nvidia-cuda-cccl==13.0.*\"); tried {} places, \
         first: {}",
        tried.len(),
        tried.first().map(String::as_str).unwrap_or("none")
    ))
}
