//! The forward and backward passes of a training step, over the activation arena.

use andrea_core::{Backend, Ids, View};

use super::{Phase, Trainer};
use crate::block;
use crate::error::{ModelError, Result};
use crate::gpt::{self, Activations};

/// The first `n` ids of `buf`.
pub(super) fn ids<B: Backend>(buf: &B::IdBuffer, n: usize) -> Ids<'_, B> {
    View::new(buf, 0, [n])
}

impl<B: Backend> Trainer<B> {
    /// The forward pass over `tokens` (`[b, seq]` row-major, `b <= batch`) with
    /// next-token `targets` of the same shape ([`crate::IGNORE_INDEX`] to skip a position).
    /// Returns the mean cross-entropy over the counted targets, in nats.
    pub fn forward(&mut self, tokens: &[u32], targets: &[u32]) -> Result<f32> {
        self.forward_pass(tokens, targets, false)
    }

    /// [`forward`](Self::forward) for a training step: the same loss, and in the same pass
    /// over the logits the loss's gradient with respect to them, written in their place,
    /// so [`backward`](Self::backward) starts from it. That reads the `[tokens, vocab]`
    /// logits once instead of twice and computes their exponentials once (measured on the
    /// tiny model's step: benches/README.md, "Model"). [`logits`](Self::logits) is not available afterwards.
    pub fn forward_train(&mut self, tokens: &[u32], targets: &[u32]) -> Result<f32> {
        self.forward_pass(tokens, targets, true)
    }

    fn forward_pass(&mut self, tokens: &[u32], targets: &[u32], dlogits: bool) -> Result<f32> {
        let (batch, counted) = self.queue_forward(tokens, targets, dlogits)?;
        self.read_loss(batch, counted)
    }

    /// The forward pass up to and including the loss kernel, queued on the backend
    /// (nothing waits for the device); returns the batch and the number of counted
    /// targets.
    /// [`Trainer::read_loss`] then reads the loss, and may come after the backward pass
    /// has been queued too (see [`Trainer::train_step`]).
    pub(super) fn queue_forward(
        &mut self,
        tokens: &[u32],
        targets: &[u32],
        dlogits: bool,
    ) -> Result<(usize, usize)> {
        let cfg = self.model.config();
        let shape = (self.slots.batch, self.slots.seq);
        let (batch, counted) = gpt::check_batch(cfg, "trainer", shape, tokens, targets)?;
        let n = batch * self.slots.seq;
        let be = self.model.backend();
        self.phase = Phase::Empty;
        let (ids, target_ids) = (ids::<B>(&self.tokens, n), ids::<B>(&self.targets, n));
        be.upload_ids(tokens, ids)?;
        be.upload_ids(targets, target_ids)?;
        let acts = self.slots.on(be, &self.acts, batch);
        gpt::forward(&self.model, ids, 0, &acts)?;
        let (logits, losses) = (acts.logits_rows(), acts.losses());
        let vocab = cfg.vocab_size;
        gpt::queue_loss(be, vocab, logits, target_ids, losses, counted, dlogits)?;
        self.phase = Phase::Forward {
            batch,
            counted,
            dlogits,
        };
        Ok((batch, counted))
    }

    /// The mean loss of the last queued forward pass of `batch` sequences (its `losses`
    /// rows, which the backward pass leaves alone). A NaN or infinite loss is an error
    /// and forgets the forward pass.
    pub(super) fn read_loss(&mut self, batch: usize, counted: usize) -> Result<f32> {
        let n = batch * self.slots.seq;
        let be = self.model.backend();
        let acts = self.slots.on(be, &self.acts, batch);
        let host = &mut self.host_losses[..n];
        let loss = gpt::read_mean_loss(be, acts.losses(), counted, host)?;
        self.check_loss(loss)?;
        Ok(loss as f32)
    }

    /// A NaN or infinite mean loss is an error and forgets the forward pass.
    pub(super) fn check_loss(&mut self, loss: f64) -> Result<()> {
        if !loss.is_finite() {
            self.phase = Phase::Empty;
            return Err(ModelError::NonFinite {
                step: self.steps + 1,
                what: "loss",
                value: loss,
            });
        }
        Ok(())
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
    /// into the gradient buffer (the first one since a step or [`Trainer::zero_grad`]
    /// writes it: the buffer's contents are not read).
    pub fn backward(&mut self) -> Result<()> {
        let Phase::Forward {
            batch,
            counted,
            dlogits,
        } = self.phase
        else {
            return Err(ModelError::State(
                "backward: call forward first (each forward pass allows one backward pass)".into(),
            ));
        };
        let n = batch * self.slots.seq;
        if self.micro_batches > 0 {
            self.reserve_accumulation()?;
        }
        let be = self.model.backend();
        let cfg = self.model.config();
        // The first micro-batch's gradient goes straight into `grads`; a later one into
        // `micro_grads`, added afterwards (see the module docs). Either buffer holds
        // nothing to keep: the weight matrices' gradients are written, and only the
        // tensors whose backward ops add (biases, LayerNorms, `wpe`) are zeroed first.
        let grads = match (&self.micro_grads, self.micro_batches) {
            (Some(micro), 1..) => micro,
            _ => &self.grads,
        };
        let (layout, params) = (self.model.layout(), self.model.buffer());
        let added = View::new(grads, layout.decay_len, [layout.len - layout.decay_len]);
        be.fill(added, 0.0)?;
        be.fill(layout.wpe.on(grads), 0.0)?;
        let (s, buf) = (&self.slots, &self.acts);
        let acts = s.on(be, buf, batch);
        self.phase = Phase::Backward;

        // dlogits = (softmax - onehot) / counted, in place of the logits (done already
        // by `forward_train`).
        let logits = acts.logits_rows();
        if !dlogits {
            be.softmax_cross_entropy(
                logits,
                ids::<B>(&self.targets, n),
                cfg.vocab_size,
                acts.losses(),
                Some(logits),
                1.0 / counted as f32,
            )?;
        }
        // logits = ln_f · wteᵀ.
        let d = s.grads::<B>(buf, batch)?;
        let (wte, ln_f) = (layout.wte_padded.on(params), acts.ln_f());
        be.matmul(logits.mat(), wte.mat(), None, d.d_ln.mat())?;
        // wte's gradient: written here, then `embedding_backward` adds the input side's.
        be.matmul(
            logits.mat().t(),
            ln_f.out.mat(),
            None,
            layout.wte_padded.on(grads).mat(),
        )?;
        be.fill(d.d_res, 0.0)?;
        let last = acts.block(cfg.n_layer - 1)?;
        let (ln_f_p, ln_f_g) = (layout.ln_f(params), layout.ln_f(grads));
        ln_f_p.backward(be, last.residual_3, &ln_f, d.d_ln, d.d_res, &ln_f_g)?;
        let scratch = s.attn_scratch(be, buf, batch);
        for l in (0..cfg.n_layer).rev() {
            let (p, g) = (layout.layer(params, l), layout.layer(grads, l));
            block::backward(be, &p, &g, &acts.block(l)?, &d, scratch)?;
        }
        // x = wte[ids] + wpe[positions].
        let (dwte, dwpe) = (layout.wte_padded.on(grads), layout.wpe.on(grads));
        let d_encoded = s.d_res.btc(buf, batch, s.seq);
        be.embedding_backward(ids::<B>(&self.tokens, n), d_encoded, dwte, dwpe)?;
        if self.micro_batches > 0 {
            let (sum, micro) = (View::whole(&self.grads), View::whole(grads));
            be.add(sum, micro, sum)?;
        }
        self.micro_batches += 1;
        Ok(())
    }
}
