//! The reward-model verifier against a fake server speaking vLLM's pooling API on 127.0.0.1:
//! batched text requests and their order, the three output shapes (number, vector, per-token
//! matrix), `/classify`'s probabilities, chat input, scale/shift/threshold, and the failures
//! (wrong counts, missing or non-numeric scores, refusals), each naming the server. The same
//! verifier against a real vLLM CPU server: tests/it/live_reward_model.rs.

use crate::common::{server, server_with_headers};
use rlvr_reward::combine::VerifierConfig;
use rlvr_reward::reward_model::{score_of, RewardModelConfig, RewardModelEndpoint};
use rlvr_reward::{Sample, Verifier};
use serde_json::{json, Value};

fn rm(url: &str, extra: Value) -> RewardModelConfig {
    let mut v = json!({"server": url, "model": "rm", "retries": 1, "timeout_s": 5.0});
    for (k, x) in extra.as_object().unwrap() {
        v[k] = x.clone();
    }
    serde_json::from_value(v).unwrap()
}

/// The fake model's score of a text: its length in bytes over 10.
fn fake(text: &str) -> f64 {
    text.len() as f64 / 10.0
}

fn texts(body: &Value) -> Vec<String> {
    body["input"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_str().unwrap().to_string())
        .collect()
}

const COMPLETIONS: [&str; 5] = ["4", "four", "It is 4.", "5", ""];

fn samples(c: &[(String, String)]) -> Vec<Sample<'_>> {
    COMPLETIONS
        .iter()
        .enumerate()
        .map(|(i, completion)| Sample {
            prompt: "2+2=",
            completion,
            reference: "4",
            columns: c,
            index: Some(i),
        })
        .collect()
}

fn cols() -> Vec<(String, String)> {
    vec![("question".into(), "What is 2+2?".into())]
}

#[test]
fn text_batches_are_scored_in_order_with_scale_shift_and_threshold() {
    // Entries come back in reverse order, placed by their `index`.
    let (url, seen) = server(3, |_, b| {
        let data: Vec<Value> = texts(b)
            .iter()
            .enumerate()
            .rev()
            .map(|(i, t)| json!({"index": i, "object": "pooling", "data": [fake(t)]}))
            .collect();
        (200, json!({"object": "list", "data": data}).to_string(), 0)
    });
    let v = rm(
        &url,
        json!({"batch_size": 2, "template": "Q: {question} A: {completion}",
               "scale": 2.0, "shift": -3.0, "correct_above": 0.5}),
    )
    .build()
    .unwrap();
    let c = cols();
    let got = v.score_batch(&samples(&c)).unwrap();
    let want: Vec<f64> = COMPLETIONS
        .iter()
        .map(|a| 2.0 * fake(&format!("Q: What is 2+2? A: {a}")) - 3.0)
        .collect();
    assert_eq!(got.iter().map(|s| s.reward).collect::<Vec<_>>(), want);
    assert_eq!(
        got.iter().map(|s| s.correct).collect::<Vec<_>>(),
        want.iter().map(|r| *r > 0.5).collect::<Vec<_>>()
    );
    assert_eq!(got[0].extracted.as_deref(), Some("2"));
    // 5 texts in requests of at most 2: 3 requests to /pooling, every text sent once.
    let bodies = seen.bodies.lock().unwrap();
    let mut sent: Vec<usize> = bodies.iter().map(|b| texts(b).len()).collect();
    sent.sort();
    assert_eq!(sent, [1, 2, 2]);
    assert!(bodies
        .iter()
        .all(|b| b["model"] == "rm" && b["use_activation"] == false));
    assert_eq!(*seen.paths.lock().unwrap(), ["/pooling"; 3]);
}

#[test]
fn the_three_output_shapes_and_classify() {
    let e = RewardModelEndpoint::Pooling;
    assert_eq!(score_of(&json!({"data": 1.5}), e, 0), Ok(1.5));
    assert_eq!(score_of(&json!({"data": [0.25, -2.0]}), e, 1), Ok(-2.0));
    // Per-token pooling (a *ForRewardModel): the last token's vector.
    assert_eq!(
        score_of(&json!({"data": [[9.0], [8.0], [0.75]]}), e, 0),
        Ok(0.75)
    );
    let c = RewardModelEndpoint::Classify;
    assert_eq!(score_of(&json!({"probs": [0.2, 0.8]}), c, 1), Ok(0.8));
    for (entry, label, want) in [
        (json!({"probs": [0.2]}), 0, "without `data`"),
        (json!({"data": [0.2]}), 3, "label = 3"),
        (json!({"data": ["x"]}), 0, "not a finite number"),
        (json!({"data": null}), 0, "not a finite number"),
        (json!({"data": 2.0}), 1, "not a finite number"),
    ] {
        let e = score_of(&entry, e, label).unwrap_err();
        assert!(e.contains(want), "{entry}: {e}");
    }
    // Through /classify, one request per completion with chat input.
    let (url, seen) = server(5, |_, b| {
        let m = &b["messages"];
        assert_eq!(m[0]["role"], "user");
        assert_eq!(m[1]["role"], "assistant");
        let p = if m[1]["content"] == "4" { 0.9 } else { 0.1 };
        let body = json!({"data": [{"index": 0, "probs": [1.0 - p, p]}]});
        (200, body.to_string(), 0)
    });
    let v = rm(
        &url,
        json!({"endpoint": "classify", "input": "chat", "label": 1, "correct_above": 0.5}),
    )
    .build()
    .unwrap();
    let c = cols();
    let got = v.score_batch(&samples(&c)).unwrap();
    assert_eq!(
        got.iter().map(|s| s.reward).collect::<Vec<_>>(),
        [0.9, 0.1, 0.1, 0.1, 0.1]
    );
    assert_eq!(
        got.iter().map(|s| s.correct).collect::<Vec<_>>(),
        [true, false, false, false, false]
    );
    assert_eq!(*seen.paths.lock().unwrap(), ["/classify"; 5]);
    assert_eq!(
        seen.bodies.lock().unwrap()[0]["messages"][0]["content"],
        "2+2="
    );
}

#[test]
fn malformed_answers_are_retried_then_fail_naming_the_server_and_refusals_are_not_retried() {
    let c = cols();
    let one = &samples(&c)[..1];
    let fails = |reply: &'static str, want: &str, requests: usize| {
        let (url, seen) = server(requests, move |_, _| {
            let status = if reply.starts_with('{') { 200 } else { 404 };
            (status, reply.to_string(), 0)
        });
        let e = rm(&url, json!({}))
            .build()
            .unwrap()
            .score_batch(one)
            .unwrap_err()
            .to_string();
        assert!(e.contains(want) && e.contains(&url), "{e}");
        std::thread::sleep(std::time::Duration::from_millis(50));
        assert_eq!(seen.bodies.lock().unwrap().len(), requests, "{e}");
    };
    // Two attempts each (retries = 1).
    fails(r#"{"data": []}"#, "0 scores for 1 inputs", 2);
    fails(
        r#"{"data": [{"index": 0, "data": ["NaN"]}]}"#,
        "not a finite number",
        2,
    );
    fails(r#"{"object": "error"}"#, "without a `data` list", 2);
    fails(
        r#"{"data": [{"index": 5, "data": [1.0]}]}"#,
        "index 5 for 1 inputs",
        2,
    );
    // A refusal (a generative model has no /pooling): one attempt.
    fails("Not Found", "HTTP 404", 1);
    // A wrong answer, then a right one: the retry succeeds.
    let (url, _) = server(2, |n, _| {
        let d = if n == 0 {
            json!([])
        } else {
            json!([{"index": 0, "data": [0.5]}])
        };
        (200, json!({ "data": d }).to_string(), 0)
    });
    let v = rm(&url, json!({})).build().unwrap();
    assert_eq!(v.score_batch(one).unwrap()[0].reward, 0.5);
}

#[test]
fn config_checks_and_kind_reward_model() {
    let v: VerifierConfig = toml_like(json!({
        "kind": "reward_model", "server": "http://127.0.0.1:1", "model": "rm",
    }));
    assert_eq!(v.name(), "reward_model");
    assert!(v.build().is_ok());
    let bad = |extra: Value, want: &str| {
        let e = rm("http://127.0.0.1:1", extra)
            .build()
            .err()
            .unwrap()
            .to_string();
        assert!(e.contains(want) && e.contains("reward model at"), "{e}");
    };
    bad(json!({"server": "https://x"}), "plain HTTP");
    bad(json!({"in_flight": 0}), "in_flight must be in 1..=256");
    bad(
        json!({"retries": 101}),
        "retries = 101 is out of range: at most 100",
    );
    bad(
        json!({"batch_size": 100000}),
        "batch_size must be in 1..=4096",
    );
    bad(json!({"timeout_s": 1e300}), "timeout_s");
    bad(json!({"template": "{completion"}), "template");
    let e = serde_json::from_value::<VerifierConfig>(json!({
        "kind": "reward_model", "server": "http://x", "model": "m", "temprature": 1.0,
    }))
    .unwrap_err()
    .to_string();
    assert!(e.contains("temprature"), "{e}");
}

fn toml_like(v: Value) -> VerifierConfig {
    serde_json::from_value(v).unwrap()
}

#[test]
fn a_redirect_is_refused_and_429_is_retried() {
    let c = cols();
    let s = samples(&c);
    let (url, seen) = server_with_headers(2, |_, _| {
        let h = vec![("Location".to_string(), "http://127.0.0.1:9/x".to_string())];
        (307, h, String::new(), 0)
    });
    let e = rm(&url, json!({"batch_size": 8}))
        .build()
        .unwrap()
        .score_batch(&s)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("HTTP 307") && e.contains(&url) && e.contains("http://127.0.0.1:9/x"),
        "{e}"
    );
    std::thread::sleep(std::time::Duration::from_millis(100));
    assert_eq!(seen.bodies.lock().unwrap().len(), 1);
    let (url, seen) = server_with_headers(2, |n, body| {
        if n == 0 {
            let h = vec![("Retry-After".to_string(), "1".to_string())];
            (429, h, String::new(), 0)
        } else {
            let data: Vec<Value> = texts(body)
                .iter()
                .enumerate()
                .map(|(i, t)| json!({"index": i, "data": [fake(t)]}))
                .collect();
            (200, Vec::new(), json!({ "data": data }).to_string(), 0)
        }
    });
    let t0 = std::time::Instant::now();
    let scores = rm(&url, json!({"batch_size": 8}))
        .build()
        .unwrap()
        .score_batch(&s)
        .unwrap();
    assert!(t0.elapsed() >= std::time::Duration::from_secs(1));
    // The default text is the prompt followed by the completion.
    let want: Vec<f64> = COMPLETIONS
        .iter()
        .map(|a| fake(&format!("2+2={a}")))
        .collect();
    assert_eq!(scores.iter().map(|s| s.reward).collect::<Vec<_>>(), want);
    assert_eq!(seen.bodies.lock().unwrap().len(), 2);
}
