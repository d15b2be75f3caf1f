//! `rlvr generate --env` (issue 45): a config's environment's episodes printed for inspection,
//! one line per episode with its transcript and token accounting.

use crate::common;

use clap::Parser;
use rlvr_rollout::cli::GenerateArgs;
use rlvr_train::cli::run_generate;
use rlvr_train::config::settings;

#[derive(Parser)]
struct W {
    #[command(flatten)]
    a: GenerateArgs,
}

fn generate(argv: &[String]) -> anyhow::Result<Vec<serde_json::Value>> {
    let mut full = vec!["x".to_string()];
    full.extend(argv.iter().cloned());
    let a = W::try_parse_from(full)
        .map_err(|e| anyhow::anyhow!("{e}"))?
        .a;
    let mut buf = Vec::new();
    run_generate(&a, &mut buf)?;
    Ok(String::from_utf8(buf)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect())
}

/// With the built-in `retry` environment (every answer is 5): each line is an episode whose turn
/// 1 is plain `rlvr generate`'s completion with the same flags (ids and log-prob bits); its
/// segments cover `completion_ids` in order, alternating assistant turns (mask 1) and bridges
/// (mask 0, log-prob 0.0) that decode to the template's rendering of the retry message; the
/// counts, turns and transcript agree.
#[test]
fn generate_env_prints_episodes_with_their_token_accounting() {
    let tmp = tempfile::tempdir().unwrap();
    let model = common::tiny_model(tmp.path(), 3);
    let tpl = tmp.path().join("chat.jinja");
    std::fs::write(
        &tpl,
        "{% for m in messages %}{{ m.role }}:{{ m.content }}<|endoftext|>\n\
         {% endfor %}{% if add_generation_prompt %}=>{% endif %}",
    )
    .unwrap();
    let config = tmp.path().join("env.toml");
    std::fs::write(
        &config,
        format!(
            "[data]\ntask = \"jsonl\"\nverifier = {{ kind = \"arithmetic\" }}\n\n\
             [rollout]\nmax_new_tokens = 4\n\n[env]\nbuiltin = \"retry\"\nmax_turns = 2\nmax_episode_tokens = 80\nchat_template = {:?}\n",
            tpl.display().to_string()
        ),
    )
    .unwrap();
    let prompts = tmp.path().join("prompts.jsonl");
    let lines: Vec<String> = (0..10)
        .map(|i| {
            serde_json::json!({"prompt": format!("{}+{}=", i % 10, (i + 3) % 10), "reference": "5"})
                .to_string()
        })
        .collect();
    std::fs::write(&prompts, lines.join("\n")).unwrap();
    let base: Vec<String> = [
        "--model",
        model.to_str().unwrap(),
        "--prompts",
        prompts.to_str().unwrap(),
        "-n",
        "16",
        "--max-new-tokens",
        "4",
        "--seed",
        "5",
    ]
    .map(String::from)
    .to_vec();
    let plain = generate(&base).unwrap();
    let mut with_env = base.clone();
    with_env.extend(["--env".to_string(), config.display().to_string()]);
    // A per-turn limit above the config's episode budget is refused naming the flag and the
    // value to pass, not left to the engine's positions.
    let at = with_env
        .iter()
        .position(|w| w == "--max-new-tokens")
        .unwrap();
    let mut above = with_env.clone();
    above[at + 1] = "100".into();
    let e = format!("{:#}", generate(&above).unwrap_err());
    assert!(
        e.starts_with("--max-new-tokens 100 is above env.max_episode_tokens = 80 of ")
            && e.contains("pass --max-new-tokens 80 or less"),
        "{e}"
    );
    let eps = generate(&with_env).unwrap();
    // Without the flag the per-turn limit is the config's rollout.max_new_tokens (4), as in
    // training: the same episodes.
    let mut no_flag = with_env.clone();
    no_flag.drain(at..at + 2);
    assert_eq!(generate(&no_flag).unwrap(), eps);
    assert_eq!((plain.len(), eps.len()), (160, 160));
    let tok = settings::load_tokenizer(&model).unwrap();
    // The retry message as the template renders it after a turn (the test tokenizer splits it
    // into single characters, so its ids are the text's).
    let bridge = tok
        .encode(
            "\nuser:That is not correct. Please try again.<|endoftext|>\n=>",
            false,
        )
        .unwrap();
    let mut longer = 0;
    for (p, e) in plain.iter().zip(&eps) {
        assert_eq!(
            (&e["prompt_index"], &e["sample_index"]),
            (&p["prompt_index"], &p["sample_index"])
        );
        let ids: Vec<u32> = serde_json::from_value(e["completion_ids"].clone()).unwrap();
        let mask: Vec<u8> = serde_json::from_value(e["completion_mask"].clone()).unwrap();
        let lp: Vec<f32> = serde_json::from_value(e["behaviour_logprobs"].clone()).unwrap();
        assert_eq!((mask.len(), lp.len()), (ids.len(), ids.len()), "{e}");
        // Turn 1 is the single-turn completion, bit for bit.
        let first: Vec<u32> = serde_json::from_value(p["token_ids"].clone()).unwrap();
        let first_lp: Vec<f32> = serde_json::from_value(p["behaviour_logprobs"].clone()).unwrap();
        assert_eq!(&ids[..first.len()], &first[..], "{e}");
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&lp[..first.len()]), bits(&first_lp));
        // The segments tile the completion, alternating, from turn 1 to the last turn.
        let segs = e["segments"].as_array().unwrap();
        let turns = e["turns"].as_u64().unwrap() as usize;
        assert!((1..=2).contains(&turns), "{e}");
        assert_eq!(segs.len(), 2 * turns - 1, "{e}");
        assert_eq!(segs[0]["len"].as_u64().unwrap() as usize, first.len());
        let (mut at, mut sampled, mut bridged) = (0, 0, 0);
        for (k, s) in segs.iter().enumerate() {
            let (start, len) = (
                s["start"].as_u64().unwrap() as usize,
                s["len"].as_u64().unwrap() as usize,
            );
            assert_eq!(start, at, "{e}");
            assert_eq!(s["turn"].as_u64().unwrap() as usize, k / 2 + 1, "{e}");
            let part = start..start + len;
            if k % 2 == 0 {
                assert_eq!(s["kind"], "assistant");
                assert!(mask[part].iter().all(|&m| m == 1), "{e}");
                sampled += len;
            } else {
                assert_eq!(s["kind"], "bridge");
                assert!(mask[part.clone()].iter().all(|&m| m == 0), "{e}");
                assert!(lp[part.clone()].iter().all(|&x| x == 0.0), "{e}");
                assert_eq!(&ids[part], &bridge[..], "{e}");
                bridged += len;
            }
            at += len;
        }
        assert_eq!(at, ids.len());
        assert_eq!(
            (e["sampled_tokens"].as_u64(), e["bridge_tokens"].as_u64()),
            (Some(sampled as u64), Some(bridged as u64))
        );
        let tr = e["transcript"].as_array().unwrap();
        let assistant = tr.iter().filter(|m| m["role"] == "assistant").count();
        assert_eq!(assistant, turns, "{e}");
        assert_eq!(tr[0]["content"], p["text"], "{e}");
        assert!(e["reward"].is_number(), "{e}");
        // retry's metric: solved (1) exactly when the reward is above 0 (env.turn_discount 1).
        let solved = e["metrics"]["solved"].as_f64().unwrap();
        assert_eq!(
            solved,
            f64::from(u8::from(e["reward"].as_f64() > Some(0.0))),
            "{e}"
        );
        if turns > 1 {
            longer += 1;
        }
    }
    assert!(
        longer > 0,
        "no episode took a second turn: nothing but turn 1 was checked"
    );
    // env.kv_cache_mib = 0: every later turn prefills its whole context. Turn 1 is the same bits;
    // later turns keep their tokens here, and their log-probs agree within rounding but not to
    // the bit (the kept keys and values come from decode steps), which shows the key reached the
    // engine. The same seed gives the same bits again.
    let mut exact = with_env.clone();
    exact.extend(["--set".to_string(), "env.kv_cache_mib=0".to_string()]);
    let eps0 = generate(&exact).unwrap();
    assert_eq!(generate(&exact).unwrap(), eps0);
    let (mut differ, mut worst) = (0, 0f32);
    for (e, z) in eps.iter().zip(&eps0) {
        assert_eq!(e["completion_ids"], z["completion_ids"], "{e}\n{z}");
        let lp: Vec<f32> = serde_json::from_value(e["behaviour_logprobs"].clone()).unwrap();
        let lp0: Vec<f32> = serde_json::from_value(z["behaviour_logprobs"].clone()).unwrap();
        let first = e["segments"][0]["len"].as_u64().unwrap() as usize;
        assert_eq!(&lp[..first], &lp0[..first]);
        for (a, b) in lp.iter().zip(&lp0) {
            worst = worst.max((a - b).abs());
            differ += usize::from(a.to_bits() != b.to_bits());
        }
    }
    assert!(worst < 1e-4, "{worst}");
    assert!(
        differ > 0,
        "env.kv_cache_mib = 0 changed no bit: did it reach the engine?"
    );
    // A config without [env], and --out, are refused naming why.
    let bare = tmp.path().join("bare.toml");
    std::fs::write(&bare, "[data]\ntask = \"jsonl\"\n").unwrap();
    let mut argv = base.clone();
    argv.extend(["--env".to_string(), bare.display().to_string()]);
    let err = format!("{:#}", generate(&argv).unwrap_err());
    assert!(err.contains("the config has no environment"), "{err}");
    let mut argv = with_env.clone();
    argv.extend([
        "--out".to_string(),
        tmp.path().join("x.jsonl").display().to_string(),
    ]);
    let err = format!("{:#}", generate(&argv).unwrap_err());
    assert!(err.contains("--out with --env"), "{err}");
}

/// An environment that replaces each prompt with its row's `prompt` and `level` fields (or
/// `MISSING`), and ends the episode after one turn.
const ROW_ENV: &str = r#"
import json, sys
for line in sys.stdin:
    req = json.loads(line)
    t = req["type"]
    if t == "hello":
        out = {"version": 1}
    elif t == "reset":
        out = {"episodes": [{"id": e["id"], "messages": [{"role": "user",
                "content": e["row"].get("prompt", "MISSING") + e["row"].get("level", "MISSING")
                           + e["row"].get("reference", "MISSING")}]}
               for e in req["episodes"]]}
    elif t == "step":
        out = {"episodes": [{"id": e["id"], "done": True, "messages": []} for e in req["episodes"]]}
    else:
        out = {"episodes": [{"id": e["id"]} for e in req["episodes"]]}
    print(json.dumps(out), flush=True)
"#;

/// A program environment's `reset` row holds the `--prompts` line's `prompt` with its other keys,
/// as a training row holds the data file's prompt field (examples/env_calculator.py reads the
/// question from `prompt` when there is no `question`): it was left out, so such an environment
/// asked the model an empty question.
#[test]
fn generate_env_rows_hold_the_prompt_and_the_lines_other_keys() {
    let tmp = tempfile::tempdir().unwrap();
    let model = common::tiny_model(tmp.path(), 3);
    std::fs::write(tmp.path().join("row_env.py"), ROW_ENV).unwrap();
    std::fs::write(
        tmp.path().join("chat.jinja"),
        "{% for m in messages %}{{ m.role }}:{{ m.content }}<|endoftext|>\n\
         {% endfor %}{% if add_generation_prompt %}=>{% endif %}",
    )
    .unwrap();
    let config = tmp.path().join("env.toml");
    std::fs::write(
        &config,
        "[env]\ncommand = [\"python3\", \"row_env.py\"]\nmax_turns = 2\n\
         chat_template = \"chat.jinja\"\n",
    )
    .unwrap();
    let prompts = tmp.path().join("prompts.jsonl");
    std::fs::write(
        &prompts,
        "{\"prompt\": \"1+2=\", \"level\": \"7\", \"reference\": \"3\"}\n",
    )
    .unwrap();
    let argv: Vec<String> = [
        "--model",
        model.to_str().unwrap(),
        "--prompts",
        prompts.to_str().unwrap(),
        "--max-new-tokens",
        "4",
        "--env",
        config.to_str().unwrap(),
        "--env-log",
        tmp.path().join("env.stderr").to_str().unwrap(),
    ]
    .map(String::from)
    .to_vec();
    let eps = generate(&argv).unwrap();
    assert_eq!(eps.len(), 1);
    let tok = settings::load_tokenizer(&model).unwrap();
    let want = tok.encode("user:1+2=73<|endoftext|>\n=>", false).unwrap();
    let got: Vec<u32> = serde_json::from_value(eps[0]["prompt_ids"].clone()).unwrap();
    assert_eq!(
        got,
        want,
        "{:?}",
        tok.decode(&got, false).unwrap_or_default()
    );
}

/// The last integer in `text` (an optional `-` and digits), as the test environment vf-guess
/// reads a guess (`re.findall(r"-?\d+", text)[-1]`).
fn last_number(text: &str) -> Option<i64> {
    let b = text.as_bytes();
    let mut found = None;
    let mut i = 0;
    while i < b.len() {
        if b[i].is_ascii_digit() {
            let start = if i > 0 && b[i - 1] == b'-' { i - 1 } else { i };
            let mut j = i;
            while j < b.len() && b[j].is_ascii_digit() {
                j += 1;
            }
            found = text[start..j].parse().ok().or(found);
            i = j;
        } else {
            i += 1;
        }
    }
    found
}

/// `env.verifiers`: a real multi-turn episode loop (the tiny model sampling, rlvr's bridges)
/// through the adapter the binary carries, on the verifiers test environment vf-guess
/// (crates/rlvr-env/tests/verifiers/envs/vf_guess.py, on the stand-in package): every episode
/// gets the environment's prompt, each later turn follows the environment's hint for the guess
/// it saw, and its reward is the rubric's, worked out here from the transcript: 1 when the last
/// guess the environment saw is the number, plus 0.5 / the turns it saw.
#[test]
fn generate_env_runs_a_verifiers_environment_through_the_carried_adapter() {
    let tmp = tempfile::tempdir().unwrap();
    let model = common::tiny_model(tmp.path(), 3);
    std::fs::write(
        tmp.path().join("chat.jinja"),
        "{% for m in messages %}{{ m.content }}<|endoftext|>{% endfor %}\
         {% if add_generation_prompt %}={% endif %}",
    )
    .unwrap();
    let fixtures = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../rlvr-env/tests/verifiers")
        .canonicalize()
        .unwrap();
    let config = tmp.path().join("env.toml");
    std::fs::write(
        &config,
        format!(
            "[data]\ntask = \"jsonl\"\n\n[rollout]\nmax_new_tokens = 4\n\n\
             [env]\nverifiers = \"vf-guess\"\nmax_turns = 3\nmax_episode_tokens = 64\n\
             chat_template = \"chat.jinja\"\noptions = {{ paths = [{:?}, {:?}] }}\n",
            fixtures.join("standin").display().to_string(),
            fixtures.join("envs").display().to_string()
        ),
    )
    .unwrap();
    let prompts = tmp.path().join("prompts.jsonl");
    std::fs::write(
        &prompts,
        "{\"prompt\": \"1+1=\", \"example_id\": 0}\n{\"prompt\": \"2+2=\", \"example_id\": 1}\n\
         {\"prompt\": \"3+3=\", \"example_id\": 0}\n{\"prompt\": \"4+4=\", \"example_id\": 1}\n",
    )
    .unwrap();
    let argv: Vec<String> = [
        "--model",
        model.to_str().unwrap(),
        "--prompts",
        prompts.to_str().unwrap(),
        "-n",
        "16",
        "--seed",
        "5",
        "--env",
        config.to_str().unwrap(),
        "--env-log",
        tmp.path().join("env.stderr").to_str().unwrap(),
    ]
    .map(String::from)
    .to_vec();
    let eps = generate(&argv).unwrap_or_else(|e| {
        let log = std::fs::read_to_string(tmp.path().join("env.stderr")).unwrap_or_default();
        panic!("{e:#}\nthe environment's stderr:\n{log}")
    });
    assert_eq!(eps.len(), 64);
    let tok = settings::load_tokenizer(&model).unwrap();
    // The environment's prompt, not the line's: its system prompt and question, rendered.
    let want = tok
        .encode(
            "Answer with one number.<|endoftext|>Guess my number from 1 to 10.<|endoftext|>=",
            false,
        )
        .unwrap();
    let mut hinted = 0;
    for e in &eps {
        assert!(e["error"].is_null(), "{e}");
        let target = match e["prompt_index"].as_u64().unwrap() % 2 {
            0 => 7,
            _ => 3,
        };
        if target == 7 {
            let got: Vec<u32> = serde_json::from_value(e["prompt_ids"].clone()).unwrap();
            assert_eq!(got, want, "{e}");
        }
        let tr = e["transcript"].as_array().unwrap();
        let turns = e["turns"].as_u64().unwrap() as usize;
        let finish = e["finish"].as_str().unwrap();
        // The turns the environment saw: all but a last one cut by rlvr (`length`, `eos`, or
        // `budget` within the turn), which got no step and so no reply after it.
        let answered = tr.last().is_some_and(|m| m["role"] == "user");
        let seen = match finish {
            "done" | "max_turns" => turns,
            _ if answered => turns,
            _ => turns - 1,
        };
        let assistant: Vec<&str> = tr
            .iter()
            .filter(|m| m["role"] == "assistant")
            .map(|m| m["content"].as_str().unwrap())
            .collect();
        assert_eq!(assistant.len(), turns, "{e}");
        // Each user message after a turn is the hint for that turn's guess.
        let mut k = 0;
        for (i, m) in tr.iter().enumerate() {
            if m["role"] != "assistant" {
                continue;
            }
            if let Some(next) = tr.get(i + 1).filter(|n| n["role"] == "user") {
                let hint = match last_number(assistant[k]) {
                    None => "Answer with a number.",
                    Some(g) if g < target => "Higher.",
                    Some(_) => "Lower.",
                };
                assert_eq!(next["content"], hint, "{e}");
                hinted += 1;
            }
            k += 1;
        }
        let last = seen.checked_sub(1).and_then(|t| last_number(assistant[t]));
        let correct = if last == Some(target) { 1.0 } else { 0.0 };
        let reward = correct + 0.5 / seen.max(1) as f64;
        assert_eq!(e["reward"].as_f64(), Some(reward), "{e}");
        if finish == "done" {
            assert_eq!(correct, 1.0, "done only when guessed: {e}");
        }
    }
    assert!(
        hinted > 0,
        "no episode got a hint: no later turn was checked"
    );
    let log = std::fs::read_to_string(tmp.path().join("env.stderr")).unwrap();
    assert_eq!(log.matches("[verifiers] episode ").count(), 64, "{log}");
}
