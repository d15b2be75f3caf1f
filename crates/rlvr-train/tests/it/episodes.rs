//! Multi-turn episodes (docs/DESIGN.md section 14) through the explorer and the trainer, on the
//! tiny character model with a small chat template whose end-of-turn token is the tokenizer's
//! `<|endoftext|>`, driven by the built-in `retry` environment over the arithmetic verifier:
//!
//! - `max_turns = 1` samples exactly the single-turn batch (ids, behaviour log-probs, versions,
//!   groups, bit for bit) and gives the verifier's reward to every turn that ended on the
//!   end-of-turn token (a turn cut by `max_new_tokens` gets `finish`, which `retry` scores 0);
//! - multi-turn rows are `a_1 b_1 a_2 …` with the mask 1 exactly on sampled ids, bridges equal to
//!   the template's rendering of the retry message, and the trainer's log-probs over the stored
//!   rows equal the sampler's at every sampled position (importance ratio 1 on-policy);
//! - garbage written into the behaviour log-probs at bridge positions changes nothing in a step
//!   (loss, every statistic, gradient norm, weights bit for bit), with and without a
//!   sequence-level mismatch correction;
//! - a whole `rlvr train` run with `[env]` writes the `env/*` metrics;
//! - a stateful program environment that dies mid-episode gets its live episodes replayed, so
//!   the batch equals an uninterrupted run's.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use candle_core::{DType, Device};
use rlvr_data::generate::Split;
use rlvr_data::sampler::PromptSampler;
use rlvr_model::Model;
use rlvr_train::config::{settings, RawConfig, ResolvedConfig};
use rlvr_train::feed::backend::{self, BackendSettings, NativeWeights, ServerUse, Workload};
use rlvr_train::feed::explorer::{Explorer, TrainPrompts};
use rlvr_train::feed::prompts::prepare_prompts;
use rlvr_train::store::experience::Experience;

use crate::common::{arithmetic_sets, tiny_model};

/// A chat template in the model's characters: `role:content<|endoftext|>` per message, `=>` as
/// the generation prompt.
const TEMPLATE: &str = "{% for m in messages %}{{ m.role }}:{{ m.content }}<|endoftext|>\n\
                        {% endfor %}{% if add_generation_prompt %}=>{% endif %}";

fn config(model: &Path, run: &Path, extra: &[&str]) -> ResolvedConfig {
    let tpl = run.parent().unwrap().join("chat.jinja");
    std::fs::write(&tpl, TEMPLATE).unwrap();
    let mut sets = arithmetic_sets(model, run);
    sets.push("rollout.max_new_tokens=6".into());
    sets.push(format!("env.chat_template=\"{}\"", tpl.display()));
    sets.extend(extra.iter().map(|s| s.to_string()));
    RawConfig::load(None, &sets).unwrap().resolve().unwrap()
}

fn single_turn(cfg: &ResolvedConfig) -> ResolvedConfig {
    let mut c = cfg.clone();
    c.raw.env = Default::default();
    c
}

/// The explorer `rlvr train` builds for `cfg` (native backend over `model`, version 0).
fn explorer(cfg: &ResolvedConfig, model: &Model, dir: &Path) -> Explorer {
    let c = &cfg.raw;
    let tok = settings::load_tokenizer(dir).unwrap();
    let p = prepare_prompts(&c.data, Split::Train, &tok, settings::scoring(c)).unwrap();
    let ids = p
        .encode(&tok, settings::add_special_tokens(&c.data))
        .unwrap();
    let reward = Arc::new(settings::reward_function(c).unwrap());
    let rollout = backend::build(
        &BackendSettings::Native,
        model,
        &tok,
        0,
        Workload {
            longest_prompt: 8,
            max_new_tokens: 6,
            room_key: "rollout.max_new_tokens",
        },
        NativeWeights::Copy,
        &ServerUse::Fixed {
            command: "test",
            share: false,
        },
    )
    .unwrap();
    let runner = c
        .env
        .is_on()
        .then(|| settings::episode_runner(&cfg.raw, &tok, &reward, None).unwrap());
    let sampler = PromptSampler::new(p.texts.len(), c.data.seed).unwrap();
    let ex = Explorer::new(
        rollout,
        settings::load_tokenizer(dir).unwrap(),
        TrainPrompts {
            ids,
            texts: p.texts,
            references: p.references,
            rows: p.rows,
            columns: p.columns,
        },
        sampler,
        reward,
        settings::explorer_settings(cfg, &tok.eos_ids),
    )
    .unwrap();
    match runner {
        Some(r) => ex.with_episodes(r, true),
        None => ex,
    }
}

struct Fixture {
    _tmp: tempfile::TempDir,
    model_dir: PathBuf,
    run: PathBuf,
    model: Model,
}

fn fixture() -> Fixture {
    let tmp = tempfile::tempdir().unwrap();
    let model_dir = tiny_model(tmp.path(), 3);
    let run = tmp.path().join("run");
    let model = Model::load(&model_dir, DType::F32, &Device::Cpu).unwrap();
    Fixture {
        model_dir,
        run,
        model,
        _tmp: tmp,
    }
}

fn eot(f: &Fixture) -> u32 {
    let tok = settings::load_tokenizer(&f.model_dir).unwrap();
    tok.eos_ids[0]
}

#[test]
fn one_turn_samples_the_single_turn_batch_bit_for_bit() {
    let f = fixture();
    let cfg = config(
        &f.model_dir,
        &f.run,
        &["env.builtin=\"retry\"", "env.max_turns=1"],
    );
    let single = explorer(&single_turn(&cfg), &f.model, &f.model_dir)
        .produce(1)
        .unwrap();
    let mut ex = explorer(&cfg, &f.model, &f.model_dir);
    let multi = ex.produce(1).unwrap();
    assert_eq!(single.experiences.len(), 16);
    assert_eq!(multi.experiences.len(), 16);
    let eot = eot(&f);
    let (mut on_eot, mut cut) = (0, 0);
    for (a, b) in single.experiences.iter().zip(&multi.experiences) {
        assert_eq!(a.prompt_ids, b.prompt_ids);
        assert_eq!(a.completion_ids, b.completion_ids);
        let bits = |e: &Experience| -> Vec<u32> {
            e.behaviour_logprobs.iter().map(|x| x.to_bits()).collect()
        };
        assert_eq!(bits(a), bits(b));
        assert_eq!((&a.group_id, a.version), (&b.group_id, b.version));
        assert_eq!(
            b.completion_mask.as_deref(),
            Some(&vec![1u8; a.completion_ids.len()][..])
        );
        assert_eq!(b.turns, Some(1));
        if a.completion_ids.last() == Some(&eot) {
            on_eot += 1;
            // The verifier's judgement, as retry's reward 1 or 0.
            assert_eq!(
                b.reward,
                Some(if a.correct == Some(true) { 1.0 } else { 0.0 })
            );
            assert_eq!(a.truncated, b.truncated);
        } else {
            cut += 1;
            assert!(b.truncated);
            assert_eq!(b.reward, Some(0.0));
        }
    }
    assert!(
        on_eot > 0,
        "no completion ended on the end-of-turn token ({cut} cut)"
    );
    let env = multi.env.unwrap();
    assert_eq!((env.episodes, env.errors), (16, 0));
    // The next batch follows the same cursor.
    let again = ex.produce(2).unwrap();
    assert_eq!(again.experiences.len(), 16);
}

/// Multi-turn episodes of the retry environment: 3 turns at most.
fn multi_turn_batch(f: &Fixture, extra: &[&str]) -> (ResolvedConfig, Vec<Experience>) {
    let mut sets = vec!["env.builtin=\"retry\"", "env.max_turns=3"];
    sets.extend_from_slice(extra);
    let cfg = config(&f.model_dir, &f.run, &sets);
    let b = explorer(&cfg, &f.model, &f.model_dir).produce(1).unwrap();
    (cfg, b.experiences)
}

#[test]
fn episodes_are_turns_and_bridges_with_the_mask_on_sampled_ids() {
    let f = fixture();
    let (_, exps) = multi_turn_batch(&f, &[]);
    let tok = settings::load_tokenizer(&f.model_dir).unwrap();
    let eot = eot(&f);
    // The retry message as the template renders it after a turn.
    let bridge_text = "\nuser:That is not correct. Please try again.<|endoftext|>\n=>";
    let bridge = tok.encode(bridge_text, false).unwrap();
    let mut multi = 0;
    for e in &exps {
        let m = e.completion_mask.as_ref().unwrap();
        assert_eq!(m.len(), e.completion_ids.len());
        assert_eq!(m.last(), Some(&1), "an episode never ends in a bridge");
        // Split the row at its bridges: each is the rendered retry message, each sampled run
        // but the last ends on the end-of-turn token.
        let mut j = 0;
        let mut turns = 0;
        while j < m.len() {
            let start = j;
            while j < m.len() && m[j] == 1 {
                j += 1;
            }
            turns += 1;
            if j < m.len() {
                assert_eq!(
                    e.completion_ids[j - 1],
                    eot,
                    "a bridge follows a turn's end"
                );
                assert_eq!(&e.completion_ids[j..j + bridge.len()], &bridge[..]);
                assert!(m[j..j + bridge.len()].iter().all(|&x| x == 0));
                assert!(e.behaviour_logprobs[j..j + bridge.len()]
                    .iter()
                    .all(|&x| x == 0.0));
                j += bridge.len();
            }
            assert!(j > start);
        }
        assert_eq!(Some(turns), e.turns);
        assert!(turns <= 3);
        // One reward entry per stepped turn (a wrong one's is null); a turn cut by
        // max_new_tokens is finished, and retry's finish gives none.
        let stepped = turns as usize - usize::from(e.completion_ids.last() != Some(&eot));
        assert_eq!(e.turn_rewards.len(), stepped);
        if turns > 1 {
            multi += 1;
            assert_eq!(e.turn_rewards[0], None, "a wrong first turn has no reward");
        }
    }
    assert!(multi > 0, "no episode took a second turn");
}

#[test]
fn on_policy_ratio_is_one_on_the_sampled_tokens_of_episodes() {
    let f = fixture();
    let (cfg, exps) = multi_turn_batch(&f, &[]);
    assert!(exps.iter().any(|e| e.turns > Some(1)));
    let lp =
        rlvr_train::score::score_rows(&f.model, &exps, 3, cfg.raw.rollout.temperature, 0, false)
            .unwrap();
    let mut worst = 0f32;
    let mut n = 0;
    for (e, l) in exps.iter().zip(&lp) {
        for (j, (&x, &old)) in l.iter().zip(&e.behaviour_logprobs).enumerate() {
            if e.sampled(j) {
                worst = worst.max((x - old).abs());
                n += 1;
            }
        }
    }
    assert!(n > 100);
    assert!(
        worst <= 1e-5,
        "max |ℓ_trainer − ℓ_sampler| = {worst} over {n} sampled tokens"
    );
}

fn trainer(cfg: &ResolvedConfig, model: &Model) -> rlvr_train::update::Trainer {
    rlvr_train::update::Trainer::new(
        model.try_clone().unwrap(),
        None,
        settings::trainer_settings(cfg, 0),
    )
    .unwrap()
}

fn weights(t: &rlvr_train::update::Trainer) -> Vec<u32> {
    t.model
        .named_vars()
        .iter()
        .flat_map(|(_, v)| {
            v.as_tensor()
                .flatten_all()
                .unwrap()
                .to_vec1::<f32>()
                .unwrap()
        })
        .map(f32::to_bits)
        .collect()
}

#[test]
fn garbage_at_bridge_positions_changes_nothing() {
    let f = fixture();
    for extra in [
        &["algorithm.preset=\"grpo\""][..],
        &[
            "algorithm.preset=\"grpo\"",
            "algorithm.mismatch_correction=\"geometric-mask\"",
        ],
        &["algorithm.preset=\"gspo\""],
        &["algorithm.preset=\"cispo\""],
        &["algorithm.preset=\"rec_oneside_is\""],
    ] {
        let (cfg, mut exps) = multi_turn_batch(&f, extra);
        // Rewards with variance (the random model is rarely right): what is tested is the mask.
        for (i, e) in exps.iter_mut().enumerate() {
            e.reward = Some((i % 3) as f64);
        }
        let mut dirty = exps.clone();
        let mut bridges = 0;
        for e in &mut dirty {
            for j in 0..e.completion_ids.len() {
                if !e.sampled(j) {
                    e.behaviour_logprobs[j] = [-1e4, f32::NAN, 0.0, -7.5][j % 4];
                    bridges += 1;
                }
            }
        }
        assert!(bridges > 0);
        let (mut a, mut b) = (trainer(&cfg, &f.model), trainer(&cfg, &f.model));
        let before = weights(&a);
        for step in 1..=2 {
            let ra = a.step(&exps, step, 1e-2, 0).unwrap();
            let rb = b.step(&dirty, step, 1e-2, 0).unwrap();
            assert_eq!(
                format!("{ra:?}"),
                format!("{rb:?}"),
                "{extra:?} step {step}"
            );
            assert!(ra.loss.is_some(), "{extra:?} step {step}");
        }
        // The steps updated the weights (a loss at ratio 1 can be exactly 0: the group's
        // advantages sum to 0, while its gradient does not), the same with and without garbage.
        assert_ne!(
            weights(&a),
            before,
            "{extra:?}: no update, nothing compared"
        );
        assert_eq!(weights(&a), weights(&b), "{extra:?}");
        // The normaliser counted sampled tokens only.
        let sampled: usize = exps.iter().map(Experience::sampled_tokens).sum();
        let all: usize = exps.iter().map(|e| e.completion_ids.len()).sum();
        assert!(sampled < all);
    }
}

#[test]
fn a_train_run_with_retry_writes_env_metrics() {
    let f = fixture();
    let cfg = config(
        &f.model_dir,
        &f.run,
        &[
            "train.steps=2",
            "env.builtin=\"retry\"",
            "env.max_turns=2",
            "env.max_episode_tokens=100",
        ],
    );
    rlvr_train::run::train(&cfg, &rlvr_train::run::RunOptions::default()).unwrap();
    let m = rlvr_train::store::metrics::read_metrics(&f.run.join("metrics.jsonl")).unwrap();
    assert_eq!(m.len(), 2);
    for line in &m {
        let turns = line["env/turns/mean"].as_f64().unwrap();
        assert!((1.0..=2.0).contains(&turns), "{turns}");
        let (lo, hi) = (
            line["env/turns/min"].as_f64().unwrap(),
            line["env/turns/max"].as_f64().unwrap(),
        );
        assert!(
            1.0 <= lo && lo <= turns && turns <= hi && hi <= 2.0,
            "{line:?}"
        );
        assert_eq!(line["env/error_frac"].as_f64(), Some(0.0));
        assert_eq!(line["env/tool_call_errors"].as_f64(), Some(0.0));
        assert_eq!(line["env/restarts"].as_f64(), Some(0.0));
        assert_eq!(line["env/replayed"].as_f64(), Some(0.0));
        assert_eq!(line["env/obs_truncated"].as_f64(), Some(0.0));
        assert_eq!(line["env/closed"].as_f64(), Some(0.0));
        assert!(line["time/env_s"].as_f64().unwrap() >= 0.0);
        // retry's metric `solved` (1 or 0 per episode): with env.turn_discount = 1 the reward
        // is the same number, so their means agree.
        let solved = line["env/metrics/solved/mean"].as_f64().unwrap();
        let reward = line["reward/mean"].as_f64().unwrap();
        assert!((solved - reward).abs() < 1e-12, "{solved} {reward}");
        // Per turn index: every episode has turn 1; the reached shares sum to the mean turns
        // (E[T] = Σ P(T ≥ k)); keys for turns 1 and 2 only (env.max_turns).
        assert_eq!(line["env/turn_1/reached"].as_f64(), Some(1.0));
        let reached: f64 = (1..=2)
            .map(|k| line[&format!("env/turn_{k}/reached")].as_f64().unwrap())
            .sum();
        assert!((reached - turns).abs() < 1e-12, "{reached} {turns}");
        assert!(line["env/turn_1/tokens/mean"].as_f64().unwrap() >= 1.0);
        // retry: a turn-1 reward is 1 (correct) or 0, a turn-2 one is 1 or 0 (discount 1).
        let r1 = line["env/turn_1/reward/mean"].as_f64().unwrap();
        assert!((0.0..=1.0).contains(&r1), "{r1}");
        assert!(line.get("env/turn_3/reached").is_none(), "{line:?}");
        // Every episode ended one way: the shares of the ends cover the batch.
        let ends: f64 = ["done", "max_turns", "length", "budget", "eos"]
            .iter()
            .map(|end| line[&format!("env/finish/{end}")].as_f64().unwrap())
            .sum();
        assert!((ends - 1.0).abs() < 1e-12, "{ends}");
        assert!(
            line["env/episode_len/mean"].as_f64().unwrap()
                >= line["completion_len/mean"].as_f64().unwrap()
        );
    }
    let config = std::fs::read_to_string(f.run.join("config.toml")).unwrap();
    assert!(
        config.contains("[env]") && config.contains("builtin = \"retry\""),
        "{config}"
    );
}

#[test]
fn the_python_guess_the_number_example_runs_episodes() {
    let f = fixture();
    let script = crate::common::repo().join("examples/env_guess_number.py");
    let cmd = format!("env.command=[\"python3\", \"{}\"]", script.display());
    let cfg = config(
        &f.model_dir,
        &f.run,
        &[
            &cmd,
            "env.max_turns=3",
            "env.max_episode_tokens=40",
            "env.options={ low = 1, high = 9 }",
        ],
    );
    let mut ex = explorer(&cfg, &f.model, &f.model_dir);
    let b = ex.produce(1).unwrap();
    let tok = settings::load_tokenizer(&f.model_dir).unwrap();
    // The environment replaced the prompt: rendered by the template, the group's K share it.
    let prompt = tok
        .encode(
            "user:Guess my number from 1 to 9. Answer with one number.<|endoftext|>\n=>",
            false,
        )
        .unwrap();
    let env = b.env.clone().unwrap();
    assert_eq!((env.episodes, env.errors), (16, 0));
    let mut bridged = 0;
    for e in &b.experiences {
        assert_eq!(e.prompt_ids, prompt);
        assert!(e.turns.unwrap() >= 1 && e.turns.unwrap() <= 3);
        assert!(e.completion_ids.len() <= 40);
        let m = e.completion_mask.as_ref().unwrap();
        bridged += m.iter().filter(|&&x| x == 0).count();
        // Sum of the turn rewards: 1 for the right guess, -0.1 per turn without a number.
        let sum: f64 = e.turn_rewards.iter().flatten().sum();
        assert_eq!(e.reward, Some(sum));
        // Its metrics say the same: found, and the turns without a number.
        let found = e.env_metrics["found"];
        let no_number = e.env_metrics["no_number_turns"];
        assert_eq!(e.env_metrics.len(), 2);
        assert!((found + -0.1 * no_number - sum).abs() < 1e-12, "{e:?}");
    }
    assert!(bridged > 0, "no episode got the environment's feedback");
    // rollouts.jsonl's lines name the prompt the episodes started from (the replacement, as the
    // tiny tokenizer decodes it: letters are unknown to it), not the dataset's question.
    assert!(!b.rollouts.is_empty());
    let shown = tok.decode(&prompt, false).unwrap();
    assert!(shown.contains(" 1 ") && !shown.contains('+'), "{shown}");
    for r in &b.rollouts {
        assert_eq!(r.prompt, shown);
    }
    // The same batch again from a fresh explorer (and a fresh environment process).
    let again = explorer(&cfg, &f.model, &f.model_dir).produce(1).unwrap();
    assert_eq!(
        format!("{:?}", again.experiences),
        format!("{:?}", b.experiences)
    );
}

/// An environment whose episodes end every way it can make them end: sample 0 of a group says
/// `done` at its first step; the others get "again" until `env.max_turns`, except group 1's
/// sample 1, which fails at its first step.
const ENDS_ENV: &str = r#"
import json, sys
for line in sys.stdin:
    req = json.loads(line)
    t = req["type"]
    if t == "hello":
        out = {"version": 1}
    elif t == "reset":
        out = {"episodes": [{"id": e["id"], "messages": None, "tools": None} for e in req["episodes"]]}
    elif t == "step":
        eps = []
        for e in req["episodes"]:
            if e["id"].endswith(":0"):
                eps.append({"id": e["id"], "reward": 1.0, "done": True, "messages": []})
            elif e["id"] == "1:1":
                eps.append({"id": e["id"], "error": "no such game"})
            else:
                eps.append({"id": e["id"], "reward": 0.0, "done": False,
                            "messages": [{"role": "user", "content": "again"}]})
        out = {"episodes": eps}
    else:
        out = {"episodes": [{"id": e["id"]} for e in req["episodes"]]}
    print(json.dumps(out), flush=True)
"#;

#[test]
fn env_finish_counts_are_the_episodes_ends() {
    // `env/finish/<end>`'s counts (EnvStats::ends) equal the ends the episodes' own records
    // give, and with the failed ones they cover the batch.
    let f = fixture();
    let script = f.run.parent().unwrap().join("ends_env.py");
    std::fs::write(&script, ENDS_ENV).unwrap();
    let cmd = format!("env.command=[\"python3\", \"{}\"]", script.display());
    let cfg = config(
        &f.model_dir,
        &f.run,
        &[
            &cmd,
            "env.max_turns=2",
            "env.max_episode_tokens=40",
            "data.prompts_per_step=16",
            "train.log_rollouts=128",
        ],
    );
    let mut ex = explorer(&cfg, &f.model, &f.model_dir);
    let b = ex.produce(1).unwrap();
    let env = b.env.clone().unwrap();
    assert_eq!(b.rollouts.len(), 128);
    let mut want = rlvr_train::feed::episodes::EndCounts::default();
    let mut errors = 0;
    for r in &b.rollouts {
        match r.finish_reason.as_str() {
            "error" => errors += 1,
            end => {
                let before = want;
                want.count(end);
                assert_ne!(want, before, "an end that is not counted: {end}");
            }
        }
    }
    assert_eq!(env.ends, want);
    // Each line carries the episode's turns and the rewards the environment gave, which sum to
    // its reward (env.reward = "sum"); the failed episode's reward is null.
    for (r, e) in b.rollouts.iter().zip(&b.experiences) {
        assert_eq!(r.turns, e.turns, "{r:?}");
        let given = r.turn_rewards.as_ref().unwrap();
        assert_eq!(given, &e.turn_rewards, "{r:?}");
        match r.finish_reason.as_str() {
            "error" => assert_eq!(r.reward, None, "{r:?}"),
            _ => assert_eq!(r.reward, Some(given.iter().flatten().sum()), "{r:?}"),
        }
    }
    assert_eq!((env.episodes, env.errors), (128, errors));
    let ended: usize = env.ends.named().iter().map(|(_, n)| n).sum();
    assert_eq!(ended + env.errors, env.episodes);
    // The environment's `done`, rlvr's `max_turns` and a cut turn all happened (what the test
    // covers).
    let n = env.ends;
    assert!(
        n.done > 0 && n.max_turns > 0 && n.length + n.budget > 0,
        "{env:?}"
    );
}

/// A stateful environment for restart replay: `reset` sets an episode's number to its seed mod
/// 10, each `step` adds the turn's text length and shows the number (done at turn 3, rewarded
/// the number), `finish` rewards the number; the last reply's metrics hold the number (`n`) and
/// the turn it ended at (`done` only). An id it does not know starts from 0 (the fault a replay
/// prevents). `die`: the first program dies at its 2nd step request; `nondet`: also, and
/// its observations carry a per-process salt.
const STATEFUL_ENV: &str = r#"
import json, os, sys, random
mode, marker = sys.argv[1], sys.argv[2]
salt = " %d" % random.randrange(10**6) if mode == "nondet" else ""
state, steps_seen = {}, 0
for line in sys.stdin:
    req = json.loads(line)
    t = req["type"]
    if t == "hello":
        out = {"version": 1}
    elif t == "reset":
        for e in req["episodes"]:
            state[e["id"]] = e["seed"] % 10
        out = {"episodes": [{"id": e["id"], "messages": None} for e in req["episodes"]]}
    elif t == "step":
        steps_seen += 1
        if mode != "steady" and steps_seen == 2 and not os.path.exists(marker):
            open(marker, "w").close(); os._exit(3)
        eps = []
        for e in req["episodes"]:
            n = state.get(e["id"], 0) + len(e["text"])
            state[e["id"]] = n
            done = e["turn"] >= 3
            r = {"id": e["id"], "messages": [{"role": "user", "content": "%d%s" % (n, salt)}],
                 "reward": float(n) if done else 0.0, "done": done}
            if done:
                r["metrics"] = {"n": n, "turn": e["turn"]}
            eps.append(r)
        out = {"episodes": eps}
    else:
        out = {"episodes": [{"id": e["id"], "reward": float(state.get(e["id"], 0)),
                             "metrics": {"n": state.pop(e["id"], 0)}} for e in req["episodes"]]}
    print(json.dumps(out), flush=True)
"#;

/// One multi-turn batch over [`STATEFUL_ENV`] in `mode`.
fn stateful_batch(f: &Fixture, mode: &str) -> rlvr_train::feed::explorer::Batch {
    let dir = f.run.parent().unwrap().join(format!("stateful-{mode}"));
    std::fs::create_dir_all(&dir).unwrap();
    let script = dir.join("stateful_env.py");
    std::fs::write(&script, STATEFUL_ENV).unwrap();
    let marker = dir.join("died");
    let cmd = format!(
        "env.command=[\"python3\", \"{}\", \"{mode}\", \"{}\"]",
        script.display(),
        marker.display()
    );
    let cfg = config(
        &f.model_dir,
        &f.run,
        &[
            &cmd,
            "env.max_turns=3",
            "env.max_episode_tokens=40",
            "env.max_error_frac=1.0",
        ],
    );
    explorer(&cfg, &f.model, &f.model_dir).produce(1).unwrap()
}

#[test]
fn a_restarted_stateful_environment_gets_its_episodes_replayed() {
    // The program dies at turn 2's step request; its replacement gets each live episode's
    // reset and turn-1 step again, so the batch (ids, masks, rewards) equals an uninterrupted
    // run's. Before the replay the replacement scored them from missing state (0).
    let f = fixture();
    let steady = stateful_batch(&f, "steady");
    let restarted = stateful_batch(&f, "die");
    let rewards = |b: &rlvr_train::feed::explorer::Batch| -> Vec<Option<f64>> {
        b.experiences.iter().map(|e| e.reward).collect()
    };
    assert_eq!(rewards(&restarted), rewards(&steady));
    let (s, r) = (steady.env.clone().unwrap(), restarted.env.clone().unwrap());
    assert_eq!((s.restarts, s.replayed, s.errors), (0, 0, 0));
    assert_eq!(r.restarts, 1);
    // Every episode that reached turn 2 was replayed (in the retried step, or before its
    // finish): those with two turns or more.
    let reached_2 = steady
        .experiences
        .iter()
        .filter(|e| e.turns.unwrap() >= 2)
        .count();
    assert!(reached_2 > 0);
    assert_eq!((r.replayed, r.errors), (reached_2, 0));
    assert!(rewards(&steady).iter().any(|r| r.unwrap() > 0.0));
    // Each episode's metrics (its last reply's: `n` is its reward) are the uninterrupted run's:
    // the replay neither loses nor repeats them (compared with the rest of the rows below).
    for e in &steady.experiences {
        assert_eq!(e.env_metrics.get("n").copied(), e.reward, "{e:?}");
    }
    assert_eq!(
        format!("{:?}", restarted.experiences),
        format!("{:?}", steady.experiences)
    );

    // Observations that change across a restart: every replayed episode is unscorable.
    let nondet = stateful_batch(&f, "nondet");
    let n = nondet.env.clone().unwrap();
    assert_eq!(n.restarts, 1);
    assert!(n.replayed > 0);
    assert_eq!(n.errors, n.replayed);
    let failed = nondet
        .experiences
        .iter()
        .filter(|e| e.reward.is_none())
        .count();
    assert_eq!(failed, n.errors);
    // A failed episode contributes no metrics.
    assert!(nondet
        .experiences
        .iter()
        .all(|e| e.reward.is_some() != e.env_metrics.is_empty()));
}

/// An environment whose every reply is 40 digits (one token each for the tiny tokenizer); the
/// episode is done at turn 2.
const LONG_ENV: &str = r#"
import json, sys
for line in sys.stdin:
    req = json.loads(line)
    t = req["type"]
    if t == "hello":
        out = {"version": 1}
    elif t == "reset":
        out = {"episodes": [{"id": e["id"], "messages": None} for e in req["episodes"]]}
    elif t == "step":
        out = {"episodes": [{"id": e["id"], "messages": [{"role": "user", "content": "0123456789" * 4}],
                             "reward": 1.0, "done": e["turn"] >= 2} for e in req["episodes"]]}
    else:
        out = {"episodes": [{"id": e["id"]} for e in req["episodes"]]}
    print(json.dumps(out), flush=True)
"#;

#[test]
fn long_observations_are_cut_to_fit_keeping_the_side_asked_for() {
    use rlvr_env::truncate::MARKER;
    let f = fixture();
    let script = f.run.parent().unwrap().join("long_env.py");
    std::fs::write(&script, LONG_ENV).unwrap();
    let tok = settings::load_tokenizer(&f.model_dir).unwrap();
    let bridge_of = |content: &str| {
        tok.encode(&format!("\nuser:{content}<|endoftext|>\n=>"), false)
            .unwrap()
    };
    // The bridge's template costs 10 tokens ("\nuser:", the end-of-turn, "\n=>"), the marker 17
    // (one per char): a limit of 34 leaves 7 of the 40 digits.
    assert_eq!(bridge_of("").len(), 10);
    assert_eq!(tok.encode(MARKER, false).unwrap().len(), MARKER.len());
    let digits = "0123456789".repeat(4);
    assert_eq!(bridge_of(&digits).len(), 50);
    let cases = [
        ("error", None),
        ("keep-head", Some(format!("0123456{MARKER}"))),
        ("keep-tail", Some(format!("{MARKER}3456789"))),
        ("keep-ends", Some(format!("0123{MARKER}789"))),
    ];
    for (side, kept) in cases {
        let cmd = format!("env.command=[\"python3\", \"{}\"]", script.display());
        let trunc = format!("env.observation_truncation=\"{side}\"");
        let cfg = config(
            &f.model_dir,
            &f.run,
            &[
                &cmd,
                &trunc,
                "env.max_turns=2",
                "env.max_observation_tokens=34",
                "env.max_episode_tokens=80",
                "env.max_error_frac=1.0",
                "train.log_rollouts=128",
            ],
        );
        let b = explorer(&cfg, &f.model, &f.model_dir).produce(1).unwrap();
        let env = b.env.clone().unwrap();
        let mut bridges = 0;
        for e in &b.experiences {
            let m = e.completion_mask.as_ref().unwrap();
            for seg in rlvr_train::feed::episodes::segments(m) {
                if seg.kind == "bridge" {
                    let want = bridge_of(kept.as_deref().expect("no bridge under error"));
                    assert_eq!(want.len(), 34, "{side}");
                    assert_eq!(
                        &e.completion_ids[seg.start..seg.start + seg.len],
                        &want[..],
                        "{side}"
                    );
                    bridges += 1;
                }
            }
        }
        match &kept {
            None => {
                // Every episode whose first turn was stepped failed, as before this key.
                assert_eq!((env.obs_truncated, bridges), (0, 0));
                assert!(env.errors > 0, "{env:?}");
            }
            Some(k) => {
                assert!(bridges > 0, "{side}: no turn was stepped");
                assert_eq!(env.errors, 0, "{side}");
                // Each cut observation is counted (a turn-2 reply ends its episode with `done`:
                // never bridged, never cut).
                assert_eq!(env.obs_truncated, bridges, "{side}");
                // The transcript shows what the model was shown.
                let shown = b.rollouts.iter().any(|r| r.completion.contains(k.as_str()));
                assert!(shown, "{side}: {:?}", b.rollouts.first());
            }
        }
    }
}

/// A ledger environment: it writes `reset ID`, `done ID`, `failed ID` (its own `error` entry) and
/// `finish ID REASON` to the file it is given, so every way an episode ends is on record. By the
/// group (draw mod 4) its first step answers: 0, 40 digits (too long for the bridge, which rlvr
/// fails under `env.observation_truncation = "error"`); 1, text holding `<|endoftext|>` (the
/// client refuses it); 2, an episode error; 3, `done`.
const LEDGER_ENV: &str = r#"
import json, sys
ledger = sys.argv[1]
def note(s):
    with open(ledger, "a") as f:
        f.write(s + "\n")
for line in sys.stdin:
    req = json.loads(line)
    t = req["type"]
    if t == "hello":
        print(json.dumps({"version": 1}), flush=True); continue
    eps = []
    for e in req["episodes"]:
        i = e["id"]
        kind = int(i.split(":")[0]) % 4
        if t == "reset":
            note("reset " + i)
            eps.append({"id": i, "messages": None})
        elif t == "step":
            if kind == 2:
                note("failed " + i)
                eps.append({"id": i, "error": "no sandbox"})
                continue
            text = {0: "0123456789" * 4, 1: "a<|endoftext|>b", 3: "right"}[kind]
            done = kind == 3
            if done:
                note("done " + i)
            eps.append({"id": i, "messages": [{"role": "user", "content": text}], "reward": 1.0,
                        "done": done})
        else:
            note("finish %s %s" % (i, e["reason"]))
            eps.append({"id": i, "reward": 2.0})
    print(json.dumps({"episodes": eps}), flush=True)
"#;

#[test]
fn every_episode_a_program_was_sent_ends_once_even_when_rlvr_fails_it() {
    // Episodes rlvr makes unscorable itself after the program answered (an observation too long,
    // one holding a special token) get `finish` with reason `error`, once, so a program holding
    // a sandbox per episode frees it; one the program failed itself gets none. Before, the first
    // two kinds were never finished.
    let f = fixture();
    let dir = f.run.parent().unwrap().join("ledger");
    std::fs::create_dir_all(&dir).unwrap();
    let script = dir.join("ledger_env.py");
    std::fs::write(&script, LEDGER_ENV).unwrap();
    let ledger = dir.join("ledger.txt");
    let cmd = format!(
        "env.command=[\"python3\", \"{}\", \"{}\"]",
        script.display(),
        ledger.display()
    );
    let cfg = config(
        &f.model_dir,
        &f.run,
        &[
            &cmd,
            "env.max_turns=3",
            "env.max_observation_tokens=34",
            "env.max_episode_tokens=80",
            "env.max_error_frac=1.0",
            "data.prompts_per_step=16",
        ],
    );
    let b = explorer(&cfg, &f.model, &f.model_dir).produce(1).unwrap();
    let env = b.env.clone().unwrap();
    let text = std::fs::read_to_string(&ledger).unwrap();
    let mut resets: Vec<&str> = Vec::new();
    let mut ends: std::collections::BTreeMap<&str, Vec<String>> = Default::default();
    for l in text.lines() {
        let mut w = l.split(' ');
        let (what, id) = (w.next().unwrap(), w.next().unwrap());
        match what {
            "reset" => resets.push(id),
            "finish" => ends
                .entry(id)
                .or_default()
                .push(format!("finish {}", w.next().unwrap())),
            _ => ends.entry(id).or_default().push(what.to_string()),
        }
    }
    assert_eq!(resets.len(), b.experiences.len());
    for id in &resets {
        assert_eq!(
            ends.get(id).map_or(0, Vec::len),
            1,
            "episode {id}: {:?}\n{text}",
            ends.get(id)
        );
    }
    assert_eq!(ends.len(), resets.len(), "{text}");
    // Which end each kind got, when its first turn was stepped (a turn cut by `length` is
    // finished with that reason before any step).
    let kind = |id: &str| id.split(':').next().unwrap().parse::<usize>().unwrap() % 4;
    let mut seen = [0usize; 4];
    for (id, e) in &ends {
        let e = e[0].as_str();
        if e == "finish length" || e == "finish budget" || e == "finish eos" {
            continue;
        }
        let want: &[&str] = match kind(id) {
            0 | 1 => &["finish error"],
            2 => &["failed"],
            _ => &["done"],
        };
        assert!(want.contains(&e), "episode {id} ended by {e}\n{text}");
        seen[kind(id)] += 1;
    }
    assert!(seen.iter().all(|&n| n > 0), "{seen:?}\n{text}");
    // Every finished-with-error episode is one rlvr counts as failed, and no other.
    let errors = ends
        .values()
        .filter(|e| e[0] == "finish error" || e[0] == "failed")
        .count();
    assert_eq!(env.errors, errors, "{env:?}");
    // `env/closed` counts the episodes sent `finish` with reason `error`.
    let closed = ends.values().filter(|e| e[0] == "finish error").count();
    assert!(closed > 0);
    assert_eq!(env.closed, closed, "{env:?}");
}

#[test]
fn experiences_files_carry_an_optional_mask() {
    use rlvr_train::store::experience::parse_line;
    let f = Path::new("x.jsonl");
    let base = r#""prompt_ids":[1,2],"completion_ids":[3,4,5],"behaviour_logprobs":[-1,0,-2],"reward":1,"group_id":"g""#;
    // Absent (an old file): every token sampled.
    let e = parse_line(&format!("{{{base}}}"), f, 1).unwrap();
    assert_eq!(e.completion_mask, None);
    assert_eq!((e.sampled_tokens(), e.loss_mask()), (3, vec![1.0; 3]));
    let e = parse_line(&format!("{{{base},\"completion_mask\":[1,0,1]}}"), f, 2).unwrap();
    assert_eq!(e.completion_mask, Some(vec![1, 0, 1]));
    assert_eq!(
        (e.sampled_tokens(), e.loss_mask()),
        (2, vec![1.0, 0.0, 1.0])
    );
    for (bad, why) in [
        ("[1,0]", "has 2 entries but completion_ids has 3"),
        ("[1,2,1]", "entry 1 is 2"),
        ("\"101\"", "expected an array"),
    ] {
        let err = parse_line(&format!("{{{base},\"completion_mask\":{bad}}}"), f, 7)
            .unwrap_err()
            .to_string();
        assert!(
            err.starts_with("x.jsonl:7: field `completion_mask`") && err.contains(why),
            "{err}"
        );
    }
}

/// `rollout.cache_salt`: the vLLM client gets the run's salt tag only with "version", and run.json
/// records the choice (docs/vllm.md "Prefix caching").
fn vllm_settings(cache_salt: bool) -> backend::VllmSettings {
    backend::VllmSettings {
        servers: vec!["http://127.0.0.1:8000".into()],
        served_model_name: "rlvr-policy".into(),
        weights_dir: "/tmp/w".into(),
        api_key_env: None,
        request_timeout_s: 180.0,
        retries: 3,
        in_flight: 8,
        accept_renormalised_logprobs: false,
        refresh_tolerance: 0.01,
        cache_salt,
        follower: false,
        served_base: None,
    }
}

#[test]
fn the_vllm_client_gets_the_runs_salt_tag_only_when_asked() {
    let train = ServerUse::Train {
        run_dir: "/runs/a".into(),
    };
    let on = backend::client_config(&vllm_settings(true), &train).unwrap();
    assert_eq!(on.cache_salt, Some(backend::salt_tag(&train)));
    let off = backend::client_config(&vllm_settings(false), &train).unwrap();
    assert_eq!(off.cache_salt, None);
    // A tag vLLM accepts in a salt: rlvr- and 16 hex digits.
    let tag = on.cache_salt.unwrap();
    assert!(tag.starts_with("rlvr-") && tag.len() == 21, "{tag}");
    assert!(tag[5..].chars().all(|c| c.is_ascii_hexdigit()), "{tag}");
    let describe = BackendSettings::Vllm(vllm_settings(true)).describe();
    assert_eq!(describe["cache_salt"], "version");
    let describe = BackendSettings::Vllm(vllm_settings(false)).describe();
    assert_eq!(describe["cache_salt"], "off");
    // The config key: "version" by default, "off" accepted, anything else refused.
    let d = rlvr_train::config::RolloutSection::default();
    assert_eq!(d.cache_salt, rlvr_train::config::CacheSalt::Version);
    let off: rlvr_train::config::RolloutSection = toml::from_str("cache_salt = \"off\"").unwrap();
    assert_eq!(off.cache_salt, rlvr_train::config::CacheSalt::Off);
    assert!(toml::from_str::<rlvr_train::config::RolloutSection>("cache_salt = \"on\"").is_err());
}

#[test]
fn a_training_runs_salt_tag_is_its_run_directorys_and_fixed_uses_never_share_one() {
    let train = |d: &str| ServerUse::Train { run_dir: d.into() };
    // Every rank and a resume of one run directory: one tag; two runs: two tags.
    assert_eq!(
        backend::salt_tag(&train("/runs/a")),
        backend::salt_tag(&train("/runs/a"))
    );
    assert_ne!(
        backend::salt_tag(&train("/runs/a")),
        backend::salt_tag(&train("/runs/b"))
    );
    // A relative run directory is made absolute first.
    let cwd = std::env::current_dir().unwrap();
    assert_eq!(
        backend::salt_tag(&train("r")),
        backend::salt_tag(&ServerUse::Train {
            run_dir: cwd.join("r")
        })
    );
    let eval = ServerUse::Fixed {
        command: "rlvr eval",
        share: false,
    };
    assert_ne!(backend::salt_tag(&eval), backend::salt_tag(&eval));
    assert_ne!(
        backend::salt_tag(&eval),
        backend::salt_tag(&train("/runs/a"))
    );
}

/// A group's environment seed is output number draw + 1 of SplitMix64 started from the run seed:
/// seed 0 gives the reference sequence of Vigna's splitmix64.c (prng.di.unimi.it/splitmix64.c,
/// `x = 0`: 0xE220A8397B1DCDAF, 0x6E789E6AA1B965F4, 0x06C45D188009454F), so the first group of a
/// seed-0 run no longer gets seed 0 (which many environments read as "unset"); another seed gives
/// the same generator's stream, stepped one state at a time.
#[test]
fn group_seeds_are_splitmix64_outputs_and_never_zero_at_the_start() {
    use rlvr_train::feed::episodes::group_seed;
    assert_eq!(
        [group_seed(0, 0), group_seed(0, 1), group_seed(0, 2)],
        [
            0xE220_A839_7B1D_CDAF,
            0x6E78_9E6A_A1B9_65F4,
            0x06C4_5D18_8009_454F
        ]
    );
    // The same generator stepped by hand (state += γ, then the finaliser) from seed 42.
    let mut state: u64 = 42;
    for draw in 0..100 {
        state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        assert_eq!(group_seed(42, draw), z ^ (z >> 31), "draw {draw}");
    }
    // No small run seed's first groups map to 0 (the old mixing gave group_seed(0, 0) = 0).
    for seed in 0..64 {
        for draw in 0..64 {
            assert_ne!(group_seed(seed, draw), 0, "seed {seed} draw {draw}");
        }
    }
}

/// An environment whose episodes report metrics with different key sets (DESIGN.md section 14's
/// additions, "Metrics"): a turn of even length ends the episode (`done`, reward 1) with
/// `chars`, `even` and `turn`; an odd one gets "odd" back; `finish` reports `cut` and
/// `reason_<reason>`; the groups whose draw is 3 mod 4 fail at `reset` (no metrics).
const METRICS_ENV: &str = r#"
import json, sys
for line in sys.stdin:
    req = json.loads(line)
    t = req["type"]
    if t == "hello":
        out = {"version": 1}
    elif t == "reset":
        out = {"episodes": [{"id": e["id"], "error": "no game"} if int(e["group"]) % 4 == 3
                            else {"id": e["id"], "messages": None} for e in req["episodes"]]}
    elif t == "step":
        eps = []
        for e in req["episodes"]:
            n = len(e["text"])
            if n % 2 == 0:
                eps.append({"id": e["id"], "done": True, "reward": 1.0, "messages": [],
                            "metrics": {"chars": n, "even": 1, "turn": e["turn"]}})
            else:
                eps.append({"id": e["id"], "done": False, "reward": 0.0,
                            "messages": [{"role": "user", "content": "odd"}]})
        out = {"episodes": eps}
    else:
        out = {"episodes": [{"id": e["id"], "metrics": {"cut": 1, "reason_" + e["reason"]: 1.5}}
                            for e in req["episodes"]]}
    print(json.dumps(out), flush=True)
"#;

#[test]
fn env_metrics_are_the_means_over_the_episodes_that_carry_them() {
    // A training run: each step's `env/metrics/<name>/mean` equals the mean, computed here by
    // hand from rollouts.jsonl (every episode logged), over the scorable episodes that carry the
    // name; failed episodes carry none; each line's metrics are its episode's last reply's.
    let f = fixture();
    let script = f.run.parent().unwrap().join("metrics_env.py");
    std::fs::write(&script, METRICS_ENV).unwrap();
    let cmd = format!("env.command=[\"python3\", \"{}\"]", script.display());
    let cfg = config(
        &f.model_dir,
        &f.run,
        &[
            &cmd,
            "train.steps=2",
            "env.max_turns=2",
            "env.max_episode_tokens=40",
            "env.max_error_frac=0.9",
            "data.prompts_per_step=8",
            "train.log_rollouts=64",
        ],
    );
    rlvr_train::run::train(&cfg, &rlvr_train::run::RunOptions::default()).unwrap();
    let m = rlvr_train::store::metrics::read_metrics(&f.run.join("metrics.jsonl")).unwrap();
    let text = std::fs::read_to_string(f.run.join("rollouts.jsonl")).unwrap();
    let rows: Vec<serde_json::Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(m.len(), 2);
    assert_eq!(rows.len(), 2 * 64);
    let mut seen: std::collections::BTreeSet<String> = Default::default();
    for line in &m {
        let step = line["step"].as_u64().unwrap();
        let eps: Vec<&serde_json::Value> = rows.iter().filter(|r| r["step"] == step).collect();
        assert_eq!(eps.len(), 64);
        let mut want: std::collections::BTreeMap<String, (f64, usize)> = Default::default();
        for r in &eps {
            let metrics = r.get("metrics").and_then(|v| v.as_object());
            match r["finish_reason"].as_str().unwrap() {
                "error" => assert!(metrics.is_none(), "{r}"),
                "done" => {
                    let m = metrics.unwrap();
                    let chars = m["chars"].as_f64().unwrap();
                    assert_eq!(chars % 2.0, 0.0);
                    assert_eq!((m["even"].as_f64(), m.len()), (Some(1.0), 3), "{r}");
                    assert_eq!(m["turn"].as_f64(), r["turns"].as_f64(), "{r}");
                }
                reason => {
                    let m = metrics.unwrap();
                    assert_eq!(m["cut"].as_f64(), Some(1.0), "{r}");
                    assert_eq!(m[&format!("reason_{reason}")].as_f64(), Some(1.5), "{r}");
                    assert_eq!(m.len(), 2, "{r}");
                }
            }
            for (k, v) in metrics.into_iter().flatten() {
                let s = want.entry(k.clone()).or_default();
                s.0 += v.as_f64().unwrap();
                s.1 += 1;
            }
        }
        let got: Vec<&String> = line
            .keys()
            .filter(|k| k.starts_with("env/metrics/"))
            .collect();
        assert_eq!(got.len(), want.len(), "{line:?}");
        for (k, (sum, n)) in &want {
            let key = format!("env/metrics/{k}/mean");
            let v = line[&key].as_f64().unwrap();
            assert!(
                (v - sum / *n as f64).abs() < 1e-12,
                "{key}: {v} vs {sum}/{n}"
            );
            seen.insert(k.clone());
        }
        // The failed groups (draws 3 mod 4) are there, and counted out of every mean.
        assert!(line["env/error_frac"].as_f64().unwrap() > 0.0, "{line:?}");
    }
    // What the test covered: episodes that ended by `done` and by rlvr's `finish`, so the key
    // sets differ between episodes of a step.
    assert!(
        seen.contains("even") && seen.contains("cut") && seen.contains("reason_max_turns"),
        "{seen:?}"
    );
}

/// `rlvr train` on a verifiers 0.4.0 (`verifiers.v1`) environment through the adapter the binary
/// carries: the test taskset `vf-guess-v1` (crates/rlvr-env/tests/verifiers/envs/vf_guess_v1, on
/// the stand-in `verifiers.v1`), each training row the task itself (its question the prompt, its
/// reference the number). Its harness answers each guess with a hint until `env.max_turns`, when
/// rlvr stops the trace and the task scores it. The task's reward functions reach metrics.jsonl
/// as `env/metrics/NAME/mean`, and the step's reward is their weighted sum: correct + 0.5 x quick.
#[test]
fn a_train_run_on_a_verifiers_v1_environment_logs_the_tasks_rewards() {
    let f = fixture();
    let fixtures = crate::common::repo().join("crates/rlvr-env/tests/verifiers");
    let paths = format!(
        "env.options={{ paths = [{:?}, {:?}] }}",
        fixtures.join("standin_v1").display().to_string(),
        fixtures.join("envs").display().to_string()
    );
    // A run writes its environment's stderr to RUN/env.stderr.
    let log = f.run.join("env.stderr");
    let cfg = config(
        &f.model_dir,
        &f.run,
        &[
            "train.steps=2",
            "env.verifiers=\"vf-guess-v1\"",
            "env.python=\"python3\"",
            "env.max_turns=3",
            "env.max_episode_tokens=100",
            &paths,
        ],
    );
    rlvr_train::run::train(&cfg, &rlvr_train::run::RunOptions::default()).unwrap_or_else(|e| {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        panic!("{e:#}\nthe environment's stderr:\n{text}")
    });
    let m = rlvr_train::store::metrics::read_metrics(&f.run.join("metrics.jsonl")).unwrap();
    assert_eq!(m.len(), 2);
    for line in &m {
        assert_eq!(line["env/error_frac"].as_f64(), Some(0.0), "{line:?}");
        let correct = line["env/metrics/correct/mean"].as_f64().unwrap();
        let quick = line["env/metrics/quick/mean"].as_f64().unwrap();
        let guesses = line["env/metrics/guesses/mean"].as_f64().unwrap();
        let reward = line["reward/mean"].as_f64().unwrap();
        assert!((reward - (correct + 0.5 * quick)).abs() < 1e-9, "{line:?}");
        assert_eq!(line["env/metrics/reward/mean"].as_f64(), Some(reward));
        // quick = 1 / max(1, guesses) per episode: within [1/3, 1] with at most 3 guesses.
        assert!((1.0 / 3.0 - 1e-12..=1.0).contains(&quick), "{quick}");
        assert!((0.0..=3.0).contains(&guesses), "{guesses}");
        let turns = line["env/turns/mean"].as_f64().unwrap();
        assert!((1.0..=3.0).contains(&turns), "{turns}");
    }
    // Each episode's scores, as the adapter logged them.
    let text = std::fs::read_to_string(&log).unwrap();
    let scored = text
        .lines()
        .filter(|l| l.starts_with("[verifiers] episode "))
        .count();
    assert_eq!(scored, 32, "{text}");
}
