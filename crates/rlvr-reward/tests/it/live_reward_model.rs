//! The reward-model verifier against a real vLLM CPU server with `--runner pooling` on a small
//! random Qwen2ForSequenceClassification (scripts/ci_vllm.sh makes it with
//! scripts/make_reward_model.py, starts the server and runs this).
//!
//! Runs only when `RLVR_RM_URL` names the live server, served as `RLVR_RM_NAME` (default
//! rlvr-rm) on the model directory `RLVR_RM_DIR`, whose expected.json holds transformers' own raw
//! scores for some texts and conversations. Ignored by a plain `cargo test`; scripts/ci_vllm.sh
//! runs it with `--include-ignored`, and run without its server it fails.

use rlvr_reward::reward_model::RewardModelConfig;
use rlvr_reward::{Sample, Verifier};
use serde_json::{json, Value};

struct Live {
    url: String,
    name: String,
    expected: Value,
}

fn live() -> Option<Live> {
    let Ok(url) = std::env::var("RLVR_RM_URL") else {
        panic!(
            "RLVR_RM_URL is not set: this live test needs a running server; \
             scripts/ci_vllm.sh starts one and runs it (a plain `cargo test` skips it as ignored)"
        );
    };
    let dir = std::env::var("RLVR_RM_DIR").expect("RLVR_RM_DIR: the served model dir");
    let expected =
        serde_json::from_str(&std::fs::read_to_string(format!("{dir}/expected.json")).unwrap())
            .unwrap();
    Some(Live {
        url,
        name: std::env::var("RLVR_RM_NAME").unwrap_or_else(|_| "rlvr-rm".into()),
        expected,
    })
}

impl Live {
    fn rm(&self, extra: Value) -> RewardModelConfig {
        let mut v = json!({"server": self.url, "model": self.name, "timeout_s": 120.0,
                           "retries": 1});
        for (k, x) in extra.as_object().unwrap() {
            v[k] = x.clone();
        }
        serde_json::from_value(v).unwrap()
    }

    fn rows(&self, key: &str) -> Vec<Vec<Value>> {
        serde_json::from_value(self.expected[key].clone()).unwrap()
    }
}

/// Scores agree with transformers' float32 forward within this (absolute; the scores are O(1)).
const TOL: f64 = 1e-4;

#[test]
#[ignore = "live: needs a reward-model server, started by scripts/ci_vllm.sh"]
fn raw_scores_equal_transformers_in_batches_and_as_probabilities() {
    let Some(l) = live() else { return };
    let rows = l.rows("texts");
    let texts: Vec<&str> = rows.iter().map(|r| r[0].as_str().unwrap()).collect();
    let want: Vec<f64> = rows.iter().map(|r| r[1].as_f64().unwrap()).collect();
    // The texts as completions of an empty prompt (the default template is prompt + completion),
    // two per request.
    let samples: Vec<Sample> = texts
        .iter()
        .map(|t| Sample {
            prompt: "",
            completion: t,
            ..Sample::default()
        })
        .collect();
    let v = l.rm(json!({"batch_size": 2})).build().unwrap();
    let got: Vec<f64> = v
        .score_batch(&samples)
        .unwrap()
        .iter()
        .map(|s| s.reward)
        .collect();
    eprintln!("rlvr {got:?}\ntransformers {want:?}");
    for (g, w) in got.iter().zip(&want) {
        assert!((g - w).abs() < TOL, "{got:?} vs {want:?}");
    }
    // Distinct texts, distinct scores: the check has signal.
    assert!(
        want.windows(2).all(|w| (w[0] - w[1]).abs() > 10.0 * TOL),
        "{want:?}"
    );
    // /classify gives the sigmoid of the same logits (one label), as does `activation = true`.
    for extra in [json!({"endpoint": "classify"}), json!({"activation": true})] {
        let p: Vec<f64> = l
            .rm(extra.clone())
            .build()
            .unwrap()
            .score_batch(&samples)
            .unwrap()
            .iter()
            .map(|s| s.reward)
            .collect();
        for (p, w) in p.iter().zip(&want) {
            let s = 1.0 / (1.0 + (-w).exp());
            assert!((p - s).abs() < TOL, "{extra}: {p} vs sigmoid {s}");
        }
    }
}

#[test]
#[ignore = "live: needs a reward-model server, started by scripts/ci_vllm.sh"]
fn chat_input_is_rendered_by_the_server_template() {
    let Some(l) = live() else { return };
    let rows = l.rows("chats");
    let samples: Vec<Sample> = rows
        .iter()
        .map(|r| Sample {
            prompt: r[0].as_str().unwrap(),
            completion: r[1].as_str().unwrap(),
            ..Sample::default()
        })
        .collect();
    let v = l
        .rm(json!({"input": "chat", "correct_above": -100.0}))
        .build()
        .unwrap();
    let got = v.score_batch(&samples).unwrap();
    for (g, r) in got.iter().zip(&rows) {
        let w = r[2].as_f64().unwrap();
        assert!((g.reward - w).abs() < TOL, "{} vs {w}", g.reward);
        assert!(g.correct);
    }
}

#[test]
#[ignore = "live: needs a reward-model server, started by scripts/ci_vllm.sh"]
fn an_unknown_model_is_a_refusal_naming_the_server() {
    let Some(l) = live() else { return };
    let one = [Sample::new("4", "")];
    let e = l
        .rm(json!({"model": "no-such-model"}))
        .build()
        .unwrap()
        .score_batch(&one)
        .unwrap_err()
        .to_string();
    assert!(e.contains(&l.url) && e.contains("HTTP 4"), "{e}");
}
