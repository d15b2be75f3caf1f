//! Parity with PEFT: adapters written by `peft` (`save_pretrained`) on the tiny qwen2, qwen3,
//! llama, Phi-3 (fused `qkv_proj` and `gate_up_proj`), Gemma 2 and Gemma 3 text parity
//! checkpoints, with non-zero B, give the PeftModel's float32 log-probs within 1e-5 and (Phi-3,
//! Gemma) its gradients of every lora_A and lora_B within 1e-4 of each tensor's largest entry
//! (fixtures and reference values: `scripts/make_lora_fixtures.py`); what rlvr writes for them
//! has PEFT's tensor names and shapes, and the merged Phi-3 model scores as the adapter does.

use std::path::{Path, PathBuf};

use candle_core::{DType, Device};
use rlvr_model::{LoraTarget, Model};

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/lora")
}

fn expected(name: &str) -> serde_json::Value {
    let text = std::fs::read_to_string(fixtures().join(name).join("expected.json")).unwrap();
    serde_json::from_str(&text).unwrap()
}

/// The largest |rlvr − peft| over the fixture's log-prob cases, for `m`.
fn worst_logprob_gap(m: &Model, exp: &serde_json::Value) -> f64 {
    let mut worst = 0f64;
    for case in exp["cases"].as_array().unwrap() {
        let t = case["temperature"].as_f64().unwrap();
        let ids: Vec<Vec<u32>> = serde_json::from_value(case["input_ids"].clone()).unwrap();
        let want: Vec<Vec<f64>> = serde_json::from_value(case["logprobs"].clone()).unwrap();
        let mask = vec![vec![1u32; ids[0].len()]; ids.len()];
        let got: Vec<Vec<f32>> = m
            .token_logprobs(&ids, &mask, 0, t, false, false)
            .unwrap()
            .logprobs
            .to_vec2()
            .unwrap();
        assert_eq!(got.len(), want.len());
        for (g, w) in got.iter().flatten().zip(want.iter().flatten()) {
            worst = worst.max((*g as f64 - w).abs());
        }
    }
    worst
}

fn check(name: &str) {
    let dir = fixtures().join(name);
    let exp = expected(name);
    // PEFT's own layout: adapter_config.json at the top, the base named relative to it.
    let m = Model::load(&dir, DType::F32, &Device::Cpu).unwrap();
    let lora = m.lora_config().expect("the adapter is attached");
    assert_eq!(lora.rank as u64, exp["r"].as_u64().unwrap());
    assert_eq!(lora.alpha, exp["lora_alpha"].as_f64().unwrap());
    let mut want: Vec<LoraTarget> = exp["target_modules"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_str().unwrap().parse().unwrap())
        .collect();
    let mut got = lora.targets.clone();
    let key = |t: &LoraTarget| t.module();
    want.sort_by_key(key);
    got.sort_by_key(key);
    assert_eq!(got, want);
    let worst = worst_logprob_gap(&m, &exp);
    eprintln!("{name}: max |rlvr − peft| = {worst:.2e}");
    assert!(worst < 1e-5, "{name}: max |rlvr − peft| = {worst}");
    // The adapter changes the model (so the comparison above tests it).
    assert!(exp["max_logit_change_from_adapter"].as_f64().unwrap() > 0.5);
    if exp.get("grads").is_some() {
        check_grads(name, &m, &exp);
        // Activation checkpointing recomputes each layer in the backward: the same gradients.
        let mut ck = m.clone();
        ck.set_gradient_checkpointing(true);
        check_grads(name, &ck, &exp);
    }
}

/// The gradient of L = Σ temperature-1 log-probs of the first case with respect to every
/// adapter factor equals PEFT's (each tensor within 1e-4 of its largest entry, every factor of
/// the file compared; the loss within 1e-5 relative), with or without activation checkpointing.
fn check_grads(name: &str, m: &Model, exp: &serde_json::Value) {
    let g = &exp["grads"];
    let case = &exp["cases"][0];
    assert_eq!(case["temperature"].as_f64(), Some(1.0));
    let ids: Vec<Vec<u32>> = serde_json::from_value(case["input_ids"].clone()).unwrap();
    let mask = vec![vec![1u32; ids[0].len()]; ids.len()];
    let loss = m
        .token_logprobs(&ids, &mask, 0, 1.0, false, true)
        .unwrap()
        .logprobs
        .sum_all()
        .unwrap();
    let l = loss.to_scalar::<f32>().unwrap() as f64;
    let want_loss = g["loss"].as_f64().unwrap();
    assert!(
        (l - want_loss).abs() <= 1e-5 * want_loss.abs(),
        "{name}: loss {l} vs peft {want_loss}"
    );
    let grads = rlvr_model::recompute::backward(&loss).unwrap();
    let weights = g["weights"].as_object().unwrap();
    let vars = m.named_vars();
    assert_eq!(vars.len(), weights.len(), "{name}: one gradient per factor");
    let mut worst = 0f64;
    for (n, v) in &vars {
        let want: Vec<f64> = serde_json::from_value(weights[n.as_str()].clone()).unwrap();
        let shape: Vec<usize> = serde_json::from_value(g["shapes"][n.as_str()].clone()).unwrap();
        assert_eq!(v.dims(), &shape[..], "{name}: {n}");
        let got: Vec<f32> = (grads.get(v.as_tensor()))
            .unwrap_or_else(|| panic!("{name}: no gradient for {n}"))
            .flatten_all()
            .unwrap()
            .to_vec1()
            .unwrap();
        let scale = want.iter().fold(0f64, |a, x| a.max(x.abs()));
        assert!(scale > 0.0, "{name}: {n} has a zero gradient in peft");
        for (a, b) in got.iter().zip(&want) {
            let e = (*a as f64 - b).abs() / scale;
            worst = worst.max(e);
            assert!(e <= 1e-4, "{name}: {n}: {a} vs peft {b} (scale {scale})");
        }
    }
    eprintln!("{name}: max |∂rlvr − ∂peft| / max |∂peft| = {worst:.2e}");
}

#[test]
fn peft_adapters_match_peft_logprobs_qwen2() {
    check("qwen2_bias_tied");
}

#[test]
fn peft_adapters_match_peft_logprobs_qwen3() {
    check("qwen3");
}

#[test]
fn peft_adapters_match_peft_logprobs_llama() {
    check("llama_gqa_untied_rope3");
}

#[test]
fn peft_adapters_match_peft_logprobs_and_grads_phi3_fused() {
    check("phi3_longrope_partial");
}

#[test]
fn peft_adapters_match_peft_logprobs_and_grads_gemma2() {
    check("gemma2_softcap");
}

#[test]
fn peft_adapters_match_peft_logprobs_and_grads_gemma3_text() {
    check("gemma3_local_global");
}

/// With `RLVR_LORA_KEEP=DIR` set, copies the adapter rlvr saved for fixture `name` (`saved`,
/// holding `adapter/`) to `DIR/name`, for `scripts/check_peft_fixtures.py` to load in PEFT.
fn keep(name: &str, saved: &Path) {
    let Some(dir) = std::env::var_os("RLVR_LORA_KEEP") else {
        return;
    };
    let to = Path::new(&dir).join(name);
    std::fs::create_dir_all(&to).unwrap();
    for f in ["adapter_config.json", "adapter_model.safetensors"] {
        std::fs::copy(saved.join("adapter").join(f), to.join(f)).unwrap();
    }
}

/// The tensors of `file`: name → (shape, f32 values).
fn tensors(file: &Path) -> std::collections::BTreeMap<String, (Vec<usize>, Vec<f32>)> {
    candle_core::safetensors::load(file, &Device::Cpu)
        .unwrap()
        .into_iter()
        .map(|(n, t)| {
            let v = t.flatten_all().unwrap().to_vec1::<f32>().unwrap();
            (n, (t.dims().to_vec(), v))
        })
        .collect()
}

/// What rlvr writes for an adapter is what PEFT wrote: the Phi-3, Gemma 2 and Gemma 3 fixtures
/// loaded and saved again give PEFT's tensor names (`…self_attn.qkv_proj.lora_B.weight`
/// `[(h + 2·kv)·head_dim, r]`, `…mlp.gate_up_proj.lora_B.weight` `[2·intermediate, r]` on
/// Phi-3), shapes and values, and PEFT's target_modules; fresh adapters (`all-linear`) on the
/// Phi-3 base have PEFT's names and shapes too.
#[test]
fn saved_adapters_have_peft_names_and_shapes() {
    for name in [
        "phi3_longrope_partial",
        "gemma2_softcap",
        "gemma3_local_global",
    ] {
        let src = fixtures().join(name);
        let m = Model::load(&src, DType::F32, &Device::Cpu).unwrap();
        let out = tempfile::tempdir().unwrap();
        m.save(out.path(), DType::F32).unwrap();
        keep(name, out.path());
        let peft = tensors(&src.join("adapter_model.safetensors"));
        let ours = tensors(&out.path().join("adapter/adapter_model.safetensors"));
        assert_eq!(
            ours.keys().collect::<Vec<_>>(),
            peft.keys().collect::<Vec<_>>(),
            "{name}"
        );
        assert_eq!(ours, peft, "{name}");
        let cfg: serde_json::Value = serde_json::from_str(
            &std::fs::read_to_string(out.path().join("adapter/adapter_config.json")).unwrap(),
        )
        .unwrap();
        let mut targets: Vec<String> =
            serde_json::from_value(cfg["target_modules"].clone()).unwrap();
        let mut want: Vec<String> =
            serde_json::from_value(expected(name)["target_modules"].clone()).unwrap();
        targets.sort();
        want.sort();
        assert_eq!(targets, want, "{name}");
    }
    let phi3 = fixtures().join("phi3_longrope_partial");
    let peft = tensors(&phi3.join("adapter_model.safetensors"));
    assert_eq!(
        peft["base_model.model.model.layers.0.self_attn.qkv_proj.lora_B.weight"].0,
        [(4 + 2 * 2) * 16, 2]
    );
    assert_eq!(
        peft["base_model.model.model.layers.0.mlp.gate_up_proj.lora_B.weight"].0,
        [2 * 96, 2]
    );
    let mut fresh = Model::load_base(
        &fixtures().join("../phi3_longrope_partial"),
        DType::F32,
        &Device::Cpu,
    )
    .unwrap();
    let cfg = rlvr_model::LoraConfig {
        rank: 2,
        alpha: 5.0,
        targets: vec![LoraTarget::AllLinear],
        dropout: 0.0,
    };
    fresh.add_lora(&cfg, 3).unwrap();
    assert_eq!(
        fresh.lora_config().unwrap().targets,
        [
            LoraTarget::Qkv,
            LoraTarget::O,
            LoraTarget::GateUp,
            LoraTarget::Down
        ]
    );
    let names: std::collections::BTreeMap<String, Vec<usize>> = fresh
        .named_vars()
        .into_iter()
        .map(|(n, v)| (n, v.dims().to_vec()))
        .collect();
    let want: std::collections::BTreeMap<String, Vec<usize>> =
        peft.into_iter().map(|(n, (s, _))| (n, s)).collect();
    assert_eq!(names, want);
}

/// Phi-3 targets as PEFT users write them: the fused names and `all-linear` are accepted; the
/// split q/k/v/gate/up (no module of a phi3 checkpoint) are refused naming the fused module and
/// the valid names; phi3's fused names on another architecture are refused the same way.
#[test]
fn phi3_targets_are_its_fused_modules() {
    let base = fixtures().join("../phi3_longrope_partial");
    let cfg = |targets: Vec<LoraTarget>| rlvr_model::LoraConfig {
        rank: 2,
        alpha: 4.0,
        targets,
        dropout: 0.0,
    };
    for bad in [
        LoraTarget::Q,
        LoraTarget::K,
        LoraTarget::V,
        LoraTarget::Gate,
        LoraTarget::Up,
    ] {
        let mut m = Model::load_base(&base, DType::F32, &Device::Cpu).unwrap();
        let e = m
            .add_lora(&cfg(vec![LoraTarget::O, bad]), 0)
            .unwrap_err()
            .to_string();
        let fused = bad.fused_in().unwrap().module();
        assert!(
            e.contains(bad.module())
                && e.contains(fused)
                && e.contains("qkv_proj, o_proj, gate_up_proj, down_proj"),
            "{e}"
        );
        assert!(m.lora_config().is_none());
    }
    let mut m = Model::load_base(&base, DType::F32, &Device::Cpu).unwrap();
    m.add_lora(&cfg(vec![LoraTarget::Qkv, LoraTarget::Down]), 0)
        .unwrap();
    let names: Vec<String> = m.named_vars().into_iter().map(|(n, _)| n).collect();
    assert_eq!(names.len(), 3 * 4);
    assert!(
        names[0].ends_with("layers.0.self_attn.qkv_proj.lora_A.weight"),
        "{names:?}"
    );
    let e = cfg(vec![LoraTarget::AllLinear, LoraTarget::O])
        .for_arch(rlvr_model::Arch::Phi3)
        .unwrap_err()
        .to_string();
    assert!(e.contains("all-linear stands alone"), "{e}");
    let mut llama = Model::load_base(
        &fixtures().join("../llama_gqa_untied_rope3"),
        DType::F32,
        &Device::Cpu,
    )
    .unwrap();
    let e = llama
        .add_lora(&cfg(vec![LoraTarget::GateUp]), 0)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("gate_up_proj") && e.contains("q_proj, k_proj, v_proj"),
        "{e}"
    );
    llama
        .add_lora(&cfg(vec![LoraTarget::AllLinear]), 0)
        .unwrap();
    assert_eq!(llama.lora_config().unwrap().targets, LoraTarget::ALL);
}

/// `Model::merged` of the PEFT Phi-3 adapter (each fused module's update split by rows over the
/// projections it holds), saved (fused `qkv_proj` and `gate_up_proj` again) and loaded as a
/// plain model, gives PEFT's log-probs within 2e-5, as the adapter does; the merged fused
/// weights are W + (α/r)·B·A of the fused weight.
#[test]
fn merged_phi3_adapter_scores_as_peft() {
    let name = "phi3_longrope_partial";
    let m = Model::load(&fixtures().join(name), DType::F32, &Device::Cpu).unwrap();
    let out = tempfile::tempdir().unwrap();
    m.merged().unwrap().save(out.path(), DType::F32).unwrap();
    let merged = Model::load(out.path(), DType::F32, &Device::Cpu).unwrap();
    assert!(merged.lora_config().is_none());
    let worst = worst_logprob_gap(&merged, &expected(name));
    eprintln!("{name} merged: max |rlvr − peft| = {worst:.2e}");
    // W + (α/r)·B·A rounded to f32 once more than the unmerged sum: 2e-5.
    assert!(worst < 2e-5, "{worst}");
    // The stored fused weight: W + (α/r)·B·A.
    let st = tensors(&out.path().join("model.safetensors"));
    let base = tensors(&fixtures().join("../phi3_longrope_partial/model.safetensors"));
    let ad = tensors(&fixtures().join(name).join("adapter_model.safetensors"));
    let key = "model.layers.1.self_attn.qkv_proj.weight";
    let (shape, w) = (&base[key].0, &base[key].1);
    let a = &ad["base_model.model.model.layers.1.self_attn.qkv_proj.lora_A.weight"].1;
    let b = &ad["base_model.model.model.layers.1.self_attn.qkv_proj.lora_B.weight"].1;
    let (rows, cols, r) = (shape[0], shape[1], 2);
    assert_eq!(st[key].0, *shape);
    for i in 0..rows {
        for j in 0..cols {
            let d: f32 = (0..r).map(|k| b[i * r + k] * a[k * cols + j]).sum::<f32>() * 2.5;
            let (got, want) = (st[key].1[i * cols + j], w[i * cols + j] + d);
            assert!(
                (got - want).abs() <= 1e-6 * (1.0 + want.abs()),
                "{i},{j}: {got} vs {want}"
            );
        }
    }
}

#[test]
fn peft_adapters_match_peft_logprobs_and_grads_gemma3_wrapper() {
    check("gemma3_wrapper_tiny");
}

/// On the multimodal Gemma 3 wrapper rlvr writes PEFT's names for it
/// (`base_model.model.model.language_model.layers.N…`, the values PEFT wrote), without the
/// vision tower's adapters PEFT's target list added (rlvr runs text only), and a
/// `target_modules` pattern that PEFT matches against the language model's modules only; rlvr
/// loads that adapter back (the targets read from the file's factors) with the same log-probs.
#[test]
fn gemma3_wrapper_adapters_have_peft_names() {
    let name = "gemma3_wrapper_tiny";
    let src = fixtures().join(name);
    let m = Model::load(&src, DType::F32, &Device::Cpu).unwrap();
    let out = tempfile::tempdir().unwrap();
    m.save(out.path(), DType::F32).unwrap();
    keep(name, out.path());
    let peft = tensors(&src.join("adapter_model.safetensors"));
    assert!(peft.keys().any(|k| k.contains(".vision_tower.")));
    let text: std::collections::BTreeMap<_, _> = peft
        .into_iter()
        .filter(|(k, _)| !k.contains(".vision_tower."))
        .collect();
    assert!(text
        .keys()
        .all(|k| k.starts_with("base_model.model.model.language_model.layers.")));
    let ours = tensors(&out.path().join("adapter/adapter_model.safetensors"));
    assert_eq!(ours, text);
    let cfg: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(out.path().join("adapter/adapter_config.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(
        cfg["target_modules"],
        r"model\.language_model\.layers\.\d+\.(self_attn|mlp)\.(q_proj|v_proj|down_proj)"
    );
    let back = Model::load(out.path(), DType::F32, &Device::Cpu).unwrap();
    assert_eq!(
        back.lora_config().unwrap().targets,
        [LoraTarget::Q, LoraTarget::V, LoraTarget::Down]
    );
    let worst = worst_logprob_gap(&back, &expected(name));
    assert!(worst < 1e-5, "{worst}");
}
