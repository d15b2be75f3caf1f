//! `rlvr eval`: `{"task", "n", "accuracy", "mean@k", "pass@k"}`, per-item `--out`, `--limit`.

use crate::common;

use clap::Parser;
use rlvr_train::cli::{run_eval, EvalArgs};

#[derive(Parser)]
struct W {
    #[command(flatten)]
    a: EvalArgs,
}

fn check_eval(extra: &[&str]) -> (serde_json::Value, Vec<serde_json::Value>) {
    let tmp = tempfile::tempdir().unwrap();
    let model = common::tiny_model(tmp.path(), 7);
    let out = tmp.path().join("items.jsonl");
    let mut argv = vec![
        "x".to_string(),
        "--model".into(),
        model.display().to_string(),
        "--task".into(),
        "arithmetic".into(),
        "--set".into(),
        "data.arithmetic.max_digits=1".into(),
        "--set".into(),
        "data.arithmetic.min_digits=1".into(),
        "--set".into(),
        "data.style=\"plain\"".into(),
        "--set".into(),
        "data.arithmetic.train_size=64".into(),
        "--set".into(),
        "data.arithmetic.test_size=8".into(),
        "--limit".into(),
        "5".into(),
        "--max-new-tokens".into(),
        "3".into(),
        "--out".into(),
        out.display().to_string(),
    ];
    argv.extend(extra.iter().map(|s| s.to_string()));
    let a = W::parse_from(argv).a;
    let mut buf = Vec::new();
    run_eval(&a, &mut buf).unwrap();
    let v: serde_json::Value = serde_json::from_slice(&buf).unwrap();
    let items = std::fs::read_to_string(&out)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    (v, items)
}

#[test]
fn eval_greedy_and_sampled() {
    let (v, items) = check_eval(&[]);
    let keys: Vec<&String> = v.as_object().unwrap().keys().collect();
    assert_eq!(
        keys,
        [
            "accuracy",
            "mean@k",
            "n",
            "pass@k",
            "reward/arithmetic/mean",
            "reward/mean",
            "task"
        ]
    );
    // The task's verifier alone is one component named after the task: its mean is the reward's.
    assert_eq!(v["reward/mean"], v["reward/arithmetic/mean"]);
    assert_eq!(v["task"], "arithmetic");
    assert_eq!(v["n"], 5);
    assert_eq!(items.len(), 5);
    assert_eq!(
        v["accuracy"], v["pass@k"],
        "greedy n = 1: pass@1 = accuracy"
    );
    let (v, items) = check_eval(&["--n", "4"]);
    assert_eq!(items.len(), 20);
    assert!(v["pass@k"].as_f64() >= v["mean@k"].as_f64());
    let correct = items.iter().filter(|i| i["correct"] == true).count() as f64;
    assert!((v["mean@k"].as_f64().unwrap() - correct / 20.0).abs() < 1e-12);
}

/// `rlvr eval` reports the rewards as a training step names them (TRL's `rewards/<fn>/mean`):
/// `reward/mean` and each component's raw `reward/<name>/mean`, in config order; each `--out` item
/// carries its components' raw rewards (`"rewards"`). Two components: the task's verifier and an
/// external one whose raw reward is the completion's length in characters (weight 0.5).
#[test]
fn eval_reports_the_mean_of_each_reward_component() {
    let tmp = tempfile::tempdir().unwrap();
    let script = tmp.path().join("len.sh");
    std::fs::write(
        &script,
        r#"while IFS= read -r line; do
  comp=$(printf '%s' "$line" | sed 's/.*"completion":"\([^"]*\)".*/\1/')
  printf '{"reward":%d}\n' "${#comp}"
done
"#,
    )
    .unwrap();
    let components = format!(
        "reward.components=[{{ name = \"right\", verifier = {{ kind = \"arithmetic\" }} }}, \
         {{ name = \"len\", weight = 0.5, verifier = {{ kind = \"external\", \
         command = [\"sh\", \"{}\"] }} }}]",
        script.display()
    );
    let (v, items) = check_eval(&["--n", "2", "--set", &components]);
    assert_eq!(items.len(), 10);
    let keys: Vec<&str> = items[0]["rewards"]
        .as_object()
        .unwrap()
        .keys()
        .map(String::as_str)
        .collect();
    // (Parsed, the keys come sorted.) `correct` is the first component's judgement.
    assert_eq!(keys, ["len", "right"]);
    let mean = |f: &dyn Fn(&serde_json::Value) -> f64| {
        items.iter().map(f).sum::<f64>() / items.len() as f64
    };
    // The external component's raw reward is each completion's length.
    for it in &items {
        let chars = it["completion"].as_str().unwrap().chars().count() as f64;
        assert_eq!(it["rewards"]["len"].as_f64().unwrap(), chars, "{it}");
        let right = it["rewards"]["right"].as_f64().unwrap();
        assert_eq!(right, f64::from(u8::from(it["correct"] == true)), "{it}");
        assert_eq!(it["reward"].as_f64().unwrap(), 0.5 * chars + right, "{it}");
    }
    let len = mean(&|it| it["rewards"]["len"].as_f64().unwrap());
    assert!(len > 0.0, "the completions are not empty: {items:?}");
    assert_eq!(v["reward/len/mean"].as_f64().unwrap(), len);
    assert_eq!(
        v["reward/right/mean"].as_f64().unwrap(),
        mean(&|it| it["rewards"]["right"].as_f64().unwrap())
    );
    assert_eq!(
        v["reward/mean"].as_f64().unwrap(),
        mean(&|it| it["reward"].as_f64().unwrap())
    );
}

/// Without --device/--dtype, `rlvr eval` takes the config's model.device and model.dtype (a GPU
/// config evaluates on the GPU); the flags override them. On a CPU-only build a config that names
/// cuda:0 fails with the device named, and `--device cpu` makes the same call succeed.
#[cfg(not(feature = "cuda"))]
#[test]
fn eval_takes_device_and_dtype_from_the_config() {
    let tmp = tempfile::tempdir().unwrap();
    let model = common::tiny_model(tmp.path(), 7);
    let argv = |extra: &[&str]| -> EvalArgs {
        let mut v: Vec<String> = [
            "x",
            "--model",
            model.to_str().unwrap(),
            "--task",
            "arithmetic",
            "--set",
            "data.arithmetic.max_digits=1",
            "--set",
            "data.arithmetic.min_digits=1",
            "--set",
            "data.style=\"plain\"",
            "--set",
            "data.arithmetic.train_size=64",
            "--set",
            "data.arithmetic.test_size=4",
            "--set",
            "model.device=\"cuda:0\"",
            "--set",
            "model.dtype=\"bf16\"",
            "--max-new-tokens",
            "2",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        v.extend(extra.iter().map(|s| s.to_string()));
        W::parse_from(v).a
    };
    let err = run_eval(&argv(&[]), &mut Vec::new()).unwrap_err();
    assert!(format!("{err:#}").contains("cuda:0"), "{err:#}");
    let mut buf = Vec::new();
    run_eval(&argv(&["--device", "cpu"]), &mut buf).unwrap();
    let v: serde_json::Value = serde_json::from_slice(&buf).unwrap();
    assert_eq!(v["n"], 4);
    let err = run_eval(
        &argv(&["--device", "cpu", "--dtype", "f8"]),
        &mut Vec::new(),
    )
    .unwrap_err();
    assert!(format!("{err:#}").contains("f8"), "{err:#}");
}

/// `rlvr eval` on a task the tiny random model gets right now and then (every answer is 5: two
/// new tokens with the end-of-turn), 10 problems × 16 samples of at most 4 tokens at temperature
/// 1, with `extra`.
fn eval_five(extra: &[String]) -> (serde_json::Value, Vec<serde_json::Value>) {
    let tmp = tempfile::tempdir().unwrap();
    let model = common::tiny_model(tmp.path(), 3);
    let data = tmp.path().join("five.jsonl");
    let rows: Vec<String> = (0..10)
        .map(|i| {
            serde_json::json!({"question": format!("{}+{}=", i % 10, (i + 3) % 10), "answer": "5"})
                .to_string()
        })
        .collect();
    std::fs::write(&data, rows.join("\n")).unwrap();
    let out = tmp.path().join("items.jsonl");
    let mut argv: Vec<String> = [
        "x",
        "--model",
        model.to_str().unwrap(),
        "--task",
        "jsonl",
        "--data",
        data.to_str().unwrap(),
        "--set",
        "data.verifier={ kind = \"arithmetic\" }",
        "--set",
        "data.style=\"plain\"",
        "--n",
        "16",
        "--max-new-tokens",
        "4",
        "--out",
        out.to_str().unwrap(),
    ]
    .map(String::from)
    .to_vec();
    argv.extend(extra.iter().cloned());
    let a = W::parse_from(argv).a;
    let mut buf = Vec::new();
    run_eval(&a, &mut buf).unwrap();
    let v: serde_json::Value = serde_json::from_slice(&buf).unwrap();
    let items = std::fs::read_to_string(&out)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    (v, items)
}

/// `rlvr eval --env` (issue 45): every sample is an episode of the config's environment. With the
/// built-in `retry` environment, turn 1 of each episode is the single-turn evaluation's sample
/// (same text, token for token: the same draw and seed); one turn scores what the single-turn
/// evaluation scores on turns that ended on the end-of-turn token (a cut turn is `finish`ed and
/// scores 0); a second turn only adds correct episodes; `--out` items carry the episode.
#[test]
fn eval_env_runs_episodes_whose_first_turn_is_the_single_turn_sample() {
    let tmp = tempfile::tempdir().unwrap();
    let tpl = tmp.path().join("chat.jinja");
    std::fs::write(
        &tpl,
        "{% for m in messages %}{{ m.role }}:{{ m.content }}<|endoftext|>\n\
         {% endfor %}{% if add_generation_prompt %}=>{% endif %}",
    )
    .unwrap();
    let tpl = format!("env.chat_template=\"{}\"", tpl.display());
    let env = |turns: &str| -> Vec<String> {
        [
            "--env",
            "--set",
            "env.builtin=\"retry\"",
            "--set",
            turns,
            "--set",
            "env.max_episode_tokens=80",
            "--set",
            &tpl,
        ]
        .map(String::from)
        .to_vec()
    };
    let (single_v, single) = eval_five(&[]);
    let (v1, one) = eval_five(&env("env.max_turns=1"));
    let (v2, two) = eval_five(&env("env.max_turns=2"));
    assert_eq!(v1["n"], single_v["n"]);
    assert_eq!((one.len(), two.len()), (160, 160));
    let (mut cut, mut second) = (0, 0);
    for ((s, a), b) in single.iter().zip(&one).zip(&two) {
        for x in [a, b] {
            assert_eq!(
                (&x["index"], &x["sample_index"]),
                (&s["index"], &s["sample_index"])
            );
            // The dataset's prompt, which `retry` keeps.
            assert_eq!(x["prompt"], s["prompt"]);
            // Turn 1 is the single-turn sample.
            assert_eq!(x["episode"]["transcript"][0]["role"], "assistant");
            assert_eq!(
                x["episode"]["transcript"][0]["content"], s["completion"],
                "{x}"
            );
        }
        assert!(
            s.get("episode").is_none(),
            "single-turn items carry no episode"
        );
        assert_eq!(a["episode"]["turns"], 1);
        match a["episode"]["finish"].as_str().unwrap() {
            "length" => {
                cut += 1;
                assert_eq!(a["correct"], false);
            }
            "done" | "max_turns" => assert_eq!(a["correct"], s["correct"], "{a} vs {s}"),
            other => panic!("finish {other}: {a}"),
        }
        if a["correct"] == true {
            assert_eq!(
                b["correct"], true,
                "a second turn cannot undo the first: {b}"
            );
        }
        let t = b["episode"]["turns"].as_u64().unwrap();
        assert!((1..=2).contains(&t), "{b}");
        if t == 2 {
            second += 1;
            let tr = b["episode"]["transcript"].as_array().unwrap();
            assert_eq!(tr[1]["role"], "user");
            assert_eq!(tr[1]["content"], "That is not correct. Please try again.");
        }
    }
    eprintln!(
        "eval --env: {cut}/160 first turns cut, {second}/160 second turns; accuracy {} single-turn, \
         {} one turn, {} two turns",
        single_v["accuracy"], v1["accuracy"], v2["accuracy"]
    );
    assert!(second > 0, "no episode took a second turn");
    assert!(cut < 160, "every first turn was cut: nothing compared");
    let right = |items: &[serde_json::Value]| items.iter().filter(|i| i["correct"] == true).count();
    assert!(
        right(&one) > 0,
        "no episode right at turn 1: the comparison is empty"
    );
    assert!(
        right(&two) > right(&one),
        "the second turn added no correct episode"
    );
    assert!(v2["accuracy"].as_f64() >= v1["accuracy"].as_f64());
    // Without [env], --env names what is missing.
    let err = std::panic::catch_unwind(|| eval_five(&["--env".to_string()])).unwrap_err();
    let msg = err.downcast_ref::<String>().cloned().unwrap_or_default();
    assert!(msg.contains("--env: no environment"), "{msg}");
}

/// An environment that replaces every prompt at `reset` with the question reversed ("3+0=" for
/// "0+3=") and ends each episode after one turn.
const REVERSE_ENV: &str = r#"
import json, sys
for line in sys.stdin:
    req = json.loads(line)
    t = req["type"]
    if t == "hello":
        out = {"version": 1}
    elif t == "reset":
        out = {"episodes": [{"id": e["id"], "tools": None, "messages": [{"role": "user",
                "content": e["row"]["question"][-2::-1] + "="}]} for e in req["episodes"]]}
    elif t == "step":
        out = {"episodes": [{"id": e["id"], "reward": 0.0, "done": True, "messages": []}
               for e in req["episodes"]]}
    else:
        out = {"episodes": [{"id": e["id"]} for e in req["episodes"]]}
    print(json.dumps(out), flush=True)
"#;

/// `rlvr eval --env` items name the prompt each episode started from: an environment whose
/// `reset` messages replace the dataset's prompt shows the replacement, rendered by the chat
/// template, not the dataset's text.
#[test]
fn eval_env_items_show_the_prompt_the_environment_replaced() {
    let tmp = tempfile::tempdir().unwrap();
    let script = tmp.path().join("reverse_env.py");
    std::fs::write(&script, REVERSE_ENV).unwrap();
    let tpl = tmp.path().join("chat.jinja");
    std::fs::write(&tpl, common::TINY_CHAT_TEMPLATE).unwrap();
    let extra: Vec<String> = [
        "--env".to_string(),
        "--set".into(),
        format!("env.command=[\"python3\", \"{}\"]", script.display()),
        "--set".into(),
        format!("env.chat_template=\"{}\"", tpl.display()),
        "--set".into(),
        "env.max_episode_tokens=16".into(),
    ]
    .to_vec();
    let (_, single) = eval_five(&[]);
    let (_, items) = eval_five(&extra);
    assert_eq!(items.len(), 160);
    for (s, x) in single.iter().zip(&items) {
        assert_eq!(x["index"], s["index"]);
        let i = x["index"].as_u64().unwrap();
        let question = format!("{}+{}=", i % 10, (i + 3) % 10);
        assert_eq!(
            s["prompt"],
            format!("<|im_start|>user\n{question}<|im_end|>\n<|im_start|>assistant\n"),
            "the single-turn item shows the dataset's prompt, rendered"
        );
        let reversed = format!("{}+{}=", (i + 3) % 10, i % 10);
        assert_eq!(
            x["prompt"],
            format!("{reversed}<|endoftext|>\n="),
            "the episode's item shows the prompt it started from"
        );
    }
}

/// A stateful environment for `rlvr eval --env`'s metrics: `reset` opens a per-episode record,
/// the first `step` request kills the program (once: `marker`), so the restarted one needs the
/// live episodes replayed (an episode it has no record of gets an error); turn 1's reply is 60
/// digits (cut to fit by `env.observation_truncation`) with reward 0.25, turn 2's ends the
/// episode with reward 1 and the metrics `turn` and `sample` (the episode's index in its group);
/// `finish` rewards 0.5 with the metrics `finished` and `sample`.
const COUNTING_ENV: &str = r#"
import json, os, sys
marker = sys.argv[1]
state = {}
for line in sys.stdin:
    req = json.loads(line)
    t = req["type"]
    if t == "hello":
        out = {"version": 1}
    elif t == "reset":
        for e in req["episodes"]:
            state[e["id"]] = 0
        out = {"episodes": [{"id": e["id"], "messages": None} for e in req["episodes"]]}
    elif t == "step":
        if not os.path.exists(marker):
            open(marker, "w").close(); os._exit(3)
        eps = []
        for e in req["episodes"]:
            if e["id"] not in state:
                eps.append({"id": e["id"], "error": "unknown episode"}); continue
            done = e["turn"] >= 2
            r = {"id": e["id"], "messages": [{"role": "user", "content": "0123456789" * 6}],
                 "reward": 1.0 if done else 0.25, "done": done}
            if done:
                r["metrics"] = {"turn": e["turn"], "sample": int(e["id"].split(":")[1])}
            eps.append(r)
        out = {"episodes": eps}
    else:
        out = {"episodes": [{"id": e["id"], "reward": 0.5 if state.pop(e["id"], None) is not None
                             else "unknown",
                             "metrics": {"finished": 1, "sample": int(e["id"].split(":")[1])}}
                            for e in req["episodes"]]}
    print(json.dumps(out), flush=True)
"#;

/// `rlvr eval --env` reports what training reports for its episodes, under the same names:
/// `env/restarts`, `env/replayed`, `env/obs_truncated`, `env/turns/{min,max}`,
/// `env/episode_len/mean`, `env/tool_calls` and per turn `env/turn_k/{reached,tokens/mean,
/// reward/mean}`, and each item carries its turn structure (`segments`). Checked against values
/// worked out from the items and the environment's script: one restart, every one of the 160
/// episodes replayed once (each was live at the death: stepped or finished after it), one cut
/// observation per episode that reached turn 2; each item's metrics are its last reply's, and
/// `env/metrics/<name>/mean` their means over the items carrying each name (the restart's
/// replay counts nothing twice).
#[test]
fn eval_env_reports_trainings_env_metrics_and_each_episodes_turns() {
    let tmp = tempfile::tempdir().unwrap();
    let script = tmp.path().join("counting_env.py");
    std::fs::write(&script, COUNTING_ENV).unwrap();
    let marker = tmp.path().join("died");
    let tpl = tmp.path().join("chat.jinja");
    std::fs::write(&tpl, common::TINY_CHAT_TEMPLATE).unwrap();
    let extra: Vec<String> = [
        "--env".to_string(),
        "--set".into(),
        format!(
            "env.command=[\"python3\", \"{}\", \"{}\"]",
            script.display(),
            marker.display()
        ),
        "--set".into(),
        format!("env.chat_template=\"{}\"", tpl.display()),
        "--set".into(),
        "env.max_turns=2".into(),
        "--set".into(),
        "env.max_episode_tokens=80".into(),
        // The bridge's template costs 4 tokens ("\n", the end-of-turn, "\n="), the marker 17
        // (one per char): 30 keeps 9 of the 60 digits.
        "--set".into(),
        "env.max_observation_tokens=30".into(),
        "--set".into(),
        "env.observation_truncation=\"keep-head\"".into(),
        // One batch of all 160 episodes: each is live when the program dies.
        "--set".into(),
        "rollout.max_batch_rows=160".into(),
    ]
    .to_vec();
    let (v, items) = eval_five(&extra);
    assert!(marker.exists(), "the program never died: nothing replayed");
    assert_eq!(items.len(), 160);
    let f = |k: &str| {
        v[k].as_f64()
            .unwrap_or_else(|| panic!("{k} missing or null: {v}"))
    };
    let close = |k: &str, want: f64| {
        let got = f(k);
        assert!((got - want).abs() < 1e-12, "{k}: {got} != {want}");
    };
    // Each item's turn structure: turn 1, its cut bridge (30 tokens), turn 2.
    let (mut reached_2, mut done, mut len) = (0usize, 0usize, 0usize);
    let mut samples_sum = 0.0;
    let mut tokens = [0usize; 2];
    for it in &items {
        let ep = &it["episode"];
        let segs = ep["segments"].as_array().unwrap();
        let turns = ep["turns"].as_u64().unwrap();
        let kinds: Vec<(&str, u64)> = segs
            .iter()
            .map(|s| (s["kind"].as_str().unwrap(), s["turn"].as_u64().unwrap()))
            .collect();
        let mut start = 0;
        for s in segs {
            assert_eq!(s["start"].as_u64().unwrap() as usize, start, "{ep}");
            start += s["len"].as_u64().unwrap() as usize;
        }
        len += start;
        let rewards: Vec<f64> = ep["turn_rewards"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r.as_f64().unwrap())
            .collect();
        assert_eq!(ep.get("error"), None, "{ep}");
        tokens[0] += segs[0]["len"].as_u64().unwrap() as usize;
        match turns {
            1 => {
                assert_eq!(kinds, [("assistant", 1)], "{ep}");
                assert_eq!(rewards, [0.5], "{ep}");
            }
            2 => {
                reached_2 += 1;
                assert_eq!(
                    kinds,
                    [("assistant", 1), ("bridge", 1), ("assistant", 2)],
                    "{ep}"
                );
                assert_eq!(segs[1]["len"], 30, "{ep}");
                tokens[1] += segs[2]["len"].as_u64().unwrap() as usize;
                // The cut reply, as the model was shown it.
                let tr = ep["transcript"].as_array().unwrap();
                assert_eq!(tr[1]["content"], "012345678[...truncated...]", "{ep}");
                if ep["finish"] == "done" {
                    done += 1;
                    assert_eq!(rewards, [0.25, 1.0], "{ep}");
                } else {
                    assert_eq!(rewards, [0.25, 0.5], "{ep}");
                }
            }
            _ => panic!("{ep}"),
        }
        assert_eq!(it["reward"].as_f64().unwrap(), rewards.iter().sum::<f64>());
        // The episode's metrics, from its last reply: done's, or finish's.
        let m = ep["metrics"].as_object().unwrap();
        let sample = it["sample_index"].as_f64().unwrap();
        assert_eq!(m["sample"].as_f64(), Some(sample), "{ep}");
        match ep["finish"].as_str().unwrap() {
            "done" => assert_eq!((m["turn"].as_f64(), m.len()), (Some(2.0), 2), "{ep}"),
            _ => assert_eq!((m["finished"].as_f64(), m.len()), (Some(1.0), 2), "{ep}"),
        }
        samples_sum += sample;
    }
    assert!(
        reached_2 > 0 && reached_2 < 160 && done > 0,
        "{reached_2} {done}"
    );
    let n2 = reached_2 as f64;
    assert_eq!(f("env/restarts"), 1.0);
    assert_eq!(f("env/replayed"), 160.0);
    assert_eq!(f("env/obs_truncated"), n2);
    // Every replay matched (the program is deterministic): nothing to close.
    assert_eq!(f("env/closed"), 0.0);
    assert_eq!(f("env/error_frac"), 0.0);
    assert_eq!(f("env/tool_calls"), 0.0);
    assert_eq!(f("env/tool_call_errors"), 0.0);
    assert_eq!(f("env/turns/min"), 1.0);
    assert_eq!(f("env/turns/max"), 2.0);
    close("env/turns/mean", (160.0 + n2) / 160.0);
    close("env/episode_len/mean", len as f64 / 160.0);
    assert_eq!(f("env/turn_1/reached"), 1.0);
    close("env/turn_2/reached", n2 / 160.0);
    close("env/turn_1/tokens/mean", tokens[0] as f64 / 160.0);
    close("env/turn_2/tokens/mean", tokens[1] as f64 / n2);
    close(
        "env/turn_1/reward/mean",
        (0.25 * n2 + 0.5 * (160.0 - n2)) / 160.0,
    );
    close(
        "env/turn_2/reward/mean",
        (done as f64 + 0.5 * (n2 - done as f64)) / n2,
    );
    // Every episode carries `sample` (its index, 0..16 in each of the 10 groups: mean 7.5),
    // `done` ones `turn`, finished ones `finished`.
    assert_eq!(samples_sum, 10.0 * (0..16).sum::<i32>() as f64);
    close("env/metrics/sample/mean", samples_sum / 160.0);
    close("env/metrics/sample/mean", 7.5);
    assert_eq!(f("env/metrics/turn/mean"), 2.0);
    assert_eq!(f("env/metrics/finished/mean"), 1.0);
    // Keys for env.max_turns = 2 only, and no duration.
    assert!(v.get("env/turn_3/reached").is_none(), "{v}");
    assert!(v.get("time/env_s").is_none(), "{v}");
}

/// An environment that starts every episode from a few-shot dialogue (`reset`'s `dialogue`: a
/// system message, one solved example with its assistant answer, then the row's question), or,
/// with the argument `messages`, puts that dialogue in `messages` (refused: assistant turns);
/// one turn, reward 0.
const DIALOGUE_ENV: &str = r#"
import json, sys
key = sys.argv[1]
for line in sys.stdin:
    req = json.loads(line)
    t = req["type"]
    if t == "hello":
        out = {"version": 1}
    elif t == "reset":
        out = {"episodes": [{"id": e["id"], key: [
                {"role": "system", "content": "0"}, {"role": "user", "content": "1+1="},
                {"role": "assistant", "content": "2"},
                {"role": "user", "content": e["row"]["question"]}]} for e in req["episodes"]]}
    elif t == "step":
        out = {"episodes": [{"id": e["id"], "reward": 0.0, "done": True, "messages": []}
               for e in req["episodes"]]}
    else:
        out = {"episodes": [{"id": e["id"]} for e in req["episodes"]]}
    print(json.dumps(out), flush=True)
"#;

/// `reset`'s `dialogue` (an addition to DESIGN.md section 14): an episode starts from a prompt
/// holding assistant turns, rendered by the chat template as the prompt (each role as the
/// template writes it), so the dialogue is never part of the completion (not trained on: the
/// completion is the sampled turn alone). The same dialogue in `messages` stops the run, naming
/// `dialogue`.
#[test]
fn eval_env_episodes_start_from_a_reset_dialogue_with_assistant_turns() {
    let tmp = tempfile::tempdir().unwrap();
    let script = tmp.path().join("dialogue_env.py");
    std::fs::write(&script, DIALOGUE_ENV).unwrap();
    let tpl = tmp.path().join("chat.jinja");
    // Each role its own mark, in characters the tiny tokenizer has.
    std::fs::write(
        &tpl,
        "{% for m in messages %}{% if m.role == 'assistant' %}#{% elif m.role == 'system' %}*\
         {% else %}-{% endif %}{{ m.content }}<|endoftext|>\n{% endfor %}\
         {% if add_generation_prompt %}#{% endif %}",
    )
    .unwrap();
    let extra = |key: &str| -> Vec<String> {
        [
            "--env".to_string(),
            "--set".into(),
            format!(
                "env.command=[\"python3\", \"{}\", \"{key}\"]",
                script.display()
            ),
            "--set".into(),
            format!("env.chat_template=\"{}\"", tpl.display()),
            "--set".into(),
            "env.max_episode_tokens=16".into(),
        ]
        .to_vec()
    };
    let (_, items) = eval_five(&extra("dialogue"));
    assert_eq!(items.len(), 160);
    for x in &items {
        let i = x["index"].as_u64().unwrap();
        let question = format!("{}+{}=", i % 10, (i + 3) % 10);
        assert_eq!(
            x["prompt"],
            format!(
                "*0<|endoftext|>\n-1+1=<|endoftext|>\n#2<|endoftext|>\n-{question}<|endoftext|>\n#"
            ),
            "{x}"
        );
        // The completion is the one sampled turn: the dialogue's tokens are the prompt's.
        let ep = &x["episode"];
        assert_eq!(ep["turns"], 1, "{x}");
        let segs = ep["segments"].as_array().unwrap();
        assert_eq!(segs.len(), 1, "{x}");
        assert_eq!(
            (&segs[0]["kind"], &segs[0]["start"]),
            (&"assistant".into(), &0.into())
        );
        assert!(segs[0]["len"].as_u64().unwrap() <= 4, "{x}");
        assert_eq!(
            ep["transcript"].as_array().unwrap().len(),
            1,
            "only the sampled turn: {x}"
        );
    }
    let err = std::panic::catch_unwind(|| eval_five(&extra("messages"))).unwrap_err();
    let msg = err.downcast_ref::<String>().cloned().unwrap_or_default();
    assert!(
        msg.contains("role is \"assistant\"") && msg.contains("goes in \"dialogue\""),
        "{msg}"
    );
}

/// Plain `rlvr eval` (no `--env`) whose verifier fails partway (an external command that exits 1
/// on problem 2's batch; one problem of two samples per batch: `rollout.max_batch_rows = 2`)
/// writes the items of problems 0 and 1 to `--out`, each line as a complete evaluation writes it
/// plus `"partial": true`, and fails naming how many and where (it wrote nothing before).
#[test]
fn plain_eval_failing_partway_keeps_what_was_evaluated_marked_partial() {
    let tmp = tempfile::tempdir().unwrap();
    let model = common::tiny_model(tmp.path(), 3);
    let data = tmp.path().join("four.jsonl");
    let rows: Vec<String> = ["5", "5", "BOOM", "5"]
        .iter()
        .enumerate()
        .map(|(i, a)| serde_json::json!({"question": format!("{i}+5="), "answer": a}).to_string())
        .collect();
    std::fs::write(&data, rows.join("\n")).unwrap();
    let verifier = "while read -r l; do case \"$l\" in *BOOM*) echo boom >&2; exit 1;; esac; \
                    echo '{\"reward\": 0.5, \"correct\": true}'; done";
    let out = tmp.path().join("items.jsonl");
    let argv = |out: &std::path::Path, data: &std::path::Path| {
        W::parse_from([
            "x".to_string(),
            "--model".into(),
            model.display().to_string(),
            "--task".into(),
            "jsonl".into(),
            "--data".into(),
            data.display().to_string(),
            "--set".into(),
            format!(
                "data.verifier={{ kind = \"external\", command = [\"sh\", \"-c\", {}] }}",
                serde_json::to_string(verifier).unwrap()
            ),
            "--set".into(),
            "data.style=\"plain\"".into(),
            "--set".into(),
            "rollout.max_batch_rows=2".into(),
            "--n".into(),
            "2".into(),
            "--max-new-tokens".into(),
            "3".into(),
            "--out".into(),
            out.display().to_string(),
        ])
        .a
    };
    let e = format!(
        "{:#}",
        run_eval(&argv(&out, &data), &mut Vec::new()).unwrap_err()
    );
    assert!(
        e.contains(&format!(
            "the evaluation failed after 2 of 4 problems: their 4 items are in {}, each marked \
             \"partial\": true",
            out.display()
        )) && e.contains("scoring the completions of eval problems 2..3"),
        "{e}"
    );
    let partial = std::fs::read_to_string(&out).unwrap();
    let items: Vec<serde_json::Value> = partial
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let seen: Vec<(u64, u64, bool)> = items
        .iter()
        .map(|it| {
            (
                it["index"].as_u64().unwrap(),
                it["sample_index"].as_u64().unwrap(),
                it["partial"] == true,
            )
        })
        .collect();
    assert_eq!(
        seen,
        [(0, 0, true), (0, 1, true), (1, 0, true), (1, 1, true)]
    );
    // The same lines as a complete evaluation's (same draws and seed) with the key added last.
    let whole = tmp.path().join("whole.jsonl");
    std::fs::write(&whole, rows[..2].join("\n")).unwrap();
    let whole_out = tmp.path().join("whole-items.jsonl");
    run_eval(&argv(&whole_out, &whole), &mut Vec::new()).unwrap();
    let complete = std::fs::read_to_string(&whole_out).unwrap();
    assert!(!complete.contains("partial"), "{complete}");
    let marked: Vec<String> = complete
        .lines()
        .map(|l| format!("{},\"partial\":true}}", l.strip_suffix('}').unwrap()))
        .collect();
    assert_eq!(partial.lines().collect::<Vec<_>>(), marked);
}

/// `rlvr eval --model CKPT` alone (no `--task`, `--config` or `--data`: the default task gsm8k
/// reads a file) says which flag gives the problems, naming the run's config.toml when the model
/// is one of its checkpoints; it said "invalid data config: data.test is required for task gsm8k".
#[test]
fn eval_without_test_data_says_which_flag_gives_it() {
    let tmp = tempfile::tempdir().unwrap();
    let model = common::tiny_model(tmp.path(), 7);
    let err = |model: &std::path::Path, extra: &[&str]| {
        let mut argv = vec![
            "x".to_string(),
            "--model".into(),
            model.display().to_string(),
        ];
        argv.extend(extra.iter().map(|s| s.to_string()));
        format!(
            "{:#}",
            run_eval(&W::parse_from(argv).a, &mut Vec::new()).unwrap_err()
        )
    };
    let e = err(&model, &[]);
    assert!(
        e.contains("no held-out problems to evaluate on: data.task = \"gsm8k\" (the default")
            && e.contains("add --data FILE")
            && e.contains("data/gsm8k/test.jsonl")
            && e.contains("--config FILE whose data.test names one")
            && e.contains("--task arithmetic"),
        "{e}"
    );
    let e = err(&model, &["--task", "math500"]);
    assert!(e.contains("--task math500 reads them from a file"), "{e}");
    // A run's checkpoint: its config.toml is named.
    let run = tmp.path().join("run");
    let ckpt = run.join("checkpoints/step-1");
    std::fs::create_dir_all(&ckpt).unwrap();
    for f in std::fs::read_dir(&model).unwrap() {
        let f = f.unwrap();
        std::fs::copy(f.path(), ckpt.join(f.file_name())).unwrap();
    }
    std::fs::write(run.join("config.toml"), "").unwrap();
    let e = err(&ckpt, &[]);
    assert!(
        e.contains(&format!(
            "--config {} (the run's own config",
            run.join("config.toml").display()
        )),
        "{e}"
    );
}
