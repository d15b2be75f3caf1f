//! The decoder: Qwen2/Qwen2.5, Qwen3, Llama, Mistral, Gemma 2 and Gemma 3 as one pre-norm
//! transformer (Gemma's differences: [`crate::layers`] and [`crate::GemmaConfig`]), written with
//! differentiable candle-core ops only (candle-nn's fused rope/rms-norm/softmax have no backward:
//! DESIGN.md section 7), so every parameter receives its gradient.
//!
//! Numerics follow transformers' eager implementation (`modeling_qwen2.py`, `modeling_llama.py`):
//! RMSNorm in f32, rotary embedding with `rotate_half`, attention `softmax(q·kᵀ/√d + mask)·v` with
//! grouped KV heads, SiLU-gated MLP. The blocks are in [`crate::layers`] (candle's model-file
//! layout: private blocks with `new(config, weights)` and `forward`, weight paths equal to the
//! checkpoint names); this file holds the public [`Model`].
//!
//! One forward ([`Model::forward`]) serves training (with the autograd graph), scoring, prefill
//! and cached decoding; a cached forward writes keys and values through a [`KvStore`] (the
//! concatenating [`crate::KvCache`] here, the sampler's preallocated in-place cache in
//! `rlvr-rollout`).

use std::cell::RefCell;
use std::path::Path;

use candle_core::{DType, Device, Tensor, Var};
use rand::SeedableRng;
use rand_distr::Distribution;

use crate::config::{Arch, ModelConfig};
use crate::error::{ModelError, Result};
use crate::kv::KvStore;
pub use crate::layers::MASK_BIAS;
use crate::layers::{AttnMask, DecoderLayer, Linear, Loader, RmsNorm, Rotary, Vb};
use crate::ops::upcast;
use crate::param::{Param, Pass};
use crate::weights::WeightFiles;

mod lora;

/// A causal language model with trainable weights.
///
/// Weights are candle [`Var`]s in the compute dtype, each under its checkpoint name
/// ([`Model::named_vars`]); the training forward builds the autograd graph through them, the
/// other forwards use detached handles on the same storage. `clone()` shares the weights (an
/// in-place update through one is seen by the other, as for `Var`); [`Model::try_clone`] copies.
///
/// With LoRA adapters attached ([`Model::add_lora`], or loaded from a checkpoint's `adapter/`)
/// the trainable weights are the adapters only and the base is frozen (module [`crate::lora`]).
#[derive(Clone)]
pub struct Model {
    config: ModelConfig,
    pub(crate) embed: Param,
    pub(crate) layers: Vec<DecoderLayer>,
    pub(crate) norm: RmsNorm,
    /// The output projection; shares `embed`'s weight when tied.
    pub(crate) lm_head: Linear,
    tied: bool,
    rotary: Rotary,
    /// Gemma 3's sliding layers' rotary embedding (`rope_local_base_freq`, no scaling).
    rotary_local: Option<Rotary>,
    device: Device,
    dtype: DType,
    /// Recompute each decoder layer's forward in the backward ([`crate::recompute`]).
    checkpointing: bool,
    /// The fused kernels' switches ([`Model::set_kernels`]) and what they resolved to here.
    kernels: crate::kernels::KernelSwitches,
    fused: crate::kernels::Fused,
    /// The LoRA adapters' settings when adapters are attached (then the base is frozen).
    pub(crate) lora: Option<crate::lora::LoraConfig>,
    /// The directory the base weights were loaded from (`base_model_name_or_path` of a saved
    /// adapter); `None` for a random model.
    pub(crate) source: Option<std::path::PathBuf>,
    /// The config.json the model was loaded from, as it was (`None` for a random or converted
    /// model): [`Model::save`] writes it back with only the dtype changed, so a checkpoint keeps
    /// the base model's fields (`pad_token_id`, `unk_token_id`, `transformers_version`, ...).
    pub(crate) source_config: Option<serde_json::Value>,
}

/// Converts an attention mask `[B, T]` (1 = token, 0 = padding) to position ids: the number of
/// real tokens before each position (transformers' `cumsum(mask) - 1`, clamped at 0), which makes
/// the result independent of the padding side.
pub fn position_ids(mask: &[Vec<u32>]) -> Vec<Vec<u32>> {
    mask.iter()
        .map(|row| {
            let mut c = 0u32;
            row.iter()
                .map(|&m| {
                    c += m;
                    c.saturating_sub(1)
                })
                .collect()
        })
        .collect()
}

/// Whether two tensors share one storage (candle's own check is private to it).
fn same_storage(a: &Tensor, b: &Tensor) -> bool {
    let addr = |t: &Tensor| {
        let (s, _) = t.storage_and_layout();
        &*s as *const candle_core::Storage as usize
    };
    addr(a) == addr(b)
}

impl Model {
    /// Loads a HuggingFace model directory (config.json + safetensors weights) with weights in
    /// `dtype` (F32 or BF16) on `device`.
    ///
    /// Errors: missing config.json or weights, unknown `model_type`, a missing tensor, a shape
    /// mismatch, or a tensor config.json has no place for (weights of more layers than
    /// `num_hidden_layers`); each names the file and the tensor.
    ///
    /// A directory with a LoRA adapter (`adapter/adapter_config.json`, as rlvr's checkpoints
    /// write, or `adapter_config.json` at the top, as PEFT's `save_pretrained` does) loads its
    /// base (the directory's own weights when it has them, else `base_model_name_or_path`) and
    /// attaches the adapter: see [`crate::lora::find_adapter`].
    pub fn load(dir: &Path, dtype: DType, device: &Device) -> Result<Self> {
        if let Some(adapter) = crate::lora::find_adapter(dir) {
            return lora::load_with_adapter(dir, &adapter, dtype, device);
        }
        Self::load_base(dir, dtype, device)
    }

    /// [`Model::load`] of the weights in `dir` alone (any adapter there is ignored).
    pub fn load_base(dir: &Path, dtype: DType, device: &Device) -> Result<Self> {
        let cfg_path = dir.join("config.json");
        if !cfg_path.exists() {
            return Err(ModelError::MissingFile {
                path: cfg_path,
                what: "model configuration".into(),
            });
        }
        let raw = ModelConfig::read_json(&cfg_path)?;
        let config = ModelConfig::from_json(&raw, &cfg_path)?;
        let files = WeightFiles::open(dir)?;
        let mut used = std::collections::HashSet::new();
        // The multimodal Gemma 3 wrapper: the language model's weights under its prefix, the
        // vision tower's and projector's left unread.
        let wrapper = raw.get("model_type").and_then(|t| t.as_str()) == Some("gemma3");
        let stored = |name: &str| -> String {
            if !wrapper {
                return name.to_string();
            }
            // Hub and transformers' save_pretrained: `language_model.model.…`; transformers'
            // in-memory layout: `model.language_model.…`.
            let hub = format!("language_model.{name}");
            match name.strip_prefix("model.") {
                Some(rest) if !files.contains(&hub) => format!("model.language_model.{rest}"),
                _ => hub,
            }
        };
        if wrapper {
            let vision = |k: &str| {
                ["vision_tower.", "multi_modal_projector."]
                    .iter()
                    .any(|p| k.starts_with(p) || k.starts_with(&format!("model.{p}")))
            };
            used.extend(files.names().filter(|k| vision(k)).map(str::to_string));
        }
        // Phi-3's fused projections, read once and split by rows (the last one read is kept).
        let mut fused_read: Option<(String, Tensor)> = None;
        let mut load = |name: &str, shape: &[usize]| -> Result<Var> {
            let key = stored(name);
            if let Some((fused, at, rows)) = phi3_fused(&config, &key) {
                if !files.contains(&key) {
                    if fused_read.as_ref().is_none_or(|(n, _)| n != &fused) {
                        let t = files.load(&fused, &[rows, shape[1]], dtype, device)?;
                        fused_read = Some((fused.clone(), t));
                    }
                    let t = &fused_read.as_ref().expect("read above").1;
                    used.insert(fused);
                    return Ok(Var::from_tensor(&t.narrow(0, at, shape[0])?.contiguous()?)?);
                }
            }
            let t = files.load(&key, shape, dtype, device)?;
            used.insert(key);
            Ok(Var::from_tensor(&t)?)
        };
        let mut m = Self::build(config.clone(), dtype, device, &mut load)?;
        files.refuse_unused(&used, &cfg_path)?;
        m.source = Some(std::fs::canonicalize(dir).unwrap_or_else(|_| dir.to_path_buf()));
        m.source_config = Some(raw);
        Ok(m)
    }

    /// Builds the model from `load` (`(checkpoint name, shape) → Var`), called once per weight
    /// in checkpoint order.
    fn build(
        config: ModelConfig,
        dtype: DType,
        device: &Device,
        load: &mut dyn FnMut(&str, &[usize]) -> Result<Var>,
    ) -> Result<Self> {
        let c = &config;
        let cell: RefCell<&mut Loader> = RefCell::new(load);
        let vb = Vb::root(&cell);
        let m = vb.pp("model");
        let embed = m
            .pp("embed_tokens")
            .get("weight", &[c.vocab_size, c.hidden_size])?;
        let layers = (0..c.num_hidden_layers)
            .map(|l| DecoderLayer::new(c, l, m.pp("layers").pp(l)))
            .collect::<Result<Vec<_>>>()?;
        let norm = RmsNorm::of(c, m.pp("norm"), c.hidden_size)?;
        // Some tied checkpoints still store lm_head.weight; tying wins, as in transformers.
        let tied = c.tie_word_embeddings;
        let lm_head = if tied {
            Linear::tied(embed.clone())
        } else {
            Linear::new(vb.pp("lm_head"), c.vocab_size, c.hidden_size, false)?
        };
        let kernels = crate::kernels::KernelSwitches::default();
        let fused = crate::kernels::Fused::of(&kernels, c, dtype, device);
        let rotary_local = (c.gemma.as_ref())
            .and_then(|g| g.rope_local_base_freq)
            .map(|theta| {
                let mut local = c.clone();
                local.rope_theta = theta;
                local.rope_scaling = None;
                Rotary::new(&local, dtype, device)
            });
        let mut m = Self {
            rotary: Rotary::new(c, dtype, device),
            rotary_local,
            config,
            embed,
            layers,
            norm,
            lm_head,
            tied,
            device: device.clone(),
            dtype,
            checkpointing: false,
            kernels,
            fused,
            lora: None,
            source: None,
            source_config: None,
        };
        m.apply_fused();
        Ok(m)
    }

    /// A randomly initialised model (weights ~ N(0, `init_std`), norms 1 (Gemma's `1 + weight`
    /// norms: weights 0), biases 0), as transformers' `_init_weights` with
    /// `initializer_range = init_std`. Deterministic in `seed`.
    pub fn random(
        config: ModelConfig,
        init_std: f64,
        seed: u64,
        dtype: DType,
        device: &Device,
    ) -> Result<Self> {
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        let normal = rand_distr::Normal::new(0.0f32, init_std as f32)
            .map_err(|e| ModelError::Invalid(format!("init_std: {e}")))?;
        let norm_init = if config.arch.is_gemma() { 0.0 } else { 1.0 };
        let mut load = |name: &str, shape: &[usize]| -> Result<Var> {
            let n: usize = shape.iter().product();
            let data: Vec<f32> = if name.ends_with("norm.weight") {
                vec![norm_init; n]
            } else if name.ends_with(".bias") {
                vec![0.0; n]
            } else {
                (0..n).map(|_| normal.sample(&mut rng)).collect()
            };
            let t = Tensor::from_vec(data, shape, device)?.to_dtype(dtype)?;
            Ok(Var::from_tensor(&t)?)
        };
        Self::build(config, dtype, device, &mut load)
    }

    /// The model configuration (config.json).
    pub fn config(&self) -> &ModelConfig {
        &self.config
    }

    /// The device the weights live on.
    pub fn device(&self) -> &Device {
        &self.device
    }

    /// The compute dtype of the weights.
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// Activation (gradient) checkpointing: when on, a forward with `grad` keeps one
    /// `[B, T, hidden]` tensor per decoder layer and recomputes the layer in the backward
    /// ([`crate::recompute`]; transformers' `gradient_checkpointing_enable`). Backpropagate with
    /// [`crate::recompute::backward`] to get the weight gradients. Off by default.
    pub fn set_gradient_checkpointing(&mut self, on: bool) {
        self.checkpointing = on;
    }

    /// The fused GPU kernels to use ([`crate::kernels`]; `[kernels]` of the training config):
    /// resolved here against the model's device, dtype and shapes, once (fallbacks and no-ops
    /// are logged once). Every switch defaults to `auto`, which is on for CUDA only for kernels
    /// that passed the GPU check (none yet), so a model is built with the candle composition.
    /// The CPU path is unchanged whatever the switches.
    pub fn set_kernels(&mut self, switches: crate::kernels::KernelSwitches) {
        self.kernels = switches;
        self.fused = crate::kernels::Fused::of(&switches, &self.config, self.dtype, &self.device);
        self.apply_fused();
    }

    /// The fused kernels' switches ([`Model::set_kernels`]).
    pub fn kernels(&self) -> crate::kernels::KernelSwitches {
        self.kernels
    }

    fn apply_fused(&mut self) {
        for l in &mut self.layers {
            l.set_fused(self.fused);
        }
        self.norm.fused = self.fused.rms_norm;
    }

    /// The resolved fused-op flags ([`Model::set_kernels`]).
    #[cfg(test)]
    pub(crate) fn fused_flags(&self) -> crate::kernels::Fused {
        self.fused
    }

    /// Whether `kernels.adamw` resolved on for this model (CUDA; on the CPU, `"on"` flags it
    /// for the launch recorder only): what [`crate::optim::AdamW::set_fused`] takes.
    pub fn fused_adamw(&self) -> bool {
        self.fused.adamw
    }

    /// Whether the log-prob head's chunk kernels run (on CUDA, or on the CPU under the launch
    /// recorder).
    pub(crate) fn fused_head(&self) -> bool {
        self.fused.logprob_head
    }

    /// Whether fused attention runs (on CUDA, or on the CPU under the launch recorder).
    pub(crate) fn fused_attention(&self) -> bool {
        self.fused.attention
    }

    /// The fused attention kernels' layout over `seqs` of a flat axis of `n` positions.
    pub(crate) fn fused_layout(
        &self,
        n: usize,
        seqs: Vec<rlvr_kernels::triton::families::attention::Seq>,
    ) -> std::sync::Arc<crate::layers::FusedLayout> {
        let c = &self.config;
        std::sync::Arc::new(crate::layers::FusedLayout {
            n_tokens: n,
            seqs,
            q_heads: c.num_attention_heads,
            kv_heads: c.num_key_value_heads,
            head_dim: c.head_dim,
            // The layers' scale: Gemma's query_pre_attn_scalar^-½, else head_dim^-½.
            softmax_scale: match &c.gemma {
                Some(g) => (1.0 / g.query_pre_attn_scalar.sqrt()) as f32,
                None => (1.0 / (c.head_dim as f64).sqrt()) as f32,
            },
            // Per layer: a sliding layer sets its window (`layers::Attention::forward`).
            window: 0,
        })
    }

    /// Whether activation checkpointing is on.
    pub fn gradient_checkpointing(&self) -> bool {
        self.checkpointing
    }

    /// The base params in checkpoint order (the one weight list).
    pub(crate) fn params(&self) -> Vec<&Param> {
        let mut v = vec![&self.embed];
        for layer in &self.layers {
            layer.params(&mut v);
        }
        v.push(&self.norm.weight);
        if !self.tied {
            v.push(&self.lm_head.weight);
        }
        v
    }

    /// The trainable params: the adapters when LoRA is on, else the base params.
    fn trainable(&self) -> Vec<&Param> {
        match self.lora {
            Some(_) => self.adapter_params(),
            None => self.params(),
        }
    }

    /// Every trainable weight with its HuggingFace tensor name, in a fixed order (embedding,
    /// layers, final norm, lm_head). Tied models list the embedding once (as
    /// `model.embed_tokens.weight`). With LoRA adapters attached: the adapters only, under PEFT's
    /// names (`base_model.model.model.layers.N.self_attn.q_proj.lora_A.weight` `[r, in]`, then
    /// `…lora_B.weight` `[out, r]`), layer by layer; the frozen base is [`Model::base_vars`].
    pub fn named_vars(&self) -> Vec<(String, &Var)> {
        self.trainable()
            .into_iter()
            .map(|p| (p.name.clone(), &p.var))
            .collect()
    }

    /// The base weights with their checkpoint names (equal to [`Model::named_vars`] without LoRA).
    pub fn base_vars(&self) -> Vec<(String, &Var)> {
        self.params()
            .into_iter()
            .map(|p| (p.name.clone(), &p.var))
            .collect()
    }

    /// The weight named `name` (a checkpoint name, as in [`Model::named_vars`] or
    /// [`Model::base_vars`]), if the model has it.
    pub fn var(&self, name: &str) -> Option<&Var> {
        self.trainable()
            .into_iter()
            .chain(self.params())
            .find(|p| p.name == name)
            .map(|p| &p.var)
    }

    /// The rotary tables cos and sin `[n, head_dim]` of positions `0..n` exactly as the layers
    /// use them: angles `position · inv_freq` in f32, then cos/sin cast to the compute dtype
    /// (the fused decode step reads them as f32 copies).
    ///
    /// Errors: tensor errors (out of memory).
    pub fn rotary_tables(&self, n: usize) -> Result<(Tensor, Tensor)> {
        self.rotary.tables(n)
    }

    /// The lm_head weight `[vocab, hidden]` (the embedding when tied), detached.
    pub fn head_weight(&self) -> &Tensor {
        self.lm_head.weight.get(false)
    }

    /// Copies `weights` (checkpoint name → tensor) into the model's weights in place, converted
    /// to the model's dtype and device; weights not listed keep their values, and
    /// `lm_head.weight` of a tied model is skipped (tying wins, as when loading). A tensor that
    /// already is the weight's storage (a model sharing its weights) is left as it is.
    ///
    /// Errors: an unknown name or a shape mismatch (nothing is copied then), tensor errors.
    ///
    /// With LoRA the names are the adapters' ([`Model::named_vars`]); the frozen base is not
    /// loaded this way.
    pub fn load_named(&self, weights: &[(String, Tensor)]) -> Result<()> {
        let params = self.trainable();
        let mut plan = Vec::with_capacity(weights.len());
        for (name, t) in weights {
            if self.tied && name == "lm_head.weight" {
                continue;
            }
            let p = params.iter().find(|p| &p.name == name).ok_or_else(|| {
                ModelError::Invalid(format!("load_named: the model has no weight `{name}`"))
            })?;
            if t.dims() != p.var.dims() {
                return Err(ModelError::Invalid(format!(
                    "load_named: `{name}` has shape {:?}, the model's is {:?}",
                    t.dims(),
                    p.var.dims()
                )));
            }
            plan.push((p, t));
        }
        for (p, t) in plan {
            if same_storage(p.var.as_tensor(), t) {
                continue;
            }
            p.var
                .set(&t.to_device(&self.device)?.to_dtype(p.var.dtype())?)?;
        }
        Ok(())
    }

    /// The one forward: runs the decoder stack and the final norm over `ids` `[B, T]`.
    ///
    /// - `positions`: `B·T` rotary positions (row-major), e.g. from [`position_ids`].
    /// - `bias`: `[B, 1, T, S]` additive attention bias (0 visible, [`MASK_BIAS`] hidden) over the
    ///   S = cached + T key positions; a `[B, 1, 1, S]` bias broadcasts over the T queries.
    /// - `cache`: when given, keys/values of earlier positions are read from it and the new ones
    ///   stored (prefill and decode); on the CPU in f32 a forward of at most
    ///   `rlvr_kernels::skinny::MAX_ROWS` positions then takes the skinny matmul kernel.
    /// - `grad`: build the autograd graph through the weights (training).
    ///
    /// Returns the final hidden states `[B, T, hidden]` in the compute dtype.
    ///
    /// Errors: `positions` not `B·T` long, shapes that disagree, a full cache.
    pub fn forward(
        &self,
        ids: &Tensor,
        positions: &[u32],
        bias: &Tensor,
        cache: Option<&mut dyn KvStore>,
        grad: bool,
    ) -> Result<Tensor> {
        self.forward_masked(ids, positions, bias, None, cache, grad)
    }

    /// [`Model::forward`], with the key mask the bias was built from when the caller has it
    /// (1 = a visible key): `[B][T]` for a causal padding mask with no past
    /// ([`Model::attention_bias`]'s), so that fused attention takes its layout from the mask
    /// instead of reading the `[B, 1, T, T]` bias back from the device (the sampler's prefill);
    /// or `[B][past + T]` after `past` cached positions, each row's new tokens and its visible
    /// past keys each one contiguous block, every new query seeing all of that past and its own
    /// earlier new keys (a multi-turn episode's later turn with kept keys and values): then,
    /// without `grad`, fused attention reads the past keys from the cache instead of
    /// materialising `[B, heads, T, past + T]` scores.
    ///
    /// Errors: as [`Model::forward`].
    pub fn forward_masked(
        &self,
        ids: &Tensor,
        positions: &[u32],
        bias: &Tensor,
        key_mask: Option<&[Vec<u32>]>,
        cache: Option<&mut dyn KvStore>,
        grad: bool,
    ) -> Result<Tensor> {
        let (b, t) = ids.dims2()?;
        if positions.len() != b * t {
            return Err(ModelError::Invalid(format!(
                "positions hold {} entries for ids of shape [{b}, {t}]",
                positions.len()
            )));
        }
        // Fused attention runs without a cache, on a prefill into an empty one (the sampler's
        // prompts: the layers write the keys and values into the cache, then attend over the
        // new positions only), and on new positions after cached ones when the key mask says
        // which past keys each row sees (a multi-turn episode's later turn; forward only).
        let past = cache.as_ref().map_or(0, |c| c.len());
        let fused = match key_mask {
            _ if !self.fused.attention => None,
            Some(mask) if past > 0 => {
                let seqs = (!grad && mask.len() == b && bias.dims() == [b, 1, t, past + t])
                    .then(|| crate::kernels::kept_seqs(mask, past, t))
                    .flatten();
                if seqs.is_none() {
                    crate::kernels::log_once(
                        "kernels.attention: new positions after a cache whose rows' past keys are \
                         not one contiguous block each run the candle composition"
                            .into(),
                    );
                }
                seqs.map(|seqs| self.fused_layout(b * (t + past), seqs))
            }
            _ if past > 0 => None,
            Some(mask) if mask.len() == b && bias.dims() == [b, 1, t, t] => {
                match crate::kernels::mask_seqs(mask, t) {
                    Some(seqs) => Some(self.fused_layout(b * t, seqs)),
                    None => self.dense_fused_layout(bias, b, t)?,
                }
            }
            _ => self.dense_fused_layout(bias, b, t)?,
        };
        let bias = bias.to_dtype(upcast(self.dtype))?.unsqueeze(2)?; // [B, 1, 1, T, S]
                                                                     // The sliding layers' mask: each query's `size` last visible keys.
        let window = match &self.config.sliding_window {
            // One bias row broadcast over several queries cannot say which keys each one's
            // window keeps.
            Some(_) if t > 1 && bias.dim(3)? != t => {
                return Err(ModelError::Invalid(format!(
                    "a sliding-window model needs an attention bias with a row per query: got                      {:?} for {t} new positions",
                    bias.dims()
                )))
            }
            Some(w) => crate::layers::window_bias(&bias, w.size)?,
            None => None,
        };
        // LoRA dropout's token keys: the rows' real tokens are the key mask's ones.
        let keys = match (grad && self.lora_dropout_active(), key_mask) {
            (true, Some(m)) if past == 0 && m.len() == b && m.iter().all(|r| r.len() == t) => {
                let host = ids.flatten_all()?.to_vec1::<u32>()?;
                Some(crate::lora::row_keys(&host, Some(m), b, t))
            }
            _ => None,
        };
        let x = self.stack(
            ids,
            positions,
            &AttnMask::Dense(bias, fused, window),
            cache,
            grad,
            keys,
        )?;
        let pass = self.pass(grad, false);
        self.norm.forward(&x, pass)
    }

    /// The fused attention layout of a dense forward without a cache: each row's real tokens (a
    /// causal padding mask read from `bias` `[B, 1, T, T]`); `None` for another mask (then the
    /// composition runs, said once in the log).
    fn dense_fused_layout(
        &self,
        bias: &Tensor,
        b: usize,
        t: usize,
    ) -> Result<Option<std::sync::Arc<crate::layers::FusedLayout>>> {
        if bias.dims() != [b, 1, t, t] {
            return Ok(None);
        }
        let host = bias.to_dtype(DType::F32)?.flatten_all()?.to_vec1::<f32>()?;
        Ok(match crate::kernels::dense_seqs(&host, b, t) {
            Some(seqs) => Some(self.fused_layout(b * t, seqs)),
            None => {
                crate::kernels::log_once(
                    "kernels.attention: an attention bias that is not a causal padding mask runs \
                     the candle composition"
                        .into(),
                );
                None
            }
        })
    }

    /// How a forward with (`grad`) or without the graph runs; `cached` whether it reads a KV cache.
    pub(crate) fn pass(&self, grad: bool, cached: bool) -> Pass {
        Pass {
            grad,
            base: grad && self.lora.is_none(),
            fast: cached && !grad,
            dropout: grad,
        }
    }

    /// The decoder stack without the final norm: embeds `ids` `[B, T]` and runs every layer with
    /// `positions` (`B·T`) and `mask`; with `grad` and checkpointing on (and no cache), each layer
    /// is checkpointed ([`crate::recompute`]). With `grad` and LoRA dropout, `dropout_keys` are
    /// the `B·T` tokens' keys (`crate::lora::DropoutKeys`; `None`: every token of a row is real,
    /// [`crate::lora::row_keys`]). Returns `[B, T, hidden]` (compute dtype).
    pub(crate) fn stack(
        &self,
        ids: &Tensor,
        positions: &[u32],
        mask: &AttnMask,
        mut cache: Option<&mut dyn KvStore>,
        grad: bool,
        dropout_keys: Option<Vec<u64>>,
    ) -> Result<Tensor> {
        let (b, t) = ids.dims2()?;
        let pass = self.pass(grad, cache.is_some());
        let (cos, sin) = self.rotary.forward(positions, b, t)?;
        let fused = (self.fused.rotary)
            .then(|| self.rotary.fused(positions))
            .transpose()?;
        let dropout = match pass.dropout && self.lora_dropout_active() {
            true => {
                let tokens = match dropout_keys {
                    Some(k) => k,
                    None => {
                        let host = ids.flatten_all()?.to_vec1::<u32>()?;
                        crate::lora::row_keys(&host, None, b, t)
                    }
                };
                Some(std::sync::Arc::new(crate::lora::DropoutKeys {
                    round: self.lora_dropout_round().unwrap_or(0),
                    tokens,
                }))
            }
            false => None,
        };
        let local = match &self.rotary_local {
            Some(r) => Some(r.forward(positions, b, t)?),
            None => None,
        };
        let rope = crate::layers::Rope {
            cos,
            sin,
            fused,
            local,
            dropout,
        };
        let mut x = self
            .embed
            .get(pass.base)
            .index_select(&ids.flatten_all()?, 0)?
            .reshape((b, t, self.config.hidden_size))?;
        if self.config.arch.is_gemma() {
            x = (x * self.embed_scale()?)?;
        }
        let recompute = grad && self.checkpointing && cache.is_none();
        for (li, layer) in self.layers.iter().enumerate() {
            if recompute {
                x = crate::recompute::checkpointed(layer, &x, &rope, mask, pass.base)?;
                continue;
            }
            let store = cache.as_deref_mut().map(|c| (c, li));
            x = layer.forward(&x, &rope, mask, store, pass)?;
        }
        if let Some(c) = cache {
            c.commit(t)?;
        }
        Ok(x)
    }

    /// Gemma's embedding multiplier √hidden_size as transformers applies it: computed in f32,
    /// then rounded to the compute dtype (`embed_scale.to(weight.dtype)`: 48 → 48 in bf16, but
    /// √2304 = 48 and √1152 = 33.94… → 34.0 in bf16).
    ///
    /// Errors: tensor errors.
    pub(crate) fn embed_scale(&self) -> Result<f64> {
        let s = (self.config.hidden_size as f32).sqrt();
        let r = Tensor::new(&[s], &Device::Cpu)?
            .to_dtype(self.dtype)?
            .to_dtype(DType::F64)?
            .to_vec1::<f64>()?;
        Ok(r[0])
    }

    /// The final-logit softcapping of Gemma 2 (`cap · tanh(logits / cap)`), `None` when the
    /// model has none: every path that turns hidden states into logits or log-probs applies it
    /// ([`Model::lm_head`], the log-prob head, the sampler's packed head).
    pub fn final_logit_softcap(&self) -> Option<f64> {
        self.config
            .gemma
            .as_ref()
            .and_then(|g| g.final_logit_softcapping)
    }

    /// `logits` `[.., vocab]` through [`Model::final_logit_softcap`] (unchanged without one).
    ///
    /// Errors: tensor errors.
    pub fn softcap_logits(&self, logits: Tensor) -> Result<Tensor> {
        Ok(match self.final_logit_softcap() {
            Some(cap) => ((logits / cap)?.tanh()? * cap)?,
            None => logits,
        })
    }

    /// The final RMSNorm on hidden states `[.., hidden]` (with the graph when `grad`).
    pub(crate) fn final_norm(&self, x: &Tensor, grad: bool) -> Result<Tensor> {
        self.norm.forward(x, self.pass(grad, false))
    }

    /// [`Model::forward`] with positions given per row, `[B][T]`.
    pub fn forward_hidden(
        &self,
        ids: &Tensor,
        positions: &[Vec<u32>],
        bias: &Tensor,
        cache: Option<&mut dyn KvStore>,
        grad: bool,
    ) -> Result<Tensor> {
        let flat: Vec<u32> = positions.iter().flatten().copied().collect();
        self.forward(ids, &flat, bias, cache, grad)
    }

    /// Logits `[.., vocab]` (compute dtype) of final hidden states `[.., hidden]`, softcapped
    /// for Gemma 2 ([`Model::final_logit_softcap`]). Without `grad`, on the CPU in f32, a few
    /// rows take the skinny matmul kernel.
    pub fn lm_head(&self, hidden: &Tensor, grad: bool) -> Result<Tensor> {
        let base = grad && self.lora.is_none();
        let logits = self.lm_head.forward(
            hidden,
            Pass {
                grad,
                base,
                fast: !grad,
                dropout: grad,
            },
        )?;
        self.softcap_logits(logits)
    }

    /// Builds the additive attention bias `[B, 1, T, S]` for `T` new positions after `past`
    /// cached ones: key j is visible to query i when j ≤ past + i and `key_mask[b][j] == 1`.
    /// `key_mask` is `[B, S]` over all S = past + T positions.
    pub fn attention_bias(&self, key_mask: &[Vec<u32>], past: usize, t: usize) -> Result<Tensor> {
        let b = key_mask.len();
        let s = past + t;
        let mut data = vec![MASK_BIAS; b * t * s];
        for (bi, row) in key_mask.iter().enumerate() {
            if row.len() != s {
                return Err(ModelError::Invalid(format!(
                    "attention mask row {bi} has {} entries, expected {s}",
                    row.len()
                )));
            }
            for i in 0..t {
                let base = (bi * t + i) * s;
                for j in 0..=past + i {
                    if row[j] != 0 {
                        data[base + j] = 0.0;
                    }
                }
            }
        }
        Ok(Tensor::from_vec(data, (b, 1, t, s), &self.device)?)
    }

    /// Inference forward for sampling: runs `ids` `[B, T]` (new positions) against `cache`,
    /// appending their keys/values, and returns logits `[B, vocab]` (f32) of the last new
    /// position only. `key_mask` is `[B][cached + T]`; `positions` `[B][T]`.
    pub fn forward_cached(
        &self,
        ids: &[Vec<u32>],
        positions: &[Vec<u32>],
        key_mask: &[Vec<u32>],
        cache: &mut dyn KvStore,
    ) -> Result<Tensor> {
        let b = ids.len();
        let t = ids.first().map(|r| r.len()).unwrap_or(0);
        let flat: Vec<u32> = ids.iter().flatten().copied().collect();
        let ids_t = Tensor::from_vec(flat, (b, t), &self.device)?;
        let past = cache.len();
        let bias = self.attention_bias(key_mask, past, t)?;
        let hidden = self.forward_hidden(&ids_t, positions, &bias, Some(cache), false)?;
        let last = hidden.narrow(1, t - 1, 1)?.squeeze(1)?;
        Ok(self.lm_head(&last, false)?.to_dtype(DType::F32)?)
    }

    /// A deep copy: new [`Var`]s holding copies of every weight (for a frozen reference policy or
    /// an explorer that samples while the trainer updates). With LoRA adapters only the adapters
    /// are copied and the frozen base is shared (nothing writes it), so an explorer costs no
    /// second base in memory.
    pub fn try_clone(&self) -> Result<Self> {
        if self.lora.is_some() {
            return self.copy_adapters();
        }
        let params = self.params();
        let mut copy = |name: &str, _shape: &[usize]| -> Result<Var> {
            let p = params
                .iter()
                .find(|p| p.name == name)
                .expect("the same config builds the same weight list");
            Ok(Var::from_tensor(&p.var.as_tensor().copy()?)?)
        };
        let mut m = Self::build(self.config.clone(), self.dtype, &self.device, &mut copy)?;
        m.rotary = self.rotary.clone();
        m.rotary_local = self.rotary_local.clone();
        m.checkpointing = self.checkpointing;
        m.set_kernels(self.kernels);
        m.source = self.source.clone();
        m.source_config = self.source_config.clone();
        Ok(m)
    }

    /// Writes config.json and model.safetensors (weights in `dtype`) into `dir` atomically.
    /// Tokenizer files are not written here. config.json is the one the model was loaded from
    /// with only its dtype field changed ([`ModelConfig::json_bytes_over`]), or a
    /// transformers-4 style one ([`ModelConfig::to_json`]) for a model from no directory.
    ///
    /// With LoRA adapters: config.json and `adapter/` (PEFT's files, [`crate::lora`]); the frozen
    /// base is referenced by `base_model_name_or_path` and not written again, except for a model
    /// whose base came from no directory (a random one), whose base weights are written too.
    /// Temporaries that a writer of `dir` killed mid-write left behind are removed first
    /// ([`rlvr_rundir::fs::remove_stale_temporaries`]).
    pub fn save(&self, dir: &Path, dtype: DType) -> Result<()> {
        std::fs::create_dir_all(dir).map_err(|e| ModelError::Io {
            path: dir.to_path_buf(),
            err: e,
        })?;
        // What an earlier writer of `dir` killed mid-write left (`.NAME.tmp-PID`).
        rlvr_rundir::fs::remove_stale_temporaries(dir);
        if self.lora.is_some() {
            lora::save_adapter(self, &dir.join("adapter"))?;
            if self.source.is_some() {
                return self.save_config(dir, dtype);
            }
        }
        let tensors: Vec<(String, Tensor)> = self
            .base_vars()
            .into_iter()
            .map(|(n, v)| Ok((n, v.as_tensor().detach().to_dtype(dtype)?)))
            .collect::<Result<_>>()?;
        let tensors = fuse_phi3(&self.config, tensors)?;
        crate::weights::write_safetensors(&dir.join("model.safetensors"), &tensors)?;
        self.save_config(dir, dtype)
    }

    /// Writes config.json with `torch_dtype` (or the base's `dtype`) = `dtype`.
    fn save_config(&self, dir: &Path, dtype: DType) -> Result<()> {
        let json = self
            .config
            .json_bytes_over(self.source_config.as_ref(), dtype);
        crate::weights::atomic_write(&dir.join("config.json"), &json)?;
        Ok(())
    }
}

/// Where the split projection weight `name` lies in a Phi-3 checkpoint (`cfg.arch` phi3):
/// `(fused tensor name, first row, fused rows)`. `Phi3Attention` stacks q `[nh·hd]`, k and v
/// `[nkv·hd]` by rows in `self_attn.qkv_proj.weight`; `Phi3MLP` stacks gate then up
/// `[intermediate]` in `mlp.gate_up_proj.weight` (its `chunk(2)`). `None` for other names and
/// architectures.
fn phi3_fused(cfg: &ModelConfig, name: &str) -> Option<(String, usize, usize)> {
    if cfg.arch != Arch::Phi3 {
        return None;
    }
    let q = cfg.num_attention_heads * cfg.head_dim;
    let kv = cfg.num_key_value_heads * cfg.head_dim;
    let i = cfg.intermediate_size;
    let (stem, module) = name.strip_suffix(".weight")?.rsplit_once('.')?;
    let (fused, at, rows) = match module {
        "q_proj" => ("qkv_proj", 0, q + 2 * kv),
        "k_proj" => ("qkv_proj", q, q + 2 * kv),
        "v_proj" => ("qkv_proj", q + kv, q + 2 * kv),
        "gate_proj" => ("gate_up_proj", 0, 2 * i),
        "up_proj" => ("gate_up_proj", i, 2 * i),
        _ => return None,
    };
    Some((format!("{stem}.{fused}.weight"), at, rows))
}

/// The checkpoint tensors of a model of `cfg` in the names its architecture's checkpoints use:
/// for phi3 the split projections of [`phi3_fused`] stacked back into `qkv_proj` and
/// `gate_up_proj` (at the place of their first part), so transformers reads the save as a
/// Phi-3 model; unchanged for every other architecture.
///
/// Errors: a part missing (not a model of `cfg`), tensor errors.
fn fuse_phi3(cfg: &ModelConfig, tensors: Vec<(String, Tensor)>) -> Result<Vec<(String, Tensor)>> {
    if cfg.arch != Arch::Phi3 {
        return Ok(tensors);
    }
    let mut parts: std::collections::HashMap<String, Vec<(usize, Tensor)>> = Default::default();
    let mut out: Vec<(String, Option<Tensor>)> = Vec::with_capacity(tensors.len());
    for (name, t) in tensors {
        match phi3_fused(cfg, &name) {
            Some((fused, at, _)) => {
                let entry = parts.entry(fused.clone()).or_default();
                if entry.is_empty() {
                    out.push((fused, None));
                }
                entry.push((at, t));
            }
            None => out.push((name, Some(t))),
        }
    }
    out.into_iter()
        .map(|(name, t)| match t {
            Some(t) => Ok((name, t)),
            None => {
                let mut p = parts.remove(&name).expect("collected above");
                p.sort_by_key(|(at, _)| *at);
                let ts: Vec<&Tensor> = p.iter().map(|(_, t)| t).collect();
                Ok((name, Tensor::cat(&ts, 0)?))
            }
        })
        .collect()
}

#[cfg(test)]
mod gemma_tests {
    use super::*;

    /// Gemma's √hidden embedding multiplier is rounded to the compute dtype as transformers
    /// rounds `embed_scale.to(weight.dtype)`: √1152 (Gemma 3 1B) = 33.941… in f32 but 34 in bf16;
    /// √2304 (Gemma 2 2B) = 48 in both.
    #[test]
    fn the_embedding_multiplier_is_rounded_to_the_compute_dtype() {
        let cfg = |hidden: usize| {
            let mut c = ModelConfig::from_json(
                &serde_json::json!({"model_type": "gemma3_text", "vocab_size": 8,
                    "hidden_size": hidden, "intermediate_size": 8, "num_hidden_layers": 1,
                    "num_attention_heads": 1, "head_dim": 4}),
                Path::new("config.json"),
            )
            .unwrap();
            c.sliding_window = None;
            c
        };
        let scale = |hidden: usize, dtype: DType| {
            Model::random(cfg(hidden), 0.02, 1, dtype, &Device::Cpu)
                .unwrap()
                .embed_scale()
                .unwrap()
        };
        assert_eq!(scale(1152, DType::F32), (1152f32).sqrt() as f64);
        assert!((scale(1152, DType::F32) - 33.941_125).abs() < 1e-5);
        assert_eq!(scale(1152, DType::BF16), 34.0);
        assert_eq!(scale(2304, DType::BF16), 48.0);
        assert_eq!(scale(2304, DType::F32), 48.0);
    }
}
