//! The committed limits of `cargo xtask sass-report --check` ([`THRESHOLDS_FILE`]): one
//! row per kernel, whitespace-separated columns, `-` for none, `#` comments:
//!
//! ```text
//! # kernel                 max/HMMA  max_regs  max_spills  target/HMMA
//! *                        -         -         0           -
//! matmul_mma_bf16_128x128  48.5      128       0           6
//! ```
//!
//! `*` applies to every kernel without a row of its own. A kernel with tensor-core
//! instructions needs its own row with a maximum of instructions per HMMA. The target is
//! where the kernel should get to; the report says whether it is met, and it fails
//! nothing.

use std::collections::BTreeMap;

/// The file, relative to the workspace root.
pub const THRESHOLDS_FILE: &str = "kernels/sass-thresholds.tsv";

/// One row's limits.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Threshold {
    pub max_per_mma: Option<f64>,
    pub max_registers: Option<u32>,
    pub max_spills: Option<u32>,
    pub target_per_mma: Option<f64>,
}

#[derive(Debug, Default)]
pub struct Thresholds {
    rows: BTreeMap<String, Threshold>,
    default: Option<Threshold>,
}

fn field<T: std::str::FromStr>(line: usize, what: &str, s: &str) -> Result<Option<T>, String> {
    if s == "-" {
        return Ok(None);
    }
    s.parse().map(Some).map_err(|_| {
        format!("line {line}: {what} `{s}` is not a number (write a number, or - for none)")
    })
}

impl Thresholds {
    pub fn parse(text: &str) -> Result<Thresholds, String> {
        let mut t = Thresholds::default();
        for (n, line) in text.lines().enumerate() {
            let line = line.split('#').next().unwrap_or("").trim();
            if line.is_empty() {
                continue;
            }
            let cols: Vec<&str> = line.split_whitespace().collect();
            let n = n + 1;
            let [name, ipm, regs, spills, target] = cols[..] else {
                return Err(format!(
                    "line {n}: {} columns, expected 5 (kernel, max instructions per HMMA, max \
                     registers, max spills, target instructions per HMMA)",
                    cols.len()
                ));
            };
            let row = Threshold {
                max_per_mma: field(n, "max instructions per HMMA", ipm)?,
                max_registers: field(n, "max registers", regs)?,
                max_spills: field(n, "max spills", spills)?,
                target_per_mma: field(n, "target instructions per HMMA", target)?,
            };
            let slot = if name == "*" {
                t.default.replace(row)
            } else {
                t.rows.insert(name.to_string(), row)
            };
            if slot.is_some() {
                return Err(format!("line {n}: a second row for `{name}`"));
            }
        }
        Ok(t)
    }

    /// The kernel's own row.
    pub fn own(&self, kernel: &str) -> Option<&Threshold> {
        self.rows.get(kernel)
    }

    /// The kernel's own row, else `*`.
    pub fn get(&self, kernel: &str) -> Option<&Threshold> {
        self.own(kernel).or(self.default.as_ref())
    }

    /// The kernels with rows of their own.
    pub fn named(&self) -> impl Iterator<Item = &str> {
        self.rows.keys().map(String::as_str)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_defaults_and_comments() {
        let t = Thresholds::parse(
            "# kernel max regs spills target\n*  -  -  0  -\n\nk_mma  48.5 128 0 6  # today\n",
        )
        .expect("parses");
        assert_eq!(
            t.get("k_mma"),
            Some(&Threshold {
                max_per_mma: Some(48.5),
                max_registers: Some(128),
                max_spills: Some(0),
                target_per_mma: Some(6.0)
            })
        );
        assert_eq!(t.own("other"), None);
        assert_eq!(t.get("other").and_then(|r| r.max_spills), Some(0));
        assert_eq!(t.named().collect::<Vec<_>>(), ["k_mma"]);
    }

    #[test]
    fn bad_rows_name_their_line() {
        let e = Thresholds::parse("a 1 2 3\n").unwrap_err();
        assert!(e.contains("line 1") && e.contains("4 columns"), "{e}");
        let e = Thresholds::parse("\na 1 x 0 -\n").unwrap_err();
        assert!(
            e.contains("line 2") && e.contains("max registers `x`"),
            "{e}"
        );
        let e = Thresholds::parse("a 1 2 0 -\na 1 2 0 -\n").unwrap_err();
        assert!(e.contains("second row"), "{e}");
    }
}
