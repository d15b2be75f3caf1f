//! `rlvr sft`: supervised warm start on `{prompt, completion}` JSONL pairs.
//!
//! Loss: token-mean cross-entropy over the completion tokens of the whole batch, the appended EOS
//! included: L = −Σ_i Σ_t ℓ_it / Σ_i n_i, fixed over the batch before micro-batching (so the
//! micro-batch size does not change the gradient). Prompt tokens are not trained. AdamW with the
//! schedules of `[train]`, global gradient-norm clipping, a seeded shuffle per epoch.
//!
//! Output: `--out DIR` is a model directory (`rlvr eval --model`, `model.path`) with a
//! `metrics.jsonl` (`step`, `loss`, `lr`, `grad_norm`, `tokens_per_s`, `time/train_s`).

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{bail, Context};
use candle_core::{backprop::GradStore, DType, Tensor, Var};
use rlvr_data::sampler::PromptSampler;
use rlvr_model::checkpoint::{write_tokenizer_files, Policy};
use rlvr_model::optim::{AdamW, AdamWConfig};
use rlvr_model::{Message, Model, TokenizerBundle};

use crate::config::{lr_at, Schedule, TrainSection};
use crate::metrics::{append_line, MetricsLine};

/// `rlvr sft`.
#[derive(clap::Args, Debug, Clone)]
pub struct SftArgs {
    /// Model directory to start from.
    #[arg(long)]
    pub model: PathBuf,
    /// Training pairs: JSONL with `{"prompt": TEXT, "completion": TEXT}` per line. Without it, the
    /// pairs are the `[data]` train split of `--config`/`--set` (rendered prompt, reference as the
    /// completion: e.g. arithmetic's answer, GSM8K's worked solution).
    #[arg(long)]
    pub data: Option<PathBuf>,
    /// A training config: its `[data]` (task, template, train/test split), `[reward]` and `[eval]` are
    /// used for pairs without `--data` and for `--eval-every`.
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Config overrides (`--set data.task=arithmetic`). Repeatable.
    #[arg(long = "set", value_name = "KEY=VALUE")]
    pub set: Vec<String>,
    /// Evaluate on the held-out split every this many steps (0 = never); `eval/*` keys go to
    /// metrics.jsonl and a line to eval.jsonl in `--out`.
    #[arg(long, default_value_t = 0)]
    pub eval_every: u64,
    /// Stop (and save) at the first evaluation whose accuracy reaches this value.
    #[arg(long)]
    pub stop_at_accuracy: Option<f64>,
    /// Output model directory (written at the end and every `--save-every` steps). An existing
    /// non-empty directory is refused unless `--force`; the `--model` directory always is.
    #[arg(long)]
    pub out: PathBuf,
    /// Write into a non-empty `--out` (its `*.safetensors` files are removed first).
    #[arg(long)]
    pub force: bool,
    /// Render the prompt as a user message with the model's chat template.
    #[arg(long)]
    pub chat: bool,
    /// Pairs per optimizer step.
    #[arg(long, default_value_t = 16)]
    pub batch_size: usize,
    /// Rows per forward/backward (does not change the gradient).
    #[arg(long, default_value_t = 16)]
    pub micro_batch_size: usize,
    /// Passes over the data (ignored when `--steps` is given).
    #[arg(long, default_value_t = 1)]
    pub epochs: u64,
    /// Optimizer steps (default: epochs × ⌈pairs / batch size⌉).
    #[arg(long)]
    pub steps: Option<u64>,
    /// Peak learning rate.
    #[arg(long, default_value_t = 1e-5)]
    pub lr: f64,
    /// Linear warm-up steps.
    #[arg(long, default_value_t = 0)]
    pub warmup_steps: u64,
    /// Schedule: constant, linear or cosine.
    #[arg(long, default_value = "constant")]
    pub schedule: String,
    /// AdamW weight decay.
    #[arg(long, default_value_t = 0.0)]
    pub weight_decay: f64,
    /// Global gradient-norm clip (0 = off).
    #[arg(long, default_value_t = 1.0)]
    pub grad_clip: f64,
    /// Shuffling seed.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Drop completion tokens beyond this many (the EOS included).
    #[arg(long)]
    pub max_completion_len: Option<usize>,
    /// Save the model every this many steps (0 = only at the end).
    #[arg(long, default_value_t = 0)]
    pub save_every: u64,
    /// Weights dtype: f32 or bf16.
    #[arg(long, default_value = "f32")]
    pub dtype: String,
    /// Device: cpu or cuda:N.
    #[arg(long, default_value = "cpu")]
    pub device: String,
}

/// One tokenised pair.
#[derive(Debug, Clone, PartialEq)]
pub struct SftPair {
    /// Prompt ids.
    pub prompt: Vec<u32>,
    /// Completion ids, EOS appended.
    pub completion: Vec<u32>,
}

/// Reads and tokenises `{prompt, completion}` pairs; the first EOS id is appended to each completion.
///
/// # Errors
/// Unreadable file, a line that is not an object with string `prompt` and `completion` (naming file,
/// line and field), tokenizer errors, a tokenizer without EOS.
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
        let at = || format!("{}:{}", path.display(), i + 1);
        let v: serde_json::Value =
            serde_json::from_str(line).with_context(|| format!("{}: invalid JSON", at()))?;
        let field = |f: &str| -> anyhow::Result<String> {
            v.get(f)
                .and_then(|x| x.as_str())
                .map(str::to_string)
                .with_context(|| format!("{}: field `{f}` missing or not a string", at()))
        };
        let (p, c) = (field("prompt")?, field("completion")?);
        let prompt = if chat {
            let rendered = tok.apply_chat_template(&[Message::new("user", &p)], true)?;
            tok.encode(&rendered, false)?
        } else {
            tok.encode(&p, true)?
        };
        if prompt.is_empty() {
            bail!("{}: the prompt encodes to no token", at());
        }
        let mut completion = tok.encode(&c, false)?;
        completion.push(eos);
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
    let p = crate::run::prepare_prompts(data, rlvr_data::generate::Split::Train, tok)?;
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
    let len = rows
        .iter()
        .map(|&i| pairs[i].prompt.len() + pairs[i].completion.len())
        .max()
        .unwrap_or(2)
        .max(2);
    let start = rows
        .iter()
        .map(|&i| pairs[i].prompt.len())
        .min()
        .unwrap_or(1)
        .saturating_sub(1);
    let n_out = len - 1 - start;
    let mut ids = Vec::new();
    let mut mask = Vec::new();
    let mut w = Vec::with_capacity(rows.len() * n_out);
    let mut tokens = 0;
    for &i in rows {
        let p = &pairs[i];
        let mut r = p.prompt.clone();
        r.extend_from_slice(&p.completion);
        let n = r.len();
        r.resize(len, pad);
        let mut m = vec![1u32; n];
        m.resize(len, 0);
        ids.push(r);
        mask.push(m);
        // Output position k predicts token start + k + 1: completion tokens are P..P+C−1.
        for k in 0..n_out {
            let target = start + k + 1;
            let on = target >= p.prompt.len() && target < n;
            w.push(if on { 1f32 } else { 0f32 });
        }
        tokens += p.completion.len();
    }
    let out = model.token_logprobs(&ids, &mask, start, 1.0, false, true)?;
    let w = Tensor::from_vec(w, (rows.len(), n_out), model.device())?;
    Ok(((out.logprobs * w)?.sum_all()?, tokens))
}

/// Runs `rlvr sft`. Prints `{"out", "steps", "loss"}`.
///
/// # Errors
/// Data, model and I/O errors; a non-finite loss aborts (nothing is saved for that step).
pub fn run_sft(a: &SftArgs, out: &mut dyn Write) -> anyhow::Result<()> {
    // --out: never the input model; non-empty only with --force (lock.rs).
    crate::lock::refuse_same_dir(&a.model, &a.out)?;
    crate::lock::prepare_model_output(&a.out, a.force, "--out")?;
    let device = rlvr_model::parse_device(&a.device)?;
    let dtype = rlvr_model::parse_dtype(&a.dtype)
        .with_context(|| format!("--dtype {}: expected f32 or bf16", a.dtype))?;
    let schedule = match a.schedule.as_str() {
        "constant" => Schedule::Constant,
        "linear" => Schedule::Linear,
        "cosine" => Schedule::Cosine,
        s => bail!("--schedule {s}: expected constant, linear or cosine"),
    };
    if a.batch_size == 0 || a.micro_batch_size == 0 {
        bail!("--batch-size and --micro-batch-size must be at least 1");
    }
    let policy = Policy::load(&a.model, dtype, &device)
        .with_context(|| format!("loading {}", a.model.display()))?;
    let raw = crate::config::RawConfig::load(a.config.as_deref(), &a.set)?;
    let pairs = match &a.data {
        Some(d) => read_pairs(d, &policy.tokenizer, a.chat, a.max_completion_len)?,
        None if a.config.is_some() || !a.set.is_empty() => {
            pairs_from_config(&raw.data, &policy.tokenizer, a.max_completion_len)?
        }
        None => bail!(
            "give --data PAIRS.jsonl, or --config/--set naming a task whose train split to use"
        ),
    };
    let evaluator = if a.eval_every > 0 {
        Some(SftEval::new(&raw, &policy.tokenizer)?)
    } else {
        None
    };
    let _ = std::fs::remove_file(a.out.join("eval.jsonl"));
    let per_epoch = pairs.len().div_ceil(a.batch_size) as u64;
    let steps = a.steps.unwrap_or(per_epoch * a.epochs.max(1));
    let t = TrainSection {
        steps,
        lr: a.lr,
        warmup_steps: a.warmup_steps,
        schedule,
        ..TrainSection::default()
    };
    let model = policy.model;
    let vars: Vec<Var> = model
        .named_vars()
        .into_iter()
        .map(|(_, v)| v.clone())
        .collect();
    let mut opt = AdamW::new(
        vars.clone(),
        AdamWConfig {
            lr: a.lr,
            weight_decay: a.weight_decay,
            ..AdamWConfig::default()
        },
    )?;
    std::fs::create_dir_all(&a.out).with_context(|| format!("creating {}", a.out.display()))?;
    let metrics = a.out.join("metrics.jsonl");
    let _ = std::fs::remove_file(&metrics);
    let mut sampler = PromptSampler::new(pairs.len(), a.seed)?;
    let save = |model: &Model| -> anyhow::Result<()> {
        model.save(&a.out, dtype)?;
        write_tokenizer_files(&a.out, &policy.tokenizer)?;
        Ok(())
    };
    let mut last = f64::NAN;
    let mut done = 0;
    for step in 1..=steps {
        let t0 = Instant::now();
        let batch = sampler.next_batch(a.batch_size);
        let total: usize = batch.iter().map(|&i| pairs[i].completion.len()).sum();
        let mut acc: Vec<Option<Tensor>> = vec![None; vars.len()];
        let mut loss = 0.0;
        for mb in batch.chunks(a.micro_batch_size) {
            let (s, _) = completion_logprob_sum(&model, &pairs, mb, policy.tokenizer.pad_id)?;
            let l = (s.neg()? / total as f64)?;
            loss += l.to_dtype(DType::F64)?.to_scalar::<f64>()?;
            let g = l.backward()?;
            for (k, v) in vars.iter().enumerate() {
                if let Some(g) = g.get(v.as_tensor()) {
                    let g = g.to_dtype(DType::F32)?;
                    acc[k] = Some(match acc[k].take() {
                        Some(p) => (p + g)?,
                        None => g,
                    });
                }
            }
        }
        let mut sq = 0.0;
        for g in acc.iter().flatten() {
            sq += g
                .sqr()?
                .sum_all()?
                .to_dtype(DType::F64)?
                .to_scalar::<f64>()?;
        }
        let norm = sq.sqrt();
        if !loss.is_finite() || !norm.is_finite() {
            bail!("SFT step {step}: non-finite loss or gradient; lower --lr");
        }
        let scale = if a.grad_clip > 0.0 && norm > a.grad_clip {
            a.grad_clip / (norm + 1e-6)
        } else {
            1.0
        };
        let mut store = GradStore::default();
        for (k, v) in vars.iter().enumerate() {
            if let Some(g) = acc[k].take() {
                store.insert(v.as_tensor(), (g * scale)?);
            }
        }
        let lr = lr_at(&t, step);
        opt.step(&store, lr)?;
        let secs = t0.elapsed().as_secs_f64();
        let mut line = MetricsLine::new(step);
        line.set("loss", Some(loss));
        line.set("lr", Some(lr));
        line.set("grad_norm", Some(norm));
        line.set("time/train_s", Some(secs));
        line.set("tokens_per_s", Some(total as f64 / secs.max(1e-9)));
        // SFT lines carry only the keys that apply.
        let json: serde_json::Value = serde_json::from_str(&line.to_json())?;
        let compact: serde_json::Map<String, serde_json::Value> = json
            .as_object()
            .expect("object")
            .iter()
            .filter(|(_, v)| !v.is_null())
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        let mut compact = compact;
        let mut reached = false;
        if let (Some(ev), true) = (&evaluator, step % a.eval_every.max(1) == 0) {
            let acc = ev.run(&model, &policy.tokenizer, step, &mut compact, &a.out)?;
            reached = a.stop_at_accuracy.is_some_and(|x| acc >= x);
        }
        append_line(&metrics, &serde_json::Value::Object(compact).to_string())?;
        last = loss;
        done = step;
        if a.save_every > 0 && step % a.save_every == 0 {
            save(&model)?;
        }
        if reached {
            break;
        }
    }
    save(&model)?;
    writeln!(
        out,
        "{}",
        serde_json::json!({"out": a.out, "steps": done, "loss": last})
    )?;
    Ok(())
}

/// Held-out evaluation during SFT.
struct SftEval {
    prompts: crate::run::PreparedPrompts,
    reward: rlvr_reward::combine::RewardFunction,
    settings: crate::eval::EvalSettings,
    task: &'static str,
}

impl SftEval {
    fn new(raw: &crate::config::RawConfig, tok: &TokenizerBundle) -> anyhow::Result<Self> {
        let mut prompts =
            crate::run::prepare_prompts(&raw.data, rlvr_data::generate::Split::Test, tok)?;
        if let Some(n) = raw.eval.limit {
            prompts.texts.truncate(n);
            prompts.references.truncate(n);
        }
        let reward =
            rlvr_reward::combine::RewardFunction::from_config(&raw.reward, &raw.data.verifier()?)?;
        Ok(SftEval {
            prompts,
            reward,
            settings: crate::eval::EvalSettings {
                samples: raw.eval.samples,
                max_new_tokens: raw
                    .eval
                    .max_new_tokens
                    .unwrap_or(raw.rollout.max_new_tokens),
                seed: raw.train.seed,
                max_batch_rows: raw.rollout.max_batch_rows,
                stop: raw.rollout.stop.clone(),
                add_special_tokens: raw.data.style == rlvr_data::config::PromptStyle::Plain,
            },
            task: raw.data.task.name(),
        })
    }

    fn run(
        &self,
        model: &Model,
        tok: &TokenizerBundle,
        step: u64,
        line: &mut serde_json::Map<String, serde_json::Value>,
        out: &Path,
    ) -> anyhow::Result<f64> {
        let (r, _) = crate::eval::evaluate(
            model,
            tok,
            self.task,
            &self.prompts.texts,
            &self.prompts.references,
            &self.reward,
            &self.settings,
        )?;
        line.insert("eval/accuracy".into(), r.accuracy.into());
        line.insert("eval/mean@k".into(), r.mean_at_k.into());
        line.insert("eval/pass@k".into(), r.pass_at_k.into());
        line.insert("eval/n".into(), r.n.into());
        let mut e = serde_json::to_value(&r)?;
        e["step"] = step.into();
        append_line(&out.join("eval.jsonl"), &e.to_string())?;
        Ok(r.accuracy)
    }
}
