//! Fail fast (issue 48, item 4): every check that needs no weights runs before the weights load.
//! Each test removes the model's `model.safetensors`, so the weights cannot load: a run whose data,
//! prompts, reward program or environment is broken must report that problem (file, line, field,
//! key), not the missing weights; a run with nothing broken reaches the weights and reports them
//! (the control). The environment is sent `hello` and nothing else (never `reset`).

use std::path::{Path, PathBuf};

use rlvr_train::config::RawConfig;
use rlvr_train::run::{train, RunOptions};

use crate::common::tiny_model;

/// The char model's chat template (as tests/it/episodes.rs): `role:content<|endoftext|>` per
/// message, `=>` as the generation prompt.
const TEMPLATE: &str = "{% for m in messages %}{{ m.role }}:{{ m.content }}<|endoftext|>\n\
                        {% endfor %}{% if add_generation_prompt %}=>{% endif %}";

struct Fixture {
    _tmp: tempfile::TempDir,
    dir: PathBuf,
    model: PathBuf,
}

/// The tiny char model without its weights, and good train and test files (`1+2` → `3`).
fn fixture() -> Fixture {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().to_path_buf();
    let model = tiny_model(&dir, 1);
    std::fs::remove_file(model.join("model.safetensors")).unwrap();
    let rows: String = (0..8)
        .map(|i| format!("{{\"question\": \"{i}+1\", \"answer\": \"{}\"}}\n", i + 1))
        .collect();
    std::fs::write(dir.join("train.jsonl"), &rows).unwrap();
    std::fs::write(dir.join("test.jsonl"), &rows).unwrap();
    Fixture {
        _tmp: tmp,
        dir,
        model,
    }
}

/// `rlvr train` on the fixture with `extra` sets; its error, with every context.
fn error(f: &Fixture, extra: &[String]) -> String {
    let mut sets = vec![
        format!("model.path=\"{}\"", f.model.display()),
        format!("output.dir=\"{}\"", f.dir.join("run").display()),
        "data.task=\"arithmetic\"".to_string(),
        format!("data.train=\"{}\"", f.dir.join("train.jsonl").display()),
        format!("data.test=\"{}\"", f.dir.join("test.jsonl").display()),
        "data.template=\"{question}=\"".into(),
        "data.prompts_per_step=2".into(),
        "rollout.group_size=2".into(),
        "rollout.max_new_tokens=4".into(),
        "train.steps=1".into(),
        "train.eval_every=1".into(),
    ];
    sets.extend(extra.iter().cloned());
    let cfg = RawConfig::load(None, &sets).unwrap().resolve().unwrap();
    format!("{:#}", train(&cfg, &RunOptions::default()).unwrap_err())
}

fn weights_missing(e: &str) -> bool {
    e.contains("model.safetensors") || e.contains("weights")
}

#[test]
fn with_nothing_broken_the_run_reaches_the_weights() {
    let f = fixture();
    let e = error(&f, &[]);
    assert!(weights_missing(&e), "{e}");
}

#[test]
fn a_bad_train_or_test_line_is_reported_before_the_weights_load() {
    let f = fixture();
    std::fs::write(
        f.dir.join("bad.jsonl"),
        "{\"question\": \"1+1\", \"answer\": \"2\"}\n{\"question\": \"1+2\"}\n",
    )
    .unwrap();
    let bad = f.dir.join("bad.jsonl").display().to_string();
    for key in ["data.train", "data.test"] {
        let e = error(&f, &[format!("{key}=\"{bad}\"")]);
        assert!(
            e.contains(&format!("{bad}:2")) && e.contains("missing field `answer`"),
            "{key}: {e}"
        );
        assert!(!weights_missing(&e), "{key}: {e}");
    }
}

#[test]
fn a_prompt_over_the_model_positions_is_reported_before_the_weights_load() {
    let f = fixture();
    // 125 characters + "=" + 4 new tokens > the tiny model's 128 positions.
    let long = "1".repeat(125);
    std::fs::write(
        f.dir.join("long.jsonl"),
        format!(
            "{{\"question\": \"1+1\", \"answer\": \"2\"}}\n{{\"question\": \"{long}\", \"answer\": \"1\"}}\n"
        ),
    )
    .unwrap();
    let long_file = f.dir.join("long.jsonl").display().to_string();
    let e = error(&f, &[format!("data.train=\"{long_file}\"")]);
    assert!(
        e.contains(&format!("{long_file}:2"))
            && e.contains("126 tokens")
            && e.contains("rollout.max_new_tokens"),
        "{e}"
    );
    assert!(!weights_missing(&e), "{e}");
}

#[test]
fn a_crashing_reward_program_is_probed_before_the_weights_load() {
    let f = fixture();
    let e = error(
        &f,
        &[
            "reward.components=[{ name = \"mine\", verifier = { kind = \"external\", command = [\"sh\", \"-c\", \"echo broken >&2; exit 3\"] } }]"
                .into(),
        ],
    );
    assert!(
        e.contains("start-up probe")
            && e.contains("train.jsonl:1")
            && e.contains("`mine`")
            && e.contains("broken"),
        "{e}"
    );
    assert!(!weights_missing(&e), "{e}");
    // Behind a built-in component, the error names the failing component's own key (it said
    // `reward.components[N].verifier`).
    let e = error(
        &f,
        &[
            "reward.components=[{ verifier = { kind = \"arithmetic\" } }, { name = \"mine\", verifier = { kind = \"external\", command = [\"sh\", \"-c\", \"exit 3\"] } }]"
                .into(),
        ],
    );
    assert!(
        e.contains(
            "reward.components[1].verifier: the external reward program failed the start-up probe"
        ) && e.contains("`mine` (#1)"),
        "{e}"
    );
}

/// An environment program that logs every request line to `log` and answers `hello` (and only
/// that: a `reset` would get no reply).
fn env_script(dir: &Path, log: &Path) -> PathBuf {
    let p = dir.join("env.sh");
    std::fs::write(
        &p,
        format!(
            "echo 'env.sh: up, waiting for hello' >&2\n\
             while IFS= read -r line; do\n  printf '%s\\n' \"$line\" >> '{}'\n  \
             case \"$line\" in *'\"hello\"'*) echo '{{\"version\":1}}';; esac\ndone\n",
            log.display()
        ),
    )
    .unwrap();
    p
}

#[test]
fn the_environment_gets_hello_and_no_reset_before_the_weights_load() {
    let f = fixture();
    let tpl = f.dir.join("chat.jinja");
    std::fs::write(&tpl, TEMPLATE).unwrap();
    let env_sets = |cmd: &str| {
        vec![
            format!("env.command={cmd}"),
            format!("env.chat_template=\"{}\"", tpl.display()),
            "env.max_episode_tokens=8".into(),
            "env.options={ level = 2 }".into(),
        ]
    };
    // An environment that exits at once: its start-up fails before the weights load.
    let e = error(&f, &env_sets("[\"sh\", \"-c\", \"exit 0\"]"));
    assert!(e.contains("env.command"), "{e}");
    assert!(!weights_missing(&e), "{e}");
    // One that answers `hello`: the run goes on to the weights, and the environment saw `hello`
    // with the options, and nothing else.
    let log = f.dir.join("env.log");
    let script = env_script(&f.dir, &log);
    let e = error(
        &f,
        &env_sets(&format!("[\"sh\", \"{}\"]", script.display())),
    );
    assert!(weights_missing(&e), "{e}");
    let seen = std::fs::read_to_string(&log).unwrap();
    let lines: Vec<serde_json::Value> = seen
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 1, "{seen}");
    assert_eq!(lines[0]["type"], "hello");
    assert_eq!(lines[0]["options"]["level"], 2);
    // Its stderr is in RUN_DIR/env.stderr in full, after rlvr's line naming the start, appended
    // to the first attempt's (the stderr reader may still be writing when the run's error
    // returns: wait for it, bounded).
    let want = format!(
        "[rlvr: starting `sh -c exit 0` (start 1)]\n\
         [rlvr: starting `sh {}` (start 1)]\nenv.sh: up, waiting for hello\n",
        script.display()
    );
    let path = f.dir.join("run").join("env.stderr");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    let mut got = String::new();
    while std::time::Instant::now() < deadline {
        got = std::fs::read_to_string(&path).unwrap_or_default();
        if got == want {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    assert_eq!(got, want);
}

/// `kind = "verl"` in a config file: `function` (a file alone: verl's `compute_score`) is relative
/// to the file's directory, the task's name is `data_source` for rows without that column, and a
/// function that raises on the probe item is reported before the weights load, naming it.
#[test]
fn a_verl_reward_function_is_resolved_beside_the_config_and_probed() {
    let f = fixture();
    std::fs::write(
        f.dir.join("my_reward.py"),
        "def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n    \
         raise ValueError(f'source {data_source} truth {ground_truth} extra {extra_info}')\n",
    )
    .unwrap();
    let toml = f.dir.join("run.toml");
    std::fs::write(
        &toml,
        "[data]\nverifier = { kind = \"verl\", function = \"my_reward.py\" }\n",
    )
    .unwrap();
    let sets = vec![
        format!("model.path=\"{}\"", f.model.display()),
        format!("output.dir=\"{}\"", f.dir.join("run").display()),
        "data.task=\"arithmetic\"".to_string(),
        format!("data.train=\"{}\"", f.dir.join("train.jsonl").display()),
        "data.template=\"{question}=\"".into(),
        "rollout.max_new_tokens=4".into(),
    ];
    let cfg = RawConfig::load(Some(&toml), &sets).unwrap();
    let command = cfg.data.verifier.as_ref().unwrap().command().unwrap();
    assert_eq!(command[2], f.dir.join("my_reward.py").display().to_string());
    let cfg = cfg.resolve().unwrap();
    let e = format!("{:#}", train(&cfg, &RunOptions::default()).unwrap_err());
    assert!(
        e.contains("start-up probe")
            && e.contains("compute_score (")
            && e.contains("source arithmetic truth ")
            && e.contains("extra None"),
        "{e}"
    );
    assert!(!weights_missing(&e), "{e}");
}

/// `kind = "python"` in a config file: `function`'s file is relative to the file's directory, and
/// a function that raises on the probe item is reported before the weights load, naming it.
#[test]
fn a_python_reward_function_is_resolved_beside_the_config_and_probed() {
    let f = fixture();
    std::fs::write(
        f.dir.join("my_rewards.py"),
        "def broken(completions, **kwargs):\n    raise ValueError('no answer here')\n",
    )
    .unwrap();
    let toml = f.dir.join("run.toml");
    std::fs::write(
        &toml,
        "[[reward.components]]\nname = \"mine\"\nverifier = { kind = \"python\", function = \"my_rewards.py:broken\" }\n",
    )
    .unwrap();
    let sets = vec![
        format!("model.path=\"{}\"", f.model.display()),
        format!("output.dir=\"{}\"", f.dir.join("run").display()),
        "data.task=\"arithmetic\"".to_string(),
        format!("data.train=\"{}\"", f.dir.join("train.jsonl").display()),
        "data.template=\"{question}=\"".into(),
        "rollout.max_new_tokens=4".into(),
    ];
    let cfg = RawConfig::load(Some(&toml), &sets).unwrap();
    let v = &cfg.reward.components[0].verifier;
    let command = v.command().unwrap();
    assert_eq!(
        command[2],
        format!("{}:broken", f.dir.join("my_rewards.py").display())
    );
    let cfg = cfg.resolve().unwrap();
    let e = format!("{:#}", train(&cfg, &RunOptions::default()).unwrap_err());
    assert!(
        e.contains("start-up probe")
            && e.contains("`mine`")
            && e.contains("broken")
            && e.contains("no answer here"),
        "{e}"
    );
    assert!(!weights_missing(&e), "{e}");
}

/// `env.command` and `env.chat_template` written in a config file, each broken the way a user
/// breaks them: a script named as the program without `./` or an interpreter (a bare name is
/// looked up on PATH), a program path that names no file, a template that is not there. Each is
/// refused before anything starts, naming the key, the path and the file's line.
#[test]
fn a_broken_env_program_or_template_names_the_key_and_line() {
    let f = fixture();
    let conf = f.dir.join("conf");
    std::fs::create_dir_all(&conf).unwrap();
    std::fs::write(conf.join("my_env.py"), "print('never run')\n").unwrap();
    std::fs::write(conf.join("chat.jinja"), TEMPLATE).unwrap();
    let file = conf.join("run.toml");
    let run = |command: &str, template: &str| {
        std::fs::write(
            &file,
            format!(
                "[data]\ntask = \"arithmetic\"\ntemplate = \"{{question}}=\"\n\n[env]\n\
                 max_turns = 2\ncommand = {command}\nchat_template = \"{template}\"\n"
            ),
        )
        .unwrap();
        let sets = vec![
            format!("model.path=\"{}\"", f.model.display()),
            format!("output.dir=\"{}\"", f.dir.join("run").display()),
            format!("data.train=\"{}\"", f.dir.join("train.jsonl").display()),
            "rollout.max_new_tokens=4".to_string(),
            "data.prompts_per_step=2".into(),
            "rollout.group_size=2".into(),
        ];
        let cfg = RawConfig::load(Some(&file), &sets)
            .unwrap()
            .resolve()
            .unwrap();
        format!("{:#}", train(&cfg, &RunOptions::default()).unwrap_err())
    };
    let at = |line: usize| format!("(written in {} line {line})", file.display());
    let err = run("[\"my_env.py\"]", "chat.jinja");
    let want = format!(
        "env.command: the program `my_env.py` is not on PATH {}",
        at(7)
    );
    assert!(err.starts_with(&want), "{err}");
    assert!(
        err.contains("[\"./my_env.py\", ...]") && err.contains("[\"python3\", \"my_env.py\", ...]"),
        "{err}"
    );
    let err = run("[\"./nope.py\"]", "chat.jinja");
    let want = format!(
        "env.command: the program {}: no such file or directory {}",
        conf.join("nope.py").display(),
        at(7)
    );
    assert!(err.starts_with(&want), "{err}");
    let err = run("[\"python3\", \"my_env.py\"]", "chatt.jinja");
    let want = format!(
        "env.chat_template = {}: no such file or directory {}",
        conf.join("chatt.jinja").display(),
        at(8)
    );
    assert!(err.starts_with(&want), "{err}");
    // The program's working directory (env.dir) is not there: named as such, not as a program
    // that "could not start".
    std::fs::write(
        &file,
        "[data]\ntask = \"arithmetic\"\n[env]\ncommand = [\"python3\", \"my_env.py\"]\n\
         dir = \"gone\"\n",
    )
    .unwrap();
    let sets = vec![
        format!("model.path=\"{}\"", f.model.display()),
        format!("output.dir=\"{}\"", f.dir.join("run").display()),
        format!("data.train=\"{}\"", f.dir.join("train.jsonl").display()),
    ];
    let cfg = RawConfig::load(Some(&file), &sets)
        .unwrap()
        .resolve()
        .unwrap();
    let err = format!("{:#}", train(&cfg, &RunOptions::default()).unwrap_err());
    let want = format!(
        "env.dir = {}: no such file or directory {}",
        conf.join("gone").display(),
        at(5)
    );
    assert!(err.starts_with(&want), "{err}");
    // Fixed, the run gets past these checks: the program is started (it never answers hello).
    let err = run("[\"python3\", \"my_env.py\"]", "chat.jinja");
    assert!(!err.starts_with("env."), "{err}");
}

/// A config file copied into another directory without its data: its relative `data.train` now
/// names a file beside the copy. The error names the key, the path it resolved to, the file and
/// line that wrote it and the rule, before anything loads; a missing `data.test` given by `--set`
/// names the `--set`.
#[test]
fn a_missing_input_path_names_its_key_and_where_it_was_written() {
    let f = fixture();
    let copied = f.dir.join("elsewhere");
    std::fs::create_dir_all(&copied).unwrap();
    let file = copied.join("run.toml");
    std::fs::write(
        &file,
        "[data]\ntask = \"arithmetic\"\ntemplate = \"{question}=\"\n\ntrain = \"data/train.jsonl\"\n",
    )
    .unwrap();
    let sets = |test: &Path| {
        vec![
            format!("model.path=\"{}\"", f.model.display()),
            format!("output.dir=\"{}\"", f.dir.join("run").display()),
            format!("data.test=\"{}\"", test.display()),
            "train.eval_every=1".to_string(),
            "rollout.max_new_tokens=4".into(),
            "data.prompts_per_step=2".into(),
            "rollout.group_size=2".into(),
        ]
    };
    let run = |sets: Vec<String>| {
        let cfg = RawConfig::load(Some(&file), &sets)
            .unwrap()
            .resolve()
            .unwrap();
        format!("{:#}", train(&cfg, &RunOptions::default()).unwrap_err())
    };
    let err = run(sets(&f.dir.join("test.jsonl")));
    let want = format!(
        "data.train = {}: no such file or directory (written in {} line 5)",
        copied.join("data/train.jsonl").display(),
        file.display()
    );
    assert!(err.starts_with(&want), "{err}");
    assert!(err.contains("relative to that file's directory"), "{err}");
    // The train file where the copy says; the test file given by --set is missing.
    std::fs::create_dir_all(copied.join("data")).unwrap();
    std::fs::copy(f.dir.join("train.jsonl"), copied.join("data/train.jsonl")).unwrap();
    let missing = f.dir.join("nope.jsonl");
    let err = run(sets(&missing));
    let want = format!(
        "data.test = {}: no such file or directory (written in --set data.test=\"{}\")",
        missing.display(),
        missing.display()
    );
    assert!(err.starts_with(&want), "{err}");
    // A model.path written like a Hub id, in no cache: the hint that rlvr downloads nothing.
    let mut s = sets(&f.dir.join("test.jsonl"));
    s.push("model.path=\"rlvr-test-org/no-such-model-4821\"".into());
    let err = run(s);
    assert!(err.starts_with("model.path = "), "{err}");
    assert!(err.contains("rlvr downloads nothing"), "{err}");
    // With both files there the run gets as far as the weights (removed by the fixture).
    let err = run(sets(&f.dir.join("test.jsonl")));
    assert!(err.contains("model.safetensors"), "{err}");
}

/// A `jsonl` row with an empty answer, scored by a built-in verifier that reads the gold answer
/// from it: refused naming the file, line and field (it would score 0 whatever the model says);
/// the same row with an answer runs as far as the weights.
#[test]
fn an_empty_reference_for_a_builtin_verifier_is_refused() {
    let f = fixture();
    let data = f.dir.join("refs.jsonl");
    std::fs::write(
        &data,
        "{\"question\": \"1+1\", \"answer\": \"2\"}\n{\"question\": \"2+1\", \"answer\": \"3\"}\n\
         {\"question\": \"3+1\", \"answer\": \" \"}\n",
    )
    .unwrap();
    let sets = vec![
        "data.task=\"jsonl\"".to_string(),
        "data.verifier={kind=\"arithmetic\"}".into(),
        format!("data.train=\"{}\"", data.display()),
    ];
    let err = error(&f, &sets);
    assert!(
        err.contains(&format!(
            "[data] Train split: {}:3: field `answer` is empty: the arithmetic verifier",
            data.display()
        )),
        "{err}"
    );
    std::fs::write(
        &data,
        "{\"question\": \"1+1\", \"answer\": \"2\"}\n{\"question\": \"3+1\", \"answer\": \"4\"}\n",
    )
    .unwrap();
    let err = error(&f, &sets);
    assert!(weights_missing(&err), "{err}");
}

/// A gold answer a built-in verifier cannot use is refused before the weights load, in the train
/// and the test split alike, naming file, line, field and verifier: a `gsm8k` or `arithmetic`
/// reference with no number, a blank `math` one, on a `jsonl` task or a built-in task read from a
/// file (`arithmetic`, `math500`); each used to score every completion of its prompt 0, silently.
/// `rlvr eval` refuses the same test rows.
#[test]
fn a_gold_answer_no_verifier_can_use_is_refused_in_either_split() {
    let f = fixture();
    let bad = f.dir.join("bad.jsonl");
    let rows = |last: &str| {
        format!(
            "{{\"question\": \"1+1\", \"answer\": \"2\", \"problem\": \"1+1\"}}\n\
             {{\"question\": \"3+1\", \"answer\": \"{last}\", \"problem\": \"3+1\"}}\n"
        )
    };
    let cases: [(&str, &[&str], &str, &str); 5] = [
        (
            "four",
            &["data.task=\"jsonl\"", "data.verifier={kind=\"gsm8k\"}"],
            "Train",
            "holds no number (\"four\"): the gsm8k verifier",
        ),
        (
            "#",
            &[],
            "Train",
            "holds no number (\"#\"): the arithmetic verifier",
        ),
        (
            "four",
            &["data.task=\"jsonl\"", "data.verifier={kind=\"arithmetic\"}"],
            "Test",
            "holds no number (\"four\"): the arithmetic verifier",
        ),
        (
            " ",
            &["data.task=\"math500\""],
            "Test",
            "is empty: the math verifier",
        ),
        (
            "x",
            &[
                "data.task=\"jsonl\"",
                "data.verifier={kind=\"math\"}",
                "reward.components=[{ name = \"g\", verifier = { kind = \"gsm8k\" } }]",
            ],
            "Test",
            "holds no number (\"x\"): the gsm8k verifier",
        ),
    ];
    let good = f.dir.join("good.jsonl");
    std::fs::write(&good, rows("4")).unwrap();
    let files = |split: &str| {
        let (train, test) = match split {
            "Train" => (&bad, &good),
            _ => (&good, &bad),
        };
        [
            format!("data.train=\"{}\"", train.display()),
            format!("data.test=\"{}\"", test.display()),
        ]
    };
    for (last, sets, split, want) in cases {
        std::fs::write(&bad, rows(last)).unwrap();
        let mut s: Vec<String> = sets.iter().map(|x| x.to_string()).collect();
        s.extend(files(split));
        let err = error(&f, &s);
        assert!(
            err.contains(&format!(
                "[data] {split} split: {}:2: field `answer` {want}",
                bad.display()
            )),
            "{last:?} {sets:?}: {err}"
        );
        assert!(!weights_missing(&err), "{err}");
    }
    // The control: a number (gsm8k, arithmetic) and a word (math) are usable gold answers.
    for (last, sets) in [
        (
            "4",
            &["data.task=\"jsonl\"", "data.verifier={kind=\"gsm8k\"}"][..],
        ),
        ("four", &["data.task=\"math500\""][..]),
    ] {
        std::fs::write(&bad, rows(last)).unwrap();
        let mut s: Vec<String> = sets.iter().map(|x| x.to_string()).collect();
        s.extend(files("Test"));
        let err = error(&f, &s);
        assert!(weights_missing(&err), "{last:?}: {err}");
    }
    // rlvr eval reads the test split the same way (a model with its weights).
    std::fs::write(&bad, rows("four")).unwrap();
    let args = rlvr_train::cli::EvalArgs {
        model: tiny_model(&f.dir.join("whole"), 1),
        task: Some("jsonl".into()),
        data: Some(bad.clone()),
        set: vec!["data.verifier={kind=\"gsm8k\"}".into()],
        ..Default::default()
    };
    let e = format!(
        "{:#}",
        rlvr_train::cli::run_eval(&args, &mut Vec::new()).unwrap_err()
    );
    assert!(
        e.contains(&format!(
            "[data] Test split: {}:2: field `answer` holds no number",
            bad.display()
        )),
        "{e}"
    );
}
