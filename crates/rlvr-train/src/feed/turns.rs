//! Per-turn-index metrics of multi-turn episodes (docs/environments.md, "Metrics"): for each turn
//! index k, how many episodes got there, how long their k-th assistant turn was and what reward
//! the environment gave at it. What a multi-turn run is plotted by: whether later turns are
//! reached and whether they pay.
//!
//! Keys: `env/turn_k/reached` (the share of the batch's episodes with at least k turns),
//! `env/turn_k/tokens/mean` (the mean sampled tokens of turn k, its stop id included, over the
//! episodes that reached it) and `env/turn_k/reward/mean` (the mean reward given at turn k over
//! the scorable episodes that reached it: its `step` reply's, plus at an episode's last turn
//! whatever came after, `finish`'s included; no reward counts 0). Bounded: turns 1 to
//! [`TURN_KEYS`] each get their keys, and when `env.max_turns` is larger the turns after them
//! share one set, `env/turn_9+/...` (reached: at least 9 turns; tokens and reward: means over
//! every (episode, turn ≥ 9) pair). The keys depend on `env.max_turns` only, never on the batch
//! (a turn no episode reached has nulls), so at most 3 × ([`TURN_KEYS`] + 1) = 27 keys per line.
//! Sums run in the batch's order, so the values are the same at any thread count.

use super::episodes::segments;

/// Turn indices with keys of their own; later turns share the `turn_9+` keys.
pub const TURN_KEYS: u32 = 8;

/// One episode as the metrics read it.
#[derive(Debug, Clone, Copy)]
pub struct EpisodeTurns<'a> {
    /// Its `completion_mask` (1 on sampled ids).
    pub mask: &'a [u8],
    /// Its assistant turns.
    pub turns: u32,
    /// The rewards the environment gave, in order (one per `step` reply, then `finish`'s).
    pub turn_rewards: &'a [Option<f64>],
    /// Whether its reward is not null (a failed episode is outside the reward means).
    pub scorable: bool,
}

/// One turn index's (or the `9+` bucket's) values; `None` where no episode counts.
#[derive(Debug, Clone, PartialEq)]
pub struct TurnStat {
    /// `1` .. `8`, or `9+`.
    pub label: String,
    /// The share of the episodes that reached it.
    pub reached: Option<f64>,
    /// Mean sampled tokens of the turn.
    pub tokens: Option<f64>,
    /// Mean reward given at the turn.
    pub reward: Option<f64>,
}

/// The reward given at turn `k` (from 1) of an episode of `turns` turns: its `k`-th entry, and at
/// its last turn every entry from there on (a `finish` reward follows the last `step`'s, or
/// stands for a cut turn's). `None` entries count 0.
fn reward_at(turn_rewards: &[Option<f64>], turns: u32, k: u32) -> f64 {
    let i = (k - 1) as usize;
    if k < turns {
        turn_rewards.get(i).copied().flatten().unwrap_or(0.0)
    } else {
        turn_rewards.iter().skip(i).map(|r| r.unwrap_or(0.0)).sum()
    }
}

#[derive(Default)]
struct Acc {
    reached: usize,
    token_n: usize,
    tokens: f64,
    reward_n: usize,
    reward: f64,
}

/// The per-turn values of `episodes` for a run of `max_turns` turns (see the module docs): one
/// [`TurnStat`] per turn 1..=min(`max_turns`, [`TURN_KEYS`]), then the `9+` bucket when
/// `max_turns` is larger.
pub fn turn_stats(episodes: &[EpisodeTurns<'_>], max_turns: u32) -> Vec<TurnStat> {
    let own = max_turns.min(TURN_KEYS);
    let slots = own as usize + usize::from(max_turns > TURN_KEYS);
    let mut acc: Vec<Acc> = (0..slots).map(|_| Acc::default()).collect();
    for e in episodes {
        let lens: Vec<usize> = segments(e.mask)
            .into_iter()
            .filter(|s| s.kind == "assistant")
            .map(|s| s.len)
            .collect();
        let mut bucket_reached = false;
        for k in 1..=e.turns.min(max_turns) {
            let slot = (k.min(TURN_KEYS + 1) - 1) as usize;
            let a = &mut acc[slot];
            if k <= TURN_KEYS || !bucket_reached {
                a.reached += 1;
                bucket_reached = k > TURN_KEYS;
            }
            if let Some(&n) = lens.get((k - 1) as usize) {
                a.token_n += 1;
                a.tokens += n as f64;
            }
            if e.scorable {
                a.reward_n += 1;
                a.reward += reward_at(e.turn_rewards, e.turns, k);
            }
        }
    }
    let total = episodes.len();
    let mean = |s: f64, n: usize| (n > 0).then(|| s / n as f64);
    acc.into_iter()
        .enumerate()
        .map(|(i, a)| TurnStat {
            label: if i < own as usize {
                (i + 1).to_string()
            } else {
                format!("{}+", TURN_KEYS + 1)
            },
            reached: mean(a.reached as f64, total),
            tokens: mean(a.tokens, a.token_n),
            reward: mean(a.reward, a.reward_n),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ep<'a>(
        mask: &'a [u8],
        turns: u32,
        r: &'a [Option<f64>],
        scorable: bool,
    ) -> EpisodeTurns<'a> {
        EpisodeTurns {
            mask,
            turns,
            turn_rewards: r,
            scorable,
        }
    }

    #[test]
    fn per_turn_values_by_hand() {
        // A: 3 turns of 2, 1, 3 tokens; steps gave 0, none, then done with 1.
        // B: 2 turns of 4 and 2 tokens; turn 2 cut (no step), finish gave 0.5.
        // C: 1 turn of 5 tokens, then max_turns... failed (unscorable).
        // D: 2 turns of 1 and 1 tokens; step 1 gave 0.25, step 2 none, finish 2.0.
        let a = [1, 1, 0, 1, 0, 0, 1, 1, 1];
        let b = [1, 1, 1, 1, 0, 1, 1];
        let c = [1, 1, 1, 1, 1];
        let d = [1, 0, 1];
        let (ra, rb, rc, rd) = (
            [Some(0.0), None, Some(1.0)],
            [Some(0.0), Some(0.5)],
            [],
            [Some(0.25), None, Some(2.0)],
        );
        let eps = [
            ep(&a, 3, &ra, true),
            ep(&b, 2, &rb, true),
            ep(&c, 1, &rc, false),
            ep(&d, 2, &rd, true),
        ];
        let s = turn_stats(&eps, 3);
        assert_eq!(s.len(), 3);
        let stat = |label: &str, reached, tokens, reward| TurnStat {
            label: label.into(),
            reached: Some(reached),
            tokens: Some(tokens),
            reward: Some(reward),
        };
        assert_eq!(
            s,
            vec![
                // 4 of 4 reached; tokens (2+4+5+1)/4 = 3; rewards (0 + 0 + 0.25)/3 (C out).
                stat("1", 1.0, 3.0, 0.25 / 3.0),
                // A, B, D: tokens (1+2+1)/3; rewards A 0 (none), B 0.5 (finish of the cut
                // last turn), D 0 + 2.0 (its last turn: step's none, then finish's).
                stat("2", 0.75, 4.0 / 3.0, 2.5 / 3.0),
                stat("3", 0.25, 3.0, 1.0),
            ]
        );
        // The mean of turns is the sum of the reached shares (E[T] = Σ P(T ≥ k)).
        let reached: f64 = s.iter().filter_map(|t| t.reached).sum();
        assert_eq!(reached, (3 + 2 + 1 + 2) as f64 / 4.0);
    }

    #[test]
    fn turns_past_eight_share_one_bucket_and_keys_do_not_depend_on_the_batch() {
        // 10 turns of 1 token each, a reward of 1 at each step.
        let mask: Vec<u8> = (0..19).map(|i| u8::from(i % 2 == 0)).collect();
        let r = vec![Some(1.0); 10];
        let s = turn_stats(&[ep(&mask, 10, &r, true)], 12);
        let labels: Vec<&str> = s.iter().map(|t| t.label.as_str()).collect();
        assert_eq!(labels, ["1", "2", "3", "4", "5", "6", "7", "8", "9+"]);
        // Reached once (not once per turn), and turns 9 and 10 averaged.
        assert_eq!(
            (s[8].reached, s[8].tokens, s[8].reward),
            (Some(1.0), Some(1.0), Some(1.0))
        );
        // No episode: the same keys, all null.
        let empty = turn_stats(&[], 12);
        assert_eq!(empty.len(), 9);
        assert!(empty
            .iter()
            .all(|t| t.reached.is_none() && t.tokens.is_none()));
        assert_eq!(turn_stats(&[], 2).len(), 2);
    }
}
