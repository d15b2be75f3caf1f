//! The identity of a model directory, recorded in `RUN_DIR/run.json` when a run starts and
//! compared on `--resume`: a checkpoint holds the policy's weights, but the reference policy of
//! the KL term, a LoRA run's base weights and the explorer's starting point come from
//! `model.path`, so a resume whose `model.path` names another model would train another problem
//! than the run's first steps did. A moved or copied directory is the same model: the identity
//! leaves the path out.
//!
//! The identity is, for each top-level file of the directory that defines the model
//! ([`defines_model`]: `config.json`, `generation_config.json`, the tokenizer and chat-template
//! files, the `*.safetensors` weights and their index), its size and a CRC-32C: of the whole file,
//! except for a weights file larger than [`SAMPLES`] × [`SAMPLE_BYTES`] past its header, whose
//! CRC-32C covers the safetensors header (tensor names, dtypes, shapes, offsets) and [`SAMPLES`]
//! pieces of [`SAMPLE_BYTES`] spread evenly over the tensor data. A fine-tuned checkpoint of the
//! same architecture changes every piece; reading 1 MiB per file keeps the check within
//! milliseconds for a 70B model. What it cannot see: a change confined to bytes between the
//! pieces (one edited tensor).

use std::io::{Read, Seek, SeekFrom};
use std::path::Path;

use anyhow::Context;
use serde_json::{json, Map, Value};

/// Pieces of a large weights file that its identity reads.
pub const SAMPLES: u64 = 16;
/// Bytes of each piece (64 KiB).
pub const SAMPLE_BYTES: u64 = 64 << 10;

/// Whether a top-level file named `name` of a model directory is part of the model's identity:
/// the config, the generation config, tokenizer and chat-template files, weights and their index
/// (not a checkpoint's `manifest.json`, a README or anything in a subdirectory).
pub fn defines_model(name: &str) -> bool {
    matches!(
        name,
        "config.json"
            | "generation_config.json"
            | "special_tokens_map.json"
            | "added_tokens.json"
            | "vocab.json"
            | "merges.txt"
            | "adapter_config.json"
    ) || name.starts_with("tokenizer")
        || name.starts_with("chat_template")
        || name.ends_with(".safetensors")
        || name.ends_with(".safetensors.index.json")
}

/// The identity of model directory `dir`: `{"files": {NAME: {"bytes": n, "crc32c": "hex"}}}`
/// for each file [`defines_model`] takes, in name order; a large weights file has
/// `"sampled_crc32c"` in place of `"crc32c"` (module doc).
///
/// # Errors
/// `dir` cannot be listed, or one of its files read (named).
pub fn identity(dir: &Path) -> anyhow::Result<Value> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .with_context(|| format!("listing {}", dir.display()))?
        .filter_map(Result::ok)
        // Followed links count (a Hugging Face cache snapshot links each file to its blob).
        .filter(|e| e.path().is_file())
        .filter_map(|e| e.file_name().to_str().map(str::to_string))
        .filter(|n| defines_model(n))
        .collect();
    names.sort();
    let mut files = Map::new();
    for n in names {
        let p = dir.join(&n);
        let entry = if n.ends_with(".safetensors") {
            weights_entry(&p)?
        } else {
            crate::store::manifest::entry(&p)?
        };
        files.insert(n, entry);
    }
    Ok(json!({ "files": files }))
}

/// A weights file's entry: its size and the CRC-32C of the whole file when its tensor data is at
/// most [`SAMPLES`] × [`SAMPLE_BYTES`], else of the header and the sampled pieces.
fn weights_entry(p: &Path) -> anyhow::Result<Value> {
    let mut f = std::fs::File::open(p).with_context(|| format!("opening {}", p.display()))?;
    let len = f
        .metadata()
        .with_context(|| format!("reading {}", p.display()))?
        .len();
    // safetensors: an 8-byte little-endian header length, the JSON header, then the data.
    let mut head = [0u8; 8];
    let header_end = match f.read_exact(&mut head) {
        Ok(()) => 8u64.saturating_add(u64::from_le_bytes(head)).min(len),
        Err(_) => len,
    };
    let data = len - header_end;
    if data <= SAMPLES * SAMPLE_BYTES {
        return crate::store::manifest::entry(p);
    }
    let read_at = |f: &mut std::fs::File, at: u64, n: u64, crc: u32| -> anyhow::Result<u32> {
        let mut buf = vec![0u8; n as usize];
        f.seek(SeekFrom::Start(at))
            .and_then(|_| f.read_exact(&mut buf))
            .with_context(|| format!("reading {}", p.display()))?;
        Ok(crc32c::crc32c_append(crc, &buf))
    };
    let mut crc = read_at(&mut f, 0, header_end, 0)?;
    let step = (data - SAMPLE_BYTES) / (SAMPLES - 1);
    for i in 0..SAMPLES {
        crc = read_at(&mut f, header_end + i * step, SAMPLE_BYTES, crc)?;
    }
    Ok(json!({"bytes": len, "sampled_crc32c": format!("{crc:08x}")}))
}

/// How identity `now` differs from `was` (both as [`identity`] returns them), one phrase per
/// file: `config.json differs (N bytes, crc32c X, was M bytes, crc32c Y)`, `F is missing`,
/// `F is new`; empty when they are the same model.
pub fn differences(was: &Value, now: &Value) -> Vec<String> {
    let empty = Map::new();
    let files = |v: &Value| v.get("files").and_then(Value::as_object).cloned();
    let (w, n) = (
        files(was).unwrap_or_else(|| empty.clone()),
        files(now).unwrap_or(empty),
    );
    let show = |v: &Value| {
        let (kind, crc) = match (v.get("crc32c"), v.get("sampled_crc32c")) {
            (Some(c), _) => ("crc32c", c),
            (None, Some(c)) => ("sampled crc32c", c),
            (None, None) => ("crc32c", &Value::Null),
        };
        format!(
            "{} bytes, {kind} {}",
            v.get("bytes").unwrap_or(&Value::Null),
            crc.as_str().unwrap_or("?")
        )
    };
    let mut out = Vec::new();
    for (name, wv) in &w {
        match n.get(name) {
            Some(nv) if nv == wv => {}
            Some(nv) => out.push(format!("{name} differs ({}, was {})", show(nv), show(wv))),
            None => out.push(format!("{name} is missing")),
        }
    }
    for name in n.keys().filter(|k| !w.contains_key(*k)) {
        out.push(format!("{name} is new"));
    }
    out
}

/// What a `--resume` whose `model.path` is `now` does about the model recorded in `run_dir`'s
/// run.json (`recorded`: its path and identity, `None` for a run started before they were
/// recorded). `from_config` is `model.path` in the run's config.toml and `origin` where the
/// value `now` comes from (`--set model.path=...` or that file). Returns a warning for train.log,
/// if any: the model moved (same identity, another path), or the change cannot be checked.
///
/// # Errors
/// `now` names another model than the recorded one (or the same path now holds another), naming
/// both paths, what differs and what to do; `now` is another path than the recorded one and is
/// no readable model directory.
pub fn check_on_resume(
    run_dir: &Path,
    recorded: Option<(&Path, &Value)>,
    (from_config, now, origin): (&Path, &Path, &str),
) -> anyhow::Result<Option<String>> {
    let run_json = run_dir.join("run.json");
    let Some((was_path, was)) = recorded else {
        if from_config == now {
            return Ok(None);
        }
        return Ok(Some(format!(
            "--resume changes model.path from {} to {} ({origin}), and {} records no identity \
             of the run's model (the run started before rlvr recorded one), so whether they are \
             the same model is not checked: if they are not, the reference policy (KL) and a \
             LoRA run's base are another model's from here on. This resume records the identity \
             of {} for later ones",
            from_config.display(),
            now.display(),
            run_json.display(),
            now.display()
        )));
    };
    let moved = was_path != now;
    if !now.is_dir() {
        if !moved {
            return Ok(Some(format!(
                "model.path {} is not a directory here, so it cannot be checked against the \
                 model {} records; the resume fails if it needs the model (the reference policy \
                 of the KL term, a LoRA run's base)",
                now.display(),
                run_json.display()
            )));
        }
        anyhow::bail!(
            "--resume changes model.path from {} (the run's model, recorded in {}) to {} \
             ({origin}), which is not a model directory; resume with model.path = {} or a copy \
             of it",
            was_path.display(),
            run_json.display(),
            now.display(),
            was_path.display()
        );
    }
    let diff = differences(was, &identity(now)?);
    if diff.is_empty() {
        return Ok(moved.then(|| {
            format!(
                "model.path is {} ({origin}), the run's model was at {} ({}): the same model \
                 (its config, tokenizer and weights files match), so the run goes on from there",
                now.display(),
                was_path.display(),
                run_json.display()
            )
        }));
    }
    let lead = if moved {
        format!(
            "--resume changes model.path from {} (the run's model, recorded in {}) to {} \
             ({origin}), another model",
            was_path.display(),
            run_json.display(),
            now.display()
        )
    } else {
        format!(
            "model.path {} ({origin}) no longer holds the model the run started from ({} \
             records it)",
            now.display(),
            run_json.display()
        )
    };
    anyhow::bail!(
        "{lead}: {}. The checkpoint holds the policy's weights, but the reference policy (KL), a \
         LoRA run's base and the model's config and tokenizer come from model.path, so the steps \
         after the checkpoint would train another problem. Resume with model.path = {} as it \
         was (a moved or copied directory is accepted when its files are the same), or start a \
         new run from a checkpoint's weights (--set model.path=RUN_DIR/checkpoints/step-N)",
        diff.join("; "),
        was_path.display()
    )
}

/// The reference recorded in run.json as [`check_reference_on_resume`] takes it: `None` for a
/// run.json without `"reference"`, `Some(None)` for a run without `model.reference`, else its
/// path and identity.
pub type RecordedReference<'a> = Option<Option<(&'a Path, &'a Value)>>;

/// What a `--resume` whose `model.reference` is `now` (`None`: unset, so the KL reference is
/// `model.path`'s model, which [`check_on_resume`] checks) does about the reference recorded in
/// `run_dir`'s run.json (`recorded`), where `now`'s value comes from `origin` (the run's
/// config.toml, edited, or a `--set` that left the value as it was: a `--set` that changes it
/// is a recorded resume change, warned about and not checked here). A reference that is the
/// same model (the same files; moved or copied) goes on; anything else is refused, as
/// `model.path`'s change is, because it would change every later step's KL term without a
/// trace in run.json's `resume_changes`. Returns a warning for train.log, if any (moved; or
/// unchanged path that is not a directory here, as for `model.path`).
///
/// # Errors
/// Another reference than the run's: a reference added, removed, or another model (at the same
/// path or another), naming both, what differs and what to do.
pub fn check_reference_on_resume(
    run_dir: &Path,
    recorded: RecordedReference<'_>,
    now: Option<&Path>,
    origin: &str,
) -> anyhow::Result<Option<String>> {
    let run_json = run_dir.join("run.json");
    let on_purpose = "or change the reference on purpose with --set model.reference=PATH (warned \
                      about, and recorded in run.json's `resume_changes`)";
    let (was_path, was) = match (recorded, now) {
        // A run started before the reference was recorded: nothing to check against.
        (None, _) | (Some(None), None) => return Ok(None),
        (Some(None), Some(p)) => anyhow::bail!(
            "model.reference is {} ({origin}), but the run started without one ({} records \
             none: its KL reference was model.path's model): the steps after the checkpoint \
             would take their KL term against another model. Resume without model.reference, \
             {on_purpose}",
            p.display(),
            run_json.display()
        ),
        (Some(Some((w, _))), None) => anyhow::bail!(
            "model.reference is not set ({origin}), but the run's KL reference was {} ({} \
             records it): the steps after the checkpoint would take their KL term against \
             model.path's model instead. Resume with model.reference = {:?}, {on_purpose}",
            w.display(),
            run_json.display(),
            w.display().to_string()
        ),
        (Some(Some(r)), Some(_)) => r,
    };
    let now = now.unwrap_or(was_path);
    let moved = was_path != now;
    if !now.is_dir() {
        if !moved {
            return Ok(Some(format!(
                "model.reference {} is not a directory here, so it cannot be checked against \
                 the reference {} records; the resume fails if it needs it (algorithm.kl_coef \
                 ≠ 0)",
                now.display(),
                run_json.display()
            )));
        }
        anyhow::bail!(
            "model.reference changes from {} (the run's reference, recorded in {}) to {} \
             ({origin}), which is not a model directory; resume with model.reference = {:?} or a \
             copy of it, {on_purpose}",
            was_path.display(),
            run_json.display(),
            now.display(),
            was_path.display().to_string()
        );
    }
    let diff = differences(was, &identity(now)?);
    if diff.is_empty() {
        return Ok(moved.then(|| {
            format!(
                "model.reference is {} ({origin}), the run's reference was at {} ({}): the same \
                 model (its config, tokenizer and weights files match), so the run goes on with \
                 it",
                now.display(),
                was_path.display(),
                run_json.display()
            )
        }));
    }
    let lead = if moved {
        format!(
            "model.reference changes from {} (the run's reference, recorded in {}) to {} \
             ({origin}), another model",
            was_path.display(),
            run_json.display(),
            now.display()
        )
    } else {
        format!(
            "model.reference {} ({origin}) no longer holds the model the run's KL reference was \
             ({} records it)",
            now.display(),
            run_json.display()
        )
    };
    anyhow::bail!(
        "{lead}: {}. The KL term of every step after the checkpoint would be taken against \
         another model than the steps before it. Resume with model.reference = {:?} as it was (a \
         moved or copied directory is accepted when its files are the same), {on_purpose}",
        diff.join("; "),
        was_path.display().to_string()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The header of the test weights files (its values are not read).
    const HEADER: &[u8] = br#"{"w":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}}"#;

    fn safetensors(dir: &Path, name: &str, fill: impl Fn(usize) -> u8, n: usize) {
        let mut bytes = (HEADER.len() as u64).to_le_bytes().to_vec();
        bytes.extend_from_slice(HEADER);
        bytes.extend((0..n).map(fill));
        std::fs::write(dir.join(name), bytes).unwrap();
    }

    /// A large weights file's identity reads its pieces: a change inside one is seen, one between
    /// them is not (the documented limit); a small file's is its whole CRC-32C. Files that do not
    /// define the model are left out, and differences name each file.
    #[test]
    fn the_identity_sees_the_sampled_pieces_and_names_what_differs() {
        let tmp = tempfile::tempdir().unwrap();
        let (a, b) = (tmp.path().join("a"), tmp.path().join("b"));
        std::fs::create_dir_all(&a).unwrap();
        std::fs::create_dir_all(&b).unwrap();
        let n = 4 << 20;
        for d in [&a, &b] {
            safetensors(d, "model.safetensors", |i| (i % 251) as u8, n);
            std::fs::write(d.join("config.json"), "{}").unwrap();
            std::fs::write(d.join("README.md"), d.display().to_string()).unwrap();
        }
        let id = identity(&a).unwrap();
        let keys: Vec<&String> = id["files"].as_object().unwrap().keys().collect();
        assert_eq!(keys, ["config.json", "model.safetensors"]);
        assert!(id["files"]["model.safetensors"]["sampled_crc32c"].is_string());
        assert!(differences(&id, &identity(&b).unwrap()).is_empty());
        // A directory of links to the files (a Hugging Face cache snapshot) is the same model.
        let links = tmp.path().join("links");
        std::fs::create_dir_all(&links).unwrap();
        for n in ["config.json", "model.safetensors"] {
            std::os::unix::fs::symlink(a.join(n), links.join(n)).unwrap();
        }
        assert!(differences(&id, &identity(&links).unwrap()).is_empty());
        // The first byte of the data is in the first piece.
        let hdr = 8 + HEADER.len();
        let mut bytes = std::fs::read(b.join("model.safetensors")).unwrap();
        bytes[hdr] ^= 1;
        std::fs::write(b.join("model.safetensors"), &bytes).unwrap();
        let d = differences(&id, &identity(&b).unwrap());
        assert_eq!(d.len(), 1, "{d:?}");
        let size = format!(
            "model.safetensors differs ({} bytes, sampled crc32c ",
            hdr + n
        );
        assert!(d[0].starts_with(&size), "{d:?}");
        // Undo, then change a byte just past the first piece: not read.
        bytes[hdr] ^= 1;
        bytes[hdr + SAMPLE_BYTES as usize] ^= 1;
        std::fs::write(b.join("model.safetensors"), &bytes).unwrap();
        assert!(differences(&id, &identity(&b).unwrap()).is_empty());
        std::fs::write(b.join("config.json"), "{\"x\": 1}").unwrap();
        std::fs::write(b.join("tokenizer.json"), "{}").unwrap();
        let d = differences(&id, &identity(&b).unwrap());
        assert_eq!(
            d,
            [
                format!(
                    "config.json differs (8 bytes, crc32c {}, was 2 bytes, crc32c {})",
                    id_crc(&b.join("config.json")),
                    id_crc(&a.join("config.json"))
                ),
                "tokenizer.json is new".to_string()
            ]
        );
        // A small weights file: its whole CRC-32C.
        safetensors(&a, "small.safetensors", |i| i as u8, 100);
        let small = &identity(&a).unwrap()["files"]["small.safetensors"];
        assert_eq!(
            small["crc32c"].as_str().unwrap(),
            id_crc(&a.join("small.safetensors"))
        );
    }

    fn id_crc(p: &Path) -> String {
        format!("{:08x}", crate::store::manifest::digest(p).unwrap().1)
    }
}
