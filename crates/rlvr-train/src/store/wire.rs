//! The one binary serialisation of experience rows: what data-parallel ranks send each other
//! (a sampling round's groups and rollout records, the trainer's per-row metadata), typed and
//! little-endian. Every field travels bit for bit: f32 and f64 as their bits (NaN payloads, ±inf
//! and −0.0 included), strings as UTF-8 with their byte length, options with a tag.
//!
//! Format, per item: `u64` counts and lengths; an [`Experience`] is its prompt ids, completion ids
//! and behaviour log-probs (each a count then `u32`s, log-probs as f32 bits), the reward (`u8`
//! tag, f64 bits), `correct` (`u8`: 0 none, 1 false, 2 true), the group id, the version (`u8`
//! tag, `u64`), `truncated` (`u8`) and its reward parts (count, then name, raw and weighted as
//! f64 bits, and its extra numbers: count, then name and f64 bits each), its mask, turns, turn
//! rewards and environment metrics (count, then name and f64 bits each); a [`RolloutRecord`] its
//! group id, prompt, completion, reward, correct, version, finish reason, turns, turn rewards and
//! metrics; a [`RowMeta`] its reward, completion tokens (`u64`), `truncated` and group id.
//!
//! Reading a peer's message never trusts it: every count is checked against the bytes left
//! before anything is allocated, a bad tag or bad UTF-8 is an error, and leftover bytes are an
//! error. The text formats of a run (the experiences JSONL with its line and field errors,
//! [`crate::store::experience`]; the checkpoint's `buffer.jsonl`) stay JSON: files a person reads.

use crate::store::experience::{Experience, RewardPart};
use crate::store::rollouts::RolloutRecord;

/// What the advantages and the normalisers need of one row, from whichever rank holds it.
#[derive(Debug, Clone, PartialEq)]
pub struct RowMeta {
    /// The reward (`None`: unscorable).
    pub reward: Option<f64>,
    /// Sampled completion tokens (a multi-turn episode's bridge tokens left out).
    pub completion_tokens: usize,
    /// Hit `max_new_tokens` without EOS.
    pub truncated: bool,
    /// The group id.
    pub group_id: String,
}

impl RowMeta {
    /// `e`'s metadata.
    pub fn of(e: &Experience) -> RowMeta {
        RowMeta {
            reward: e.reward,
            completion_tokens: e.sampled_tokens(),
            truncated: e.truncated,
            group_id: e.group_id.clone(),
        }
    }
}

/// A value with a binary form in this codec.
pub trait Wire: Sized {
    /// Appends `self` to `w`.
    fn put(&self, w: &mut Writer);
    /// Reads one value from `r`.
    ///
    /// # Errors
    /// Too few bytes, a count that exceeds the message, a bad tag or bad UTF-8.
    fn get(r: &mut Reader) -> anyhow::Result<Self>;
}

/// `items` as one message: a count, then each item.
pub fn encode<T: Wire>(items: &[T]) -> Vec<u8> {
    let mut w = Writer::default();
    put_all(&mut w, items);
    w.0
}

/// The items of a message written by [`encode`]; the whole message must be read.
///
/// # Errors
/// A malformed message (what is wrong, never a panic or an oversized allocation).
pub fn decode<T: Wire>(bytes: &[u8]) -> anyhow::Result<Vec<T>> {
    let mut r = Reader(bytes);
    let items = get_all(&mut r)?;
    r.finish()?;
    Ok(items)
}

/// One sampling round of a rank: its groups, then its rollout records.
pub fn encode_round(groups: &[Vec<Experience>], rollouts: &[RolloutRecord]) -> Vec<u8> {
    let mut w = Writer::default();
    w.len(groups.len());
    for g in groups {
        put_all(&mut w, g);
    }
    put_all(&mut w, rollouts);
    w.0
}

/// A message of [`encode_round`].
///
/// # Errors
/// A malformed message.
pub fn decode_round(bytes: &[u8]) -> anyhow::Result<(Vec<Vec<Experience>>, Vec<RolloutRecord>)> {
    let mut r = Reader(bytes);
    let n = r.len(8)?;
    let mut groups = Vec::with_capacity(n);
    for _ in 0..n {
        groups.push(get_all(&mut r)?);
    }
    let rollouts = get_all(&mut r)?;
    r.finish()?;
    Ok((groups, rollouts))
}

/// A rank's [`RowMeta`]s as one message ([`encode`]).
pub fn encode_metas(rows: &[RowMeta]) -> Vec<u8> {
    encode(rows)
}

/// A message of [`encode_metas`].
///
/// # Errors
/// A malformed message.
pub fn decode_metas(bytes: &[u8]) -> anyhow::Result<Vec<RowMeta>> {
    decode(bytes)
}

fn put_all<T: Wire>(w: &mut Writer, items: &[T]) {
    w.len(items.len());
    for x in items {
        x.put(w);
    }
}

fn get_all<T: Wire>(r: &mut Reader) -> anyhow::Result<Vec<T>> {
    // Every item takes at least one byte.
    let n = r.len(1)?;
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        out.push(T::get(r)?);
    }
    Ok(out)
}

/// Little-endian writer.
#[derive(Default)]
pub struct Writer(pub Vec<u8>);

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
    fn u32s(&mut self, xs: impl ExactSizeIterator<Item = u32>) {
        self.len(xs.len());
        for x in xs {
            self.0.extend_from_slice(&x.to_le_bytes());
        }
    }
}

/// Reader over a peer's message: every length is checked against the bytes left before anything
/// is allocated.
pub struct Reader<'a>(pub &'a [u8]);

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
    fn finish(&self) -> anyhow::Result<()> {
        anyhow::ensure!(self.0.is_empty(), "{} bytes left over", self.0.len());
        Ok(())
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
    fn flag(&mut self) -> anyhow::Result<bool> {
        match self.u8()? {
            0 => Ok(false),
            1 => Ok(true),
            b => anyhow::bail!("bad flag {b}"),
        }
    }
    fn str(&mut self) -> anyhow::Result<String> {
        let n = self.len(1)?;
        Ok(String::from_utf8(self.take(n)?.to_vec())?)
    }
    fn opt_f64(&mut self) -> anyhow::Result<Option<f64>> {
        let some = self.flag()?;
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
        let some = self.flag()?;
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

/// Named numbers (an episode's metrics): the count, then name and f64 bits each.
fn put_numbers(w: &mut Writer, m: &std::collections::BTreeMap<String, f64>) {
    w.len(m.len());
    for (k, x) in m {
        w.str(k);
        w.f64(*x);
    }
}

/// Reads what [`put_numbers`] wrote.
fn get_numbers(r: &mut Reader) -> anyhow::Result<std::collections::BTreeMap<String, f64>> {
    // A number is at least a name's length and an f64.
    let n = r.len(16)?;
    let mut m = std::collections::BTreeMap::new();
    for _ in 0..n {
        let k = r.str()?;
        m.insert(k, r.f64()?);
    }
    Ok(m)
}

impl Wire for Experience {
    fn put(&self, w: &mut Writer) {
        w.u32s(self.prompt_ids.iter().copied());
        w.u32s(self.completion_ids.iter().copied());
        w.u32s(self.behaviour_logprobs.iter().map(|x| x.to_bits()));
        w.opt_f64(self.reward);
        w.opt_bool(self.correct);
        w.str(&self.group_id);
        w.opt_u64(self.version);
        w.u8(u8::from(self.truncated));
        w.len(self.components.len());
        for c in &self.components {
            w.str(&c.name);
            w.f64(c.raw);
            w.f64(c.weighted);
            w.len(c.extra.len());
            for (k, x) in &c.extra {
                w.str(k);
                w.f64(*x);
            }
        }
        w.u8(u8::from(self.completion_mask.is_some()));
        if let Some(m) = &self.completion_mask {
            w.u32s(m.iter().map(|&x| u32::from(x)));
        }
        w.opt_u64(self.turns.map(u64::from));
        w.len(self.turn_rewards.len());
        for r in &self.turn_rewards {
            w.opt_f64(*r);
        }
        put_numbers(w, &self.env_metrics);
    }

    fn get(r: &mut Reader) -> anyhow::Result<Self> {
        let prompt_ids = r.u32s()?;
        let completion_ids = r.u32s()?;
        let behaviour_logprobs = r.u32s()?.into_iter().map(f32::from_bits).collect();
        let reward = r.opt_f64()?;
        let correct = r.opt_bool()?;
        let group_id = r.str()?;
        let version = r.opt_u64()?;
        let truncated = r.flag()?;
        // A part is at least a name's length, two f64s and its extras' count.
        let n = r.len(32)?;
        let mut components = Vec::with_capacity(n);
        for _ in 0..n {
            let (name, raw, weighted) = (r.str()?, r.f64()?, r.f64()?);
            // An extra number is at least a name's length and an f64.
            let m = r.len(16)?;
            let mut extra = std::collections::BTreeMap::new();
            for _ in 0..m {
                let k = r.str()?;
                extra.insert(k, r.f64()?);
            }
            components.push(RewardPart {
                name,
                raw,
                weighted,
                extra,
            });
        }
        let completion_mask = if r.flag()? {
            let m = r.u32s()?;
            anyhow::ensure!(
                m.len() == completion_ids.len() && m.iter().all(|&x| x <= 1),
                "a completion mask of {} entries for {} tokens, or not 0/1",
                m.len(),
                completion_ids.len()
            );
            Some(m.into_iter().map(|x| x as u8).collect())
        } else {
            None
        };
        let turns = r.opt_u64()?.map(u32::try_from).transpose()?;
        // A turn reward is at least its presence byte.
        let n = r.len(1)?;
        let mut turn_rewards = Vec::with_capacity(n);
        for _ in 0..n {
            turn_rewards.push(r.opt_f64()?);
        }
        let env_metrics = get_numbers(r)?;
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
            completion_mask,
            turns,
            turn_rewards,
            env_metrics,
        })
    }
}

impl Wire for RolloutRecord {
    fn put(&self, w: &mut Writer) {
        w.str(&self.group_id);
        w.str(&self.prompt);
        w.str(&self.completion);
        w.opt_f64(self.reward);
        w.opt_bool(self.correct);
        w.opt_u64(self.version);
        w.str(&self.finish_reason);
        w.opt_u64(self.turns.map(u64::from));
        w.u8(u8::from(self.turn_rewards.is_some()));
        if let Some(t) = &self.turn_rewards {
            w.len(t.len());
            for r in t {
                w.opt_f64(*r);
            }
        }
        put_numbers(w, &self.metrics);
    }

    fn get(r: &mut Reader) -> anyhow::Result<Self> {
        let (group_id, prompt, completion) = (r.str()?, r.str()?, r.str()?);
        let (reward, correct, version) = (r.opt_f64()?, r.opt_bool()?, r.opt_u64()?);
        let finish_reason = r.str()?;
        let turns = r.opt_u64()?.map(u32::try_from).transpose()?;
        let turn_rewards = if r.flag()? {
            // A turn reward is at least its presence byte.
            let n = r.len(1)?;
            let mut t = Vec::with_capacity(n);
            for _ in 0..n {
                t.push(r.opt_f64()?);
            }
            Some(t)
        } else {
            None
        };
        let metrics = get_numbers(r)?;
        Ok(RolloutRecord {
            group_id,
            prompt,
            completion,
            reward,
            correct,
            version,
            finish_reason,
            turns,
            turn_rewards,
            metrics,
        })
    }
}

impl Wire for RowMeta {
    fn put(&self, w: &mut Writer) {
        w.opt_f64(self.reward);
        w.u64(self.completion_tokens as u64);
        w.u8(u8::from(self.truncated));
        w.str(&self.group_id);
    }

    fn get(r: &mut Reader) -> anyhow::Result<Self> {
        let reward = r.opt_f64()?;
        let tokens = r.u64()?;
        Ok(RowMeta {
            reward,
            completion_tokens: usize::try_from(tokens)?,
            truncated: r.flag()?,
            group_id: r.str()?,
        })
    }
}
