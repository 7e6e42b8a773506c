use std::arch::x86_64::*;
use std::time::Instant;

#[inline(never)]
#[target_feature(enable = "avx512f,fma")]
unsafe fn kern<const MR: usize, const NV: usize>(kc: usize, a: *const f32, b: *const f32, c: *mut f32, crs: usize) {
    let mut acc = [[_mm512_setzero_ps(); NV]; MR];
    let mut ap = a;
    let mut bp = b;
    for _ in 0..kc {
        let bv: [__m512; NV] = std::array::from_fn(|v| _mm512_load_ps(bp.add(16 * v)));
        for i in 0..MR {
            let av = _mm512_set1_ps(*ap.add(i));
            for v in 0..NV {
                acc[i][v] = _mm512_fmadd_ps(av, bv[v], acc[i][v]);
            }
        }
        ap = ap.add(MR);
        bp = bp.add(16 * NV);
    }
    for i in 0..MR {
        for v in 0..NV {
            let p = c.add(i * crs + 16 * v);
            _mm512_storeu_ps(p, _mm512_add_ps(_mm512_loadu_ps(p), acc[i][v]));
        }
    }
}


#[repr(align(64))]
#[derive(Clone, Copy)]
struct Line([f32; 16]);

fn alloc(n: usize) -> Vec<Line> { vec![Line([1.0e-3; 16]); n.div_ceil(16)] }

/// GEMM macro-loop on packed buffers: A block mc x kc (panels of MR), B block kc x nc (panels of NR=16NV).
/// b_inner: for each B panel (outer), loop A panels (inner)  [B micro-panel in L1, A from L2]
/// else: for each A panel (outer), loop B panels (inner) [A micro-panel in L1, B from L2]
fn run<const MR: usize, const NV: usize>(kc: usize, mc: usize, nc: usize, a_outer: bool) {
    let nr = 16 * NV;
    let (ma, nb) = (mc / MR, nc / nr);
    let a = alloc(ma * MR * kc);
    let b = alloc(nb * nr * kc);
    let crs: usize = std::env::var("CRS").map(|v| v.parse().unwrap()).unwrap_or(0);
    let n_full = if crs == 0 { nr } else { crs };
    let mut c = vec![0.0f32; ma * MR * n_full.max(nb*nr) + 64 + nb * nr];
    let ap = a.as_ptr() as *const f32;
    let bp = b.as_ptr() as *const f32;
    let cp = c.as_mut_ptr();
    let mut best = 0.0f64;
    let reps = (2_000_000_000usize / (2 * ma * MR * nb * nr * kc)).max(1);
    for _ in 0..20 {
        let t = Instant::now();
        for _ in 0..reps {
            if a_outer {
                for i in 0..ma { for j in 0..nb { unsafe { kern::<MR, NV>(kc, ap.add(i * MR * kc), bp.add(j * nr * kc), if crs == 0 { cp.add((i * nb + j) * MR * nr) } else { cp.add(i * MR * crs + j * nr) }, n_full) } } }
            } else {
                for j in 0..nb { for i in 0..ma { unsafe { kern::<MR, NV>(kc, ap.add(i * MR * kc), bp.add(j * nr * kc), if crs == 0 { cp.add((i * nb + j) * MR * nr) } else { cp.add(i * MR * crs + j * nr) }, n_full) } } }
            }
        }
        let s = t.elapsed().as_secs_f64();
        best = best.max((2 * ma * MR * nb * nr * kc * reps) as f64 / s / 1e9);
    }
    println!("{}x{} kc={} mc={} nc={} a_outer={} best {:.1} GFLOP/s ({:.0}% of 247) {}", MR, nr, kc, mc, nc, a_outer, best, best / 247.0 * 100.0, c[0] > 0.0);
}


/// Full GEMM m x n x k with pre-packed operands (A packed per (mc block, kc slice); B per kc slice, all n),
/// C row-major m x n (fresh, 12 MB), loop: kc slices, mc blocks, B panels, A panels.
fn full<const MR: usize, const NV: usize>(m: usize, n: usize, k: usize, kc: usize, mc: usize, pf: usize, nc: usize) {
    let nr = 16 * NV;
    let mc = mc / MR * MR;
    let a = alloc(m.div_ceil(MR) * MR * k + 64);
    let b = alloc(n.div_ceil(nr) * nr * k + 64);
    let mut c = vec![0.0f32; m * n + 64];
    let ap = a.as_ptr() as *const f32;
    let bp = b.as_ptr() as *const f32;
    let cp = c.as_mut_ptr();
    let mut times = vec![];
    for _ in 0..15 {
        let t = Instant::now();
        for pc in (0..k).step_by(kc) {
            let kcc = kc.min(k - pc);
            if nc == 0 {
            for i0 in (0..m).step_by(mc) {
                let mcc = mc.min(m - i0);
                for j in 0..n / nr {
                    let bpan = unsafe { bp.add(pc * n + j * nr * kcc) };
                    for i in (0..mcc / MR) {
                        let apan = unsafe { ap.add(pc * m + (i0 + i * MR) * kcc) };
                        let ct = unsafe { cp.add((i0 + i * MR) * n + j * nr) };
                        if pf == 1 {
                            for r in 0..MR { unsafe { _mm_prefetch::<_MM_HINT_T0>(ct.add(r * n) as *const i8); _mm_prefetch::<_MM_HINT_T0>(ct.add(r * n + nr - 1) as *const i8); } }
                        }
                        if pf == 2 {
                            for r in 0..MR { unsafe { _mm_prefetch::<_MM_HINT_T1>(ct.add(r * n) as *const i8); _mm_prefetch::<_MM_HINT_T1>(ct.add(r * n + nr - 1) as *const i8); } }
                        }
                        if pf == 3 && i + 1 < mcc / MR {
                            // next tile's C (rows +MR) to L2
                            let cn = unsafe { ct.add(MR * n) };
                            for r in 0..MR { unsafe { _mm_prefetch::<_MM_HINT_T1>(cn.add(r * n) as *const i8); _mm_prefetch::<_MM_HINT_T1>(cn.add(r * n + nr - 1) as *const i8); } }
                        }
                        unsafe { kern::<MR, NV>(kcc, apan, bpan, ct, n) };
                    }
                }
            }
            } else {
            for j0 in (0..n).step_by(nc) {
            for i0 in (0..m).step_by(mc) {
                let mcc = mc.min(m - i0);
                for i in (0..mcc / MR) {
                    let apan = unsafe { ap.add(pc * m + (i0 + i * MR) * kcc) };
                    for j in j0 / nr..(j0 + nc) / nr {
                        let bpan = unsafe { bp.add(pc * n + j * nr * kcc) };
                        let ct = unsafe { cp.add((i0 + i * MR) * n + j * nr) };
                        unsafe { kern::<MR, NV>(kcc, apan, bpan, ct, n) };
                    }
                }
            }
            }
            }
        }
        times.push(t.elapsed().as_secs_f64());
    }
    times.sort_by(|a, b| a.partial_cmp(b).unwrap());
    let g = (2 * m * n * k) as f64 / 1e9;
    println!("full {}x{} m={} n={} k={} kc={} mc={} pf={} nc={}: median {:.1} best {:.1} GFLOP/s ({:.0}% of 247) {}", MR, nr, m, n, k, kc, mc, pf, nc, g / times[7], g / times[0], g / times[7] / 247.0 * 100.0, c[0] > 0.0);
}

fn main() {
    let args: Vec<usize> = std::env::args().skip(1).map(|a| a.parse().unwrap()).collect();
    let (m, n, k, kc, mc, pf, nc) = (args[0], args[1], args[2], args[3], args[4], args[5], args[6]);
    full::<14, 2>(m, n, k, kc, mc, pf, nc);
    full::<6, 4>(m, n, k, kc, mc, pf, nc);
    full::<8, 3>(m, n, k, kc, mc, pf, nc);
}
