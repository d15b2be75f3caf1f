//! Phi-3 / Phi-4-mini (`model_type` "phi3") against transformers, on the fixture
//! `phi3_longrope_partial` that `scripts/make_model_fixtures.py` builds: fused `qkv_proj` and
//! `gate_up_proj` split when loading and fused again when saving, partial rotary (12 of 16
//! dimensions of a head rotate), LongRoPE whose `original_max_position_embeddings` (16) the long
//! case (40 tokens) and the greedy continuation cross, and a 24-token sliding window on every
//! layer: log-probs, entropies and logits within `parity.rs`'s bound, gradients against
//! transformers' float64 autograd, greedy decoding with the KV cache, the save's tensor names and
//! config.json, and errors that name the file and the field.

use std::path::{Path, PathBuf};

use candle_core::{DType, Device};
use rlvr_model::{Arch, KvCache, Model, ModelConfig, RopeScaling};

use crate::reference::{self, case_loss, Expected};

const NAME: &str = "phi3_longrope_partial";

fn fixture() -> PathBuf {
    reference::fixture(NAME)
}

fn expected() -> Expected {
    reference::expected(NAME)
}

fn load() -> Model {
    Model::load(&fixture(), DType::F32, &Device::Cpu).unwrap()
}

#[test]
fn phi3_with_partial_rotary_and_longrope_matches_transformers() {
    let worst = crate::parity::check(NAME, DType::F32, 1e-4);
    eprintln!("phi3 worst abs err {worst:e}");
    // The long case crosses the switch: it is scored with the long factors.
    let exp = expected();
    let longest = (exp.cases.iter())
        .map(|c| c.input_ids[0].len())
        .max()
        .unwrap();
    assert!(longest > 16, "{longest}");
    assert!(exp.cases.iter().any(|c| c.input_ids[0].len() <= 16));
}

#[test]
fn phi3_bf16_compute_is_close_to_transformers() {
    crate::parity::check(NAME, DType::BF16, 0.25);
}

/// The config as transformers reads it, in both styles (config.json is transformers 5's
/// `rope_parameters`, config.v4.json has `rope_scaling` with `partial_rotary_factor` and
/// `original_max_position_embeddings` at the top level).
#[test]
fn phi3_configs_read_as_transformers_reads_them() {
    let v5 = ModelConfig::from_file(&fixture().join("config.json")).unwrap();
    let v4 = ModelConfig::from_file(&fixture().join("config.v4.json")).unwrap();
    let mut v4s = v4.clone();
    v4s.stored_dtype = v5.stored_dtype.clone();
    assert_eq!(v4s, v5);
    assert_eq!(v5.arch, Arch::Phi3);
    assert_eq!((v5.head_dim, v5.rotary_dim()), (16, 12));
    assert!(!v5.qkv_bias && !v5.o_bias && !v5.mlp_bias && !v5.tie_word_embeddings);
    let w = v5.sliding_window.as_ref().unwrap();
    assert_eq!((w.size, w.layers.clone()), (24, vec![true; 3]));
    let Some(RopeScaling::LongRope {
        short_factor,
        long_factor,
        original_max_position_embeddings,
        factor,
        attention_factor,
    }) = &v5.rope_scaling
    else {
        panic!("{:?}", v5.rope_scaling)
    };
    assert_eq!(short_factor, &[1.0, 1.1, 1.3, 1.7, 2.2, 3.0]);
    assert_eq!(long_factor, &[1.0, 1.5, 2.5, 4.0, 7.0, 12.0]);
    assert_eq!(*original_max_position_embeddings, 16.0);
    assert_eq!((*factor, *attention_factor), (None, None));
    // max 64 / original 16 = 4: √(1 + ln 4 / ln 16) = √1.5.
    assert!((v5.rope_attention_factor() - 1.5f64.sqrt()).abs() < 1e-15);
    // The short table is transformers' (float64 reference), and the long one past 16 positions.
    let exp = expected();
    assert_eq!(v5.rope_inv_freq().len(), 6);
    for (o, w) in v5.rope_inv_freq().iter().zip(&exp.rope_inv_freq) {
        assert!((o - w).abs() <= 1e-12 * w.abs(), "{o} vs {w}");
    }
    assert_eq!(v5.rope_inv_freq_for(16), v5.rope_inv_freq());
    assert!(!v5.rope_is_long_at(16) && v5.rope_is_long_at(17));
    let long = v5.rope_inv_freq_for(17);
    for (i, (s, l)) in v5.rope_inv_freq().iter().zip(&long).enumerate() {
        let want = s * short_factor[i] / long_factor[i];
        assert!((l - want).abs() <= 1e-12 * want, "{i}: {l} vs {want}");
    }
}

/// `∂L/∂w` of L = Σ log-probs of the stored case against transformers' float64 autograd: the
/// stored rows of the fused `qkv_proj` and `gate_up_proj` are rows of rlvr's `q_proj` and
/// `gate_proj`; within 1e-4 of the largest entry (at least 1), and the loss within 1e-4.
#[test]
fn phi3_gradients_match_transformers() {
    let model = load();
    let exp = expected();
    let case = (exp.cases.iter())
        .find(|c| c.name == exp.grads.case)
        .unwrap();
    let loss = case_loss(&model, case);
    let l: f32 = loss.to_scalar().unwrap();
    assert!(
        (l as f64 - exp.grads.loss).abs() <= 1e-4 * exp.grads.loss.abs().max(1.0),
        "loss {l} vs {}",
        exp.grads.loss
    );
    let grads = loss.backward().unwrap();
    assert!(exp.grads.weights.len() >= 6);
    let mut fused = 0;
    for (w, want) in &exp.grads.weights {
        let ours = match w
            .replace("qkv_proj", "q_proj")
            .replace("gate_up_proj", "gate_proj")
        {
            o if &o != w => {
                fused += 1;
                o
            }
            o => o,
        };
        let var = model
            .var(&ours)
            .unwrap_or_else(|| panic!("no weight {ours}"));
        let g = grads.get(var.as_tensor()).unwrap();
        let shape = &exp.grads.shapes[w];
        let g = match shape.len() {
            1 => g.clone(),
            _ => g.narrow(0, 0, shape[0]).unwrap(),
        };
        let got: Vec<f32> = g.flatten_all().unwrap().to_vec1().unwrap();
        assert_eq!(got.len(), want.len(), "{w}");
        let scale = want.iter().fold(1f64, |m, x| m.max(x.abs()));
        for (i, (g, w2)) in got.iter().zip(want).enumerate() {
            assert!(
                (*g as f64 - w2).abs() <= 1e-4 * scale,
                "{w}[{i}]: {g} vs transformers {w2}"
            );
        }
    }
    assert_eq!(fused, 2);
}

/// Greedy decoding by full forwards of the whole sequence (no cache), one token a step: the
/// table of each forward's own length, as transformers' generate after its cache drop.
fn greedy_full(model: &Model, prompt: &[u32], n: usize) -> Vec<u32> {
    let mut seq = prompt.to_vec();
    for _ in 0..n {
        let mask = vec![vec![1u32; seq.len()]];
        let pos = vec![(0..seq.len() as u32).collect::<Vec<_>>()];
        let mut cache = KvCache::new(model.config().num_hidden_layers);
        let logits: Vec<f32> = model
            .forward_cached(&[seq.clone()], &pos, &mask, &mut cache)
            .unwrap()
            .squeeze(0)
            .unwrap()
            .to_vec1()
            .unwrap();
        seq.push(argmax(&logits));
    }
    seq[prompt.len()..].to_vec()
}

fn argmax(x: &[f32]) -> u32 {
    let mut best = 0;
    for (i, v) in x.iter().enumerate() {
        if *v > x[best] {
            best = i;
        }
    }
    best as u32
}

/// transformers' generate crosses original_max_position_embeddings (10-token prompt, 20 new
/// tokens, switch at 16) and, as `Phi3ForCausalLM.prepare_inputs_for_generation` drops its cache
/// there, gives the argmax chain of full forwards; rlvr's full forwards give the same tokens.
#[test]
fn phi3_greedy_full_forwards_equal_transformers_generate() {
    let model = load();
    let g = expected()
        .greedy
        .expect("phi3's expected.json has `greedy`");
    assert!(g.prompt.len() <= 16 && g.prompt.len() + g.tokens.len() > 16);
    assert_eq!(g.tokens, g.full_forward_argmax);
    let full = greedy_full(&model, &g.prompt, g.tokens.len());
    assert_eq!(full, g.tokens);
}

/// rlvr's save writes the fused names back (`qkv_proj` `[q + 2kv, h]`, `gate_up_proj`
/// `[2i, h]`; no split name), and loads them again bit-identical; a random model's
/// transformers-4 style config.json reads back to the same configuration.
#[test]
fn saved_phi3_checkpoints_keep_the_fused_names_and_reload_bit_identical() {
    let model = load();
    let dir = tempfile::tempdir().unwrap();
    model.save(dir.path(), DType::F32).unwrap();
    let st =
        candle_core::safetensors::load(dir.path().join("model.safetensors"), &Device::Cpu).unwrap();
    let orig =
        candle_core::safetensors::load(fixture().join("model.safetensors"), &Device::Cpu).unwrap();
    let mut names: Vec<&String> = st.keys().collect();
    let mut want: Vec<&String> = orig.keys().collect();
    names.sort();
    want.sort();
    assert_eq!(names, want);
    assert_eq!(
        st["model.layers.0.self_attn.qkv_proj.weight"].dims(),
        &[128, 64]
    );
    assert_eq!(
        st["model.layers.0.mlp.gate_up_proj.weight"].dims(),
        &[192, 64]
    );
    for (k, t) in &orig {
        let d: f32 = (t - &st[k])
            .unwrap()
            .abs()
            .unwrap()
            .max_all()
            .unwrap()
            .to_scalar()
            .unwrap();
        assert_eq!(d, 0.0, "{k}");
    }
    let back = Model::load(dir.path(), DType::F32, &Device::Cpu).unwrap();
    assert_eq!(back.config(), model.config());
    let random = Model::random(model.config().clone(), 0.02, 1, DType::F32, &Device::Cpu).unwrap();
    let d2 = tempfile::tempdir().unwrap();
    random.save(d2.path(), DType::F32).unwrap();
    let cfg = ModelConfig::from_file(&d2.path().join("config.json")).unwrap();
    let mut want = model.config().clone();
    want.stored_dtype = Some("float32".into());
    assert_eq!(cfg, want);
    Model::load(d2.path(), DType::F32, &Device::Cpu).unwrap();
}

fn base() -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(fixture().join("config.v4.json")).unwrap())
        .unwrap()
}

fn refused(edit: impl Fn(&mut serde_json::Value)) -> String {
    let mut v = base();
    edit(&mut v);
    ModelConfig::from_json(&v, Path::new("/m/config.json"))
        .unwrap_err()
        .to_string()
}

#[test]
fn bad_phi3_fields_are_refused_naming_file_and_field() {
    type Edit = Box<dyn Fn(&mut serde_json::Value)>;
    let cases: Vec<(Edit, &str)> = vec![
        (
            Box::new(|v| v["rope_scaling"]["short_factor"] = serde_json::json!([1.0, 2.0])),
            "rope_scaling.short_factor",
        ),
        (
            Box::new(|v| v["rope_scaling"]["long_factor"][2] = serde_json::json!(0.0)),
            "rope_scaling.long_factor",
        ),
        (
            Box::new(|v| {
                v["rope_scaling"]
                    .as_object_mut()
                    .unwrap()
                    .remove("long_factor");
            }),
            "rope_scaling.long_factor",
        ),
        (
            Box::new(|v| v["partial_rotary_factor"] = serde_json::json!(1.5)),
            "partial_rotary_factor",
        ),
        (
            // 16 × 0.7 = 11.2 → 11 dimensions: odd.
            Box::new(|v| v["partial_rotary_factor"] = serde_json::json!(0.7)),
            "partial_rotary_factor",
        ),
        (
            Box::new(|v| v["original_max_position_embeddings"] = serde_json::json!(0)),
            "original_max_position_embeddings",
        ),
        (
            Box::new(|v| v["rope_scaling"]["rope_type"] = serde_json::json!("llama3")),
            "rope_scaling.rope_type",
        ),
        (
            Box::new(|v| v["hidden_act"] = serde_json::json!("gelu")),
            "hidden_act",
        ),
        (
            Box::new(|v| v["sliding_window"] = serde_json::json!(0)),
            "sliding_window",
        ),
    ];
    for (edit, field) in cases {
        let e = refused(edit);
        assert!(
            e.contains("/m/config.json") && e.contains(&format!("`{field}`")),
            "{field}: {e}"
        );
    }
    // Phi3Config reads "su" (Phi-3's first name) and "yarn" as LongRoPE.
    for ty in ["su", "yarn"] {
        let mut v = base();
        v["rope_scaling"]["rope_type"] = serde_json::json!(ty);
        let c = ModelConfig::from_json(&v, Path::new("c.json")).unwrap();
        assert!(matches!(c.rope_scaling, Some(RopeScaling::LongRope { .. })));
    }
    // Without a top-level original_max_position_embeddings, Phi3Config's 4096 wins over the
    // rope object's (transformers' standardize_rope_params).
    let mut v = base();
    v.as_object_mut()
        .unwrap()
        .remove("original_max_position_embeddings");
    let c = ModelConfig::from_json(&v, Path::new("c.json")).unwrap();
    assert!(!c.rope_is_long_at(4096) && c.rope_is_long_at(4097));
}

/// LoRA on phi3: the fused projections' parts are refused with the phi3 names (PEFT adapts the
/// fused modules: `lora_parity.rs` checks them against PEFT), the unfused `o_proj` and
/// `down_proj` are adapted on their own too.
#[test]
fn lora_on_phi3_refuses_the_fused_projections_parts_by_name() {
    let mut model = load();
    let cfg = |targets: &str| rlvr_model::lora::LoraConfig {
        rank: 2,
        alpha: 4.0,
        targets: (targets.split(',')).map(|t| t.parse().unwrap()).collect(),
        dropout: 0.0,
    };
    let e = model
        .add_lora(&cfg("q_proj,o_proj"), 1)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("qkv_proj") && e.contains("gate_up_proj") && e.contains("q_proj"),
        "{e}"
    );
    model.add_lora(&cfg("o_proj,down_proj"), 1).unwrap();
    assert_eq!(model.named_vars().len(), 3 * 2 * 2);
    let t = "qkv_proj".parse::<rlvr_model::lora::LoraTarget>().unwrap();
    assert_eq!(t, rlvr_model::lora::LoraTarget::Qkv);
    let e = "fc1".parse::<rlvr_model::lora::LoraTarget>().unwrap_err();
    assert!(e.contains("fc1") && e.contains("all-linear"), "{e}");
}

/// transformers reads what rlvr saves as the same Phi-3 model (`scripts/check_hf_roundtrip.py`:
/// no missing or unexpected tensor, log-probs within 1e-4), the fixture after an in-place change
/// of one weight and a random model with rlvr's own config.json.
#[test]
#[ignore = "needs RLVR_HF_PYTHON (a Python with torch and transformers)"]
fn transformers_reads_saved_phi3_checkpoints() {
    let python = std::env::var("RLVR_HF_PYTHON").expect("RLVR_HF_PYTHON names a Python");
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/check_hf_roundtrip.py");
    // 23 tokens: past original_max_position_embeddings (16), under the window (24).
    let tokens: Vec<u32> = (0..23).map(|i| (i * 37 + 5) % 512).collect();
    let m = load();
    let v = m.var("model.layers.0.self_attn.k_proj.weight").unwrap();
    v.set(&(v.as_tensor() * 0.5).unwrap()).unwrap();
    let c = ModelConfig::from_file(&fixture().join("config.json")).unwrap();
    let r = Model::random(c, 0.2, 3, DType::F32, &Device::Cpu).unwrap();
    for (what, m) in [("fixture", m), ("random", r)] {
        let dir = tempfile::tempdir().unwrap();
        m.save(dir.path(), DType::F32).unwrap();
        let lp: Vec<Vec<f32>> = m
            .token_logprobs(
                std::slice::from_ref(&tokens),
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
        let expect = dir.path().join("expect.json");
        let j = serde_json::json!({"tokens": tokens, "logprobs": lp[0]});
        std::fs::write(&expect, j.to_string()).unwrap();
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

/// LongRoPE chooses its factors per sequence: a short row's log-probs are the same alone and
/// batched beside a row past the switch (transformers would pick by the batch's largest
/// position), and the shared-prefix scorer over rows on both sides of the switch gives the
/// rows' own values (it takes the unshared path then).
#[test]
fn longrope_factors_are_chosen_per_sequence() {
    let model = load();
    let short: Vec<u32> = (0..9).map(|i| (i * 11 + 3) % 512).collect();
    let long: Vec<u32> = (0..30).map(|i| (i * 13 + 7) % 512).collect();
    let lp = |rows: &[Vec<u32>]| -> Vec<Vec<f32>> {
        let t = rows.iter().map(Vec::len).max().unwrap();
        let ids: Vec<Vec<u32>> = (rows.iter())
            .map(|r| {
                r.iter()
                    .copied()
                    .chain(std::iter::repeat(0))
                    .take(t)
                    .collect()
            })
            .collect();
        let mask: Vec<Vec<u32>> = (rows.iter())
            .map(|r| (0..t).map(|j| u32::from(j < r.len())).collect())
            .collect();
        (model
            .token_logprobs(&ids, &mask, 0, 1.0, false, false)
            .unwrap())
        .logprobs
        .to_vec2()
        .unwrap()
    };
    let alone = lp(std::slice::from_ref(&short));
    let mixed = lp(&[short.clone(), long.clone()]);
    // Equal up to the summation order of the wider batch (the long factors would move them
    // by far more: they divide the frequencies by up to 12 instead of 3).
    for (a, b) in alone[0][..8].iter().zip(&mixed[0][..8]) {
        assert!((a - b).abs() < 1e-5, "{a} vs {b}");
    }
    let long_alone = lp(std::slice::from_ref(&long));
    for (a, b) in long_alone[0].iter().zip(&mixed[1]) {
        assert!((a - b).abs() < 1e-5, "{a} vs {b}");
    }
    // Shared prefix: one prompt, completions ending before and after the switch.
    let prompt: Vec<u32> = short[..6].to_vec();
    let (c1, c2): (Vec<u32>, Vec<u32>) = (short[6..].to_vec(), long[..20].to_vec());
    let rows: Vec<(&[u32], &[u32])> = vec![(&prompt, &c1), (&prompt, &c2), (&prompt, &c1)];
    let shared: Vec<Vec<f32>> = (model.shared_prefix_logprobs_rows(&rows, 1.0, false, false))
        .unwrap()
        .logprobs
        .to_vec2()
        .unwrap();
    let own = |c: &[u32]| {
        let seq: Vec<u32> = prompt.iter().chain(c).copied().collect();
        lp(&[seq])[0][prompt.len() - 1..].to_vec()
    };
    let batch = rlvr_model::SharedPrefixBatch {
        groups: vec![rlvr_model::PromptGroup {
            prompt: prompt.clone(),
            completions: vec![c1.clone(), c2.clone()],
        }],
    };
    let Err(e) = model.shared_prefix_logprobs(&batch, 1.0, false, false) else {
        panic!("a mixed batch was scored shared")
    };
    let e = e.to_string();
    assert!(e.contains("LongRoPE"), "{e}");
    for (row, c) in [(0, &c1), (1, &c2), (2, &c1)] {
        for (i, w) in own(c).iter().enumerate() {
            assert!((shared[row][i] - w).abs() < 1e-5, "row {row} token {i}");
        }
    }
}
