//! `env.verifiers`: environments written with Prime Intellect's `verifiers` (0.3.1's classic API)
//! run unchanged through the adapter the binary carries (`rlvr_env::verifiers`, written out from
//! examples/verifiers_env.py), driven by rlvr's own process client exactly as a run drives it.
//!
//! The environments (tests/verifiers/envs/: `vf-guess`, a `MultiTurnEnv` with user turns, a custom
//! stop condition and a rubric of two weighted reward functions; `vf-adder`, a `ToolEnv`) are
//! written against the real package. CI runs them on the stand-in package in
//! tests/verifiers/standin/ (the real one pulls in transformers, openai, mcp, ...);
//! scripts/check_verifiers_env.py runs the same episodes with verifiers 0.3.1 itself and checks
//! the same values (docs/coming-from-prime-rl.md has its result).

use rlvr_env::bridge::bridge;
use rlvr_env::client::{ProcessEnvironment, ProcessSettings};
use rlvr_env::json::Json;
use rlvr_env::protocol::{FinishEpisode, FinishReason, ResetEpisode, StepEpisode};
use rlvr_env::template::ChatTemplate;
use rlvr_env::tools::{parse_tool_calls, ToolFormat};
use rlvr_env::Environment;
use std::path::{Path, PathBuf};
use std::time::Duration;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/verifiers")
}

/// The carried adapter run by `python3` for verifiers environment `env_id`, with the stand-in
/// package and the test environments on its path (option `paths`), as `env.verifiers` starts it.
fn start(env_id: &str, env_args: Json, log: Option<PathBuf>) -> Result<ProcessEnvironment, String> {
    let command = rlvr_env::verifiers::command("python3").unwrap();
    let paths = Json::Array(vec![
        Json::from(fixtures().join("standin").display().to_string().as_str()),
        Json::from(fixtures().join("envs").display().to_string().as_str()),
    ]);
    let mut s = ProcessSettings::new(command);
    s.timeout = Duration::from_secs(30);
    s.restarts = 0;
    s.options =
        rlvr_env::verifiers::hello_options(Json::object([("paths", paths)]), env_id, env_args);
    s.stderr_log = log;
    ProcessEnvironment::start(s).map_err(|e| e.to_string())
}

fn reset(id: &str, sample: u32, row: Json) -> ResetEpisode {
    ResetEpisode {
        id: id.into(),
        group: id.split(':').next().unwrap().into(),
        sample,
        seed: 5,
        row,
        prompt: None,
    }
}

fn example(i: &str) -> Json {
    Json::object([("example_id", Json::from(i))])
}

fn step(id: &str, turn: u32, text: &str) -> StepEpisode {
    let parsed = parse_tool_calls(ToolFormat::Hermes, text);
    StepEpisode {
        id: id.into(),
        turn,
        text: text.into(),
        tool_calls: parsed.calls,
        tool_call_errors: parsed.errors,
    }
}

fn pairs(msgs: &[rlvr_env::message::Message]) -> Vec<(&str, &str)> {
    msgs.iter()
        .map(|m| (m.role.as_str(), m.content.as_str()))
        .collect()
}

#[test]
fn a_verifiers_multi_turn_environment_runs_unchanged_and_its_rubric_scores_the_episodes() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("env.stderr");
    let mut env = start("vf-guess", Json::object::<&str>([]), Some(log.clone())).unwrap();
    let r = env
        .reset(&[
            reset("0:0", 0, example("0")),
            reset("0:1", 1, example("0")),
            // A row that is the input itself: its question made into the environment's prompt.
            reset(
                "1:0",
                0,
                Json::object([
                    ("question", Json::from("Guess my number from 1 to 10.")),
                    ("reference", Json::from("3")),
                ]),
            ),
            reset("2:0", 0, example("1")),
            reset("3:0", 0, example("1")),
        ])
        .unwrap();
    let prompt = [
        ("system", "Answer with one number."),
        ("user", "Guess my number from 1 to 10."),
    ];
    for (i, id) in ["0:0", "0:1", "1:0"].iter().enumerate() {
        let a = r[i].as_ref().unwrap();
        assert_eq!(pairs(a.messages.as_ref().unwrap()), prompt, "{id}");
        assert_eq!(a.tools, None, "{id}: no tools");
    }
    assert_eq!(
        pairs(r[3].as_ref().unwrap().messages.as_ref().unwrap())[1],
        ("user", "Guess my number from 1 to 10 again.")
    );

    // Turn 1: too low (a user turn), right (1 + 0.5 x 1), right on the row's input, too high.
    let out = env
        .step(&[
            step("0:0", 1, "5"),
            step("0:1", 1, "7"),
            step("1:0", 1, "I guess 3."),
            step("2:0", 1, "9"),
        ])
        .unwrap();
    let s = out[0].as_ref().unwrap();
    assert_eq!(
        (pairs(&s.messages), s.done),
        (vec![("user", "Higher.")], false)
    );
    assert_eq!(s.reward, None);
    let s = out[1].as_ref().unwrap();
    assert_eq!((s.done, s.reward, s.messages.len()), (true, Some(1.5), 0));
    // Each reward function's score (the rubric's two and MultiTurnEnv's num_turns metric) and
    // the weighted reward, as the episode's metrics.
    let metrics = |m: &rlvr_env::protocol::Metrics| -> Vec<(String, f64)> {
        m.iter().map(|(k, v)| (k.clone(), *v)).collect()
    };
    let want = |v: [(&str, f64); 4]| -> Vec<(String, f64)> {
        v.iter().map(|(k, x)| (k.to_string(), *x)).collect()
    };
    assert_eq!(
        metrics(&s.metrics),
        want([
            ("correct", 1.0),
            ("num_turns", 1.0),
            ("quick", 1.0),
            ("reward", 1.5)
        ])
    );
    // A reply that does not end the episode carries none.
    assert!(out[0].as_ref().unwrap().metrics.is_empty());
    let s = out[2].as_ref().unwrap();
    assert_eq!((s.done, s.reward), (true, Some(1.5)));
    assert_eq!(
        pairs(&out[3].as_ref().unwrap().messages),
        [("user", "Lower.")]
    );

    // Turn 2: right after one hint: correct 1 + 0.5 x quick 1/2.
    let out = env.step(&[step("0:0", 2, "Then 7.")]).unwrap();
    let s = out[0].as_ref().unwrap();
    assert_eq!((s.done, s.reward), (true, Some(1.25)));
    assert_eq!(
        metrics(&s.metrics),
        want([
            ("correct", 1.0),
            ("num_turns", 2.0),
            ("quick", 0.5),
            ("reward", 1.25)
        ])
    );

    // rlvr ends 2:0 (max_turns): the rollout ends as one whose context ran out, scored:
    // correct 0 + 0.5 x quick 1; 3:0 is closed unscored.
    let fin = env
        .finish(&[
            FinishEpisode {
                id: "2:0".into(),
                reason: FinishReason::MaxTurns,
            },
            FinishEpisode {
                id: "3:0".into(),
                reason: FinishReason::Error,
            },
        ])
        .unwrap();
    assert_eq!(fin[0].as_ref().unwrap().reward, Some(0.5));
    assert_eq!(
        metrics(&fin[0].as_ref().unwrap().metrics),
        want([
            ("correct", 0.0),
            ("num_turns", 1.0),
            ("quick", 1.0),
            ("reward", 0.5)
        ])
    );
    drop(env);
    // The same scores in the environment's log too.
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(
        text.contains(
            "[verifiers] episode 0:0 reward 1.25 metrics \
             {\"correct\": 1.0, \"num_turns\": 2.0, \"quick\": 0.5}"
        ),
        "{text}"
    );
    assert!(
        text.contains("[verifiers] episode 2:0 reward 0.5 metrics"),
        "{text}"
    );
}

#[test]
fn a_verifiers_tool_environment_answers_rlvrs_parsed_tool_calls() {
    let mut env = start("vf-adder", Json::object::<&str>([]), None).unwrap();
    let r = env.reset(&[reset("0:0", 0, example("0"))]).unwrap();
    let a = r[0].as_ref().unwrap();
    assert_eq!(
        pairs(a.messages.as_ref().unwrap()),
        [
            ("system", "Use the tools."),
            ("user", "What is 17 + 25? Use the add tool.")
        ]
    );
    let tools = a.tools.as_ref().unwrap();
    assert_eq!(tools.len(), 1);
    assert_eq!(
        tools[0].to_compact(),
        "{\"type\":\"function\",\"function\":{\"name\":\"add\",\"description\":\"Add two \
         integers.\",\"parameters\":{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\
         \"integer\"},\"b\":{\"type\":\"integer\"}},\"required\":[\"a\",\"b\"]}}}"
    );

    // A Qwen-style turn whose Hermes call rlvr parses: the tool's result answers call_0.
    let turn1 =
        "<tool_call>\n{\"name\": \"add\", \"arguments\": {\"a\": 17, \"b\": 25}}\n</tool_call>";
    let out = env.step(&[step("0:0", 1, turn1)]).unwrap();
    let s = out[0].as_ref().unwrap();
    assert!(!s.done);
    assert_eq!(pairs(&s.messages), [("tool", "42")]);
    assert_eq!(s.messages[0].tool_call_id.as_deref(), Some("call_0"));
    // It renders as the official Qwen2.5 template's <tool_response> turn.
    let source = std::fs::read_to_string(root().join("data/chat_templates/qwen2_5.jinja")).unwrap();
    let template = ChatTemplate::new(&source, vec![]).unwrap();
    let tok =
        tokenizers::Tokenizer::from_file(root().join("data/tokenizers/qwen2.5/tokenizer.json"))
            .unwrap();
    let enc = |t: &str| -> Result<Vec<u32>, String> {
        Ok(tok
            .encode(t, false)
            .map_err(|e| e.to_string())?
            .get_ids()
            .to_vec())
    };
    let b = bridge(&template, "<|im_end|>", &s.messages, Some(tools), &enc).unwrap();
    assert_eq!(
        b.text,
        "\n<|im_start|>user\n<tool_response>\n42\n</tool_response><|im_end|>\n\
         <|im_start|>assistant\n"
    );

    // A turn without a tool call ends the rollout (ToolEnv's stop condition); the rubric pays 1.
    let out = env.step(&[step("0:0", 2, "The sum is 42.")]).unwrap();
    let s = out[0].as_ref().unwrap();
    assert_eq!((s.done, s.reward), (true, Some(1.0)));
}

#[test]
fn errors_inside_a_verifiers_environment_name_the_environment_and_the_function() {
    // A reward function that raises: verifiers would log it and score 0; the episode is
    // unscorable instead, named.
    let mut env = start(
        "vf-guess",
        Json::object([("broken_reward", Json::Bool(true))]),
        None,
    )
    .unwrap();
    env.reset(&[reset("0:0", 0, example("0"))]).unwrap();
    let out = env.step(&[step("0:0", 1, "7")]).unwrap();
    let e = out[0].as_ref().unwrap_err();
    assert!(
        e.contains("verifiers environment 'vf-guess'")
            && e.contains("reward function broken")
            && e.contains("division by zero"),
        "{e}"
    );
    drop(env);
    // An exception in the environment's env_response: the episode's error names the function.
    let mut env = start(
        "vf-guess",
        Json::object([("broken_hint", Json::Bool(true))]),
        None,
    )
    .unwrap();
    env.reset(&[reset("0:0", 0, example("0"))]).unwrap();
    let out = env.step(&[step("0:0", 1, "5")]).unwrap();
    let e = out[0].as_ref().unwrap_err();
    assert!(
        e.starts_with(
            "verifiers environment 'vf-guess': the rollout raised ValueError: no hint for 5 in \
             env_response (vf_guess.py:"
        ),
        "{e}"
    );
    // An example the environment's dataset does not have.
    let r = env.reset(&[reset("1:0", 0, example("9"))]).unwrap();
    let e = r[0].as_ref().unwrap_err();
    assert!(
        e.contains("has no example_id 9 in its train dataset"),
        "{e}"
    );
    drop(env);

    // An environment that cannot be loaded stops the run at start-up, named.
    let e = match start("vf-missing", Json::object::<&str>([]), None) {
        Ok(_) => panic!("vf-missing started"),
        Err(e) => e,
    };
    assert!(
        e.contains("verifiers environment 'vf-missing': load_environment failed")
            && e.contains("Could not import 'vf-missing'"),
        "{e}"
    );
}

// ----- verifiers 0.4.0 (`verifiers.v1`) -----
//
// `vf-guess-v1` (tests/verifiers/envs/vf_guess_v1): a v1 taskset whose task scores the trace with
// two weighted `@vf.reward` functions and a `@vf.metric`, played by its own harness, which runs
// its chat loop in-process and calls the model through the interception endpoint. CI runs it on
// the stand-in `verifiers.v1` (tests/verifiers/standin_v1); scripts/check_verifiers_env.py runs
// the same episodes with verifiers 0.4.0 itself and checks the same values.

/// The carried adapter for `vf-guess-v1` on the stand-in v1 package, its harness configured with
/// `harness` (the v1 env config's `agent.harness` fields) and its taskset with `env_args`.
fn start_v1(
    harness: &[(&str, Json)],
    env_args: Json,
    log: Option<PathBuf>,
) -> Result<ProcessEnvironment, String> {
    let command = rlvr_env::verifiers::command("python3").unwrap();
    let paths = Json::Array(vec![
        Json::from(fixtures().join("standin_v1").display().to_string().as_str()),
        Json::from(fixtures().join("envs").display().to_string().as_str()),
    ]);
    let mut fields = vec![("id", Json::from("vf-guess-v1"))];
    fields.extend(harness.iter().cloned());
    let env_config = Json::object([("agent", Json::object([("harness", Json::object(fields))]))]);
    let mut s = ProcessSettings::new(command);
    s.timeout = Duration::from_secs(30);
    s.restarts = 0;
    s.options = rlvr_env::verifiers::hello_options(
        Json::object([("paths", paths), ("env_config", env_config)]),
        "vf-guess-v1",
        env_args,
    );
    s.stderr_log = log;
    ProcessEnvironment::start(s).map_err(|e| e.to_string())
}

fn metric_pairs(m: &rlvr_env::protocol::Metrics) -> Vec<(String, f64)> {
    m.iter().map(|(k, v)| (k.clone(), *v)).collect()
}

fn named(v: &[(&str, f64)]) -> Vec<(String, f64)> {
    v.iter().map(|(k, x)| (k.to_string(), *x)).collect()
}

#[test]
fn a_verifiers_v1_harness_runs_unchanged_each_model_call_a_turn_and_the_tasks_rewards_score_it() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("env.stderr");
    let mut env = start_v1(&[], Json::object::<&str>([]), Some(log.clone())).unwrap();
    let r = env
        .reset(&[
            reset("0:0", 0, example("0")),
            reset("0:1", 1, example("0")),
            // A row that is the task itself: its question the prompt, its reference the answer.
            reset(
                "1:0",
                0,
                Json::object([
                    ("question", Json::from("Guess my number from 1 to 10.")),
                    ("reference", Json::from("3")),
                ]),
            ),
            reset("2:0", 0, example("1")),
            reset("3:0", 0, example("1")),
        ])
        .unwrap();
    // The harness's first model call is the prompt: the task's system prompt and question.
    let prompt = [
        ("system", "Answer with one number."),
        ("user", "Guess my number from 1 to 10."),
    ];
    for (i, id) in ["0:0", "0:1"].iter().enumerate() {
        let a = r[i].as_ref().unwrap();
        assert_eq!(pairs(a.messages.as_ref().unwrap()), prompt, "{id}");
        assert_eq!(a.tools, None, "{id}: no tools");
    }
    assert_eq!(
        pairs(r[2].as_ref().unwrap().messages.as_ref().unwrap()),
        [prompt[1]]
    );
    assert_eq!(
        pairs(r[3].as_ref().unwrap().messages.as_ref().unwrap())[1],
        ("user", "Guess my number from 1 to 10 again.")
    );

    // Turn 1: too low (the harness's user turn), right (correct 1 + 0.5 x quick 1), right on the
    // row's task, too high.
    let out = env
        .step(&[
            step("0:0", 1, "5"),
            step("0:1", 1, "7"),
            step("1:0", 1, "I guess 3."),
            step("2:0", 1, "9"),
        ])
        .unwrap();
    let s = out[0].as_ref().unwrap();
    assert_eq!(
        (pairs(&s.messages), s.done, s.reward),
        (vec![("user", "Higher.")], false, None)
    );
    assert!(s.metrics.is_empty());
    let s = out[1].as_ref().unwrap();
    assert_eq!((s.done, s.reward, s.messages.len()), (true, Some(1.5), 0));
    // Each reward's score, the metric and the weighted reward, as the episode's metrics.
    assert_eq!(
        metric_pairs(&s.metrics),
        named(&[
            ("correct", 1.0),
            ("guesses", 1.0),
            ("quick", 1.0),
            ("reward", 1.5)
        ])
    );
    assert_eq!(out[2].as_ref().unwrap().reward, Some(1.5));
    assert_eq!(
        pairs(&out[3].as_ref().unwrap().messages),
        [("user", "Lower.")]
    );

    // Turn 2: right after one hint: correct 1 + 0.5 x quick 1/2.
    let out = env.step(&[step("0:0", 2, "Then 7.")]).unwrap();
    let s = out[0].as_ref().unwrap();
    assert_eq!((s.done, s.reward), (true, Some(1.25)));
    assert_eq!(
        metric_pairs(&s.metrics),
        named(&[
            ("correct", 1.0),
            ("guesses", 2.0),
            ("quick", 0.5),
            ("reward", 1.25)
        ])
    );

    // rlvr ends 2:0 (max_turns): its trace stops, the waiting call is refused, the harness ends
    // and the task scores the one guess: correct 0 + 0.5 x quick 1. 3:0 is closed unscored.
    let fin = env
        .finish(&[
            FinishEpisode {
                id: "2:0".into(),
                reason: FinishReason::MaxTurns,
            },
            FinishEpisode {
                id: "3:0".into(),
                reason: FinishReason::Error,
            },
        ])
        .unwrap();
    assert_eq!(fin[0].as_ref().unwrap().reward, Some(0.5));
    assert_eq!(
        metric_pairs(&fin[0].as_ref().unwrap().metrics),
        named(&[
            ("correct", 0.0),
            ("guesses", 1.0),
            ("quick", 1.0),
            ("reward", 0.5)
        ])
    );
    drop(env);
    let text = std::fs::read_to_string(&log).unwrap();
    for line in [
        "[verifiers] episode 0:0 reward 1.25 metrics \
         {\"correct\": 1.0, \"guesses\": 2.0, \"quick\": 0.5} stop agent_completed",
        "[verifiers] episode 2:0 reward 0.5 metrics \
         {\"correct\": 0.0, \"guesses\": 1.0, \"quick\": 1.0} stop rlvr_max_turns",
        // The harness's temperature is not rlvr's: ignored, said once.
        "request key 'temperature' (0.3) ignored: rlvr's own sampling settings make every turn",
    ] {
        assert!(text.contains(line), "{line}\n{text}");
    }
    assert_eq!(text.matches("ignored").count(), 1, "{text}");
}

#[test]
fn a_verifiers_v1_harness_tools_and_streamed_calls_map_to_rlvrs_turns() {
    for stream in [false, true] {
        let mut env = start_v1(
            &[("tools", Json::Bool(true)), ("stream", Json::Bool(stream))],
            Json::object::<&str>([]),
            None,
        )
        .unwrap();
        let r = env.reset(&[reset("0:0", 0, example("0"))]).unwrap();
        let tools = r[0].as_ref().unwrap().tools.as_ref().unwrap();
        assert_eq!(
            tools[0].to_compact(),
            "{\"type\":\"function\",\"function\":{\"name\":\"add\",\"description\":\"Add two \
             integers.\",\"parameters\":{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\
             \"integer\"},\"b\":{\"type\":\"integer\"}},\"required\":[\"a\",\"b\"]}}}",
            "stream {stream}"
        );
        // rlvr's parsed Hermes call goes to the harness as an OpenAI tool call `call_0`; the
        // harness's tool message answers it.
        let turn1 =
            "<tool_call>\n{\"name\": \"add\", \"arguments\": {\"a\": 3, \"b\": 4}}\n</tool_call>";
        let out = env.step(&[step("0:0", 1, turn1)]).unwrap();
        let s = out[0].as_ref().unwrap();
        assert_eq!(
            (pairs(&s.messages), s.done),
            (vec![("tool", "7")], false),
            "stream {stream}"
        );
        assert_eq!(s.messages[0].tool_call_id.as_deref(), Some("call_0"));
        let out = env.step(&[step("0:0", 2, "7")]).unwrap();
        let s = out[0].as_ref().unwrap();
        // Right on the second reply: correct 1 + 0.5 x quick 1/2.
        assert_eq!((s.done, s.reward), (true, Some(1.25)), "stream {stream}");
    }
}

#[test]
fn a_verifiers_v1_episode_rlvr_cannot_train_on_is_refused_naming_the_environment() {
    // A harness that drops earlier turns from its next call (history rewriting, compaction):
    // not one linear transcript.
    let mut env = start_v1(
        &[("rewrite_history", Json::Bool(true))],
        Json::object::<&str>([]),
        None,
    )
    .unwrap();
    env.reset(&[reset("0:0", 0, example("0"))]).unwrap();
    let out = env.step(&[step("0:0", 1, "5")]).unwrap();
    let e = out[0].as_ref().unwrap_err();
    assert!(
        e.starts_with(
            "verifiers environment 'vf-guess-v1': the model call of turn 2 does not extend the \
             transcript so far (3 messages, the last the model's turn)"
        ) && e.ends_with("rlvr's episodes are one linear transcript"),
        "{e}"
    );
    drop(env);

    // A reward function that raises (the taskset's config from env_args): the episode is
    // unscorable, the function named.
    let mut env = start_v1(
        &[],
        Json::object([("broken_reward", Json::Bool(true))]),
        None,
    )
    .unwrap();
    env.reset(&[reset("0:0", 0, example("0"))]).unwrap();
    let out = env.step(&[step("0:0", 1, "7")]).unwrap();
    let e = out[0].as_ref().unwrap_err();
    assert!(
        e.starts_with(
            "verifiers environment 'vf-guess-v1': the episode failed: TaskError: task GuessTask \
             scoring: ZeroDivisionError: float division by zero in correct (__init__.py:"
        ),
        "{e}"
    );
    let r = env.reset(&[reset("1:0", 0, example("9"))]).unwrap();
    let e = r[0].as_ref().unwrap_err();
    assert!(
        e.contains("has no task at idx 9 (its taskset has 2)"),
        "{e}"
    );
    drop(env);

    // A harness option its config does not have stops the run at start-up, named.
    let e = match start_v1(
        &[("bogus", Json::Bool(true))],
        Json::object::<&str>([]),
        None,
    ) {
        Ok(_) => panic!("started"),
        Err(e) => e,
    };
    assert!(
        e.contains("verifiers environment 'vf-guess-v1': its config is not valid")
            && e.contains("Extra inputs are not permitted"),
        "{e}"
    );
}
