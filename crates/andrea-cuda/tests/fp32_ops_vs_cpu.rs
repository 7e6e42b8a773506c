//! CPU vs CUDA for the ops whose CUDA kernels are FP32 in every precision mode
//! (LayerNorm, softmax, cross-entropy, embedding, attention, AdamW, the sum of squares),
//! run in the default fast mode. Each tolerance is twice the conformance suite's
//! tolerance for that op (each backend may be off from the float64 reference by one
//! suite tolerance). Attention and its backward use the fused SIMT kernels (forced: the
//! fast mode would pick the tensor-core ones, tested in `cpu_vs_cuda.rs`) at shapes past
//! one key tile, with odd head sizes.

andrea_testkit::tests_need_feature!("cuda", "a device or the emulator: see .ci/run");

#[cfg(feature = "cuda")]
mod common;

/// The tests, which need the `cuda` feature.
#[cfg(feature = "cuda")]
mod tests {
    use crate::common;

    use andrea_core::{AdamWStep, Backend, View};
    use andrea_cuda::Precision;
    use andrea_testkit::{tol, Tol};
    use common::{attention_pass, buf, compare, cpu, cuda, data, ids, read};

    fn twice(t: Tol) -> Tol {
        Tol::new(2.0 * t.abs, 2.0 * t.rel)
    }

    fn close(name: &str, got: &[f32], want: &[f32], t: Tol) {
        let t = twice(t);
        compare(name, got, want, |i| t.bound(want[i] as f64)).unwrap();
    }

    fn layernorm_pass<B: Backend>(
        be: &B,
        x: &[f32],
        g: &[f32],
        b: &[f32],
        d: &[f32],
        n: usize,
        c: usize,
    ) -> Vec<Vec<f32>> {
        let (xb, gb, bb, db) = (buf(be, x), buf(be, g), buf(be, b), buf(be, d));
        let (out, stats) = (buf(be, &vec![0.0; n * c]), buf(be, &vec![0.0; 2 * n]));
        let (dx, dp) = (
            buf(be, &data(9, n * c, -1.0, 1.0)),
            buf(be, &data(10, 2 * c, -1.0, 1.0)),
        );
        let (mean, rstd) = (View::new(&stats, 0, [n]), View::new(&stats, n, [n]));
        be.layernorm(
            View::new(&xb, 0, [n, c]),
            View::whole(&gb),
            View::whole(&bb),
            View::new(&out, 0, [n, c]),
            mean,
            rstd,
            1e-5,
        )
        .expect("layernorm");
        be.layernorm_backward(
            View::new(&xb, 0, [n, c]),
            View::whole(&gb),
            mean,
            rstd,
            View::new(&db, 0, [n, c]),
            View::new(&dx, 0, [n, c]),
            View::new(&dp, 0, [c]),
            View::new(&dp, c, [c]),
        )
        .expect("layernorm_backward");
        vec![
            read(be, &out),
            read(be, &stats),
            read(be, &dx),
            read(be, &dp),
        ]
    }

    #[test]
    fn layernorm_vs_cpu() {
        let Some(gpu) = cuda("layernorm_vs_cpu", Precision::FAST) else {
            return;
        };
        for (n, c) in [(1usize, 1usize), (7, 21), (64, 768), (300, 770)] {
            let x = data(1, n * c, -2.0, 2.0);
            let (g, b, d) = (
                data(2, c, -1.0, 1.0),
                data(3, c, -1.0, 1.0),
                data(4, n * c, -1.0, 1.0),
            );
            let want = layernorm_pass(&cpu(), &x, &g, &b, &d, n, c);
            let got = layernorm_pass(&gpu, &x, &g, &b, &d, n, c);
            close("layernorm out", &got[0], &want[0], tol::layernorm_out(c));
            close(
                "layernorm mean/rstd",
                &got[1],
                &want[1],
                tol::layernorm_stats(c),
            );
            close("layernorm dx", &got[2], &want[2], tol::layernorm_dx(c));
            close(
                "layernorm dgamma/dbeta",
                &got[3],
                &want[3],
                tol::layernorm_dparams(n),
            );
        }
    }

    fn softmax_pass<B: Backend>(
        be: &B,
        x: &[f32],
        dp: &[f32],
        dims: [usize; 3],
        causal: Option<usize>,
    ) -> Vec<Vec<f32>> {
        let (xb, db) = (buf(be, x), buf(be, dp));
        be.softmax(
            View::new(&xb, 0, dims),
            View::new(&xb, 0, dims),
            0.3,
            causal,
        )
        .expect("softmax");
        be.softmax_backward(
            View::new(&xb, 0, dims),
            View::new(&db, 0, dims),
            View::new(&db, 0, dims),
            0.3,
        )
        .expect("softmax_backward");
        vec![read(be, &xb), read(be, &db)]
    }

    #[test]
    fn softmax_vs_cpu() {
        let Some(gpu) = cuda("softmax_vs_cpu", Precision::FAST) else {
            return;
        };
        for (dims, causal) in [
            ([1usize, 1usize, 1usize], None),
            ([2, 5, 37], Some(3)),
            ([3, 64, 1024], Some(960)),
            ([1, 9, 301], None),
        ] {
            let n: usize = dims.iter().product();
            let (x, dp) = (data(5, n, -8.0, 8.0), data(6, n, -1.0, 1.0));
            let want = softmax_pass(&cpu(), &x, &dp, dims, causal);
            let got = softmax_pass(&gpu, &x, &dp, dims, causal);
            close("softmax", &got[0], &want[0], tol::softmax(dims[2]));
            close(
                "softmax_backward",
                &got[1],
                &want[1],
                tol::softmax_backward(dims[2]),
            );
        }
    }

    fn loss_pass<B: Backend>(
        be: &B,
        logits: &[f32],
        targets: &[u32],
        vocab: usize,
        vp: usize,
    ) -> Vec<Vec<f32>> {
        let n = targets.len();
        let (z, t, l) = (buf(be, logits), ids(be, targets), buf(be, &vec![0.0; n]));
        let zv = View::new(&z, 0, [n, vp]);
        be.softmax_cross_entropy(zv, View::whole(&t), vocab, View::whole(&l), Some(zv), 0.5)
            .expect("softmax_cross_entropy");
        vec![read(be, &l), read(be, &z)]
    }

    #[test]
    fn cross_entropy_vs_cpu() {
        let Some(gpu) = cuda("cross_entropy_vs_cpu", Precision::FAST) else {
            return;
        };
        for (n, vocab, vp) in [(1usize, 1usize, 1usize), (5, 37, 40), (64, 8449, 8512)] {
            let logits = data(7, n * vp, -8.0, 8.0);
            let targets: Vec<u32> = (0..n as u32)
                .map(|i| {
                    if i % 7 == 3 {
                        u32::MAX
                    } else {
                        (i * 131) % vocab as u32
                    }
                })
                .collect();
            let want = loss_pass(&cpu(), &logits, &targets, vocab, vp);
            let got = loss_pass(&gpu, &logits, &targets, vocab, vp);
            close(
                "cross-entropy loss",
                &got[0],
                &want[0],
                tol::cross_entropy_loss(vocab),
            );
            close(
                "cross-entropy grad",
                &got[1],
                &want[1],
                tol::cross_entropy_grad(vocab),
            );
        }
    }

    fn embedding_pass<B: Backend>(
        be: &B,
        tokens: &[u32],
        wte: &[f32],
        wpe: &[f32],
        dout: &[f32],
        b: usize,
        t: usize,
        c: usize,
    ) -> Vec<Vec<f32>> {
        let (i, e, p, d) = (ids(be, tokens), buf(be, wte), buf(be, wpe), buf(be, dout));
        let out = buf(be, &vec![0.0; b * t * c]);
        let vocab = wte.len() / c;
        be.embedding(
            View::whole(&i),
            View::new(&e, 0, [vocab, c]),
            View::new(&p, 0, [t, c]),
            View::new(&out, 0, [b, t, c]),
            0,
        )
        .expect("embedding");
        be.embedding_backward(
            View::whole(&i),
            View::new(&d, 0, [b, t, c]),
            View::new(&e, 0, [vocab, c]),
            View::new(&p, 0, [t, c]),
        )
        .expect("embedding_backward");
        vec![read(be, &out), read(be, &e), read(be, &p)]
    }

    #[test]
    fn embedding_vs_cpu() {
        let Some(gpu) = cuda("embedding_vs_cpu", Precision::FAST) else {
            return;
        };
        for (b, t, c, vocab) in [
            (1usize, 1usize, 1usize, 1usize),
            (3, 17, 21, 5),
            (4, 256, 768, 8449),
        ] {
            let tokens: Vec<u32> = (0..(b * t) as u32)
                .map(|i| (i * i + 7) % vocab as u32)
                .collect();
            let (wte, wpe) = (data(1, vocab * c, -1.0, 1.0), data(2, t * c, -1.0, 1.0));
            let dout = data(3, b * t * c, -1.0, 1.0);
            let want = embedding_pass(&cpu(), &tokens, &wte, &wpe, &dout, b, t, c);
            let got = embedding_pass(&gpu, &tokens, &wte, &wpe, &dout, b, t, c);
            close("embedding", &got[0], &want[0], tol::one_rounding());
            close(
                "embedding dwte",
                &got[1],
                &want[1],
                tol::embedding_backward(b * t),
            );
            close(
                "embedding dwpe",
                &got[2],
                &want[2],
                tol::embedding_backward(b),
            );
        }
    }

    #[test]
    fn attention_vs_cpu() {
        let Some(mut gpu) = cuda("attention_vs_cpu", Precision::FAST) else {
            return;
        };
        gpu.set_attention_kernels(andrea_cuda::AttentionKernels::Simt);
        for (b, t, h, d) in [
            (1usize, 1usize, 1usize, 1usize),
            (2, 37, 3, 21),
            (2, 130, 2, 64),
            (1, 70, 1, 128),
            (1, 33, 2, 100),
        ] {
            let qkv = data(11, b * t * 3 * h * d, -1.0, 1.0);
            let dout = data(12, b * t * h * d, -1.0, 1.0);
            let want = attention_pass(&cpu(), &qkv, &dout, b, t, h, d);
            let got = attention_pass(&gpu, &qkv, &dout, b, t, h, d);
            close("attention out", &got[0], &want[0], tol::attention_out(t, d));
            close(
                "attention dqkv",
                &got[1],
                &want[1],
                tol::attention_grad(t, d),
            );
        }
    }

    fn adamw_pass<B: Backend>(be: &B, n: usize, offset: usize) -> (Vec<Vec<f32>>, f64) {
        let (p, g) = (
            buf(be, &data(1, n + offset, -1.0, 1.0)),
            buf(be, &data(2, n + offset, -1.0, 1.0)),
        );
        let (m, v) = (
            buf(be, &data(3, n + offset, -0.1, 0.1)),
            buf(be, &vec![0.01; n + offset]),
        );
        let step = AdamWStep {
            lr: 1e-3,
            beta1: 0.9,
            beta2: 0.95,
            eps: 1e-8,
            weight_decay: 0.1,
            step: 7,
            grad_scale: 0.5,
        };
        let s = |b| View::new(b, offset, [n]);
        let norm = be.sum_squares(s(&g)).expect("sum_squares");
        be.adamw(s(&p), s(&g), s(&m), s(&v), &step).expect("adamw");
        (vec![read(be, &p), read(be, &m), read(be, &v)], norm)
    }

    #[test]
    fn adamw_and_norm_vs_cpu() {
        let Some(gpu) = cuda("adamw_and_norm_vs_cpu", Precision::FAST) else {
            return;
        };
        for (n, offset) in [(1usize, 0usize), (1001, 3), (5_000_000, 0)] {
            let (want, want_norm) = adamw_pass(&cpu(), n, offset);
            let (got, got_norm) = adamw_pass(&gpu, n, offset);
            close("adamw param", &got[0], &want[0], tol::adamw_param(1e-3));
            close("adamw m", &got[1], &want[1], tol::adamw_m());
            close("adamw v", &got[2], &want[2], tol::adamw_v());
            let t = twice(tol::sum_squares());
            assert!(
                (got_norm - want_norm).abs() <= t.bound(want_norm),
                "sum_squares: gpu {got_norm}, cpu {want_norm}"
            );
        }
    }

    /// `device_region`, which NCCL's all-reduce is handed: a view's address is its buffer's
    /// plus 4 bytes per element of offset, on the backend's one stream; a view past the
    /// buffer is an error, and the CPU backend (host memory) has no device region.
    #[test]
    fn device_region_is_the_views_address_on_the_backends_stream() {
        use andrea_core::MemoryOps;
        let Some(gpu) = cuda(
            "device_region_is_the_views_address_on_the_backends_stream",
            Precision::FAST,
        ) else {
            return;
        };
        let b = buf(&gpu, &data(1, 100, -1.0, 1.0));
        let whole = gpu.device_region(View::whole(&b)).unwrap().unwrap();
        let part = gpu.device_region(View::new(&b, 36, [50])).unwrap().unwrap();
        assert_eq!(whole.len, 100);
        assert_eq!((part.ptr, part.len), (whole.ptr + 4 * 36, 50));
        assert_eq!(part.stream, whole.stream);
        assert!(gpu.device_region(View::new(&b, 60, [50])).is_err());
        let host = cpu();
        let hb = buf(&host, &[1.0, 2.0]);
        assert_eq!(host.device_region(View::whole(&hb)).unwrap(), None);
    }
}
