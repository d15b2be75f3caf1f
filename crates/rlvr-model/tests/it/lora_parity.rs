//! Forward parity with PEFT: adapters written by `peft` (`save_pretrained`) on the tiny qwen2,
//! qwen3 and llama parity checkpoints, with non-zero B, give the PeftModel's float32 log-probs
//! within 1e-5 (fixtures and reference values: `scripts/make_lora_fixtures.py`).

use std::path::{Path, PathBuf};

use candle_core::{DType, Device};
use rlvr_model::{LoraTarget, Model};

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/lora")
}

fn check(name: &str) {
    let dir = fixtures().join(name);
    let exp: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("expected.json")).unwrap()).unwrap();
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
        for (g, w) in got.iter().flatten().zip(want.iter().flatten()) {
            worst = worst.max((*g as f64 - w).abs());
        }
    }
    eprintln!("{name}: max |rlvr − peft| = {worst:.2e}");
    assert!(worst < 1e-5, "{name}: max |rlvr − peft| = {worst}");
    // The adapter changes the model (so the comparison above tests it).
    assert!(exp["max_logit_change_from_adapter"].as_f64().unwrap() > 1.0);
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
