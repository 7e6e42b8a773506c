//! Safetensors + config.json I/O: round trips, the variants transformers writes, and
//! errors that name the tensor or key at fault.

mod common;

use std::collections::HashMap;
use std::path::Path;

use andrea_core::ModelConfig;
use andrea_cpu::CpuBackend;
use andrea_model::io::{read_config, CONFIG_FILE, WEIGHTS_FILE};
use andrea_model::{Model, ModelError};
use common::small;
use safetensors::tensor::{Dtype, TensorView};

fn model(seed: u64) -> Model<CpuBackend> {
    Model::new(CpuBackend::new(), small(), seed).unwrap()
}

/// Rewrites `dir/model.safetensors` from `model`'s tensors passed through `edit`.
fn write_variant(
    model: &Model<CpuBackend>,
    dir: &Path,
    edit: impl FnOnce(&mut Vec<(String, Vec<usize>, Vec<f32>)>),
) {
    let mut tensors: Vec<(String, Vec<usize>, Vec<f32>)> = model
        .params()
        .iter()
        .map(|p| {
            (
                p.name().to_string(),
                p.shape().to_vec(),
                model.read_param(p.name()).unwrap(),
            )
        })
        .collect();
    edit(&mut tensors);
    let bytes: Vec<Vec<u8>> = tensors
        .iter()
        .map(|t| t.2.iter().flat_map(|v| v.to_le_bytes()).collect())
        .collect();
    let views: Vec<(String, TensorView<'_>)> = tensors
        .iter()
        .zip(&bytes)
        .map(|(t, b)| {
            (
                t.0.clone(),
                TensorView::new(Dtype::F32, t.1.clone(), b).unwrap(),
            )
        })
        .collect();
    let meta = HashMap::from([("format".to_string(), "pt".to_string())]);
    std::fs::write(
        dir.join(WEIGHTS_FILE),
        safetensors::serialize(views, Some(meta)).unwrap(),
    )
    .unwrap();
}

fn same_params(a: &Model<CpuBackend>, b: &Model<CpuBackend>) {
    for p in a.params() {
        assert_eq!(
            a.read_param(p.name()).unwrap(),
            b.read_param(p.name()).unwrap(),
            "{}",
            p.name()
        );
    }
}

#[test]
fn save_then_load_gives_the_same_model_and_a_transformers_config() {
    let dir = tempfile::tempdir().unwrap();
    let a = model(1);
    a.save(dir.path()).unwrap();
    let b = Model::load(CpuBackend::new(), dir.path()).unwrap();
    same_params(&a, &b);
    assert_eq!(
        b.config(),
        &ModelConfig {
            mlp_dim: Some(128),
            ..small()
        }
    );
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.path().join(CONFIG_FILE)).unwrap())
            .unwrap();
    for (key, want) in [
        ("model_type", serde_json::json!("gpt2")),
        ("activation_function", serde_json::json!("gelu_new")),
        ("tie_word_embeddings", serde_json::json!(true)),
        ("vocab_size", serde_json::json!(70)),
        ("n_positions", serde_json::json!(32)),
        ("n_embd", serde_json::json!(32)),
        ("n_layer", serde_json::json!(2)),
        ("n_head", serde_json::json!(4)),
        ("resid_pdrop", serde_json::json!(0.0)),
    ] {
        assert_eq!(json[key], want, "{key}");
    }
    // Written atomically: nothing but the two files is left behind.
    let mut files: Vec<String> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    files.sort();
    assert_eq!(files, [CONFIG_FILE, WEIGHTS_FILE]);
    // Saving over an existing checkpoint works.
    model(2).save(dir.path()).unwrap();
    same_params(
        &model(2),
        &Model::load(CpuBackend::new(), dir.path()).unwrap(),
    );
}

#[test]
fn loads_the_variants_transformers_writes() {
    let dir = tempfile::tempdir().unwrap();
    let a = model(3);
    a.save(dir.path()).unwrap();
    // GPT2Model names (no `transformer.`), a tied lm_head, the old causal-mask buffers.
    write_variant(&a, dir.path(), |t| {
        for x in t.iter_mut() {
            x.0 = x.0.trim_start_matches("transformer.").to_string();
        }
        let wte = t[0].clone();
        t.push(("lm_head.weight".into(), wte.1, wte.2));
        t.push(("h.0.attn.bias".into(), vec![1, 1, 32, 32], vec![1.0; 1024]));
        t.push(("h.1.attn.masked_bias".into(), vec![], vec![-1e4]));
    });
    same_params(&a, &Model::load(CpuBackend::new(), dir.path()).unwrap());
}

#[test]
fn bad_checkpoints_are_errors_naming_the_tensor_or_key() {
    let dir = tempfile::tempdir().unwrap();
    let a = model(4);
    a.save(dir.path()).unwrap();
    let load = || Model::load(CpuBackend::new(), dir.path()).unwrap_err();

    write_variant(&a, dir.path(), |t| {
        t.retain(|x| x.0 != "transformer.h.1.ln_2.bias")
    });
    assert!(
        matches!(load(), ModelError::MissingTensor { name, .. } if name == "transformer.h.1.ln_2.bias")
    );

    write_variant(&a, dir.path(), |t| {
        t.push((
            "transformer.h.2.ln_1.weight".into(),
            vec![32],
            vec![1.0; 32],
        ))
    });
    let e = load();
    assert!(
        e.to_string()
            .contains("unexpected tensor `transformer.h.2.ln_1.weight`"),
        "{e}"
    );

    write_variant(&a, dir.path(), |t| {
        let x = t
            .iter_mut()
            .find(|x| x.0 == "transformer.h.0.attn.c_attn.weight")
            .unwrap();
        x.1 = vec![96, 32]; // transposed (a Linear's [out, in] layout)
    });
    let e = load();
    assert!(
        e.to_string().contains(
            "`transformer.h.0.attn.c_attn.weight` has shape [96, 32], the model expects [32, 96]"
        ),
        "{e}"
    );

    write_variant(&a, dir.path(), |t| {
        let mut head = t[0].clone();
        head.0 = "lm_head.weight".into();
        head.2[0] += 1.0;
        t.push(head);
    });
    assert!(load().to_string().contains("`lm_head.weight` differs"));

    std::fs::write(dir.path().join(WEIGHTS_FILE), b"not safetensors").unwrap();
    assert!(load().to_string().contains("not a safetensors file"));

    std::fs::remove_file(dir.path().join(CONFIG_FILE)).unwrap();
    let e = load();
    assert!(
        matches!(e, ModelError::Io { .. }) && e.to_string().contains(CONFIG_FILE),
        "{e}"
    );
}

#[test]
fn loading_another_configs_checkpoint_names_the_key() {
    let dir = tempfile::tempdir().unwrap();
    Model::new(CpuBackend::new(), ModelConfig::new(70, 32, 32, 3, 4), 5)
        .unwrap()
        .save(dir.path())
        .unwrap();
    assert_eq!(read_config(dir.path()).unwrap().n_layer, 3);
    let mut m = model(6);
    let e = m.load_weights(dir.path()).unwrap_err();
    assert!(
        e.to_string()
            .contains("the checkpoint has n_layer = 3, this model has 2"),
        "{e}"
    );
    // Unchanged after the failed load.
    same_params(&m, &model(6));
}
