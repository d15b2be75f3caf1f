//! How a refresh names the weights for the servers' loader ([`ServedLayout`]): its own module so
//! that the client (which holds a layout) and the refresh (which writes with it) both read it
//! without naming each other.

use std::path::Path;

use candle_core::DType;
use rlvr_model::ModelConfig;
use serde_json::Value;

use crate::error::Result;

/// How the checkpoint directory of a refresh names the weights: as the servers' loader takes them
/// for the checkpoint the servers were started on (the trainer's base, `model.path`). vLLM's
/// `reload_weights` reads the directory with the loader of the architecture it serves, which
/// refuses a name outside that model ("There is no module or parameter named …") and leaves the
/// model's layers on the meta device, so the engine dies at its next request.
#[derive(Debug, Clone, PartialEq, Default)]
pub enum ServedLayout {
    /// A `*ForCausalLM` checkpoint (every text architecture rlvr trains): the model's own names
    /// (`model.layers.N.…`, `lm_head.weight`; Phi-3's q/k/v and gate/up split, which vLLM's
    /// Phi-3 loader stacks into `qkv_proj` and `gate_up_proj` as it loads) and its config.json.
    #[default]
    CausalLm,
    /// The multimodal Gemma 3 wrapper (config.json `model_type` "gemma3",
    /// `Gemma3ForConditionalGeneration`), whose language model rlvr trains: every name under
    /// `language_model.` (`language_model.model.layers.N.…`, `language_model.lm_head.weight`: the
    /// Hub's layout, which vLLM's `Gemma3ForConditionalGeneration` loads as named; its vision
    /// tower and projector are not written, and a reload keeps theirs), and the wrapper's
    /// config.json (this value, with its dtype set to the written one).
    Gemma3Multimodal(Value),
}

impl ServedLayout {
    /// The layout of the checkpoint directory `dir` (its config.json: a server started on `dir`
    /// loads this layout): [`ServedLayout::Gemma3Multimodal`] for `model_type` "gemma3", else
    /// [`ServedLayout::CausalLm`]. Read from the directory the servers were started on (a run's
    /// `model.path`), not from the model pushed: rlvr's own checkpoints of a multimodal Gemma 3
    /// base (a resumed run's policy) hold its language model alone. A directory without
    /// config.json (a LoRA adapter's, whose base lies elsewhere) is [`ServedLayout::CausalLm`].
    ///
    /// # Errors
    /// [`crate::VllmError::Model`]: config.json unreadable or not JSON, naming the file.
    pub fn of_dir(dir: &Path) -> Result<Self> {
        let path = dir.join("config.json");
        if !path.exists() {
            return Ok(Self::CausalLm);
        }
        let c = ModelConfig::read_json(&path)?;
        Ok(match c.get("model_type").and_then(Value::as_str) {
            Some("gemma3") => Self::Gemma3Multimodal(c),
            _ => Self::CausalLm,
        })
    }

    /// The name the servers' loader takes for the model's weight `name`.
    pub fn served_name(&self, name: &str) -> String {
        match self {
            Self::CausalLm => name.to_string(),
            Self::Gemma3Multimodal(_) => format!("language_model.{name}"),
        }
    }

    /// config.json's bytes for `config` stored as `dtype` in this layout.
    pub(crate) fn config_bytes(&self, config: &ModelConfig, dtype: DType) -> Vec<u8> {
        let Self::Gemma3Multimodal(wrapper) = self else {
            return config.json_bytes_for(dtype);
        };
        let name = match dtype {
            DType::BF16 => "bfloat16",
            DType::F16 => "float16",
            _ => "float32",
        };
        let mut out = wrapper.clone();
        // The dtype fields the wrapper has (transformers 5: `dtype`; 4: `torch_dtype`), at the top
        // and in `text_config`; `torch_dtype` at the top when it has neither.
        let set = |o: &mut Value, top: bool| {
            if let Some(m) = o.as_object_mut() {
                let has = |k: &str| m.get(k).is_some_and(|v| !v.is_null());
                let (dt, tdt) = (has("dtype"), has("torch_dtype"));
                if dt {
                    m.insert("dtype".into(), name.into());
                }
                if tdt || (top && !dt) {
                    m.insert("torch_dtype".into(), name.into());
                }
            }
        };
        set(&mut out, true);
        if let Some(text) = out.get_mut("text_config") {
            set(text, false);
        }
        let mut b = serde_json::to_vec_pretty(&out).expect("config serialises");
        b.push(b'\n');
        b
    }
}
