//! The real vLLM server killed while a sampling call is in flight: the fake server's "down" case,
//! checked against the real one, so that a dead server is an error naming it and never a hang. scripts/ci_vllm.sh runs this after tests/it/live_server.rs,
//! since it ends the server.
//!
//! It runs only when `RLVR_VLLM_URL` names a live server whose process group id (scripts/
//! vllm_server.sh starts it with setsid, so its pid) is `RLVR_VLLM_PID`, served as
//! `RLVR_VLLM_NAME` (default rlvr-policy). Ignored by a plain `cargo test`; scripts/ci_vllm.sh
//! runs it with `--include-ignored`, and run without its server it fails.

use std::process::Command;
use std::time::{Duration, Instant};

use rlvr_rollout::SamplingParams;
use rlvr_vllm::{ClientConfig, VllmClient, VllmError};

#[test]
#[ignore = "live: needs a vLLM server, started by scripts/ci_vllm.sh"]
fn a_server_killed_mid_call_gives_an_error_naming_it() {
    let (Ok(url), Ok(pid)) = (
        std::env::var("RLVR_VLLM_URL"),
        std::env::var("RLVR_VLLM_PID"),
    ) else {
        panic!(
            "RLVR_VLLM_URL / RLVR_VLLM_PID are not set: this live test needs a running server; \
             scripts/ci_vllm.sh starts one and runs it (a plain `cargo test` skips it as ignored)"
        );
    };
    let pid: u32 = pid.parse().expect("RLVR_VLLM_PID: a process id");
    let client = VllmClient::new(ClientConfig {
        servers: vec![url.clone()],
        served_model_name: std::env::var("RLVR_VLLM_NAME").unwrap_or_else(|_| "rlvr-policy".into()),
        timeout: Duration::from_secs(120),
        retries: 2,
        backoff: Duration::from_millis(200),
        ..Default::default()
    })
    .unwrap();
    // Long completions without stop ids, so that the call is still running when the server dies.
    let prompts: Vec<Vec<u32>> = (0..16u32).map(|i| vec![100 + i, 200, 300]).collect();
    let params = SamplingParams {
        group_size: 8,
        temperature: 1.0,
        max_new_tokens: 400,
        ..Default::default()
    };
    std::thread::scope(|s| {
        let call = s.spawn(|| {
            let t = Instant::now();
            (client.sample(&prompts, 0, &params, 1), t.elapsed())
        });
        std::thread::sleep(Duration::from_millis(1500));
        assert!(
            !call.is_finished(),
            "the call ended before the server was killed: make it longer"
        );
        let killed = Command::new("kill")
            .args(["-KILL", "--", &format!("-{pid}")])
            .status()
            .unwrap();
        assert!(killed.success(), "kill -KILL -{pid} failed");
        let (result, took) = call.join().unwrap();
        let err = result.expect_err("sampling from a killed server must fail");
        let msg = err.to_string();
        eprintln!("after {:.2} s: {msg}", took.as_secs_f64());
        match &err {
            VllmError::Server {
                server,
                what,
                attempts,
                answer,
            } => {
                assert_eq!(server, &url);
                assert_eq!(what, "POST /v1/completions");
                assert_eq!(*attempts, 3);
                assert!(answer.contains("transport error"), "{answer}");
            }
            other => panic!("expected VllmError::Server, got {other:?}"),
        }
        assert!(msg.contains(&url), "{msg}");
        assert!(took < Duration::from_secs(60), "{took:?}");
    });
}
