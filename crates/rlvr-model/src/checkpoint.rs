//! Whole model directories: loading a model with its tokenizer, and writing a directory that both
//! rlvr and transformers load (config.json, model.safetensors, tokenizer.json,
//! tokenizer_config.json, generation_config.json).

use std::path::Path;

use candle_core::{DType, Device};
use serde_json::{json, Value};

use crate::config::ModelConfig;
use crate::error::{ModelError, Result};
use crate::model::Model;
use crate::tokenizer::{TokenizerBundle, CHATML_TEMPLATE};
use crate::weights::atomic_write;

/// A policy: the model and the tokenizer of one model directory.
pub struct Policy {
    pub model: Model,
    pub tokenizer: TokenizerBundle,
}

impl Policy {
    /// Loads the model directory `dir` (see [`Model::load`] and [`TokenizerBundle::load`]).
    ///
    /// Errors: any missing or malformed file, naming it; a tokenizer with a token id at or above
    /// config.json's `vocab_size` ([`check_vocabulary`]), before the weights are read.
    pub fn load(dir: &Path, dtype: DType, device: &Device) -> Result<Self> {
        let config = dir.join("config.json");
        if !config.is_file() {
            // A PEFT adapter directory, or not a model directory at all: the model's loader
            // finds the base or names the missing config.json.
            let model = Model::load(dir, dtype, device)?;
            let tokenizer = TokenizerBundle::load(dir)?;
            return Ok(Self { model, tokenizer });
        }
        let model_config = ModelConfig::from_file(&config)?;
        let tokenizer = TokenizerBundle::load(dir)?;
        check_vocabulary(&tokenizer, &model_config, &config)?;
        let model = Model::load(dir, dtype, device)?;
        Ok(Self { model, tokenizer })
    }

    /// Writes the model (weights in `dtype`) and the tokenizer files into `dir`, each file
    /// atomically; the result is a model directory rlvr and transformers load.
    pub fn save(&self, dir: &Path, dtype: DType) -> Result<()> {
        self.model.save(dir, dtype)?;
        write_tokenizer_files(dir, &self.tokenizer)
    }
}

/// Refuses a tokenizer that can produce a token id the model has no embedding row for: its
/// largest id (added tokens included) at or above `config`'s `vocab_size`. Such an id would
/// otherwise fail deep inside sampling or training, or, in a prompt, only at the first step.
/// (A `vocab_size` above the tokenizer's size is normal: Qwen's pads it to a multiple of 64.)
///
/// # Errors
/// [`ModelError::Tokenizer`] naming the tokenizer file, the token and its id, and `config_path`
/// (the config.json whose `vocab_size` it exceeds).
pub fn check_vocabulary(
    tok: &TokenizerBundle,
    config: &ModelConfig,
    config_path: &Path,
) -> Result<()> {
    let vocab = tok.tokenizer.get_vocab(true);
    let Some((token, &id)) = vocab.iter().max_by_key(|entry| *entry.1) else {
        return Ok(());
    };
    if (id as usize) < config.vocab_size {
        return Ok(());
    }
    let token: String = token.chars().take(40).collect();
    Err(ModelError::Tokenizer {
        file: tok.path.clone(),
        msg: format!(
            "token {token:?} has id {id}, but {}'s `vocab_size` is {}: ids from {} up have no \
             embedding row (this tokenizer is not the model's, or config.json's vocab_size is \
             wrong)",
            config_path.display(),
            config.vocab_size,
            config.vocab_size
        ),
    })
}

fn json_bytes(v: &Value) -> Vec<u8> {
    let mut b = serde_json::to_vec_pretty(v).expect("JSON serialises");
    b.push(b'\n');
    b
}

/// The generation parameters transformers takes from a model's config.json when the model
/// directory has no generation_config.json (`GenerationConfig.from_model_config` keeps every
/// non-null config field that is a `GenerationConfig` attribute; the attribute names of
/// transformers 5.19's `generation/configuration_utils.py`, those a config.json can carry).
pub const IMPLIED_GENERATION_FIELDS: [&str; 51] = [
    "max_length",
    "max_new_tokens",
    "min_length",
    "min_new_tokens",
    "early_stopping",
    "max_time",
    "stop_strings",
    "do_sample",
    "num_beams",
    "num_beam_groups",
    "penalty_alpha",
    "dola_layers",
    "use_cache",
    "cache_implementation",
    "temperature",
    "top_k",
    "top_p",
    "min_p",
    "typical_p",
    "epsilon_cutoff",
    "eta_cutoff",
    "diversity_penalty",
    "repetition_penalty",
    "encoder_repetition_penalty",
    "length_penalty",
    "no_repeat_ngram_size",
    "bad_words_ids",
    "force_words_ids",
    "renormalize_logits",
    "forced_bos_token_id",
    "forced_eos_token_id",
    "remove_invalid_values",
    "exponential_decay_length_penalty",
    "suppress_tokens",
    "begin_suppress_tokens",
    "sequence_bias",
    "token_healing",
    "guidance_scale",
    "low_memory",
    "watermarking_config",
    "num_return_sequences",
    "output_attentions",
    "output_hidden_states",
    "output_scores",
    "output_logits",
    "return_dict_in_generate",
    "pad_token_id",
    "bos_token_id",
    "eos_token_id",
    "encoder_no_repeat_ngram_size",
    "decoder_start_token_id",
];

/// The generation_config.json of a model directory that came without one: what transformers
/// derives from `dir`'s config.json (written before) for such a model — `"_from_model_config":
/// true` and the [`IMPLIED_GENERATION_FIELDS`] config.json holds — so `generate()` defaults stay
/// those of the base. No sampling default and no `transformers_version` is invented. With no
/// config.json in `dir`: `tok`'s EOS, pad and BOS ids.
fn implied_generation_config(dir: &Path, tok: &TokenizerBundle) -> Result<Value> {
    let mut gc = serde_json::Map::new();
    let config = dir.join("config.json");
    if config.is_file() {
        let c = ModelConfig::read_json(&config)?;
        gc.insert("_from_model_config".into(), true.into());
        for k in IMPLIED_GENERATION_FIELDS {
            if let Some(v) = c.get(k).filter(|v| !v.is_null()) {
                gc.insert(k.into(), v.clone());
            }
        }
        return Ok(Value::Object(gc));
    }
    match tok.eos_ids.as_slice() {
        [] => {}
        [one] => {
            gc.insert("eos_token_id".into(), (*one).into());
        }
        many => {
            gc.insert("eos_token_id".into(), json!(many));
        }
    }
    gc.insert("pad_token_id".into(), tok.pad_id.into());
    if let Some(b) = tok
        .bos_token
        .as_deref()
        .and_then(|t| tok.tokenizer.token_to_id(t))
    {
        gc.insert("bos_token_id".into(), b.into());
    }
    Ok(Value::Object(gc))
}

/// Writes tokenizer.json, tokenizer_config.json and generation_config.json of `tok` into `dir`
/// (after config.json, which the generation config is derived from when `tok` carries none).
///
/// generation_config.json is the base model's byte for byte when it had one
/// ([`TokenizerBundle::generation_config`]), else what transformers derives from `dir`'s
/// config.json ([`IMPLIED_GENERATION_FIELDS`]): a plain `generate()` on the result decodes as on
/// the base model.
///
/// # Errors
/// I/O errors and a config.json in `dir` that does not parse, naming the file.
pub fn write_tokenizer_files(dir: &Path, tok: &TokenizerBundle) -> Result<()> {
    // Copy the source file byte for byte when there is one (re-serialising changes its layout).
    let bytes = match std::fs::read(&tok.path) {
        Ok(b) if tok.path.file_name() == Some("tokenizer.json".as_ref()) => b,
        _ => tok
            .tokenizer
            .to_string(false)
            .map_err(|e| ModelError::Tokenizer {
                file: dir.join("tokenizer.json"),
                msg: e.to_string(),
            })?
            .into_bytes(),
    };
    atomic_write(&dir.join("tokenizer.json"), &bytes)?;
    let mut tc = serde_json::Map::new();
    tc.insert("tokenizer_class".into(), "PreTrainedTokenizerFast".into());
    tc.insert(
        "bos_token".into(),
        tok.bos_token
            .clone()
            .map(Value::from)
            .unwrap_or(Value::Null),
    );
    tc.insert(
        "eos_token".into(),
        tok.eos_token
            .clone()
            .map(Value::from)
            .unwrap_or(Value::Null),
    );
    tc.insert(
        "pad_token".into(),
        tok.pad_token
            .clone()
            .map(Value::from)
            .unwrap_or(Value::Null),
    );
    if let Some(t) = &tok.chat_template {
        tc.insert("chat_template".into(), t.clone().into());
    }
    tc.insert("clean_up_tokenization_spaces".into(), false.into());
    tc.insert("model_max_length".into(), 32768.into());
    atomic_write(
        &dir.join("tokenizer_config.json"),
        &json_bytes(&Value::Object(tc)),
    )?;
    let gc = match &tok.generation_config {
        Some(text) => text.clone().into_bytes(),
        None => json_bytes(&implied_generation_config(dir, tok)?),
    };
    atomic_write(&dir.join("generation_config.json"), &gc)?;
    Ok(())
}

/// Special tokens for a tokenizer that comes without a tokenizer_config.json: the EOS is the
/// first of `<|im_end|>`, `<|endoftext|>`, `<|eot_id|>`, `</s>`, `<eos>` the vocabulary holds; the
/// pad token is `<|endoftext|>` when present, else the EOS; BOS is `<|begin_of_text|>` or `<s>`
/// when present.
pub fn default_special_tokens(
    tok: &tokenizers::Tokenizer,
) -> (Option<String>, Option<String>, Option<String>) {
    // Only added special tokens count: "<s>" is an ordinary BPE token in some vocabularies
    // (Qwen2.5 id 128245), and must not become a BOS.
    let special: std::collections::HashSet<String> = tok
        .get_added_tokens_decoder()
        .values()
        .filter(|t| t.special)
        .map(|t| t.content.clone())
        .collect();
    let has = |t: &str| special.contains(t);
    let eos = ["<|im_end|>", "<|endoftext|>", "<|eot_id|>", "</s>", "<eos>"]
        .into_iter()
        .find(|t| has(t))
        .map(str::to_string);
    let pad = if has("<|endoftext|>") {
        Some("<|endoftext|>".to_string())
    } else {
        eos.clone()
    };
    let bos = ["<|begin_of_text|>", "<s>"]
        .into_iter()
        .find(|t| has(t))
        .map(str::to_string);
    (bos, eos, pad)
}

/// Builds the [`TokenizerBundle`] that `rlvr init` writes for `tokenizer_json`: the special tokens
/// and chat template of a `tokenizer_config.json` beside it when there is one, else
/// [`default_special_tokens`] and a plain ChatML template.
pub fn tokenizer_for_init(tokenizer_json: &Path) -> Result<TokenizerBundle> {
    let dir = tokenizer_json.parent().unwrap_or(Path::new("."));
    let tokenizer = TokenizerBundle::read_tokenizer(tokenizer_json)?;
    let mut bundle = if dir.join("tokenizer_config.json").exists()
        && tokenizer_json.file_name() == Some("tokenizer.json".as_ref())
    {
        TokenizerBundle::load(dir)?
    } else {
        let (bos, eos, pad) = default_special_tokens(&tokenizer);
        let eos_ids: Vec<u32> = eos
            .as_deref()
            .and_then(|t| tokenizer.token_to_id(t))
            .into_iter()
            .collect();
        let pad_id = pad
            .as_deref()
            .and_then(|t| tokenizer.token_to_id(t))
            .or(eos_ids.first().copied())
            .unwrap_or(0);
        TokenizerBundle {
            tokenizer,
            chat_template: None,
            bos_token: bos,
            eos_token: eos,
            pad_token: pad,
            eos_ids,
            pad_id,
            path: tokenizer_json.to_path_buf(),
            generation_config: None,
        }
    };
    if bundle.chat_template.is_none() {
        bundle.chat_template = Some(CHATML_TEMPLATE.to_string());
    }
    Ok(bundle)
}
