//! `rlvr plot --mean-over-seeds`: which runs are seeds of one configuration (their config.toml
//! files equal once the seed keys, `output.dir` and the `--ignore-key` keys are left out, and a
//! path segment `seed-S` naming the run's own seed is read as any seed's), and the legend names
//! of such groups.

use std::path::{Path, PathBuf};

use anyhow::Context;

use super::labels;

/// The run directory of `run` (a run directory, or a metrics.jsonl file in one).
fn run_dir(run: &Path) -> &Path {
    if run.is_dir() {
        run
    } else {
        run.parent().unwrap_or(run)
    }
}

/// A run's config.toml without its seeds and `ignore` keys (what `--mean-over-seeds` compares),
/// and the seeds removed (`key=value`, sorted), which tell the runs of a group apart.
///
/// # Errors
/// A missing or malformed config.toml, named.
fn config_but_seeds(run: &Path, ignore: &[String]) -> anyhow::Result<(toml::Table, String)> {
    let path = run_dir(run).join("config.toml");
    let text = std::fs::read_to_string(&path).with_context(|| {
        format!(
            "--mean-over-seeds compares the runs' configs: reading {}",
            path.display()
        )
    })?;
    let mut t: toml::Table = text
        .parse()
        .with_context(|| format!("parsing {}", path.display()))?;
    fn strip(t: &mut toml::Table, prefix: &str, ignore: &[String], seeds: &mut Vec<String>) {
        let keys: Vec<String> = t.keys().cloned().collect();
        for k in keys {
            let full = if prefix.is_empty() {
                k.clone()
            } else {
                format!("{prefix}.{k}")
            };
            if k == "seed" || k.ends_with("_seed") {
                if let Some(v) = t.remove(&k) {
                    seeds.push(format!("{full}={v}"));
                }
            } else if full == "output.dir" || ignore.contains(&full) {
                t.remove(&k);
            } else if let Some(toml::Value::Table(sub)) = t.get_mut(&k) {
                strip(sub, &full, ignore, seeds);
            }
        }
    }
    let mut seeds = Vec::new();
    strip(&mut t, "", ignore, &mut seeds);
    seeds.sort();
    // Paths named after the seed (a lab's `warm_start/seed-S/sft`, `seed-S/data/train.jsonl`,
    // each seed's own warm start and data) are one path for the comparison.
    let values: Vec<String> = seeds
        .iter()
        .filter_map(|s| {
            s.split_once('=')
                .map(|(_, v)| v.trim_matches('"').to_string())
        })
        .collect();
    fn unseed(v: &mut toml::Value, values: &[String]) {
        match v {
            toml::Value::String(s) if s.contains("seed-") => {
                let parts: Vec<String> = s
                    .split('/')
                    .map(|p| match p.strip_prefix("seed-") {
                        Some(n) if values.iter().any(|v| v == n) => "seed-{seed}".to_string(),
                        _ => p.to_string(),
                    })
                    .collect();
                *s = parts.join("/");
            }
            toml::Value::Table(t) => t.iter_mut().for_each(|(_, v)| unseed(v, values)),
            toml::Value::Array(a) => a.iter_mut().for_each(|v| unseed(v, values)),
            _ => {}
        }
    }
    t.iter_mut().for_each(|(_, v)| unseed(v, &values));
    Ok((t, seeds.join(" ")))
}

/// `--mean-over-seeds`: the runs grouped by their config.toml with every seed key, `output.dir`
/// and the `ignore` keys left out; groups in the order of their first run, runs in the given
/// order. Runs with the same seeds in one group are named in a warning (they are counted twice).
///
/// # Errors
/// A run without a readable config.toml.
pub fn seed_groups(runs: &[PathBuf], ignore: &[String]) -> anyhow::Result<Vec<Vec<usize>>> {
    let mut groups: Vec<(toml::Table, Vec<(usize, String)>)> = Vec::new();
    for (i, r) in runs.iter().enumerate() {
        let (cfg, seeds) = config_but_seeds(r, ignore)?;
        match groups.iter_mut().find(|g| g.0 == cfg) {
            Some(g) => {
                if let Some((j, _)) = g.1.iter().find(|m| m.1 == seeds) {
                    crate::log::say(&format!(
                        "warning: {} and {} have the same config and seeds ({seeds}); both are \
                         in the mean",
                        runs[*j].display(),
                        r.display()
                    ));
                }
                g.1.push((i, seeds));
            }
            None => groups.push((cfg, vec![(i, seeds)])),
        }
    }
    Ok(groups
        .into_iter()
        .map(|g| g.1.into_iter().map(|m| m.0).collect())
        .collect())
}

/// What `--mean-over-seeds` could not group: for runs each drawn alone whose configs differ from
/// another such run's in one or two paths besides their seeds (`model.path`, `data.train`: each
/// seed's own warm start or data, when not named after the seed), one note per such set of keys,
/// naming an example pair and the `--ignore-key` that would average them. Empty when every run is
/// in a group of several, or the single runs differ in more.
///
/// # Errors
/// A run without a readable config.toml.
pub fn apart_notes(
    runs: &[PathBuf],
    groups: &[Vec<usize>],
    ignore: &[String],
) -> anyhow::Result<Vec<String>> {
    fn flat(prefix: &str, t: &toml::Table, out: &mut Vec<(String, toml::Value)>) {
        for (k, v) in t {
            let full = if prefix.is_empty() {
                k.clone()
            } else {
                format!("{prefix}.{k}")
            };
            match v {
                toml::Value::Table(sub) => flat(&full, sub, out),
                v => out.push((full, v.clone())),
            }
        }
    }
    let single: Vec<usize> = groups
        .iter()
        .filter(|g| g.len() == 1)
        .map(|g| g[0])
        .collect();
    let mut configs = Vec::new();
    for &i in &single {
        let (t, _) = config_but_seeds(&runs[i], ignore)?;
        let mut f = Vec::new();
        flat("", &t, &mut f);
        configs.push((i, f));
    }
    let mut seen: Vec<Vec<String>> = Vec::new();
    let mut notes = Vec::new();
    for (x, (i, a)) in configs.iter().enumerate() {
        for (j, b) in &configs[x + 1..] {
            let mut keys: Vec<String> = a
                .iter()
                .filter(|(k, v)| !b.iter().any(|(k2, v2)| k2 == k && v2 == v))
                .map(|(k, _)| k.clone())
                .chain(
                    b.iter()
                        .filter(|(k, _)| !a.iter().any(|(k2, _)| k2 == k))
                        .map(|(k, _)| k.clone()),
                )
                .collect();
            keys.sort();
            keys.dedup();
            // Only paths (each seed's own checkpoint or data), never a hyperparameter: runs
            // of two presets or intervals are not seeds of one config.
            let path = |k: &String| {
                let is_path = |c: &[(String, toml::Value)]| {
                    c.iter()
                        .find(|(k2, _)| k2 == k)
                        .is_some_and(|(_, v)| v.as_str().is_some_and(|s| s.contains('/')))
                };
                is_path(a) && is_path(b)
            };
            if keys.is_empty() || keys.len() > 2 || !keys.iter().all(path) || seen.contains(&keys) {
                continue;
            }
            let flags: Vec<String> = keys.iter().map(|k| format!("--ignore-key {k}")).collect();
            notes.push(format!(
                "note: --mean-over-seeds draws {} and {} apart: their configs differ in {} \
                 besides their seeds; add {} to draw such runs as one mean",
                runs[*i].display(),
                runs[*j].display(),
                keys.join(" and "),
                flags.join(" ")
            ));
            seen.push(keys);
        }
    }
    Ok(notes)
}

/// The legend labels of `groups` of `runs` (run labels `run_labels`): a group of one run keeps
/// its label; a larger one is named by its runs' common parent directory (`grpo_v4` for
/// `grpo_v4/seed-0`, `grpo_v4/seed-1`), else by its first run's label, followed by
/// `(mean ± SE of n seeds)`. `given`: `--label` values, one per run (a group takes its first
/// run's) or one per group.
///
/// # Errors
/// A `--label` count that is neither the runs' nor the groups'.
pub fn group_labels(
    runs: &[PathBuf],
    groups: &[Vec<usize>],
    given: &[String],
) -> anyhow::Result<Vec<String>> {
    let names: Vec<String> = if given.len() == groups.len() && !given.is_empty() {
        given.to_vec()
    } else {
        let per_run = labels(runs, given)
            .map_err(|e| anyhow::anyhow!("{e}, or one per group of seeds ({})", groups.len()))?;
        let parent = |i: usize| {
            run_dir(&runs[i])
                .canonicalize()
                .ok()
                .and_then(|d| d.parent().map(Path::to_path_buf))
        };
        let mut out: Vec<String> = groups
            .iter()
            .map(|g| {
                let p = parent(g[0]);
                let shared = g.len() > 1 && p.is_some() && g.iter().all(|&i| parent(i) == p);
                match p.as_deref().and_then(Path::file_name) {
                    Some(n) if shared && given.is_empty() => n.to_string_lossy().to_string(),
                    _ => per_run[g[0]].clone(),
                }
            })
            .collect();
        // Two groups under one parent: their first runs' labels instead.
        for (j, g) in groups.iter().enumerate() {
            if out.iter().filter(|n| **n == out[j]).count() > 1 {
                out[j] = per_run[g[0]].clone();
            }
        }
        out
    };
    Ok(names
        .into_iter()
        .zip(groups)
        .map(|(n, g)| match g.len() {
            1 => n,
            k => format!("{n} (mean ± SE of {k} seeds)"),
        })
        .collect())
}
