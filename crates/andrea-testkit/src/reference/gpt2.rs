//! The whole GPT-2 forward pass and loss in float64, built from the reference ops of
//! this module only: the executable specification of `andrea-model` (its `block.rs` is
//! the fast, allocation-free version of [`block`], its `gpt.rs` that of [`logits`]).
//! Nothing is fused and every intermediate is a fresh vector, so each line is one step
//! of the diagram:
//!
//! ```text
//! x = wte[tokens] + wpe[0..T]
//! for each block:  x = x + Attention(ln_1(x));  x = x + MLP(ln_2(x))
//! logits = ln_f(x) · wteᵀ
//! ```
//!
//! The model's gradients are checked against central differences of [`loss`]
//! (`crates/andrea-model/tests/gradcheck.rs`).

use std::collections::HashMap;

use andrea_core::{ModelConfig, IGNORE_INDEX};

use super::{attention_forward, embedding, gelu, layernorm, matmul, softmax_cross_entropy, Layout};

/// Parameters by transformers name (`transformer.h.0.attn.c_attn.weight`, ...),
/// row-major in transformers' shapes (weights `[in, out]`).
pub type Params = HashMap<String, Vec<f64>>;

/// `y[n, o] = x[n, i] · w[i, o] + bias[o]`.
fn linear(x: &[f64], w: &[f64], bias: &[f64], n: usize, i: usize, o: usize) -> Vec<f64> {
    let mut y = vec![0.0; n * o];
    let (lx, lw, ly) = (
        Layout::dense(1, n, i),
        Layout::dense(1, i, o),
        Layout::dense(1, n, o),
    );
    matmul(x, lx, w, lw, Some(bias), &mut y, ly, false);
    y
}

/// LayerNorm over the last dimension of `x: [n, c]`.
fn norm(x: &[f64], gamma: &[f64], beta: &[f64], n: usize, c: usize, eps: f64) -> Vec<f64> {
    let (mut out, mut mean, mut rstd) = (vec![0.0; n * c], vec![0.0; n], vec![0.0; n]);
    layernorm(&mut out, &mut mean, &mut rstd, x, gamma, beta, n, c, eps);
    out
}

fn add(a: &[f64], b: &[f64]) -> Vec<f64> {
    a.iter().zip(b).map(|(a, b)| a + b).collect()
}

fn get<'p>(p: &'p Params, name: &str) -> &'p [f64] {
    p.get(name)
        .unwrap_or_else(|| panic!("gpt2 reference: no parameter {name}"))
        .as_slice()
}

/// Block `l` over the residual stream `x: [b·t, C]`: returns the next residual stream.
pub fn block(cfg: &ModelConfig, p: &Params, l: usize, x: &[f64], b: usize, t: usize) -> Vec<f64> {
    let (c, m, h) = (cfg.d_model, cfg.mlp_dim(), cfg.n_head);
    let eps = cfg.layer_norm_eps as f64;
    let n = b * t;
    let w = |s: &str| get(p, &format!("transformer.h.{l}.{s}"));

    // x = x + Attention(ln_1(x))
    let ln_1 = norm(x, w("ln_1.weight"), w("ln_1.bias"), n, c, eps);
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
    let (q, k, v) = (third(0), third(1), third(2));
    let mut atty = vec![0.0; n * c];
    attention_forward(&mut atty, &q, &k, &v, (b, t, t, h, c / h), 0);
    let attn = linear(
        &atty,
        w("attn.c_proj.weight"),
        w("attn.c_proj.bias"),
        n,
        c,
        c,
    );
    let x = add(x, &attn);

    // x = x + MLP(ln_2(x)), MLP(y) = GELU(y · W1 + b1) · W2 + b2
    let ln_2 = norm(&x, w("ln_2.weight"), w("ln_2.bias"), n, c, eps);
    let fc_pre = linear(&ln_2, w("mlp.c_fc.weight"), w("mlp.c_fc.bias"), n, c, m);
    let mut fc = vec![0.0; n * m];
    gelu(&mut fc, &fc_pre);
    let mlp = linear(&fc, w("mlp.c_proj.weight"), w("mlp.c_proj.bias"), n, m, c);
    add(&x, &mlp)
}

/// Logits `[B·T, V]` of `tokens` (`[B, T]`, positions from 0).
pub fn logits(cfg: &ModelConfig, p: &Params, tokens: &[u32], b: usize, t: usize) -> Vec<f64> {
    let (c, v) = (cfg.d_model, cfg.vocab_size);
    let eps = cfg.layer_norm_eps as f64;
    let n = b * t;
    let (wte, wpe) = (
        get(p, "transformer.wte.weight"),
        get(p, "transformer.wpe.weight"),
    );
    let mut x = vec![0.0; n * c];
    embedding(&mut x, tokens, wte, wpe, b, t, c, 0);
    for l in 0..cfg.n_layer {
        x = block(cfg, p, l, &x, b, t);
    }
    let (g, beta) = (
        get(p, "transformer.ln_f.weight"),
        get(p, "transformer.ln_f.bias"),
    );
    let ln_f = norm(&x, g, beta, n, c, eps);
    // Tied output layer: logits = ln_f · wteᵀ.
    let mut logits = vec![0.0; n * v];
    let (lx, lw, ly) = (
        Layout::dense(1, n, c),
        Layout::dense(1, v, c).t(),
        Layout::dense(1, n, v),
    );
    matmul(&ln_f, lx, wte, lw, None, &mut logits, ly, false);
    logits
}

/// Mean cross-entropy of the next-token `targets` (`[B, T]`) over those that are not
/// [`IGNORE_INDEX`].
pub fn loss(
    cfg: &ModelConfig,
    p: &Params,
    tokens: &[u32],
    targets: &[u32],
    b: usize,
    t: usize,
) -> f64 {
    let z = logits(cfg, p, tokens, b, t);
    let (n, v) = (b * t, cfg.vocab_size);
    let mut losses = vec![0.0; n];
    softmax_cross_entropy(&mut losses, None, &z, targets, n, v, v, 1.0);
    let counted = targets.iter().filter(|&&t| t != IGNORE_INDEX).count();
    losses.iter().sum::<f64>() / counted as f64
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::random::Rand;

    /// Parameters with every weight and bias zero and LayerNorm gains one.
    fn zeros(cfg: &ModelConfig) -> Params {
        let (c, m, v) = (cfg.d_model, cfg.mlp_dim(), cfg.vocab_size);
        let mut p = Params::new();
        p.insert("transformer.wte.weight".into(), vec![0.0; v * c]);
        p.insert(
            "transformer.wpe.weight".into(),
            vec![0.0; cfg.context_length * c],
        );
        for l in 0..cfg.n_layer {
            let sizes = [
                ("ln_1.weight", c),
                ("ln_1.bias", c),
                ("attn.c_attn.weight", c * 3 * c),
                ("attn.c_attn.bias", 3 * c),
                ("attn.c_proj.weight", c * c),
                ("attn.c_proj.bias", c),
                ("ln_2.weight", c),
                ("ln_2.bias", c),
                ("mlp.c_fc.weight", c * m),
                ("mlp.c_fc.bias", m),
                ("mlp.c_proj.weight", m * c),
                ("mlp.c_proj.bias", c),
            ];
            for (name, len) in sizes {
                let fill = if name.ends_with("ln_1.weight") || name.ends_with("ln_2.weight") {
                    1.0
                } else {
                    0.0
                };
                p.insert(format!("transformer.h.{l}.{name}"), vec![fill; len]);
            }
        }
        p.insert("transformer.ln_f.weight".into(), vec![1.0; c]);
        p.insert("transformer.ln_f.bias".into(), vec![0.0; c]);
        p
    }

    /// With zero weights every logit is 0, so the loss is exactly ln V; a block whose
    /// residual path is broken (or an attention that looks ahead) changes the logits of
    /// random weights when later tokens change.
    #[test]
    fn zero_weights_give_ln_v_and_logits_are_causal() {
        let cfg = ModelConfig::new(11, 8, 8, 2, 2);
        let tokens = [1, 4, 4, 0, 10, 3];
        let targets = [4, 4, 0, 10, 3, 7];
        let loss0 = loss(&cfg, &zeros(&cfg), &tokens, &targets, 1, 6);
        assert!((loss0 - 11f64.ln()).abs() < 1e-12, "{loss0}");

        let mut r = Rand::new(7);
        let mut p = zeros(&cfg);
        for (name, values) in p.iter_mut() {
            let centre = if name.contains("ln_") && name.ends_with("weight") {
                1.0
            } else {
                0.0
            };
            values.iter_mut().for_each(|x| *x = centre + r.unit() - 0.5);
        }
        let a = logits(&cfg, &p, &tokens, 1, 6);
        let mut changed = tokens;
        changed[5] = 2;
        let b = logits(&cfg, &p, &changed, 1, 6);
        let v = cfg.vocab_size;
        assert_eq!(
            a[..5 * v],
            b[..5 * v],
            "an earlier position saw a later token"
        );
        assert_ne!(a[5 * v..], b[5 * v..]);
        assert!((loss(&cfg, &p, &tokens, &targets, 1, 6) - loss0).abs() > 1e-3);
    }
}
