//! PEFT's adapter files: `adapter_config.json` and `adapter_model.safetensors` (see the parent
//! module's docs for the names), read and written.

use std::path::{Path, PathBuf};

use candle_core::{DType, Device, Tensor};
use serde_json::{json, Value};

use super::{LoraConfig, LoraTarget};
use crate::error::{ModelError, Result};
use crate::model::Model;

/// The adapter directory of model directory `dir`: `dir/adapter` when it holds
/// `adapter_config.json` (rlvr's checkpoints), else `dir` itself when it does (PEFT's layout).
pub fn find_adapter(dir: &Path) -> Option<PathBuf> {
    let sub = dir.join("adapter");
    if sub.join("adapter_config.json").is_file() {
        Some(sub)
    } else if dir.join("adapter_config.json").is_file() {
        Some(dir.to_path_buf())
    } else {
        None
    }
}

/// What an `adapter_config.json` says: the settings and `base_model_name_or_path`.
pub fn read_adapter_config(adapter_dir: &Path) -> Result<(LoraConfig, Option<PathBuf>)> {
    let file = adapter_dir.join("adapter_config.json");
    let text = std::fs::read_to_string(&file).map_err(|e| ModelError::Io {
        path: file.clone(),
        err: e,
    })?;
    let bad = |msg: String| ModelError::Config {
        file: file.clone(),
        msg,
    };
    let v: Value = serde_json::from_str(&text).map_err(|e| bad(e.to_string()))?;
    if let Some(t) = v.get("peft_type").and_then(Value::as_str) {
        if t != "LORA" {
            return Err(bad(format!("peft_type is {t}; only LORA is supported")));
        }
    }
    for key in ["use_rslora", "use_dora"] {
        if v.get(key).and_then(Value::as_bool) == Some(true) {
            return Err(bad(format!("{key} = true is not supported")));
        }
    }
    if let Some(b) = v.get("bias").and_then(Value::as_str) {
        if b != "none" {
            return Err(bad(format!(
                "bias = \"{b}\" is not supported (only \"none\")"
            )));
        }
    }
    for key in ["rank_pattern", "alpha_pattern"] {
        if v.get(key)
            .and_then(Value::as_object)
            .is_some_and(|o| !o.is_empty())
        {
            return Err(bad(format!("a non-empty {key} is not supported")));
        }
    }
    if v.get("lora_bias").and_then(Value::as_bool) == Some(true) {
        return Err(bad("lora_bias = true is not supported".into()));
    }
    for key in [
        "layers_to_transform",
        "modules_to_save",
        "exclude_modules",
        "layer_replication",
        "target_parameters",
        "trainable_token_indices",
    ] {
        if v.get(key).is_some_and(|x| !x.is_null()) {
            return Err(bad(format!("{key} is not supported")));
        }
    }
    let rank = v
        .get("r")
        .and_then(Value::as_u64)
        .ok_or_else(|| bad("missing or invalid `r`".into()))? as usize;
    let alpha = v
        .get("lora_alpha")
        .and_then(Value::as_f64)
        .ok_or_else(|| bad("missing or invalid `lora_alpha`".into()))?;
    let targets = match v.get("target_modules") {
        Some(Value::String(s)) if s == "all-linear" => LoraTarget::ALL.to_vec(),
        Some(Value::Array(a)) => a
            .iter()
            .map(|x| {
                x.as_str()
                    .ok_or_else(|| bad("target_modules must be strings".into()))?
                    .parse::<LoraTarget>()
                    .map_err(bad)
            })
            .collect::<Result<Vec<_>>>()?,
        _ => {
            return Err(bad(
                "target_modules must be a list of module names or \"all-linear\"".into(),
            ))
        }
    };
    let dropout = v.get("lora_dropout").and_then(Value::as_f64).unwrap_or(0.0);
    let base = v
        .get("base_model_name_or_path")
        .and_then(Value::as_str)
        .filter(|s| !s.is_empty())
        .map(PathBuf::from);
    let cfg = LoraConfig {
        rank,
        alpha,
        targets,
        dropout,
    };
    cfg.validate().map_err(|e| bad(e.to_string()))?;
    Ok((cfg, base))
}

/// Loads model directory `dir` with the adapter in `adapter_dir`: the base weights are `dir`'s
/// own when it has weights, else those of `base_model_name_or_path` (relative to `dir` when
/// relative); then the adapter's A and B from `adapter_model.safetensors`.
///
/// # Errors
/// No base found, a malformed adapter config, a missing or mis-shaped adapter tensor, a tensor
/// the model has no place for.
pub(crate) fn load_with_adapter(
    dir: &Path,
    adapter_dir: &Path,
    dtype: DType,
    device: &Device,
) -> Result<Model> {
    let (cfg, base) = read_adapter_config(adapter_dir)?;
    let has_weights = |d: &Path| {
        d.join("model.safetensors").is_file() || d.join("model.safetensors.index.json").is_file()
    };
    let base_dir = if has_weights(dir) {
        dir.to_path_buf()
    } else {
        let b = base.ok_or_else(|| ModelError::MissingFile {
            path: dir.join("model.safetensors"),
            what: "base weights (the adapter names no base_model_name_or_path)".into(),
        })?;
        if b.is_absolute() {
            b
        } else {
            dir.join(b)
        }
    };
    let mut model = Model::load_base(&base_dir, dtype, device)?;
    model.add_lora(&cfg, 0)?;
    let file = adapter_dir.join("adapter_model.safetensors");
    if !file.is_file() {
        return Err(ModelError::MissingFile {
            path: file,
            what: "LoRA adapter weights".into(),
        });
    }
    let stored =
        candle_core::safetensors::load(&file, device).map_err(|e| ModelError::Safetensors {
            file: file.clone(),
            msg: e.to_string(),
        })?;
    let mut weights = Vec::with_capacity(stored.len());
    for (name, _) in model.named_vars() {
        // PEFT writes no adapter name; some writers keep `.default` before `.weight`.
        let alt = name.replace(".weight", ".default.weight");
        let t = stored
            .get(&name)
            .or_else(|| stored.get(&alt))
            .ok_or_else(|| ModelError::MissingTensor {
                file: file.clone(),
                tensor: name.clone(),
            })?;
        weights.push((name, t.clone()));
    }
    if stored.len() != weights.len() {
        let known: Vec<&String> = weights.iter().map(|(n, _)| n).collect();
        let extra = stored
            .keys()
            .find(|k| {
                !known.contains(k)
                    && !known
                        .iter()
                        .any(|n| n.replace(".weight", ".default.weight") == **k)
            })
            .cloned()
            .unwrap_or_default();
        return Err(ModelError::Config {
            file,
            msg: format!("tensor `{extra}` matches no adapter of target_modules"),
        });
    }
    model.load_named(&weights)?;
    Ok(model)
}

/// Writes `model`'s adapters into `adapter_dir` in PEFT's format (module docs), atomically per
/// file. `base_model_name_or_path` is the directory the base was loaded from (empty for a random
/// base, which [`Model::save`] then writes beside the adapter).
///
/// # Errors
/// A model without adapters, I/O errors.
pub(crate) fn save_adapter(model: &Model, adapter_dir: &Path) -> Result<()> {
    let cfg = model
        .lora_config()
        .ok_or_else(|| ModelError::Invalid("save_adapter: the model has no adapters".into()))?;
    std::fs::create_dir_all(adapter_dir).map_err(|e| ModelError::Io {
        path: adapter_dir.to_path_buf(),
        err: e,
    })?;
    let tensors: Vec<(String, Tensor)> = model
        .named_vars()
        .into_iter()
        .map(|(n, v)| (n, v.as_tensor().detach()))
        .collect();
    let bytes = crate::weights::safetensors_bytes(&tensors)?;
    crate::weights::atomic_write(&adapter_dir.join("adapter_model.safetensors"), &bytes)?;
    let alpha = if cfg.alpha.fract() == 0.0 {
        json!(cfg.alpha as i64)
    } else {
        json!(cfg.alpha)
    };
    let base = model
        .source
        .as_ref()
        .map(|p| p.display().to_string())
        .unwrap_or_default();
    let targets: Vec<&str> = cfg.targets.iter().map(|t| t.module()).collect();
    let config = json!({
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "r": cfg.rank,
        "lora_alpha": alpha,
        "lora_dropout": cfg.dropout,
        "target_modules": targets,
        "bias": "none",
        "base_model_name_or_path": base,
        "fan_in_fan_out": false,
        "use_rslora": false,
        "use_dora": false,
        "init_lora_weights": true,
        "inference_mode": true,
        "modules_to_save": null,
        "layers_to_transform": null,
        "revision": null,
    });
    let mut json = serde_json::to_vec_pretty(&config).expect("JSON serialises");
    json.push(b'\n');
    crate::weights::atomic_write(&adapter_dir.join("adapter_config.json"), &json)
}
