//! Where each parameter lives in the one contiguous parameter buffer (and, at the same
//! offsets, in the gradient buffer and the two AdamW moment buffers).
//!
//! Names and shapes are those of transformers' `GPT2LMHeadModel` (weights `[in, out]`, as
//! its `Conv1D` stores them). Inside the buffer:
//!
//! * every tensor with weight decay (the 2-D ones: `wte`, `wpe` and the four matmul
//!   weights of each block) comes first, then every tensor without (biases and LayerNorm
//!   parameters), so an optimizer step is two AdamW calls over two ranges;
//! * each tensor starts at a multiple of [`ALIGN`] floats (vectorised loads); the gaps
//!   are zeros with zero gradient and stay zero;
//! * `transformer.wte.weight` is stored with [`andrea_core::ModelConfig::padded_vocab_size`]
//!   rows; the rows past the real vocabulary are zero and never seen outside: the named
//!   view is the first `vocab_size` rows.

use std::collections::HashMap;

use andrea_core::{DeviceMemory, ModelConfig, Shape, View};

/// Alignment of every tensor in the parameter buffer, in floats (256 bytes).
pub const ALIGN: usize = 64;

/// A region of a buffer: where a tensor starts and its shape.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Slot {
    pub offset: usize,
    pub shape: Shape,
}

impl Slot {
    pub fn on<'a, M: DeviceMemory>(&self, buf: &'a M) -> View<'a, M> {
        View::new(buf, self.offset, self.shape)
    }
}

/// How a parameter is initialised (GPT-2).
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Init {
    Normal(f32),
    Zeros,
    Ones,
}

/// One named parameter tensor.
#[derive(Debug, Clone)]
pub struct ParamInfo {
    name: String,
    shape: Vec<usize>,
    decay: bool,
    pub(crate) slot: Slot,
    pub(crate) init: Init,
}

impl ParamInfo {
    /// The transformers name, such as `transformer.h.0.attn.c_attn.weight`.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The transformers shape, such as `[768, 2304]`.
    pub fn shape(&self) -> &[usize] {
        &self.shape
    }

    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }

    /// Whether AdamW decays it (2-D tensors only).
    pub fn decay(&self) -> bool {
        self.decay
    }
}

/// A LayerNorm's parameters, `[C]` each: `y = gamma·x̂ + beta`, named as every op and
/// reference names them (transformers names them `ln_*.weight` and `ln_*.bias`).
pub(crate) struct Norm<'a, M> {
    pub gamma: View<'a, M>,
    pub beta: View<'a, M>,
}

/// A linear layer's parameters: `weight: [in, out]` (as transformers' `Conv1D` stores
/// it) and `bias: [out]`, so `y = x·weight + bias`.
pub(crate) struct Linear<'a, M> {
    pub weight: View<'a, M>,
    pub bias: View<'a, M>,
}

/// The parameters of one block, as views into one buffer (parameters or gradients),
/// named as transformers names them (`attn_proj` is `attn.c_proj`, `mlp_proj` is
/// `mlp.c_proj`).
pub(crate) struct LayerParams<'a, M> {
    pub ln_1: Norm<'a, M>,
    /// `[C, 3C]`: the fused query, key and value projection.
    pub c_attn: Linear<'a, M>,
    /// `[C, C]`
    pub attn_proj: Linear<'a, M>,
    pub ln_2: Norm<'a, M>,
    /// `[C, M]`
    pub c_fc: Linear<'a, M>,
    /// `[M, C]`
    pub mlp_proj: Linear<'a, M>,
}

const LAYER_TENSORS: usize = 12;

/// The suffixes of one block's tensors, in transformers' order, with whether each is
/// decayed.
const LAYER_NAMES: [&str; LAYER_TENSORS] = [
    "ln_1.weight",
    "ln_1.bias",
    "attn.c_attn.weight",
    "attn.c_attn.bias",
    "attn.c_proj.weight",
    "attn.c_proj.bias",
    "ln_2.weight",
    "ln_2.bias",
    "mlp.c_fc.weight",
    "mlp.c_fc.bias",
    "mlp.c_proj.weight",
    "mlp.c_proj.bias",
];

/// The parameter layout of a model config.
#[derive(Debug, Clone)]
pub(crate) struct ParamLayout {
    params: Vec<ParamInfo>,
    index: HashMap<String, usize>,
    /// `transformer.wte.weight` with its padding rows: `[Vp, C]`.
    pub wte_padded: Slot,
    pub wpe: Slot,
    layers: Vec<[Slot; LAYER_TENSORS]>,
    pub ln_f_w: Slot,
    pub ln_f_b: Slot,
    /// `[0, decay_len)` holds the decayed tensors, `[decay_len, len)` the others.
    pub decay_len: usize,
    pub len: usize,
}

impl ParamLayout {
    pub fn new(cfg: &ModelConfig) -> Self {
        let (c, m, l) = (cfg.d_model, cfg.mlp_dim(), cfg.n_layer);
        let std = cfg.init_std;
        // GPT-2 scales the two residual projections by 1/sqrt(2·n_layer): each block adds
        // two outputs to the residual stream.
        let proj_std = std / (2.0 * l as f32).sqrt();
        let mut specs: Vec<(String, Vec<usize>, Init)> = vec![
            (
                "transformer.wte.weight".into(),
                vec![cfg.vocab_size, c],
                Init::Normal(std),
            ),
            (
                "transformer.wpe.weight".into(),
                vec![cfg.context_length, c],
                Init::Normal(std),
            ),
        ];
        for i in 0..l {
            let shapes: [(Vec<usize>, Init); LAYER_TENSORS] = [
                (vec![c], Init::Ones),
                (vec![c], Init::Zeros),
                (vec![c, 3 * c], Init::Normal(std)),
                (vec![3 * c], Init::Zeros),
                (vec![c, c], Init::Normal(proj_std)),
                (vec![c], Init::Zeros),
                (vec![c], Init::Ones),
                (vec![c], Init::Zeros),
                (vec![c, m], Init::Normal(std)),
                (vec![m], Init::Zeros),
                (vec![m, c], Init::Normal(proj_std)),
                (vec![c], Init::Zeros),
            ];
            for (suffix, (shape, init)) in LAYER_NAMES.iter().zip(shapes) {
                specs.push((format!("transformer.h.{i}.{suffix}"), shape, init));
            }
        }
        specs.push(("transformer.ln_f.weight".into(), vec![c], Init::Ones));
        specs.push(("transformer.ln_f.bias".into(), vec![c], Init::Zeros));

        let vp = cfg.padded_vocab_size();
        let mut params: Vec<ParamInfo> = specs
            .into_iter()
            .map(|(name, shape, init)| ParamInfo {
                decay: shape.len() == 2,
                slot: Slot {
                    offset: 0,
                    shape: Shape::new(&shape),
                },
                name,
                shape,
                init,
            })
            .collect();
        // Offsets: decayed tensors first, then the rest, each aligned.
        let mut offset = 0;
        let mut decay_len = 0;
        for decayed in [true, false] {
            for (i, p) in params.iter_mut().enumerate() {
                if p.decay != decayed {
                    continue;
                }
                p.slot.offset = offset;
                // wte (index 0) is stored with its padding rows.
                let stored = if i == 0 { vp * c } else { p.numel() };
                offset += stored.div_ceil(ALIGN) * ALIGN;
            }
            if decayed {
                decay_len = offset;
            }
        }
        let index = params
            .iter()
            .enumerate()
            .map(|(i, p)| (p.name.clone(), i))
            .collect();
        let slot = |i: usize| params[i].slot;
        let layers = (0..l)
            .map(|li| std::array::from_fn(|k| slot(2 + li * LAYER_TENSORS + k)))
            .collect();
        let last = params.len();
        ParamLayout {
            wte_padded: Slot {
                offset: params[0].slot.offset,
                shape: Shape::new(&[vp, c]),
            },
            wpe: slot(1),
            layers,
            ln_f_w: slot(last - 2),
            ln_f_b: slot(last - 1),
            decay_len,
            len: offset,
            index,
            params,
        }
    }

    /// Every parameter, in transformers' order.
    pub fn params(&self) -> &[ParamInfo] {
        &self.params
    }

    pub fn get(&self, name: &str) -> Option<&ParamInfo> {
        self.index.get(name).map(|&i| &self.params[i])
    }

    /// Block `i`'s tensors as views into `buf`.
    pub fn layer<'a, M: DeviceMemory>(&self, buf: &'a M, i: usize) -> LayerParams<'a, M> {
        let s = &self.layers[i];
        let v = |k: usize| s[k].on(buf);
        let norm = |k: usize| Norm {
            gamma: v(k),
            beta: v(k + 1),
        };
        let linear = |k: usize| Linear {
            weight: v(k),
            bias: v(k + 1),
        };
        LayerParams {
            ln_1: norm(0),
            c_attn: linear(2),
            attn_proj: linear(4),
            ln_2: norm(6),
            c_fc: linear(8),
            mlp_proj: linear(10),
        }
    }

    /// The final LayerNorm's parameters as views into `buf`.
    pub fn ln_f<'a, M: DeviceMemory>(&self, buf: &'a M) -> Norm<'a, M> {
        Norm {
            gamma: self.ln_f_w.on(buf),
            beta: self.ln_f_b.on(buf),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layout_counts_every_parameter_once_and_tensors_do_not_overlap() {
        let cfg = ModelConfig::andrea_120m();
        let layout = ParamLayout::new(&cfg);
        let total: usize = layout.params().iter().map(|p| p.numel()).sum();
        assert_eq!(total, cfg.param_count());
        assert_eq!(layout.params().len(), 2 + 12 * 12 + 2);
        let mut ranges: Vec<(usize, usize)> = layout
            .params()
            .iter()
            .map(|p| (p.slot.offset, p.slot.offset + p.numel()))
            .collect();
        ranges.push((
            layout.wte_padded.offset,
            layout.wte_padded.offset + 8512 * 768,
        ));
        ranges.sort();
        for w in ranges.windows(2) {
            // The padded wte contains the named wte; otherwise disjoint.
            assert!(w[0].1 <= w[1].0 || w[0].0 == w[1].0, "{w:?}");
        }
        for p in layout.params() {
            assert_eq!(p.slot.offset % ALIGN, 0);
            assert_eq!(p.decay(), p.offset_in_decay_range(&layout), "{}", p.name());
        }
        let qkv = layout.get("transformer.h.3.attn.c_attn.weight").unwrap();
        assert_eq!(qkv.shape(), [768, 2304]);
        assert!(qkv.decay());
        assert!(!layout
            .get("transformer.h.3.attn.c_attn.bias")
            .unwrap()
            .decay());
        assert!(!layout.get("transformer.ln_f.weight").unwrap().decay());
    }

    impl ParamInfo {
        fn offset_in_decay_range(&self, l: &ParamLayout) -> bool {
            self.slot.offset < l.decay_len
        }
    }
}
