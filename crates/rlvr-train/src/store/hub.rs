//! Hugging Face Hub ids written as `model.path` (`HuggingFaceTB/SmolLM2-135M-Instruct`): rlvr
//! downloads nothing, but a model already in the local Hugging Face cache is used from there.
//!
//! The cache layout read is huggingface_hub's (its docs, "Manage huggingface_hub cache-system"):
//! `HUB/models--ORG--NAME/refs/main` holds a commit hash and `HUB/models--ORG--NAME/snapshots/HASH/`
//! the files, where HUB is `$HF_HUB_CACHE`, else `$HF_HOME/hub`, else
//! `$XDG_CACHE_HOME/huggingface/hub`, else `~/.cache/huggingface/hub`.

use std::path::{Path, PathBuf};

/// `(org, name)` when `s` looks like a Hub model id: exactly two non-empty parts split by one `/`,
/// each of ASCII letters, digits, `-`, `_` and `.`, neither starting with `.` (so `../m`, `./m`,
/// `/abs/m` and `a/b/c` are paths, not ids).
pub fn hub_id(s: &str) -> Option<(&str, &str)> {
    let (org, name) = s.split_once('/')?;
    let part = |p: &str| {
        !p.is_empty()
            && !p.starts_with('.')
            && p.len() <= 96
            && p.bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
    };
    (part(org) && part(name)).then_some((org, name))
}

/// The Hugging Face hub cache directory from the environment (see the module docs), or `None`
/// when neither a variable nor `HOME` is set.
pub fn cache_dir() -> Option<PathBuf> {
    let var = |k: &str| {
        std::env::var_os(k)
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
    };
    var("HF_HUB_CACHE")
        .or_else(|| var("HF_HOME").map(|h| h.join("hub")))
        .or_else(|| var("XDG_CACHE_HOME").map(|c| c.join("huggingface/hub")))
        .or_else(|| var("HOME").map(|h| h.join(".cache/huggingface/hub")))
}

/// The snapshot directory of model `org/name` that `refs/main` names in the hub cache `hub`,
/// when it holds a config.json; `None` otherwise (not cached, no `main` ref, an incomplete
/// snapshot). A ref that is not a plain commit hash is ignored.
pub fn cached_snapshot(hub: &Path, org: &str, name: &str) -> Option<PathBuf> {
    let repo = hub.join(format!("models--{org}--{name}"));
    let rev = std::fs::read_to_string(repo.join("refs/main")).ok()?;
    let rev = rev.trim();
    if rev.is_empty() || rev.len() > 64 || !rev.bytes().all(|b| b.is_ascii_alphanumeric()) {
        return None;
    }
    let snap = repo.join("snapshots").join(rev);
    snap.join("config.json").is_file().then_some(snap)
}

/// What a `model.path` written as `written` (before any joining) stands for when `resolved`
/// (the path it was resolved to) does not exist and `written` looks like a Hub id: the cached
/// snapshot, with a note on stderr saying so; `resolved` otherwise.
pub fn resolve_model_path(written: &str, resolved: PathBuf, hub: Option<&Path>) -> PathBuf {
    if resolved.exists() {
        return resolved;
    }
    let Some((org, name)) = hub_id(written) else {
        return resolved;
    };
    match hub.and_then(|h| cached_snapshot(h, org, name)) {
        Some(snap) => {
            eprintln!(
                "note: model path {written} is not a directory here; using the Hugging Face \
                 cache's snapshot of {org}/{name}: {}",
                snap.display()
            );
            snap
        }
        None => resolved,
    }
}

/// The advice for a model directory `path` that does not exist, in a directory that does not
/// exist either, and whose last two parts look like a Hub id (`CONFIG_DIR/ORG/NAME`): rlvr
/// downloads nothing, and how to get it. A path that climbs to `ORG` (`../models/NAME`, the
/// shipped configs' placeholder) was written as a local path, not an id: the advice says to
/// point it at a checkpoint directory instead. `None` for other paths.
pub fn missing_model_hint(path: &Path) -> Option<String> {
    // A missing directory in an existing one is a local path with a typo, not an id.
    if path.exists()
        || path
            .parent()
            .is_some_and(|p| !p.as_os_str().is_empty() && p.exists())
    {
        return None;
    }
    let parts: Vec<&str> = path.iter().filter_map(|p| p.to_str()).collect();
    let (id, climbs) = match parts.as_slice() {
        [.., up, org, name] => (format!("{org}/{name}"), *up == ".."),
        [org, name] => (format!("{org}/{name}"), false),
        _ => return None,
    };
    let (org, name) = hub_id(&id)?;
    if climbs {
        return Some(format!(
            "{} does not exist; set model.path (or --model) to your checkpoint directory, e.g. \
             one downloaded with `huggingface-cli download <org>/{name} --local-dir DIR` (rlvr \
             downloads nothing)",
            path.display()
        ));
    }
    Some(format!(
        "{} does not exist; if {org}/{name} is a Hugging Face Hub id: rlvr downloads nothing \
         (and found no snapshot of it in the local Hugging Face cache); download it with \
         `huggingface-cli download {org}/{name} --local-dir DIR` and set model.path = DIR \
         (or --model DIR)",
        path.display()
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_and_paths() {
        assert_eq!(
            hub_id("HuggingFaceTB/SmolLM2-135M-Instruct"),
            Some(("HuggingFaceTB", "SmolLM2-135M-Instruct"))
        );
        assert_eq!(hub_id("Qwen/Qwen2.5-0.5B"), Some(("Qwen", "Qwen2.5-0.5B")));
        for p in [
            "../m/x", "./m", "/abs/m", "a/b/c", "m", "a/", "/a", "a b/c", ".a/b",
        ] {
            assert_eq!(hub_id(p), None, "{p}");
        }
    }

    fn fake_cache(hub: &Path, rev: &str, with_config: bool) -> PathBuf {
        let repo = hub.join("models--Org--Tiny-1");
        let snap = repo.join("snapshots").join(rev);
        std::fs::create_dir_all(&snap).unwrap();
        std::fs::create_dir_all(repo.join("refs")).unwrap();
        std::fs::write(repo.join("refs/main"), format!("{rev}\n")).unwrap();
        if with_config {
            std::fs::write(snap.join("config.json"), "{}").unwrap();
        }
        snap
    }

    #[test]
    fn a_cached_model_is_found_by_refs_main() {
        let tmp = tempfile::tempdir().unwrap();
        let hub = tmp.path().join("hub");
        // An older snapshot beside the one refs/main names: the named one is used.
        std::fs::create_dir_all(hub.join("models--Org--Tiny-1/snapshots/0ld")).unwrap();
        let snap = fake_cache(&hub, "abc123", true);
        assert_eq!(cached_snapshot(&hub, "Org", "Tiny-1"), Some(snap.clone()));
        assert_eq!(cached_snapshot(&hub, "Org", "Other"), None);
        let missing = tmp.path().join("cfg/Org/Tiny-1");
        assert_eq!(
            resolve_model_path("Org/Tiny-1", missing.clone(), Some(&hub)),
            snap
        );
        // A path that is not an id, or no cache: unchanged.
        assert_eq!(
            resolve_model_path("./Org/Tiny-1", missing.clone(), Some(&hub)),
            missing
        );
        assert_eq!(
            resolve_model_path("Org/Tiny-1", missing.clone(), None),
            missing
        );
        // A local directory of that name wins over the cache.
        std::fs::create_dir_all(&missing).unwrap();
        assert_eq!(
            resolve_model_path("Org/Tiny-1", missing.clone(), Some(&hub)),
            missing
        );
    }

    #[test]
    fn an_incomplete_snapshot_or_a_bad_ref_is_not_used() {
        let tmp = tempfile::tempdir().unwrap();
        let hub = tmp.path().join("hub");
        fake_cache(&hub, "abc123", false);
        assert_eq!(cached_snapshot(&hub, "Org", "Tiny-1"), None);
        let tmp = tempfile::tempdir().unwrap();
        let hub = tmp.path().join("hub");
        fake_cache(&hub, "abc123", true);
        std::fs::write(hub.join("models--Org--Tiny-1/refs/main"), "../../x").unwrap();
        assert_eq!(cached_snapshot(&hub, "Org", "Tiny-1"), None);
    }

    #[test]
    fn the_hint_names_the_download_command() {
        let h = missing_model_hint(Path::new("/nowhere/here/HuggingFaceTB/SmolLM2-135M")).unwrap();
        assert!(
            h.contains("rlvr downloads nothing")
                && h.contains(
                    "huggingface-cli download HuggingFaceTB/SmolLM2-135M --local-dir DIR"
                ),
            "{h}"
        );
        assert_eq!(missing_model_hint(Path::new("/")), None);
        let tmp = tempfile::tempdir().unwrap();
        assert_eq!(missing_model_hint(&tmp.path().join("typo")), None);
        assert!(missing_model_hint(&tmp.path().join("Org/Name")).is_some());
        assert_eq!(missing_model_hint(Path::new("/nowhere/a b")), None);
        // The shipped configs' placeholder is a local path, not the id `models/NAME`.
        let h = missing_model_hint(Path::new(
            "/nowhere/configs/../models/Qwen2.5-0.5B-Instruct",
        ))
        .unwrap();
        assert!(
            h.contains("set model.path (or --model) to your checkpoint directory")
                && h.contains("huggingface-cli download <org>/Qwen2.5-0.5B-Instruct")
                && !h.contains("models/Qwen2.5-0.5B-Instruct is a Hugging Face Hub id"),
            "{h}"
        );
    }
}
