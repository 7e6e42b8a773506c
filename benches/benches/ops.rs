//! Every op of one ANDREA-120M training step at batch 4 x 256 tokens, per backend.
//!
//! Groups are ops at a shape; inside a group each backend (and each peer library) is one
//! function, so a CUDA column is one more `bench_backend` call. GEMMs report elements as
//! FLOPs (criterion prints them as `elem/s`: read Gelem/s as GFLOP/s); memory-bound ops
//! report bytes moved (reads + writes). `peak/*` measures this machine's FMA peak and
//! copy bandwidth in the same run, so ratios can be quoted.
//!
//! `cargo bench -p andrea-benches --bench ops` (all), or a filter such as
//! `cargo bench -p andrea-benches --bench ops -- gemm/`.
//!
//! With `--features cuda` (build against the link stub where there is no CUDA:
//! `cargo xtask cuda-stub`, `CUDA_LIBRARY_PATH=$PWD/target/cuda-stub`), the CUDA backend
//! adds columns: `cuda-tf32` (the training precision, every op), and `cuda-fp32` and
//! `cuda-bf16` for the GEMMs, and the group `attention_gpu` (B 16, T 1024, 12 heads of
//! 64) with `cuda-{tf32,bf16}-{mma,simt}`: the tensor-core attention kernels and the SIMT
//! ones, per precision; `cuda-tf32-wmma` and `cuda-bf16-wmma` time the GEMMs on the older
//! WMMA kernels next to the default ones (`ANDREA_CUDA_MATMUL`: mma.sync for TF32,
//! kernels/matmul_bf16.cu for BF16; gpu_check's GEMM rows time all three). Each iteration
//! ends with `synchronize`, so GPU times are of finished work. Without a device the
//! columns are skipped with a printed message; on a
//! GPU machine, `-- cuda-` runs only them (the bench binary in `cargo xtask gpu-bundle`).
//!
//! Attention on the CPU also has a group `attention_tiny` at the tiny model's shape (B 8,
//! T 256, 4 heads of 32).

use std::hint::black_box;
use std::time::Duration;

use andrea_core::config::step_gemms;
use andrea_core::{AdamWStep, Backend, Heads, Matrix, View};
use andrea_cpu::CpuBackend;
use criterion::{criterion_group, BenchmarkId, Criterion, Throughput};

const BT: usize = 1024; // batch 4 x 256 tokens
const B: usize = 4;
const T: usize = 256;
const C: usize = 768;
const H: usize = 12;
const V: usize = 8449;

/// Uniform in [-1, 1): enough for timing.
fn randn(n: usize, seed: u64) -> Vec<f32> {
    andrea_testkit::random::Rand::new(seed).vec(n, -1.0, 1.0)
}

/// The source and destination of a reference copy of `n` floats, both starting on a 4 KiB
/// boundary. Two `Vec`s land wherever the allocator puts them, and where the destination
/// sits 16 bytes past the source modulo 4 KiB the copy's loads alias its recent stores
/// (same low 12 address bits), which can make the copy many times slower and flatter
/// every op compared with it. A reference runs at its best.
struct CopyPair {
    src: Vec<f32>,
    dst: Vec<f32>,
    src_at: usize,
    dst_at: usize,
    n: usize,
}

impl CopyPair {
    fn new(n: usize, seed: u64) -> Self {
        const PAGE_FLOATS: usize = 1024;
        let page_start =
            |v: &Vec<f32>| (PAGE_FLOATS - (v.as_ptr() as usize % 4096) / 4) % PAGE_FLOATS;
        let src = randn(n + PAGE_FLOATS, seed);
        let dst = vec![0.0f32; n + PAGE_FLOATS];
        let (src_at, dst_at) = (page_start(&src), page_start(&dst));
        CopyPair {
            src,
            dst,
            src_at,
            dst_at,
            n,
        }
    }

    /// `dst = src` in chunks of 2^16 floats on rayon's threads.
    fn copy(&mut self) {
        use rayon::prelude::*;
        let src = &self.src[self.src_at..][..self.n];
        self.dst[self.dst_at..][..self.n]
            .par_chunks_mut(1 << 16)
            .zip(src.par_chunks(1 << 16))
            .for_each(|(d, s)| d.copy_from_slice(s));
    }
}

/// Footprints (bytes read + written per call) of memory-bound ops benched by the CPU
/// column whose own-size copy is still to be timed, and the ops whose copy was timed.
/// The copy runs right after its op ([`own_copy`]), seconds apart rather than minutes,
/// so a load that comes and goes on a shared machine disturbs op and copy alike, and
/// the copy sits in the same level of the cache hierarchy as the op's data.
static FOOTPRINTS: std::sync::Mutex<Footprints> = std::sync::Mutex::new(Footprints {
    pending: Vec::new(),
    copied: Vec::new(),
});

struct Footprints {
    /// (op name, bytes) whose copy is to be timed next.
    pending: Vec<(String, usize)>,
    /// Ops whose copy was timed (an op benched again by another CPU column gets none).
    copied: Vec<String>,
}

/// `Throughput::Bytes(bytes)` for op `name`, and its footprint noted for the own-size
/// copy that [`own_copy`] times next.
fn footprint(label: &str, name: &str, bytes: usize) -> Throughput {
    if label.starts_with("cpu-") {
        let mut f = FOOTPRINTS.lock().unwrap();
        if !f.copied.iter().any(|n| n == name) {
            f.pending.push((name.to_string(), bytes));
        }
    }
    Throughput::Bytes(bytes as u64)
}

/// A copy of `bytes / 2` bytes (so `bytes` of traffic) on the backend's threads for the
/// op whose [`footprint`] was just noted, in the same group under the op's name, column
/// `copy-<threads>t`: `memory_bound/copy-2t/<op>` next to `memory_bound/cpu-2t/<op>`.
fn own_copy(g: &mut criterion::BenchmarkGroup<'_, criterion::measurement::WallTime>, label: &str) {
    if !label.starts_with("cpu-") {
        return;
    }
    let pending = std::mem::take(&mut FOOTPRINTS.lock().unwrap().pending);
    let threads = rayon::current_num_threads();
    for (name, bytes) in pending {
        let n = bytes / 8;
        let mut pair = CopyPair::new(n, 40);
        g.throughput(Throughput::Bytes((8 * n) as u64));
        g.bench_function(BenchmarkId::new(format!("copy-{threads}t"), &name), |bch| {
            bch.iter(|| pair.copy())
        });
        FOOTPRINTS.lock().unwrap().copied.push(name);
    }
}

fn config(c: &mut Criterion) -> &mut Criterion {
    c
}

fn group_settings(g: &mut criterion::BenchmarkGroup<'_, criterion::measurement::WallTime>) {
    g.sample_size(10)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2));
}

fn upload<B: Backend>(be: &B, data: &[f32]) -> B::Buffer {
    let buf = be.alloc(data.len()).unwrap();
    be.upload(data, View::whole(&buf)).unwrap();
    buf
}

fn mat<M: andrea_core::DeviceMemory>(buf: &M, rows: usize, cols: usize, t: bool) -> Matrix<'_, M> {
    // A stored [rows, cols] (or [cols, rows] when transposed) row-major matrix.
    if t {
        View::new(buf, 0, [cols, rows]).mat().t()
    } else {
        View::new(buf, 0, [rows, cols]).mat()
    }
}

/// Benchmarks every op on `be`, labelled `label` inside each group.
pub fn bench_backend<B: Backend>(c: &mut Criterion, be: &B, label: &str) {
    bench_gemms(c, be, label);
    bench_rest(c, be, label);
    bench_remaining(c, be, label);
}

fn bench_gemms<B: Backend>(c: &mut Criterion, be: &B, label: &str) {
    let sync = |be: &B| be.synchronize().unwrap();
    let mut g = c.benchmark_group("gemm");
    group_settings(&mut g);
    for p in step_gemms(BT, C, 4 * C, V) {
        let (name, m, k, n, ta, tb) = (p.name, p.m, p.k, p.n, p.a_transposed, p.b_transposed);
        let a = upload(be, &randn(m * k, 1));
        let b = upload(be, &randn(k * n, 2));
        let out = be.alloc(m * n).unwrap();
        g.throughput(Throughput::Elements((2 * m * k * n) as u64));
        g.bench_function(
            BenchmarkId::new(label, format!("{name}_{m}x{k}x{n}")),
            |bch| {
                bch.iter(|| {
                    be.matmul(
                        mat(&a, m, k, ta),
                        mat(&b, k, n, tb),
                        None,
                        View::new(&out, 0, [m, n]).mat(),
                    )
                    .unwrap();
                    sync(be);
                })
            },
        );
    }
    // The MLP's dX product through the GELU, `d_fc = (dy·W_projᵀ) ⊙ GELU'(fc_pre)`: the
    // backend's fused op against the product then the separate gelu_backward pass (the
    // default composition, what the fused op replaces). FLOPs of the product.
    let (m, k, n) = (BT, C, 4 * C);
    let (dy, w, pre) = (
        upload(be, &randn(m * k, 7)),
        upload(be, &randn(n * k, 8)),
        upload(be, &randn(m * n, 9)),
    );
    let out = be.alloc(m * n).unwrap();
    let args = || {
        (
            View::new(&dy, 0, [m, k]).mat(),
            View::new(&w, 0, [n, k]).mat().t(),
            View::new(&pre, 0, [m, n]),
            View::new(&out, 0, [m, n]),
        )
    };
    g.throughput(Throughput::Elements((2 * m * k * n) as u64));
    for fused in [true, false] {
        let what = if fused { "fused" } else { "then_gelu_backward" };
        g.bench_function(
            BenchmarkId::new(label, format!("bwd_dx_fc_proj_gelu_{what}_{m}x{k}x{n}")),
            |bch| {
                bch.iter(|| {
                    let (a, b, p, o) = args();
                    if fused {
                        be.matmul_gelu_backward(a, b, p, o).unwrap();
                    } else {
                        andrea_core::fused::matmul_gelu_backward(be, a, b, p, o).unwrap();
                    }
                    sync(be);
                })
            },
        );
    }
    g.finish();
}

/// The step's other ops, also memory-bound (bytes: reads + writes, as each says):
/// softmax backward, the bias gradient, the embedding and its backward, the fused
/// residual + LayerNorm, the gradient norm and scaling.
fn bench_remaining<B: Backend>(c: &mut Criterion, be: &B, label: &str) {
    let sync = |be: &B| be.synchronize().unwrap();
    let mut g = c.benchmark_group("memory_bound");
    group_settings(&mut g);
    let mut run = |name: String, bytes: usize, op: &mut dyn FnMut()| {
        g.throughput(footprint(label, &name, bytes));
        g.bench_function(BenchmarkId::new(label, name), |bch| {
            bch.iter(|| {
                op();
                sync(be)
            })
        });
        own_copy(&mut g, label);
    };

    // Reads probs and dprobs, writes dx.
    let sm = B * H * T * T;
    let (p, dp) = (upload(be, &randn(sm, 21)), upload(be, &randn(sm, 22)));
    let dx = be.alloc(sm).unwrap();
    let shape = [B * H, T, T];
    run(
        format!("softmax_backward_{B}x{H}x{T}x{T}"),
        12 * sm,
        &mut || {
            be.softmax_backward(
                View::new(&p, 0, shape),
                View::new(&dp, 0, shape),
                View::new(&dx, 0, shape),
                0.125,
            )
            .unwrap()
        },
    );

    // Reads dout [BT, 4C] (the fc layer's bias, the widest).
    let dout = upload(be, &randn(BT * 4 * C, 23));
    let dbias = be.alloc(4 * C).unwrap();
    run(
        format!("bias_backward_{BT}x{}", 4 * C),
        4 * BT * 4 * C,
        &mut || {
            be.bias_backward(View::new(&dout, 0, [BT, 4 * C]), View::whole(&dbias))
                .unwrap()
        },
    );

    // Reads BT rows of wte and of wpe, writes BT rows.
    let ids = be.alloc_ids(BT).unwrap();
    be.upload_ids(
        &(0..BT as u32)
            .map(|i| i * 37 % V as u32)
            .collect::<Vec<_>>(),
        View::whole(&ids),
    )
    .unwrap();
    let (wte, wpe) = (upload(be, &randn(V * C, 24)), upload(be, &randn(T * C, 25)));
    let (emb, demb) = (be.alloc(BT * C).unwrap(), upload(be, &randn(BT * C, 26)));
    let (ev, idv) = (View::new(&emb, 0, [B, T, C]), View::whole(&ids));
    run(format!("embedding_{B}x{T}x{C}"), 12 * BT * C, &mut || {
        be.embedding(
            idv,
            View::new(&wte, 0, [V, C]),
            View::new(&wpe, 0, [T, C]),
            ev,
            0,
        )
        .unwrap()
    });
    // Reads dout; reads and writes BT rows of dwte and T rows of dwpe.
    let (dwte, dwpe) = (be.alloc(V * C).unwrap(), be.alloc(T * C).unwrap());
    run(
        format!("embedding_backward_{B}x{T}x{C}"),
        12 * BT * C + 8 * T * C,
        &mut || {
            be.embedding_backward(
                idv,
                View::new(&demb, 0, [B, T, C]),
                View::new(&dwte, 0, [V, C]),
                View::new(&dwpe, 0, [T, C]),
            )
            .unwrap()
        },
    );

    // Reads a and b, writes the residual and the normalised rows.
    let r = BT * C;
    let (a, bb) = (upload(be, &randn(r, 27)), upload(be, &randn(r, 28)));
    let (res, out) = (be.alloc(r).unwrap(), be.alloc(r).unwrap());
    let (gamma, beta) = (upload(be, &randn(C, 29)), upload(be, &randn(C, 30)));
    let (mean, rstd) = (be.alloc(BT).unwrap(), be.alloc(BT).unwrap());
    run(format!("residual_layernorm_{BT}x{C}"), 16 * r, &mut || {
        be.residual_layernorm(
            View::new(&a, 0, [BT, C]),
            View::new(&bb, 0, [BT, C]),
            View::new(&res, 0, [BT, C]),
            View::whole(&gamma),
            View::whole(&beta),
            View::new(&out, 0, [BT, C]),
            View::whole(&mean),
            View::whole(&rstd),
            1e-5,
        )
        .unwrap()
    });

    // The global gradient norm reads, scaling reads and writes, 7.3M values (as AdamW's).
    let np = 7 * 1024 * 1024;
    let grads = upload(be, &randn(np, 31));
    run(format!("sum_squares_{np}"), 4 * np, &mut || {
        black_box(be.sum_squares(View::whole(&grads)).unwrap());
    });
    run(format!("scale_{np}"), 8 * np, &mut || {
        be.scale(View::whole(&grads), 1.0).unwrap()
    });
    g.finish();
}

fn bench_rest<B: Backend>(c: &mut Criterion, be: &B, label: &str) {
    let sync = |be: &B| be.synchronize().unwrap();
    let mut g = c.benchmark_group("memory_bound");
    group_settings(&mut g);
    let n = BT * 4 * C;
    let x = upload(be, &randn(n, 3));
    let dy = upload(be, &randn(n, 4));
    let y = be.alloc(n).unwrap();
    let (xv, dyv, yv) = (View::whole(&x), View::whole(&dy), View::whole(&y));
    let name = format!("gelu_{BT}x{}", 4 * C);
    g.throughput(footprint(label, &name, 8 * n));
    g.bench_function(BenchmarkId::new(label, name), |bch| {
        bch.iter(|| {
            be.gelu(xv, yv).unwrap();
            sync(be)
        })
    });
    own_copy(&mut g, label);
    let name = format!("gelu_backward_{BT}x{}", 4 * C);
    g.throughput(footprint(label, &name, 12 * n));
    g.bench_function(BenchmarkId::new(label, name), |bch| {
        bch.iter(|| {
            be.gelu_backward(xv, dyv, yv).unwrap();
            sync(be)
        })
    });
    own_copy(&mut g, label);
    let r = BT * C;
    let (a, bb) = (upload(be, &randn(r, 5)), upload(be, &randn(r, 6)));
    let out = be.alloc(r).unwrap();
    let name = format!("residual_add_{BT}x{C}");
    g.throughput(footprint(label, &name, 12 * r));
    g.bench_function(BenchmarkId::new(label, name), |bch| {
        bch.iter(|| {
            be.add(View::whole(&a), View::whole(&bb), View::whole(&out))
                .unwrap();
            sync(be)
        })
    });
    own_copy(&mut g, label);
    let gamma = upload(be, &randn(C, 7));
    let beta = upload(be, &randn(C, 8));
    let (mean, rstd) = (be.alloc(BT).unwrap(), be.alloc(BT).unwrap());
    let xs = View::new(&a, 0, [BT, C]);
    let os = View::new(&out, 0, [BT, C]);
    // Reads x, γ, β; writes out, mean, rstd.
    let name = format!("layernorm_{BT}x{C}");
    g.throughput(footprint(label, &name, 8 * r + 8 * C + 8 * BT));
    g.bench_function(BenchmarkId::new(label, name), |bch| {
        bch.iter(|| {
            be.layernorm(
                xs,
                View::whole(&gamma),
                View::whole(&beta),
                os,
                View::whole(&mean),
                View::whole(&rstd),
                1e-5,
            )
            .unwrap();
            sync(be)
        })
    });
    own_copy(&mut g, label);
    be.layernorm(
        xs,
        View::whole(&gamma),
        View::whole(&beta),
        os,
        View::whole(&mean),
        View::whole(&rstd),
        1e-5,
    )
    .unwrap();
    let dx = be.alloc(r).unwrap();
    let (dg, db) = (be.alloc(C).unwrap(), be.alloc(C).unwrap());
    // Reads x, dout, mean, rstd, γ; reads and adds into dx (`+=`), dγ, dβ.
    let name = format!("layernorm_backward_{BT}x{C}");
    g.throughput(footprint(label, &name, 16 * r + 8 * BT + 20 * C));
    g.bench_function(BenchmarkId::new(label, name), |bch| {
        bch.iter(|| {
            be.layernorm_backward(
                xs,
                View::whole(&gamma),
                View::whole(&mean),
                View::whole(&rstd),
                View::new(&bb, 0, [BT, C]),
                View::new(&dx, 0, [BT, C]),
                View::whole(&dg),
                View::whole(&db),
            )
            .unwrap();
            sync(be)
        })
    });
    own_copy(&mut g, label);
    let sm = B * H * T * T;
    let s = upload(be, &randn(sm, 9));
    let p = be.alloc(sm).unwrap();
    // Reads the visible part of each row (row i of a head sees i + 1 scores), writes the
    // whole row (the masked part as zeros): 4·(Σ visible + T·T) bytes per head, 75% of
    // reading and writing every row (`8 · sm`, the count before this was honest).
    let visible = B * H * T * (T + 1) / 2;
    let name = format!("softmax_causal_{B}x{H}x{T}x{T}");
    g.throughput(footprint(label, &name, 4 * (visible + sm)));
    g.bench_function(BenchmarkId::new(label, name), |bch| {
        bch.iter(|| {
            be.softmax(
                View::new(&s, 0, [B * H, T, T]),
                View::new(&p, 0, [B * H, T, T]),
                0.125,
                Some(0),
            )
            .unwrap();
            sync(be)
        })
    });
    own_copy(&mut g, label);
    let logits = upload(be, &randn(BT * V, 10));
    let dlogits = be.alloc(BT * V).unwrap();
    let targets = be.alloc_ids(BT).unwrap();
    be.upload_ids(
        &(0..BT as u32).map(|i| i * 7 % V as u32).collect::<Vec<_>>(),
        View::whole(&targets),
    )
    .unwrap();
    let losses = be.alloc(BT).unwrap();
    // Counted: each logit read once, each gradient element written once, and the targets
    // and losses (8 bytes a row). The kernel reads each row three times (max, sum, then
    // the gradient), but a row is 34 KB: the second and third reads come from L1/L2 and
    // are not counted.
    let name = format!("softmax_cross_entropy_{BT}x{V}");
    g.throughput(footprint(label, &name, 8 * BT * V + 8 * BT));
    g.bench_function(BenchmarkId::new(label, name), |bch| {
        bch.iter(|| {
            be.softmax_cross_entropy(
                View::new(&logits, 0, [BT, V]),
                View::whole(&targets),
                V,
                View::whole(&losses),
                Some(View::new(&dlogits, 0, [BT, V])),
                1.0 / BT as f32,
            )
            .unwrap();
            sync(be)
        })
    });
    own_copy(&mut g, label);
    // As the model calls it: the gradient over the logits, in place (the same bytes).
    let name = format!("softmax_cross_entropy_in_place_{BT}x{V}");
    g.throughput(footprint(label, &name, 8 * BT * V + 8 * BT));
    g.bench_function(BenchmarkId::new(label, name), |bch| {
        bch.iter(|| {
            let lv = View::new(&logits, 0, [BT, V]);
            be.softmax_cross_entropy(
                lv,
                View::whole(&targets),
                V,
                View::whole(&losses),
                Some(lv),
                1.0 / BT as f32,
            )
            .unwrap();
            sync(be)
        })
    });
    own_copy(&mut g, label);
    // AdamW over a 7M-parameter slice (one block's weights): reads p, g, m, v, writes p, m, v.
    let np = 7 * 1024 * 1024;
    let (pp, gg) = (upload(be, &randn(np, 11)), upload(be, &randn(np, 12)));
    let (mm, vv) = (be.alloc(np).unwrap(), be.alloc(np).unwrap());
    let step = AdamWStep {
        lr: 1e-4,
        beta1: 0.9,
        beta2: 0.95,
        eps: 1e-8,
        weight_decay: 0.1,
        step: 1,
        grad_scale: 1.0,
    };
    let name = format!("adamw_{np}");
    g.throughput(footprint(label, &name, 28 * np));
    g.bench_function(BenchmarkId::new(label, name), |bch| {
        bch.iter(|| {
            be.adamw(
                View::whole(&pp),
                View::whole(&gg),
                View::whole(&mm),
                View::whole(&vv),
                &step,
            )
            .unwrap();
            sync(be)
        })
    });
    own_copy(&mut g, label);
    g.finish();

    bench_attention(c, be, label, "attention", [B, T, H, C / H]);
    black_box(());
}

/// Attention forward and backward at `[b, t, h, d]` in group `group`.
fn bench_attention<Bk: Backend>(
    c: &mut Criterion,
    be: &Bk,
    label: &str,
    group: &str,
    [b, t, h, d]: [usize; 4],
) {
    let sync = |be: &Bk| be.synchronize().unwrap();
    let cc = h * d;
    let mut g = c.benchmark_group(group);
    group_settings(&mut g);
    let qkv = upload(be, &randn(b * t * 3 * cc, 13));
    let att = be.alloc(b * t * cc).unwrap();
    let shape = andrea_core::AttentionShape {
        batch: b,
        heads: h,
        head_dim: d,
        q_len: t,
        k_len: t,
    };
    let ws = be.alloc(be.attention_workspace_len(shape).max(1)).unwrap();
    let scratch = be
        .alloc(be.attention_backward_scratch_len(shape).max(1))
        .unwrap();
    let dqkv = be.alloc(b * t * 3 * cc).unwrap();
    let datt = upload(be, &randn(b * t * cc, 14));
    let [q, k, v] = Heads::split_qkv(View::new(&qkv, 0, [b, t, 3 * cc]), h).unwrap();
    let [dq, dk, dv] = Heads::split_qkv(View::new(&dqkv, 0, [b, t, 3 * cc]), h).unwrap();
    let o = Heads::from_tensor(View::new(&att, 0, [b, t, cc]), h).unwrap();
    let dout = Heads::from_tensor(View::new(&datt, 0, [b, t, cc]), h).unwrap();
    // Causal attention FLOPs: QKᵀ and PV, full T×T (what the kernels compute).
    let flops = (4 * b * h * t * t * d) as u64;
    g.throughput(Throughput::Elements(flops));
    g.bench_function(
        BenchmarkId::new(label, format!("forward_{b}x{t}x{h}x{d}")),
        |bch| {
            bch.iter(|| {
                be.attention_forward(q, k, v, o, View::whole(&ws), 0)
                    .unwrap();
                sync(be)
            })
        },
    );
    be.attention_forward(q, k, v, o, View::whole(&ws), 0)
        .unwrap();
    g.throughput(Throughput::Elements(2 * flops + flops / 2));
    g.bench_function(
        BenchmarkId::new(label, format!("backward_{b}x{t}x{h}x{d}")),
        |bch| {
            bch.iter(|| {
                be.attention_backward(
                    q,
                    k,
                    v,
                    o,
                    dout,
                    dq,
                    dk,
                    dv,
                    View::whole(&ws),
                    View::whole(&scratch),
                )
                .unwrap();
                sync(be)
            })
        },
    );
    g.finish();
}

/// Peer GEMM: the `gemm` crate on the same shapes, all threads.
fn bench_gemm_crate(c: &mut Criterion) {
    let threads = rayon::current_num_threads();
    let mut g = c.benchmark_group("gemm");
    group_settings(&mut g);
    for p in step_gemms(BT, C, 4 * C, V) {
        let (name, m, k, n, ta, tb) = (p.name, p.m, p.k, p.n, p.a_transposed, p.b_transposed);
        let a = randn(m * k, 1);
        let b = randn(k * n, 2);
        let mut out = vec![0.0f32; m * n];
        // Row-major strides (row, col) of the stored operands; transposed = swapped.
        let (ars, acs) = if ta { (1, m as isize) } else { (k as isize, 1) };
        let (brs, bcs) = if tb { (1, k as isize) } else { (n as isize, 1) };
        g.throughput(Throughput::Elements((2 * m * k * n) as u64));
        g.bench_function(
            BenchmarkId::new(
                format!("gemm-crate-{threads}t"),
                format!("{name}_{m}x{k}x{n}"),
            ),
            |bch| {
                bch.iter(|| unsafe {
                    gemm::gemm(
                        m,
                        n,
                        k,
                        out.as_mut_ptr(),
                        1,
                        n as isize,
                        false,
                        a.as_ptr(),
                        acs,
                        ars,
                        b.as_ptr(),
                        bcs,
                        brs,
                        0.0f32,
                        1.0f32,
                        false,
                        false,
                        false,
                        gemm::Parallelism::Rayon(threads),
                    )
                })
            },
        );
    }
    g.finish();
}

/// This machine's peaks, measured in the same run: f32 FMA throughput on all threads
/// and copy bandwidth at the memory-bound ops' size.
fn bench_peak(c: &mut Criterion) {
    let mut g = c.benchmark_group("peak");
    group_settings(&mut g);
    let threads = rayon::current_num_threads();
    let iters = 1u64 << 22;
    // 12 independent 8-wide FMA chains per thread: 2 FLOPs x 8 lanes x 12 x iters.
    g.throughput(Throughput::Elements(threads as u64 * iters * 12 * 16));
    g.bench_function(format!("fma_f32_{threads}t"), |bch| {
        bch.iter(|| {
            use rayon::prelude::*;
            (0..threads)
                .into_par_iter()
                .map(|_| fma_chain(iters))
                .sum::<f32>()
        })
    });
    // The 512-bit peak, where the backend's kernels run AVX-512 (not under
    // `ANDREA_SIMD=avx2`, whose GEMMs are then 256-bit: bench-report takes the highest
    // `fma*` entry as the peak). A CPU with two 512-bit FMA pipes (Intel server cores)
    // reads twice the 256-bit figure; one that splits them (Zen 4) reads the same.
    #[cfg(target_arch = "x86_64")]
    if std::is_x86_feature_detected!("avx512f") && {
        use andrea_core::MemoryOps as _;
        CpuBackend::new().name().contains("avx512")
    } {
        g.throughput(Throughput::Elements(threads as u64 * iters * 16 * 32));
        g.bench_function(format!("fma512_f32_{threads}t"), |bch| {
            bch.iter(|| {
                use rayon::prelude::*;
                (0..threads)
                    .into_par_iter()
                    // SAFETY: the CPU has AVX-512 F (checked above).
                    .map(|_| unsafe { fma512_chain(iters) })
                    .sum::<f32>()
            })
        });
    }
    for n in [BT * C, BT * 4 * C] {
        let mut pair = CopyPair::new(n, 1);
        g.throughput(Throughput::Bytes((8 * n) as u64));
        g.bench_function(format!("copy_{threads}t_{}MB", (4 * n) >> 20), |bch| {
            bch.iter(|| pair.copy())
        });
    }
    // The same copy at the size of the logits (1024 x 8449, 35 MB each way), which no
    // cache holds: the peer of softmax + cross-entropy, which streams them from memory.
    // Named apart so `bench-report` keeps the cache-resident copies as its reference.
    let n = BT * V;
    let mut pair = CopyPair::new(n, 2);
    g.throughput(Throughput::Bytes((8 * n) as u64));
    g.bench_function(format!("dram_copy_{threads}t_{}MB", (4 * n) >> 20), |bch| {
        bch.iter(|| pair.copy())
    });
    g.finish();
}

#[cfg(target_arch = "x86_64")]
fn fma_chain(iters: u64) -> f32 {
    #[target_feature(enable = "avx2,fma")]
    unsafe fn run(iters: u64) -> f32 {
        use std::arch::x86_64::*;
        // SAFETY: only reached after checking the CPU has AVX2 and FMA.
        unsafe {
            let m = _mm256_set1_ps(0.999_999);
            let a0 = _mm256_set1_ps(1e-7);
            let mut acc = [_mm256_set1_ps(1.0); 12];
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
            _mm256_storeu_ps(out.as_mut_ptr(), s);
            out.iter().sum()
        }
    }
    assert!(
        std::is_x86_feature_detected!("fma"),
        "peak bench needs AVX2 + FMA"
    );
    unsafe { run(iters) }
}

/// The same 12 chains of 8 lanes in portable code, for the other architectures
/// (`f32::mul_add` is one fused multiply-add on aarch64).
#[cfg(not(target_arch = "x86_64"))]
fn fma_chain(iters: u64) -> f32 {
    let mut acc = [[1.0f32; 8]; 12];
    for _ in 0..iters {
        for a in acc.iter_mut() {
            for x in a.iter_mut() {
                *x = x.mul_add(0.999_999, 1e-7);
            }
        }
    }
    acc.iter().flatten().sum()
}

/// 16 independent 16-wide FMA chains: 2 FLOPs x 16 lanes x 16 x iters.
///
/// # Safety
/// The CPU has AVX-512 F.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn fma512_chain(iters: u64) -> f32 {
    use std::arch::x86_64::*;
    let m = _mm512_set1_ps(0.999_999);
    let a0 = _mm512_set1_ps(1e-7);
    let mut acc = [_mm512_set1_ps(1.0); 16];
    for _ in 0..iters {
        for a in acc.iter_mut() {
            *a = _mm512_fmadd_ps(*a, m, a0);
        }
    }
    _mm512_reduce_add_ps(
        acc.iter()
            .fold(_mm512_setzero_ps(), |s, &a| _mm512_add_ps(s, a)),
    )
}

fn benches(c: &mut Criterion) {
    let c = config(c);
    bench_peak(c);
    let cpu = CpuBackend::new();
    bench_backend(c, &cpu, &format!("cpu-{}t", cpu.threads()));
    // Attention at the tiny model's heads too (B 8 x T 256, 4 heads of 32).
    let label = format!("cpu-{}t", cpu.threads());
    bench_attention(c, &cpu, &label, "attention_tiny", [8, T, 4, 32]);
    bench_gemm_crate(c);
    #[cfg(feature = "cuda")]
    bench_cuda(c);
}

/// The CUDA columns, or one line saying why there are none.
#[cfg(feature = "cuda")]
fn bench_cuda(c: &mut Criterion) {
    use andrea_cuda::{AttentionKernels, CudaBackend, Precision};
    // The GPU bundle's run.sh sets ANDREA_REQUIRE_DEVICE: there a skip is a failure.
    let start = |p| {
        andrea_testkit::device::start_or_skip("the CUDA columns of the ops bench", || {
            CudaBackend::with_precision(p)
        })
    };
    let Some(tf32) = start(Precision::FAST) else {
        return;
    };
    bench_backend(c, &tf32, "cuda-tf32");
    drop(tf32);
    for (label, p) in [
        ("cuda-fp32", Precision::FP32),
        ("cuda-bf16", Precision::BF16),
    ] {
        if let Some(be) = start(p) {
            bench_gemms(c, &be, label);
        }
    }
    // Attention at the GPU shape of issue 12 (B 16, T 1024, 12 heads of 64): the
    // tensor-core kernels and the SIMT ones they replace, per precision.
    for (label, p) in [
        ("cuda-tf32", Precision::FAST),
        ("cuda-bf16", Precision::BF16),
    ] {
        if let Some(mut be) = start(p) {
            for (kernels, tag) in [
                (AttentionKernels::Mma, "mma"),
                (AttentionKernels::Simt, "simt"),
            ] {
                be.set_attention_kernels(kernels);
                let shape = [16, 1024, 12, 64];
                bench_attention(c, &be, &format!("{label}-{tag}"), "attention_gpu", shape);
            }
        }
    }
    // The WMMA kernels (kernels/matmul.cu) next to the default mma ones, same run.
    for (label, p) in [
        ("cuda-tf32-wmma", Precision::FAST),
        ("cuda-bf16-wmma", Precision::BF16),
    ] {
        if let Some(mut be) = start(p) {
            be.set_matmul_impl(andrea_cuda::MatmulImpl::Wmma);
            bench_gemms(c, &be, label);
        }
    }
}

criterion_group!(ops, benches);

// `criterion_main!`, on a worker of rayon's global pool (the CPU backends' pool): ops
// then start their parallel work in place, as they do in the `andrea` binary, which runs
// every command inside `CpuBackend::install`, instead of handing it over from the main
// thread (which costs each call a wake-up: benches/README.md, "Model").
fn main() {
    rayon::scope(|_| {
        ops();
        Criterion::default().configure_from_args().final_summary();
    });
}
