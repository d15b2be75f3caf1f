//! A checkpoint's `manifest.json` (issue 34): the size and CRC-32C of every file of the
//! checkpoint directory, and the identity of the inputs it was trained from (the dataset files
//! and, with LoRA, the base model's config.json and weights), so a file that was truncated,
//! corrupted or replaced after the save is named instead of being loaded.
//!
//! Written last, into the staging directory, before the rename that makes the checkpoint visible
//! ([`crate::store::checkpoint::save`]); checked by [`verify`] whenever a checkpoint is judged
//! complete (resume), by `rlvr eval --model`, and before any other command loads a model directory
//! ([`check_model_dir`], [`load_policy`], [`load_model`]: `rlvr train`'s `model.path` and
//! `model.reference`, `rlvr sft`, `rlvr generate`, `rlvr logprobs`, `rlvr merge`). Checkpoints
//! written before manifests existed, and HuggingFace directories, have none and still load
//! ([`verify`] says so). CRC-32C is the crate `crc32c` (hardware instruction
//! where present, several GB/s), the checksum TFRecord framing already uses.

use std::io::Read;
use std::path::{Path, PathBuf};

use anyhow::Context;
use serde_json::{json, Map, Value};

/// The manifest's file name inside a checkpoint directory.
pub const MANIFEST: &str = "manifest.json";

/// Size in bytes and CRC-32C of the file `p`, read in 8 MiB pieces.
///
/// # Errors
/// I/O errors, naming the file.
pub fn digest(p: &Path) -> anyhow::Result<(u64, u32)> {
    let mut f = std::fs::File::open(p).with_context(|| format!("opening {}", p.display()))?;
    let mut buf = vec![0u8; 8 << 20];
    let (mut n, mut crc) = (0u64, 0u32);
    loop {
        let k = f
            .read(&mut buf)
            .with_context(|| format!("reading {}", p.display()))?;
        if k == 0 {
            return Ok((n, crc));
        }
        crc = crc32c::crc32c_append(crc, &buf[..k]);
        n += k as u64;
    }
}

/// `{"bytes": n, "crc32c": "8 hex digits"}` of the file `p`.
///
/// # Errors
/// As [`digest`].
pub fn entry(p: &Path) -> anyhow::Result<Value> {
    let (n, crc) = digest(p)?;
    Ok(json!({"bytes": n, "crc32c": format!("{crc:08x}")}))
}

/// Every regular file under `dir`, as paths relative to it with `/`, sorted; the manifest itself
/// excluded.
fn files(dir: &Path) -> anyhow::Result<Vec<String>> {
    let mut out = Vec::new();
    let mut stack = vec![PathBuf::new()];
    while let Some(rel) = stack.pop() {
        let abs = dir.join(&rel);
        for e in std::fs::read_dir(&abs).with_context(|| format!("listing {}", abs.display()))? {
            let e = e.with_context(|| format!("listing {}", abs.display()))?;
            let r = rel.join(e.file_name());
            let t = e.file_type()?;
            if t.is_dir() {
                stack.push(r);
            } else if t.is_file() && r != Path::new(MANIFEST) {
                out.push(r.to_string_lossy().replace('\\', "/"));
            }
        }
    }
    out.sort();
    Ok(out)
}

/// Writes `dir/manifest.json`: every file of `dir` with its size and CRC-32C, and `inputs` (the
/// identity of what the checkpoint was trained from, see [`inputs`]), atomically.
///
/// # Errors
/// I/O errors, naming the file.
pub fn write(dir: &Path, inputs: Value) -> anyhow::Result<()> {
    let mut map = Map::new();
    for rel in files(dir)? {
        map.insert(rel.clone(), entry(&dir.join(&rel))?);
    }
    let m = json!({"format": 1, "checksum": "crc32c", "files": map, "inputs": inputs});
    rlvr_model::weights::atomic_write(
        &dir.join(MANIFEST),
        (serde_json::to_string_pretty(&m)? + "\n").as_bytes(),
    )?;
    Ok(())
}

/// The identity of a run's inputs for the manifest: each of `data` (a config key and its file,
/// e.g. `("data.train", path)`) as `{path, bytes, crc32c}`, and with LoRA (`base` = `model.path`)
/// the base model's config.json and `*.safetensors` files the same way. A file that cannot be read
/// is recorded with its error.
pub fn inputs(data: &[(&str, &Path)], base: Option<&Path>) -> Value {
    let one = |p: &Path| -> Value {
        match entry(p) {
            Ok(mut e) => {
                e["path"] = json!(p.display().to_string());
                e
            }
            Err(err) => json!({"path": p.display().to_string(), "error": format!("{err:#}")}),
        }
    };
    let mut out = Map::new();
    for (key, p) in data {
        out.insert((*key).to_string(), one(p));
    }
    if let Some(b) = base {
        let mut names: Vec<PathBuf> = std::fs::read_dir(b)
            .map(|rd| {
                rd.filter_map(|e| e.ok().map(|e| e.path()))
                    .filter(|p| {
                        p.file_name()
                            .and_then(|n| n.to_str())
                            .is_some_and(|n| n == "config.json" || n.ends_with(".safetensors"))
                    })
                    .collect()
            })
            .unwrap_or_default();
        names.sort();
        let files: Map<String, Value> = names
            .iter()
            .map(|p| {
                let n = p.file_name().unwrap_or_default().to_string_lossy();
                (n.into_owned(), one(p))
            })
            .collect();
        out.insert(
            "base_model".into(),
            json!({"path": b.display().to_string(), "files": files}),
        );
    }
    Value::Object(out)
}

/// Checks checkpoint `dir` against its manifest: every listed file present with its size and
/// CRC-32C, and no weight or state file (`*.safetensors`, `*.json`, `*.jsonl`) that the manifest
/// does not list. `Ok(false)`: no manifest (a checkpoint written before manifests; it loads
/// unchecked).
///
/// # Errors
/// The first file that is missing, has another size or checksum, or is not listed, naming it and
/// both values; a manifest that does not parse.
pub fn verify(dir: &Path) -> anyhow::Result<bool> {
    let mp = dir.join(MANIFEST);
    let text = match std::fs::read_to_string(&mp) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(false),
        Err(e) => anyhow::bail!("reading {}: {e}", mp.display()),
    };
    let m: Value =
        serde_json::from_str(&text).with_context(|| format!("parsing {}", mp.display()))?;
    let listed = m
        .get("files")
        .and_then(Value::as_object)
        .with_context(|| format!("{} has no \"files\" table", mp.display()))?;
    for (rel, want) in listed {
        let p = dir.join(rel);
        anyhow::ensure!(
            p.is_file(),
            "{} is missing (listed in {})",
            p.display(),
            mp.display()
        );
        let (n, crc) = digest(&p)?;
        let (wn, wc) = (
            want.get("bytes").and_then(Value::as_u64),
            want.get("crc32c").and_then(Value::as_str),
        );
        anyhow::ensure!(
            wn == Some(n),
            "{} has {n} bytes, its manifest says {} ({}): the file changed after the checkpoint \
             was written",
            p.display(),
            wn.map_or("?".into(), |w| w.to_string()),
            mp.display()
        );
        let got = format!("{crc:08x}");
        anyhow::ensure!(
            wc == Some(got.as_str()),
            "{} has CRC-32C {got}, its manifest says {} ({}): the file is corrupt or was replaced \
             after the checkpoint was written",
            p.display(),
            wc.unwrap_or("?"),
            mp.display()
        );
    }
    for rel in files(dir)? {
        let weighty = [".safetensors", ".json", ".jsonl"]
            .iter()
            .any(|e| rel.ends_with(e));
        anyhow::ensure!(
            !weighty || listed.contains_key(&rel),
            "{} is not in the checkpoint's manifest ({}): it was added after the checkpoint was \
             written; remove it",
            dir.join(&rel).display(),
            mp.display()
        );
    }
    Ok(true)
}

/// Checks model directory `dir` against its manifest before its weights are used: a directory
/// without `manifest.json` (a HuggingFace download, a checkpoint written before manifests) passes
/// unchecked; an rlvr checkpoint must match it file for file ([`verify`]). `what` names the use in
/// the error (`"load"`, `"merge"`).
///
/// # Errors
/// [`verify`]'s error (the file, its expected and actual size or CRC-32C), under
/// `refusing to {what} DIR: it differs from its checkpoint manifest`.
pub fn check_model_dir(dir: &Path, what: &str) -> anyhow::Result<()> {
    verify(dir).map(|_| ()).with_context(|| {
        format!(
            "refusing to {what} {}: it differs from its checkpoint manifest",
            dir.display()
        )
    })
}

/// Loads the policy (model and tokenizer) of directory `dir` after [`check_model_dir`]: the one
/// way commands load a model directory, so none loads a corrupt checkpoint unchecked.
///
/// # Errors
/// A missing `ORG/NAME` directory ([`crate::store::hub::missing_model_hint`]: rlvr downloads
/// nothing, and how to download it); a manifest mismatch (naming the file and both checksums),
/// then load errors naming `dir`.
pub fn load_policy(
    dir: &Path,
    dtype: candle_core::DType,
    device: &candle_core::Device,
) -> anyhow::Result<rlvr_model::checkpoint::Policy> {
    if let Some(hint) = crate::store::hub::missing_model_hint(dir) {
        anyhow::bail!("model {hint}");
    }
    check_model_dir(dir, "load")?;
    rlvr_model::checkpoint::Policy::load(dir, dtype, device)
        .with_context(|| format!("loading {}", dir.display()))
}

/// Loads the model (no tokenizer) of directory `dir` after [`check_model_dir`] (a reference model,
/// a benchmark's model).
///
/// # Errors
/// A manifest mismatch (naming the file and both checksums), then load errors naming `dir`.
pub fn load_model(
    dir: &Path,
    dtype: candle_core::DType,
    device: &candle_core::Device,
) -> anyhow::Result<rlvr_model::Model> {
    if let Some(hint) = crate::store::hub::missing_model_hint(dir) {
        anyhow::bail!("model {hint}");
    }
    check_model_dir(dir, "load")?;
    rlvr_model::Model::load(dir, dtype, device)
        .with_context(|| format!("loading {}", dir.display()))
}

/// The inputs recorded in checkpoint `dir`'s manifest that differ from `now` (the same shape,
/// [`inputs`] of today's run), as lines `key: path (bytes, crc) was …, is now …`; empty when the
/// manifest is missing or records no inputs.
pub fn changed_inputs(dir: &Path, now: &Value) -> Vec<String> {
    let Some(m) = std::fs::read_to_string(dir.join(MANIFEST))
        .ok()
        .and_then(|t| serde_json::from_str::<Value>(&t).ok())
    else {
        return Vec::new();
    };
    let Some(old) = m.get("inputs").and_then(Value::as_object) else {
        return Vec::new();
    };
    let id = |v: &Value| (v.get("bytes").cloned(), v.get("crc32c").cloned());
    let show = |v: &Value| {
        format!(
            "{} bytes, crc32c {}",
            v.get("bytes").unwrap_or(&Value::Null),
            v.get("crc32c").and_then(Value::as_str).unwrap_or("?")
        )
    };
    let mut out = Vec::new();
    for (key, o) in old {
        let Some(n) = now.get(key) else { continue };
        if key == "base_model" {
            let (of, nf) = (&o["files"], &n["files"]);
            if let (Some(of), Some(nf)) = (of.as_object(), nf.as_object()) {
                for (name, ov) in of {
                    match nf.get(name) {
                        Some(nv) if id(nv) == id(ov) => {}
                        Some(nv) => out.push(format!(
                            "the LoRA base model's {name} ({}) was {}, is now {}",
                            n["path"].as_str().unwrap_or("?"),
                            show(ov),
                            show(nv)
                        )),
                        None => out.push(format!(
                            "the LoRA base model's {name} ({}) is gone",
                            n["path"].as_str().unwrap_or("?")
                        )),
                    }
                }
            }
        } else if id(o) != id(n) {
            out.push(format!(
                "{key} {} was {}, is now {}",
                n["path"].as_str().unwrap_or("?"),
                show(o),
                show(n)
            ));
        }
    }
    out
}
