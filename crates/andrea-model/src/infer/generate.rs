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
        // Fed first the prompts, then each sequence's last token; sampled where the
        // logits lie (`extend_with`).
        let mut fed: Vec<u32> = prompts.concat();
        for i in 0..max_new_tokens {
            self.extend_with(&mut cache, &fed, |b, logits| {
                out[b].push(sampler.sample(logits))
            })?;
            if i + 1 < max_new_tokens {
                fed.clear();
                fed.extend(out.iter().map(|o| o[o.len() - 1]));
            }
        }
        Ok(out)
    }
}
