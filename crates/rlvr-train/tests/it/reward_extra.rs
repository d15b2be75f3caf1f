//! A verifier's extra numbers (verl's `reward_extra_info`: a `compute_score` dict's numeric keys
//! besides `score`; any external program's `"extra"` object) are logged per step as
//! `reward/<component>/<key>/mean`, each averaged over the scored rows that carry it, and
//! reported by `rlvr eval`; a verl verifier's `kwargs` reach the function in a run.

use crate::common;

use std::collections::BTreeMap;

use rlvr_train::config::RawConfig;
use rlvr_train::eval::{reward_summary, EvalItem};
use rlvr_train::run::report::step_metrics;
use rlvr_train::run::{train, RunOptions};
use rlvr_train::store::experience::{Experience, RewardPart};
use rlvr_train::store::metrics::read_metrics;
use rlvr_train::update::StepReport;

/// A scored row whose one component (`verl`) reported `extra`.
fn row(reward: Option<f64>, extra: &[(&str, f64)]) -> Experience {
    Experience {
        prompt_ids: vec![1],
        completion_ids: vec![2],
        behaviour_logprobs: vec![-0.5],
        reward,
        group_id: "0".into(),
        components: vec![RewardPart {
            name: "verl".into(),
            raw: reward.unwrap_or(0.0),
            weighted: reward.unwrap_or(0.0),
            extra: extra.iter().map(|(k, x)| (k.to_string(), *x)).collect(),
        }],
        ..Default::default()
    }
}

/// The means: `acc` over the three scored rows, `len` over the two that carry it (a key set that
/// changes between rows), nothing from the unscored row; keys in order after the component's.
/// Before, extra numbers did not reach the metrics at all.
#[test]
fn each_extra_key_is_averaged_over_the_scored_rows_that_carry_it() {
    let exps = [
        row(Some(1.0), &[("acc", 1.0), ("len", 10.0)]),
        row(Some(0.0), &[("acc", 0.0)]),
        row(Some(1.0), &[("acc", 1.0), ("len", 4.0)]),
        row(None, &[("acc", 100.0), ("len", 100.0), ("lost", 1.0)]),
    ];
    let line = step_metrics(1, &exps, &StepReport::default(), 1e-6, 1.0, 1.0);
    let f = |k: &str| line.get(k).and_then(|v| v.as_f64());
    assert_eq!(f("reward/verl/acc/mean"), Some(2.0 / 3.0));
    assert_eq!(f("reward/verl/len/mean"), Some(7.0));
    assert_eq!(line.get("reward/verl/lost/mean"), None);
    let keys: Vec<&str> = line
        .keys()
        .filter(|k| k.starts_with("reward/verl"))
        .collect();
    assert_eq!(
        keys,
        [
            "reward/verl/mean",
            "reward/verl/share",
            "reward/verl/acc/mean",
            "reward/verl/len/mean"
        ]
    );
}

/// `rlvr eval`'s report: `reward/<component>/<key>/mean` over the items that carry the key, and
/// each item's numbers as `"reward_extra": {component: {key: value}}` (absent without any).
#[test]
fn eval_reports_the_extra_numbers_under_trainings_names() {
    let item = |reward: f64, extra: &[(&str, f64)]| EvalItem {
        index: 0,
        sample_index: 0,
        prompt: String::new(),
        completion: String::new(),
        reward,
        correct: reward > 0.0,
        extracted: None,
        gold: None,
        components: vec![("verl".into(), reward), ("fmt".into(), 0.0)],
        extra: match extra.is_empty() {
            true => Vec::new(),
            false => vec![(
                "verl".to_string(),
                extra.iter().map(|(k, x)| (k.to_string(), *x)).collect(),
            )],
        },
        episode: None,
    };
    let items = [
        item(1.0, &[("acc", 1.0), ("len", 3.0)]),
        item(0.0, &[("acc", 0.0)]),
        item(0.0, &[]),
    ];
    let got: BTreeMap<String, serde_json::Value> = reward_summary(&items).into_iter().collect();
    assert_eq!(got["reward/verl/acc/mean"], serde_json::json!(0.5));
    assert_eq!(got["reward/verl/len/mean"], serde_json::json!(3.0));
    assert_eq!(got["reward/verl/mean"], serde_json::json!(1.0 / 3.0));
    let out = serde_json::to_value(&items[0]).unwrap();
    assert_eq!(
        out["reward_extra"],
        serde_json::json!({"verl": {"acc": 1.0, "len": 3.0}})
    );
    assert!(serde_json::to_value(&items[2])
        .unwrap()
        .get("reward_extra")
        .is_none());
}

/// A verl function with a keyword argument and extra keys, in a training run: `kwargs.bonus`
/// reaches every call (the component's mean is the accuracy plus it), `acc` and `parity` are
/// logged per step (`parity` only on the rows of odd length, so its mean is 1), and `source`
/// (text) is not.
#[test]
fn a_verl_functions_kwargs_and_extra_numbers_in_a_training_run() {
    let python = std::process::Command::new("python3")
        .arg("--version")
        .output();
    assert!(
        python.is_ok_and(|o| o.status.success()),
        "python3 is needed by this test and was not found (Debian: apt-get install python3)"
    );
    let tmp = tempfile::tempdir().unwrap();
    let model = common::tiny_model(&tmp.path().join("m"), 4);
    let rd = tmp.path().join("run");
    let file = tmp.path().join("my_reward.py");
    std::fs::write(
        &file,
        r#"
def compute_score(data_source, solution_str, ground_truth, extra_info=None, bonus=0.0):
    ok = solution_str[:1] in "01234"
    out = {"score": bonus + (1.0 if ok else 0.0), "acc": ok, "source": data_source}
    if len(solution_str) % 2 == 1:
        out["parity"] = 1
    return out
"#,
    )
    .unwrap();
    let mut sets = common::arithmetic_sets(&model, &rd);
    sets.extend([
        "train.steps=2".to_string(),
        "train.eval_every=0".into(),
        "output.tensorboard=false".into(),
        format!(
            "data.verifier={{ kind = \"verl\", function = \"{}\", kwargs = {{ bonus = 0.25 }} }}",
            file.display()
        ),
    ]);
    let cfg = RawConfig::load(None, &sets).unwrap().resolve().unwrap();
    train(&cfg, &RunOptions::default()).unwrap();
    let lines = read_metrics(&rd.join("metrics.jsonl")).unwrap();
    assert_eq!(lines.len(), 2);
    for l in &lines {
        let f = |k: &str| l.get(k).and_then(|v| v.as_f64());
        let acc = f("reward/verl/acc/mean").unwrap_or_else(|| panic!("{l:?}"));
        assert_eq!(Some(acc), f("accuracy"), "{l:?}");
        assert!(
            (f("reward/verl/mean").unwrap() - (acc + 0.25)).abs() < 1e-12,
            "{l:?}"
        );
        assert!(
            matches!(f("reward/verl/parity/mean"), None | Some(1.0)),
            "{l:?}"
        );
        assert!(l.get("reward/verl/source/mean").is_none(), "{l:?}");
    }
}
