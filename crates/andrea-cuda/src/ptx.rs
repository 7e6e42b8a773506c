//! The PTX the kernels compile to, committed under `ptx/` by `cargo xtask build-kernels`
//! (from `kernels/*.cu`, virtual architecture compute_80, nvcc 13.0: PTX ISA 9.0, which
//! needs a driver of the CUDA 13.0 era, 580 or newer). The crate never runs nvcc.
//!
//! A build can also embed machine code: with `ANDREA_CUDA_FATBIN_DIR` set at build time
//! (`cargo xtask gpu-bundle` does it), [`fatbin`] returns each module's fatbin (SASS for
//! sm_80 and sm_90 plus the same compute_80 PTX, assembled from the committed PTX by
//! `cargo xtask build-kernels`), which the backend loads in place of the PTX text, so an
//! sm_80 or sm_90 GPU runs the kernels without JIT compilation. Such a build embeds only
//! the header and `.entry` lines of each module's PTX text ([`PtxModule::source`]; the
//! fatbin carries the whole PTX): build.rs copies `ptx/` into `$OUT_DIR` so.
//!
//! The GPU bundle goes one step further (`ANDREA_CUDA_FATBIN_EXTERNAL` at build time, next
//! to `ANDREA_CUDA_FATBIN_DIR`): its binaries embed neither, and read `<module>.fatbin` when
//! the backend starts from [`KERNEL_DIR_ENV`], else from `kernels/` next to the executable
//! or one folder up (the bundle's layout), so a dozen binaries share one copy of the
//! machine code and the bundle stays inside the lease's 64 MiB.

/// One compiled `kernels/<name>.cu`.
#[derive(Debug, Clone, Copy)]
pub struct PtxModule {
    pub name: &'static str,
    /// The PTX text; in a build with fatbins, only its header and `.entry` lines.
    pub source: &'static str,
}

macro_rules! modules {
    ($($name:literal)*) => {
        /// Every module, loaded once when the backend starts.
        pub const MODULES: &[PtxModule] = &[
            $(PtxModule { name: $name, source: include_str!(concat!(env!("OUT_DIR"), "/ptx/", $name, ".ptx")) },)*
        ];
    };
}

modules! {
    "adamw" "attention" "attention_decode" "attention_mma" "bias" "elementwise" "embedding" "gelu" "layernorm"
    "loss" "matmul" "matmul_bf16" "matmul_mma" "norm" "softmax" "tc_selftest"
}

mod embedded {
    include!(concat!(env!("OUT_DIR"), "/fatbins.rs"));
}

/// Where a build with external fatbins looks first for `<module>.fatbin`.
pub const KERNEL_DIR_ENV: &str = "ANDREA_CUDA_KERNEL_DIR";

/// The fatbin for module `name`, if this build has one: embedded, or (a bundle build) read
/// once per process from the kernel folder. An external fatbin that cannot be found or read
/// is an error that says where it was looked for.
pub fn fatbin(name: &str) -> Result<Option<&'static [u8]>, String> {
    if let Some((_, b)) = embedded::FATBINS.iter().find(|(n, _)| *n == name) {
        return Ok(Some(*b));
    }
    if !embedded::EXTERNAL.contains(&name) {
        return Ok(None);
    }
    use std::collections::HashMap;
    use std::sync::{Mutex, OnceLock};
    static LOADED: OnceLock<Mutex<HashMap<String, &'static [u8]>>> = OnceLock::new();
    let mut loaded = LOADED
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|e| e.into_inner());
    if let Some(b) = loaded.get(name) {
        return Ok(Some(*b));
    }
    let file = format!("{name}.fatbin");
    let mut tried = Vec::new();
    for dir in kernel_dirs() {
        let path = dir.join(&file);
        match std::fs::read(&path) {
            Ok(bytes) => {
                // Once per module and process: the backend keeps the modules it loads.
                let bytes: &'static [u8] = Box::leak(bytes.into_boxed_slice());
                loaded.insert(name.to_string(), bytes);
                return Ok(Some(bytes));
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => tried.push(path),
            Err(e) => return Err(format!("reading {}: {e}", path.display())),
        }
    }
    let tried: Vec<String> = tried.iter().map(|p| p.display().to_string()).collect();
    Err(format!(
        "this build reads its kernels' machine code from `{file}` files (a GPU bundle build), \
         and found none at {}; run it from the bundle, or set {KERNEL_DIR_ENV} to the \
         bundle's `kernels/` folder",
        if tried.is_empty() {
            "no candidate folder".to_string()
        } else {
            tried.join(", ")
        }
    ))
}

/// The folders a bundle build reads fatbins from, in order.
fn kernel_dirs() -> Vec<std::path::PathBuf> {
    let mut dirs = Vec::new();
    if let Some(d) = std::env::var_os(KERNEL_DIR_ENV) {
        dirs.push(std::path::PathBuf::from(d));
    }
    if let Some(exe_dir) = std::env::current_exe()
        .ok()
        .and_then(|e| e.parent().map(|p| p.to_path_buf()))
    {
        dirs.push(exe_dir.join("kernels"));
        if let Some(up) = exe_dir.parent() {
            dirs.push(up.join("kernels"));
        }
    }
    dirs
}

/// The PTX ISA version the modules declare (`.version`), for the driver-too-old message.
pub fn isa_version() -> &'static str {
    MODULES
        .first()
        .and_then(|m| {
            m.source
                .lines()
                .find_map(|l| l.trim().strip_prefix(".version "))
        })
        .unwrap_or("unknown")
}

/// The names of the kernels a module defines (its `.entry` directives).
pub fn entries(m: &PtxModule) -> impl Iterator<Item = &'static str> {
    m.source.lines().filter_map(|l| {
        let rest = l.trim_start().strip_prefix(".visible .entry ")?;
        Some(rest.split('(').next().unwrap_or(rest).trim())
    })
}

/// The module that defines kernel `name`.
pub fn module_of(name: &str) -> Option<&'static PtxModule> {
    MODULES.iter().find(|m| entries(m).any(|e| e == name))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_module_has_kernels_and_names_are_unique() {
        let mut all: Vec<&str> = MODULES.iter().flat_map(entries).collect();
        for m in MODULES {
            assert!(entries(m).count() > 0, "{} has no .entry", m.name);
        }
        let n = all.len();
        all.sort_unstable();
        all.dedup();
        assert_eq!(all.len(), n, "a kernel name is defined twice");
    }

    #[test]
    fn ptx_is_isa_9_for_compute_80() {
        assert_eq!(isa_version(), "9.0");
        for m in MODULES {
            assert!(
                m.source.contains(".target sm_80"),
                "{} is not compute_80",
                m.name
            );
        }
    }
}

#[cfg(test)]
mod names {
    //! Every kernel name the plans and the ops launch exists in the committed PTX.
    use super::module_of;
    use crate::plan;
    use andrea_core::check::AttentionDims;

    /// Quoted names in the ops' sources that look like kernel names (`"x_v1"`, ...).
    fn literal_kernel_names(src: &str) -> Vec<&str> {
        src.split('"')
            .skip(1)
            .step_by(2)
            .filter(|s| {
                !s.is_empty()
                    && s.bytes()
                        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
                    && (s.ends_with("_v1")
                        || s.ends_with("_v4")
                        || s.contains("forward_")
                        || s.contains("backward_"))
            })
            .collect()
    }

    #[test]
    fn names_in_the_ops_exist() {
        let sources = [
            include_str!("device/ops_memory.rs"),
            include_str!("device/ops_linalg.rs"),
            include_str!("device/ops_elementwise.rs"),
            include_str!("device/ops_layernorm.rs"),
            include_str!("device/ops_softmax.rs"),
            include_str!("device/ops_embedding.rs"),
            include_str!("device/ops_loss.rs"),
            include_str!("device/ops_optim.rs"),
            include_str!("device/ops_attention.rs"),
        ];
        let names: Vec<&str> = sources
            .iter()
            .flat_map(|s| literal_kernel_names(s))
            .collect();
        assert!(names.len() >= 20, "found only {names:?}");
        for n in names
            .into_iter()
            .chain(["copy_strided", "column_partials", "softmax_backward"])
        {
            assert!(
                module_of(n).is_some(),
                "kernel `{n}` is launched but not in the PTX"
            );
        }
    }

    #[test]
    fn names_from_the_plans_exist() {
        let mut launches = vec![
            plan::rows::cross_entropy(3).unwrap(),
            plan::reduce::sum_squares(10, 0).unwrap().partials,
            plan::reduce::sum_squares(10, 1).unwrap().partials,
            plan::reduce::sum_squares(10, 1).unwrap().finish,
            plan::reduce::column_sums("x", "column_partials", 10, 10)
                .unwrap()
                .finish,
        ];
        let (wte, wpe) = plan::embedding::backward(3, 4).unwrap();
        launches.extend([
            wte,
            wpe,
            plan::embedding::forward(3, 4, &[0]).unwrap(),
            plan::embedding::forward(3, 5, &[0]).unwrap(),
        ]);
        for d in [1, 64, 128] {
            let dims = AttentionDims {
                batch: 1,
                heads: 1,
                head_dim: d,
                q_len: 5,
                k_len: 5,
            };
            let (dq, dkdv) = plan::attention::backward(&dims).unwrap();
            launches.extend([plan::attention::forward(&dims).unwrap(), dq, dkdv]);
        }
        let mut names: Vec<&str> = launches.iter().map(|l| l.kernel).collect();
        for k in plan::matmul::MatmulKernel::all() {
            for store in plan::matmul::MmaStore::ALL {
                names.push(k.launch_name(store));
            }
        }
        names.push(
            plan::matmul::split(300, 5, 4096, plan::matmul::MatmulKernel::Simt, 2)
                .unwrap()
                .unwrap()
                .reduce
                .kernel,
        );
        for n in names {
            assert!(
                module_of(n).is_some(),
                "plan returns kernel `{n}`, not in the PTX"
            );
        }
    }
}
