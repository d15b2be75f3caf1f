//! The registered parts of the `[algorithm]` choices: every value registered once, under the
//! name the config writes; every declared default the one resolution uses; the loss-specific keys
//! and each loss's group as they were written by hand before they followed from the parts.

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
    let defaults = serde_json::to_value(Algorithm::default()).unwrap();
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

/// The resolved policy loss carries its own parameters: REC's ring its ε′, REC's IS weight the
/// cap, CISPO its ε_high and cap only, REINFORCE nothing.
#[test]
fn the_policy_value_carries_its_own_parameters() {
    use rlvr_algo::config::{Cispo, Policy, RecKeep, RecScale, Surrogate};
    let mut a = AlgorithmConfig::empty("rec_ring_is").resolve().unwrap();
    a.is_cap = Some(3.0);
    match a.policy() {
        Policy::Rec(r) => {
            assert_eq!(
                r.keep,
                RecKeep::Ring {
                    clip_low_prime: a.clip_low_prime,
                    clip_high_prime: a.clip_high_prime
                }
            );
            assert_eq!(r.scale, RecScale::Is { is_cap: Some(3.0) });
            assert_eq!((r.clip_low, r.clip_high), (a.clip_low, a.clip_high));
        }
        other => panic!("{other:?}"),
    }
    a.loss = PolicyLoss::Cispo;
    a.clip_low = 0.9; // CISPO has no ε_low: its value does not carry one
    assert_eq!(
        a.policy(),
        Policy::Cispo(Cispo {
            clip_high: a.clip_high,
            is_cap: Some(3.0)
        })
    );
    a.loss = PolicyLoss::Gspo;
    a.dual_clip = Some(3.0);
    assert_eq!(
        a.policy(),
        Policy::Gspo(Surrogate {
            clip_low: 0.9,
            clip_high: a.clip_high,
            dual_clip: Some(3.0),
            is_cap: Some(3.0)
        })
    );
    a.loss = PolicyLoss::Reinforce;
    assert_eq!(a.policy(), Policy::Reinforce);
}
