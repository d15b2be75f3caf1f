//! PEFT's adapter files: `adapter_config.json` and `adapter_model.safetensors` (see the parent
//! module's docs for the names): finding and reading the config here; loading the tensors into a
//! model and writing both files take a `Model`, so they are `model/lora.rs`'s.

use std::path::{Path, PathBuf};

use serde_json::Value;

use super::{LoraConfig, LoraTarget};
use crate::error::{ModelError, Result};

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
        // Resolved against the base's architecture when attached (`LoraConfig::for_arch`).
        Some(Value::String(s)) if s == "all-linear" => vec![LoraTarget::AllLinear],
        // A regular expression over module names (PEFT matches it in full; rlvr writes one
        // for the Gemma 3 wrapper, so the vision tower gets no adapter): the targets are the
        // language model's modules that the adapter file holds factors of.
        Some(Value::String(_)) => targets_in_file(adapter_dir).map_err(bad)?,
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
                "target_modules must be a list of module names, \"all-linear\" or a regular \
                 expression"
                    .into(),
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

/// Whether adapter tensor `name` belongs to the multimodal Gemma 3 wrapper's vision side (its
/// vision tower or projector), which rlvr does not run (text only): PEFT gives it adapters when a
/// target list names modules it has too (SigLIP's `q_proj`, `k_proj`, `v_proj`).
pub(crate) fn is_vision_tensor(name: &str) -> bool {
    name.contains(".vision_tower.") || name.contains(".multi_modal_projector.")
}

/// The decoder modules (`q_proj` …) whose factors `adapter_model.safetensors` in `adapter_dir`
/// holds (`….layers.N.<block>.<module>.lora_A.weight`), vision-side tensors aside, in
/// checkpoint order.
///
/// Errors (as text): the file cannot be read, a module rlvr has no target for, no factors.
fn targets_in_file(adapter_dir: &Path) -> std::result::Result<Vec<LoraTarget>, String> {
    let file = adapter_dir.join("adapter_model.safetensors");
    let names = crate::weights::tensor_names(&file).map_err(|e| e.to_string())?;
    let mut found = Vec::new();
    for n in names.iter().filter(|n| !is_vision_tensor(n)) {
        let Some(stem) = n
            .strip_suffix(".lora_A.weight")
            .or_else(|| n.strip_suffix(".lora_A.default.weight"))
        else {
            continue;
        };
        let module = stem.rsplit('.').next().unwrap_or(stem);
        let t: LoraTarget = module
            .parse()
            .map_err(|e| format!("target_modules (a pattern): tensor `{n}`: {e}"))?;
        if !found.contains(&t) {
            found.push(t);
        }
    }
    if found.is_empty() {
        return Err(format!(
            "target_modules is a pattern and {} holds no lora_A factor",
            file.display()
        ));
    }
    let order = |t: &LoraTarget| {
        let all = [LoraTarget::ALL.as_slice(), LoraTarget::PHI3.as_slice()].concat();
        all.iter().position(|x| x == t).unwrap_or(usize::MAX)
    };
    found.sort_by_key(order);
    Ok(found)
}
