//! The trainer step's data-parallel pieces (DISTRIBUTED.md): each rank holds whole groups of the
//! step's batch, ranks in order; the per-row data the loss needs globally is gathered so that every
//! rank computes the advantages and every update's normaliser one process would compute for the
//! whole batch, then trains its own rows; gradients are summed by the optimizer's reduce hook
//! (`rlvr_dist::DistReduce`), the loss statistics here.
//!
//! Invariants: every rank calls the same collectives in the same order (one gather per step, one
//! reduction of the statistics per step, one gradient reduction per update, even with no local
//! rows); the global row order is rank 0's rows, then rank 1's, …, which is the one-process batch
//! when the ranks hold consecutive slices of it; a group id on two ranks is an error.

use std::collections::HashSet;

use rlvr_algo::{LossStats, MismatchSums};
use rlvr_dist::{Communicator, Op, SharedComm};

use crate::store::experience::Experience;

/// What the advantages and the normalisers need of one row, from whichever rank holds it.
#[derive(Debug, Clone, PartialEq)]
pub struct RowMeta {
    /// The reward (`None`: unscorable).
    pub reward: Option<f64>,
    /// Completion tokens.
    pub completion_tokens: usize,
    /// Hit `max_new_tokens` without EOS.
    pub truncated: bool,
    /// The group id.
    pub group_id: String,
}

/// The step batch as every rank sees it: all rows' [`RowMeta`] in global order, and where this
/// rank's rows sit in it.
#[derive(Debug, Clone)]
pub struct GlobalView {
    /// Every row of the step, rank 0's first.
    pub rows: Vec<RowMeta>,
    /// Global index of this rank's first row.
    pub offset: usize,
    /// This rank's rows.
    pub local: usize,
}

impl GlobalView {
    /// The global index of local row `i`.
    pub fn global(&self, i: usize) -> usize {
        self.offset + i
    }

    /// The local index of global row `g`, when this rank holds it.
    pub fn local_index(&self, g: usize) -> Option<usize> {
        (g >= self.offset && g < self.offset + self.local).then(|| g - self.offset)
    }
}

fn meta(e: &Experience) -> RowMeta {
    RowMeta {
        reward: e.reward,
        completion_tokens: e.completion_ids.len(),
        truncated: e.truncated,
        group_id: e.group_id.clone(),
    }
}

/// The one-process view of `batch` (no communication).
pub fn local_view(batch: &[Experience]) -> GlobalView {
    GlobalView {
        rows: batch.iter().map(meta).collect(),
        offset: 0,
        local: batch.len(),
    }
}

/// Every rank's rows of the step, gathered (one `all_gather_bytes`).
///
/// # Errors
/// A failed collective; a malformed message; a group id held by two ranks (groups must not be
/// split across ranks: their advantages would need communication).
pub fn gather_view(comm: &mut SharedComm, batch: &[Experience]) -> anyhow::Result<GlobalView> {
    let parts = comm.all_gather_bytes(&encode(batch))?;
    let mut rows = Vec::new();
    let mut offset = 0;
    let mut seen: HashSet<String> = HashSet::new();
    for (r, bytes) in parts.iter().enumerate() {
        if r == comm.rank() {
            offset = rows.len();
        }
        let mine = decode(bytes).map_err(|e| anyhow::anyhow!("rank {r}'s rows: {e}"))?;
        let groups: HashSet<&str> = mine.iter().map(|m| m.group_id.as_str()).collect();
        for g in groups {
            anyhow::ensure!(
                seen.insert(g.to_string()),
                "group {g:?} has rows on rank {r} and on a lower rank: a group must be on one rank"
            );
        }
        rows.extend(mine);
    }
    Ok(GlobalView {
        rows,
        offset,
        local: batch.len(),
    })
}

/// Per row: flags (bit 0 reward present, bit 1 truncated), reward bits (f64 LE), completion
/// tokens (u64 LE), group id length (u32 LE) and its UTF-8 bytes.
fn encode(batch: &[Experience]) -> Vec<u8> {
    let mut out = Vec::new();
    for e in batch {
        let flags = u8::from(e.reward.is_some()) | (u8::from(e.truncated) << 1);
        out.push(flags);
        out.extend_from_slice(&e.reward.unwrap_or(0.0).to_le_bytes());
        out.extend_from_slice(&(e.completion_ids.len() as u64).to_le_bytes());
        out.extend_from_slice(&(e.group_id.len() as u32).to_le_bytes());
        out.extend_from_slice(e.group_id.as_bytes());
    }
    out
}

fn decode(mut b: &[u8]) -> anyhow::Result<Vec<RowMeta>> {
    fn take<'a>(b: &mut &'a [u8], n: usize) -> anyhow::Result<&'a [u8]> {
        anyhow::ensure!(b.len() >= n, "truncated message");
        let (h, t) = b.split_at(n);
        *b = t;
        Ok(h)
    }
    let mut out = Vec::new();
    while !b.is_empty() {
        let flags = take(&mut b, 1)?[0];
        let reward = f64::from_le_bytes(take(&mut b, 8)?.try_into()?);
        let tokens = u64::from_le_bytes(take(&mut b, 8)?.try_into()?);
        let n = u32::from_le_bytes(take(&mut b, 4)?.try_into()?) as usize;
        let group_id = String::from_utf8(take(&mut b, n)?.to_vec())?;
        out.push(RowMeta {
            reward: (flags & 1 != 0).then_some(reward),
            completion_tokens: tokens as usize,
            truncated: flags & 2 != 0,
            group_id,
        });
    }
    Ok(out)
}

/// Sums `stats` and `diff` over the ranks in place (the ratio's min and max by min and max):
/// two `all_reduce_f64` calls. The fields that add are [`LossStats::to_sums`]'s and
/// [`MismatchSums::to_parts`]'s (counts and histogram buckets included), so a new statistic is
/// reduced where it is defined.
///
/// # Errors
/// A failed collective.
pub fn reduce_stats(
    comm: &mut SharedComm,
    stats: &mut LossStats,
    diff: &mut MismatchSums,
) -> anyhow::Result<()> {
    let mut sums = stats.to_sums();
    let n = sums.len();
    sums.extend(diff.to_parts());
    comm.all_reduce_f64(&mut sums, Op::Sum)?;
    let mut ext = stats.extrema();
    comm.all_reduce_f64(&mut ext, Op::Max)?;
    *stats = LossStats::from_sums(&sums[..n], ext);
    *diff = MismatchSums::from_parts(&sums[n..]);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn row_metadata_survives_the_wire() {
        let e = |r: Option<f64>, n: usize, t: bool, g: &str| Experience {
            prompt_ids: vec![1],
            completion_ids: vec![2; n],
            behaviour_logprobs: vec![0.0; n],
            reward: r,
            correct: None,
            group_id: g.into(),
            version: None,
            components: Vec::new(),
            truncated: t,
        };
        let batch = vec![
            e(Some(0.1 + 0.2), 3, false, "a"),
            e(None, 0, true, "gruppe-ü"),
            e(Some(-1e-300), 7, false, ""),
        ];
        let back = decode(&encode(&batch)).unwrap();
        assert_eq!(back, local_view(&batch).rows);
        assert!(decode(&encode(&batch)[..5]).is_err());
    }
}
