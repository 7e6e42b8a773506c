//! Saving and loading models as transformers does: a directory with `model.safetensors`
//! (transformers' tensor names and layouts, F32) and `config.json` (`GPT2Config`), so
//! `GPT2LMHeadModel.from_pretrained(dir)` loads an andrea model and andrea loads a
//! directory transformers saved.
//!
//! Reading accepts what transformers writes for GPT-2: names with or without the
//! `transformer.` prefix (`GPT2LMHeadModel` or `GPT2Model`), the tied `lm_head.weight`
//! present or absent (if present it must equal the token embedding), the causal-mask
//! buffers `attn.bias` / `attn.masked_bias` of older versions (ignored), and F32, F16,
//! BF16 or F64 values. Every name, shape and dtype is checked before a value is used: a
//! missing, unexpected or mis-shaped tensor is an error naming it.
//!
//! Every file is written atomically: to a temporary file in the same directory, synced,
//! then renamed over the target, so a crash leaves the old file or the new one.

pub(crate) mod hf_config;
pub(crate) mod tensors;

use std::collections::{HashMap, HashSet};
use std::path::Path;

use andrea_core::{Backend, ModelConfig};

use crate::error::{ModelError, Result};
use crate::layout::ParamLayout;
use crate::model::Model;
use tensors::{HostTensor, TensorFile};

/// The weights file of a model directory.
pub const WEIGHTS_FILE: &str = "model.safetensors";
/// The config file of a model directory.
pub const CONFIG_FILE: &str = "config.json";

/// Writes `bytes` to `path` atomically: [`andrea_fs::write_atomic`] (temporary file in
/// the same directory, fsync, rename, fsync the directory).
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    andrea_fs::write_atomic(path, bytes).map_err(|e| ModelError::io(path, e))
}

/// Reads a whole file, which must be a regular file (a FIFO or a device named
/// `model.safetensors` would block or never end) of at most `max_bytes` bytes:
/// [`andrea_fs::read_regular`].
fn read(path: &Path, max_bytes: u64) -> Result<Vec<u8>> {
    andrea_fs::read_regular(path, max_bytes).map_err(|e| ModelError::io(path, e))
}

/// The largest weight magnitude a loaded model may hold. Trained GPT-2 weights lie
/// within a few tens (AdamW moves a weight by about `lr` a step; weight decay pulls it
/// back). A forward multiplies weights by weights (`x·W_qkv`, then `Q·Kᵀ`; two MLP
/// products back to back) and LayerNorm squares the residual stream, so a weight far
/// below FP32's `3.4e38` (a square overflows from `1.8e19`) already gives infinities and
/// then NaN. `1e6` leaves room for any trained model and none for a diverged one whose
/// weights are still finite.
pub const MAX_WEIGHT: f32 = 1e6;

/// Whether `v` is finite and at most [`MAX_WEIGHT`] in magnitude.
fn within_bound(v: f32) -> bool {
    v.is_finite() && v.abs() <= MAX_WEIGHT
}

/// Which tensor of a file becomes which parameter; made before anything is allocated.
struct LoadPlan {
    /// `(name in file, parameter)`.
    tensors: Vec<(String, String)>,
    /// The tied output layer's name in the file, if it holds one.
    lm_head: Option<String>,
}

/// Pass 1 of a load: every name, shape and dtype of `file` against `layout`.
fn plan_load(layout: &ParamLayout, file: &TensorFile, path: &Path) -> Result<LoadPlan> {
    let mut tensors: Vec<(String, String)> = Vec::new();
    let mut lm_head = None;
    let mut seen = HashSet::new();
    let wte = layout
        .get("transformer.wte.weight")
        .ok_or_else(|| ModelError::State("the layout has no token embedding".into()))?
        .shape()
        .to_vec();
    for name in file.names() {
        let param = canonical(&name);
        if is_mask_buffer(&param) {
            continue;
        }
        let expected = if param == "lm_head.weight" {
            lm_head = Some(name.clone());
            wte.clone()
        } else {
            let info = layout
                .get(&param)
                .ok_or_else(|| ModelError::UnexpectedTensor {
                    path: path.to_path_buf(),
                    name: name.clone(),
                })?;
            if !seen.insert(param.clone()) {
                return Err(ModelError::format(
                    path,
                    format!("tensor `{param}` appears twice (with and without `transformer.`)"),
                ));
            }
            tensors.push((name.clone(), param.clone()));
            info.shape().to_vec()
        };
        let got = file.shape(&name)?;
        if got != expected {
            return Err(ModelError::TensorShape {
                path: path.to_path_buf(),
                name,
                expected,
                got,
            });
        }
        file.check_dtype(&name)?;
    }
    if let Some(p) = layout.params().iter().find(|p| !seen.contains(p.name())) {
        return Err(ModelError::MissingTensor {
            path: path.to_path_buf(),
            name: p.name().to_string(),
        });
    }
    Ok(LoadPlan { tensors, lm_head })
}

/// A checkpoint tensor name as andrea names it (`GPT2Model` checkpoints lack the prefix).
fn canonical(name: &str) -> String {
    let bare = ["wte.", "wpe.", "h.", "ln_f."];
    if bare.iter().any(|p| name.starts_with(p)) {
        format!("transformer.{name}")
    } else {
        name.to_string()
    }
}

/// The causal-mask buffers older transformers versions saved: not parameters.
fn is_mask_buffer(name: &str) -> bool {
    let Some(rest) = name.strip_prefix("transformer.h.") else {
        return false;
    };
    let Some((layer, suffix)) = rest.split_once('.') else {
        return false;
    };
    layer.parse::<usize>().is_ok() && (suffix == "attn.bias" || suffix == "attn.masked_bias")
}

impl<B: Backend> Model<B> {
    /// Saves the model to `dir` (created if needed) as `model.safetensors` + `config.json`.
    pub fn save(&self, dir: impl AsRef<Path>) -> Result<()> {
        let dir = dir.as_ref();
        std::fs::create_dir_all(dir).map_err(|e| ModelError::io(dir, e))?;
        self.save_safetensors(dir.join(WEIGHTS_FILE))?;
        write_atomic(
            &dir.join(CONFIG_FILE),
            hf_config::to_json(self.config()).as_bytes(),
        )
    }

    /// Writes the parameters alone to a safetensors file (transformers' names, F32).
    pub fn save_safetensors(&self, path: impl AsRef<Path>) -> Result<()> {
        let tensors = self
            .params()
            .iter()
            .map(|p| {
                Ok((
                    p.name().to_string(),
                    p.shape().to_vec(),
                    self.read_param(p.name())?,
                ))
            })
            .collect::<Result<Vec<HostTensor>>>()?;
        let meta = HashMap::from([("format".to_string(), "pt".to_string())]);
        write_atomic(path.as_ref(), &tensors::serialize(&tensors, meta)?)
    }

    /// Loads a model directory (andrea's or transformers') onto `backend`. The
    /// config and every tensor's name, shape and dtype are checked before the model's
    /// memory is allocated, so a config promising a huge model next to a small file is
    /// refused, not allocated.
    pub fn load(backend: B, dir: impl AsRef<Path>) -> Result<Self> {
        let config = read_config(dir.as_ref())?;
        let path = dir.as_ref().join(WEIGHTS_FILE);
        check_not_pickle_only(dir.as_ref())?;
        let bytes = read(&path, u64::MAX)?;
        let file = TensorFile::parse(&path, &bytes)?;
        let plan = plan_load(&ParamLayout::new(&config), &file, &path)?;
        let mut model = Model::zeros(backend, config)?;
        model.apply_load(&file, &plan, &path)?;
        Ok(model)
    }

    /// Replaces this model's parameters by those in `dir`, whose config must describe
    /// the same shapes (an error names the first key that differs).
    pub fn load_weights(&mut self, dir: impl AsRef<Path>) -> Result<()> {
        let dir = dir.as_ref();
        let theirs = read_config(dir)?;
        check_same_shape(self.config(), &theirs, &dir.join(CONFIG_FILE))?;
        self.load_safetensors(dir.join(WEIGHTS_FILE))
    }

    /// Reads the parameters from a safetensors file. Nothing is changed unless every
    /// tensor is present, expected and of the right shape.
    pub fn load_safetensors(&mut self, path: impl AsRef<Path>) -> Result<()> {
        let path = path.as_ref();
        let bytes = read(path, u64::MAX)?;
        let file = TensorFile::parse(path, &bytes)?;
        let plan = plan_load(self.layout(), &file, path)?;
        self.apply_load(&file, &plan, path)
    }

    /// Pass 2 of a load: the values.
    fn apply_load(&mut self, file: &TensorFile, plan: &LoadPlan, path: &Path) -> Result<()> {
        for (name, param) in &plan.tensors {
            let values = file.read_f32(name)?;
            // A NaN or infinity in a weight makes every output NaN, and so does a finite
            // weight large enough to overflow a product or a LayerNorm variance: refuse
            // it here, by name, rather than print garbage or a loss of NaN later.
            if let Some(i) = values.iter().position(|v| !within_bound(*v)) {
                let what = if values[i].is_finite() {
                    format!("a value of magnitude above {MAX_WEIGHT:e}, where a forward overflows")
                } else {
                    "a non-finite value".to_string()
                };
                return Err(ModelError::format(
                    path,
                    format!(
                        "tensor `{name}` holds {what} ({}) at index {i}: the weights are damaged \
                         or come from a diverged run; use an earlier checkpoint",
                        values[i]
                    ),
                ));
            }
            self.write_param(param, &values)?;
        }
        if let Some(name) = &plan.lm_head {
            if file.read_f32(name)? != self.read_param("transformer.wte.weight")? {
                return Err(ModelError::format(
                    path,
                    format!("`{name}` differs from `transformer.wte.weight`: andrea's output layer is tied to the token embedding"),
                ));
            }
        }
        Ok(())
    }
}

/// A transformers folder saved with `safe_serialization=False` holds its weights in
/// `pytorch_model.bin` (a pickle, which andrea does not read): say how to convert it.
fn check_not_pickle_only(dir: &Path) -> Result<()> {
    let (ours, pickle) = (dir.join(WEIGHTS_FILE), dir.join("pytorch_model.bin"));
    if std::fs::symlink_metadata(&ours).is_err() && pickle.exists() {
        return Err(ModelError::format(
            &ours,
            format!(
                "missing; {} holds the weights as a PyTorch pickle, which andrea does not read: \
                 convert it with `python -c \"from transformers import GPT2LMHeadModel; \
                 GPT2LMHeadModel.from_pretrained('{d}').save_pretrained('{d}', \
                 safe_serialization=True)\"`",
                pickle.display(),
                d = dir.display()
            ),
        ));
    }
    Ok(())
}

/// Checks the weights of the model directory `dir` as [`Model::load`] does (every value
/// finite and at most [`MAX_WEIGHT`] in magnitude) without loading a model: whether a
/// checkpoint can be named as one to go back to.
pub fn check_weights(dir: &Path) -> Result<()> {
    let path = dir.join(WEIGHTS_FILE);
    let bytes = read(&path, u64::MAX)?;
    let file = TensorFile::parse(&path, &bytes)?;
    for name in file.names() {
        let values = file.read_f32(&name)?;
        if let Some(i) = values.iter().position(|v| !within_bound(*v)) {
            return Err(ModelError::format(
                &path,
                format!("tensor `{name}` holds {} at index {i}", values[i]),
            ));
        }
    }
    Ok(())
}

/// Reads `dir/config.json`.
pub fn read_config(dir: &Path) -> Result<ModelConfig> {
    let path = dir.join(CONFIG_FILE);
    // A GPT2Config is a few hundred bytes; a file of megabytes is not one.
    const MAX_CONFIG_BYTES: u64 = 1 << 20;
    let bytes = read(&path, MAX_CONFIG_BYTES)?;
    let text = std::str::from_utf8(&bytes)
        .map_err(|e| ModelError::format(&path, format!("not UTF-8 text: {e}")))?;
    hf_config::from_json(text, &path)
}

fn check_same_shape(ours: &ModelConfig, theirs: &ModelConfig, path: &Path) -> Result<()> {
    let keys: [(&'static str, String, String); 7] = [
        (
            "vocab_size",
            ours.vocab_size.to_string(),
            theirs.vocab_size.to_string(),
        ),
        (
            "context_length",
            ours.context_length.to_string(),
            theirs.context_length.to_string(),
        ),
        (
            "d_model",
            ours.d_model.to_string(),
            theirs.d_model.to_string(),
        ),
        (
            "n_layer",
            ours.n_layer.to_string(),
            theirs.n_layer.to_string(),
        ),
        ("n_head", ours.n_head.to_string(), theirs.n_head.to_string()),
        (
            "mlp_dim",
            ours.mlp_dim().to_string(),
            theirs.mlp_dim().to_string(),
        ),
        (
            "layer_norm_eps",
            ours.layer_norm_eps.to_string(),
            theirs.layer_norm_eps.to_string(),
        ),
    ];
    match keys.into_iter().find(|(_, a, b)| a != b) {
        Some((key, expected, got)) => Err(ModelError::ConfigMismatch {
            path: path.to_path_buf(),
            key,
            expected,
            got,
        }),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_of_transformers_checkpoints() {
        assert_eq!(canonical("h.0.ln_1.weight"), "transformer.h.0.ln_1.weight");
        assert_eq!(
            canonical("transformer.wte.weight"),
            "transformer.wte.weight"
        );
        assert_eq!(canonical("lm_head.weight"), "lm_head.weight");
        assert!(is_mask_buffer("transformer.h.11.attn.bias"));
        assert!(is_mask_buffer("transformer.h.0.attn.masked_bias"));
        assert!(!is_mask_buffer("transformer.h.0.attn.c_attn.bias"));
        assert!(!is_mask_buffer("transformer.h.x.attn.bias"));
    }
}
