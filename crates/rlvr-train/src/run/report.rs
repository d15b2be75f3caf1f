//! What a completed step leaves behind besides the weights: its metrics.jsonl line (DESIGN.md
//! section 10 keys), its rollouts.jsonl and diagnostics.jsonl lines, its train.log line and the
//! progress bar's message.

use std::path::Path;

use serde_json::json;

use crate::feed::explorer::Batch;
use crate::store::experience::Experience;
use crate::store::metrics::{append_line, MetricsLine};
use crate::update::StepReport;

/// Mean and population standard deviation of `x` (`None` when empty). Finite values of any
/// magnitude give finite statistics: when the plain sums overflow (Σ(r − m)² passes f64's range
/// beyond |r| ≈ 1e154), they are taken again on x / max|x| and scaled back. A NaN or infinite
/// value gives NaN (null in metrics.jsonl).
pub fn mean_std(x: &[f64]) -> (Option<f64>, Option<f64>) {
    if x.is_empty() {
        return (None, None);
    }
    let n = x.len() as f64;
    let plain = |x: &mut dyn Iterator<Item = f64>| {
        let v: Vec<f64> = x.collect();
        let m = v.iter().sum::<f64>() / n;
        (
            m,
            (v.iter().map(|r| (r - m).powi(2)).sum::<f64>() / n).sqrt(),
        )
    };
    let (m, s) = plain(&mut x.iter().copied());
    if (m.is_finite() && s.is_finite()) || x.iter().any(|v| !v.is_finite()) {
        return (Some(m), Some(s));
    }
    let scale = x.iter().fold(0.0f64, |a, v| a.max(v.abs()));
    let (m, s) = plain(&mut x.iter().map(|v| v / scale));
    (Some(m * scale), Some(s * scale))
}

/// The metrics line of one step (DESIGN.md section 10 keys; null where undefined).
pub fn step_metrics(
    step: u64,
    exps: &[Experience],
    rep: &StepReport,
    lr: f64,
    sample_s: f64,
    train_s: f64,
) -> MetricsLine {
    let mut l = MetricsLine::new(step);
    let rewards: Vec<f64> = exps.iter().filter_map(|e| e.reward).collect();
    let mean = |x: &[f64]| (!x.is_empty()).then(|| x.iter().sum::<f64>() / x.len() as f64);
    let (rm, rs) = mean_std(&rewards);
    l.set("reward/mean", rm);
    l.set("reward/std", rs);
    set_components(&mut l, exps);
    let correct: Vec<f64> = exps
        .iter()
        .filter_map(|e| e.is_correct())
        .map(|c| if c { 1.0 } else { 0.0 })
        .collect();
    l.set("accuracy", mean(&correct));
    let lens: Vec<f64> = exps.iter().map(|e| e.sampled_tokens() as f64).collect();
    l.set("completion_len/mean", mean(&lens));
    let st: Vec<f64> = exps
        .iter()
        .filter_map(|e| e.staleness(step))
        .map(|s| s as f64)
        .collect();
    l.set("staleness/mean", mean(&st));
    l.set("staleness/max", st.iter().cloned().reduce(f64::max));
    if let Some(m) = &rep.loss {
        l.set("loss", Some(m.loss));
        l.set("clip_frac", m.clip_frac);
        l.set("clip_frac/low", m.clip_frac_low);
        l.set("clip_frac/high", m.clip_frac_high);
        l.set("ratio/mean", m.ratio_mean);
        l.set("ratio/min", m.ratio_min);
        l.set("ratio/max", m.ratio_max);
        l.set("kl_ref", m.kl_ref);
        l.set("kl_behaviour", m.kl_behaviour);
        l.set("entropy", m.entropy);
        l.set("ess", m.ess);
        l.set("masked_frac", m.masked_frac);
    }
    l.set("zero_std_frac", rep.adv.zero_std_frac());
    l.set("grad_norm", rep.grad_norm);
    l.set("lr", Some(lr));
    l.set_value("skipped", serde_json::Value::Bool(rep.skipped));
    l.set("time/sample_s", Some(sample_s));
    l.set("time/train_s", Some(train_s));
    let tokens: usize = exps.iter().map(Experience::sampled_tokens).sum();
    let secs = sample_s + train_s;
    l.set("tokens_per_s", (secs > 0.0).then(|| tokens as f64 / secs));
    set_extra_metrics(&mut l, exps, &lens, rep);
    l
}

/// The metrics beyond DESIGN.md section 10's keys that verl and TRL users look for, appended after
/// them: `completion_len/clipped_frac` (share of the step's completions cut at
/// `rollout.max_new_tokens`; verl `response_length/clip_ratio`, TRL `completions/clipped_ratio`),
/// `completion_len/max`, `advantage/mean|min|max` over the rows with a scored reward (verl
/// `critic/advantages/*`), then the loss split into `pg_loss` (the policy-gradient term's part;
/// verl `actor/pg_loss`) and `reg_loss` (the regulariser's, KL penalty's and entropy bonus's;
/// `pg_loss + reg_loss = loss`), and `clip_frac/dual` (the share of trained tokens the dual clip
/// bounded; verl `actor/pg_clipfrac_lower`; null without a dual clip). `lens`: each completion's
/// sampled tokens.
fn set_extra_metrics(l: &mut MetricsLine, exps: &[Experience], lens: &[f64], rep: &StepReport) {
    let n = exps.len();
    let cut = exps.iter().filter(|e| e.truncated).count();
    l.set(
        "completion_len/clipped_frac",
        (n > 0).then(|| cut as f64 / n as f64),
    );
    l.set("completion_len/max", lens.iter().copied().reduce(f64::max));
    let [mean, min, max] = rep.advantage.map_or([None; 3], |a| a.map(Some));
    l.set("advantage/mean", mean);
    l.set("advantage/min", min);
    l.set("advantage/max", max);
    let loss = rep.loss.as_ref();
    l.set("pg_loss", loss.map(|m| m.pg_loss));
    l.set("reg_loss", loss.map(|m| m.reg_loss));
    l.set("clip_frac/dual", loss.and_then(|m| m.clip_frac_dual));
}

/// The metrics of a multi-turn run's step (docs/DESIGN.md section 14), nothing for a
/// single-turn one: `env/turns/mean`, `env/turns/min`, `env/turns/max` (verl's `num_turns/*`)
/// and `env/episode_len/mean` (completion tokens, bridges
/// included) over the episodes trained on, and from what the environment did in the batch
/// (`env`): `env/error_frac`, `env/finish/<end>` (the share of the batch's episodes that ended
/// by `done`, `max_turns`, `length`, `budget` or `eos`; with `env/error_frac` they sum to 1;
/// verl's `num_turns` and truncation ratios), `env/tool_calls`, `env/tool_call_errors`,
/// `env/restarts` and `env/replayed` (restarts of the program and episodes replayed to a restarted
/// one, `rlvr_env::replay`), `env/obs_truncated` (observations cut to fit,
/// `env.observation_truncation`), `env/closed` (episodes sent `finish` with reason `error` so that
/// the program frees them: rlvr failed them after it answered, or their replay differed),
/// `env/metrics/<name>/mean` (each metric the environment reported on an episode's last reply,
/// averaged over the scorable episodes trained on that carry it) and
/// `time/env_s`; and per turn index up to `max_turns`
/// (`env.max_turns`), `env/turn_k/reached`, `env/turn_k/tokens/mean` and
/// `env/turn_k/reward/mean` ([`crate::feed::turns`]).
pub fn set_env_metrics(
    l: &mut MetricsLine,
    exps: &[Experience],
    env: Option<&crate::feed::episodes::EnvStats>,
    max_turns: u32,
) {
    use crate::feed::turns::EpisodeTurns;
    let Some(env) = env else { return };
    let eps: Vec<EpisodeTurns<'_>> = exps
        .iter()
        .filter_map(|e| {
            Some(EpisodeTurns {
                mask: e.completion_mask.as_deref()?,
                turns: e.turns?,
                turn_rewards: &e.turn_rewards,
                scorable: e.reward.is_some(),
            })
        })
        .collect();
    let turns: Vec<f64> = exps.iter().filter_map(|e| e.turns).map(f64::from).collect();
    let lens: Vec<f64> = exps
        .iter()
        .filter(|e| e.turns.is_some())
        .map(|e| e.completion_ids.len() as f64)
        .collect();
    let metrics: Vec<&rlvr_env::protocol::Metrics> = exps
        .iter()
        .filter(|e| e.reward.is_some())
        .map(|e| &e.env_metrics)
        .collect();
    for (k, v) in env_metrics(&eps, (&turns, &lens), env, &metrics, max_turns) {
        l.set(k, v);
    }
    l.set("time/env_s", Some(env.env_s));
}

/// The `env/*` metrics of a batch of episodes, in metrics.jsonl's order: what training's step
/// line and `rlvr eval --env`'s summary share (one computation, so the two read the same
/// quantities). `eps`: the episodes' masks, turns and rewards for `env/turn_k/*`
/// ([`crate::feed::turns`]); `turns` and `lens`: each episode's assistant turns and completion
/// tokens (bridges included); `env`: what the environment did in the batch; `metrics`: the
/// metrics of each scorable episode, in the batch's order (empty maps for those that gave none),
/// each name's `env/metrics/<name>/mean` the mean over the episodes that carry it (summed in
/// that order, so the value depends only on the batch), names in order, after the other keys.
/// Every key but `time/env_s` (a duration, the caller's).
pub fn env_metrics(
    eps: &[crate::feed::turns::EpisodeTurns<'_>],
    (turns, lens): (&[f64], &[f64]),
    env: &crate::feed::episodes::EnvStats,
    metrics: &[&rlvr_env::protocol::Metrics],
    max_turns: u32,
) -> Vec<(String, Option<f64>)> {
    let mut out: Vec<(String, Option<f64>)> = Vec::new();
    for t in crate::feed::turns::turn_stats(eps, max_turns) {
        let k = &t.label;
        out.push((format!("env/turn_{k}/reached"), t.reached));
        out.push((format!("env/turn_{k}/tokens/mean"), t.tokens));
        out.push((format!("env/turn_{k}/reward/mean"), t.reward));
    }
    let mean = |x: &[f64]| (!x.is_empty()).then(|| x.iter().sum::<f64>() / x.len() as f64);
    let share = |n: usize| (env.episodes > 0).then(|| n as f64 / env.episodes as f64);
    out.push(("env/turns/mean".into(), mean(turns)));
    out.push((
        "env/turns/min".into(),
        turns.iter().copied().reduce(f64::min),
    ));
    out.push((
        "env/turns/max".into(),
        turns.iter().copied().reduce(f64::max),
    ));
    out.push(("env/episode_len/mean".into(), mean(lens)));
    out.push(("env/error_frac".into(), share(env.errors)));
    for (end, n) in env.ends.named() {
        out.push((format!("env/finish/{end}"), share(n)));
    }
    out.push(("env/tool_calls".into(), Some(env.tool_calls as f64)));
    out.push((
        "env/tool_call_errors".into(),
        Some(env.tool_call_errors as f64),
    ));
    out.push(("env/restarts".into(), Some(env.restarts as f64)));
    out.push(("env/replayed".into(), Some(env.replayed as f64)));
    out.push(("env/obs_truncated".into(), Some(env.obs_truncated as f64)));
    out.push(("env/closed".into(), Some(env.closed as f64)));
    let pairs = metrics.iter().flat_map(|m| {
        m.iter()
            .map(|(name, x)| (format!("env/metrics/{name}/mean"), *x))
    });
    out.extend(
        crate::store::metrics::keyed_means(pairs)
            .into_iter()
            .map(|(k, x)| (k, Some(x))),
    );
    out
}

/// `reward/<name>/mean` (the raw component reward over the scored experiences) and
/// `reward/<name>/share` (its weighted part of the summed reward; null when that sum is 0) for
/// each reward part the experiences carry (none for offline experiences).
fn set_components(l: &mut MetricsLine, exps: &[Experience]) {
    let Some(first) = exps.iter().find(|e| !e.components.is_empty()) else {
        return;
    };
    let scored: Vec<&Experience> = exps
        .iter()
        .filter(|e| e.reward.is_some() && e.components.len() == first.components.len())
        .collect();
    let total: f64 = scored.iter().filter_map(|e| e.reward).sum();
    for (k, part) in first.components.iter().enumerate() {
        let raw: f64 = scored.iter().map(|e| e.components[k].raw).sum();
        let weighted: f64 = scored.iter().map(|e| e.components[k].weighted).sum();
        let n = scored.len() as f64;
        l.set(
            format!("reward/{}/mean", part.name),
            (n > 0.0).then(|| raw / n),
        );
        l.set(
            format!("reward/{}/share", part.name),
            (total != 0.0).then(|| weighted / total),
        );
    }
    set_reward_extra(l, &scored);
}

/// `reward/<component>/<key>/mean` for each extra number a component's verifier reported
/// ([`crate::store::experience::RewardPart::extra`]; verl's `reward_extra_info`): its mean over
/// the scored experiences that carry that key (a key set that changes between rows averages
/// each key over its own rows), in key order after the components' keys. Every rank computes it
/// from the step's whole batch, as the other reward metrics.
fn set_reward_extra(l: &mut MetricsLine, scored: &[&Experience]) {
    let pairs = scored.iter().flat_map(|e| {
        e.components.iter().flat_map(|part| {
            part.extra
                .iter()
                .map(|(key, x)| (format!("reward/{}/{key}/mean", part.name), *x))
        })
    });
    for (key, x) in crate::store::metrics::keyed_means(pairs) {
        l.set(key, Some(x));
    }
}

/// Appends the step's rollouts.jsonl and diagnostics.jsonl lines; returns the diagnostics line.
/// `comm_s`: data parallel, the seconds rank 0 spent in collectives during the step (the
/// communication and the wait for slower ranks); `None` (null) in one process. `mem`: this
/// process's memory over the update ([`super::memory`]: `memory/rss_mib` and `memory/heap_mib`
/// when it began, `memory/update_peak_mib` the most live heap above that; the whole process, so
/// an explorer thread sampling beside the update counts too).
///
/// # Errors
/// I/O errors naming the file.
pub(crate) fn write_step_logs(
    run_dir: &Path,
    t: u64,
    batch: &Batch,
    rep: &StepReport,
    rows: usize,
    dropped_stale: usize,
    (comm_s, mem): (Option<f64>, super::memory::MemoryReport),
) -> anyhow::Result<String> {
    for r in &batch.rollouts {
        let mut v = serde_json::to_value(r)?;
        v["step"] = json!(t);
        v["staleness"] = json!(r.version.map(|ver| (t - 1).saturating_sub(ver)));
        append_line(&run_dir.join("rollouts.jsonl"), &v.to_string())?;
    }
    let loss = rep.loss.as_ref();
    // What each correction did: [masked tokens, masked rows, truncated tokens, truncated rows]
    // as shares; null when it is off (nothing looked at).
    let none = [None; 4];
    let mm = loss.map_or(none, |l| l.mismatch.fractions());
    let op = loss.map_or(none, |l| l.opsm.fractions());
    let (stale_counts, stale_unknown) = staleness_counts(&batch.experiences, t);
    let diag = json!({
        "step": t,
        "logprob_diff/staleness0": rep.logprob_diff_s0,
        "logprob_k3/staleness0": rep.logprob_k3_s0,
        "clip_frac/adv_pos": loss.and_then(|l| l.clip_frac_adv_pos),
        "clip_frac/adv_neg": loss.and_then(|l| l.clip_frac_adv_neg),
        "hist/ratio": loss.map(|l| l.ratio_hist),
        "hist/mismatch": rep.mismatch_hist,
        "mismatch/masked_frac": mm[0],
        "mismatch/masked_rows_frac": mm[1],
        "mismatch/truncated_frac": mm[2],
        "mismatch/truncated_rows_frac": mm[3],
        "opsm/masked_frac": op[0],
        "opsm/masked_rows_frac": op[1],
        "red_drop/dropped_frac": rep.dropped_frac,
        "red_drop/dropped": rep.dropped_frac.map(|_| rep.adv.dropped),
        "staleness/counts": stale_counts,
        "staleness/unknown": stale_unknown,
        "dynamic_sampling/dropped_groups": batch.dropped_groups,
        "dynamic_sampling/short_groups": batch.short_groups,
        "stale_dropped": dropped_stale,
        "updates": rep.updates,
        "rows": rows,
        "rows_skipped_zero_gradient": rep.rows_skipped,
        "time/score_s": batch.score_s,
        "time/comm_s": comm_s,
        "memory/rss_mib": mem.rss_mib,
        "memory/heap_mib": mem.heap_mib,
        "memory/update_peak_mib": mem.update_peak_mib,
    });
    let diag = diag.to_string();
    append_line(&run_dir.join("diagnostics.jsonl"), &diag)?;
    Ok(diag)
}

/// Rows of the step's batch (before `sync.max_staleness` drops any) by staleness: entry s counts
/// the rows of staleness s (up to the largest seen), then the rows whose version is unknown.
fn staleness_counts(exps: &[Experience], t: u64) -> (Vec<usize>, usize) {
    let mut counts = Vec::new();
    let mut unknown = 0;
    for e in exps {
        match e.staleness(t) {
            Some(s) => {
                let s = s as usize;
                if counts.len() <= s {
                    counts.resize(s + 1, 0);
                }
                counts[s] += 1;
            }
            None => unknown += 1,
        }
    }
    (counts, unknown)
}

/// Step `t`'s line (train.log always, stderr off a terminal every `output.log_every` steps):
/// the values of its metrics.jsonl line rounded to 4 places (the loss in scientific notation
/// when 0 < |loss| < 1e-3, `crate::log::small`) (step, staleness, reward mean,
/// accuracy, loss, KL and entropy where on, tokens/s, each reward component's mean and share),
/// the elapsed time and the ETA. Keys that are null at this step are left out.
pub(crate) fn step_text(t: u64, steps: u64, line: &MetricsLine, elapsed: f64, eta: f64) -> String {
    let f = |k: &str| line.get(k).and_then(|v| v.as_f64());
    let mut s = format!("step {t}/{steps} ");
    s.push_str(&crate::log::fields(&[
        ("staleness", f("staleness/mean"), 2),
        ("reward", f("reward/mean"), 4),
        ("accuracy", f("accuracy"), 4),
        ("loss", f("loss"), crate::log::SMALL),
        ("kl_ref", f("kl_ref"), 4),
        ("entropy", f("entropy"), 4),
        ("tokens/s", f("tokens_per_s"), 1),
    ]));
    if line.get("skipped").and_then(|v| v.as_bool()) == Some(true) {
        s.push_str(" skipped");
    }
    // reward/<name>/mean and share: every pair the line holds, in its order.
    let comps: Vec<String> = line
        .keys()
        .filter_map(|k| k.strip_prefix("reward/")?.strip_suffix("/mean"))
        .map(|name| {
            crate::log::fields(&[
                (
                    &format!("reward/{name}"),
                    f(&format!("reward/{name}/mean")),
                    4,
                ),
                ("share", f(&format!("reward/{name}/share")), 4),
            ])
        })
        .filter(|x| !x.is_empty())
        .collect();
    for c in comps {
        s.push(' ');
        s.push_str(&c);
    }
    s.push_str(&format!(
        " elapsed {} eta {}",
        crate::log::clock(elapsed),
        crate::log::clock(eta)
    ));
    s
}

/// An evaluation's line: `eval step T accuracy A mean@k M pass@k P n N` (the `eval/*` values of
/// the metrics line, 4 places), or `None` when the line holds no evaluation.
pub(crate) fn eval_text(t: u64, line: &MetricsLine) -> Option<String> {
    let f = |k: &str| line.get(k).and_then(|v| v.as_f64());
    let acc = f("eval/accuracy")?;
    Some(format!(
        "eval step {t} {}",
        crate::log::fields(&[
            ("accuracy", Some(acc), 4),
            ("mean@k", f("eval/mean@k"), 4),
            ("pass@k", f("eval/pass@k"), 4),
            ("n", f("eval/n"), 0),
        ])
    ))
}

/// Moves the progress bar to step `t` with the step's loss and mean reward.
pub(crate) fn show_progress(
    bar: Option<&indicatif::ProgressBar>,
    t: u64,
    rep: &StepReport,
    line: &MetricsLine,
) {
    if let Some(b) = bar {
        b.set_position(t);
        b.set_message(format!(
            "loss {} reward {:.3}",
            crate::log::small(rep.loss.as_ref().map(|l| l.loss).unwrap_or(f64::NAN)),
            line.get("reward/mean")
                .and_then(|v| v.as_f64())
                .unwrap_or(f64::NAN)
        ));
    }
}

#[cfg(test)]
mod tests {
    use super::mean_std;

    #[test]
    fn reward_statistics_of_huge_finite_rewards_stay_finite() {
        assert_eq!(mean_std(&[]), (None, None));
        assert_eq!(mean_std(&[0.0, 1.0]), (Some(0.5), Some(0.5)));
        // Σ(r − m)² = 4e300 · 2 overflows to inf in the plain sums.
        let (m, s) = mean_std(&[1e300, -1e300, 1e300, -1e300]);
        assert_eq!((m, s), (Some(0.0), Some(1e300)));
        let (m, s) = mean_std(&[f64::MAX, f64::MAX]);
        assert_eq!((m, s), (Some(f64::MAX), Some(0.0)));
        let (m, s) = mean_std(&[1e200, 3e200]);
        assert!((m.unwrap() / 2e200 - 1.0).abs() < 1e-12, "{m:?}");
        assert!((s.unwrap() / 1e200 - 1.0).abs() < 1e-12, "{s:?}");
        // A non-finite reward stays undefined.
        assert!(mean_std(&[f64::NAN, 1.0]).1.unwrap().is_nan());
        assert!(mean_std(&[f64::INFINITY, 1.0]).1.unwrap().is_nan());
    }
}
