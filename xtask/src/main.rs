//! `cargo xtask <task>`: developer tasks that are not part of the library.
//!
//! * `bench-report [DIR]`: a markdown table of the criterion results under
//!   `target/criterion` (or DIR): the median throughput of every benchmark, one column
//!   per backend or peer, and the share of this machine's measured peak (the `peak/*`
//!   benchmarks of the same run).

mod bench_report;

use std::process::ExitCode;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let result = match args.first().map(String::as_str) {
        Some("bench-report") => bench_report::run(args.get(1).map(String::as_str)),
        Some("help") | Some("--help") | None => {
            println!("usage: cargo xtask <task>\n\ntasks:\n  bench-report [DIR]   table of criterion medians (default DIR: target/criterion)");
            Ok(())
        }
        Some(other) => Err(format!("unknown task `{other}`; run `cargo xtask help`")),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("xtask: {e}");
            ExitCode::FAILURE
        }
    }
}
