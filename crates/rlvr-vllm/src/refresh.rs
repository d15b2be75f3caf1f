//! Weight refresh: the policy written as a HuggingFace checkpoint directory per version under
//! `weights_dir`, then on every server pause → `collective_rpc reload_weights` → reset the prefix
//! cache → resume (the HTTP-only sequence of this crate's docs/VLLM-CPU.md), then a check that the
//! servers score a fixed sequence as the new weights do. Old version directories are deleted after
//! a successful refresh.

use std::path::{Path, PathBuf};
use std::time::Instant;

use candle_core::{DType, Tensor};
use rlvr_model::ModelConfig;
use serde_json::json;

use crate::client::VllmClient;
use crate::error::{io, Result, VllmError};
use crate::fingerprint::{check_scores, RefreshCheck};

pub use crate::layout::ServedLayout;

/// The directory of `version` under `weights_dir`: `weights_dir/version-NNNNNNNN`.
pub fn version_dir(weights_dir: &Path, version: u64) -> PathBuf {
    weights_dir.join(format!("version-{version:08}"))
}

/// Writes `tensors` (HuggingFace names, e.g. `rlvr_model::Model::named_vars`) in `dtype` and
/// `config`'s config.json as the checkpoint directory of `version`, atomically (written beside it,
/// then renamed), and returns its absolute path.
///
/// For a tied-embedding model (`config.tie_word_embeddings`) without an `lm_head.weight` tensor, a
/// copy of `model.embed_tokens.weight` is written as `lm_head.weight`: vLLM's reload otherwise
/// keeps its old head silently ("ParallelLMHead: Failed to load weights"; this crate's
/// docs/VLLM-CPU.md). Except for Gemma 2 ([`head_written`]): vLLM's `Gemma2ForCausalLM` has no
/// `lm_head` (its logits always come from the embedding), and a reload naming one fails.
///
/// # Errors
/// [`VllmError::Io`]; a tied model without `model.embed_tokens.weight` ([`VllmError::Config`]);
/// tensor errors.
pub fn write_weights(
    weights_dir: &Path,
    version: u64,
    tensors: &[(String, Tensor)],
    config: &ModelConfig,
    dtype: DType,
) -> Result<PathBuf> {
    let name = format!("version-{version:08}");
    write_weights_as(
        weights_dir,
        &name,
        tensors,
        config,
        dtype,
        &ServedLayout::CausalLm,
    )
}

/// As [`write_weights`], into `weights_dir/name`, in `layout`'s names and config.json.
///
/// # Errors
/// As [`write_weights`].
pub fn write_weights_as(
    weights_dir: &Path,
    name: &str,
    tensors: &[(String, Tensor)],
    config: &ModelConfig,
    dtype: DType,
    layout: &ServedLayout,
) -> Result<PathBuf> {
    write_dir(weights_dir, name, |tmp| {
        write_checkpoint(tmp, tensors, config, dtype, layout)
    })
}

/// Creates `weights_dir/name` atomically: `fill` writes into a fresh directory beside it
/// (`.tmp-NAME-PID`), which is then renamed (replacing an older `name`). Such folders that a
/// killed process left are removed first ([`remove_stale_temporaries`]), so the first push of
/// the next start clears them. Returns the absolute path.
///
/// # Errors
/// [`VllmError::Io`]; `fill`'s errors.
pub(crate) fn write_dir(
    weights_dir: &Path,
    name: &str,
    fill: impl FnOnce(&Path) -> Result<()>,
) -> Result<PathBuf> {
    std::fs::create_dir_all(weights_dir).map_err(io(weights_dir))?;
    let weights_dir = weights_dir.canonicalize().map_err(io(weights_dir))?;
    remove_stale_temporaries(&weights_dir);
    let dir = weights_dir.join(name);
    let tmp = weights_dir.join(format!(".tmp-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&tmp);
    std::fs::create_dir_all(&tmp).map_err(io(&tmp))?;
    fill(&tmp)?;
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::rename(&tmp, &dir).map_err(io(&dir))?;
    Ok(dir)
}

/// The PID in the name of a folder [`write_dir`] fills before renaming it (`.tmp-NAME-PID`),
/// `None` for any other name.
fn temporary_pid(name: &str) -> Option<u32> {
    let (stem, pid) = name.strip_prefix(".tmp-")?.rsplit_once('-')?;
    if stem.is_empty() || pid.is_empty() || !pid.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    pid.parse().ok()
}

/// Removes from `weights_dir` the folders a refresh was writing when its process was killed
/// (`.tmp-version-NNNNNNNN-PID`, a whole checkpoint's size each; LoRA adapters' alike): only those
/// whose process is gone, by [`rlvr_rundir::fs::remove_stale_entries`]'s rule, so a live run's
/// refresh in a shared directory is left alone. Returns the folders removed; a missing directory
/// removes nothing. [`write_dir`] calls it before every version it writes.
pub fn remove_stale_temporaries(weights_dir: &Path) -> Vec<PathBuf> {
    rlvr_rundir::fs::remove_stale_entries(weights_dir, temporary_pid)
        .into_iter()
        .map(|(p, _)| p)
        .collect()
}

/// Whether a refresh of a model of `config` writes a copy of the embedding as `lm_head.weight`: for a
/// tied model, except Gemma 2, whose vLLM 0.32 model (`Gemma2ForCausalLM`, vllm/model_executor/
/// models/gemma2.py) has no `lm_head` module: its logits always come from `embed_tokens`, and its
/// loader refuses an `lm_head.weight` ("There is no module or parameter named 'lm_head'"), which on
/// a reload leaves the engine dead. (An untied Gemma 2 is refused before any push:
/// [`crate::checks::check_servable`].)
pub fn head_written(config: &ModelConfig) -> bool {
    config.tie_word_embeddings && config.arch != rlvr_model::Arch::Gemma2
}

/// `tensors` in `dtype` and `config` as a HuggingFace checkpoint in `layout` in the existing
/// directory `tmp` (see [`write_weights`]).
fn write_checkpoint(
    tmp: &Path,
    tensors: &[(String, Tensor)],
    config: &ModelConfig,
    dtype: DType,
    layout: &ServedLayout,
) -> Result<()> {
    let mut out: Vec<(String, Tensor)> = tensors
        .iter()
        .map(|(n, t)| Ok((n.clone(), t.detach().to_dtype(dtype)?)))
        .collect::<Result<_>>()?;
    if head_written(config) && !out.iter().any(|(n, _)| n == "lm_head.weight") {
        let embed = out
            .iter()
            .find(|(n, _)| n == "model.embed_tokens.weight")
            .map(|(_, t)| t.clone())
            .ok_or_else(|| {
                VllmError::Config("a tied model's tensors lack model.embed_tokens.weight".into())
            })?;
        out.push(("lm_head.weight".into(), embed));
    }
    for (n, _) in &mut out {
        *n = layout.served_name(n);
    }
    rlvr_model::weights::write_safetensors(&tmp.join("model.safetensors"), &out)?;
    std::fs::write(tmp.join("config.json"), layout.config_bytes(config, dtype)).map_err(io(tmp))?;
    Ok(())
}

/// Deletes every `version-*` directory under `weights_dir` except that of `keep`.
///
/// # Errors
/// [`VllmError::Io`].
pub fn prune_versions(weights_dir: &Path, keep: u64) -> Result<()> {
    let keep_name = format!("version-{keep:08}");
    for entry in std::fs::read_dir(weights_dir).map_err(io(weights_dir))? {
        let entry = entry.map_err(io(weights_dir))?;
        let name = entry.file_name().to_string_lossy().to_string();
        if name.starts_with("version-") && name != keep_name {
            std::fs::remove_dir_all(entry.path()).map_err(io(&entry.path()))?;
        }
    }
    Ok(())
}

/// Seconds spent in one [`VllmClient::refresh`].
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct RefreshTimings {
    /// Writing the checkpoint directory.
    pub write_s: f64,
    /// Pause → reload → reset prefix cache → resume, all servers (sequentially).
    pub reload_s: f64,
    /// Scoring the fixed sequence on every server.
    pub verify_s: f64,
    /// The largest max |ℓ_server − ℓ_expected| over the servers.
    pub max_abs_diff: f64,
}

impl VllmClient {
    /// Reloads the checkpoint directory `dir` (absolute; readable by the servers) on every server:
    /// `POST /pause?mode=wait`, `POST /collective_rpc {"method": "reload_weights", "kwargs":
    /// {"weights_path": dir}}`, `POST /reset_prefix_cache` (after a reload the prefix cache serves
    /// stale KV), `POST /resume`. A server whose reload fails is still asked to resume.
    ///
    /// # Errors
    /// The first failed call (naming the server and its answer). The servers may then hold
    /// different versions: the caller must stop (see [`VllmClient::refresh`]).
    pub fn reload(&self, dir: &Path) -> Result<()> {
        let path = dir.to_string_lossy().to_string();
        let rpc = json!({"method": "reload_weights", "kwargs": {"weights_path": path}});
        for s in &self.servers {
            s.call("POST", "/pause?mode=wait", None, |_| Ok(()))?;
            let reloaded = s
                .call("POST", "/collective_rpc", Some(&rpc), |_| Ok(()))
                .and_then(|_| s.call("POST", "/reset_prefix_cache", None, |_| Ok(())));
            let resumed = s.call("POST", "/resume", None, |_| Ok(()));
            reloaded?;
            resumed?;
        }
        Ok(())
    }

    /// Each server's max |ℓ_server − ℓ_expected| on `check`; errors when one exceeds the tolerance.
    ///
    /// # Errors
    /// [`VllmError::Check`] naming the server that scores differently (stale weights, a head that
    /// was not reloaded, another dtype); request errors.
    pub fn verify(&self, check: &RefreshCheck) -> Result<f64> {
        let scored = self.score(&check.prompt, &check.completion)?;
        check_scores(&self.server_urls(), &scored, check)
    }
}

impl VllmClient {
    /// Pushes the policy of `version` to every server: [`write_weights`] under `weights_dir` (in
    /// the client's [`ServedLayout`], [`VllmClient::set_served_layout`]),
    /// [`VllmClient::reload`], [`VllmClient::verify`] with `check`, then the client's version
    /// becomes `version` and older version directories are deleted ([`prune_versions`]).
    ///
    /// A failed refresh leaves the client refusing to sample ([`VllmClient::sample`] errors) until
    /// a later refresh succeeds, so nothing is ever trained on silently stale weights.
    ///
    /// # Errors
    /// Any step's error, naming the server.
    pub fn refresh(
        &mut self,
        weights_dir: &Path,
        version: u64,
        tensors: &[(String, Tensor)],
        config: &ModelConfig,
        check: &RefreshCheck,
    ) -> Result<RefreshTimings> {
        self.refresh_failed = Some(version);
        let t0 = Instant::now();
        let dir = write_weights_as(
            weights_dir,
            &format!("version-{version:08}"),
            tensors,
            config,
            DType::F32,
            &self.layout,
        )?;
        let write_s = t0.elapsed().as_secs_f64();
        let t1 = Instant::now();
        self.reload(&dir)?;
        let reload_s = t1.elapsed().as_secs_f64();
        let t2 = Instant::now();
        self.model_name = self.config.served_model_name.clone();
        // Scored under the new version's salt: the blocks this request writes hold its KV.
        let salt = self.cache_salt_at(version);
        let scored = self.score_salted(
            &self.model_name,
            &check.prompt,
            &check.completion,
            salt.as_deref(),
        )?;
        let max_abs_diff = check_scores(&self.server_urls(), &scored, check)?;
        let verify_s = t2.elapsed().as_secs_f64();
        self.refreshed(version, check)?;
        prune_versions(weights_dir, version)?;
        Ok(RefreshTimings {
            write_s,
            reload_s,
            verify_s,
            max_abs_diff,
        })
    }
}
