//! `config.json` in the format of transformers' `GPT2Config`, both ways.
//!
//! Writing gives every key that changes the computation explicitly (dropout 0: andrea
//! trains without dropout). Reading applies `GPT2Config`'s defaults to absent keys
//! (transformers leaves out keys equal to its defaults) and refuses the settings andrea
//! does not implement, naming the key.

use std::path::Path;

use andrea_core::ModelConfig;
use serde_json::{json, Map, Value};

use crate::error::{ModelError, Result};

/// The `config.json` transformers reads for `cfg`.
pub(crate) fn to_json(cfg: &ModelConfig) -> String {
    let token = |id: Option<u32>| id.map_or(Value::Null, Value::from);
    let value = json!({
        "architectures": ["GPT2LMHeadModel"],
        "model_type": "gpt2",
        "vocab_size": cfg.vocab_size,
        "n_positions": cfg.context_length,
        "n_ctx": cfg.context_length,
        "n_embd": cfg.d_model,
        "n_layer": cfg.n_layer,
        "n_head": cfg.n_head,
        "n_inner": cfg.mlp_dim(),
        "activation_function": "gelu_new",
        "layer_norm_epsilon": cfg.layer_norm_eps,
        "initializer_range": cfg.init_std,
        "resid_pdrop": 0.0,
        "embd_pdrop": 0.0,
        "attn_pdrop": 0.0,
        "scale_attn_weights": true,
        "scale_attn_by_inverse_layer_idx": false,
        "reorder_and_upcast_attn": false,
        "tie_word_embeddings": true,
        "use_cache": true,
        "bos_token_id": token(cfg.eos_token_id),
        "eos_token_id": token(cfg.eos_token_id),
        "dtype": "float32",
    });
    let mut text = serde_json::to_string_pretty(&value).expect("JSON values serialize");
    text.push('\n');
    text
}

fn usize_key(obj: &Map<String, Value>, key: &str, default: usize, path: &Path) -> Result<usize> {
    match obj.get(key) {
        None | Some(Value::Null) => Ok(default),
        // Beyond usize (a 32-bit target) saturates; `validate` then refuses the size.
        Some(v) => v
            .as_u64()
            .map(|x| usize::try_from(x).unwrap_or(usize::MAX))
            .ok_or_else(|| {
                ModelError::format(
                    path,
                    format!("`{key}` must be a non-negative integer, got {v}"),
                )
            }),
    }
}

fn bool_key(obj: &Map<String, Value>, key: &str, default: bool, path: &Path) -> Result<bool> {
    match obj.get(key) {
        None | Some(Value::Null) => Ok(default),
        Some(v) => v.as_bool().ok_or_else(|| {
            ModelError::format(path, format!("`{key}` must be true or false, got {v}"))
        }),
    }
}

fn unsupported(path: &Path, key: &str, value: &Value, need: &str) -> ModelError {
    ModelError::format(
        path,
        format!("`{key}` = {value} is not supported by andrea (needs {need})"),
    )
}

/// Reads a transformers GPT-2 `config.json`.
pub(crate) fn from_json(text: &str, path: &Path) -> Result<ModelConfig> {
    let value: Value = serde_json::from_str(text)
        .map_err(|e| ModelError::format(path, format!("not valid JSON: {e}")))?;
    let obj = value
        .as_object()
        .ok_or_else(|| ModelError::format(path, "expected a JSON object"))?;
    if let Some(t) = obj.get("model_type") {
        if t != "gpt2" {
            return Err(unsupported(path, "model_type", t, "\"gpt2\""));
        }
    }
    if let Some(act) = obj.get("activation_function") {
        // Both names are the tanh approximation of GELU.
        if act != "gelu_new" && act != "gelu_pytorch_tanh" {
            return Err(unsupported(
                path,
                "activation_function",
                act,
                "\"gelu_new\"",
            ));
        }
    }
    for (key, default, need) in [
        ("scale_attn_weights", true, true),
        ("scale_attn_by_inverse_layer_idx", false, false),
        ("tie_word_embeddings", true, true),
        ("add_cross_attention", false, false),
    ] {
        if bool_key(obj, key, default, path)? != need {
            let got = obj.get(key).unwrap_or(&Value::Null);
            return Err(unsupported(path, key, got, &need.to_string()));
        }
    }
    let d_model = usize_key(obj, "n_embd", 768, path)?;
    let eps = match obj.get("layer_norm_epsilon") {
        None | Some(Value::Null) => 1e-5,
        Some(v) => v.as_f64().ok_or_else(|| {
            ModelError::format(
                path,
                format!("`layer_norm_epsilon` must be a number, got {v}"),
            )
        })?,
    };
    let init_std = obj
        .get("initializer_range")
        .and_then(Value::as_f64)
        .unwrap_or(0.02);
    let vocab_size = usize_key(obj, "vocab_size", 50257, path)?;
    // An end-of-text id outside the vocabulary (GPT2Config's default 50256 for a smaller
    // vocabulary) means there is none.
    let eos_token_id = obj
        .get("eos_token_id")
        .and_then(Value::as_u64)
        .filter(|&id| (id as usize) < vocab_size)
        .map(|id| id as u32);
    let cfg = ModelConfig {
        name: None,
        vocab_size,
        context_length: usize_key(obj, "n_positions", 1024, path)?,
        d_model,
        n_layer: usize_key(obj, "n_layer", 12, path)?,
        n_head: usize_key(obj, "n_head", 12, path)?,
        mlp_dim: Some(usize_key(obj, "n_inner", d_model.saturating_mul(4), path)?),
        layer_norm_eps: eps as f32,
        init_std: init_std as f32,
        eos_token_id,
    };
    cfg.validate()
        .map_err(|e| ModelError::format(path, e.to_string()))?;
    Ok(cfg)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_defaults() {
        let cfg = ModelConfig {
            mlp_dim: Some(3072),
            ..ModelConfig::andrea_120m()
        };
        let back = from_json(&to_json(&cfg), Path::new("config.json")).unwrap();
        assert_eq!(back, ModelConfig { name: None, ..cfg });
        // transformers omits keys equal to GPT2Config's defaults: GPT-2 small.
        let small = from_json(r#"{"model_type": "gpt2"}"#, Path::new("c.json")).unwrap();
        assert_eq!(
            (
                small.vocab_size,
                small.context_length,
                small.d_model,
                small.mlp_dim()
            ),
            (50257, 1024, 768, 3072)
        );
    }

    #[test]
    fn unsupported_settings_name_the_key() {
        for (text, key) in [
            (r#"{"model_type": "llama"}"#, "model_type"),
            (r#"{"activation_function": "relu"}"#, "activation_function"),
            (r#"{"tie_word_embeddings": false}"#, "tie_word_embeddings"),
            (
                r#"{"scale_attn_by_inverse_layer_idx": true}"#,
                "scale_attn_by_inverse_layer_idx",
            ),
            (r#"{"n_embd": "wide"}"#, "n_embd"),
            (r#"{"n_embd": 10, "n_head": 3}"#, "model.n_head"),
        ] {
            let e = from_json(text, Path::new("c.json"))
                .unwrap_err()
                .to_string();
            assert!(e.contains(&format!("`{key}`")), "{text}: {e}");
        }
    }
}
