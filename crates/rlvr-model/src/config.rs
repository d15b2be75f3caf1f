//! `config.json` of a HuggingFace causal-LM checkpoint, in both the transformers-4 style
//! (`rope_theta`, `rope_scaling`, `torch_dtype` at top level) and the transformers-5 style
//! (`rope_parameters`, `dtype`).

use std::path::Path;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::error::{ModelError, Result};

/// The decoder families rlvr implements.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Arch {
    /// Qwen2 and Qwen2.5 (`model_type` "qwen2"): q/k/v projections carry biases.
    Qwen2,
    /// Qwen3 (`model_type` "qwen3"): RMSNorm on each head of q and k, no q/k/v bias.
    Qwen3,
    /// Llama 2 and 3 (`model_type` "llama"): optional `attention_bias`, Llama-3 rope scaling.
    Llama,
    /// Mistral (`model_type` "mistral"): the Llama layout without biases, with a sliding window
    /// over every layer when `sliding_window` is not null (transformers' `MistralConfig`: 4096
    /// when the field is absent).
    Mistral,
    /// Gemma 2 (`model_type` "gemma2"): RMSNorm scaling by `1 + weight`, four norms per layer,
    /// GeGLU MLP, embeddings scaled by √hidden, attention scale `query_pre_attn_scalar^-½`,
    /// tanh softcapping of attention scores and final logits, a sliding window on alternate
    /// layers ([`GemmaConfig`]).
    Gemma2,
    /// Gemma 3 text (`model_type` "gemma3_text", or the language model of the multimodal
    /// "gemma3" wrapper): Gemma 2's layout with Qwen3-style per-head q/k norms (`1 + weight`), no
    /// softcapping by default, and sliding (local) layers rotating with their own base
    /// `rope_local_base_freq` while the global layers use `rope_theta` and its scaling.
    Gemma3,
    /// Phi-3 and Phi-4-mini (`model_type` "phi3", transformers' `Phi3Config`): the Llama layout
    /// without biases, with q/k/v fused into one `qkv_proj` and gate/up into one `gate_up_proj`
    /// in the checkpoint (rlvr splits them when loading and fuses them again when saving, so
    /// its projections and LoRA targets are the Llama ones), optional `partial_rotary_factor`
    /// and LongRoPE scaling ([`RopeScaling::LongRope`]), and a sliding window over every layer
    /// when `sliding_window` is not null.
    Phi3,
}

impl Arch {
    /// The `model_type` string of config.json.
    pub fn model_type(self) -> &'static str {
        match self {
            Arch::Qwen2 => "qwen2",
            Arch::Qwen3 => "qwen3",
            Arch::Llama => "llama",
            Arch::Mistral => "mistral",
            Arch::Gemma2 => "gemma2",
            Arch::Gemma3 => "gemma3_text",
            Arch::Phi3 => "phi3",
        }
    }

    /// Whether this is a Gemma family ([`GemmaConfig`] holds its settings).
    pub fn is_gemma(self) -> bool {
        matches!(self, Arch::Gemma2 | Arch::Gemma3)
    }

    /// Parses a `model_type` string; `None` for families rlvr does not implement.
    pub fn from_model_type(s: &str) -> Option<Self> {
        match s {
            "qwen2" => Some(Arch::Qwen2),
            "qwen3" => Some(Arch::Qwen3),
            "llama" => Some(Arch::Llama),
            "mistral" => Some(Arch::Mistral),
            "gemma2" => Some(Arch::Gemma2),
            "gemma3_text" | "gemma3" => Some(Arch::Gemma3),
            "phi3" => Some(Arch::Phi3),
            _ => None,
        }
    }
}

/// Rotary position embedding frequency scaling.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum RopeScaling {
    /// Llama-3 "llama3" scaling (transformers `_compute_llama3_parameters`): wavelengths above
    /// `original_max_position_embeddings / low_freq_factor` are divided by `factor`, those below
    /// `original_max_position_embeddings / high_freq_factor` are kept, and the band in between is
    /// interpolated smoothly.
    Llama3 {
        factor: f64,
        low_freq_factor: f64,
        high_freq_factor: f64,
        original_max_position_embeddings: f64,
    },
    /// Linear position interpolation: every inverse frequency divided by `factor`.
    Linear { factor: f64 },
    /// YaRN (Peng et al. 2023, "YaRN: Efficient Context Window Extension of Large Language
    /// Models", arXiv 2309.00071; transformers `_compute_yarn_parameters`): dimensions that turn
    /// fewer than `beta_slow` times over `original_max_position_embeddings` are interpolated
    /// (frequency divided by `factor`), those that turn more than `beta_fast` times are kept, a
    /// linear ramp over the dimension index blends the band between (its ends floored and ceiled
    /// when `truncate`), and cos/sin are multiplied by `attention_factor` (the paper's
    /// `0.1·ln(factor) + 1`, or DeepSeek's `mscale` / `mscale_all_dim` ratio, when config.json
    /// gives none: [`ModelConfig::rope_attention_factor`]).
    Yarn {
        factor: f64,
        original_max_position_embeddings: f64,
        beta_fast: f64,
        beta_slow: f64,
        /// config.json's `attention_factor` (the cos/sin multiplier), when given.
        attention_factor: Option<f64>,
        /// DeepSeek's `mscale` and `mscale_all_dim` (0 when absent: unused).
        mscale: f64,
        mscale_all_dim: f64,
        truncate: bool,
    },
    /// Dynamic NTK scaling (transformers `_compute_dynamic_ntk_parameters` with its
    /// `dynamic_rope_update`): a forward whose largest position `p` has `p + 1 = L` above
    /// `max_position_embeddings` uses the base `theta · (factor·L/max − (factor − 1))^(d/(d−2))`;
    /// up to `max_position_embeddings` it is the default rotary embedding. rlvr computes the
    /// table per forward from that forward's positions, as a freshly loaded transformers model
    /// does ([`ModelConfig::rope_inv_freq_for`]).
    Dynamic { factor: f64 },
    /// LongRoPE (Ding et al. 2024, "LongRoPE: Extending LLM Context Window Beyond 2 Million
    /// Tokens", arXiv 2402.13753; transformers `_compute_longrope_parameters`, rope type
    /// "longrope", Phi-3's "su"): rotary dimension pair `i` turns at `1 / (ext_i ·
    /// theta^(2i/d))`, where `ext` is `short_factor` for a forward whose largest position `p`
    /// has `p + 1 ≤ original_max_position_embeddings` and `long_factor` past it (transformers'
    /// `longrope_frequency_update` decides once per forward by the batch's largest position;
    /// rlvr decides per sequence, which is the same for a forward of one sequence), and cos/sin
    /// are multiplied by `attention_factor` ([`ModelConfig::rope_attention_factor`]).
    LongRope {
        /// Per rotary dimension pair (`rotary_dim / 2` numbers): the divisors of a short forward.
        short_factor: Vec<f64>,
        /// Per rotary dimension pair: the divisors of a forward past the original context.
        long_factor: Vec<f64>,
        /// The pretraining context: the switch point between the two factor lists.
        original_max_position_embeddings: f64,
        /// config.json's `factor`, when given (else `max_position_embeddings / original`).
        factor: Option<f64>,
        /// config.json's `attention_factor`, when given (else `√(1 + ln factor / ln original)`
        /// for a factor above 1, 1 otherwise).
        attention_factor: Option<f64>,
    },
}

/// Sliding-window attention: on the layers it covers, each query attends to its `size` most
/// recent visible keys (itself included), transformers' `sliding_window_causal` mask
/// (`q − k < size`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SlidingWindow {
    /// The window in tokens (`sliding_window`).
    pub size: usize,
    /// Per decoder layer, whether it attends through the window (`layer_types[i] ==
    /// "sliding_attention"`; for Qwen2/Qwen3 without `layer_types`, the layers from
    /// `max_window_layers` on; every layer for Mistral).
    pub layers: Vec<bool>,
}

/// The settings of the Gemma 2 and Gemma 3 text models (transformers' `Gemma2Config`,
/// `Gemma3TextConfig`) beyond the Llama layout's.
#[derive(Debug, Clone, PartialEq)]
pub struct GemmaConfig {
    /// Attention scores are `q·kᵀ · query_pre_attn_scalar^-½` (not `head_dim^-½`).
    pub query_pre_attn_scalar: f64,
    /// Attention scores become `cap · tanh(scores / cap)` before the mask (`None`: off).
    pub attn_logit_softcapping: Option<f64>,
    /// Logits become `cap · tanh(logits / cap)` before any softmax (`None`: off).
    pub final_logit_softcapping: Option<f64>,
    /// Gemma 3: the rotary base of the sliding (local) layers, which use the default rope
    /// without scaling (`rope_local_base_freq`, or `rope_parameters.sliding_attention`);
    /// `None` (Gemma 2): every layer rotates as [`ModelConfig::rope_theta`] says.
    pub rope_local_base_freq: Option<f64>,
}

impl GemmaConfig {
    /// transformers' defaults for `arch` (`None` for non-Gemma architectures), with the
    /// attention scale `head_dim^-½` (what `rlvr init` writes for a new random model).
    pub fn defaults_for(arch: Arch, head_dim: usize) -> Option<Self> {
        match arch {
            Arch::Gemma2 => Some(Self {
                query_pre_attn_scalar: head_dim as f64,
                attn_logit_softcapping: Some(50.0),
                final_logit_softcapping: Some(30.0),
                rope_local_base_freq: None,
            }),
            Arch::Gemma3 => Some(Self {
                query_pre_attn_scalar: head_dim as f64,
                attn_logit_softcapping: None,
                final_logit_softcapping: None,
                rope_local_base_freq: Some(10_000.0),
            }),
            _ => None,
        }
    }
}

/// The model hyper-parameters rlvr needs, normalised from either config style.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelConfig {
    pub arch: Arch,
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub num_hidden_layers: usize,
    pub num_attention_heads: usize,
    pub num_key_value_heads: usize,
    /// Per-head width; `hidden_size / num_attention_heads` unless config.json gives `head_dim`.
    pub head_dim: usize,
    pub rms_norm_eps: f64,
    pub rope_theta: f64,
    pub rope_scaling: Option<RopeScaling>,
    pub max_position_embeddings: usize,
    /// Sliding-window attention, when config.json turns it on for at least one layer.
    pub sliding_window: Option<SlidingWindow>,
    pub tie_word_embeddings: bool,
    /// Whether q/k/v projections carry a bias (always for qwen2; `attention_bias` for llama).
    pub qkv_bias: bool,
    /// Whether the output projection carries a bias (llama `attention_bias`).
    pub o_bias: bool,
    /// Whether the MLP projections carry a bias (llama `mlp_bias`).
    pub mlp_bias: bool,
    /// Storage dtype named by `torch_dtype` / `dtype` ("float32", "bfloat16", ...), if any.
    pub stored_dtype: Option<String>,
    pub bos_token_id: Option<u32>,
    /// EOS ids from config.json (`eos_token_id`, an int or a list).
    pub eos_token_ids: Vec<u32>,
    /// Gemma 2 / Gemma 3 settings; `Some` exactly for those architectures.
    pub gemma: Option<GemmaConfig>,
    /// The fraction of each head's dimensions that rotate (`partial_rotary_factor`, 1 when
    /// absent): the first [`ModelConfig::rotary_dim`] of each q and k head take the rotary
    /// embedding, the rest pass through (transformers' `apply_rotary_pos_emb` with a shorter
    /// cos/sin). Phi-4-mini uses 0.75.
    pub partial_rotary_factor: f64,
}

fn get<'a>(v: &'a Value, key: &str) -> Option<&'a Value> {
    v.get(key).filter(|x| !x.is_null())
}

/// The largest value rlvr accepts for each size of config.json, far above every released model
/// (the largest use hidden 16384-25600, 128 layers, MLP 53248-73728, 256k vocabularies, 10M
/// positions) and small enough that every count rlvr derives from them (parameters, bytes,
/// activations) stays far inside `u64`, so a corrupt or hostile config.json is refused by name
/// instead of overflowing `rlvr plan` or a tensor allocation.
pub const MAX_SIZES: [(&str, usize); 8] = [
    ("hidden_size", 1 << 17),
    ("intermediate_size", 1 << 19),
    ("num_hidden_layers", 1 << 12),
    ("num_attention_heads", 1 << 12),
    ("num_key_value_heads", 1 << 12),
    ("head_dim", 1 << 13),
    ("vocab_size", 1 << 23),
    ("max_position_embeddings", 1 << 26),
];

/// A size field of config.json: an integer from 1 to its [`MAX_SIZES`] bound.
fn req_usize(v: &Value, key: &str, file: &Path) -> Result<usize> {
    let x = get(v, key)
        .and_then(Value::as_u64)
        .ok_or_else(|| ModelError::Config {
            file: file.to_path_buf(),
            msg: format!("field `{key}` is missing or not a non-negative integer"),
        })?;
    let max = MAX_SIZES
        .iter()
        .find(|(k, _)| *k == key)
        .map_or(usize::MAX, |&(_, m)| m);
    if x == 0 || x > max as u64 {
        return Err(ModelError::Config {
            file: file.to_path_buf(),
            msg: format!(
                "field `{key}` = {x} is outside 1..={max} (no released model comes near that \
                 bound; is the file corrupt?)"
            ),
        });
    }
    Ok(x as usize)
}

/// Why `rope_theta` must be positive, for its error message.
const ROPE_THETA_WHY: &str = "the rotary base: every inverse frequency is theta^(-2i/d), so 0 or \
     less makes them infinite or NaN (released models use 10000 to 1000000)";

/// Why the rope scaling numbers must be positive, for their error messages.
const ROPE_SCALING_WHY: &str =
    "rope scaling divides rotary frequencies or wavelengths by it, so 0 \
     or less makes them infinite or NaN (Llama 3.1 uses factor 8)";

/// Why `rms_norm_eps` must be positive, for its error message.
const RMS_NORM_EPS_WHY: &str = "RMSNorm divides by sqrt(mean(x²) + eps), so 0 or less gives \
     infinite or NaN activations (released models use 1e-5 or 1e-6)";

/// The number `x` of config.json's field `key` when it is finite and above 0.
///
/// # Errors
/// [`ModelError::Config`] naming `file`, the field, its value and `why` it must be positive: a
/// value that is not a number, not finite (a JSON number beyond f64's range) or ≤ 0.
fn positive(x: &Value, key: &str, why: &str, file: &Path) -> Result<f64> {
    match x.as_f64() {
        Some(f) if f.is_finite() && f > 0.0 => Ok(f),
        _ => Err(ModelError::Config {
            file: file.to_path_buf(),
            msg: format!(
                "field `{key}` = {} is out of range: expected a finite number > 0 ({why})",
                shown(x)
            ),
        }),
    }
}

/// A config.json value as written in an error: at most 40 characters of its JSON.
fn shown(x: &Value) -> String {
    let s = x.to_string();
    if s.chars().count() <= 40 {
        s
    } else {
        let head: String = s.chars().take(40).collect();
        format!("{head}… ({} characters)", s.chars().count())
    }
}

/// Why the YaRN numbers must be positive, for their error messages.
const YARN_WHY: &str = "YaRN divides by it or takes its logarithm, so 0 or less makes the \
     rotary frequencies or the attention factor infinite or NaN (Qwen2.5 uses factor 4 over \
     32768 positions; beta_fast and beta_slow default to 32 and 1)";

/// YaRN's settings from the rope scaling object `s` of config.json `v` (`key`: its field name,
/// for errors), as transformers' `standardize_rope_params` and `_compute_yarn_parameters` read
/// them: `original_max_position_embeddings` from the top level when config.json has it there,
/// else from `s`, else `max_position_embeddings`; `beta_fast` 32 and `beta_slow` 1 when absent;
/// `attention_factor` from `factor`, `mscale` and `mscale_all_dim` when absent; `truncate` true
/// when absent.
///
/// # Errors
/// [`ModelError::Config`] naming `file` and the field: a number that is not finite and > 0
/// (`mscale` and `mscale_all_dim` may be 0, which transformers reads as absent), `beta_fast` not
/// above `beta_slow`, or `truncate` not a boolean.
fn yarn(
    s: &Value,
    v: &Value,
    key: &str,
    max_position_embeddings: usize,
    factor: f64,
    opt: &dyn Fn(&str, &str) -> Result<Option<f64>>,
    file: &Path,
) -> Result<RopeScaling> {
    let cerr = |msg: String| ModelError::Config {
        file: file.to_path_buf(),
        msg,
    };
    let original = match get(v, "original_max_position_embeddings") {
        Some(x) => positive(x, "original_max_position_embeddings", YARN_WHY, file)?,
        None => opt("original_max_position_embeddings", YARN_WHY)?
            .unwrap_or(max_position_embeddings as f64),
    };
    let beta_fast = opt("beta_fast", YARN_WHY)?.unwrap_or(32.0);
    let beta_slow = opt("beta_slow", YARN_WHY)?.unwrap_or(1.0);
    if beta_fast <= beta_slow {
        return Err(cerr(format!(
            "field `{key}.beta_fast` = {beta_fast} must be greater than `{key}.beta_slow` = \
             {beta_slow} (YaRN keeps the dimensions turning more than beta_fast times and \
             interpolates those turning fewer than beta_slow times; the defaults are 32 and 1)"
        )));
    }
    // mscale / mscale_all_dim: finite and ≥ 0; 0 or absent means unused, as in transformers.
    let nonneg = |k: &str| -> Result<f64> {
        match get(s, k) {
            None => Ok(0.0),
            Some(x) => match x.as_f64() {
                Some(f) if f.is_finite() && f >= 0.0 => Ok(f),
                _ => Err(cerr(format!(
                    "field `{key}.{k}` = {} is out of range: expected a finite number ≥ 0 (the \
                     YaRN attention factor is 0.1·{k}·ln(factor) + 1)",
                    shown(x)
                ))),
            },
        }
    };
    let (mscale, mscale_all_dim) = (nonneg("mscale")?, nonneg("mscale_all_dim")?);
    let attention_factor = opt("attention_factor", YARN_WHY)?;
    let truncate = match get(s, "truncate") {
        None => true,
        Some(Value::Bool(b)) => *b,
        Some(x) => {
            return Err(cerr(format!(
                "field `{key}.truncate` = {} is not a boolean",
                shown(x)
            )))
        }
    };
    Ok(RopeScaling::Yarn {
        factor,
        original_max_position_embeddings: original,
        beta_fast,
        beta_slow,
        attention_factor,
        mscale,
        mscale_all_dim,
        truncate,
    })
}

/// `partial_rotary_factor` of config.json `v`: the top-level field, else transformers-5's
/// `rope_parameters.partial_rotary_factor` (`rope`), else 1.
///
/// # Errors
/// [`ModelError::Config`] naming `file` and the field: not a number in (0, 1], or a rotary width
/// `floor(head_dim · factor)` that is odd or 0 (rotary dimensions come in pairs).
fn partial_rotary_factor(
    v: &Value,
    rope: Option<&Value>,
    head_dim: usize,
    file: &Path,
) -> Result<f64> {
    let (key, x) = match (
        get(v, "partial_rotary_factor"),
        rope.and_then(|p| get(p, "partial_rotary_factor")),
    ) {
        (Some(x), _) => ("partial_rotary_factor", x),
        (None, Some(x)) => ("rope_parameters.partial_rotary_factor", x),
        (None, None) => return Ok(1.0),
    };
    let cerr = |why: String| ModelError::Config {
        file: file.to_path_buf(),
        msg: format!("field `{key}` = {} is out of range: {why}", shown(x)),
    };
    let f = match x.as_f64() {
        Some(f) if f.is_finite() && f > 0.0 && f <= 1.0 => f,
        _ => {
            return Err(cerr(
                "expected a number in (0, 1], the fraction of each head's dimensions that \
                 rotate (Phi-4-mini uses 0.75)"
                    .into(),
            ))
        }
    };
    let dim = (head_dim as f64 * f) as usize;
    if dim == 0 || !dim.is_multiple_of(2) {
        return Err(cerr(format!(
            "the rotary width floor(head_dim {head_dim} × {f}) = {dim} must be even and at least \
             2 (rotary dimensions turn in pairs)"
        )));
    }
    Ok(f)
}

/// Why LongRoPE's numbers must be positive, for their error messages.
const LONGROPE_WHY: &str = "LongRoPE divides each rotary frequency by its factor and takes the \
     logarithm of the context lengths, so 0 or less makes the angles infinite or NaN (a factor \
     of 1 keeps a frequency as it is)";

/// LongRoPE's settings from the rope scaling object `s` of config.json `v` (`key`: its field
/// name, for errors), as transformers' `standardize_rope_params` reads them:
/// `original_max_position_embeddings` from the top level when config.json has it there (for
/// phi3 always: `Phi3Config` defaults it to 4096 and it wins over the rope object's), else from
/// `s`, else `max_position_embeddings`.
///
/// # Errors
/// [`ModelError::Config`] naming `file` and the field: `short_factor` or `long_factor` missing,
/// not a list of finite numbers > 0, or not `rotary_dim / 2` long; `factor`, `attention_factor`
/// or `original_max_position_embeddings` not a finite number > 0.
#[allow(clippy::too_many_arguments)]
fn longrope(
    s: &Value,
    v: &Value,
    arch: Arch,
    key: &str,
    max_position_embeddings: usize,
    rotary_dim: usize,
    opt: &dyn Fn(&str, &str) -> Result<Option<f64>>,
    file: &Path,
) -> Result<RopeScaling> {
    let cerr = |msg: String| ModelError::Config {
        file: file.to_path_buf(),
        msg,
    };
    let list = |k: &str| -> Result<Vec<f64>> {
        let x = get(s, k).ok_or_else(|| {
            cerr(format!(
                "rope scaling \"longrope\" needs the field `{key}.{k}` (a list of \
                 {} numbers, one per rotary dimension pair)",
                rotary_dim / 2
            ))
        })?;
        let bad = || {
            cerr(format!(
                "field `{key}.{k}` = {} must be a list of {} finite numbers > 0 (one per rotary \
                 dimension pair: rotary width {rotary_dim} = head_dim × partial_rotary_factor; \
                 {LONGROPE_WHY})",
                shown(x),
                rotary_dim / 2
            ))
        };
        let a = x.as_array().ok_or_else(bad)?;
        if a.len() != rotary_dim / 2 {
            return Err(bad());
        }
        a.iter()
            .map(|y| match y.as_f64() {
                Some(f) if f.is_finite() && f > 0.0 => Ok(f),
                _ => Err(bad()),
            })
            .collect()
    };
    let original = match get(v, "original_max_position_embeddings") {
        Some(x) => positive(x, "original_max_position_embeddings", LONGROPE_WHY, file)?,
        None if arch == Arch::Phi3 => 4096.0,
        None => opt("original_max_position_embeddings", LONGROPE_WHY)?
            .unwrap_or(max_position_embeddings as f64),
    };
    Ok(RopeScaling::LongRope {
        short_factor: list("short_factor")?,
        long_factor: list("long_factor")?,
        original_max_position_embeddings: original,
        factor: opt("factor", LONGROPE_WHY)?,
        attention_factor: opt("attention_factor", LONGROPE_WHY)?,
    })
}

/// The sliding window of config.json `v` as transformers applies it, `None` when no layer
/// attends through one.
///
/// - qwen2/qwen3: only with `use_sliding_window: true`; the window is `sliding_window` (4096 when
///   the field is absent, none when it is null); the layers are those `layer_types` names
///   `"sliding_attention"`, or without `layer_types` those from `max_window_layers` (28 when
///   absent) on.
/// - mistral: `sliding_window` (4096 when absent, none when null) on every layer (MistralConfig
///   ignores `layer_types`).
/// - gemma2 / gemma3: `sliding_window` (4096 when absent, none when null) on the layers
///   `layer_types` names `"sliding_attention"`, or without it all but every `pattern`-th
///   (Gemma 2: 2; Gemma 3: `sliding_window_pattern` or `_sliding_window_pattern`, 6 when absent).
/// - llama: none.
///
/// # Errors
/// [`ModelError::Config`] naming `file` and the field: `use_sliding_window` not a boolean,
/// `sliding_window` not an integer ≥ 1, `max_window_layers` not an integer ≥ 0, `layer_types`
/// not a list of `num_layers` entries each "full_attention" or "sliding_attention".
fn sliding_window(
    v: &Value,
    arch: Arch,
    num_layers: usize,
    file: &Path,
) -> Result<Option<SlidingWindow>> {
    let cerr = |msg: String| ModelError::Config {
        file: file.to_path_buf(),
        msg,
    };
    let on = match arch {
        Arch::Llama => false,
        Arch::Mistral | Arch::Gemma2 | Arch::Gemma3 => true,
        // Phi3Config's `sliding_window` defaults to null (none).
        Arch::Phi3 => get(v, "sliding_window").is_some(),
        Arch::Qwen2 | Arch::Qwen3 => match v.get("use_sliding_window") {
            None | Some(Value::Null) => false,
            Some(Value::Bool(b)) => *b,
            Some(x) => {
                return Err(cerr(format!(
                    "field `use_sliding_window` = {} is not a boolean",
                    shown(x)
                )))
            }
        },
    };
    if !on {
        return Ok(None);
    }
    let size = match v.get("sliding_window") {
        None => 4096,
        Some(Value::Null) => return Ok(None),
        Some(x) => match x.as_u64() {
            Some(n) if (1..=1 << 26).contains(&n) => n as usize,
            _ => {
                return Err(cerr(format!(
                    "field `sliding_window` = {} is out of range: expected an integer from 1 to \
                     {} (the number of most recent tokens each query of a sliding-window layer \
                     attends to; Mistral 7B v0.1 uses 4096)",
                    shown(x),
                    1u64 << 26
                )))
            }
        },
    };
    let layers = match (arch, get(v, "layer_types")) {
        (Arch::Mistral | Arch::Phi3, _) => vec![true; num_layers],
        // Gemma without `layer_types`: every `pattern`-th layer is global, the others slide
        // (Gemma2Config alternates; Gemma3TextConfig's `sliding_window_pattern` defaults to 6).
        (Arch::Gemma2 | Arch::Gemma3, None) => {
            let key = ["sliding_window_pattern", "_sliding_window_pattern"]
                .into_iter()
                .find(|k| get(v, k).is_some());
            let pattern = match (arch, key) {
                (Arch::Gemma2, _) | (_, None) => {
                    if arch == Arch::Gemma2 {
                        2
                    } else {
                        6
                    }
                }
                (_, Some(k)) => {
                    let x = get(v, k).expect("found above");
                    match x.as_u64() {
                        Some(n) if (1..=1 << 12).contains(&n) => n as usize,
                        _ => {
                            return Err(cerr(format!(
                                "field `{k}` = {} is out of range: expected an integer from 1 \
                                 to 4096 (every that many-th layer attends globally; Gemma 3 \
                                 uses 6)",
                                shown(x)
                            )))
                        }
                    }
                }
            };
            (0..num_layers).map(|i| (i + 1) % pattern != 0).collect()
        }
        (_, Some(lt)) => {
            let bad = || {
                cerr(format!(
                    "field `layer_types` = {} must list {num_layers} entries (one per layer, \
                     `num_hidden_layers`), each \"full_attention\" or \"sliding_attention\"",
                    shown(lt)
                ))
            };
            let list = lt.as_array().ok_or_else(bad)?;
            if list.len() != num_layers {
                return Err(bad());
            }
            list.iter()
                .map(|x| match x.as_str() {
                    Some("full_attention") => Ok(false),
                    Some("sliding_attention") => Ok(true),
                    _ => Err(bad()),
                })
                .collect::<Result<Vec<_>>>()?
        }
        (_, None) => {
            let from = match v.get("max_window_layers") {
                None | Some(Value::Null) => 28,
                Some(x) => x.as_u64().ok_or_else(|| {
                    cerr(format!(
                        "field `max_window_layers` = {} is out of range: expected an integer ≥ 0 \
                         (the layers from this index on use the sliding window)",
                        shown(x)
                    ))
                })? as usize,
            };
            (0..num_layers).map(|i| i >= from).collect()
        }
    };
    Ok(layers
        .iter()
        .any(|&s| s)
        .then_some(SlidingWindow { size, layers }))
}

/// Why a softcapping value must be positive, for its error message.
const SOFTCAP_WHY: &str = "scores become cap·tanh(x / cap), so 0 or less makes them infinite, \
     NaN or sign-flipped (Gemma 2 uses 50 for attention and 30 for the final logits; null turns \
     it off)";

/// The Gemma settings of config.json `v` ([`GemmaConfig`]), with transformers' defaults for
/// absent fields: `query_pre_attn_scalar` 256; softcapping 50 (attention) and 30 (logits) for
/// Gemma 2, off for Gemma 3 (null: off); Gemma 3's local base `rope_local_base_freq` (or
/// `rope_parameters.sliding_attention.rope_theta`, `local`) 10000.
///
/// # Errors
/// [`ModelError::Config`] naming `file` and the field: `hidden_activation` other than
/// "gelu_pytorch_tanh"; `query_pre_attn_scalar`, a softcapping or the local rope
/// base not a finite number > 0; a local rope type other than "default";
/// `use_bidirectional_attention` true (not a causal language model).
fn gemma(v: &Value, arch: Arch, local: Option<&Value>, file: &Path) -> Result<GemmaConfig> {
    let cerr = |msg: String| ModelError::Config {
        file: file.to_path_buf(),
        msg,
    };
    // Gemma2Config and Gemma3TextConfig read `hidden_activation` (checkpoints also carry an
    // unused `hidden_act`).
    if let Some(x) = get(v, "hidden_activation") {
        if x.as_str() != Some("gelu_pytorch_tanh") {
            return Err(cerr(format!(
                "field `hidden_activation` = {} is not supported: Gemma's MLP is GeGLU with the \
                 tanh approximation of GELU (\"gelu_pytorch_tanh\")",
                shown(x)
            )));
        }
    }
    if let Some(x) = get(v, "use_bidirectional_attention") {
        if x.as_bool() != Some(false) {
            return Err(cerr(format!(
                "field `use_bidirectional_attention` = {} is not supported: rlvr trains causal \
                 language models (EmbeddingGemma-style bidirectional attention is not one)",
                shown(x)
            )));
        }
    }
    let query_pre_attn_scalar = match get(v, "query_pre_attn_scalar") {
        Some(x) => positive(
            x,
            "query_pre_attn_scalar",
            "attention scores are scaled by its inverse square root (Gemma uses 256 or \
             hidden_size / num_attention_heads)",
            file,
        )?,
        None => 256.0,
    };
    let cap = |key: &str, default: Option<f64>| -> Result<Option<f64>> {
        match v.get(key) {
            None => Ok(default),
            Some(Value::Null) => Ok(None),
            Some(x) => positive(x, key, SOFTCAP_WHY, file).map(Some),
        }
    };
    let (attn_default, final_default) = match arch {
        Arch::Gemma2 => (Some(50.0), Some(30.0)),
        _ => (None, None),
    };
    let rope_local_base_freq = match arch {
        Arch::Gemma3 => Some(match (get(v, "rope_local_base_freq"), local) {
            (Some(x), _) => positive(x, "rope_local_base_freq", ROPE_THETA_WHY, file)?,
            (None, Some(p)) => {
                let ty = get(p, "rope_type")
                    .or_else(|| get(p, "type"))
                    .and_then(Value::as_str)
                    .unwrap_or("default");
                if ty != "default" {
                    return Err(cerr(format!(
                        "field `rope_parameters.sliding_attention.rope_type` = \"{ty}\" is not \
                         supported: rlvr rotates Gemma 3's local layers with the default rope \
                         (released checkpoints scale only the global layers)"
                    )));
                }
                match get(p, "rope_theta") {
                    Some(x) => positive(
                        x,
                        "rope_parameters.sliding_attention.rope_theta",
                        ROPE_THETA_WHY,
                        file,
                    )?,
                    None => 10_000.0,
                }
            }
            (None, None) => 10_000.0,
        }),
        _ => None,
    };
    Ok(GemmaConfig {
        query_pre_attn_scalar,
        attn_logit_softcapping: cap("attn_logit_softcapping", attn_default)?,
        final_logit_softcapping: cap("final_logit_softcapping", final_default)?,
        rope_local_base_freq,
    })
}

/// A `config.json` token-id field (one number or a list) as ids; anything else is none.
pub(crate) fn ids(v: Option<&Value>) -> Vec<u32> {
    match v {
        Some(Value::Number(n)) => n.as_u64().map(|x| vec![x as u32]).unwrap_or_default(),
        Some(Value::Array(a)) => a
            .iter()
            .filter_map(|x| x.as_u64().map(|x| x as u32))
            .collect(),
        _ => vec![],
    }
}

impl ModelConfig {
    /// Reads and normalises `config.json`.
    ///
    /// Errors: the file is missing or not JSON, `model_type` is not one of [`Arch`]'s (or
    /// "gemma3" with a `text_config`), a Gemma field is out of range ([`GemmaConfig`]), a
    /// required field is missing, the head counts do not divide, `rms_norm_eps` or `rope_theta`
    /// is not a finite number > 0, the rope scaling type is unknown, or a rope scaling number
    /// (`factor`, llama3's `low_freq_factor`, `high_freq_factor` and
    /// `original_max_position_embeddings`) is not a finite number > 0 (or llama3's high frequency
    /// factor is not above its low one), `partial_rotary_factor` is outside (0, 1] or gives an
    /// odd rotary width, LongRoPE's factor lists are missing, not positive or not
    /// `rotary_dim / 2` long, or a phi3 field is unsupported (`hidden_act` other than silu, a
    /// rope type other than default/longrope/su/yarn); each error names the file and the field.
    pub fn from_file(path: &Path) -> Result<Self> {
        Self::from_json(&Self::read_json(path)?, path)
    }

    /// Reads config.json at `path` as JSON, unnormalised (a regular file of at most
    /// [`crate::error::MAX_TOKENIZER_FILE_BYTES`]).
    ///
    /// # Errors
    /// [`ModelError::Io`] or [`ModelError::Config`] naming the file.
    pub fn read_json(path: &Path) -> Result<Value> {
        let text = crate::error::read_model_text(path)?;
        serde_json::from_str(&text).map_err(|e| ModelError::Config {
            file: path.to_path_buf(),
            msg: format!("not valid JSON: {e}"),
        })
    }

    /// Normalises a parsed config.json; `file` is only used in error messages.
    // One field of config.json at a time with its aliases and its error message, in the order of
    // the HF config it mirrors, so the function reads as a map of config.json.
    pub fn from_json(v: &Value, file: &Path) -> Result<Self> {
        let cerr = |msg: String| ModelError::Config {
            file: file.to_path_buf(),
            msg,
        };
        let model_type = get(v, "model_type")
            .and_then(Value::as_str)
            .ok_or_else(|| cerr("field `model_type` is missing".into()))?;
        if model_type == "gemma3" {
            return Self::from_gemma3_wrapper(v, file);
        }
        let arch = Arch::from_model_type(model_type).ok_or_else(|| {
            cerr(format!(
                "unknown `model_type` \"{model_type}\" (rlvr supports qwen2, qwen3, llama, \
                 mistral, gemma2, gemma3_text, gemma3's language model and phi3)"
            ))
        })?;
        let hidden_size = req_usize(v, "hidden_size", file)?;
        let num_attention_heads = req_usize(v, "num_attention_heads", file)?;
        let num_key_value_heads = match get(v, "num_key_value_heads") {
            Some(_) => req_usize(v, "num_key_value_heads", file)?,
            None => num_attention_heads,
        };
        if num_attention_heads == 0
            || num_key_value_heads == 0
            || num_attention_heads % num_key_value_heads != 0
        {
            return Err(cerr(format!(
                "`num_attention_heads` ({num_attention_heads}) must be a positive multiple of \
                 `num_key_value_heads` ({num_key_value_heads})"
            )));
        }
        let head_dim = match get(v, "head_dim") {
            Some(_) => req_usize(v, "head_dim", file)?,
            // Gemma2Config and Gemma3TextConfig default head_dim to 256 whatever the width.
            None if arch.is_gemma() => 256,
            None => {
                if hidden_size % num_attention_heads != 0 {
                    return Err(cerr(format!(
                        "`hidden_size` ({hidden_size}) is not divisible by `num_attention_heads` \
                         ({num_attention_heads}) and no `head_dim` is given"
                    )));
                }
                hidden_size / num_attention_heads
            }
        };
        if head_dim % 2 != 0 {
            return Err(cerr(format!(
                "`head_dim` ({head_dim}) must be even for rotary embeddings"
            )));
        }
        // transformers-5 keeps theta and scaling together in `rope_parameters`; Gemma 3 keeps
        // one such object per layer type there (`full_attention`, `sliding_attention`).
        let mut rope_key = "rope_parameters";
        let mut rope_params = get(v, "rope_parameters");
        let mut local_params = None;
        if arch == Arch::Gemma3 {
            if let Some(p) = rope_params.filter(|p| {
                get(p, "full_attention").is_some() || get(p, "sliding_attention").is_some()
            }) {
                rope_key = "rope_parameters.full_attention";
                rope_params = get(p, "full_attention");
                local_params = get(p, "sliding_attention");
            }
        }
        let theta_key = format!("{rope_key}.rope_theta");
        let rope_theta = match (
            get(v, "rope_theta"),
            rope_params.and_then(|p| get(p, "rope_theta")),
        ) {
            (Some(x), _) => positive(x, "rope_theta", ROPE_THETA_WHY, file)?,
            (None, Some(x)) => positive(x, &theta_key, ROPE_THETA_WHY, file)?,
            // Gemma3TextConfig's global base.
            (None, None) if arch == Arch::Gemma3 => 1_000_000.0,
            (None, None) => 10000.0,
        };
        let (scaling_key, scaling_obj) = match get(v, "rope_scaling") {
            Some(s) => ("rope_scaling", Some(s)),
            None => (rope_key, rope_params),
        };
        let max_position_embeddings = match get(v, "max_position_embeddings") {
            Some(_) => req_usize(v, "max_position_embeddings", file)?,
            // transformers' defaults: MistralConfig 4096·32, Gemma2Config 8192,
            // Gemma3TextConfig 131072, the others rlvr's 32768.
            None if arch == Arch::Mistral || arch == Arch::Gemma3 => 131072,
            None if arch == Arch::Gemma2 => 8192,
            None if arch == Arch::Phi3 => 4096,
            None => 32768,
        };
        let partial_rotary_factor = partial_rotary_factor(v, rope_params, head_dim, file)?;
        let rotary_dim = (head_dim as f64 * partial_rotary_factor) as usize;
        let rope_scaling = match scaling_obj {
            None => None,
            Some(s) => {
                let ty = get(s, "rope_type")
                    .or_else(|| get(s, "type"))
                    .and_then(Value::as_str)
                    .unwrap_or("default");
                // Each is a divisor of frequencies or wavelengths: 0, negative or non-finite
                // would give infinite or NaN angles (null log-probs).
                let f = |k: &str| -> Result<f64> {
                    let x = get(s, k).filter(|x| !x.is_null()).ok_or_else(|| {
                        cerr(format!("rope scaling \"{ty}\" needs the field `{k}`"))
                    })?;
                    positive(x, &format!("{scaling_key}.{k}"), ROPE_SCALING_WHY, file)
                };
                // An optional positive number: `None` when absent or null.
                let opt = |k: &str, why: &str| -> Result<Option<f64>> {
                    get(s, k)
                        .map(|x| positive(x, &format!("{scaling_key}.{k}"), why, file))
                        .transpose()
                };
                // Phi3Config reads "su" and "yarn" as LongRoPE.
                let ty = match (arch, ty) {
                    (Arch::Phi3, "su" | "yarn") => "longrope",
                    (Arch::Phi3, "default" | "longrope") => ty,
                    (Arch::Phi3, other) => {
                        return Err(cerr(format!(
                            "field `{scaling_key}.rope_type` = \"{other}\" is not supported for \
                             phi3 (Phi3Config takes \"default\" or \"longrope\", and reads \"su\" \
                             and \"yarn\" as \"longrope\")"
                        )))
                    }
                    _ => ty,
                };
                match ty {
                    "default" => None,
                    "longrope" => Some(longrope(
                        s,
                        v,
                        arch,
                        scaling_key,
                        max_position_embeddings,
                        rotary_dim,
                        &opt,
                        file,
                    )?),
                    "llama3" => {
                        let (low, high) = (f("low_freq_factor")?, f("high_freq_factor")?);
                        if high <= low {
                            return Err(cerr(format!(
                                "field `{scaling_key}.high_freq_factor` = {high} must be greater \
                                 than `{scaling_key}.low_freq_factor` = {low} (llama3 rope \
                                 scaling divides by their difference; Llama 3.1 uses 4 and 1)"
                            )));
                        }
                        Some(RopeScaling::Llama3 {
                            factor: f("factor")?,
                            low_freq_factor: low,
                            high_freq_factor: high,
                            original_max_position_embeddings: f(
                                "original_max_position_embeddings",
                            )?,
                        })
                    }
                    "linear" => Some(RopeScaling::Linear {
                        factor: f("factor")?,
                    }),
                    "yarn" => Some(yarn(
                        s,
                        v,
                        scaling_key,
                        max_position_embeddings,
                        f("factor")?,
                        &opt,
                        file,
                    )?),
                    "dynamic" => Some(RopeScaling::Dynamic {
                        factor: f("factor")?,
                    }),
                    other => {
                        return Err(cerr(format!(
                            "rope scaling type \"{other}\" is not supported (default, linear, \
                             llama3, yarn, dynamic, longrope)"
                        )))
                    }
                }
            }
        };
        let num_hidden_layers = req_usize(v, "num_hidden_layers", file)?;
        let sliding_window = sliding_window(v, arch, num_hidden_layers, file)?;
        let attention_bias = get(v, "attention_bias")
            .and_then(Value::as_bool)
            .unwrap_or(false);
        let (qkv_bias, o_bias) = match arch {
            Arch::Qwen2 => (true, false),
            Arch::Qwen3 => (attention_bias, attention_bias),
            Arch::Llama => (attention_bias, attention_bias),
            // MistralAttention and Phi3Attention have no biases whatever config.json says.
            Arch::Mistral | Arch::Phi3 => (false, false),
            Arch::Gemma2 | Arch::Gemma3 => (attention_bias, attention_bias),
        };
        // MistralMLP and the Gemma MLPs have no biases.
        let mlp_bias = !matches!(
            arch,
            Arch::Mistral | Arch::Gemma2 | Arch::Gemma3 | Arch::Phi3
        ) && get(v, "mlp_bias").and_then(Value::as_bool).unwrap_or(false);
        if arch == Arch::Phi3 {
            if let Some(x) = get(v, "hidden_act").filter(|x| x.as_str() != Some("silu")) {
                return Err(cerr(format!(
                    "field `hidden_act` = {} is not supported for phi3: rlvr's MLP is SwiGLU \
                     (\"silu\", every released Phi-3 and Phi-4-mini checkpoint)",
                    shown(x)
                )));
            }
        }
        let gemma = match arch.is_gemma() {
            true => Some(gemma(v, arch, local_params, file)?),
            false => None,
        };
        // transformers' Qwen2Config, Qwen3Config, LlamaConfig and MistralConfig all default
        // `tie_word_embeddings` to false; released checkpoints write the field.
        // Gemma2Config and Gemma3TextConfig default it to true.
        let tie_word_embeddings = get(v, "tie_word_embeddings")
            .and_then(Value::as_bool)
            .unwrap_or(arch.is_gemma());
        Ok(ModelConfig {
            arch,
            vocab_size: req_usize(v, "vocab_size", file)?,
            hidden_size,
            intermediate_size: req_usize(v, "intermediate_size", file)?,
            num_hidden_layers,
            num_attention_heads,
            num_key_value_heads,
            head_dim,
            rms_norm_eps: match get(v, "rms_norm_eps") {
                Some(x) => positive(x, "rms_norm_eps", RMS_NORM_EPS_WHY, file)?,
                // Phi3Config's default.
                None if arch == Arch::Phi3 => 1e-5,
                None => 1e-6,
            },
            rope_theta,
            rope_scaling,
            max_position_embeddings,
            sliding_window,
            tie_word_embeddings,
            qkv_bias,
            o_bias,
            mlp_bias,
            stored_dtype: get(v, "torch_dtype")
                .or_else(|| get(v, "dtype"))
                .and_then(Value::as_str)
                .map(str::to_string),
            bos_token_id: ids(get(v, "bos_token_id")).first().copied(),
            eos_token_ids: ids(get(v, "eos_token_id")),
            gemma,
            partial_rotary_factor,
        })
    }

    /// The language model of a multimodal Gemma 3 config.json (`model_type` "gemma3",
    /// transformers' `Gemma3Config`): its `text_config`, with the top level's dtype, token ids and
    /// `tie_word_embeddings` where `text_config` has none. The vision tower is not read: rlvr
    /// trains and samples the text model only ([`crate::Model::load`] reads the weights under
    /// `language_model.`).
    ///
    /// # Errors
    /// [`ModelError::Config`] naming `file`: `text_config` missing or not an object, or any error
    /// of [`ModelConfig::from_json`] on it (said to be in `text_config`).
    fn from_gemma3_wrapper(v: &Value, file: &Path) -> Result<Self> {
        let Some(Value::Object(text)) = get(v, "text_config") else {
            return Err(ModelError::Config {
                file: file.to_path_buf(),
                msg: "field `text_config` is missing or not an object (a \"gemma3\" config.json \
                      describes its language model there)"
                    .into(),
            });
        };
        let mut text = text.clone();
        for k in [
            "torch_dtype",
            "dtype",
            "bos_token_id",
            "eos_token_id",
            "tie_word_embeddings",
        ] {
            if let (None, Some(x)) = (text.get(k).filter(|x| !x.is_null()), get(v, k)) {
                text.insert(k.into(), x.clone());
            }
        }
        text.insert("model_type".into(), "gemma3_text".into());
        Self::from_json(&Value::Object(text), file).map_err(|e| match e {
            ModelError::Config { file, msg } => ModelError::Config {
                file,
                msg: format!("in `text_config`: {msg}"),
            },
            e => e,
        })
    }

    /// config.json's bytes (pretty JSON, [`ModelConfig::to_json`]) for weights stored as `dtype`:
    /// `torch_dtype` is "bfloat16", "float16" or "float32" (anything else is written as f32).
    pub fn json_bytes_for(&self, dtype: candle_core::DType) -> Vec<u8> {
        let mut cfg = self.clone();
        cfg.stored_dtype = Some(
            match dtype {
                candle_core::DType::BF16 => "bfloat16",
                candle_core::DType::F16 => "float16",
                _ => "float32",
            }
            .into(),
        );
        serde_json::to_vec_pretty(&cfg.to_json()).expect("config serialises")
    }

    /// config.json's bytes for weights stored as `dtype` when the model was loaded from `base`
    /// (that directory's config.json as it was): `base` with only its dtype field set — `dtype`
    /// when it has one (transformers 5), `torch_dtype` when it has one or neither — so every
    /// other field (`pad_token_id`, `unk_token_id`, `transformers_version`, sliding-window and
    /// rope settings, ...) stays the base model's. Without `base`, or when `base` no longer
    /// normalises to this configuration (it was changed after loading), or when it is the
    /// multimodal "gemma3" wrapper (the model saved is its language model, "gemma3_text"), it is
    /// [`ModelConfig::json_bytes_for`].
    pub fn json_bytes_over(&self, base: Option<&Value>, dtype: candle_core::DType) -> Vec<u8> {
        let Some(Value::Object(base)) = base else {
            return self.json_bytes_for(dtype);
        };
        // A multimodal Gemma 3 base: the model holds its language model only, saved as one.
        if base.get("model_type").and_then(Value::as_str) == Some("gemma3") {
            return self.json_bytes_for(dtype);
        }
        let name = match dtype {
            candle_core::DType::BF16 => "bfloat16",
            candle_core::DType::F16 => "float16",
            _ => "float32",
        };
        let mut out = base.clone();
        let has = |k: &str| out.get(k).is_some_and(|v| !v.is_null());
        let (dt, tdt) = (has("dtype"), has("torch_dtype"));
        if dt {
            out.insert("dtype".into(), name.into());
        }
        if tdt || !dt {
            out.insert("torch_dtype".into(), name.into());
        }
        let out = Value::Object(out);
        let mut expect = self.clone();
        expect.stored_dtype = Some(name.into());
        match Self::from_json(&out, Path::new("config.json")) {
            Ok(back) if back == expect => {
                let mut b = serde_json::to_vec_pretty(&out).expect("config serialises");
                b.push(b'\n');
                b
            }
            _ => self.json_bytes_for(dtype),
        }
    }

    /// Serialises to a transformers-4 style config.json that transformers and rlvr both load.
    pub fn to_json(&self) -> Value {
        let mut m = serde_json::Map::new();
        let arch_name = match self.arch {
            Arch::Qwen2 => "Qwen2ForCausalLM",
            Arch::Qwen3 => "Qwen3ForCausalLM",
            Arch::Llama => "LlamaForCausalLM",
            Arch::Mistral => "MistralForCausalLM",
            Arch::Gemma2 => "Gemma2ForCausalLM",
            Arch::Gemma3 => "Gemma3ForCausalLM",
            Arch::Phi3 => "Phi3ForCausalLM",
        };
        m.insert("architectures".into(), serde_json::json!([arch_name]));
        m.insert("model_type".into(), self.arch.model_type().into());
        m.insert("vocab_size".into(), self.vocab_size.into());
        m.insert("hidden_size".into(), self.hidden_size.into());
        m.insert("intermediate_size".into(), self.intermediate_size.into());
        m.insert("num_hidden_layers".into(), self.num_hidden_layers.into());
        m.insert(
            "num_attention_heads".into(),
            self.num_attention_heads.into(),
        );
        m.insert(
            "num_key_value_heads".into(),
            self.num_key_value_heads.into(),
        );
        m.insert("head_dim".into(), self.head_dim.into());
        match &self.gemma {
            None => {
                m.insert("hidden_act".into(), "silu".into());
            }
            Some(g) => {
                m.insert("hidden_activation".into(), "gelu_pytorch_tanh".into());
                // An int field of Gemma2Config / Gemma3TextConfig (transformers 5 refuses 24.0).
                let q = g.query_pre_attn_scalar;
                m.insert(
                    "query_pre_attn_scalar".into(),
                    match q.fract() == 0.0 && q <= (1u64 << 53) as f64 {
                        true => (q as u64).into(),
                        false => q.into(),
                    },
                );
                let cap = |c: Option<f64>| c.map_or(Value::Null, Value::from);
                m.insert(
                    "attn_logit_softcapping".into(),
                    cap(g.attn_logit_softcapping),
                );
                m.insert(
                    "final_logit_softcapping".into(),
                    cap(g.final_logit_softcapping),
                );
                if let Some(f) = g.rope_local_base_freq {
                    m.insert("rope_local_base_freq".into(), f.into());
                }
            }
        }
        m.insert("rms_norm_eps".into(), self.rms_norm_eps.into());
        m.insert("rope_theta".into(), self.rope_theta.into());
        m.insert(
            "rope_scaling".into(),
            match &self.rope_scaling {
                None => Value::Null,
                Some(RopeScaling::Linear { factor }) => {
                    serde_json::json!({"rope_type": "linear", "factor": factor})
                }
                Some(RopeScaling::Llama3 {
                    factor,
                    low_freq_factor,
                    high_freq_factor,
                    original_max_position_embeddings,
                }) => serde_json::json!({
                    "rope_type": "llama3", "factor": factor,
                    "low_freq_factor": low_freq_factor, "high_freq_factor": high_freq_factor,
                    "original_max_position_embeddings": *original_max_position_embeddings as u64,
                }),
                Some(RopeScaling::Yarn {
                    factor,
                    original_max_position_embeddings,
                    beta_fast,
                    beta_slow,
                    attention_factor,
                    mscale,
                    mscale_all_dim,
                    truncate,
                }) => serde_json::json!({
                    "rope_type": "yarn", "factor": factor,
                    "original_max_position_embeddings": *original_max_position_embeddings as u64,
                    "beta_fast": beta_fast, "beta_slow": beta_slow,
                    "attention_factor": attention_factor, "mscale": mscale,
                    "mscale_all_dim": mscale_all_dim, "truncate": truncate,
                }),
                Some(RopeScaling::Dynamic { factor }) => {
                    serde_json::json!({"rope_type": "dynamic", "factor": factor})
                }
                Some(RopeScaling::LongRope {
                    short_factor,
                    long_factor,
                    original_max_position_embeddings,
                    factor,
                    attention_factor,
                }) => {
                    let original = *original_max_position_embeddings as u64;
                    let mut o = serde_json::json!({
                        "rope_type": "longrope", "short_factor": short_factor,
                        "long_factor": long_factor, "original_max_position_embeddings": original,
                    });
                    if let Some(f) = factor {
                        o["factor"] = (*f).into();
                    }
                    if let Some(a) = attention_factor {
                        o["attention_factor"] = (*a).into();
                    }
                    o
                }
            },
        );
        if let Some(RopeScaling::LongRope {
            original_max_position_embeddings: o,
            ..
        }) = &self.rope_scaling
        {
            // Phi3Config reads the top-level field (4096 when absent) over the rope object's.
            m.insert(
                "original_max_position_embeddings".into(),
                (*o as u64).into(),
            );
        }
        if self.partial_rotary_factor != 1.0 {
            m.insert(
                "partial_rotary_factor".into(),
                self.partial_rotary_factor.into(),
            );
        }
        m.insert(
            "max_position_embeddings".into(),
            self.max_position_embeddings.into(),
        );
        m.insert(
            "tie_word_embeddings".into(),
            self.tie_word_embeddings.into(),
        );
        if matches!(
            self.arch,
            Arch::Llama | Arch::Qwen3 | Arch::Gemma2 | Arch::Gemma3
        ) {
            m.insert("attention_bias".into(), self.qkv_bias.into());
        }
        if self.arch == Arch::Llama {
            m.insert("mlp_bias".into(), self.mlp_bias.into());
        }
        match (&self.sliding_window, self.arch) {
            (Some(w), Arch::Qwen2 | Arch::Qwen3) => {
                m.insert("use_sliding_window".into(), true.into());
                m.insert("sliding_window".into(), w.size.into());
                let types: Vec<&str> = (w.layers.iter())
                    .map(|&s| match s {
                        true => "sliding_attention",
                        false => "full_attention",
                    })
                    .collect();
                m.insert("layer_types".into(), serde_json::json!(types));
            }
            (None, Arch::Qwen2) => {
                m.insert("use_sliding_window".into(), false.into());
            }
            // Absent would mean 4096 to MistralConfig: null says none (Phi3Config: the same).
            (w, Arch::Mistral | Arch::Phi3) => {
                m.insert(
                    "sliding_window".into(),
                    w.as_ref().map_or(Value::Null, |w| w.size.into()),
                );
            }
            (w, Arch::Gemma2 | Arch::Gemma3) => {
                // transformers' Gemma models build a sliding mask whatever the layer types and
                // refuse a null window: without one, every layer is "full_attention" and the
                // window is the whole context.
                m.insert(
                    "sliding_window".into(),
                    w.as_ref()
                        .map_or(self.max_position_embeddings, |w| w.size)
                        .into(),
                );
                let types: Vec<&str> = (0..self.num_hidden_layers)
                    .map(|i| match w.as_ref().is_some_and(|w| w.layers[i]) {
                        true => "sliding_attention",
                        false => "full_attention",
                    })
                    .collect();
                m.insert("layer_types".into(), serde_json::json!(types));
            }
            _ => {}
        }
        if self.arch == Arch::Phi3 {
            // Phi3Config's default pad id 32000 would be outside a smaller vocabulary, which
            // transformers' embedding refuses.
            m.insert("pad_token_id".into(), Value::Null);
        }
        m.insert("attention_dropout".into(), 0.0.into());
        m.insert("initializer_range".into(), 0.02.into());
        m.insert("use_cache".into(), true.into());
        m.insert(
            "torch_dtype".into(),
            self.stored_dtype.clone().unwrap_or("float32".into()).into(),
        );
        if let Some(b) = self.bos_token_id {
            m.insert("bos_token_id".into(), b.into());
        }
        match self.eos_token_ids.as_slice() {
            [] => {}
            [one] => {
                m.insert("eos_token_id".into(), (*one).into());
            }
            many => {
                m.insert("eos_token_id".into(), serde_json::json!(many));
            }
        }
        Value::Object(m)
    }

    /// Inverse frequencies of the rotary embedding, `[rotary_dim / 2]`, with scaling applied
    /// (transformers `ROPE_INIT_FUNCTIONS`), computed in f64: those of a forward whose positions
    /// stay below `max_position_embeddings` ([`ModelConfig::rope_inv_freq_for`]).
    pub fn rope_inv_freq(&self) -> Vec<f64> {
        self.rope_inv_freq_for(0)
    }

    /// The number of leading dimensions of each q and k head that rotate: `floor(head_dim ·
    /// partial_rotary_factor)` (transformers' `int(head_dim * partial_rotary_factor)`), even.
    pub fn rotary_dim(&self) -> usize {
        (self.head_dim as f64 * self.partial_rotary_factor) as usize
    }

    /// The multiplier of the rotary cos and sin tables: YaRN's and LongRoPE's
    /// `attention_factor`, 1 for every other rope type (transformers' `attention_scaling`).
    /// LongRoPE without one: `√(1 + ln s / ln original)` with `s` its `factor`, or
    /// `max_position_embeddings / original_max_position_embeddings` without one, and 1 when
    /// `s ≤ 1` (transformers `_compute_longrope_parameters`).
    pub fn rope_attention_factor(&self) -> f64 {
        if let Some(RopeScaling::LongRope {
            original_max_position_embeddings: original,
            factor,
            attention_factor,
            ..
        }) = &self.rope_scaling
        {
            let s = factor.unwrap_or(self.max_position_embeddings as f64 / original);
            return match attention_factor {
                Some(a) => *a,
                None if s <= 1.0 => 1.0,
                None => (1.0 + s.ln() / original.ln()).sqrt(),
            };
        }
        let Some(RopeScaling::Yarn {
            factor,
            attention_factor,
            mscale,
            mscale_all_dim,
            ..
        }) = &self.rope_scaling
        else {
            return 1.0;
        };
        // The paper's attention temperature, sqrt(1/t) = 0.1·ln(s) + 1 (section 3.4), or
        // DeepSeek's ratio of two such with `mscale` and `mscale_all_dim` as multipliers.
        let m = |scale: f64, mul: f64| {
            if scale <= 1.0 {
                1.0
            } else {
                0.1 * mul * scale.ln() + 1.0
            }
        };
        match attention_factor {
            Some(a) => *a,
            None if *mscale != 0.0 && *mscale_all_dim != 0.0 => {
                m(*factor, *mscale) / m(*factor, *mscale_all_dim)
            }
            None => m(*factor, 1.0),
        }
    }

    /// Whether the rotary frequencies of a forward depend on its largest position: dynamic NTK
    /// scaling, for a forward reaching past `max_position_embeddings`
    /// ([`ModelConfig::rope_inv_freq_for`]).
    pub fn rope_is_dynamic_at(&self, seq_len: usize) -> bool {
        matches!(self.rope_scaling, Some(RopeScaling::Dynamic { .. }))
            && seq_len > self.max_position_embeddings
    }

    /// Whether a forward whose largest position is `seq_len − 1` rotates with LongRoPE's
    /// `long_factor`: `seq_len > original_max_position_embeddings` (transformers'
    /// `longrope_frequency_update`). False for every other rope type.
    pub fn rope_is_long_at(&self, seq_len: usize) -> bool {
        matches!(&self.rope_scaling, Some(RopeScaling::LongRope { original_max_position_embeddings: o, .. })
            if seq_len as f64 > *o)
    }

    /// [`ModelConfig::rope_inv_freq`] of a forward whose largest position is `seq_len − 1`:
    /// differs only for dynamic NTK scaling with `seq_len > max_position_embeddings`, where the
    /// base is `theta · (factor·seq_len/max − (factor − 1))^(d/(d−2))` (transformers
    /// `_compute_dynamic_ntk_parameters`), and for LongRoPE, whose `long_factor` replaces
    /// `short_factor` when [`ModelConfig::rope_is_long_at`]. `[rotary_dim / 2]` (`d` is
    /// [`ModelConfig::rotary_dim`] throughout), f64.
    pub fn rope_inv_freq_for(&self, seq_len: usize) -> Vec<f64> {
        let d = self.rotary_dim();
        let theta = match &self.rope_scaling {
            Some(RopeScaling::Dynamic { factor }) if self.rope_is_dynamic_at(seq_len) => {
                let max = self.max_position_embeddings as f64;
                let grow = factor * seq_len as f64 / max - (factor - 1.0);
                self.rope_theta * grow.powf(d as f64 / (d as f64 - 2.0))
            }
            _ => self.rope_theta,
        };
        let base: Vec<f64> = (0..d / 2)
            .map(|i| 1.0 / theta.powf((2 * i) as f64 / d as f64))
            .collect();
        match &self.rope_scaling {
            None | Some(RopeScaling::Dynamic { .. }) => base,
            Some(RopeScaling::LongRope {
                short_factor,
                long_factor,
                ..
            }) => {
                let ext = match self.rope_is_long_at(seq_len) {
                    true => long_factor,
                    false => short_factor,
                };
                base.iter().zip(ext).map(|(f, e)| f / e).collect()
            }
            Some(RopeScaling::Linear { factor }) => base.iter().map(|f| f / factor).collect(),
            Some(RopeScaling::Llama3 {
                factor,
                low_freq_factor,
                high_freq_factor,
                original_max_position_embeddings: old,
            }) => {
                let low_wavelen = old / low_freq_factor;
                let high_wavelen = old / high_freq_factor;
                base.iter()
                    .map(|&f| {
                        let wavelen = 2.0 * std::f64::consts::PI / f;
                        if wavelen > low_wavelen {
                            f / factor
                        } else if wavelen < high_wavelen {
                            f
                        } else {
                            let smooth = (old / wavelen - low_freq_factor)
                                / (high_freq_factor - low_freq_factor);
                            (1.0 - smooth) * f / factor + smooth * f
                        }
                    })
                    .collect()
            }
            Some(RopeScaling::Yarn {
                factor,
                original_max_position_embeddings: old,
                beta_fast,
                beta_slow,
                truncate,
                ..
            }) => {
                // The dimension index at which a frequency turns `turns` times over the
                // original context (YaRN section 3.2, "NTK-by-parts").
                let dim_of = |turns: f64| {
                    d as f64 * (old / (turns * 2.0 * std::f64::consts::PI)).ln()
                        / (2.0 * self.rope_theta.ln())
                };
                let (mut low, mut high) = (dim_of(*beta_fast), dim_of(*beta_slow));
                if *truncate {
                    (low, high) = (low.floor(), high.ceil());
                }
                let (low, mut high) = (low.max(0.0), high.min(d as f64 - 1.0));
                if low == high {
                    high += 0.001;
                }
                base.iter()
                    .enumerate()
                    .map(|(i, &f)| {
                        // 0: keep the frequency (extrapolate), 1: divide it by factor.
                        let ramp = ((i as f64 - low) / (high - low)).clamp(0.0, 1.0);
                        (f / factor) * ramp + f * (1.0 - ramp)
                    })
                    .collect()
            }
        }
    }

    /// Number of parameters, counting tied embeddings once.
    pub fn num_parameters(&self) -> usize {
        let h = self.hidden_size;
        let q = self.num_attention_heads * self.head_dim;
        let kv = self.num_key_value_heads * self.head_dim;
        let mut layer = h * q + 2 * h * kv + q * h + 3 * h * self.intermediate_size + 2 * h;
        if self.qkv_bias {
            layer += q + 2 * kv;
        }
        if matches!(self.arch, Arch::Qwen3 | Arch::Gemma3) {
            layer += 2 * self.head_dim;
        }
        if self.o_bias {
            layer += h;
        }
        if self.mlp_bias {
            layer += 2 * self.intermediate_size + h;
        }
        if self.arch.is_gemma() {
            // pre_feedforward_layernorm and post_feedforward_layernorm.
            layer += 2 * h;
        }
        let mut n = self.vocab_size * h + self.num_hidden_layers * layer + h;
        if !self.tie_word_embeddings {
            n += self.vocab_size * h;
        }
        n
    }
}
