//! The explorer's sampling engine chosen by `rollout.backend` (DESIGN.md section 12): the native
//! engine over a copy of the policy, or vLLM servers ([`rlvr_vllm::VllmRollout`], issue 15).
//! Either way the run then pushes the starting weights through [`Rollout::load_weights`] (at start
//! and on `--resume`) before the first batch is sampled.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context;
use rlvr_model::{Model, TokenizerBundle};
use rlvr_rollout::{NativeRollout, Rollout};
use rlvr_vllm::{ClientConfig, VllmRollout, VllmRolloutConfig};
use serde_json::json;

use crate::config::{RolloutBackend, RolloutSection};

/// `rollout.weights_dir`, defaulting to `RUN_DIR/vllm-weights`.
pub fn weights_dir(r: &RolloutSection, run_dir: &Path) -> PathBuf {
    r.weights_dir
        .clone()
        .unwrap_or_else(|| run_dir.join("vllm-weights"))
}

/// The vLLM client settings of `rollout.*`; the API key is read from the environment variable
/// `rollout.api_key_env` names.
///
/// # Errors
/// `rollout.api_key_env` names a variable that is not set.
pub fn client_config(r: &RolloutSection) -> anyhow::Result<ClientConfig> {
    let api_key = match &r.api_key_env {
        Some(var) => Some(std::env::var(var).with_context(|| {
            format!("rollout.api_key_env = {var:?}, but the environment variable {var} is not set")
        })?),
        None => None,
    };
    Ok(ClientConfig {
        servers: r.servers.clone(),
        served_model_name: r.served_model_name.clone(),
        api_key,
        timeout: Duration::from_secs_f64(r.request_timeout_s),
        retries: r.retries,
        in_flight: r.in_flight,
        accept_renormalised_logprobs: r.accept_renormalised_logprobs,
        ..Default::default()
    })
}

/// The backend `r.backend` names, with no weights pushed yet (the caller loads the starting
/// version). Native: over a copy of `model` at version `version`. vLLM: connects and runs the
/// start-up checks (health, served name, `max_model_len ≥ longest_prompt + max_new_tokens`,
/// tokenizer agreement), with versions written under [`weights_dir`] of `run_dir`.
///
/// # Errors
/// Model copy errors; a failed start-up check naming the server and what it answered.
pub fn build(
    r: &RolloutSection,
    run_dir: &Path,
    model: &Model,
    tokenizer: &TokenizerBundle,
    version: u64,
    longest_prompt: usize,
) -> anyhow::Result<Box<dyn Rollout>> {
    Ok(match r.backend {
        RolloutBackend::Native => Box::new(NativeRollout::owning(
            model.try_clone()?,
            version,
            Some(tokenizer.tokenizer.clone()),
        )),
        RolloutBackend::Vllm => {
            let config = VllmRolloutConfig {
                client: client_config(r)?,
                weights_dir: weights_dir(r, run_dir),
                refresh_tolerance: r.refresh_tolerance,
            };
            let v =
                VllmRollout::connect(config, model, tokenizer, longest_prompt, r.max_new_tokens)
                    .context("starting the vLLM rollout backend (rollout.backend = \"vllm\")")?;
            Box::new(v)
        }
    })
}

/// Records the rollout backend in RUN_DIR/run.json (`rollout_backend`: the engine, and for vLLM
/// the servers, served name, weights directory and whether renormalised behaviour log-probs were
/// accepted: issue 15 item 4).
///
/// # Errors
/// I/O errors.
pub fn record_in_run_json(r: &RolloutSection, run_dir: &Path) -> anyhow::Result<()> {
    let path = run_dir.join("run.json");
    let mut v: serde_json::Value = std::fs::read_to_string(&path)
        .ok()
        .and_then(|t| serde_json::from_str(&t).ok())
        .unwrap_or_else(|| json!({}));
    v["rollout_backend"] = match r.backend {
        RolloutBackend::Native => json!({"backend": "native"}),
        RolloutBackend::Vllm => json!({
            "backend": "vllm",
            "servers": r.servers,
            "served_model_name": r.served_model_name,
            "weights_dir": weights_dir(r, run_dir),
            "accept_renormalised_logprobs": r.accept_renormalised_logprobs,
        }),
    };
    rlvr_model::weights::atomic_write(&path, serde_json::to_string_pretty(&v)?.as_bytes())?;
    Ok(())
}
