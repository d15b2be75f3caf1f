//! Restart replay (crates/rlvr-env/src/replay.rs): a program that keeps state per episode and dies
//! mid-episode gets, after its restart, each live episode's `reset` and earlier `step`s again, so
//! every reply (and so every reward) equals an uninterrupted run's; a program whose replies
//! change across a restart fails those episodes as not deterministic. Skipped nowhere: python3
//! is required (crate::faults::python).

use rlvr_env::client::{ProcessEnvironment, ProcessSettings};
use rlvr_env::json::Json;
use rlvr_env::protocol::{FinishEpisode, FinishReason, ResetEpisode, StepEpisode};
use rlvr_env::{Environment, Faults};
use std::time::Duration;

/// A stateful environment: `reset` sets an episode's total to its seed mod 10, each `step` adds
/// the turn's text length and reports the total (done at turn 3, rewarded the total), `finish`
/// rewards the total. An id it does not know starts from 0 (the quiet fault replay prevents).
/// Modes: `steady`; `die` (the first program dies at its 2nd step request); `die_twice` (and the
/// second at its 1st, a replayed step); `nondet` (dies like `die`, and its reset text carries a
/// per-process salt).
const STATEFUL_PY: &str = r#"
import json, os, sys, random
mode, marker = sys.argv[1], sys.argv[2]
deaths = {"steady": [], "die": [(marker, 2)], "nondet": [(marker, 2)],
          "die_twice": [(marker, 2), (marker + ".2", 1)]}[mode]
salt = " salt %f" % random.random() if mode == "nondet" else ""
state, steps_seen = {}, 0
for line in sys.stdin:
    req = json.loads(line)
    t = req["type"]
    if t == "hello":
        out = {"version": 1}
    elif t == "reset":
        eps = []
        for e in req["episodes"]:
            state[e["id"]] = e["seed"] % 10
            eps.append({"id": e["id"], "messages": [{"role": "user", "content": "start %d%s" % (state[e["id"]], salt)}]})
        out = {"episodes": eps}
    elif t == "step":
        steps_seen += 1
        for m, n in deaths:
            if not os.path.exists(m):
                if steps_seen == n:
                    open(m, "w").close(); print("dying mid-episode", file=sys.stderr, flush=True); os._exit(3)
                break
        eps = []
        for e in req["episodes"]:
            s = state.get(e["id"], 0) + len(e["text"])
            state[e["id"]] = s
            done = e["turn"] >= 3
            eps.append({"id": e["id"], "messages": [{"role": "user", "content": "total %d" % s}],
                        "reward": float(s) if done else 0.0, "done": done})
        out = {"episodes": eps}
    else:
        out = {"episodes": [{"id": e["id"], "reward": float(state.pop(e["id"], 0))} for e in req["episodes"]]}
    print(json.dumps(out), flush=True)
"#;

fn start(dir: &std::path::Path, mode: &str, restarts: u32) -> ProcessEnvironment {
    std::fs::write(dir.join("stateful.py"), STATEFUL_PY).unwrap();
    let marker = dir.join("marker").display().to_string();
    let mut s = ProcessSettings::new(vec![
        "python3".into(),
        "stateful.py".into(),
        mode.into(),
        marker,
    ]);
    s.dir = Some(dir.to_path_buf());
    s.timeout = Duration::from_secs(20);
    s.restarts = restarts;
    ProcessEnvironment::start(s).unwrap()
}

fn turn(id: &str, turn: u32, text: &str) -> StepEpisode {
    StepEpisode {
        id: id.into(),
        turn,
        text: text.into(),
        tool_calls: vec![],
        tool_call_errors: vec![],
    }
}

/// Runs 2 groups × 2 episodes as the episode driver does: reset; step turn 1 for all; turn 2 for
/// three of them while `1:1` is finished (`max_turns`); turn 3 (done) for the three. Returns
/// every reply, in order, as text.
fn script(env: &mut dyn Environment) -> Result<Vec<String>, rlvr_env::EnvError> {
    let ids = ["0:0", "0:1", "1:0", "1:1"];
    let resets: Vec<ResetEpisode> = ids
        .iter()
        .map(|id| {
            let g: u64 = id[..1].parse().unwrap();
            ResetEpisode {
                id: (*id).into(),
                group: g.to_string(),
                sample: id[2..].parse().unwrap(),
                seed: 13 + g,
                row: Json::object([("q", Json::from("x"))]),
                prompt: None,
            }
        })
        .collect();
    let mut out = vec![format!("{:?}", env.reset(&resets)?)];
    let t1: Vec<StepEpisode> = ids
        .iter()
        .enumerate()
        .map(|(i, id)| turn(id, 1, &"a".repeat(i + 1)))
        .collect();
    out.push(format!("{:?}", env.step(&t1)?));
    let t2: Vec<StepEpisode> = ids[..3]
        .iter()
        .enumerate()
        .map(|(i, id)| turn(id, 2, &"bb".repeat(i + 1)))
        .collect();
    out.push(format!("{:?}", env.step(&t2)?));
    let fin = FinishEpisode {
        id: "1:1".into(),
        reason: FinishReason::MaxTurns,
    };
    out.push(format!("{:?}", env.finish(&[fin])?));
    let t3: Vec<StepEpisode> = ids[..3].iter().map(|id| turn(id, 3, "c")).collect();
    out.push(format!("{:?}", env.step(&t3)?));
    Ok(out)
}

#[test]
fn a_stateful_program_that_dies_mid_episode_answers_as_an_uninterrupted_one() {
    if !crate::faults::python() {
        return;
    }
    let steady_dir = tempfile::tempdir().unwrap();
    let mut steady = start(steady_dir.path(), "steady", 0);
    let want = script(&mut steady).unwrap();
    assert_eq!(steady.starts(), 1);
    // Every episode ended (done, finish): nothing is kept for a replay.
    assert_eq!(steady.kept_episodes(), 0);
    // The totals the replies carry, by hand: seeds 13 and 14 → 3 and 4; turn 1 adds 1..4, turn
    // 2 adds 2, 4, 6, turn 3 adds 1: "0:0" ends at 3+1+2+1 = 7, "1:0" at 4+3+6+1 = 14, and
    // "1:1" is finished at 4+4 = 8.
    assert!(want[4].contains("reward: Some(7.0)"), "{}", want[4]);
    assert!(want[4].contains("reward: Some(14.0)"), "{}", want[4]);
    assert!(want[3].contains("reward: Some(8.0)"), "{}", want[3]);

    // Dies at its second step request (turn 2); the restarted program gets turn 2 after the
    // replay, and "1:1"'s finish after its own replay (it was not in the retried request).
    let dir = tempfile::tempdir().unwrap();
    let mut env = start(dir.path(), "die", 1);
    assert_eq!(script(&mut env).unwrap(), want);
    assert_eq!((env.starts(), env.kept_episodes()), (2, 0));
    assert_eq!(
        env.faults(),
        Faults {
            restarts: 1,
            replayed: 4,
            diverged: 0,
            closed: 0
        }
    );

    // A death during the replay is one more restart, and the replay begins again.
    let dir = tempfile::tempdir().unwrap();
    let mut env = start(dir.path(), "die_twice", 2);
    assert_eq!(script(&mut env).unwrap(), want);
    assert_eq!((env.starts(), env.faults().restarts), (3, 2));
    // ... bounded by env.restarts like any other.
    let dir = tempfile::tempdir().unwrap();
    let mut env = start(dir.path(), "die_twice", 1);
    let e = script(&mut env).unwrap_err().to_string();
    assert!(
        e.contains("after 1 restarts") && e.contains("dying mid-episode"),
        "{e}"
    );
}

#[test]
fn a_program_whose_replies_change_across_a_restart_fails_the_replayed_episodes() {
    if !crate::faults::python() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let mut env = start(dir.path(), "nondet", 1);
    let ids = ["0:0", "0:1", "1:0", "1:1"];
    let resets: Vec<ResetEpisode> = ids
        .iter()
        .map(|id| ResetEpisode {
            id: (*id).into(),
            group: id[..1].into(),
            sample: id[2..].parse().unwrap(),
            seed: 13,
            row: Json::Object(vec![]),
            prompt: None,
        })
        .collect();
    env.reset(&resets).unwrap();
    let t1: Vec<StepEpisode> = ids.iter().map(|id| turn(id, 1, "a")).collect();
    assert!(env.step(&t1).unwrap().iter().all(|r| r.is_ok()));
    // The program dies at turn 2: the replayed resets carry another salt.
    let t2: Vec<StepEpisode> = ids[..3].iter().map(|id| turn(id, 2, "b")).collect();
    let r = env.step(&t2).unwrap();
    for e in &r {
        let e = e.as_ref().unwrap_err();
        assert!(
            e.contains("not deterministic across a restart")
                && e.contains("replayed reset reply gives other messages"),
            "{e}"
        );
    }
    // The one left out of that request fails at its own replay, when its finish is sent.
    let fin = FinishEpisode {
        id: "1:1".into(),
        reason: FinishReason::MaxTurns,
    };
    let r = env.finish(&[fin]).unwrap();
    assert!(r[0]
        .as_ref()
        .unwrap_err()
        .contains("not deterministic across a restart"));
    assert_eq!(
        env.faults(),
        Faults {
            restarts: 1,
            replayed: 4,
            diverged: 4,
            closed: 4
        }
    );
}

/// A program that holds a resource per episode (an entry in `open`) from its `reset` until its
/// `finish` (or `done`), and writes each event to a ledger (`ledger`: `START reset|finish ID
/// [REASON] open=N`, START counting the programs). Its observations carry a per-process salt
/// (every replay differs); the first program dies at its 2nd step request (`marker`); a later
/// program fails the replayed reset of `0:1` itself (an `error` entry, holding nothing for it).
const LEDGER_PY: &str = r#"
import json, os, sys, random
marker, ledger = sys.argv[1], sys.argv[2]
start = 2 if os.path.exists(marker) else 1
salt = random.randrange(10**9)
opened, steps_seen = set(), 0
def note(s):
    with open(ledger, "a") as f:
        f.write("%d %s open=%d\n" % (start, s, len(opened)))
for line in sys.stdin:
    req = json.loads(line)
    t = req["type"]
    if t == "hello":
        out = {"version": 1}
    elif t == "reset":
        eps = []
        for e in req["episodes"]:
            if start == 2 and e["id"] == "0:1":
                eps.append({"id": e["id"], "error": "no sandbox left"}); continue
            opened.add(e["id"]); note("reset " + e["id"])
            eps.append({"id": e["id"], "messages": [{"role": "user", "content": "salt %d" % salt}]})
        out = {"episodes": eps}
    elif t == "step":
        steps_seen += 1
        if start == 1 and steps_seen == 2:
            open(marker, "w").close(); os._exit(3)
        out = {"episodes": [{"id": e["id"], "messages": [{"role": "user", "content": "ok"}],
                             "done": False} for e in req["episodes"]]}
    else:
        for e in req["episodes"]:
            opened.discard(e["id"]); note("finish %s %s" % (e["id"], e["reason"]))
        out = {"episodes": [{"id": e["id"], "reward": 1.0} for e in req["episodes"]]}
    print(json.dumps(out), flush=True)
"#;

/// An episode whose replay differs is failed by rlvr; the restarted program, which got its
/// replayed `reset` (and steps) and so holds its state, is sent `finish` with reason `error` for
/// it, once, so it frees what it holds (DESIGN.md section 14's additions, "Closing failed
/// replays"). An episode whose replayed reset the program failed itself gets none. Before this,
/// the second program ended holding 3 episodes no request would ever name again.
#[test]
fn a_restarted_program_gets_finish_for_each_episode_whose_replay_differed() {
    if !crate::faults::python() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("ledger.py"), LEDGER_PY).unwrap();
    let ledger = dir.path().join("ledger.txt");
    let mut s = ProcessSettings::new(vec![
        "python3".into(),
        "ledger.py".into(),
        dir.path().join("marker").display().to_string(),
        ledger.display().to_string(),
    ]);
    s.dir = Some(dir.path().to_path_buf());
    s.timeout = Duration::from_secs(20);
    s.restarts = 1;
    let mut env = ProcessEnvironment::start(s).unwrap();
    let ids = ["0:0", "0:1", "1:0", "1:1"];
    let resets: Vec<ResetEpisode> = ids
        .iter()
        .map(|id| ResetEpisode {
            id: (*id).into(),
            group: id[..1].into(),
            sample: id[2..].parse().unwrap(),
            seed: 13,
            row: Json::Object(vec![]),
            prompt: None,
        })
        .collect();
    assert!(env.reset(&resets).unwrap().iter().all(|r| r.is_ok()));
    let t1: Vec<StepEpisode> = ids.iter().map(|id| turn(id, 1, "a")).collect();
    assert!(env.step(&t1).unwrap().iter().all(|r| r.is_ok()));
    // The first program dies at turn 2; the replayed resets carry the new program's salt.
    let t2: Vec<StepEpisode> = ids[..3].iter().map(|id| turn(id, 2, "b")).collect();
    let r = env.step(&t2).unwrap();
    assert!(r.iter().all(|e| e
        .as_ref()
        .unwrap_err()
        .contains("not deterministic across a restart")));
    // The one left out of that request diverges at its own replay; its finish (max_turns) is
    // not sent, the closing one (error) is.
    let fin = FinishEpisode {
        id: "1:1".into(),
        reason: FinishReason::MaxTurns,
    };
    assert!(env.finish(&[fin]).unwrap()[0].is_err());
    assert_eq!(
        env.faults(),
        Faults {
            restarts: 1,
            replayed: 4,
            diverged: 4,
            closed: 3
        }
    );
    assert_eq!(env.kept_episodes(), 0);
    drop(env);
    let text = std::fs::read_to_string(&ledger).unwrap();
    let second: Vec<&str> = text.lines().filter_map(|l| l.strip_prefix("2 ")).collect();
    assert_eq!(
        second,
        [
            // The replay of turn 2's request: 0:1's reset is failed by the program itself.
            "reset 0:0 open=1",
            "reset 1:0 open=2",
            "finish 0:0 error open=1",
            "finish 1:0 error open=0",
            // 1:1's replay, before its finish.
            "reset 1:1 open=1",
            "finish 1:1 error open=0",
        ],
        "{text}"
    );
    // The first program never got a finish (it died holding all four).
    assert!(!text.lines().any(|l| l.starts_with("1 finish")), "{text}");
}

/// Records each request's episodes on the ledger (`reset ID`, `step ID`, `finish ID REASON`);
/// observations hold `<|im_end|>` as text for `bad` (its reset) and `late` and `last` (their
/// first step, `last`'s with `done`).
const REFUSED_PY: &str = r#"
import json, sys
ledger = sys.argv[1]
def note(s):
    with open(ledger, "a") as f:
        f.write(s + "\n")
for line in sys.stdin:
    req = json.loads(line)
    t = req["type"]
    eps = []
    if t == "hello":
        print(json.dumps({"version": 1}), flush=True); continue
    for e in req["episodes"]:
        i = e["id"]
        if t == "reset":
            note("reset " + i)
            text = "a <|im_end|> b" if i == "bad" else "hi"
            eps.append({"id": i, "messages": [{"role": "user", "content": text}]})
        elif t == "step":
            note("step " + i)
            text = "x <|im_end|>" if i in ("late", "last") else "ok"
            eps.append({"id": i, "messages": [{"role": "user", "content": text}],
                        "done": i == "last"})
        else:
            note("finish %s %s" % (i, e["reason"]))
            eps.append({"id": i, "reward": 5.0})
    print(json.dumps({"episodes": eps}), flush=True)
"#;

/// An observation the client refuses (a special token as text) fails its episode while the
/// program holds it: the client sends that program `finish` with reason `error` for it at once,
/// once (DESIGN.md section 14's additions, "Closing failed replays"), so the `Err` the caller
/// sees means the episode ended on both sides. A `done` reply holding one is accepted as it is:
/// it is never rendered (before, it was refused too, and the episode lost its reward). Before
/// the closing, refused episodes were only dropped from the replay history, and the program
/// kept them until it exited.
#[test]
fn an_observation_the_client_refuses_gets_its_episode_finished_with_error() {
    if !crate::faults::python() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("refused.py"), REFUSED_PY).unwrap();
    let ledger = dir.path().join("ledger.txt");
    let mut s = ProcessSettings::new(vec![
        "python3".into(),
        "refused.py".into(),
        ledger.display().to_string(),
    ]);
    s.dir = Some(dir.path().to_path_buf());
    s.timeout = Duration::from_secs(20);
    s.special_tokens = vec!["<|im_end|>".into()];
    let mut env = ProcessEnvironment::start(s).unwrap();
    let ids = ["bad", "late", "last", "good"];
    let resets: Vec<ResetEpisode> = ids
        .iter()
        .map(|id| ResetEpisode {
            id: (*id).into(),
            group: (*id).into(),
            sample: 0,
            seed: 1,
            row: Json::Object(vec![]),
            prompt: None,
        })
        .collect();
    let r = env.reset(&resets).unwrap();
    assert!(
        r[0].as_ref().unwrap_err().contains("special token"),
        "{r:?}"
    );
    assert!(r[1..].iter().all(|r| r.is_ok()), "{r:?}");
    let t1: Vec<StepEpisode> = ids[1..].iter().map(|id| turn(id, 1, "a")).collect();
    let r = env.step(&t1).unwrap();
    assert!(
        r[0].as_ref().unwrap_err().contains("special token"),
        "{r:?}"
    );
    let last = r[1].as_ref().unwrap();
    assert!(
        last.done && last.messages[0].content == "x <|im_end|>",
        "{r:?}"
    );
    assert!(!r[2].as_ref().unwrap().done);
    let fin = FinishEpisode {
        id: "good".into(),
        reason: FinishReason::MaxTurns,
    };
    assert_eq!(
        env.finish(&[fin]).unwrap()[0].as_ref().unwrap().reward,
        Some(5.0)
    );
    assert_eq!(
        env.faults(),
        Faults {
            restarts: 0,
            replayed: 0,
            diverged: 0,
            closed: 2
        }
    );
    assert_eq!(env.kept_episodes(), 0);
    drop(env);
    let text = std::fs::read_to_string(&ledger).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(
        lines,
        [
            "reset bad",
            "reset late",
            "reset last",
            "reset good",
            "finish bad error",
            "step late",
            "step last",
            "step good",
            "finish late error",
            "finish good max_turns",
        ],
        "{text}"
    );
}

/// Records `START reset ID`, `START step ID`, `START finish ID REASON`; the first program dies at
/// its first `finish` request.
const DIES_AT_FINISH_PY: &str = r#"
import json, os, sys
marker, ledger = sys.argv[1], sys.argv[2]
start = 2 if os.path.exists(marker) else 1
def note(s):
    with open(ledger, "a") as f:
        f.write("%d %s\n" % (start, s))
for line in sys.stdin:
    req = json.loads(line)
    t = req["type"]
    if t == "hello":
        print(json.dumps({"version": 1}), flush=True); continue
    if t == "finish" and start == 1:
        open(marker, "w").close(); os._exit(3)
    eps = []
    for e in req["episodes"]:
        note("%s %s%s" % (t, e["id"], " " + e["reason"] if t == "finish" else ""))
        eps.append({"id": e["id"], "messages": [{"role": "user", "content": "ok"}], "done": False}
                   if t == "step" else {"id": e["id"]})
    print(json.dumps({"episodes": eps}), flush=True)
"#;

/// A `finish` with reason `error` (rlvr failed the episode after the program answered) that
/// meets a restart is not preceded by the episode's replay: the program that held it died with
/// its state, so the episode is forgotten unsent, while the request's other episodes are
/// replayed and finished as any request's.
#[test]
fn a_closing_finish_after_a_restart_replays_nothing_for_its_episode() {
    if !crate::faults::python() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("dies.py"), DIES_AT_FINISH_PY).unwrap();
    let ledger = dir.path().join("ledger.txt");
    let mut s = ProcessSettings::new(vec![
        "python3".into(),
        "dies.py".into(),
        dir.path().join("marker").display().to_string(),
        ledger.display().to_string(),
    ]);
    s.dir = Some(dir.path().to_path_buf());
    s.timeout = Duration::from_secs(20);
    s.restarts = 1;
    let mut env = ProcessEnvironment::start(s).unwrap();
    let resets: Vec<ResetEpisode> = ["a", "b"]
        .iter()
        .map(|id| ResetEpisode {
            id: (*id).into(),
            group: (*id).into(),
            sample: 0,
            seed: 3,
            row: Json::Object(vec![]),
            prompt: None,
        })
        .collect();
    assert!(env.reset(&resets).unwrap().iter().all(|r| r.is_ok()));
    let r = env.step(&[turn("a", 1, "x"), turn("b", 1, "y")]).unwrap();
    assert!(r.iter().all(|r| r.is_ok()));
    let fin = |id: &str, reason| FinishEpisode {
        id: id.into(),
        reason,
    };
    let r = env
        .finish(&[
            fin("a", FinishReason::Error),
            fin("b", FinishReason::MaxTurns),
        ])
        .unwrap();
    assert!(
        r.iter().all(|r| r.as_ref().unwrap().reward.is_none()),
        "{r:?}"
    );
    assert_eq!(env.faults().restarts, 1);
    assert_eq!(env.faults().replayed, 1);
    assert_eq!(env.kept_episodes(), 0);
    drop(env);
    let text = std::fs::read_to_string(&ledger).unwrap();
    let second: Vec<&str> = text.lines().filter_map(|l| l.strip_prefix("2 ")).collect();
    assert_eq!(
        second,
        ["reset b", "step b", "finish b max_turns"],
        "{text}"
    );
}
