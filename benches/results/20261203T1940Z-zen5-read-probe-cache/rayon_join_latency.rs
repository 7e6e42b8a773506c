use std::time::Instant;
use rayon::prelude::*;
fn spin(us: f64) { let t = Instant::now(); while t.elapsed().as_secs_f64() < us * 1e-6 {} }
fn work(n: usize) -> f32 { let mut s = 0f32; for i in 0..n { s += std::hint::black_box(i as f32); } s }
fn main() {
    rayon::ThreadPoolBuilder::new().num_threads(2).build_global().unwrap();
    rayon::scope(|_| {
        for gap in [0.0, 3.0, 6.0, 10.0, 15.0, 20.0, 30.0] {
            let mut ts = vec![];
            let mut tid = 0usize;
            for _ in 0..3000 {
                spin(gap);
                let t = Instant::now();
                let (_, b) = rayon::join(|| work(2000), || { (work(2000), rayon::current_thread_index()) });
                if b.1 != rayon::current_thread_index() { tid += 1; }
                ts.push(t.elapsed().as_secs_f64() * 1e6);
            }
            ts.sort_by(|a, b| a.partial_cmp(b).unwrap());
            println!("gap {gap:5} us: join(2x work) median {:.2} us p10 {:.2} p90 {:.2}; stolen {:.0}%", ts[1500], ts[300], ts[2700], tid as f64 / 30.0);
        }
        let mut ts = vec![];
        for _ in 0..3000 { let t = Instant::now(); work(2000); ts.push(t.elapsed().as_secs_f64() * 1e6); }
        ts.sort_by(|a, b| a.partial_cmp(b).unwrap());
        println!("one work alone {:.2} us", ts[1500]);
    });
}
