//! Parity with HuggingFace transformers: per-token log-probs, entropy and raw logits of tiny
//! random checkpoints, against float64 references produced by `scripts/make_model_fixtures.py`
//! (transformers 5.24, torch 2.15). Tolerance: 1e-4 max abs error in f32, small enough that an
//! importance ratio built from these log-probs moves by at most 0.01%.

use std::path::{Path, PathBuf};

use candle_core::{DType, Device};
use rlvr_model::{Model, ModelConfig};
use serde::Deserialize;

#[derive(Deserialize)]
struct Expected {
    cases: Vec<Case>,
}

#[derive(Deserialize)]
struct Case {
    name: String,
    temperature: f64,
    input_ids: Vec<Vec<u32>>,
    attention_mask: Vec<Vec<u32>>,
    logprobs: Vec<Vec<Option<f64>>>,
    entropy: Vec<Vec<Option<f64>>>,
    last_logits_row0: Vec<f64>,
}

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name)
}

fn load_expected(dir: &Path) -> Expected {
    let text = std::fs::read_to_string(dir.join("expected.json")).unwrap();
    serde_json::from_str(&text).unwrap()
}

/// Checks every case of a fixture; returns the max abs log-prob error seen.
pub(crate) fn check(name: &str, dtype: DType, tol: f64) -> f64 {
    let dir = fixture(name);
    let model = Model::load(&dir, dtype, &Device::Cpu).unwrap();
    let exp = load_expected(&dir);
    let mut worst = 0.0f64;
    for case in &exp.cases {
        let out = model
            .token_logprobs(
                &case.input_ids,
                &case.attention_mask,
                0,
                case.temperature,
                true,
                false,
            )
            .unwrap();
        let lp: Vec<Vec<f32>> = out.logprobs.to_vec2().unwrap();
        let ent: Vec<Vec<f32>> = out.entropy.unwrap().to_vec2().unwrap();
        let mut n = 0;
        for (b, row) in case.logprobs.iter().enumerate() {
            for (t, want) in row.iter().enumerate() {
                if let Some(w) = want {
                    let got = lp[b][t] as f64;
                    let err = (got - w).abs();
                    worst = worst.max(err);
                    assert!(
                        err <= tol,
                        "{name}/{}: logprob[{b}][{t}] = {got}, transformers {w} (err {err:e})",
                        case.name
                    );
                    let we = case.entropy[b][t].unwrap();
                    let ge = ent[b][t] as f64;
                    assert!(
                        (ge - we).abs() <= tol,
                        "{name}/{}: entropy[{b}][{t}] = {ge}, transformers {we}",
                        case.name
                    );
                    n += 1;
                }
            }
        }
        assert!(n > 0, "case {} scored nothing", case.name);
        // Raw logits of the last real position of row 0 (full vocabulary).
        let t = case.input_ids[0].len();
        let ids0 = vec![case.input_ids[0].clone()];
        let mask0 = vec![case.attention_mask[0].clone()];
        let mut cache = rlvr_model::KvCache::new(model.config().num_hidden_layers);
        let pos = rlvr_model::model::position_ids(&mask0);
        let logits: Vec<f32> = model
            .forward_cached(&ids0, &pos, &mask0, &mut cache)
            .unwrap()
            .squeeze(0)
            .unwrap()
            .to_vec1()
            .unwrap();
        assert_eq!(logits.len(), case.last_logits_row0.len());
        for (v, (g, w)) in logits.iter().zip(&case.last_logits_row0).enumerate() {
            assert!(
                (*g as f64 - w).abs() <= tol * 10.0,
                "{name}/{}: logit[{v}] at position {} = {g}, transformers {w}",
                case.name,
                t - 1
            );
        }
    }
    worst
}

#[test]
fn qwen2_with_bias_and_tied_head_matches_transformers() {
    let worst = check("qwen2_bias_tied", DType::F32, 1e-4);
    eprintln!("qwen2 worst abs err {worst:e}");
}

#[test]
fn llama3_gqa_untied_sharded_matches_transformers() {
    let worst = check("llama_gqa_untied_rope3", DType::F32, 1e-4);
    eprintln!("llama worst abs err {worst:e}");
}

#[test]
fn qwen3_bf16_weights_match_transformers() {
    let worst = check("qwen3", DType::F32, 1e-4);
    eprintln!("qwen3 worst abs err {worst:e}");
}

#[test]
fn bf16_compute_is_close_to_transformers() {
    // bf16 has ~3 significant digits: only a loose bound is meaningful.
    let worst = check("qwen2_bias_tied", DType::BF16, 0.25);
    eprintln!("qwen2 bf16 worst abs err {worst:e}");
}

#[test]
fn transformers_v4_and_v5_configs_describe_the_same_model() {
    for name in ["qwen2_bias_tied", "llama_gqa_untied_rope3", "qwen3"] {
        let dir = fixture(name);
        let v5 = ModelConfig::from_file(&dir.join("config.json")).unwrap();
        let v4 = ModelConfig::from_file(&dir.join("config.v4.json")).unwrap();
        let (mut a, mut b) = (v5.clone(), v4.clone());
        a.stored_dtype = None;
        b.stored_dtype = None;
        assert_eq!(a, b, "{name}");
        assert!(v5.stored_dtype.is_some() && v4.stored_dtype.is_some());
    }
    let llama =
        ModelConfig::from_file(&fixture("llama_gqa_untied_rope3").join("config.json")).unwrap();
    assert!(matches!(
        llama.rope_scaling,
        Some(rlvr_model::RopeScaling::Llama3 { factor, .. }) if factor == 8.0
    ));
    assert_eq!(llama.num_attention_heads / llama.num_key_value_heads, 3);
    assert!(!llama.tie_word_embeddings);
    let qwen3 = ModelConfig::from_file(&fixture("qwen3").join("config.json")).unwrap();
    assert_eq!(qwen3.head_dim, 32);
    assert_eq!(qwen3.hidden_size, 64);
}

#[test]
fn rope_inverse_frequencies_match_transformers() {
    #[derive(Deserialize)]
    struct E {
        rope_inv_freq: Vec<f64>,
    }
    for name in ["qwen2_bias_tied", "llama_gqa_untied_rope3", "qwen3"] {
        let dir = fixture(name);
        let e: E =
            serde_json::from_str(&std::fs::read_to_string(dir.join("expected.json")).unwrap())
                .unwrap();
        let cfg = ModelConfig::from_file(&dir.join("config.json")).unwrap();
        let ours = cfg.rope_inv_freq();
        assert_eq!(ours.len(), e.rope_inv_freq.len());
        for (o, w) in ours.iter().zip(&e.rope_inv_freq) {
            assert!(
                (o - w).abs() <= 1e-6 * w.abs().max(1e-30),
                "{name}: {o} vs {w}"
            );
        }
    }
}

#[test]
fn left_padding_and_right_padding_give_the_unpadded_values() {
    let model = Model::load(&fixture("llama_gqa_untied_rope3"), DType::F32, &Device::Cpu).unwrap();
    let seq: Vec<u32> = vec![5, 17, 301, 44, 2, 99, 120];
    let alone = model
        .token_logprobs(
            std::slice::from_ref(&seq),
            &[vec![1; 7]],
            0,
            1.0,
            false,
            false,
        )
        .unwrap()
        .logprobs
        .to_vec2::<f32>()
        .unwrap()[0]
        .clone();
    let mut left = vec![0u32; 3];
    left.extend(&seq);
    let mut lmask = vec![0u32; 3];
    lmask.extend(vec![1; 7]);
    let mut right = seq.clone();
    right.extend([0u32; 3]);
    let mut rmask = vec![1u32; 7];
    rmask.extend([0; 3]);
    let other: Vec<u32> = (0..10).map(|i| (i * 37 % 500) as u32).collect();
    let lp = model
        .token_logprobs(
            &[left, other.clone(), right],
            &[lmask, vec![1; 10], rmask],
            0,
            1.0,
            false,
            false,
        )
        .unwrap()
        .logprobs
        .to_vec2::<f32>()
        .unwrap();
    for t in 0..6 {
        assert!((lp[0][3 + t] - alone[t]).abs() < 1e-5, "left t={t}");
        assert!((lp[2][t] - alone[t]).abs() < 1e-5, "right t={t}");
    }
}

#[test]
fn scoring_from_a_start_position_equals_the_tail_of_the_full_scores() {
    let model = Model::load(&fixture("qwen2_bias_tied"), DType::F32, &Device::Cpu).unwrap();
    let ids = vec![
        vec![1u32, 2, 3, 4, 5, 6, 7, 8],
        vec![0, 0, 9, 10, 11, 12, 13, 14],
    ];
    let mask = vec![vec![1u32; 8], vec![0, 0, 1, 1, 1, 1, 1, 1]];
    let full = model
        .token_logprobs(&ids, &mask, 0, 0.8, true, false)
        .unwrap();
    let tail = model
        .token_logprobs(&ids, &mask, 4, 0.8, true, false)
        .unwrap();
    let f: Vec<Vec<f32>> = full.logprobs.to_vec2().unwrap();
    let t: Vec<Vec<f32>> = tail.logprobs.to_vec2().unwrap();
    assert_eq!(t[0].len(), 3);
    for b in 0..2 {
        for i in 0..3 {
            assert!((f[b][4 + i] - t[b][i]).abs() < 1e-6);
        }
    }
}

#[test]
fn missing_files_and_tensors_are_named_in_errors() {
    let tmp = tempfile::tempdir().unwrap();
    let err = Model::load(tmp.path(), DType::F32, &Device::Cpu)
        .err()
        .unwrap()
        .to_string();
    assert!(err.contains("config.json"), "{err}");

    // config.json present, weights missing.
    std::fs::copy(
        fixture("qwen2_bias_tied").join("config.json"),
        tmp.path().join("config.json"),
    )
    .unwrap();
    let err = Model::load(tmp.path(), DType::F32, &Device::Cpu)
        .err()
        .unwrap()
        .to_string();
    assert!(err.contains("model.safetensors"), "{err}");

    // Weights of another shape: qwen2's weights under a config with a wider MLP.
    std::fs::copy(
        fixture("qwen2_bias_tied").join("model.safetensors"),
        tmp.path().join("model.safetensors"),
    )
    .unwrap();
    let mut cfg: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(tmp.path().join("config.json")).unwrap())
            .unwrap();
    cfg["intermediate_size"] = 999.into();
    std::fs::write(tmp.path().join("config.json"), cfg.to_string()).unwrap();
    let err = Model::load(tmp.path(), DType::F32, &Device::Cpu)
        .err()
        .unwrap()
        .to_string();
    assert!(
        err.contains("model.layers.0.mlp.gate_proj.weight") && err.contains("model.safetensors"),
        "{err}"
    );

    // An untied config over tied weights: lm_head.weight is missing.
    cfg["intermediate_size"] = 160.into();
    cfg["tie_word_embeddings"] = false.into();
    std::fs::write(tmp.path().join("config.json"), cfg.to_string()).unwrap();
    let err = Model::load(tmp.path(), DType::F32, &Device::Cpu)
        .err()
        .unwrap()
        .to_string();
    assert!(err.contains("lm_head.weight"), "{err}");

    // Unknown model_type.
    cfg["model_type"] = "gpt_neox".into();
    std::fs::write(tmp.path().join("config.json"), cfg.to_string()).unwrap();
    let err = Model::load(tmp.path(), DType::F32, &Device::Cpu)
        .err()
        .unwrap()
        .to_string();
    assert!(
        err.contains("gpt_neox") && err.contains("config.json"),
        "{err}"
    );

    // A shard named by the index but absent.
    let tmp2 = tempfile::tempdir().unwrap();
    let src = fixture("llama_gqa_untied_rope3");
    for f in [
        "config.json",
        "model.safetensors.index.json",
        "model-00001-of-00005.safetensors",
    ] {
        std::fs::copy(src.join(f), tmp2.path().join(f)).unwrap();
    }
    let err = Model::load(tmp2.path(), DType::F32, &Device::Cpu)
        .err()
        .unwrap()
        .to_string();
    assert!(err.contains("model-0000") && err.contains("shard"), "{err}");
}

#[test]
fn saved_model_reloads_bit_identical() {
    let src = fixture("qwen3");
    let model = Model::load(&src, DType::F32, &Device::Cpu).unwrap();
    let tmp = tempfile::tempdir().unwrap();
    model.save(tmp.path(), DType::F32).unwrap();
    let again = Model::load(tmp.path(), DType::F32, &Device::Cpu).unwrap();
    assert_eq!(again.config().head_dim, 32);
    for ((n1, v1), (n2, v2)) in model.named_vars().iter().zip(again.named_vars().iter()) {
        assert_eq!(n1, n2);
        let a: Vec<f32> = v1.as_tensor().flatten_all().unwrap().to_vec1().unwrap();
        let b: Vec<f32> = v2.as_tensor().flatten_all().unwrap().to_vec1().unwrap();
        assert_eq!(a, b, "{n1}");
    }
}

#[test]
fn weights_stored_in_f16_and_bf16_load_and_compute_in_f32() {
    let src = fixture("qwen2_bias_tied");
    let model = Model::load(&src, DType::F32, &Device::Cpu).unwrap();
    let exp = load_expected(&src);
    let case = &exp.cases[0];
    for (dtype, name, tol) in [
        (DType::F16, "float16", 0.05),
        (DType::BF16, "bfloat16", 0.3),
    ] {
        let tmp = tempfile::tempdir().unwrap();
        model.save(tmp.path(), dtype).unwrap();
        let cfg: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(tmp.path().join("config.json")).unwrap())
                .unwrap();
        // The fixture's config.json is transformers-5 style: its `dtype` field is set, and no
        // `torch_dtype` is added (a saved config keeps the base's fields, issue 48).
        assert_eq!(cfg["dtype"], name);
        assert!(cfg.get("torch_dtype").is_none(), "{cfg}");
        let again = Model::load(tmp.path(), DType::F32, &Device::Cpu).unwrap();
        assert_eq!(again.config().stored_dtype.as_deref(), Some(name));
        let lp: Vec<Vec<f32>> = again
            .token_logprobs(&case.input_ids, &case.attention_mask, 0, 1.0, false, false)
            .unwrap()
            .logprobs
            .to_vec2()
            .unwrap();
        let mut worst = 0f64;
        for (b, row) in case.logprobs.iter().enumerate() {
            for (t, w) in row.iter().enumerate() {
                if let Some(w) = w {
                    worst = worst.max((lp[b][t] as f64 - w).abs());
                }
            }
        }
        // Rounding the weights moves log-probs a little, but not to another model.
        assert!(worst > 0.0 && worst < tol, "{name}: worst {worst}");
    }
}

#[test]
fn try_clone_is_a_deep_copy() {
    let model = Model::load(&fixture("qwen2_bias_tied"), DType::F32, &Device::Cpu).unwrap();
    let copy = model.try_clone().unwrap();
    let ids = vec![vec![1u32, 2, 3, 4]];
    let mask = vec![vec![1u32; 4]];
    let a: Vec<Vec<f32>> = model
        .token_logprobs(&ids, &mask, 0, 1.0, false, false)
        .unwrap()
        .logprobs
        .to_vec2()
        .unwrap();
    let b: Vec<Vec<f32>> = copy
        .token_logprobs(&ids, &mask, 0, 1.0, false, false)
        .unwrap()
        .logprobs
        .to_vec2()
        .unwrap();
    assert_eq!(a, b);
    // Changing the original leaves the copy alone.
    let embed = model.var("model.embed_tokens.weight").unwrap();
    let e = embed.as_tensor();
    embed.set(&(e * 2.0).unwrap()).unwrap();
    let c: Vec<Vec<f32>> = copy
        .token_logprobs(&ids, &mask, 0, 1.0, false, false)
        .unwrap()
        .logprobs
        .to_vec2()
        .unwrap();
    assert_eq!(b, c);
    let d: Vec<Vec<f32>> = model
        .token_logprobs(&ids, &mask, 0, 1.0, false, false)
        .unwrap()
        .logprobs
        .to_vec2()
        .unwrap();
    assert_ne!(a, d);
}

/// A checkpoint whose weights hold NaN or ∞ is refused at load, naming the file, the tensor, the
/// count and the first index, in every stored dtype (such weights used to sample
/// ids past the vocabulary and train with a zero gradient, silently).
#[test]
fn non_finite_weights_are_refused_at_load() {
    let model = Model::load(&fixture("qwen3"), DType::F32, &Device::Cpu).unwrap();
    let name = "model.layers.1.mlp.up_proj.weight";
    let v = model.var(name).unwrap();
    let mut w: Vec<f32> = v.as_tensor().flatten_all().unwrap().to_vec1().unwrap();
    w[7] = f32::NAN;
    w[20] = f32::INFINITY;
    w[21] = f32::NEG_INFINITY;
    v.set(&candle_core::Tensor::from_vec(w, v.shape(), &Device::Cpu).unwrap())
        .unwrap();
    for dtype in [DType::F32, DType::BF16, DType::F16] {
        let tmp = tempfile::tempdir().unwrap();
        model.save(tmp.path(), dtype).unwrap();
        let Err(err) = Model::load(tmp.path(), DType::F32, &Device::Cpu) else {
            panic!("{dtype:?}: a checkpoint with NaN and inf loaded");
        };
        let msg = err.to_string();
        assert!(
            matches!(
                &err,
                rlvr_model::ModelError::NonFinite { tensor, count: 3, first: 7, .. } if tensor == name
            ),
            "{dtype:?}: {msg}"
        );
        assert!(
            msg.contains("model.safetensors") && msg.contains(name),
            "{msg}"
        );
    }
}
