//! Integration tests against a real vLLM server (scripts/ci_vllm.sh starts one and runs these).
//!
//! They run only when `RLVR_VLLM_URL` names a live server started on the model directory
//! `RLVR_VLLM_MODEL` (a tied-embedding Qwen2 from `scripts/vllm_server.sh model`; an untied one
//! with `RLVR_VLLM_TIED=false`), served as
//! `RLVR_VLLM_NAME` (default rlvr-policy) with `--dtype float32 --logprobs-mode
//! processed_logprobs` and `VLLM_SERVER_DEV_MODE=1`. Ignored by a plain `cargo test`
//! (scripts/ci_vllm.sh passes `--include-ignored`); run without it they fail. The tests share the
//! server, so they hold one lock, and a test that changes its weights puts the original back.

use crate::common::tensors;
use std::path::PathBuf;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use candle_core::{DType, Device};
use rlvr_model::checkpoint::Policy;
use rlvr_model::Model;
use rlvr_rollout::{Completion, SamplingParams};
use rlvr_vllm::{trainer_logprobs, ClientConfig, RefreshCheck, VllmClient};

static SERVER: Mutex<()> = Mutex::new(());

struct Live {
    client: VllmClient,
    policy: Policy,
}

fn live() -> Option<Live> {
    let Ok(url) = std::env::var("RLVR_VLLM_URL") else {
        panic!(
            "RLVR_VLLM_URL is not set: this live test needs a running server; \
             scripts/ci_vllm.sh starts one and runs it (a plain `cargo test` skips it as ignored)"
        );
    };
    let dir = PathBuf::from(
        std::env::var("RLVR_VLLM_MODEL").expect("RLVR_VLLM_MODEL: the served model dir"),
    );
    let policy = Policy::load(&dir, DType::F32, &Device::Cpu).unwrap();
    let client = VllmClient::new(ClientConfig {
        servers: vec![url],
        served_model_name: std::env::var("RLVR_VLLM_NAME").unwrap_or_else(|_| "rlvr-policy".into()),
        timeout: Duration::from_secs(120),
        retries: 1,
        ..Default::default()
    })
    .unwrap();
    Some(Live { client, policy })
}

fn prompts(l: &Live) -> Vec<Vec<u32>> {
    [
        "Natalia sold clips to 48 of her friends in April.",
        "What is 12 + 30?",
        "def fib(n):",
    ]
    .iter()
    .map(|t| l.policy.tokenizer.encode(t, false).unwrap())
    .collect()
}

fn params(temperature: f64, l: &Live) -> SamplingParams {
    SamplingParams {
        group_size: 4,
        temperature,
        max_new_tokens: 24,
        stop_ids: l.policy.tokenizer.eos_ids.clone(),
        ..Default::default()
    }
}

/// Largest |ℓ_vLLM − ℓ_trainer| over all tokens of `out`.
fn max_gap(model: &Model, prompts: &[Vec<u32>], out: &[Completion], temperature: f64) -> f64 {
    let mut worst = 0.0f64;
    for c in out {
        assert_eq!(c.token_ids.len(), c.behaviour_logprobs.len());
        let ours =
            trainer_logprobs(model, &prompts[c.prompt_index], &c.token_ids, temperature).unwrap();
        for (a, b) in c.behaviour_logprobs.iter().zip(&ours) {
            worst = worst.max((a - b).abs() as f64);
        }
    }
    worst
}

/// Mean |ℓ_vLLM − log_softmax(logits)| (T = 1) over all tokens of `out`.
fn mean_gap_to_raw(model: &Model, prompts: &[Vec<u32>], out: &[Completion]) -> f64 {
    let (mut sum, mut n) = (0.0f64, 0usize);
    for c in out {
        let raw = trainer_logprobs(model, &prompts[c.prompt_index], &c.token_ids, 1.0).unwrap();
        for (a, b) in c.behaviour_logprobs.iter().zip(&raw) {
            sum += (a - b).abs() as f64;
            n += 1;
        }
    }
    sum / n as f64
}

#[test]
#[ignore = "live: needs a vLLM server, started by scripts/ci_vllm.sh"]
fn startup_checks_pass_on_a_correctly_started_server() {
    let _g = SERVER.lock().unwrap_or_else(|e| e.into_inner());
    let Some(l) = live() else { return };
    let infos = l
        .client
        .check_servers(&l.policy.tokenizer, 32, 64, "rollout.max_new_tokens")
        .unwrap();
    assert!(infos[0].max_model_len >= 96);
    let gaps = l
        .client
        .check_logprob_mode(&l.policy.model, &prompts(&l)[0], 16)
        .unwrap();
    eprintln!(
        "log-prob-mode check: mean |ℓ_vLLM − ℓ_trainer| at T = 0.7 = {:.2e}",
        gaps[0]
    );
    assert!(gaps[0] < 1e-4, "{gaps:?}");
    let err = l
        .client
        .check_servers(&l.policy.tokenizer, 32, 100_000, "rollout.max_new_tokens")
        .unwrap_err();
    assert!(err.to_string().contains("max_model_len"), "{err}");
}

#[test]
#[ignore = "live: needs a vLLM server, started by scripts/ci_vllm.sh"]
fn behaviour_logprobs_equal_the_trainers_at_staleness_zero() {
    let _g = SERVER.lock().unwrap_or_else(|e| e.into_inner());
    let Some(l) = live() else { return };
    let p = prompts(&l);
    for t in [1.0, 0.7] {
        let out = l.client.sample(&p, 0, &params(t, &l), 11).unwrap();
        assert_eq!(out.len(), p.len() * 4);
        let gap = max_gap(&l.policy.model, &p, &out, t);
        eprintln!(
            "T = {t}: max |ℓ_vLLM − ℓ_trainer| = {gap:.2e} over {} tokens",
            out.iter().map(|c| c.token_ids.len()).sum::<usize>()
        );
        assert!(gap <= 1e-4, "T = {t}: max gap {gap}");
        if t != 1.0 {
            // What a server with raw log-probs (vLLM's default, before temperature) would return:
            // the model is peaked enough that the log-prob-mode check tells the two apart.
            let raw = mean_gap_to_raw(&l.policy.model, &p, &out);
            eprintln!("T = {t}: raw log-probs would be {raw:.3} nats away on average");
            assert!(
                raw > 2.0 * rlvr_vllm::checks::LOGPROB_MODE_TOLERANCE,
                "{raw}"
            );
        }
        for c in &out {
            assert_eq!(c.version, 0);
            // A completion that ended on a stop id carries it as its last token.
            if c.finish_reason == rlvr_rollout::FinishReason::Eos {
                assert!(l
                    .policy
                    .tokenizer
                    .eos_ids
                    .contains(c.token_ids.last().unwrap()));
            } else {
                assert_eq!(c.token_ids.len(), 24);
            }
        }
    }
}

#[test]
#[ignore = "live: needs a vLLM server, started by scripts/ci_vllm.sh"]
fn the_same_seed_gives_the_same_completions() {
    let _g = SERVER.lock().unwrap_or_else(|e| e.into_inner());
    let Some(l) = live() else { return };
    let p = prompts(&l);
    let a = l.client.sample(&p, 100, &params(1.0, &l), 5).unwrap();
    let b = l.client.sample(&p, 100, &params(1.0, &l), 5).unwrap();
    assert_eq!(a, b);
    let c = l.client.sample(&p, 100, &params(1.0, &l), 6).unwrap();
    assert_ne!(
        a.iter().map(|c| &c.token_ids).collect::<Vec<_>>(),
        c.iter().map(|c| &c.token_ids).collect::<Vec<_>>()
    );
    // Within a request the K samples differ (seed + j), and so do requests of different prompt indices.
    assert_ne!(a[0].token_ids, a[1].token_ids);
}

fn check_for(m: &Model, prompt: &[u32]) -> RefreshCheck {
    let completion: Vec<u32> = (0..12u32).map(|i| 100 + 37 * i).collect();
    let expected = trainer_logprobs(m, prompt, &completion, 1.0).unwrap();
    RefreshCheck {
        prompt: prompt.to_vec(),
        completion,
        expected,
        tolerance: 1e-4,
    }
}

#[test]
#[ignore = "live: needs a vLLM server, started by scripts/ci_vllm.sh"]
fn after_a_refresh_the_server_samples_and_scores_with_the_new_weights() {
    let _g = SERVER.lock().unwrap_or_else(|e| e.into_inner());
    let Some(mut l) = live() else { return };
    // CI serves a tied model (the hard case: vLLM's reload keeps a tied head silently unless
    // lm_head.weight is written); `RLVR_VLLM_TIED=false` declares an untied one, for a run by hand.
    let tied = std::env::var("RLVR_VLLM_TIED").map_or(true, |v| v != "false");
    assert_eq!(
        l.policy.model.config().tie_word_embeddings,
        tied,
        "the served model's tie_word_embeddings differs from RLVR_VLLM_TIED (default true)"
    );
    let weights = tempfile::tempdir().unwrap();
    let p = prompts(&l);
    // New weights: same shapes, other values (another init), tied like the served model.
    let new = Model::random(
        l.policy.model.config().clone(),
        0.05,
        99,
        DType::F32,
        &Device::Cpu,
    )
    .unwrap();
    let t0 = Instant::now();
    let timings = l
        .client
        .refresh(
            weights.path(),
            1,
            &tensors(&new),
            new.config(),
            &check_for(&new, &p[0]),
        )
        .unwrap();
    eprintln!(
        "refresh: {:.3} s in all, {timings:?}",
        t0.elapsed().as_secs_f64()
    );
    assert_eq!(l.client.version(), 1);
    let out = l.client.sample(&p, 0, &params(0.7, &l), 3).unwrap();
    assert!(out.iter().all(|c| c.version == 1));
    let gap_new = max_gap(&new, &p, &out, 0.7);
    assert!(
        gap_new <= 1e-4,
        "after the refresh: max gap to the new weights {gap_new}"
    );
    let gap_old = max_gap(&l.policy.model, &p, &out, 0.7);
    eprintln!("after the refresh, T = 0.7: max gap to the new weights {gap_new:.2e}, to the old {gap_old:.2}");
    assert!(
        gap_old > 1e-2,
        "the old and new weights must differ ({gap_old})"
    );
    // Back to the served checkpoint's weights (a second sync), which also prunes version 1.
    let original = &l.policy.model;
    l.client
        .refresh(
            weights.path(),
            2,
            &tensors(original),
            original.config(),
            &check_for(original, &p[0]),
        )
        .unwrap();
    let names: Vec<String> = std::fs::read_dir(weights.path().canonicalize().unwrap())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().to_string())
        .collect();
    assert_eq!(names, ["version-00000002"]);
    let out = l.client.sample(&p, 0, &params(1.0, &l), 3).unwrap();
    assert!(max_gap(original, &p, &out, 1.0) <= 1e-4);
}

/// `rlvr generate --server URL` samples on the server (the model pushed first as version 0): one
/// line per completion, and its behaviour log-probs equal the trainer's at T = 0.7.
#[test]
#[ignore = "live: needs a vLLM server, started by scripts/ci_vllm.sh"]
fn rlvr_generate_samples_on_the_server() {
    let Some(l) = live() else { return };
    let _g = SERVER.lock().unwrap_or_else(|e| e.into_inner());
    let rlvr = std::env::var("RLVR")
        .map(PathBuf::from)
        .unwrap_or_else(|_| {
            PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../target/debug/rlvr")
        });
    let url = std::env::var("RLVR_VLLM_URL").unwrap();
    let model = std::env::var("RLVR_VLLM_MODEL").unwrap();
    let name = std::env::var("RLVR_VLLM_NAME").unwrap_or_else(|_| "rlvr-policy".into());
    let text = "What is 12 + 30?";
    let out = std::process::Command::new(&rlvr)
        .args(["generate", "--model", &model, "--prompt", text, "-n", "4"])
        .args([
            "--temperature",
            "0.7",
            "--max-new-tokens",
            "16",
            "--seed",
            "3",
        ])
        .args(["--server", &url, "--served-model-name", &name])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let lines: Vec<serde_json::Value> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|x| serde_json::from_str(x).unwrap())
        .collect();
    assert_eq!(lines.len(), 4, "{stderr}");
    let prompt = l.policy.tokenizer.encode(text, true).unwrap();
    let mut worst = 0f64;
    for c in &lines {
        let ids: Vec<u32> = serde_json::from_value(c["token_ids"].clone()).unwrap();
        let lps: Vec<f32> = serde_json::from_value(c["behaviour_logprobs"].clone()).unwrap();
        assert!(!ids.is_empty() && ids.len() == lps.len(), "{c}");
        let ours = trainer_logprobs(&l.policy.model, &prompt, &ids, 0.7).unwrap();
        for (a, b) in lps.iter().zip(&ours) {
            worst = worst.max((a - b).abs() as f64);
        }
    }
    eprintln!("rlvr generate on vLLM: max |l_vllm - l_trainer| = {worst:e}");
    assert!(worst < 1e-4, "{worst}");
}
