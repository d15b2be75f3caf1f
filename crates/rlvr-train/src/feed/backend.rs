//! The one place that picks the sampling engine (DESIGN.md section 12), for `rlvr train`'s
//! explorer, `rlvr eval` and `rlvr generate` alike: the native engine of this process, or vLLM
//! OpenAI-compatible servers ([`rlvr_vllm::VllmRollout`]). Whatever the engine, the caller then
//! pushes the weights it samples with through [`Rollout::load_weights`] before the first batch.
//!
//! Architecture invariant: no other file of rlvr-train names a vLLM type; everything else sees a
//! `Box<dyn Rollout>`.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use rlvr_model::{Model, TokenizerBundle};
use rlvr_rollout::{NativeRollout, Rollout, Sampler};
use rlvr_vllm::{ClientConfig, LeaseHolder, ServedLayout, VllmRollout, VllmRolloutConfig};
use serde_json::json;

/// Which engine samples, with its settings (`rollout.backend` and the `rollout.*` vLLM keys).
#[derive(Debug, Clone, PartialEq)]
pub enum BackendSettings {
    /// rlvr's own engine in this process (rlvr-rollout).
    Native,
    /// vLLM servers (rlvr-vllm).
    Vllm(VllmSettings),
}

/// The vLLM servers a run samples from and how it talks to them (the `rollout.*` keys of the same
/// names document each).
#[derive(Debug, Clone, PartialEq)]
pub struct VllmSettings {
    /// Base URLs of the servers; groups are spread over them.
    pub servers: Vec<String>,
    /// The `--served-model-name` the servers run.
    pub served_model_name: String,
    /// Where each policy version is written for the servers to reload.
    pub weights_dir: PathBuf,
    /// The environment variable holding the servers' API key, if any.
    pub api_key_env: Option<String>,
    /// Whole-request timeout, seconds.
    pub request_timeout_s: f64,
    /// Attempts after a failed request.
    pub retries: usize,
    /// Requests (groups) in flight per server.
    pub in_flight: usize,
    /// Accept behaviour log-probs renormalised over truncated sampling's kept tokens.
    pub accept_renormalised_logprobs: bool,
    /// Largest max |ℓ_server − ℓ_trainer| (nats) on the check sequence after a weight refresh.
    pub refresh_tolerance: f64,
    /// `rollout.cache_salt = "version"`: every completion request carries a `cache_salt` naming
    /// the run ([`salt_tag`]) and the policy version the servers hold.
    pub cache_salt: bool,
    /// Data parallel, a rank above 0: rank 0 writes and pushes every version, this rank takes it
    /// (`rlvr_vllm::VllmRolloutConfig::follower`); the run loop holds every rank at a barrier
    /// after each weight load.
    pub follower: bool,
    /// The checkpoint directory the servers were started on (`rlvr train`: `model.path`; `rlvr
    /// eval` and `rlvr generate`: the evaluated model): full-weight pushes name the weights as its
    /// loader takes them ([`ServedLayout::of_dir`]), so that a resumed run of a multimodal Gemma 3
    /// base, whose checkpoints hold its language model alone, still writes the wrapper's names.
    /// `None`: the model's own names.
    pub served_base: Option<PathBuf>,
}

/// What the vLLM servers are used for, which decides their lease (rlvr-vllm's `lease` module:
/// one run per server, named in the refusal of a second).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ServerUse {
    /// A training run (its run directory): the servers are leased to it for its whole life and
    /// tagged with its policy version at every sync; a server leased to anything else is refused.
    Train {
        /// The run directory (named in another process's refusal).
        run_dir: PathBuf,
    },
    /// `rlvr eval` or `rlvr generate` of a fixed model (`command`): the servers are leased while
    /// it runs, and one leased to a training run is refused, unless `share` (`--share-server`).
    Fixed {
        /// The command, e.g. `rlvr eval`.
        command: &'static str,
        /// `--share-server`: take no lease and push anyway (a training run on the server then
        /// stops at its next weight check).
        share: bool,
    },
}

/// How the native engine holds the weights it samples with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NativeWeights {
    /// Its own copy, updated only by [`Rollout::load_weights`]: the explorer, whose version lags
    /// the trainer's under a sync interval.
    Copy,
    /// The caller's weights, shared without a copy: evaluation and generation of a fixed model.
    Share,
}

/// What the engine will be asked to do, for the vLLM start-up check
/// `max_model_len ≥ longest_prompt + max_new_tokens`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Workload {
    /// Tokens of the longest prompt.
    pub longest_prompt: usize,
    /// Most new tokens per completion; for multi-turn episodes, per episode after its prompt
    /// (turns and bridges: `env.max_episode_tokens` resolved).
    pub max_new_tokens: usize,
    /// The config key that sets `max_new_tokens`, named by the check's error:
    /// `rollout.max_new_tokens`, or `env.max_episode_tokens` for episodes (docs/DESIGN.md
    /// section 14).
    pub room_key: &'static str,
}

impl BackendSettings {
    /// The engine as RUN_DIR/run.json records it (`rollout_backend`): the engine, and for vLLM
    /// the servers, served name, weights directory, whether renormalised behaviour log-probs
    /// were accepted, and the prefix-cache salt (`version` or `off`).
    pub fn describe(&self) -> serde_json::Value {
        match self {
            BackendSettings::Native => json!({"backend": "native"}),
            BackendSettings::Vllm(v) => json!({
                "backend": "vllm",
                "servers": v.servers,
                "served_model_name": v.served_model_name,
                "weights_dir": v.weights_dir,
                "accept_renormalised_logprobs": v.accept_renormalised_logprobs,
                "cache_salt": if v.cache_salt { "version" } else { "off" },
            }),
        }
    }
}

/// The vLLM client settings of `v` for `server_use`; the API key is read from the environment
/// variable `api_key_env` names, and with `v.cache_salt` the run's salt tag is [`salt_tag`]`(server_use)`.
///
/// # Errors
/// `api_key_env` names a variable that is not set.
pub fn client_config(v: &VllmSettings, server_use: &ServerUse) -> anyhow::Result<ClientConfig> {
    let api_key = match &v.api_key_env {
        Some(var) => Some(std::env::var(var).with_context(|| {
            format!("rollout.api_key_env = {var:?}, but the environment variable {var} is not set")
        })?),
        None => None,
    };
    Ok(ClientConfig {
        servers: v.servers.clone(),
        served_model_name: v.served_model_name.clone(),
        api_key,
        timeout: Duration::try_from_secs_f64(v.request_timeout_s)
            .unwrap_or(rlvr_vllm::http::DEFAULT_TIMEOUT),
        retries: v.retries,
        in_flight: v.in_flight,
        accept_renormalised_logprobs: v.accept_renormalised_logprobs,
        cache_salt: v.cache_salt.then(|| salt_tag(server_use)),
        ..Default::default()
    })
}

/// The run's part of the prefix-cache salt ([`rlvr_vllm::ClientConfig::cache_salt`]):
/// `rlvr-` and 16 hex digits of a hash of
///
/// - a training run's absolute run directory: the same for every data-parallel rank (they sample
///   on the same servers at the same version, so they may share blocks) and for a resumed run
///   (whose pushes reset the servers' prefix cache anyway), different for two runs;
/// - for `rlvr eval` and `rlvr generate`, the command, the process id, a count of calls and the
///   time: a fixed model's blocks are never shared with another process or backend, whose weights
///   may differ.
///
/// The hash (std's SipHash with fixed keys) need only agree between ranks of one binary.
pub fn salt_tag(u: &ServerUse) -> String {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    match u {
        ServerUse::Train { run_dir } => {
            "train".hash(&mut h);
            std::path::absolute(run_dir)
                .unwrap_or_else(|_| run_dir.clone())
                .hash(&mut h);
        }
        ServerUse::Fixed { command, .. } => {
            static CALLS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
            command.hash(&mut h);
            std::process::id().hash(&mut h);
            CALLS
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed)
                .hash(&mut h);
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos())
                .unwrap_or_default()
                .hash(&mut h);
        }
    }
    format!("rlvr-{:016x}", h.finish())
}

/// The lease `u` takes, if any: none for a data-parallel follower (its leader holds it) or a
/// shared fixed-model use.
fn lease_holder(u: &ServerUse, follower: bool) -> Option<LeaseHolder> {
    match u {
        _ if follower => None,
        ServerUse::Train { run_dir } => {
            let dir = std::path::absolute(run_dir).unwrap_or_else(|_| run_dir.clone());
            Some(LeaseHolder::new(
                format!("training run {}", dir.display()),
                true,
            ))
        }
        ServerUse::Fixed { share: true, .. } => None,
        ServerUse::Fixed { command, .. } => Some(LeaseHolder::new(*command, false)),
    }
}

/// The engine `s` names, at version `version`, with no weights pushed yet (the caller loads the
/// starting version). Native: over `model` as `native` says. vLLM: connects and runs the start-up
/// checks (health, served name, `max_model_len ≥ longest_prompt + max_new_tokens`, tokenizer
/// agreement), with versions written under the settings' weights directory, the servers leased
/// as `server_use` says.
///
/// # Errors
/// Model copy errors; a failed start-up check naming the server and what it answered.
pub fn build(
    s: &BackendSettings,
    model: &Model,
    tokenizer: &TokenizerBundle,
    version: u64,
    work: Workload,
    native: NativeWeights,
    server_use: &ServerUse,
) -> anyhow::Result<Box<dyn Rollout>> {
    Ok(match (s, native) {
        (BackendSettings::Native, NativeWeights::Copy) => Box::new(NativeRollout::owning(
            model.try_clone()?,
            version,
            Some(tokenizer.tokenizer.clone()),
        )),
        (BackendSettings::Native, NativeWeights::Share) => {
            let sampler = Sampler::new(model, version).with_tokenizer(tokenizer.tokenizer.clone());
            Box::new(NativeRollout::new(sampler))
        }
        (BackendSettings::Vllm(v), _) => {
            let config =
                VllmRolloutConfig {
                    client: client_config(v, server_use)?,
                    weights_dir: v.weights_dir.clone(),
                    refresh_tolerance: v.refresh_tolerance,
                    follower: v.follower,
                    lease: lease_holder(server_use, v.follower),
                    served_layout: match &v.served_base {
                        Some(dir) => Some(ServedLayout::of_dir(dir).with_context(|| {
                            format!("reading the served base {}", dir.display())
                        })?),
                        None => None,
                    },
                };
            let r = VllmRollout::connect(
                config,
                model,
                tokenizer,
                work.longest_prompt,
                work.max_new_tokens,
                work.room_key,
            )
            .context("starting the vLLM rollout backend (rollout.backend = \"vllm\")")?;
            Box::new(r)
        }
    })
}
