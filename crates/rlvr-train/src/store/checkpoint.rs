//! Checkpoints (DESIGN.md section 10): `RUN_DIR/checkpoints/step-N/` is a model directory that
//! `rlvr eval --model` accepts (config.json, model.safetensors, tokenizer files) plus
//! `trainer_state/` (optimizer moments and, for bf16 weights, f32 master weights, RNG state, data
//! cursor, explorer version and, when it differs from the policy, the explorer's weights; and
//! `buffer.jsonl`, which a run writes empty: with o ≥ 1 a resume re-samples the batches that were
//! in flight). `checkpoints/latest` names the last complete
//! one; `checkpoints/best` the best evaluated one.
//!
//! Atomicity: everything is written into `checkpoints/.tmp-step-N/`, which is renamed to `step-N`
//! only when complete; `latest` is then replaced atomically. A crash at any point leaves the
//! previous `latest` valid.

use std::path::{Path, PathBuf};

use anyhow::Context;
use candle_core::{DType, Device, Tensor};
use rlvr_data::sampler::DataCursor;
use rlvr_model::checkpoint::write_tokenizer_files;
use rlvr_model::weights::{atomic_write, safetensors_bytes};
use rlvr_model::{Model, TokenizerBundle};
use serde::{Deserialize, Serialize};

use crate::store::experience::Experience;

/// Where the experience source stands: saved in checkpoints, so a resumed run draws the prompts
/// (online) or reads the groups (offline) an uninterrupted one would.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", tag = "kind")]
pub enum SourceCursor {
    /// Online: the prompt sampler's cursor.
    Online {
        /// The data cursor.
        cursor: DataCursor,
    },
    /// Offline: groups of the experiences file consumed so far (wrapping around at the end).
    Offline {
        /// Groups consumed.
        groups: u64,
    },
}

/// `trainer_state/state.json`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TrainerState {
    /// Completed trainer steps (= policy version).
    pub step: u64,
    /// AdamW update count.
    pub optimizer_step: u64,
    /// Policy version of the explorer's weights.
    pub explorer_version: u64,
    /// Where the experience source stands.
    pub cursor: SourceCursor,
    /// RNG state: every random choice is seeded by (run seed, indices), so the seed is the state.
    pub rng_seed: u64,
    /// Skipped steps in a row at this point.
    pub skipped_in_row: u32,
    /// Best held-out accuracy so far and its step.
    pub best: Option<(f64, u64)>,
    /// Whether `trainer_state/explorer/` holds the explorer's weights.
    pub explorer_weights: bool,
    /// LoRA-dropout masks drawn so far per adapter ([`rlvr_model::Model::lora_dropout_draws`]), so
    /// a resumed run with `model.lora_dropout` > 0 draws the masks an uninterrupted one would (0,
    /// and absent in checkpoints written before it existed, without LoRA).
    #[serde(default)]
    pub lora_dropout_draws: u64,
    /// Data-parallel ranks of the run that wrote it (1, and absent in checkpoints written before
    /// it existed, for one process). Without optimizer sharding every rank holds the whole state,
    /// and the batch and normalisers are the whole batch's at any world size, so a run may resume
    /// at another world size (train.log notes it).
    #[serde(default = "one")]
    pub world_size: u64,
}

fn one() -> u64 {
    1
}

/// What a checkpoint needs besides the trainer state record.
pub struct CheckpointParts<'a> {
    /// The policy.
    pub model: &'a Model,
    /// Its tokenizer.
    pub tokenizer: &'a TokenizerBundle,
    /// AdamW moments (m, v), in `model.named_vars()` order.
    pub moments: (&'a [Tensor], &'a [Tensor]),
    /// AdamW's f32 master weights, in the same order (`None` for f32 parameters; empty = none):
    /// saved beside the moments so a bf16 run resumes exactly.
    pub masters: &'a [Option<Tensor>],
    /// The explorer's weights when their version differs from the policy's.
    pub explorer: Option<&'a Model>,
    /// Experiences produced but not yet trained on.
    pub buffer: &'a [Experience],
}

/// `RUN_DIR/checkpoints`.
pub fn checkpoints_dir(run_dir: &Path) -> PathBuf {
    run_dir.join("checkpoints")
}

/// Writes checkpoint `step-N` atomically and points `latest` at it.
///
/// # Errors
/// I/O and serialisation errors, naming the path.
pub fn save(
    run_dir: &Path,
    state: &TrainerState,
    parts: &CheckpointParts,
) -> anyhow::Result<PathBuf> {
    let root = checkpoints_dir(run_dir);
    std::fs::create_dir_all(&root).with_context(|| format!("creating {}", root.display()))?;
    let name = format!("step-{}", state.step);
    let tmp = root.join(format!(".tmp-{name}"));
    if tmp.exists() {
        std::fs::remove_dir_all(&tmp).with_context(|| format!("removing {}", tmp.display()))?;
    }
    let dtype = parts.model.dtype();
    parts
        .model
        .save(&tmp, dtype)
        .with_context(|| format!("writing the model to {}", tmp.display()))?;
    write_tokenizer_files(&tmp, parts.tokenizer)?;
    let ts = tmp.join("trainer_state");
    std::fs::create_dir_all(&ts)?;
    let (m, v) = parts.moments;
    let mut named = Vec::with_capacity(m.len() * 2);
    for (i, (m, v)) in m.iter().zip(v).enumerate() {
        named.push((format!("m.{i:05}"), m.clone()));
        named.push((format!("v.{i:05}"), v.clone()));
    }
    for (i, w) in parts.masters.iter().enumerate() {
        if let Some(w) = w {
            named.push((format!("w.{i:05}"), w.clone()));
        }
    }
    atomic_write(
        &ts.join("optimizer.safetensors"),
        &safetensors_bytes(&named)?,
    )?;
    if let Some(e) = parts.explorer {
        e.save(&ts.join("explorer"), e.dtype())?;
    }
    let mut buf = String::new();
    for e in parts.buffer {
        buf.push_str(&serde_json::to_string(e)?);
        buf.push('\n');
    }
    atomic_write(&ts.join("buffer.jsonl"), buf.as_bytes())?;
    let mut st = state.clone();
    st.explorer_weights = parts.explorer.is_some();
    atomic_write(
        &ts.join("state.json"),
        serde_json::to_string_pretty(&st)?.as_bytes(),
    )?;
    let dest = root.join(&name);
    if dest.exists() {
        std::fs::remove_dir_all(&dest)?;
    }
    std::fs::rename(&tmp, &dest)
        .with_context(|| format!("renaming {} to {}", tmp.display(), dest.display()))?;
    atomic_write(&root.join("latest"), format!("{name}\n").as_bytes())?;
    Ok(dest)
}

/// The directory `checkpoints/latest` names, if any.
///
/// # Errors
/// `latest` names a missing directory.
pub fn latest(run_dir: &Path) -> anyhow::Result<Option<PathBuf>> {
    let root = checkpoints_dir(run_dir);
    let Ok(name) = std::fs::read_to_string(root.join("latest")) else {
        return Ok(None);
    };
    let dir = root.join(name.trim());
    anyhow::ensure!(
        dir.is_dir(),
        "{} names {}, which does not exist",
        root.join("latest").display(),
        dir.display()
    );
    Ok(Some(dir))
}

/// The model directory a `--model` path names: `RUN_DIR` (a directory with `checkpoints/latest`
/// and no `config.json` of its own) and `RUN_DIR/checkpoints/latest` (the text file) both name the
/// checkpoint that `latest` names; any other path is returned as given. The name in `latest` must
/// be one plain path component (`step-N`), so it never leaves the run's `checkpoints/` folder.
///
/// # Errors
/// An unreadable `latest`, a name that is not one plain component, or a checkpoint that does not
/// exist, naming the file.
pub fn resolve_model_dir(path: &Path) -> anyhow::Result<PathBuf> {
    let latest = if path.is_file() && path.file_name().is_some_and(|n| n == "latest") {
        path.to_path_buf()
    } else if path.is_dir()
        && !path.join("config.json").exists()
        && checkpoints_dir(path).join("latest").is_file()
    {
        checkpoints_dir(path).join("latest")
    } else {
        return Ok(path.to_path_buf());
    };
    let name = std::fs::read_to_string(&latest)
        .map_err(|e| anyhow::anyhow!("reading {}: {e}", latest.display()))?;
    let name = name.trim();
    let mut parts = Path::new(name).components();
    let plain = matches!(
        (parts.next(), parts.next()),
        (Some(std::path::Component::Normal(_)), None)
    );
    anyhow::ensure!(
        plain,
        "{} names `{name}`, which is not a checkpoint folder beside it (expected e.g. step-12)",
        latest.display()
    );
    let dir = latest.with_file_name(name);
    anyhow::ensure!(
        dir.join("config.json").is_file(),
        "{} names {}, which is not a model directory (no config.json)",
        latest.display(),
        dir.display()
    );
    Ok(dir)
}

/// What [`load_state`] returns: the state record, AdamW moments m and v, and the buffer.
pub type LoadedState = (TrainerState, Vec<Tensor>, Vec<Tensor>, Vec<Experience>);

/// Reads `trainer_state/state.json`, the optimizer moments and the buffer of checkpoint `dir`.
///
/// # Errors
/// Missing or malformed files, naming them.
pub fn load_state(dir: &Path, device: &Device) -> anyhow::Result<LoadedState> {
    let ts = dir.join("trainer_state");
    let p = ts.join("state.json");
    let st: TrainerState = serde_json::from_str(
        &std::fs::read_to_string(&p).with_context(|| format!("reading {}", p.display()))?,
    )
    .with_context(|| format!("parsing {}", p.display()))?;
    let p = ts.join("optimizer.safetensors");
    let map = candle_core::safetensors::load(&p, device)
        .with_context(|| format!("reading {}", p.display()))?;
    let mut keys: Vec<&String> = map.keys().filter(|k| k.starts_with("m.")).collect();
    keys.sort();
    let mut m = Vec::new();
    let mut v = Vec::new();
    for k in keys {
        m.push(map[k].to_dtype(DType::F32)?);
        let vk = format!("v.{}", &k[2..]);
        v.push(
            map.get(&vk)
                .with_context(|| format!("{} lacks {vk}", p.display()))?
                .to_dtype(DType::F32)?,
        );
    }
    let p = ts.join("buffer.jsonl");
    let mut buffer = Vec::new();
    if let Ok(text) = std::fs::read_to_string(&p) {
        for (i, line) in text.lines().enumerate() {
            if !line.trim().is_empty() {
                buffer.push(
                    serde_json::from_str(line)
                        .with_context(|| format!("{}:{}", p.display(), i + 1))?,
                );
            }
        }
    }
    Ok((st, m, v, buffer))
}

/// The f32 master weights of checkpoint `dir` (`trainer_state/optimizer.safetensors`, keys
/// `w.NNNNN`), one entry per parameter (`n` of them), `None` where none was saved (f32 parameters,
/// or a checkpoint written before masters existed: the optimizer then starts from the weights).
///
/// # Errors
/// A missing or unreadable optimizer file, a master index ≥ `n`.
pub fn load_masters(dir: &Path, n: usize, device: &Device) -> anyhow::Result<Vec<Option<Tensor>>> {
    let p = dir.join("trainer_state/optimizer.safetensors");
    let map = candle_core::safetensors::load(&p, device)
        .with_context(|| format!("reading {}", p.display()))?;
    let mut out = vec![None; n];
    for (k, t) in map {
        if let Some(i) = k.strip_prefix("w.").and_then(|i| i.parse::<usize>().ok()) {
            anyhow::ensure!(i < n, "{}: master {k} for {n} parameters", p.display());
            out[i] = Some(t.to_dtype(DType::F32)?);
        }
    }
    Ok(out)
}

/// Removes old checkpoints, keeping the `keep_last` newest and the one `best` names (0 = keep all).
///
/// # Errors
/// I/O errors.
pub fn rotate(run_dir: &Path, keep_last: usize, best: Option<u64>) -> anyhow::Result<()> {
    if keep_last == 0 {
        return Ok(());
    }
    let root = checkpoints_dir(run_dir);
    let mut steps: Vec<u64> = std::fs::read_dir(&root)?
        .filter_map(|e| e.ok())
        .filter_map(|e| {
            e.file_name()
                .to_str()
                .and_then(|n| n.strip_prefix("step-"))
                .and_then(|n| n.parse().ok())
        })
        .collect();
    steps.sort_unstable();
    let n = steps.len();
    for (i, s) in steps.iter().enumerate() {
        if i + keep_last < n && Some(*s) != best {
            std::fs::remove_dir_all(root.join(format!("step-{s}")))?;
        }
    }
    Ok(())
}

/// Points `checkpoints/best` at `step-N`.
///
/// # Errors
/// I/O errors.
pub fn mark_best(run_dir: &Path, step: u64) -> anyhow::Result<()> {
    atomic_write(
        &checkpoints_dir(run_dir).join("best"),
        format!("step-{step}\n").as_bytes(),
    )?;
    Ok(())
}

/// Refuses to write a checkpoint whose weights hold a NaN or an infinity (`latest` then keeps
/// naming the previous, good one).
///
/// # Errors
/// Names the first non-finite tensor; tensor errors.
pub fn ensure_finite(model: &Model) -> anyhow::Result<()> {
    if let Some(name) = non_finite_weight(model)? {
        anyhow::bail!(
            "weight {name} holds a non-finite value (NaN or inf): this checkpoint is not written and \
             checkpoints/latest still names the last good one"
        );
    }
    Ok(())
}

/// The name of the first weight of `model` that holds a NaN or an infinity, if any.
///
/// # Errors
/// Tensor errors.
pub fn non_finite_weight(model: &Model) -> anyhow::Result<Option<String>> {
    for (name, v) in model.named_vars() {
        let t = v.as_tensor();
        // x − x is 0 for every finite x and NaN for NaN and ±inf: the sum is finite iff all are.
        let s = t
            .sub(t)?
            .sum_all()?
            .to_dtype(candle_core::DType::F32)?
            .to_scalar::<f32>()?;
        if !s.is_finite() {
            return Ok(Some(name));
        }
    }
    Ok(None)
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::{DType, Device, Tensor};

    #[test]
    fn a_checkpoint_with_a_nan_or_inf_weight_is_refused() {
        let config = rlvr_model::ModelConfig::from_json(
            &serde_json::json!({"model_type": "qwen2", "vocab_size": 16, "hidden_size": 8,
                "intermediate_size": 16, "num_hidden_layers": 1, "num_attention_heads": 2,
                "num_key_value_heads": 1, "max_position_embeddings": 32}),
            "inline".as_ref(),
        )
        .unwrap();
        let m = rlvr_model::Model::random(config, 0.02, 0, DType::F32, &Device::Cpu).unwrap();
        ensure_finite(&m).unwrap();
        for bad in [f32::NAN, f32::INFINITY] {
            let (name, v) = m.named_vars().into_iter().last().unwrap();
            let good = v.as_tensor().copy().unwrap();
            let mut data = good.flatten_all().unwrap().to_vec1::<f32>().unwrap();
            data[3] = bad;
            v.set(&Tensor::from_vec(data, good.dims().to_vec(), &Device::Cpu).unwrap())
                .unwrap();
            let e = ensure_finite(&m).unwrap_err().to_string();
            assert!(e.contains(&name) && e.contains("non-finite"), "{e}");
            v.set(&good).unwrap();
        }
    }
}
