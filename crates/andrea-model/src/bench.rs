//! Throughput of the two things a user waits for: a full training step (forward, loss,
//! backward, clipping and AdamW) and KV-cache decoding, in tokens per second.
//!
//! Both are measured the same way: untimed warm-up iterations, then each timed iteration
//! on its own clock (the backend synchronised before the clock is read); the figure is
//! the median, which a noisy shared machine moves far less than the mean. The same logic
//! serves the `bench` example of this crate, the criterion benches in `benches/` and the
//! CLI's `andrea bench`; `benches/pytorch/train_step.py` measures PyTorch the same way
//! and prints the same JSON shape ([`BenchReport::to_json`]). [`train_profile`] and
//! [`decode_profile`] run the same steps on `andrea_core::timed::Timed` for a per-op
//! table (`andrea bench train --profile`, `andrea bench decode --profile`).
//!
//! ```
//! use andrea_cpu::CpuBackend;
//! use andrea_model::bench::{self, TrainBench};
//! use andrea_model::{ModelConfig, OptimizerConfig};
//!
//! let config = ModelConfig::new(64, 16, 32, 2, 4);
//! let plan = TrainBench { batch: 2, seq: 16, warmup: 1, steps: 3, seed: 0 };
//! let report = bench::train(CpuBackend::new(), config, OptimizerConfig::default(), &plan)?;
//! assert!(report.tokens_per_s > 0.0 && report.steps == 3);
//! println!("{}", report.to_json());
//! # Ok::<(), andrea_model::ModelError>(())
//! ```

use std::time::{Duration, Instant};

use andrea_core::timed::{Profile, Timed};
use andrea_core::{Backend, ModelConfig, OptimizerConfig};
use serde::Serialize;

use crate::error::{ModelError, Result};
use crate::infer::{KvCache, Sampler};
use crate::model::Model;
use crate::rng::Rng;
use crate::train::Trainer;

/// A training-step measurement: `warmup` untimed then `steps` timed steps at `batch x seq`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TrainBench {
    pub batch: usize,
    pub seq: usize,
    pub warmup: usize,
    pub steps: usize,
    /// Seeds the initialisation and the synthetic tokens.
    pub seed: u64,
}

/// A decoding measurement: `batch` sequences in a KV cache of `capacity` positions,
/// prefilled with a `prompt_len`-token prompt (untimed), then `warmup` untimed and
/// `steps` timed single-token extends, each followed by a greedy pick of the next token.
/// When the cache is full it is reset and the prompt prefilled again, untimed, so the
/// timed positions cycle through `prompt_len..capacity`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DecodeBench {
    pub batch: usize,
    pub prompt_len: usize,
    pub capacity: usize,
    pub warmup: usize,
    pub steps: usize,
    pub seed: u64,
}

/// Seconds per timed iteration of one phase: median, minimum and maximum.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Spread {
    pub median_s: f64,
    pub min_s: f64,
    pub max_s: f64,
}

impl Spread {
    /// `None` for no samples.
    pub fn of(samples: &[Duration]) -> Option<Spread> {
        let mut s: Vec<f64> = samples.iter().map(Duration::as_secs_f64).collect();
        s.sort_by(f64::total_cmp);
        let n = s.len();
        let median = match n {
            0 => return None,
            _ if n % 2 == 1 => s[n / 2],
            _ => 0.5 * (s[n / 2 - 1] + s[n / 2]),
        };
        Some(Spread {
            median_s: median,
            min_s: s[0],
            max_s: s[n - 1],
        })
    }
}

/// One measurement, as one JSON object (`to_json`).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct BenchReport {
    /// `"andrea"` (the PyTorch script writes `"pytorch"`).
    pub implementation: &'static str,
    /// `"train_step"` or `"decode"`.
    pub bench: &'static str,
    /// The config's name (or "unnamed").
    pub config: String,
    /// The backend's [`andrea_core::MemoryOps::name`], e.g. "cpu (2 threads, avx512)".
    pub backend: String,
    pub batch: usize,
    /// Training: the sequence length. Decode: the cache capacity.
    pub seq_len: usize,
    /// Decode only: the prompt's length.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub prompt_len: Option<usize>,
    pub warmup: usize,
    pub steps: usize,
    /// Tokens processed per timed iteration (training `batch · seq`, decode `batch`).
    pub tokens_per_step: usize,
    /// `tokens_per_step / median_s`.
    pub tokens_per_s: f64,
    /// The whole iteration.
    #[serde(flatten)]
    pub time: Spread,
    /// Training only: the model FLOPs per second at the median (forward + backward
    /// GEMMs and attention, [`ModelConfig::training_flops_per_token`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gflop_per_s: Option<f64>,
    /// Training only: medians of the forward pass (with the loss), the backward pass and
    /// the optimizer step (norm, clipping, AdamW, zeroing the gradients).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub phases: Option<Phases>,
    /// Training: the mean loss of the last step (≈ ln vocab at initialisation).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub loss: Option<f32>,
}

/// Median seconds of each phase of a training step.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Phases {
    pub forward_s: f64,
    pub backward_s: f64,
    pub optimizer_s: f64,
}

impl BenchReport {
    /// The report as one line of JSON.
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).expect("a report always serializes")
    }
}

/// Deterministic tokens for a training batch: a uniform random stream of
/// `batch · seq + 1` ids, inputs and next-token targets shifted by one.
pub fn synthetic_batch(vocab: usize, batch: usize, seq: usize, seed: u64) -> (Vec<u32>, Vec<u32>) {
    let mut rng = Rng::new(seed ^ 0xBE7C_0000);
    let stream: Vec<u32> = (0..batch * seq + 1)
        .map(|_| (rng.next_u64() % vocab as u64) as u32)
        .collect();
    (
        stream[..batch * seq].to_vec(),
        stream[1..batch * seq + 1].to_vec(),
    )
}

fn check_counts(what: &'static str, steps: usize) -> Result<()> {
    if steps == 0 {
        return Err(ModelError::batch(
            what,
            "need at least one timed step".to_string(),
        ));
    }
    Ok(())
}

fn timed(be: &impl Backend, f: impl FnOnce() -> Result<()>) -> Result<Duration> {
    let start = Instant::now();
    f()?;
    be.synchronize()?;
    Ok(start.elapsed())
}

/// Measures full training steps of a freshly initialised model of `config` on `backend`
/// with `optimizer` at its configured learning rate.
pub fn train<B: Backend>(
    backend: B,
    config: ModelConfig,
    optimizer: OptimizerConfig,
    plan: &TrainBench,
) -> Result<BenchReport> {
    train_with(backend, config, optimizer, plan, |_| {}).map(|(report, _)| report)
}

/// [`train`] on [`Timed`]`<B>`: the same steps of the real [`Trainer`], every op timed
/// (counts reset after the warm-up), and the per-op [`Profile`] of the timed steps
/// ([`Profile::table`] prints it per step). Each op runs between two synchronisations,
/// so on a GPU the step is slower than [`train`]'s; the report's figures are those of
/// the timed run.
pub fn train_profile<B: Backend>(
    backend: B,
    config: ModelConfig,
    optimizer: OptimizerConfig,
    plan: &TrainBench,
) -> Result<(BenchReport, Profile)> {
    let timed = Timed::new(backend);
    let (report, trainer) = train_with(timed, config, optimizer, plan, Timed::reset)?;
    Ok((report, trainer.model().backend().profile()))
}

/// [`train`], calling `after_warmup` on the backend once the warm-up steps are done, and
/// giving back the trainer.
fn train_with<B: Backend>(
    backend: B,
    config: ModelConfig,
    optimizer: OptimizerConfig,
    plan: &TrainBench,
    after_warmup: impl FnOnce(&B),
) -> Result<(BenchReport, Trainer<B>)> {
    check_counts("bench::train", plan.steps)?;
    let name = config.name.clone().unwrap_or_else(|| "unnamed".into());
    let flops_per_token = config.training_flops_per_token(plan.seq);
    let (tokens, targets) = synthetic_batch(config.vocab_size, plan.batch, plan.seq, plan.seed);
    let model = Model::new(backend, config, plan.seed)?;
    let lr = optimizer.lr;
    let mut trainer = Trainer::new(model, optimizer, plan.batch, plan.seq)?;
    let (mut total, mut fwd, mut bwd, mut opt) = (vec![], vec![], vec![], vec![]);
    let mut loss = 0.0;
    let sync = |t: &Trainer<B>| t.model().backend().synchronize();
    let mut after_warmup = Some(after_warmup);
    for i in 0..plan.warmup + plan.steps {
        if i == plan.warmup {
            sync(&trainer)?;
            if let Some(f) = after_warmup.take() {
                f(trainer.model().backend());
            }
        }
        let t0 = Instant::now();
        loss = trainer.forward_train(&tokens, &targets)?;
        sync(&trainer)?;
        let t1 = Instant::now();
        trainer.backward()?;
        sync(&trainer)?;
        let t2 = Instant::now();
        trainer.step(lr)?;
        sync(&trainer)?;
        let t3 = Instant::now();
        if i >= plan.warmup {
            total.push(t3 - t0);
            fwd.push(t1 - t0);
            bwd.push(t2 - t1);
            opt.push(t3 - t2);
        }
    }
    let time = Spread::of(&total).expect("steps >= 1");
    let median = |d: &[Duration]| Spread::of(d).expect("steps >= 1").median_s;
    let tokens_per_step = plan.batch * plan.seq;
    let tokens_per_s = tokens_per_step as f64 / time.median_s;
    let report = BenchReport {
        implementation: "andrea",
        bench: "train_step",
        config: name,
        backend: trainer.model().backend().name(),
        batch: plan.batch,
        seq_len: plan.seq,
        prompt_len: None,
        warmup: plan.warmup,
        steps: plan.steps,
        tokens_per_step,
        tokens_per_s,
        time,
        gflop_per_s: Some(flops_per_token * tokens_per_s / 1e9),
        phases: Some(Phases {
            forward_s: median(&fwd),
            backward_s: median(&bwd),
            optimizer_s: median(&opt),
        }),
        loss: Some(loss),
    };
    Ok((report, trainer))
}

/// Greedy decoding one token at a time through a KV cache, refilling the cache with
/// the prompt when it is full (see [`DecodeBench`]). Used by [`decode`] and by the
/// criterion bench, which times [`Decoder::step`] alone.
pub struct Decoder<'m, B: Backend> {
    model: &'m Model<B>,
    cache: KvCache<B>,
    prompt: Vec<u32>,
    /// The next token of each sequence, `[batch]`.
    next: Vec<u32>,
    /// The tokens a step feeds (a copy of `next`, which the step overwrites).
    fed: Vec<u32>,
    sampler: Sampler,
}

impl<'m, B: Backend> Decoder<'m, B> {
    /// A cache for `batch` sequences of `capacity` positions, prefilled with a
    /// deterministic prompt of `prompt_len` tokens per sequence (`prompt_len < capacity`).
    pub fn new(
        model: &'m Model<B>,
        batch: usize,
        prompt_len: usize,
        capacity: usize,
        seed: u64,
    ) -> Result<Self> {
        if prompt_len == 0 || prompt_len >= capacity {
            return Err(ModelError::batch(
                "bench::Decoder",
                format!("need 1 <= prompt_len < capacity, got {prompt_len} and {capacity}"),
            ));
        }
        let (prompt, _) = synthetic_batch(model.config().vocab_size, batch, prompt_len, seed);
        let mut decoder = Decoder {
            cache: model.kv_cache(batch, capacity)?,
            model,
            prompt,
            next: vec![0; batch],
            fed: vec![0; batch],
            sampler: Sampler::greedy(),
        };
        decoder.refill()?;
        Ok(decoder)
    }

    /// Resets the cache and prefills the prompt.
    fn refill(&mut self) -> Result<()> {
        self.cache.reset();
        let logits = self.model.extend(&mut self.cache, &self.prompt)?;
        pick(&mut self.sampler, logits, &mut self.next);
        Ok(())
    }

    /// Makes room for one more position (a reset and prefill when the cache is full).
    /// Call it outside the timed region.
    pub fn ensure_room(&mut self) -> Result<()> {
        if self.cache.len() == self.cache.capacity() {
            self.refill()?;
        }
        Ok(())
    }

    /// Feeds the current token of every sequence and picks the next one greedily. The
    /// cache must have room ([`Decoder::ensure_room`]).
    pub fn step(&mut self) -> Result<()> {
        let Decoder {
            model,
            cache,
            next,
            fed,
            sampler,
            ..
        } = self;
        fed.copy_from_slice(next);
        model.extend_with(cache, fed, |b, logits| next[b] = sampler.sample(logits))
    }

    /// The sequences' next tokens.
    pub fn next_tokens(&self) -> &[u32] {
        &self.next
    }
}

/// The next token of each sequence from its logits, `[batch, vocab]`.
fn pick(sampler: &mut Sampler, logits: &[f32], next: &mut [u32]) {
    let vocab = logits.len() / next.len();
    for (id, row) in next.iter_mut().zip(logits.chunks_exact(vocab)) {
        *id = sampler.sample(row);
    }
}

/// Measures greedy KV-cache decoding of a freshly initialised model of `config`.
pub fn decode<B: Backend>(
    backend: B,
    config: ModelConfig,
    plan: &DecodeBench,
) -> Result<BenchReport> {
    decode_with(backend, config, plan, |_, _| {}).map(|(report, _)| report)
}

/// [`decode`] on [`Timed`]`<B>`: the same greedy steps, every op timed, and the per-op
/// [`Profile`] of the timed steps alone: counts start after the warm-up, and the
/// prompt refills of a full cache (untimed in [`decode`] too) run paused
/// ([`Timed::pause`]), out of the counts and of the wall time. The time outside the
/// ops is then the step's own host work: the greedy pick, host copies of ids and
/// logits, the clock.
pub fn decode_profile<B: Backend>(
    backend: B,
    config: ModelConfig,
    plan: &DecodeBench,
) -> Result<(BenchReport, Profile)> {
    let (report, model) =
        decode_with(Timed::new(backend), config, plan, |be, event| match event {
            Between::WarmupDone => be.reset(),
            Between::RoomStart => be.pause(),
            Between::RoomEnd => be.resume(),
        })?;
    let profile = model.backend().profile();
    Ok((report, profile))
}

/// Points between the timed decode steps at which [`decode_with`] calls its hook.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Between {
    /// The warm-up steps are done; the timed ones follow.
    WarmupDone,
    /// Before and after [`Decoder::ensure_room`] (a prompt refill when the cache is
    /// full), ahead of every step.
    RoomStart,
    RoomEnd,
}

/// [`decode`], calling `hook` on the backend at the points of [`Between`], and giving
/// back the model.
fn decode_with<B: Backend>(
    backend: B,
    config: ModelConfig,
    plan: &DecodeBench,
    mut hook: impl FnMut(&B, Between),
) -> Result<(BenchReport, Model<B>)> {
    check_counts("bench::decode", plan.steps)?;
    let name = config.name.clone().unwrap_or_else(|| "unnamed".into());
    let model = Model::new(backend, config, plan.seed)?;
    let mut decoder = Decoder::new(
        &model,
        plan.batch,
        plan.prompt_len,
        plan.capacity,
        plan.seed,
    )?;
    let mut times = Vec::with_capacity(plan.steps);
    for i in 0..plan.warmup + plan.steps {
        if i == plan.warmup {
            model.backend().synchronize()?;
            hook(model.backend(), Between::WarmupDone);
        }
        hook(model.backend(), Between::RoomStart);
        decoder.ensure_room()?;
        model.backend().synchronize()?;
        hook(model.backend(), Between::RoomEnd);
        let t = timed(model.backend(), || decoder.step())?;
        if i >= plan.warmup {
            times.push(t);
        }
    }
    drop(decoder);
    let time = Spread::of(&times).expect("steps >= 1");
    let report = BenchReport {
        implementation: "andrea",
        bench: "decode",
        config: name,
        backend: model.backend().name(),
        batch: plan.batch,
        seq_len: plan.capacity,
        prompt_len: Some(plan.prompt_len),
        warmup: plan.warmup,
        steps: plan.steps,
        tokens_per_step: plan.batch,
        tokens_per_s: plan.batch as f64 / time.median_s,
        time,
        gflop_per_s: None,
        phases: None,
        loss: None,
    };
    Ok((report, model))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_of_odd_and_even_counts() {
        let ms = |v: &[u64]| {
            v.iter()
                .map(|&m| Duration::from_millis(m))
                .collect::<Vec<_>>()
        };
        let s = Spread::of(&ms(&[30, 10, 20])).unwrap();
        assert_eq!((s.median_s, s.min_s, s.max_s), (0.02, 0.01, 0.03));
        assert_eq!(Spread::of(&ms(&[40, 10, 20, 30])).unwrap().median_s, 0.025);
        assert!(Spread::of(&[]).is_none());
    }

    #[test]
    fn synthetic_targets_are_the_next_tokens() {
        let (x, y) = synthetic_batch(100, 2, 5, 7);
        assert_eq!((x.len(), y.len()), (10, 10));
        assert_eq!(&x[1..], &y[..9]);
        assert!(x.iter().chain(&y).all(|&t| t < 100));
    }
}
