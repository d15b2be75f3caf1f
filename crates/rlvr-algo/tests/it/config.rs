//! Config resolution (defaults < preset < user), presets of DESIGN.md section 4, TOML round trips, errors.

use rlvr_algo::{
    find_preset, presets, print_algorithms, Aggregation, Algorithm, AlgorithmConfig, KeepMask,
    KlEstimator, PolicyLoss, RecWeight, Regulariser, StdLevel, StdNorm,
};

use crate::common::{flat, Flat};

fn resolved(preset: &str) -> Algorithm {
    AlgorithmConfig::empty(preset).resolve().unwrap()
}

/// The resolved knobs of `preset`, flat.
fn resolve(preset: &str) -> Flat {
    flat(&resolved(preset))
}

#[test]
fn every_preset_resolves_and_round_trips_through_toml() {
    assert_eq!(presets().len(), 24);
    for p in presets() {
        let alg = resolved(p.name);
        assert_eq!(alg.kl.coef, 0.0, "{}", p.name);
        assert_eq!(alg.entropy_coef, 0.0, "{}", p.name);
        // Resolved → fully-set config → TOML → parse → resolve: identical.
        let text = toml::to_string(&alg.to_config()).unwrap();
        let back: AlgorithmConfig = toml::from_str(&text).unwrap();
        assert_eq!(back.resolve().unwrap(), alg, "{}:\n{text}", p.name);
        // The preset's own values parse as an [algorithm] table too.
        let partial = toml::to_string(&p.values).unwrap();
        let _: AlgorithmConfig = toml::from_str(&partial).unwrap();
        assert!(
            !p.description.is_empty() && p.reference.contains("arXiv"),
            "{}",
            p.name
        );
        // The sync interval is never part of a preset.
        assert!(p
            .values
            .set_values()
            .iter()
            .all(|(k, _)| !k.contains("sync")));
    }
}

#[test]
fn presets_set_the_values_of_design_table() {
    let g = resolve("grpo");
    assert_eq!(
        (g.loss, g.std_norm, g.std_eps),
        (PolicyLoss::Ppo, StdNorm::Sample, 1e-6)
    );
    assert_eq!(
        (g.clip_low, g.clip_high, g.aggregation),
        (0.2, 0.2, Aggregation::SeqMeanTokenMean)
    );
    let o = resolve("off_policy_grpo");
    assert_eq!(
        Flat {
            preset: "grpo".into(),
            ..o
        },
        g
    );
    let r = resolve("reinforce");
    assert_eq!(
        (r.loss, r.std_norm, r.aggregation),
        (PolicyLoss::Reinforce, StdNorm::None, Aggregation::TokenMean)
    );
    for (name, keep, weight) in [
        ("rec_oneside_nois", KeepMask::OneSide, RecWeight::None),
        ("rec_oneside_is", KeepMask::OneSide, RecWeight::Is),
        ("rec_twoside_nois", KeepMask::TwoSide, RecWeight::None),
        ("rec_twoside_is", KeepMask::TwoSide, RecWeight::Is),
        ("rec_ring_nois", KeepMask::Ring, RecWeight::None),
        ("rec_ring_is", KeepMask::Ring, RecWeight::Is),
    ] {
        let a = resolve(name);
        assert_eq!(
            (a.loss, a.keep_mask, a.rec_weight),
            (PolicyLoss::Rec, keep, weight),
            "{name}"
        );
        assert_eq!(
            (a.clip_low, a.clip_high, a.std_norm),
            (0.2, 0.2, StdNorm::None),
            "{name}"
        );
        assert_eq!(a.aggregation, Aggregation::TokenMean, "{name}");
    }
    let ring = resolve("rec_ring_is");
    assert_eq!((ring.clip_low_prime, ring.clip_high_prime), (0.6, 2.0));
    for (name, weight) in [
        ("rec_gspo_nois", RecWeight::None),
        ("rec_gspo_is", RecWeight::SeqIs),
    ] {
        let a = resolve(name);
        assert_eq!((a.keep_mask, a.rec_weight), (KeepMask::GspoOneSide, weight));
        assert_eq!(
            (a.clip_low, a.clip_high, a.aggregation),
            (3e-4, 4e-4, Aggregation::SeqMeanTokenMean)
        );
    }
    let opmd = resolve("opmd");
    assert_eq!(
        (opmd.regulariser, opmd.tau, opmd.std_norm),
        (Regulariser::Opmd, 0.1, StdNorm::None)
    );
    let asym = resolve("asymre");
    assert_eq!((asym.regulariser, asym.tau), (Regulariser::Asymre, 0.1));
    // Trinity-RFT's RED-Drop recipe: `std_normalize: false`; dropped rows stay in the batch.
    let rd = resolve("red_drop");
    assert!(rd.red_drop && rd.red_drop_in_normaliser);
    assert_eq!(
        (rd.std_norm, rd.loss),
        (StdNorm::None, PolicyLoss::Reinforce)
    );
    // Paper B's presets count zero-variance groups in the normaliser, as its Trinity recipes do;
    // the others keep rlvr's default (out).
    for name in [
        "reinforce",
        "rec_oneside_nois",
        "rec_oneside_is",
        "rec_twoside_nois",
        "rec_twoside_is",
        "rec_ring_nois",
        "rec_ring_is",
        "rec_gspo_nois",
        "rec_gspo_is",
        "opmd",
        "asymre",
        "red_drop",
        "red_weight",
        "grpo_rec",
    ] {
        assert!(!resolve(name).exclude_zero_std, "{name}");
    }
    for name in [
        "grpo",
        "off_policy_grpo",
        "dr_grpo",
        "dapo",
        "gspo",
        "cispo",
    ] {
        assert!(resolve(name).exclude_zero_std, "{name}");
    }
    // Paper B's GRPO baseline (Trinity's rec recipe "GRPO"): one-side keep-mask with the IS weight,
    // population std (`std(unbiased=False)`), token mean.
    let g = resolve("grpo_rec");
    assert_eq!(
        (g.loss, g.keep_mask, g.rec_weight),
        (PolicyLoss::Rec, KeepMask::OneSide, RecWeight::Is)
    );
    assert_eq!(
        (g.std_norm, g.std_level, g.std_eps, g.aggregation),
        (
            StdNorm::Population,
            StdLevel::Group,
            1e-6,
            Aggregation::TokenMean
        )
    );
    assert_eq!((g.clip_low, g.clip_high), (0.2, 0.2));
    let rw = resolve("red_weight");
    assert_eq!(
        (rw.rec_weight, rw.keep_mask, rw.adv_temperature),
        (RecWeight::AdvantageExp, KeepMask::None, 1.0)
    );
    let dr = resolve("dr_grpo");
    assert_eq!(
        (dr.std_norm, dr.loss, dr.aggregation),
        (StdNorm::None, PolicyLoss::Ppo, Aggregation::Constant)
    );
    let dapo = resolve("dapo");
    assert_eq!(
        (dapo.clip_low, dapo.clip_high, dapo.aggregation),
        (0.2, 0.28, Aggregation::TokenMean)
    );
    assert!(dapo.dynamic_sampling && dapo.exclude_zero_std);
    let gspo = resolve("gspo");
    assert_eq!(
        (gspo.loss, gspo.clip_low, gspo.clip_high),
        (PolicyLoss::Gspo, 3e-4, 4e-4)
    );
    assert_eq!(gspo.aggregation, Aggregation::SeqMeanTokenMean);
    let cispo = resolve("cispo");
    assert_eq!(
        (cispo.loss, cispo.clip_high, cispo.aggregation),
        (PolicyLoss::Cispo, 0.28, Aggregation::TokenMean)
    );
}

#[test]
fn precedence_is_defaults_then_preset_then_user() {
    // The user's table sets clip_high and kl; the preset fills the rest it knows; defaults the others.
    let user: AlgorithmConfig = toml::from_str(
        r#"
        preset = "dapo"
        clip_high = 0.3
        kl_coef = 0.05
        kl_estimator = "k2"
        "#,
    )
    .unwrap();
    let a = flat(&user.resolve().unwrap());
    assert_eq!(a.clip_high, 0.3); // user beats preset (0.28)
    assert_eq!(a.clip_low, 0.2); // preset
    assert_eq!(a.kl_coef, 0.05); // user beats preset's 0
    assert_eq!(a.kl_estimator, KlEstimator::K2);
    assert_eq!(a.log_ratio_clamp, 20.0); // default: no preset sets it
    assert_eq!(a.preset, "dapo");
    // Integers are accepted for float knobs (`--set algorithm.dual_clip=3` parses as a TOML integer).
    let ints: AlgorithmConfig =
        toml::from_str("dual_clip = 3\nkl_coef = 0\nclip_high = 1").unwrap();
    let a = flat(&ints.resolve().unwrap());
    assert_eq!((a.dual_clip, a.kl_coef, a.clip_high), (Some(3.0), 0.0, 1.0));
    // A user value equal to the default still wins over the preset.
    let mut c = AlgorithmConfig::empty("dr_grpo");
    c.aggregation = Some(Aggregation::TokenMean);
    assert_eq!(c.resolve().unwrap().aggregation, Aggregation::TokenMean);
    // Default config is the grpo preset; "none" is the bare defaults.
    assert_eq!(
        AlgorithmConfig::default().resolve().unwrap(),
        resolved("grpo")
    );
    assert_eq!(resolved("none"), Algorithm::default());
}

#[test]
fn unknown_keys_values_and_presets_are_rejected_with_their_names() {
    let e = toml::from_str::<AlgorithmConfig>("clip_hgh = 0.3")
        .unwrap_err()
        .to_string();
    assert!(e.contains("clip_hgh"), "{e}");
    let e = toml::from_str::<AlgorithmConfig>("aggregation = \"mean\"")
        .unwrap_err()
        .to_string();
    assert!(e.contains("token-mean") && e.contains("constant"), "{e}");
    let e = AlgorithmConfig::empty("gpro")
        .resolve()
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("gpro") && e.contains("grpo") && e.contains("rec_ring_is"),
        "{e}"
    );
    assert!(find_preset("cispo").is_ok());
}

#[test]
fn invalid_values_name_the_key() {
    let bad = |f: &dyn Fn(&mut AlgorithmConfig), key: &str| {
        let mut c = AlgorithmConfig::empty("grpo");
        f(&mut c);
        let e = c.resolve().unwrap_err().to_string();
        assert!(e.contains(key), "{e}");
    };
    bad(&|c| c.clip_low = Some(1.0), "clip_low");
    bad(&|c| c.clip_high = Some(-0.1), "clip_high");
    bad(&|c| c.clip_low_prime = Some(0.1), "clip_low_prime");
    bad(&|c| c.clip_high_prime = Some(0.1), "clip_high_prime");
    bad(&|c| c.dual_clip = Some(0.9), "dual_clip");
    bad(&|c| c.is_cap = Some(0.0), "is_cap");
    bad(&|c| c.std_eps = Some(f64::NAN), "std_eps");
    bad(&|c| c.adv_temperature = Some(0.0), "adv_temperature");
    bad(&|c| c.kl_coef = Some(-1.0), "kl_coef");
    bad(
        &|c| c.overlong_buffer_frac = Some(0.0),
        "overlong_buffer_frac",
    );
    bad(
        &|c| {
            c.red_drop = Some(true);
            c.baseline = Some(rlvr_algo::Baseline::LeaveOneOut);
        },
        "red_drop",
    );
}

#[test]
fn print_algorithms_lists_every_preset_and_value() {
    let mut out = Vec::new();
    print_algorithms(&mut out).unwrap();
    let text = String::from_utf8(out).unwrap();
    for p in presets() {
        assert!(text.contains(&format!("\n{}\n", p.name)), "{}", p.name);
        assert!(text.contains(p.reference));
        for (k, v) in p.values.set_values() {
            assert!(text.contains(&format!("{k} = {v}")), "{}: {k}", p.name);
        }
    }
    assert!(text.contains("clip_high = 0.28"));
    assert!(text.contains("aggregation = \"constant\""));
}

/// Each loss reads its own group of options; a knob of another loss that the user set is rejected
/// with the key and the loss named, a preset's is not; `to_config` writes the chosen loss's only.
#[test]
fn loss_options_are_grouped_by_loss() {
    use rlvr_algo::config::LOSS_OPTIONS;
    // Every loss-specific key belongs to at least one loss, and REINFORCE reads none.
    for key in LOSS_OPTIONS {
        assert!(
            PolicyLoss::ALL.iter().any(|l| l.options().contains(&key)),
            "{key}"
        );
    }
    assert!(PolicyLoss::Reinforce.options().is_empty());
    assert!(PolicyLoss::Reinforce.reads("kl_coef"));
    assert!(PolicyLoss::Rec.reads("keep_mask") && !PolicyLoss::Ppo.reads("keep_mask"));
    assert!(PolicyLoss::Ppo.reads("dual_clip") && !PolicyLoss::Cispo.reads("dual_clip"));
    assert!(PolicyLoss::Cispo.reads("clip_high") && !PolicyLoss::Cispo.reads("clip_low"));
    for (preset, f, key, loss) in [
        (
            "grpo",
            (|c: &mut AlgorithmConfig| c.keep_mask = Some(KeepMask::Ring))
                as fn(&mut AlgorithmConfig),
            "keep_mask",
            "ppo",
        ),
        (
            "reinforce",
            |c| c.clip_high = Some(0.3),
            "clip_high",
            "reinforce",
        ),
        ("cispo", |c| c.clip_low = Some(0.1), "clip_low", "cispo"),
        (
            "gspo",
            |c| c.adv_temperature = Some(2.0),
            "adv_temperature",
            "gspo",
        ),
        (
            "rec_ring_is",
            |c| c.dual_clip = Some(3.0),
            "dual_clip",
            "rec",
        ),
        (
            "rec_oneside_is",
            |c| {
                c.loss = Some(PolicyLoss::Reinforce);
                c.is_cap = Some(2.0);
            },
            "is_cap",
            "reinforce",
        ),
    ] {
        let mut c = AlgorithmConfig::empty(preset);
        f(&mut c);
        let e = c.resolve().unwrap_err().to_string();
        assert!(
            e.contains(&format!("`algorithm.{key}`")) && e.contains(&format!("\"{loss}\"")),
            "{preset}: {e}"
        );
    }
    // The preset's REC knobs with a user-chosen PPO loss: not the user's, accepted; not written.
    let mut c = AlgorithmConfig::empty("rec_ring_is");
    c.loss = Some(PolicyLoss::Ppo);
    let a = c.resolve().unwrap();
    let back = a.to_config();
    assert_eq!(
        (back.keep_mask, back.clip_low_prime, back.rec_weight),
        (None, None, None)
    );
    assert_eq!((back.clip_low, back.clip_high), (Some(0.2), Some(0.2)));
    assert_eq!(back.resolve().unwrap(), a);
    // Every preset writes exactly the loss-specific knobs its loss reads (optional ones when set).
    for p in presets() {
        let a = resolve(p.name);
        let written: Vec<String> = resolved(p.name)
            .to_config()
            .set_values()
            .into_iter()
            .map(|(k, _)| k)
            .collect();
        for key in LOSS_OPTIONS {
            let want = a.loss.reads(key)
                && match key {
                    "dual_clip" => a.dual_clip.is_some(),
                    "is_cap" => a.is_cap.is_some(),
                    _ => true,
                };
            assert_eq!(written.iter().any(|k| k == key), want, "{}: {key}", p.name);
        }
    }
}

/// Each keep-mask's bounds are checked only for the loss that reads them (issue 47): TRL's CISPO
/// `epsilon_high = 5` (clip_high 4), ppo/gspo clip_high above 2 and ppo clip_low above 0.6 resolve;
/// the ring keep-mask still ties ε′ to ε, and out-of-range values keep their messages.
#[test]
fn keep_mask_bounds_apply_only_where_read() {
    let with = |preset: &str, f: &dyn Fn(&mut AlgorithmConfig)| {
        let mut c = AlgorithmConfig::empty(preset);
        f(&mut c);
        c.resolve().map(|a| flat(&a))
    };
    for h in [0.28, 2.0, 4.0, 100.0] {
        let a = with("cispo", &|c| c.clip_high = Some(h)).unwrap();
        assert_eq!(a.clip_high, h);
    }
    assert_eq!(
        with("grpo", &|c| c.clip_high = Some(3.0))
            .unwrap()
            .clip_high,
        3.0
    );
    assert_eq!(
        with("gspo", &|c| c.clip_high = Some(2.5))
            .unwrap()
            .clip_high,
        2.5
    );
    assert_eq!(
        with("grpo", &|c| c.clip_low = Some(0.7)).unwrap().clip_low,
        0.7
    );
    // Non-ring REC keep-masks do not read ε′ either.
    assert_eq!(
        with("rec_twoside_is", &|c| c.clip_high = Some(3.0))
            .unwrap()
            .clip_high,
        3.0
    );
    let err = |r: rlvr_algo::error::Result<Flat>| r.unwrap_err().to_string();
    // The ring keep-mask: ε′_high ≥ ε_high and ε_low ≤ ε′_low ≤ 1 still hold.
    let e = err(with("rec_ring_is", &|c| c.clip_high = Some(3.0)));
    assert!(
        e.contains("clip_high_prime") && e.contains("clip_high = 3") && e.contains("ring"),
        "{e}"
    );
    let e = err(with("rec_ring_is", &|c| c.clip_low = Some(0.7)));
    assert!(
        e.contains("clip_low_prime") && e.contains("clip_low = 0.7"),
        "{e}"
    );
    let e = err(with("rec_ring_is", &|c| c.clip_low_prime = Some(1.5)));
    assert!(e.contains("clip_low_prime") && e.contains("ring"), "{e}");
    // Genuinely invalid values keep their messages, for every loss that reads them.
    let e = err(with("cispo", &|c| c.clip_high = Some(-1.0)));
    assert!(e.contains("clip_high") && e.contains(">= 0"), "{e}");
    let e = err(with("cispo", &|c| c.clip_high = Some(f64::INFINITY)));
    assert!(e.contains("clip_high"), "{e}");
    let e = err(with("gspo", &|c| c.clip_low = Some(1.0)));
    assert!(e.contains("clip_low") && e.contains("[0, 1)"), "{e}");
    let e = err(with("grpo", &|c| c.clip_high = Some(2e6)));
    assert!(e.contains("clip_high") && e.contains("1e6"), "{e}");
    // A knob of another loss is still refused by name.
    let e = err(with("cispo", &|c| c.clip_high_prime = Some(2.0)));
    assert!(e.contains("clip_high_prime") && e.contains("cispo"), "{e}");
}

/// The presets TRL users expect by name (issue 47): `grpo_trl` is GRPOConfig 1.16's defaults
/// (loss_type "dapo": token mean over the update, zero-variance groups counted, std + 1e-4,
/// epsilon 0.2 both sides, beta 0); `bnpo` is TRL's bnpo as a token mean per update (the same
/// values); `dapo` stays the DAPO paper's recipe.
#[test]
fn trl_presets_equal_grpo_trainer_defaults() {
    for name in ["grpo_trl", "bnpo"] {
        let a = resolve(name);
        assert_eq!(a.loss, PolicyLoss::Ppo, "{name}");
        assert_eq!(
            (a.clip_low, a.clip_high, a.dual_clip),
            (0.2, 0.2, None),
            "{name}"
        );
        assert_eq!(
            (a.std_norm, a.std_level, a.std_eps),
            (StdNorm::Sample, StdLevel::Group, 1e-4),
            "{name}"
        );
        assert_eq!(a.aggregation, Aggregation::TokenMean, "{name}");
        assert!(!a.exclude_zero_std, "{name}");
        assert_eq!(
            (a.kl_coef, a.is_cap, a.opsm_delta),
            (0.0, None, None),
            "{name}"
        );
        assert!(!a.dynamic_sampling, "{name}");
    }
    let dapo = resolve("dapo");
    assert!(dapo.dynamic_sampling && dapo.clip_high == 0.28);
    assert!(find_preset("dapo").unwrap().follows.contains("grpo_trl"));
    // The presets that name TRL but differ from it say each difference.
    for name in ["grpo", "gspo", "cispo", "off_policy_grpo"] {
        let f = find_preset(name).unwrap().follows;
        let a = resolve(name);
        assert_eq!(a.std_eps, 1e-6, "{name}");
        assert!(a.exclude_zero_std, "{name}");
        assert!(
            f.contains("TRL") && f.contains("std + 1e-6") && f.contains("zero-variance"),
            "{name}: {f}"
        );
    }
    assert!(find_preset("grpo_trl")
        .unwrap()
        .follows
        .contains("no difference"));
}

/// A misspelt preset gets "did you mean" with the nearest name; TRL's names without a preset say so.
#[test]
fn preset_typos_suggest_the_nearest() {
    let e = |n: &str| AlgorithmConfig::empty(n).resolve().unwrap_err().to_string();
    for (typo, want) in [
        ("drgrpo", "dr_grpo"),
        ("DR-GRPO", "dr_grpo"),
        ("gpro", "grpo"),
        ("grpo-trl", "grpo_trl"),
        ("trl", "grpo_trl"),
        ("cipso", "cispo"),
        ("rec_ringis", "rec_ring_is"),
        ("asymree", "asymre"),
    ] {
        let msg = e(typo);
        assert!(
            msg.contains(&format!("did you mean `{want}`?")),
            "{typo}: {msg}"
        );
        assert!(
            msg.contains(&format!("unknown algorithm preset `{typo}`")),
            "{msg}"
        );
    }
    assert!(e("rec_ring").contains("did you mean one of `rec_ring_nois`, `rec_ring_is`?"));
    assert!(e("sapo").contains("TRL's loss_type=\"sapo\" has no rlvr preset"));
    // Nothing close: no guess, but the list of valid names.
    let msg = e("completely_else");
    assert!(
        !msg.contains("did you mean") && msg.contains("grpo_trl"),
        "{msg}"
    );
}

/// docs/algorithms.md's preset table ("follows" column, with the advantage ε, zero-variance
/// handling and aggregation each preset resolves to) equals `follows_table()`; run with
/// RLVR_BLESS=1 to rewrite it.
#[test]
fn docs_preset_table_holds_the_follows_lines() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/algorithms.md");
    let text = std::fs::read_to_string(&path).unwrap();
    let (begin, end) = ("<!-- presets:begin -->\n", "<!-- presets:end -->");
    let i = text
        .find(begin)
        .expect("docs/algorithms.md has the presets:begin marker")
        + begin.len();
    let j = text
        .find(end)
        .expect("docs/algorithms.md has the presets:end marker");
    let want = rlvr_algo::follows_table();
    if text[i..j] != want {
        if std::env::var_os("RLVR_BLESS").is_some() {
            std::fs::write(&path, format!("{}{}{}", &text[..i], want, &text[j..])).unwrap();
        } else {
            panic!("docs/algorithms.md's preset table is stale: run RLVR_BLESS=1 cargo test -p rlvr-algo --test it -- config::docs_preset_table");
        }
    }
    for p in presets() {
        assert!(want.contains(&format!("| `{}` |", p.name)));
        assert!(want.contains(p.follows));
    }
}
