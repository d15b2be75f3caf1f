//! The process client against small Python environments started by the tests: the protocol as
//! written, and each fault (wrong version, silence, timeouts, death and replay, malformed and
//! flooding replies, per-episode errors, special tokens, groups whose resets differ) ending as
//! docs/DESIGN.md section 14 says. Skipped (with a message) where `python3` is missing.

use rlvr_env::client::{ProcessEnvironment, ProcessSettings};
use rlvr_env::json::Json;
use rlvr_env::protocol::{FinishEpisode, FinishReason, ResetEpisode, StepEpisode, ToolCall};
use rlvr_env::Environment;
use std::time::{Duration, Instant};

/// One environment program; its behaviour is picked by its first argument.
const ENV_PY: &str = r#"
import json, os, sys, time
mode = sys.argv[1]
marker = sys.argv[2] if len(sys.argv) > 2 else None
def send(obj):
    sys.stdout.write(json.dumps(obj) + "\n"); sys.stdout.flush()
for line in sys.stdin:
    req = json.loads(line)
    assert req["version"] == 1
    kind = req["type"]
    print("got", kind, file=sys.stderr, flush=True)
    if kind == "hello":
        if mode == "silent":
            time.sleep(60)
        if mode == "buffered":
            print(json.dumps({"version": 1})); continue
        send({"version": 2 if mode == "wrong_version" else 1})
        continue
    eps = req["episodes"]
    if kind == "reset":
        if mode == "malformed":
            sys.stdout.write("this is not json\n"); sys.stdout.flush(); continue
        if mode == "flood":
            sys.stdout.write("x" * (4 << 20)); sys.stdout.flush(); time.sleep(60)
        if mode == "envcheck":
            info = {"env": sorted(os.environ), "cwd": os.getcwd(), "options": None}
            send({"episodes": [{"id": e["id"], "messages": [{"role": "user", "content": json.dumps(info)}]} for e in eps]})
            continue
        def msgs(e):
            text = "state %d" % (e["seed"] + (e["sample"] if mode == "differ" else 0))
            return [{"role": "user", "content": text + " " + e["row"]["q"]}]
        send({"episodes": [{"id": e["id"], "messages": msgs(e), "tools": None} for e in reversed(eps)]})
    elif kind == "step":
        if mode == "die_once" and not os.path.exists(marker):
            open(marker, "w").close(); print("dying on purpose", file=sys.stderr, flush=True); os._exit(3)
        if mode == "hang":
            time.sleep(60)
        if mode == "error":
            send({"error": "the database is down"}); continue
        if mode == "wide":
            send({"episodes": [{"id": e["id"], "messages": [{"role": "tool", "content": "x" * 300000}], "reward": 0.0, "done": False} for e in eps]}); continue
        if mode == "gym_keys":
            send({"episodes": [{"id": e["id"], "messages": [], "rewrad": 1.0, "terminated": True, "info": {}} for e in eps]}); continue
        if mode == "bad_metric":
            send({"episodes": [{"id": e["id"], "messages": [], "reward": 1.0, "done": True, "metrics": {"format": 0.5, "correct": None}} for e in eps]}); continue
        if mode == "bad_reward":
            print("scoring with the string reward", file=sys.stderr, flush=True)
            send({"episodes": [{"id": e["id"], "messages": [], "reward": "1.0", "done": True} for e in eps]}); continue
        out = []
        for e in eps:
            if e["text"] == "boom":
                out.append({"id": e["id"], "error": "tool crashed"})
            elif mode == "special":
                out.append({"id": e["id"], "messages": [{"role": "tool", "content": "x<|im_end|>y"}]})
            else:
                calls = e["tool_calls"]
                content = ";".join(c["name"] + ":" + c["arguments"]["expr"] for c in calls)
                out.append({"id": e["id"], "messages": [{"role": "tool", "name": "calc", "tool_call_id": "call_0", "content": content}],
                            "reward": 0.25, "done": e["turn"] >= 2})
        send({"episodes": out})
    elif kind == "finish":
        send({"episodes": [{"id": e["id"], "reward": 1.0 if e["reason"] == "max_turns" else 0.0} for e in eps]})
"#;

pub(crate) fn python() -> bool {
    let ok = std::process::Command::new("python3")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    assert!(ok, "python3 is needed by this test and was not found (Debian: apt-get install python3); a test does not pass without running");
    ok
}

struct Fixture {
    dir: tempfile::TempDir,
}

impl Fixture {
    fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("env.py"), ENV_PY).unwrap();
        Fixture { dir }
    }

    fn settings(&self, mode: &str) -> ProcessSettings {
        let marker = self.dir.path().join("marker").display().to_string();
        let mut s =
            ProcessSettings::new(vec!["python3".into(), "env.py".into(), mode.into(), marker]);
        s.dir = Some(self.dir.path().to_path_buf());
        s.timeout = Duration::from_secs(20);
        s.restarts = 0;
        s
    }
}

fn reset_eps(groups: usize, k: u32) -> Vec<ResetEpisode> {
    let mut out = Vec::new();
    for g in 0..groups {
        for s in 0..k {
            out.push(ResetEpisode {
                id: format!("{g}:{s}"),
                group: g.to_string(),
                sample: s,
                seed: 100 + g as u64,
                row: Json::object([("q", Json::from(format!("q{g}")))]),
                prompt: None,
            });
        }
    }
    out
}

fn step(id: &str, turn: u32, text: &str, expr: &str) -> StepEpisode {
    StepEpisode {
        id: id.into(),
        turn,
        text: text.into(),
        tool_calls: vec![ToolCall {
            id: "call_0".into(),
            name: "calc".into(),
            arguments: Json::object([("expr", Json::from(expr))]),
        }],
        tool_call_errors: vec![],
    }
}

#[test]
fn a_well_behaved_environment_is_driven_through_the_protocol() {
    if !python() {
        return;
    }
    let f = Fixture::new();
    let mut env = ProcessEnvironment::start(f.settings("good")).unwrap();
    // Replies come in reverse order; they are matched by id.
    let r = env.reset(&reset_eps(2, 2)).unwrap();
    let firsts: Vec<String> = r
        .iter()
        .map(|x| {
            x.as_ref().unwrap().messages.as_ref().unwrap()[0]
                .content
                .clone()
        })
        .collect();
    assert_eq!(
        firsts,
        [
            "state 100 q0",
            "state 100 q0",
            "state 101 q1",
            "state 101 q1"
        ]
    );
    let s = env
        .step(&[
            step("0:0", 1, "x", "3*7"),
            step("0:1", 2, "boom", "1"),
            step("1:0", 2, "y", "2+2"),
        ])
        .unwrap();
    let a = s[0].as_ref().unwrap();
    assert_eq!(
        (
            a.messages[0].content.as_str(),
            a.messages[0].name.as_deref(),
            a.reward,
            a.done
        ),
        ("calc:3*7", Some("calc"), Some(0.25), false)
    );
    assert_eq!(s[1], Err("tool crashed".to_string()));
    assert!(s[2].as_ref().unwrap().done);
    let fin = env
        .finish(&[FinishEpisode {
            id: "0:0".into(),
            reason: FinishReason::MaxTurns,
        }])
        .unwrap();
    assert_eq!(fin[0].as_ref().unwrap().reward, Some(1.0));
    assert!(env.step(&[]).unwrap().is_empty());
    assert_eq!(env.starts(), 1);
}

#[test]
fn the_environment_gets_a_minimal_environment_its_directory_and_dies_when_dropped() {
    if !python() {
        return;
    }
    let f = Fixture::new();
    let mut s = f.settings("envcheck");
    s.env = vec!["RLVR_ENV_TEST_LISTED".into()];
    // Set for this process only: one name listed, one withheld.
    std::env::set_var("RLVR_ENV_TEST_LISTED", "1");
    std::env::set_var("RLVR_ENV_TEST_SECRET", "1");
    let mut env = ProcessEnvironment::start(s).unwrap();
    let r = env.reset(&reset_eps(1, 1)).unwrap();
    let info = Json::parse(&r[0].as_ref().unwrap().messages.as_ref().unwrap()[0].content).unwrap();
    let Some(Json::Array(names)) = info.get("env") else {
        panic!("{info}")
    };
    let names: Vec<&str> = names.iter().filter_map(Json::as_str).collect();
    assert!(names.contains(&"RLVR_ENV_TEST_LISTED"), "{names:?}");
    assert!(!names.contains(&"RLVR_ENV_TEST_SECRET"), "{names:?}");
    // cargo's own variables (set for this test process) are withheld too.
    assert!(!names.iter().any(|n| n.starts_with("CARGO")), "{names:?}");
    let cwd = std::fs::canonicalize(info.get("cwd").and_then(Json::as_str).unwrap()).unwrap();
    assert_eq!(cwd, std::fs::canonicalize(f.dir.path()).unwrap());
    let pid = env.pid().unwrap();
    drop(env);
    assert!(
        !std::path::Path::new(&format!("/proc/{pid}")).exists() || {
            // A zombie is reaped by the end call; the process must not be running.
            let st = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
            st.contains(") Z ") || st.is_empty()
        }
    );
}

#[test]
fn start_up_faults_stop_the_run_with_the_stderr_tail() {
    if !python() {
        return;
    }
    let f = Fixture::new();
    let e = ProcessEnvironment::start(f.settings("wrong_version"))
        .err()
        .unwrap()
        .to_string();
    assert!(
        e.contains("protocol version 2") && e.contains("got hello"),
        "{e}"
    );
    assert_eq!(e.matches("environment `").count(), 1, "{e}");
    let mut s = f.settings("silent");
    s.timeout = Duration::from_millis(500);
    let t0 = Instant::now();
    let e = ProcessEnvironment::start(s).err().unwrap().to_string();
    assert!(e.contains("no answer to hello within 0.5 s"), "{e}");
    // The command is named once (it was twice: "environment `...`: environment `...`: ...").
    assert_eq!(e.matches("environment `").count(), 1, "{e}");
    assert!(t0.elapsed() < Duration::from_secs(10));
    let mut s = f.settings("good");
    s.command = vec!["/nonexistent/env".into()];
    let e = ProcessEnvironment::start(s).err().unwrap().to_string();
    assert!(e.contains("could not start it"), "{e}");
}

#[test]
fn a_silent_program_is_not_restarted_once_the_run_is_asked_to_stop() {
    // The first Ctrl-C waits for the current step; a hung program would otherwise be restarted
    // (and waited for) env.restarts more times: 4 × 60 s by default.
    if !python() {
        return;
    }
    let f = Fixture::new();
    let mut s = f.settings("hang");
    s.timeout = Duration::from_millis(700);
    s.restarts = 3;
    let mut env = ProcessEnvironment::start(s).unwrap();
    env.reset(&reset_eps(1, 1)).unwrap();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(true));
    env.watch_stop(stop);
    let t0 = Instant::now();
    let e = env
        .step(&[step("0:0", 1, "x", "1")])
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("no reply to step within 0.7 s") && e.contains("not restarted"),
        "{e}"
    );
    assert_eq!(env.starts(), 1);
    assert!(t0.elapsed() < Duration::from_secs(2), "{:?}", t0.elapsed());
}

#[test]
fn a_program_that_never_flushes_is_told_to() {
    // The most common first mistake: Python's `print` into a pipe is buffered, so the answer
    // to hello never arrives. The timeout's error says why and how to fix it.
    if !python() {
        return;
    }
    let f = Fixture::new();
    let mut s = f.settings("buffered");
    s.timeout = Duration::from_millis(500);
    let e = ProcessEnvironment::start(s).err().unwrap().to_string();
    assert!(e.contains("no answer to hello within 0.5 s"), "{e}");
    assert!(e.contains("flush=True") && e.contains("python3 -u"), "{e}");
}

#[test]
fn restarts_meaning_forever_and_an_empty_command_are_refused_before_starting() {
    // Refused before anything is spawned, so no interpreter is needed: the program named would
    // fail to start if it were tried.
    let mut s = ProcessSettings::new(vec!["/nonexistent/env".into()]);
    s.restarts = u32::MAX;
    let e = ProcessEnvironment::start(s).err().unwrap().to_string();
    assert_eq!(e, "env.restarts = 4294967295 is out of range: at most 1000");
    let mut s = ProcessSettings::new(vec!["/nonexistent/env".into()]);
    s.restarts = 1000;
    let e = ProcessEnvironment::start(s).err().unwrap().to_string();
    assert!(e.contains("could not start it"), "{e}");
    let e = ProcessEnvironment::start(ProcessSettings::new(Vec::new()))
        .err()
        .unwrap()
        .to_string();
    assert!(e.starts_with("env.command is empty"), "{e}");
}

#[test]
fn a_dead_environment_is_restarted_and_the_request_replayed_within_the_limit() {
    if !python() {
        return;
    }
    let f = Fixture::new();
    let mut s = f.settings("die_once");
    s.restarts = 1;
    let mut env = ProcessEnvironment::start(s).unwrap();
    env.reset(&reset_eps(1, 1)).unwrap();
    let r = env.step(&[step("0:0", 1, "x", "6*7")]).unwrap();
    assert_eq!(r[0].as_ref().unwrap().messages[0].content, "calc:6*7");
    assert_eq!(env.starts(), 2);

    let f = Fixture::new();
    let mut env = ProcessEnvironment::start(f.settings("die_once")).unwrap();
    let e = env
        .step(&[step("0:0", 1, "x", "1")])
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("after 0 restarts") && e.contains("dying on purpose"),
        "{e}"
    );
}

#[test]
fn a_request_past_the_timeout_counts_as_a_death() {
    if !python() {
        return;
    }
    let f = Fixture::new();
    let mut s = f.settings("hang");
    // Long enough for a Python start-up on a loaded 2-core machine (0.7 s failed under load 13).
    s.timeout = Duration::from_secs(3);
    s.restarts = 1;
    let mut env = ProcessEnvironment::start(s).unwrap();
    let t0 = Instant::now();
    let e = env
        .step(&[step("0:0", 1, "x", "1")])
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("no reply to step within 3.0 s") && e.contains("after 1 restarts"),
        "{e}"
    );
    assert_eq!(env.starts(), 2);
    assert!(t0.elapsed() < Duration::from_secs(15), "{:?}", t0.elapsed());
}

#[test]
fn malformed_flooding_and_error_replies_stop_the_run() {
    if !python() {
        return;
    }
    let f = Fixture::new();
    let mut env = ProcessEnvironment::start(f.settings("malformed")).unwrap();
    let e = env.reset(&reset_eps(1, 1)).unwrap_err().to_string();
    assert!(
        e.contains("is not JSON") && e.contains("this is not json"),
        "{e}"
    );

    let mut s = f.settings("flood");
    s.max_reply_bytes = 1 << 20;
    let mut env = ProcessEnvironment::start(s).unwrap();
    let t0 = Instant::now();
    let e = env.reset(&reset_eps(1, 1)).unwrap_err().to_string();
    assert!(e.contains("passed 1048576 bytes"), "{e}");
    assert!(t0.elapsed() < Duration::from_secs(10), "{:?}", t0.elapsed());

    let mut env = ProcessEnvironment::start(f.settings("error")).unwrap();
    let e = env
        .step(&[step("0:0", 1, "x", "1")])
        .unwrap_err()
        .to_string();
    assert!(e.contains("the database is down"), "{e}");
}

#[test]
fn a_malformed_episode_entry_names_the_program_and_its_stderr_and_kills_it() {
    // A reward sent as a string: the run stops with an error naming the field and episode, the
    // program's command, its stderr tail and the file holding the rest; the program is gone.
    if !python() {
        return;
    }
    let f = Fixture::new();
    let mut s = f.settings("bad_reward");
    let log = f.dir.path().join("env.stderr");
    s.stderr_log = Some(log.clone());
    let mut env = ProcessEnvironment::start(s).unwrap();
    let pid = env.pid().unwrap();
    env.reset(&reset_eps(1, 1)).unwrap();
    let e = env
        .step(&[step("0:0", 1, "x", "1")])
        .unwrap_err()
        .to_string();
    for want in [
        "\"reward\" must be a finite number, not \"1.0\"",
        "episode \"0:0\"",
        "environment `python3 env.py bad_reward",
        "scoring with the string reward",
        &format!("its whole stderr is in {}", log.display()),
    ] {
        assert!(e.contains(want), "{want:?} not in: {e}");
    }
    assert_eq!(env.pid(), None, "the program is still held");
    // The process is gone: /proc has no entry for it (Linux), or it is a zombie being reaped.
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    assert!(stat.is_empty() || stat.contains(") Z "), "{stat}");
}

#[test]
fn a_metric_that_is_not_a_finite_number_stops_the_run_naming_the_episode_and_key() {
    // As a bad reward does (DESIGN.md section 14's additions, "Metrics"): a protocol error
    // naming the episode, the key and the value, and the program.
    if !python() {
        return;
    }
    let f = Fixture::new();
    let mut env = ProcessEnvironment::start(f.settings("bad_metric")).unwrap();
    env.reset(&reset_eps(1, 1)).unwrap();
    let e = env
        .step(&[step("0:0", 1, "x", "1")])
        .unwrap_err()
        .to_string();
    for want in [
        "step reply for episode \"0:0\": \"metrics\" \"correct\" must be a finite number, not null",
        "environment `python3 env.py bad_metric",
    ] {
        assert!(e.contains(want), "{want:?} not in: {e}");
    }
    assert_eq!(env.pid(), None, "the program is still held");
}

#[test]
fn reply_keys_rlvr_does_not_read_are_warned_of_once_with_the_key_meant() {
    // Gymnasium's `terminated` and a misspelt `reward` would pass silently as done = false and
    // no reward: the episode runs to max_turns. Each is named once in the program's stderr log
    // (and on rlvr's stderr), with the key it stands for; a key of no known meaning is named
    // without a guess. The replies are still accepted (an environment may add fields).
    if !python() {
        return;
    }
    let f = Fixture::new();
    let mut s = f.settings("gym_keys");
    let log = f.dir.path().join("env.stderr");
    s.stderr_log = Some(log.clone());
    let mut env = ProcessEnvironment::start(s).unwrap();
    env.reset(&reset_eps(1, 2)).unwrap();
    for turn in 1..=2 {
        let r = env
            .step(&[step("0:0", turn, "x", "1"), step("0:1", turn, "x", "1")])
            .unwrap();
        for e in r {
            let e = e.unwrap();
            assert_eq!((e.done, e.reward), (false, None));
        }
    }
    let text = std::fs::read_to_string(&log).unwrap();
    let warned: Vec<&str> = text
        .lines()
        .filter(|l| l.starts_with("[rlvr: warning"))
        .collect();
    assert_eq!(warned.len(), 3, "{text}");
    assert!(
        warned[0].contains("its step reply carries \"rewrad\", which rlvr does not read")
            && warned[0].contains("did you mean \"reward\"?"),
        "{text}"
    );
    assert!(
        warned[1].contains("\"terminated\"") && warned[1].contains("did you mean \"done\"?"),
        "{text}"
    );
    assert!(
        warned[2].contains("\"info\"") && !warned[2].contains("did you mean"),
        "{text}"
    );
}

#[test]
fn the_reply_limit_grows_with_the_episodes_of_a_request() {
    // 8 episodes of 300 kB observations: a 2.4 MB reply line. Over a fixed 1 MiB limit it stops
    // the run; with 400 kB allowed per episode (3.2 MB for this request) it is read.
    if !python() {
        return;
    }
    let f = Fixture::new();
    let eps: Vec<StepEpisode> = (0..8)
        .map(|j| step(&format!("0:{j}"), 1, "x", "1"))
        .collect();
    let mut s = f.settings("wide");
    s.max_reply_bytes = 1 << 20;
    let mut env = ProcessEnvironment::start(s.clone()).unwrap();
    env.reset(&reset_eps(1, 8)).unwrap();
    let e = env.step(&eps).unwrap_err().to_string();
    assert!(e.contains("passed 1048576 bytes"), "{e}");
    s.episode_reply_bytes = 400_000;
    let mut env = ProcessEnvironment::start(s).unwrap();
    env.reset(&reset_eps(1, 8)).unwrap();
    let r = env.step(&eps).unwrap();
    assert_eq!(r.len(), 8);
    assert_eq!(r[7].as_ref().unwrap().messages[0].content.len(), 300_000);
}

#[test]
fn groups_whose_resets_differ_stop_the_run_naming_the_group() {
    if !python() {
        return;
    }
    let f = Fixture::new();
    let mut env = ProcessEnvironment::start(f.settings("differ")).unwrap();
    env.reset(&reset_eps(2, 1)).unwrap();
    let e = env.reset(&reset_eps(2, 2)).unwrap_err().to_string();
    assert!(
        e.contains("group \"0\"") && e.contains("\"0:0\" and \"0:1\""),
        "{e}"
    );
}

#[test]
fn special_tokens_in_observations_make_the_episode_unscorable() {
    if !python() {
        return;
    }
    let f = Fixture::new();
    let mut s = f.settings("special");
    s.special_tokens = vec!["<|im_start|>".into(), "<|im_end|>".into()];
    let mut env = ProcessEnvironment::start(s).unwrap();
    let r = env
        .step(&[step("0:0", 1, "x", "1"), step("0:1", 1, "boom", "1")])
        .unwrap();
    let e = r[0].as_ref().unwrap_err();
    assert!(
        e.contains("\"<|im_end|>\"") && e.contains("messages[0].content"),
        "{e}"
    );
    assert_eq!(r[1], Err("tool crashed".to_string()));
    // Allowed when no special tokens are listed.
    let mut env = ProcessEnvironment::start(f.settings("special")).unwrap();
    let r = env.step(&[step("0:0", 1, "x", "1")]).unwrap();
    assert_eq!(r[0].as_ref().unwrap().messages[0].content, "x<|im_end|>y");
}

/// A reply to the last turn (`max_turns`) is never rendered (the episode is finished with reason
/// `max_turns`), so a special token in it is accepted; the same reply to an earlier turn, which
/// would be rendered as the next observation, is still refused. Before, both were refused, and
/// the episode lost its reward.
#[test]
fn special_tokens_in_the_last_turns_reply_are_accepted() {
    if !python() {
        return;
    }
    let f = Fixture::new();
    let specials = vec!["<|im_start|>".to_string(), "<|im_end|>".to_string()];
    for (max_turns, turn, accepted) in [(2, 2, true), (2, 3, true), (2, 1, false), (1, 1, true)] {
        let mut s = f.settings("special");
        s.special_tokens = specials.clone();
        s.max_turns = Some(max_turns);
        let mut env = ProcessEnvironment::start(s).unwrap();
        let r = env.step(&[step("0:0", turn, "x", "1")]).unwrap();
        match accepted {
            true => assert_eq!(
                r[0].as_ref().unwrap().messages[0].content,
                "x<|im_end|>y",
                "max_turns {max_turns}, turn {turn}"
            ),
            false => assert!(
                r[0].as_ref().unwrap_err().contains("\"<|im_end|>\""),
                "max_turns {max_turns}, turn {turn}: {r:?}"
            ),
        }
    }
}
