//! Helpers shared by the integration tests.
#![allow(dead_code)]

use andrea_core::ModelConfig;

/// Deterministic pseudo-random token ids in `0..vocab` (test data only).
pub fn tokens(n: usize, vocab: usize, seed: u64) -> Vec<u32> {
    andrea_testkit::random::Rand::new(seed).ids(n, vocab)
}

/// A small config that runs in milliseconds: vocabulary 70 (padded to 128), context 32,
/// d_model 32, 2 blocks of 4 heads.
pub fn small() -> ModelConfig {
    ModelConfig::new(70, 32, 32, 2, 4)
}

/// The shipped tiny config (`configs/tiny.toml`).
pub fn tiny() -> ModelConfig {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../configs/tiny.toml");
    andrea_core::Config::from_toml_file(path).unwrap().model
}
