//! Reads criterion's `new/benchmark.json` + `new/estimates.json` files and prints the
//! median throughput of each benchmark as a markdown table.

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};

use serde_json::Value;

struct Entry {
    group: String,
    function: String,
    value: String,
    /// Median throughput in G{elements,bytes}/s.
    rate: f64,
    unit: &'static str,
}

fn find(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(rd) = fs::read_dir(dir) else { return };
    for e in rd.flatten() {
        let p = e.path();
        if p.is_dir() {
            if p.file_name().is_some_and(|n| n == "new") && p.join("benchmark.json").exists() {
                out.push(p);
            } else {
                find(&p, out);
            }
        }
    }
}

fn read(dir: &Path) -> Result<Option<Entry>, String> {
    let load = |name: &str| -> Result<Value, String> {
        let p = dir.join(name);
        let text = fs::read_to_string(&p).map_err(|e| format!("{}: {e}", p.display()))?;
        serde_json::from_str(&text).map_err(|e| format!("{}: {e}", p.display()))
    };
    let b = load("benchmark.json")?;
    let est = load("estimates.json")?;
    let median_ns = est["median"]["point_estimate"]
        .as_f64()
        .ok_or_else(|| format!("{}: no median", dir.display()))?;
    let (amount, unit) = match &b["throughput"] {
        Value::Object(t) if t.contains_key("Elements") => (t["Elements"].as_f64(), "G/s"),
        Value::Object(t) if t.contains_key("Bytes") => (t["Bytes"].as_f64(), "GB/s"),
        _ => (None, ""),
    };
    let Some(amount) = amount else {
        return Ok(None);
    };
    let s = |k: &str| b[k].as_str().unwrap_or("").to_string();
    Ok(Some(Entry {
        group: s("group_id"),
        function: s("function_id"),
        value: s("value_str"),
        rate: amount / median_ns,
        unit,
    }))
}

/// A rate in G{unit}/s as text, switching to plain units per second for slow
/// benchmarks (a training step counts tokens: thousands per second, not billions).
fn rate_text(rate_g: f64, unit: &str) -> String {
    if rate_g >= 0.1 {
        format!("{rate_g:.1} {unit}")
    } else {
        let per_s = rate_g * 1e9;
        let plain = if unit == "GB/s" { "B/s" } else { "/s" };
        format!("{per_s:.1} {plain}")
    }
}

/// Whether `column` ran on this machine's CPU, so that its share of the CPU peaks
/// means something (the CUDA columns of `--features cuda` are labelled `cuda-*`).
fn on_cpu(column: &str) -> bool {
    !column.starts_with("cuda")
}

pub fn run(dir: Option<&str>) -> Result<(), String> {
    print!("{}", report(Path::new(dir.unwrap_or("target/criterion")))?);
    Ok(())
}

/// The markdown tables of the results under `root`.
fn report(root: &Path) -> Result<String, String> {
    use std::fmt::Write;
    let mut text = String::new();
    let mut dirs = Vec::new();
    find(root, &mut dirs);
    if dirs.is_empty() {
        return Err(format!(
            "no criterion results under {}; run `cargo bench -p andrea-benches` first",
            root.display()
        ));
    }
    let mut entries = Vec::new();
    for d in dirs {
        if let Some(e) = read(&d)? {
            entries.push(e);
        }
    }
    // Peaks of the same run: FMA for compute-bound groups, copy for memory-bound ones.
    let peak_fma = entries
        .iter()
        .filter(|e| e.group == "peak" && e.function.starts_with("fma"))
        .map(|e| e.rate)
        .fold(None, |a: Option<f64>, r| Some(a.map_or(r, |a| a.max(r))));
    let peak_copy = entries
        .iter()
        .filter(|e| e.group == "peak" && e.function.starts_with("copy"))
        .map(|e| e.rate)
        .fold(None, |a: Option<f64>, r| Some(a.map_or(r, |a| a.min(r))));
    // group -> row -> column -> (rate, unit)
    type Columns<'a> = BTreeMap<String, (f64, &'a str)>;
    let mut groups: BTreeMap<String, BTreeMap<String, Columns>> = BTreeMap::new();
    for e in &entries {
        let (row, col) = if e.value.is_empty() {
            (e.function.clone(), "-".to_string())
        } else {
            (e.value.clone(), e.function.clone())
        };
        groups
            .entry(e.group.clone())
            .or_default()
            .entry(row)
            .or_default()
            .insert(col, (e.rate, e.unit));
    }
    for (group, rows) in &groups {
        let mut cols: Vec<&String> = rows.values().flat_map(|r| r.keys()).collect();
        cols.sort();
        cols.dedup();
        // Memory-bound ops against the copy of their own footprint where the run has one
        // (`memory_bound/copy-*/<op>`, benches/benches/ops.rs), else the smallest copy.
        let own_copy = |vals: &Columns| {
            vals.iter()
                .find(|(c, _)| c.starts_with("copy-"))
                .map(|(_, (r, _))| *r)
        };
        let has_own = group == "memory_bound" && rows.values().any(|v| own_copy(v).is_some());
        let peak = match group.as_str() {
            "gemm" | "attention" => peak_fma.map(|p| (p, "FMA peak")),
            "memory_bound" if has_own => Some((0.0, "own-size copy")),
            "memory_bound" => peak_copy.map(|p| (p, "copy bandwidth")),
            _ => None,
        };
        // Shares of the CPU's peaks only for the columns that ran on the CPU.
        let with_peak = |c: &str| peak.is_some() && on_cpu(c) && !c.starts_with("copy-");
        let _ = writeln!(text, "\n### {group}\n");
        let mut header = String::from("| benchmark |");
        let mut n_cols = 1;
        for c in &cols {
            header.push_str(&format!(" {c} |"));
            n_cols += 1;
            if let (Some((_, what)), true) = (peak, with_peak(c)) {
                header.push_str(&format!(" {c} % of {what} |"));
                n_cols += 1;
            }
        }
        let _ = writeln!(text, "{header}");
        let _ = writeln!(text, "|{}", "---|".repeat(n_cols));
        for (row, vals) in rows {
            let mut line = format!("| {row} |");
            let peak = match (has_own, peak) {
                (true, Some((_, what))) => own_copy(vals).map(|r| (r, what)),
                (_, p) => p,
            };
            for c in &cols {
                match vals.get(*c) {
                    Some((r, unit)) => {
                        line.push_str(&format!(" {} |", rate_text(*r, unit)));
                        match (peak, with_peak(c)) {
                            (Some((p, _)), true) => {
                                line.push_str(&format!(" {:.0}% |", 100.0 * r / p))
                            }
                            (None, true) => line.push_str(" - |"),
                            _ => {}
                        }
                    }
                    None => line.push_str(if with_peak(c) { " - | - |" } else { " - |" }),
                }
            }
            let _ = writeln!(text, "{line}");
        }
    }
    Ok(text)
}

#[cfg(test)]
mod tests {
    use super::report;
    use std::path::Path;

    /// One criterion result: `group/function/value` with `elements` per iteration.
    fn write(root: &Path, group: &str, function: &str, value: &str, elements: f64, ns: f64) {
        write_as(root, group, function, value, ("Elements", elements), ns)
    }

    /// One criterion result with `amount` of throughput kind `Elements` or `Bytes`.
    fn write_as(
        root: &Path,
        group: &str,
        function: &str,
        value: &str,
        amount: (&str, f64),
        ns: f64,
    ) {
        let dir = root.join(group).join(function).join(value).join("new");
        std::fs::create_dir_all(&dir).unwrap();
        let b = serde_json::json!({
            "group_id": group, "function_id": function, "value_str": value,
            "throughput": {amount.0: amount.1},
        });
        let e = serde_json::json!({"median": {"point_estimate": ns}});
        std::fs::write(dir.join("benchmark.json"), b.to_string()).unwrap();
        std::fs::write(dir.join("estimates.json"), e.to_string()).unwrap();
    }

    /// A memory-bound op is put against the copy of its own footprint from the same run,
    /// not against the smallest copy.
    #[test]
    fn memory_bound_ops_are_compared_with_their_own_size_copy() {
        let root =
            std::env::temp_dir().join(format!("andrea-bench-own-copy-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        write(&root, "peak", "copy_2t_3MB", "", 1e9, 1e8); // 10 GB/s, not used
        let bytes =
            |f: &str, b: f64| write_as(&root, "memory_bound", f, "layernorm", ("Bytes", b), 1e9);
        bytes("cpu-2t", 4e9); // 4 GB/s
        bytes("copy-2t", 8e9); // 8 GB/s
        let text = report(&root).unwrap();
        let _ = std::fs::remove_dir_all(&root);
        assert!(
            text.contains("| benchmark | copy-2t | cpu-2t | cpu-2t % of own-size copy |"),
            "{text}"
        );
        assert!(
            text.contains("| layernorm | 8.0 GB/s | 4.0 GB/s | 50% |"),
            "{text}"
        );
    }

    #[test]
    fn cuda_columns_get_no_share_of_the_cpu_peak() {
        let root = std::env::temp_dir().join(format!("andrea-bench-report-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        write(&root, "peak", "fma_f32_2t", "", 1e9, 1e9); // 1 G/s
        write(&root, "gemm", "cpu-2t", "fwd_qkv", 5e8, 1e9); // 0.5 G/s
        write(&root, "gemm", "cuda-tf32", "fwd_qkv", 1e11, 1e9); // 100 G/s
        let text = report(&root).unwrap();
        let _ = std::fs::remove_dir_all(&root);
        assert!(
            text.contains("| benchmark | cpu-2t | cpu-2t % of FMA peak | cuda-tf32 |"),
            "{text}"
        );
        assert!(
            text.contains("| fwd_qkv | 0.5 G/s | 50% | 100.0 G/s |"),
            "{text}"
        );
        assert!(text.contains("|---|---|---|---|\n"), "{text}");
    }
}
