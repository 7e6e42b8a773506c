use std::arch::x86_64::*;
use std::time::Instant;
#[target_feature(enable = "avx512f")]
unsafe fn nt_fill(p: *mut f32, n: usize, v: f32) {
    let vv = _mm512_set1_ps(v);
    let head = ((64 - p as usize % 64) % 64 / 4).min(n);
    for i in 0..head { *p.add(i) = v; }
    let mut i = head;
    while i + 16 <= n { _mm512_stream_ps(p.add(i), vv); i += 16; }
    while i < n { *p.add(i) = v; i += 1; }
    _mm_sfence();
}
fn run(buf: &mut [f32], nt: bool, threads: usize) -> f64 {
    let t = Instant::now();
    let chunk = buf.len().div_ceil(threads);
    std::thread::scope(|s| {
        for c in buf.chunks_mut(chunk) {
            s.spawn(move || {
                // 64k-float sub-chunks, like the backend's tasks
                for sc in c.chunks_mut(1 << 16) {
                    if nt { unsafe { nt_fill(sc.as_mut_ptr(), sc.len(), 0.0) } } else { sc.fill(std::hint::black_box(0.0)); }
                }
            });
        }
    });
    t.elapsed().as_secs_f64()
}
fn main() {
    let n = 124_000_000usize;
    let layout = std::alloc::Layout::from_size_align(n * 4, 2 << 20).unwrap();
    let p = unsafe { std::alloc::alloc_zeroed(layout) as *mut f32 };
    unsafe { libc_madvise(p as *mut u8, n * 4) };
    let buf = unsafe { std::slice::from_raw_parts_mut(p, n) };
    for x in buf.iter_mut() { *x = 1.0; }
    for round in 0..5 {
        let a = run(buf, false, 2);
        let b = run(buf, true, 2);
        println!("round {round}: plain {:.1} ms ({:.1} GB/s), streamed {:.1} ms ({:.1} GB/s)", a * 1e3, n as f64 * 4.0 / a / 1e9, b * 1e3, n as f64 * 4.0 / b / 1e9);
    }
}
extern "C" { fn madvise(addr: *mut u8, len: usize, advice: i32) -> i32; }
unsafe fn libc_madvise(p: *mut u8, len: usize) { madvise(p, len, 14); }
