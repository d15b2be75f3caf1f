//! Which directory a config's paths are relative to (README "Configuration", configs/README.md).
//!
//! - **Input paths written in a config file** (the keys of [`INPUT_PATHS`], and an external
//!   verifier's program and script in `data.verifier` or `[[reward.components]]`) are relative to
//!   the directory of that file, so a config travels with the data beside it: `configs/x.toml`
//!   names `../data/gsm8k/train.jsonl` and runs from any working directory.
//! - **`--set` values and output paths** ([`OUTPUT_PATHS`]: `output.dir`, `rollout.weights_dir`)
//!   stay relative to the working directory, where they were typed.
//!
//! After loading, every input path is absolute ([`absolutize`]), so `--print-config` and the run's
//! `config.toml` name the files a later `--resume` reads from any directory.

use std::path::{Component, Path, PathBuf};

use anyhow::Context;
use rlvr_reward::combine::VerifierConfig;

use super::RawConfig;

/// The input path keys of the config: resolved against the directory of the config file that
/// names them (and against the working directory when given by `--set`).
pub const INPUT_PATHS: [&str; 5] = [
    "model.path",
    "model.reference",
    "data.train",
    "data.test",
    "data.experiences",
];

/// The output path keys: always relative to the working directory (as `--set` values are).
pub const OUTPUT_PATHS: [&str; 2] = ["output.dir", "rollout.weights_dir"];

/// The absolute directory of config file `file` (its parent, made absolute against the working
/// directory and with symbolic links resolved, so that `..` in a path means the real parent).
///
/// # Errors
/// The working directory cannot be read, or the file's directory does not exist.
pub fn config_dir(file: &Path) -> anyhow::Result<PathBuf> {
    let parent = match file.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    parent
        .canonicalize()
        .with_context(|| format!("resolving the directory of config {}", file.display()))
}

/// `rel` joined to the absolute directory `dir`: unchanged when already absolute; `.` parts
/// dropped and leading `..` parts taken off `dir` (exact, since `dir` has no symbolic links).
pub fn join_clean(dir: &Path, rel: &Path) -> PathBuf {
    if rel.is_absolute() {
        return rel.to_path_buf();
    }
    let mut out = dir.to_path_buf();
    let mut leading = true;
    for c in rel.components() {
        match c {
            Component::CurDir => {}
            Component::ParentDir if leading && out.parent().is_some() => {
                out.pop();
            }
            other => {
                leading = false;
                out.push(other.as_os_str());
            }
        }
    }
    out
}

/// Rewrites the relative input paths of a config file's table (see the module docs) against
/// `dir`, the file's directory. Values that are not strings are left for deserialisation to
/// report.
pub fn resolve_in_table(table: &mut toml::Table, dir: &Path) {
    for key in INPUT_PATHS {
        if let Some(toml::Value::String(s)) = get_mut(table, key) {
            if !s.is_empty() && Path::new(s.as_str()).is_relative() {
                let mut p = join_clean(dir, Path::new(s.as_str()));
                if key.starts_with("model.") {
                    p = crate::store::hub::resolve_model_path(
                        s,
                        p,
                        crate::store::hub::cache_dir().as_deref(),
                    );
                }
                *s = p.display().to_string();
            }
        }
    }
    if let Some(env) = table.get_mut("env").and_then(toml::Value::as_table_mut) {
        resolve_env_table(env, dir);
    }
    let mut verifiers: Vec<&mut toml::Value> = Vec::new();
    let (data, reward) = split_two(table, "data", "reward");
    if let Some(v) = data.and_then(|d| d.get_mut("verifier")) {
        verifiers.push(v);
    }
    if let Some(toml::Value::Array(cs)) = reward.and_then(|r| r.get_mut("components")) {
        for c in cs.iter_mut() {
            if let Some(v) = c.as_table_mut().and_then(|c| c.get_mut("verifier")) {
                verifiers.push(v);
            }
        }
    }
    for v in verifiers {
        let Some(t) = v.as_table_mut() else { continue };
        if matches!(
            t.get("kind").and_then(|k| k.as_str()),
            Some("python" | "verl")
        ) {
            resolve_python_table(t, dir);
            continue;
        }
        if t.get("kind").and_then(|k| k.as_str()) != Some("external") {
            continue;
        }
        if let Some(toml::Value::Array(cmd)) = t.get_mut("command") {
            let mut words: Vec<String> = cmd
                .iter()
                .map(|w| w.as_str().map(str::to_string))
                .collect::<Option<_>>()
                .unwrap_or_default();
            if words.len() == cmd.len() {
                resolve_command(&mut words, dir);
                *cmd = words.into_iter().map(toml::Value::String).collect();
            }
        }
    }
}

/// A `kind = "python"` or `kind = "verl"` verifier table of a config file in `dir`: `python` when
/// it is a relative path with a `/` in it, and `function`'s FILE when that file exists there, made
/// absolute (as an external verifier's command, [`resolve_command`]).
fn resolve_python_table(t: &mut toml::Table, dir: &Path) {
    let python = match t.get("python") {
        Some(toml::Value::String(p)) => p.clone(),
        _ => String::new(),
    };
    let Some(toml::Value::String(function)) = t.get("function") else {
        return;
    };
    let mut words = vec![python.clone(), function.clone()];
    resolve_command(&mut words, dir);
    let [p, f] = <[String; 2]>::try_from(words).expect("two words");
    t.insert("function".into(), toml::Value::String(f));
    if !python.is_empty() {
        t.insert("python".into(), toml::Value::String(p));
    }
}

/// Makes an external verifier's `command` independent of the working directory: the program
/// (the first word) when it is a relative path with a `/` in it (`./score.py`, `tools/score`; a
/// bare name such as `python3` is looked up on `PATH`), and each later word that is not an option
/// and names an existing file or directory relative to `dir` (`["python3", "score.py"]`), or is
/// `FILE:NAME` with FILE an existing file there (`"my_rewards.py:accuracy_reward"`: its file part).
pub fn resolve_command(words: &mut [String], dir: &Path) {
    for (i, w) in words.iter_mut().enumerate() {
        let p = Path::new(w.as_str());
        if w.is_empty() || p.is_absolute() || w.starts_with('-') {
            continue;
        }
        let resolve = if i == 0 {
            w.contains('/')
        } else {
            dir.join(p).exists()
        };
        if resolve {
            *w = join_clean(dir, p).display().to_string();
        } else if let Some((file, name)) = w.rsplit_once(':') {
            // `FILE.py:FUNCTION` (examples/trl_rewards.py's arguments): the file part.
            let f = Path::new(file);
            if i > 0 && !file.is_empty() && f.is_relative() && dir.join(f).is_file() {
                *w = format!("{}:{name}", join_clean(dir, f).display());
            }
        }
    }
}

/// `[env]` of a config file in `dir`: `env.command`'s program and scripts as a verifier's,
/// `env.python` (a path with a `/`), `env.chat_template` and `env.dir` against `dir`, and
/// `env.dir` set to `dir` when the file sets `env.command` or `env.verifiers` without it (the
/// program runs in the config file's directory).
fn resolve_env_table(env: &mut toml::Table, dir: &Path) {
    let mut has_command = false;
    if let Some(toml::Value::Array(cmd)) = env.get_mut("command") {
        let mut words: Vec<String> = cmd
            .iter()
            .map(|w| w.as_str().map(str::to_string))
            .collect::<Option<_>>()
            .unwrap_or_default();
        if words.len() == cmd.len() && !words.is_empty() {
            has_command = true;
            resolve_command(&mut words, dir);
            *cmd = words.into_iter().map(toml::Value::String).collect();
        }
    }
    for key in ["chat_template", "dir"] {
        if let Some(toml::Value::String(s)) = env.get_mut(key) {
            if !s.is_empty() && Path::new(s.as_str()).is_relative() {
                *s = join_clean(dir, Path::new(s.as_str())).display().to_string();
            }
        }
    }
    // env.verifiers' interpreter: a path with a `/` is the config file's, as a command's program.
    if let Some(toml::Value::String(p)) = env.get_mut("python") {
        if p.contains('/') && Path::new(p.as_str()).is_relative() {
            *p = join_clean(dir, Path::new(p.as_str())).display().to_string();
        }
    }
    let has_command = has_command || env.contains_key("verifiers");
    if has_command && !env.contains_key("dir") {
        env.insert("dir".into(), toml::Value::String(dir.display().to_string()));
    }
}

/// Makes the input paths of `raw` that are still relative (from `--set`, or from a run's
/// `config.toml` written before paths were recorded absolute) absolute against the working
/// directory `cwd`, and so the external verifiers' programs and scripts.
pub fn absolutize(raw: &mut RawConfig, cwd: &Path) {
    let (m, d) = (&mut raw.model, &mut raw.data);
    let hub = crate::store::hub::cache_dir();
    for p in [Some(&mut m.path), m.reference.as_mut()]
        .into_iter()
        .flatten()
    {
        if p.is_relative() && !p.as_os_str().is_empty() {
            let written = p.display().to_string();
            *p =
                crate::store::hub::resolve_model_path(&written, join_clean(cwd, p), hub.as_deref());
        }
    }
    let paths = [d.train.as_mut(), d.test.as_mut(), d.experiences.as_mut()];
    for p in paths.into_iter().flatten() {
        if p.is_relative() && !p.as_os_str().is_empty() {
            *p = join_clean(cwd, p);
        }
    }
    let env = &mut raw.env;
    resolve_command(&mut env.command, cwd);
    if let Some(p) = env.python.as_mut() {
        if p.contains('/') && Path::new(p.as_str()).is_relative() {
            *p = join_clean(cwd, Path::new(p.as_str())).display().to_string();
        }
    }
    for p in [env.chat_template.as_mut(), env.dir.as_mut()]
        .into_iter()
        .flatten()
    {
        if p.is_relative() && !p.as_os_str().is_empty() {
            *p = join_clean(cwd, p);
        }
    }
    let verifiers = d
        .verifier
        .iter_mut()
        .chain(raw.reward.components.iter_mut().map(|c| &mut c.verifier));
    for v in verifiers {
        match v {
            VerifierConfig::External { command, .. } => resolve_command(command, cwd),
            VerifierConfig::Python {
                function, python, ..
            }
            | VerifierConfig::Verl {
                function, python, ..
            } => {
                let mut words = [python.clone(), function.clone()];
                resolve_command(&mut words, cwd);
                let [p, f] = words;
                (*python, *function) = (p, f);
            }
            _ => {}
        }
    }
}

/// The value at dotted `key` of `table`, if every part exists.
pub(super) fn get<'a>(table: &'a toml::Table, key: &str) -> Option<&'a toml::Value> {
    let mut parts = key.split('.');
    let mut cur = table.get(parts.next()?)?;
    for p in parts {
        cur = cur.as_table()?.get(p)?;
    }
    Some(cur)
}

/// The value at dotted `key` of `table`, if every part exists.
fn get_mut<'a>(table: &'a mut toml::Table, key: &str) -> Option<&'a mut toml::Value> {
    let mut parts = key.split('.');
    let mut cur = table.get_mut(parts.next()?)?;
    for p in parts {
        cur = cur.as_table_mut()?.get_mut(p)?;
    }
    Some(cur)
}

/// Mutable access to two distinct sub-tables of `table` at once.
fn split_two<'a>(
    table: &'a mut toml::Table,
    a: &str,
    b: &str,
) -> (Option<&'a mut toml::Table>, Option<&'a mut toml::Table>) {
    let (mut first, mut second) = (None, None);
    for (k, v) in table.iter_mut() {
        if k == a {
            first = v.as_table_mut();
        } else if k == b {
            second = v.as_table_mut();
        }
    }
    (first, second)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn leading_parent_parts_leave_the_directory() {
        let d = Path::new("/r/configs");
        assert_eq!(
            join_clean(d, Path::new("../data/x.jsonl")),
            Path::new("/r/data/x.jsonl")
        );
        assert_eq!(
            join_clean(d, Path::new("./a/../b")),
            Path::new("/r/configs/a/../b")
        );
        assert_eq!(join_clean(d, Path::new("/abs")), Path::new("/abs"));
    }
}
