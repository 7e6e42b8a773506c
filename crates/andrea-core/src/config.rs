//! Configs: the model's shape, the optimizer and the learning-rate schedule, read from
//! TOML (`configs/*.toml`), with every key checked.
//!
//! A config file has a `[model]` table and optional `[optimizer]` and `[schedule]`
//! tables. Unknown keys (and unknown tables) are rejected with a message naming them, and
//! [`Config::validate`] names the key of every value out of range:
//!
//! ```
//! use andrea_core::config::Config;
//!
//! let cfg = Config::from_toml_str(
//!     "[model]\nvocab_size = 8449\ncontext_length = 1024\nd_model = 768\nn_layer = 12\nn_head = 12\n",
//! )?;
//! assert_eq!(cfg.model.param_count(), 92_331_264);
//! assert_eq!(cfg.model.padded_vocab_size(), 8512);
//!
//! let err = Config::from_toml_str("[model]\nvocab = 8449\n").unwrap_err();
//! assert!(err.to_string().contains("unknown field `vocab`"));
//! # Ok::<(), andrea_core::config::ConfigError>(())
//! ```

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// What went wrong reading or checking a config.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read config {path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    /// Malformed TOML, a value of the wrong type, or an unknown key (the message names it
    /// and its line).
    #[error("{origin}: {message}")]
    Parse { origin: String, message: String },
    /// A value out of range: `key` is the full key, such as `model.n_head`.
    #[error("invalid config: `{key}` {message}")]
    Invalid { key: &'static str, message: String },
}

fn invalid(key: &'static str, message: impl Into<String>) -> ConfigError {
    ConfigError::Invalid {
        key,
        message: message.into(),
    }
}

/// A whole config file.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    pub model: ModelConfig,
    #[serde(default)]
    pub optimizer: OptimizerConfig,
    #[serde(default)]
    pub schedule: ScheduleConfig,
}

impl Config {
    /// Parses and validates a config from TOML text.
    pub fn from_toml_str(text: &str) -> Result<Self, ConfigError> {
        Self::parse(text, "config")
    }

    /// Reads, parses and validates a config file.
    pub fn from_toml_file(path: impl AsRef<Path>) -> Result<Self, ConfigError> {
        let path = path.as_ref();
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        Self::parse(&text, &path.display().to_string())
    }

    fn parse(text: &str, origin: &str) -> Result<Self, ConfigError> {
        let cfg: Config = toml::from_str(text).map_err(|e| ConfigError::Parse {
            origin: origin.to_string(),
            message: e.to_string().trim_end().to_string(),
        })?;
        cfg.validate()?;
        Ok(cfg)
    }

    /// The config as TOML text (what [`Config::from_toml_str`] reads back).
    pub fn to_toml_string(&self) -> String {
        toml::to_string(self).expect("a config always serializes to TOML")
    }

    /// Checks every value; the error names the first bad key.
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.model.validate()?;
        self.optimizer.validate()?;
        self.schedule.validate()
    }
}

/// The shape of a GPT-2-style model (see DESIGN.md): pre-norm blocks, fused QKV,
/// tanh-GELU MLP, learned positions, tied output embedding.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelConfig {
    /// A label for messages ("andrea-120m"); not part of the model.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Number of token ids.
    pub vocab_size: usize,
    /// Longest sequence (number of learned positions).
    pub context_length: usize,
    /// Width of the residual stream.
    pub d_model: usize,
    /// Number of transformer blocks.
    pub n_layer: usize,
    /// Attention heads; `d_model` must be a multiple.
    pub n_head: usize,
    /// Hidden width of the MLP; default `4 · d_model`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mlp_dim: Option<usize>,
    /// LayerNorm epsilon.
    #[serde(default = "default_layer_norm_eps")]
    pub layer_norm_eps: f32,
    /// Standard deviation of the GPT-2 initialisation.
    #[serde(default = "default_init_std")]
    pub init_std: f32,
    /// The id of `<|endoftext|>`, if the vocabulary has one (written to `config.json` as
    /// `bos_token_id` / `eos_token_id`; generation may stop on it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub eos_token_id: Option<u32>,
}

fn default_layer_norm_eps() -> f32 {
    1e-5
}

fn default_init_std() -> f32 {
    0.02
}

/// Ids and positions are `u32` on the device; sizes beyond this are refused.
const MAX_SIZE: usize = 1 << 30;
/// Blocks: far beyond any GPT (GPT-3 has 96); bounds the per-layer tables a model builds.
const MAX_LAYERS: usize = 1 << 12;
/// Parameters (4 TiB of f32): bounds every product of sizes so `usize` arithmetic on
/// them is exact; the memory a command needs is checked against the machine separately.
const MAX_PARAMS: u128 = 1 << 40;

impl ModelConfig {
    /// A config with the given sizes and defaults for the rest.
    pub fn new(
        vocab_size: usize,
        context_length: usize,
        d_model: usize,
        n_layer: usize,
        n_head: usize,
    ) -> Self {
        ModelConfig {
            name: None,
            vocab_size,
            context_length,
            d_model,
            n_layer,
            n_head,
            mlp_dim: None,
            layer_norm_eps: default_layer_norm_eps(),
            init_std: default_init_std(),
            eos_token_id: None,
        }
    }

    /// ANDREA-120M: d_model 768, 12 blocks of 12 heads, vocabulary 8449, context 1024.
    pub fn andrea_120m() -> Self {
        ModelConfig {
            name: Some("andrea-120m".into()),
            mlp_dim: Some(3072),
            eos_token_id: Some(8448),
            ..Self::new(8449, 1024, 768, 12, 12)
        }
    }

    /// Hidden width of the MLP.
    pub fn mlp_dim(&self) -> usize {
        self.mlp_dim.unwrap_or(self.d_model.saturating_mul(4))
    }

    /// Width of one attention head.
    pub fn head_dim(&self) -> usize {
        self.d_model / self.n_head
    }

    /// The vocabulary rounded up to a multiple of 64: the row count of the token
    /// embedding inside a model (the output GEMM runs faster at such sizes). The extra
    /// rows are zero, get zero gradient and never appear outside the model.
    pub fn padded_vocab_size(&self) -> usize {
        self.vocab_size.div_ceil(64) * 64
    }

    /// Checks every size; the error names the key.
    pub fn validate(&self) -> Result<(), ConfigError> {
        for (key, v) in [
            ("model.vocab_size", self.vocab_size),
            ("model.context_length", self.context_length),
            ("model.d_model", self.d_model),
            ("model.n_layer", self.n_layer),
            ("model.n_head", self.n_head),
            ("model.mlp_dim", self.mlp_dim()),
        ] {
            if v == 0 {
                return Err(invalid(key, "must be at least 1, got 0"));
            }
            if v > MAX_SIZE {
                return Err(invalid(key, format!("must be at most {MAX_SIZE}, got {v}")));
            }
        }
        if self.n_layer > MAX_LAYERS {
            return Err(invalid(
                "model.n_layer",
                format!("must be at most {MAX_LAYERS}, got {}", self.n_layer),
            ));
        }
        // Counted wide so no size can wrap; after this check `param_count` is exact.
        let params = self.param_count_u128();
        if params > MAX_PARAMS {
            return Err(invalid(
                "model.d_model",
                format!(
                    "and the other sizes make {params} parameters, more than the {MAX_PARAMS} andrea can hold: \
                     use a smaller d_model, n_layer, mlp_dim, context_length or vocab_size"
                ),
            ));
        }
        if !self.d_model.is_multiple_of(self.n_head) {
            return Err(invalid(
                "model.n_head",
                format!(
                    "must divide model.d_model ({}), got {}",
                    self.d_model, self.n_head
                ),
            ));
        }
        if !(self.layer_norm_eps > 0.0 && self.layer_norm_eps.is_finite()) {
            return Err(invalid(
                "model.layer_norm_eps",
                format!("must be a positive number, got {}", self.layer_norm_eps),
            ));
        }
        if !(self.init_std >= 0.0 && self.init_std.is_finite()) {
            return Err(invalid(
                "model.init_std",
                format!("must be a non-negative number, got {}", self.init_std),
            ));
        }
        if let Some(id) = self.eos_token_id {
            if id as usize >= self.vocab_size {
                return Err(invalid(
                    "model.eos_token_id",
                    format!("must be < model.vocab_size ({}), got {id}", self.vocab_size),
                ));
            }
        }
        Ok(())
    }

    /// [`ModelConfig::param_count`] in 128 bits: exact for any sizes.
    pub fn param_count_u128(&self) -> u128 {
        let (c, m, l) = (
            self.d_model as u128,
            self.mlp_dim() as u128,
            self.n_layer as u128,
        );
        let per_layer = 4 * c + (c * 3 * c + 3 * c) + (c * c + c) + (c * m + m) + (m * c + c);
        (self.vocab_size as u128 + self.context_length as u128) * c + l * per_layer + 2 * c
    }

    /// Parameters of one transformer block.
    pub fn params_per_layer(&self) -> usize {
        let (c, m) = (self.d_model, self.mlp_dim());
        let layer_norms = 2 * (2 * c);
        let attention = (c * 3 * c + 3 * c) + (c * c + c); // c_attn, c_proj
        let mlp = (c * m + m) + (m * c + c); // c_fc, c_proj
        layer_norms + attention + mlp
    }

    /// The exact number of parameters, counting the tied token embedding once (the real
    /// vocabulary, not the padded one): 92,331,264 for ANDREA-120M.
    pub fn param_count(&self) -> usize {
        let c = self.d_model;
        self.vocab_size * c
            + self.context_length * c
            + self.n_layer * self.params_per_layer()
            + 2 * c
    }

    /// Floating-point operations per token of one training step (forward + backward,
    /// counting a multiply-add as 2) at sequence length `seq`, for the matrix products,
    /// which are all but a fraction of a percent of the work:
    ///
    /// * weights: `6 · (n_layer · (4·C² + 2·C·M) + C·V)`: forward `2·params` per token,
    ///   backward twice that (input and weight gradients), the output layer included;
    /// * attention: `6 · n_layer · C · (seq + 1)`: `q·kᵀ` and `P·v` each take `2·C` per
    ///   key, and a causal query sees `(seq + 1) / 2` keys on average.
    ///
    /// About 563 MFLOP for ANDREA-120M at `seq` 256.
    pub fn training_flops_per_token(&self, seq: usize) -> f64 {
        let (c, m, l, v) = (
            self.d_model as f64,
            self.mlp_dim() as f64,
            self.n_layer as f64,
            self.vocab_size as f64,
        );
        let weights = l * (4.0 * c * c + 2.0 * c * m) + c * v;
        6.0 * weights + 6.0 * l * c * (seq as f64 + 1.0)
    }
}

/// One matrix product of a training step, `[m, k] · [k, n]`, with its operands as the
/// model stores them (weights `[in, out]`; the tied LM head reads `wte: [V, C]`
/// transposed; a weight gradient reads the activations transposed).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StepGemm {
    pub name: &'static str,
    pub m: usize,
    pub k: usize,
    pub n: usize,
    pub a_transposed: bool,
    pub b_transposed: bool,
}

/// 11 products of one training step over `tokens = B·T` rows, width `c`, MLP width `mlp`
/// and vocabulary `v` (the benches and the GPU checks time these). The attention
/// projection's `dx` has `fwd_attn_proj`'s shape and `bwd_dx_fc_proj` stands for both
/// `[tokens, C]·[C, M]` products; two weight gradients are left out, the attention
/// projection's (`C x tokens x C`) and the MLP-up's (`C x tokens x M`), both with `A`
/// transposed as in `bwd_dw_qkv` (the CPU's `gemm_kernels` example adds them).
pub fn step_gemms(tokens: usize, c: usize, mlp: usize, v: usize) -> Vec<StepGemm> {
    let g = |name, m, k, n, a_transposed, b_transposed| StepGemm {
        name,
        m,
        k,
        n,
        a_transposed,
        b_transposed,
    };
    vec![
        g("fwd_qkv", tokens, c, 3 * c, false, false),
        g("fwd_attn_proj", tokens, c, c, false, false),
        g("fwd_fc", tokens, c, mlp, false, false),
        g("fwd_fc_proj", tokens, mlp, c, false, false),
        g("fwd_lm_head", tokens, c, v, false, true),
        g("bwd_dx_qkv", tokens, 3 * c, c, false, true),
        g("bwd_dw_qkv", c, tokens, 3 * c, true, false),
        g("bwd_dx_fc_proj", tokens, c, mlp, false, true),
        g("bwd_dw_fc_proj", mlp, tokens, c, true, false),
        g("bwd_dx_lm_head", tokens, v, c, false, false),
        g("bwd_dwte_lm_head", v, tokens, c, true, false),
    ]
}

/// AdamW (`torch.optim.AdamW` semantics) and gradient clipping.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct OptimizerConfig {
    /// Peak learning rate (the schedule scales it).
    pub lr: f32,
    pub beta1: f32,
    pub beta2: f32,
    pub eps: f32,
    /// Decoupled weight decay, applied to 2-D tensors only (matmul weights, embeddings).
    pub weight_decay: f32,
    /// Clip the global gradient norm to this value (`torch.nn.utils.clip_grad_norm_`);
    /// `None`: no clipping. Absent from a config file it is the default, 1.0 (a config
    /// cannot turn clipping off; the command line's `--grad-clip 0` does).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub grad_clip: Option<f32>,
}

impl Default for OptimizerConfig {
    /// GPT-2/3-style training defaults: lr 6e-4, betas (0.9, 0.95), eps 1e-8, weight
    /// decay 0.1, clipping at 1.0.
    fn default() -> Self {
        OptimizerConfig {
            lr: 6e-4,
            beta1: 0.9,
            beta2: 0.95,
            eps: 1e-8,
            weight_decay: 0.1,
            grad_clip: Some(1.0),
        }
    }
}

impl OptimizerConfig {
    /// Checks every value; the error names the key.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if !(self.lr >= 0.0 && self.lr.is_finite()) {
            return Err(invalid(
                "optimizer.lr",
                format!("must be a non-negative number, got {}", self.lr),
            ));
        }
        for (key, b) in [
            ("optimizer.beta1", self.beta1),
            ("optimizer.beta2", self.beta2),
        ] {
            if !(0.0..1.0).contains(&b) {
                return Err(invalid(key, format!("must be in [0, 1), got {b}")));
            }
        }
        if !(self.eps > 0.0 && self.eps.is_finite()) {
            return Err(invalid(
                "optimizer.eps",
                format!("must be a positive number, got {}", self.eps),
            ));
        }
        if !(self.weight_decay >= 0.0 && self.weight_decay.is_finite()) {
            return Err(invalid(
                "optimizer.weight_decay",
                format!("must be a non-negative number, got {}", self.weight_decay),
            ));
        }
        if let Some(c) = self.grad_clip {
            if !(c > 0.0 && c.is_finite()) {
                return Err(invalid(
                    "optimizer.grad_clip",
                    format!(
                        "must be a positive number (clipping off: `--grad-clip 0` on the \
                         command line), got {c}"
                    ),
                ));
            }
        }
        Ok(())
    }
}

/// Learning-rate schedule: linear warmup to the peak, then cosine decay to a floor.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ScheduleConfig {
    /// Steps of linear warmup (0: start at the peak).
    pub warmup_steps: u64,
    /// The step at which the cosine reaches the floor; the rate stays there after it.
    pub total_steps: u64,
    /// The floor as a fraction of the peak, in `[0, 1]`.
    pub min_lr_ratio: f32,
}

impl Default for ScheduleConfig {
    fn default() -> Self {
        ScheduleConfig {
            warmup_steps: 0,
            total_steps: 1,
            min_lr_ratio: 0.1,
        }
    }
}

impl ScheduleConfig {
    /// Checks every value; the error names the key.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.total_steps == 0 {
            return Err(invalid("schedule.total_steps", "must be at least 1, got 0"));
        }
        if self.warmup_steps > self.total_steps {
            return Err(invalid(
                "schedule.warmup_steps",
                format!(
                    "must be <= schedule.total_steps ({}), got {}",
                    self.total_steps, self.warmup_steps
                ),
            ));
        }
        if !(0.0..=1.0).contains(&self.min_lr_ratio) {
            return Err(invalid(
                "schedule.min_lr_ratio",
                format!("must be in [0, 1], got {}", self.min_lr_ratio),
            ));
        }
        Ok(())
    }

    /// The learning rate of optimizer step `step` (0-based) for peak rate `peak`:
    ///
    /// ```text
    /// step < warmup:           peak · (step + 1) / warmup
    /// warmup <= step < total:  floor + (peak - floor) · (1 + cos(π · progress)) / 2,
    ///                          progress = (step - warmup) / (total - warmup)
    /// step >= total:           floor = peak · min_lr_ratio
    /// ```
    pub fn lr(&self, peak: f32, step: u64) -> f32 {
        let floor = peak as f64 * self.min_lr_ratio as f64;
        let peak = peak as f64;
        let lr = if step < self.warmup_steps {
            peak * (step + 1) as f64 / self.warmup_steps as f64
        } else if step >= self.total_steps {
            floor
        } else {
            let span = (self.total_steps - self.warmup_steps) as f64;
            let progress = (step - self.warmup_steps) as f64 / span;
            floor + (peak - floor) * 0.5 * (1.0 + (std::f64::consts::PI * progress).cos())
        };
        lr as f32
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A valid `[model]` table with `key = value` set (replacing or adding the key).
    fn model_toml_with(key: &str, value: &str) -> String {
        let mut keys = vec![
            ("vocab_size", "100"),
            ("context_length", "16"),
            ("d_model", "32"),
            ("n_layer", "2"),
            ("n_head", "4"),
        ];
        keys.retain(|(k, _)| *k != key);
        keys.push((key, value));
        let lines: Vec<String> = keys.iter().map(|(k, v)| format!("{k} = {v}\n")).collect();
        format!("[model]\n{}", lines.concat())
    }

    fn model_toml(extra: &str) -> String {
        format!("{}{extra}", model_toml_with("n_layer", "2"))
    }

    #[test]
    fn step_gemms_forward_products_are_the_counted_weight_flops() {
        // One block and the LM head: the forward products are a third of the weights'
        // training FLOPs that `training_flops_per_token` counts (forward + 2x backward).
        let mut cfg = ModelConfig::andrea_120m();
        cfg.n_layer = 1;
        let (tokens, seq) = (4 * 256, 256);
        let v = cfg.vocab_size;
        let fwd: f64 = step_gemms(tokens, cfg.d_model, cfg.mlp_dim(), v)
            .iter()
            .filter(|g| g.name.starts_with("fwd_"))
            .map(|g| 2.0 * (g.m * g.k * g.n) as f64)
            .sum();
        let attention = 6.0 * (cfg.d_model * (seq + 1)) as f64;
        let weights = cfg.training_flops_per_token(seq) - attention;
        assert_eq!(3.0 * fwd / tokens as f64, weights);
        let all = step_gemms(tokens, 768, 3072, 8512);
        assert_eq!(all.len(), 11);
        // Every weight gradient reduces over the tokens; every dX keeps them as rows.
        for g in &all {
            assert_eq!(g.name.contains("_dw"), g.k == tokens, "{}", g.name);
        }
    }

    #[test]
    fn shipped_configs_parse_and_andrea_120m_has_the_documented_size() {
        let root = concat!(env!("CARGO_MANIFEST_DIR"), "/../../configs");
        let big = Config::from_toml_file(format!("{root}/andrea-120m.toml")).unwrap();
        assert_eq!(big.model, ModelConfig::andrea_120m());
        assert_eq!(big.model.param_count(), 92_331_264);
        let flops = big.model.training_flops_per_token(256);
        assert!((flops / 1e6 - 563.0).abs() < 1.0, "{flops}");
        let tiny = Config::from_toml_file(format!("{root}/tiny.toml")).unwrap();
        assert!(tiny.model.param_count() < 3_000_000);
    }

    #[test]
    fn unknown_keys_are_named() {
        let e = Config::from_toml_str(&model_toml("dropout = 0.1\n")).unwrap_err();
        assert!(e.to_string().contains("unknown field `dropout`"), "{e}");
        let e = Config::from_toml_str(&format!("{}[optimiser]\nlr = 1.0\n", model_toml("")))
            .unwrap_err();
        assert!(e.to_string().contains("unknown field `optimiser`"), "{e}");
        let e = Config::from_toml_str(&format!(
            "{}[optimizer]\nlearning_rate = 1\n",
            model_toml("")
        ))
        .unwrap_err();
        assert!(
            e.to_string().contains("unknown field `learning_rate`"),
            "{e}"
        );
    }

    #[test]
    fn bad_values_name_their_key() {
        for (key, value) in [
            ("n_head", "5"),
            ("d_model", "0"),
            ("mlp_dim", "0"),
            ("layer_norm_eps", "0.0"),
            ("eos_token_id", "100"),
        ] {
            let e = Config::from_toml_str(&model_toml_with(key, value)).unwrap_err();
            assert!(
                e.to_string().contains(&format!("`model.{key}`")),
                "{key}: {e}"
            );
        }
        let e = Config::from_toml_str(&format!("{}[optimizer]\nbeta2 = 1.0\n", model_toml("")))
            .unwrap_err();
        assert!(e.to_string().contains("`optimizer.beta2`"), "{e}");
        let e = Config::from_toml_str(&format!(
            "{}[schedule]\nwarmup_steps = 10\ntotal_steps = 5\n",
            model_toml("")
        ))
        .unwrap_err();
        assert!(e.to_string().contains("`schedule.warmup_steps`"), "{e}");
    }

    #[test]
    fn toml_round_trip() {
        let cfg = Config::from_toml_str(&model_toml("mlp_dim = 48\n")).unwrap();
        assert_eq!(Config::from_toml_str(&cfg.to_toml_string()).unwrap(), cfg);
    }

    #[test]
    fn schedule_warms_up_then_decays_to_the_floor() {
        let s = ScheduleConfig {
            warmup_steps: 10,
            total_steps: 110,
            min_lr_ratio: 0.1,
        };
        let close = |a: f32, b: f32| (a - b).abs() <= 1e-6 * b.abs().max(1e-3);
        assert!(close(s.lr(1.0, 0), 0.1));
        assert!(close(s.lr(1.0, 9), 1.0));
        assert!(close(s.lr(1.0, 10), 1.0));
        assert!(close(s.lr(1.0, 60), 0.55)); // half way: mean of peak and floor
        assert!(close(s.lr(1.0, 110), 0.1));
        assert!(close(s.lr(1.0, 10_000), 0.1));
        let mut prev = f32::INFINITY;
        for step in 10..=110 {
            let lr = s.lr(1.0, step);
            assert!(lr <= prev + 1e-7);
            prev = lr;
        }
    }
}
