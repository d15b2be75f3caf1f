//! LoRA adapters on vLLM ([`rlvr_vllm::lora`]) against a fake server that answers like vLLM 0.32
//! (its plain-text success answers and its error answers, copied from the real CPU server): the
//! load / unload calls, the refresh check through the adapter name, and the errors that name the
//! missing server flags.

use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::common::{check_for, completion_answer, FakeServer, Reply};
use candle_core::{DType, Device, Tensor};
use rlvr_model::{LoraConfig, LoraTarget, Model, ModelConfig};
use rlvr_rollout::SamplingParams;
use rlvr_vllm::{adapter_name, trainer_logprobs, version_dir, ClientConfig, VllmClient, VllmError};
use serde_json::{json, Value};

/// A tiny random qwen2 with rank-2 adapters on every projection and non-zero B.
fn lora_model(seed: u64) -> Model {
    let config = ModelConfig::from_json(
        &json!({"model_type": "qwen2", "vocab_size": 64, "hidden_size": 16, "intermediate_size": 32,
                "num_hidden_layers": 1, "num_attention_heads": 2, "num_key_value_heads": 1,
                "max_position_embeddings": 64, "tie_word_embeddings": false}),
        "inline".as_ref(),
    )
    .unwrap();
    let mut m = Model::random(config, 0.5, 3, DType::F32, &Device::Cpu).unwrap();
    let lora = LoraConfig {
        rank: 2,
        alpha: 4.0,
        targets: LoraTarget::ALL.to_vec(),
        dropout: 0.0,
    };
    m.add_lora(&lora, seed).unwrap();
    for (i, (name, var)) in m.named_vars().into_iter().enumerate() {
        if name.ends_with("lora_B.weight") {
            let t = Tensor::randn(0f32, 0.3, var.as_tensor().dims(), &Device::Cpu).unwrap();
            var.set(&(t + i as f64 * 1e-3).unwrap()).unwrap();
        }
    }
    m
}

fn client(url: &str) -> VllmClient {
    VllmClient::new(ClientConfig {
        servers: vec![url.to_string()],
        served_model_name: "policy".into(),
        retries: 1,
        backoff: Duration::from_millis(10),
        timeout: Duration::from_secs(5),
        ..Default::default()
    })
    .unwrap()
}

/// vLLM's prompt_logprobs answer for `ids` whose last `served.len()` log-probs are `served`.
fn scoring_answer(ids: &[u32], served: &[f32]) -> String {
    let mut pl = vec![Value::Null];
    for (k, id) in ids[1..].iter().enumerate() {
        let lp = if k + served.len() >= ids.len() - 1 {
            served[k + served.len() + 1 - ids.len()]
        } else {
            -1.0
        };
        pl.push(json!({ id.to_string(): {"logprob": lp, "rank": 1, "decoded_token": "x"} }));
    }
    json!({"choices": [{"index": 0, "text": "", "prompt_logprobs": pl, "finish_reason": "length"}]})
        .to_string()
}

/// A fake vLLM with LoRA on: it keeps the set of loaded adapters (listed by /v1/models), loads
/// with vLLM's plain-text answer, and scores any loaded adapter with `served`.
struct LoraServer {
    fake: FakeServer,
    loaded: Arc<Mutex<Vec<String>>>,
    served: Arc<Mutex<Vec<f32>>>,
}

fn lora_server(load_reply: Option<Reply>) -> LoraServer {
    let loaded = Arc::new(Mutex::new(vec!["policy-lora-00000001".to_string()]));
    let served = Arc::new(Mutex::new(Vec::new()));
    let (l, s) = (loaded.clone(), served.clone());
    let fake = FakeServer::start(move |line, body| match line {
        "POST /v1/load_lora_adapter" => {
            if let Some(r) = &load_reply {
                return r.clone();
            }
            let name = body["lora_name"].as_str().unwrap().to_string();
            let mut l = l.lock().unwrap();
            if !l.contains(&name) {
                l.push(name.clone());
            }
            Reply::Status(
                200,
                format!("Success: LoRA adapter '{name}' added successfully."),
            )
        }
        "POST /v1/unload_lora_adapter" => {
            let name = body["lora_name"].as_str().unwrap().to_string();
            let mut l = l.lock().unwrap();
            match l.iter().position(|n| *n == name) {
                Some(i) => {
                    l.remove(i);
                    Reply::Status(
                        200,
                        format!("Success: LoRA adapter '{name}' removed successfully."),
                    )
                }
                None => Reply::Status(
                    404,
                    json!({"error": {"message": format!("The lora adapter '{name}' cannot be found."),
                        "type": "NotFoundError", "code": 404}})
                    .to_string(),
                ),
            }
        }
        "GET /v1/models" => {
            let mut data = vec![json!({"id": "policy", "max_model_len": 512})];
            for n in l.lock().unwrap().iter() {
                data.push(json!({"id": n, "parent": "policy"}));
            }
            data.push(json!({"id": "other-lora-00000001", "parent": "policy"}));
            Reply::Status(200, json!({"object": "list", "data": data}).to_string())
        }
        "POST /v1/completions" if body.get("prompt_logprobs").is_some() => {
            let model = body["model"].as_str().unwrap().to_string();
            if model != "policy" && !l.lock().unwrap().contains(&model) {
                return Reply::Status(
                    404,
                    json!({"error": {"message": format!("The model `{model}` does not exist.")}})
                        .to_string(),
                );
            }
            let ids: Vec<u32> = serde_json::from_value(body["prompt"].clone()).unwrap();
            Reply::Status(200, scoring_answer(&ids, &s.lock().unwrap()))
        }
        "POST /v1/completions" => Reply::Status(
            200,
            completion_answer(
                &[vec![5, 6]],
                &[vec![-0.5, -1.0]],
                &[("length", Value::Null)],
            ),
        ),
        _ => Reply::Status(404, "{\"detail\":\"Not Found\"}".into()),
    });
    LoraServer {
        fake,
        loaded,
        served,
    }
}

fn params() -> SamplingParams {
    SamplingParams {
        group_size: 1,
        max_new_tokens: 2,
        ..Default::default()
    }
}

fn safetensor_names(file: &Path) -> Vec<String> {
    let mut v: Vec<String> = candle_core::safetensors::load(file, &Device::Cpu)
        .unwrap()
        .into_keys()
        .collect();
    v.sort();
    v
}

#[test]
fn refresh_writes_peft_files_loads_checks_through_the_adapter_and_unloads_the_old_one() {
    let m = lora_model(1);
    let check = check_for(&m);
    let s = lora_server(None);
    *s.served.lock().unwrap() = check.expected.clone();
    let dir = tempfile::tempdir().unwrap();
    // An older version directory that the refresh must delete.
    std::fs::create_dir_all(version_dir(dir.path(), 1)).unwrap();
    let mut c = client(&s.fake.url);
    let t = c.refresh_adapter(dir.path(), 2, &m, &check).unwrap();
    assert!(t.max_abs_diff < 1e-6, "{t:?}");

    let name = adapter_name("policy", 2);
    assert_eq!(name, "policy-lora-00000002");
    assert_eq!((c.version(), c.model_name()), (2, name.as_str()));
    let seen = s.fake.seen.lock().unwrap().clone();
    let lines: Vec<&str> = seen.iter().map(|x| x.line.as_str()).collect();
    assert_eq!(
        lines,
        [
            "POST /v1/load_lora_adapter",
            "POST /v1/completions",
            "GET /v1/models",
            "POST /v1/unload_lora_adapter"
        ]
    );
    let adapter = version_dir(&dir.path().canonicalize().unwrap(), 2).join("adapter");
    assert_eq!(
        seen[0].body,
        json!({"lora_name": name, "lora_path": adapter.to_string_lossy(), "load_inplace": true})
    );
    assert_eq!(seen[1].body["model"], json!(name));
    assert_eq!(seen[1].body["prompt"], json!([1, 2, 3, 4, 5, 6, 7]));
    // Only this policy's older adapter is unloaded, not another run's.
    assert_eq!(seen[3].body, json!({"lora_name": "policy-lora-00000001"}));
    assert_eq!(*s.loaded.lock().unwrap(), vec![name.clone()]);

    // PEFT's files with PEFT's names; the older version directory is gone.
    let cfg: Value =
        serde_json::from_slice(&std::fs::read(adapter.join("adapter_config.json")).unwrap())
            .unwrap();
    assert_eq!(
        (cfg["peft_type"].as_str(), cfg["r"].as_u64()),
        (Some("LORA"), Some(2))
    );
    assert_eq!(cfg["lora_alpha"], json!(4));
    let names = safetensor_names(&adapter.join("adapter_model.safetensors"));
    assert_eq!(names.len(), 14);
    assert!(
        names.contains(&"base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight".into())
    );
    assert!(names.contains(&"base_model.model.model.layers.0.mlp.down_proj.lora_B.weight".into()));
    let mut left: Vec<String> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().to_string())
        .collect();
    left.sort();
    assert_eq!(left, vec!["version-00000002".to_string()]);

    // The written adapter is the model's: loading it back gives the same log-probs.
    let back = Model::load(&version_dir(dir.path(), 2), DType::F32, &Device::Cpu).unwrap();
    let again = trainer_logprobs(&back, &check.prompt, &check.completion, 1.0).unwrap();
    assert_eq!(again, check.expected);

    // Sampling names the adapter version.
    let out = c.sample(&[vec![1, 2]], 0, &params(), 0).unwrap();
    assert_eq!(out[0].version, 2);
    let last = s.fake.seen.lock().unwrap().last().unwrap().clone();
    assert_eq!(last.body["model"], json!(name));
}

#[test]
fn a_server_scoring_the_adapter_differently_fails_the_refresh_and_blocks_sampling() {
    let m = lora_model(1);
    let check = check_for(&m);
    let s = lora_server(None);
    // The server serves B = 0 (the base): what a server ignoring the adapter would score.
    let base = m.without_adapters();
    *s.served.lock().unwrap() =
        trainer_logprobs(&base, &check.prompt, &check.completion, 1.0).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let mut c = client(&s.fake.url);
    let e = c.refresh_adapter(dir.path(), 3, &m, &check).unwrap_err();
    let msg = e.to_string();
    assert!(matches!(e, VllmError::Check { .. }), "{msg}");
    assert!(
        msg.contains(&s.fake.url) && msg.contains("other weights"),
        "{msg}"
    );
    assert_eq!(c.version(), 0);
    assert_eq!(c.model_name(), "policy");
    let e = c
        .sample(&[vec![1]], 0, &params(), 0)
        .unwrap_err()
        .to_string();
    assert!(e.contains("refresh to version 3 failed"), "{e}");
    // Nothing was unloaded: the refresh stopped at the check.
    assert!(!s
        .fake
        .lines()
        .contains(&"POST /v1/unload_lora_adapter".to_string()));
}

fn load_failure(reply: Reply) -> (String, usize) {
    let m = lora_model(1);
    let check = check_for(&m);
    let s = lora_server(Some(reply));
    let dir = tempfile::tempdir().unwrap();
    let mut c = client(&s.fake.url);
    let e = c.refresh_adapter(dir.path(), 1, &m, &check).unwrap_err();
    assert!(matches!(e, VllmError::Check { .. }), "{e}");
    assert!(c.sample(&[vec![1]], 0, &params(), 0).is_err());
    let loads = s
        .fake
        .lines()
        .iter()
        .filter(|l| *l == "POST /v1/load_lora_adapter")
        .count();
    (e.to_string(), loads)
}

#[test]
fn load_errors_name_the_server_flags() {
    // The route is missing: VLLM_ALLOW_RUNTIME_LORA_UPDATING unset (FastAPI's 404, not retried).
    let (e, n) = load_failure(Reply::Status(404, "{\"detail\":\"Not Found\"}".into()));
    assert_eq!(n, 1);
    assert!(e.contains("no /v1/load_lora_adapter route"), "{e}");
    assert!(e.contains("VLLM_ALLOW_RUNTIME_LORA_UPDATING=True"), "{e}");
    assert!(e.contains("--enable-lora") && e.contains("HTTP 404"), "{e}");

    // The real CPU server's answer to a rank-16 adapter with --max-lora-rank 8 (a 500, retried).
    let rank = "{\"error\":{\"message\":\"Call to add_lora method failed: Worker failed with error \
                'LoRA rank 16 is greater than max_lora_rank 8.', please check the stack trace above \
                for the root cause\",\"type\":\"InternalServerError\",\"param\":null,\"code\":500}}";
    let (e, n) = load_failure(Reply::Status(500, rank.into()));
    assert_eq!(n, 2);
    assert!(e.contains("rank 2 is above its --max-lora-rank"), "{e}");
    assert!(e.contains("greater than max_lora_rank 8"), "{e}");

    // vLLM's worker without --enable-lora (lora_model_runner_mixin.py).
    let off = "{\"error\":{\"message\":\"LoRA is not enabled. Use --enable-lora to enable LoRA.\",\
               \"type\":\"InternalServerError\",\"code\":500}}";
    let (e, _) = load_failure(Reply::Status(500, off.into()));
    assert!(e.contains("started without --enable-lora"), "{e}");
    assert!(e.contains("--max-lora-rank R"), "{e}");
}

#[test]
fn unload_tolerates_a_missing_adapter_and_reports_other_failures() {
    let s = lora_server(None);
    let c = client(&s.fake.url);
    c.unload_adapter("policy-lora-00000009").unwrap();
    c.unload_adapter("policy-lora-00000001").unwrap();
    assert!(s.loaded.lock().unwrap().is_empty());
    let broken = FakeServer::scripted(vec![Reply::Status(
        500,
        "{\"error\": \"engine died\"}".into(),
    )]);
    let e = client(&broken.url)
        .unload_adapter("x")
        .unwrap_err()
        .to_string();
    assert!(
        e.contains(&broken.url) && e.contains("unload_lora_adapter") && e.contains("engine died"),
        "{e}"
    );
    assert_eq!(broken.lines().len(), 2);
}

#[test]
fn a_plain_text_answer_is_not_retried_as_malformed_json() {
    let fake = FakeServer::scripted(vec![Reply::Status(
        200,
        "Success: LoRA adapter 'a' added successfully.".into(),
    )]);
    let m = lora_model(1);
    let c = client(&fake.url);
    c.load_adapter("a", Path::new("/nowhere"), m.lora_config().unwrap().rank)
        .unwrap();
    assert_eq!(fake.lines(), vec!["POST /v1/load_lora_adapter".to_string()]);
}
