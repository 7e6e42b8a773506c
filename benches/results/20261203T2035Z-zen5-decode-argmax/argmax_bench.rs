use std::time::Instant;
fn key(x: f32) -> f32 { if x.is_nan() { f32::NEG_INFINITY } else { x } }
#[inline(always)]
fn argmax_g(logits: &[f32]) -> usize {
    const LANES: usize = 16;
    let mut lanes = [f32::NEG_INFINITY; LANES];
    let chunks = logits.chunks_exact(LANES);
    let mut max = chunks.remainder().iter().fold(f32::NEG_INFINITY, |m, &x| if key(x) > m { key(x) } else { m });
    for c in chunks { for (l, &x) in lanes.iter_mut().zip(c) { *l = if key(x) > *l { key(x) } else { *l }; } }
    for l in lanes { max = if l > max { l } else { max }; }
    logits.iter().position(|&x| key(x) == max).unwrap_or(0)
}
#[inline(always)]
fn argmax_c(logits: &[f32]) -> usize {
    const LANES: usize = 16;
    let mut lanes = [f32::NEG_INFINITY; LANES];
    let chunks = logits.chunks_exact(LANES);
    let mut max = chunks.remainder().iter().fold(f32::NEG_INFINITY, |m, &x| if key(x) > m { key(x) } else { m });
    for c in chunks { for (l, &x) in lanes.iter_mut().zip(c) { *l = if key(x) > *l { key(x) } else { *l }; } }
    for l in lanes { max = if l > max { l } else { max }; }
    let mut base = 0;
    for c in logits.chunks(LANES) {
        if c.iter().fold(false, |f, &x| f | (key(x) == max)) {
            return base + c.iter().position(|&x| key(x) == max).unwrap_or(0);
        }
        base += c.len();
    }
    0
}
#[target_feature(enable = "avx2,fma")]
unsafe fn argmax_avx2(l: &[f32]) -> usize { argmax_c(l) }
#[target_feature(enable = "avx512f,avx2,fma")]
unsafe fn argmax_512(l: &[f32]) -> usize { argmax_c(l) }
fn main() {
    let v: Vec<f32> = (0..8449u32).map(|i| ((i.wrapping_mul(2654435761)) >> 8) as f32 / 1e6).collect();
    let want = argmax_g(&v);
    for (name, f) in [("generic", argmax_g as fn(&[f32]) -> usize), ("chunked", argmax_c), ("avx2", |l: &[f32]| unsafe { argmax_avx2(l) }), ("avx512", |l: &[f32]| unsafe { argmax_512(l) })] {
        assert_eq!(f(&v), want);
        let t = Instant::now();
        let mut s = 0;
        for _ in 0..20000 { s += f(std::hint::black_box(&v)); }
        println!("{name}: {:.2} us per call ({s})", t.elapsed().as_secs_f64() / 20000.0 * 1e6);
    }
    println!("argmax at {want}");
}
