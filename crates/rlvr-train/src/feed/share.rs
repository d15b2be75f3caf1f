//! Data parallel sampling (ARCHITECTURE.md, "Data parallel"): every rank draws the same B
//! prompts of a step from the one prompt sampler (same seed, same cursor), samples and scores only
//! its share of the groups ([`crate::pack::rank_range`]: consecutive, rank order), and the groups
//! are then gathered, so that every rank holds the whole batch, exactly as one process would have
//! sampled it: each completion's randomness is seeded by (run seed, prompt draw index, sample
//! index), never by the rank or the split. DAPO's dynamic sampling then decides on the gathered
//! groups, the same on every rank; the trainer takes its own share of the result.
//!
//! Architecture invariant: a rank's share depends only on the batch size, the rank and the world
//! size; the gathered batch is the ranks' shares concatenated in rank order; the wire format below
//! carries every field bit for bit (f32 and f64 as their bits, NaN included).

use rlvr_dist::{Communicator, SharedComm};

use crate::store::experience::{Experience, RewardPart};
use crate::store::rollouts::RolloutRecord;

/// Which share of each step's groups this process samples, and the ranks it gathers them from.
#[derive(Clone)]
pub struct Share {
    /// This rank.
    pub rank: usize,
    /// Ranks in all.
    pub world: usize,
    /// The communicator the sampled groups are gathered over; `None` where the caller gathers
    /// (the explorer on its own thread: collectives stay on the run's thread).
    pub comm: Option<SharedComm>,
}

/// Every rank's groups and rollout records of one sampling round, gathered in rank order (one
/// `all_gather_bytes`).
///
/// # Errors
/// A failed collective; a malformed message (names the rank).
pub fn gather_round(
    comm: &mut SharedComm,
    groups: &[Vec<Experience>],
    rollouts: &[RolloutRecord],
) -> anyhow::Result<(Vec<Vec<Experience>>, Vec<RolloutRecord>)> {
    let mut w = Writer::default();
    w.len(groups.len());
    for g in groups {
        w.len(g.len());
        for e in g {
            put_experience(&mut w, e);
        }
    }
    w.len(rollouts.len());
    for r in rollouts {
        put_rollout(&mut w, r);
    }
    let parts = comm.all_gather_bytes(&w.0)?;
    let (mut all_groups, mut all_rollouts) = (Vec::new(), Vec::new());
    for (rank, bytes) in parts.iter().enumerate() {
        let mut r = Reader(bytes);
        let decoded = (|| -> anyhow::Result<()> {
            for _ in 0..r.len(1)? {
                let n = r.len(1)?;
                let mut g = Vec::with_capacity(n);
                for _ in 0..n {
                    g.push(get_experience(&mut r)?);
                }
                all_groups.push(g);
            }
            for _ in 0..r.len(1)? {
                all_rollouts.push(get_rollout(&mut r)?);
            }
            anyhow::ensure!(r.0.is_empty(), "{} bytes left over", r.0.len());
            Ok(())
        })();
        decoded.map_err(|e| anyhow::anyhow!("rank {rank}'s sampled groups: {e}"))?;
    }
    Ok((all_groups, all_rollouts))
}

/// Little-endian wire writer.
#[derive(Default)]
struct Writer(Vec<u8>);

impl Writer {
    fn u64(&mut self, x: u64) {
        self.0.extend_from_slice(&x.to_le_bytes());
    }
    fn len(&mut self, n: usize) {
        self.u64(n as u64);
    }
    fn f64(&mut self, x: f64) {
        self.u64(x.to_bits());
    }
    fn u8(&mut self, x: u8) {
        self.0.push(x);
    }
    fn str(&mut self, s: &str) {
        self.len(s.len());
        self.0.extend_from_slice(s.as_bytes());
    }
    fn opt_f64(&mut self, x: Option<f64>) {
        self.u8(u8::from(x.is_some()));
        self.f64(x.unwrap_or(0.0));
    }
    fn opt_bool(&mut self, x: Option<bool>) {
        self.u8(match x {
            None => 0,
            Some(false) => 1,
            Some(true) => 2,
        });
    }
    fn opt_u64(&mut self, x: Option<u64>) {
        self.u8(u8::from(x.is_some()));
        self.u64(x.unwrap_or(0));
    }
}

/// Reader over a peer's message: every length is checked against the bytes left before anything
/// is allocated.
struct Reader<'a>(&'a [u8]);

impl Reader<'_> {
    fn take(&mut self, n: usize) -> anyhow::Result<&[u8]> {
        anyhow::ensure!(
            n <= self.0.len(),
            "truncated: {n} bytes wanted, {} left",
            self.0.len()
        );
        let (a, b) = self.0.split_at(n);
        self.0 = b;
        Ok(a)
    }
    fn u64(&mut self) -> anyhow::Result<u64> {
        Ok(u64::from_le_bytes(self.take(8)?.try_into()?))
    }
    /// A count of items of at least `item_bytes` bytes each.
    fn len(&mut self, item_bytes: usize) -> anyhow::Result<usize> {
        let n = self.u64()?;
        anyhow::ensure!(
            n.saturating_mul(item_bytes as u64) <= self.0.len() as u64,
            "a count of {n} exceeds the message"
        );
        Ok(n as usize)
    }
    fn f64(&mut self) -> anyhow::Result<f64> {
        Ok(f64::from_bits(self.u64()?))
    }
    fn u8(&mut self) -> anyhow::Result<u8> {
        Ok(self.take(1)?[0])
    }
    fn str(&mut self) -> anyhow::Result<String> {
        let n = self.len(1)?;
        Ok(String::from_utf8(self.take(n)?.to_vec())?)
    }
    fn opt_f64(&mut self) -> anyhow::Result<Option<f64>> {
        let some = self.u8()? != 0;
        let x = self.f64()?;
        Ok(some.then_some(x))
    }
    fn opt_bool(&mut self) -> anyhow::Result<Option<bool>> {
        Ok(match self.u8()? {
            0 => None,
            1 => Some(false),
            2 => Some(true),
            b => anyhow::bail!("bad option tag {b}"),
        })
    }
    fn opt_u64(&mut self) -> anyhow::Result<Option<u64>> {
        let some = self.u8()? != 0;
        let x = self.u64()?;
        Ok(some.then_some(x))
    }
    fn u32s(&mut self) -> anyhow::Result<Vec<u32>> {
        let n = self.len(4)?;
        Ok(self
            .take(4 * n)?
            .chunks_exact(4)
            .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect())
    }
}

fn put_u32s(w: &mut Writer, xs: impl ExactSizeIterator<Item = u32>) {
    w.len(xs.len());
    for x in xs {
        w.0.extend_from_slice(&x.to_le_bytes());
    }
}

fn put_experience(w: &mut Writer, e: &Experience) {
    put_u32s(w, e.prompt_ids.iter().copied());
    put_u32s(w, e.completion_ids.iter().copied());
    put_u32s(w, e.behaviour_logprobs.iter().map(|x| x.to_bits()));
    w.opt_f64(e.reward);
    w.opt_bool(e.correct);
    w.str(&e.group_id);
    w.opt_u64(e.version);
    w.u8(u8::from(e.truncated));
    w.len(e.components.len());
    for c in &e.components {
        w.str(&c.name);
        w.f64(c.raw);
        w.f64(c.weighted);
    }
}

fn get_experience(r: &mut Reader) -> anyhow::Result<Experience> {
    let prompt_ids = r.u32s()?;
    let completion_ids = r.u32s()?;
    let behaviour_logprobs = r.u32s()?.into_iter().map(f32::from_bits).collect();
    let reward = r.opt_f64()?;
    let correct = r.opt_bool()?;
    let group_id = r.str()?;
    let version = r.opt_u64()?;
    let truncated = r.u8()? != 0;
    let n = r.len(24)?;
    let mut components = Vec::with_capacity(n);
    for _ in 0..n {
        components.push(RewardPart {
            name: r.str()?,
            raw: r.f64()?,
            weighted: r.f64()?,
        });
    }
    Ok(Experience {
        prompt_ids,
        completion_ids,
        behaviour_logprobs,
        reward,
        correct,
        group_id,
        version,
        truncated,
        components,
    })
}

fn put_rollout(w: &mut Writer, r: &RolloutRecord) {
    w.str(&r.group_id);
    w.str(&r.prompt);
    w.str(&r.completion);
    w.opt_f64(r.reward);
    w.opt_bool(r.correct);
    w.opt_u64(r.version);
    w.str(&r.finish_reason);
}

fn get_rollout(r: &mut Reader) -> anyhow::Result<RolloutRecord> {
    Ok(RolloutRecord {
        group_id: r.str()?,
        prompt: r.str()?,
        completion: r.str()?,
        reward: r.opt_f64()?,
        correct: r.opt_bool()?,
        version: r.opt_u64()?,
        finish_reason: r.str()?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use rlvr_dist::ThreadComm;

    fn exp(g: &str, i: u32) -> Experience {
        Experience {
            prompt_ids: vec![1, 2, i],
            completion_ids: (0..i).collect(),
            behaviour_logprobs: (0..i)
                .map(|j| {
                    if j == 1 {
                        f32::NAN
                    } else {
                        -0.1 * j as f32 - 1e-8
                    }
                })
                .collect(),
            reward: (i != 2).then_some(0.1 * i as f64),
            correct: [None, Some(false), Some(true)][i as usize % 3],
            group_id: g.into(),
            version: i.is_multiple_of(2).then_some(u64::MAX - i as u64),
            truncated: i % 2 == 1,
            components: (0..i % 3)
                .map(|k| RewardPart {
                    name: format!("c{k}·é"),
                    raw: 1.0 / 3.0 + k as f64,
                    weighted: -0.0,
                })
                .collect(),
        }
    }

    fn bits(e: &Experience) -> (Vec<u32>, Option<u64>) {
        (
            e.behaviour_logprobs.iter().map(|x| x.to_bits()).collect(),
            e.reward.map(f64::to_bits),
        )
    }

    #[test]
    fn groups_gather_in_rank_order_bit_for_bit() {
        let out = ThreadComm::run(3, |c| {
            let mut comm = SharedComm::new(Box::new(c));
            let r = comm.rank() as u32;
            // Rank 2 sampled nothing (fewer groups than ranks).
            let groups: Vec<Vec<Experience>> = if r == 2 {
                vec![]
            } else {
                vec![(0..4).map(|i| exp(&format!("g{r}"), i)).collect()]
            };
            let recs = vec![RolloutRecord {
                group_id: format!("g{r}"),
                prompt: "p\n∑".into(),
                completion: String::new(),
                reward: None,
                correct: Some(true),
                version: Some(3),
                finish_reason: "eos".into(),
            }];
            gather_round(&mut comm, &groups, &recs).unwrap()
        });
        let want: Vec<Vec<Experience>> = (0..2)
            .map(|r| (0..4).map(|i| exp(&format!("g{r}"), i)).collect())
            .collect();
        for (groups, recs) in &out {
            assert_eq!(groups.len(), 2);
            for (a, b) in groups.iter().flatten().zip(want.iter().flatten()) {
                assert_eq!(bits(a), bits(b));
                let (mut a, mut b) = (a.clone(), b.clone());
                a.behaviour_logprobs.clear();
                b.behaviour_logprobs.clear();
                assert_eq!(a, b);
            }
            let ids: Vec<&str> = recs.iter().map(|r| r.group_id.as_str()).collect();
            assert_eq!(ids, ["g0", "g1", "g2"]);
            assert_eq!(recs[0].prompt, "p\n∑");
        }
    }

    #[test]
    fn a_malformed_message_is_an_error_not_an_allocation() {
        // A count of 2^60 groups in a 16-byte message.
        let mut w = Writer::default();
        w.u64(1 << 60);
        w.u64(0);
        let mut r = Reader(&w.0);
        assert!(r.len(1).unwrap_err().to_string().contains("exceeds"));
        let mut r = Reader(&[1, 2, 3]);
        assert!(r.u64().is_err());
    }
}
