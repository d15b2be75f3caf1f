//! `rlvr logprobs`: per-token log-probs of a completion under a model.

use std::io::Write;
use std::path::PathBuf;

use anyhow::{bail, Context};
use rlvr_model::Message;

/// Arguments of `rlvr logprobs` (DESIGN.md section 10).
#[derive(clap::Args, Debug)]
pub struct LogprobsArgs {
    /// Model directory (config.json, safetensors, tokenizer.json, ...).
    #[arg(long)]
    pub model: PathBuf,
    /// Prompt text. Plain prompts are encoded as the tokenizer's post-processor says (BOS for
    /// Llama); with --chat it is rendered as one user message by the chat template and encoded
    /// without added special tokens.
    #[arg(long)]
    pub prompt: String,
    /// Completion text, encoded alone without special tokens and appended to the prompt.
    #[arg(long)]
    pub completion: String,
    /// Render the prompt with the model's chat template.
    #[arg(long)]
    pub chat: bool,
    /// Logits are divided by T before the log-softmax.
    #[arg(long, default_value_t = 1.0)]
    pub temperature: f64,
    /// Compute dtype: f32 or bf16.
    #[arg(long, default_value = "f32")]
    pub dtype: String,
    /// Device: cpu or cuda:N.
    #[arg(long, default_value = "cpu")]
    pub device: String,
    /// The fused GPU kernels to use (the config's `[kernels]` switches), for A/B runs: `all`,
    /// `none`, or a comma-separated list of keys (e.g. `attention,rms_norm`: those on, the rest
    /// off). Default: each `auto` (on only once verified on a GPU). A no-op on the CPU.
    #[arg(long, value_name = "LIST")]
    pub fused: Option<String>,
}

/// Prints `{"tokens": [completion ids], "logprobs": [one per completion id]}`.
pub fn run(a: &LogprobsArgs, out: &mut dyn Write) -> anyhow::Result<()> {
    let most = rlvr_rollout::params::MAX_TEMPERATURE;
    if !(a.temperature.is_finite() && a.temperature > 0.0 && a.temperature <= most) {
        bail!(
            "--temperature {:e} is out of range: expected a finite T in (0, {most}] (the logits \
             are divided by it)",
            a.temperature
        );
    }
    let dtype = rlvr_model::parse_dtype(&a.dtype)
        .with_context(|| format!("--dtype {}: expected f32 or bf16", a.dtype))?;
    let device = rlvr_model::parse_device(&a.device)?;
    let kernels = match &a.fused {
        Some(list) => Some(rlvr_model::KernelSwitches::from_fused_list(list)?),
        None => None,
    };
    let mut policy = rlvr_train::store::manifest::load_policy(&a.model, dtype, &device)?;
    if let Some(k) = kernels {
        policy.model.set_kernels(k);
    }
    let tok = &policy.tokenizer;
    let prompt_ids = if a.chat {
        let text = tok.apply_chat_template(&[Message::new("user", &a.prompt)], true)?;
        tok.encode(&text, false)?
    } else {
        tok.encode(&a.prompt, true)?
    };
    let completion_ids = tok.encode(&a.completion, false)?;
    if completion_ids.is_empty() {
        bail!("--completion encodes to no tokens");
    }
    if prompt_ids.is_empty() {
        bail!("--prompt encodes to no tokens (a plain prompt needs at least one token)");
    }
    let mut ids = prompt_ids.clone();
    ids.extend(&completion_ids);
    let mask = vec![1u32; ids.len()];
    let start = prompt_ids.len() - 1;
    let lp = policy
        .model
        .token_logprobs(&[ids], &[mask], start, a.temperature, false, false)?;
    let logprobs: Vec<f32> = lp
        .logprobs
        .squeeze(0)?
        .to_dtype(candle_core::DType::F32)?
        .to_vec1()?;
    writeln!(
        out,
        "{}",
        serde_json::json!({"tokens": completion_ids, "logprobs": logprobs})
    )?;
    Ok(())
}
