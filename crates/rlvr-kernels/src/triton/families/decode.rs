//! The sampler's decode step (`kernels/src/decode.py`, issue 50): the rotary embedding of the new
//! token's query and key with the key/value written into the preallocated cache, and split-KV
//! decode attention (FlashDecoding: FlashAttention's online softmax per split of the cache, the
//! splits merged by log-sum-exp in split order) with grouped kv heads.
//!
//! Buffers (names used by every plan of one step, so one buffer list serves all three):
//! - `q`, `k`, `v`: the new token's query `[rows, Hq, D]` and key/value `[rows, Hkv, D]`,
//!   contiguous; or, with [`Decode::fused_qkv`], one buffer `qkv` `[rows, (Hq + 2·Hkv)·D]` (a
//!   fused projection's output) that the three parameters view at element offsets `0`, `Hq·D`,
//!   `(Hq + Hkv)·D` with row stride `(Hq + 2·Hkv)·D`.
//! - `q_out` `[rows, Hq, D]`: the rotated query (the attention's query).
//! - `k_cache`, `v_cache` `[rows, Hkv, capacity, D]`: the sampler's cache (`KvBuffer`).
//! - `cos`, `sin` `[max_pos, D]` f32: rlvr's rotary tables; `pos` `[rows]` i32: each row's rotary
//!   position; `cols` `[rows]` i32: the cache column its key/value go to.
//! - `bias` `[rows, capacity]` f32: added to the scaled scores (0, or −1e30 for padding columns);
//!   `lens` `[rows]` i32: each row's attention length (columns `0..lens[r]`, `1 ≤ lens[r] ≤
//!   capacity`).
//! - `o_part` `[rows, Hq, n_splits, D]` f32, `lse_part` `[rows, Hq, n_splits]` f32: scratch of
//!   the split attention ([`Decode::n_splits`]); `o` `[rows, Hq, D]`: the attention's output.
//!
//! `pos`, `cols` and `lens` are read by the kernels from device memory, so a CUDA graph
//! captured once replays every step with the step's values (nothing of a step is baked into
//! the launch): grids and scalars depend on the shapes only.
//!
//! The split rule ([`SplitRule`]) is the kernels' own: a function of a row's cache length alone,
//! so a rerun gives the same bits whatever the batch, capacity or GPU.

use super::super::manifest::{DType, KernelEntry};
use super::super::plan::{cdiv, LaunchPlan, PlanBuilder};
use super::super::{Result, TritonError};

/// Query heads per kv head one attention program handles (the kernels' `GROUP_BLOCK`): a larger
/// GQA ratio is refused.
pub const GROUP_BLOCK: usize = 16;

/// The kernels of one decode layer step, in launch order.
pub const KERNELS: [&str; 3] = ["rope_kv", "attn", "attn_combine"];

/// The shapes of one decode step's launches (one new token per row).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Decode {
    /// Rows (the batch).
    pub rows: usize,
    /// Query heads.
    pub q_heads: usize,
    /// Key/value heads (divides `q_heads`, ratio at most [`GROUP_BLOCK`]).
    pub kv_heads: usize,
    /// Head dimension (the variant's `HEAD_DIM`: 64 or 128).
    pub head_dim: usize,
    /// Cache columns per row (the preallocated capacity).
    pub capacity: usize,
    /// q, k, v as views of one fused projection output `qkv` (module docs).
    pub fused_qkv: bool,
    /// The attention's score scale (the model passes `1/√head_dim`).
    pub softmax_scale: f32,
}

/// How a cache is split (the attention variants' constexprs `BLOCK_N`, `SPLIT_MIN`,
/// `MAX_SPLITS`; `kernels/src/decode.py`'s `split_len`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SplitRule {
    /// Keys per loop step.
    pub block_n: usize,
    /// The fewest keys of a split (a multiple of `block_n`).
    pub split_min: usize,
    /// The most splits of one row.
    pub max_splits: usize,
}

impl SplitRule {
    /// The rule compiled into `entry` (a `decode_attn*` variant).
    ///
    /// Errors: a constexpr missing or not positive.
    pub fn of(entry: &KernelEntry) -> Result<Self> {
        let get = |k: &str| -> Result<usize> {
            let v = entry.constexpr_int(k)?;
            usize::try_from(v)
                .ok()
                .filter(|v| *v > 0)
                .ok_or_else(|| TritonError::Plan {
                    name: entry.name.clone(),
                    why: format!("constexpr {k} = {v} is not positive"),
                })
        };
        Ok(SplitRule {
            block_n: get("BLOCK_N")?,
            split_min: get("SPLIT_MIN")?,
            max_splits: get("MAX_SPLITS")?,
        })
    }

    /// Keys per split for a row of `len` cached keys:
    /// `block_n · max(split_min / block_n, cdiv(cdiv(len, block_n), max_splits))`.
    pub fn split_len(&self, len: usize) -> usize {
        let blocks = len.div_ceil(self.block_n);
        self.block_n * (self.split_min / self.block_n).max(blocks.div_ceil(self.max_splits))
    }

    /// Splits of a row of `len` keys (at most `max_splits`, one up to `split_min` keys).
    pub fn splits(&self, len: usize) -> usize {
        len.div_ceil(self.split_len(len).max(1))
    }

    /// The launch's split axis for a cache of `capacity` columns: at least [`SplitRule::splits`]
    /// of every length up to `capacity`.
    pub fn grid_splits(&self, capacity: usize) -> usize {
        capacity
            .div_ceil(self.split_min)
            .clamp(1, self.max_splits.max(1))
    }
}

/// The variant name of `kernel` (one of [`KERNELS`]) for `dtype` and `head_dim`.
pub fn variant(kernel: &str, dtype: DType, head_dim: usize) -> String {
    let dt = if dtype == DType::Bf16 { "bf16" } else { "f32" };
    format!("decode_{kernel}_{dt}_d{head_dim}")
}

impl Decode {
    /// The split axis of the attention launch (`o_part`/`lse_part`'s third dimension) for the
    /// rule of `entry` (any `decode_attn*` variant).
    ///
    /// Errors: [`SplitRule::of`]'s.
    pub fn n_splits(&self, entry: &KernelEntry) -> Result<usize> {
        Ok(SplitRule::of(entry)?.grid_splits(self.capacity))
    }

    fn check(&self, entry: &KernelEntry) -> Result<()> {
        let err = |why: String| {
            Err(TritonError::Plan {
                name: entry.name.clone(),
                why,
            })
        };
        let d = entry.constexpr_int("HEAD_DIM")? as usize;
        if d != self.head_dim {
            return err(format!(
                "head dim {} but the variant's HEAD_DIM is {d}",
                self.head_dim
            ));
        }
        if self.rows == 0 || self.capacity == 0 {
            return err(format!(
                "{} rows × {} cache columns: nothing to decode",
                self.rows, self.capacity
            ));
        }
        if self.kv_heads == 0 || !self.q_heads.is_multiple_of(self.kv_heads) {
            return err(format!(
                "{} query heads are not a multiple of {} kv heads",
                self.q_heads, self.kv_heads
            ));
        }
        if self.q_heads / self.kv_heads > GROUP_BLOCK {
            return err(format!(
                "{} query heads per kv head; the decode attention handles up to {GROUP_BLOCK}",
                self.q_heads / self.kv_heads
            ));
        }
        Ok(())
    }
}

/// The plan for `entry` (a `decode_*` variant) at shapes `s`.
///
/// Errors: a head dim other than the variant's, a GQA ratio over [`GROUP_BLOCK`] or not whole,
/// zero rows or capacity, another family's entry; [`PlanBuilder`]'s checks (an i32 overflow, an
/// aligned twin's divisibility).
pub fn plan(entry: &KernelEntry, s: &Decode) -> Result<LaunchPlan> {
    s.check(entry)?;
    let name = &entry.name;
    let (hq, hk, d) = (s.q_heads, s.kv_heads, s.head_dim);
    match entry.entry.as_str() {
        "decode_rope_kv_kernel" => {
            let b = PlanBuilder::new(entry);
            let (b, stride_q, stride_kv) = if s.fused_qkv {
                let row = (hq + 2 * hk) * d;
                let b = (b.buf_at("q", "qkv", 0)).buf_at("k", "qkv", hq * d).buf_at(
                    "v",
                    "qkv",
                    (hq + hk) * d,
                );
                (b, row, row)
            } else {
                (b.buf("q", "q").buf("k", "k").buf("v", "v"), hq * d, hk * d)
            };
            b.buf("q_out", "q_out")
                .buf("k_cache", "k_cache")
                .buf("v_cache", "v_cache")
                .buf("cos", "cos")
                .buf("sin", "sin")
                .buf("pos", "pos")
                .buf("cols", "cols")
                .i32("stride_q", stride_q)
                .i32("stride_kv", stride_kv)
                .i32("n_qh", hq)
                .i32("n_kh", hk)
                .i32("cap", s.capacity)
                .finish([cdiv(name, s.rows, 1)?, 1, 1])
        }
        "decode_attn_kernel" => {
            let n_splits = s.n_splits(entry)?;
            PlanBuilder::new(entry)
                .buf("q", "q_out")
                .buf("k_cache", "k_cache")
                .buf("v_cache", "v_cache")
                .buf("bias", "bias")
                .buf("lens", "lens")
                .buf("o_part", "o_part")
                .buf("lse_part", "lse_part")
                .i32("n_qh", hq)
                .i32("n_kh", hk)
                .i32("cap", s.capacity)
                .i32("n_splits", n_splits)
                .f32("softmax_scale", s.softmax_scale)
                .finish([cdiv(name, s.rows, 1)?, cdiv(name, hk, 1)?, n_splits as u32])
        }
        "decode_attn_combine_kernel" => {
            let n_splits = s.n_splits(entry)?;
            PlanBuilder::new(entry)
                .buf("o_part", "o_part")
                .buf("lse_part", "lse_part")
                .buf("lens", "lens")
                .buf("o", "o")
                .i32("n_qh", hq)
                .i32("n_splits", n_splits)
                .finish([cdiv(name, s.rows, 1)?, cdiv(name, hq, 1)?, 1])
        }
        other => Err(TritonError::Plan {
            name: name.clone(),
            why: format!("{other} is not a decode kernel"),
        }),
    }
}

/// [`plan`] at a small shape: 3 rows, 7 query heads per kv head (GQA 7), 300 cache columns
/// (two splits at the shipped rule), a fused QKV for the rope kernel.
pub fn example(entry: &KernelEntry) -> Result<LaunchPlan> {
    let head_dim = entry.constexpr_int("HEAD_DIM")? as usize;
    plan(
        entry,
        &Decode {
            rows: 3,
            q_heads: 14,
            kv_heads: 2,
            head_dim,
            capacity: 300,
            fused_qkv: true,
            softmax_scale: 1.0 / (head_dim as f32).sqrt(),
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    const RULE: SplitRule = SplitRule {
        block_n: 64,
        split_min: 256,
        max_splits: 16,
    };

    /// The table `kernels/tests/test_decode.py::test_split_rule` asserts for the Python rule.
    #[test]
    fn split_rule_matches_the_kernels() {
        let table = [
            (1, 256, 1),
            (256, 256, 1),
            (257, 256, 2),
            (384, 256, 2),
            (4096, 256, 16),
            (4097, 320, 13),
            (10000, 640, 16),
            (32768, 2048, 16),
        ];
        for (len, span, n) in table {
            assert_eq!(RULE.split_len(len), span, "{len}");
            assert_eq!(RULE.splits(len), n, "{len}");
        }
        for rule in [
            RULE,
            SplitRule {
                block_n: 32,
                ..RULE
            },
        ] {
            for cap in [1usize, 256, 257, 4096, 5000, 40000] {
                let g = rule.grid_splits(cap);
                assert!(g <= rule.max_splits);
                for len in (1..=cap).step_by(7) {
                    assert!(rule.splits(len) <= g, "{cap} {len}");
                }
            }
        }
    }

    #[test]
    fn committed_decode_plans() {
        let Ok(m) = super::super::super::Manifest::committed() else {
            return;
        };
        if !m.kernels.iter().any(|k| k.family == "decode") {
            return;
        }
        let t = super::super::super::Target::Sm90a;
        let s = Decode {
            rows: 64,
            q_heads: 14,
            kv_heads: 2,
            head_dim: 64,
            capacity: 384,
            fused_qkv: false,
            softmax_scale: 0.125,
        };
        let e = m.entry(&variant("attn", DType::Bf16, 64), t).unwrap();
        assert_eq!(SplitRule::of(e).unwrap(), RULE);
        let p = plan(e, &s).unwrap();
        assert_eq!(p.grid, [64, 2, 2]);
        let c = m
            .entry(&variant("attn_combine", DType::Bf16, 64), t)
            .unwrap();
        assert_eq!(plan(c, &s).unwrap().grid, [64, 14, 1]);
        let r = m.entry(&variant("rope_kv", DType::Bf16, 64), t).unwrap();
        let p = plan(r, &s).unwrap();
        assert_eq!(p.grid, [64, 1, 1]);
        assert_eq!(
            p.buffers(),
            ["q", "k", "v", "q_out", "k_cache", "v_cache", "cos", "sin", "pos", "cols"]
        );
        // The fused QKV views one buffer at the three offsets; the aligned twin takes it (every
        // offset and stride a multiple of 16 elements).
        let f = Decode {
            fused_qkv: true,
            ..s
        };
        let p = super::super::pick(m, &variant("rope_kv", DType::Bf16, 64), t, None, |e| {
            plan(e, &f)
        })
        .unwrap();
        assert_eq!(p.name, "decode_rope_kv_bf16_d64_a16");
        assert_eq!(&p.buffers()[..1], ["qkv"]);
        // Refusals name the problem.
        let bad = |s: Decode, want: &str| {
            let e = plan(e, &s).unwrap_err().to_string();
            assert!(e.contains(want), "{e}");
        };
        bad(
            Decode {
                kv_heads: 1,
                q_heads: 17,
                ..s
            },
            "handles up to 16",
        );
        bad(Decode { kv_heads: 3, ..s }, "not a multiple");
        bad(Decode { head_dim: 128, ..s }, "HEAD_DIM is 64");
        bad(Decode { rows: 0, ..s }, "nothing to decode");
    }
}
