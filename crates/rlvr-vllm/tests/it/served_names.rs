//! The names and shapes a full-weight refresh writes, per architecture: what vLLM 0.32's loader
//! of the architecture the servers run takes (checked live by live_arch.rs; docs/vllm.md lists
//! which architectures were served).
//!
//! - Every `*ForCausalLM` architecture: the model's own names and shapes, one tensor each
//!   (Phi-3's q/k/v and gate/up split: vLLM's Phi-3 loader, Llama's, stacks them into its fused
//!   `qkv_proj` and `gate_up_proj` as it loads), plus `lm_head.weight` equal to the embedding for
//!   a tied model, except Gemma 2 (vLLM's has no `lm_head` and refuses one); an untied Gemma 2
//!   is refused, and so is a LongRoPE model on a server whose `--max-model-len` passes its switch.
//! - The multimodal Gemma 3 wrapper: the same tensors under `language_model.`, the wrapper's
//!   config.json with the written dtype; the directory loads back in rlvr as the same model.

use std::collections::BTreeMap;
use std::path::Path;

use candle_core::{DType, Device, Tensor};
use rlvr_model::{Model, ModelConfig};
use rlvr_vllm::{write_weights, write_weights_as, ServedLayout};
use serde_json::{json, Value};

use crate::common::tensors;

/// name → (shape, values) of the safetensors file in `dir`.
fn written(dir: &Path) -> BTreeMap<String, (Vec<usize>, Vec<f32>)> {
    let bytes = std::fs::read(dir.join("model.safetensors")).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    st.tensors()
        .into_iter()
        .map(|(n, v)| {
            assert_eq!(v.dtype(), safetensors::Dtype::F32, "{n}");
            let vals = v
                .data()
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
                .collect();
            (n, (v.shape().to_vec(), vals))
        })
        .collect()
}

fn values(t: &Tensor) -> Vec<f32> {
    t.flatten_all().unwrap().to_vec1().unwrap()
}

/// A random model of `model_type` with the given extra config fields: hidden 32, 2 layers, 4
/// query heads and 2 KV heads of head size 8, intermediate 48, vocabulary 40.
fn tiny(model_type: &str, extra: Value) -> Model {
    let mut j = json!({"model_type": model_type, "vocab_size": 40, "hidden_size": 32,
        "intermediate_size": 48, "num_hidden_layers": 2, "num_attention_heads": 4,
        "num_key_value_heads": 2, "head_dim": 8, "max_position_embeddings": 64});
    for (k, v) in extra.as_object().unwrap() {
        j[k] = v.clone();
    }
    let config = ModelConfig::from_json(&j, "inline".as_ref()).unwrap();
    Model::random(config, 0.3, 5, DType::F32, &Device::Cpu).unwrap()
}

/// The projections and norms of one decoder layer of `model_type`, as `(name, shape)`, for the
/// tiny sizes of [`tiny`] (q 32 rows, k/v 16, MLP 48).
fn layer(model_type: &str, i: usize) -> Vec<(String, Vec<usize>)> {
    let p = |n: &str| format!("model.layers.{i}.{n}");
    let mut v = vec![
        (p("self_attn.q_proj.weight"), vec![32, 32]),
        (p("self_attn.k_proj.weight"), vec![16, 32]),
        (p("self_attn.v_proj.weight"), vec![16, 32]),
        (p("self_attn.o_proj.weight"), vec![32, 32]),
        (p("mlp.gate_proj.weight"), vec![48, 32]),
        (p("mlp.up_proj.weight"), vec![48, 32]),
        (p("mlp.down_proj.weight"), vec![32, 48]),
        (p("input_layernorm.weight"), vec![32]),
        (p("post_attention_layernorm.weight"), vec![32]),
    ];
    if model_type == "qwen2" {
        for (n, rows) in [("q", 32), ("k", 16), ("v", 16)] {
            v.push((p(&format!("self_attn.{n}_proj.bias")), vec![rows]));
        }
    }
    if model_type.starts_with("gemma") {
        v.push((p("pre_feedforward_layernorm.weight"), vec![32]));
        v.push((p("post_feedforward_layernorm.weight"), vec![32]));
    }
    if model_type == "qwen3" || model_type == "gemma3_text" {
        v.push((p("self_attn.q_norm.weight"), vec![8]));
        v.push((p("self_attn.k_norm.weight"), vec![8]));
    }
    v
}

#[test]
fn each_architecture_writes_its_own_names_and_shapes_once() {
    for (model_type, extra) in [
        ("qwen2", json!({"tie_word_embeddings": true})),
        ("qwen3", json!({"tie_word_embeddings": false})),
        ("llama", json!({})),
        ("mistral", json!({})),
        ("gemma2", json!({"query_pre_attn_scalar": 8})),
        ("gemma3_text", json!({"query_pre_attn_scalar": 8})),
        ("phi3", json!({})),
    ] {
        let m = tiny(model_type, extra);
        let tied = m.config().tie_word_embeddings;
        let tmp = tempfile::tempdir().unwrap();
        let dir = write_weights(tmp.path(), 3, &tensors(&m), m.config(), DType::F32).unwrap();
        let got = written(&dir);
        let mut want: BTreeMap<String, Vec<usize>> = (0..2)
            .flat_map(|i| layer(model_type, i))
            .chain([
                ("model.embed_tokens.weight".to_string(), vec![40, 32]),
                ("model.norm.weight".to_string(), vec![32]),
                ("lm_head.weight".to_string(), vec![40, 32]),
            ])
            .collect();
        if model_type == "gemma2" {
            // vLLM's Gemma 2 has no lm_head (logits from the embedding; it refuses one).
            assert!(tied);
            want.remove("lm_head.weight");
        }
        let names: BTreeMap<String, Vec<usize>> = got
            .iter()
            .map(|(n, (s, _))| (n.clone(), s.clone()))
            .collect();
        assert_eq!(names, want, "{model_type}: the names and shapes written");
        // The values are the model's, and a tied head is the embedding.
        for (n, t) in tensors(&m) {
            assert_eq!(got[&n].1, values(&t), "{model_type}: {n}");
        }
        if tied && model_type != "gemma2" {
            assert_eq!(
                got["lm_head.weight"].1, got["model.embed_tokens.weight"].1,
                "{model_type}"
            );
        }
        let cfg: Value =
            serde_json::from_slice(&std::fs::read(dir.join("config.json")).unwrap()).unwrap();
        assert_eq!(cfg["model_type"], model_type);
        assert_eq!(cfg["torch_dtype"], "float32");
        // The directory loads back as the same model.
        let back = Model::load(&dir, DType::F32, &Device::Cpu).unwrap();
        for ((n, a), (_, b)) in tensors(&m).into_iter().zip(tensors(&back)) {
            assert_eq!(values(&a), values(&b), "{model_type}: {n} loaded back");
        }
    }
}

/// A multimodal Gemma 3 checkpoint (transformers' `Gemma3ForConditionalGeneration` layout, the
/// Hub's names): the text model of [`tiny`] under `language_model.`, a vision tensor beside it.
fn multimodal(dir: &Path, m: &Model, dtype_key: &str) {
    let mut text = serde_json::from_slice::<Value>(&m.config().json_bytes_for(DType::F32)).unwrap();
    text.as_object_mut().unwrap().remove("torch_dtype");
    let cfg = json!({"model_type": "gemma3", "architectures": ["Gemma3ForConditionalGeneration"],
        dtype_key: "bfloat16", "text_config": text, "mm_tokens_per_image": 4,
        "vision_config": {"model_type": "siglip_vision_model", "hidden_size": 8}});
    std::fs::write(dir.join("config.json"), cfg.to_string()).unwrap();
    let mut out: Vec<(String, Tensor)> = tensors(m)
        .into_iter()
        .map(|(n, t)| (format!("language_model.{n}"), t))
        .collect();
    out.push((
        "vision_tower.vision_model.post_layernorm.weight".into(),
        Tensor::ones(3, DType::F32, &Device::Cpu).unwrap(),
    ));
    let map: std::collections::HashMap<String, Tensor> = out.into_iter().collect();
    candle_core::safetensors::save(&map, dir.join("model.safetensors")).unwrap();
}

#[test]
fn a_multimodal_gemma3_base_gets_its_language_model_names_and_config() {
    for dtype_key in ["dtype", "torch_dtype"] {
        let m = tiny("gemma3_text", json!({"query_pre_attn_scalar": 8}));
        let base = tempfile::tempdir().unwrap();
        multimodal(base.path(), &m, dtype_key);
        let loaded = Model::load(base.path(), DType::F32, &Device::Cpu).unwrap();
        let layout = ServedLayout::of_dir(base.path()).unwrap();
        assert!(
            matches!(layout, ServedLayout::Gemma3Multimodal(_)),
            "{layout:?}"
        );
        // A text checkpoint (what rlvr saves of it) keeps the model's names.
        let text = tempfile::tempdir().unwrap();
        loaded.save(text.path(), DType::F32).unwrap();
        assert_eq!(
            ServedLayout::of_dir(text.path()).unwrap(),
            ServedLayout::CausalLm
        );

        let tmp = tempfile::tempdir().unwrap();
        let dir = write_weights_as(
            tmp.path(),
            "version-00000002",
            &tensors(&loaded),
            loaded.config(),
            DType::F32,
            &layout,
        )
        .unwrap();
        let got = written(&dir);
        let mut want: Vec<String> = tensors(&m)
            .into_iter()
            .map(|(n, _)| format!("language_model.{n}"))
            .collect();
        want.push("language_model.lm_head.weight".into());
        want.sort();
        assert_eq!(got.keys().cloned().collect::<Vec<_>>(), want, "{dtype_key}");
        for (n, t) in tensors(&m) {
            assert_eq!(got[&format!("language_model.{n}")].1, values(&t), "{n}");
        }
        assert_eq!(
            got["language_model.lm_head.weight"].1,
            got["language_model.model.embed_tokens.weight"].1
        );
        // The wrapper's config.json with the written dtype; the rest as it was.
        let cfg: Value =
            serde_json::from_slice(&std::fs::read(dir.join("config.json")).unwrap()).unwrap();
        let orig: Value =
            serde_json::from_slice(&std::fs::read(base.path().join("config.json")).unwrap())
                .unwrap();
        assert_eq!(cfg[dtype_key], "float32");
        assert_eq!(cfg["text_config"], orig["text_config"]);
        assert_eq!(cfg["vision_config"], orig["vision_config"]);
        assert_eq!(cfg["model_type"], "gemma3");
        // rlvr reads the directory back as the same language model.
        let back = Model::load(&dir, DType::F32, &Device::Cpu).unwrap();
        for ((n, a), (_, b)) in tensors(&m).into_iter().zip(tensors(&back)) {
            assert_eq!(values(&a), values(&b), "{n} loaded back");
        }
    }
}

#[test]
fn an_untied_gemma2_is_refused_and_a_tied_one_passes() {
    let tied = tiny("gemma2", json!({"query_pre_attn_scalar": 8}));
    assert!(tied.config().tie_word_embeddings);
    rlvr_vllm::checks::check_servable(tied.config()).unwrap();
    let untied = tiny(
        "gemma2",
        json!({"query_pre_attn_scalar": 8, "tie_word_embeddings": false}),
    );
    let e = rlvr_vllm::checks::check_servable(untied.config())
        .unwrap_err()
        .to_string();
    assert!(e.contains("untied Gemma 2") && e.contains("lm_head"), "{e}");
    for t in ["gemma3_text", "phi3", "llama", "qwen2", "mistral"] {
        let m = tiny(
            t,
            json!({"query_pre_attn_scalar": 8, "tie_word_embeddings": false}),
        );
        rlvr_vllm::checks::check_servable(m.config()).unwrap();
    }
}

#[test]
fn longrope_needs_a_max_model_len_within_its_switch_and_vllms_attention_factor() {
    use rlvr_vllm::checks::check_longrope;
    use rlvr_vllm::ServerInfo;
    let rope = |extra: Value| {
        let mut r = json!({"rope_type": "longrope", "original_max_position_embeddings": 16,
            "short_factor": [1.0, 1.1, 1.2, 1.3], "long_factor": [1.0, 2.0, 3.0, 4.0]});
        for (k, v) in extra.as_object().unwrap() {
            r[k] = v.clone();
        }
        tiny(
            "phi3",
            json!({"rope_scaling": r, "original_max_position_embeddings": 16}),
        )
    };
    let at = |len: usize| {
        vec![
            ServerInfo {
                url: "http://a".into(),
                max_model_len: 16,
            },
            ServerInfo {
                url: "http://b".into(),
                max_model_len: len,
            },
        ]
    };
    let m = rope(json!({}));
    check_longrope(m.config(), &at(16)).unwrap();
    check_longrope(m.config(), &at(8)).unwrap();
    let e = check_longrope(m.config(), &at(17)).unwrap_err().to_string();
    assert!(
        e.contains("http://b")
            && e.contains("max_model_len 17")
            && e.contains("--max-model-len 16"),
        "{e}"
    );
    // vLLM's factor is √(1 + ln(64/16) / ln 16) = √1.5; an attention_factor or factor that gives
    // another is refused, one that gives the same passes.
    let same = rope(json!({"attention_factor": 1.5f64.sqrt()}));
    check_longrope(same.config(), &at(16)).unwrap();
    for extra in [json!({"attention_factor": 1.0}), json!({"factor": 8.0})] {
        let m = rope(extra.clone());
        let e = check_longrope(m.config(), &at(16)).unwrap_err().to_string();
        assert!(
            e.contains("attention factor") && e.contains("http://a"),
            "{extra}: {e}"
        );
    }
    // Other rope types pass whatever the length.
    check_longrope(tiny("phi3", json!({})).config(), &at(4096)).unwrap();
}

#[test]
fn lora_on_a_multimodal_gemma3_base_is_refused_before_any_request() {
    let m = tiny("gemma3_text", json!({"query_pre_attn_scalar": 8}));
    let base = tempfile::tempdir().unwrap();
    multimodal(base.path(), &m, "dtype");
    let mut policy = Model::load(base.path(), DType::F32, &Device::Cpu).unwrap();
    let lora = rlvr_model::LoraConfig {
        rank: 2,
        alpha: 4.0,
        targets: rlvr_model::LoraTarget::ALL.to_vec(),
        dropout: 0.0,
    };
    policy.add_lora(&lora, 1).unwrap();
    let tok = rlvr_model::TokenizerBundle::load(
        &std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../rlvr-model/tests/fixtures/gemma_tokenizer"),
    )
    .unwrap();
    let weights = tempfile::tempdir().unwrap();
    // No server listens there: the refusal comes before any request.
    let e = rlvr_vllm::VllmRollout::connect(
        rlvr_vllm::VllmRolloutConfig {
            client: rlvr_vllm::ClientConfig {
                servers: vec!["http://127.0.0.1:9".into()],
                served_model_name: "rlvr-policy".into(),
                ..Default::default()
            },
            weights_dir: weights.path().to_path_buf(),
            refresh_tolerance: 1e-4,
            follower: false,
            lease: None,
            served_layout: Some(ServedLayout::of_dir(base.path()).unwrap()),
        },
        &policy,
        &tok,
        8,
        8,
        "rollout.max_new_tokens",
    )
    .err()
    .expect("refused")
    .to_string();
    assert!(e.contains("LoRA on a multimodal Gemma 3"), "{e}");
}
