//! [`VllmRollout`]: the vLLM servers behind rlvr's [`Rollout`] boundary, so that the explorer,
//! checkpoints and resume treat them as they treat the native engine (DESIGN.md sections 3 and 12).
//!
//! - `load_weights(version, w)`: the weights go into a local copy of the policy (which the
//!   checkpoint saves as the explorer's weights when their version differs from the trainer's, and
//!   which scores the refresh check), are written as the checkpoint directory of `version` under
//!   `weights_dir` (`lm_head.weight` written for tied models), reloaded on every server (pause,
//!   `reload_weights`, reset prefix cache, resume), verified by scoring a fixed sequence against
//!   the local copy's log-probs, and older version directories are deleted
//!   ([`VllmClient::refresh`]). The first successful push also runs the log-prob-mode check
//!   ([`VllmClient::check_logprob_mode`]).
//! - With LoRA (`model.lora_rank` > 0) the weights are the adapters: each version is written as a
//!   PEFT adapter and loaded by name on every server, and requests name it
//!   ([`VllmClient::refresh_adapter`], [`crate::lora`]). The servers keep the base they loaded;
//!   at the first push it is compared with the trainer's base (the fixed sequence scored through
//!   the served name against the policy with its adapters off), and only when it differs
//!   (servers started on another checkpoint) the trainer's base is pushed once by the full-weight
//!   reload, then checked again.
//! - `sample`: one request per group, groups spread over the servers concurrently
//!   ([`VllmClient::sample`]); a failure fails the whole call, so nothing is trained on a partial
//!   group.
//! - `sample_turns`: a multi-turn episode's later turns, one request per episode with its whole
//!   context as token ids and `n = 1` ([`VllmClient::sample_turns`]).

use std::path::{Path, PathBuf};

use candle_core::Tensor;
use rlvr_model::{Model, TokenizerBundle};
use rlvr_rollout::{
    Completion, GroupResult, PromptIds, Rollout, RolloutError, SamplingParams, TurnRow,
};

use crate::checks::{trainer_logprobs, ServerInfo};
use crate::client::{ClientConfig, VllmClient};
use crate::error::{Result, VllmError};
use crate::fingerprint::{check_scores, RefreshCheck};
use crate::refresh::{write_weights_as, RefreshTimings, ServedLayout};

/// Tokens sampled by the log-prob-mode check after the first push.
const MODE_CHECK_TOKENS: usize = 16;

/// Settings of [`VllmRollout`] beyond the client's.
#[derive(Debug, Clone, PartialEq)]
pub struct VllmRolloutConfig {
    /// The client (servers, served name, key, timeout, retries, in-flight requests, truncated
    /// sampling acceptance).
    pub client: ClientConfig,
    /// Where the checkpoint directory of each version is written; the servers must read the same
    /// path (a shared filesystem for remote servers).
    pub weights_dir: PathBuf,
    /// Largest accepted max |ℓ_server − ℓ_local| (nats, T = 1) on the refresh check sequence.
    pub refresh_tolerance: f64,
    /// Data parallel, a rank above 0: the leader (rank 0) alone writes and pushes each version;
    /// a follower's [`Rollout::load_weights`] keeps its local copy and takes the version (and,
    /// with LoRA, the adapter's name) as pushed. The caller makes every follower wait until the
    /// leader's push is done and never lets a push overlap a follower's sampling (rlvr's run
    /// loop: a barrier after every weight load of the inline explorer; with an explorer thread,
    /// the run's threads hand each version to the explorers in that order, rlvr-train's
    /// `feed::SharedServers`).
    pub follower: bool,
    /// The servers' lease ([`crate::lease`]): taken at [`VllmRollout::connect`] for this holder
    /// and held while the backend lives, tagged with the version at every push. `None`: no lease
    /// (a data-parallel follower, whose leader holds it; `--share-server`).
    pub lease: Option<crate::lease::LeaseHolder>,
    /// How full-weight pushes name the weights ([`ServedLayout`]): as the loader of the checkpoint
    /// the servers were started on takes them (rlvr-train: [`ServedLayout::of_dir`] of
    /// `model.path`, or of the evaluated model). `None`: [`ServedLayout::CausalLm`].
    pub served_layout: Option<ServedLayout>,
}

/// The vLLM backend of the explorer. See the module docs.
pub struct VllmRollout {
    client: VllmClient,
    /// The policy at [`Rollout::version`] (a copy owned by this backend).
    model: Model,
    weights_dir: PathBuf,
    tolerance: f64,
    /// The refresh check's fixed prompt and completion (ids spread over the vocabulary).
    check_prompt: Vec<u32>,
    check_completion: Vec<u32>,
    mode_checked: bool,
    /// With LoRA: whether the servers' base was compared with the trainer's, and whether it had
    /// to be pushed then.
    base_pushed: Option<bool>,
    last_refresh: Option<RefreshTimings>,
    infos: Vec<ServerInfo>,
    /// [`VllmRolloutConfig::follower`].
    follower: bool,
}

/// `n` ids spread over a vocabulary of `vocab` by a fixed stride from `start` (a fixed, model-
/// independent sequence for scoring).
fn spread_ids(n: usize, start: u64, vocab: usize) -> Vec<u32> {
    (0..n as u64)
        .map(|i| ((start + 7919 * i) % vocab as u64) as u32)
        .collect()
}

fn backend_err(e: VllmError) -> RolloutError {
    RolloutError::Backend(Box::new(e))
}

impl VllmRollout {
    /// Connects to the servers and runs the start-up checks ([`VllmClient::check_servers`]:
    /// health, served name, `max_model_len ≥ longest_prompt + room` (`room`: the most tokens after
    /// a prompt, the config key `room_key` named in the error), tokenizer agreement). No weights are pushed yet: the caller's first [`Rollout::load_weights`] does
    /// that (at start and on resume alike) and then checks the log-prob mode.
    ///
    /// `model` is the policy (copied: the backend keeps its own weights); `tokenizer` cuts stop
    /// strings and probes the servers' tokenizers.
    ///
    /// # Errors
    /// [`VllmError::Config`] for a bad client config; a server leased to another process
    /// (naming it); a failed check naming the server.
    pub fn connect(
        config: VllmRolloutConfig,
        model: &Model,
        tokenizer: &TokenizerBundle,
        longest_prompt: usize,
        room: usize,
        room_key: &str,
    ) -> Result<Self> {
        crate::checks::check_servable(model.config())?;
        let mut client =
            VllmClient::new(config.client)?.with_tokenizer(tokenizer.tokenizer.clone());
        let layout = config.served_layout.unwrap_or_default();
        if model.lora_config().is_some() && matches!(layout, ServedLayout::Gemma3Multimodal(_)) {
            // Checked live with vLLM 0.32: the adapter loaded, the refresh's check then scored the
            // base (1.99 nats from the adapted model).
            return Err(VllmError::Config(
                "LoRA on a multimodal Gemma 3 base (model_type \"gemma3\") is not served: the \
                 adapter rlvr writes names the text model's modules (PEFT's \
                 base_model.model.model.layers.…), which vLLM's Gemma3ForConditionalGeneration \
                 does not apply, so the servers would sample the base; train it without LoRA, or \
                 sample with rollout.backend = \"native\""
                    .into(),
            ));
        }
        client.set_served_layout(layout);
        if let Some(holder) = config.lease {
            client.take_lease(holder)?;
        }
        let infos = client.check_servers(tokenizer, longest_prompt, room, room_key)?;
        crate::checks::check_longrope(model.config(), &infos)?;
        let vocab = model.config().vocab_size;
        Ok(Self {
            client,
            model: model.try_clone()?,
            weights_dir: config.weights_dir,
            tolerance: config.refresh_tolerance,
            check_prompt: spread_ids(6, 11, vocab),
            check_completion: spread_ids(12, 5003, vocab),
            mode_checked: false,
            base_pushed: None,
            last_refresh: None,
            infos,
            follower: config.follower,
        })
    }

    /// What each server reported at start-up.
    pub fn servers(&self) -> &[ServerInfo] {
        &self.infos
    }

    /// The timings of the last successful refresh.
    pub fn last_refresh(&self) -> Option<RefreshTimings> {
        self.last_refresh
    }

    /// With LoRA, after the first push: whether the servers' base weights differed from the
    /// trainer's and were pushed (`Some(true)`) or were already the trainer's (`Some(false)`).
    pub fn base_pushed(&self) -> Option<bool> {
        self.base_pushed
    }

    /// The directory the versions are written under.
    pub fn weights_dir(&self) -> &Path {
        &self.weights_dir
    }

    /// The client.
    pub fn client(&self) -> &VllmClient {
        &self.client
    }

    /// The refresh check of `model`: the fixed sequence and `model`'s log-probs of it (T = 1).
    fn check_of(&self, model: &Model) -> Result<RefreshCheck> {
        let expected = trainer_logprobs(model, &self.check_prompt, &self.check_completion, 1.0)?;
        Ok(RefreshCheck {
            prompt: self.check_prompt.clone(),
            completion: self.check_completion.clone(),
            expected,
            tolerance: self.tolerance,
        })
    }

    /// With LoRA: makes the servers' base weights the trainer's (see the module docs). Returns
    /// whether they had to be pushed.
    ///
    /// # Errors
    /// [`VllmError::Check`] when a server still scores the base differently after the push;
    /// request, write and reload errors.
    fn push_base_if_needed(&mut self) -> Result<bool> {
        let base = self.model.without_adapters();
        let check = self.check_of(&base)?;
        let served = self.client.config().served_model_name.clone();
        let urls = self.client.server_urls();
        let scored = self
            .client
            .score_as(&served, &check.prompt, &check.completion)?;
        if check_scores(&urls, &scored, &check).is_ok() {
            return Ok(false);
        }
        let tensors = rlvr_rollout::named_tensors(&base);
        let dir = write_weights_as(
            &self.weights_dir,
            "base",
            &tensors,
            base.config(),
            candle_core::DType::F32,
            self.client.served_layout(),
        )?;
        self.client.reload(&dir)?;
        let _ = std::fs::remove_dir_all(&dir);
        let scored = self
            .client
            .score_as(&served, &check.prompt, &check.completion)?;
        check_scores(&urls, &scored, &check).map_err(|e| match e {
            VllmError::Check { server, msg } => VllmError::Check {
                server,
                msg: format!(
                    "its base model differed from the trainer's (model.path), and after the \
                     trainer's base weights were pushed (reload_weights) it still differs: {msg}"
                ),
            },
            e => e,
        })?;
        Ok(true)
    }

    /// Pushes the local copy's weights as `version` (see the module docs).
    fn push(&mut self, version: u64) -> Result<()> {
        let check = self.check_of(&self.model)?;
        let timings = if self.model.lora_config().is_some() {
            if self.base_pushed.is_none() {
                // Not yet compared: on failure the next push compares again.
                self.client.refresh_failed = Some(version);
                self.base_pushed = Some(self.push_base_if_needed()?);
            }
            self.client
                .refresh_adapter(&self.weights_dir, version, &self.model, &check)?
        } else {
            let tensors = rlvr_rollout::named_tensors(&self.model);
            self.client.refresh(
                &self.weights_dir,
                version,
                &tensors,
                self.model.config(),
                &check,
            )?
        };
        self.last_refresh = Some(timings);
        if !self.mode_checked {
            self.client
                .check_logprob_mode(&self.model, &self.check_prompt, MODE_CHECK_TOKENS)?;
            self.mode_checked = true;
        }
        Ok(())
    }
}

impl Rollout for VllmRollout {
    fn version(&self) -> u64 {
        self.client.version()
    }

    /// On an error the servers' weights are unknown: the client refuses to sample until a later
    /// refresh succeeds, and [`Rollout::version`] and the local copy already hold `version`
    /// (a checkpoint written then records the explorer at the trainer's version, so a resume
    /// pushes the trainer's weights again).
    fn load_weights(
        &mut self,
        version: u64,
        weights: &[(String, Tensor)],
    ) -> rlvr_rollout::Result<()> {
        if let Some((name, _)) = self
            .model
            .named_vars()
            .into_iter()
            .find(|(n, _)| !weights.iter().any(|(m, _)| m == n))
        {
            return Err(backend_err(VllmError::Config(format!(
                "load_weights: weight `{name}` of version {version} is missing"
            ))));
        }
        self.model.load_named(weights)?;
        if self.follower {
            let lora = self.model.lora_config().is_some();
            self.client.follow(version, lora);
            return Ok(());
        }
        let r = self.push(version);
        if r.is_err() {
            // The servers may hold anything now; sampling is refused by the client.
            self.client.set_version(version);
        }
        r.map_err(backend_err)
    }

    fn sample(
        &mut self,
        prompts: &[PromptIds],
        first_index: usize,
        params: &SamplingParams,
        seed: u64,
    ) -> rlvr_rollout::Result<Vec<GroupResult>> {
        let out = self
            .client
            .sample(prompts, first_index, params, seed)
            .map_err(backend_err)?;
        // `VllmClient::sample` returns every group or fails: B·K completions in (prompt, sample) order.
        let k = params.group_size;
        Ok(out.chunks(k).map(|g| Ok(g.to_vec())).collect())
    }

    /// One `/v1/completions` request per row with its whole context as token ids
    /// ([`VllmClient::sample_turns`]): an episode's later turns on the servers (docs/DESIGN.md
    /// §14).
    fn sample_turns(
        &mut self,
        rows: &[TurnRow],
        params: &SamplingParams,
        seed: u64,
    ) -> rlvr_rollout::Result<Vec<Completion>> {
        self.client
            .sample_turns(rows, params, seed)
            .map_err(backend_err)
    }

    /// The local copy of the policy at [`Rollout::version`]: the run checkpoints it as the
    /// explorer's weights and `train.recompute_behaviour` scores with it.
    fn local_model(&self) -> Option<&Model> {
        Some(&self.model)
    }
}
