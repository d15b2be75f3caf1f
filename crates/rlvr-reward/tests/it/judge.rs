//! The LLM judge against a fake OpenAI-compatible server on 127.0.0.1: the template and request,
//! both parse rules, parse failures under both policies, retries on timeouts and HTTP 5xx, no retry
//! on a refusal, garbage answers, and the bound on requests in flight.

use crate::common::{keep_alive_server, server, server_with_headers};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use rlvr_reward::combine::VerifierConfig;
use rlvr_reward::judge::{parse_answer, JudgeConfig, JudgeParse};
use rlvr_reward::{Sample, Verifier};

fn chat(answer: &str) -> String {
    serde_json::json!({"choices": [{"message": {"role": "assistant", "content": answer}}]})
        .to_string()
}

fn judge(url: &str, extra: serde_json::Value) -> JudgeConfig {
    let mut v = serde_json::json!({
        "server": url, "model": "judge-m", "seed": 11, "retries": 1, "timeout_s": 5.0,
        "template": "Q: {question} ({points} pts)\nA: {completion}\nRef: {reference} #{index} {{ok}}",
        "parse": {"rule": "labels", "labels": {"yes": 1.0, "no": 0.0, "partly": 0.5}},
    });
    for (k, x) in extra.as_object().unwrap() {
        v[k] = x.clone();
    }
    serde_json::from_value(v).unwrap()
}

fn cols() -> Vec<(String, String)> {
    vec![
        ("question".into(), "2+2".into()),
        ("points".into(), "3".into()),
    ]
}

fn samples(c: &[(String, String)]) -> Vec<Sample<'_>> {
    ["4", "5", "four"]
        .iter()
        .enumerate()
        .map(|(i, completion)| Sample {
            prompt: "p",
            completion,
            reference: "4",
            columns: c,
            index: Some(i),
        })
        .collect()
}

fn content(body: &serde_json::Value) -> String {
    body["messages"][0]["content"].as_str().unwrap().to_string()
}

#[test]
fn labels_are_read_from_the_answers_and_the_request_is_as_configured() {
    let (url, seen) = server(3, |_, b| {
        let a = if content(b).contains("A: 4\n") {
            "Yes."
        } else if content(b).contains("A: four") {
            " partly"
        } else {
            "NO"
        };
        (200, chat(a), 0)
    });
    let v = judge(&url, serde_json::json!({})).build().unwrap();
    let c = cols();
    let got = v.score_batch(&samples(&c)).unwrap();
    assert_eq!(
        got.iter().map(|s| s.reward).collect::<Vec<_>>(),
        [1.0, 0.0, 0.5]
    );
    assert_eq!(
        got.iter().map(|s| s.correct).collect::<Vec<_>>(),
        [true, false, true]
    );
    assert_eq!(got[0].extracted.as_deref(), Some("Yes."));
    assert_eq!(v.parse_failures(), 0);
    let bodies = seen.bodies.lock().unwrap();
    let first = bodies
        .iter()
        .find(|b| content(b).contains("#0"))
        .expect("item 0 was sent");
    assert_eq!(content(first), "Q: 2+2 (3 pts)\nA: 4\nRef: 4 #0 {ok}");
    assert_eq!(first["model"], "judge-m");
    assert_eq!(first["seed"], 11);
    assert_eq!(first["max_tokens"], 8);
    assert_eq!(first["temperature"], 0.0);
}

#[test]
fn numbers_in_range_parse_and_failures_follow_the_policy() {
    let reply = |_: usize, b: &serde_json::Value| {
        let p = b["prompt"].as_str().unwrap();
        let a = match p {
            _ if p.contains("A: 4\n") => " 7/10",
            _ if p.contains("A: 5\n") => "score: 11",
            _ => "I cannot tell",
        };
        (
            200,
            serde_json::json!({"choices": [{"text": a}]}).to_string(),
            0,
        )
    };
    let extra = serde_json::json!({"endpoint": "completions",
        "parse": {"rule": "number", "min": 0.0, "max": 10.0}, "extra_body": {"stop": ["\n"]}});
    let (url, seen) = server(3, reply);
    let v = judge(&url, extra.clone()).build().unwrap();
    let c = cols();
    let got = v.score_batch(&samples(&c)).unwrap();
    // 11 is out of range and "I cannot tell" has no number: two counted failures scoring 0.
    assert_eq!(
        got.iter().map(|s| s.reward).collect::<Vec<_>>(),
        [7.0, 0.0, 0.0]
    );
    assert_eq!(v.parse_failures(), 2);
    assert_eq!(
        seen.bodies.lock().unwrap()[0]["stop"],
        serde_json::json!(["\n"])
    );
    let mut strict = extra;
    strict["on_parse_failure"] = "error".into();
    let (url, _) = server(3, reply);
    let e = judge(&url, strict)
        .build()
        .unwrap()
        .score_batch(&samples(&c))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("2 of 3 answers could not be parsed") && e.contains(&url),
        "{e}"
    );
}

#[test]
fn parse_rules() {
    let num = JudgeParse::Number {
        min: -1.0,
        max: 1.0,
    };
    for (a, want) in [
        ("0.5", Some(0.5)),
        ("-1", Some(-1.0)),
        ("x=+0.25.", Some(0.25)),
        ("2", None),
        ("", None),
        ("1.", Some(1.0)),
    ] {
        assert_eq!(parse_answer(&num, a), want, "{a:?}");
    }
    let labels = JudgeParse::Labels {
        labels: [("Correct".to_string(), 1.0), ("wrong".to_string(), -1.0)].into(),
    };
    for (a, want) in [
        ("correct", Some(1.0)),
        ("**Wrong**, because", Some(-1.0)),
        ("incorrect", None),
        ("correctly", None),
    ] {
        assert_eq!(parse_answer(&labels, a), want, "{a:?}");
    }
}

#[test]
fn timeouts_and_5xx_are_retried_and_refusals_are_not() {
    let c = cols();
    let one = &samples(&c)[..1];
    // A 503, then an answer: the retry succeeds.
    let (url, seen) = server(2, |n, _| {
        if n == 0 {
            (503, "busy".into(), 0)
        } else {
            (200, chat("yes"), 0)
        }
    });
    let v = judge(&url, serde_json::json!({})).build().unwrap();
    assert_eq!(v.score_batch(one).unwrap()[0].reward, 1.0);
    assert_eq!(seen.bodies.lock().unwrap().len(), 2);
    // Always too slow: two attempts (retries = 1), then an error naming the server.
    let (url, seen) = server(2, |_, _| (200, chat("yes"), 1500));
    let t0 = Instant::now();
    let e = judge(&url, serde_json::json!({"timeout_s": 0.3}))
        .build()
        .unwrap()
        .score_batch(one)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains(&url) && e.contains("timeout") && e.contains("2 attempts"),
        "{e}"
    );
    assert!(
        t0.elapsed() < Duration::from_millis(1400),
        "{:?}",
        t0.elapsed()
    );
    std::thread::sleep(Duration::from_millis(100));
    assert_eq!(seen.bodies.lock().unwrap().len(), 2);
    // A refusal (unknown model): no retry.
    let (url, seen) = server(2, |_, _| {
        (404, r#"{"error": "model judge-m not found"}"#.into(), 0)
    });
    let e = judge(&url, serde_json::json!({}))
        .build()
        .unwrap()
        .score_batch(one)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("HTTP 404") && e.contains("not found") && e.contains(&url),
        "{e}"
    );
    assert_eq!(seen.bodies.lock().unwrap().len(), 1);
    // Garbage with HTTP 200, twice.
    let (url, _) = server(2, |_, _| (200, "<html>".into(), 0));
    let e = judge(&url, serde_json::json!({}))
        .build()
        .unwrap()
        .score_batch(one)
        .unwrap_err()
        .to_string();
    assert!(e.contains("invalid JSON"), "{e}");
    // No server at all.
    let e = judge("http://127.0.0.1:9", serde_json::json!({"retries": 0}))
        .build()
        .unwrap()
        .score_batch(one)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("http://127.0.0.1:9") && e.contains("transport"),
        "{e}"
    );
}

/// `(name, value)` headers for the fake server.
fn headers(h: &[(&str, &str)]) -> Vec<(String, String)> {
    h.iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

#[test]
fn a_redirect_is_refused_naming_the_url_and_the_location() {
    let c = cols();
    let one = &samples(&c)[..1];
    let (url, seen) = server_with_headers(3, |_, _| {
        let h = headers(&[("Location", "http://127.0.0.1:9/elsewhere")]);
        (302, h, String::new(), 0)
    });
    let e = judge(&url, serde_json::json!({"retries": 2}))
        .build()
        .unwrap()
        .score_batch(one)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("HTTP 302")
            && e.contains(&url)
            && e.contains("http://127.0.0.1:9/elsewhere")
            && e.contains("not redirected"),
        "{e}"
    );
    // Refused at once: one request, no retry, nothing sent to the Location.
    std::thread::sleep(Duration::from_millis(100));
    assert_eq!(seen.bodies.lock().unwrap().len(), 1);
}

#[test]
fn http_429_and_408_are_retried_after_retry_after() {
    let c = cols();
    let one = &samples(&c)[..1];
    // 429 asking for 1 s, then an answer: the retry waits the second and succeeds.
    let (url, seen) = server_with_headers(2, |n, _| {
        if n == 0 {
            let h = headers(&[("Retry-After", "1")]);
            (429, h, r#"{"error": "rate limited"}"#.into(), 0)
        } else {
            (200, Vec::new(), chat("yes"), 0)
        }
    });
    let t0 = Instant::now();
    let v = judge(&url, serde_json::json!({})).build().unwrap();
    assert_eq!(v.score_batch(one).unwrap()[0].reward, 1.0);
    let took = t0.elapsed();
    assert!(took >= Duration::from_secs(1), "{took:?}");
    // Upper bounds with room for a loaded machine: the waits asked for are 1 s and 3600 s.
    assert!(took < Duration::from_secs(10), "{took:?}");
    assert_eq!(seen.bodies.lock().unwrap().len(), 2);
    // 408 without Retry-After: retried after the usual back-off.
    let (url, seen) = server(2, |n, _| {
        if n == 0 {
            (408, "slow client".into(), 0)
        } else {
            (200, chat("no"), 0)
        }
    });
    let v = judge(&url, serde_json::json!({})).build().unwrap();
    assert_eq!(v.score_batch(one).unwrap()[0].reward, 0.0);
    assert_eq!(seen.bodies.lock().unwrap().len(), 2);
    // A Retry-After longer than the request's timeout is cut to it.
    let (url, _) = server_with_headers(2, |n, _| {
        if n == 0 {
            (429, headers(&[("Retry-After", "3600")]), String::new(), 0)
        } else {
            (200, Vec::new(), chat("yes"), 0)
        }
    });
    let t0 = Instant::now();
    let v = judge(&url, serde_json::json!({"timeout_s": 0.5}))
        .build()
        .unwrap();
    assert_eq!(v.score_batch(one).unwrap()[0].reward, 1.0);
    let took = t0.elapsed();
    assert!(
        took >= Duration::from_millis(500) && took < Duration::from_secs(10),
        "{took:?}"
    );
}

#[test]
fn http_429_forever_stops_after_the_bounded_retries() {
    let c = cols();
    let one = &samples(&c)[..1];
    let (url, seen) = server_with_headers(10, |_, _| {
        let h = headers(&[("Retry-After", "1")]);
        (429, h, r#"{"error": "rate limited"}"#.into(), 0)
    });
    let t0 = Instant::now();
    let e = judge(&url, serde_json::json!({"retries": 2}))
        .build()
        .unwrap()
        .score_batch(one)
        .unwrap_err()
        .to_string();
    let took = t0.elapsed();
    assert!(
        e.contains(&url)
            && e.contains("HTTP 429")
            && e.contains("rate limited")
            && e.contains("Retry-After 1 s")
            && e.contains("3 attempts"),
        "{e}"
    );
    // Two waits of 1 s between the three attempts, then the error.
    assert!(
        took >= Duration::from_secs(2) && took < Duration::from_secs(5),
        "{took:?}"
    );
    std::thread::sleep(Duration::from_millis(100));
    assert_eq!(seen.bodies.lock().unwrap().len(), 3);
}

#[test]
fn requests_in_flight_are_bounded() {
    let (url, seen) = server(12, |_, _| (200, chat("yes"), 150));
    let v = judge(&url, serde_json::json!({"in_flight": 3}))
        .build()
        .unwrap();
    let c = cols();
    let s: Vec<Sample> = (0..12).map(|i| samples(&c)[i % 3]).collect();
    let got = v.score_batch(&s).unwrap();
    assert_eq!(got.len(), 12);
    let peak = seen.peak.load(Ordering::SeqCst);
    assert!((2..=3).contains(&peak), "peak in flight {peak}");
}

#[test]
fn config_checks_and_kind_judge() {
    let v: VerifierConfig = serde_json::from_value(serde_json::json!({
        "kind": "judge", "server": "http://127.0.0.1:1", "model": "m", "template": "{completion}",
        "parse": {"rule": "number", "min": 0.0, "max": 1.0},
    }))
    .unwrap();
    assert_eq!(v.name(), "judge");
    assert!(v.build().is_ok());
    let bad = |extra: serde_json::Value, want: &str| {
        let e = judge("http://127.0.0.1:1", extra)
            .build()
            .err()
            .unwrap()
            .to_string();
        assert!(e.contains(want), "{e}");
    };
    bad(serde_json::json!({"server": "https://x"}), "plain HTTP");
    bad(serde_json::json!({"in_flight": 0}), "in_flight");
    // Issue 49, item 12: u32::MAX retries would retry a dead server for ever.
    bad(
        serde_json::json!({"retries": u32::MAX}),
        "retries = 4294967295 is out of range: at most 100",
    );
    assert!(
        judge("http://127.0.0.1:1", serde_json::json!({"retries": 100}))
            .build()
            .is_ok()
    );
    bad(
        serde_json::json!({"template": "{completion"}),
        "without its `}`",
    );
    bad(
        serde_json::json!({"parse": {"rule": "number", "min": 2.0, "max": 1.0}}),
        "empty",
    );
    // An unknown name fails the batch, naming it.
    let v = judge(
        "http://127.0.0.1:1",
        serde_json::json!({"template": "{nope}"}),
    )
    .build()
    .unwrap();
    let e = v.score(&Sample::new("a", "b")).unwrap_err().to_string();
    assert!(e.contains("`{nope}`"), "{e}");
}

/// Issue 49 item 16: the judge's requests reuse their connections. 96 samples scored 8 at a time
/// over 3 batches open at most 8 connections (ureq's default pool kept 3 per host, so the other
/// requests each opened one: hundreds of sockets in TIME_WAIT over a run).
#[test]
fn requests_reuse_their_connections() {
    let (url, seen) = keep_alive_server(|_| (200, chat("yes")));
    let v = judge(&url, serde_json::json!({"in_flight": 8}))
        .build()
        .unwrap();
    let c = cols();
    let many: Vec<_> = (0..32)
        .map(|i| rlvr_reward::Sample {
            prompt: "p",
            completion: "4",
            reference: "4",
            columns: &c,
            index: Some(i),
        })
        .collect();
    for _ in 0..3 {
        assert!(v
            .score_batch(&many)
            .unwrap()
            .iter()
            .all(|s| s.reward == 1.0));
    }
    assert_eq!(seen.auth.lock().unwrap().len(), 96);
    let n = seen.connections.load(Ordering::SeqCst);
    assert!(
        (1..=8).contains(&n),
        "{n} connections for 96 requests, 8 in flight"
    );
}

/// Issue 49 item 7: a hosted judge's key comes from the environment variable `api_key_env`
/// names, sent as a bearer token on every request, and never in a message; a URL with
/// credentials is refused without repeating them; a variable that is not set is named.
#[test]
fn api_key_env_sends_a_bearer_token_and_urls_with_credentials_are_refused() {
    let (url, seen) = keep_alive_server(|_| (200, chat("yes")));
    // A variable name no other test uses.
    std::env::set_var("RLVR_TEST_JUDGE_KEY_7", "sk-test-7");
    let v = judge(
        &url,
        serde_json::json!({"api_key_env": "RLVR_TEST_JUDGE_KEY_7"}),
    )
    .build()
    .unwrap();
    let c = cols();
    assert_eq!(v.score_batch(&samples(&c)).unwrap().len(), 3);
    let auth = seen.auth.lock().unwrap().clone();
    assert_eq!(auth, vec![Some("Bearer sk-test-7".to_string()); 3]);
    // Without api_key_env: no header.
    let (url2, seen2) = keep_alive_server(|_| (200, chat("yes")));
    judge(&url2, serde_json::json!({}))
        .build()
        .unwrap()
        .score_batch(&samples(&c))
        .unwrap();
    assert_eq!(seen2.auth.lock().unwrap().clone(), vec![None; 3]);
    // A variable that is not set.
    let e = judge(
        &url,
        serde_json::json!({"api_key_env": "RLVR_TEST_JUDGE_KEY_UNSET"}),
    )
    .build()
    .err()
    .unwrap()
    .to_string();
    assert!(
        e.contains("RLVR_TEST_JUDGE_KEY_UNSET") && e.contains("is not set"),
        "{e}"
    );
    // Credentials in the URL: refused, not repeated.
    let with_creds = url.replace("http://", "http://user:s3cret@");
    let e = judge(&with_creds, serde_json::json!({}))
        .build()
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("api_key_env") && e.contains("***@"), "{e}");
    assert!(!e.contains("s3cret"), "{e}");
}
