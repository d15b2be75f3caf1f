//! Checkpoints (DESIGN.md section 10): `RUN_DIR/checkpoints/step-N/` is a model directory that
//! `rlvr eval --model` accepts (config.json, model.safetensors, tokenizer files) plus
//! `trainer_state/` (optimizer moments and, for bf16 weights, f32 master weights, RNG state, data
//! cursor, explorer version and, when it differs from the policy, the explorer's weights; and
//! `buffer.jsonl`: with o ≥ 1 the batches sampled for the steps after the checkpoint, one JSON
//! object each, which a resume trains on instead of re-sampling them; empty with o = 0).
//! `checkpoints/latest` names the last complete
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
use rlvr_model::weights::{atomic_write, write_safetensors};
use rlvr_model::{Model, TokenizerBundle};
use serde::{Deserialize, Serialize};

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
    /// The LoRA-dropout round ([`rlvr_model::Model::lora_dropout_round`]: optimizer updates so
    /// far), so a resumed run with `model.lora_dropout` > 0 draws the masks an uninterrupted one
    /// would (0 without LoRA, and absent in checkpoints written before it existed). The file
    /// keeps the key `lora_dropout_draws` (the format is unchanged); until 2026-12-07 it held the
    /// position of a mask stream drawn once per forward.
    #[serde(default, rename = "lora_dropout_draws")]
    pub lora_dropout_round: u64,
    /// Data-parallel ranks of the run that wrote it (1, and absent in checkpoints written before
    /// it existed, for one process). Without optimizer sharding every rank holds the whole state,
    /// and the batch and normalisers are the whole batch's at any world size, so a run may resume
    /// at another world size (train.log notes it).
    #[serde(default = "one")]
    pub world_size: u64,
    /// Whether `trainer_state/optimizer.safetensors` holds the optimizer's moments and masters
    /// (true, and absent in checkpoints written before it existed); false for a checkpoint of
    /// a run with `train.save_optimizer = false`, which holds the model alone and which a
    /// resume refuses unless `train.resume_without_optimizer` is set. Written only when false,
    /// so a checkpoint with the optimizer is byte for byte what it was before the field existed.
    #[serde(default = "yes", skip_serializing_if = "is_true")]
    pub optimizer_saved: bool,
}

fn one() -> u64 {
    1
}

fn yes() -> bool {
    true
}

fn is_true(b: &bool) -> bool {
    *b
}

/// The optimizer's tensors in a checkpoint (`trainer_state/optimizer.safetensors`): AdamW's
/// moments and f32 master weights, in `model.named_vars()` order.
#[derive(Debug, Clone, Default)]
pub struct OptimizerRecord {
    /// First moments m, one per parameter (f32, the parameter's shape).
    pub m: Vec<Tensor>,
    /// Second moments v, one per parameter (f32, the parameter's shape).
    pub v: Vec<Tensor>,
    /// f32 master weights (`None` for f32 parameters, or a checkpoint written before masters
    /// existed; empty = none): saved beside the moments so a bf16 run resumes exactly.
    pub masters: Vec<Option<Tensor>>,
}

/// What a checkpoint needs besides the trainer state record.
pub struct CheckpointParts<'a, B: Serialize> {
    /// The policy.
    pub model: &'a Model,
    /// Its tokenizer.
    pub tokenizer: &'a TokenizerBundle,
    /// The optimizer's tensors; `None` writes the model alone (`train.save_optimizer = false`:
    /// no `trainer_state/optimizer.safetensors`, [`TrainerState::optimizer_saved`] false).
    pub optimizer: Option<&'a OptimizerRecord>,
    /// The explorer's weights when their version differs from the policy's.
    pub explorer: Option<&'a Model>,
    /// Batches sampled but not yet trained on (the explorer's in flight under a sync offset), in
    /// step order: one JSON object each in `buffer.jsonl`.
    pub buffer: &'a [B],
    /// The identity of the run's inputs for `manifest.json` ([`crate::store::manifest::inputs`]).
    pub inputs: serde_json::Value,
}

/// `RUN_DIR/checkpoints`.
pub fn checkpoints_dir(run_dir: &Path) -> PathBuf {
    run_dir.join(rlvr_rundir::files::CHECKPOINTS)
}

/// Writes checkpoint `step-N` atomically and points `latest` at it.
///
/// # Errors
/// I/O and serialisation errors, naming the path.
pub fn save<B: Serialize>(
    run_dir: &Path,
    state: &TrainerState,
    parts: &CheckpointParts<B>,
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
    if let Some(opt) = parts.optimizer {
        let mut named = Vec::with_capacity(opt.m.len() * 2);
        for (i, (m, v)) in opt.m.iter().zip(&opt.v).enumerate() {
            named.push((format!("m.{i:05}"), m.clone()));
            named.push((format!("v.{i:05}"), v.clone()));
        }
        for (i, w) in opt.masters.iter().enumerate() {
            if let Some(w) = w {
                named.push((format!("w.{i:05}"), w.clone()));
            }
        }
        write_safetensors(&ts.join("optimizer.safetensors"), &named)?;
    }
    if let Some(e) = parts.explorer {
        e.save(&ts.join("explorer"), e.dtype())?;
    }
    atomic_write(
        &ts.join("buffer.jsonl"),
        buffer_text(parts.buffer)?.as_bytes(),
    )?;
    let mut st = state.clone();
    st.explorer_weights = parts.explorer.is_some();
    st.optimizer_saved = parts.optimizer.is_some();
    atomic_write(
        &ts.join("state.json"),
        serde_json::to_string_pretty(&st)?.as_bytes(),
    )?;
    // Last: sizes and checksums of everything above, before the checkpoint becomes visible.
    crate::store::manifest::write(&tmp, parts.inputs.clone())?;
    let dest = root.join(&name);
    if dest.exists() {
        std::fs::remove_dir_all(&dest)?;
    }
    std::fs::rename(&tmp, &dest)
        .with_context(|| format!("renaming {} to {}", tmp.display(), dest.display()))?;
    atomic_write(&root.join("latest"), format!("{name}\n").as_bytes())?;
    Ok(dest)
}

/// The checkpoint `--resume` continues from: [`resume_point`]'s directory.
///
/// # Errors
/// As [`resume_point`].
pub fn latest(run_dir: &Path) -> anyhow::Result<Option<PathBuf>> {
    Ok(resume_point(run_dir)?.map(|p| p.dir))
}

/// The checkpoint a resume continues from, and why it is not the one `checkpoints/latest` names
/// when it is not.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResumePoint {
    /// The checkpoint directory (`RUN_DIR/checkpoints/step-N`), complete ([`incomplete`]).
    pub dir: PathBuf,
    /// Set when `latest` is missing or names an incomplete checkpoint, so the newest complete
    /// `step-N` was taken instead: a line for stderr naming both.
    pub note: Option<String>,
}

/// The checkpoint a resume continues from: the one `checkpoints/latest` names when it is complete
/// ([`incomplete`]); when `latest` is missing or names a missing or incomplete checkpoint, the
/// newest complete `step-N` directory (with a [`ResumePoint::note`] naming it), so a lost or torn
/// `latest` never makes a resume start over and overwrite later work. `None`: no `latest` and no
/// complete checkpoint (a fresh start).
///
/// # Errors
/// A `latest` whose name is not one plain component of `checkpoints/` (e.g. `../x`, an absolute
/// path) or that resolves outside it through a link, naming the file and the path; a `latest` that
/// names an incomplete checkpoint when no complete one exists (nothing is started over); I/O errors
/// listing `checkpoints/`.
pub fn resume_point(run_dir: &Path) -> anyhow::Result<Option<ResumePoint>> {
    let root = checkpoints_dir(run_dir);
    let latest = root.join("latest");
    let named = match std::fs::read(&latest) {
        Ok(bytes) => Some(checkpoint_named(&latest, &bytes)?),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(e) => anyhow::bail!("reading {}: {e}", latest.display()),
    };
    let broken = match &named {
        Some(dir) => match incomplete(dir) {
            None => {
                return Ok(Some(ResumePoint {
                    dir: dir.clone(),
                    note: None,
                }))
            }
            Some(why) => Some((dir.clone(), why)),
        },
        None => None,
    };
    let newest = newest_complete(&root)?;
    match (newest, broken) {
        (Some(dir), None) => Ok(Some(ResumePoint {
            note: Some(format!(
                "note: {} is missing: resuming from the newest complete checkpoint, {}",
                latest.display(),
                dir.display()
            )),
            dir,
        })),
        (Some(dir), Some((bad, why))) => Ok(Some(ResumePoint {
            note: Some(format!(
                "note: {} names {}, which is incomplete ({why}): resuming from the newest \
                 complete checkpoint, {}",
                latest.display(),
                bad.display(),
                dir.display()
            )),
            dir,
        })),
        (None, None) => Ok(None),
        (None, Some((bad, why))) => anyhow::bail!(
            "{} names {}, which is incomplete ({why}), and no other checkpoint in {} is complete: \
             nothing to resume from (move the run directory aside to start over)",
            latest.display(),
            bad.display(),
            root.display()
        ),
    }
}

/// The checkpoint directory that `latest` (the file, holding `bytes`) names: one plain path
/// component inside `latest`'s folder, which must not leave it through a link either.
fn checkpoint_named(latest: &Path, bytes: &[u8]) -> anyhow::Result<PathBuf> {
    let root = latest.parent().unwrap_or(Path::new("."));
    let name = String::from_utf8_lossy(bytes);
    let name = name.trim();
    let mut parts = Path::new(name).components();
    let plain = matches!(
        (parts.next(), parts.next()),
        (Some(std::path::Component::Normal(_)), None)
    );
    anyhow::ensure!(
        plain,
        "{} names `{name}`, which is not a checkpoint folder inside {} (expected e.g. step-12): \
         refusing to resume from outside the run's checkpoints",
        latest.display(),
        root.display()
    );
    let dir = root.join(name);
    if let (Ok(real), Ok(real_root)) = (dir.canonicalize(), root.canonicalize()) {
        anyhow::ensure!(
            real.parent() == Some(real_root.as_path()),
            "{} names {}, which resolves to {}, outside {}: refusing to resume from outside the \
             run's checkpoints",
            latest.display(),
            dir.display(),
            real.display(),
            real_root.display()
        );
    }
    Ok(dir)
}

/// The newest `step-N` directory of `root` that is complete ([`incomplete`]), if any.
fn newest_complete(root: &Path) -> anyhow::Result<Option<PathBuf>> {
    let entries = match std::fs::read_dir(root) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => anyhow::bail!("listing {}: {e}", root.display()),
    };
    let mut steps: Vec<u64> = entries
        .filter_map(|e| e.ok())
        .filter_map(|e| {
            e.file_name()
                .to_str()
                .and_then(|n| n.strip_prefix("step-"))
                .and_then(|n| n.parse().ok())
        })
        .collect();
    steps.sort_unstable_by(|a, b| b.cmp(a));
    // A `step-N` that is a link out of `checkpoints/` is not one of this run's checkpoints.
    let real_root = root.canonicalize().ok();
    let inside = |d: &PathBuf| {
        d.canonicalize().ok().as_deref().and_then(Path::parent) == real_root.as_deref()
    };
    Ok(steps
        .into_iter()
        .map(|s| root.join(format!("step-{s}")))
        .find(|d| inside(d) && incomplete(d).is_none()))
}

/// Why checkpoint `dir` is incomplete, or `None` when every file [`save`] writes is present and
/// parses: config.json and tokenizer_config.json (JSON), tokenizer.json, the weights
/// (`model.safetensors`, and/or LoRA's `adapter/adapter_config.json` and
/// `adapter/adapter_model.safetensors`: a header that parses and a length that matches it),
/// `trainer_state/state.json` (a [`TrainerState`] whose `step` is the N of a `step-N` directory),
/// `trainer_state/optimizer.safetensors` (unless the state says it was not saved),
/// `trainer_state/buffer.jsonl` and, when the state says so, `trainer_state/explorer/` (the same
/// model files); then, when it has a `manifest.json`, every file's size and CRC-32C
/// ([`crate::store::manifest::verify`], which reads every file once).
pub fn incomplete(dir: &Path) -> Option<String> {
    if !dir.is_dir() {
        return Some(format!("{} does not exist", dir.display()));
    }
    let ts = dir.join("trainer_state");
    let state = match std::fs::read(ts.join("state.json"))
        .map_err(|e| e.to_string())
        .and_then(|b| serde_json::from_slice::<TrainerState>(&b).map_err(|e| e.to_string()))
    {
        Ok(s) => s,
        Err(e) => return Some(format!("{}: {e}", ts.join("state.json").display())),
    };
    // A `step-N` directory holds the state after step N; another step is a copied or edited file.
    let named = dir
        .file_name()
        .and_then(|n| n.to_str())
        .and_then(|n| n.strip_prefix("step-"))
        .and_then(|n| n.parse::<u64>().ok());
    if let Some(n) = named.filter(|&n| n != state.step) {
        return Some(format!(
            "{}: field `step` is {}, but the directory is step-{n}",
            ts.join("state.json").display(),
            state.step
        ));
    }
    let mut checks = model_dir_problem(dir, true)
        .into_iter()
        .chain(
            state
                .optimizer_saved
                .then(|| safetensors_problem(&ts.join("optimizer.safetensors")))
                .flatten(),
        )
        .chain(
            (!ts.join("buffer.jsonl").is_file())
                .then(|| format!("{} is missing", ts.join("buffer.jsonl").display())),
        );
    if let Some(why) = checks.next() {
        return Some(why);
    }
    if state.explorer_weights {
        if let Some(why) = model_dir_problem(&ts.join("explorer"), false) {
            return Some(why);
        }
    }
    crate::store::manifest::verify(dir)
        .err()
        .map(|e| format!("{e:#}"))
}

/// What is wrong with the model files of `dir` (config.json, the weights; the tokenizer files when
/// `tokenizer`), if anything.
fn model_dir_problem(dir: &Path, tokenizer: bool) -> Option<String> {
    let json = |p: PathBuf| -> Option<String> {
        match std::fs::read(&p) {
            Ok(b) => serde_json::from_slice::<serde_json::Value>(&b)
                .err()
                .map(|e| format!("{}: {e}", p.display())),
            Err(e) => Some(format!("{}: {e}", p.display())),
        }
    };
    if let Some(why) = json(dir.join("config.json")) {
        return Some(why);
    }
    if tokenizer {
        if let Some(why) = json(dir.join("tokenizer_config.json")) {
            return Some(why);
        }
        let t = dir.join("tokenizer.json");
        if !t.is_file() {
            return Some(format!("{} is missing", t.display()));
        }
    }
    let adapter = dir.join("adapter");
    if adapter.is_dir() {
        if let Some(why) = json(adapter.join("adapter_config.json")) {
            return Some(why);
        }
        if let Some(why) = safetensors_problem(&adapter.join("adapter_model.safetensors")) {
            return Some(why);
        }
        let base = dir.join("model.safetensors");
        return base.exists().then(|| safetensors_problem(&base)).flatten();
    }
    safetensors_problem(&dir.join("model.safetensors"))
}

/// What is wrong with safetensors file `p` (missing, a header that does not parse, a length that
/// does not match the header's offsets), if anything. Reads the header only.
fn safetensors_problem(p: &Path) -> Option<String> {
    use std::io::Read;
    let check = || -> Result<(), String> {
        let mut f = std::fs::File::open(p).map_err(|e| e.to_string())?;
        let len = f.metadata().map_err(|e| e.to_string())?.len();
        let mut n = [0u8; 8];
        f.read_exact(&mut n)
            .map_err(|_| format!("{len} bytes, shorter than a header"))?;
        let n = u64::from_le_bytes(n);
        if n > len.saturating_sub(8) || n > 100 << 20 {
            return Err(format!("header of {n} bytes in a file of {len}"));
        }
        let mut header = vec![0u8; n as usize];
        f.read_exact(&mut header).map_err(|e| e.to_string())?;
        let map: serde_json::Map<String, serde_json::Value> =
            serde_json::from_slice(&header).map_err(|e| format!("header: {e}"))?;
        let mut end = 0u64;
        for (name, t) in &map {
            if name == "__metadata__" {
                continue;
            }
            let off = t
                .get("data_offsets")
                .and_then(|o| o.get(1))
                .and_then(serde_json::Value::as_u64)
                .ok_or_else(|| format!("header: tensor {name} has no data_offsets"))?;
            end = end.max(off);
        }
        if 8 + n + end != len {
            return Err(format!(
                "{len} bytes, but its header describes {}",
                8 + n + end
            ));
        }
        Ok(())
    };
    check().err().map(|e| format!("{}: {e}", p.display()))
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

/// `trainer_state/buffer.jsonl`'s text for `batches`: one JSON object per line, written through
/// `serde_json::Value` as the format has always been (keys sorted, f32s widened to f64; a direct
/// `to_string` would keep field order and print f32s short), so that checkpoints stay
/// byte-identical to those of earlier versions.
///
/// # Errors
/// A batch that does not serialise.
pub fn buffer_text<B: Serialize>(batches: &[B]) -> serde_json::Result<String> {
    let mut buf = String::new();
    for b in batches {
        buf.push_str(&serde_json::to_string(&serde_json::to_value(b)?)?);
        buf.push('\n');
    }
    Ok(buf)
}

/// The in-flight batches of checkpoint `dir`'s `trainer_state/buffer.jsonl` (one JSON object per
/// line, each a `T`), in step order; a missing or empty file (checkpoints of o = 0, or written
/// before the buffer was kept) is an empty buffer.
///
/// # Errors
/// A line that is not a `T`, naming file and line.
pub fn read_buffer<T: serde::de::DeserializeOwned>(dir: &Path) -> anyhow::Result<Vec<T>> {
    let p = dir.join("trainer_state/buffer.jsonl");
    let mut buffer = Vec::new();
    if let Ok(text) = std::fs::read_to_string(&p) {
        for (i, line) in text.lines().enumerate() {
            if !line.trim().is_empty() {
                let at = format!("{}:{}", p.display(), i + 1);
                let v = serde_json::from_str(line)
                    .with_context(|| format!("parsing the batch at {at}"))?;
                buffer.push(v);
            }
        }
    }
    Ok(buffer)
}

/// Reads `trainer_state/state.json` of checkpoint `dir`.
///
/// # Errors
/// A missing or malformed file, naming it.
pub fn load_state(dir: &Path) -> anyhow::Result<TrainerState> {
    let p = dir.join("trainer_state/state.json");
    serde_json::from_str(
        &std::fs::read_to_string(&p).with_context(|| format!("reading {}", p.display()))?,
    )
    .with_context(|| format!("parsing {}", p.display()))
}

/// The optimizer's tensors of checkpoint `dir` (`trainer_state/optimizer.safetensors`): the
/// moments (keys `m.NNNNN`, `v.NNNNN`, in key order) and the f32 master weights (keys
/// `w.NNNNN`), one master entry per parameter (`n` of them), `None` where none was saved (f32
/// parameters, or a checkpoint written before masters existed: the optimizer then starts from the
/// weights).
///
/// # Errors
/// A missing or unreadable optimizer file, an `m` without its `v`, a master index ≥ `n`.
pub fn load_optimizer(dir: &Path, n: usize, device: &Device) -> anyhow::Result<OptimizerRecord> {
    let p = dir.join("trainer_state/optimizer.safetensors");
    let map = candle_core::safetensors::load(&p, device)
        .with_context(|| format!("reading {}", p.display()))?;
    let mut keys: Vec<&String> = map.keys().filter(|k| k.starts_with("m.")).collect();
    keys.sort();
    let mut rec = OptimizerRecord {
        masters: vec![None; n],
        ..OptimizerRecord::default()
    };
    for k in keys {
        rec.m.push(map[k].to_dtype(DType::F32)?);
        let vk = format!("v.{}", &k[2..]);
        rec.v.push(
            map.get(&vk)
                .with_context(|| format!("{} lacks {vk}", p.display()))?
                .to_dtype(DType::F32)?,
        );
    }
    for (k, t) in &map {
        if let Some(i) = k.strip_prefix("w.").and_then(|i| i.parse::<usize>().ok()) {
            anyhow::ensure!(i < n, "{}: master {k} for {n} parameters", p.display());
            rec.masters[i] = Some(t.to_dtype(DType::F32)?);
        }
    }
    Ok(rec)
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
            remove_unless_read(&root.join(format!("step-{s}")))?;
        }
    }
    Ok(())
}

/// Removes checkpoint `dir` under an exclusive `flock` on it, unless a reader holds its shared
/// lock ([`resolve_and_hold`]: `rlvr eval --model RUN` reading it): then it stays, and a later
/// rotation removes it. A directory already gone is fine.
///
/// # Errors
/// I/O errors other than a missing directory or a busy lock.
fn remove_unless_read(dir: &Path) -> anyhow::Result<()> {
    let f = match std::fs::File::open(dir) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e).with_context(|| format!("opening {}", dir.display())),
    };
    match rlvr_rundir::lock::try_flock(&f).with_context(|| format!("locking {}", dir.display()))? {
        true => std::fs::remove_dir_all(dir)
            .with_context(|| format!("removing the old checkpoint {}", dir.display())),
        // A reader holds it: a later rotation removes it.
        false => Ok(()),
    }
}

/// A shared `flock` on a checkpoint directory, held while a command reads it; dropping it
/// releases it. While it is held, [`rotate`] leaves that checkpoint in place.
#[derive(Debug)]
pub struct CheckpointReadLock {
    // Keeping the descriptor open keeps the lock.
    _dir: std::fs::File,
}

/// [`resolve_model_dir`], holding a shared lock on the checkpoint when the path names one in a
/// run's `checkpoints/` folder, so that the trainer's rotation cannot delete it while it is read
/// (`rlvr eval --model RUN` during a run reported files missing or corrupt that were only being
/// rotated away). When `latest` moved on and the checkpoint it named was removed before the lock
/// was taken, `latest` is read again (up to 5 times). Any other model directory is returned
/// without a lock.
///
/// # Errors
/// As [`resolve_model_dir`] (after the retries); the lock cannot be taken.
pub fn resolve_and_hold(path: &Path) -> anyhow::Result<(PathBuf, Option<CheckpointReadLock>)> {
    let mut last = None;
    for _ in 0..5 {
        let dir = match resolve_model_dir(path) {
            Ok(d) => d,
            Err(e) => {
                // `latest` named a checkpoint rotated away between two reads: read it again.
                last = Some(e);
                std::thread::sleep(std::time::Duration::from_millis(50));
                continue;
            }
        };
        let in_run = dir
            .parent()
            .and_then(Path::file_name)
            .is_some_and(|n| n == rlvr_rundir::files::CHECKPOINTS);
        if !in_run {
            return Ok((dir, None));
        }
        let Ok(f) = std::fs::File::open(&dir) else {
            std::thread::sleep(std::time::Duration::from_millis(50));
            continue;
        };
        // Waits while a rotation holds the exclusive lock to delete it.
        rlvr_rundir::lock::flock_shared(&f)
            .with_context(|| format!("locking {}", dir.display()))?;
        if dir.join("config.json").is_file() {
            return Ok((dir, Some(CheckpointReadLock { _dir: f })));
        }
        last = Some(anyhow::anyhow!(
            "{} was removed while it was being opened",
            dir.display()
        ));
    }
    Err(last
        .unwrap_or_else(|| anyhow::anyhow!("{}: no checkpoint could be opened", path.display())))
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

    /// A safetensors file holding one f32 tensor named `name`.
    fn safetensors_file(p: &Path, name: &str) {
        let header =
            format!("{{\"{name}\":{{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}}}");
        let mut b = (header.len() as u64).to_le_bytes().to_vec();
        b.extend_from_slice(header.as_bytes());
        b.extend_from_slice(&[0u8; 8]);
        std::fs::write(p, b).unwrap();
    }

    /// A checkpoint `RUN/checkpoints/step-N` with every file [`save`] writes (tiny stand-ins).
    fn fake_checkpoint(run: &Path, step: u64) -> PathBuf {
        let dir = checkpoints_dir(run).join(format!("step-{step}"));
        std::fs::create_dir_all(dir.join("trainer_state")).unwrap();
        std::fs::write(dir.join("config.json"), "{\"model_type\": \"qwen2\"}").unwrap();
        std::fs::write(dir.join("tokenizer.json"), "{}").unwrap();
        std::fs::write(dir.join("tokenizer_config.json"), "{}").unwrap();
        safetensors_file(&dir.join("model.safetensors"), "w");
        safetensors_file(&dir.join("trainer_state/optimizer.safetensors"), "m.00000");
        std::fs::write(dir.join("trainer_state/buffer.jsonl"), "").unwrap();
        let st = TrainerState {
            step,
            optimizer_step: step,
            explorer_version: step,
            cursor: SourceCursor::Offline { groups: step },
            rng_seed: 0,
            skipped_in_row: 0,
            best: None,
            explorer_weights: false,
            lora_dropout_round: 0,
            world_size: 1,
            optimizer_saved: true,
        };
        std::fs::write(
            dir.join("trainer_state/state.json"),
            serde_json::to_string(&st).unwrap(),
        )
        .unwrap();
        assert_eq!(incomplete(&dir), None);
        dir
    }

    fn set_latest(run: &Path, name: &str) {
        std::fs::write(checkpoints_dir(run).join("latest"), format!("{name}\n")).unwrap();
    }

    #[test]
    fn resume_takes_the_newest_complete_checkpoint_when_latest_is_missing_or_broken() {
        let tmp = tempfile::tempdir().unwrap();
        let run = tmp.path();
        assert_eq!(resume_point(run).unwrap(), None);
        fake_checkpoint(run, 1);
        let two = fake_checkpoint(run, 2);
        let three = fake_checkpoint(run, 3);
        // step-3's optimizer state was torn (a crash while a copy was written, a full disk).
        let opt = three.join("trainer_state/optimizer.safetensors");
        let full = std::fs::read(&opt).unwrap();
        std::fs::write(&opt, &full[..full.len() - 3]).unwrap();
        let why = incomplete(&three).unwrap();
        assert!(why.contains("optimizer.safetensors"), "{why}");
        set_latest(run, "step-3");
        let p = resume_point(run).unwrap().unwrap();
        assert_eq!(p.dir, two);
        let note = p.note.unwrap();
        assert!(
            note.contains(&three.display().to_string())
                && note.contains("incomplete")
                && note.contains(&two.display().to_string()),
            "{note}"
        );
        // `latest` lost: the newest complete one, not a fresh start.
        std::fs::remove_file(checkpoints_dir(run).join("latest")).unwrap();
        let p = resume_point(run).unwrap().unwrap();
        assert_eq!(p.dir, two);
        assert!(p.note.unwrap().contains("is missing"));
        // `latest` naming a complete checkpoint is taken as it is, without a note.
        set_latest(run, "step-1");
        let p = resume_point(run).unwrap().unwrap();
        assert_eq!((p.dir, p.note), (checkpoints_dir(run).join("step-1"), None));
        // Each missing or unparsable file makes a checkpoint incomplete.
        for (file, bad) in [
            ("trainer_state/state.json", Some("{\"step\": 2")),
            ("trainer_state/buffer.jsonl", None),
            ("config.json", Some("{")),
            ("tokenizer.json", None),
            ("model.safetensors", Some("\u{1}")),
        ] {
            let d = fake_checkpoint(run, 2);
            match bad {
                Some(text) => std::fs::write(d.join(file), text).unwrap(),
                None => std::fs::remove_file(d.join(file)).unwrap(),
            }
            let why = incomplete(&d).unwrap_or_else(|| panic!("{file}"));
            assert!(why.contains(file.rsplit('/').next().unwrap()), "{why}");
            set_latest(run, "step-2");
            assert_eq!(
                resume_point(run).unwrap().unwrap().dir,
                checkpoints_dir(run).join("step-1"),
                "{file}"
            );
        }
        // Nothing complete but what `latest` names is broken: an error, not a start over.
        std::fs::remove_dir_all(checkpoints_dir(run).join("step-1")).unwrap();
        let e = resume_point(run).unwrap_err().to_string();
        assert!(
            e.contains("no other checkpoint") && e.contains("step-2"),
            "{e}"
        );
    }

    #[test]
    fn latest_must_name_a_checkpoint_inside_the_checkpoints_folder() {
        let tmp = tempfile::tempdir().unwrap();
        let run = tmp.path().join("run");
        fake_checkpoint(&run, 1);
        let outside = fake_checkpoint(tmp.path(), 7);
        for name in ["../../checkpoints/step-7", "/etc", "step-1/.."] {
            set_latest(&run, name);
            let e = resume_point(&run).unwrap_err().to_string();
            assert!(
                e.contains(name) && e.contains("outside the run's checkpoints"),
                "{name}: {e}"
            );
        }
        #[cfg(unix)]
        {
            std::os::unix::fs::symlink(&outside, checkpoints_dir(&run).join("step-9")).unwrap();
            set_latest(&run, "step-9");
            let e = resume_point(&run).unwrap_err().to_string();
            assert!(
                e.contains("resolves to")
                    && e.contains(&outside.canonicalize().unwrap().display().to_string()),
                "{e}"
            );
            // Nor is such a link taken when `latest` is lost.
            std::fs::remove_file(checkpoints_dir(&run).join("latest")).unwrap();
            let p = resume_point(&run).unwrap().unwrap();
            assert_eq!(p.dir, checkpoints_dir(&run).join("step-1"));
        }
    }

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
