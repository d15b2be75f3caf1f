//! Group-relative advantages from rewards and group ids (host-side, f64).
//!
//! For a group g with scored rewards r_1..r_n (a *group* is the set of rows sharing a group id, in any
//! layout):
//!
//! ```text
//! centred_i = r_i − b_i            b: mean | log-mean-exp | leave-one-out    (Baseline)
//! A_i       = centred_i / (σ + ε)  σ: sample | population std, of the group or the batch (StdNorm, StdLevel)
//!           = centred_i            std_norm = none
//! A_i      ← A_i − δ               δ = baseline_shift (AsymRE equivalence: δ = −τ)
//! ```
//!
//! Rules (DESIGN.md section 5):
//! - **Groups by id, never by position**: rows are grouped through a hash map on the id, so any row
//!   layout (contiguous, interleaved) gives the same advantages.
//! - **Null rewards** (unscorable, `None`) get A = 0, are ignored by every mean and std, and leave the
//!   normaliser.
//! - **Zero-variance groups** (all scored rewards bitwise equal) get centred reward exactly 0, whatever
//!   the float residue of mean/std would have been (e.g. eight f32 0.1 rewards), hence A = −δ (0 without a
//!   shift). They are counted in `zero_std_frac` and, with `exclude_zero_std`, leave the normaliser.
//! - **K = 1** (a group with a single scored reward): no baseline can be formed from the group, so it is
//!   a zero-variance group: A = 0 (TRL's choice; verl's A = r is rejected because it turns the raw reward
//!   into an advantage without a baseline).
//! - **RED-Drop** (paper B, arXiv 2509.24203): per group, negatives are rows with r < group mean; when they
//!   outnumber the other rows, the surplus is dropped at random (seeded by the run seed and the group
//!   id, so it does not depend on the layout of other groups); mean and std are recomputed on the kept
//!   rows; dropped rows get A = 0 and leave the normaliser (or, with `red_drop_in_normaliser`, stay
//!   in it as Trinity-RFT's rows do). With `red_drop_rule = "bernoulli"` (Trinity-RFT as first
//!   written) each negative is instead dropped with probability 1 − pos/neg and the group's mean and
//!   std stay those of all its rows.
//! - **RED-Weight** (A·exp(A/T)) is applied in the loss as the REC weight `advantage-exp`
//!   ([`crate::RecWeight::AdvantageExp`]); [`advantage_exp_weight`] is the same function on the host.

use std::collections::HashMap;
use std::hash::{Hash, Hasher};

use crate::config::{Algorithm, GroupBaseline, OverlongRule, RedDropRule, StdLevel, StdNorm};
use crate::error::{AlgoError, Result};

/// Advantages of one batch, row-aligned with the input.
#[derive(Debug, Clone, PartialEq)]
pub struct Advantages {
    /// A_i per row, `[N]`; 0 for null rewards and dropped rows.
    pub values: Vec<f64>,
    /// Whether row i counts in the loss normaliser, `[N]`: false for null rewards, RED-Drop dropped rows
    /// and (with `exclude_zero_std`) zero-variance groups. Pass it to [`crate::RowInfo`].
    pub in_normaliser: Vec<bool>,
    /// Counts for the metrics.
    pub stats: AdvantageStats,
}

/// Counts behind the advantage metrics.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct AdvantageStats {
    /// Groups with at least one scored reward.
    pub groups: usize,
    /// Of those, groups with zero variance (including K = 1).
    pub zero_std_groups: usize,
    /// Rows whose reward is null.
    pub null_rewards: usize,
    /// Rows dropped by RED-Drop.
    pub dropped: usize,
    /// Rows with a scored (non-null) reward.
    pub scored: usize,
}

impl AdvantageStats {
    /// `zero_std_frac` (DESIGN.md section 10): share of groups with zero reward variance; `None` without groups.
    pub fn zero_std_frac(&self) -> Option<f64> {
        (self.groups > 0).then(|| self.zero_std_groups as f64 / self.groups as f64)
    }

    /// `red_drop/dropped_frac`: share of the scored rows RED-Drop dropped (A = 0); `None` without
    /// scored rows. With equal group sizes it is the mean over groups of Trinity-RFT's
    /// `drop_balance` metric (dropped / group size, `rec_advantage.py`).
    pub fn dropped_frac(&self) -> Option<f64> {
        (self.scored > 0).then(|| self.dropped as f64 / self.scored as f64)
    }
}

/// Computes advantages for one batch (one trainer step, or one update batch: the caller decides which
/// rows share statistics; batch-level std uses every row passed in).
///
/// - `rewards`: `[N]`, `None` = unscorable.
/// - `group_ids`: `[N]`, any hashable id (DESIGN.md section 10: ids compare as strings, so pass strings when the
///   source mixes types).
/// - `seed`: the run seed; only RED-Drop draws from it.
///
/// # Errors
/// [`AlgoError::Input`] when lengths differ or a reward is not finite (use `None` for unscorable).
// One function with one pass per rule of DESIGN.md section 5 in the order they apply
// (group, RED-Drop, centre, std-normalise, weight), each short and commented; split, the
// intermediate per-group vectors would have to travel between functions.
pub fn compute_advantages<G: Hash + Eq>(
    rewards: &[Option<f64>],
    group_ids: &[G],
    alg: &Algorithm,
    seed: u64,
) -> Result<Advantages> {
    const OP: &str = "compute_advantages";
    if rewards.len() != group_ids.len() {
        return Err(AlgoError::Input {
            op: OP,
            why: format!(
                "rewards has {} rows but group_ids has {}; pass one group id per completion",
                rewards.len(),
                group_ids.len()
            ),
        });
    }
    if let Some(i) = rewards
        .iter()
        .position(|r| r.is_some_and(|r| !r.is_finite()))
    {
        return Err(AlgoError::Input {
            op: OP,
            why: format!(
                "reward of row {i} is {:?}; use null (None) for unscorable completions",
                rewards[i]
            ),
        });
    }
    let adv = &alg.advantage;
    let n = rewards.len();
    let mut stats = AdvantageStats {
        null_rewards: rewards.iter().filter(|r| r.is_none()).count(),
        scored: rewards.iter().filter(|r| r.is_some()).count(),
        ..Default::default()
    };

    // Group rows by id (first-appearance order), keeping scored rows only.
    let mut index: HashMap<&G, usize> = HashMap::new();
    let mut groups: Vec<(u64, Vec<usize>)> = Vec::new();
    for (i, g) in group_ids.iter().enumerate() {
        let k = *index.entry(g).or_insert_with(|| {
            groups.push((fnv1a(g), Vec::new()));
            groups.len() - 1
        });
        if rewards[i].is_some() {
            groups[k].1.push(i);
        }
    }
    let r = |i: usize| rewards[i].expect("scored rows only");

    // RED-Drop: choose the dropped rows of each group. `surplus` takes them out of the group's
    // statistics too; `bernoulli` keeps the statistics of all rows (Trinity-RFT as first written).
    let mut kept = vec![false; n];
    let mut in_stats = vec![false; n];
    for (gid_hash, rows) in &mut groups {
        let mut dropped = Vec::new();
        if let (Some(rd), true) = (adv.red_drop, rows.len() > 1) {
            dropped = match rd.rule {
                RedDropRule::Surplus => red_drop_choice(rows, &r, seed ^ *gid_hash),
                RedDropRule::Bernoulli => red_drop_bernoulli(rows, &r, seed ^ *gid_hash),
            };
            stats.dropped += dropped.len();
            if rd.rule == RedDropRule::Surplus {
                rows.retain(|i| !dropped.contains(i));
            }
        }
        for &i in rows.iter() {
            in_stats[i] = true;
            kept[i] = !dropped.contains(&i);
        }
    }

    // Centred rewards and zero-variance flags.
    let mut centred = vec![0.0; n];
    let mut zero_std = vec![false; n];
    let mut group_std = vec![0.0; n];
    for (_, rows) in &groups {
        if rows.is_empty() {
            continue;
        }
        stats.groups += 1;
        let vals: Vec<f64> = rows.iter().map(|&i| r(i)).collect();
        let is_zero_var = vals.iter().all(|&v| v == vals[0]);
        if is_zero_var {
            stats.zero_std_groups += 1;
            for &i in rows {
                zero_std[i] = true;
            }
            continue;
        }
        let b = baselines(&vals, adv.baseline);
        let s = adv.std.map_or(0.0, |d| std_of(&vals, d.norm));
        for (k, &i) in rows.iter().enumerate() {
            centred[i] = vals[k] - b[k];
            group_std[i] = s;
        }
    }

    // Std normalisation: A = (r − b)/(std + ε_std), GRPO (arXiv 2402.03300 Eq. 3 / §4.1.2) and paper A
    // (whitening inside each group); none for Dr.GRPO (arXiv 2503.20783) and paper B's REINFORCE.
    let batch_std = match adv.std {
        Some(d) if d.level == StdLevel::Batch => {
            let all: Vec<f64> = (0..n).filter(|&i| in_stats[i]).map(r).collect();
            std_of(&all, d.norm)
        }
        _ => 0.0,
    };
    let mut values = vec![0.0; n];
    let mut in_normaliser = vec![false; n];
    for i in 0..n {
        if !kept[i] {
            // A RED-Drop dropped row (scored, not kept): A = 0, in the normaliser only when asked.
            in_normaliser[i] =
                adv.red_drop.is_some_and(|rd| rd.in_normaliser) && rewards[i].is_some();
            continue;
        }
        let a = if zero_std[i] {
            0.0
        } else {
            match adv.std {
                None => centred[i],
                Some(d) => {
                    let s = match d.level {
                        StdLevel::Group => group_std[i],
                        StdLevel::Batch => batch_std,
                    };
                    centred[i] / (s + d.eps)
                }
            }
        };
        values[i] = a - adv.shift;
        in_normaliser[i] = !(zero_std[i] && adv.exclude_zero_std);
    }
    Ok(Advantages {
        values,
        in_normaliser,
        stats,
    })
}

/// Per-row baselines b_k of one group with at least two distinct values.
fn baselines(vals: &[f64], baseline: GroupBaseline) -> Vec<f64> {
    let n = vals.len() as f64;
    let sum: f64 = vals.iter().sum();
    match baseline {
        // GRPO's group mean (arXiv 2402.03300 §4.1.2; paper A; paper B's group-relative REINFORCE).
        GroupBaseline::Mean => vec![sum / n; vals.len()],
        // RLOO (arXiv 2402.14740): the mean of the other K−1 rewards.
        GroupBaseline::LeaveOneOut => vals.iter().map(|v| (sum - v) / (n - 1.0)).collect(),
        // Kimi k1.5 (arXiv 2501.12599): b = T·log mean_j exp(r_j / T).
        GroupBaseline::LogMeanExp { temperature: t } => {
            let m = vals.iter().fold(f64::NEG_INFINITY, |a, &v| a.max(v / t));
            let mean_exp = vals.iter().map(|v| (v / t - m).exp()).sum::<f64>() / n;
            vec![t * (m + mean_exp.ln()); vals.len()]
        }
    }
}

/// Std of `vals` (0 when undefined: empty, or one value with Bessel's correction).
fn std_of(vals: &[f64], norm: StdNorm) -> f64 {
    let n = vals.len();
    let denom = match norm {
        StdNorm::None => return 0.0,
        StdNorm::Sample if n < 2 => return 0.0,
        StdNorm::Sample => (n - 1) as f64,
        StdNorm::Population if n == 0 => return 0.0,
        StdNorm::Population => n as f64,
    };
    let mean = vals.iter().sum::<f64>() / n as f64;
    (vals.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / denom).sqrt()
}

/// RED-Drop (paper B, arXiv 2509.24203; DESIGN.md section 4 preset table): the rows to drop so that
/// negatives (r < mean) do not outnumber the rest.
fn red_drop_choice(rows: &[usize], r: &dyn Fn(usize) -> f64, seed: u64) -> Vec<usize> {
    let mean = rows.iter().map(|&i| r(i)).sum::<f64>() / rows.len() as f64;
    let mut negatives: Vec<usize> = rows.iter().copied().filter(|&i| r(i) < mean).collect();
    let others = rows.len() - negatives.len();
    if negatives.len() <= others {
        return Vec::new();
    }
    // Fisher-Yates with SplitMix64: deterministic across platforms and library versions.
    let mut state = seed;
    for k in (1..negatives.len()).rev() {
        let j = (splitmix64(&mut state) % (k as u64 + 1)) as usize;
        negatives.swap(k, j);
    }
    negatives.truncate(negatives.len() - others);
    negatives
}

/// RED-Drop as first written in Trinity-RFT (yaochaorui/Trinity-RFT 8a0e9e81,
/// `rec_advantage.py` `drop = "balance"`): with pos = rows with r ≥ mean and neg the others, each
/// negative is dropped independently with probability 1 − pos/neg when neg > pos. The draws
/// (SplitMix64, 53-bit uniforms in [0, 1)) go through the negatives in row order.
fn red_drop_bernoulli(rows: &[usize], r: &dyn Fn(usize) -> f64, seed: u64) -> Vec<usize> {
    let mean = rows.iter().map(|&i| r(i)).sum::<f64>() / rows.len() as f64;
    let negatives: Vec<usize> = rows.iter().copied().filter(|&i| r(i) < mean).collect();
    let pos = rows.len() - negatives.len();
    if negatives.len() <= pos {
        return Vec::new();
    }
    let p = 1.0 - pos as f64 / negatives.len() as f64;
    let mut state = seed;
    negatives
        .into_iter()
        .filter(|_| unit(splitmix64(&mut state)) < p)
        .collect()
}

/// The top 53 bits of `x` as a uniform number in [0, 1).
fn unit(x: u64) -> f64 {
    (x >> 11) as f64 / (1u64 << 53) as f64
}

fn splitmix64(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// FNV-1a over the `Hash` byte stream of `g`: a hash fixed across runs and platforms.
fn fnv1a<G: Hash>(g: &G) -> u64 {
    struct Fnv(u64);
    impl Hasher for Fnv {
        fn finish(&self) -> u64 {
            self.0
        }
        fn write(&mut self, bytes: &[u8]) {
            for b in bytes {
                self.0 ^= u64::from(*b);
                self.0 = self.0.wrapping_mul(0x100_0000_01b3);
            }
        }
    }
    let mut h = Fnv(0xcbf2_9ce4_8422_2325);
    g.hash(&mut h);
    h.finish()
}

/// RED-Weight's reweighting A·exp(A/T) (paper B, arXiv 2509.24203), as applied by the REC weight
/// `advantage-exp`. `t` > 0.
pub fn advantage_exp_weight(a: f64, t: f64) -> f64 {
    a * (a / t).exp()
}

/// DAPO's soft overlong punishment (arXiv 2503.14476, its length-aware penalty R_length), in reward units, for a completion of
/// `completion_tokens` tokens under the budget L_max = `max_new_tokens`, with L_cache =
/// round(`overlong_buffer_frac`·L_max) and scale `overlong_penalty_factor`:
///
/// ```text
/// 0                                  |y| ≤ L_max − L_cache
/// factor·((L_max − L_cache) − |y|)/L_cache   L_max − L_cache < |y| ≤ L_max
/// −factor                            |y| > L_max
/// ```
///
/// Returns 0 unless `alg.overlong` is [`OverlongRule::Soft`]. Add it to the scored rewards before
/// [`compute_advantages`] (null rewards stay null): see [`shape_rewards`].
pub fn overlong_penalty(completion_tokens: usize, max_new_tokens: usize, alg: &Algorithm) -> f64 {
    let OverlongRule::Soft {
        buffer_frac,
        penalty_factor: f,
    } = alg.overlong
    else {
        return 0.0;
    };
    if max_new_tokens == 0 {
        return 0.0;
    }
    let l_max = max_new_tokens as f64;
    let cache = (buffer_frac * l_max).round().max(1.0);
    let len = completion_tokens as f64;
    if len <= l_max - cache {
        0.0
    } else if len <= l_max {
        f * ((l_max - cache) - len) / cache
    } else {
        -f
    }
}

/// Adds [`overlong_penalty`] to every scored reward in place (lengths `[N]` in completion tokens).
///
/// # Errors
/// [`AlgoError::Input`] when the lengths differ.
pub fn shape_rewards(
    rewards: &mut [Option<f64>],
    completion_tokens: &[usize],
    max_new_tokens: usize,
    alg: &Algorithm,
) -> Result<()> {
    if rewards.len() != completion_tokens.len() {
        return Err(AlgoError::Input {
            op: "shape_rewards",
            why: format!(
                "rewards has {} rows but completion_tokens has {}",
                rewards.len(),
                completion_tokens.len()
            ),
        });
    }
    for (r, &len) in rewards.iter_mut().zip(completion_tokens) {
        if let Some(r) = r {
            *r += overlong_penalty(len, max_new_tokens, alg);
        }
    }
    Ok(())
}
