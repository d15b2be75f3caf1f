//! `rlvr init`: a randomly initialised checkpoint in HuggingFace format.

use std::io::Write;
use std::path::PathBuf;

use anyhow::{bail, Context};
use candle_core::{DType, Device};
use rlvr_model::checkpoint::{tokenizer_for_init, write_tokenizer_files};
use rlvr_model::{Arch, Model, ModelConfig};

/// The largest `--init-std`: weights drawn with a larger standard deviation overflow every
/// activation of the first layer.
pub const MAX_INIT_STD: f64 = 10.0;

/// Arguments of `rlvr init` (DESIGN.md section 10).
#[derive(clap::Args, Debug)]
pub struct InitArgs {
    /// Architecture: qwen2, qwen3, llama, mistral, gemma2, gemma3_text (Gemma with
    /// transformers' defaults: softcapping for gemma2, attention scale head_dim^-1/2, no window)
    /// or phi3 (fused qkv_proj and gate_up_proj in the file, full rotary, no rope scaling).
    #[arg(long, default_value = "qwen2")]
    pub arch: String,
    /// Hidden size.
    #[arg(long, default_value_t = 64)]
    pub hidden: usize,
    /// Number of decoder layers.
    #[arg(long, default_value_t = 2)]
    pub layers: usize,
    /// Attention heads.
    #[arg(long, default_value_t = 4)]
    pub heads: usize,
    /// Key/value heads (GQA); must divide --heads.
    #[arg(long)]
    pub kv_heads: Option<usize>,
    /// MLP intermediate size (default 4 × hidden).
    #[arg(long)]
    pub intermediate: Option<usize>,
    /// Per-head width (default hidden / heads).
    #[arg(long)]
    pub head_dim: Option<usize>,
    /// tokenizer.json to ship with the checkpoint. A tokenizer_config.json beside it supplies the
    /// special tokens and chat template; otherwise a ChatML template is written.
    #[arg(long)]
    pub tokenizer: PathBuf,
    /// Vocabulary size (default: the tokenizer's size rounded up to a multiple of 64).
    #[arg(long)]
    pub vocab_size: Option<usize>,
    /// Tie lm_head to the embedding (default true for qwen2/qwen3, false for llama).
    #[arg(long)]
    pub tie_embeddings: Option<bool>,
    /// Rotary base θ.
    #[arg(long, default_value_t = 10000.0)]
    pub rope_theta: f64,
    /// Maximum positions recorded in config.json.
    #[arg(long, default_value_t = 4096)]
    pub max_position_embeddings: usize,
    /// Standard deviation of the normal init (transformers' initializer_range).
    #[arg(long, default_value_t = 0.02)]
    pub init_std: f64,
    /// Seed of the weight init.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Storage dtype of the weights: f32 or bf16.
    #[arg(long, default_value = "f32")]
    pub dtype: String,
    /// Output model directory (created). An existing non-empty directory is refused unless
    /// `--force`.
    #[arg(long)]
    pub out: PathBuf,
    /// Write into a non-empty `--out` (its `*.safetensors` weight files are removed first, so a
    /// loader cannot pick stale shards).
    #[arg(long)]
    pub force: bool,
}

/// The most parameters `rlvr init` creates: 10¹¹ (400 GB of f32 weights, built in memory before
/// they are written); larger sizes are typos.
pub const MAX_PARAMETERS: f64 = 1e11;

/// Refuses sizes whose model has more than [`MAX_PARAMETERS`] parameters, or needs more memory
/// than this machine has (`MemTotal` of /proc/meminfo, where there is one: the f32 weights and the
/// written file's bytes), naming the flags. Counted in f64, so no size overflows.
fn check_size(
    a: &InitArgs,
    vocab: usize,
    kv: usize,
    head_dim: usize,
    inter: usize,
    tie: bool,
    dtype: DType,
) -> anyhow::Result<()> {
    let [v, h, l, q, kv, d, i] =
        [vocab, a.hidden, a.layers, a.heads, kv, head_dim, inter].map(|x| x as f64);
    // q, k, v, o projections (+ q/k/v biases), the MLP's three, two norms per layer.
    let layer = 2.0 * h * q * d + 2.0 * h * kv * d + (q + 2.0 * kv) * d + 3.0 * h * i + 2.0 * h;
    let embeddings = if tie { v * h } else { 2.0 * v * h };
    let params = embeddings + l * layer + h;
    let flags = format!(
        "--vocab-size {vocab}, --hidden {}, --layers {}, --heads {}, --kv-heads {kv}, --head-dim \
         {head_dim}, --intermediate {inter}",
        a.hidden, a.layers, a.heads
    );
    anyhow::ensure!(
        params <= MAX_PARAMETERS,
        "the model of {flags} has {params:.3e} parameters: out of range, at most \
         {MAX_PARAMETERS:e} (`rlvr init` builds it in memory)"
    );
    let need = params * (4.0 + dtype.size_in_bytes() as f64);
    if let Some(total) = mem_total_bytes().filter(|&t| need > t as f64) {
        anyhow::bail!(
            "the model of {flags} needs about {:.1} GiB of memory ({params:.3e} parameters in f32, \
             and the file's bytes), more than this machine's {:.1} GiB",
            need / f64::from(1u32 << 30),
            total as f64 / f64::from(1u32 << 30)
        );
    }
    Ok(())
}

/// This machine's memory from /proc/meminfo (`MemTotal`), where there is one.
fn mem_total_bytes() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = text.lines().find(|l| l.starts_with("MemTotal:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    kib.checked_mul(1024)
}

/// Builds the config, writes the model directory, prints `{"out", "parameters", "vocab_size"}`.
///
/// # Errors
/// A size flag of 0 (named), a non-empty `--out` without `--force`, inconsistent head sizes, a model
/// above [`MAX_PARAMETERS`] or this machine's memory, a tokenizer that does not load, I/O errors.
pub fn run(a: &InitArgs, out: &mut dyn Write) -> anyhow::Result<()> {
    // (Sizes first, then the initialisation and position flags.)
    for (flag, v) in [
        ("--hidden", Some(a.hidden)),
        ("--layers", Some(a.layers)),
        ("--heads", Some(a.heads)),
        ("--kv-heads", a.kv_heads),
        ("--intermediate", a.intermediate),
        ("--head-dim", a.head_dim),
        ("--vocab-size", a.vocab_size),
        ("--max-position-embeddings", Some(a.max_position_embeddings)),
    ] {
        if v == Some(0) {
            bail!("{flag} 0: every size of the model must be at least 1");
        }
    }
    if !(a.init_std.is_finite() && (0.0..=MAX_INIT_STD).contains(&a.init_std)) {
        bail!(
            "--init-std {:e}: expected a finite value in [0, {MAX_INIT_STD}] (0.02 is usual; 0 \
             writes all-zero weights)",
            a.init_std
        );
    }
    let most = rlvr_rollout::params::MAX_NEW_TOKENS;
    if a.max_position_embeddings > most {
        bail!(
            "--max-position-embeddings {} is out of range: at most {most}",
            a.max_position_embeddings
        );
    }
    if !(a.rope_theta.is_finite() && a.rope_theta > 0.0) {
        bail!("--rope-theta {}: expected a finite value > 0", a.rope_theta);
    }
    let arch = Arch::from_model_type(&a.arch).with_context(|| {
        format!(
            "--arch {}: expected qwen2, qwen3, llama, mistral, gemma2, gemma3_text or phi3",
            a.arch
        )
    })?;
    let dtype = rlvr_model::parse_dtype(&a.dtype)
        .ok()
        .filter(|d| matches!(d, DType::F32 | DType::BF16))
        .with_context(|| format!("--dtype {}: expected f32 or bf16", a.dtype))?;
    let tok = tokenizer_for_init(&a.tokenizer)?;
    let tok_size = tok.vocab_size();
    let vocab_size = a.vocab_size.unwrap_or(tok_size.div_ceil(64) * 64);
    if vocab_size < tok_size {
        bail!("--vocab-size {vocab_size} is smaller than the tokenizer's {tok_size} tokens");
    }
    let kv = a.kv_heads.unwrap_or(a.heads);
    if a.heads == 0 || kv == 0 || !a.heads.is_multiple_of(kv) {
        bail!(
            "--heads {} must be a positive multiple of --kv-heads {kv}",
            a.heads
        );
    }
    let head_dim = match a.head_dim {
        Some(d) => d,
        None => {
            if !a.hidden.is_multiple_of(a.heads) {
                bail!(
                    "--hidden {} is not divisible by --heads {}; give --head-dim",
                    a.hidden,
                    a.heads
                );
            }
            a.hidden / a.heads
        }
    };
    if head_dim % 2 != 0 {
        bail!("head dim {head_dim} must be even (rotary embeddings)");
    }
    let bos = tok
        .bos_token
        .as_deref()
        .and_then(|t| tok.tokenizer.token_to_id(t));
    let intermediate = a.intermediate.unwrap_or(a.hidden.saturating_mul(4));
    let tie = a.tie_embeddings.unwrap_or(matches!(
        arch,
        Arch::Qwen2 | Arch::Qwen3 | Arch::Gemma2 | Arch::Gemma3
    ));
    check_size(a, vocab_size, kv, head_dim, intermediate, tie, dtype)?;
    let config = ModelConfig {
        arch,
        vocab_size,
        hidden_size: a.hidden,
        intermediate_size: intermediate,
        num_hidden_layers: a.layers,
        num_attention_heads: a.heads,
        num_key_value_heads: kv,
        head_dim,
        rms_norm_eps: 1e-6,
        rope_theta: a.rope_theta,
        rope_scaling: None,
        max_position_embeddings: a.max_position_embeddings,
        sliding_window: None,
        tie_word_embeddings: tie,
        qkv_bias: arch == Arch::Qwen2,
        o_bias: false,
        mlp_bias: false,
        stored_dtype: None,
        bos_token_id: bos,
        eos_token_ids: tok.eos_ids.clone(),
        gemma: rlvr_model::GemmaConfig::defaults_for(arch, head_dim),
        partial_rotary_factor: 1.0,
    };
    // --force over a model: the new one is written into a staging sibling and moved over the old
    // one only when complete, so a failure leaves the old weights in place.
    let staged = rlvr_train::store::lock::StagedOutput::prepare(&a.out, a.force, "--out")?;
    let model = Model::random(config, a.init_std, a.seed, DType::F32, &Device::Cpu)?;
    model.save(staged.path(), dtype)?;
    write_tokenizer_files(staged.path(), &tok)?;
    staged.commit()?;
    writeln!(
        out,
        "{}",
        serde_json::json!({
            "out": a.out.display().to_string(),
            "parameters": model.config().num_parameters(),
            "vocab_size": vocab_size,
        })
    )?;
    Ok(())
}
