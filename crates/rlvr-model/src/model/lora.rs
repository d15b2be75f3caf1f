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
    /// freezes the base. The model's outputs are unchanged until B moves.
    ///
    /// # Errors
    /// Invalid settings ([`LoraConfig::validate`]), adapters already attached.
    pub fn add_lora(&mut self, cfg: &LoraConfig, seed: u64) -> Result<()> {
        cfg.validate()?;
        if self.config.arch == crate::config::Arch::Phi3 {
            let fused: Vec<&str> = (cfg.targets.iter())
                .map(|t| t.module())
                .filter(|m| matches!(*m, "q_proj" | "k_proj" | "v_proj" | "gate_proj" | "up_proj"))
                .collect();
            if !fused.is_empty() {
                return Err(ModelError::Invalid(format!(
                    "LoRA targets {fused:?} are not supported for phi3: its checkpoints fuse q/k/v \
                     into `qkv_proj` and gate/up into `gate_up_proj`, so a PEFT adapter for phi3 \
                     names those, and rlvr adapts only unfused projections there; use \
                     target_modules [\"o_proj\", \"down_proj\"] (the phi3 modules rlvr adapts)"
                )));
            }
        }
        if self.lora.is_some() {
            return Err(ModelError::Invalid(
                "this model already has LoRA adapters".into(),
            ));
        }
        let dt = adapter_dtype(self.dtype());
        let device = self.device().clone();
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        let r = cfg.rank;
        for (li, layer) in self.layers.iter_mut().enumerate() {
            for (path, lin) in layer.linears_mut() {
                let module = path.rsplit('.').next().expect("a module name");
                if !cfg.targets.iter().any(|t| t.module() == module) {
                    continue;
                }
                let (out, inp) = lin.weight.var.dims2()?;
                let bound = 1.0 / (inp as f64).sqrt();
                let a: Vec<f64> = (0..r * inp)
                    .map(|_| rng.random_range(-bound..bound))
                    .collect();
                let a = Tensor::from_vec(a, (r, inp), &device)?.to_dtype(dt)?;
                let b = Tensor::zeros((out, r), dt, &device)?;
                let name =
                    |m: &str| format!("base_model.model.model.layers.{li}.{path}.lora_{m}.weight");
                lin.lora = Some(Adapter::new(
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
            .flat_map(|l| l.linears())
            .filter_map(|(_, lin)| lin.lora.as_ref())
    }

    /// The base model with the adapters disabled, sharing the base weights' storage (no copy):
    /// the KL reference of a LoRA run.
    pub fn without_adapters(&self) -> Model {
        let mut m = self.clone();
        for layer in &mut m.layers {
            for (_, lin) in layer.linears_mut() {
                lin.lora = None;
            }
        }
        m.lora = None;
        m
    }

    /// The adapters' params (A then B per projection, layer by layer, checkpoint order).
    pub(crate) fn adapter_params(&self) -> Vec<&Param> {
        let mut v = Vec::new();
        for layer in &self.layers {
            for (_, lin) in layer.linears() {
                if let Some(a) = &lin.lora {
                    v.push(&a.a);
                    v.push(&a.b);
                }
            }
        }
        v
    }

    /// A model sharing the frozen base with copies of the adapters (see [`Model::try_clone`]).
    pub(crate) fn copy_adapters(&self) -> Result<Model> {
        let mut m = self.clone();
        for layer in &mut m.layers {
            for (_, lin) in layer.linears_mut() {
                if let Some(a) = &mut lin.lora {
                    *a = a.try_copy()?;
                }
            }
        }
        Ok(m)
    }

    /// A model without adapters whose targeted weights are `W + (α/r)·B·A`, computed in f32 (f64
    /// for an f64 model) and cast to the model's dtype (peft's `merge_and_unload`); new storage
    /// for every weight. Without adapters: a deep copy.
    ///
    /// # Errors
    /// Tensor errors.
    pub fn merged(&self) -> Result<Model> {
        let m = self.without_adapters().try_clone()?;
        for (li, layer) in self.layers.iter().enumerate() {
            for (k, (_, lin)) in layer.linears().into_iter().enumerate() {
                let Some(a) = &lin.lora else { continue };
                let dt = a.a.var.dtype();
                let delta = a.delta()?;
                let w = (lin.weight.var.as_tensor().to_dtype(dt)? + delta)?;
                let target = &m.layers[li].linears()[k].1.weight.var;
                target.set(&w.to_dtype(target.dtype())?)?;
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
