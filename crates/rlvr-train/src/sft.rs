//! Supervised warm start (`rlvr sft`, and the quickstart's first phase): one loop for both.
//!
//! Loss: token-mean cross-entropy over the completion tokens of the whole batch, the appended EOS
//! included: L = −Σ_i Σ_t ℓ_it / Σ_i n_i, fixed over the batch before micro-batching (so the
//! micro-batch size does not change the gradient). Prompt tokens are not trained. The optimizer
//! step is the RL trainer's ([`OptimizerStep`]: AdamW, global-norm clipping), the learning rate
//! follows the schedules of `[train]`, batches come from a seeded shuffle per epoch.
//!
//! Evaluation (optional) every `eval_every` steps through the one [`Evaluator`]; a [`StopRule`]
//! ends the run at the first evaluation it accepts. Output in the model directory `out`:
//! the weights and tokenizer files (at the end and every `save_every` steps), `metrics.jsonl`
//! (`step`, `loss`, `lr`, `grad_norm`, `tokens_per_s`, `time/train_s`, and `eval/*` at
//! evaluations) and `eval.jsonl`.

use std::path::Path;
use std::time::Instant;

use anyhow::{bail, Context};
use candle_core::{DType, Tensor};
use rlvr_data::sampler::PromptSampler;
use rlvr_model::checkpoint::write_tokenizer_files;
use rlvr_model::optim::AdamWConfig;
use rlvr_model::{Message, Model, TokenizerBundle};

use crate::eval::{EvalResult, Evaluator};
use crate::job::Job;
use crate::pack::pack_rows;
use crate::store::metrics::{append_line, MetricsLine};
use crate::update::{LrSchedule, OptimizerStep};

/// One tokenised pair.
#[derive(Debug, Clone, PartialEq)]
pub struct SftPair {
    /// Prompt ids.
    pub prompt: Vec<u32>,
    /// Completion ids, EOS appended.
    pub completion: Vec<u32>,
}

/// Reads and tokenises SFT pairs; each completion ends with the first EOS id.
///
/// A line is one of:
/// - `{"prompt": TEXT, "completion": TEXT}`: the prompt encoded as it is (with `chat`: rendered
///   as one user message by the model's chat template), the completion encoded, the first EOS id
///   appended;
/// - TRL's conversational prompt-completion row, `{"prompt": [MESSAGES], "completion":
///   [MESSAGES]}` (a string on one side is one user or assistant message): the prompt is the
///   prompt messages rendered with the generation prompt, the completion what the chat template
///   adds after it when it renders the whole conversation, up to and including the last EOS token
///   there (the end-of-turn token of a chat model's EOS), else with the first EOS id appended;
/// - TRL's conversational language-modelling row, `{"messages": [MESSAGES]}`: the last message
///   (an assistant's) is the completion, every message before it the prompt, as above. Earlier
///   assistant turns are prompt, not trained (TRL trains them unless `assistant_only_loss`).
///
/// A message is `{"role": "system" | "user" | "assistant", "content": TEXT}`; message lists are
/// rendered whatever `chat` says. `max_completion_len` cuts each completion (EOS included) to that
/// many tokens.
///
/// # Errors
/// Unreadable file; a line that is not one of the forms above, naming file, line and field (e.g.
/// `pairs.jsonl:3: field `messages[2].role` ...`); a model without a chat template for message
/// lists; a template that renders the prompt messages other than as the start of the whole
/// conversation (the completion cannot be told apart); tokenizer errors; a tokenizer without EOS.
pub fn read_pairs(
    path: &Path,
    tok: &TokenizerBundle,
    chat: bool,
    max_completion_len: Option<usize>,
) -> anyhow::Result<Vec<SftPair>> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let Some(&eos) = tok.eos_ids.first() else {
        bail!("the tokenizer has no EOS token: SFT trains the EOS that ends each completion");
    };
    let mut out = Vec::new();
    for (i, line) in text.split('\n').enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let at = format!("{}:{}", path.display(), i + 1);
        let v: serde_json::Value =
            serde_json::from_str(line).with_context(|| format!("{at}: invalid JSON"))?;
        let (prompt, mut completion) = match pair_side(&v, &at)? {
            (Side::Text(p), Side::Text(c)) => {
                let prompt = if chat {
                    let rendered = tok.apply_chat_template(&[Message::new("user", &p)], true)?;
                    tok.encode(&rendered, false)?
                } else {
                    tok.encode(&p, true)?
                };
                let mut completion = tok.encode(&c, false)?;
                completion.push(eos);
                (prompt, completion)
            }
            (p, c) => {
                let pm = p.into_messages("user");
                let cm = c.into_messages("assistant");
                chat_pair(tok, &pm, &cm, eos)
                    .with_context(|| format!("{at}: rendering the row's chat messages"))?
            }
        };
        if prompt.is_empty() {
            bail!("{at}: the prompt encodes to no token");
        }
        if let Some(m) = max_completion_len {
            completion.truncate(m);
        }
        out.push(SftPair { prompt, completion });
    }
    if out.is_empty() {
        bail!("{} holds no pair", path.display());
    }
    Ok(out)
}

/// One side of a pair as a line gives it: a string or chat messages.
enum Side {
    Text(String),
    Chat(Vec<Message>),
}

impl Side {
    /// The side as messages: a string becomes one message of `role`.
    fn into_messages(self, role: &str) -> Vec<Message> {
        match self {
            Side::Text(t) => vec![Message::new(role, &t)],
            Side::Chat(m) => m,
        }
    }
}

/// The (prompt, completion) sides of line `v` (at `at`, "FILE:LINE"): `prompt` and `completion`,
/// or `messages` split before its last message, which must be the assistant's.
fn pair_side(v: &serde_json::Value, at: &str) -> anyhow::Result<(Side, Side)> {
    const FORMS: &str = "a line is {\"prompt\", \"completion\"} (strings or lists of chat \
                         messages) or {\"messages\": [...]}, TRL's conversational rows";
    if !v.is_object() {
        bail!("{at}: expected a JSON object; {FORMS}");
    }
    if v.get("prompt").is_none() {
        if let Some(m) = v.get("messages") {
            let mut msgs = messages(m, "messages", at)?;
            let last = msgs.len() - 1;
            if msgs[last].role != "assistant" {
                bail!(
                    "{at}: field `messages[{last}].role` is {:?}: the last message is the \
                     completion and must be the assistant's",
                    msgs[last].role
                );
            }
            if last == 0 {
                bail!(
                    "{at}: field `messages` holds the assistant's message alone: the messages \
                     before the last one are the prompt, and there must be at least one"
                );
            }
            let c = msgs.split_off(last);
            return Ok((Side::Chat(msgs), Side::Chat(c)));
        }
    }
    let side = |f: &str| -> anyhow::Result<Side> {
        match v.get(f) {
            Some(serde_json::Value::String(s)) => Ok(Side::Text(s.clone())),
            Some(m @ serde_json::Value::Array(_)) => Ok(Side::Chat(messages(m, f, at)?)),
            Some(other) => bail!(
                "{at}: field `{f}` must be a string or a list of chat messages, found {}",
                json_kind(other)
            ),
            None => bail!("{at}: field `{f}` is missing; {FORMS}"),
        }
    };
    Ok((side("prompt")?, side("completion")?))
}

/// The chat messages of field `f` (a non-empty list of `{"role", "content"}` objects, roles
/// system, user or assistant); errors name `FILE:LINE` and the message's field.
fn messages(v: &serde_json::Value, f: &str, at: &str) -> anyhow::Result<Vec<Message>> {
    let Some(items) = v.as_array() else {
        bail!(
            "{at}: field `{f}` must be a list of chat messages, found {}",
            json_kind(v)
        );
    };
    if items.is_empty() {
        bail!("{at}: field `{f}` is an empty list of chat messages");
    }
    items
        .iter()
        .enumerate()
        .map(|(i, m)| {
            let get = |k: &str| m.get(k).and_then(|x| x.as_str());
            let role = match get("role") {
                Some(r @ ("system" | "user" | "assistant")) => r,
                _ => bail!(
                    "{at}: field `{f}[{i}].role` must be \"system\", \"user\" or \"assistant\", \
                     found {}",
                    m.get("role").map_or("nothing", json_kind)
                ),
            };
            let Some(content) = get("content") else {
                bail!(
                    "{at}: field `{f}[{i}].content` must be a string, found {}",
                    m.get("content").map_or("nothing", json_kind)
                );
            };
            Ok(Message::new(role, content))
        })
        .collect()
}

/// Names a JSON value's type for an error (`a number`, `an object`, ...).
fn json_kind(v: &serde_json::Value) -> &'static str {
    match v {
        serde_json::Value::Null => "null",
        serde_json::Value::Bool(_) => "a boolean",
        serde_json::Value::Number(_) => "a number",
        serde_json::Value::String(_) => "a string",
        serde_json::Value::Array(_) => "a list",
        serde_json::Value::Object(_) => "an object",
    }
}

/// Prompt and completion ids of a conversation split into `prompt` and `completion` messages:
/// the prompt rendered with the generation prompt; the completion the rest of the whole
/// conversation's rendering, cut after its last EOS token, else with `eos` appended.
fn chat_pair(
    tok: &TokenizerBundle,
    prompt: &[Message],
    completion: &[Message],
    eos: u32,
) -> anyhow::Result<(Vec<u32>, Vec<u32>)> {
    let p = tok.apply_chat_template(prompt, true)?;
    let all: Vec<Message> = prompt.iter().chain(completion).cloned().collect();
    let whole = tok.apply_chat_template(&all, false)?;
    let Some(rest) = whole.strip_prefix(&p) else {
        bail!(
            "the chat template renders the prompt messages (with the generation prompt) other than \
             as the start of the whole conversation, so the completion's tokens cannot be told \
             apart; give the prompt and completion as strings with --chat instead"
        );
    };
    let mut c = tok.encode(rest, false)?;
    match c.iter().rposition(|t| tok.eos_ids.contains(t)) {
        Some(k) => c.truncate(k + 1),
        None => c.push(eos),
    }
    Ok((tok.encode(&p, false)?, c))
}

/// Pairs from the `[data]` train split: the rendered prompt and the problem's reference as the
/// completion (EOS appended).
///
/// # Errors
/// Data and tokenizer errors, a tokenizer without EOS.
pub fn pairs_from_config(
    data: &rlvr_data::config::DataConfig,
    tok: &TokenizerBundle,
    max_completion_len: Option<usize>,
) -> anyhow::Result<Vec<SftPair>> {
    let Some(&eos) = tok.eos_ids.first() else {
        bail!("the tokenizer has no EOS token: SFT trains the EOS that ends each completion");
    };
    let p = crate::feed::prompts::prepare_prompts(
        data,
        rlvr_data::generate::Split::Train,
        tok,
        rlvr_data::config::Scoring::Verifier,
    )?;
    let plain = data.style == rlvr_data::config::PromptStyle::Plain;
    p.texts
        .iter()
        .zip(&p.references)
        .map(|(t, r)| {
            let mut completion = tok.encode(r, false)?;
            completion.push(eos);
            if let Some(m) = max_completion_len {
                completion.truncate(m);
            }
            Ok(SftPair {
                prompt: tok.encode(t, plain)?,
                completion,
            })
        })
        .collect()
}

/// Σ_t ℓ_t over the completion tokens of `rows`, with gradient (a scalar), and the token count.
///
/// # Errors
/// Tensor errors.
pub fn completion_logprob_sum(
    model: &Model,
    pairs: &[SftPair],
    rows: &[usize],
    pad: u32,
) -> anyhow::Result<(Tensor, usize)> {
    let packed: Vec<(&[u32], &[u32])> = rows
        .iter()
        .map(|&i| (&pairs[i].prompt[..], &pairs[i].completion[..]))
        .collect();
    let p = pack_rows(&packed, pad);
    let n_out = p.columns();
    // Output column k predicts token start + k + 1: weight 1 on the completion tokens' columns.
    let mut w = vec![0f32; rows.len() * n_out];
    for (r, at) in p.at.iter().enumerate() {
        for &k in at {
            w[r * n_out + k] = 1.0;
        }
    }
    let tokens = rows.iter().map(|&i| pairs[i].completion.len()).sum();
    let out = model.token_logprobs(&p.ids, &p.mask, p.start, 1.0, false, true)?;
    let w = Tensor::from_vec(w, (rows.len(), n_out), model.device())?;
    Ok(((out.logprobs * w)?.sum_all()?, tokens))
}

/// When SFT stops before its last step, checked at each evaluation.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum StopRule {
    /// Run every step.
    Never,
    /// Stop at the first evaluation whose accuracy is at least this (`rlvr sft --stop-at-accuracy`).
    AccuracyAtLeast(f64),
    /// Stop at the first evaluation whose accuracy lies in `[lo, hi]` (the quickstart: a warm start
    /// that leaves RL room to show a gain).
    AccuracyWithin(f64, f64),
}

impl StopRule {
    /// Whether `accuracy` ends the run.
    pub fn reached(&self, accuracy: f64) -> bool {
        match *self {
            StopRule::Never => false,
            StopRule::AccuracyAtLeast(x) => accuracy >= x,
            StopRule::AccuracyWithin(lo, hi) => (lo..=hi).contains(&accuracy),
        }
    }
}

/// Settings of one SFT run.
#[derive(Debug, Clone)]
pub struct SftSettings {
    /// Pairs per optimizer step (≥ 1).
    pub batch_size: usize,
    /// Rows per forward/backward (≥ 1; does not change the gradient).
    pub micro_batch_size: usize,
    /// Learning rate and its schedule; its `steps` is the number of optimizer steps.
    pub schedule: LrSchedule,
    /// AdamW hyper-parameters (`lr` is taken from the schedule at each step).
    pub adamw: AdamWConfig,
    /// Global gradient-norm clip (0 = off).
    pub grad_clip: f64,
    /// Seed of the batch shuffle.
    pub seed: u64,
    /// Evaluate every this many steps (0 = never; needs an evaluator).
    pub eval_every: u64,
    /// When to stop early.
    pub stop: StopRule,
    /// Save the model every this many steps (0 = only at the end).
    pub save_every: u64,
    /// dtype of the saved weights.
    pub save_dtype: DType,
}

/// What one SFT step reports to the caller's progress callback.
#[derive(Debug, Clone)]
pub struct SftStep<'a> {
    /// Step (1-based).
    pub step: u64,
    /// Batch loss (token-mean cross-entropy).
    pub loss: f64,
    /// The evaluation run after this step, if any.
    pub eval: Option<&'a EvalResult>,
    /// Steps of the run.
    pub steps: u64,
    /// The step's metrics.jsonl line (its null keys included).
    pub metrics: &'a MetricsLine,
}

/// What an SFT run reached.
#[derive(Debug, Clone, PartialEq)]
pub struct SftOutcome {
    /// Steps run.
    pub steps: u64,
    /// Loss of the last step (NaN when no step ran).
    pub loss: f64,
    /// Accuracy of the last evaluation, if any ran.
    pub accuracy: Option<f64>,
}

/// Trains `model` in place on `pairs` as `s` says, writing into the model directory `out` (module
/// docs); `progress` is called after every step.
///
/// # Errors
/// Tensor, evaluation and I/O errors; a non-finite loss or gradient, or a weight the update made
/// NaN or infinite ([`crate::update::optimizer::NonFiniteWeight`]), aborts (nothing is saved for
/// that step).
pub fn train_sft(
    model: &Model,
    tok: &TokenizerBundle,
    pairs: &[SftPair],
    s: &SftSettings,
    evaluator: Option<&Evaluator>,
    out: &Path,
    progress: &mut dyn FnMut(&SftStep),
) -> anyhow::Result<SftOutcome> {
    train_sft_on(
        model,
        tok,
        pairs,
        s,
        evaluator,
        out,
        progress,
        Job::single(),
    )
}

/// [`train_sft`] as one rank of `job` ([`Job::single`]: one process, [`train_sft`]): every
/// rank draws the same batch, trains its [`Job::my_range`] of the pairs with the whole
/// batch's token normaliser, the gradients and the non-finite flag are summed over the ranks
/// (`rlvr_dist::DistReduce`) and the loss too, so each step is the one-process step within
/// rounding; evaluation is split ([`Evaluator::record_split`]); rank 0 alone writes `out` and
/// calls `progress`.
///
/// # Errors
/// As [`train_sft`]; a failed collective.
#[allow(clippy::too_many_arguments)]
pub fn train_sft_on(
    model: &Model,
    tok: &TokenizerBundle,
    pairs: &[SftPair],
    s: &SftSettings,
    evaluator: Option<&Evaluator>,
    out: &Path,
    progress: &mut dyn FnMut(&SftStep),
    mut job: Job,
) -> anyhow::Result<SftOutcome> {
    if s.batch_size == 0 || s.micro_batch_size == 0 {
        bail!("the SFT batch size and micro-batch size must be at least 1");
    }
    let writer = job.writer();
    let mut opt = OptimizerStep::new(model, s.adamw, s.grad_clip)?;
    if job.is_parallel() {
        let params: Vec<Tensor> = model
            .named_vars()
            .iter()
            .map(|(_, v)| v.as_tensor().clone())
            .collect();
        let reduce = rlvr_dist::DistReduce::new(Box::new(job.comm()), &params)?;
        opt = opt.with_reduce(Box::new(reduce))?;
    }
    let metrics = out.join("metrics.jsonl");
    if writer {
        std::fs::create_dir_all(out).with_context(|| format!("creating {}", out.display()))?;
        let _ = std::fs::remove_file(&metrics);
        let _ = std::fs::remove_file(out.join("eval.jsonl"));
    }
    let mut sampler = PromptSampler::new(pairs.len(), s.seed)?;
    let save = || -> anyhow::Result<()> {
        if !writer {
            return Ok(());
        }
        model.save(out, s.save_dtype)?;
        write_tokenizer_files(out, tok)?;
        Ok(())
    };
    let mut done = SftOutcome {
        steps: 0,
        loss: f64::NAN,
        accuracy: None,
    };
    for step in 1..=s.schedule.steps {
        let t0 = Instant::now();
        let batch = sampler.next_batch(s.batch_size);
        let total: usize = batch.iter().map(|&i| pairs[i].completion.len()).sum();
        let mut grads = opt.gradients();
        let mut loss = 0.0;
        let mine = &batch[job.my_range(batch.len())];
        for mb in mine.chunks(s.micro_batch_size) {
            let (sum, _) = completion_logprob_sum(model, pairs, mb, tok.pad_id)?;
            let l = (sum.neg()? / total as f64)?;
            loss += l.to_dtype(DType::F64)?.to_scalar::<f64>()?;
            opt.accumulate(&mut grads, &l)?;
        }
        let mut l = [loss];
        job.sum_f64(&mut l)?;
        loss = l[0];
        if !loss.is_finite() {
            grads.mark_non_finite();
        }
        let lr = s.schedule.at(step);
        // A weight the update made NaN or infinite ends SFT as a non-finite loss does.
        let applied = opt
            .apply(grads, lr)
            .with_context(|| format!("SFT step {step}"))?;
        let Some(norm) = applied else {
            bail!("SFT step {step}: non-finite loss or gradient; lower the learning rate");
        };
        let secs = t0.elapsed().as_secs_f64();
        let mut line = MetricsLine::new(step);
        line.set("loss", Some(loss));
        line.set("lr", Some(lr));
        line.set("grad_norm", Some(norm));
        line.set("time/train_s", Some(secs));
        line.set("tokens_per_s", Some(total as f64 / secs.max(1e-9)));
        let eval = match evaluator {
            // Every eval_every steps and at the last step.
            Some(ev)
                if s.eval_every > 0 && (step % s.eval_every == 0 || step == s.schedule.steps) =>
            {
                let r = ev.record_split(model, tok, step, writer.then_some(out), &mut job)?;
                for (k, v) in r.metrics() {
                    line.set_value(k, v);
                }
                Some(r)
            }
            _ => None,
        };
        if writer {
            append_line(&metrics, &compact(&line)?)?;
        }
        done = SftOutcome {
            steps: step,
            loss,
            accuracy: eval.as_ref().map(|r| r.accuracy).or(done.accuracy),
        };
        if writer {
            progress(&SftStep {
                step,
                loss,
                eval: eval.as_ref(),
                steps: s.schedule.steps,
                metrics: &line,
            });
        }
        if s.save_every > 0 && step % s.save_every == 0 {
            save()?;
        }
        if eval.is_some_and(|r| s.stop.reached(r.accuracy)) {
            break;
        }
    }
    save()?;
    Ok(done)
}

/// The line without its null keys: SFT lines carry only the keys that apply.
fn compact(line: &MetricsLine) -> anyhow::Result<String> {
    let json: serde_json::Value = serde_json::from_str(&line.to_json())?;
    let map: serde_json::Map<String, serde_json::Value> = json
        .as_object()
        .context("a metrics line is an object")?
        .iter()
        .filter(|(_, v)| !v.is_null())
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    Ok(serde_json::Value::Object(map).to_string())
}
