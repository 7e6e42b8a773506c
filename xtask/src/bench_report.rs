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

pub fn run(dir: Option<&str>) -> Result<(), String> {
    let root = PathBuf::from(dir.unwrap_or("target/criterion"));
    let mut dirs = Vec::new();
    find(&root, &mut dirs);
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
        let peak = match group.as_str() {
            "gemm" | "attention" => peak_fma.map(|p| (p, "FMA peak")),
            "memory_bound" => peak_copy.map(|p| (p, "copy bandwidth")),
            _ => None,
        };
        println!("\n### {group}\n");
        let mut header = String::from("| benchmark |");
        for c in &cols {
            header.push_str(&format!(" {c} |"));
            if let Some((_, what)) = peak {
                header.push_str(&format!(" {c} % of {what} |"));
            }
        }
        println!("{header}");
        println!(
            "|{}",
            "---|".repeat(1 + cols.len() * if peak.is_some() { 2 } else { 1 })
        );
        for (row, vals) in rows {
            let mut line = format!("| {row} |");
            for c in &cols {
                match vals.get(*c) {
                    Some((r, unit)) => {
                        line.push_str(&format!(" {} |", rate_text(*r, unit)));
                        if let Some((p, _)) = peak {
                            line.push_str(&format!(" {:.0}% |", 100.0 * r / p));
                        }
                    }
                    None => line.push_str(if peak.is_some() { " - | - |" } else { " - |" }),
                }
            }
            println!("{line}");
        }
    }
    Ok(())
}
