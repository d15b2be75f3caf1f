//! LoRA adapters served by vLLM: instead of reloading the full weights, each
//! sync writes the policy's adapter as a new version in PEFT's format and loads it by name on
//! every server; sampling requests then name that version as their `model`.
//!
//! The sequence of [`VllmClient::refresh_adapter`] for version v:
//! 1. `weights_dir/version-v/adapter/` written by [`rlvr_model::Model::save`] (the checkpoints'
//!    writer: `adapter_config.json` and `adapter_model.safetensors` with PEFT's names), atomically;
//! 2. on every server `POST /v1/load_lora_adapter {"lora_name": NAME_v, "lora_path": DIR,
//!    "load_inplace": true}` (`load_inplace`: a server that outlived an earlier run may hold
//!    `NAME_v` with other weights; it is replaced, not refused);
//! 3. the refresh check: every server scores a fixed completion through `NAME_v` (T = 1), compared
//!    with the trainer's log-probs of the policy with its adapters ([`crate::RefreshCheck`]);
//! 4. the client's version becomes v and its requests name `NAME_v`
//!    ([`VllmClient::model_name`]);
//! 5. every other `NAME_*` adapter a server lists in `/v1/models` is unloaded
//!    (`POST /v1/unload_lora_adapter`), and older version directories are deleted.
//!
//! Step 5 may run at once: the explorer samples and loads weights on one thread (also with
//! `sync.offset` ≥ 1), so no request of an older version is in flight when v is loaded. At most
//! two adapters are loaded at a time, so `--max-loras 2` suffices (`scripts/vllm_server.sh`
//! defaults to 3, which also covers `sync.offset + 2` at offset 1).
//!
//! The servers need `--enable-lora --max-lora-rank R` (R ≥ `model.lora_rank`) and the
//! environment `VLLM_ALLOW_RUNTIME_LORA_UPDATING=True` (which adds the two routes). A server
//! started otherwise fails step 2 with an error naming those flags ([`VllmClient::load_adapter`]).
//! vLLM's CPU build (0.32) serves such adapters: scored through the adapter name, its log-probs
//! matched the trainer's log-probs of base + adapter within 4.8e-6 in f32
//! (crates/rlvr-vllm/tests/it/live_lora.rs).

use std::path::{Path, PathBuf};
use std::time::Instant;

use rlvr_model::Model;
use serde_json::{json, Value};

use crate::client::{adapter_name, VllmClient};
use crate::error::{Result, VllmError};
use crate::fingerprint::{check_scores, RefreshCheck};
use crate::refresh::{prune_versions, write_dir, RefreshTimings};

/// What a server needs to serve rlvr's adapters, for error messages.
pub const LORA_SERVER_FLAGS: &str = "start vLLM with --enable-lora --max-lora-rank R (R ≥ \
     model.lora_rank; vLLM accepts 1, 8, 16, 32, 64, 128, 256, 320 or 512) --max-loras 2 (or \
     more) and the environment variable VLLM_ALLOW_RUNTIME_LORA_UPDATING=True (scripts/vllm_server.sh: \
     LORA_RANK=R)";

/// Writes `model`'s adapter (PEFT files, by [`Model::save`]) as the version directory of
/// `version` under `weights_dir`, atomically, and returns the adapter directory inside it
/// (`weights_dir/version-NNNNNNNN/adapter`, absolute): the `lora_path` to load.
///
/// # Errors
/// [`VllmError::Config`] for a model without adapters; I/O and model errors.
pub fn write_adapter(weights_dir: &Path, version: u64, model: &Model) -> Result<PathBuf> {
    if model.lora_config().is_none() {
        return Err(VllmError::Config(
            "write_adapter: the model has no LoRA adapters".into(),
        ));
    }
    let name = format!("version-{version:08}");
    let dir = write_dir(weights_dir, &name, |tmp| {
        Ok(model.save(tmp, candle_core::DType::F32)?)
    })?;
    Ok(dir.join("adapter"))
}

/// `e` (from `POST /v1/load_lora_adapter`) as an error that says which server flag is missing.
fn load_error(e: VllmError, rank: usize) -> VllmError {
    let (server, status, answer) = match &e {
        VllmError::Refused {
            server,
            status,
            body,
            ..
        } => (server.clone(), Some(*status), body.clone()),
        VllmError::Server { server, answer, .. } => (server.clone(), None, answer.clone()),
        _ => return e,
    };
    let low = answer.to_lowercase();
    let why = if status == Some(404) && low.contains("\"not found\"") {
        "it has no /v1/load_lora_adapter route, so runtime LoRA loading is off \
         (VLLM_ALLOW_RUNTIME_LORA_UPDATING=True missing)"
            .to_string()
    } else if low.contains("max_lora_rank") {
        format!("the adapter's rank {rank} is above its --max-lora-rank")
    } else if low.contains("not enabled") || low.contains("enable-lora") {
        "it was started without --enable-lora".to_string()
    } else {
        "it could not load the adapter".to_string()
    };
    VllmError::Check {
        server,
        msg: format!(
            "POST /v1/load_lora_adapter failed: {why}; it answered {}: {answer}. For \
             model.lora_rank > 0 {LORA_SERVER_FLAGS}",
            status.map_or("(after retries)".to_string(), |s| format!("HTTP {s}")),
        ),
    }
}

impl VllmClient {
    /// Loads the PEFT adapter directory `dir` (absolute, readable by the servers) as `name` on
    /// every server (`POST /v1/load_lora_adapter`, with `load_inplace` so that an adapter of
    /// that name left from an earlier run is replaced). `rank` is for the error message.
    ///
    /// # Errors
    /// [`VllmError::Check`] naming the server, what it answered and the flags it needs
    /// ([`LORA_SERVER_FLAGS`]): no such route (404), a rank above `--max-lora-rank`, LoRA off.
    pub fn load_adapter(&self, name: &str, dir: &Path, rank: usize) -> Result<()> {
        let body = json!({
            "lora_name": name,
            "lora_path": dir.to_string_lossy(),
            "load_inplace": true,
        });
        for s in &self.servers {
            s.call_text("POST", "/v1/load_lora_adapter", Some(&body), |_| Ok(()))
                .map_err(|e| load_error(e, rank))?;
        }
        Ok(())
    }

    /// Unloads adapter `name` on every server (`POST /v1/unload_lora_adapter`); a server that
    /// answers 404 (it does not hold `name`, e.g. after a restart) counts as done.
    ///
    /// # Errors
    /// Another failure, naming the server and its answer.
    pub fn unload_adapter(&self, name: &str) -> Result<()> {
        let body = json!({ "lora_name": name });
        for s in &self.servers {
            match s.call_text("POST", "/v1/unload_lora_adapter", Some(&body), |_| Ok(())) {
                Ok(()) | Err(VllmError::Refused { status: 404, .. }) => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    /// The ids each server lists in `GET /v1/models` (the served model and its loaded adapters),
    /// one list per server in [`VllmClient::server_urls`] order.
    ///
    /// # Errors
    /// As [`crate::Server::call`]; an answer without `data[].id`.
    pub fn listed_models(&self) -> Result<Vec<Vec<String>>> {
        self.servers
            .iter()
            .map(|s| {
                s.call("GET", "/v1/models", None, |a: Value| {
                    a["data"]
                        .as_array()
                        .ok_or("no `data` list")?
                        .iter()
                        .map(|m| {
                            m["id"]
                                .as_str()
                                .map(String::from)
                                .ok_or("a model without `id`")
                        })
                        .collect::<std::result::Result<Vec<_>, _>>()
                        .map_err(String::from)
                })
            })
            .collect()
    }

    /// Unloads every adapter of this policy (`SERVED-lora-*`, [`adapter_name`]) other than
    /// `keep` that any server lists.
    ///
    /// # Errors
    /// As [`VllmClient::listed_models`] and [`VllmClient::unload_adapter`].
    pub fn unload_other_adapters(&self, keep: &str) -> Result<Vec<String>> {
        let prefix = format!("{}-lora-", self.config.served_model_name);
        let mut names: Vec<String> = self
            .listed_models()?
            .into_iter()
            .flatten()
            .filter(|id| id.starts_with(&prefix) && id != keep)
            .collect();
        names.sort();
        names.dedup();
        for n in &names {
            self.unload_adapter(n)?;
        }
        Ok(names)
    }

    /// Pushes `model`'s adapter as policy `version` (see the module docs): write, load on every
    /// server, check that each scores `check` through the adapter within its tolerance, switch
    /// the requests' `model` to the adapter, then unload older adapters and delete their
    /// directories. `write_s` in the timings is the adapter's write, `reload_s` its load on all
    /// servers plus the unloading of the old ones.
    ///
    /// As [`VllmClient::refresh`]: a failed refresh leaves the client refusing to sample until a
    /// later one succeeds.
    ///
    /// # Errors
    /// A model without adapters; any step's error, naming the server.
    pub fn refresh_adapter(
        &mut self,
        weights_dir: &Path,
        version: u64,
        model: &Model,
        check: &RefreshCheck,
    ) -> Result<RefreshTimings> {
        self.refresh_failed = Some(version);
        let rank = model.lora_config().map_or(0, |c| c.rank);
        let t0 = Instant::now();
        let dir = write_adapter(weights_dir, version, model)?;
        let write_s = t0.elapsed().as_secs_f64();
        let t1 = Instant::now();
        let name = adapter_name(&self.config.served_model_name, version);
        self.load_adapter(&name, &dir, rank)?;
        let mut reload_s = t1.elapsed().as_secs_f64();
        let t2 = Instant::now();
        // Scored under the new version's salt (see `VllmClient::refresh`).
        let salt = self.cache_salt_at(version);
        let scored = self.score_salted(&name, &check.prompt, &check.completion, salt.as_deref())?;
        let max_abs_diff = check_scores(&self.server_urls(), &scored, check)?;
        let verify_s = t2.elapsed().as_secs_f64();
        self.model_name = name.clone();
        self.refreshed(version, check)?;
        let t3 = Instant::now();
        self.unload_other_adapters(&name)?;
        reload_s += t3.elapsed().as_secs_f64();
        prune_versions(weights_dir, version)?;
        Ok(RefreshTimings {
            write_s,
            reload_s,
            verify_s,
            max_abs_diff,
        })
    }
}
