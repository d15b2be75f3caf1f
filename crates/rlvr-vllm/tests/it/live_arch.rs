//! One architecture on a real vLLM server: the checkpoint rlvr saves serves, its log-probs equal
//! the trainer's, every weight a refresh sends reaches the server (each kind of tensor changed on
//! its own, then all at once), and, on a LoRA-enabled server, the adapters rlvr trains for that
//! architecture are scored as the trainer scores them.
//!
//! Any architecture rlvr trains: the model directory `RLVR_VLLM_MODEL` (an `rlvr init --arch …`
//! checkpoint, head size ≥ 32: vLLM's CPU attention refuses 16) served at `RLVR_VLLM_URL` as
//! `RLVR_VLLM_NAME` (default rlvr-policy) by `scripts/vllm_server.sh start` with `LORA_RANK=R`
//! (`--enable-lora --max-lora-rank R`), R given to the tests as `RLVR_VLLM_LORA_RANK`.
//! scripts/ci_vllm.sh runs it on a Phi-3 model (fused `qkv_proj`/`gate_up_proj` in its files,
//! split in rlvr's refresh: the architecture most at risk); docs/vllm.md lists the architectures
//! checked by hand. Ignored by a plain `cargo test`; run without a server they fail. The tests
//! share the server, so they hold one lock, and each puts the served weights back at its end.

use crate::common::tensors;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::Duration;

use candle_core::{DType, Device, Tensor};
use rlvr_model::checkpoint::Policy;
use rlvr_model::{Arch, LoraConfig, LoraTarget, Model};
use rlvr_rollout::{named_tensors, Rollout, SamplingParams};
use rlvr_vllm::{
    trainer_logprobs, ClientConfig, RefreshCheck, ServedLayout, VllmClient, VllmRollout,
    VllmRolloutConfig,
};

static SERVER: Mutex<()> = Mutex::new(());

/// The bar of every live test between the server's and the trainer's log-probs (f32 on both).
const TOLERANCE: f64 = 1e-4;

struct Live {
    url: String,
    dir: PathBuf,
    policy: Policy,
}

fn live() -> Live {
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
    eprintln!(
        "architecture {} ({}), tied embeddings {}",
        policy.model.config().arch.model_type(),
        dir.display(),
        policy.model.config().tie_word_embeddings
    );
    Live { url, dir, policy }
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

fn encode(l: &Live, text: &str) -> Vec<u32> {
    l.policy.tokenizer.encode(text, false).unwrap()
}

fn prompts(l: &Live) -> Vec<Vec<u32>> {
    ["What is 12 + 30?", "def fib(n):"]
        .iter()
        .map(|t| encode(l, t))
        .collect()
}

/// The fixed sequence every check scores: a prompt and a 14-token completion of spread ids.
fn fixed(l: &Live) -> (Vec<u32>, Vec<u32>) {
    let vocab = l.policy.tokenizer.vocab_size() as u32;
    let completion = (0..14u32).map(|i| (100 + 613 * i) % vocab).collect();
    (
        encode(l, "Natalia sold clips to 48 of her friends in April."),
        completion,
    )
}

fn check_of(l: &Live, m: &Model) -> RefreshCheck {
    let (prompt, completion) = fixed(l);
    RefreshCheck {
        expected: trainer_logprobs(m, &prompt, &completion, 1.0).unwrap(),
        prompt,
        completion,
        tolerance: TOLERANCE,
    }
}

/// Largest |a − b| over two equal-length vectors.
fn gap(a: &[f32], b: &[f32]) -> f64 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs() as f64)
        .fold(0.0, f64::max)
}

/// `t` + N(0, σ²)-like noise with σ = 0.5 · rms(t) + 0.05, from a deterministic generator seeded
/// by `seed`: every element moves, norms' gains (stored near 0 for Gemma's `1 + w`) included.
fn perturbed(t: &Tensor, seed: u64) -> Tensor {
    let dims = t.dims().to_vec();
    let v: Vec<f32> = t.flatten_all().unwrap().to_vec1().unwrap();
    let rms = (v.iter().map(|x| (x * x) as f64).sum::<f64>() / v.len() as f64).sqrt();
    let sigma = (0.5 * rms + 0.05) as f32;
    let mut x = seed.wrapping_mul(6364136223846793005) | 1;
    let out: Vec<f32> = v
        .iter()
        .map(|a| {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            a + ((x >> 33) as f32 / (1u64 << 31) as f32 - 0.5) * 3.46 * sigma
        })
        .collect();
    Tensor::from_vec(out, dims, &Device::Cpu).unwrap()
}

/// The kind of a weight: its name with the layer index replaced by `*`
/// (`model.layers.*.self_attn.q_proj.weight`).
fn kind(name: &str) -> String {
    name.split('.')
        .map(|p| match p.bytes().all(|b| b.is_ascii_digit()) {
            true => "*",
            false => p,
        })
        .collect::<Vec<_>>()
        .join(".")
}

/// A copy of the served model with `weights` loaded.
fn model_with(l: &Live, weights: &[(String, Tensor)]) -> Model {
    let m = Policy::load(&l.dir, DType::F32, &Device::Cpu)
        .unwrap()
        .model;
    m.load_named(weights).unwrap();
    m
}

/// A client whose full-weight refreshes name the weights as the served checkpoint does
/// ([`ServedLayout::of_dir`], as `rlvr train` sets it from `model.path`).
fn client(l: &Live) -> VllmClient {
    let mut c = VllmClient::new(client_config(l)).unwrap();
    c.set_served_layout(ServedLayout::of_dir(&l.dir).unwrap());
    c
}

/// Pushes the served checkpoint's own weights back (a full-weight refresh, checked).
fn restore(l: &Live, weights_dir: &Path) {
    let mut c = client(l);
    c.refresh(
        &weights_dir.join("restore"),
        0,
        &named_tensors(&l.policy.model),
        l.policy.model.config(),
        &check_of(l, &l.policy.model),
    )
    .unwrap();
    let _ = std::fs::remove_dir_all(weights_dir.join("restore"));
}

/// Largest |ℓ_vLLM − ℓ_trainer(m)| over the tokens of completions sampled from `c` (4 per
/// prompt of [`prompts`], up to 16 tokens, at `temperature`, from `seed`).
fn sampled_gap(l: &Live, c: &VllmClient, m: &Model, temperature: f64, seed: u64) -> f64 {
    let p = prompts(l);
    let params = SamplingParams {
        group_size: 4,
        temperature,
        max_new_tokens: 16,
        stop_ids: l.policy.tokenizer.eos_ids.clone(),
        ..Default::default()
    };
    let out = c.sample(&p, 0, &params, seed).unwrap();
    assert_eq!(out.len(), p.len() * 4);
    let mut worst = 0.0f64;
    for o in &out {
        let ours = trainer_logprobs(m, &p[o.prompt_index], &o.token_ids, temperature).unwrap();
        worst = worst.max(gap(&o.behaviour_logprobs, &ours));
    }
    worst
}

#[test]
#[ignore = "live: needs a vLLM server, started by scripts/ci_vllm.sh"]
fn the_saved_checkpoint_serves_with_the_trainers_logprobs() {
    let _g = SERVER.lock().unwrap_or_else(|e| e.into_inner());
    let l = live();
    let tmp = tempfile::tempdir().unwrap();
    // A test before may have left other weights on the server.
    restore(&l, tmp.path());
    let c = client(&l);
    c.check_servers(&l.policy.tokenizer, 32, 64, "rollout.max_new_tokens")
        .unwrap();
    let mode = c
        .check_logprob_mode(&l.policy.model, &prompts(&l)[0], 16)
        .unwrap();
    eprintln!(
        "log-prob-mode check: mean |ℓ_vLLM − ℓ_trainer| at T = 0.7 = {:.2e}",
        mode[0]
    );
    assert!(mode[0] < TOLERANCE, "{mode:?}");
    let (prompt, completion) = fixed(&l);
    let served = c.score(&prompt, &completion).unwrap().remove(0);
    let ours = trainer_logprobs(&l.policy.model, &prompt, &completion, 1.0).unwrap();
    let d = gap(&served, &ours);
    eprintln!("fixed sequence: max |ℓ_vLLM − ℓ_trainer| = {d:.2e}");
    assert!(d < TOLERANCE, "{d}");
    for t in [1.0, 0.7] {
        let g = sampled_gap(&l, &c, &l.policy.model, t, 5);
        eprintln!("sampled at T = {t}: max |ℓ_vLLM − ℓ_trainer| = {g:.2e}");
        assert!(g < TOLERANCE, "T = {t}: {g}");
    }
}

#[test]
#[ignore = "live: needs a vLLM server, started by scripts/ci_vllm.sh"]
fn every_weight_a_refresh_sends_reaches_the_server() {
    let _g = SERVER.lock().unwrap_or_else(|e| e.into_inner());
    let l = live();
    let tmp = tempfile::tempdir().unwrap();
    let weights_dir = tmp.path().join("weights");
    let base = tensors(&l.policy.model);
    let base_lp = check_of(&l, &l.policy.model).expected;
    let mut kinds: BTreeMap<String, Vec<usize>> = BTreeMap::new();
    for (i, (name, _)) in base.iter().enumerate() {
        kinds.entry(kind(name)).or_default().push(i);
    }
    let mut c = client(&l);
    // Each kind of weight changed alone: a kind the server's loader skipped (kept its old values)
    // or put elsewhere fails the refresh's check, since the trainer's log-probs moved.
    let mut version = 0;
    for (k, idx) in &kinds {
        version += 1;
        let mut w = base.clone();
        for &i in idx {
            w[i].1 = perturbed(&w[i].1, version * 1000 + i as u64);
        }
        let m = model_with(&l, &w);
        let check = check_of(&l, &m);
        let moved = gap(&check.expected, &base_lp);
        assert!(
            moved > 10.0 * TOLERANCE,
            "changing {k} moves the trainer's log-probs by {moved} only: the check cannot tell"
        );
        let t = c
            .refresh(
                &weights_dir,
                version,
                &named_tensors(&m),
                m.config(),
                &check,
            )
            .unwrap_or_else(|e| panic!("refresh with only {k} changed: {e}"));
        eprintln!(
            "{k} ({} tensors) changed alone: ℓ moved by up to {moved:.3}, server within {:.2e}",
            idx.len(),
            t.max_abs_diff
        );
    }
    // All at once, then sampled at T = 1 and 0.7 with the new weights, not the old.
    version += 1;
    let w: Vec<(String, Tensor)> = (base.iter().enumerate())
        .map(|(i, (n, t))| (n.clone(), perturbed(t, 7 + i as u64)))
        .collect();
    let m = model_with(&l, &w);
    c.refresh(
        &weights_dir,
        version,
        &named_tensors(&m),
        m.config(),
        &check_of(&l, &m),
    )
    .unwrap();
    for t in [1.0, 0.7] {
        let g_new = sampled_gap(&l, &c, &m, t, 3);
        let g_old = sampled_gap(&l, &c, &l.policy.model, t, 3);
        eprintln!(
            "all weights changed, sampled at T = {t}: max gap to the new weights {g_new:.2e}, \
             to the old {g_old:.2}"
        );
        assert!(g_new < TOLERANCE, "T = {t}: {g_new}");
        assert!(
            g_old > 1e-2,
            "T = {t}: the old weights score alike ({g_old})"
        );
    }
    restore(&l, tmp.path());
}

/// The LoRA targets rlvr adapts for `arch` (phi3: the unfused projections only).
fn targets(arch: Arch) -> Vec<LoraTarget> {
    match arch {
        Arch::Phi3 => vec![LoraTarget::O, LoraTarget::Down],
        _ => LoraTarget::ALL.to_vec(),
    }
}

/// Sets every B of `m` to uniform draws of standard deviation `std` (seeded by `seed`), so the
/// adapters change the output.
fn randomise_b(m: &Model, std: f32, seed: u64) {
    for (i, (name, var)) in m.named_vars().into_iter().enumerate() {
        if name.ends_with("lora_B.weight") {
            let zero = (var.as_tensor() * 0.0).unwrap();
            let t = perturbed(&zero, seed + i as u64);
            // perturbed() adds 0.05-σ noise to zeros; scale it to `std`.
            var.set(&(t * (std / 0.05) as f64).unwrap()).unwrap();
        }
    }
}

#[test]
#[ignore = "live: needs a LoRA-enabled vLLM server, started by scripts/ci_vllm.sh"]
fn adapters_load_by_name_with_the_trainers_logprobs() {
    let _g = SERVER.lock().unwrap_or_else(|e| e.into_inner());
    let l = live();
    let rank: usize = std::env::var("RLVR_VLLM_LORA_RANK")
        .expect("RLVR_VLLM_LORA_RANK: the server's --max-lora-rank (LORA_RANK of vllm_server.sh)")
        .parse()
        .unwrap();
    let tmp = tempfile::tempdir().unwrap();
    restore(&l, tmp.path());
    let mut policy = Policy::load(&l.dir, DType::F32, &Device::Cpu).unwrap();
    let arch = policy.model.config().arch;
    let cfg = LoraConfig {
        rank,
        alpha: 2.0 * rank as f64,
        targets: targets(arch),
        dropout: 0.0,
    };
    policy.model.add_lora(&cfg, 3).unwrap();
    let layout = ServedLayout::of_dir(&l.dir).unwrap();
    let connected = VllmRollout::connect(
        VllmRolloutConfig {
            client: client_config(&l),
            weights_dir: tmp.path().join("weights"),
            refresh_tolerance: TOLERANCE,
            follower: false,
            lease: None,
            served_layout: Some(ServedLayout::of_dir(&l.dir).unwrap()),
        },
        &policy.model,
        &policy.tokenizer,
        32,
        32,
        "rollout.max_new_tokens",
    );
    if matches!(layout, ServedLayout::Gemma3Multimodal(_)) {
        // vLLM does not apply a text-model adapter to the wrapper: refused before any push.
        let e = connected.err().expect("refused").to_string();
        eprintln!("multimodal Gemma 3 with LoRA: {e}");
        assert!(e.contains("LoRA on a multimodal Gemma 3"), "{e}");
        return;
    }
    let mut r = connected.unwrap();
    r.load_weights(0, &named_tensors(&policy.model)).unwrap();
    assert_eq!(r.base_pushed(), Some(false));
    randomise_b(&policy.model, 0.2, 11);
    r.load_weights(1, &named_tensors(&policy.model)).unwrap();
    assert_eq!(r.client().model_name(), "rlvr-policy-lora-00000001");
    let (prompt, completion) = fixed(&l);
    let ours = trainer_logprobs(&policy.model, &prompt, &completion, 1.0).unwrap();
    let base =
        trainer_logprobs(&policy.model.without_adapters(), &prompt, &completion, 1.0).unwrap();
    let served = r.client().score(&prompt, &completion).unwrap().remove(0);
    let (d, d_base) = (gap(&served, &ours), gap(&ours, &base));
    eprintln!(
        "{} adapter r = {rank} on {:?}: max |ℓ_vLLM − ℓ_trainer| = {d:.2e} (the adapter moves ℓ \
         by up to {d_base:.2})",
        arch.model_type(),
        cfg.targets.iter().map(|t| t.module()).collect::<Vec<_>>()
    );
    assert!(d < TOLERANCE, "{d}");
    assert!(d_base > 1e-2, "{d_base}");
    let g = sampled_gap(&l, r.client(), &policy.model, 1.0, 9);
    eprintln!("sampled at T = 1 through the adapter: max |ℓ_vLLM − ℓ_trainer| = {g:.2e}");
    assert!(g < TOLERANCE, "{g}");
    r.client().unload_other_adapters("").unwrap();
}
