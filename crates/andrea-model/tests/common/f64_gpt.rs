//! The whole GPT-2 forward pass and loss in float64, built from `andrea_testkit`'s
//! reference ops only: the independent implementation that the model's gradients are
//! checked against (by central differences of this loss).

use std::collections::HashMap;

use andrea_core::{ModelConfig, IGNORE_INDEX};
use andrea_testkit::reference::{self as r, Layout};

/// Parameters by transformers name, row-major in transformers' shapes.
pub type Params = HashMap<String, Vec<f64>>;

/// `y[n, o] = x[n, i] · w[i, o] + bias[o]`.
fn linear(x: &[f64], w: &[f64], bias: &[f64], n: usize, i: usize, o: usize) -> Vec<f64> {
    let mut y = vec![0.0; n * o];
    r::matmul(
        x,
        Layout::dense(1, n, i),
        w,
        Layout::dense(1, i, o),
        Some(bias),
        &mut y,
        Layout::dense(1, n, o),
        false,
    );
    y
}

fn layernorm(x: &[f64], g: &[f64], b: &[f64], n: usize, c: usize, eps: f64) -> Vec<f64> {
    let (mut out, mut mean, mut rstd) = (vec![0.0; n * c], vec![0.0; n], vec![0.0; n]);
    r::layernorm(&mut out, &mut mean, &mut rstd, x, g, b, n, c, eps);
    out
}

/// Logits `[B·T, V]` of `tokens` (`[B, T]`).
pub fn logits(cfg: &ModelConfig, p: &Params, tokens: &[u32], b: usize, t: usize) -> Vec<f64> {
    let (c, m, h, v) = (cfg.d_model, cfg.mlp_dim(), cfg.n_head, cfg.vocab_size);
    let eps = cfg.layer_norm_eps as f64;
    let n = b * t;
    let get = |name: &str| {
        p.get(name)
            .unwrap_or_else(|| panic!("no {name}"))
            .as_slice()
    };
    let mut x = vec![0.0; n * c];
    let (wte, wpe) = (get("transformer.wte.weight"), get("transformer.wpe.weight"));
    r::embedding(&mut x, tokens, wte, wpe, b, t, c, 0);
    for l in 0..cfg.n_layer {
        let w = |s: &str| get(&format!("transformer.h.{l}.{s}"));
        let ln_1 = layernorm(&x, w("ln_1.weight"), w("ln_1.bias"), n, c, eps);
        let qkv = linear(
            &ln_1,
            w("attn.c_attn.weight"),
            w("attn.c_attn.bias"),
            n,
            c,
            3 * c,
        );
        let third = |k: usize| -> Vec<f64> {
            (0..n)
                .flat_map(|i| qkv[i * 3 * c + k * c..i * 3 * c + (k + 1) * c].to_vec())
                .collect()
        };
        let (q, k, vv) = (third(0), third(1), third(2));
        let mut att = vec![0.0; n * c];
        r::attention_forward(&mut att, &q, &k, &vv, (b, t, t, h, c / h), 0);
        let proj = linear(
            &att,
            w("attn.c_proj.weight"),
            w("attn.c_proj.bias"),
            n,
            c,
            c,
        );
        let r2: Vec<f64> = x.iter().zip(&proj).map(|(a, b)| a + b).collect();
        let ln_2 = layernorm(&r2, w("ln_2.weight"), w("ln_2.bias"), n, c, eps);
        let pre = linear(&ln_2, w("mlp.c_fc.weight"), w("mlp.c_fc.bias"), n, c, m);
        let mut fc = vec![0.0; n * m];
        r::gelu(&mut fc, &pre);
        let out = linear(&fc, w("mlp.c_proj.weight"), w("mlp.c_proj.bias"), n, m, c);
        x = r2.iter().zip(&out).map(|(a, b)| a + b).collect();
    }
    let ln_f = layernorm(
        &x,
        get("transformer.ln_f.weight"),
        get("transformer.ln_f.bias"),
        n,
        c,
        eps,
    );
    // Tied output layer: logits = ln_f · wteᵀ.
    let mut logits = vec![0.0; n * v];
    r::matmul(
        &ln_f,
        Layout::dense(1, n, c),
        wte,
        Layout::dense(1, v, c).t(),
        None,
        &mut logits,
        Layout::dense(1, n, v),
        false,
    );
    logits
}

/// Mean cross-entropy over the targets that are not `IGNORE_INDEX`.
pub fn loss(
    cfg: &ModelConfig,
    p: &Params,
    tokens: &[u32],
    targets: &[u32],
    b: usize,
    t: usize,
) -> f64 {
    let z = logits(cfg, p, tokens, b, t);
    let n = b * t;
    let mut losses = vec![0.0; n];
    let v = cfg.vocab_size;
    r::softmax_cross_entropy(&mut losses, None, &z, targets, n, v, v, 1.0);
    let counted = targets.iter().filter(|&&t| t != IGNORE_INDEX).count();
    losses.iter().sum::<f64>() / counted as f64
}
