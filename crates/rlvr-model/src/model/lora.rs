//! The model's LoRA side (module [`crate::lora`] holds the adapters, their settings and PEFT's
//! file format): attaching fresh adapters, the adapter-only views and copies of a model, merging,
//! and loading or saving a model with its adapter. It sits above both the decoder's blocks and
//! the adapters, which take no [`Model`].

use std::path::Path;

use candle_core::{DType, Device, Tensor, Var};
use rand::{Rng, SeedableRng};
use serde_json::json;

use super::Model;
use crate::error::{ModelError, Result};
use crate::lora::{read_adapter_config, Adapter, LoraConfig};
use crate::param::Param;

/// The dtype adapters are kept in for a base of dtype `dt`: f64 for f64, else f32.
fn adapter_dtype(dt: DType) -> DType {
    if dt == DType::F64 {
        DType::F64
    } else {
        DType::F32
    }
}

impl Model {
    /// Attaches fresh LoRA adapters (A Kaiming-uniform, a = √5, drawn from `seed` in
    /// [`Model::named_vars`] order; B zeros) to the `cfg.targets` projections of every layer and
    /// freezes the base. The model's outputs are unchanged until B moves. `all-linear` becomes
    /// the architecture's projections and the targets are checked against its modules
    /// ([`LoraConfig::for_arch`]): on phi3 the adapters sit on the fused `qkv_proj` (B
    /// `[(h + 2·kv)·head_dim, r]`) and `gate_up_proj` (B `[2·intermediate, r]`) as PEFT's do.
    ///
    /// # Errors
    /// Invalid settings or targets ([`LoraConfig::for_arch`]), adapters already attached.
    pub fn add_lora(&mut self, cfg: &LoraConfig, seed: u64) -> Result<()> {
        let cfg = &cfg.for_arch(self.config.arch)?;
        if self.lora.is_some() {
            return Err(ModelError::Invalid(
                "this model already has LoRA adapters".into(),
            ));
        }
        let dt = adapter_dtype(self.dtype());
        let device = self.device().clone();
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        let r = cfg.rank;
        let prefix = self.adapter_prefix();
        for (li, layer) in self.layers.iter_mut().enumerate() {
            let dims: Vec<(usize, usize)> = layer.adapter_slots().iter().map(|s| s.1).collect();
            for ((path, slot), (out, inp)) in layer.adapter_slots_mut().into_iter().zip(dims) {
                let module = path.rsplit('.').next().expect("a module name");
                if !cfg.targets.iter().any(|t| t.module() == module) {
                    continue;
                }
                let bound = 1.0 / (inp as f64).sqrt();
                let a: Vec<f64> = (0..r * inp)
                    .map(|_| rng.random_range(-bound..bound))
                    .collect();
                let a = Tensor::from_vec(a, (r, inp), &device)?.to_dtype(dt)?;
                let b = Tensor::zeros((out, r), dt, &device)?;
                let name = |m: &str| format!("{prefix}.{li}.{path}.lora_{m}.weight");
                *slot = Some(Adapter::new(
                    Param::new(name("A"), Var::from_tensor(&a)?),
                    Param::new(name("B"), Var::from_tensor(&b)?),
                    cfg,
                    seed ^ ((li as u64) << 8) ^ path.len() as u64,
                ));
            }
        }
        self.lora = Some(cfg.clone());
        Ok(())
    }

    /// Whether the model is the language model of the multimodal Gemma 3 wrapper (config.json's
    /// `model_type` "gemma3", `Gemma3ForConditionalGeneration`).
    pub(crate) fn is_gemma3_wrapper(&self) -> bool {
        (self.source_config.as_ref())
            .and_then(|c| c.get("model_type"))
            .and_then(|t| t.as_str())
            == Some("gemma3")
    }

    /// Where PEFT names the decoder layers' adapters: `base_model.model.model.layers`, or for
    /// the Gemma 3 wrapper (whose language model transformers holds as
    /// `model.language_model`) `base_model.model.model.language_model.layers`.
    pub(crate) fn adapter_prefix(&self) -> &'static str {
        match self.is_gemma3_wrapper() {
            true => "base_model.model.model.language_model.layers",
            false => "base_model.model.model.layers",
        }
    }

    /// The LoRA settings when adapters are attached.
    pub fn lora_config(&self) -> Option<&LoraConfig> {
        self.lora.as_ref()
    }

    /// The LoRA-dropout round: with the tokens' keys, what the dropout masks are a function of
    /// (`crate::lora::DropoutKeys`); training forwards in the same round draw the same mask for
    /// the same token. The trainer sets it to its optimizer updates so far, and saves it in
    /// trainer_state so a resumed run draws the masks an uninterrupted one would. `None` without
    /// adapters.
    pub fn lora_dropout_round(&self) -> Option<u64> {
        self.lora.as_ref()?;
        self.adapters().map(Adapter::round).max()
    }

    /// Sets every adapter's LoRA-dropout round (see [`Model::lora_dropout_round`]); no-op without
    /// adapters.
    pub fn set_lora_dropout_round(&self, n: u64) {
        for a in self.adapters() {
            a.set_round(n);
        }
    }

    /// Whether training forwards apply LoRA dropout (adapters with dropout > 0).
    pub(crate) fn lora_dropout_active(&self) -> bool {
        self.lora.as_ref().is_some_and(|c| c.dropout > 0.0)
    }

    fn adapters(&self) -> impl Iterator<Item = &Adapter> {
        self.layers
            .iter()
            .flat_map(|l| l.adapter_slots())
            .filter_map(|(_, _, a)| a.as_ref())
    }

    /// The LoRA factors acting on projection `path` (e.g. `self_attn.q_proj`) of layer `layer`,
    /// detached: A `[r, in]` and the rows of B that update this projection `[out, r]`. They are
    /// the projection's own adapter's, or, for Phi-3's split projections, A and the projection's
    /// rows of the fused module's B (`self_attn.qkv_proj`: q's, k's, v's; `mlp.gate_up_proj`:
    /// gate's, up's). `None` when no adapter acts on it. (The fused decode step reads them.)
    ///
    /// # Errors
    /// Tensor errors.
    pub fn lora_factors(&self, layer: usize, path: &str) -> Result<Option<(Tensor, Tensor)>> {
        let Some(l) = self.layers.get(layer) else {
            return Ok(None);
        };
        let slots = l.adapter_slots();
        let find = |p: &str| {
            slots
                .iter()
                .find(|(name, _, _)| *name == p)
                .and_then(|(_, _, a)| a.as_ref())
        };
        let detach = |a: &Adapter| (a.a.var.as_tensor().detach(), a.b.var.as_tensor().detach());
        if let Some(a) = find(path) {
            return Ok(Some(detach(a)));
        }
        const QKV: [&str; 3] = ["self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"];
        const GATE_UP: [&str; 2] = ["mlp.gate_proj", "mlp.up_proj"];
        let (fused, parts): (&str, &[&str]) = if QKV.contains(&path) {
            ("self_attn.qkv_proj", &QKV)
        } else if GATE_UP.contains(&path) {
            ("mlp.gate_up_proj", &GATE_UP)
        } else {
            return Ok(None);
        };
        let Some(a) = find(fused) else {
            return Ok(None);
        };
        let (fa, fb) = detach(a);
        let mut at = 0;
        for part in parts {
            let rows = l.slot_weights(part)[0].var.dims()[0];
            if *part == path {
                return Ok(Some((fa, fb.narrow(0, at, rows)?)));
            }
            at += rows;
        }
        Ok(None)
    }

    /// The base model with the adapters disabled, sharing the base weights' storage (no copy):
    /// the KL reference of a LoRA run.
    pub fn without_adapters(&self) -> Model {
        let mut m = self.clone();
        for layer in &mut m.layers {
            for (_, slot) in layer.adapter_slots_mut() {
                *slot = None;
            }
        }
        m.lora = None;
        m
    }

    /// The adapters' params (A then B per projection, layer by layer, checkpoint order).
    pub(crate) fn adapter_params(&self) -> Vec<&Param> {
        let mut v = Vec::new();
        for a in self.adapters() {
            v.push(&a.a);
            v.push(&a.b);
        }
        v
    }

    /// A model sharing the frozen base with copies of the adapters (see [`Model::try_clone`]).
    pub(crate) fn copy_adapters(&self) -> Result<Model> {
        let mut m = self.clone();
        for layer in &mut m.layers {
            for (_, slot) in layer.adapter_slots_mut() {
                *slot = slot.as_ref().map(Adapter::try_copy).transpose()?;
            }
        }
        Ok(m)
    }

    /// A model without adapters whose targeted weights are `W + (α/r)·B·A`, computed in f32 (f64
    /// for an f64 model) and cast to the model's dtype (peft's `merge_and_unload`); new storage
    /// for every weight. A fused module's update (Phi-3's `qkv_proj`, `gate_up_proj`) is split
    /// by rows over the projections it holds, as the fused weight is. Without adapters: a deep
    /// copy.
    ///
    /// # Errors
    /// Tensor errors.
    pub fn merged(&self) -> Result<Model> {
        let m = self.without_adapters().try_clone()?;
        for (li, layer) in self.layers.iter().enumerate() {
            for (path, _, a) in layer.adapter_slots() {
                let Some(a) = a else { continue };
                let dt = a.a.var.dtype();
                let delta = a.delta()?;
                let mut at = 0;
                for target in m.layers[li].slot_weights(path) {
                    let target = &target.var;
                    let rows = target.dims()[0];
                    let w = (target.as_tensor().to_dtype(dt)? + delta.narrow(0, at, rows)?)?;
                    target.set(&w.to_dtype(target.dtype())?)?;
                    at += rows;
                }
            }
        }
        Ok(m)
    }
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
    model.add_lora(&cfg, 0).map_err(|e| ModelError::Config {
        file: adapter_dir.join("adapter_config.json"),
        msg: format!("target_modules: {e}"),
    })?;
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
    // The wrapper's vision-side adapters (PEFT adds them when a target list names a SigLIP
    // module too) act on image inputs only, which rlvr never has: left unread.
    let stored: std::collections::HashMap<String, Tensor> = match model.is_gemma3_wrapper() {
        true => (stored.into_iter())
            .filter(|(n, _)| !crate::lora::is_vision_tensor(n))
            .collect(),
        false => stored,
    };
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
    crate::weights::write_safetensors(&adapter_dir.join("adapter_model.safetensors"), &tensors)?;
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
    // On the Gemma 3 wrapper a list would match the vision tower's q/k/v_proj too (PEFT
    // matches names by suffix): a pattern over the language model's modules instead, which PEFT
    // matches in full against `model.language_model.layers.N.self_attn.q_proj` ….
    let targets = match model.is_gemma3_wrapper() {
        true => json!(format!(
            "model\\.language_model\\.layers\\.\\d+\\.(self_attn|mlp)\\.({})",
            targets.join("|")
        )),
        false => json!(targets),
    };
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
