//! The registered parts of the `[algorithm]` choices: every value registered once, under the
//! name the config writes; every declared default the one resolution uses; the loss-specific keys
//! and each loss's group as they were written by hand before they followed from the parts.

use crate::common::alg;
use rlvr_algo::config::LOSS_OPTIONS;
use rlvr_algo::parts::{enum_values, table_keys};
use rlvr_algo::{
    Algorithm, AlgorithmConfig, Baseline, KeepMask, MismatchCorrection, Overlong, PolicyLoss,
    RecWeight, Registered, Regulariser, StdNorm,
};

/// `T`'s parts are exactly its variants (as serde names them), each once.
fn registered_once<T: Registered + for<'de> serde::Deserialize<'de>>() {
    let mut parts: Vec<&str> = T::PARTS.iter().map(|p| p.name).collect();
    let mut values = enum_values::<T>().to_vec();
    assert!(!values.is_empty(), "{}: no variants read", T::KEY);
    parts.sort_unstable();
    values.sort_unstable();
    assert_eq!(parts, values, "{}", T::KEY);
}

#[test]
fn every_value_of_every_choice_is_registered_once() {
    registered_once::<PolicyLoss>();
    registered_once::<Baseline>();
    registered_once::<StdNorm>();
    registered_once::<KeepMask>();
    registered_once::<RecWeight>();
    registered_once::<Regulariser>();
    registered_once::<MismatchCorrection>();
    registered_once::<Overlong>();
    // And `part()` finds each value's own part.
    for l in PolicyLoss::ALL {
        assert_eq!(
            serde_json::to_value(l).unwrap().as_str().unwrap(),
            l.part().name
        );
    }
    for m in MismatchCorrection::ALL {
        assert_eq!(
            serde_json::to_value(m).unwrap().as_str().unwrap(),
            m.part().name
        );
    }
}

/// A declared default is the value resolution gives an unset knob (`unset` for an optional one).
#[test]
fn declared_defaults_are_the_resolved_defaults() {
    let defaults = serde_json::to_value(AlgorithmConfig::defaults()).unwrap();
    let mut seen = 0;
    let all_parts = PolicyLoss::PARTS.iter().chain(
        rlvr_algo::config::ALGORITHM_CHOICES
            .iter()
            .flat_map(|c| c.parts),
    );
    for p in all_parts {
        for k in p.knobs.iter().filter(|k| !k.key.contains('.')) {
            let v = &defaults[k.key];
            let want = match v {
                serde_json::Value::Null => "unset".to_string(),
                other => other.to_string(),
            };
            assert_eq!(k.default, want, "{} of {}", k.key, p.name);
            seen += 1;
        }
    }
    assert!(seen > 20, "{seen}");
}

/// The loss-specific keys and each loss's group, as the hand-written lists had them (the order
/// decides which key an error names first).
#[test]
fn loss_options_follow_from_the_loss_parts() {
    let keys: Vec<&str> = LOSS_OPTIONS.into_iter().collect();
    assert_eq!(
        keys,
        [
            "clip_low",
            "clip_high",
            "clip_low_prime",
            "clip_high_prime",
            "dual_clip",
            "keep_mask",
            "rec_weight",
            "adv_temperature",
            "is_cap",
        ]
    );
    assert_eq!(
        PolicyLoss::Ppo.options(),
        ["clip_low", "clip_high", "dual_clip", "is_cap"]
    );
    assert_eq!(PolicyLoss::Gspo.options(), PolicyLoss::Ppo.options());
    assert_eq!(PolicyLoss::Cispo.options(), ["clip_high", "is_cap"]);
    assert_eq!(
        PolicyLoss::Rec.options(),
        [
            "keep_mask",
            "rec_weight",
            "clip_low",
            "clip_high",
            "clip_low_prime",
            "clip_high_prime",
            "adv_temperature",
            "is_cap",
        ]
    );
    assert!(PolicyLoss::Reinforce.options().is_empty());
}

/// The table's keys come from the type: every field of `AlgorithmConfig`, in order, and a
/// table with each of them set deserialises (no key is refused).
#[test]
fn table_keys_are_the_fields() {
    let keys = table_keys::<AlgorithmConfig>();
    assert_eq!(keys.len(), 38, "{keys:?}");
    assert_eq!(keys[0], "preset");
    assert_eq!(keys[1], "baseline");
    assert_eq!(keys[keys.len() - 1], "dynamic_sampling");
    let full = toml::to_string(&Algorithm::default().to_config()).unwrap();
    let table: toml::Table = full.parse().unwrap();
    for k in table.keys() {
        assert!(keys.contains(&k.as_str()), "{k}");
    }
    let mut one = toml::Table::new();
    for k in keys {
        one.insert((*k).to_string(), toml::Value::String("\u{1}".into()));
        // Refused for its value (or taken: `preset` is any string), never as an unknown key.
        if let Err(e) = toml::Value::Table(one.clone()).try_into::<AlgorithmConfig>() {
            assert!(!e.to_string().contains("unknown field"), "{k}: {e}");
        }
        one.clear();
    }
}

/// The resolved policy loss carries its own parameters: REC's ring its ε′, REC the IS cap its
/// `is` weight applies, CISPO its ε_high and cap only (a PPO-shaped ε_low it does not have cannot
/// be set), GSPO the surrogate's, REINFORCE nothing.
#[test]
fn the_policy_value_carries_its_own_parameters() {
    use rlvr_algo::config::{Cispo, Policy, Rec, RecKeep, RecScale, Surrogate};
    let a = alg(|c| {
        c.preset = "rec_ring_is".into();
        c.is_cap = Some(3.0);
        c.clip_low_prime = Some(0.7);
    });
    assert_eq!(
        a.policy,
        Policy::Rec(Rec {
            keep: RecKeep::Ring {
                clip_low_prime: 0.7,
                clip_high_prime: 2.0
            },
            scale: RecScale::Is,
            clip_low: 0.2,
            clip_high: 0.2,
            is_cap: Some(3.0)
        })
    );
    let a = alg(|c| {
        c.loss = Some(PolicyLoss::Cispo);
        c.clip_high = Some(0.3);
        c.is_cap = Some(3.0);
    });
    assert_eq!(
        a.policy,
        Policy::Cispo(Cispo {
            clip_high: 0.3,
            is_cap: Some(3.0)
        })
    );
    let a = alg(|c| {
        c.loss = Some(PolicyLoss::Gspo);
        c.clip_low = Some(0.1);
        c.dual_clip = Some(3.0);
    });
    assert_eq!(
        a.policy,
        Policy::Gspo(Surrogate {
            clip_low: 0.1,
            clip_high: 0.2,
            dual_clip: Some(3.0),
            is_cap: None
        })
    );
    let a = alg(|c| c.loss = Some(PolicyLoss::Reinforce));
    assert_eq!(a.policy, Policy::Reinforce);
}

/// The advantage, the regulariser, the overlong rule and the mismatch correction carry their own
/// parameters, and only those: the log-mean-exp temperature, the std division's level and ε, the
/// RED-Drop rule, τ, the soft penalty's buffer and factor, the correction's bounds.
#[test]
fn the_other_parts_carry_their_own_parameters() {
    use rlvr_algo::{
        Correction, GroupBaseline, OverlongRule, RedDrop, RedDropRule, RegTerm, StdDivision,
        StdLevel,
    };
    let a = alg(|c| {
        c.baseline = Some(Baseline::LogMeanExp);
        c.lme_temperature = Some(0.5);
        c.std_level = Some(StdLevel::Batch);
        c.std_eps = Some(1e-4);
        c.regulariser = Some(Regulariser::Opmd);
        c.tau = Some(0.3);
        c.overlong = Some(Overlong::Soft);
        c.overlong_penalty_factor = Some(2.0);
        c.mismatch_correction = Some(MismatchCorrection::Icepop);
        c.mismatch_low = Some(0.5);
        c.mismatch_cap = Some(5.0);
    });
    assert_eq!(
        a.advantage.baseline,
        GroupBaseline::LogMeanExp { temperature: 0.5 }
    );
    assert_eq!(
        a.advantage.std,
        Some(StdDivision {
            norm: StdNorm::Sample,
            level: StdLevel::Batch,
            eps: 1e-4
        })
    );
    assert_eq!(a.advantage.red_drop, None);
    assert_eq!(a.regulariser, RegTerm::Opmd { tau: 0.3 });
    assert_eq!(
        a.overlong,
        OverlongRule::Soft {
            buffer_frac: 0.2,
            penalty_factor: 2.0
        }
    );
    assert_eq!(
        a.mismatch,
        Correction::Bounded {
            kind: MismatchCorrection::Icepop,
            cap: 5.0,
            low: Some(0.5)
        }
    );
    let d = alg(|c| c.preset = "red_drop_bernoulli".into());
    assert_eq!(
        d.advantage.red_drop,
        Some(RedDrop {
            rule: RedDropRule::Bernoulli,
            in_normaliser: true
        })
    );
    assert_eq!(d.advantage.std, None);
    let k3 = alg(|c| c.mismatch_correction = Some(MismatchCorrection::SequenceK3Mask));
    assert_eq!(k3.mismatch, Correction::K3Mask { threshold: 0.01 });
    let t = alg(|c| c.mismatch_correction = Some(MismatchCorrection::GeometricTruncate));
    assert_eq!(
        t.mismatch,
        Correction::Truncate {
            kind: MismatchCorrection::GeometricTruncate,
            cap: 2.0
        }
    );
    assert_eq!(alg(|_| {}).mismatch, Correction::Off);
}

/// Every preset sets only knobs its chosen parts read: the round trip through the flat table
/// keeps each of its values, and resolves back to the same algorithm. Together with rlvr-train
/// leaving unread knobs out of `config.toml`, this is why writing an unread knob at its default
/// changes no written file.
#[test]
fn presets_set_only_knobs_their_parts_read() {
    for p in rlvr_algo::presets() {
        let a = AlgorithmConfig::empty(p.name).resolve().unwrap();
        let back = a.to_config();
        let written = back.set_values();
        for (k, v) in p.values.set_values() {
            assert!(
                written.contains(&(k.clone(), v.clone())),
                "{}: {k} = {v}",
                p.name
            );
        }
        assert_eq!(back.resolve().unwrap(), a, "{}", p.name);
    }
}
