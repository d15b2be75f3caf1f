//! LoRA adapters on a real vLLM server: adapters with non-zero B loaded with
//! `POST /v1/load_lora_adapter` are scored and sampled by vLLM as the trainer computes them; a
//! trainer whose base is not the server's model gets its base pushed once; an adapter above the
//! server's `--max-lora-rank` is refused with an error naming the flag; and a short `rlvr train`
//! with LoRA on vLLM follows the sync schedule, every refresh's check passing.
//!
//! scripts/ci_vllm.sh runs this after live_train.rs on the UNTIED model's server, started with
//! `LORA_RANK=8` (`--enable-lora --max-lora-rank 8 --max-loras 3`,
//! `VLLM_ALLOW_RUNTIME_LORA_UPDATING=True`), with `RLVR_VLLM_URL`, `RLVR_VLLM_MODEL` (the served
//! directory: the trainer's base), `RLVR_VLLM_LORA_RANK` (the server's `--max-lora-rank`, default
//! 8) and `RLVR` (the rlvr binary). Ignored by a plain `cargo test` (the script passes
//! `--include-ignored`); run without a server they fail. The tests share the server, so they hold one
//! lock; each test that needs the server's own base weights pushes them first (live_train.rs,
//! run before on the same server, leaves trained weights there), and one that changes them puts
//! the original back.

use crate::common::jsonl;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use candle_core::{DType, Device, Tensor};
use rlvr_model::checkpoint::Policy;
use rlvr_model::{LoraConfig, LoraTarget, Model};
use rlvr_rollout::{named_tensors, Rollout, SamplingParams};
use rlvr_vllm::{
    trainer_logprobs, write_adapter, ClientConfig, RefreshCheck, VllmClient, VllmRollout,
    VllmRolloutConfig,
};

static SERVER: Mutex<()> = Mutex::new(());

struct Live {
    url: String,
    model: PathBuf,
    max_rank: usize,
}

fn live() -> Option<Live> {
    let Ok(url) = std::env::var("RLVR_VLLM_URL") else {
        panic!(
            "RLVR_VLLM_URL is not set: this live test needs a running server; \
             scripts/ci_vllm.sh starts one and runs it (a plain `cargo test` skips it as ignored)"
        );
    };
    Some(Live {
        url,
        model: PathBuf::from(std::env::var("RLVR_VLLM_MODEL").expect("RLVR_VLLM_MODEL")),
        max_rank: std::env::var("RLVR_VLLM_LORA_RANK").map_or(8, |r| r.parse().unwrap()),
    })
}

fn client_config(l: &Live) -> ClientConfig {
    ClientConfig {
        servers: vec![l.url.clone()],
        served_model_name: std::env::var("RLVR_VLLM_NAME").unwrap_or_else(|_| "rlvr-policy".into()),
        timeout: Duration::from_secs(120),
        retries: 1,
        ..Default::default()
    }
}

fn lora(rank: usize) -> LoraConfig {
    LoraConfig {
        rank,
        alpha: 2.0 * rank as f64,
        targets: LoraTarget::ALL.to_vec(),
        dropout: 0.0,
    }
}

/// Sets every B of `m` to N(0, std²) draws (seeded by `seed`), so the adapters change the output.
fn randomise_b(m: &Model, std: f32, seed: u64) {
    for (i, (name, var)) in m.named_vars().into_iter().enumerate() {
        if name.ends_with("lora_B.weight") {
            let dims = var.as_tensor().dims().to_vec();
            let n: usize = dims.iter().product();
            // A small deterministic generator: no rng state shared with other tests.
            let mut x = seed
                .wrapping_mul(6364136223846793005)
                .wrapping_add(i as u64);
            let v: Vec<f32> = (0..n)
                .map(|_| {
                    x = x
                        .wrapping_mul(6364136223846793005)
                        .wrapping_add(1442695040888963407);
                    ((x >> 33) as f32 / (1u64 << 31) as f32 - 0.5) * 3.46 * std
                })
                .collect();
            var.set(&Tensor::from_vec(v, dims, &Device::Cpu).unwrap())
                .unwrap();
        }
    }
}

fn rollout(l: &Live, policy: &Policy, weights_dir: &Path) -> VllmRollout {
    VllmRollout::connect(
        VllmRolloutConfig {
            client: client_config(l),
            weights_dir: weights_dir.to_path_buf(),
            refresh_tolerance: 1e-4,
            follower: false,
            lease: None,
            served_layout: None,
        },
        &policy.model,
        &policy.tokenizer,
        32,
        32,
        "rollout.max_new_tokens",
    )
    .unwrap()
}

/// Pushes the served model's own weights back (full-weight refresh) and unloads this policy's
/// adapters: a test before may have left other weights (live_train.rs's runs leave trained ones).
fn restore_base(l: &Live, served: &Policy, tmp: &Path) {
    let mut c = VllmClient::new(client_config(l)).unwrap();
    let (prompt, completion) = (encode(served, "What is 12 + 30?"), encode(served, " 42"));
    let check = RefreshCheck {
        expected: trainer_logprobs(&served.model, &prompt, &completion, 1.0).unwrap(),
        prompt,
        completion,
        tolerance: 1e-4,
    };
    let tensors = named_tensors(&served.model.without_adapters());
    c.refresh(
        &tmp.join("restore"),
        0,
        &tensors,
        served.model.config(),
        &check,
    )
    .unwrap();
    c.unload_other_adapters("").unwrap();
    let _ = std::fs::remove_dir_all(tmp.join("restore"));
}

fn encode(policy: &Policy, text: &str) -> Vec<u32> {
    policy.tokenizer.encode(text, false).unwrap()
}

/// Largest |a − b| over two equal-length vectors.
fn gap(a: &[f32], b: &[f32]) -> f64 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs() as f64)
        .fold(0.0, f64::max)
}

#[test]
#[ignore = "live: needs a vLLM server, started by scripts/ci_vllm.sh"]
fn adapter_logprobs_on_vllm_equal_the_trainers() {
    let _g = SERVER.lock().unwrap_or_else(|e| e.into_inner());
    let Some(l) = live() else { return };
    let mut policy = Policy::load(&l.model, DType::F32, &Device::Cpu).unwrap();
    let tmp = tempfile::tempdir().unwrap();
    restore_base(&l, &policy, tmp.path());
    policy.model.add_lora(&lora(l.max_rank), 3).unwrap();
    let mut r = rollout(&l, &policy, tmp.path());
    // Version 0: B = 0, the base the server already serves, so no base push.
    r.load_weights(0, &named_tensors(&policy.model)).unwrap();
    assert_eq!(r.base_pushed(), Some(false));
    let t0 = r.last_refresh().unwrap();
    randomise_b(&policy.model, 0.2, 11);
    r.load_weights(1, &named_tensors(&policy.model)).unwrap();
    let t1 = r.last_refresh().unwrap();
    assert_eq!(r.client().model_name(), "rlvr-policy-lora-00000001");

    // A fixed completion scored through the adapter equals the trainer's log-probs (f32, T = 1),
    // and is far from the base's: the adapter is applied.
    let prompt = encode(&policy, "Natalia sold clips to 48 of her friends in April.");
    let completion = encode(&policy, " Then she sold half as many clips in May.");
    let ours = trainer_logprobs(&policy.model, &prompt, &completion, 1.0).unwrap();
    let base =
        trainer_logprobs(&policy.model.without_adapters(), &prompt, &completion, 1.0).unwrap();
    let served = r.client().score(&prompt, &completion).unwrap().remove(0);
    let (d, d_base) = (gap(&served, &ours), gap(&ours, &base));
    eprintln!(
        "adapter r = {}: max |ℓ_vLLM − ℓ_trainer| = {d:.2e} (adapter moves ℓ by up to {d_base:.2})",
        l.max_rank
    );
    assert!(d < 1e-4, "{d}");
    assert!(d_base > 1e-2, "{d_base}");

    // Behaviour log-probs of sampled completions (T = 1) equal the trainer's too.
    let params = SamplingParams {
        group_size: 4,
        temperature: 1.0,
        max_new_tokens: 16,
        stop_ids: policy.tokenizer.eos_ids.clone(),
        ..Default::default()
    };
    let groups = r
        .sample(std::slice::from_ref(&prompt), 0, &params, 9)
        .unwrap();
    let mut worst = 0.0f64;
    for c in groups.into_iter().next().unwrap().unwrap() {
        assert_eq!(c.version, 1);
        let t = trainer_logprobs(&policy.model, &prompt, &c.token_ids, 1.0).unwrap();
        worst = worst.max(gap(&c.behaviour_logprobs, &t));
    }
    eprintln!("sampled at T = 1 through the adapter: max |ℓ_vLLM − ℓ_trainer| = {worst:.2e}");
    assert!(worst < 1e-4, "{worst}");

    // Only the newest adapter stays loaded, and only its directory on disk.
    let listed = r.client().listed_models().unwrap().remove(0);
    let ours_listed: Vec<&String> = listed.iter().filter(|m| m.contains("-lora-")).collect();
    assert_eq!(ours_listed, ["rlvr-policy-lora-00000001"]);
    let dirs: Vec<String> = std::fs::read_dir(tmp.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().to_string())
        .collect();
    assert_eq!(dirs, ["version-00000001"]);

    // What a refresh costs: the adapter (write + load) against a full-weight reload of the same
    // model (write + pause/reload/reset/resume), on the same server.
    let base_model = policy.model.without_adapters();
    let mut full = VllmClient::new(client_config(&l)).unwrap();
    let check = RefreshCheck {
        prompt: prompt.clone(),
        completion: completion.clone(),
        expected: base,
        tolerance: 1e-4,
    };
    let full_dir = tmp.path().join("full");
    let tf = full
        .refresh(
            &full_dir,
            2,
            &named_tensors(&base_model),
            base_model.config(),
            &check,
        )
        .unwrap();
    eprintln!(
        "refresh cost: adapter v0 write {:.4} s + load {:.4} s + check {:.4} s; adapter v1 write {:.4} s + load {:.4} s + check {:.4} s; full-weight reload write {:.4} s + reload {:.4} s + check {:.4} s",
        t0.write_s, t0.reload_s, t0.verify_s, t1.write_s, t1.reload_s, t1.verify_s, tf.write_s, tf.reload_s, tf.verify_s
    );
    full.unload_other_adapters("").unwrap();
}

#[test]
#[ignore = "live: needs a vLLM server, started by scripts/ci_vllm.sh"]
fn a_trainer_base_other_than_the_servers_is_pushed_once() {
    let _g = SERVER.lock().unwrap_or_else(|e| e.into_inner());
    let Some(l) = live() else { return };
    let served = Policy::load(&l.model, DType::F32, &Device::Cpu).unwrap();
    // Another base of the same shapes: the served model with every weight scaled by 0.9.
    let mut other = Policy::load(&l.model, DType::F32, &Device::Cpu).unwrap();
    for (_, v) in other.model.named_vars() {
        v.set(&(v.as_tensor() * 0.9).unwrap()).unwrap();
    }
    other.model.add_lora(&lora(l.max_rank), 4).unwrap();
    randomise_b(&other.model, 0.2, 12);
    let tmp = tempfile::tempdir().unwrap();
    let mut r = rollout(&l, &other, tmp.path());
    r.load_weights(0, &named_tensors(&other.model)).unwrap();
    assert_eq!(r.base_pushed(), Some(true));
    let prompt = encode(&other, "What is 12 + 30?");
    let completion = encode(&other, " It is 42, and 42 is the answer.");
    let ours = trainer_logprobs(&other.model, &prompt, &completion, 1.0).unwrap();
    let served_lp = r.client().score(&prompt, &completion).unwrap().remove(0);
    let d = gap(&served_lp, &ours);
    eprintln!("other base pushed, then its adapter: max |ℓ_vLLM − ℓ_trainer| = {d:.2e}");
    assert!(d < 1e-4, "{d}");
    // Put the served model's weights back for the other tests.
    restore_base(&l, &served, tmp.path());
}

#[test]
#[ignore = "live: needs a vLLM server, started by scripts/ci_vllm.sh"]
fn an_adapter_above_the_servers_max_rank_is_refused_naming_the_flag() {
    let _g = SERVER.lock().unwrap_or_else(|e| e.into_inner());
    let Some(l) = live() else { return };
    let mut policy = Policy::load(&l.model, DType::F32, &Device::Cpu).unwrap();
    let rank = 2 * l.max_rank;
    policy.model.add_lora(&lora(rank), 5).unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let dir = write_adapter(tmp.path(), 1, &policy.model).unwrap();
    let c = VllmClient::new(client_config(&l)).unwrap();
    let e = c
        .load_adapter("rlvr-policy-lora-too-big", &dir, rank)
        .unwrap_err()
        .to_string();
    eprintln!("{e}");
    assert!(e.contains(&l.url), "{e}");
    assert!(
        e.contains(&format!("rank {rank} is above its --max-lora-rank")),
        "{e}"
    );
    // The server is still healthy and serving.
    let s = rlvr_vllm::Server::new(&l.url, None, Default::default()).unwrap();
    s.health().unwrap();
}

#[test]
#[ignore = "live: needs a vLLM server, started by scripts/ci_vllm.sh"]
fn a_lora_run_on_vllm_follows_the_schedule() {
    let _g = SERVER.lock().unwrap_or_else(|e| e.into_inner());
    let Some(l) = live() else { return };
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let rlvr = std::env::var("RLVR")
        .map(PathBuf::from)
        .unwrap_or_else(|_| root.join("target/debug/rlvr"));
    let tmp = tempfile::tempdir().unwrap();
    let served = Policy::load(&l.model, DType::F32, &Device::Cpu).unwrap();
    restore_base(&l, &served, tmp.path());
    let run = tmp.path().join("lora");
    let score = tmp.path().join("score.sh");
    // The parity of the input line's length: varied rewards, so every step has gradients.
    std::fs::write(
        &score,
        "exec awk '{ print \"{\\\"reward\\\": \" (length($0) % 2) \"}\" }'\n",
    )
    .unwrap();
    let sets = [
        format!(
            "data.verifier={{ kind = \"external\", command = [\"sh\", \"{}\"] }}",
            score.display()
        ),
        format!("model.path={}", l.model.display()),
        format!("model.lora_rank={}", l.max_rank),
        format!("output.dir={}", run.display()),
        "data.task=\"arithmetic\"".into(),
        "data.arithmetic.train_size=64".into(),
        "data.arithmetic.test_size=8".into(),
        "data.prompts_per_step=2".into(),
        "rollout.group_size=4".into(),
        "rollout.max_new_tokens=8".into(),
        "rollout.temperature=1.0".into(),
        "rollout.backend=\"vllm\"".into(),
        format!("rollout.servers=[\"{}\"]", l.url),
        "rollout.retries=1".into(),
        "rollout.request_timeout_s=60".into(),
        "rollout.refresh_tolerance=1e-4".into(),
        "sync.interval=2".into(),
        "train.steps=4".into(),
        "train.lr=1e-1".into(),
        "train.micro_batch_size=8".into(),
        "train.eval_every=0".into(),
        "train.save_every=0".into(),
        "train.log_rollouts=100".into(),
        "train.seed=5".into(),
    ];
    let mut c = Command::new(&rlvr);
    c.arg("train").arg("--no-progress").stdin(Stdio::null());
    for s in &sets {
        c.arg("--set").arg(s);
    }
    let t0 = Instant::now();
    let st = c.status().unwrap();
    assert!(
        st.success(),
        "rlvr train with LoRA on vLLM failed: see {}",
        run.display()
    );
    eprintln!(
        "4-step LoRA run on vLLM: {:.1} s",
        t0.elapsed().as_secs_f64()
    );
    // Staleness 0, 1, 0, 1: step t samples with version 2·⌊(t−1)/2⌋.
    let rollouts = jsonl(&run.join("rollouts.jsonl"));
    assert_eq!(rollouts.len(), 4 * 8);
    for r in &rollouts {
        let t = r["step"].as_u64().unwrap();
        assert_eq!(
            r["version"].as_u64(),
            Some(2 * ((t - 1) / 2)),
            "step {t}: {r}"
        );
        assert_eq!(r["staleness"].as_u64(), Some((t - 1) % 2), "step {t}: {r}");
    }
    // At staleness 0 vLLM's behaviour log-probs (through the adapter) equal the trainer's.
    let diag = jsonl(&run.join("diagnostics.jsonl"));
    assert_eq!(diag.len(), 4);
    for d in &diag {
        let t = d["step"].as_u64().unwrap();
        if t % 2 == 1 {
            let g = d["logprob_diff/staleness0"].as_f64().unwrap();
            eprintln!("step {t}: mean |ℓ_vLLM − ℓ_trainer| at staleness 0 = {g:.2e}");
            assert!(g < 1e-4, "step {t}: {g}");
        }
    }
    // The adapters moved (version 2 differs from version 0): the behaviour KL at staleness 1.
    for m in jsonl(&run.join("metrics.jsonl")) {
        let t = m["step"].as_u64().unwrap();
        let kl = m["kl_behaviour"].as_f64().unwrap();
        eprintln!("step {t}: kl_behaviour {kl:.3e}");
        if t % 2 == 0 {
            assert!(kl > 0.0, "step {t}: kl_behaviour {kl}");
        }
    }
    // Every sync pushed an adapter (no full-weight directory); only the newest is kept on disk
    // and loaded on the server.
    let names: Vec<String> = std::fs::read_dir(run.join("vllm-weights"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().to_string())
        .collect();
    assert_eq!(names, ["version-00000004"]);
    assert!(run
        .join("vllm-weights/version-00000004/adapter/adapter_model.safetensors")
        .is_file());
    let c = VllmClient::new(client_config(&l)).unwrap();
    let listed = c.listed_models().unwrap().remove(0);
    let ours: Vec<&String> = listed.iter().filter(|m| m.contains("-lora-")).collect();
    assert_eq!(ours, ["rlvr-policy-lora-00000004"]);
    c.unload_other_adapters("").unwrap();
}
