//! `cargo xtask build-kernels [--check]`: compiles every `kernels/*.cu` to PTX for the
//! virtual architecture compute_80 and writes `crates/andrea-cuda/ptx/<name>.ptx`
//! (committed: the crate builds without nvcc), then assembles each PTX with ptxas for
//! sm_80 and sm_90 and prints every kernel's registers, shared memory and spills.
//!
//! It also packs each committed PTX into a fatbin, `target/kernels-fatbin/<name>.fatbin`:
//! sm_80 and sm_90 machine code assembled from that PTX, plus the PTX itself for newer
//! GPUs ([`crate::fatbin`]: each module is assembled once per architecture, for the report
//! and the fatbin both). Not committed; `cargo xtask gpu-bundle` builds andrea-cuda with
//! `ANDREA_CUDA_FATBIN_DIR` pointing there, so the bundle's kernels run as compiled here
//! instead of being JIT-compiled by the driver at start, and reuses the fatbins made from
//! the same PTX.
//!
//! `--check` writes nothing to the repository (only the fatbins under `target/`): it
//! fails when a committed PTX file differs from what the sources compile to (comment
//! lines, which carry the compiler's build stamp, are ignored), when a `.cu` has no PTX
//! or a PTX no `.cu`, or when a committed file does not assemble. Both modes fail on any
//! register spill.
//!
//! ptxas's registers and static shared memory per kernel and architecture go into
//! `crates/andrea-cuda/ptx/resources.tsv` ([`RESOURCES_FILE`]), which `--check` holds to
//! what ptxas reports as it holds the PTX to the sources.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::nvcc::{self, Toolchain};

/// The virtual architecture the PTX targets (Ampere and later; nothing needs more).
pub const VIRTUAL_ARCH: &str = "compute_80";
/// Real architectures ptxas reports on.
pub const REPORT_ARCHS: [&str; 2] = ["sm_80", "sm_90"];

/// One kernel as ptxas reports it.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct KernelInfo {
    pub name: String,
    pub arch: String,
    pub registers: u32,
    pub smem_bytes: u32,
    pub stack_bytes: u32,
    pub spill_stores: u32,
    pub spill_loads: u32,
}

fn number_before(line: &str, unit: &str) -> Option<u32> {
    let i = line.find(unit)?;
    line[..i].split_whitespace().last()?.parse().ok()
}

/// Parses `ptxas -v` output.
pub fn parse_ptxas(text: &str) -> Vec<KernelInfo> {
    let mut out: Vec<KernelInfo> = Vec::new();
    for line in text.lines() {
        if let Some(i) = line.find("Compiling entry function '") {
            let rest = &line[i + "Compiling entry function '".len()..];
            let name = rest.split('\'').next().unwrap_or("").to_string();
            let arch = rest
                .split("for '")
                .nth(1)
                .unwrap_or("")
                .trim_end_matches('\'');
            out.push(KernelInfo {
                name,
                arch: arch.to_string(),
                ..Default::default()
            });
        } else if let Some(k) = out.last_mut() {
            if line.contains("bytes stack frame") {
                k.stack_bytes = number_before(line, "bytes stack frame").unwrap_or(0);
                k.spill_stores = number_before(line, "bytes spill stores").unwrap_or(0);
                k.spill_loads = number_before(line, "bytes spill loads").unwrap_or(0);
            } else if line.contains("Used") && line.contains("registers") {
                k.registers = number_before(line, "registers").unwrap_or(0);
                k.smem_bytes = number_before(line, "bytes smem").unwrap_or(0);
            }
        }
    }
    out
}

/// PTX without comment lines, for comparing builds of different nvcc patch releases.
pub fn normalize(ptx: &str) -> String {
    ptx.lines()
        .filter(|l| !l.trim_start().starts_with("//"))
        .map(str::trim_end)
        .collect::<Vec<_>>()
        .join("\n")
}

pub(crate) fn sources(root: &Path) -> Result<Vec<PathBuf>, String> {
    let dir = root.join("kernels");
    let mut v: Vec<PathBuf> = std::fs::read_dir(&dir)
        .map_err(|e| format!("reading {}: {e}", dir.display()))?
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "cu"))
        .collect();
    v.sort();
    Ok(v)
}

pub(crate) fn stem(p: &Path) -> String {
    p.file_stem()
        .unwrap_or_default()
        .to_string_lossy()
        .into_owned()
}

fn compile(tc: &Toolchain, src: &Path, out: &Path) -> Result<(), String> {
    let o = Command::new(&tc.nvcc)
        .args(["-ptx", "-O3", "-std=c++17"])
        .arg(format!("-arch={VIRTUAL_ARCH}"))
        .arg("-o")
        .arg(out)
        .arg(src)
        .output()
        .map_err(|e| format!("running {}: {e}", tc.nvcc.display()))?;
    if !o.status.success() {
        return Err(format!(
            "nvcc failed on {}:\n{}",
            src.display(),
            String::from_utf8_lossy(&o.stderr)
        ));
    }
    Ok(())
}

/// Where `build-kernels` leaves the fatbins (relative to the workspace root).
pub const FATBIN_DIR: &str = "target/kernels-fatbin";

/// The committed PTX modules: (name, path), one per `kernels/*.cu`.
fn committed_modules(root: &Path, srcs: &[PathBuf]) -> Vec<(String, PathBuf)> {
    srcs.iter()
        .map(|src| {
            let name = stem(src);
            let ptx = root.join(format!("crates/andrea-cuda/ptx/{name}.ptx"));
            (name, ptx)
        })
        .filter(|(_, ptx)| ptx.is_file())
        .collect()
}

/// Makes `dir/<name>.fatbin` of every committed PTX, reusing those already made from the
/// same PTX (for `gpu-bundle`; see [`crate::fatbin`]).
pub fn fatbins_only(root: &Path, dir: &Path) -> Result<(), String> {
    let tc = nvcc::find(root)?;
    crate::fatbin::refresh(&tc, &committed_modules(root, &sources(root)?), dir)
}

/// `f` of every item, on as many threads as there are cores, results in the items' order.
pub fn in_parallel<T: Sync, R: Send>(
    items: &[T],
    f: impl Fn(&T) -> R + Sync,
) -> Result<Vec<R>, String> {
    let next = std::sync::atomic::AtomicUsize::new(0);
    let workers = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1)
        .clamp(1, items.len().max(1));
    let mut done: Vec<(usize, R)> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..workers)
            .map(|_| {
                scope.spawn(|| {
                    let mut mine = Vec::new();
                    loop {
                        let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        let Some(item) = items.get(i) else { break };
                        mine.push((i, f(item)));
                    }
                    mine
                })
            })
            .collect();
        handles
            .into_iter()
            .flat_map(|h| h.join().unwrap_or_default())
            .collect()
    });
    if done.len() != items.len() {
        return Err("a build thread panicked".into());
    }
    done.sort_by_key(|(i, _)| *i);
    Ok(done.into_iter().map(|(_, r)| r).collect())
}

/// What compiling one `.cu` found.
#[derive(Default)]
struct FileOutcome {
    problems: Vec<String>,
    /// The committed PTX it rewrote, if any.
    wrote: Option<String>,
}

/// Compiles `src` to PTX in `tmp` and compares it with (or writes it as) the committed
/// PTX. `Err` only when nvcc or the file system fails; what is wrong with the kernels
/// goes into `problems`.
fn one_file(
    tc: &Toolchain,
    src: &Path,
    tmp: &Path,
    ptx_dir: &Path,
    check: bool,
) -> Result<FileOutcome, String> {
    let mut out = FileOutcome::default();
    let name = stem(src);
    let built = tmp.join(format!("{name}.ptx"));
    compile(tc, src, &built)?;
    let fresh = std::fs::read_to_string(&built).map_err(|e| format!("{}: {e}", built.display()))?;
    let target = ptx_dir.join(format!("{name}.ptx"));
    let committed = std::fs::read_to_string(&target).ok();
    if check {
        match &committed {
            None => out.problems.push(format!(
                "{}: missing (run `cargo xtask build-kernels`)",
                target.display()
            )),
            Some(c) if normalize(c) != normalize(&fresh) => out.problems.push(format!(
                "{}: stale, kernels/{name}.cu compiles to different PTX (run `cargo xtask build-kernels`)",
                target.display()
            )),
            Some(_) => {}
        }
    } else if committed.as_deref() != Some(fresh.as_str()) {
        std::fs::write(&target, &fresh).map_err(|e| format!("{}: {e}", target.display()))?;
        out.wrote = Some(target.display().to_string());
    }
    Ok(out)
}

pub fn run(root: &Path, check: bool) -> Result<(), String> {
    let tc = nvcc::find(root)?;
    println!("nvcc: {}", tc.nvcc.display());
    let ptx_dir = root.join("crates/andrea-cuda/ptx");
    let tmp = root.join("target/xtask/ptx-build");
    std::fs::create_dir_all(&tmp).map_err(|e| format!("creating {}: {e}", tmp.display()))?;
    if !check {
        std::fs::create_dir_all(&ptx_dir).map_err(|e| format!("{}: {e}", ptx_dir.display()))?;
    }
    let fat_dir = root.join(FATBIN_DIR);
    let srcs = sources(root)?;
    // nvcc's front end is single-threaded and most of the time: one file per core.
    let done = in_parallel(&srcs, |src| one_file(&tc, src, &tmp, &ptx_dir, check))?;
    let mut problems = Vec::new();
    for outcome in done {
        let o = outcome?;
        if let Some(w) = o.wrote {
            println!("wrote {w}");
        }
        problems.extend(o.problems);
    }
    // The committed PTX (as just written, or as checked) assembled for each architecture,
    // and its fatbins.
    let built = crate::fatbin::build(&tc, &committed_modules(root, &srcs), &fat_dir)?;
    problems.extend(built.problems);
    let (infos, fat_bytes) = (built.infos, built.bytes);
    if let Ok(entries) = std::fs::read_dir(&ptx_dir) {
        for e in entries.flatten() {
            let p = e.path();
            if p.extension().is_some_and(|x| x == "ptx")
                && !srcs.iter().any(|s| stem(s) == stem(&p))
            {
                problems.push(format!(
                    "{}: no kernels/{}.cu for it",
                    p.display(),
                    stem(&p)
                ));
            }
        }
    }
    print_table(&infos);
    let table = resources_table(&infos);
    let resources = ptx_dir.join(RESOURCES_FILE);
    let committed = std::fs::read_to_string(&resources).ok();
    if committed.as_deref() != Some(table.as_str()) {
        if check {
            problems.push(format!(
                "{}: stale, ptxas reports other registers or shared memory (run `cargo xtask build-kernels`)",
                resources.display()
            ));
        } else {
            std::fs::write(&resources, &table)
                .map_err(|e| format!("{}: {e}", resources.display()))?;
            println!("wrote {}", resources.display());
        }
    }
    for (file, k) in &infos {
        if k.spill_stores > 0 || k.spill_loads > 0 {
            problems.push(format!(
                "{file}.cu: {} spills on {} ({} B stores, {} B loads)",
                k.name, k.arch, k.spill_stores, k.spill_loads
            ));
        }
    }
    if problems.is_empty() {
        println!(
            "{} kernels in {} files: PTX {}, assembles for {} with no spills; fatbins \
             ({} + PTX, {:.1} MiB) in {}",
            infos.len() / REPORT_ARCHS.len(),
            srcs.len(),
            if check { "up to date" } else { "written" },
            REPORT_ARCHS.join(" and "),
            REPORT_ARCHS.join(", "),
            fat_bytes as f64 / (1024.0 * 1024.0),
            fat_dir.display()
        );
        Ok(())
    } else {
        Err(problems.join("\n"))
    }
}

/// The table of each kernel's registers and static shared memory per architecture,
/// committed next to the PTX: the CUDA emulator reports it as `cuFuncGetAttribute` does
/// on a GPU, and the plans' tests plan with it as on an A100 or an H200
/// (`andrea_cuda::plan::occupancy::ptxas_table` reads it).
pub const RESOURCES_FILE: &str = "resources.tsv";

fn resources_table(infos: &[(String, KernelInfo)]) -> String {
    let mut rows: Vec<&KernelInfo> = infos.iter().map(|(_, k)| k).collect();
    rows.sort_by(|a, b| (&a.name, &a.arch).cmp(&(&b.name, &b.arch)));
    let mut out = String::from(
        "# Written by `cargo xtask build-kernels` from ptxas -v on the committed PTX:\n\
         # kernel, architecture, registers per thread, static shared memory per block (bytes).\n",
    );
    for k in rows {
        out += &format!(
            "{}\t{}\t{}\t{}\n",
            k.name, k.arch, k.registers, k.smem_bytes
        );
    }
    out
}

fn print_table(infos: &[(String, KernelInfo)]) {
    println!(
        "\n{:<12} {:<30} {:>6} {:>5} {:>9} {:>7} {:>7}",
        "file", "kernel", "arch", "regs", "smem (B)", "stack", "spills"
    );
    for (file, k) in infos {
        println!(
            "{:<12} {:<30} {:>6} {:>5} {:>9} {:>7} {:>7}",
            file,
            k.name,
            k.arch,
            k.registers,
            k.smem_bytes,
            k.stack_bytes,
            k.spill_stores + k.spill_loads
        );
    }
    println!("(smem is static shared memory; attention kernels add dynamic shared memory at launch, see plan::attention)\n");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_ptxas_verbose_output() {
        let text = "ptxas info    : 0 bytes gmem\n\
ptxas info    : Compiling entry function 'matmul_simt' for 'sm_80'\n\
ptxas info    : Function properties for matmul_simt\n\
    8 bytes stack frame, 4 bytes spill stores, 12 bytes spill loads\n\
ptxas info    : Used 64 registers, used 1 barriers, 8704 bytes smem, 496 bytes cmem[0]\n\
ptxas info    : Compiling entry function 'add_v1' for 'sm_90'\n\
ptxas info    : Function properties for add_v1\n\
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads\n\
ptxas info    : Used 10 registers\n";
        let k = parse_ptxas(text);
        assert_eq!(k.len(), 2);
        assert_eq!(
            k[0],
            KernelInfo {
                name: "matmul_simt".into(),
                arch: "sm_80".into(),
                registers: 64,
                smem_bytes: 8704,
                stack_bytes: 8,
                spill_stores: 4,
                spill_loads: 12,
            }
        );
        assert_eq!(
            (k[1].name.as_str(), k[1].registers, k[1].smem_bytes),
            ("add_v1", 10, 0)
        );
    }

    #[test]
    fn normalize_ignores_comments_and_trailing_space() {
        let a = "//\n// Generated by NVIDIA NVVM Compiler\n// Cuda compilation tools, release 13.0, V13.0.88\n.version 9.0  \n.entry x()\n";
        let b = "// Cuda compilation tools, release 13.0, V13.0.99\n.version 9.0\n.entry x()";
        assert_eq!(normalize(a), normalize(b));
        assert_ne!(normalize(a), normalize(".version 9.0\n.entry y()"));
    }
}
