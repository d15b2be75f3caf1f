//! `rlvr generate` (DESIGN.md section 10): sample completions from a model directory.
//!
//! Prints one JSON object per completion on `out`, groups contiguous, in prompt order:
//! `{"prompt_index", "sample_index", "text", "token_ids", "behaviour_logprobs", "finish_reason"}`,
//! where `text` is the completion decoded without special tokens, `token_ids` include a generated
//! EOS, `behaviour_logprobs` has one entry per token (DESIGN.md section 3) and `finish_reason` is
//! "eos" (an EOS id or a `--stop` string ended it) or "length". With `--out FILE.jsonl` the same
//! completions are also written in the experiences format (`reward` null, `group_id` = prompt
//! index, `version` 0), so that `rlvr train` can learn from them later.
//!
//! With `--env CONFIG.toml` (the rlvr binary only) each sample is a multi-turn episode of that
//! config's environment (docs/DESIGN.md section 14) and each line is one episode with its
//! transcript and token accounting (`rlvr_train::cli::run_generate`).
//!
//! Prompts: `--prompt TEXT`, or `--prompts FILE.jsonl` with one `{"prompt": TEXT}` per line
//! (lines split on `\n` only; blank lines skipped; other keys are ignored, or with `--env` handed
//! to the environment as the row). A plain prompt is encoded as the tokenizer's
//! post-processor says (BOS for Llama); with `--chat` it is rendered as one user message by the
//! model's chat template (with the generation prompt) and encoded without added special tokens.

use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context};
use candle_core::DType;
use rlvr_model::checkpoint::Policy;
use rlvr_model::{Message, TokenizerBundle};
use serde::Serialize;

use crate::backend::{flatten, NativeRollout, Rollout};
use crate::engine::{Completion, PromptIds, Sampler, SamplingParams};

/// Compute dtype of `--dtype`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum DtypeArg {
    /// 32-bit float.
    F32,
    /// bfloat16.
    Bf16,
}

/// Arguments of `rlvr generate`.
#[derive(Debug, Clone, clap::Args)]
pub struct GenerateArgs {
    /// Model directory (config.json, safetensors weights, tokenizer.json).
    #[arg(long, value_name = "DIR")]
    pub model: PathBuf,
    /// One prompt.
    #[arg(
        long,
        value_name = "TEXT",
        required_unless_present = "prompts",
        conflicts_with = "prompts"
    )]
    pub prompt: Option<String>,
    /// Many prompts: a JSONL file with one {"prompt": TEXT} per line.
    #[arg(long, value_name = "FILE.jsonl")]
    pub prompts: Option<PathBuf>,
    /// Render each prompt as a user message with the model's chat template.
    #[arg(long)]
    pub chat: bool,
    /// Group size K: completions per prompt (1 to 4096).
    #[arg(short = 'n', value_name = "K", default_value_t = 1)]
    pub n: usize,
    /// Softmax temperature T; 0 = greedy.
    #[arg(long, default_value_t = 1.0)]
    pub temperature: f64,
    /// Nucleus (top-p) mass in (0, 1]; 1 = off.
    #[arg(long, default_value_t = 1.0)]
    pub top_p: f64,
    /// Keep only the k most likely tokens (default: off).
    #[arg(long, value_name = "K")]
    pub top_k: Option<usize>,
    /// Most tokens generated per completion (a generated EOS included). Default: 256; with
    /// `--env`, the per-turn limit, the config's rollout.max_new_tokens.
    #[arg(long)]
    pub max_new_tokens: Option<usize>,
    /// Fewest tokens before EOS or a stop string may end a completion (EOS is not drawn until
    /// then); equal to --max-new-tokens for fixed-length completions.
    #[arg(long, default_value_t = 0)]
    pub min_new_tokens: usize,
    /// Stop string (repeatable): a completion ends once its text contains it.
    #[arg(long = "stop", value_name = "TEXT")]
    pub stop: Vec<String>,
    /// Sampling seed; completion (i, j) uses its own stream of (seed, i, j).
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Compute dtype.
    #[arg(long, value_enum, default_value_t = DtypeArg::F32)]
    pub dtype: DtypeArg,
    /// Device: cpu or cuda:N.
    #[arg(long, default_value = "cpu")]
    pub device: String,
    /// Also write the completions as experiences JSONL (reward null, group_id = prompt index,
    /// version 0).
    #[arg(long, value_name = "FILE.jsonl")]
    pub out: Option<PathBuf>,
    /// Most sequences decoded together (bounds KV-cache memory; does not change the tokens).
    #[arg(long, default_value_t = 64)]
    pub max_batch_rows: usize,
    /// Sample on this vLLM OpenAI-compatible server instead of the native engine (repeatable:
    /// groups are spread over the servers), as `rollout.backend = "vllm"` with `rollout.servers`
    /// does in training: the model's weights are pushed to every server first, and behaviour
    /// log-probs are vLLM's (README "Scaling out with vLLM").
    #[arg(long = "server", value_name = "URL")]
    pub servers: Vec<String>,
    /// The servers' `--served-model-name` (`rollout.served_model_name`).
    #[arg(long, default_value = "rlvr-policy")]
    pub served_model_name: String,
    /// Where the pushed weights are written, a directory the servers can read
    /// (`rollout.weights_dir`); default a temporary directory, removed afterwards.
    #[arg(long, value_name = "DIR")]
    pub weights_dir: Option<PathBuf>,
    /// With `--server`: accept vLLM's log-probs renormalised over the tokens `--top-p`/`--top-k`
    /// keep (`rollout.accept_renormalised_logprobs`).
    #[arg(long)]
    pub accept_renormalised_logprobs: bool,
    /// With `--server`: use servers leased to another process (a training run) anyway; the model
    /// is pushed over that run's weights and the run stops at its next weight check. Without it
    /// such servers are refused, naming the run.
    #[arg(long)]
    pub share_server: bool,
    /// The fused GPU kernels to use (the config's `[kernels]` switches), for A/B runs: `all`,
    /// `none`, or a comma-separated list of keys (e.g. `decode,cuda_graphs`: those on, the rest
    /// off). Default: each `auto` (on only once verified on a GPU). A no-op on the CPU.
    #[arg(long, value_name = "LIST")]
    pub fused: Option<String>,
    /// Sample multi-turn episodes of this training config's `[env]` (docs/environments.md): each
    /// of a prompt's K samples is an episode, printed as one JSON line with its transcript and
    /// per-turn token accounting (the rlvr binary only). The config's verifier scores the
    /// built-in `retry` environment (a program gives its own rewards and needs none); more than
    /// `env.max_error_frac` failed episodes in a batch stop it, as in training;
    /// `--max-new-tokens` is the per-turn limit.
    #[arg(long, value_name = "CONFIG.toml")]
    pub env: Option<PathBuf>,
    /// Override a key of `--env`'s config (`--set env.max_turns=3`); repeatable.
    #[arg(long = "set", value_name = "KEY=VALUE", requires = "env")]
    pub set: Vec<String>,
    /// With `--env` and a program environment (`env.command`): the file its whole stderr is
    /// written to (replaced at start, at most 64 MiB; named in the error when the environment
    /// fails). Default: `rlvr-generate.env.stderr` in the working directory.
    #[arg(long, value_name = "FILE", requires = "env")]
    pub env_log: Option<PathBuf>,
}

/// `--max-new-tokens` of `rlvr generate` without `--env` when the flag is not given.
pub const DEFAULT_MAX_NEW_TOKENS: usize = 256;

impl GenerateArgs {
    /// `--max-new-tokens`, or [`DEFAULT_MAX_NEW_TOKENS`] (`rlvr generate --env` sets the flag
    /// from its config's rollout.max_new_tokens when it is not given).
    pub fn max_new_tokens(&self) -> usize {
        self.max_new_tokens.unwrap_or(DEFAULT_MAX_NEW_TOKENS)
    }
}

/// Builds the sampling engine for `rlvr generate` from the loaded policy, the sampling parameters
/// and the longest encoded prompt (tokens). [`run`] uses the native engine; the binary passes one
/// that honours `--server` (a vLLM backend lives above this crate).
pub type RolloutFactory<'a> =
    dyn Fn(&Policy, &SamplingParams, usize) -> anyhow::Result<Box<dyn Rollout>> + 'a;

/// One line of `rlvr generate`'s output.
#[derive(Serialize)]
struct GenerateRecord<'a> {
    prompt_index: usize,
    sample_index: usize,
    text: String,
    token_ids: &'a [u32],
    behaviour_logprobs: &'a [f32],
    finish_reason: &'static str,
}

/// One line of the experiences format (DESIGN.md section 10).
#[derive(Serialize)]
struct ExperienceRecord<'a> {
    prompt_ids: &'a [u32],
    completion_ids: &'a [u32],
    behaviour_logprobs: &'a [f32],
    reward: Option<f64>,
    group_id: usize,
    version: u64,
    finish_reason: &'static str,
}

/// Reads `--prompts`: one `{"prompt": TEXT}` object per `\n`-separated line, blank lines skipped.
///
/// Errors: the file cannot be read; a line is not such an object (the error names file and line).
pub fn read_prompts(path: &Path) -> anyhow::Result<Vec<String>> {
    Ok(read_prompt_rows(path)?
        .into_iter()
        .map(|(p, _)| p)
        .collect())
}

/// Reads `--prompts` as [`read_prompts`] does, keeping each line's other keys (the row an
/// environment's `reset` gets with `--env`).
///
/// Errors: as [`read_prompts`].
pub fn read_prompt_rows(
    path: &Path,
) -> anyhow::Result<Vec<(String, serde_json::Map<String, serde_json::Value>)>> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("{}: cannot read the prompts file", path.display()))?;
    let mut out = Vec::new();
    for (i, line) in text.split('\n').enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let v: serde_json::Value = serde_json::from_str(line)
            .with_context(|| format!("{}:{}: not a JSON object", path.display(), i + 1))?;
        let (Some(p), serde_json::Value::Object(mut row)) = (
            v.get("prompt").and_then(|p| p.as_str()).map(String::from),
            v,
        ) else {
            bail!(
                "{}:{}: expected {{\"prompt\": TEXT}} with a string prompt",
                path.display(),
                i + 1
            );
        };
        row.remove("prompt");
        out.push((p, row));
    }
    if out.is_empty() {
        bail!("{}: no prompts in the file", path.display());
    }
    Ok(out)
}

/// Encodes one prompt: plain text with the tokenizer's special tokens (e.g. Llama's BOS), or with
/// `chat` a user message rendered by the chat template and encoded without added special tokens.
pub fn encode_prompt(tok: &TokenizerBundle, text: &str, chat: bool) -> anyhow::Result<PromptIds> {
    Ok(if chat {
        let rendered = tok.apply_chat_template(&[Message::new("user", text)], true)?;
        tok.encode(&rendered, false)?
    } else {
        tok.encode(text, true)?
    })
}

/// Runs `rlvr generate`: loads the model, samples, prints one JSON line per completion to `out`
/// and writes `--out` when given.
///
/// Errors: bad arguments (each names the flag), an unreadable model directory or prompts file,
/// a malformed prompts line (file and line), a tokenizer or sampling failure, an I/O error.
pub fn run(args: &GenerateArgs, out: &mut dyn Write) -> anyhow::Result<()> {
    if !args.servers.is_empty() {
        bail!("--server needs the vLLM backend, which this entry point does not have (use the rlvr binary)");
    }
    if args.env.is_some() {
        bail!(
            "--env needs environments, which this entry point does not have (use the rlvr binary)"
        );
    }
    run_with(args, out, &native)
}

/// The native engine over the loaded policy (its storage shared, not copied).
///
/// Errors: none today (a `Result` for the [`RolloutFactory`] signature).
pub fn native(
    policy: &Policy,
    _params: &SamplingParams,
    _longest_prompt: usize,
) -> anyhow::Result<Box<dyn Rollout>> {
    let sampler = Sampler::new(&policy.model, 0).with_tokenizer(policy.tokenizer.tokenizer.clone());
    Ok(Box::new(NativeRollout::new(sampler)))
}

/// Refuses a numeric flag out of range before anything is loaded, naming the flag and the range.
///
/// Errors: the first flag out of range.
pub fn check_flags(args: &GenerateArgs) -> anyhow::Result<()> {
    use crate::params::{MAX_GROUP_SIZE, MAX_NEW_TOKENS, MAX_TEMPERATURE};
    if !(1..=MAX_GROUP_SIZE).contains(&args.n) {
        bail!(
            "-n {} is out of range: expected 1 to {MAX_GROUP_SIZE} completions per prompt",
            args.n
        );
    }
    let t = args.temperature;
    if !(t.is_finite() && (0.0..=MAX_TEMPERATURE).contains(&t)) {
        bail!("--temperature {t:e} is out of range: expected a finite T in [0, {MAX_TEMPERATURE}] (0 = greedy)");
    }
    if !(args.top_p > 0.0 && args.top_p <= 1.0) {
        bail!(
            "--top-p {:e} is out of range: expected 0 < top_p <= 1 (1 = off)",
            args.top_p
        );
    }
    let max_new = args.max_new_tokens();
    if !(1..=MAX_NEW_TOKENS).contains(&max_new) {
        bail!("--max-new-tokens {max_new} is out of range: expected 1 to {MAX_NEW_TOKENS}");
    }
    if args.min_new_tokens > max_new {
        bail!(
            "--min-new-tokens {} is out of range: at most --max-new-tokens = {max_new}",
            args.min_new_tokens,
        );
    }
    Ok(())
}

/// [`run`] with the engine `make` builds (module docs).
///
/// Errors: as [`run`], and `make`'s.
pub fn run_with(
    args: &GenerateArgs,
    out: &mut dyn Write,
    make: &RolloutFactory,
) -> anyhow::Result<()> {
    check_flags(args)?;
    let texts: Vec<String> = prompt_rows(args)?.into_iter().map(|(t, _)| t).collect();
    let policy = load_policy(args)?;
    let tok = &policy.tokenizer;
    let prompts = encode_prompts(tok, &texts, args.chat)?;
    let params = sampling_params(args, tok);
    let longest = prompts.iter().map(|p| p.len()).max().unwrap_or(0);
    let mut rollout = make(&policy, &params, longest)?;
    let completions = flatten(rollout.sample(&prompts, 0, &params, args.seed)?)?;
    write_generate(tok, &completions, out)?;
    if let Some(path) = &args.out {
        write_experiences(path, &prompts, &completions)
            .with_context(|| format!("{}: cannot write the experiences file", path.display()))?;
    }
    Ok(())
}

/// The prompts of `--prompt` or `--prompts`, each with its line's other keys (empty for
/// `--prompt`).
///
/// Errors: neither or both given; [`read_prompt_rows`]'s.
pub fn prompt_rows(
    args: &GenerateArgs,
) -> anyhow::Result<Vec<(String, serde_json::Map<String, serde_json::Value>)>> {
    match (&args.prompt, &args.prompts) {
        (Some(p), None) => Ok(vec![(p.clone(), serde_json::Map::new())]),
        (None, Some(path)) => read_prompt_rows(path),
        _ => bail!("give exactly one of --prompt TEXT and --prompts FILE.jsonl"),
    }
}

/// Loads `--model` with `--dtype`, `--device` and `--fused`.
///
/// Errors: a bad device or `--fused` list; an unreadable model directory (naming it).
pub fn load_policy(args: &GenerateArgs) -> anyhow::Result<Policy> {
    let dtype = match args.dtype {
        DtypeArg::F32 => DType::F32,
        DtypeArg::Bf16 => DType::BF16,
    };
    let device = rlvr_model::parse_device(&args.device).context("--device")?;
    let kernels = match &args.fused {
        Some(list) => Some(rlvr_model::KernelSwitches::from_fused_list(list)?),
        None => None,
    };
    let mut policy = Policy::load(&args.model, dtype, &device)
        .with_context(|| format!("loading the model directory {}", args.model.display()))?;
    if let Some(k) = kernels {
        policy.model.set_kernels(k);
    }
    Ok(policy)
}

/// Encodes every prompt with [`encode_prompt`].
///
/// Errors: a tokenizer or template failure, naming the prompt's index.
pub fn encode_prompts(
    tok: &TokenizerBundle,
    texts: &[String],
    chat: bool,
) -> anyhow::Result<Vec<PromptIds>> {
    texts
        .iter()
        .enumerate()
        .map(|(i, t)| encode_prompt(tok, t, chat).with_context(|| format!("encoding prompt {i}")))
        .collect()
}

/// The sampling parameters of the flags: stop ids the tokenizer's EOS ids.
pub fn sampling_params(args: &GenerateArgs, tok: &TokenizerBundle) -> SamplingParams {
    SamplingParams {
        group_size: args.n,
        temperature: args.temperature,
        top_p: args.top_p,
        top_k: args.top_k.filter(|&k| k > 0),
        max_new_tokens: args.max_new_tokens(),
        min_new_tokens: args.min_new_tokens,
        stop_ids: tok.eos_ids.clone(),
        stop_strings: args.stop.clone(),
        max_batch_rows: args.max_batch_rows,
    }
}

fn write_generate(
    tok: &TokenizerBundle,
    completions: &[Completion],
    out: &mut dyn Write,
) -> anyhow::Result<()> {
    for c in completions {
        let rec = GenerateRecord {
            prompt_index: c.prompt_index,
            sample_index: c.sample_index,
            text: tok.decode(&c.token_ids, true)?,
            token_ids: &c.token_ids,
            behaviour_logprobs: &c.behaviour_logprobs,
            finish_reason: c.finish_reason.as_str(),
        };
        serde_json::to_writer(&mut *out, &rec)?;
        out.write_all(b"\n")?;
    }
    out.flush()?;
    Ok(())
}

/// Writes `--out`'s experiences, one JSON object a line, atomically (a kill leaves the old file
/// or the whole new one, never half of it; what a killed one left, `.NAME.tmp-PID`, the next
/// `rlvr generate --out NAME` removes).
fn write_experiences(
    path: &Path,
    prompts: &[PromptIds],
    completions: &[Completion],
) -> anyhow::Result<()> {
    let mut w = Vec::new();
    for c in completions {
        let rec = ExperienceRecord {
            prompt_ids: &prompts[c.prompt_index],
            completion_ids: &c.token_ids,
            behaviour_logprobs: &c.behaviour_logprobs,
            reward: None,
            group_id: c.prompt_index,
            version: 0,
            finish_reason: c.finish_reason.as_str(),
        };
        serde_json::to_writer(&mut w, &rec)?;
        w.push(b'\n');
    }
    rlvr_model::weights::atomic_write(path, &w)?;
    Ok(())
}
