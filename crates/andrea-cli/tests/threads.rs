//! One result for any thread count. The CPU backend cuts work by sizes alone, so a few
//! training steps with `--threads 1` to `8` give byte-identical weights and optimizer
//! moments, and a run resumed with another `--threads` is the run that would have been.
//!
//! Each case runs the kernels of the process's SIMD level; `.ci/run` runs the tests again
//! under `ANDREA_SIMD=avx2` and `baseline`, so the `gemm` crate (the products' kernel at
//! the baseline and AVX-512 levels) is covered on every machine. Its depth of `k` per call
//! and its small-product path depend on the shape of the block it is given, and blocks
//! are cut by the thread count: on 2-4 threads its blocks of `C` took another order of
//! the sums than on 1 or 7, until `sgemm_strided` fixed the depth by `k`. The products alone
//! are checked on shapes that reach those paths and on ANDREA-120M's shapes; training
//! on the tests' micro model (with `B·T` of 600, a depth the crate cut differently by
//! block), on `configs/tiny.toml`'s shapes, on a mid-size model and on one block of
//! ANDREA-120M (d_model 768, 12 heads, a 1024-token window). The CPU computes in FP32
//! only (`--precision` is the GPU's), so there is no BF16 case here.

mod common;

use andrea::core::prelude::*;
use andrea::core::View;
use andrea::cpu::CpuBackend;
use common::*;
use std::path::Path;

/// `C = A·B` (`B` given transposed, `[n, k]`, with `bt`) on `threads` threads: C's bits.
fn product(threads: usize, (m, k, n): (usize, usize, usize), bt: bool) -> Vec<u32> {
    let be = CpuBackend::with_threads(threads).unwrap();
    let up = |len: usize, seed: u64| {
        let data = andrea_testkit::random::Rand::new(seed).vec(len, -1.0, 1.0);
        let buf = be.alloc(len).unwrap();
        be.upload(&data, View::whole(&buf)).unwrap();
        buf
    };
    let (a, w, c) = (up(m * k, 1), up(k * n, 2), be.alloc(m * n).unwrap());
    let w = if bt {
        View::new(&w, 0, [n, k]).mat().t()
    } else {
        View::new(&w, 0, [k, n]).mat()
    };
    be.matmul(
        View::new(&a, 0, [m, k]).mat(),
        w,
        None,
        View::new(&c, 0, [m, n]).mat(),
    )
    .unwrap();
    let mut host = vec![0.0; m * n];
    be.download(View::whole(&c), &mut host).unwrap();
    host.iter().map(|x| x.to_bits()).collect()
}

#[test]
fn products_give_the_same_bits_on_1_to_8_threads() {
    let mut shapes = vec![
        // Cut by rows on 2-4 threads into blocks of at most 64 x 64, which the gemm
        // crate sliced 512 deep, the whole 300 deep.
        ((128, 600, 64), false),
        ((200, 1000, 60), true),
        // Blocks of 16 x 16: the crate's horizontal dot products.
        ((16, 64, 64), true),
        // A last block of one row.
        ((33, 100, 300), false),
        // ANDREA-120M's step: QKV, MLP up and down, the attention projection's dx, the
        // dW of the MLP (k = B·T = 1024) and the tied output layer (vocabulary 8449).
        ((1024, 768, 2304), false),
        ((1024, 768, 3072), false),
        ((1024, 3072, 768), false),
        ((1024, 768, 768), true),
        ((768, 1024, 3072), false),
        ((1024, 768, 8449), true),
    ];
    let mut r = andrea_testkit::random::Rand::new(9);
    for _ in 0..60 {
        let mut pick = |hi: f32| (r.vec(1, 1.0, hi)[0] as usize).max(1);
        let shape = (pick(300.0), pick(1300.0), pick(300.0));
        shapes.push((shape, pick(3.0) > 1));
    }
    let name = CpuBackend::new().name();
    for (shape, bt) in shapes {
        let one = product(1, shape, bt);
        for threads in 2..=8 {
            assert!(
                product(threads, shape, bt) == one,
                "{name}: {shape:?} (B transposed: {bt}) on {threads} threads differs from 1 thread"
            );
        }
    }
}

/// Trains `config` with each thread count and requires the
/// bytes of `model.safetensors` and `optimizer.safetensors` of one thread.
fn same_bits_for_every_thread_count(dir: &Path, name: &str, config: &str, extra: &[&str]) {
    std::fs::write(dir.join(format!("{name}.toml")), config).unwrap();
    let cfg = format!("{name}.toml");
    {
        let mut first: Option<(Vec<u8>, Vec<u8>)> = None;
        for threads in 1..=8 {
            let out = format!("{name}-{threads}");
            let t = threads.to_string();
            let args = [
                &["--threads", &t, "train", "--config", &cfg, "--data", "data"][..],
                &["--out", &out, "--eval-every", "0", "--sample-every", "0"],
                extra,
            ]
            .concat();
            let run = std::process::Command::new(binary())
                .current_dir(dir)
                .args(&args)
                .output()
                .unwrap();
            assert!(
                run.status.success(),
                "{name}, {threads} threads: {}",
                String::from_utf8_lossy(&run.stderr)
            );
            let ckpt = dir.join(&out).join("latest");
            let got = (
                bytes(ckpt.join("model.safetensors")),
                bytes(ckpt.join("optimizer.safetensors")),
            );
            std::fs::remove_dir_all(dir.join(&out)).unwrap();
            let Some(one) = &first else {
                first = Some(got);
                continue;
            };
            assert!(
                one.0 == got.0 && one.1 == got.1,
                "{name}: the weights or moments of {threads} threads differ from 1 thread's"
            );
        }
    }
}

fn model(d_model: usize, n_layer: usize, n_head: usize, context: usize) -> String {
    format!(
        "[model]\nname = \"t\"\nvocab_size = 8449\ncontext_length = {context}\n\
         d_model = {d_model}\nn_layer = {n_layer}\nn_head = {n_head}\n\n\
         [optimizer]\nlr = 3e-3\nweight_decay = 0.1\ngrad_clip = 1.0\n"
    )
}

#[test]
fn training_gives_the_same_bits_on_1_to_8_threads() {
    let tmp = prepared("50");
    let dir = tmp.path();
    // Two steps: a product that sums in another order differs in the last bit of the
    // weights after the first step already, and the second runs AdamW on them.
    let steps = ["--steps", "2"];
    // B·T = 600: products of depth 600, cut into blocks of at most 64 x 64 on some
    // thread counts.
    let odd = [
        &steps[..],
        &["--batch-size", "5", "--seq-len", "120", "--grad-accum", "2"],
    ]
    .concat();
    same_bits_for_every_thread_count(dir, "micro", &model(32, 2, 4, 128), &odd);
    let tiny = [&steps[..], &["--batch-size", "4", "--seq-len", "128"]].concat();
    same_bits_for_every_thread_count(dir, "tiny", &model(128, 4, 4, 256), &tiny);
    let mid = [&steps[..], &["--batch-size", "2", "--seq-len", "256"]].concat();
    same_bits_for_every_thread_count(dir, "mid", &model(384, 2, 6, 512), &mid);
}

/// One block of ANDREA-120M (d_model 768, 12 heads, MLP 3072, context 1024) on a full
/// 1024-token window: every op of a step at the 120M model's shapes but the output
/// layer's vocabulary (the tests' tokenizer has about 300 ids; the products test above
/// has the 8449-wide output layer).
#[test]
fn one_block_of_andrea_120m_gives_the_same_bits_on_1_to_8_threads() {
    let tmp = prepared("50");
    let dir = tmp.path();
    let args = ["--steps", "1", "--batch-size", "1", "--seq-len", "1024"];
    same_bits_for_every_thread_count(dir, "a120m-block", &model(768, 1, 12, 1024), &args);
}
