use std::arch::x86_64::*;
use std::sync::{Arc, Barrier};
use std::time::Instant;
#[target_feature(enable = "avx512f")]
unsafe fn sum(x: &[f32]) -> f32 {
    let mut acc = [_mm512_setzero_ps(); 8];
    for c in x.chunks_exact(128) {
        for j in 0..8 { acc[j] = _mm512_add_ps(acc[j], _mm512_loadu_ps(c.as_ptr().add(16*j))); }
    }
    let mut s = _mm512_setzero_ps();
    for a in acc { s = _mm512_add_ps(s, a); }
    _mm512_reduce_add_ps(s)
}
fn main() {
    // args: MB per thread, mode (0 fixed, 1 swap each pass), passes
    let a: Vec<String> = std::env::args().collect();
    let mb: f64 = a[1].parse().unwrap();
    let mode: usize = a[2].parse().unwrap();
    let passes: usize = a[3].parse().unwrap();
    let n = (mb * 262144.0) as usize / 128 * 128;
    let bufs: Arc<Vec<Vec<f32>>> = Arc::new((0..2).map(|t| (0..n).map(|i| (i % 7 + t) as f32).collect()).collect());
    let bar = Arc::new(Barrier::new(2));
    let hs: Vec<_> = (0..2).map(|t| { let bufs = bufs.clone(); let bar = bar.clone(); std::thread::spawn(move || {
        let mut times = vec![];
        for p in 0..passes {
            bar.wait();
            let which = if mode == 1 { (t + p) % 2 } else { t };
            let t0 = Instant::now();
            std::hint::black_box(unsafe { sum(&bufs[which]) });
            times.push(t0.elapsed().as_secs_f64());
        }
        times
    })}).collect();
    let ts: Vec<Vec<f64>> = hs.into_iter().map(|h| h.join().unwrap()).collect();
    let mut per: Vec<f64> = (10..passes).map(|p| ts[0][p].max(ts[1][p])).collect();
    per.sort_by(|a, b| a.partial_cmp(b).unwrap());
    let med = per[per.len()/2];
    println!("mb/thread {mb} mode {mode}: median pass {:.1} us, {:.1} GB/s total", med*1e6, 2.0*(n*4) as f64/med/1e9);
}
