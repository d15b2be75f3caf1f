//! Every rank of a data-parallel run trains one config on one input (issue 49 item 6a): ranks
//! launched with different `--set` values, data files or seeds would otherwise diverge silently,
//! each computing gradients of another problem. At start-up, before the run directory is touched,
//! rank 0 sends its fingerprint (the resolved config and its inputs); a rank whose own differs
//! names the first key that does, and every rank stops.

use std::path::Path;

use anyhow::Context;

use crate::config::ResolvedConfig;
use crate::job::Job;

/// Keys that may differ between ranks: the device is rewritten per rank (`cuda` → `cuda:N`).
const PER_RANK: &[&str] = &["model.device"];

/// The fingerprint of `cfg`: its resolved TOML (as RUN_DIR/config.toml holds it, keys of
/// [`PER_RANK`] left out) plus an `[inputs]` table of what the ranks read: each data file's size
/// and CRC-32C, and the model directory's config.json CRC-32C with each file's size.
///
/// # Errors
/// An input that cannot be read (named).
pub(crate) fn fingerprint(cfg: &ResolvedConfig) -> anyhow::Result<toml::Table> {
    let mut t: toml::Table = cfg
        .to_toml()?
        .parse()
        .context("reading back the resolved config")?;
    for key in PER_RANK {
        if let Some((table, leaf)) = key.split_once('.') {
            if let Some(toml::Value::Table(s)) = t.get_mut(table) {
                s.remove(leaf);
            }
        }
    }
    let mut inputs = toml::Table::new();
    let d = &cfg.raw.data;
    for (name, path) in [
        ("data.train", &d.train),
        ("data.test", &d.test),
        ("data.experiences", &d.experiences),
    ] {
        if let Some(p) = path.as_deref().filter(|p| p.is_file()) {
            inputs.insert(name.into(), file_print(p)?.into());
        }
    }
    model_print(&cfg.raw.model.path, &mut inputs)?;
    t.insert("inputs".into(), toml::Value::Table(inputs));
    Ok(t)
}

/// Adds the model directory `model`'s files to `inputs`: config.json's size and CRC-32C, every
/// other file's size (`model/NAME`). Nothing when it is not a directory.
///
/// # Errors
/// A file that cannot be read (named).
pub(crate) fn model_print(model: &Path, inputs: &mut toml::Table) -> anyhow::Result<()> {
    if model.is_dir() {
        let mut files: Vec<_> = std::fs::read_dir(model)
            .with_context(|| format!("reading {}", model.display()))?
            .filter_map(Result::ok)
            .filter(|e| e.path().is_file())
            .collect();
        files.sort_by_key(|e| e.file_name());
        for e in files {
            let name = e.file_name().to_string_lossy().into_owned();
            let print = if name == "config.json" {
                file_print(&e.path())?
            } else {
                format!("{} bytes", e.metadata()?.len())
            };
            inputs.insert(format!("model/{name}"), print.into());
        }
    }
    Ok(())
}

/// `N bytes, crc32c X` of the file at `path` ([`crate::store::manifest::digest`], as checkpoint
/// manifests record their inputs).
pub(crate) fn file_print(path: &Path) -> anyhow::Result<String> {
    let (len, crc) = crate::store::manifest::digest(path)?;
    Ok(format!("{len} bytes, crc32c {crc:08x}"))
}

/// The first dotted key, in `a`'s order and then `b`'s, whose value differs between the tables,
/// with both values (`None` where a table lacks it).
fn first_difference(
    a: &toml::Table,
    b: &toml::Table,
    prefix: &str,
) -> Option<(String, Option<String>, Option<String>)> {
    let key = |k: &str| {
        if prefix.is_empty() {
            k.to_string()
        } else {
            format!("{prefix}.{k}")
        }
    };
    for (k, va) in a {
        match (va, b.get(k)) {
            (toml::Value::Table(x), Some(toml::Value::Table(y))) => {
                if let Some(d) = first_difference(x, y, &key(k)) {
                    return Some(d);
                }
            }
            (x, Some(y)) if x == y => {}
            (x, y) => return Some((key(k), Some(x.to_string()), y.map(|v| v.to_string()))),
        }
    }
    b.iter()
        .find(|(k, _)| !a.contains_key(*k))
        .map(|(k, v)| (key(k), None, Some(v.to_string())))
}

/// Checks that every rank of `job` runs the config and inputs of `cfg` that rank 0 runs. One
/// process: nothing to check.
///
/// # Errors
/// A rank's fingerprint differs from rank 0's: that rank's error names the first key that
/// differs and both values; the others' say that a rank differs. A failed collective; an input
/// that cannot be read.
pub(crate) fn check(cfg: &ResolvedConfig, job: &mut Job) -> anyhow::Result<()> {
    if !job.is_parallel() {
        return Ok(());
    }
    check_fingerprint(fingerprint(cfg)?, job, "config")
}

/// Checks that every rank of `job` has the fingerprint `mine` that rank 0 has (`what` names it in
/// the messages: "config", "sft flags and inputs"). One process: nothing to check.
///
/// # Errors
/// As [`check`].
pub(crate) fn check_fingerprint(
    mine: toml::Table,
    job: &mut Job,
    what: &str,
) -> anyhow::Result<()> {
    if !job.is_parallel() {
        return Ok(());
    }
    let text = toml::to_string(&mine).context("writing the config's fingerprint")?;
    let theirs = job.rank0_says(text.into_bytes())?;
    let rank0: toml::Table = String::from_utf8(theirs)
        .context("rank 0's fingerprint")?
        .parse()
        .context("reading rank 0's fingerprint")?;
    let diff = first_difference(&rank0, &mine, "");
    if !job.any(diff.is_some())? {
        return Ok(());
    }
    let show = |v: &Option<String>| v.clone().unwrap_or_else(|| "(absent)".into());
    match diff {
        Some((key, at0, here)) => anyhow::bail!(
            "rank {} does not run rank 0's {what}: {key} is {} here and {} on rank 0 (every rank \
             of a data-parallel run must be launched with the same config, flags, --set values \
             and inputs)",
            job.rank(),
            show(&here),
            show(&at0)
        ),
        None => anyhow::bail!(
            "another rank does not run this {what} (its error names the key that differs): \
             every rank of a data-parallel run must be launched with the same config, flags, \
             --set values and inputs"
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_difference_is_named_in_order() {
        let a: toml::Table = "x = 1\n[t]\nlr = 1e-5\nseed = 3\n".parse().unwrap();
        let b: toml::Table = "x = 1\n[t]\nlr = 2e-5\nseed = 4\n".parse().unwrap();
        assert_eq!(
            first_difference(&a, &b, ""),
            Some((
                "t.lr".into(),
                Some("0.00001".into()),
                Some("0.00002".into())
            ))
        );
        let c: toml::Table = "x = 1\n[t]\nlr = 1e-5\nseed = 3\nextra = true\n"
            .parse()
            .unwrap();
        assert_eq!(
            first_difference(&a, &c, ""),
            Some(("t.extra".into(), None, Some("true".into())))
        );
        assert_eq!(first_difference(&a, &a, ""), None);
    }
}
