//! The gates follow from the registered parts: the same knobs, options and wording, in the same
//! order, as the table that was written by hand before (`git show eaaff0e:crates/rlvr-train/src/config/gates.rs`).

use rlvr_algo::parts::enum_values;
use rlvr_algo::Registered;
use rlvr_train::config::gates::GATES;
use rlvr_train::config::{RolloutBackend, Schedule};

/// (knob, option, the values that read it) of every gate, in check order.
const WRITTEN: &[(&str, &str, &str)] = &[
    (
        "algorithm.lme_temperature",
        "algorithm.baseline",
        "\"log-mean-exp\"",
    ),
    (
        "algorithm.std_eps",
        "algorithm.std_norm",
        "\"sample\" or \"population\"",
    ),
    (
        "algorithm.std_level",
        "algorithm.std_norm",
        "\"sample\" or \"population\"",
    ),
    (
        "algorithm.red_drop_in_normaliser",
        "algorithm.red_drop",
        "true",
    ),
    ("algorithm.red_drop_rule", "algorithm.red_drop", "true"),
    (
        "algorithm.clip_low_prime",
        "algorithm.keep_mask",
        "\"ring\"",
    ),
    (
        "algorithm.clip_high_prime",
        "algorithm.keep_mask",
        "\"ring\"",
    ),
    (
        "algorithm.adv_temperature",
        "algorithm.rec_weight",
        "\"advantage-exp\"",
    ),
    (
        "algorithm.tau",
        "algorithm.regulariser",
        "\"opmd\" or \"asymre\"",
    ),
    ("algorithm.kl_estimator", "algorithm.kl_coef", "≠ 0"),
    ("algorithm.kl_ratio_weighted", "algorithm.kl_coef", "≠ 0"),
    (
        "model.reference",
        "algorithm.kl_coef",
        "≠ 0 (the reference is loaded for the KL term)",
    ),
    (
        "algorithm.mismatch_cap",
        "algorithm.mismatch_correction",
        "a truncation, a mask or \"icepop\"",
    ),
    (
        "algorithm.mismatch_low",
        "algorithm.mismatch_correction",
        "\"token-mask\", \"sequence-mask\", \"geometric-mask\" or \"icepop\"",
    ),
    (
        "algorithm.mismatch_k3_threshold",
        "algorithm.mismatch_correction",
        "\"sequence-k3-mask\"",
    ),
    (
        "algorithm.overlong_buffer_frac",
        "algorithm.overlong",
        "\"soft\"",
    ),
    (
        "algorithm.overlong_penalty_factor",
        "algorithm.overlong",
        "\"soft\"",
    ),
    ("train.min_lr", "train.schedule", "\"linear\" or \"cosine\""),
    (
        "train.dynamic_sampling_max_rounds",
        "algorithm.dynamic_sampling",
        "true",
    ),
    (
        "train.dynamic_sampling_short_batch",
        "algorithm.dynamic_sampling",
        "true",
    ),
    ("model.lora_alpha", "model.lora_rank", "≥ 1"),
    ("model.lora_targets", "model.lora_rank", "≥ 1"),
    ("model.lora_dropout", "model.lora_rank", "≥ 1"),
    ("rollout.servers", "rollout.backend", "\"vllm\""),
    ("rollout.served_model_name", "rollout.backend", "\"vllm\""),
    ("rollout.weights_dir", "rollout.backend", "\"vllm\""),
    ("rollout.api_key_env", "rollout.backend", "\"vllm\""),
    ("rollout.request_timeout_s", "rollout.backend", "\"vllm\""),
    ("rollout.retries", "rollout.backend", "\"vllm\""),
    ("rollout.in_flight", "rollout.backend", "\"vllm\""),
    (
        "rollout.accept_renormalised_logprobs",
        "rollout.backend",
        "\"vllm\"",
    ),
    ("rollout.refresh_tolerance", "rollout.backend", "\"vllm\""),
    ("rollout.cache_salt", "rollout.backend", "\"vllm\""),
];

#[test]
fn the_gates_are_the_hand_written_table() {
    let got: Vec<(&str, &str, &str)> = GATES.iter().map(|g| (g.key, g.gate, g.when)).collect();
    assert_eq!(got, WRITTEN);
}

#[test]
fn the_trainer_choices_register_every_value_once() {
    fn once<T: Registered + for<'de> serde::Deserialize<'de>>() {
        let mut parts: Vec<&str> = T::PARTS.iter().map(|p| p.name).collect();
        let mut values = enum_values::<T>().to_vec();
        parts.sort_unstable();
        values.sort_unstable();
        assert_eq!(parts, values, "{}", T::KEY);
    }
    once::<Schedule>();
    once::<RolloutBackend>();
}
