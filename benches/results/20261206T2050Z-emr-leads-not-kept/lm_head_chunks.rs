//! Experiment: the output layer of a training step (logits, loss + dlogits in place,
//! d_ln, dwte) over all rows at once against chunks of rows, alternating.
use std::time::Instant;

use andrea_core::{LinalgOps, LossOps, MemoryOps, View};
use andrea_cpu::CpuBackend;

fn main() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let args: Vec<String> = std::env::args().collect();
    let n: usize = args[1].parse()?;
    let c: usize = args[2].parse()?;
    let chunks: Vec<usize> = args[3].split(',').map(|s| s.parse().unwrap()).collect();
    let rounds: usize = args.get(4).map(|s| s.parse().unwrap()).unwrap_or(15);
    rayon::ThreadPoolBuilder::new().num_threads(2).build_global()?;
    rayon::scope(|_| run(n, c, &chunks, rounds))
}

fn run(n: usize, c: usize, chunks: &[usize], rounds: usize) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let (v, vp) = (8449usize, 8512usize);
    let be = CpuBackend::new();
    let fill = |len: usize, s: u32, sc: f32| -> Vec<f32> {
        (0..len)
            .map(|i| (((i as u32).wrapping_mul(2_654_435_761).wrapping_add(s) >> 8) as f32 / 8e6 - 1.0) * sc)
            .collect()
    };
    let ln = be.alloc(n * c)?;
    be.upload(&fill(n * c, 1, 1.0), View::whole(&ln))?;
    let wte = be.alloc(vp * c)?;
    be.upload(&fill(vp * c, 2, 0.1), View::whole(&wte))?;
    let logits = be.alloc(n * vp)?;
    let losses = be.alloc(n)?;
    let d_ln = be.alloc(n * c)?;
    let dwte = be.alloc(vp * c)?;
    let ids = be.alloc_ids(n)?;
    let t: Vec<u32> = (0..n as u32).map(|i| i * 7919 % v as u32).collect();
    be.upload_ids(&t, View::whole(&ids))?;
    // a 256 MB buffer written between rounds, as the blocks' passes would
    let pollute = be.alloc(64 << 20)?;
    let mut times = vec![Vec::new(); chunks.len()];
    let mut ops: Vec<Vec<[f64; 4]>> = vec![Vec::new(); chunks.len()];
    for r in 0..rounds + 1 {
        for (ci, &rows) in chunks.iter().enumerate() {
            be.fill(View::whole(&pollute), r as f32)?;
            let t0 = Instant::now();
            let mut r0 = 0;
            while r0 < n {
                let m = if rows == 1 { n } else { rows.min(n - r0) };
                let lg = View::new(&logits, 0, [m, vp]);
                let lnv = View::new(&ln, r0 * c, [m, c]);
                let ta = Instant::now();
                be.matmul(lnv.mat(), View::new(&wte, 0, [vp, c]).mat().t(), None, lg.mat())?;
                let tb = Instant::now();
                be.softmax_cross_entropy(lg, View::new(&ids, r0, [m]), v, View::new(&losses, r0, [m]), Some(lg), 1.0 / n as f32)?;
                let tc = Instant::now();
                be.matmul(lg.mat(), View::new(&wte, 0, [vp, c]).mat(), None, View::new(&d_ln, r0 * c, [m, c]).mat())?;
                let td = Instant::now();
                if rows == 1 {
                    be.matmul(lnv.mat().t(), lg.mat(), None, View::new(&dwte, 0, [vp, c]).mat().t())?;
                    r0 += n; continue;
                }
                if r0 == 0 {
                    be.matmul(lg.mat().t(), lnv.mat(), None, View::new(&dwte, 0, [vp, c]).mat())?;
                } else {
                    be.matmul_add(lg.mat().t(), lnv.mat(), None, View::new(&dwte, 0, [vp, c]).mat())?;
                }
                let te = Instant::now();
                if m == n { ops[ci].push([tb - ta, tc - tb, td - tc, te - td].map(|d| d.as_secs_f64())); }
                r0 += m;
            }
            let mut h = vec![0.0; 1];
            be.download(View::new(&losses, 0, [1]), &mut h)?;
            times[ci].push(t0.elapsed().as_secs_f64());
        }
    }
    for (ci, o) in ops.iter().enumerate() {
        if o.is_empty() { continue; }
        let med = |j: usize| { let mut v: Vec<f64> = o.iter().map(|x| x[j]).collect(); v.sort_by(f64::total_cmp); v[v.len() / 2] * 1e3 };
        println!("variant {}: logits {:.2} ce {:.2} dx {:.2} dwte {:.2} ms", chunks[ci], med(0), med(1), med(2), med(3));
    }
    for (ci, t) in times.iter_mut().enumerate() {
        t.remove(0);
        t.sort_by(f64::total_cmp);
        println!("n {n} c {c} chunk {:5}: median {:.2} ms best {:.2} ms", chunks[ci], t[t.len() / 2] * 1e3, t[0] * 1e3);
    }
    Ok(())
}
