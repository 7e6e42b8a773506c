//! Scratch timing of single ops (not part of the docs).
use andrea_core::{Backend, View};
use std::time::Instant;
fn main() {
    let be = andrea_cpu::CpuBackend::with_threads(1).unwrap();
    let n = 1 << 20;
    let x = be.alloc(n).unwrap();
    let y = be.alloc(n).unwrap();
    be.upload(
        &(0..n)
            .map(|i| (i % 1000) as f32 * 0.01 - 5.0)
            .collect::<Vec<_>>(),
        View::whole(&x),
    )
    .unwrap();
    let mut best = [f64::MAX; 3];
    for _ in 0..30 {
        let t = Instant::now();
        be.gelu(View::whole(&x), View::whole(&y)).unwrap();
        best[0] = best[0].min(t.elapsed().as_secs_f64());
        let t = Instant::now();
        be.gelu_backward(View::whole(&x), View::whole(&x), View::whole(&y))
            .unwrap_or(());
        best[1] = best[1].min(t.elapsed().as_secs_f64());
        let t = Instant::now();
        be.softmax(
            View::new(&x, 0, [n / 256, 256]),
            View::new(&y, 0, [n / 256, 256]),
            0.125,
            None,
        )
        .unwrap();
        best[2] = best[2].min(t.elapsed().as_secs_f64());
    }
    for (name, b) in ["gelu", "gelu_bwd(x,x)", "softmax256"].iter().zip(best) {
        println!(
            "{name}: {:.3} ns/elem (best of 30, 1 thread)",
            b * 1e9 / n as f64
        );
    }
}
