//! Multi-turn episodes on the vLLM backend (DESIGN.md section 14; issue 45), against a fake server:
//! `VllmClient::sample_turns` sends one `/v1/completions` request per episode whose `prompt` is
//! exactly the episode's stored context (token ids, never re-rendered), `n = 1`, and the seed
//! `turn_seed(run seed, prompt, sample, turn)`; results come back in row order whatever order the
//! server answers in, with the row's indices; a failed request fails the whole call.

use std::collections::HashSet;
use std::time::Duration;

use crate::common::{completion_answer, FakeServer, Reply};
use rlvr_rollout::{FinishReason, SamplingParams, TurnRow};
use rlvr_vllm::completion::{request_seed, turn_seed};
use rlvr_vllm::{ClientConfig, VllmClient, VllmError};
use serde_json::{json, Value};

fn client(urls: &[&String], in_flight: usize) -> VllmClient {
    VllmClient::new(ClientConfig {
        servers: urls.iter().map(|u| u.to_string()).collect(),
        served_model_name: "policy".into(),
        retries: 0,
        backoff: Duration::from_millis(10),
        timeout: Duration::from_secs(5),
        in_flight,
        ..Default::default()
    })
    .unwrap()
}

fn params() -> SamplingParams {
    SamplingParams {
        // Ignored by sample_turns: one completion per row.
        group_size: 4,
        temperature: 0.7,
        max_new_tokens: 5,
        stop_ids: vec![9],
        ..Default::default()
    }
}

/// Three episodes' contexts (prompt, turn, bridge) at turns 2, 3 and 2.
fn rows() -> Vec<TurnRow> {
    vec![
        TurnRow {
            context: vec![1, 2, 3, 40, 41, 9, 50, 51],
            prompt_index: 7,
            sample_index: 2,
            turn: 2,
        },
        TurnRow {
            context: vec![1, 2, 3, 42, 9, 50, 51, 43, 44, 9, 52],
            prompt_index: 7,
            sample_index: 0,
            turn: 3,
        },
        TurnRow {
            context: vec![4, 5, 45, 9, 53],
            prompt_index: 8,
            sample_index: 1,
            turn: 2,
        },
    ]
}

/// A server whose answer is a function of the request's prompt: ids [len, last, 9] (a stop) with
/// log-probs [-len/10, -0.5, -0.25]; the shortest context (row 2) is answered last, after a pause,
/// so the answers arrive out of row order.
fn echo_server() -> FakeServer {
    FakeServer::start(|line, body| {
        if line != "POST /v1/completions" {
            return Reply::Status(404, "{}".into());
        }
        let p: Vec<u32> = serde_json::from_value(body["prompt"].clone()).unwrap();
        let ids = vec![p.len() as u32, *p.last().unwrap(), 9];
        let lps = vec![-(p.len() as f32) / 10.0, -0.5, -0.25];
        let answer = completion_answer(&[ids], &[lps], &[("stop", json!(9))]);
        if p.len() == 5 {
            Reply::Slow(Duration::from_millis(300), answer)
        } else {
            Reply::Status(200, answer)
        }
    })
}

#[test]
fn each_turn_is_one_request_whose_prompt_is_the_stored_context() {
    let fake = echo_server();
    let mut c = client(&[&fake.url], 3);
    c.set_version(4);
    let rows = rows();
    let out = c.sample_turns(&rows, &params(), 11).unwrap();
    assert_eq!(out.len(), 3);
    for (r, o) in rows.iter().zip(&out) {
        assert_eq!(
            (o.prompt_index, o.sample_index),
            (r.prompt_index, r.sample_index)
        );
        assert_eq!(o.version, 4);
        assert_eq!(
            o.token_ids,
            vec![r.context.len() as u32, *r.context.last().unwrap(), 9]
        );
        assert_eq!(
            o.behaviour_logprobs,
            vec![-(r.context.len() as f32) / 10.0, -0.5, -0.25]
        );
        assert_eq!(o.finish_reason, FinishReason::Eos);
    }
    let seen = fake.seen.lock().unwrap().clone();
    assert_eq!(seen.len(), 3, "one request per row");
    for r in &rows {
        let b: &Value = &seen
            .iter()
            .find(|s| s.body["prompt"] == json!(r.context))
            .unwrap_or_else(|| panic!("no request with the context of {r:?}: {seen:?}"))
            .body;
        assert_eq!(b["n"], 1);
        assert_eq!(b["max_tokens"], 5);
        assert_eq!(b["temperature"], 0.7);
        assert_eq!(b["stop_token_ids"], json!([9]));
        assert_eq!(b["ignore_eos"], true);
        assert_eq!(b["model"], "policy");
        assert_eq!(
            b["seed"],
            turn_seed(11, r.prompt_index, r.sample_index, r.turn)
        );
    }
}

#[test]
fn a_rows_request_does_not_depend_on_the_other_rows_of_the_call() {
    let fake = echo_server();
    let c = client(&[&fake.url], 2);
    let all = c.sample_turns(&rows(), &params(), 11).unwrap();
    let bodies_all = fake.seen.lock().unwrap().clone();
    fake.seen.lock().unwrap().clear();
    let last = c.sample_turns(&rows()[2..], &params(), 11).unwrap();
    assert_eq!(last[0], all[2]);
    let bodies_one = fake.seen.lock().unwrap().clone();
    let same = bodies_all
        .iter()
        .find(|s| s.body["prompt"] == bodies_one[0].body["prompt"])
        .unwrap();
    assert_eq!(same.body, bodies_one[0].body);
}

#[test]
fn turn_seeds_are_distinct_reproducible_and_outside_the_group_ranges() {
    let mut seen = HashSet::new();
    for p in 0..200 {
        for s in 0..8 {
            for t in 1..6u64 {
                let x = turn_seed(5, p, s, t);
                assert_eq!(x, turn_seed(5, p, s, t));
                assert!(x < 1 << 63);
                assert!(seen.insert(x), "seed {x} of ({p}, {s}, {t}) repeats");
            }
        }
    }
    // Another run seed moves every seed.
    assert!((0..200).all(|p| turn_seed(6, p, 0, 2) != turn_seed(5, p, 0, 2)));
    // No turn seed falls in a group request's range [seed, seed + K) of the same run.
    let k = 8u64;
    let mut groups: Vec<u64> = (0..200).map(|p| request_seed(5, p, k as usize)).collect();
    groups.sort_unstable();
    for &x in &seen {
        let i = groups.partition_point(|&g| g <= x);
        assert!(
            i == 0 || x >= groups[i - 1] + k,
            "turn seed {x} in a group range"
        );
    }
}

#[test]
fn one_failed_turn_fails_the_call_and_bad_rows_are_refused() {
    let fake = FakeServer::start(|_, body| {
        if body["prompt"] == json!([4, 5, 45, 9, 53]) {
            Reply::Status(500, "{\"error\": \"boom\"}".into())
        } else {
            Reply::Status(
                200,
                completion_answer(&[vec![1]], &[vec![-0.1]], &[("length", Value::Null)]),
            )
        }
    });
    let c = client(&[&fake.url], 1);
    let err = c.sample_turns(&rows(), &params(), 11).unwrap_err();
    assert!(matches!(err, VllmError::Server { .. }), "{err:?}");
    assert!(err.to_string().contains(&fake.url), "{err}");
    let mut bad = rows();
    bad[1].context.clear();
    let err = c.sample_turns(&bad, &params(), 11).unwrap_err().to_string();
    assert!(err.contains("episode (7, 0) turn 3"), "{err}");
    let mut bad = rows();
    bad[0].turn = 0;
    let err = c.sample_turns(&bad, &params(), 11).unwrap_err().to_string();
    assert!(err.contains("turns count from 1"), "{err}");
    // A server answering two choices for n = 1 is malformed.
    let two = FakeServer::scripted(vec![Reply::Status(
        200,
        completion_answer(
            &[vec![1], vec![2]],
            &[vec![-0.1], vec![-0.2]],
            &[("length", Value::Null), ("length", Value::Null)],
        ),
    )]);
    let err = client(&[&two.url], 1)
        .sample_turns(&rows()[..1], &params(), 11)
        .unwrap_err()
        .to_string();
    assert!(err.contains("2 choices for n = 1"), "{err}");
}
