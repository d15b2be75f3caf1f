//! The prefix-cache salt (`rollout.cache_salt = "version"`, docs/vllm.md "Prefix caching"), against
//! a fake server: with a run tag every `/v1/completions` request (a group's, an episode's later
//! turn, the refresh's check and the post-sampling fingerprint) carries `cache_salt` =
//! `TAG-vVERSION` of the version the client holds, which is the version stamped on the
//! completions; a weight push changes it; without a tag no salt is sent; a tag vLLM would refuse
//! is refused up front.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::common::{check_for, completion_answer, tensors, FakeServer, Reply};
use rlvr_model::Model;
use rlvr_rollout::{SamplingParams, TurnRow};
use rlvr_vllm::client::{cache_salt, MAX_SALT_TAG};
use rlvr_vllm::{ClientConfig, VllmClient, VllmError};
use serde_json::{json, Value};

const TAG: &str = "rlvr-0123456789abcdef";

fn model(seed: u64) -> Model {
    crate::common::tiny_qwen2(true, seed)
}

fn client(url: &str, tag: Option<&str>) -> Result<VllmClient, VllmError> {
    VllmClient::new(ClientConfig {
        servers: vec![url.to_string()],
        served_model_name: "policy".into(),
        retries: 0,
        backoff: Duration::from_millis(10),
        timeout: Duration::from_secs(5),
        in_flight: 2,
        cache_salt: tag.map(String::from),
        ..Default::default()
    })
}

/// A fake vLLM: scoring requests (`prompt_logprobs`) get `served` as the check completion's
/// log-probs; sampling requests get `n` choices [p, 9] with log-probs [-0.5, -0.25], p the
/// prompt's length; the weight-refresh routes answer 200.
fn vllm(served: Arc<Mutex<Vec<f32>>>) -> FakeServer {
    FakeServer::start(move |line, body| match line {
        "POST /v1/completions" if body.get("prompt_logprobs").is_some() => {
            let ids: Vec<u32> = serde_json::from_value(body["prompt"].clone()).unwrap();
            let served = served.lock().unwrap();
            let mut pl = vec![Value::Null];
            let mut lps = vec![-1.0f32; ids.len() - 1 - served.len()];
            lps.extend(served.iter());
            for (id, lp) in ids[1..].iter().zip(&lps) {
                pl.push(
                    json!({ id.to_string(): {"logprob": lp, "rank": 1, "decoded_token": "x"} }),
                );
            }
            let answer = json!({"choices": [{"index": 0, "text": "", "prompt_logprobs": pl,
                                             "finish_reason": "length"}]});
            Reply::Status(200, answer.to_string())
        }
        "POST /v1/completions" => {
            let p = body["prompt"].as_array().unwrap().len() as u32;
            let n = body["n"].as_u64().unwrap() as usize;
            let ids = vec![vec![p, 9]; n];
            let lps = vec![vec![-0.5, -0.25]; n];
            let finish = vec![("stop", json!(9)); n];
            Reply::Status(200, completion_answer(&ids, &lps, &finish))
        }
        _ => Reply::Status(200, "{}".into()),
    })
}

fn params() -> SamplingParams {
    SamplingParams {
        group_size: 2,
        max_new_tokens: 4,
        stop_ids: vec![9],
        ..Default::default()
    }
}

fn turn_rows() -> Vec<TurnRow> {
    vec![
        TurnRow {
            context: vec![1, 2, 3, 8, 9, 20, 21],
            prompt_index: 0,
            sample_index: 1,
            turn: 2,
        },
        TurnRow {
            context: vec![4, 5, 8, 9, 22],
            prompt_index: 1,
            sample_index: 0,
            turn: 2,
        },
    ]
}

/// The `cache_salt` of every `/v1/completions` request seen since `from` (`None` for a request
/// without one), with whether it was a scoring request.
fn salts_since(fake: &FakeServer, from: usize) -> Vec<(bool, Option<String>)> {
    fake.seen.lock().unwrap()[from..]
        .iter()
        .filter(|s| s.line == "POST /v1/completions")
        .map(|s| {
            (
                s.body.get("prompt_logprobs").is_some(),
                s.body
                    .get("cache_salt")
                    .map(|v| v.as_str().unwrap().to_string()),
            )
        })
        .collect()
}

#[test]
fn every_request_carries_the_salt_of_the_version_it_was_sampled_under() {
    let weights = tempfile::tempdir().unwrap();
    let (v3, v4) = (model(3), model(4));
    let served = Arc::new(Mutex::new(check_for(&v3).expected));
    let fake = vllm(served.clone());
    let mut c = client(&fake.url, Some(TAG)).unwrap();
    assert_eq!(c.cache_salt(), Some(format!("{TAG}-v0")));
    // Version 3 pushed: the refresh's check is scored under version 3's salt.
    c.refresh(
        weights.path(),
        3,
        &tensors(&v3),
        v3.config(),
        &check_for(&v3),
    )
    .unwrap();
    let salt3 = format!("{TAG}-v3");
    assert_eq!(c.cache_salt().as_deref(), Some(salt3.as_str()));
    assert_eq!(salts_since(&fake, 0), [(true, Some(salt3.clone()))]);

    // Turn 1 (one request per group) and later turns (one per episode), then the fingerprint.
    let mark = fake.seen.lock().unwrap().len();
    let groups = c
        .sample(&[vec![1, 2, 3], vec![4, 5]], 0, &params(), 7)
        .unwrap();
    let turns = c.sample_turns(&turn_rows(), &params(), 7).unwrap();
    assert_eq!(groups.len(), 4);
    assert_eq!(turns.len(), 2);
    assert!(groups.iter().chain(&turns).all(|x| x.version == 3));
    let seen = salts_since(&fake, mark);
    // 2 groups + fingerprint, 2 turns + fingerprint.
    assert_eq!(seen.len(), 6, "{seen:?}");
    assert_eq!(seen.iter().filter(|(scoring, _)| !scoring).count(), 4);
    assert!(
        seen.iter()
            .all(|(_, s)| s.as_deref() == Some(salt3.as_str())),
        "{seen:?}"
    );

    // A weight push to version 4: its check and every later request carry version 4's salt.
    *served.lock().unwrap() = check_for(&v4).expected;
    let mark = fake.seen.lock().unwrap().len();
    c.refresh(
        weights.path(),
        4,
        &tensors(&v4),
        v4.config(),
        &check_for(&v4),
    )
    .unwrap();
    let groups = c.sample(&[vec![1, 2, 3]], 1, &params(), 7).unwrap();
    let turns = c.sample_turns(&turn_rows(), &params(), 7).unwrap();
    assert!(groups.iter().chain(&turns).all(|x| x.version == 4));
    let salt4 = format!("{TAG}-v4");
    assert_eq!(cache_salt(TAG, 4), salt4);
    let seen = salts_since(&fake, mark);
    // The refresh's check, 1 group + fingerprint, 2 turns + fingerprint.
    assert_eq!(seen.len(), 6, "{seen:?}");
    assert!(
        seen.iter()
            .all(|(_, s)| s.as_deref() == Some(salt4.as_str())),
        "{seen:?}"
    );
    assert_ne!(salt3, salt4);
}

#[test]
fn without_a_tag_no_request_carries_a_salt() {
    let fake = vllm(Arc::new(Mutex::new(Vec::new())));
    let mut c = client(&fake.url, None).unwrap();
    c.set_version(5);
    assert_eq!(c.cache_salt(), None);
    c.sample(&[vec![1, 2, 3]], 0, &params(), 7).unwrap();
    c.sample_turns(&turn_rows(), &params(), 7).unwrap();
    let seen = salts_since(&fake, 0);
    assert_eq!(seen.len(), 3);
    assert!(seen.iter().all(|(_, s)| s.is_none()), "{seen:?}");
}

#[test]
fn a_tag_vllm_would_refuse_is_refused_naming_it() {
    let long = "x".repeat(MAX_SALT_TAG + 1);
    for bad in ["", "run/a", "a@b", "back\\slash", "nul\0", long.as_str()] {
        let Err(e) = client("http://127.0.0.1:9", Some(bad)) else {
            panic!("{bad:?} was accepted")
        };
        assert!(
            matches!(&e, VllmError::Config(m) if m.contains("prefix-cache salt") && m.contains(&format!("{bad:?}"))),
            "{bad:?}: {e}"
        );
    }
    // The longest tag with the largest version stays within vLLM's 128 characters.
    let longest = "x".repeat(MAX_SALT_TAG);
    assert!(client("http://127.0.0.1:9", Some(&longest)).is_ok());
    assert!(cache_salt(&longest, u64::MAX).len() <= 128);
}
