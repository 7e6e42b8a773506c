//! Experiment harness (an example of andrea-cpu while it ran; needs the diff
//! dw_ksplit_and_preread.diff for `KSPLIT` and `CpuBuffer::host_slice`): the step's weight
//! gradient products `dW = xᵀ·dy` on the tiny model's and ANDREA-120M's shapes, each call
//! after a 256 MB write (operands out of cache, as in a step), the old path and a variant
//! alternating call by call, 21 calls each. First run: the variant is `KSPLIT` (the
//! reduction split in two halves, one per thread, the second half into scratch and added).
//! Second and third runs (as below): the variant pre-reads both operands on both threads
//! before the product (`EXCL=1`: that read left out of the time, to see how much a warm
//! start alone would give).
use std::sync::atomic::Ordering;
use std::time::Instant;

use andrea_core::{LinalgOps, MemoryOps, View};
use andrea_cpu::{CpuBackend, KSPLIT};

fn main() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let rounds: usize = std::env::args().nth(1).map(|s| s.parse().unwrap()).unwrap_or(21);
    rayon::ThreadPoolBuilder::new().num_threads(2).build_global()?;
    rayon::scope(|_| run(rounds))
}

fn run(rounds: usize) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let be = CpuBackend::new();
    let shapes = [
        (128, 2048, 384),
        (128, 2048, 128),
        (128, 2048, 512),
        (512, 2048, 128),
        (8512, 2048, 128),
        (768, 1024, 768),
        (768, 1024, 3072),
        (3072, 1024, 768),
    ];
    let pollute = be.alloc(64 << 20)?;
    for (m, k, n) in shapes {
        let a = be.alloc(k * m)?;
        let b = be.alloc(k * n)?;
        let c = be.alloc(m * n)?;
        be.fill(View::whole(&a), 0.5)?;
        be.fill(View::whole(&b), 0.25)?;
        let mut t = [Vec::new(), Vec::new()];
        for r in 0..2 * rounds + 2 {
            let on = r % 2 == 1;
            // First run: KSPLIT.store(on, ..) and no pre-read.
            KSPLIT.store(false, Ordering::Relaxed);
            be.fill(View::whole(&pollute), r as f32)?;
            let mut t0 = Instant::now();
            if on {
                let (ah, bh) = (a.host_slice(), b.host_slice());
                use rayon::prelude::*;
                let s: f32 = ah
                    .par_chunks(1 << 16)
                    .chain(bh.par_chunks(1 << 16))
                    .map(|ch| {
                        let mut acc = [0f32; 16];
                        for v in ch.chunks_exact(16) {
                            for i in 0..16 {
                                acc[i] += v[i];
                            }
                        }
                        acc.iter().sum::<f32>()
                    })
                    .sum();
                std::hint::black_box(s);
                if std::env::var("EXCL").is_ok() {
                    t0 = Instant::now();
                }
            }
            let (am, bm, cm) = (
                View::new(&a, 0, [k, m]).mat().t(),
                View::new(&b, 0, [k, n]).mat(),
                View::new(&c, 0, [m, n]).mat(),
            );
            be.matmul(am, bm, None, cm)?;
            if r >= 2 {
                t[on as usize].push(t0.elapsed().as_secs_f64());
            }
        }
        let med = |v: &mut Vec<f64>| {
            v.sort_by(f64::total_cmp);
            v[v.len() / 2]
        };
        let (off, on) = (med(&mut t[0]), med(&mut t[1]));
        let gf = |s: f64| 2.0 * (m * k * n) as f64 / s / 1e9;
        println!(
            "{m}x{k}x{n} tn: rows/cols {:.1} GFLOP/s, k-split {:.1} GFLOP/s, ratio {:.3}",
            gf(off),
            gf(on),
            off / on
        );
    }
    Ok(())
}
