//! Keys and values kept between the turns of multi-turn episodes (docs/DESIGN.md section 14;
//! issue 45's "per-row KV reuse between turns").
//!
//! Without it, each later turn of an episode prefills the whole episode so far
//! ([`Sampler::sample_each`]). With a [`TurnCache`], every completion of an episode's turn leaves
//! the keys and values of its context and of its fed tokens behind (every sampled token but the
//! last, which was never run through the model), keyed by (prompt index, sample index); the next
//! turn ([`Sampler::sample_each_kept`]) loads them and prefills only the ids after them: the
//! turn's last sampled token, the environment's bridge and the next generation prompt.
//!
//! Bounds: the kept keys and values never exceed the cache's byte budget. A completion whose
//! entry would pass it evicts entries in descending (prompt index, sample index) order (itself
//! included) until the rest fit, so what is evicted depends on the batch and never on timing; an
//! evicted episode's next turn prefills its whole context, as without the cache. An entry is used
//! only by the same episode, with the same policy version, when its ids are a proper prefix of the
//! new context; otherwise it is dropped and the context prefilled.
//!
//! Exactness: a kept turn samples from the same stream, and its logits differ from the
//! re-prefill path's only by float rounding: the keys and values of a turn's tokens were computed
//! by decode steps (few rows: `rlvr_kernels::skinny`) and not by one prefill over the whole context
//! (GEMM), and the softmax sums run over keys at other columns, so the two paths sum in different
//! orders (the engine's batch-shape caveat, [`crate::engine`]'s module docs). Bit-identical
//! results would need batch-invariant kernels (matmul, softmax and attention whose per-row
//! results do not depend on the batch shape; Thinking Machines, "Defeating Nondeterminism in LLM
//! Inference", 2025), which rlvr does not have. Measured: log-probs within 1e-5 at the tests'
//! widths and 1.8e-5 on SmolLM2-135M, where at least one of 2,048 draws fell on the other side
//! of a CDF boundary (`rlvr bench turns`, BENCHMARKS.md). A kept run is deterministic: the layout
//! depends only on the batch, never on timing or the thread count; a budget of 0 is the
//! re-prefill path bit for bit.

use std::collections::BTreeMap;

use candle_core::Tensor;

use super::{turn_rng, Completion, PromptIds, Row, Sampler, SamplingParams, TurnRow};
use crate::decode::{forward_last_masked, KvBuffer, MASK_BIAS};
use crate::error::Result;

/// The default byte budget of a [`TurnCache`]: 1 GiB of kept keys and values (SmolLM2-135M in
/// f32 keeps 45 KiB per token: about 23,000 tokens, e.g. 64 episodes of 360 tokens).
pub const DEFAULT_TURN_CACHE_BYTES: usize = 1 << 30;

/// One episode's kept keys and values.
struct Entry {
    /// The ids whose keys and values are kept (the context, then the fed sampled ids).
    ids: PromptIds,
    /// Per layer `(k, v)`, each `[1, n_kv_heads, ids.len(), head_dim]`.
    layers: Vec<(Tensor, Tensor)>,
    /// The policy version that computed them.
    version: u64,
    bytes: usize,
}

/// What a [`TurnCache`] did since it was made (counts over every call).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct TurnCacheStats {
    /// Later turns that found their episode's entry.
    pub hits: u64,
    /// Later turns that prefilled their whole context (no entry, evicted, or not a prefix).
    pub misses: u64,
    /// Entries evicted to keep within the budget.
    pub evictions: u64,
    /// Context tokens whose keys and values were read from the cache instead of prefilled.
    pub reused_tokens: u64,
    /// Context tokens prefilled by later turns.
    pub prefilled_tokens: u64,
}

/// The keys and values of episodes between their turns, bounded by a byte budget (module docs).
pub struct TurnCache {
    budget: usize,
    entries: BTreeMap<(usize, usize), Entry>,
    bytes: usize,
    stats: TurnCacheStats,
}

impl TurnCache {
    /// An empty cache keeping at most `budget_bytes` of keys and values (0 keeps nothing: every
    /// turn prefills its whole context).
    pub fn new(budget_bytes: usize) -> Self {
        Self {
            budget: budget_bytes,
            entries: BTreeMap::new(),
            bytes: 0,
            stats: TurnCacheStats::default(),
        }
    }

    /// The byte budget.
    pub fn budget(&self) -> usize {
        self.budget
    }

    /// Bytes of keys and values kept now.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// Episodes with an entry now.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether no episode has an entry.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The counts since the cache was made.
    pub fn stats(&self) -> TurnCacheStats {
        self.stats
    }

    /// Drops every entry (new weights, or the episodes ended); the counts stay.
    pub fn clear(&mut self) {
        self.entries.clear();
        self.bytes = 0;
    }

    /// Takes episode `key`'s entry when it was computed by `version` and its ids are a proper
    /// prefix of `context`; any other entry of that episode is dropped.
    fn take(&mut self, key: (usize, usize), context: &[u32], version: u64) -> Option<Entry> {
        let e = self.entries.remove(&key)?;
        self.bytes -= e.bytes;
        (e.version == version && e.ids.len() < context.len() && context.starts_with(&e.ids))
            .then_some(e)
    }

    /// Keeps `entry` for episode `key`, then evicts in descending key order until within budget.
    fn insert(&mut self, key: (usize, usize), entry: Entry) {
        self.bytes += entry.bytes;
        if let Some(old) = self.entries.insert(key, entry) {
            self.bytes -= old.bytes;
        }
        while self.bytes > self.budget {
            let Some((_, e)) = self.entries.pop_last() else {
                break;
            };
            self.bytes -= e.bytes;
            self.stats.evictions += 1;
        }
    }
}

/// Keeps row `r` of `cache` (a row that just finished) in `rec`: its context's columns `cols`,
/// then its fed sampled tokens from column `decoded` (all but the last token).
#[allow(clippy::too_many_arguments)]
pub(super) fn keep_row(
    rec: &mut TurnCache,
    cache: &KvBuffer,
    r: usize,
    cols: &[(usize, usize)],
    decoded: usize,
    context: &[u32],
    row: &Row,
    version: u64,
) -> Result<()> {
    if rec.budget == 0 {
        return Ok(());
    }
    let fed = row.tokens.len().saturating_sub(1);
    let mut segments = cols.to_vec();
    segments.push((decoded, fed));
    let mut ids = Vec::with_capacity(context.len() + fed);
    ids.extend_from_slice(context);
    ids.extend_from_slice(&row.tokens[..fed]);
    debug_assert_eq!(segments.iter().map(|s| s.1).sum::<usize>(), ids.len());
    let layers = cache.row_columns(r, &segments)?;
    let bytes = layers
        .iter()
        .map(|(k, v)| (k.elem_count() + v.elem_count()) * k.dtype().size_in_bytes())
        .sum();
    rec.insert(
        (row.prompt_index, row.sample_index),
        Entry {
            ids,
            layers,
            version,
            bytes,
        },
    );
    Ok(())
}

impl Sampler {
    /// [`Sampler::sample_each`] with the keys and values of earlier turns kept in `cache`
    /// (module docs): a row whose episode has an entry prefills only the ids after it, and every
    /// finished row leaves its entry for the episode's next turn. Fill the cache for the first
    /// turn with [`Sampler::sample_keeping`]. Same streams, same results up to float rounding
    /// (module docs, "Exactness").
    ///
    /// Errors: as [`Sampler::sample_each`].
    pub fn sample_each_kept(
        &self,
        rows: &[TurnRow],
        params: &SamplingParams,
        seed: u64,
        cache: &mut TurnCache,
    ) -> Result<Vec<Completion>> {
        let (one, head) = self.turns_prelude(rows, params)?;
        let mut out = Vec::with_capacity(rows.len());
        for chunk in rows.chunks(one.max_batch_rows.max(1)) {
            let entries: Vec<Option<Entry>> = chunk
                .iter()
                .map(|r| {
                    let key = (r.prompt_index, r.sample_index);
                    let mut e = cache.take(key, &r.context, self.version);
                    // LongRoPE: an entry written before the row passed the switch holds keys
                    // rotated with the short factors; a context past the switch needs them all
                    // with the long ones (a whole prefill, as transformers' generate computes).
                    if let Some(switch) = super::longrope_switch(&self.model) {
                        if r.context.len() > switch
                            && e.as_ref().is_some_and(|e| e.ids.len() <= switch)
                        {
                            e = None;
                        }
                    }
                    let reused = e.as_ref().map_or(0, |e| e.ids.len());
                    let s = &mut cache.stats;
                    match e {
                        Some(_) => s.hits += 1,
                        None => s.misses += 1,
                    }
                    s.reused_tokens += reused as u64;
                    s.prefilled_tokens += (r.context.len() - reused) as u64;
                    e
                })
                .collect();
            let mut wave = Vec::with_capacity(chunk.len());
            self.run_kept_wave(chunk, entries, &one, seed, head.as_ref(), cache, &mut wave)?;
            out.extend(super::in_row_order(chunk, wave)?);
        }
        Ok(out)
    }

    /// [`Sampler::sample`] (an episode's first turn) leaving each completion's keys and values
    /// in `cache` for [`Sampler::sample_each_kept`]. The completions are `sample`'s, bit for bit.
    ///
    /// Errors: as [`Sampler::sample`].
    pub fn sample_keeping(
        &self,
        prompts: &[PromptIds],
        first_prompt_index: usize,
        params: &SamplingParams,
        seed: u64,
        cache: &mut TurnCache,
    ) -> Result<Vec<Completion>> {
        self.sample_recording(prompts, first_prompt_index, params, seed, Some(cache))
    }

    /// One wave of kept turns. Cache layout: columns `0..C` hold each row's entry right-aligned
    /// (C the longest entry), columns `C..C+T` its new ids left-padded (T the most new ids), then
    /// the decode steps; every other column is masked for that row. Rotary positions count the
    /// row's own ids from 0, as a whole-context prefill's do.
    #[allow(clippy::too_many_arguments)]
    fn run_kept_wave(
        &self,
        rows: &[TurnRow],
        entries: Vec<Option<Entry>>,
        params: &SamplingParams,
        seed: u64,
        head: Option<&rlvr_kernels::PackedHead>,
        rec: &mut TurnCache,
        out: &mut Vec<Completion>,
    ) -> Result<()> {
        let dev = self.model.device().clone();
        let b = rows.len();
        let kept: Vec<usize> = entries
            .iter()
            .map(|e| e.as_ref().map_or(0, |e| e.ids.len()))
            .collect();
        let c = kept.iter().copied().max().unwrap_or(0);
        let t = rows
            .iter()
            .zip(&kept)
            .map(|(r, n)| r.context.len() - n)
            .max()
            .unwrap_or(0);
        let s = c + t;
        let cap = s + params.max_new_tokens;
        let mut ids = Vec::with_capacity(b * t);
        let mut pos = Vec::with_capacity(b * t);
        let mut bias = vec![MASK_BIAS; b * t * s];
        // The keys each row's new positions see (1): its kept columns and its new ones.
        let mut key_mask = vec![vec![0u32; s]; b];
        let mut bias_rows = vec![0f32; b * cap];
        for (i, (r, &n)) in rows.iter().zip(&kept).enumerate() {
            let new = r.context.len() - n;
            let pad = t - new;
            ids.extend(std::iter::repeat_n(0u32, pad).chain(r.context[n..].iter().copied()));
            pos.extend(std::iter::repeat_n(0u32, pad).chain(n as u32..r.context.len() as u32));
            bias_rows[i * cap..i * cap + c - n].fill(MASK_BIAS);
            bias_rows[i * cap + c..i * cap + c + pad].fill(MASK_BIAS);
            key_mask[i][c - n..c].fill(1);
            key_mask[i][c + pad..].fill(1);
            for j in pad..t {
                let q = &mut bias[(i * t + j) * s..(i * t + j + 1) * s];
                q[c - n..c].fill(0.0);
                q[c + pad..=c + j].fill(0.0);
            }
        }
        let mut cache = KvBuffer::new(&self.model, bias_rows, b, cap)?;
        if c > 0 {
            let cfg = self.model.config();
            let (nkv, hd) = (cfg.num_key_value_heads, cfg.head_dim);
            let dtype = self.model.dtype();
            let layers = (0..cfg.num_hidden_layers)
                .map(|li| {
                    let side = |which: usize| -> Result<Tensor> {
                        let per_row = entries
                            .iter()
                            .zip(&kept)
                            .map(|(e, &n)| {
                                let zeros = Tensor::zeros((1, nkv, c - n, hd), dtype, &dev)?;
                                Ok(match e {
                                    Some(e) => {
                                        let kv = &e.layers[li];
                                        let x = if which == 0 { &kv.0 } else { &kv.1 };
                                        Tensor::cat(&[&zeros, x], 2)?
                                    }
                                    None => zeros,
                                })
                            })
                            .collect::<Result<Vec<_>>>()?;
                        Ok(Tensor::cat(&per_row, 0)?)
                    };
                    Ok((side(0)?, side(1)?))
                })
                .collect::<Result<Vec<_>>>()?;
            drop(entries);
            cache.preload(&layers, c)?;
        }
        let ids = Tensor::from_vec(ids, (b, t), &dev)?;
        let bias = Tensor::from_vec(bias, (b, 1, t, s), &dev)?;
        let tm = std::time::Instant::now();
        // With `kernels.attention` (CUDA), the new positions attend by the fused kernel, the
        // kept columns read from the cache (`Model::forward_masked`).
        let logits = forward_last_masked(
            &self.model,
            &ids,
            &pos,
            Some(&bias),
            Some(&key_mask),
            &mut cache,
            head,
        )?;
        if self.timings.is_some() {
            dev.synchronize()?;
        }
        self.time(|d| d.prefill_s += tm.elapsed().as_secs_f64());
        let mut wave_rows: Vec<Row> = rows
            .iter()
            .zip(&kept)
            .map(|(r, &n)| {
                let new = r.context.len() - n;
                Row {
                    prompt_index: r.prompt_index,
                    sample_index: r.sample_index,
                    prompt_len: r.context.len(),
                    rng: turn_rng(seed, r.prompt_index, r.sample_index, r.turn - 1),
                    tokens: Vec::with_capacity(params.max_new_tokens),
                    logprobs: Vec::with_capacity(params.max_new_tokens),
                    finish: None,
                    kept: Some((vec![(c - n, n), (s - new, new)], r.context.clone())),
                    context: super::longrope_switch(&self.model).map(|_| r.context.clone()),
                }
            })
            .collect();
        let mut src: Vec<usize> = (0..b).collect();
        // The fused step (`kernels.decode`, issue 50) masks the gap between a row's kept and
        // new columns by the cache's bias rows, as it masks a prompt's left padding.
        let fused = self.fused_step(&cache)?;
        self.decode_loop(
            &mut wave_rows,
            &mut src,
            logits,
            &mut cache,
            params,
            head,
            Some(rec),
            fused,
            out,
        )
    }
}

#[cfg(test)]
mod tests {
    use candle_core::{DType, Device};
    use rlvr_model::{Model, ModelConfig};

    use super::*;

    fn model() -> Model {
        let config = ModelConfig::from_json(
            &serde_json::json!({"model_type": "qwen2", "vocab_size": 64, "hidden_size": 32,
                "intermediate_size": 48, "num_hidden_layers": 2, "num_attention_heads": 4,
                "num_key_value_heads": 2, "max_position_embeddings": 256}),
            "inline".as_ref(),
        )
        .unwrap();
        Model::random(config, 0.3, 4, DType::F32, &Device::Cpu).unwrap()
    }

    fn params() -> SamplingParams {
        SamplingParams {
            group_size: 2,
            max_new_tokens: 9,
            stop_ids: vec![3, 7, 11, 19, 23],
            max_batch_rows: 3,
            ..Default::default()
        }
    }

    /// Three turns of the episodes of three prompts × K = 2 (a fixed bridge of 2 or 3 ids per
    /// turn), every turn's completions in order; with `cache`, kept between turns.
    fn episodes(s: &Sampler, mut cache: Option<&mut TurnCache>) -> Vec<Completion> {
        let prompts: Vec<PromptIds> = vec![vec![1, 2, 5, 9, 4], vec![8, 6], vec![12, 13, 14]];
        let p = params();
        let first = match cache.as_deref_mut() {
            Some(c) => s.sample_keeping(&prompts, 4, &p, 17, c).unwrap(),
            None => s.sample(&prompts, 4, &p, 17).unwrap(),
        };
        let mut contexts: Vec<PromptIds> = first
            .iter()
            .map(|c| {
                let mut x = prompts[c.prompt_index - 4].clone();
                x.extend(&c.token_ids);
                x
            })
            .collect();
        let mut all = first.clone();
        let mut last = first;
        for turn in 2..=3u64 {
            let rows: Vec<TurnRow> = last
                .iter()
                .zip(contexts.iter_mut())
                .map(|(c, ctx)| {
                    let j = c.sample_index;
                    ctx.extend([(c.prompt_index * 7 + j * 3) as u32 % 64, 60]);
                    ctx.extend(std::iter::repeat_n(61, j));
                    TurnRow {
                        context: ctx.clone(),
                        prompt_index: c.prompt_index,
                        sample_index: j,
                        turn,
                    }
                })
                .collect();
            // Later turns give the shorter-context episodes first, as a caller may.
            let rows: Vec<TurnRow> = rows.into_iter().rev().collect();
            let out = match cache.as_deref_mut() {
                Some(c) => s.sample_each_kept(&rows, &p, 17, c).unwrap(),
                None => s.sample_each(&rows, &p, 17).unwrap(),
            };
            let out: Vec<Completion> = out.into_iter().rev().collect();
            for (ctx, c) in contexts.iter_mut().zip(&out) {
                ctx.extend(&c.token_ids);
            }
            all.extend(out.iter().cloned());
            last = out;
        }
        all
    }

    fn bits(cs: &[Completion]) -> Vec<(Vec<u32>, Vec<u32>)> {
        cs.iter()
            .map(|c| {
                let lp = c.behaviour_logprobs.iter().map(|x| x.to_bits()).collect();
                (c.token_ids.clone(), lp)
            })
            .collect()
    }

    fn in_pool<T: Send>(threads: usize, f: impl FnOnce() -> T + Send) -> T {
        rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .unwrap()
            .install(f)
    }

    /// The largest |Δ log-prob| between `a` and `b`, which must hold the same tokens.
    fn max_gap(a: &[Completion], b: &[Completion]) -> f32 {
        assert_eq!(a.len(), b.len());
        let mut gap = 0f32;
        for (x, y) in a.iter().zip(b) {
            assert_eq!(
                (
                    x.prompt_index,
                    x.sample_index,
                    &x.token_ids,
                    x.finish_reason
                ),
                (
                    y.prompt_index,
                    y.sample_index,
                    &y.token_ids,
                    y.finish_reason
                )
            );
            for (p, q) in x.behaviour_logprobs.iter().zip(&y.behaviour_logprobs) {
                gap = gap.max((p - q).abs());
            }
        }
        gap
    }

    /// Kept turns prefill only each turn's new ids and sample the re-prefill path's tokens, with
    /// log-probs within float rounding of its (the keys and values of a turn's tokens come from
    /// decode steps rather than one prefill: module docs, "Exactness"); the first turns are the
    /// same bits, and the kept path is the same bits at 1 and 2 threads. Finished episodes' rows
    /// of every length (stop ids end some early) are kept and reused.
    #[test]
    fn kept_turns_sample_the_re_prefill_paths_tokens() {
        let m = model();
        let s = Sampler::new(&m, 5);
        let want = in_pool(1, || episodes(&s, None));
        assert_eq!(want.len(), 18);
        let lens: std::collections::BTreeSet<usize> =
            want.iter().map(|c| c.token_ids.len()).collect();
        assert!(lens.len() > 1, "completions of one length only: {lens:?}");
        let mut first: Option<Vec<Completion>> = None;
        for threads in [1, 2] {
            let mut cache = TurnCache::new(DEFAULT_TURN_CACHE_BYTES);
            let got = in_pool(threads, || episodes(&s, Some(&mut cache)));
            assert_eq!(bits(&got[..6]), bits(&want[..6]), "{threads} threads");
            let gap = max_gap(&got, &want);
            assert!(gap < 1e-5, "{threads} threads: log-probs {gap:e} apart");
            match &first {
                None => first = Some(got),
                Some(f) => assert_eq!(bits(&got), bits(f), "1 and {threads} threads differ"),
            }
            let st = cache.stats();
            assert_eq!((st.hits, st.misses, st.evictions), (12, 0, 0), "{st:?}");
            // Each later turn prefilled its last sampled id and its bridge only.
            let bridges: u64 = want[..12]
                .iter()
                .map(|c| 1 + 2 + c.sample_index as u64)
                .sum();
            assert_eq!(st.prefilled_tokens, bridges, "{st:?}");
            // What is left: the six episodes' last turns, every id but the last sampled one.
            assert_eq!(cache.len(), 6);
            let cfg = m.config();
            let per_token = 2 * cfg.num_hidden_layers * cfg.num_key_value_heads * cfg.head_dim * 4;
            let prompt_len = [5, 2, 3];
            let tokens: usize = (0..6)
                .map(|e| {
                    let n = |t: usize| want[6 * t + e].token_ids.len();
                    prompt_len[e / 2] + n(0) + n(1) + n(2) + 2 * (2 + e % 2) - 1
                })
                .sum();
            assert_eq!(cache.bytes(), tokens * per_token);
        }
    }

    /// Sliding-window models (Mistral with a 4-token window on every layer; Qwen2 with a 5-token
    /// window from layer 1 on): kept turns, whose cached rows are padded between turns, sample
    /// the re-prefill path's tokens within float rounding; and the window is in force (the
    /// same weights without it sample other log-probs).
    #[test]
    fn kept_turns_of_a_sliding_window_model_sample_the_re_prefill_paths_tokens() {
        for extra in [
            serde_json::json!({"model_type": "mistral", "sliding_window": 4}),
            serde_json::json!({"model_type": "qwen2", "use_sliding_window": true,
                "sliding_window": 5, "max_window_layers": 1}),
        ] {
            let mut v = serde_json::json!({"vocab_size": 64, "hidden_size": 32,
                "intermediate_size": 48, "num_hidden_layers": 2, "num_attention_heads": 4,
                "num_key_value_heads": 2, "max_position_embeddings": 256});
            for (k, x) in extra.as_object().unwrap() {
                v[k] = x.clone();
            }
            let config = ModelConfig::from_json(&v, "inline".as_ref()).unwrap();
            assert!(config.sliding_window.is_some());
            let m = Model::random(config.clone(), 0.3, 4, DType::F32, &Device::Cpu).unwrap();
            let s = Sampler::new(&m, 5);
            let want = episodes(&s, None);
            let mut cache = TurnCache::new(DEFAULT_TURN_CACHE_BYTES);
            let got = episodes(&s, Some(&mut cache));
            let gap = max_gap(&got, &want);
            assert!(gap < 1e-5, "{extra}: log-probs {gap:e} apart");
            assert_eq!(cache.stats().hits, 12);
            let mut full = config;
            full.sliding_window = None;
            let f = Model::random(full, 0.3, 4, DType::F32, &Device::Cpu).unwrap();
            let other = episodes(&Sampler::new(&f, 5), None);
            let differ = (want.iter().zip(&other)).any(|(a, b)| {
                a.token_ids != b.token_ids || a.behaviour_logprobs != b.behaviour_logprobs
            });
            assert!(differ, "{extra}: the window changed nothing");
        }
    }

    /// LongRoPE (switch at 9 positions, which the episodes' contexts pass in their first turns'
    /// decode and between turns): kept turns sample the re-prefill path's tokens within float
    /// rounding, as the sampler recomputes a row at the switch and an entry written before it is
    /// not reused for a context past it.
    #[test]
    fn kept_turns_of_a_longrope_model_sample_the_re_prefill_paths_tokens() {
        let v = serde_json::json!({"model_type": "phi3", "vocab_size": 64, "hidden_size": 32,
            "intermediate_size": 48, "num_hidden_layers": 2, "num_attention_heads": 4,
            "num_key_value_heads": 2, "max_position_embeddings": 256,
            "original_max_position_embeddings": 9, "pad_token_id": null,
            "rope_scaling": {"rope_type": "longrope", "short_factor": [1.0, 1.2, 1.5, 2.0],
                "long_factor": [1.0, 3.0, 9.0, 30.0]}});
        let config = ModelConfig::from_json(&v, "inline".as_ref()).unwrap();
        let m = Model::random(config, 0.3, 4, DType::F32, &Device::Cpu).unwrap();
        let s = Sampler::new(&m, 5);
        let want = episodes(&s, None);
        let mut cache = TurnCache::new(DEFAULT_TURN_CACHE_BYTES);
        let got = episodes(&s, Some(&mut cache));
        let gap = max_gap(&got, &want);
        assert!(gap < 1e-5, "log-probs {gap:e} apart");
        assert!(want.iter().any(|c| c.token_ids.len() > 4));
    }

    /// A budget below the episodes' needs evicts (deterministically, in descending episode
    /// order) and never holds more than it allows; evicted episodes prefill their whole context.
    /// A budget of 0 keeps nothing and is the re-prefill path bit for bit.
    #[test]
    fn a_small_budget_evicts_deterministically() {
        let m = model();
        let s = Sampler::new(&m, 5);
        let want = episodes(&s, None);
        let cfg = m.config();
        let per_token = 2 * cfg.num_hidden_layers * cfg.num_key_value_heads * cfg.head_dim * 4;
        for budget in [0, 30 * per_token, 60 * per_token] {
            let mut cache = TurnCache::new(budget);
            let got = episodes(&s, Some(&mut cache));
            assert!(max_gap(&got, &want) < 1e-5, "budget {budget}");
            let st = cache.stats();
            assert!(cache.bytes() <= budget, "{} > {budget}", cache.bytes());
            assert_eq!(st.hits + st.misses, 12, "{st:?}");
            if budget == 0 {
                assert_eq!(bits(&got), bits(&want));
                assert_eq!((st.hits, st.evictions, cache.len()), (0, 0, 0), "{st:?}");
            } else {
                assert!(st.evictions > 0 && st.hits > 0 && st.misses > 0, "{st:?}");
            }
            // The same budget evicts the same entries and samples the same bits again.
            let mut again = TurnCache::new(budget);
            assert_eq!(bits(&episodes(&s, Some(&mut again))), bits(&got));
            assert_eq!(again.stats(), st);
        }
    }

    /// An entry is used only by its own episode, when its ids are a proper prefix of the new
    /// context and the policy version is the same; otherwise the context is prefilled whole,
    /// exactly as the re-prefill path does.
    #[test]
    fn entries_that_do_not_fit_the_context_are_dropped() {
        let m = model();
        let p = SamplingParams {
            group_size: 1,
            ..params()
        };
        let row = |context: PromptIds| TurnRow {
            context,
            prompt_index: 0,
            sample_index: 0,
            turn: 2,
        };
        let mut s = Sampler::new(&m, 5);
        let first = s.sample(&[vec![1, 2, 3]], 0, &p, 9).unwrap();
        let mut ctx = vec![1, 2, 3];
        ctx.extend(&first[0].token_ids);
        ctx.push(60);
        let mut other = ctx.clone();
        other[1] = 40;
        for (context, version, hit) in [(ctx.clone(), 5, true), (other, 5, false), (ctx, 6, false)]
        {
            s.set_version(5);
            let mut cache = TurnCache::new(DEFAULT_TURN_CACHE_BYTES);
            s.sample_keeping(&[vec![1, 2, 3]], 0, &p, 9, &mut cache)
                .unwrap();
            assert_eq!(cache.len(), 1);
            s.set_version(version);
            let want = s.sample_each(&[row(context.clone())], &p, 9).unwrap();
            let got = s
                .sample_each_kept(&[row(context)], &p, 9, &mut cache)
                .unwrap();
            assert_eq!(cache.stats().hits, u64::from(hit));
            if hit {
                assert!(max_gap(&got, &want) < 1e-5);
            } else {
                assert_eq!(bits(&got), bits(&want));
            }
        }
    }

    /// With `kernels.attention` on, a kept turn's prefill (each row's new ids after its kept
    /// keys and values) runs the fused attention with the cache's columns as key-only rows:
    /// three turns of episodes sample the same bits as with it off (on the CPU the op is the
    /// candle composition over the same tensors), and the launch is recorded with a layout
    /// whose prefixes lie past the new positions, for the interpreter's replay (CI).
    #[test]
    fn kept_turns_prefill_by_the_fused_attention() {
        let config = ModelConfig::from_json(
            &serde_json::json!({"model_type": "qwen2", "vocab_size": 64, "hidden_size": 128,
                "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 2,
                "num_key_value_heads": 1, "max_position_embeddings": 256}),
            "inline".as_ref(),
        )
        .unwrap();
        let plain = Model::random(config, 0.3, 6, DType::F32, &Device::Cpu).unwrap();
        let mut cache = TurnCache::new(DEFAULT_TURN_CACHE_BYTES);
        let want = episodes(&Sampler::new(&plain, 0), Some(&mut cache));
        let mut m = plain.try_clone().unwrap();
        let mut k = rlvr_model::KernelSwitches::all(rlvr_model::Switch::Off);
        k.set(rlvr_model::FusedOp::Attention, rlvr_model::Switch::On);
        m.set_kernels(k);
        let tmp = tempfile::tempdir().unwrap();
        let mut cache = TurnCache::new(DEFAULT_TURN_CACHE_BYTES);
        let got = {
            let _guard = rlvr_model::kernels::record_launches(tmp.path()).unwrap();
            episodes(&Sampler::new(&m, 0), Some(&mut cache))
        };
        assert_eq!(bits(&got), bits(&want));
        assert_eq!(cache.stats().hits, 12, "{:?}", cache.stats());
        let (fwd, rec) = crate::decode::forward_record(tmp.path(), "model_attn_kept_");
        let fwd = &fwd;
        // q holds the new positions only; k the new ones, then the cache's.
        let rows = |b: &str| rec["buffers"][b]["shape"][0].as_u64().unwrap() as usize;
        let (nq, nk) = (rows("q"), rows("k"));
        assert!(nq < nk, "q {nq} rows, k {nk}: {rec}");
        assert_eq!(rows("o"), nq);
        crate::decode::keep_record_for_ci(tmp.path(), fwd, "sampler_kept");
    }
}
