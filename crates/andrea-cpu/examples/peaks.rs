//! This machine's peaks, the denominators of benches/README.md's "% of peak" figures:
//! the f32 FMA throughput at 256 and 512 bits and a read-only memory stream, on
//! `--threads` threads (default 2). One JSON object on stdout.
//!
//! ```text
//! cargo run --release -p andrea-cpu --example peaks -- --threads 2 --read-mb 366,2048
//! ```
//!
//! * `fma_256_gflops`, `fma_512_gflops`: `chains` independent FMA chains per thread
//!   (enough to cover the FMA latency on both pipes of the CPUs at hand), 2 FLOPs per
//!   lane; the best of `--reps` timings (a peak, so the least disturbed run). `null`
//!   where the CPU lacks the instructions. A machine whose 512-bit FMA runs as two
//!   256-bit halves (Zen 4) reads the same for both; one with two 512-bit FMA ports
//!   (Intel server cores) reads twice as much at 512 bits.
//! * `read_gbps`: for each size in `--read-mb`, every thread sums its contiguous share of
//!   one buffer (8 AVX accumulators, no writes), bytes read / seconds, best of `--reps`
//!   passes after one untimed pass, on threads started once, each pass begun on all of
//!   them at a spinning barrier. A size past the last-level cache is the DRAM read
//!   bandwidth; the decode's weights are read once per token in the same pattern. A size
//!   that cache holds (8 MiB, about the tiny model's weights) is its read rate; threads
//!   started once and released together keep their start-up and wake-up out of a pass
//!   that lasts tens of microseconds. The
//!   buffer is advised transparent huge pages, as the CPU backend's large buffers are
//!   (a stream over 4 KiB pages reads slower).
//! * `read_gbps_4k`: the same stream over a buffer left on 4 KiB pages, for comparison.

#[cfg(target_arch = "x86_64")]
use std::time::Instant;

struct Args {
    threads: usize,
    reps: usize,
    read_mb: Vec<usize>,
}

fn parse() -> Result<Args, String> {
    let mut a = Args {
        threads: 2,
        reps: 5,
        read_mb: vec![2048],
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let value = it.next().ok_or(format!("{flag} needs a value"))?;
        let num = |v: &str| {
            v.trim()
                .parse::<usize>()
                .ok()
                .filter(|&n| n > 0)
                .ok_or(format!("{flag}: expected a positive integer, got {v:?}"))
        };
        match flag.as_str() {
            "--threads" => a.threads = num(&value)?,
            "--reps" => a.reps = num(&value)?,
            "--read-mb" => a.read_mb = value.split(',').map(num).collect::<Result<_, _>>()?,
            _ => return Err(format!("unknown flag {flag}")),
        }
    }
    Ok(a)
}

/// Runs `f(thread)` on `threads` threads at once, `reps` times; the shortest wall time.
#[cfg(target_arch = "x86_64")]
fn best_of(threads: usize, reps: usize, f: impl Fn(usize) -> f32 + Sync) -> f64 {
    let mut best = f64::INFINITY;
    for _ in 0..reps {
        let barrier = std::sync::Barrier::new(threads + 1);
        let t = std::thread::scope(|s| {
            let hs: Vec<_> = (0..threads)
                .map(|i| {
                    let (f, barrier) = (&f, &barrier);
                    s.spawn(move || {
                        barrier.wait();
                        let t0 = Instant::now();
                        std::hint::black_box(f(i));
                        (t0, Instant::now())
                    })
                })
                .collect();
            barrier.wait();
            // From the first probe's start to the last one's end, each read on its own
            // thread: timed from this thread, a wait here (a busy host descheduling it
            // after the barrier) could find the probes done and time next to nothing
            // (reads of thousands of GB/s were seen).
            let spans: Vec<_> = hs
                .into_iter()
                .map(|h| h.join().expect("probe thread"))
                .collect();
            let start = spans.iter().map(|s| s.0).min().expect("one thread or more");
            let end = spans.iter().map(|s| s.1).max().expect("one thread or more");
            end.duration_since(start).as_secs_f64()
        });
        best = best.min(t);
    }
    best
}

/// A barrier whose threads spin rather than sleep: a thread woken from a futex can start
/// microseconds after the others, which in a pass of 40 µs (8 MiB from the last-level
/// cache) would count as reading time.
#[cfg(target_arch = "x86_64")]
struct SpinBarrier {
    threads: usize,
    arrived: std::sync::atomic::AtomicUsize,
}

#[cfg(target_arch = "x86_64")]
impl SpinBarrier {
    fn new(threads: usize) -> Self {
        SpinBarrier {
            threads,
            arrived: std::sync::atomic::AtomicUsize::new(0),
        }
    }

    /// The `round`-th wait (0, 1, ...): returns once every thread has arrived at it.
    fn wait(&self, round: usize) {
        use std::sync::atomic::Ordering;
        self.arrived.fetch_add(1, Ordering::AcqRel);
        while self.arrived.load(Ordering::Acquire) < (round + 1) * self.threads {
            std::hint::spin_loop();
        }
    }
}

/// Runs `pass(thread)` on `threads` threads started once, one untimed pass and then
/// `reps` timed ones, each started on all threads at once (a barrier); the shortest
/// span from the first thread's start to the last one's end. Each thread reads the same
/// share in every pass, as each of the backend's threads mostly takes the same part of
/// a product from token to token, so a buffer that fits the caches is read from them.
#[cfg(target_arch = "x86_64")]
fn best_pass(threads: usize, reps: usize, pass: impl Fn(usize) -> f32 + Sync) -> f64 {
    let barrier = SpinBarrier::new(threads);
    let spans: Vec<Vec<(Instant, Instant)>> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..threads)
            .map(|i| {
                let (pass, barrier) = (&pass, &barrier);
                s.spawn(move || {
                    std::hint::black_box(pass(i));
                    (0..reps)
                        .map(|r| {
                            barrier.wait(r);
                            let t0 = Instant::now();
                            std::hint::black_box(pass(i));
                            (t0, Instant::now())
                        })
                        .collect()
                })
            })
            .collect();
        hs.into_iter()
            .map(|h| h.join().expect("probe thread"))
            .collect()
    });
    (0..reps)
        .map(|r| {
            let start = spans
                .iter()
                .map(|t| t[r].0)
                .min()
                .expect("one thread or more");
            let end = spans
                .iter()
                .map(|t| t[r].1)
                .max()
                .expect("one thread or more");
            end.duration_since(start).as_secs_f64()
        })
        .fold(f64::INFINITY, f64::min)
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    pub const CHAINS_256: usize = 12;
    pub const CHAINS_512: usize = 16;

    #[target_feature(enable = "avx2,fma")]
    pub fn fma_256(iters: u64) -> f32 {
        let m = _mm256_set1_ps(0.999_999);
        let a0 = _mm256_set1_ps(1e-7);
        let mut acc = [_mm256_set1_ps(1.0); CHAINS_256];
        for _ in 0..iters {
            for a in acc.iter_mut() {
                *a = _mm256_fmadd_ps(*a, m, a0);
            }
        }
        let mut s = _mm256_setzero_ps();
        for a in acc {
            s = _mm256_add_ps(s, a);
        }
        let mut out = [0.0f32; 8];
        // SAFETY: `out` holds 8 floats.
        unsafe { _mm256_storeu_ps(out.as_mut_ptr(), s) };
        out.iter().sum()
    }

    #[target_feature(enable = "avx512f")]
    pub fn fma_512(iters: u64) -> f32 {
        let m = _mm512_set1_ps(0.999_999);
        let a0 = _mm512_set1_ps(1e-7);
        let mut acc = [_mm512_set1_ps(1.0); CHAINS_512];
        for _ in 0..iters {
            for a in acc.iter_mut() {
                *a = _mm512_fmadd_ps(*a, m, a0);
            }
        }
        let mut s = _mm512_setzero_ps();
        for a in acc {
            s = _mm512_add_ps(s, a);
        }
        _mm512_reduce_add_ps(s)
    }

    /// Σ x, 8 vector accumulators: a read stream with nothing else on the critical path.
    #[target_feature(enable = "avx2")]
    pub fn sum(x: &[f32]) -> f32 {
        let mut acc = [_mm256_setzero_ps(); 8];
        let chunks = x.chunks_exact(64);
        let tail: f32 = chunks.remainder().iter().sum();
        for c in chunks {
            for (j, a) in acc.iter_mut().enumerate() {
                // SAFETY: `c` holds 64 floats, 8 per accumulator.
                *a = _mm256_add_ps(*a, unsafe { _mm256_loadu_ps(c.as_ptr().add(8 * j)) });
            }
        }
        let mut s = _mm256_setzero_ps();
        for a in acc {
            s = _mm256_add_ps(s, a);
        }
        let mut out = [0.0f32; 8];
        // SAFETY: `out` holds 8 floats.
        unsafe { _mm256_storeu_ps(out.as_mut_ptr(), s) };
        out.iter().sum::<f32>() + tail
    }
}

/// Advises transparent huge pages for `buf`'s whole 2 MiB pages, as the CPU backend does
/// for its large buffers (andrea-cpu's `buffer::huge_pages`), so the read stream runs on
/// the same kind of memory as the decode it is the denominator of.
#[cfg(target_arch = "x86_64")]
fn advise_huge_pages(buf: &mut [f32]) {
    #[cfg(target_os = "linux")]
    {
        const HUGE: usize = 2 << 20;
        let start = (buf.as_ptr() as usize).next_multiple_of(HUGE);
        let end = (buf.as_ptr() as usize + std::mem::size_of_val(buf)) / HUGE * HUGE;
        if end > start {
            // SAFETY: the range lies inside `buf`; the advice changes no contents.
            unsafe { libc::madvise(start as *mut libc::c_void, end - start, libc::MADV_HUGEPAGE) };
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = buf;
}

fn main() {
    let args = match parse() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("peaks: {e}");
            std::process::exit(2);
        }
    };
    #[cfg(target_arch = "x86_64")]
    {
        use std::is_x86_feature_detected as has;
        if !(has!("avx2") && has!("fma")) {
            eprintln!("peaks: needs AVX2 + FMA");
            std::process::exit(2);
        }
        let th = args.threads;
        let iters = 1u64 << 24;
        // SAFETY (both probes): the CPU has the instructions, checked before each call.
        let t = best_of(th, args.reps, |_| unsafe { x86::fma_256(iters) });
        let fma_256 = (th as u64 * iters * x86::CHAINS_256 as u64 * 16) as f64 / t / 1e9;
        let fma_512 = has!("avx512f").then(|| {
            let t = best_of(th, args.reps, |_| unsafe { x86::fma_512(iters) });
            (th as u64 * iters * x86::CHAINS_512 as u64 * 32) as f64 / t / 1e9
        });
        // `"<MiB>": GB/s` entries, written as JSON by hand (the crate has no serde).
        let mut read = Vec::new();
        let mut read_4k = Vec::new();
        for &mb in &args.read_mb {
            for huge in [true, false] {
                let n = mb << 18; // floats in `mb` MiB
                let mut buf = vec![0.0f32; n]; // calloc: untouched until the fill below
                if huge {
                    advise_huge_pages(&mut buf);
                }
                for (i, v) in buf.iter_mut().enumerate() {
                    *v = (i % 7) as f32;
                }
                let share = n.div_ceil(th);
                // SAFETY: AVX2 checked above.
                let pass = |i: usize| unsafe {
                    x86::sum(&buf[(i * share).min(n)..((i + 1) * share).min(n)])
                };
                let t = best_pass(th, args.reps, pass);
                let entry = format!("\"{mb}\": {:.2}", (4 * n) as f64 / t / 1e9);
                if huge { &mut read } else { &mut read_4k }.push(entry);
            }
        }
        let flags = std::fs::read_to_string("/proc/cpuinfo")
            .ok()
            .and_then(|s| {
                s.lines()
                    .find(|l| l.starts_with("flags"))
                    .map(|l| l.split(':').nth(1).unwrap_or("").trim().to_string())
            })
            .unwrap_or_default();
        let simd: Vec<&str> = flags
            .split(' ')
            .filter(|f| f.starts_with("avx") || *f == "fma" || f.starts_with("amx"))
            .collect();
        println!(
            "{{\"bench\": \"peaks\", \"threads\": {th}, \"fma_256_gflops\": {fma_256:.2}, \
             \"fma_512_gflops\": {}, \"fma_chains\": [{}, {}], \"read_gbps\": {{{}}}, \
             \"read_gbps_4k\": {{{}}}, \"simd_flags\": \"{}\"}}",
            fma_512.map_or("null".into(), |g| format!("{g:.2}")),
            x86::CHAINS_256,
            x86::CHAINS_512,
            read.join(", "),
            read_4k.join(", "),
            simd.join(" ")
        );
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = args;
        eprintln!("peaks: x86-64 only");
        std::process::exit(2);
    }
}
