//! Start-up checks, the log-prob-mode check and the weight refresh against a fake server that
//! answers like vLLM, with a tiny random model as the trainer.

use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::common::{check_for, completion_answer, tensors, FakeServer, Reply};
use candle_core::{DType, Device};
use rlvr_model::Model;
use rlvr_rollout::SamplingParams;
use rlvr_vllm::{trainer_logprobs, version_dir, ClientConfig, VllmClient};
use serde_json::{json, Value};

fn model(tied: bool, seed: u64) -> Model {
    crate::common::tiny_qwen2(tied, seed)
}

fn client(url: &str) -> VllmClient {
    VllmClient::new(ClientConfig {
        servers: vec![url.to_string()],
        served_model_name: "policy".into(),
        retries: 0,
        backoff: Duration::from_millis(10),
        timeout: Duration::from_secs(5),
        ..Default::default()
    })
    .unwrap()
}

/// vLLM's prompt_logprobs answer for `ids` with `lps` = log-probs of ids[1..].
fn prompt_logprobs_answer(ids: &[u32], lps: &[f32]) -> String {
    let mut pl = vec![Value::Null];
    for (id, lp) in ids[1..].iter().zip(lps) {
        pl.push(json!({ id.to_string(): {"logprob": lp, "rank": 1, "decoded_token": "x"} }));
    }
    json!({"choices": [{"index": 0, "text": "", "prompt_logprobs": pl, "finish_reason": "length"}]})
        .to_string()
}

/// A fake vLLM whose scoring answers with `served` (the log-probs of ids[1..] of [1..=7]).
fn vllm_serving(served: Arc<Mutex<Vec<f32>>>, reload_status: u16) -> FakeServer {
    FakeServer::start(move |line, body| match line {
        "POST /collective_rpc" => Reply::Status(reload_status, "{\"results\": [null]}".into()),
        "POST /v1/completions" if body.get("prompt_logprobs").is_some() => {
            let ids: Vec<u32> = serde_json::from_value(body["prompt"].clone()).unwrap();
            let served = served.lock().unwrap();
            // served holds the completion's log-probs; the prompt's own are never compared.
            let mut all = vec![-1.0f32; ids.len() - 1 - served.len()];
            all.extend(served.iter());
            Reply::Status(200, prompt_logprobs_answer(&ids, &all))
        }
        _ => Reply::Status(200, String::new()),
    })
}

fn safetensor_names(dir: &Path) -> Vec<String> {
    let bytes = std::fs::read(dir.join("model.safetensors")).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let mut names: Vec<String> = st.names().into_iter().map(|s| s.to_string()).collect();
    names.sort();
    names
}

#[test]
fn refresh_pauses_reloads_resets_resumes_verifies_and_prunes() {
    let weights = tempfile::tempdir().unwrap();
    let (old, new) = (model(true, 1), model(true, 2));
    let check = check_for(&new);
    let served = Arc::new(Mutex::new(check.expected.clone()));
    let fake = vllm_serving(served.clone(), 200);
    let mut c = client(&fake.url);
    // A leftover of version 1 (e.g. from the previous refresh) is deleted after version 2 took.
    rlvr_vllm::write_weights(weights.path(), 1, &tensors(&old), old.config(), DType::F32).unwrap();
    let t = c
        .refresh(weights.path(), 2, &tensors(&new), new.config(), &check)
        .unwrap();
    assert!(t.max_abs_diff <= 1e-7, "{t:?}");
    assert_eq!(c.version(), 2);
    let lines = fake.lines();
    assert_eq!(
        lines,
        [
            "POST /pause?mode=wait",
            "POST /collective_rpc",
            "POST /reset_prefix_cache",
            "POST /resume",
            "POST /v1/completions"
        ]
    );
    let dir = version_dir(&weights.path().canonicalize().unwrap(), 2);
    let rpc = fake.seen.lock().unwrap()[1].body.clone();
    assert_eq!(rpc["method"], "reload_weights");
    assert_eq!(
        rpc["kwargs"]["weights_path"],
        dir.to_string_lossy().as_ref()
    );
    // Tied model: lm_head.weight written explicitly, equal to the embedding.
    let names = safetensor_names(&dir);
    assert!(names.contains(&"lm_head.weight".to_string()), "{names:?}");
    let bytes = std::fs::read(dir.join("model.safetensors")).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    assert_eq!(
        st.tensor("lm_head.weight").unwrap().data(),
        st.tensor("model.embed_tokens.weight").unwrap().data()
    );
    assert!(dir.join("config.json").exists());
    assert!(!version_dir(&weights.path().canonicalize().unwrap(), 1).exists());
    // Reloaded as a model, the directory reproduces the new weights' log-probs.
    let back = Model::load(&dir, DType::F32, &Device::Cpu).unwrap();
    assert_eq!(
        trainer_logprobs(&back, &check.prompt, &check.completion, 1.0).unwrap(),
        check.expected
    );
}

/// A refresh that a kill interrupted leaves its folder (`.tmp-version-N-PID`, a whole checkpoint)
/// beside the versions; the next push (the first of the next start) removes it, and only it: a
/// live process's folder in the same directory stays. (Such folders used to stay forever.)
#[cfg(target_os = "linux")]
#[test]
fn a_refresh_removes_the_folders_of_killed_refreshes() {
    let weights = tempfile::tempdir().unwrap();
    let m = model(false, 3);
    let check = check_for(&m);
    let fake = vllm_serving(Arc::new(Mutex::new(check.expected.clone())), 200);
    let mut c = client(&fake.url);
    // A PID that was just freed: a child that exited and was waited for.
    let mut child = std::process::Command::new("true").spawn().unwrap();
    let dead = child.id();
    child.wait().unwrap();
    let killed = weights.path().join(format!(".tmp-version-00000001-{dead}"));
    let killed_adapter = weights
        .path()
        .join(format!(".tmp-version-00000001-lora-{dead}"));
    let live = weights
        .path()
        .join(format!(".tmp-version-00000007-{}", std::process::id()));
    for d in [&killed, &killed_adapter, &live] {
        std::fs::create_dir_all(d.join("adapter")).unwrap();
        std::fs::write(d.join("model.safetensors"), b"half").unwrap();
    }
    let other = weights.path().join(".tmp-notes");
    std::fs::write(&other, b"x").unwrap();
    c.refresh(weights.path(), 2, &tensors(&m), m.config(), &check)
        .unwrap();
    assert!(!killed.exists() && !killed_adapter.exists());
    assert!(live.join("model.safetensors").is_file() && other.is_file());
    assert!(version_dir(weights.path(), 2)
        .join("model.safetensors")
        .is_file());
}

#[test]
fn untied_models_get_no_extra_head() {
    let weights = tempfile::tempdir().unwrap();
    let m = model(false, 3);
    let dir =
        rlvr_vllm::write_weights(weights.path(), 0, &tensors(&m), m.config(), DType::F32).unwrap();
    let names = safetensor_names(&dir);
    assert_eq!(names.iter().filter(|n| *n == "lm_head.weight").count(), 1);
    assert_eq!(names.len(), tensors(&m).len());
}

#[test]
fn a_stale_server_fails_the_refresh_and_blocks_sampling() {
    let weights = tempfile::tempdir().unwrap();
    let (old, new) = (model(true, 1), model(true, 2));
    let check = check_for(&new);
    // The server still scores with the old weights (as vLLM does when the tied head is not reloaded).
    let stale = trainer_logprobs(&old, &check.prompt, &check.completion, 1.0).unwrap();
    let fake = vllm_serving(Arc::new(Mutex::new(stale)), 200);
    let mut c = client(&fake.url);
    let err = c
        .refresh(weights.path(), 2, &tensors(&new), new.config(), &check)
        .unwrap_err();
    assert!(
        err.to_string().contains("still serves other weights")
            && err.to_string().contains(&fake.url),
        "{err}"
    );
    assert_eq!(c.version(), 0);
    let err = c
        .sample(&[vec![1]], 0, &SamplingParams::default(), 0)
        .unwrap_err();
    assert!(
        err.to_string().contains("refresh to version 2 failed"),
        "{err}"
    );
}

#[test]
fn a_failed_reload_is_an_error_and_the_server_is_still_resumed() {
    let weights = tempfile::tempdir().unwrap();
    let new = model(true, 2);
    let check = check_for(&new);
    let fake = vllm_serving(Arc::new(Mutex::new(check.expected.clone())), 500);
    let mut c = client(&fake.url);
    let err = c
        .refresh(weights.path(), 1, &tensors(&new), new.config(), &check)
        .unwrap_err();
    assert!(
        err.to_string().contains("POST /collective_rpc") && err.to_string().contains("HTTP 500"),
        "{err}"
    );
    assert_eq!(fake.lines().last().unwrap(), "POST /resume");
    assert!(c
        .sample(&[vec![1]], 0, &SamplingParams::default(), 0)
        .is_err());
}

fn mode_server(m: &Model, temperature: f64) -> FakeServer {
    let (prompt, completion) = (vec![1u32, 2, 3], vec![10u32, 20, 30, 40, 50, 60]);
    let lps = trainer_logprobs(m, &prompt, &completion, temperature).unwrap();
    let answer = completion_answer(&[completion], &[lps], &[("length", Value::Null)]);
    FakeServer::scripted(vec![Reply::Status(200, answer)])
}

#[test]
fn the_logprob_mode_check_catches_raw_logprobs() {
    let m = model(true, 4);
    let (prompt, completion) = ([1u32, 2, 3], [10u32, 20, 30, 40, 50, 60]);
    let raw = trainer_logprobs(&m, &prompt, &completion, 1.0).unwrap();
    let processed = trainer_logprobs(&m, &prompt, &completion, 0.7).unwrap();
    let gap: f32 = raw
        .iter()
        .zip(&processed)
        .map(|(a, b)| (a - b).abs())
        .sum::<f32>()
        / raw.len() as f32;
    assert!(
        gap > 0.1,
        "the model must tell T = 1 from T = 0.7 (gap {gap})"
    );
    // A server in processed mode returns log_softmax(logits / 0.7): the check passes.
    let ok = mode_server(&m, 0.7);
    let gaps = client(&ok.url).check_logprob_mode(&m, &prompt, 6).unwrap();
    assert!(gaps[0] < 1e-6, "{gaps:?}");
    let body = ok.seen.lock().unwrap()[0].body.clone();
    assert_eq!(
        (
            body["temperature"].clone(),
            body["top_p"].clone(),
            body["n"].clone()
        ),
        (json!(0.7), json!(1.0), json!(1))
    );
    // vLLM's default returns raw log-probs (before temperature): refused with the flag to set.
    let raw_server = mode_server(&m, 1.0);
    let err = client(&raw_server.url)
        .check_logprob_mode(&m, &prompt, 6)
        .unwrap_err();
    assert!(
        err.to_string()
            .contains("--logprobs-mode processed_logprobs"),
        "{err}"
    );
}

fn startup_server(name: &'static str, max_len: u64, tokens: Option<Vec<u32>>) -> FakeServer {
    FakeServer::start(move |line, _| {
        match line {
        "GET /health" => Reply::Status(200, String::new()),
        "GET /v1/models" => Reply::Status(
            200,
            json!({"object": "list", "data": [{"id": name, "object": "model", "max_model_len": max_len}]}).to_string(),
        ),
        "POST /tokenize" => Reply::Status(200, json!({"count": 1, "tokens": tokens.clone().unwrap()}).to_string()),
        _ => Reply::Status(404, "{}".into()),
    }
    })
}

#[test]
fn startup_checks_name_what_disagrees() {
    let path =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../data/tokenizers/qwen2.5/tokenizer.json");
    let tok = rlvr_model::checkpoint::tokenizer_for_init(&path).unwrap();
    let (_, probe_ids) = rlvr_vllm::checks::tokenizer_probe(&tok).unwrap();
    let last = tok.vocab_size() as u32 - 1;
    assert!(
        probe_ids.contains(&last) && tok.eos_ids.iter().all(|e| probe_ids.contains(e)),
        "{probe_ids:?}"
    );
    let good = startup_server("policy", 512, Some(probe_ids.clone()));
    let infos = client(&good.url)
        .check_servers(&tok, 100, 400, "rollout.max_new_tokens")
        .unwrap();
    assert_eq!(infos[0].max_model_len, 512);
    assert_eq!(
        good.lines(),
        ["GET /health", "GET /v1/models", "POST /tokenize"]
    );
    assert_eq!(
        good.seen.lock().unwrap()[2].body["add_special_tokens"],
        false
    );
    let short = client(&good.url)
        .check_servers(&tok, 200, 400, "rollout.max_new_tokens")
        .unwrap_err()
        .to_string();
    assert!(
        short.contains(
            "max_model_len 512 < longest prompt 200 + rollout.max_new_tokens 400: restart it \
             with --max-model-len 600"
        ),
        "{short}"
    );
    // Multi-turn episodes: the bound is the episode's, and the error names its key.
    let short = client(&good.url)
        .check_servers(&tok, 200, 400, "env.max_episode_tokens")
        .unwrap_err()
        .to_string();
    assert!(
        short.contains("longest prompt 200 + env.max_episode_tokens 400")
            && !short.contains("max_new_tokens"),
        "{short}"
    );
    let other = startup_server("other", 512, Some(probe_ids.clone()));
    let e = client(&other.url)
        .check_servers(&tok, 1, 1, "rollout.max_new_tokens")
        .unwrap_err()
        .to_string();
    assert!(e.contains("--served-model-name policy"), "{e}");
    let mut wrong = probe_ids;
    *wrong.last_mut().unwrap() += 1;
    let bad_tok = startup_server("policy", 512, Some(wrong));
    let e = client(&bad_tok.url)
        .check_servers(&tok, 1, 1, "rollout.max_new_tokens")
        .unwrap_err()
        .to_string();
    assert!(e.contains("tokenizer disagrees"), "{e}");
}

/// A fake vLLM that scores with `served` (as [`vllm_serving`]) and samples one group of two
/// completions.
fn sampling_and_scoring(served: Arc<Mutex<Vec<f32>>>) -> FakeServer {
    let group = completion_answer(
        &[vec![5, 6], vec![7, 8]],
        &[vec![-0.5, -0.25], vec![-1.0, -0.5]],
        &[("length", Value::Null), ("length", Value::Null)],
    );
    FakeServer::start(move |line, body| match line {
        "POST /v1/completions" if body.get("prompt_logprobs").is_some() => {
            let ids: Vec<u32> = serde_json::from_value(body["prompt"].clone()).unwrap();
            let served = served.lock().unwrap();
            let mut all = vec![-1.0f32; ids.len() - 1 - served.len()];
            all.extend(served.iter());
            Reply::Status(200, prompt_logprobs_answer(&ids, &all))
        }
        "POST /v1/completions" => Reply::Status(200, group.clone()),
        "POST /collective_rpc" => Reply::Status(200, "{\"results\": [null]}".into()),
        _ => Reply::Status(200, String::new()),
    })
}

#[test]
fn samples_drawn_after_another_process_reloaded_the_server_are_refused() {
    let weights = tempfile::tempdir().unwrap();
    let (ours, theirs) = (model(true, 2), model(true, 5));
    let check = check_for(&ours);
    let served = Arc::new(Mutex::new(check.expected.clone()));
    let fake = sampling_and_scoring(served.clone());
    let mut c = client(&fake.url);
    c.refresh(weights.path(), 3, &tensors(&ours), ours.config(), &check)
        .unwrap();
    let params = SamplingParams {
        group_size: 2,
        max_new_tokens: 2,
        ..Default::default()
    };
    // Still our weights: the samples are used, after one more scoring of the check sequence.
    let n_before = fake.lines().len();
    let out = c.sample(&[vec![1, 2]], 0, &params, 0).unwrap();
    assert_eq!(out.len(), 2);
    assert_eq!(fake.lines().len(), n_before + 2, "{:?}", fake.lines());
    // Another run reloads the server with its weights: the next samples are refused.
    *served.lock().unwrap() =
        trainer_logprobs(&theirs, &check.prompt, &check.completion, 1.0).unwrap();
    let err = c
        .sample(&[vec![1, 2]], 0, &params, 0)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains(&fake.url)
            && err.contains("its weights changed after this client pushed version 3")
            && err.contains("are dropped"),
        "{err}"
    );
}

#[test]
fn a_leased_server_is_refused_naming_the_run_and_its_version() {
    let weights = tempfile::tempdir().unwrap();
    let leases = tempfile::tempdir().unwrap();
    let m = model(true, 2);
    let check = check_for(&m);
    let fake = vllm_serving(Arc::new(Mutex::new(check.expected.clone())), 200);
    let holder = |owner: &str, training| rlvr_vllm::LeaseHolder {
        owner: owner.into(),
        training,
        dir: leases.path().to_path_buf(),
    };
    let mut a = client(&fake.url);
    a.take_lease(holder("training run /runs/a", true)).unwrap();
    a.refresh(weights.path(), 4, &tensors(&m), m.config(), &check)
        .unwrap();
    // A second run on the same server (spelled with localhost) is refused.
    let port = fake.url.rsplit(':').next().unwrap();
    let mut b = client(&format!("http://localhost:{port}/"));
    let err = b
        .take_lease(holder("training run /runs/b", true))
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("is leased to training run /runs/a")
            && err.contains("weights at version 4")
            && err.contains("start another vLLM server"),
        "{err}"
    );
    // An evaluation is told about --share-server.
    let err = client(&fake.url)
        .take_lease(holder("rlvr eval", false))
        .unwrap_err()
        .to_string();
    assert!(err.contains("--share-server"), "{err}");
    drop(a);
    // The lock goes with a's file, but a child process another test forks at that moment holds
    // a copy of every descriptor (close-on-exec ones too) until its exec: the lease is free
    // within that window, not necessarily at once.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    loop {
        match b.take_lease(holder("training run /runs/b", true)) {
            Ok(()) => break,
            Err(e) if std::time::Instant::now() < deadline => {
                assert!(e.to_string().contains("is leased to"), "{e}");
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
            Err(e) => panic!("the lease was not released after a was dropped: {e}"),
        }
    }
}
