//! Extreme values fed to every numeric config key and every numeric flag of every subcommand
//! (issue 34 item 4's property test): each is refused with an error naming the key or flag, never
//! a panic, an abort, a hang or an allocation sized from the value.
//!
//! The keys come from the config itself ([`accepted_keys`]: the deserialiser asked which keys each
//! table takes), the flags from clap's introspection of [`rlvr::Cli`], so a new key or flag is
//! covered without editing this file. A value that is meaningful for a key or flag (a seed of
//! 10^18, `train.eval_every = 0` for "never") is listed in [`ACCEPTED_KEYS`] or [`ACCEPTED_FLAGS`]
//! with the reason; any other value that is accepted fails the test.
#![cfg(unix)]

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use crate::common::{rlvr, tokenizer_json};
use clap::{CommandFactory, Parser};
use rlvr_train::config::keys::{accepted_keys, AcceptedKey};
use rlvr_train::config::{apply_override, RawConfig};

/// The values fed to every key and flag: huge (as a float, 1e18, and as an integer, [`BIG`]),
/// negative, overflowing every float but f64, not a number, infinite, and zero.
const BIG: &str = "1000000000000000000";

/// The values fed to every key and flag.
const EXTREMES: &[&str] = &["1e18", BIG, "-1", "1e300", "nan", "inf", "-inf", "0"];

/// The leaf keys of the config (a key no other key is below), with the tagged variant each
/// belongs to.
fn leaf_keys() -> Vec<AcceptedKey> {
    let all = accepted_keys();
    all.iter()
        .filter(|k| {
            !all.iter().any(|o| {
                o.key.starts_with(&format!("{}.", k.key))
                    || o.key.starts_with(&format!("{}[]", k.key))
            })
        })
        .cloned()
        .collect()
}

/// Sets the dotted `key` (with `[]` for the one element of an array of tables) to `v` in `t`.
fn set_path(t: &mut toml::Table, key: &str, v: toml::Value) {
    let (head, rest) = match key.split_once('.') {
        Some((h, r)) => (h, Some(r)),
        None => (key, None),
    };
    let Some(rest) = rest else {
        t.insert(head.trim_end_matches("[]").to_string(), v);
        return;
    };
    if let Some(name) = head.strip_suffix("[]") {
        let arr = t
            .entry(name.to_string())
            .or_insert_with(|| toml::Value::Array(vec![toml::Value::Table(toml::Table::new())]));
        if let toml::Value::Array(a) = arr {
            if let Some(toml::Value::Table(inner)) = a.get_mut(0) {
                set_path(inner, rest, v);
            }
        }
        return;
    }
    let inner = t
        .entry(head.to_string())
        .or_insert_with(|| toml::Value::Table(toml::Table::new()));
    if let toml::Value::Table(inner) = inner {
        set_path(inner, rest, v);
    }
}

/// The tag settings `key` needs to be read (`kind = "external"` for `data.verifier.timeout_s`):
/// for each `name = "value"` of its variant, the tag key of that name whose table holds `key`.
fn tags_for(key: &AcceptedKey, all: &[AcceptedKey]) -> Vec<(String, String)> {
    let Some(within) = key.within.first() else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for part in within.split(", ") {
        let Some((name, value)) = part.split_once(" = ") else {
            continue;
        };
        let value = value.trim_matches('"');
        let tag = all
            .iter()
            .filter(|t| !t.tags.is_empty())
            .filter(|t| t.key.rsplit('.').next() == Some(name))
            .filter(|t| {
                let table = t.key.rsplit_once('.').map_or("", |(p, _)| p);
                key.key.starts_with(&format!("{table}."))
            })
            .max_by_key(|t| t.key.len());
        if let Some(t) = tag {
            out.push((t.key.clone(), value.to_string()));
        }
    }
    out
}

/// What a variant's required keys are given when the probe of another key needs them.
fn sample_value(field: &str) -> toml::Value {
    match field {
        "command" => toml::Value::Array(vec![toml::Value::String("true".into())]),
        "labels" => toml::Value::Array(vec![
            toml::Value::String("yes".into()),
            toml::Value::String("no".into()),
        ]),
        "verifier" => {
            let mut t = toml::Table::new();
            t.insert("kind".into(), toml::Value::String("math".into()));
            toml::Value::Table(t)
        }
        "min" => toml::Value::Float(0.0),
        "max" => toml::Value::Float(1.0),
        "url" | "server" | "base_url" => toml::Value::String("http://127.0.0.1:9".into()),
        "parse" => {
            let mut t = toml::Table::new();
            t.insert("rule".into(), toml::Value::String("number".into()));
            t.insert("min".into(), toml::Value::Float(0.0));
            t.insert("max".into(), toml::Value::Float(1.0));
            toml::Value::Table(t)
        }
        _ => toml::Value::String("x".into()),
    }
}

/// The values a key takes on purpose among [`EXTREMES`], and why: every other extreme value of
/// every key must be refused at start-up naming the key.
const ACCEPTED_KEYS: &[(&str, &[&str], &str)] = &[
    ("algorithm.baseline_shift", &["-1", "0"], "a shift of the reward baseline, in [-1e6, 1e6]"),
    ("algorithm.clip_high", &["0"], "no upward slack of the ratio"),
    ("algorithm.clip_low", &["0"], "no downward slack of the ratio"),
    ("algorithm.entropy_coef", &["-1", "0"], "an entropy bonus (< 0: a penalty), in [-1e6, 1e6]"),
    ("algorithm.kl_coef", &["0"], "no KL term"),
    ("algorithm.opsm_delta", &["0"], "OPSM masks every negative sequence past δ = 0"),
    ("algorithm.std_eps", &["0"], "no ε in the std division (zero-std groups are excluded)"),
    ("data.countdown.max_target", &[BIG], "an upper bound on generated targets, not a size"),
    ("data.max_prompt_len", &[BIG], "a filter: prompts longer are dropped, none is"),
    ("data.seed", &[BIG, "0"], "any u64 seeds the data order"),
    ("data.verifier.correct_above", &["-1", "0"], "a reward threshold, in [-1e6, 1e6]"),
    ("data.verifier.label", &["0"], "the first output"),
    ("data.verifier.parse.min", &["-1", "0"], "the judge's score range [min, 1]"),
    ("data.verifier.restarts", &["0"], "no restart of a dead verifier"),
    ("data.verifier.retries", &["0"], "no retry"),
    ("data.verifier.scale", &["-1", "0"], "a reward scale, in [-1e6, 1e6]"),
    ("data.verifier.seed", &[BIG, "0"], "any u64 seeds the judge"),
    ("data.verifier.shift", &["-1", "0"], "a reward shift, in [-1e6, 1e6]"),
    ("data.verifier.temperature", &["0"], "a greedy judge"),
    ("distributed.timeout_s", &["0"], "no collective timeout"),
    ("distributed.zero", &["0"], "no sharding"),
    ("eval.limit", &[BIG], "a cap on the problems evaluated, min'd with the split's size"),
    ("model.lora_rank", &["0"], "LoRA off"),
    ("output.log_every", &[BIG], "a cadence: the last step is logged whatever it is"),
    ("output.warn_no_signal_steps", &[BIG, "0"], "a cadence of a warning (0 = never)"),
    ("reward.components[].verifier.correct_above", &["-1", "0"], "as data.verifier's"),
    ("reward.components[].verifier.label", &["0"], "as data.verifier's"),
    ("reward.components[].verifier.parse.min", &["-1", "0"], "as data.verifier's"),
    ("reward.components[].verifier.restarts", &["0"], "as data.verifier's"),
    ("reward.components[].verifier.retries", &["0"], "as data.verifier's"),
    ("reward.components[].verifier.scale", &["-1", "0"], "as data.verifier's"),
    ("reward.components[].verifier.seed", &[BIG, "0"], "as data.verifier's"),
    ("reward.components[].verifier.shift", &["-1", "0"], "as data.verifier's"),
    ("reward.components[].verifier.temperature", &["0"], "as data.verifier's"),
    ("reward.components[].weight", &["-1", "0"], "a component's weight: < 0 penalises"),
    ("reward.format.bonus", &["-1", "0"], "a format reward"),
    ("reward.format.penalty", &["-1", "0"], "a format reward"),
    ("rollout.max_batch_rows", &[BIG, "0"], "a cap on rows per forward pass (0 = all)"),
    ("rollout.min_new_tokens", &["0"], "no minimum"),
    ("rollout.top_k", &[BIG, "0"], "0 = off; above the vocabulary keeps every token"),
    ("sync.interval", &[BIG], "beyond train.steps the explorer keeps the first weights"),
    ("sync.max_staleness", &[BIG, "0"], "a filter on the samples' age"),
    ("sync.offset", &["0"], "on-policy"),
    ("train.beta1", &["0"], "AdamW without momentum, in [0, 1)"),
    ("train.beta2", &["0"], "AdamW's second moment of one step, in [0, 1)"),
    ("train.eval_every", &[BIG, "0"], "a cadence (0 = never)"),
    ("train.grad_clip", &["1e18", BIG, "1e300", "0"], "a clip norm: huge or 0 = off"),
    ("train.keep_last", &[BIG, "0"], "checkpoints kept (0 = all)"),
    ("train.log_rollouts", &[BIG, "0"], "rollouts logged per step, at most the step's rows"),
    ("train.lr", &["1e18", BIG, "1e300"], "finite: a step that makes the weights non-finite is skipped, and train.max_skipped_in_row stops the run naming the fix"),
    ("train.micro_batch_size", &[BIG], "a cap on rows per micro-batch"),
    ("train.micro_batch_tokens", &[BIG], "a cap on tokens per micro-batch"),
    ("train.save_every", &[BIG, "0"], "a cadence (0 = only at the end)"),
    ("train.seed", &[BIG, "0"], "any u64 seeds the run"),
    ("train.steps", &[BIG], "the run's length: nothing is sized by it"),
    ("train.warmup_steps", &[BIG, "0"], "the warm-up's length: lr·step/warmup stays finite"),
    ("train.weight_decay", &["0"], "no decay"),
];

/// Whether `msg` names `key`: the dotted key (an array element's as `[0]`), or the table it is
/// in and its own name (`data.verifier: ... scale = 1e18 ...`).
fn names_key(msg: &str, key: &str) -> bool {
    let key0 = key.replace("[]", "[0]");
    if msg.contains(key) || msg.contains(&key0) {
        return true;
    }
    let Some((table, last)) = key0.rsplit_once('.') else {
        return false;
    };
    let table = table.rsplit_once('.').map_or(table, |(_, t)| t);
    msg.contains(table)
        && msg
            .split(|c: char| !(c.is_alphanumeric() || c == '_'))
            .any(|w| w == last)
}

/// Every extreme value of every leaf key of the config is refused by `RawConfig::load` or
/// `resolve` (the start-up checks before the model loads) with a message naming the key, unless
/// [`ACCEPTED_KEYS`] lists it; and every value listed there is still accepted.
#[test]
fn every_config_key_refuses_extreme_values_naming_the_key() {
    let tmp = tempfile::tempdir().unwrap();
    let all = accepted_keys();
    let leaves = leaf_keys();
    assert!(leaves.len() > 150, "{}", leaves.len());
    let file = tmp.path().join("c.toml");
    let base_sets = [
        "model.device=\"cpu\"",
        "model.dtype=\"f32\"",
        "data.task=\"arithmetic\"",
        "model.path=\"/m\"",
    ];
    let t0 = Instant::now();
    let mut failures = Vec::new();
    let mut accepted = Vec::new();
    for k in &leaves {
        for v in EXTREMES {
            let mut t = toml::Table::new();
            for s in base_sets {
                apply_override(&mut t, s).unwrap();
            }
            for (tag, val) in tags_for(k, &all) {
                set_path(&mut t, &tag, toml::Value::String(val));
            }
            // A judge's number rule needs its range beside the key probed.
            if k.key.contains(".parse.") && k.within.iter().any(|w| w.contains("number")) {
                let parse = k.key.rsplit_once('.').unwrap().0;
                set_path(&mut t, &format!("{parse}.min"), toml::Value::Float(0.0));
                set_path(&mut t, &format!("{parse}.max"), toml::Value::Float(1.0));
            }
            set_path(&mut t, &k.key, rlvr_train::config::parse_value(v));
            let mut res = Err(anyhow::anyhow!("not loaded"));
            // The keys a variant requires (an external verifier's command) get sample values.
            for _ in 0..8 {
                std::fs::write(&file, toml::to_string(&t).unwrap()).unwrap();
                res = RawConfig::load(Some(&file), &[]).and_then(|c| c.resolve());
                let Err(e) = &res else { break };
                let msg = format!("{e:#}");
                let help = rlvr_train::config::help::quoted_after;
                let (Some(field), Some(table)) =
                    (help(&msg, "missing field"), help(&msg, "config key"))
                else {
                    break;
                };
                let path = format!("{}.{field}", table.replace("[0]", "[]"));
                set_path(&mut t, &path, sample_value(field));
            }
            let listed = ACCEPTED_KEYS
                .iter()
                .any(|(key, values, _)| *key == k.key && values.contains(v));
            match res {
                Ok(_) if listed => accepted.push((k.key.clone(), *v)),
                Ok(_) => failures.push(format!("{} = {v}: accepted", k.key)),
                Err(e) => {
                    let msg = format!("{e:#}");
                    if !names_key(&msg, &k.key) {
                        failures.push(format!(
                            "{} = {v}: the error does not name it: {msg}",
                            k.key
                        ));
                    }
                }
            }
        }
    }
    for (key, values, _) in ACCEPTED_KEYS {
        for v in *values {
            if !accepted.iter().any(|(k, a)| k == key && a == v) {
                failures.push(format!(
                    "{key} = {v} is listed as accepted but was refused or is no key"
                ));
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{} failures:\n{}",
        failures.len(),
        failures.join("\n")
    );
    // About 1,500 loads and resolves.
    assert!(t0.elapsed() < Duration::from_secs(30), "{:?}", t0.elapsed());
}

/// The flag values among [`EXTREMES`] a subcommand takes on purpose, and why (never run: a seed
/// of 10^18 would run a whole quickstart): (subcommand path, long flag, values, why).
const ACCEPTED_FLAGS: &[(&str, &str, &[&str], &str)] = &[
    ("init", "seed", &[BIG, "0"], "any u64 seeds the weights"),
    (
        "init",
        "rope-theta",
        &["1e18", BIG, "1e300"],
        "a finite RoPE base > 0 (config.json's check)",
    ),
    ("init", "init-std", &["0"], "all-zero weights"),
    ("sft", "seed", &[BIG, "0"], "any u64 seeds the order"),
    ("sft", "eval-every", &[BIG, "0"], "a cadence (0 = never)"),
    (
        "sft",
        "log-every",
        &[BIG],
        "a cadence: the last step is logged whatever it is",
    ),
    (
        "sft",
        "max-completion-len",
        &[BIG],
        "a filter: longer pairs are dropped, none is",
    ),
    (
        "sft",
        "stop-at-accuracy",
        &["0"],
        "stops at the first evaluation",
    ),
    (
        "sft",
        "save-every",
        &[BIG, "0"],
        "a cadence (0 = only at the end)",
    ),
    ("sft", "warmup-steps", &[BIG, "0"], "the warm-up's length"),
    ("sft", "weight-decay", &["0"], "no decay"),
    (
        "sft",
        "grad-clip",
        &["1e18", BIG, "1e300", "0"],
        "a clip norm: huge or 0 = off",
    ),
    ("sft", "lr", &["1e18", BIG, "1e300"], "finite, as train.lr"),
    (
        "sft",
        "steps",
        &[BIG],
        "a step budget: the run stops at the end of --epochs first",
    ),
    ("eval", "seed", &[BIG, "0"], "any u64 seeds the sampling"),
    (
        "eval",
        "limit",
        &[BIG],
        "a cap on the problems, min'd with the split's size",
    ),
    ("plan", "zero", &["0"], "no sharding"),
    ("plot", "smooth", &["0"], "no smoothing"),
    ("lab", "smooth", &["0"], "no moving average"),
    (
        "generate",
        "seed",
        &[BIG, "0"],
        "any u64 seeds the sampling",
    ),
    (
        "generate",
        "top-k",
        &[BIG, "0"],
        "0 = off; above the vocabulary keeps every token",
    ),
    ("generate", "min-new-tokens", &["0"], "no minimum"),
    (
        "generate",
        "max-batch-rows",
        &[BIG, "0"],
        "a cap on rows per forward pass (0 = all)",
    ),
    ("generate", "temperature", &["0"], "greedy"),
    (
        "reward",
        "numbers",
        &[BIG, "-1", "0"],
        "any integer of a countdown problem is scored",
    ),
    (
        "reward",
        "target",
        &[BIG, "-1", "0"],
        "any integer of a countdown problem is scored",
    ),
    (
        "quickstart",
        "seed",
        &[BIG, "0"],
        "any u64 seeds the quickstart",
    ),
    (
        "bench sample",
        "seed",
        &[BIG, "0"],
        "any u64 seeds the weights' inputs",
    ),
    ("bench train", "seed", &[BIG, "0"], "any u64 seeds the data"),
    (
        "bench turns",
        "seed",
        &[BIG, "0"],
        "any u64 seeds the prompts and bridges",
    ),
];

/// Whether clap parses values of `arg` as a number.
fn is_numeric(arg: &clap::Arg) -> bool {
    use std::any::TypeId;
    let t = arg.get_value_parser().type_id();
    [
        TypeId::of::<u8>(),
        TypeId::of::<u16>(),
        TypeId::of::<u32>(),
        TypeId::of::<u64>(),
        TypeId::of::<usize>(),
        TypeId::of::<i32>(),
        TypeId::of::<i64>(),
        TypeId::of::<f32>(),
        TypeId::of::<f64>(),
    ]
    .iter()
    .any(|id| t == *id)
}

/// Every subcommand (`bench sample` for nested ones) with its numeric flags (long names, or the
/// letter of a flag that has only a short one: `n` for `generate -n`).
fn numeric_flags() -> Vec<(String, Vec<String>)> {
    fn walk(c: &clap::Command, prefix: &str, out: &mut Vec<(String, Vec<String>)>) {
        for sub in c.get_subcommands() {
            let name = format!("{prefix} {}", sub.get_name()).trim().to_string();
            let flags: Vec<String> = sub
                .get_arguments()
                .filter(|a| is_numeric(a))
                .map(|a| match (a.get_long(), a.get_short()) {
                    (Some(l), _) => l.to_string(),
                    (None, Some(c)) => c.to_string(),
                    (None, None) => {
                        panic!("{name}: a positional numeric argument: extend this test")
                    }
                })
                .collect();
            if !flags.is_empty() {
                out.push((name.clone(), flags));
            }
            walk(sub, &name, out);
        }
    }
    let mut out = Vec::new();
    walk(&rlvr::Cli::command(), "", &mut out);
    out
}

/// The files the subcommands read: a tiny model, its tokenizer, SFT pairs, a config for `plan`
/// and a run directory with metrics for `plot`.
struct Inputs {
    dir: PathBuf,
    model: PathBuf,
    tokenizer: PathBuf,
    pairs: PathBuf,
    config: PathBuf,
    run: PathBuf,
}

fn inputs(dir: &Path) -> Inputs {
    let tokenizer = dir.join("tokenizer.json");
    std::fs::write(&tokenizer, tokenizer_json()).unwrap();
    let model = dir.join("model");
    let out = rlvr()
        .args([
            "init",
            "--hidden",
            "16",
            "--layers",
            "1",
            "--heads",
            "2",
            "--kv-heads",
            "1",
        ])
        .args([
            "--intermediate",
            "32",
            "--max-position-embeddings",
            "64",
            "--tokenizer",
        ])
        .arg(&tokenizer)
        .arg("--out")
        .arg(&model)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let pairs = dir.join("pairs.jsonl");
    std::fs::write(
        &pairs,
        "{\"prompt\": \"1+1=\", \"completion\": \"2\"}\n{\"prompt\": \"2+2=\", \"completion\": \"4\"}\n",
    )
    .unwrap();
    let config = dir.join("plan.toml");
    std::fs::write(
        &config,
        format!(
            "[model]\npath = \"{}\"\n[data]\ntask = \"arithmetic\"\n",
            model.display()
        ),
    )
    .unwrap();
    let run = dir.join("run");
    std::fs::create_dir_all(&run).unwrap();
    std::fs::write(
        run.join("metrics.jsonl"),
        "{\"step\": 1, \"reward/mean\": 0.5}\n{\"step\": 2, \"reward/mean\": 0.7}\n",
    )
    .unwrap();
    Inputs {
        dir: dir.to_path_buf(),
        model,
        tokenizer,
        pairs,
        config,
        run,
    }
}

/// A command line of `sub` that runs quickly when every value is ordinary, its output going to
/// the fresh path `out`.
fn base_args(sub: &str, i: &Inputs, out: &Path) -> Vec<String> {
    let p = |p: &Path| p.display().to_string();
    let v = |a: &[&str]| a.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    let mut a = v(&sub.split(' ').collect::<Vec<_>>());
    match sub {
        "init" => {
            a.extend(v(&[
                "--hidden",
                "16",
                "--layers",
                "1",
                "--heads",
                "2",
                "--kv-heads",
                "1",
            ]));
            a.extend(v(&[
                "--intermediate",
                "32",
                "--max-position-embeddings",
                "64",
            ]));
            a.extend([
                "--tokenizer".into(),
                p(&i.tokenizer),
                "--out".into(),
                p(out),
            ]);
        }
        "logprobs" => {
            a.extend(["--model".into(), p(&i.model)]);
            a.extend(v(&["--prompt", "1+1=", "--completion", "2"]));
        }
        "sft" => {
            a.extend(["--model".into(), p(&i.model), "--data".into(), p(&i.pairs)]);
            a.extend(["--out".into(), p(out), "--no-progress".into()]);
            a.extend(v(&[
                "--steps",
                "1",
                "--batch-size",
                "2",
                "--micro-batch-size",
                "2",
            ]));
        }
        "eval" => {
            a.extend(["--model".into(), p(&i.model)]);
            a.extend(v(&[
                "--task",
                "arithmetic",
                "--limit",
                "2",
                "--max-new-tokens",
                "2",
            ]));
        }
        "plan" => a.extend(["--config".into(), p(&i.config)]),
        "plot" => {
            a.extend([p(&i.run), "--metric".into(), "reward/mean".into()]);
            a.extend(["--out".into(), format!("{}.svg", p(out))]);
        }
        "generate" => {
            a.extend(["--model".into(), p(&i.model)]);
            a.extend(v(&["--prompt", "1+1=", "--max-new-tokens", "2"]));
        }
        "reward" => a.extend(v(&["--task", "countdown", "--completion", "1+2"])),
        "quickstart" => a.extend(["--out".into(), p(out)]),
        "lab" => a.extend(["--dry-run".into(), "--out".into(), p(out)]),
        "bench sample" => {
            a.extend(["--model".into(), p(&i.model)]);
            a.extend(v(&[
                "--batch",
                "1",
                "--prompt-len",
                "4",
                "--new-tokens",
                "2",
                "--runs",
                "1",
            ]));
        }
        "bench turns" => {
            a.extend(["--model".into(), p(&i.model)]);
            a.extend(v(&[
                "--batch",
                "1",
                "--prompt-len",
                "4",
                "--turns",
                "2",
                "--new-tokens",
                "2",
                "--bridge-len",
                "1",
                "--runs",
                "1",
            ]));
        }
        "bench train" => {
            a.extend(["--model".into(), p(&i.model)]);
            a.extend(v(&["--rows", "1", "--seq-len", "4", "--steps", "1"]));
        }
        other => panic!("no base command line for `rlvr {other}`: add one to base_args"),
    }
    a
}

/// `--flag`, or `-n` for a one-letter name.
fn spelled(flag: &str) -> String {
    if flag.len() == 1 {
        format!("-{flag}")
    } else {
        format!("--{flag}")
    }
}

/// `args` with `--flag=value` in place of the base's own `--flag` (and its value).
fn with_flag(mut args: Vec<String>, flag: &str, value: &str) -> Vec<String> {
    let flag = spelled(flag);
    if let Some(k) = args.iter().position(|a| *a == flag) {
        args.drain(k..k + 2);
    }
    args.push(format!("{flag}={value}"));
    args
}

/// Runs `rlvr args` with stdin closed for at most `limit`: (exit code, None on a signal; stderr),
/// or an error when it ran over and was killed.
fn run_limited(args: &[String], limit: Duration) -> Result<(Option<i32>, String), String> {
    let mut child = rlvr()
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = child.stderr.take().unwrap();
    let reader = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = std::io::Read::read_to_string(&mut { stderr }, &mut s);
        s
    });
    let t0 = Instant::now();
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return Ok((status.code(), reader.join().unwrap()));
        }
        if t0.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            return Err(format!(
                "still running after {limit:?}: {}",
                reader.join().unwrap()
            ));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Every extreme value of every numeric flag of every subcommand (found through clap's
/// introspection of `rlvr::Cli`) is refused with an error exit naming the flag, within 20 s and
/// without a panic or an abort, unless [`ACCEPTED_FLAGS`] lists it. A value clap refuses is
/// checked in process (clap's message names the flag); the others run the binary on a tiny
/// model.
#[test]
fn every_numeric_flag_refuses_extreme_values_naming_the_flag() {
    let tmp = tempfile::tempdir().unwrap();
    let inputs = inputs(tmp.path());
    let flags = numeric_flags();
    let subs: Vec<&str> = flags.iter().map(|(s, _)| s.as_str()).collect();
    for want in ["init", "sft", "eval", "generate", "bench sample"] {
        assert!(subs.contains(&want), "{want}: {subs:?}");
    }
    let t0 = Instant::now();
    let (mut failures, mut ran, mut n) = (Vec::new(), 0, 0);
    for (sub, names) in &flags {
        for flag in names {
            for v in EXTREMES {
                n += 1;
                if ACCEPTED_FLAGS
                    .iter()
                    .any(|(s, f, values, _)| s == sub && f == flag && values.contains(v))
                {
                    continue;
                }
                let out = inputs.dir.join(format!("out-{n}"));
                let args = with_flag(base_args(sub, &inputs, &out), flag, v);
                let spelt = spelled(flag);
                let shown = format!("rlvr {sub} {spelt}={v}");
                let mut argv = vec!["rlvr".to_string()];
                argv.extend(args.iter().cloned());
                if let Err(e) = rlvr::Cli::try_parse_from(&argv) {
                    let msg = e.to_string();
                    if !msg.contains(&spelt) {
                        failures.push(format!("{shown}: clap's error does not name it: {msg}"));
                    }
                    continue;
                }
                ran += 1;
                match run_limited(&args, Duration::from_secs(20)) {
                    Err(e) => failures.push(format!("{shown}: {e}")),
                    Ok((Some(0), _)) => failures.push(format!("{shown}: accepted (exit 0)")),
                    Ok((code, err)) => {
                        for bad in ["panicked", "overflow", "abort", "memory allocation"] {
                            if err.contains(bad) {
                                failures.push(format!("{shown}: `{bad}`: {err}"));
                            }
                        }
                        if code.is_none() {
                            failures.push(format!("{shown}: killed by a signal: {err}"));
                        } else if !err.contains(&spelt) {
                            failures.push(format!("{shown}: the error does not name it: {err}"));
                        }
                    }
                }
            }
        }
    }
    println!(
        "{n} flag values, {ran} run through the binary, in {:?}",
        t0.elapsed()
    );
    assert!(
        failures.is_empty(),
        "{} failures:\n{}",
        failures.len(),
        failures.join("\n")
    );
}
