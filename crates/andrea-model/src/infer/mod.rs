//! Inference: the KV cache, generation and sampling.

mod cache;
mod generate;
mod sample;

pub(crate) use cache::{CacheSlots, KvAppend};
pub use cache::{KvCache, PREFILL_CHUNK};
pub use sample::Sampler;
