//! [`VllmClient`]: the explorer's side on one or several vLLM servers. Each group is one
//! `/v1/completions` request; the groups of a call are spread over the servers and run
//! concurrently, at most `in_flight` requests per server.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use rlvr_rollout::{Completion, Detokenize, PromptIds, SamplingParams, TurnRow};

use crate::completion::{
    is_truncated, parse_group, request_body, request_seed, to_completions, turn_seed,
};
use crate::error::{Result, VllmError};
use crate::http::{RetryPolicy, Server};

/// Settings of the vLLM backend (`rollout.*` keys of DESIGN.md section 12).
#[derive(Debug, Clone, PartialEq)]
pub struct ClientConfig {
    /// Base URLs of the servers, e.g. `["http://127.0.0.1:8000"]` (at least one).
    pub servers: Vec<String>,
    /// The name the servers were started with (`--served-model-name`).
    pub served_model_name: String,
    /// Sent as `Authorization: Bearer KEY` when set (vLLM's `--api-key`). Default none.
    pub api_key: Option<String>,
    /// Whole-request timeout. Default [`crate::http::DEFAULT_TIMEOUT`] (180 s).
    pub timeout: Duration,
    /// Attempts after the first failed one. Default 3.
    pub retries: usize,
    /// First back-off; doubled per retry, at most 30 s. Default 0.5 s.
    pub backoff: Duration,
    /// Requests in flight per server (≥ 1). Default 8.
    pub in_flight: usize,
    /// Accept top-p < 1, top-k, or `min_new_tokens` > 0 with stop ids: vLLM's behaviour log-probs
    /// are then renormalised over the kept tokens (not DESIGN.md section 3's full-vocabulary ℓ_old), so the ratio carries
    /// log(kept mass). Default false: such parameters are refused.
    pub accept_renormalised_logprobs: bool,
    /// Largest answer read, in bytes: a larger one is refused naming this limit. Default
    /// [`crate::http::BODY_LIMIT`] (256 MiB).
    pub body_limit: u64,
    /// The run's part of the prefix-cache salt (`rollout.cache_salt = "version"`): when set,
    /// every `/v1/completions` request carries `cache_salt` = [`cache_salt`]`(tag, version)`, so
    /// that a server with prefix caching on shares KV blocks only between requests of this run
    /// at the policy version the client holds ([`VllmClient::cache_salt`]). 1 to
    /// [`MAX_SALT_TAG`] characters, none of `@ / \` or NUL (vLLM 0.32 refuses those in a salt).
    /// Default `None`: no salt sent.
    pub cache_salt: Option<String>,
}

impl Default for ClientConfig {
    fn default() -> Self {
        Self {
            servers: Vec::new(),
            served_model_name: String::new(),
            api_key: None,
            timeout: crate::http::DEFAULT_TIMEOUT,
            retries: 3,
            backoff: Duration::from_millis(500),
            in_flight: 8,
            accept_renormalised_logprobs: false,
            body_limit: crate::http::BODY_LIMIT,
            cache_salt: None,
        }
    }
}

/// Longest run tag of [`ClientConfig::cache_salt`], in characters: the salt adds `-v` and up to
/// 20 digits, and vLLM 0.32 refuses salts over 128 characters.
pub const MAX_SALT_TAG: usize = 100;

/// The `cache_salt` of requests sampled by run `tag` at policy `version`: `TAG-vVERSION`.
///
/// vLLM mixes the salt into the hash of a prompt's first KV block, so blocks are shared only
/// between requests with the same salt: KV computed under one version's weights never serves a
/// request of another version (even one in flight across a reload), nor another run's.
pub fn cache_salt(tag: &str, version: u64) -> String {
    format!("{tag}-v{version}")
}

/// Why `tag` cannot be a run tag of [`ClientConfig::cache_salt`], or `None` when it can.
fn salt_tag_problem(tag: &str) -> Option<String> {
    if tag.is_empty() {
        Some("is empty".into())
    } else if tag.chars().count() > MAX_SALT_TAG {
        Some(format!("is longer than {MAX_SALT_TAG} characters"))
    } else if tag.contains(['@', '/', '\\', '\0']) {
        Some("contains one of @ / \\ or NUL, which vLLM refuses in a cache_salt".into())
    } else {
        None
    }
}

/// The `lora_name` of policy `version`'s adapter on servers serving `served_model_name`:
/// `SERVED-lora-NNNNNNNN`.
pub fn adapter_name(served_model_name: &str, version: u64) -> String {
    format!("{served_model_name}-lora-{version:08}")
}

/// A client for vLLM servers serving one policy. See the crate docs.
pub struct VllmClient {
    pub(crate) servers: Vec<Server>,
    pub(crate) config: ClientConfig,
    pub(crate) version: u64,
    /// The version of a refresh that failed (cleared by a successful one): sampling is refused.
    pub(crate) refresh_failed: Option<u64>,
    /// The `model` of sampling and scoring requests: the served name, or the loaded LoRA
    /// adapter's name ([`crate::lora`]).
    pub(crate) model_name: String,
    detok: Option<Box<dyn Detokenize>>,
    /// The check of the last successful refresh: scored again after every sampling call, so
    /// samples drawn after another process reloaded a server are never used ([`crate::lease`]).
    pub(crate) verified: Option<crate::fingerprint::RefreshCheck>,
    /// The servers' lease, when this client took one ([`VllmClient::take_lease`]).
    pub(crate) lease: Option<crate::lease::ServerLease>,
    /// How a full-weight refresh names the weights ([`crate::layout::ServedLayout`]).
    pub(crate) layout: crate::layout::ServedLayout,
}

impl VllmClient {
    /// A client for `config.servers`, at policy version 0. No request is sent (see
    /// [`VllmClient::check_servers`] for the start-up checks).
    ///
    /// # Errors
    /// [`VllmError::Config`] for no server, an empty model name, `in_flight` 0 or a non-http URL.
    pub fn new(config: ClientConfig) -> Result<Self> {
        if config.servers.is_empty() {
            return Err(VllmError::Config(
                "rollout.servers is empty: give at least one base URL".into(),
            ));
        }
        if config.served_model_name.is_empty() {
            return Err(VllmError::Config(
                "rollout.served_model_name is empty: give the --served-model-name the servers run"
                    .into(),
            ));
        }
        if config.in_flight == 0 {
            return Err(VllmError::Config(
                "requests in flight per server must be ≥ 1".into(),
            ));
        }
        if let Some(problem) = config.cache_salt.as_deref().and_then(salt_tag_problem) {
            return Err(VllmError::Config(format!(
                "the prefix-cache salt's run tag {:?} {problem}",
                config.cache_salt.as_deref().unwrap_or_default()
            )));
        }
        let policy = RetryPolicy {
            retries: config.retries,
            backoff: config.backoff,
            timeout: config.timeout,
        };
        let servers = config
            .servers
            .iter()
            .map(|u| {
                Server::new(u, config.api_key.clone(), policy)
                    .map(|s| s.with_body_limit(config.body_limit))
            })
            .collect::<Result<_>>()?;
        Ok(Self {
            servers,
            model_name: config.served_model_name.clone(),
            config,
            version: 0,
            refresh_failed: None,
            detok: None,
            verified: None,
            lease: None,
            layout: Default::default(),
        })
    }

    /// Sets how full-weight refreshes name the weights: as the loader of the checkpoint the
    /// servers were started on takes them ([`crate::layout::ServedLayout::of_dir`] of that
    /// directory; [`crate::VllmRollout::connect`] sets it). Default: the model's own names.
    pub fn set_served_layout(&mut self, layout: crate::layout::ServedLayout) {
        self.layout = layout;
    }

    /// How full-weight refreshes name the weights ([`VllmClient::set_served_layout`]).
    pub fn served_layout(&self) -> &crate::layout::ServedLayout {
        &self.layout
    }

    /// Adds a detokenizer: completions are then cut after the token completing a stop string
    /// (see [`crate::completion::to_completions`]).
    pub fn with_tokenizer(mut self, detok: impl Detokenize + 'static) -> Self {
        self.detok = Some(Box::new(detok));
        self
    }

    /// Takes the lease of every server for `holder` ([`crate::lease`]); held until the client is
    /// dropped, and tagged with the version at every successful refresh.
    ///
    /// # Errors
    /// A server leased to another process, naming it ([`crate::ServerLease::acquire`]).
    pub fn take_lease(&mut self, holder: crate::lease::LeaseHolder) -> Result<()> {
        self.lease = Some(crate::lease::ServerLease::acquire(
            &self.server_urls(),
            holder,
        )?);
        Ok(())
    }

    /// After a successful refresh to `version` with `check`: remembers the check for the
    /// post-sampling fingerprint and tags the lease with the version.
    pub(crate) fn refreshed(
        &mut self,
        version: u64,
        check: &crate::fingerprint::RefreshCheck,
    ) -> Result<()> {
        self.version = version;
        self.refresh_failed = None;
        self.verified = Some(check.clone());
        if let Some(l) = &mut self.lease {
            l.tag(version)?;
        }
        Ok(())
    }

    /// The policy version the servers hold (set by [`VllmClient::refresh`] or
    /// [`VllmClient::set_version`]); stamped on every completion.
    pub fn version(&self) -> u64 {
        self.version
    }

    /// Declares the version the servers hold without refreshing them (e.g. servers started on
    /// the checkpoint of that version).
    pub fn set_version(&mut self, version: u64) {
        self.version = version;
    }

    /// Data parallel, a follower rank ([`crate::VllmRolloutConfig::follower`]): takes `version` as
    /// the leader pushed it, naming the served model (full weights) or the version's adapter
    /// (`lora`) in later requests, and clears a failed refresh.
    pub fn follow(&mut self, version: u64, lora: bool) {
        self.model_name = if lora {
            adapter_name(&self.config.served_model_name, version)
        } else {
            self.config.served_model_name.clone()
        };
        self.version = version;
        self.refresh_failed = None;
    }

    /// The `model` that sampling and scoring requests name: `served_model_name`, or after a
    /// LoRA refresh ([`VllmClient::refresh_adapter`]) the adapter version's name.
    pub fn model_name(&self) -> &str {
        &self.model_name
    }

    /// The `cache_salt` that requests sent now carry: [`cache_salt`]`(tag, version)` with
    /// [`ClientConfig::cache_salt`]'s tag and [`VllmClient::version`] (the version stamped on
    /// their completions); `None` without a tag.
    pub fn cache_salt(&self) -> Option<String> {
        self.cache_salt_at(self.version)
    }

    /// The `cache_salt` of requests at `version` ([`VllmClient::cache_salt`] once the client
    /// holds `version`).
    pub(crate) fn cache_salt_at(&self, version: u64) -> Option<String> {
        self.config
            .cache_salt
            .as_deref()
            .map(|tag| cache_salt(tag, version))
    }

    /// The settings in force.
    pub fn config(&self) -> &ClientConfig {
        &self.config
    }

    /// The base URLs, in order.
    pub fn server_urls(&self) -> Vec<String> {
        self.servers.iter().map(|s| s.url.clone()).collect()
    }

    /// Refuses parameters vLLM cannot honour as the native engine does.
    ///
    /// # Errors
    /// [`VllmError::Config`]: group size or `max_new_tokens` 0, `min_new_tokens > max_new_tokens`,
    /// or truncated sampling ([`crate::completion::is_truncated`]: top-p < 1, top-k, min new
    /// tokens with stop ids) without
    /// [`ClientConfig::accept_renormalised_logprobs`].
    pub fn check_params(&self, params: &SamplingParams) -> Result<()> {
        if params.group_size == 0 || params.max_new_tokens == 0 {
            return Err(VllmError::Config(
                "group_size and max_new_tokens must be ≥ 1".into(),
            ));
        }
        if params.min_new_tokens > params.max_new_tokens {
            return Err(VllmError::Config(format!(
                "min_new_tokens {} > max_new_tokens {}",
                params.min_new_tokens, params.max_new_tokens
            )));
        }
        if is_truncated(params) && !self.config.accept_renormalised_logprobs {
            return Err(VllmError::Config(format!(
                "top_p = {}, top_k = {:?}, min_new_tokens = {} with stop ids: vLLM's behaviour log-probs are \
                 then renormalised over the kept tokens, while the native engine's ℓ_old is over the full \
                 vocabulary (DESIGN.md section 3), so the same config would train differently; set \
                 rollout.accept_renormalised_logprobs = true to accept that, or use top_p = 1, top_k = 0 \
                 and min_new_tokens = 0",
                params.top_p, params.top_k, params.min_new_tokens
            )));
        }
        Ok(())
    }

    /// Samples `params.group_size` completions for each prompt, like
    /// `rlvr_rollout::Sampler::sample(prompts, first_prompt_index, params, seed)`: the result is
    /// ordered by (prompt, sample index), prompt indices start at `first_prompt_index`, and every
    /// completion carries [`VllmClient::version`].
    ///
    /// One request per group (seed: [`crate::completion::request_seed`]), spread over the servers
    /// from a shared queue, `in_flight` workers per server; a failed request is retried on its
    /// server with back-off. `params.max_batch_rows` is not used (the servers batch).
    ///
    /// # Errors
    /// [`VllmError::Config`] from [`VllmClient::check_params`], or after a failed
    /// [`VllmClient::refresh`]; the first request that failed on
    /// every attempt ([`VllmError::Server`] / [`VllmError::Refused`], naming the server). Nothing
    /// is returned then: no partial group, no partial batch.
    pub fn sample(
        &self,
        prompts: &[PromptIds],
        first_prompt_index: usize,
        params: &SamplingParams,
        seed: u64,
    ) -> Result<Vec<Completion>> {
        self.check_params(params)?;
        if let Some(v) = self.refresh_failed {
            return Err(VllmError::Config(format!(
                "the refresh to version {v} failed: the servers may hold stale or mixed weights; \
                 refresh again before sampling"
            )));
        }
        if let Some(p) = prompts.iter().position(|p| p.is_empty()) {
            return Err(VllmError::Config(format!(
                "prompt {} is empty",
                first_prompt_index + p
            )));
        }
        let salt = self.cache_salt();
        let groups = self.run_jobs(prompts.len(), |server, i| {
            let index = first_prompt_index + i;
            self.sample_group(server, &prompts[i], params, seed, index, salt.as_deref())
        })?;
        self.check_fingerprint()?;
        Ok(groups.into_iter().flatten().collect())
    }

    /// Continues each of `rows` by one assistant turn of a multi-turn episode (docs/DESIGN.md
    /// §14), like `rlvr_rollout::Sampler::sample_each`: one `/v1/completions` request per row
    /// with the row's whole context as token ids (`prompt`: exactly the ids stored so far, never
    /// re-rendered), `n = 1` and the seed [`crate::completion::turn_seed`]`(seed, prompt index,
    /// sample index, turn)`, so a row's turn does not depend on which others share the call.
    /// Returns one completion per row, in row order, with the row's prompt and sample index and
    /// [`VllmClient::version`]. `params.group_size` is ignored (one completion per row); the
    /// requests are spread over the servers as [`VllmClient::sample`]'s groups are.
    ///
    /// # Errors
    /// As [`VllmClient::sample`]; [`VllmError::Config`] for an empty context or a turn of 0.
    pub fn sample_turns(
        &self,
        rows: &[TurnRow],
        params: &SamplingParams,
        seed: u64,
    ) -> Result<Vec<Completion>> {
        let one = SamplingParams {
            group_size: 1,
            ..params.clone()
        };
        self.check_params(&one)?;
        if let Some(v) = self.refresh_failed {
            return Err(VllmError::Config(format!(
                "the refresh to version {v} failed: the servers may hold stale or mixed weights; \
                 refresh again before sampling"
            )));
        }
        if let Some(r) = rows.iter().find(|r| r.context.is_empty() || r.turn == 0) {
            return Err(VllmError::Config(format!(
                "episode ({}, {}) turn {}: an empty context or a turn of 0 (turns count from 1)",
                r.prompt_index, r.sample_index, r.turn
            )));
        }
        let salt = self.cache_salt();
        let out = self.run_jobs(rows.len(), |server, i| {
            let r = &rows[i];
            let body = request_body(
                &self.model_name,
                &r.context,
                &one,
                turn_seed(seed, r.prompt_index, r.sample_index, r.turn),
                salt.as_deref(),
            );
            let detok = self.detok.as_deref();
            let mut c = server.call_typed("POST", "/v1/completions", Some(&body), |answer| {
                let choices = parse_group(answer, 1, one.max_new_tokens)?;
                to_completions(choices, r.prompt_index, &one, self.version, detok)
            })?;
            let mut c = c.pop().expect("parse_group checked one choice");
            c.sample_index = r.sample_index;
            Ok(c)
        })?;
        self.check_fingerprint()?;
        Ok(out)
    }

    /// Runs jobs `0..n` over the servers from a shared queue, `in_flight` workers per server;
    /// returns their results in job order, or the first error (the other workers stop taking
    /// jobs then).
    fn run_jobs<T: Send>(
        &self,
        n: usize,
        job: impl Fn(&Server, usize) -> Result<T> + Sync,
    ) -> Result<Vec<T>> {
        let queue: Mutex<VecDeque<usize>> = Mutex::new((0..n).collect());
        let results: Mutex<Vec<Option<T>>> = Mutex::new((0..n).map(|_| None).collect());
        let failed: Mutex<Option<VllmError>> = Mutex::new(None);
        let stop = AtomicBool::new(false);
        let workers = self.config.in_flight.min(n.max(1));
        let (queue, results, failed, stop, job) = (&queue, &results, &failed, &stop, &job);
        std::thread::scope(|s| {
            for server in &self.servers {
                for _ in 0..workers {
                    s.spawn(move || {
                        while !stop.load(Ordering::Relaxed) {
                            let Some(i) = queue.lock().unwrap().pop_front() else {
                                break;
                            };
                            match job(server, i) {
                                Ok(r) => results.lock().unwrap()[i] = Some(r),
                                Err(e) => {
                                    stop.store(true, Ordering::Relaxed);
                                    failed.lock().unwrap().get_or_insert(e);
                                    break;
                                }
                            }
                        }
                    });
                }
            }
        });
        if let Some(e) = failed.lock().unwrap().take() {
            return Err(e);
        }
        let results = std::mem::take(&mut *results.lock().unwrap());
        Ok(results
            .into_iter()
            .map(|r| r.expect("every job ran"))
            .collect())
    }

    /// After sampling: every server still scores the last refresh's check sequence as the pushed
    /// weights do (nothing to check before the first refresh).
    ///
    /// # Errors
    /// [`VllmError::Check`] naming the server whose weights changed since the refresh.
    fn check_fingerprint(&self) -> Result<()> {
        let Some(check) = &self.verified else {
            return Ok(());
        };
        self.verify(check).map(|_| ()).map_err(|e| match e {
            VllmError::Check { server, msg } => VllmError::Check {
                msg: format!(
                    "its weights changed after this client pushed version {} (another process \
                     reloaded the server?), so the samples just drawn are not this policy's and \
                     are dropped; a vLLM server serves one run at a time: give each run its own \
                     server ({msg}){}",
                    self.version,
                    self.lease
                        .as_ref()
                        .map(|l| format!("; this client holds the lease as {}", l.holder().owner))
                        .unwrap_or_default()
                ),
                server,
            },
            e => e,
        })
    }

    /// One group on `server`: the request (with `salt` as its `cache_salt`), its checks, the
    /// records.
    fn sample_group(
        &self,
        server: &Server,
        prompt: &[u32],
        params: &SamplingParams,
        seed: u64,
        prompt_index: usize,
        salt: Option<&str>,
    ) -> Result<Vec<Completion>> {
        let body = request_body(
            &self.model_name,
            prompt,
            params,
            request_seed(seed, prompt_index, params.group_size),
            salt,
        );
        let detok = self.detok.as_deref();
        server.call_typed("POST", "/v1/completions", Some(&body), |answer| {
            let choices = parse_group(answer, params.group_size, params.max_new_tokens)?;
            to_completions(choices, prompt_index, params, self.version, detok)
        })
    }
}
