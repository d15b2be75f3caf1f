//! The row packer: prompt + completion rows → the right-padded batch every training forward of
//! rlvr-train reads (the trainer's update, behaviour log-prob recomputation and evaluation's
//! scoring, SFT).
//!
//! Row r is `prompt ‖ completion`, padded on the right with `pad` to the longest row (at least 2
//! positions). The forward starts its output at `start` = shortest prompt − 1, the position that
//! predicts the first completion token of the shortest prompt; completion token j of row r
//! (at position P_r + j) is predicted by output column `at[r][j]` = P_r + j − 1 − `start`.
//!
//! [`micro_batches`] decides which rows go into one forward: whole groups, a group larger than the
//! limit split into parts (each part shares its prompt in the prefix-shared forward,
//! `rlvr_model::shared_prefix`). This is the boundary every stage agrees on: the unit a micro-batch,
//! a mini-batch or (data parallel) a rank holds is a list of whole groups or group parts, never
//! rows of a group scattered among other groups.

use crate::store::experience::Experience;

/// A packed micro-batch (see the module docs).
#[derive(Debug, Clone, PartialEq)]
pub struct PackedRows {
    /// `[b][T]` token ids, right-padded.
    pub ids: Vec<Vec<u32>>,
    /// `[b][T]` attention mask: 1 on real tokens, 0 on padding.
    pub mask: Vec<Vec<u32>>,
    /// First output position (shortest prompt − 1).
    pub start: usize,
    /// Per row, the output column (relative to `start`) predicting each completion token.
    pub at: Vec<Vec<usize>>,
}

impl PackedRows {
    /// Output columns per row (`T − 1 − start`): what `Model::token_logprobs` returns per row.
    pub fn columns(&self) -> usize {
        self.ids.first().map_or(0, |r| r.len() - 1 - self.start)
    }
}

/// Packs `(prompt, completion)` rows (module docs). Every prompt must hold at least one token.
pub fn pack_rows(rows: &[(&[u32], &[u32])], pad: u32) -> PackedRows {
    let t = rows
        .iter()
        .map(|(p, c)| p.len() + c.len())
        .max()
        .unwrap_or(0)
        .max(2);
    let start = rows
        .iter()
        .map(|(p, _)| p.len())
        .min()
        .unwrap_or(1)
        .saturating_sub(1);
    let mut out = PackedRows {
        ids: Vec::with_capacity(rows.len()),
        mask: Vec::with_capacity(rows.len()),
        start,
        at: Vec::with_capacity(rows.len()),
    };
    for (p, c) in rows {
        let mut row: Vec<u32> = p.to_vec();
        row.extend_from_slice(c);
        let n = row.len();
        row.resize(t, pad);
        let mut m = vec![1u32; n];
        m.resize(t, 0);
        out.ids.push(row);
        out.mask.push(m);
        // Completion token j sits at P + j and is predicted at position P + j − 1.
        out.at
            .push((0..c.len()).map(|j| p.len() + j - 1 - start).collect());
    }
    out
}

/// The positions of each group in `ids` (one group id per row), groups in order of first
/// appearance, positions ascending: the grouping every split of rows into whole groups uses.
pub fn group_positions<'a>(ids: impl IntoIterator<Item = &'a str>) -> Vec<Vec<usize>> {
    let mut index: std::collections::HashMap<&str, usize> = Default::default();
    let mut out: Vec<Vec<usize>> = Vec::new();
    for (p, g) in ids.into_iter().enumerate() {
        let k = *index.entry(g).or_insert_with(|| {
            out.push(Vec::new());
            out.len() - 1
        });
        out[k].push(p);
    }
    out
}

/// Rank `rank`'s share of `n` items split over `world` ranks: consecutive, in rank order, the
/// first `n mod world` ranks one item more (sizes differ by at most one; a rank may get none).
/// Data parallel splits a step's groups and the held-out problems this way, so the ranks' shares
/// concatenated in rank order are the one-process order.
///
/// # Panics
/// `world` is 0 or `rank ≥ world`.
pub fn rank_range(n: usize, rank: usize, world: usize) -> std::ops::Range<usize> {
    assert!(rank < world, "rank {rank} of a world of {world}");
    let (base, extra) = (n / world, n % world);
    let start = rank * base + rank.min(extra);
    start..start + base + usize::from(rank < extra)
}

/// Rank `rank`'s rows of a step batch under data parallel: its [`rank_range`] of the batch's
/// groups ([`group_positions`] order), each group's rows in batch order. With groups stored
/// consecutively (as the explorer and the offline source hand them out) this is a consecutive
/// slice, and the ranks' slices in rank order are the batch.
pub fn rank_rows(batch: &[Experience], rank: usize, world: usize) -> Vec<Experience> {
    let groups = group_positions(batch.iter().map(|e| e.group_id.as_str()));
    groups[rank_range(groups.len(), rank, world)]
        .iter()
        .flatten()
        .map(|&i| batch[i].clone())
        .collect()
}

/// How big one micro-batch may be ([`micro_batches`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MicroBatchLimit {
    /// Rows (completions) per micro-batch, at least 1; ignored when `tokens` is set.
    pub rows: usize,
    /// Token budget per micro-batch: the decoder positions its forward runs ([`forward_cost`]).
    pub tokens: Option<usize>,
    /// Whether the forward shares each group's prompt (`train.share_prompt`): the budget then
    /// counts a shared prompt once.
    pub share_prompt: bool,
}

/// Decoder positions one forward over `rows` of `batch` runs: the right-padded `[b, T]` batch
/// (b × longest row); with `share_prompt`, the least of that and the prefix-shared layout's
/// G·P + R·C (G distinct prompts padded to the longest P, R rows padded to the longest completion
/// minus one, C), which is what `Model::shared_prefix_logprobs_rows` runs (it falls back to the
/// unshared batch when that is not larger).
pub fn forward_cost(batch: &[Experience], rows: &[usize], share_prompt: bool) -> usize {
    let longest = rows
        .iter()
        .map(|&i| batch[i].prompt_ids.len() + batch[i].completion_ids.len())
        .max()
        .unwrap_or(0);
    let unshared = rows.len() * longest;
    if !share_prompt {
        return unshared;
    }
    let mut prompts: Vec<&[u32]> = rows.iter().map(|&i| &batch[i].prompt_ids[..]).collect();
    prompts.sort_unstable();
    prompts.dedup();
    let p = prompts.iter().map(|p| p.len()).max().unwrap_or(0);
    let c = rows
        .iter()
        .map(|&i| batch[i].completion_ids.len().saturating_sub(1))
        .max()
        .unwrap_or(0);
    unshared.min(prompts.len() * p + rows.len() * c)
}

/// Splits `rows` of `batch` into micro-batches of whole groups (by `group_id`, groups in order of
/// first appearance in `rows`, each group's rows in `rows` order). Groups are added to the current
/// micro-batch while it stays within `limit`; a group that would overflow it starts the next one,
/// and a group that alone exceeds the limit is split into parts of as many rows as fit (at least
/// one row each), the last part staying open for the groups after it. With a token budget a single
/// row longer than the budget still gets its own micro-batch.
///
/// Every row of `rows` appears in exactly one micro-batch; no micro-batch is empty.
pub fn micro_batches(
    batch: &[Experience],
    rows: &[usize],
    limit: MicroBatchLimit,
) -> Vec<Vec<usize>> {
    let fits = |mb: &[usize]| match limit.tokens {
        None => mb.len() <= limit.rows.max(1),
        Some(budget) => forward_cost(batch, mb, limit.share_prompt) <= budget,
    };
    let groups = group_positions(rows.iter().map(|&i| batch[i].group_id.as_str()));
    let mut out: Vec<Vec<usize>> = Vec::new();
    let mut cur: Vec<usize> = Vec::new();
    for positions in groups {
        let group: Vec<usize> = positions.iter().map(|&p| rows[p]).collect();
        let mut joined = cur.clone();
        joined.extend_from_slice(&group);
        if fits(&joined) {
            cur = joined;
            continue;
        }
        if !cur.is_empty() {
            out.push(std::mem::take(&mut cur));
        }
        // The group alone: whole if it fits, else parts of as many rows as fit.
        for i in group {
            cur.push(i);
            if cur.len() > 1 && !fits(&cur) {
                cur.pop();
                out.push(std::mem::replace(&mut cur, vec![i]));
            }
        }
    }
    if !cur.is_empty() {
        out.push(cur);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn exp(group: &str, prompt: &[u32], completion: usize) -> Experience {
        Experience {
            group_id: group.into(),
            prompt_ids: prompt.to_vec(),
            completion_ids: vec![1; completion],
            behaviour_logprobs: vec![0.0; completion],
            reward: Some(0.0),
            correct: None,
            version: Some(0),
            components: Vec::new(),
            truncated: false,
            ..Default::default()
        }
    }

    #[test]
    fn micro_batches_hold_whole_groups_and_split_only_groups_above_the_limit() {
        // Groups a (3 rows), b (2), c (5), d (1); rows of a and b interleaved in `rows`.
        let mut batch = Vec::new();
        for (g, k) in [("a", 3), ("b", 2), ("c", 5), ("d", 1)] {
            for _ in 0..k {
                batch.push(exp(g, &[7, 8], 3));
            }
        }
        let rows = [0, 3, 1, 4, 2, 5, 6, 7, 8, 9, 10];
        let limit = MicroBatchLimit {
            rows: 4,
            tokens: None,
            share_prompt: true,
        };
        let mbs = micro_batches(&batch, &rows, limit);
        // a alone (b would make 5); b; c split 4 + 1, d joins c's last part.
        assert_eq!(
            mbs,
            vec![vec![0, 1, 2], vec![3, 4], vec![5, 6, 7, 8], vec![9, 10]]
        );
        let limit1 = MicroBatchLimit { rows: 1, ..limit };
        assert_eq!(micro_batches(&batch, &rows, limit1).len(), 11);
    }

    #[test]
    fn the_token_budget_counts_a_shared_prompt_once() {
        // One group of 4 rows, prompt 10, completions 5: unshared 4 × 15 = 60, shared 10 + 4 × 4 = 26.
        let batch: Vec<Experience> = (0..4).map(|_| exp("g", &[3; 10], 5)).collect();
        let rows = [0, 1, 2, 3];
        assert_eq!(forward_cost(&batch, &rows, false), 60);
        assert_eq!(forward_cost(&batch, &rows, true), 26);
        let budget = |share_prompt| MicroBatchLimit {
            rows: 1,
            tokens: Some(30),
            share_prompt,
        };
        assert_eq!(
            micro_batches(&batch, &rows, budget(true)),
            vec![vec![0, 1, 2, 3]]
        );
        assert_eq!(
            micro_batches(&batch, &rows, budget(false)),
            vec![vec![0, 1], vec![2, 3]]
        );
        // A row longer than the budget gets its own micro-batch.
        let tiny = MicroBatchLimit {
            rows: 1,
            tokens: Some(5),
            share_prompt: true,
        };
        assert_eq!(micro_batches(&batch, &rows, tiny).len(), 4);
        // Distinct prompts share nothing; the flat layout still drops each row's last position
        // (2 × 10 + 2 × 4 = 28 < 2 × 15), so that is the forward that runs.
        let mixed = vec![exp("x", &[1; 10], 5), exp("x", &[2; 10], 5)];
        assert_eq!(forward_cost(&mixed, &[0, 1], true), 28);
        assert_eq!(forward_cost(&mixed, &[0, 1], false), 30);
    }

    #[test]
    fn rank_shares_are_consecutive_balanced_and_cover_every_item_once() {
        assert_eq!(rank_range(5, 0, 2), 0..3);
        assert_eq!(rank_range(5, 1, 2), 3..5);
        assert_eq!(
            (0..3).map(|r| rank_range(7, r, 3)).collect::<Vec<_>>(),
            vec![0..3, 3..5, 5..7]
        );
        // Fewer items than ranks: the last ranks get none.
        assert_eq!(
            (0..3).map(|r| rank_range(2, r, 3)).collect::<Vec<_>>(),
            vec![0..1, 1..2, 2..2]
        );
        for n in 0..20 {
            for w in 1..6 {
                let all: Vec<usize> = (0..w).flat_map(|r| rank_range(n, r, w)).collect();
                assert_eq!(all, (0..n).collect::<Vec<_>>(), "n {n} w {w}");
                let sizes: Vec<usize> = (0..w).map(|r| rank_range(n, r, w).len()).collect();
                assert!(sizes.iter().max().unwrap() - sizes.iter().min().unwrap() <= 1);
            }
        }
    }

    #[test]
    fn rank_rows_hand_out_whole_groups_in_batch_order() {
        let mut batch = Vec::new();
        for (g, k) in [("a", 2), ("b", 3), ("c", 1)] {
            for i in 0..k {
                batch.push(exp(g, &[i as u32], 1));
            }
        }
        let ids = |rows: Vec<Experience>| -> Vec<(String, u32)> {
            rows.into_iter()
                .map(|e| (e.group_id, e.prompt_ids[0]))
                .collect()
        };
        let r0 = ids(rank_rows(&batch, 0, 2));
        let r1 = ids(rank_rows(&batch, 1, 2));
        assert_eq!(
            r0,
            [("a", 0), ("a", 1), ("b", 0), ("b", 1), ("b", 2)].map(|(g, i)| (g.to_string(), i))
        );
        assert_eq!(r1, vec![("c".to_string(), 0)]);
        assert!(rank_rows(&batch, 3, 4).is_empty());
    }

    #[test]
    fn rows_are_right_padded_and_completion_positions_are_relative_to_start() {
        let rows: Vec<(&[u32], &[u32])> = vec![(&[1, 2, 3][..], &[4, 5][..]), (&[6][..], &[7][..])];
        let p = pack_rows(&rows, 0);
        assert_eq!(p.ids, vec![vec![1, 2, 3, 4, 5], vec![6, 7, 0, 0, 0]]);
        assert_eq!(p.mask, vec![vec![1, 1, 1, 1, 1], vec![1, 1, 0, 0, 0]]);
        assert_eq!(p.start, 0);
        // Row 0: token 4 (position 3) is predicted at 2, token 5 at 3; row 1: token 7 at 0.
        assert_eq!(p.at, vec![vec![2, 3], vec![0]]);
        assert_eq!(p.columns(), 4);
    }

    #[test]
    fn a_lone_one_token_row_still_gets_two_positions() {
        let rows: Vec<(&[u32], &[u32])> = vec![(&[9][..], &[][..])];
        let p = pack_rows(&rows, 0);
        assert_eq!(
            (p.ids.clone(), p.start, p.columns()),
            (vec![vec![9, 0]], 0, 1)
        );
        assert!(p.at[0].is_empty());
    }
}
