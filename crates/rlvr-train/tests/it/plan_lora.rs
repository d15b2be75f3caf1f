//! `rlvr plan` with LoRA: the adapter parameter count equals the model's adapter tensors; the
//! frozen base gets no masters, gradients or moments, the explorer copies only the adapters and
//! the KL reference costs nothing (it shares the base).

use crate::common::repo;

use rlvr_model::{LoraConfig, LoraTarget, ModelConfig};
use rlvr_train::config::plan::{plan, Shape};
use rlvr_train::config::RawConfig;

#[test]
fn adapter_parameter_count_equals_the_model_adapters() {
    for (arch, targets) in [
        ("qwen2", LoraTarget::ALL.to_vec()),
        (
            "qwen3",
            vec![LoraTarget::Q, LoraTarget::O, LoraTarget::Down],
        ),
        (
            "llama",
            vec![LoraTarget::K, LoraTarget::Gate, LoraTarget::Up],
        ),
        ("mistral", vec![LoraTarget::AllLinear]),
        // Phi-3's fused modules: B `[(4 + 2·2)·8, r]` and `[2·24, r]`.
        ("phi3", vec![LoraTarget::AllLinear]),
        ("phi3", vec![LoraTarget::Qkv, LoraTarget::Down]),
    ] {
        let c = ModelConfig::from_json(
            &serde_json::json!({"model_type": arch, "vocab_size": 50, "hidden_size": 16,
                "intermediate_size": 24, "num_hidden_layers": 3, "num_attention_heads": 4,
                "num_key_value_heads": 2, "head_dim": 8, "max_position_embeddings": 64}),
            "inline".as_ref(),
        )
        .unwrap();
        let mut m = rlvr_model::Model::random(
            c.clone(),
            0.02,
            0,
            candle_core::DType::F32,
            &candle_core::Device::Cpu,
        )
        .unwrap();
        let lora = LoraConfig {
            rank: 3,
            alpha: 6.0,
            targets,
            dropout: 0.0,
        };
        m.add_lora(&lora, 0).unwrap();
        let n: usize = m
            .named_vars()
            .iter()
            .map(|(_, v)| v.as_tensor().elem_count())
            .sum();
        assert_eq!(Shape::of(&c).adapter_params(&lora), n as u64, "{arch}");
    }
}

fn raw(sets: &[&str]) -> RawConfig {
    let mut s = vec![
        format!(
            "model.path={:?}",
            repo()
                .join("configs/shapes/qwen2.5-7b")
                .display()
                .to_string()
        ),
        "model.dtype=\"bf16\"".into(),
        "model.device=\"cuda:0\"".into(),
        "data.task=\"gsm8k\"".into(),
    ];
    s.extend(sets.iter().map(|x| x.to_string()));
    RawConfig::load(None, &s).unwrap().resolve().unwrap().raw
}

#[test]
fn lora_plan_counts_a_frozen_base_and_f32_adapters() {
    let full = plan(&raw(&[]), true, Some(80 << 30)).unwrap();
    let lora = plan(&raw(&["model.lora_rank=16"]), true, Some(80 << 30)).unwrap();
    let p = full.shape.params;
    let a = lora.adapter_params;
    // Qwen2.5-7B, r = 16 on all seven projections: 16·(3584+3584 + 3584+512 + 3584+512 +
    // 3584+3584 + 2·(3584+18944) + 18944+3584) per layer × 28 layers.
    assert_eq!(a, 40_370_176);
    assert_eq!(lora.lora_rank, 16);
    assert_eq!(lora.weights, p * 2 + a * 4);
    assert_eq!(lora.master_weights, 0);
    assert_eq!(lora.adamw_moments, 2 * a * 4);
    assert_eq!(lora.gradients, 2 * a * 4);
    assert_eq!(lora.explorer_weights, a * 4);
    assert_eq!(lora.reference_model, 0);
    assert_eq!(full.reference_model, p * 2);
    assert!(lora.activations_per_row > full.activations_per_row);
    // What stays resident whatever the batch: the full model's is past 80 GB, LoRA's under 24 GB.
    let resident = |q: &rlvr_train::config::plan::Plan| {
        q.weights
            + q.master_weights
            + q.gradients
            + q.adamw_moments
            + q.explorer_weights
            + q.reference_model
    };
    assert!(resident(&full) > 80 << 30 && resident(&lora) < 24 << 30);
    assert!(lora.train_peak < full.train_peak && lora.rollout_peak < full.rollout_peak);
    // A reference named explicitly is loaded (a full copy).
    let mut r = raw(&["model.lora_rank=16"]);
    r.model.reference = Some(r.model.path.clone());
    assert_eq!(plan(&r, true, None).unwrap().reference_model, p * 2);
}
