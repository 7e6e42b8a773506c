use std::time::Instant;
#[inline(always)]
fn key(x: f32) -> f32 { if x.is_nan() { f32::NEG_INFINITY } else { x } }
#[inline(always)]
fn argmax_generic(logits: &[f32]) -> usize {
    const LANES: usize = 16;
    let mut lanes = [f32::NEG_INFINITY; LANES];
    let chunks = logits.chunks_exact(LANES);
    let mut max = chunks.remainder().iter().fold(f32::NEG_INFINITY, |m, &x| if key(x) > m { key(x) } else { m });
    for c in chunks { for (l, &x) in lanes.iter_mut().zip(c) { *l = if key(x) > *l { key(x) } else { *l }; } }
    for l in lanes { max = if l > max { l } else { max }; }
    let mut base = 0;
    for c in logits.chunks(LANES) {
        if c.iter().fold(false, |found, &x| found | (key(x) == max)) { return base + c.iter().position(|&x| key(x) == max).unwrap_or(0); }
        base += c.len();
    }
    0
}
#[target_feature(enable = "avx2")]
unsafe fn a2(l: &[f32]) -> usize { argmax_generic(l) }
#[target_feature(enable = "avx512f")]
unsafe fn a5(l: &[f32]) -> usize { argmax_generic(l) }
#[target_feature(enable = "avx512f")]
unsafe fn a5m(l: &[f32]) -> usize { argmax_m::<64>(l) }
#[target_feature(enable = "avx2")]
unsafe fn a2m(l: &[f32]) -> usize { argmax_m::<64>(l) }
#[target_feature(enable = "avx512f")]
unsafe fn a5mm(l: &[f32]) -> usize { argmax_m::<128>(l) }
#[inline(always)]
fn argmax_m<const L: usize>(logits: &[f32]) -> usize {
    // max via max of lanes with nan -> -inf, 4 accumulators
    let mut lanes = [f32::NEG_INFINITY; L];
    let chunks = logits.chunks_exact(L);
    let mut max = chunks.remainder().iter().fold(f32::NEG_INFINITY, |m, &x| if key(x) > m { key(x) } else { m });
    for c in chunks { for (l, &x) in lanes.iter_mut().zip(c) { *l = if key(x) > *l { key(x) } else { *l }; } }
    for l in lanes { max = if l > max { l } else { max }; }
    let mut base = 0;
    for c in logits.chunks(L) {
        if c.iter().fold(false, |found, &x| found | (key(x) == max)) { return base + c.iter().position(|&x| key(x) == max).unwrap_or(0); }
        base += c.len();
    }
    0
}
fn main() {
    let n = 8449;
    let v: Vec<f32> = (0..n).map(|i| ((i * 7919) % 10007) as f32 * 1e-3).collect();
    let mut v = v; v[6765] = 100.0;
    for (name, f) in [("avx2", a2 as unsafe fn(&[f32]) -> usize), ("avx512", a5), ("avx512x64", a5m), ("avx2x64", a2m), ("avx512x128", a5mm)] {
        let mut best = f64::MAX; let mut r = 0;
        for _ in 0..20 { let t = Instant::now(); for _ in 0..1000 { r += unsafe { f(std::hint::black_box(&v)) }; } best = best.min(t.elapsed().as_secs_f64() / 1000.0); }
        println!("{name}: {:.3} us ({r})", best * 1e6);
    }
}
