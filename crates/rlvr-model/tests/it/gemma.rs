//! Gemma 2 and Gemma 3 against transformers, on the fixtures `scripts/make_model_fixtures.py`
//! builds (`gemma2_softcap`: (1 + weight) norms, GeGLU, √hidden embeddings, attention and
//! final-logit softcapping, a window on alternate layers; `gemma3_local_global`: per-head q/k
//! norms, local layers with their own rotary base beside a global layer with linear rope
//! scaling): log-probs, entropies and logits within `parity.rs`'s bound on the fused CPU head, the
//! chunked head and the cached forward; gradients of the summed log-probs against transformers'
//! float64 autograd; the multimodal "gemma3" wrapper's language model; config.json fields as
//! transformers reads them and errors that name the file and the field. Greedy decoding with the
//! KV cache is checked with the other window models (`long_context.rs`, and the sampler's in
//! rlvr-rollout).

use std::path::Path;

use candle_core::{DType, Device, Tensor};
use rlvr_model::{Arch, Model, ModelConfig};
use serde::Deserialize;

use crate::reference::{case_loss, expected, fixture};

const FIXTURES: [&str; 2] = ["gemma2_softcap", "gemma3_local_global"];

#[test]
fn gemma2_with_softcapping_matches_transformers() {
    let worst = crate::parity::check("gemma2_softcap", DType::F32, 1e-4);
    eprintln!("gemma2 worst abs err {worst:e}");
}

#[test]
fn gemma3_with_local_and_global_layers_matches_transformers() {
    let worst = crate::parity::check("gemma3_local_global", DType::F32, 1e-4);
    eprintln!("gemma3 worst abs err {worst:e}");
}

/// The chunked head (every device but the CPU in f32; forced here) matches transformers as the
/// fused CPU head does (which `gemma2_with_softcapping_matches_transformers` runs through Gemma
/// 2's final-logit softcap), both within the parity bound.
#[test]
fn the_chunked_head_matches_transformers_too() {
    rlvr_model::chunked::force_on_cpu(true);
    for name in FIXTURES {
        crate::parity::check(name, DType::F32, 1e-4);
    }
    rlvr_model::chunked::force_on_cpu(false);
}

#[test]
fn bf16_compute_is_close_to_transformers() {
    for name in FIXTURES {
        crate::parity::check(name, DType::BF16, 0.25);
    }
}

/// `∂L/∂w` of L = Σ log-probs of the stored case (the training forward with the graph, through
/// the fused CPU head's softcap for Gemma 2) against transformers' float64 autograd: each
/// stored weight's gradient (norms whole, two rows of a matrix) within 1e-4 of the largest entry
/// (at least 1), and the loss within 1e-4.
#[test]
fn gradients_match_transformers() {
    for name in FIXTURES {
        let model = Model::load(&fixture(name), DType::F32, &Device::Cpu).unwrap();
        let exp = expected(name);
        let case = (exp.cases.iter())
            .find(|c| c.name == exp.grads.case)
            .unwrap();
        let loss = case_loss(&model, case);
        let l: f32 = loss.to_scalar().unwrap();
        assert!(
            (l as f64 - exp.grads.loss).abs() <= 1e-4 * exp.grads.loss.abs().max(1.0),
            "{name}: loss {l} vs {}",
            exp.grads.loss
        );
        let grads = loss.backward().unwrap();
        assert!(exp.grads.weights.len() >= 8, "{name}");
        for (w, want) in &exp.grads.weights {
            let var = model
                .var(w)
                .unwrap_or_else(|| panic!("{name}: no weight {w}"));
            let g = grads.get(var.as_tensor()).unwrap();
            let shape = &exp.grads.shapes[w];
            let g = match shape.len() {
                1 => g.clone(),
                _ => g.narrow(0, 0, shape[0]).unwrap(),
            };
            let got: Vec<f32> = g.flatten_all().unwrap().to_vec1().unwrap();
            assert_eq!(got.len(), want.len(), "{name} {w}");
            let scale = want.iter().fold(1f64, |m, x| m.max(x.abs()));
            for (i, (g, w2)) in got.iter().zip(want).enumerate() {
                assert!(
                    (*g as f64 - w2).abs() <= 1e-4 * scale,
                    "{name} {w}[{i}]: {g} vs transformers {w2}"
                );
            }
        }
    }
}

/// The fields transformers reads: Gemma 2's scale, softcaps and alternating window; Gemma 3's
/// local rotary base (as `rope_parameters.sliding_attention` in the v5 file and
/// `rope_local_base_freq` in the v4 one), the global layers' linear scaling and the layer types.
#[test]
fn configs_read_as_transformers_reads_them() {
    let g2 = ModelConfig::from_file(&fixture("gemma2_softcap").join("config.json")).unwrap();
    assert_eq!(g2.arch, Arch::Gemma2);
    let g = g2.gemma.as_ref().unwrap();
    assert_eq!(g.query_pre_attn_scalar, 24.0);
    assert_eq!(g.attn_logit_softcapping, Some(2.5));
    assert_eq!(g.final_logit_softcapping, Some(3.0));
    assert_eq!(g.rope_local_base_freq, None);
    let w = g2.sliding_window.as_ref().unwrap();
    assert_eq!((w.size, w.layers.clone()), (5, vec![true, false, true]));
    assert!(!g2.tie_word_embeddings);
    let g3 = ModelConfig::from_file(&fixture("gemma3_local_global").join("config.json")).unwrap();
    assert_eq!(g3.arch, Arch::Gemma3);
    let g = g3.gemma.as_ref().unwrap();
    assert_eq!(g.query_pre_attn_scalar, 20.0);
    assert_eq!(
        (g.attn_logit_softcapping, g.final_logit_softcapping),
        (None, None)
    );
    assert_eq!(g.rope_local_base_freq, Some(10000.0));
    assert_eq!(g3.rope_theta, 1e6);
    assert_eq!(
        g3.rope_scaling,
        Some(rlvr_model::RopeScaling::Linear { factor: 8.0 })
    );
    let w = g3.sliding_window.as_ref().unwrap();
    assert_eq!((w.size, w.layers.clone()), (4, vec![true, false, true]));
    // The local layers' frequencies: the default rope of the local base.
    let local = expected("gemma3_local_global").rope_inv_freq_local.unwrap();
    let d = g3.head_dim as f64;
    for (i, want) in local.iter().enumerate() {
        let ours = 1.0 / 10000f64.powf(2.0 * i as f64 / d);
        assert!(
            (ours - want).abs() <= 1e-12 * want,
            "local {i}: {ours} vs {want}"
        );
    }
    let global = expected("gemma3_local_global").rope_inv_freq;
    for (o, w) in g3.rope_inv_freq().iter().zip(&global) {
        assert!((o - w).abs() <= 1e-9 * w, "global: {o} vs {w}");
    }
    // Defaults of Gemma2Config / Gemma3TextConfig for absent fields.
    let bare = |t: &str| {
        ModelConfig::from_json(
            &serde_json::json!({"model_type": t, "vocab_size": 64, "hidden_size": 32,
                "intermediate_size": 64, "num_hidden_layers": 7, "num_attention_heads": 2}),
            Path::new("config.json"),
        )
        .unwrap()
    };
    let (d2, d3) = (bare("gemma2"), bare("gemma3_text"));
    assert_eq!((d2.head_dim, d2.tie_word_embeddings), (256, true));
    let g = d2.gemma.unwrap();
    assert_eq!(
        (
            g.query_pre_attn_scalar,
            g.attn_logit_softcapping,
            g.final_logit_softcapping
        ),
        (256.0, Some(50.0), Some(30.0))
    );
    let alternate: Vec<bool> = (0..7).map(|i| i % 2 == 0).collect();
    assert_eq!(
        d2.sliding_window.unwrap(),
        rlvr_model::SlidingWindow {
            size: 4096,
            layers: alternate
        }
    );
    let every_sixth: Vec<bool> = (0..7).map(|i| i != 5).collect();
    assert_eq!(d3.sliding_window.unwrap().layers, every_sixth);
    assert_eq!(d3.rope_theta, 1e6);
    assert_eq!(d3.gemma.unwrap().rope_local_base_freq, Some(10000.0));
    // Softcapping null: off.
    let off = ModelConfig::from_json(
        &serde_json::json!({"model_type": "gemma2", "vocab_size": 64, "hidden_size": 32,
            "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 2,
            "final_logit_softcapping": null, "attn_logit_softcapping": null}),
        Path::new("config.json"),
    )
    .unwrap();
    let g = off.gemma.unwrap();
    assert_eq!(
        (g.attn_logit_softcapping, g.final_logit_softcapping),
        (None, None)
    );
}

fn base() -> serde_json::Value {
    serde_json::json!({"model_type": "gemma2", "vocab_size": 64, "hidden_size": 32,
        "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 2})
}

/// Each bad Gemma field is refused with the file and the field in the message.
#[test]
fn bad_gemma_fields_are_refused_naming_file_and_field() {
    let cases: Vec<(&str, serde_json::Value, &str)> = vec![
        (
            "query_pre_attn_scalar",
            serde_json::json!(0),
            "query_pre_attn_scalar",
        ),
        (
            "attn_logit_softcapping",
            serde_json::json!(-1.0),
            "attn_logit_softcapping",
        ),
        (
            "final_logit_softcapping",
            serde_json::json!("30"),
            "final_logit_softcapping",
        ),
        (
            "hidden_activation",
            serde_json::json!("silu"),
            "hidden_activation",
        ),
        (
            "use_bidirectional_attention",
            serde_json::json!(true),
            "use_bidirectional_attention",
        ),
        (
            "rope_local_base_freq",
            serde_json::json!(0),
            "rope_local_base_freq",
        ),
        (
            "sliding_window_pattern",
            serde_json::json!(0),
            "sliding_window_pattern",
        ),
    ];
    for (key, value, field) in cases {
        let mut v = base();
        if key.starts_with("rope_local") || key.starts_with("sliding_window_pattern") {
            v["model_type"] = "gemma3_text".into();
        }
        v[key] = value;
        let err = ModelConfig::from_json(&v, Path::new("/m/config.json"))
            .unwrap_err()
            .to_string();
        assert!(err.contains("/m/config.json"), "{key}: {err}");
        assert!(err.contains(&format!("`{field}`")), "{key}: {err}");
    }
    let mut v = base();
    v["model_type"] = "gemma3_text".into();
    v["rope_parameters"] = serde_json::json!({
        "full_attention": {"rope_type": "default", "rope_theta": 1e6},
        "sliding_attention": {"rope_type": "yarn", "factor": 2.0, "rope_theta": 1e4}});
    let err = ModelConfig::from_json(&v, Path::new("/m/config.json"))
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("`rope_parameters.sliding_attention.rope_type`"),
        "{err}"
    );
    // The multimodal wrapper without its text config.
    let err = ModelConfig::from_json(
        &serde_json::json!({"model_type": "gemma3"}),
        Path::new("/m/config.json"),
    )
    .unwrap_err()
    .to_string();
    assert!(
        err.contains("`text_config`") && err.contains("/m/config.json"),
        "{err}"
    );
    // An error inside it says where.
    let mut text = base();
    text["model_type"] = "gemma3_text".into();
    text["query_pre_attn_scalar"] = serde_json::json!(-2);
    let err = ModelConfig::from_json(
        &serde_json::json!({"model_type": "gemma3", "text_config": text}),
        Path::new("/m/config.json"),
    )
    .unwrap_err()
    .to_string();
    assert!(
        err.contains("in `text_config`") && err.contains("`query_pre_attn_scalar`"),
        "{err}"
    );
}

/// A copy of `gemma3_local_global` laid out as transformers' multimodal `Gemma3ForConditional
/// Generation` saves it (checked against transformers 5.24's `save_pretrained` when this test
/// was written): config.json with the text model under `text_config` and the dtype at the top,
/// the language model's weights under `language_model.` (`language_model.model.…`,
/// `language_model.lm_head.weight`), and vision-tower and projector tensors beside them.
fn multimodal_copy() -> tempfile::TempDir {
    let src = fixture("gemma3_local_global");
    let dir = tempfile::tempdir().unwrap();
    let mut text: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(src.join("config.json")).unwrap()).unwrap();
    let dtype = text.as_object_mut().unwrap().remove("dtype").unwrap();
    let cfg = serde_json::json!({"model_type": "gemma3", "architectures":
        ["Gemma3ForConditionalGeneration"], "dtype": dtype, "text_config": text,
        "vision_config": {"model_type": "siglip_vision_model", "hidden_size": 8},
        "mm_tokens_per_image": 4});
    std::fs::write(dir.path().join("config.json"), cfg.to_string()).unwrap();
    let weights =
        candle_core::safetensors::load(src.join("model.safetensors"), &Device::Cpu).unwrap();
    let mut out: Vec<(String, Tensor)> = weights
        .into_iter()
        .map(|(k, t)| (format!("language_model.{k}"), t))
        .collect();
    let v = Tensor::ones((2, 3), DType::F32, &Device::Cpu).unwrap();
    out.push((
        "vision_tower.vision_model.post_layernorm.weight".into(),
        v.clone(),
    ));
    out.push(("multi_modal_projector.mm_input_projection_weight".into(), v));
    let map: std::collections::HashMap<String, Tensor> = out.into_iter().collect();
    candle_core::safetensors::save(&map, dir.path().join("model.safetensors")).unwrap();
    dir
}

/// The multimodal wrapper loads its language model: the same log-probs as the text fixture
/// (within the parity bound of transformers' values), its vision tensors left unread; a
/// checkpoint saved from it is the text model ("gemma3_text", canonical weight names), which
/// loads back bit-identical.
#[test]
fn the_multimodal_wrapper_loads_its_language_model() {
    let mm = multimodal_copy();
    let cfg = ModelConfig::from_file(&mm.path().join("config.json")).unwrap();
    let text = ModelConfig::from_file(&fixture("gemma3_local_global").join("config.json")).unwrap();
    assert_eq!(cfg, text);
    let model = Model::load(mm.path(), DType::F32, &Device::Cpu).unwrap();
    let exp = expected("gemma3_local_global");
    let case = &exp.cases[0];
    let lp: Vec<Vec<f32>> = model
        .token_logprobs(
            &case.input_ids,
            &case.attention_mask,
            0,
            case.temperature,
            false,
            false,
        )
        .unwrap()
        .logprobs
        .to_vec2()
        .unwrap();
    for (b, row) in case.logprobs.iter().enumerate() {
        for (t, want) in row.iter().enumerate() {
            if let Some(w) = want {
                assert!((lp[b][t] as f64 - w).abs() <= 1e-4, "[{b}][{t}]");
            }
        }
    }
    let out = tempfile::tempdir().unwrap();
    model.save(out.path(), DType::F32).unwrap();
    let saved: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.path().join("config.json")).unwrap())
            .unwrap();
    assert_eq!(saved["model_type"], "gemma3_text");
    let back = Model::load(out.path(), DType::F32, &Device::Cpu).unwrap();
    for ((n, a), (m, b)) in model.base_vars().iter().zip(back.base_vars()) {
        assert_eq!(n, &m);
        let d: f32 = (a.as_tensor() - b.as_tensor())
            .unwrap()
            .abs()
            .unwrap()
            .max_all()
            .unwrap()
            .to_scalar()
            .unwrap();
        assert_eq!(d, 0.0, "{n}");
    }
    // A stray tensor that is neither the language model's nor the vision tower's is refused.
    let weights =
        candle_core::safetensors::load(mm.path().join("model.safetensors"), &Device::Cpu).unwrap();
    let mut map = weights;
    map.insert(
        "language_model.model.layers.3.mlp.up_proj.weight".into(),
        Tensor::zeros((2, 2), DType::F32, &Device::Cpu).unwrap(),
    );
    candle_core::safetensors::save(&map, mm.path().join("model.safetensors")).unwrap();
    let err = Model::load(mm.path(), DType::F32, &Device::Cpu)
        .err()
        .unwrap()
        .to_string();
    assert!(err.contains("layers.3.mlp.up_proj"), "{err}");
}

/// Saved Gemma checkpoints keep every Gemma field: the config reads back equal and the weights
/// bit-identical (transformers' reading of them: `scripts/check_hf_load.py`).
#[test]
fn saved_gemma_checkpoints_reload_bit_identical() {
    for name in FIXTURES {
        let model = Model::load(&fixture(name), DType::F32, &Device::Cpu).unwrap();
        let dir = tempfile::tempdir().unwrap();
        model.save(dir.path(), DType::F32).unwrap();
        let back = Model::load(dir.path(), DType::F32, &Device::Cpu).unwrap();
        assert_eq!(back.config(), model.config(), "{name}");
        assert_eq!(back.base_vars().len(), model.base_vars().len());
        // A random model's transformers-4 style config (`to_json`) reads back the same.
        let random =
            Model::random(model.config().clone(), 0.02, 1, DType::F32, &Device::Cpu).unwrap();
        let d2 = tempfile::tempdir().unwrap();
        random.save(d2.path(), DType::F32).unwrap();
        let cfg = ModelConfig::from_file(&d2.path().join("config.json")).unwrap();
        let mut want = model.config().clone();
        want.stored_dtype = Some("float32".into());
        assert_eq!(cfg, want, "{name}");
        // Gemma's norms start at weight 0 (scale 1 + 0).
        let n = random.var("model.norm.weight").unwrap();
        let s: f32 = n
            .as_tensor()
            .abs()
            .unwrap()
            .sum_all()
            .unwrap()
            .to_scalar()
            .unwrap();
        assert_eq!(s, 0.0);
    }
}

/// Softcapping bounds every logit by the cap on every path: the cached forward's logits of a
/// long row stay inside (−3, 3) for Gemma 2, and without the cap (config edited) they leave it.
#[test]
fn final_softcapping_bounds_the_logits() {
    let model = Model::load(&fixture("gemma2_softcap"), DType::F32, &Device::Cpu).unwrap();
    assert_eq!(model.final_logit_softcap(), Some(3.0));
    let exp = expected("gemma2_softcap");
    let case = exp
        .cases
        .iter()
        .find(|c| c.name.starts_with("single"))
        .unwrap();
    let ids = &case.input_ids;
    let mask = &case.attention_mask;
    let pos = rlvr_model::model::position_ids(mask);
    let mut cache = rlvr_model::KvCache::new(model.config().num_hidden_layers);
    let logits: Vec<f32> = model
        .forward_cached(ids, &pos, mask, &mut cache)
        .unwrap()
        .flatten_all()
        .unwrap()
        .to_vec1()
        .unwrap();
    assert!(logits.iter().all(|x| x.abs() < 3.0));
    let dir = tempfile::tempdir().unwrap();
    for f in std::fs::read_dir(fixture("gemma2_softcap")).unwrap() {
        let f = f.unwrap().path();
        std::fs::copy(&f, dir.path().join(f.file_name().unwrap())).unwrap();
    }
    let p = dir.path().join("config.json");
    let mut v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&p).unwrap()).unwrap();
    v["final_logit_softcapping"] = serde_json::Value::Null;
    std::fs::write(&p, v.to_string()).unwrap();
    let uncapped = Model::load(dir.path(), DType::F32, &Device::Cpu).unwrap();
    let mut cache = rlvr_model::KvCache::new(model.config().num_hidden_layers);
    let raw: Vec<f32> = uncapped
        .forward_cached(ids, &pos, mask, &mut cache)
        .unwrap()
        .flatten_all()
        .unwrap()
        .to_vec1()
        .unwrap();
    assert!(raw.iter().any(|x| x.abs() > 3.0));
    for (c, r) in logits.iter().zip(&raw) {
        assert!((c - 3.0 * (r / 3.0).tanh()).abs() < 1e-5);
    }
}

/// rlvr's log-probs of `tokens[1:]` (one unpadded row, temperature 1) as check_hf_roundtrip.py
/// reads them.
fn expect_json(model: &Model, tokens: &[u32]) -> serde_json::Value {
    let lp: Vec<Vec<f32>> = model
        .token_logprobs(
            &[tokens.to_vec()],
            &[vec![1; tokens.len()]],
            0,
            1.0,
            false,
            false,
        )
        .unwrap()
        .logprobs
        .to_vec2()
        .unwrap();
    serde_json::json!({"tokens": tokens, "logprobs": lp[0]})
}

/// transformers reads what rlvr saves as the same model (`scripts/check_hf_roundtrip.py`: no
/// missing or unexpected tensor, log-probs within 1e-4): each fixture after an in-place weight
/// change (so the file is rlvr's writing, not a copy), the multimodal wrapper's language model
/// saved as "gemma3_text", and a random model of each family with its transformers-4 style
/// config.json (`ModelConfig::to_json`).
#[test]
#[ignore = "needs RLVR_HF_PYTHON (a Python with torch and transformers)"]
fn transformers_reads_saved_gemma_checkpoints() {
    let python = std::env::var("RLVR_HF_PYTHON").expect("RLVR_HF_PYTHON names a Python");
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/check_hf_roundtrip.py");
    let tokens: Vec<u32> = (0..23).map(|i| (i * 37 + 5) % 512).collect();
    let mm = multimodal_copy();
    let mut models = vec![];
    for name in FIXTURES {
        let m = Model::load(&fixture(name), DType::F32, &Device::Cpu).unwrap();
        let v = m.var("model.layers.0.input_layernorm.weight").unwrap();
        v.set(&(v.as_tensor() * 0.5).unwrap()).unwrap();
        models.push((name.to_string(), m));
        let c = ModelConfig::from_file(&fixture(name).join("config.json")).unwrap();
        let r = Model::random(c, 0.2, 3, DType::F32, &Device::Cpu).unwrap();
        models.push((format!("random {name}"), r));
    }
    models.push((
        "gemma3 wrapper".into(),
        Model::load(mm.path(), DType::F32, &Device::Cpu).unwrap(),
    ));
    for (what, m) in models {
        let dir = tempfile::tempdir().unwrap();
        m.save(dir.path(), DType::F32).unwrap();
        let expect = dir.path().join("expect.json");
        std::fs::write(&expect, expect_json(&m, &tokens).to_string()).unwrap();
        let out = std::process::Command::new(&python)
            .arg(&script)
            .arg(dir.path())
            .arg(&expect)
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout).to_string()
            + &String::from_utf8_lossy(&out.stderr);
        assert!(
            out.status.success() && text.contains("round trip ok"),
            "{what}: {text}"
        );
        println!(
            "{what}: {}",
            text.lines().find(|l| l.contains("max |")).unwrap_or("")
        );
    }
}

/// A tokenizer shaped like Gemma's (`scripts/make_gemma_tokenizer_fixture.py`: BPE over
/// "▁"-normalised text with byte fallback, `<bos>` added by the post-processor, the turn markers
/// as special tokens; trained on a few sentences since the hub is out of reach) loads through
/// the `tokenizers` crate and encodes, decodes and renders its Gemma 2-style chat template as
/// transformers' `AutoTokenizer` does, byte fallback included.
#[test]
fn a_gemma_shaped_tokenizer_encodes_as_transformers_does() {
    #[derive(Deserialize)]
    struct TokCase {
        text: String,
        ids: Vec<u32>,
        ids_plain: Vec<u32>,
        decoded: String,
    }
    #[derive(Deserialize)]
    struct Chat {
        messages: Vec<rlvr_model::Message>,
        text: String,
        ids: Vec<u32>,
    }
    #[derive(Deserialize)]
    struct TokExpected {
        cases: Vec<TokCase>,
        chat: Chat,
    }
    let dir = fixture("gemma_tokenizer");
    let exp: TokExpected =
        serde_json::from_str(&std::fs::read_to_string(dir.join("expected.json")).unwrap()).unwrap();
    let tok = rlvr_model::TokenizerBundle::load(&dir).unwrap();
    assert_eq!(tok.bos_token.as_deref(), Some("<bos>"));
    assert_eq!(tok.pad_id, 0);
    let byte = |i: &u32| (6..6 + 256).contains(i);
    assert!(exp.cases.iter().any(|c| c.ids_plain.iter().any(byte)));
    for c in &exp.cases {
        assert_eq!(tok.encode(&c.text, true).unwrap(), c.ids, "{:?}", c.text);
        assert_eq!(
            tok.encode(&c.text, false).unwrap(),
            c.ids_plain,
            "{:?}",
            c.text
        );
        assert_eq!(tok.decode(&c.ids_plain, false).unwrap(), c.decoded);
        assert_eq!(c.decoded, c.text);
    }
    let text = tok.apply_chat_template(&exp.chat.messages, true).unwrap();
    assert_eq!(text, exp.chat.text);
    assert_eq!(tok.encode(&text, false).unwrap(), exp.chat.ids);
    // The template's refusal of a system message reaches the caller.
    let err = tok
        .apply_chat_template(
            &[
                rlvr_model::Message::new("system", "Be brief."),
                rlvr_model::Message::new("user", "2+2?"),
            ],
            true,
        )
        .unwrap_err()
        .to_string();
    assert!(err.contains("System role not supported"), "{err}");
}
