// Temporary A/B harness (not committed): the fused attention's backward, old and new,
// alternated in one process; prints per-shape medians, the median pair ratio, and
// whether both give the same bits.
use andrea_core::{AttentionOps, AttentionShape, DeviceMemory, Heads, MemoryOps, View};
use andrea_cpu::CpuBackend;
use std::sync::atomic::Ordering;
use std::time::Instant;

fn main() {
    let be = CpuBackend::new();
    let reps: usize = std::env::args().nth(1).map(|s| s.parse().unwrap()).unwrap_or(30);
    for [b, t, h, d] in [[4usize, 256, 12, 64], [8, 256, 4, 32]] {
        let cc = h * d;
        let mut seed = 1u64;
        let mut rnd = |n: usize| -> Vec<f32> {
            (0..n)
                .map(|_| {
                    seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                    ((seed >> 40) as f32 / (1u64 << 24) as f32) - 0.5
                })
                .collect()
        };
        let up = |x: Vec<f32>| { let buf = be.alloc(x.len()).unwrap(); be.upload(&x, View::whole(&buf)).unwrap(); buf };
        let qkv = up(rnd(b * t * 3 * cc));
        let att = be.alloc(b * t * cc).unwrap();
        let shape = AttentionShape { batch: b, heads: h, head_dim: d, q_len: t, k_len: t };
        let ws = be.alloc(be.attention_workspace_len(shape).max(1)).unwrap();
        let scratch = be.alloc(be.attention_backward_scratch_len(shape).max(1)).unwrap();
        let dqkv = be.alloc(b * t * 3 * cc).unwrap();
        let datt = up(rnd(b * t * cc));
        let [q, k, v] = Heads::split_qkv(View::new(&qkv, 0, [b, t, 3 * cc]), h).unwrap();
        let [dq, dk, dv] = Heads::split_qkv(View::new(&dqkv, 0, [b, t, 3 * cc]), h).unwrap();
        let o = Heads::from_tensor(View::new(&att, 0, [b, t, cc]), h).unwrap();
        let dout = Heads::from_tensor(View::new(&datt, 0, [b, t, cc]), h).unwrap();
        be.attention_forward(q, k, v, o, View::whole(&ws), 0).unwrap();
        let fwd = |new: bool| {
            if std::env::var("AB_ORDER").is_ok() { andrea_cpu::AB_ORDER.store(new, Ordering::Relaxed); } else { andrea_core::AB_NEW.store(new, Ordering::Relaxed); }
            let t0 = Instant::now();
            be.attention_forward(q, k, v, o, View::whole(&ws), 0).unwrap();
            t0.elapsed().as_secs_f64()
        };
        let grab = |buf: &andrea_cpu::CpuBuffer| { let mut x = vec![0.0; buf.len()]; be.download(View::whole(buf), &mut x).unwrap(); x };
        fwd(false);
        let (o_old, l_old) = (grab(&att), grab(&ws));
        fwd(true);
        let (o_new, l_new) = (grab(&att), grab(&ws));
        let bits = |a: &[f32], b: &[f32]| a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits());
        let fsame = bits(&o_old, &o_new) && bits(&l_old, &l_new);
        if std::env::var("AB_PAD").is_err() {
            let (mut o_t, mut n_t, mut ratios) = (vec![], vec![], vec![]);
            for i in 0..reps {
                let (a, bb) = if i % 2 == 0 { let a = fwd(false); (a, fwd(true)) } else { let bb = fwd(true); (fwd(false), bb) };
                o_t.push(a); n_t.push(bb); ratios.push(a / bb);
            }
            let med = |v: &mut Vec<f64>| { v.sort_by(|a, b| a.partial_cmp(b).unwrap()); v[v.len() / 2] };
            println!("forward  {b}x{t}x{h}x{d}: old {:.3} ms, new {:.3} ms, median pair ratio old/new {:.3}, same bits {fsame}",
                med(&mut o_t) * 1e3, med(&mut n_t) * 1e3, med(&mut ratios));
        }
        let run = |new: bool| {
            if std::env::var("AB_ORDER").is_ok() {
                andrea_cpu::AB_ORDER.store(new, Ordering::Relaxed);
            } else if std::env::var("AB_PAD").is_ok() {
                andrea_cpu::AB_PAD.store(new, Ordering::Relaxed);
            } else {
                andrea_core::AB_NEW.store(new, Ordering::Relaxed);
            }
            let t0 = Instant::now();
            be.attention_backward(q, k, v, o, dout, dq, dk, dv, View::whole(&ws), View::whole(&scratch)).unwrap();
            t0.elapsed().as_secs_f64()
        };
        run(false);
        let mut old_bits = vec![0.0; b * t * 3 * cc]; be.download(View::whole(&dqkv), &mut old_bits).unwrap();
        run(true);
        let mut new_bits = vec![0.0; b * t * 3 * cc]; be.download(View::whole(&dqkv), &mut new_bits).unwrap();
        let same = old_bits.iter().zip(&new_bits).all(|(a, b)| a.to_bits() == b.to_bits());
        let (mut o_t, mut n_t, mut ratios) = (vec![], vec![], vec![]);
        for i in 0..reps {
            let (a, bb) = if i % 2 == 0 { let a = run(false); (a, run(true)) } else { let bb = run(true); (run(false), bb) };
            o_t.push(a); n_t.push(bb); ratios.push(a / bb);
        }
        let med = |v: &mut Vec<f64>| { v.sort_by(|a, b| a.partial_cmp(b).unwrap()); v[v.len() / 2] };
        println!("backward {b}x{t}x{h}x{d}: old {:.3} ms, new {:.3} ms, median pair ratio old/new {:.3}, same bits {same}",
            med(&mut o_t) * 1e3, med(&mut n_t) * 1e3, med(&mut ratios));
    }
}
