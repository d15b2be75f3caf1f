//! `RUN_DIR/run.json`: where a run comes from (git commit, seed, host, start time, rlvr version,
//! the resume times) and which rollout backend sampled it. Written atomically.

use std::path::Path;

use serde_json::json;

/// The current UTC time as `YYYY-MM-DDTHH:MM:SSZ`.
pub(crate) use rlvr_rundir::stamp::now_rfc3339;

/// The commit this binary was built from (build.rs embeds `git rev-parse HEAD`), `None` when the
/// build had no git repository.
pub(crate) fn git_commit() -> Option<String> {
    Some(env!("RLVR_GIT_COMMIT"))
        .filter(|c| !c.is_empty())
        .map(str::to_string)
}

/// This machine's host name.
pub(crate) use rlvr_rundir::stamp::host;

fn read(path: &Path) -> Option<serde_json::Value> {
    std::fs::read_to_string(path)
        .ok()
        .and_then(|t| serde_json::from_str::<serde_json::Value>(&t).ok())
}

/// Writes RUN_DIR/run.json (git commit, seed, host, start time, rlvr version); on resume, adds the
/// resume time to `resumed_at`.
///
/// # Errors
/// I/O errors naming the file.
pub(crate) fn write_run_json(run_dir: &Path, seed: u64, resume: bool) -> anyhow::Result<()> {
    let path = run_dir.join("run.json");
    let mut v = if resume {
        read(&path).unwrap_or_else(|| json!({}))
    } else {
        json!({})
    };
    if !resume || v.get("start_time").is_none() {
        v = json!({
            "git_commit": git_commit(),
            "seed": seed,
            "host": host(),
            "start_time": now_rfc3339(),
            "version": env!("CARGO_PKG_VERSION"),
            "resumed_at": [],
        });
    } else if let Some(a) = v.get_mut("resumed_at").and_then(|a| a.as_array_mut()) {
        a.push(json!(now_rfc3339()));
    }
    rlvr_model::weights::atomic_write(&path, serde_json::to_string_pretty(&v)?.as_bytes())?;
    Ok(())
}

/// Sets `key` of RUN_DIR/run.json to `value`, keeping the other keys (e.g. `rollout_backend`).
///
/// # Errors
/// I/O errors naming the file.
pub(crate) fn record(run_dir: &Path, key: &str, value: serde_json::Value) -> anyhow::Result<()> {
    let path = run_dir.join("run.json");
    let mut v = read(&path).unwrap_or_else(|| json!({}));
    v[key] = value;
    rlvr_model::weights::atomic_write(&path, serde_json::to_string_pretty(&v)?.as_bytes())?;
    Ok(())
}

/// Appends `changes` (a `--resume`'s `--set`s that change what the run means, each an object
/// `{"key", "was", "now", "set"}`) to RUN_DIR/run.json's `resume_changes`, each with `"at"` (this
/// resume's time) added. Nothing is written for none.
///
/// # Errors
/// I/O errors naming the file.
pub(crate) fn add_resume_changes(
    run_dir: &Path,
    changes: Vec<serde_json::Value>,
) -> anyhow::Result<()> {
    if changes.is_empty() {
        return Ok(());
    }
    let path = run_dir.join("run.json");
    let mut v = read(&path).unwrap_or_else(|| json!({}));
    let at = now_rfc3339();
    let mut list = v
        .get("resume_changes")
        .and_then(|a| a.as_array())
        .cloned()
        .unwrap_or_default();
    for mut c in changes {
        c["at"] = json!(at);
        list.push(c);
    }
    v["resume_changes"] = serde_json::Value::Array(list);
    rlvr_model::weights::atomic_write(&path, serde_json::to_string_pretty(&v)?.as_bytes())?;
    Ok(())
}

/// The run's model as RUN_DIR/run.json records it (`"model": {"path", "files"}`, written by
/// [`record_model`]): its path and its identity ([`crate::store::model_identity::identity`]).
/// `None` for a run started before it was recorded, or a run.json that does not parse.
pub(crate) fn recorded_model(run_dir: &Path) -> Option<(std::path::PathBuf, serde_json::Value)> {
    let v = read(&run_dir.join("run.json"))?;
    let m = v.get("model")?;
    let path = m.get("path")?.as_str()?;
    m.get("files")?;
    Some((path.into(), m.clone()))
}

/// Records model directory `model`'s path and identity as RUN_DIR/run.json's `"model"` (at the
/// start of a run; on a resume when none is recorded yet or the model moved), keeping the other
/// keys. Returns whether it did: a directory that cannot be read is left unrecorded.
///
/// # Errors
/// I/O errors writing run.json.
pub(crate) fn record_model(run_dir: &Path, model: &Path) -> anyhow::Result<bool> {
    let Ok(mut id) = crate::store::model_identity::identity(model) else {
        return Ok(false);
    };
    id["path"] = json!(model.display().to_string());
    record(run_dir, "model", id)?;
    Ok(true)
}

/// The run's KL reference as RUN_DIR/run.json records it (`"reference"`, written by
/// [`record_reference`]): `None` when run.json has no such key (a run started before it was
/// recorded, or whose `model.reference` could not be read), `Some(None)` when the run had no
/// `model.reference` (its reference is `model.path`'s model, which `"model"` identifies), else
/// `Some(Some((path, identity)))`.
#[allow(clippy::type_complexity)]
pub(crate) fn recorded_reference(
    run_dir: &Path,
) -> Option<Option<(std::path::PathBuf, serde_json::Value)>> {
    let v = read(&run_dir.join("run.json"))?;
    let r = v.get("reference")?;
    if r.is_null() {
        return Some(None);
    }
    let path = r.get("path")?.as_str()?;
    r.get("files")?;
    Some(Some((path.into(), r.clone())))
}

/// Records the run's `model.reference` as RUN_DIR/run.json's `"reference"`: its path and identity
/// ([`crate::store::model_identity::identity`], as `"model"` records `model.path`), or `null`
/// for none (the reference is `model.path`'s model), keeping the other keys. Returns whether it
/// did: a directory that cannot be read is left unrecorded (and an earlier record removed, so
/// that no stale identity is checked against).
///
/// # Errors
/// I/O errors writing run.json.
pub(crate) fn record_reference(run_dir: &Path, reference: Option<&Path>) -> anyhow::Result<bool> {
    let Some(dir) = reference else {
        record(run_dir, "reference", serde_json::Value::Null)?;
        return Ok(true);
    };
    let Ok(mut id) = crate::store::model_identity::identity(dir) else {
        let path = run_dir.join("run.json");
        if let Some(mut v) = read(&path) {
            if v.as_object_mut()
                .and_then(|o| o.remove("reference"))
                .is_some()
            {
                rlvr_model::weights::atomic_write(
                    &path,
                    serde_json::to_string_pretty(&v)?.as_bytes(),
                )?;
            }
        }
        return Ok(false);
    };
    id["path"] = json!(dir.display().to_string());
    record(run_dir, "reference", id)?;
    Ok(true)
}
