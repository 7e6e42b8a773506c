//! Inference with a KV cache: [`KvCache`] keeps every block's keys and values of the
//! positions seen so far, so each new token costs one pass over the weights instead of
//! a pass over the whole sequence.
//!
//! [`Model::extend`] feeds the next tokens of every sequence in the batch (a whole prompt
//! at first, then one token at a time) and returns the logits of the last position.
//! Long inputs are processed in chunks of [`PREFILL_CHUNK`] positions, which bounds the
//! scratch memory; the attention of a chunk sees the cache before it through
//! `pos_offset`, so the result does not depend on the chunking.

use andrea_core::{AttentionShape, Backend, Heads, HeadsOf, Matrix, ModelConfig, View};

use crate::arena::{Act, Arena};
use crate::error::{ModelError, Result};
use crate::gpt::{self, Activations};
use crate::memory::MemoryPlan;
use crate::model::Model;
use crate::scratch::ScratchSlots;

/// The most positions processed by one pass of [`Model::extend`].
pub const PREFILL_CHUNK: usize = 256;

/// Scratch activations of one chunk (shared by every block).
#[derive(Debug)]
pub(crate) struct CacheSlots {
    /// Positions per chunk.
    pub chunk: usize,
    blocks: ScratchSlots,
    /// The logits of the last position of each sequence, `[B, Vp]`.
    logits: Act,
    /// Floats of scratch, and of keys and values (`[n_layer, B, max_len, 2C]`).
    pub len: usize,
    pub kv_len: usize,
    /// Floats of product scratch the backend takes (`crate::memory::forward_scratch`).
    pub scratch: usize,
}

impl CacheSlots {
    /// The scratch of a cache for `batch` sequences of up to `max_len` positions.
    pub fn new<B: Backend>(be: &B, cfg: &ModelConfig, batch: usize, max_len: usize) -> Self {
        let chunk = max_len.min(PREFILL_CHUNK);
        // A pass runs 1..=chunk new positions over at most max_len keys; the backend's
        // workspace may depend on the row count in any way (the CUDA backend's decode
        // kernels keep per-chunk partials for a few rows only), and grows with the keys.
        let workspace_len = (1..=chunk)
            .map(|q_len| {
                be.attention_workspace_len(AttentionShape {
                    batch,
                    heads: cfg.n_head,
                    head_dim: cfg.head_dim(),
                    q_len,
                    k_len: max_len,
                })
            })
            .max()
            .unwrap_or(0)
            .max(1);
        let mut a = Arena::default();
        let blocks = ScratchSlots::new(&mut a, cfg, batch * chunk, workspace_len);
        let logits = a.take(batch, cfg.padded_vocab_size());
        CacheSlots {
            chunk,
            blocks,
            logits,
            len: a.len,
            kv_len: 2 * cfg.n_layer * batch * max_len * cfg.d_model,
            // Chunks of 1..=chunk positions per sequence; logits for the last one only.
            scratch: crate::memory::forward_scratch(
                be,
                cfg,
                (1..=chunk).map(|cn| batch * cn),
                [batch],
            ),
        }
    }
}

/// Keys and values of `batch` sequences of up to `max_len` positions, plus the scratch
/// of a forward pass. Made by [`Model::kv_cache`].
pub struct KvCache<B: Backend> {
    config: ModelConfig,
    batch: usize,
    max_len: usize,
    chunk: usize,
    pos: usize,
    /// Keys and values, laid out as the backend prefers (`AttentionOps::kv_heads_apart`):
    /// `[n_layer, B, max_len, 2C]`, at each position the keys, then the values, as they
    /// lie in the QKV projection (its last two thirds), so one copy appends both; or with
    /// heads apart `[n_layer, 2, B, H, max_len, D]`, so that one head's cached keys (and
    /// values) are one run (the CPU backend).
    kv: B::Buffer,
    heads_apart: bool,
    slots: CacheSlots,
    scratch: B::Buffer,
    ids: B::IdBuffer,
    host_ids: Vec<u32>,
    host_padded: Vec<f32>,
    host_logits: Vec<f32>,
}

impl<B: Backend> KvCache<B> {
    /// Positions cached so far (the same for every sequence of the batch).
    pub fn len(&self) -> usize {
        self.pos
    }

    pub fn is_empty(&self) -> bool {
        self.pos == 0
    }

    pub fn batch(&self) -> usize {
        self.batch
    }

    /// The most positions the cache holds.
    pub fn capacity(&self) -> usize {
        self.max_len
    }

    /// The memory this cache holds on the device, with the model's parameters.
    pub fn memory(&self) -> MemoryPlan {
        MemoryPlan::generation_of(&self.config, &self.slots, self.batch)
    }

    /// Forgets every position (the buffers are kept).
    pub fn reset(&mut self) {
        self.pos = 0;
    }

    /// Keys (`which = 0`) or values (`1`) of block `l`, positions `0..seq`.
    fn heads(&self, l: usize, which: usize, seq: usize) -> Heads<'_, B::Buffer> {
        let (c, heads) = (self.config.d_model, self.config.n_head);
        let d = c / heads;
        if self.heads_apart {
            let per_batch = self.max_len * c;
            return Heads {
                buf: &self.kv,
                offset: (2 * l + which) * self.batch * per_batch,
                batch: self.batch,
                seq,
                heads,
                head_dim: d,
                batch_stride: per_batch,
                seq_stride: d,
                head_stride: self.max_len * d,
            };
        }
        let per_batch = self.max_len * 2 * c;
        Heads {
            buf: &self.kv,
            offset: l * self.batch * per_batch + which * c,
            batch: self.batch,
            seq,
            heads,
            head_dim: d,
            batch_stride: per_batch,
            seq_stride: 2 * c,
            head_stride: d,
        }
    }
}

impl<B: Backend> Model<B> {
    /// A KV cache for `batch` sequences of up to `max_len` positions
    /// (`max_len <= context_length`).
    pub fn kv_cache(&self, batch: usize, max_len: usize) -> Result<KvCache<B>> {
        let cfg = self.config();
        if batch == 0 || max_len == 0 {
            return Err(ModelError::batch(
                "kv_cache",
                format!("batch and max_len must be at least 1, got {batch} and {max_len}"),
            ));
        }
        if max_len > cfg.context_length {
            return Err(ModelError::SequenceTooLong {
                len: max_len,
                context: cfg.context_length,
            });
        }
        let be = self.backend();
        // Generation streams the weights for every token: a backend that decodes from a
        // BF16 copy makes it now (once: a kept copy stays until the weights change).
        be.keep_bf16_weights(View::whole(self.buffer()))?;
        let slots = CacheSlots::new(be, cfg, batch, max_len);
        let (chunk, bc) = (slots.chunk, batch * slots.chunk);
        Ok(KvCache {
            config: cfg.clone(),
            batch,
            max_len,
            chunk,
            pos: 0,
            kv: be.alloc(slots.kv_len)?,
            heads_apart: be.kv_heads_apart(),
            scratch: be.alloc(slots.len)?,
            slots,
            ids: be.alloc_ids(bc)?,
            host_ids: vec![0; bc],
            host_padded: vec![0.0; batch * cfg.padded_vocab_size()],
            host_logits: vec![0.0; batch * cfg.vocab_size],
        })
    }

    /// Feeds the next `tokens.len() / batch` tokens of every sequence (`tokens` is
    /// `[batch, n]` row-major) and returns the logits after the last of them,
    /// `[batch, vocab_size]`. The first call is the prompt (prefill), later calls
    /// usually one token per sequence.
    pub fn extend<'c>(&self, cache: &'c mut KvCache<B>, tokens: &[u32]) -> Result<&'c [f32]> {
        self.feed(cache, tokens)?;
        let be = self.backend();
        let logits = cache.slots.logits.rows(&cache.scratch, cache.batch);
        let (v, vp) = (self.config().vocab_size, self.config().padded_vocab_size());
        if cache.batch == 1 {
            // One row: its first `v` logits straight into place (a decoded token of a
            // small model spends ~1 µs on each 34 kB copy).
            be.download(logits.slice(0, [v]), &mut cache.host_logits[..v])?;
            return Ok(&cache.host_logits);
        }
        be.download(logits, &mut cache.host_padded)?;
        for b in 0..cache.batch {
            cache.host_logits[b * v..(b + 1) * v]
                .copy_from_slice(&cache.host_padded[b * vp..b * vp + v]);
        }
        Ok(&cache.host_logits)
    }

    /// [`Model::extend`], but each sequence's logits (`[vocab_size]`) go to `f(b, logits)`
    /// in order instead of being returned: read in place where the backend's memory is
    /// the host's (the CPU backend), so nothing is copied; downloaded first otherwise.
    /// Sampling inside `f` saves a decoded token the copy of its logits (34 kB at the
    /// tiny model's vocabulary).
    pub fn extend_with(
        &self,
        cache: &mut KvCache<B>,
        tokens: &[u32],
        mut f: impl FnMut(usize, &[f32]),
    ) -> Result<()> {
        self.feed(cache, tokens)?;
        let be = self.backend();
        let (v, vp) = (self.config().vocab_size, self.config().padded_vocab_size());
        let logits = cache.slots.logits.rows(&cache.scratch, cache.batch);
        for b in 0..cache.batch {
            let row = logits.slice(b * vp, [v]);
            if !be.with_host_elements(row, &mut |x| f(b, x))? {
                let host = &mut cache.host_logits[..v];
                be.download(row, host)?;
                f(b, host);
            }
        }
        Ok(())
    }

    /// [`Model::extend`] up to the logits, which stay in `cache`'s scratch.
    fn feed(&self, cache: &mut KvCache<B>, tokens: &[u32]) -> Result<()> {
        let cfg = self.config();
        if cache.config != *cfg {
            return Err(ModelError::State(
                "extend: the KV cache was made for a model of another config".into(),
            ));
        }
        let batch = cache.batch;
        if tokens.is_empty() || !tokens.len().is_multiple_of(batch) {
            return Err(ModelError::batch(
                "extend",
                format!(
                    "got {} tokens for a cache of {batch} sequences: need the same number (>= 1) for each",
                    tokens.len()
                ),
            ));
        }
        if let Some(index) = tokens.iter().position(|&t| t as usize >= cfg.vocab_size) {
            return Err(ModelError::TokenOutOfRange {
                arg: "tokens",
                index,
                value: tokens[index],
                vocab: cfg.vocab_size,
            });
        }
        let n_new = tokens.len() / batch;
        if cache.pos + n_new > cache.max_len {
            return Err(ModelError::batch(
                "extend",
                format!(
                    "{} cached + {n_new} new positions exceed the cache's capacity of {} \
                     (make it with a larger max_len, at most the context length {})",
                    cache.pos, cache.max_len, cfg.context_length
                ),
            ));
        }
        let mut pos = cache.pos;
        let mut start = 0;
        while start < n_new {
            let cn = cache.chunk.min(n_new - start);
            for b in 0..batch {
                let src = &tokens[b * n_new + start..b * n_new + start + cn];
                cache.host_ids[b * cn..(b + 1) * cn].copy_from_slice(src);
            }
            let last_chunk = start + cn == n_new;
            self.chunk_forward(cache, pos, cn, last_chunk)?;
            pos += cn;
            start += cn;
        }
        cache.pos = pos;
        Ok(())
    }

    /// One chunk of `cn` positions per sequence starting at `pos`, ids in
    /// `cache.host_ids`; with `head`, also the logits of its last position.
    fn chunk_forward(
        &self,
        cache: &mut KvCache<B>,
        pos: usize,
        cn: usize,
        head: bool,
    ) -> Result<()> {
        let (be, cfg) = (self.backend(), self.config());
        let bc = cache.batch * cn;
        let ids = View::new(&cache.ids, 0, [bc]);
        be.upload_ids(&cache.host_ids[..bc], ids)?;
        let shape = AttentionShape {
            batch: cache.batch,
            heads: cfg.n_head,
            head_dim: cfg.head_dim(),
            q_len: cn,
            k_len: pos + cn,
        };
        let ws_len = be.attention_workspace_len(shape).max(1);
        let s = &cache.slots;
        if ws_len > s.blocks.workspace_len {
            return Err(ModelError::State(format!(
                "extend: the backend asks for {ws_len} floats of attention workspace, the cache has {}",
                s.blocks.workspace_len
            )));
        }
        let mut acts = s.blocks.on(&cache.scratch, cache.batch, cn, ws_len);
        acts.kv = Some(KvAppend {
            cache: &*cache,
            pos,
            cn,
        });
        if head {
            // ln_f of the last position of each sequence: rows cn-1, 2cn-1, ... of the
            // LayerNorm the last block wrote.
            let (ln_f, c) = (acts.ln_f().out, cfg.d_model);
            let last = Matrix {
                buf: ln_f.buf,
                offset: ln_f.offset + (cn - 1) * c,
                batch: 1,
                rows: cache.batch,
                cols: c,
                batch_stride: 0,
                row_stride: cn * c,
                col_stride: 1,
            };
            let logits = s.logits.rows(&cache.scratch, cache.batch);
            acts.logits = Some((last, logits.mat()));
        }
        gpt::forward(self, ids, pos, &acts)
    }
}

/// The attention of one chunk of `cn` positions from `pos` over a KV cache.
pub(crate) struct KvAppend<'a, B: Backend> {
    cache: &'a KvCache<B>,
    pos: usize,
    cn: usize,
}

impl<'a, B: Backend> KvAppend<'a, B> {
    /// Layer `l`'s cached keys and values as the chunk's attention sees them: positions
    /// `0..pos + cn`, the chunk's own (`pos..`) written by the op that reads them.
    pub fn layer(&self, l: usize) -> (HeadsOf<'a, B>, HeadsOf<'a, B>) {
        let end = self.pos + self.cn;
        (self.cache.heads(l, 0, end), self.cache.heads(l, 1, end))
    }
}

impl<B: Backend> std::fmt::Debug for KvCache<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KvCache")
            .field("batch", &self.batch)
            .field("len", &self.pos)
            .field("capacity", &self.max_len)
            .finish()
    }
}
