//! A program environment gives the reward, so the data need no verifier (docs/environments.md,
//! "Data without a verifier"): a prompts-only JSONL (`data.task = "jsonl"`, no `data.verifier`,
//! rows without an answer) trains, evaluates (`rlvr eval --env`) and samples (`rlvr generate
//! --env`) with the environment's rewards, the rows' fields reaching `reset` as `row`; the keys
//! that would need a verifier are refused, naming where they were written. Also what `rlvr eval
//! --env` and `rlvr generate --env` share with `train`: `env.max_error_frac`, and the
//! environment's whole stderr in a file named by the error when the environment fails.

use std::path::{Path, PathBuf};

use clap::Parser;
use rlvr_train::cli::{run_eval, run_generate, EvalArgs};
use rlvr_train::config::RawConfig;

use crate::common::tiny_model;

/// An environment that logs every `reset` row and every reward it gives to the file named by
/// its `log` option (one JSON object a line), and writes to stderr. A turn earns 1 when its text
/// holds the row's `want` digit, else 0; every episode ends after its first reply. Options:
/// `fail` answers every `step` and `finish` with an episode error; `die` exits (status 3) at the
/// first of them, after a last word on stderr; `big` answers each `step` with a user message of
/// that many bytes, `big_reset` each `reset`; `die_at_reset` = N exits (status 3) at the N-th
/// `reset` and every later one, counted in the file `log` + `.resets` across restarts.
const WANT_ENV: &str = r#"
import json, sys
opts, rows = {}, {}
def log(x):
    with open(opts["log"], "a") as f:
        f.write(json.dumps(x) + "\n")
for line in sys.stdin:
    req = json.loads(line)
    t = req["type"]
    if t == "hello":
        opts = req["options"]
        print("want_env: hello", file=sys.stderr, flush=True)
        out = {"version": 1}
    elif t == "reset":
        if opts.get("die_at_reset"):
            with open(opts["log"] + ".resets", "a") as f:
                f.write("reset\n")
            with open(opts["log"] + ".resets") as f:
                if len(f.readlines()) >= opts["die_at_reset"]:
                    print("want_env: dying at a reset", file=sys.stderr, flush=True)
                    sys.exit(3)
        for e in req["episodes"]:
            rows[e["id"]] = e["row"]
            log({"reset": e["id"], "row": e["row"]})
        m = None
        if opts.get("big_reset"):
            m = [{"role": "user", "content": "1" * opts["big_reset"]}]
        out = {"episodes": [{"id": e["id"], "messages": m} for e in req["episodes"]]}
    elif opts.get("die"):
        print("want_env: dying at " + t, file=sys.stderr, flush=True)
        sys.exit(3)
    elif opts.get("fail"):
        out = {"episodes": [{"id": e["id"], "error": "no such game"} for e in req["episodes"]]}
    elif t == "step":
        eps = []
        for e in req["episodes"]:
            if opts.get("big"):
                msg = {"role": "user", "content": "1" * opts["big"]}
                eps.append({"id": e["id"], "messages": [msg], "reward": 0.0, "done": False})
                continue
            r = 1.0 if rows[e["id"]]["want"] in e["text"] else 0.0
            log({"reward": e["id"], "value": r})
            eps.append({"id": e["id"], "messages": [], "reward": r, "done": True})
        out = {"episodes": eps}
    else:
        for e in req["episodes"]:
            log({"reward": e["id"], "value": 0.0})
        out = {"episodes": [{"id": e["id"], "reward": 0.0} for e in req["episodes"]]}
    print(json.dumps(out), flush=True)
"#;

use crate::common::TINY_CHAT_TEMPLATE as TEMPLATE;

struct Fixture {
    tmp: tempfile::TempDir,
    model: PathBuf,
    data: PathBuf,
    script: PathBuf,
    template: PathBuf,
}

impl Fixture {
    fn log(&self) -> PathBuf {
        self.tmp.path().join("env.log")
    }

    /// The environment's log lines.
    fn logged(&self) -> Vec<serde_json::Value> {
        std::fs::read_to_string(self.log())
            .unwrap_or_default()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    }

    /// The `--set`s of a prompts-only `jsonl` run with the environment (its options `opts`).
    fn sets(&self, opts: &str) -> Vec<String> {
        vec![
            format!("model.path=\"{}\"", self.model.display()),
            format!("output.dir=\"{}\"", self.tmp.path().join("run").display()),
            "data.task=\"jsonl\"".into(),
            format!("data.train=\"{}\"", self.data.display()),
            "data.question_field=\"prompt\"".into(),
            "data.prompts_per_step=2".into(),
            "rollout.group_size=4".into(),
            "rollout.max_new_tokens=3".into(),
            "train.lr=1e-2".into(),
            format!("env.command=[\"python3\", \"{}\"]", self.script.display()),
            format!("env.chat_template=\"{}\"", self.template.display()),
            "env.max_turns=1".into(),
            format!("env.options={{ log = \"{}\"{opts} }}", self.log().display()),
        ]
    }
}

/// Four prompts with no answer, a number field the environment reads (`want`).
fn fixture() -> Fixture {
    let tmp = tempfile::tempdir().unwrap();
    let model = tiny_model(tmp.path(), 5);
    let data = tmp.path().join("prompts.jsonl");
    std::fs::write(
        &data,
        "{\"prompt\": \"1+2=\", \"want\": 3}\n{\"prompt\": \"2+2=\", \"want\": 4}\n\
         {\"prompt\": \"4+1=\", \"want\": 5}\n{\"prompt\": \"3+3=\", \"want\": 6}\n",
    )
    .unwrap();
    let script = tmp.path().join("want_env.py");
    std::fs::write(&script, WANT_ENV).unwrap();
    let template = tmp.path().join("chat.jinja");
    std::fs::write(&template, TEMPLATE).unwrap();
    Fixture {
        tmp,
        model,
        data,
        script,
        template,
    }
}

fn resolve(sets: &[String]) -> anyhow::Result<rlvr_train::config::ResolvedConfig> {
    RawConfig::load(None, sets)?.resolve()
}

/// Two training steps on the prompts-only file: `reset` gets each row's fields as `row` (the
/// number as its text, the question also as `question`, an empty `reference`), and each step's
/// `reward/mean` is the mean of the rewards the environment logged for that step's episodes.
#[test]
fn a_program_environment_trains_on_prompts_with_no_verifier() {
    let f = fixture();
    let mut sets = f.sets("");
    sets.push("train.steps=2".into());
    let cfg = resolve(&sets).unwrap();
    rlvr_train::run::train(&cfg, &rlvr_train::run::RunOptions::default()).unwrap();
    let logged = f.logged();
    let rows: Vec<&serde_json::Value> = logged.iter().filter_map(|l| l.get("row")).collect();
    assert_eq!(rows.len(), 16, "2 steps x 2 prompts x 4 episodes");
    let prompts = ["1+2=", "2+2=", "4+1=", "3+3="];
    for row in &rows {
        let p = row["prompt"].as_str().unwrap();
        let i = prompts.iter().position(|x| *x == p).unwrap();
        assert_eq!(
            **row,
            serde_json::json!({"question": p, "prompt": p, "want": (i + 3).to_string(), "reference": ""}),
        );
    }
    let rewards: Vec<f64> = logged
        .iter()
        .filter_map(|l| l.get("value").and_then(|v| v.as_f64()))
        .collect();
    assert_eq!(rewards.len(), 16);
    let m =
        rlvr_train::store::metrics::read_metrics(&f.tmp.path().join("run/metrics.jsonl")).unwrap();
    assert_eq!(m.len(), 2);
    for (s, line) in m.iter().enumerate() {
        let want: f64 = rewards[s * 8..(s + 1) * 8].iter().sum::<f64>() / 8.0;
        let got = line["reward/mean"].as_f64().unwrap();
        assert!(
            (got - want).abs() < 1e-12,
            "step {}: {got} vs {want}",
            s + 1
        );
        assert_eq!(line["env/error_frac"].as_f64(), Some(0.0));
    }
    // The run's config.toml keeps the verifier-less data, and the environment's stderr is in
    // the run directory.
    let config = std::fs::read_to_string(f.tmp.path().join("run/config.toml")).unwrap();
    assert!(!config.contains("verifier"), "{config}");
    let stderr = std::fs::read_to_string(f.tmp.path().join("run/env.stderr")).unwrap();
    assert!(stderr.contains("want_env: hello"), "{stderr}");
}

#[derive(Parser)]
struct E {
    #[command(flatten)]
    a: EvalArgs,
}

/// `rlvr eval --env` over the prompts-only file (`--set`s of `f`, `extra`), items to `out`.
fn eval(f: &Fixture, opts: &str, extra: &[&str]) -> anyhow::Result<Vec<serde_json::Value>> {
    let out = f.tmp.path().join("items.jsonl");
    let mut argv: Vec<String> = vec![
        "x".into(),
        "--model".into(),
        f.model.display().to_string(),
        "--data".into(),
        f.data.display().to_string(),
        "--n".into(),
        "4".into(),
        "--out".into(),
        out.display().to_string(),
    ];
    for s in f.sets(opts) {
        argv.extend(["--set".to_string(), s]);
    }
    argv.extend(extra.iter().map(|s| s.to_string()));
    let a = E::try_parse_from(argv)?.a;
    let mut buf = Vec::new();
    run_eval(&a, &mut buf)?;
    let summary: serde_json::Value = serde_json::from_slice(&buf)?;
    assert_eq!(summary["n"], 4);
    Ok(std::fs::read_to_string(&out)?
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect())
}

/// `rlvr eval --env` scores each item with its episode's reward from the environment (no
/// verifier), and writes the environment's whole stderr beside `--out`; without `--env` such a
/// config is refused, naming the fix.
#[test]
fn eval_env_scores_prompts_only_data_by_the_environment() {
    let f = fixture();
    let items = eval(&f, "", &["--env"]).unwrap();
    assert_eq!(items.len(), 16);
    let given: std::collections::HashMap<String, f64> = f
        .logged()
        .iter()
        .filter_map(|l| Some((l["reward"].as_str()?.to_string(), l["value"].as_f64()?)))
        .collect();
    assert_eq!(given.len(), 16);
    for it in &items {
        let id = format!("{}:{}", it["index"], it["sample_index"]);
        assert_eq!(it["reward"].as_f64(), Some(given[&id]), "{id}");
        assert_eq!(it["correct"].as_bool(), Some(given[&id] > 0.0), "{id}");
    }
    let log = std::fs::read_to_string(f.tmp.path().join("items.jsonl.env.stderr")).unwrap();
    assert!(
        log.starts_with("[rlvr: starting `python3 ") && log.contains("want_env: hello\n"),
        "{log}"
    );
    let e = format!("{:#}", eval(&f, "", &[]).unwrap_err());
    assert!(e.contains("add --env"), "{e}");
}

/// `rlvr eval --env`'s summary line says what the episodes did, under training's metric names:
/// `reward/mean` (the environment's rewards, not just whether they were above 0),
/// `env/turns/mean`, `env/error_frac` and `env/finish/*`, each equal to what the `--out` items
/// give; a plain `rlvr eval` keeps its five keys.
#[test]
fn eval_env_summary_has_the_episodes_reward_turns_and_ends() {
    let f = fixture();
    let run = |opts: &str, extra: &[&str]| {
        let out = f.tmp.path().join("items.jsonl");
        let mut argv: Vec<String> = ["x", "--model", &f.model.display().to_string()]
            .map(String::from)
            .to_vec();
        argv.extend(["--data".into(), f.data.display().to_string()]);
        argv.extend(["--n".into(), "4".into(), "--env".into()]);
        argv.extend(["--out".into(), out.display().to_string()]);
        for s in f.sets(opts) {
            argv.extend(["--set".to_string(), s]);
        }
        argv.extend(extra.iter().map(|s| s.to_string()));
        let mut buf = Vec::new();
        run_eval(&E::try_parse_from(argv).unwrap().a, &mut buf).unwrap();
        let summary: serde_json::Value = serde_json::from_slice(&buf).unwrap();
        let items: Vec<serde_json::Value> = std::fs::read_to_string(&out)
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        (summary, items)
    };
    let (sum, items) = run("", &[]);
    assert_eq!(items.len(), 16);
    let rewards: Vec<f64> = items
        .iter()
        .map(|i| i["reward"].as_f64().unwrap())
        .collect();
    let mean = rewards.iter().sum::<f64>() / 16.0;
    assert_eq!(sum["reward/mean"].as_f64(), Some(mean), "{sum}");
    let turns: f64 = items
        .iter()
        .map(|i| i["episode"]["turns"].as_f64().unwrap())
        .sum();
    assert_eq!(sum["env/turns/mean"].as_f64(), Some(turns / 16.0), "{sum}");
    assert_eq!(sum["env/error_frac"].as_f64(), Some(0.0), "{sum}");
    let mut covered = 0.0;
    for end in ["done", "max_turns", "length", "budget", "eos"] {
        let k = items
            .iter()
            .filter(|i| i["episode"]["finish"] == end)
            .count();
        let got = sum[&format!("env/finish/{end}")].as_f64().unwrap();
        assert_eq!(got, k as f64 / 16.0, "{end}: {sum}");
        covered += got;
    }
    assert_eq!(covered, 1.0, "{sum}");
    // Every episode failed (accepted by env.max_error_frac = 1): no reward to average.
    let (sum, _) = run(", fail = true", &["--set", "env.max_error_frac=1"]);
    assert_eq!(sum["env/error_frac"].as_f64(), Some(1.0), "{sum}");
    assert!(sum["reward/mean"].is_null(), "{sum}");
    assert_eq!(sum["env/finish/done"].as_f64(), Some(0.0), "{sum}");
}

/// `env.max_error_frac` holds in `rlvr eval --env` as in training: every episode failed stops
/// the evaluation, naming the key; at 1 the failed episodes score 0 and carry their error.
#[test]
fn eval_env_applies_max_error_frac() {
    let f = fixture();
    let e = format!("{:#}", eval(&f, ", fail = true", &["--env"]).unwrap_err());
    assert!(
        e.contains("16 of 16 episodes failed") && e.contains("env.max_error_frac = 0.5"),
        "{e}"
    );
    let items = eval(
        &f,
        ", fail = true",
        &["--env", "--set", "env.max_error_frac=1"],
    )
    .unwrap();
    assert_eq!(items.len(), 16);
    for it in &items {
        assert_eq!(it["reward"].as_f64(), Some(0.0));
        let err = it["episode"]["error"].as_str().unwrap();
        assert!(err.contains("no such game"), "{err}");
    }
}

/// An environment that dies mid-evaluation (no restarts left) stops `rlvr eval --env` with an
/// error that names the file holding its whole stderr (`--env-log`), which has its last words.
#[test]
fn eval_env_names_the_stderr_log_when_the_environment_dies() {
    let f = fixture();
    let log = f.tmp.path().join("my.env.log");
    let flag = log.display().to_string();
    let e = format!(
        "{:#}",
        eval(
            &f,
            ", die = true",
            &["--env", "--env-log", &flag, "--set", "env.restarts=0"],
        )
        .unwrap_err()
    );
    assert!(e.contains(&flag) && e.contains("exit status: 3"), "{e}");
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(text.contains("want_env: dying at "), "{text}");
    // Without --env there is no environment log to name.
    let e = format!("{:#}", eval(&f, "", &["--env-log", &flag]).unwrap_err());
    assert!(e.contains("required") && e.contains("--env"), "{e}");
}

#[derive(Parser)]
struct G {
    #[command(flatten)]
    a: rlvr_rollout::cli::GenerateArgs,
}

/// `rlvr generate --env` with a prompts-only config: episodes scored by the environment, its
/// stderr in `--env-log`; an environment that dies is reported naming that file.
#[test]
fn generate_env_runs_a_prompts_only_config_and_logs_the_environment() {
    let f = fixture();
    let config = |opts: &str| -> PathBuf {
        let p = f.tmp.path().join("gen.toml");
        let mut text = String::from("[data]\ntask = \"jsonl\"\n\n[env]\n");
        text.push_str(&format!(
            "command = [\"python3\", \"{}\"]\nchat_template = \"{}\"\nmax_turns = 1\n\
             restarts = 0\n\
             options = {{ log = \"{}\"{opts} }}\n",
            f.script.display(),
            f.template.display(),
            f.log().display()
        ));
        std::fs::write(&p, text).unwrap();
        p
    };
    let log = f.tmp.path().join("gen.env.log");
    let run = |config: &Path| -> anyhow::Result<Vec<serde_json::Value>> {
        let a = G::try_parse_from([
            "x",
            "--model",
            f.model.to_str().unwrap(),
            "--prompts",
            f.data.to_str().unwrap(),
            "-n",
            "2",
            "--max-new-tokens",
            "3",
            "--env",
            config.to_str().unwrap(),
            "--env-log",
            log.to_str().unwrap(),
        ])?
        .a;
        let mut buf = Vec::new();
        run_generate(&a, &mut buf)?;
        Ok(String::from_utf8(buf)?
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect())
    };
    let eps = run(&config("")).unwrap();
    assert_eq!(eps.len(), 8);
    let given: std::collections::HashMap<String, f64> = f
        .logged()
        .iter()
        .filter_map(|l| Some((l["reward"].as_str()?.to_string(), l["value"].as_f64()?)))
        .collect();
    for e in &eps {
        let id = format!("{}:{}", e["prompt_index"], e["sample_index"]);
        assert_eq!(e["reward"].as_f64(), Some(given[&id]), "{id}");
    }
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(text.contains("want_env: hello"), "{text}");
    let e = format!("{:#}", run(&config(", die = true")).unwrap_err());
    assert!(e.contains(log.to_str().unwrap()), "{e}");
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(
        text.contains("want_env: dying at ") && !text.contains("want_env: hello\n[rlvr"),
        "the log is this run's alone: {text}"
    );
}

/// The keys that need a verifier are refused in a run whose environment gives the rewards, and
/// `retry` still needs the task's verifier; each error names where the key was written.
#[test]
fn keys_that_need_a_verifier_are_refused_without_one() {
    let f = fixture();
    let refused = |extra: &[&str], want: &str| {
        let mut sets = f.sets("");
        sets.extend(extra.iter().map(|s| s.to_string()));
        let e = format!("{:#}", resolve(&sets).unwrap_err());
        assert!(e.contains(want), "{extra:?}: {e}");
        e
    };
    let e = refused(&["train.eval_every=2"], "train.eval_every = 2");
    assert!(
        e.contains("rlvr eval --env") && e.ends_with("(in --set train.eval_every=2)"),
        "{e}"
    );
    let e = refused(
        &["reward.format={ bonus = 0.1, penalty = 0.0 }"],
        "reward.format",
    );
    assert!(e.contains("(in --set reward.format="), "{e}");
    refused(
        &["reward.components=[{ verifier = { kind = \"math\" } }]"],
        "reward.components",
    );
    refused(&["env.turn_discount=0.5"], "env.turn_discount");
    // The built-in retry environment scores with the verifier: it needs one.
    let mut sets: Vec<String> = f
        .sets("")
        .into_iter()
        .filter(|s| !s.starts_with("env.command") && !s.starts_with("env.options"))
        .collect();
    sets.push("env.builtin=\"retry\"".into());
    let e = format!("{:#}", resolve(&sets).unwrap_err());
    assert!(
        e.contains("env.builtin = \"retry\" scores each turn with the task's verifier"),
        "{e}"
    );
    // No environment at all: the verifier is required, as before.
    let sets: Vec<String> = sets
        .into_iter()
        .filter(|s| !s.starts_with("env."))
        .collect();
    let e = format!("{:#}", resolve(&sets).unwrap_err());
    assert!(e.contains("needs data.verifier"), "{e}");
    // A named answer field is read: a row without it is refused, naming file, line and field.
    let mut sets = f.sets("");
    sets.push("data.answer_field=\"solution\"".into());
    sets.push("train.steps=1".into());
    let cfg = resolve(&sets).unwrap();
    let e = format!(
        "{:#}",
        rlvr_train::run::train(&cfg, &rlvr_train::run::RunOptions::default()).unwrap_err()
    );
    assert!(
        e.contains("prompts.jsonl:1: missing field `solution`"),
        "{e}"
    );
}

/// A reply too long for `env.max_observation_tokens` whatever its tokens (more bytes than that
/// many of the tokenizer's longest tokens, times 4) fails its episode before it is rendered and
/// encoded, naming the bound: 60 000 bytes against 1024 tokens of at most 13 bytes
/// (`<|endoftext|>`), 53 248 bytes. Encoding it only to count its tokens cost ~500 MB per MiB.
#[test]
fn a_reply_longer_than_any_bridge_fails_unrendered() {
    let f = fixture();
    let items = eval(
        &f,
        ", big = 60000",
        &[
            "--env",
            "--set",
            "env.max_turns=2",
            "--set",
            "env.max_error_frac=1",
            "--set",
            "env.max_episode_tokens=40",
            "--max-new-tokens",
            "12",
        ],
    )
    .unwrap();
    let mut stepped = 0;
    for it in &items {
        // Episodes cut by the token limit at turn 1 get no step, and so no reply to refuse.
        if it["episode"]["finish"] == "length" {
            continue;
        }
        stepped += 1;
        let err = it["episode"]["error"].as_str().unwrap();
        assert_eq!(
            err,
            "step 1: the reply's messages hold 60000 bytes, more than env.max_observation_tokens \
             = 1024 tokens can render (53248 bytes at most)"
        );
    }
    assert!(
        stepped > 0,
        "no turn ended on the end-of-turn token: {items:?}"
    );
}

/// `reset` messages longer than any prompt the model can hold (more bytes than its 128 positions
/// of at most 13-byte tokens, times 4) stop the evaluation before they are rendered and encoded,
/// naming the bound, as a prompt past the positions does once encoded.
#[test]
fn reset_messages_longer_than_the_model_stop_unrendered() {
    let f = fixture();
    let e = format!(
        "{:#}",
        eval(&f, ", big_reset = 10000", &["--env"]).unwrap_err()
    );
    assert!(
        e.contains(
            "group 0: the environment's reset messages hold 10000 bytes, more than the model's \
             max_position_embeddings = 128 tokens can hold (6656 bytes at most)"
        ),
        "{e}"
    );
}

/// `rlvr eval --env` whose environment dies partway (at its second `reset`: problems 2 and 3,
/// the evaluation running two problems of four samples at a time) writes the items of the
/// problems evaluated before, atomically, to `--out`, and the error says where and how many
/// (it wrote nothing: the whole evaluation was lost).
#[test]
fn eval_env_failing_partway_keeps_what_was_evaluated() {
    let f = fixture();
    let out = f.tmp.path().join("items.jsonl");
    let e = format!(
        "{:#}",
        eval(
            &f,
            ", die_at_reset = 2",
            &[
                "--env",
                "--set",
                "rollout.max_batch_rows=8",
                "--set",
                "env.restarts=0"
            ],
        )
        .unwrap_err()
    );
    assert!(
        e.contains(&format!(
            "the evaluation failed after 2 of 4 problems: their 8 items are in {}",
            out.display()
        )) && e.contains("evaluating the episodes of problems 2..4"),
        "{e}"
    );
    let items: Vec<serde_json::Value> = std::fs::read_to_string(&out)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(items.len(), 8);
    assert!(items.iter().all(|it| it["partial"] == true), "{items:?}");
    let mut seen: Vec<(u64, u64)> = items
        .iter()
        .map(|it| {
            (
                it["index"].as_u64().unwrap(),
                it["sample_index"].as_u64().unwrap(),
            )
        })
        .collect();
    seen.sort();
    let want: Vec<(u64, u64)> = (0..2).flat_map(|i| (0..4).map(move |j| (i, j))).collect();
    assert_eq!(seen, want);
    // The items are the environment's rewards, as a whole evaluation's would be.
    let given: std::collections::HashMap<String, f64> = f
        .logged()
        .iter()
        .filter_map(|l| Some((l["reward"].as_str()?.to_string(), l["value"].as_f64()?)))
        .collect();
    for it in &items {
        let id = format!("{}:{}", it["index"], it["sample_index"]);
        assert_eq!(it["reward"].as_f64(), Some(given[&id]), "{id}");
    }
    assert!(!std::fs::read_dir(f.tmp.path()).unwrap().any(|e| e
        .unwrap()
        .file_name()
        .to_string_lossy()
        .contains(".tmp-")));
}
