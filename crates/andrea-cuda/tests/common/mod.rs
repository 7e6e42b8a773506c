//! Running one op on the CPU backend and the CUDA backend from the same host inputs.

#![allow(dead_code)]

use andrea_core::{Backend, Error, View};
use andrea_cpu::CpuBackend;
use andrea_cuda::{CudaBackend, Precision};

/// The CUDA backend in `precision`, or `None` (after printing `SKIPPED name: reason`)
/// when there is no device and `ANDREA_REQUIRE_DEVICE` is not set.
pub fn cuda(name: &str, precision: Precision) -> Option<CudaBackend> {
    match CudaBackend::with_precision(precision) {
        Ok(be) => Some(be),
        Err(e @ Error::NoDevice { .. }) => {
            if std::env::var_os("ANDREA_REQUIRE_DEVICE").is_some_and(|v| v != "0") {
                panic!("{name}: ANDREA_REQUIRE_DEVICE is set but: {e}");
            }
            skipped(name, &e.to_string());
            None
        }
        Err(e) => panic!("{name}: the CUDA backend failed to start: {e}"),
    }
}

/// Prints `SKIPPED name: reason` straight to the process's stderr: libtest captures
/// `eprintln!` of passing tests, and a skip must be visible without `--nocapture`.
pub fn skipped(name: &str, reason: &str) {
    use std::io::Write;
    let _ = writeln!(std::io::stderr(), "SKIPPED {name}: {reason}");
}

/// A deterministic pseudo-random vector in `[lo, hi)`.
pub fn data(seed: u64, n: usize, lo: f32, hi: f32) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            lo + (hi - lo) * ((s >> 40) as f32 / (1u64 << 24) as f32)
        })
        .collect()
}

/// A buffer holding `host`.
pub fn buf<B: Backend>(be: &B, host: &[f32]) -> B::Buffer {
    let b = be.alloc(host.len()).expect("alloc");
    be.upload(host, View::whole(&b)).expect("upload");
    b
}

/// A token-id buffer holding `host`.
pub fn ids<B: Backend>(be: &B, host: &[u32]) -> B::IdBuffer {
    let b = be.alloc_ids(host.len()).expect("alloc_ids");
    be.upload_ids(host, View::whole(&b)).expect("upload_ids");
    b
}

/// The contents of a buffer.
pub fn read<B: Backend>(be: &B, b: &B::Buffer) -> Vec<f32> {
    let mut host = vec![0.0; andrea_core::DeviceMemory::len(b)];
    be.download(View::whole(b), &mut host).expect("download");
    host
}

/// The CPU backend the GPU is compared with.
pub fn cpu() -> CpuBackend {
    CpuBackend::new()
}

/// Compares element by element: `|gpu - cpu| <= bound(i)`; on failure names the worst.
pub fn compare(
    name: &str,
    gpu: &[f32],
    cpu: &[f32],
    bound: impl Fn(usize) -> f64,
) -> Result<(), String> {
    assert_eq!(gpu.len(), cpu.len(), "{name}: lengths");
    let mut worst: Option<(usize, f64)> = None;
    let mut failed = 0;
    for i in 0..gpu.len() {
        let (g, c) = (gpu[i] as f64, cpu[i] as f64);
        let r = if g == c {
            0.0
        } else {
            (g - c).abs() / bound(i)
        };
        let r = if r.is_nan() { f64::INFINITY } else { r };
        if r > 1.0 {
            failed += 1;
        }
        if worst.is_none_or(|(_, w)| r > w) {
            worst = Some((i, r));
        }
    }
    match worst {
        Some((i, r)) if failed > 0 => Err(format!(
            "{name}: {failed} of {} elements out of tolerance; worst at {i}: gpu {:e}, cpu {:e}, |diff| / bound = {r:.2}",
            gpu.len(),
            gpu[i],
            cpu[i]
        )),
        _ => Ok(()),
    }
}
