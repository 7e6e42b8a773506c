//! Machine code from the committed PTX: each module assembled by ptxas once per
//! architecture of [`REPORT_ARCHS`] into `<dir>/<name>.<arch>.cubin` (its `-v` report
//! gives each kernel's registers, shared memory and spills), then packed with the PTX into
//! `<dir>/<name>.fatbin` by `fatbinary`. These are the steps and flags of `nvcc -fatbin
//! -arch=compute_80 -code=sm_80,sm_90,compute_80` (`nvcc --dryrun` lists them) plus `-v`,
//! which changes only the options a cubin records: the SASS and the PTX inside are the
//! same (`cuobjdump -sass` / `-ptx` of both agree).
//!
//! Separate steps, so that `build-kernels` assembles each module once per architecture
//! (`nvcc -fatbin` after the report assembled every module a second time) and the two
//! architectures of the largest module (`matmul_mma`, most of the time) run on two cores.
//!
//! `<dir>/<name>.fatbin.from` records what a fatbin was made from (ptxas's version and the
//! PTX): [`refresh`] (`gpu-bundle`) packs only modules whose record differs, so after
//! `build-kernels` or `build-kernels --check` it assembles nothing again.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::build_kernels::{in_parallel, parse_ptxas, KernelInfo, REPORT_ARCHS};
use crate::nvcc::Toolchain;

/// What [`build`] made and found.
#[derive(Default)]
pub struct Built {
    /// (module, kernel) for every kernel of every architecture, in the modules' order.
    pub infos: Vec<(String, KernelInfo)>,
    /// Modules that do not assemble or pack.
    pub problems: Vec<String>,
    /// Bytes of the fatbins written.
    pub bytes: u64,
}

/// Assembles every `(name, ptx)` of `modules` for each of [`REPORT_ARCHS`] and packs its
/// fatbin into `dir`. `Err` only when the tools cannot be run.
pub fn build(tc: &Toolchain, modules: &[(String, PathBuf)], dir: &Path) -> Result<Built, String> {
    std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let version = ptxas_version(tc)?;
    // Largest first, so the longest jobs do not start last.
    let mut jobs: Vec<(usize, &str)> = (0..modules.len())
        .flat_map(|m| REPORT_ARCHS.iter().map(move |&arch| (m, arch)))
        .collect();
    let size = |m: usize| std::fs::metadata(&modules[m].1).map_or(0, |x| x.len());
    jobs.sort_by_key(|&(m, _)| std::cmp::Reverse(size(m)));
    let reports = in_parallel(&jobs, |&(m, arch)| {
        let (name, ptx) = &modules[m];
        assemble(tc, ptx, arch, &cubin(dir, name, arch))
    })?;
    let mut by_module: Vec<Vec<Result<Vec<KernelInfo>, String>>> =
        modules.iter().map(|_| Vec::new()).collect();
    for (&(m, _), report) in jobs.iter().zip(reports) {
        by_module[m].push(report?);
    }
    let mut built = Built::default();
    for ((name, ptx), reports) in modules.iter().zip(by_module) {
        let mut assembled = true;
        for report in reports {
            match report {
                Ok(infos) => built
                    .infos
                    .extend(infos.into_iter().map(|k| (name.clone(), k))),
                Err(e) => {
                    built.problems.push(e);
                    assembled = false;
                }
            }
        }
        if assembled {
            match pack(tc, dir, name, ptx, &version) {
                Ok(n) => built.bytes += n,
                Err(e) => built.problems.push(e),
            }
        }
    }
    // Reports in a fixed order, whatever order the jobs finished in.
    built
        .infos
        .sort_by_key(|(m, k)| (modules.iter().position(|(n, _)| n == m), k.arch.clone()));
    Ok(built)
}

/// Makes `dir`'s fatbins those of `modules`, rebuilding only those whose record differs
/// (see the module docs).
pub fn refresh(tc: &Toolchain, modules: &[(String, PathBuf)], dir: &Path) -> Result<(), String> {
    let version = ptxas_version(tc)?;
    let stale: Vec<(String, PathBuf)> = modules
        .iter()
        .filter(|(name, ptx)| {
            let fresh = record(&version, ptx).ok();
            let fatbin = dir.join(format!("{name}.fatbin"));
            let from = std::fs::read_to_string(dir.join(format!("{name}.fatbin.from"))).ok();
            !fatbin.is_file() || fresh.is_none() || from != fresh
        })
        .cloned()
        .collect();
    if stale.is_empty() {
        println!(
            "fatbins: all {} up to date in {}",
            modules.len(),
            dir.display()
        );
        return Ok(());
    }
    let built = build(tc, &stale, dir)?;
    if built.problems.is_empty() {
        Ok(())
    } else {
        Err(built.problems.join("\n"))
    }
}

fn cubin(dir: &Path, name: &str, arch: &str) -> PathBuf {
    dir.join(format!("{name}.{arch}.cubin"))
}

fn ptxas_version(tc: &Toolchain) -> Result<String, String> {
    let o = Command::new(&tc.ptxas)
        .arg("--version")
        .output()
        .map_err(|e| format!("running {}: {e}", tc.ptxas.display()))?;
    Ok(String::from_utf8_lossy(&o.stdout).into_owned())
}

/// What a fatbin of `ptx` assembled by ptxas `version` records (`.fatbin.from`).
fn record(version: &str, ptx: &Path) -> Result<String, String> {
    let text = std::fs::read_to_string(ptx).map_err(|e| format!("{}: {e}", ptx.display()))?;
    Ok(format!("{version}\n{text}"))
}

/// `ptxas -arch=<arch> -m64 -v`, as nvcc runs it for the fatbin (with `-v`).
fn assemble(
    tc: &Toolchain,
    ptx: &Path,
    arch: &str,
    out: &Path,
) -> Result<Result<Vec<KernelInfo>, String>, String> {
    let o = Command::new(&tc.ptxas)
        .arg(format!("-arch={arch}"))
        .args(["-m64", "-v", "-o"])
        .arg(out)
        .arg(ptx)
        .output()
        .map_err(|e| format!("running {}: {e}", tc.ptxas.display()))?;
    let text =
        String::from_utf8_lossy(&o.stderr).into_owned() + &String::from_utf8_lossy(&o.stdout);
    if !o.status.success() {
        return Ok(Err(format!(
            "{} does not assemble for {arch}:\n{text}",
            ptx.display()
        )));
    }
    Ok(Ok(parse_ptxas(&text)))
}

/// `fatbinary --create`, as nvcc runs it: the PTX for JIT on newer GPUs, then the cubins;
/// then the record of what it was made from.
fn pack(tc: &Toolchain, dir: &Path, name: &str, ptx: &Path, version: &str) -> Result<u64, String> {
    let out = dir.join(format!("{name}.fatbin"));
    let virtual_sm = crate::build_kernels::VIRTUAL_ARCH.trim_start_matches("compute_");
    let mut cmd = Command::new(&tc.fatbinary);
    cmd.arg(format!("--create={}", out.display()))
        .arg("-64")
        .arg(format!(
            "--image3=kind=ptx,sm={virtual_sm},file={}",
            ptx.display()
        ));
    for arch in REPORT_ARCHS.iter().rev() {
        let sm = arch.trim_start_matches("sm_");
        cmd.arg(format!(
            "--image3=kind=elf,sm={sm},file={}",
            cubin(dir, name, arch).display()
        ));
    }
    let o = cmd
        .output()
        .map_err(|e| format!("running {}: {e}", tc.fatbinary.display()))?;
    if !o.status.success() {
        return Err(format!(
            "{} does not pack into a fatbin:\n{}",
            ptx.display(),
            String::from_utf8_lossy(&o.stderr)
        ));
    }
    let from = dir.join(format!("{name}.fatbin.from"));
    std::fs::write(&from, record(version, ptx)?).map_err(|e| format!("{}: {e}", from.display()))?;
    std::fs::metadata(&out)
        .map(|m| m.len())
        .map_err(|e| format!("{}: {e}", out.display()))
}
