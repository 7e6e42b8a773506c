//! `andrea generate`: prefill the prompt into a KV cache, then sample one token at a
//! time, printing each piece of text as soon as it is complete UTF-8, until
//! `<|endoftext|>`, `--max-new-tokens`, or the end of the context.

use andrea::{Backend, Model, Sampler};
use andrea_tokenizer::Tokenizer;
use anyhow::{bail, Context, Result};

use crate::checkpoint;
use crate::cli::GenerateArgs;

/// The prompt's ids: its text with `<|endoftext|>` recognised; an empty prompt starts a
/// new document (`<|endoftext|>` alone, or a space without one).
pub fn prompt_ids(tokenizer: &Tokenizer, prompt: &str) -> Vec<u32> {
    let ids = tokenizer.encode_with_special_tokens(prompt);
    if !ids.is_empty() {
        return ids;
    }
    match tokenizer.eot_id() {
        Some(eot) => vec![eot],
        None => tokenizer.encode(" "),
    }
}

/// Samples up to `max_new` tokens after `prompt`, calling `emit` with each complete
/// piece of text. Returns the number of tokens generated (the `<|endoftext|>` that stops
/// generation is not counted or printed).
pub fn stream<B: Backend>(
    model: &Model<B>,
    tokenizer: &Tokenizer,
    prompt: &[u32],
    max_new: usize,
    sampler: &mut Sampler,
    mut emit: impl FnMut(&str) -> Result<()>,
) -> Result<usize> {
    let context = model.config().context_length;
    if prompt.len() > context {
        bail!(
            "the prompt is {} tokens, longer than the model's context of {context}: shorten it",
            prompt.len()
        );
    }
    let max_new = max_new.min(context + 1 - prompt.len());
    if max_new == 0 {
        return Ok(0);
    }
    let vocab = model.config().vocab_size;
    let eot = tokenizer.eot_id();
    let mut cache = model.kv_cache(1, (prompt.len() + max_new - 1).max(1))?;
    let mut decoder = tokenizer.stream_decoder();
    // The model may have more ids than the tokenizer (padding a vocabulary up): never
    // sample an id the tokenizer cannot spell. Each step samples from the logits where
    // they lie (`extend_with`): `Err(value)` for a logit that is not finite.
    let spelled = tokenizer.vocab_size().min(vocab);
    let mut step = |fed: &[u32]| -> Result<std::result::Result<u32, f32>> {
        let mut picked = Ok(0);
        model.extend_with(&mut cache, fed, |_, logits| {
            let logits = &logits[..spelled];
            picked = match logits.iter().find(|v| !v.is_finite()) {
                Some(&bad) => Err(bad),
                None => Ok(sampler.sample(logits)),
            };
        })?;
        Ok(picked)
    };
    let mut picked = step(prompt)?;
    let mut produced = 0;
    for i in 0..max_new {
        let id = match picked {
            Ok(id) => id,
            Err(bad) => bail!(
                "the model's output is {bad} after {produced} generated tokens: its weights or the \
                 arithmetic overflowed; use an earlier checkpoint (or --backend cpu / --precision fp32 on a GPU)"
            ),
        };
        if Some(id) == eot {
            break;
        }
        produced += 1;
        let text = decoder.push(id)?;
        if !text.is_empty() {
            emit(&text)?;
        }
        if i + 1 < max_new {
            picked = step(&[id])?;
        }
    }
    let rest = decoder.finish();
    if !rest.is_empty() {
        emit(&rest)?;
    }
    Ok(produced)
}

/// The sampler the flags ask for.
pub fn sampler(temperature: f32, top_k: usize, top_p: f32, seed: u64) -> Result<Sampler> {
    // Checked here, whatever the sampler accepts: 2 or NaN must not quietly mean "all".
    if !(top_p > 0.0 && top_p <= 1.0) {
        bail!("--top-p must be in (0, 1] (1 samples from every token), got {top_p}");
    }
    if !(temperature >= 0.0 && temperature.is_finite()) {
        bail!("--temperature must be a non-negative number (0 is greedy), got {temperature}");
    }
    let mut s = Sampler::new(temperature, seed).context("--temperature")?;
    if top_k > 0 {
        s = s.with_top_k(top_k).context("--top-k")?;
    }
    if top_p < 1.0 {
        s = s.with_top_p(top_p).context("--top-p")?;
    }
    Ok(s)
}

pub fn run<B: Backend>(args: &GenerateArgs, backend: B) -> Result<()> {
    let loaded = checkpoint::load(&args.checkpoint, backend)?;
    print(args, &loaded)
}

/// Generates from the loaded `--checkpoint` of `args` onto stdout (the demo samples one
/// loaded checkpoint several times).
pub fn print<B: Backend>(args: &GenerateArgs, loaded: &checkpoint::Loaded<B>) -> Result<()> {
    let mut sampler = sampler(args.temperature, args.top_k, args.top_p, args.seed)?;
    let tokenizer = loaded.tokenizer()?;
    let prompt = prompt_ids(tokenizer, &args.prompt);
    let context = loaded.model.config().context_length;
    if prompt.len() > context {
        bail!(
            "the prompt is {} tokens, longer than the model's context of {context}: shorten it",
            prompt.len()
        );
    }
    if prompt.len() + args.max_new_tokens > context + 1 {
        errln!(
            "note: the context holds {context} tokens; generating at most {} after the {}-token prompt",
            (context + 1).saturating_sub(prompt.len()),
            prompt.len()
        );
    }
    out!("{}", args.prompt)?;
    stream(
        &loaded.model,
        tokenizer,
        &prompt,
        args.max_new_tokens,
        &mut sampler,
        |text| out!("{text}"),
    )?;
    outln!()?;
    Ok(())
}
