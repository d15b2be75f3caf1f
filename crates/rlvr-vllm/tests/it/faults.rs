//! The client against a fake vLLM server: request fields, records, seeds, stop strings, and the
//! faults a real server cannot be made to send (down, slow, 500, truncated JSON, a token count
//! that differs from the log-prob count, 4xx), plus several servers and partial failures.

use std::time::Duration;

use crate::common::{completion_answer, FakeServer, Reply};
use rlvr_rollout::{Detokenize, FinishReason, SamplingParams};
use rlvr_vllm::completion::request_seed;
use rlvr_vllm::{ClientConfig, VllmClient, VllmError};
use serde_json::{json, Value};

fn client(urls: &[&String], retries: usize) -> VllmClient {
    VllmClient::new(ClientConfig {
        servers: urls.iter().map(|u| u.to_string()).collect(),
        served_model_name: "policy".into(),
        retries,
        backoff: Duration::from_millis(10),
        timeout: Duration::from_millis(1500),
        in_flight: 2,
        ..Default::default()
    })
    .unwrap()
}

fn params(k: usize) -> SamplingParams {
    SamplingParams {
        group_size: k,
        temperature: 0.7,
        max_new_tokens: 4,
        stop_ids: vec![9],
        ..Default::default()
    }
}

fn good_group() -> String {
    completion_answer(
        &[vec![5, 6, 9], vec![7, 7, 7, 7]],
        &[vec![-0.5, -1.0, -0.25], vec![-1.5, -0.1, -0.2, -0.3]],
        &[("stop", json!(9)), ("length", Value::Null)],
    )
}

#[test]
fn a_group_is_one_request_and_comes_back_as_native_records() {
    let fake = FakeServer::scripted(vec![Reply::Status(200, good_group())]);
    let mut c = client(&[&fake.url], 0);
    c.set_version(3);
    let out = c.sample(&[vec![1, 2, 3]], 10, &params(2), 42).unwrap();
    assert_eq!(out.len(), 2);
    assert_eq!(
        (out[0].prompt_index, out[0].sample_index, out[0].version),
        (10, 0, 3)
    );
    assert_eq!(out[0].token_ids, vec![5, 6, 9]);
    assert_eq!(out[0].behaviour_logprobs, vec![-0.5, -1.0, -0.25]);
    assert_eq!(out[0].finish_reason, FinishReason::Eos);
    assert_eq!(out[1].sample_index, 1);
    assert_eq!(out[1].finish_reason, FinishReason::Length);
    let seen = fake.seen.lock().unwrap().clone();
    assert_eq!(seen.len(), 1);
    assert_eq!(seen[0].line, "POST /v1/completions");
    let b = &seen[0].body;
    assert_eq!(b["model"], "policy");
    assert_eq!(b["prompt"], json!([1, 2, 3]));
    assert_eq!(b["n"], 2);
    assert_eq!(b["logprobs"], 0);
    assert_eq!(b["return_token_ids"], true);
    assert_eq!(b["temperature"], 0.7);
    assert_eq!(b["top_p"], 1.0);
    assert_eq!(b["max_tokens"], 4);
    assert_eq!(b["min_tokens"], 0);
    assert_eq!(b["stop_token_ids"], json!([9]));
    assert_eq!(b["ignore_eos"], true);
    assert_eq!(b["seed"], request_seed(42, 10, 2));
    assert!(b.get("top_k").is_none() && b.get("stop").is_none());
}

#[test]
fn request_seed_ranges_never_overlap_and_are_reproducible() {
    let k = 8;
    let mut seeds: Vec<u64> = (0..1000).map(|p| request_seed(5, p, k)).collect();
    assert_eq!(
        seeds,
        (0..1000).map(|p| request_seed(5, p, k)).collect::<Vec<_>>()
    );
    assert!(seeds.iter().all(|&s| s < 1 << 63));
    seeds.sort_unstable();
    // vLLM seeds sample j with seed + j: each request owns [seed, seed + K).
    assert!(seeds.windows(2).all(|w| w[1] - w[0] >= k as u64));
    assert_ne!(request_seed(5, 0, k), request_seed(6, 0, k));
}

#[test]
fn a_500_is_retried_then_succeeds() {
    let fake = FakeServer::scripted(vec![
        Reply::Status(500, "{\"error\": \"engine hiccup\"}".into()),
        Reply::Status(200, good_group()),
    ]);
    let out = client(&[&fake.url], 2)
        .sample(&[vec![1]], 0, &params(2), 0)
        .unwrap();
    assert_eq!(out.len(), 2);
    assert_eq!(fake.lines().len(), 2);
}

fn server_error(e: VllmError) -> (String, usize, String) {
    match e {
        VllmError::Server {
            server,
            attempts,
            answer,
            ..
        } => (server, attempts, answer),
        other => panic!("expected a server error, got {other}"),
    }
}

#[test]
fn a_persistent_500_names_the_server_and_its_answer() {
    let fake = FakeServer::scripted(vec![Reply::Status(
        500,
        "{\"error\": \"engine dead\"}".into(),
    )]);
    let err = client(&[&fake.url], 2)
        .sample(&[vec![1]], 0, &params(2), 0)
        .unwrap_err();
    let text = err.to_string();
    let (server, attempts, answer) = server_error(err);
    assert_eq!(server, fake.url);
    assert_eq!(attempts, 3);
    assert_eq!(fake.lines().len(), 3);
    assert!(
        answer.contains("HTTP 500") && answer.contains("engine dead"),
        "{answer}"
    );
    assert!(
        text.contains(&fake.url) && text.contains("POST /v1/completions"),
        "{text}"
    );
}

#[test]
fn truncated_json_is_retried_then_reported() {
    let body = good_group();
    let fake = FakeServer::scripted(vec![Reply::Truncated(body[..body.len() / 2].to_string())]);
    let (_, attempts, answer) = server_error(
        client(&[&fake.url], 1)
            .sample(&[vec![1]], 0, &params(2), 0)
            .unwrap_err(),
    );
    assert_eq!(attempts, 2);
    assert!(
        answer.contains("body unreadable") || answer.contains("invalid JSON"),
        "{answer}"
    );
}

/// An answer above the body limit is refused with a message naming the limit (here 1 MiB; the
/// default is 256 MiB), never read whole or parsed.
#[test]
fn an_answer_above_the_body_limit_is_refused_naming_the_limit() {
    let n = 200_000;
    let big = completion_answer(
        &[vec![5; n], vec![7; n]],
        &[vec![-0.5; n], vec![-1.5; n]],
        &[("length", Value::Null), ("length", Value::Null)],
    );
    assert!(big.len() > 2 << 20, "{}", big.len());
    let fake = FakeServer::scripted(vec![Reply::Status(200, big)]);
    let c = VllmClient::new(ClientConfig {
        servers: vec![fake.url.clone()],
        served_model_name: "policy".into(),
        retries: 0,
        timeout: Duration::from_secs(10),
        body_limit: 1 << 20,
        ..Default::default()
    })
    .unwrap();
    let mut p = params(2);
    p.max_new_tokens = n;
    let (_, attempts, answer) = server_error(c.sample(&[vec![1]], 0, &p, 0).unwrap_err());
    assert_eq!(attempts, 1);
    assert!(
        answer.contains("larger than the limit of 1048576 bytes (1 MiB)"),
        "{answer}"
    );
}

#[test]
fn a_token_count_that_differs_from_its_logprob_count_is_a_fault() {
    let bad = completion_answer(
        &[vec![5, 6, 9], vec![7]],
        &[vec![-0.5, -1.0], vec![-1.5]],
        &[("stop", json!(9)), ("length", Value::Null)],
    );
    let fake = FakeServer::scripted(vec![Reply::Status(200, bad)]);
    let (_, attempts, answer) = server_error(
        client(&[&fake.url], 1)
            .sample(&[vec![1]], 0, &params(2), 0)
            .unwrap_err(),
    );
    assert_eq!(attempts, 2);
    assert!(
        answer.contains("choice 0 has 3 token ids but 2 log-probs"),
        "{answer}"
    );
}

#[test]
fn too_few_choices_is_a_fault_and_nothing_partial_is_returned() {
    let one = completion_answer(&[vec![5]], &[vec![-0.5]], &[("length", Value::Null)]);
    let fake = FakeServer::scripted(vec![Reply::Status(200, one)]);
    let (_, _, answer) = server_error(
        client(&[&fake.url], 0)
            .sample(&[vec![1]], 0, &params(2), 0)
            .unwrap_err(),
    );
    assert!(answer.contains("1 choices for n = 2"), "{answer}");
}

#[test]
fn a_server_that_is_down_is_reported_as_such() {
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let url = format!("http://127.0.0.1:{port}");
    let (server, attempts, answer) = server_error(
        client(&[&url], 1)
            .sample(&[vec![1]], 0, &params(2), 0)
            .unwrap_err(),
    );
    assert_eq!((server, attempts), (url, 2));
    assert!(answer.contains("transport error"), "{answer}");
}

#[test]
fn a_slow_server_times_out_and_a_hangup_is_retried() {
    let fake = FakeServer::scripted(vec![Reply::Slow(Duration::from_secs(4), good_group())]);
    let (_, _, answer) = server_error(
        client(&[&fake.url], 0)
            .sample(&[vec![1]], 0, &params(2), 0)
            .unwrap_err(),
    );
    assert!(answer.contains("timeout"), "{answer}");
    let fake = FakeServer::scripted(vec![Reply::Hangup, Reply::Status(200, good_group())]);
    assert_eq!(
        client(&[&fake.url], 1)
            .sample(&[vec![1]], 0, &params(2), 0)
            .unwrap()
            .len(),
        2
    );
}

#[test]
fn a_redirect_is_refused_naming_its_location_and_never_followed() {
    // Followed, the POST would come back as a body-less GET that this server answers with a
    // good group: the client must stop at the 302 instead, with one request sent.
    let fake = FakeServer::start(|line, _| {
        if line.starts_with("GET") {
            Reply::Status(200, good_group())
        } else {
            Reply::Redirect(302, "http://127.0.0.1:9/elsewhere".into())
        }
    });
    let err = client(&[&fake.url], 3)
        .sample(&[vec![1]], 0, &params(2), 0)
        .unwrap_err();
    assert!(
        matches!(err, VllmError::Refused { status: 302, .. }),
        "{err}"
    );
    let msg = err.to_string();
    assert!(msg.contains("http://127.0.0.1:9/elsewhere"), "{msg}");
    assert!(msg.contains("follows no redirects"), "{msg}");
    assert_eq!(fake.lines(), vec!["POST /v1/completions".to_string()]);
}

#[test]
fn a_4xx_is_not_retried() {
    let fake = FakeServer::scripted(vec![Reply::Status(400, "{\"error\": \"bad n\"}".into())]);
    let err = client(&[&fake.url], 3)
        .sample(&[vec![1]], 0, &params(2), 0)
        .unwrap_err();
    assert!(
        matches!(err, VllmError::Refused { status: 400, .. }),
        "{err}"
    );
    assert!(err.to_string().contains("bad n"));
    assert_eq!(fake.lines().len(), 1);
}

#[test]
fn one_failing_group_fails_the_whole_call() {
    let fake = FakeServer::start(|_, body| {
        if body["prompt"] == json!([4]) {
            Reply::Status(503, "overloaded".into())
        } else {
            Reply::Status(200, good_group())
        }
    });
    let prompts = vec![vec![1], vec![2], vec![4], vec![3]];
    let (_, _, answer) = server_error(
        client(&[&fake.url], 1)
            .sample(&prompts, 0, &params(2), 0)
            .unwrap_err(),
    );
    assert!(answer.contains("HTTP 503"), "{answer}");
}

#[test]
fn groups_are_spread_over_servers_and_come_back_in_order() {
    let echo = |_: &str, body: &Value| {
        let p = body["prompt"][0].as_u64().unwrap() as u32;
        Reply::Slow(
            Duration::from_millis(50),
            completion_answer(
                &[vec![p], vec![p + 100]],
                &[vec![-0.1], vec![-0.2]],
                &[("length", Value::Null), ("length", Value::Null)],
            ),
        )
    };
    let (a, b) = (FakeServer::start(echo), FakeServer::start(echo));
    let prompts: Vec<Vec<u32>> = (0..8).map(|p| vec![p]).collect();
    let out = client(&[&a.url, &b.url], 0)
        .sample(&prompts, 0, &params(2), 1)
        .unwrap();
    assert_eq!(out.len(), 16);
    for (i, c) in out.iter().enumerate() {
        assert_eq!((c.prompt_index, c.sample_index), (i / 2, i % 2));
        assert_eq!(c.token_ids, vec![(i / 2) as u32 + 100 * (i % 2) as u32]);
    }
    assert!(!a.lines().is_empty() && !b.lines().is_empty());
    assert_eq!(a.lines().len() + b.lines().len(), 8);
}

/// One character per id: 0 → 'a', 1 → 'b', ...
struct Letters;
impl Detokenize for Letters {
    fn detokenize(&self, ids: &[u32]) -> Result<String, String> {
        Ok(ids.iter().map(|&i| (b'a' + i as u8) as char).collect())
    }
}

#[test]
fn stop_strings_keep_the_completing_token_and_ids_aligned_with_logprobs() {
    // "a b c d e": the stop string "cd" is completed by token 3 ('d'); the fake server returned
    // one token past it (as a server whose stop handling differs could): the client cuts ids and
    // log-probs together after 'd' and keeps the stop text in the completion, as natively.
    let answer = completion_answer(
        &[vec![0, 1, 2, 3, 4], vec![0, 0]],
        &[vec![-0.1, -0.2, -0.3, -0.4, -0.5], vec![-0.6, -0.7]],
        &[("stop", json!("cd")), ("length", Value::Null)],
    );
    let fake = FakeServer::scripted(vec![Reply::Status(200, answer)]);
    let p = SamplingParams {
        stop_strings: vec!["cd".into()],
        ..params(2)
    };
    let p = SamplingParams {
        max_new_tokens: 5,
        ..p
    };
    let out = client(&[&fake.url], 0)
        .with_tokenizer(Letters)
        .sample(&[vec![1]], 0, &p, 0)
        .unwrap();
    assert_eq!(out[0].token_ids, vec![0, 1, 2, 3]);
    assert_eq!(out[0].behaviour_logprobs, vec![-0.1, -0.2, -0.3, -0.4]);
    assert_eq!(out[0].finish_reason, FinishReason::StopString);
    assert_eq!(out[1].token_ids.len(), out[1].behaviour_logprobs.len());
    assert_eq!(out[1].finish_reason, FinishReason::Length);
    let body = fake.seen.lock().unwrap()[0].body.clone();
    assert_eq!(body["stop"], json!(["cd"]));
    assert_eq!(body["include_stop_str_in_output"], true);
}

#[test]
fn truncated_sampling_is_refused_unless_accepted() {
    let fake = FakeServer::scripted(vec![Reply::Status(200, good_group())]);
    for p in [
        SamplingParams {
            top_p: 0.9,
            ..params(2)
        },
        SamplingParams {
            top_k: Some(20),
            ..params(2)
        },
        // vLLM masks the stop ids before its log-softmax while min_tokens is pending.
        SamplingParams {
            min_new_tokens: 1,
            ..params(2)
        },
    ] {
        let err = client(&[&fake.url], 0)
            .sample(&[vec![1]], 0, &p, 0)
            .unwrap_err();
        assert!(
            err.to_string().contains("accept_renormalised_logprobs"),
            "{err}"
        );
    }
    assert!(fake.lines().is_empty());
    // Without stop ids min_new_tokens masks nothing: accepted.
    let fixed = SamplingParams {
        min_new_tokens: 4,
        stop_ids: vec![],
        ..params(2)
    };
    assert_eq!(
        client(&[&fake.url], 0)
            .sample(&[vec![1]], 0, &fixed, 0)
            .unwrap()
            .len(),
        2
    );
    fake.seen.lock().unwrap().clear();
    let accepting = VllmClient::new(ClientConfig {
        servers: vec![fake.url.clone()],
        served_model_name: "policy".into(),
        accept_renormalised_logprobs: true,
        ..Default::default()
    })
    .unwrap();
    let p = SamplingParams {
        top_k: Some(20),
        top_p: 0.9,
        ..params(2)
    };
    assert_eq!(accepting.sample(&[vec![1]], 0, &p, 0).unwrap().len(), 2);
    let body = fake.seen.lock().unwrap()[0].body.clone();
    assert_eq!(
        (body["top_k"].clone(), body["top_p"].clone()),
        (json!(20), json!(0.9))
    );
}

#[test]
fn bad_settings_are_refused_before_any_request() {
    let bad = |c: ClientConfig| {
        VllmClient::new(c)
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default()
    };
    let base = ClientConfig {
        servers: vec!["http://127.0.0.1:1".into()],
        served_model_name: "m".into(),
        ..Default::default()
    };
    assert!(bad(ClientConfig {
        servers: vec![],
        ..base.clone()
    })
    .contains("rollout.servers"));
    assert!(bad(ClientConfig {
        served_model_name: String::new(),
        ..base.clone()
    })
    .contains("served_model_name"));
    assert!(bad(ClientConfig {
        servers: vec!["https://x:1".into()],
        ..base.clone()
    })
    .contains("http://"));
    assert!(bad(ClientConfig {
        in_flight: 0,
        ..base
    })
    .contains("in flight"));
}

#[test]
fn a_hung_server_stops_after_one_timeout_and_a_slow_one_is_retried() {
    // Accepts every connection and never answers (its /health neither): one timeout, then the
    // /health probe, then the error. Before, every retry waited its own timeout (with the 600 s
    // default and 3 retries, 40 minutes).
    let hung = FakeServer::start(|_, _| Reply::Slow(Duration::from_secs(120), String::new()));
    let t0 = std::time::Instant::now();
    let (server, attempts, answer) = server_error(
        client(&[&hung.url], 3)
            .sample(&[vec![1]], 0, &params(2), 0)
            .unwrap_err(),
    );
    assert_eq!((server, attempts), (hung.url.clone(), 1), "{answer}");
    assert!(
        answer.contains(
            "no answer within 1.5 s (timeout); then GET /health did not answer within 1.5 s either"
        ),
        "{answer}"
    );
    assert!(t0.elapsed() < Duration::from_secs(10), "{:?}", t0.elapsed());
    assert_eq!(
        hung.lines(),
        ["POST /v1/completions", "GET /health"],
        "not sent again"
    );
    // Slow on completions but alive (/health answers): the request is sent again, as before.
    let slow = FakeServer::start(|line, _| {
        if line.starts_with("GET /health") {
            Reply::Status(200, String::new())
        } else {
            Reply::Slow(Duration::from_secs(120), String::new())
        }
    });
    let (_, attempts, answer) = server_error(
        client(&[&slow.url], 1)
            .sample(&[vec![1]], 0, &params(2), 0)
            .unwrap_err(),
    );
    assert_eq!(attempts, 2, "{answer}");
    assert!(answer.contains("timeout"), "{answer}");
    assert_eq!(
        slow.lines(),
        [
            "POST /v1/completions",
            "GET /health",
            "POST /v1/completions"
        ]
    );
}

#[test]
fn the_default_request_timeout_stops_a_hung_server_within_a_few_minutes() {
    let c = ClientConfig::default();
    assert_eq!(c.timeout, Duration::from_secs(180));
    // One timeout plus the /health probe: under 3.5 minutes (was (3 + 1) × 600 s).
    let worst = c.timeout + rlvr_vllm::http::HEALTH_PROBE_TIMEOUT;
    assert!(worst <= Duration::from_secs(210), "{worst:?}");
}
