//! `cargo xtask sass-report [--json] [--check]`: the machine code of the production
//! kernels, read without a GPU. For every kernel of `kernels/*.cu` (not the test-only
//! files of [`TEST_ONLY`]) and each of sm_90 and sm_80: registers, spills, static shared
//! memory, and for kernels with tensor-core instructions (HMMA) their main loop's static
//! instruction count, HMMA count and instructions per HMMA, with the loop's LDS, LDSM,
//! F2FP, BRA and LDGSTS counts, so a reader sees where the issue slots go
//! ([`crate::sass_loops`] finds the loop from the control flow).
//!
//! The machine code is the fatbins' ([`crate::fatbin`]): ptxas on the committed PTX, the
//! code `cargo xtask gpu-bundle` carries to a GPU, which runs it without a JIT. A fatbin
//! is reused from `build-kernels` (with or without `--check`, its output folder) when the
//! PTX inside it is the committed PTX, else built into `target/xtask/sass-fatbin/`. `cuobjdump -sass -res-usage` disassembles it.
//!
//! `spills` counts the local-memory loads and stores (LDL, STL) in the machine code:
//! where ptxas puts spilled registers (and arrays it cannot keep in registers).
//! `smem_bytes` is the static shared memory of the cubin; the kernels that stage tiles
//! take dynamic shared memory at launch (`plan::matmul`, `plan::attention`).
//!
//! `--check` holds each kernel to its row of [`THRESHOLDS_FILE`] and fails when a kernel
//! passes one, when a kernel with HMMA has no row of its own, or when a row names no
//! kernel. The file's targets are reported as met or not met; they fail nothing.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::build_kernels::{self, FATBIN_DIR};
use crate::sass::{self, Kernel};
use crate::sass_loops;
use crate::sass_thresholds::{Threshold, Thresholds, THRESHOLDS_FILE};
use crate::{nvcc, root};

/// Kernel files no op launches (tensor-core wrapper self-tests).
pub const TEST_ONLY: [&str; 1] = ["tc_selftest"];

/// Where the report builds the fatbins it cannot reuse.
const OWN_FATBIN_DIR: &str = "target/xtask/sass-fatbin";

/// The architectures reported, the one the estimates use first.
const ARCHS: [&str; 2] = ["sm_90", "sm_80"];

pub struct Options {
    pub json: bool,
    pub check: bool,
}

impl Options {
    pub fn parse(args: &[String]) -> Result<Options, String> {
        let mut o = Options {
            json: false,
            check: false,
        };
        for a in args {
            match a.as_str() {
                "--json" => o.json = true,
                "--check" => o.check = true,
                other => {
                    return Err(format!(
                        "sass-report: unknown argument `{other}` (expected --json and/or --check)"
                    ))
                }
            }
        }
        Ok(o)
    }
}

/// The main loop of one kernel.
#[derive(Debug, Clone, PartialEq)]
pub struct MainLoop {
    pub instructions: u32,
    pub mma: u32,
    /// How many versions of the loop ptxas made (the largest is reported).
    pub versions: usize,
    /// LDS, LDSM, F2FP, BRA, LDGSTS in the loop.
    pub ops: [u32; 5],
}

/// The opcodes counted in a main loop, in [`MainLoop::ops`]'s order.
pub const LOOP_OPS: [&str; 5] = ["LDS", "LDSM", "F2FP", "BRA", "LDGSTS"];

impl MainLoop {
    pub fn per_mma(&self) -> f64 {
        self.instructions as f64 / self.mma as f64
    }
}

/// One kernel on one architecture.
#[derive(Debug, Clone, PartialEq)]
pub struct Row {
    pub file: String,
    pub kernel: String,
    pub arch: String,
    pub registers: u32,
    pub spills: u32,
    pub smem_bytes: u32,
    pub local_bytes: u32,
    /// HMMA anywhere in the kernel.
    pub mma_total: u32,
    pub main_loop: Option<MainLoop>,
}

/// Measures one kernel.
pub fn row(file: &str, arch: &str, k: &Kernel) -> Row {
    let loops = sass_loops::loops(&k.instrs);
    let main_loop = sass_loops::main_loop(&loops).map(|(l, versions)| MainLoop {
        instructions: l.instructions(),
        mma: l.mma(),
        versions,
        ops: LOOP_OPS.map(|op| l.count(op)),
    });
    let res = k.resources.unwrap_or_default();
    Row {
        file: file.to_string(),
        kernel: k.name.clone(),
        arch: arch.to_string(),
        registers: res.registers,
        spills: k
            .instrs
            .iter()
            .filter(|i| matches!(i.base(), "LDL" | "STL"))
            .count() as u32,
        smem_bytes: res.shared,
        local_bytes: res.local,
        mma_total: k.instrs.iter().filter(|i| i.base() == "HMMA").count() as u32,
        main_loop,
    }
}

fn run_tool(tool: &Path, args: &[&str], file: &Path) -> Result<String, String> {
    let o = Command::new(tool)
        .args(args)
        .arg(file)
        .output()
        .map_err(|e| format!("running {}: {e}", tool.display()))?;
    if !o.status.success() {
        return Err(format!(
            "`{} {} {}` failed:\n{}",
            tool.display(),
            args.join(" "),
            file.display(),
            String::from_utf8_lossy(&o.stderr)
        ));
    }
    Ok(String::from_utf8_lossy(&o.stdout).into_owned())
}

/// PTX without comments, blank lines and trailing space.
fn ptx_lines(text: &str) -> Vec<&str> {
    text.lines()
        .map(str::trim_end)
        .filter(|l| !l.is_empty() && !l.trim_start().starts_with("//"))
        .collect()
}

/// Whether `cuobjdump -ptx` of a fatbin holds exactly `ptx` (its header lines aside).
pub fn holds_ptx(dump: &str, ptx: &str) -> bool {
    let want = ptx_lines(ptx);
    let got = ptx_lines(dump);
    let start = got.iter().position(|l| l.starts_with(".version"));
    matches!(start, Some(s) if got[s..] == want[..])
}

/// The fatbin of one committed PTX: reused where fresh, else built.
fn fatbin(
    root: &Path,
    tc: &nvcc::Toolchain,
    cuobjdump: &Path,
    name: &str,
) -> Result<PathBuf, String> {
    let ptx_path = root.join(format!("crates/andrea-cuda/ptx/{name}.ptx"));
    let ptx = std::fs::read_to_string(&ptx_path).map_err(|e| {
        format!(
            "{}: {e} (run `cargo xtask build-kernels`)",
            ptx_path.display()
        )
    })?;
    for dir in [FATBIN_DIR, OWN_FATBIN_DIR] {
        let f = root.join(dir).join(format!("{name}.fatbin"));
        if f.is_file() && run_tool(cuobjdump, &["-ptx"], &f).is_ok_and(|d| holds_ptx(&d, &ptx)) {
            return Ok(f);
        }
    }
    let dir = root.join(OWN_FATBIN_DIR);
    std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    crate::fatbin::refresh(tc, &[(name.to_string(), ptx_path)], &dir)?;
    Ok(dir.join(format!("{name}.fatbin")))
}

/// The rows of one kernel file, every architecture of [`ARCHS`].
fn file_rows(
    root: &Path,
    tc: &nvcc::Toolchain,
    cuobjdump: &Path,
    name: &str,
) -> Result<Vec<Row>, String> {
    let fat = fatbin(root, tc, cuobjdump, name)?;
    let dump = run_tool(cuobjdump, &["-sass", "-res-usage"], &fat)?;
    let cubins = sass::parse(&dump);
    let mut rows = Vec::new();
    for arch in ARCHS {
        let c = cubins.iter().find(|c| c.arch == arch).ok_or_else(|| {
            format!(
                "{}: no {arch} machine code in it (rebuild it: cargo xtask build-kernels)",
                fat.display()
            )
        })?;
        rows.extend(c.kernels.iter().map(|k| row(name, arch, k)));
    }
    Ok(rows)
}

/// The report's rows: sm_90 first, then by file and kernel.
fn collect(root: &Path) -> Result<Vec<Row>, String> {
    let tc = nvcc::find(root)?;
    let cuobjdump = tc.nvcc.with_file_name("cuobjdump");
    let nvdisasm = tc.nvcc.with_file_name("nvdisasm");
    if !cuobjdump.is_file() || !nvdisasm.is_file() {
        let bin = tc.nvcc.parent().unwrap_or(Path::new("."));
        return Err(format!(
            "no cuobjdump and nvdisasm next to {} (install them into the same environment: \
             pip install \"nvidia-cuda-cuobjdump==13.2.*\" \"nvidia-cuda-nvdisasm==13.2.*\"; \
             see kernels/README.md); looked in {}",
            tc.nvcc.display(),
            bin.display()
        ));
    }
    let names: Vec<String> = build_kernels::sources(root)?
        .iter()
        .map(|p| build_kernels::stem(p))
        .filter(|n| !TEST_ONLY.contains(&n.as_str()))
        .collect();
    // cuobjdump is single-threaded: one file per core.
    let done = build_kernels::in_parallel(&names, |n| file_rows(root, &tc, &cuobjdump, n))?;
    let mut rows = Vec::new();
    for r in done {
        rows.extend(r?);
    }
    rows.sort_by(|a, b| {
        let arch = |r: &Row| ARCHS.iter().position(|x| *x == r.arch);
        (arch(a), &a.file, &a.kernel).cmp(&(arch(b), &b.file, &b.kernel))
    });
    Ok(rows)
}

fn json(rows: &[Row], th: &Thresholds) -> serde_json::Value {
    use serde_json::{json, Value};
    let rows = rows.iter().map(|r| {
        let t = th.get(&r.kernel);
        let mut o = json!({
            "kernel": r.kernel,
            "arch": r.arch,
            "file": format!("kernels/{}.cu", r.file),
            "registers": r.registers,
            "spills": r.spills,
            "smem_bytes": r.smem_bytes,
            "local_bytes": r.local_bytes,
            "mma_total": r.mma_total,
            "loop_instructions": r.main_loop.as_ref().map(|l| l.instructions),
            "loop_mma": r.main_loop.as_ref().map(|l| l.mma),
            "instructions_per_mma": r.main_loop.as_ref().map(|l| (l.per_mma() * 100.0).round() / 100.0),
            "loop_versions": r.main_loop.as_ref().map(|l| l.versions),
            "max_instructions_per_mma": t.and_then(|t| t.max_per_mma),
            "target_instructions_per_mma": t.and_then(|t| t.target_per_mma),
            "target_met": target_met(r, t),
        });
        for (k, op) in LOOP_OPS.iter().enumerate() {
            o[format!("loop_{}", op.to_lowercase())] =
                r.main_loop.as_ref().map_or(Value::Null, |l| json!(l.ops[k]));
        }
        o
    });
    Value::Array(rows.collect())
}

fn target_met(r: &Row, t: Option<&Threshold>) -> Option<bool> {
    Some(r.main_loop.as_ref()?.per_mma() <= t?.target_per_mma?)
}

fn print_table(rows: &[Row], th: &Thresholds) {
    let opt = |v: Option<f64>| v.map_or("-".to_string(), |v| format!("{v}"));
    for arch in ARCHS {
        println!(
            "\n{arch}\n{:<34} {:>4} {:>6} {:>6} {:>6} {:>5} {:>6} {:>5} {:>5} {:>5} {:>5} {:>6} {:>6} {:>12}",
            "kernel",
            "regs",
            "spills",
            "smem",
            "loop",
            "HMMA",
            "/HMMA",
            "LDS",
            "LDSM",
            "F2FP",
            "BRA",
            "LDGSTS",
            "max",
            "target"
        );
        for r in rows.iter().filter(|r| r.arch == arch) {
            let head = format!(
                "{:<34} {:>4} {:>6} {:>6}",
                r.kernel, r.registers, r.spills, r.smem_bytes
            );
            let t = th.get(&r.kernel);
            match &r.main_loop {
                None => println!("{head}"),
                Some(l) => {
                    let target = match (t.and_then(|t| t.target_per_mma), target_met(r, t)) {
                        (Some(v), Some(met)) => {
                            format!("<= {v}: {}", if met { "met" } else { "not met" })
                        }
                        _ => "-".into(),
                    };
                    let versions = if l.versions > 1 {
                        format!(" ({} versions)", l.versions)
                    } else {
                        String::new()
                    };
                    println!(
                        "{head} {:>6} {:>5} {:>6.1} {:>5} {:>5} {:>5} {:>5} {:>6} {:>6} {:>12}{versions}",
                        l.instructions,
                        l.mma,
                        l.per_mma(),
                        l.ops[0],
                        l.ops[1],
                        l.ops[2],
                        l.ops[3],
                        l.ops[4],
                        opt(t.and_then(|t| t.max_per_mma)),
                        target
                    );
                }
            }
        }
    }
    println!(
        "\nloop: static instructions of the main loop (the innermost loop holding the most HMMA, \
         every path of its body); /HMMA: loop / HMMA; smem: static shared memory (bytes); \
         spills: LDL/STL instructions; max and target: {THRESHOLDS_FILE}"
    );
}

/// What `--check` finds wrong: one line per kernel and limit.
pub fn check(rows: &[Row], th: &Thresholds) -> Vec<String> {
    let mut problems = Vec::new();
    let fix = "make the kernel leaner, or raise the threshold in the same commit with the reason";
    for r in rows {
        let at = format!("{} ({}, kernels/{}.cu)", r.kernel, r.arch, r.file);
        if r.mma_total > 0 && th.own(&r.kernel).and_then(|t| t.max_per_mma).is_none() {
            problems.push(format!(
                "{at}: {} HMMA but no maximum of instructions per HMMA in {THRESHOLDS_FILE}: \
                 add a row with today's count (cargo xtask sass-report) plus a small margin",
                r.mma_total
            ));
        }
        let Some(t) = th.get(&r.kernel) else { continue };
        if let (Some(max), Some(l)) = (t.max_per_mma, &r.main_loop) {
            if l.per_mma() > max {
                problems.push(format!(
                    "{at}: {:.1} instructions per HMMA in its main loop ({} for {} HMMA), \
                     threshold {max}: {fix}",
                    l.per_mma(),
                    l.instructions,
                    l.mma
                ));
            }
        }
        if let Some(max) = t.max_registers {
            if r.registers > max {
                problems.push(format!(
                    "{at}: {} registers per thread, threshold {max}: {fix} (registers decide \
                     blocks per SM, see plan::matmul::blocks_per_sm)",
                    r.registers
                ));
            }
        }
        if let Some(max) = t.max_spills {
            if r.spills > max {
                problems.push(format!(
                    "{at}: {} local-memory loads/stores (LDL/STL: spills), threshold {max}: \
                     lower the kernel's register pressure (fewer live fragments per thread)",
                    r.spills
                ));
            }
        }
    }
    for name in th.named() {
        if !rows.iter().any(|r| r.kernel == name) {
            problems.push(format!(
                "{THRESHOLDS_FILE}: row `{name}` names no kernel of kernels/*.cu: remove it or \
                 fix the name"
            ));
        }
    }
    problems
}

pub fn run(o: Options) -> Result<(), String> {
    let root = root();
    let th_path = root.join(THRESHOLDS_FILE);
    let th_text =
        std::fs::read_to_string(&th_path).map_err(|e| format!("{}: {e}", th_path.display()))?;
    let th = Thresholds::parse(&th_text).map_err(|e| format!("{THRESHOLDS_FILE}: {e}"))?;
    let rows = collect(&root)?;
    if o.json {
        let text = serde_json::to_string_pretty(&json(&rows, &th)).map_err(|e| e.to_string())?;
        println!("{text}");
    } else {
        print_table(&rows, &th);
    }
    if !o.check {
        return Ok(());
    }
    let problems = check(&rows, &th);
    if problems.is_empty() {
        let kernels: BTreeMap<&str, ()> = rows.iter().map(|r| (r.kernel.as_str(), ())).collect();
        eprintln!(
            "sass-report --check: {} kernels on {} within {THRESHOLDS_FILE}",
            kernels.len(),
            ARCHS.join(" and ")
        );
        Ok(())
    } else {
        Err(format!(
            "sass-report --check: {} problem(s):\n{}",
            problems.len(),
            problems.join("\n")
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mma_row(kernel: &str, instructions: u32, mma: u32, registers: u32) -> Row {
        Row {
            file: "matmul_mma".into(),
            kernel: kernel.into(),
            arch: "sm_90".into(),
            registers,
            spills: 0,
            smem_bytes: 0,
            local_bytes: 0,
            mma_total: mma,
            main_loop: Some(MainLoop {
                instructions,
                mma,
                versions: 1,
                ops: [0; 5],
            }),
        }
    }

    const TH: &str = "* - - 0 -\nk 48.5 120 0 6\n";

    #[test]
    fn within_the_thresholds_nothing_fails() {
        let th = Thresholds::parse(TH).unwrap();
        assert_eq!(
            check(&[mma_row("k", 1519, 32, 118)], &th),
            Vec::<String>::new()
        );
    }

    #[test]
    fn a_kernel_past_its_threshold_fails_with_value_threshold_and_fix() {
        let th = Thresholds::parse(TH).unwrap();
        let p = check(&[mma_row("k", 1600, 32, 128)], &th);
        assert_eq!(p.len(), 2, "{p:?}");
        assert!(p[0].starts_with("k (sm_90, kernels/matmul_mma.cu): 50.0 instructions per HMMA"));
        assert!(p[0].contains("threshold 48.5") && p[0].contains("make the kernel leaner"));
        assert!(
            p[1].contains("128 registers per thread, threshold 120"),
            "{}",
            p[1]
        );
    }

    #[test]
    fn spills_fail_under_the_default_row() {
        let th = Thresholds::parse(TH).unwrap();
        let mut r = mma_row("simt", 0, 0, 40);
        r.main_loop = None;
        r.spills = 2;
        let p = check(&[r, mma_row("k", 100, 32, 100)], &th);
        assert_eq!(p.len(), 1, "{p:?}");
        assert!(p[0].contains("simt") && p[0].contains("2 local-memory loads/stores"));
    }

    #[test]
    fn an_mma_kernel_without_a_row_and_a_row_without_a_kernel_fail() {
        let th = Thresholds::parse("* - - 0 -\ngone 10 64 0 6\n").unwrap();
        let p = check(&[mma_row("new_gemm", 100, 32, 100)], &th);
        assert_eq!(p.len(), 2, "{p:?}");
        assert!(p[0].contains("new_gemm") && p[0].contains("no maximum of instructions per HMMA"));
        assert!(p[1].contains("row `gone` names no kernel"));
    }

    #[test]
    fn spills_are_local_memory_instructions() {
        let cubins = sass::parse(include_str!("../fixtures/sass/fatbin_two_archs.txt"));
        let k = &cubins[0].kernels[1];
        let r = row("softmax", "sm_90", k);
        assert_eq!((r.spills, r.local_bytes, r.smem_bytes), (1, 8, 1024));
        assert_eq!((r.mma_total, r.main_loop), (0, None));
    }

    #[test]
    fn a_fatbin_is_fresh_only_when_it_holds_the_committed_ptx() {
        let ptx = "//\n// Generated by NVIDIA NVVM Compiler\n\n.version 9.0\n.target sm_80\n.entry k()\n{\n ret;\n}\n";
        let dump = "\nFatbin ptx code:\n================\narch = sm_80\nptxasOptions = \n\n\n.version 9.0\n.target sm_80\n.entry k()\n{\n ret;\n}\n";
        assert!(holds_ptx(dump, ptx));
        assert!(!holds_ptx(dump, &ptx.replace("ret;", "exit;")));
        assert!(!holds_ptx("Fatbin elf code:\n", ptx));
    }
}
