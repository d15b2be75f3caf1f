//! The LLM judge against a real vLLM CPU server (scripts/ci_vllm.sh starts one and runs this).
//!
//! Runs only when `RLVR_VLLM_URL` names a live server on the model directory `RLVR_VLLM_MODEL` (a
//! small random Qwen2 with the Qwen2.5 tokenizer, `scripts/vllm_server.sh model`), served as
//! `RLVR_VLLM_NAME` (default rlvr-policy). Ignored by a plain `cargo test`; scripts/ci_vllm.sh
//! runs it with `--include-ignored`, and run without its server it fails. A random model's free text
//! rarely parses, so the answer is constrained the way vLLM allows: one token, drawn from
//! `allowed_token_ids` (sent through the judge's `extra_body`). The labels' ids come from the
//! model's own tokenizer.json.

use rlvr_reward::judge::JudgeConfig;
use rlvr_reward::{Sample, Verifier};
use serde_json::{json, Value};

struct Live {
    url: String,
    name: String,
    vocab: Value,
}

fn live() -> Option<Live> {
    let Ok(url) = std::env::var("RLVR_VLLM_URL") else {
        panic!(
            "RLVR_VLLM_URL is not set: this live test needs a running server; \
             scripts/ci_vllm.sh starts one and runs it (a plain `cargo test` skips it as ignored)"
        );
    };
    let dir = std::env::var("RLVR_VLLM_MODEL").expect("RLVR_VLLM_MODEL: the served model dir");
    let tok: Value =
        serde_json::from_str(&std::fs::read_to_string(format!("{dir}/tokenizer.json")).unwrap())
            .unwrap();
    Some(Live {
        url,
        name: std::env::var("RLVR_VLLM_NAME").unwrap_or_else(|_| "rlvr-policy".into()),
        vocab: tok["model"]["vocab"].clone(),
    })
}

impl Live {
    fn id(&self, token: &str) -> u64 {
        self.vocab[token]
            .as_u64()
            .unwrap_or_else(|| panic!("{token:?} is not in the vocabulary"))
    }

    /// A completions-endpoint judge answering one token among `allowed`, labels yes = 1, no = 0.
    fn judge(&self, allowed: &[&str], extra: Value) -> JudgeConfig {
        let ids: Vec<u64> = allowed.iter().map(|t| self.id(t)).collect();
        let mut v = json!({
            "server": self.url, "model": self.name, "endpoint": "completions",
            "template": "Question: {question}\nAnswer: {completion}\nIs the answer correct (yes or no)?",
            "parse": {"rule": "labels", "labels": {"yes": 1.0, "no": 0.0}},
            "max_tokens": 1, "temperature": 1.0, "seed": 3, "retries": 1, "timeout_s": 120.0,
            "extra_body": {"allowed_token_ids": ids},
        });
        for (k, x) in extra.as_object().unwrap() {
            v[k] = x.clone();
        }
        serde_json::from_value(v).unwrap()
    }
}

fn samples(c: &[(String, String)]) -> Vec<Sample<'_>> {
    [
        "4",
        "5",
        "four",
        "22",
        "It is 4.",
        "3 + 1",
        "I do not know",
        "4.0",
    ]
    .iter()
    .enumerate()
    .map(|(i, completion)| Sample {
        prompt: "What is 2+2?",
        completion,
        reference: "4",
        columns: c,
        index: Some(i),
    })
    .collect()
}

#[test]
#[ignore = "live: needs a vLLM server, started by scripts/ci_vllm.sh"]
fn a_judge_constrained_to_its_labels_parses_every_answer_and_is_seeded() {
    let Some(l) = live() else { return };
    let c = vec![("question".to_string(), "What is 2+2?".to_string())];
    let s = samples(&c);
    let v = l.judge(&["yes", "no"], json!({})).build().unwrap();
    let a = v.score_batch(&s).unwrap();
    assert_eq!(v.parse_failures(), 0);
    for x in &a {
        let word = x.extracted.as_deref().unwrap();
        assert!(matches!(word, "yes" | "no"), "{word:?}");
        assert_eq!(x.reward, if word == "yes" { 1.0 } else { 0.0 });
        assert_eq!(x.correct, word == "yes");
    }
    // The judge's sampling is seeded: the same batch gets the same verdicts.
    let b = v.score_batch(&s).unwrap();
    assert_eq!(a, b);
    eprintln!(
        "verdicts: {:?}",
        a.iter().map(|x| x.reward).collect::<Vec<_>>()
    );
}

#[test]
#[ignore = "live: needs a vLLM server, started by scripts/ci_vllm.sh"]
fn answers_outside_the_labels_are_counted_failures_or_stop_the_batch() {
    let Some(l) = live() else { return };
    let c = vec![("question".to_string(), "What is 2+2?".to_string())];
    let s = samples(&c);
    let v = l.judge(&["maybe"], json!({})).build().unwrap();
    let got = v.score_batch(&s).unwrap();
    assert!(got
        .iter()
        .all(|x| x.reward == 0.0 && !x.correct && x.extracted.as_deref() == Some("maybe")));
    assert_eq!(v.parse_failures(), s.len() as u64);
    let e = l
        .judge(&["maybe"], json!({"on_parse_failure": "error"}))
        .build()
        .unwrap()
        .score_batch(&s)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains(&l.url) && e.contains("8 of 8 answers could not be parsed"),
        "{e}"
    );
    // A model name the server does not serve is a refusal, not retried.
    let e = l
        .judge(&["yes", "no"], json!({"model": "no-such-model"}))
        .build()
        .unwrap()
        .score_batch(&s[..1])
        .unwrap_err()
        .to_string();
    assert!(e.contains("HTTP 404") && e.contains(&l.url), "{e}");
}
