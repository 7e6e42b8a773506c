//! The forward and backward passes of a training step, over the activation arena.

use andrea_core::{AttentionShape, Backend, Heads, View, IGNORE_INDEX};

use super::{Phase, Trainer};
use crate::block::{self, Norm};
use crate::error::{ModelError, Result};

impl<B: Backend> Trainer<B> {
    /// Checks a batch and returns its number of sequences.
    fn batch_of(&self, tokens: &[u32], targets: &[u32]) -> Result<usize> {
        let (max_batch, seq) = self.shape();
        let vocab = self.model.config().vocab_size;
        if tokens.is_empty() || !tokens.len().is_multiple_of(seq) || tokens.len() > max_batch * seq
        {
            return Err(ModelError::batch(
                "forward",
                format!(
                    "got {} tokens; need whole sequences of {seq} tokens, at most {max_batch} of them \
                     (the trainer's batch x seq)",
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
        Ok(tokens.len() / seq)
    }

    fn attention_shape(&self, batch: usize) -> AttentionShape {
        AttentionShape {
            batch,
            heads: self.model.config().n_head,
            q_len: self.slots.seq,
            k_len: self.slots.seq,
        }
    }

    /// The forward pass over `tokens` (`[b, seq]` row-major, `b <= batch`) with
    /// next-token `targets` of the same shape ([`IGNORE_INDEX`] to skip a position).
    /// Returns the mean cross-entropy over the counted targets, in nats.
    pub fn forward(&mut self, tokens: &[u32], targets: &[u32]) -> Result<f32> {
        self.forward_pass(tokens, targets, false)
    }

    /// [`forward`](Self::forward) for a training step: the same loss, and in the same pass
    /// over the logits the loss's gradient with respect to them, written in their place,
    /// so [`backward`](Self::backward) starts from it. That reads the `[tokens, vocab]`
    /// logits once instead of twice and computes their exponentials once (about 4% of a
    /// tiny model's step). [`logits`](Self::logits) is not available afterwards.
    pub fn forward_train(&mut self, tokens: &[u32], targets: &[u32]) -> Result<f32> {
        self.forward_pass(tokens, targets, true)
    }

    fn forward_pass(&mut self, tokens: &[u32], targets: &[u32], dlogits: bool) -> Result<f32> {
        let b = self.batch_of(tokens, targets)?;
        let counted = targets.iter().filter(|&&t| t != IGNORE_INDEX).count();
        if counted == 0 {
            return Err(ModelError::batch("forward", "every target is IGNORE_INDEX"));
        }
        let (seq, n) = (self.slots.seq, b * self.slots.seq);
        let be = self.model.backend();
        let cfg = self.model.config();
        let (layout, params) = (self.model.layout(), self.model.buffer());
        let (s, acts) = (&self.slots, &self.acts);
        self.phase = Phase::Empty;
        be.upload_ids(tokens, View::new(&self.tokens, 0, [n]))?;
        be.upload_ids(targets, View::new(&self.targets, 0, [n]))?;

        be.embedding(
            View::new(&self.tokens, 0, [n]),
            layout.wte_padded.on(params),
            layout.wpe.on(params),
            s.encoded.btc(acts, b, seq),
            0,
        )?;
        let ws_len = be.attention_workspace_len(self.attention_shape(b)).max(1);
        let eps = cfg.layer_norm_eps;
        block::ln_1(be, &layout.layer(params, 0), &s.block::<B>(acts, 0, b), eps)?;
        for l in 0..cfg.n_layer {
            let workspace = s.blocks[l].attn_workspace.flat(acts, ws_len);
            let attention = |qkv, atty| -> Result<()> {
                let [q, k, v] = Heads::split_qkv(qkv, cfg.n_head).expect("[B, T, 3C]");
                let out = Heads::from_tensor(atty, cfg.n_head).expect("[B, T, C]");
                Ok(be.attention_forward(q, k, v, out, workspace, 0)?)
            };
            // The block's output goes through the next block's ln_1, or ln_f.
            let next = if l + 1 < cfg.n_layer {
                Norm::ln_1(&layout.layer(params, l + 1), &s.block::<B>(acts, l + 1, b))
            } else {
                Norm {
                    weight: layout.ln_f_w.on(params),
                    bias: layout.ln_f_b.on(params),
                    out: s.ln_f.rows(acts, n),
                    mean: s.ln_f_mean.flat(acts, n),
                    rstd: s.ln_f_rstd.flat(acts, n),
                }
            };
            let a = s.block::<B>(acts, l, b);
            block::forward(be, &layout.layer(params, l), &a, &next, eps, attention)?;
        }
        // Tied output layer: logits = ln_f · wteᵀ over the padded vocabulary.
        let logits = s.logits.rows(acts, n);
        be.matmul(
            s.ln_f.rows(acts, n).mat(),
            layout.wte_padded.on(params).mat().t(),
            None,
            logits.mat(),
        )?;
        let losses = s.losses.flat(acts, n);
        let targets_view = View::new(&self.targets, 0, [n]);
        if dlogits {
            // dlogits = (softmax - onehot) / counted, in place of the logits.
            be.softmax_cross_entropy(
                logits,
                targets_view,
                cfg.vocab_size,
                losses,
                Some(logits),
                1.0 / counted as f32,
            )?;
        } else {
            be.softmax_cross_entropy(logits, targets_view, cfg.vocab_size, losses, None, 1.0)?;
        }
        be.download(losses, &mut self.host_losses[..n])?;
        let sum: f64 = self.host_losses[..n].iter().map(|&l| l as f64).sum();
        let loss = sum / counted as f64;
        if !loss.is_finite() {
            return Err(ModelError::NonFinite {
                step: self.steps + 1,
                what: "loss",
                value: loss,
            });
        }
        self.phase = Phase::Forward {
            batch: b,
            counted,
            dlogits,
        };
        Ok(loss as f32)
    }

    /// The logits of the last forward pass, `[b, seq, vocab_size]` (the real vocabulary).
    /// Available until [`Trainer::backward`] overwrites them with their gradient.
    pub fn logits(&self) -> Result<Vec<f32>> {
        let Phase::Forward {
            batch,
            dlogits: false,
            ..
        } = self.phase
        else {
            return Err(ModelError::State(
                "logits: no forward pass (`forward`, not `forward_train`) since the last \
                 backward pass"
                    .into(),
            ));
        };
        let (n, vocab) = (batch * self.slots.seq, self.model.config().vocab_size);
        let vp = self.model.config().padded_vocab_size();
        let mut padded = vec![0.0; n * vp];
        self.model
            .backend()
            .download(self.slots.logits.rows(&self.acts, n), &mut padded)?;
        Ok(padded
            .chunks(vp)
            .flat_map(|row| &row[..vocab])
            .copied()
            .collect())
    }

    /// The backward pass of the last forward pass: adds the gradient of its mean loss
    /// into the gradient buffer.
    pub fn backward(&mut self) -> Result<()> {
        let Phase::Forward {
            batch: b,
            counted,
            dlogits,
        } = self.phase
        else {
            return Err(ModelError::State(
                "backward: call forward first (each forward pass allows one backward pass)".into(),
            ));
        };
        let (seq, n) = (self.slots.seq, b * self.slots.seq);
        let be = self.model.backend();
        let cfg = self.model.config();
        let (layout, params, grads) = (self.model.layout(), self.model.buffer(), &self.grads);
        let (s, acts) = (&self.slots, &self.acts);
        self.phase = Phase::Backward;

        // dlogits = (softmax - onehot) / counted, in place of the logits (done already
        // by `forward_train`).
        let logits = s.logits.rows(acts, n);
        if !dlogits {
            be.softmax_cross_entropy(
                logits,
                View::new(&self.targets, 0, [n]),
                cfg.vocab_size,
                s.losses.flat(acts, n),
                Some(logits),
                1.0 / counted as f32,
            )?;
        }
        let d = s.grads::<B>(acts, cfg, b);
        let wte = layout.wte_padded.on(params);
        be.matmul(logits.mat(), wte.mat(), None, d.d_ln.mat())?;
        be.matmul_add(
            logits.mat().t(),
            s.ln_f.rows(acts, n).mat(),
            None,
            layout.wte_padded.on(grads).mat(),
        )?;
        be.fill(d.d_res, 0.0)?;
        be.layernorm_backward(
            s.blocks[cfg.n_layer - 1].residual_3.rows(acts, n),
            layout.ln_f_w.on(params),
            s.ln_f_mean.flat(acts, n),
            s.ln_f_rstd.flat(acts, n),
            d.d_ln,
            d.d_res,
            layout.ln_f_w.on(grads),
            layout.ln_f_b.on(grads),
        )?;
        let ws_len = be.attention_workspace_len(self.attention_shape(b)).max(1);
        let scratch_len = be
            .attention_backward_scratch_len(self.attention_shape(b))
            .max(1);
        for l in (0..cfg.n_layer).rev() {
            block::backward(
                be,
                &layout.layer(params, l),
                &layout.layer(grads, l),
                &s.block::<B>(acts, l, b),
                &d,
                cfg.n_head,
                s.blocks[l].attn_workspace.flat(acts, ws_len),
                s.attn_scratch.flat(acts, scratch_len),
            )?;
        }
        be.embedding_backward(
            View::new(&self.tokens, 0, [n]),
            d.d_res
                .reshape([b, seq, cfg.d_model])
                .expect("[N, C] is [B, T, C]"),
            layout.wte_padded.on(grads),
            layout.wpe.on(grads),
        )?;
        self.micro_batches += 1;
        Ok(())
    }
}
