//! Generation: prefill the prompt into a KV cache, then sample one token at a time.

use andrea_core::Backend;

use super::sample::Sampler;
use crate::error::{ModelError, Result};
use crate::model::Model;

impl<B: Backend> Model<B> {
    /// Generates `max_new_tokens` tokens after `prompt` (non-empty) and returns them.
    /// `prompt.len() + max_new_tokens - 1` must not exceed the context length (the last
    /// token is sampled, never fed back).
    pub fn generate(
        &self,
        prompt: &[u32],
        max_new_tokens: usize,
        sampler: &mut Sampler,
    ) -> Result<Vec<u32>> {
        let mut out = self.generate_batch(&[prompt], max_new_tokens, sampler)?;
        Ok(out.pop().unwrap_or_default())
    }

    /// [`Model::generate`] for several prompts of equal length at once (one batch); the
    /// sampler draws for the sequences in order at each position.
    pub fn generate_batch(
        &self,
        prompts: &[&[u32]],
        max_new_tokens: usize,
        sampler: &mut Sampler,
    ) -> Result<Vec<Vec<u32>>> {
        let len = prompts.first().map_or(0, |p| p.len());
        if len == 0 || prompts.iter().any(|p| p.len() != len) {
            return Err(ModelError::batch(
                "generate",
                format!(
                    "need non-empty prompts of one length, got lengths {:?}",
                    prompts.iter().map(|p| p.len()).collect::<Vec<_>>()
                ),
            ));
        }
        let batch = prompts.len();
        let mut out = vec![Vec::with_capacity(max_new_tokens); batch];
        if max_new_tokens == 0 {
            return Ok(out);
        }
        let needed = len + max_new_tokens - 1;
        let context = self.config().context_length;
        if needed > context {
            return Err(ModelError::SequenceTooLong {
                len: needed,
                context,
            });
        }
        let mut cache = self.kv_cache(batch, needed)?;
        let flat: Vec<u32> = prompts.concat();
        let vocab = self.config().vocab_size;
        let mut next = vec![0u32; batch];
        let mut logits = self.extend(&mut cache, &flat)?;
        for i in 0..max_new_tokens {
            for (b, id) in next.iter_mut().enumerate() {
                *id = sampler.sample(&logits[b * vocab..(b + 1) * vocab]);
                out[b].push(*id);
            }
            if i + 1 < max_new_tokens {
                logits = self.extend(&mut cache, &next)?;
            }
        }
        Ok(out)
    }
}
