//! Each product of an ANDREA-120M decoding step at batch 1, timed one call at a time, as
//! GB/s of weights read: the four products of each of 12 layers (QKV with its bias, the
//! attention projection, the MLP's up projection with GELU, its down projection) and
//! the tied output layer `x·wteᵀ`, over a token's worth of distinct weights (366 MB,
//! more than any cache), as `andrea bench decode` streams them. Medians over the tokens
//! after two warm-up tokens; set them against `peaks`' read stream on as many threads.
//!
//! ```text
//! cargo run --release -p andrea-cpu --example decode_products -- [THREADS=2] [TOKENS=40] [MODEL]
//! ```
//!
//! `MODEL` `tiny` takes configs/tiny.toml's sizes instead (4 layers of 128, 7.5 MB of
//! weights: they stay in the last-level cache, so the figures are its read rate).
//!
//! The inputs are small constants, not a model's activations: the products' speed does
//! not depend on the values.

use std::time::Instant;

use andrea_core::{LinalgOps, MemoryOps, View};
use andrea_cpu::CpuBackend;

fn main() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let arg = |i: usize, default: usize| -> Result<usize, String> {
        match std::env::args().nth(i) {
            None => Ok(default),
            Some(v) => v.parse().ok().filter(|&n| n > 0).ok_or(format!(
                "argument {i}: expected a positive integer, got {v:?}"
            )),
        }
    };
    let (threads, tokens) = (arg(1, 2)?, arg(2, 40)?);
    // (d_model, MLP width, vocabulary, layers)
    let dims = match std::env::args().nth(3).as_deref() {
        None | Some("andrea-120m") => (768, 3072, 8449, 12),
        Some("tiny") => (128, 512, 8449, 4),
        Some(other) => return Err(format!("argument 3: andrea-120m or tiny, not {other:?}").into()),
    };
    rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build_global()?;
    rayon::scope(|_| run(tokens, dims))
}

fn run(
    tokens: usize,
    (c, f, v, layers): (usize, usize, usize, usize),
) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let be = CpuBackend::new();
    let fill = |len: usize, s: u32| -> Vec<f32> {
        (0..len)
            .map(|i| ((i as u32).wrapping_mul(2_654_435_761).wrapping_add(s) >> 8) as f32 / 8e9)
            .collect()
    };
    let alloc = |len: usize, s: u32| -> Result<_, Box<dyn std::error::Error + Send + Sync>> {
        let b = be.alloc(len)?;
        be.upload(&fill(len, s), View::whole(&b))?;
        Ok(b)
    };
    let mut w = Vec::new();
    for l in 0..layers as u32 {
        w.push((
            alloc(c * 3 * c, l * 10 + 1)?,
            alloc(c * c, l * 10 + 2)?,
            alloc(c * f, l * 10 + 3)?,
            alloc(f * c, l * 10 + 4)?,
        ));
    }
    let wte = alloc(v * c, 99)?;
    let (x, qkv, h, pre, act, logits) = (
        alloc(c, 5)?,
        alloc(3 * c, 6)?,
        alloc(c, 7)?,
        alloc(f, 8)?,
        alloc(f, 9)?,
        alloc(v, 10)?,
    );
    let bias = alloc(f, 11)?;
    let names = ["qkv", "proj", "fc+gelu", "fc_proj", "lm_head"];
    let bytes = [c * 3 * c, c * c, c * f, f * c, v * c].map(|n| n * 4);
    let mut times = vec![Vec::new(); 5];
    let mut token_times = Vec::new();
    for t in 0..tokens + 2 {
        let mut acc = [0.0f64; 5];
        let t_tok = Instant::now();
        for (wq, wp, wf, wfp) in &w {
            let xm = View::new(&x, 0, [1, c]).mat();
            let t0 = Instant::now();
            be.matmul(
                xm,
                View::new(wq, 0, [c, 3 * c]).mat(),
                Some(View::new(&bias, 0, [3 * c])),
                View::new(&qkv, 0, [1, 3 * c]).mat(),
            )?;
            let t1 = Instant::now();
            be.matmul(
                View::new(&qkv, 0, [1, c]).mat(),
                View::new(wp, 0, [c, c]).mat(),
                Some(View::new(&bias, 0, [c])),
                View::new(&h, 0, [1, c]).mat(),
            )?;
            let t2 = Instant::now();
            be.linear_gelu(
                View::new(&h, 0, [1, c]).mat(),
                View::new(wf, 0, [c, f]).mat(),
                View::new(&bias, 0, [f]),
                View::new(&pre, 0, [1, f]),
                View::new(&act, 0, [1, f]),
            )?;
            let t3 = Instant::now();
            be.matmul(
                View::new(&act, 0, [1, f]).mat(),
                View::new(wfp, 0, [f, c]).mat(),
                Some(View::new(&bias, 0, [c])),
                View::new(&x, 0, [1, c]).mat(),
            )?;
            let t4 = Instant::now();
            acc[0] += (t1 - t0).as_secs_f64();
            acc[1] += (t2 - t1).as_secs_f64();
            acc[2] += (t3 - t2).as_secs_f64();
            acc[3] += (t4 - t3).as_secs_f64();
        }
        let t0 = Instant::now();
        be.matmul(
            View::new(&x, 0, [1, c]).mat(),
            View::new(&wte, 0, [v, c]).mat().t(),
            None,
            View::new(&logits, 0, [1, v]).mat(),
        )?;
        acc[4] += t0.elapsed().as_secs_f64();
        let tt = t_tok.elapsed().as_secs_f64();
        if t >= 2 {
            for i in 0..5 {
                times[i].push(acc[i]);
            }
            token_times.push(tt);
        }
    }
    let med = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    for i in 0..5 {
        let reps = if i == 4 { 1 } else { layers };
        let m = med(&mut times[i]);
        println!(
            "{:8} {:8.3} ms  {:6.1} GB/s",
            names[i],
            m * 1e3,
            (reps * bytes[i]) as f64 / m / 1e9
        );
    }
    let total: usize = bytes[..4].iter().sum::<usize>() * layers + bytes[4];
    let m = med(&mut token_times);
    println!(
        "token    {:8.3} ms  {:6.1} GB/s  {:.1} tok/s",
        m * 1e3,
        total as f64 / m / 1e9,
        1.0 / m
    );
    Ok(())
}
