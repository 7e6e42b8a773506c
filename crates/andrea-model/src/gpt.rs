//! The GPT, top to bottom, in one place: [`forward`] owns the stack that training
//! ([`crate::Trainer`]), evaluation ([`crate::Evaluator`]) and KV-cache generation
//! ([`crate::KvCache`]) all run.
//!
//! ```text
//! x      = wte[ids] + wpe[pos..]                    [B, T, C]
//! ln     = ln_1 of block 0 (x)                      the one LayerNorm not fused
//! for each block l:
//!     x, ln = block_l(x, ln)                        ends with the next LayerNorm:
//!                                                   block l+1's ln_1, or ln_f
//! logits = ln · wteᵀ                                tied output layer, [rows, Vp]
//! ```
//!
//! What differs between the callers is behind [`Activations`]: where each block's
//! activations live (kept per block for the backward pass, or one scratch set shared
//! by every block), what the attention reads (the block's own keys, or a KV cache), and
//! which rows get logits (all of them, or the last position of each sequence).

use andrea_core::{Backend, Ids, Mat, ModelConfig, Tensor, IGNORE_INDEX};

use crate::block::{self, BlockActs, HeadsView, LayerNormOut, Qkv};
use crate::error::{ModelError, Result};
use crate::infer::KvAppend;
use crate::model::Model;

/// Where one forward pass keeps its activations, and its attention.
pub(crate) trait Activations<'a, B: Backend> {
    /// `[B, T, C]`: the embedding's output, which is block 0's `x`.
    fn encoded(&self) -> Tensor<'a, B>;

    /// Block `l`'s activations; block `l + 1`'s `x` is block `l`'s `residual_3`.
    fn block(&self, l: usize) -> Result<BlockActs<'a, B>>;

    /// Where `ln_f` (the LayerNorm after the last block) writes.
    fn ln_f(&self) -> LayerNormOut<'a, B>;

    /// The KV cache block `l`'s attention appends its keys and values to and reads
    /// from (generation), or `None`: the attention over the block's own keys.
    fn kv(&self) -> Option<&KvAppend<'a, B>> {
        None
    }

    /// The rows of `ln_f` that get logits and where their logits go (`[rows, Vp]`), or
    /// `None` for no logits.
    fn logits(&self) -> Option<(Mat<'a, B>, Mat<'a, B>)>;
}

/// The forward pass of `model` over `ids` (`[B·T]`, at positions `pos..pos + T`), into
/// `acts`: from the embedding to the logits.
pub(crate) fn forward<'a, B: Backend + 'a>(
    model: &Model<B>,
    ids: Ids<'_, B>,
    pos: usize,
    acts: &impl Activations<'a, B>,
) -> Result<()>
where
    B::Buffer: 'a,
{
    let (be, cfg) = (model.backend(), model.config());
    let (layout, params) = (model.layout(), model.buffer());
    let eps = cfg.layer_norm_eps;
    let wte = layout.wte_padded.on(params);
    be.embedding(ids, wte, layout.wpe.on(params), acts.encoded(), pos)?;
    // The first LayerNorm is not fused: nothing before it writes the residual stream.
    let (mut p, mut a) = (layout.layer(params, 0), acts.block(0)?);
    p.ln_1.forward(be, a.x, &a.ln_1, eps)?;
    // Generation hands all the blocks to the backend at once (`decode_blocks`), so that
    // it can run them as one job; training and evaluation run them one by one.
    let (ln_f, ln_f_out) = (layout.ln_f(params), acts.ln_f());
    let mut decode = Vec::with_capacity(if acts.kv().is_some() { cfg.n_layer } else { 0 });
    for l in 0..cfg.n_layer {
        // Fusion across blocks: the block's last residual add feeds the LayerNorm after
        // it, the next block's ln_1 or ln_f. (Each block's views are made once: for a
        // decoded token of a small model they are a part of its serial work.)
        let following = if l + 1 < cfg.n_layer {
            Some((layout.layer(params, l + 1), acts.block(l + 1)?))
        } else {
            None
        };
        let (next, next_out) = match &following {
            Some((p1, a1)) => (&p1.ln_1, &a1.ln_1),
            None => (&ln_f, &ln_f_out),
        };
        match acts.kv() {
            Some(kv) => decode.push(block::decode_block(&p, &a, kv.layer(l), (next, next_out))),
            None => {
                let attention = |qkv: &_, atty: &_, ws| self_attention(be, qkv, atty, ws);
                block::forward(be, &p, &a, (next, next_out), eps, attention)?
            }
        }
        if let Some((p1, a1)) = following {
            (p, a) = (p1, a1);
        }
    }
    if !decode.is_empty() {
        be.decode_blocks(&decode, eps)?;
    }
    if let Some((ln_f, logits)) = acts.logits() {
        // Tied output layer: logits = ln_f · wteᵀ over the padded vocabulary.
        be.matmul(ln_f, wte.mat().t(), None, logits)?;
    }
    Ok(())
}

/// Causal attention over the block's own keys from position 0 (training, evaluation).
fn self_attention<B: Backend>(
    be: &B,
    qkv: &Qkv<'_, B>,
    atty: &HeadsView<'_, B>,
    workspace: Tensor<'_, B>,
) -> Result<()> {
    Ok(be.attention_forward(qkv.q, qkv.k, qkv.v, atty.heads, workspace, 0)?)
}

/// Checks the shape an arena is sized for: `batch` sequences of `seq` tokens, both at
/// least 1, `seq` within the context; `what` names the caller.
pub(crate) fn check_shape(
    cfg: &ModelConfig,
    what: &'static str,
    batch: usize,
    seq: usize,
) -> Result<()> {
    if seq == 0 || batch == 0 {
        return Err(ModelError::batch(
            what,
            format!("batch and seq must be at least 1, got batch {batch}, seq {seq}"),
        ));
    }
    let context = cfg.context_length;
    if seq > context {
        return Err(ModelError::SequenceTooLong { len: seq, context });
    }
    Ok(())
}

/// Checks a batch of `[b, seq]` tokens and next-token targets against a buffer sized
/// for `max_batch` sequences (`owner` names it in the message) and returns `b` and the
/// number of targets that count (not [`IGNORE_INDEX`], at least one).
pub(crate) fn check_batch(
    cfg: &ModelConfig,
    owner: &str,
    (max_batch, seq): (usize, usize),
    tokens: &[u32],
    targets: &[u32],
) -> Result<(usize, usize)> {
    let vocab = cfg.vocab_size;
    if tokens.is_empty() || !tokens.len().is_multiple_of(seq) || tokens.len() > max_batch * seq {
        return Err(ModelError::batch(
            "forward",
            format!(
                "got {} tokens; need whole sequences of {seq} tokens, at most {max_batch} of them \
                 (the {owner}'s batch x seq)",
                tokens.len()
            ),
        ));
    }
    if targets.len() != tokens.len() {
        return Err(ModelError::batch(
            "forward",
            format!("got {} tokens but {} targets", tokens.len(), targets.len()),
        ));
    }
    if let Some(index) = tokens.iter().position(|&t| t as usize >= vocab) {
        return Err(ModelError::TokenOutOfRange {
            arg: "tokens",
            index,
            value: tokens[index],
            vocab,
        });
    }
    if let Some(index) = targets
        .iter()
        .position(|&t| t != IGNORE_INDEX && t as usize >= vocab)
    {
        return Err(ModelError::TokenOutOfRange {
            arg: "targets",
            index,
            value: targets[index],
            vocab,
        });
    }
    let counted = targets.iter().filter(|&&t| t != IGNORE_INDEX).count();
    if counted == 0 {
        return Err(ModelError::batch("forward", "every target is IGNORE_INDEX"));
    }
    Ok((tokens.len() / seq, counted))
}

/// The cross-entropy of `logits: [N, Vp]` against `targets: [N]`, per row into `losses`
/// (with `dlogits`, the loss's gradient `(softmax - onehot) / counted` replaces the
/// logits in the same pass), queued, not waited for: [`read_mean_loss`] reads it.
pub(crate) fn queue_loss<B: Backend>(
    be: &B,
    vocab: usize,
    logits: Tensor<'_, B>,
    targets: Ids<'_, B>,
    losses: Tensor<'_, B>,
    counted: usize,
    dlogits: bool,
) -> Result<()> {
    if dlogits {
        let scale = 1.0 / counted as f32;
        be.softmax_cross_entropy(logits, targets, vocab, losses, Some(logits), scale)?;
    } else {
        be.softmax_cross_entropy(logits, targets, vocab, losses, None, 1.0)?;
    }
    Ok(())
}

/// The mean loss over the `counted` targets that count: downloads `losses` into `host`
/// (`N` floats; a wait for the device) and sums them in float64.
pub(crate) fn read_mean_loss<B: Backend>(
    be: &B,
    losses: Tensor<'_, B>,
    counted: usize,
    host: &mut [f32],
) -> Result<f64> {
    be.download(losses, host)?;
    Ok(mean_loss(host, counted))
}

/// The mean of per-token `losses` over the `counted` non-ignored targets (summed in f64).
pub(crate) fn mean_loss(losses: &[f32], counted: usize) -> f64 {
    let sum: f64 = losses.iter().map(|&l| l as f64).sum();
    sum / counted as f64
}
