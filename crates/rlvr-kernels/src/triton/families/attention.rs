//! Causal GQA attention over a flat varlen token axis with shared prefixes, forward and
//! backward (`kernels/src/attention.py`; FlashAttention-2, Dao 2023, arXiv:2307.08691).
//!
//! Buffers named after the parameters (kernels/README.md, "## Attention"): `q`, `o`, `do`,
//! `dq` `[n_tokens, q_heads, head_dim]`; `k`, `v`, `dk`, `dv` `[n_tokens, kv_heads, head_dim]`
//! (f32 or bf16, contiguous); `lse`, `delta` `[q_heads, n_tokens]` f32; and the i32 descriptors
//! [`Layout`] builds: `seqs` `[S, 4]`, `q_blocks`/`k_blocks` `[NB, 2]` (for the variant's own
//! `BLOCK_M`/`BLOCK_N`, so one list per distinct block size), `viewer_off` `[S + 1]`, `viewers`
//! `[max(V, 1)]`. Grids: `(NBq, q_heads)` for the forward, `bwd_pre` and `bwd_dq`;
//! `(NBk, kv_heads)` for `bwd_dkdv`. With no sequence, launch nothing. A sliding window
//! ([`Layout::window`]) is the `window` argument of the forward, dK/dV and dQ kernels.

use std::collections::BTreeMap;

use super::super::manifest::KernelEntry;
use super::super::plan::{LaunchPlan, PlanBuilder};
use super::super::{Result, TritonError};

/// One sequence of the flat axis: it owns rows `start .. start + len` (its queries and keys);
/// its query `i` sees the `prefix_len` keys from row `prefix_start` (all), then its own keys
/// `0..=i`. A non-empty prefix lies inside the rows of one other sequence without a prefix (its
/// owner, whose dK/dV programs sum the prefix keys' gradients), or in *key-only rows* that no
/// sequence covers: keys and values with no queries, such as a KV cache's past positions
/// appended after the new tokens (the sampler's prefill of a multi-turn episode's later turn).
/// Key-only prefixes are for the forward alone: [`plan`] refuses them for the backward kernels,
/// which would leave their dK/dV unwritten.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Seq {
    /// First row.
    pub start: usize,
    /// Rows (≥ 1).
    pub len: usize,
    /// First row of the prefix (ignored when `prefix_len` is 0).
    pub prefix_start: usize,
    /// Prefix keys (0: none).
    pub prefix_len: usize,
}

/// The attention layout of one launch: sequences, heads, scale.
#[derive(Clone, Debug)]
pub struct Layout {
    /// Length of the flat token axis (rows outside every sequence are never read or written).
    pub n_tokens: usize,
    /// The sequences.
    pub seqs: Vec<Seq>,
    /// Query heads (a multiple of `kv_heads`).
    pub q_heads: usize,
    /// Key/value heads.
    pub kv_heads: usize,
    /// Head dimension (the variant's `HEAD_DIM`).
    pub head_dim: usize,
    /// The scores' scale (the model passes `1/√head_dim`).
    pub softmax_scale: f32,
    /// Sliding window in keys (0: none): a query at position `p` sees keys at positions `j`
    /// with `p − window < j ≤ p`, transformers' `kv_idx > q_idx − sliding_window` (a sequence's
    /// prefix keys at positions `0 .. prefix_len`, its own row `i` at `prefix_len + i`).
    pub window: usize,
}

fn plan_err(name: &str, why: String) -> TritonError {
    TritonError::Plan {
        name: name.into(),
        why,
    }
}

impl Layout {
    /// Checks the layout: rows inside the axis and i32-indexable, sequences not overlapping,
    /// each non-empty prefix inside exactly one other sequence that has no prefix itself or in
    /// key-only rows (inside the axis, no sequence's rows among them), heads a multiple of the
    /// kv heads. `name` is the entry, for the message.
    pub fn check(&self, name: &str) -> Result<()> {
        let err = |why: String| Err(plan_err(name, why));
        if self.kv_heads == 0 || !self.q_heads.is_multiple_of(self.kv_heads) {
            return err(format!(
                "{} query heads are not a multiple of {} kv heads",
                self.q_heads, self.kv_heads
            ));
        }
        if self.n_tokens > i32::MAX as usize {
            return err(format!("{} rows do not fit i32 indices", self.n_tokens));
        }
        if self.window >= 1 << 30 {
            return err(format!(
                "window {} (the kernels take windows below 2^30; 0 for none)",
                self.window
            ));
        }
        let mut spans: Vec<(usize, usize, usize)> = Vec::new();
        for (i, s) in self.seqs.iter().enumerate() {
            if s.len == 0 || s.start + s.len > self.n_tokens {
                return err(format!(
                    "sequence {i} {s:?} is empty or past {} rows",
                    self.n_tokens
                ));
            }
            spans.push((s.start, s.start + s.len, i));
        }
        spans.sort();
        for w in spans.windows(2) {
            if w[1].0 < w[0].1 {
                return err(format!("sequences {} and {} overlap", w[0].2, w[1].2));
            }
        }
        for (i, s) in self.seqs.iter().enumerate() {
            if s.prefix_len > 0 && self.owner(s).is_none() && !self.key_only(s) {
                return err(format!(
                    "sequence {i}'s prefix {}..{} is not inside one other sequence without a \
                     prefix, nor in rows outside every sequence within {} rows",
                    s.prefix_start,
                    s.prefix_start + s.prefix_len,
                    self.n_tokens
                ));
            }
        }
        Ok(())
    }

    /// Whether `s`'s prefix lies in key-only rows: inside the axis, and no sequence's rows
    /// among them.
    fn key_only(&self, s: &Seq) -> bool {
        let (a, b) = (s.prefix_start, s.prefix_start + s.prefix_len);
        b <= self.n_tokens
            && self
                .seqs
                .iter()
                .all(|u| u.start + u.len <= a || b <= u.start)
    }

    /// Whether some sequence's prefix lies in key-only rows ([`Seq`]): a forward-only layout.
    pub fn has_key_only_prefix(&self) -> bool {
        (self.seqs.iter()).any(|s| s.prefix_len > 0 && self.owner(s).is_none() && self.key_only(s))
    }

    /// The sequence whose rows hold `s`'s prefix.
    fn owner(&self, s: &Seq) -> Option<usize> {
        self.seqs.iter().position(|u| {
            !std::ptr::eq(u, s)
                && u.prefix_len == 0
                && u.start <= s.prefix_start
                && s.prefix_start + s.prefix_len <= u.start + u.len
        })
    }

    /// `seqs` `[S, 4]`: `(start, len, prefix_start, prefix_len)` per sequence.
    pub fn seqs_desc(&self) -> Vec<i32> {
        (self.seqs.iter())
            .flat_map(|s| [s.start, s.len, s.prefix_start, s.prefix_len].map(|x| x as i32))
            .collect()
    }

    /// `q_blocks`/`k_blocks` `[NB, 2]`: `(s, m0)` for every block of `block` rows of every
    /// sequence, in sequence order.
    pub fn blocks(&self, block: usize) -> Vec<i32> {
        (self.seqs.iter().enumerate())
            .flat_map(|(i, s)| {
                (0..s.len)
                    .step_by(block)
                    .flat_map(move |m0| [i as i32, m0 as i32])
            })
            .collect()
    }

    /// `(viewer_off [S + 1], viewers [max(V, 1)])`: per sequence, the sequences whose prefix it
    /// holds, in increasing index (the order their dK/dV contributions are summed).
    pub fn viewers(&self) -> (Vec<i32>, Vec<i32>) {
        let mut lists = vec![Vec::new(); self.seqs.len()];
        for (i, s) in self.seqs.iter().enumerate() {
            if s.prefix_len > 0 {
                if let Some(o) = self.owner(s) {
                    lists[o].push(i as i32);
                }
            }
        }
        let mut off = vec![0i32];
        for l in &lists {
            off.push(off.last().unwrap() + l.len() as i32);
        }
        let mut v: Vec<i32> = lists.concat();
        if v.is_empty() {
            v.push(0); // one dummy entry: a zero-length buffer has no address
        }
        (off, v)
    }
}

/// The plan for `entry` on `layout`, with the descriptor buffers it names (`seqs`,
/// `q_blocks` or `k_blocks` for this variant's block size, `viewer_off`, `viewers`), which
/// the caller uploads.
///
/// Errors: a layout [`Layout::check`] refuses, a key-only prefix for a backward kernel, a head
/// dim other than the variant's, no sequence (nothing to launch), another family's entry,
/// [`PlanBuilder`]'s checks.
pub fn plan(entry: &KernelEntry, l: &Layout) -> Result<(LaunchPlan, BTreeMap<String, Vec<i32>>)> {
    let name = &entry.name;
    l.check(name)?;
    if entry.entry != "attn_fwd_kernel" && l.has_key_only_prefix() {
        return Err(plan_err(
            name,
            "a prefix in key-only rows has no dK/dV program: such a layout is for the forward \
             only"
                .into(),
        ));
    }
    let d = entry.constexpr_int("HEAD_DIM")? as usize;
    if d != l.head_dim {
        return Err(plan_err(
            name,
            format!("head dim {} but HEAD_DIM is {d}", l.head_dim),
        ));
    }
    if l.seqs.is_empty() {
        return Err(plan_err(name, "no sequence: launch nothing".into()));
    }
    let mut desc = BTreeMap::from([("seqs".to_string(), l.seqs_desc())]);
    let mut b = PlanBuilder::new(entry);
    let names: &[&str] = match entry.entry.as_str() {
        "attn_fwd_kernel" => &["q", "k", "v", "o", "lse"],
        "attn_bwd_pre_kernel" => &["o", "do", "delta"],
        "attn_bwd_dkdv_kernel" => &["q", "k", "v", "do", "lse", "delta", "dk", "dv"],
        "attn_bwd_dq_kernel" => &["q", "k", "v", "do", "lse", "delta", "dq"],
        other => {
            return Err(plan_err(
                name,
                format!("{other} is not an attention kernel"),
            ))
        }
    };
    for n in names {
        b = b.buf(n, n);
    }
    b = b.buf("seqs", "seqs");
    let dkdv = entry.entry == "attn_bwd_dkdv_kernel";
    let (blocks_name, block, heads) = if dkdv {
        ("k_blocks", entry.constexpr_int("BLOCK_N")?, l.kv_heads)
    } else {
        ("q_blocks", entry.constexpr_int("BLOCK_M")?, l.q_heads)
    };
    let blocks = l.blocks(block as usize);
    let nb = blocks.len() / 2;
    b = b.buf(blocks_name, blocks_name);
    desc.insert(blocks_name.into(), blocks);
    if dkdv {
        let (off, viewers) = l.viewers();
        b = b.buf("viewer_off", "viewer_off").buf("viewers", "viewers");
        desc.insert("viewer_off".into(), off);
        desc.insert("viewers".into(), viewers);
    }
    b = b.i32("n_tokens", l.n_tokens).i32("n_heads_q", l.q_heads);
    if entry.entry != "attn_bwd_pre_kernel" {
        b = b
            .i32("n_heads_kv", l.kv_heads)
            .f32("softmax_scale", l.softmax_scale)
            .i32("window", l.window);
    }
    let grid = [
        u32::try_from(nb).map_err(|_| plan_err(name, format!("{nb} blocks")))?,
        heads as u32,
        1,
    ];
    Ok((b.finish(grid)?, desc))
}

/// A small shared-prompt layout: a prompt of 37 rows (after 2 padding rows) viewed by
/// completions of 1 and 45 rows, and an unshared row of 70; 7 query heads over 1 kv head.
pub fn example_layout(head_dim: usize) -> Layout {
    let p = Seq {
        start: 2,
        len: 37,
        prefix_start: 0,
        prefix_len: 0,
    };
    let view = |start, len| Seq {
        start,
        len,
        prefix_start: 2,
        prefix_len: 37,
    };
    Layout {
        n_tokens: 2 + 37 + 1 + 45 + 3 + 70,
        seqs: vec![
            p,
            view(39, 1),
            view(40, 45),
            Seq {
                start: 88,
                len: 70,
                prefix_start: 0,
                prefix_len: 0,
            },
        ],
        q_heads: 7,
        kv_heads: 1,
        head_dim,
        softmax_scale: 1.0 / (head_dim as f32).sqrt(),
        window: 0,
    }
}

/// [`plan`] on [`example_layout`].
pub fn example(entry: &KernelEntry) -> Result<LaunchPlan> {
    let d = entry.constexpr_int("HEAD_DIM")? as usize;
    plan(entry, &example_layout(d)).map(|(p, _)| p)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn descriptors_of_the_shared_prompt_layout() {
        let l = example_layout(64);
        l.check("t").unwrap();
        assert_eq!(
            l.seqs_desc(),
            vec![2, 37, 0, 0, 39, 1, 2, 37, 40, 45, 2, 37, 88, 70, 0, 0]
        );
        // Blocks of 32 rows: 37 → 2, 1 → 1, 45 → 2, 70 → 3.
        assert_eq!(
            l.blocks(32),
            vec![0, 0, 0, 32, 1, 0, 2, 0, 2, 32, 3, 0, 3, 32, 3, 64]
        );
        // The prompt (sequence 0) is viewed by 1 and 2; no one else has viewers.
        assert_eq!(l.viewers(), (vec![0, 2, 2, 2, 2], vec![1, 2]));
        let unshared = Layout {
            seqs: vec![l.seqs[0], l.seqs[3]],
            ..l.clone()
        };
        assert_eq!(unshared.viewers(), (vec![0, 0, 0], vec![0]));
    }

    #[test]
    fn bad_layouts_are_refused() {
        let l = example_layout(64);
        let msg = |l: &Layout| l.check("attn_fwd_f32_d64").unwrap_err().to_string();
        let mut bad = l.clone();
        bad.q_heads = 6;
        bad.kv_heads = 4;
        assert!(msg(&bad).contains("6 query heads are not a multiple of 4"));
        let mut bad = l.clone();
        bad.seqs[1].start = 30;
        assert!(msg(&bad).contains("sequences 0 and 1 overlap"));
        let mut bad = l.clone();
        bad.seqs[2].prefix_len = 40; // past the prompt's rows
        assert!(msg(&bad).contains("sequence 2's prefix 2..42 is not inside"));
        let mut bad = l.clone();
        bad.seqs[3].len = 71;
        assert!(msg(&bad).contains("past 158 rows"));
        // A prefix half in key-only rows, half in a sequence's rows.
        let mut bad = l.clone();
        bad.n_tokens += 10;
        bad.seqs[3].prefix_start = 150;
        bad.seqs[3].prefix_len = 10;
        assert!(msg(&bad).contains("sequence 3's prefix 150..160 is not inside"));
        bad.seqs[3].prefix_start = 160;
        bad.seqs[3].prefix_len = 9; // past the axis
        assert!(msg(&bad).contains("sequence 3's prefix 160..169 is not inside"));
        let mut bad = l.clone();
        bad.window = 1 << 30;
        assert!(msg(&bad).contains("window 1073741824"));
    }

    /// Key-only prefixes (a KV cache's past rows after the new tokens): checked, described, and
    /// refused by the backward's plans alone.
    #[test]
    fn key_only_prefixes_are_forward_only() {
        let l = example_layout(64);
        assert!(!l.has_key_only_prefix());
        let mut kept = l.clone();
        kept.n_tokens += 12;
        kept.seqs[3].prefix_start = 158 + 4;
        kept.seqs[3].prefix_len = 8;
        kept.check("t").unwrap();
        assert!(kept.has_key_only_prefix());
        assert_eq!(&kept.seqs_desc()[12..], &[88, 70, 162, 8]);
        // Only the owned prefixes have viewers.
        assert_eq!(kept.viewers(), l.viewers());
        let m = crate::triton::Manifest::committed().unwrap();
        let t = crate::triton::manifest::Target::Sm90a;
        plan(m.entry("attn_fwd_f32_d64", t).unwrap(), &kept).unwrap();
        for bwd in [
            "attn_bwd_pre_f32_d64",
            "attn_bwd_dkdv_f32_d64",
            "attn_bwd_dq_f32_d64",
        ] {
            let e = plan(m.entry(bwd, t).unwrap(), &kept)
                .unwrap_err()
                .to_string();
            assert!(e.contains("for the forward only"), "{bwd}: {e}");
            plan(m.entry(bwd, t).unwrap(), &l).unwrap();
        }
    }
}
