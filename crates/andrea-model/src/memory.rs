//! [`MemoryPlan`]: the device memory of training, evaluation and generation, by role,
//! from the same code that sizes the buffers (so it is what they allocate).

use andrea_core::config::step_gemms;
use andrea_core::{Backend, ModelConfig};

use crate::eval::EvalSlots;
use crate::infer::CacheSlots;
use crate::layout::ParamLayout;
use crate::train::TrainSlots;

/// Device memory in bytes, by role. Roles a use does not have are 0 (an evaluator has
/// no gradients, a KV cache no AdamW moments).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemoryPlan {
    pub parameters: usize,
    pub gradients: usize,
    /// AdamW's two moment buffers.
    pub optimizer: usize,
    /// The activation arena: for training everything the backward pass reads and its
    /// scratch; for evaluation and generation one block's scratch, reused by every block.
    pub activations: usize,
    /// Generation: every block's keys and values.
    pub kv_cache: usize,
    /// Token and target ids.
    pub ids: usize,
    /// The backend's own scratch for the products (the CUDA backend's split-K
    /// workspace, up to 209 MB for the LM head's weight gradient at 16 × 1024 tokens):
    /// the largest any product asks for ([`andrea_core::LinalgOps::matmul_scratch_len`]),
    /// since one buffer is reused. Evaluation and generation count their forward
    /// products at every row count they can run (a short last batch, a short prefill
    /// chunk, one decode row per sequence): few rows and K = 4·C (the MLP's second
    /// linear) is where the plan splits K.
    pub scratch: usize,
}

const F32: usize = 4;

/// Floats of scratch the largest of a training step's products over `tokens` rows asks
/// `backend` for.
fn step_scratch<B: Backend>(backend: &B, config: &ModelConfig, tokens: usize) -> usize {
    let (c, v) = (config.d_model, config.padded_vocab_size());
    step_gemms(tokens, c, config.mlp_dim(), v)
        .iter()
        .map(|g| backend.matmul_scratch_len(g.m, g.k, g.n))
        .max()
        .unwrap_or(0)
}

/// Floats of scratch the largest forward product asks `backend` for: the block's four
/// at each of `block_rows`, the LM head at each of `head_rows`.
pub(crate) fn forward_scratch<B: Backend>(
    backend: &B,
    config: &ModelConfig,
    block_rows: impl IntoIterator<Item = usize>,
    head_rows: impl IntoIterator<Item = usize>,
) -> usize {
    let (c, v) = (config.d_model, config.padded_vocab_size());
    let products = |m: usize, head: bool| {
        step_gemms(m, c, config.mlp_dim(), v)
            .into_iter()
            .filter(move |g| g.name.starts_with("fwd_") && (g.name == "fwd_lm_head") == head)
    };
    let block = block_rows.into_iter().flat_map(|m| products(m, false));
    let head = head_rows.into_iter().flat_map(|m| products(m, true));
    block
        .chain(head)
        .map(|g| backend.matmul_scratch_len(g.m, g.k, g.n))
        .max()
        .unwrap_or(0)
}

fn parameters(config: &ModelConfig) -> usize {
    ParamLayout::new(config).len * F32
}

impl MemoryPlan {
    /// Training (a [`crate::Trainer`]) for `config` at `batch × seq` on `backend` (its
    /// attention workspace sizes are part of the arena).
    pub fn new<B: Backend>(backend: &B, config: &ModelConfig, batch: usize, seq: usize) -> Self {
        let params = parameters(config);
        MemoryPlan {
            parameters: params,
            gradients: params,
            optimizer: 2 * params,
            activations: TrainSlots::new(backend, config, batch, seq).len * F32,
            kv_cache: 0,
            ids: 2 * batch * seq * F32,
            scratch: step_scratch(backend, config, batch * seq) * F32,
        }
    }

    /// Evaluation (an [`crate::Evaluator`], [`crate::Model::loss`]) at `batch × seq`.
    pub fn evaluation<B: Backend>(
        backend: &B,
        config: &ModelConfig,
        batch: usize,
        seq: usize,
    ) -> Self {
        Self::evaluation_of(config, &EvalSlots::new(backend, config, batch, seq))
    }

    pub(crate) fn evaluation_of(config: &ModelConfig, slots: &EvalSlots) -> Self {
        MemoryPlan {
            parameters: parameters(config),
            gradients: 0,
            optimizer: 0,
            activations: slots.len * F32,
            kv_cache: 0,
            ids: 2 * slots.batch * slots.seq * F32,
            scratch: slots.scratch * F32,
        }
    }

    /// Generation (a [`crate::KvCache`]) for `batch` sequences of up to `max_len`
    /// positions.
    pub fn generation<B: Backend>(
        backend: &B,
        config: &ModelConfig,
        batch: usize,
        max_len: usize,
    ) -> Self {
        Self::generation_of(
            config,
            &CacheSlots::new(backend, config, batch, max_len),
            batch,
        )
    }

    pub(crate) fn generation_of(config: &ModelConfig, slots: &CacheSlots, batch: usize) -> Self {
        MemoryPlan {
            parameters: parameters(config),
            gradients: 0,
            optimizer: 0,
            activations: slots.len * F32,
            kv_cache: slots.kv_len * F32,
            ids: batch * slots.chunk * F32,
            scratch: slots.scratch * F32,
        }
    }

    pub fn total(&self) -> usize {
        self.parameters
            + self.gradients
            + self.optimizer
            + self.activations
            + self.kv_cache
            + self.ids
            + self.scratch
    }
}

impl std::fmt::Display for MemoryPlan {
    /// `92.1 MiB (parameters 7.3, gradients 7.3, AdamW moments 14.6, activations 62.9)`;
    /// roles of 0 bytes are left out, ids count with the activations.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mib = |b: usize| b as f64 / (1024.0 * 1024.0);
        write!(
            f,
            "{:.1} MiB (parameters {:.1}",
            mib(self.total()),
            mib(self.parameters)
        )?;
        let roles = [
            ("gradients", self.gradients),
            ("AdamW moments", self.optimizer),
            ("activations", self.activations + self.ids),
            ("KV cache", self.kv_cache),
            ("product scratch", self.scratch),
        ];
        for (name, bytes) in roles {
            if bytes > 0 {
                write!(f, ", {name} {:.1}", mib(bytes))?;
            }
        }
        write!(f, ")")
    }
}
