//! The suite can fail: a backend that delegates to the naive one but gets one thing
//! subtly wrong must be caught by the suite function of that op, with a message that
//! says what is wrong. Without a fault, the same wrapper passes.

use std::cell::Cell;

use andrea_core::prelude::*;
use andrea_core::{check, Error, Result};
use andrea_testkit::naive::{NaiveBackend, NaiveBuffer};
use andrea_testkit::suite::{self, Config};

#[derive(Debug, Clone, Copy, PartialEq)]
enum Fault {
    None,
    /// GELU with erf instead of the tanh form.
    ErfGelu,
    /// `matmul_gelu_backward` with the derivative of the erf form (burn's mismatched
    /// forward/backward pair).
    ErfGeluGrad,
    /// LayerNorm with the unbiased variance `Σ(x - mean)²/(C - 1)`.
    UnbiasedVariance,
    /// The causal mask lets each query see one key too many.
    CausalOffByOne,
    /// `matmul` overwrites `c` even when asked to accumulate.
    IgnoresAccumulate,
    /// `embedding_backward` overwrites the gradient rows instead of adding.
    EmbeddingOverwrites,
    /// The cross-entropy's logsumexp includes the padding columns.
    ReadsPadding,
    /// AdamW's weight decay as L2 regularisation (added to the gradient).
    CoupledWeightDecay,
    /// `sum_squares` varies from call to call in the last bits.
    Nondeterministic,
    /// `matmul` panics on bad input instead of returning an error.
    PanicsOnBadInput,
    /// `add` accepts an output that partially overlaps an input.
    AcceptsOverlap,
    /// `clip_scale` divides by the norm without `clip_grad_norm_`'s `+ 1e-6`.
    ClipWithoutEps,
    /// `adamw_scaled` applies a NaN scale instead of skipping the update.
    AppliesNanScale,
    /// `mlp_forward` without its GELU.
    MlpWithoutGelu,
    /// `decode_attention` attends without first writing the new keys and values into
    /// the cache (it reads what was there).
    DecodeSkipsAppend,
    /// `decode_blocks` adds the MLP's output to the block's input `x` instead of
    /// `residual_2` (the attention's contribution dropped from the residual stream).
    StackDropsAttention,
    /// `to_bf16` cuts the lower 16 bits instead of rounding to nearest even.
    TruncatesBf16,
}

struct Faulty {
    inner: NaiveBackend,
    fault: Fault,
    calls: Cell<u64>,
}

fn faulty(fault: Fault) -> Faulty {
    Faulty {
        inner: NaiveBackend::new(),
        fault,
        calls: Cell::new(0),
    }
}

impl Faulty {
    fn get(&self, t: Tensor<'_, Self>) -> Result<Vec<f32>> {
        let mut host = vec![0.0; t.numel()];
        self.inner.download(t, &mut host)?;
        Ok(host)
    }
}

/// erf by Abramowitz & Stegun 7.1.26 (error below 1.5e-7): plenty to tell the erf form
/// of GELU from the tanh form, which differ by up to ~5e-4.
fn erf(x: f64) -> f64 {
    let t = 1.0 / (1.0 + 0.327_591_1 * x.abs());
    let poly = t
        * (0.254_829_592
            + t * (-0.284_496_736
                + t * (1.421_413_741 + t * (-1.453_152_027 + t * 1.061_405_429))));
    (1.0 - poly * (-x * x).exp()).copysign(x)
}

/// Implements the ten op families for `Faulty` from the op list
/// ([`andrea_core::for_each_op!`]): the ops that can carry a fault are [`Planted`]'s, the
/// fused ops the faults must reach keep the traits' defaults (built from `Faulty`'s own
/// ops), and every other op is the naive backend's.
macro_rules! faulty_ops {
    ($($family:ident { $(fn $op:ident $args:tt -> $ret:ty;)* })*) => {
        $(impl $family for Faulty {
            faulty_ops!(@types $family);
            $(faulty_ops!(@op $op $args -> $ret);)*
        })*
    };
    (@types MemoryOps) => {
        type Buffer = NaiveBuffer<f32>;
        type IdBuffer = NaiveBuffer<u32>;
        type Bf16Buffer = NaiveBuffer<bf16>;
    };
    (@types $family:ident) => {};

    (@op name () -> $ret:ty) => {
        fn name(&self) -> String {
            format!("naive with fault {:?}", self.fault)
        }
    };
    // The ops that can carry a fault.
    (@op matmul $($s:tt)*) => { faulty_ops!(@planted matmul $($s)*); };
    (@op matmul_add $($s:tt)*) => { faulty_ops!(@planted matmul_add $($s)*); };
    (@op mlp_forward $($s:tt)*) => { faulty_ops!(@planted mlp_forward $($s)*); };
    (@op matmul_gelu_backward $($s:tt)*) => { faulty_ops!(@planted matmul_gelu_backward $($s)*); };
    (@op add $($s:tt)*) => { faulty_ops!(@planted add $($s)*); };
    (@op gelu $($s:tt)*) => { faulty_ops!(@planted gelu $($s)*); };
    (@op layernorm $($s:tt)*) => { faulty_ops!(@planted layernorm $($s)*); };
    (@op softmax $($s:tt)*) => { faulty_ops!(@planted softmax $($s)*); };
    (@op embedding_backward $($s:tt)*) => { faulty_ops!(@planted embedding_backward $($s)*); };
    (@op softmax_cross_entropy $($s:tt)*) => {
        faulty_ops!(@planted softmax_cross_entropy $($s)*);
    };
    (@op sum_squares $($s:tt)*) => { faulty_ops!(@planted sum_squares $($s)*); };
    (@op adamw $($s:tt)*) => { faulty_ops!(@planted adamw $($s)*); };
    (@op clip_scale $($s:tt)*) => { faulty_ops!(@planted clip_scale $($s)*); };
    (@op adamw_scaled $($s:tt)*) => { faulty_ops!(@planted adamw_scaled $($s)*); };
    (@op decode_attention $($s:tt)*) => { faulty_ops!(@planted decode_attention $($s)*); };
    (@op decode_blocks $($s:tt)*) => { faulty_ops!(@planted decode_blocks $($s)*); };
    (@op to_bf16 $($s:tt)*) => { faulty_ops!(@planted to_bf16 $($s)*); };
    // Fused ops: the traits' defaults, built from `Faulty`'s ops (a GELU or softmax fault
    // reaches them).
    (@op linear_gelu $($sig:tt)*) => {};
    (@op residual_layernorm $($sig:tt)*) => {};
    (@op attention_forward $($sig:tt)*) => {};
    (@op attention_backward $($sig:tt)*) => {};
    // The rest: the naive backend's.
    (@op $op:ident ($($arg:ident: $ty:ty),* $(,)?) -> $ret:ty) => {
        fn $op(&self, $($arg: $ty),*) -> $ret {
            self.inner.$op($($arg),*)
        }
    };
    (@planted $op:ident ($($arg:ident: $ty:ty),* $(,)?) -> $ret:ty) => {
        fn $op(&self, $($arg: $ty),*) -> $ret {
            Planted(self).$op($($arg),*)
        }
    };
}

andrea_core::for_each_op!(faulty_ops);

/// The ops that can carry a fault: each is the naive op (or the trait's default) unless
/// its fault is the one planted. Through `Deref`, `self.inner`, `self.fault` and the
/// other ops are `Faulty`'s.
struct Planted<'a>(&'a Faulty);

impl std::ops::Deref for Planted<'_> {
    type Target = Faulty;
    fn deref(&self) -> &Faulty {
        self.0
    }
}

impl Planted<'_> {
    fn matmul(
        &self,
        a: Mat<'_, Faulty>,
        b: Mat<'_, Faulty>,
        bias: Option<Tensor<'_, Faulty>>,
        c: Mat<'_, Faulty>,
    ) -> Result<()> {
        if self.fault == Fault::PanicsOnBadInput {
            if let Err(e) = check::matmul(&a, &b, bias.as_ref(), &c) {
                panic!("index out of bounds (really: {e})");
            }
        }
        self.inner.matmul(a, b, bias, c)
    }

    fn matmul_add(
        &self,
        a: Mat<'_, Faulty>,
        b: Mat<'_, Faulty>,
        bias: Option<Tensor<'_, Faulty>>,
        c: Mat<'_, Faulty>,
    ) -> Result<()> {
        match self.fault {
            Fault::IgnoresAccumulate => self.inner.matmul(a, b, bias, c),
            Fault::PanicsOnBadInput => match check::matmul(&a, &b, bias.as_ref(), &c) {
                Ok(_) => self.inner.matmul_add(a, b, bias, c),
                Err(e) => panic!("index out of bounds (really: {e})"),
            },
            _ => self.inner.matmul_add(a, b, bias, c),
        }
    }

    fn mlp_forward(
        &self,
        x: Tensor<'_, Faulty>,
        fc: LinearOf<'_, Faulty>,
        pre: Tensor<'_, Faulty>,
        act: Tensor<'_, Faulty>,
        proj: LinearOf<'_, Faulty>,
        out: Tensor<'_, Faulty>,
    ) -> Result<()> {
        if self.fault != Fault::MlpWithoutGelu {
            return andrea_core::fused::mlp_forward(self.0, x, fc, pre, act, proj, out);
        }
        check::mlp_forward(&x, &fc, &pre, &act, &proj, &out)?;
        self.inner
            .matmul(x.mat(), fc.weight, Some(fc.bias), act.mat())?;
        self.inner
            .matmul(act.mat(), proj.weight, Some(proj.bias), out.mat())
    }

    fn matmul_gelu_backward(
        &self,
        dy: Mat<'_, Faulty>,
        w: Mat<'_, Faulty>,
        pre: Tensor<'_, Faulty>,
        dpre: Tensor<'_, Faulty>,
    ) -> Result<()> {
        if self.fault != Fault::ErfGeluGrad {
            return self.inner.matmul_gelu_backward(dy, w, pre, dpre);
        }
        check::matmul_gelu_backward(&dy, &w, &pre, &dpre)?;
        self.inner.matmul(dy, w, None, dpre.mat())?;
        // d/dx x·Φ(x) = Φ(x) + x·φ(x).
        let g: Vec<f32> = (self.get(pre)?.iter().zip(self.get(dpre)?))
            .map(|(&x, g)| {
                let x = x as f64;
                let phi = (-0.5 * x * x).exp() / (2.0 * std::f64::consts::PI).sqrt();
                let cdf = 0.5 * (1.0 + erf(x / std::f64::consts::SQRT_2));
                (g as f64 * (cdf + x * phi)) as f32
            })
            .collect();
        self.inner.upload(&g, dpre)
    }

    fn add(
        &self,
        a: Tensor<'_, Faulty>,
        b: Tensor<'_, Faulty>,
        out: Tensor<'_, Faulty>,
    ) -> Result<()> {
        if self.fault == Fault::AcceptsOverlap
            && std::ptr::eq(out.buf, a.buf)
            && a.numel() == out.numel()
        {
            let (av, bv) = (self.get(a)?, self.get(b)?);
            let sum: Vec<f32> = av.iter().zip(&bv).map(|(x, y)| x + y).collect();
            return self.inner.upload(&sum, out);
        }
        self.inner.add(a, b, out)
    }

    fn gelu(&self, x: Tensor<'_, Faulty>, out: Tensor<'_, Faulty>) -> Result<()> {
        if self.fault != Fault::ErfGelu {
            return self.inner.gelu(x, out);
        }
        check::gelu(&x, &out)?;
        let y: Vec<f32> = self
            .get(x)?
            .iter()
            .map(|&v| {
                let v = v as f64;
                (0.5 * v * (1.0 + erf(v / std::f64::consts::SQRT_2))) as f32
            })
            .collect();
        self.inner.upload(&y, out)
    }

    fn layernorm(
        &self,
        x: Tensor<'_, Faulty>,
        gamma: Tensor<'_, Faulty>,
        beta: Tensor<'_, Faulty>,
        out: Tensor<'_, Faulty>,
        mean: Tensor<'_, Faulty>,
        rstd: Tensor<'_, Faulty>,
        eps: f32,
    ) -> Result<()> {
        if self.fault != Fault::UnbiasedVariance {
            return self.inner.layernorm(x, gamma, beta, out, mean, rstd, eps);
        }
        let d = check::layernorm(&x, &gamma, &beta, &out, &mean, &rstd, eps)?;
        let (n, c) = (d.rows, d.channels);
        let (xv, g, b) = (self.get(x)?, self.get(gamma)?, self.get(beta)?);
        let (mut o, mut ms, mut rs) = (vec![0.0; n * c], vec![0.0; n], vec![0.0; n]);
        for row in 0..n {
            let x = &xv[row * c..(row + 1) * c];
            let m = x.iter().sum::<f32>() / c as f32;
            let var = x.iter().map(|v| (v - m) * (v - m)).sum::<f32>() / (c as f32 - 1.0).max(1.0);
            let r = 1.0 / (var + eps).sqrt();
            for i in 0..c {
                o[row * c + i] = (x[i] - m) * r * g[i] + b[i];
            }
            (ms[row], rs[row]) = (m, r);
        }
        self.inner.upload(&o, out)?;
        self.inner.upload(&ms, mean)?;
        self.inner.upload(&rs, rstd)
    }

    fn softmax(
        &self,
        x: Tensor<'_, Faulty>,
        out: Tensor<'_, Faulty>,
        scale: f32,
        causal_offset: Option<usize>,
    ) -> Result<()> {
        let Some(o) = causal_offset.filter(|_| self.fault == Fault::CausalOffByOne) else {
            return self.inner.softmax(x, out, scale, causal_offset);
        };
        let d = check::softmax(&x, &out, scale, causal_offset)?;
        let xv = self.get(x)?;
        let mut p = vec![0.0f32; xv.len()];
        for r in 0..d.rows {
            // Query i sees keys j <= o + i + 1: one too many.
            let seen = (o + r % d.q_len + 2).min(d.k_len);
            let row = &xv[r * d.k_len..r * d.k_len + seen];
            let max = row.iter().fold(f32::NEG_INFINITY, |m, &v| m.max(scale * v));
            let sum: f32 = row.iter().map(|&v| (scale * v - max).exp()).sum();
            for j in 0..seen {
                p[r * d.k_len + j] = (scale * row[j] - max).exp() / sum;
            }
        }
        self.inner.upload(&p, out)
    }

    fn embedding_backward(
        &self,
        ids: Ids<'_, Faulty>,
        dout: Tensor<'_, Faulty>,
        dwte: Tensor<'_, Faulty>,
        dwpe: Tensor<'_, Faulty>,
    ) -> Result<()> {
        if self.fault == Fault::EmbeddingOverwrites {
            self.inner.fill(dwte, 0.0)?;
            self.inner.fill(dwpe, 0.0)?;
        }
        self.inner.embedding_backward(ids, dout, dwte, dwpe)
    }

    fn softmax_cross_entropy(
        &self,
        logits: Tensor<'_, Faulty>,
        targets: Ids<'_, Faulty>,
        vocab: usize,
        losses: Tensor<'_, Faulty>,
        dlogits: Option<Tensor<'_, Faulty>>,
        grad_scale: f32,
    ) -> Result<()> {
        let vocab = if self.fault == Fault::ReadsPadding {
            logits.shape.last()
        } else {
            vocab
        };
        self.inner
            .softmax_cross_entropy(logits, targets, vocab, losses, dlogits, grad_scale)
    }

    fn sum_squares(&self, x: Tensor<'_, Faulty>) -> Result<f64> {
        let s = self.inner.sum_squares(x)?;
        if self.fault == Fault::Nondeterministic {
            self.calls.set(self.calls.get() + 1);
            return Ok(s * (1.0 + 1e-15 * (self.calls.get() % 3) as f64));
        }
        Ok(s)
    }

    fn adamw(
        &self,
        param: Tensor<'_, Faulty>,
        grad: Tensor<'_, Faulty>,
        m: Tensor<'_, Faulty>,
        v: Tensor<'_, Faulty>,
        step: &AdamWStep,
    ) -> Result<()> {
        if self.fault != Fault::CoupledWeightDecay {
            return self.inner.adamw(param, grad, m, v, step);
        }
        check::adamw(&param, &grad, &m, &v, step)?;
        // g += wd·p/grad_scale, then AdamW without decoupled decay.
        let (p, g) = (self.get(param)?, self.get(grad)?);
        let coupled: Vec<f32> = g
            .iter()
            .zip(&p)
            .map(|(g, p)| g + step.weight_decay * p / step.grad_scale)
            .collect();
        let scratch = self.inner.alloc(g.len())?;
        let scratch_view = andrea_core::View::whole(&scratch);
        self.inner.upload(&coupled, scratch_view)?;
        self.inner
            .adamw(
                param,
                scratch_view,
                m,
                v,
                &AdamWStep {
                    weight_decay: 0.0,
                    ..*step
                },
            )
            .map_err(|e| Error::invalid("adamw", e.to_string()))
    }

    fn clip_scale(
        &self,
        grad: Tensor<'_, Faulty>,
        mean: f64,
        max_norm: Option<f32>,
        guard: Option<Tensor<'_, Faulty>>,
        out: Tensor<'_, Faulty>,
    ) -> Result<()> {
        self.inner.clip_scale(grad, mean, max_norm, guard, out)?;
        if self.fault != Fault::ClipWithoutEps {
            return Ok(());
        }
        let mut stats = self.get(out)?;
        let norm = self.inner.sum_squares(grad)?.sqrt() * mean;
        if let Some(max) = max_norm {
            if (max as f64) / norm < 1.0 && stats[0].is_finite() {
                stats[0] = (mean * max as f64 / norm) as f32;
            }
        }
        self.inner.upload(&stats, out)
    }

    fn adamw_scaled(
        &self,
        param: Tensor<'_, Faulty>,
        grad: Tensor<'_, Faulty>,
        m: Tensor<'_, Faulty>,
        v: Tensor<'_, Faulty>,
        step: &AdamWStep,
        scale: Tensor<'_, Faulty>,
    ) -> Result<()> {
        if self.fault != Fault::AppliesNanScale {
            return self.inner.adamw_scaled(param, grad, m, v, step, scale);
        }
        check::adamw_scaled(&param, &grad, &m, &v, step, &scale)?;
        let s = self.get(andrea_core::View::new(scale.buf, scale.offset, [1]))?[0];
        let step = AdamWStep {
            grad_scale: s,
            ..*step
        };
        self.inner.adamw(param, grad, m, v, &step)
    }

    fn decode_attention(
        &self,
        x: Tensor<'_, Faulty>,
        qkv_w: LinearOf<'_, Faulty>,
        qkv: Tensor<'_, Faulty>,
        keys: HeadsOf<'_, Faulty>,
        values: HeadsOf<'_, Faulty>,
        atty: Tensor<'_, Faulty>,
        workspace: Tensor<'_, Faulty>,
        proj: LinearOf<'_, Faulty>,
        out: Tensor<'_, Faulty>,
    ) -> Result<()> {
        if self.fault != Fault::DecodeSkipsAppend {
            return andrea_core::fused::decode_attention(
                self.0, x, qkv_w, qkv, keys, values, atty, workspace, proj, out,
            );
        }
        let (d, v) = check::decode_attention(
            &x,
            &qkv_w,
            &qkv,
            &keys,
            &values,
            &atty,
            &workspace,
            &proj,
            &out,
            |s| self.attention_workspace_len(s),
        )?;
        self.inner
            .matmul(v.x, qkv_w.weight, Some(qkv_w.bias), v.qkv)?;
        self.inner
            .attention_forward(v.q, keys, values, v.atty_heads, workspace, d.pos)?;
        self.inner
            .matmul(v.atty, proj.weight, Some(proj.bias), v.out)
    }

    fn decode_blocks(&self, blocks: &[DecodeBlockOf<'_, Faulty>], eps: f32) -> Result<()> {
        if self.fault != Fault::StackDropsAttention {
            return andrea_core::fused::decode_blocks(self.0, blocks, eps);
        }
        for b in blocks {
            check::decode_block(b, eps, |s| self.attention_workspace_len(s))?;
        }
        for b in blocks {
            self.decode_attention(
                b.ln_1,
                b.c_attn,
                b.qkv,
                b.keys,
                b.values,
                b.atty,
                b.workspace,
                b.attn_proj,
                b.proj,
            )?;
            let (n2, n3) = (&b.ln_2_out, &b.next_out);
            let (g2, b2, g3, b3) = (b.ln_2.gamma, b.ln_2.beta, b.next.gamma, b.next.beta);
            self.residual_layernorm(
                b.x,
                b.proj,
                b.residual_2,
                g2,
                b2,
                n2.out,
                n2.mean,
                n2.rstd,
                eps,
            )?;
            self.mlp_forward(n2.out, b.c_fc, b.fc_pre, b.fc, b.mlp_proj, b.proj)?;
            self.residual_layernorm(
                b.x,
                b.proj,
                b.residual_3,
                g3,
                b3,
                n3.out,
                n3.mean,
                n3.rstd,
                eps,
            )?;
        }
        Ok(())
    }

    fn to_bf16(&self, src: Tensor<'_, Faulty>, dst: Bf16Tensor<'_, Faulty>) -> Result<()> {
        if self.fault != Fault::TruncatesBf16 {
            return self.inner.to_bf16(src, dst);
        }
        check::convert("to_bf16", &src, &dst)?;
        // The values cut to their upper 16 bits are BF16 values: rounding keeps them.
        let cut: Vec<f32> = self
            .get(src)?
            .into_iter()
            .map(|x| f32::from_bits(x.to_bits() & 0xffff_0000))
            .collect();
        let tmp = self.inner.alloc(cut.len())?;
        self.inner.upload(&cut, View::whole(&tmp))?;
        self.inner.to_bf16(View::whole(&tmp), dst)
    }
}

type SuiteFn =
    fn(&Faulty, &Config) -> std::result::Result<(), proptest::test_runner::TestCaseError>;

/// Each fault, the suite function that must catch it, and a word its message must hold.
const CASES: &[(Fault, &str, SuiteFn, &str)] = &[
    (
        Fault::ClipWithoutEps,
        "clip_scale",
        suite::clip_scale,
        "clip_scale",
    ),
    (
        Fault::AppliesNanScale,
        "adamw_scaled",
        suite::adamw_scaled,
        "adamw_scaled",
    ),
    (Fault::ErfGelu, "gelu", suite::gelu, "gelu"),
    (
        Fault::ErfGelu,
        "linear_gelu",
        suite::linear_gelu,
        "linear_gelu: out",
    ),
    (
        Fault::MlpWithoutGelu,
        "mlp_forward",
        suite::mlp_forward,
        "mlp_forward: out",
    ),
    (
        Fault::DecodeSkipsAppend,
        "decode_attention",
        suite::decode_attention,
        "decode_attention: out",
    ),
    (
        Fault::StackDropsAttention,
        "decode_blocks",
        suite::decode_blocks,
        "decode_blocks: residual_3",
    ),
    (
        Fault::ErfGeluGrad,
        "matmul_gelu_backward",
        suite::matmul_gelu_backward,
        "matmul_gelu_backward: dpre",
    ),
    (
        Fault::UnbiasedVariance,
        "layernorm",
        suite::layernorm,
        "layernorm: out",
    ),
    (Fault::CausalOffByOne, "softmax", suite::softmax, "softmax"),
    (
        Fault::CausalOffByOne,
        "attention_forward",
        suite::attention_forward,
        "attention_forward: out",
    ),
    (
        Fault::IgnoresAccumulate,
        "matmul",
        suite::matmul,
        "matmul: c",
    ),
    (
        Fault::EmbeddingOverwrites,
        "embedding_backward",
        suite::embedding_backward,
        "embedding_backward: dw",
    ),
    (
        Fault::ReadsPadding,
        "softmax_cross_entropy",
        suite::softmax_cross_entropy,
        "losses",
    ),
    (Fault::CoupledWeightDecay, "adamw", suite::adamw, "adamw: "),
    (
        Fault::Nondeterministic,
        "determinism",
        suite::determinism,
        "sum_squares",
    ),
    (
        Fault::PanicsOnBadInput,
        "bad_input_linalg",
        suite::bad_input_linalg,
        "panicked",
    ),
    (
        Fault::TruncatesBf16,
        "bf16_conversion",
        suite::bf16_conversion,
        "to_bf16",
    ),
    (
        Fault::AcceptsOverlap,
        "bad_input_elementwise",
        suite::bad_input_elementwise,
        "add: out overlaps a",
    ),
];

#[test]
fn every_fault_is_caught_by_its_suite_function() {
    let cfg = Config::with_cases(64);
    let mut missed = Vec::new();
    for &(fault, name, run, needle) in CASES {
        match run(&faulty(fault), &cfg) {
            Ok(()) => missed.push(format!("{fault:?}: suite::{name} passed")),
            Err(e) => {
                let msg = e.to_string();
                eprintln!("{fault:?} caught by suite::{name}:\n  {msg}\n");
                if !msg.contains(needle) {
                    missed.push(format!(
                        "{fault:?}: suite::{name} failed without naming `{needle}`: {msg}"
                    ));
                }
            }
        }
    }
    assert!(
        missed.is_empty(),
        "faults the suite missed:\n{}",
        missed.join("\n")
    );
}

#[test]
fn the_wrapper_without_a_fault_passes_the_same_functions() {
    let cfg = Config::with_cases(16);
    for &(_, name, run, _) in CASES {
        if let Err(e) = run(&faulty(Fault::None), &cfg) {
            panic!("suite::{name} failed on the fault-free wrapper: {e}");
        }
    }
}

/// `Compare` runs the fault-free naive backend and a faulty one in lockstep through a
/// few ops of an MLP (matmul, GELU, residual add, LayerNorm, accumulating matmul): the
/// first divergence it records names the op with the planted fault, not the ops after
/// it whose inputs already differ. Without a fault, nothing diverges.
#[test]
fn compare_names_the_op_with_the_planted_fault() {
    use andrea_testkit::compare::Compare;
    use andrea_testkit::Tol;

    fn mat<M: DeviceMemory>(b: &M, rows: usize) -> View<'_, M> {
        View::new(b, 0, [rows, 8])
    }

    fn mlp<B: Backend>(be: &B) -> Result<()> {
        let (n, c) = (6, 8);
        let buf = |vals: Vec<f32>| -> Result<B::Buffer> {
            let b = be.alloc(vals.len())?;
            be.upload(&vals, View::whole(&b))?;
            Ok(b)
        };
        let wave = |len: usize, f: f32| (0..len).map(|i| (i as f32 * f).sin()).collect();
        let (x, w) = (buf(wave(n * c, 0.7))?, buf(wave(c * c, 1.3))?);
        let (h, g, dw) = (
            buf(vec![0.0; n * c])?,
            buf(vec![0.0; n * c])?,
            buf(wave(c * c, 0.1))?,
        );
        let (ln_g, ln_b) = (buf(vec![1.0; c])?, buf(vec![0.0; c])?);
        let (out, mean, rstd) = (
            buf(vec![0.0; n * c])?,
            buf(vec![0.0; n])?,
            buf(vec![0.0; n])?,
        );
        be.matmul(mat(&x, n).mat(), mat(&w, c).mat(), None, mat(&h, n).mat())?;
        be.gelu(mat(&h, n), mat(&g, n))?;
        be.add(mat(&g, n), mat(&x, n), mat(&g, n))?;
        be.layernorm(
            mat(&g, n),
            View::whole(&ln_g),
            View::whole(&ln_b),
            mat(&out, n),
            View::whole(&mean),
            View::whole(&rstd),
            1e-5,
        )?;
        be.matmul_add(
            mat(&x, n).mat().t(),
            mat(&out, n).mat(),
            None,
            mat(&dw, c).mat(),
        )
    }

    let tol = Tol::new(1e-6, 1e-5);
    for (fault, op, output) in [
        (Fault::ErfGelu, "gelu", "out"),
        (Fault::UnbiasedVariance, "layernorm", "out"),
        (Fault::IgnoresAccumulate, "matmul_add", "c"),
    ] {
        let be = Compare::new(NaiveBackend::new(), faulty(fault), tol);
        mlp(&be).unwrap();
        let d = be
            .first_divergence()
            .unwrap_or_else(|| panic!("{fault:?}: Compare saw no divergence"));
        eprintln!("{fault:?}: {d}");
        assert_eq!((d.op, d.output), (op, output), "{fault:?}: {d}");
        assert!(d.message.contains("worst at index"), "{d}");
    }
    let be = Compare::new(NaiveBackend::new(), faulty(Fault::None), tol);
    mlp(&be).unwrap();
    assert_eq!(be.agreement(), Ok(()));
}
