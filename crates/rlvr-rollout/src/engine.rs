//! The sampler: prompts × group size K → K completions per prompt.
//!
//! One call of [`Sampler::sample`] runs in waves of at most `max_batch_rows` rows (whole groups).
//! In each wave the distinct prompts are left-padded and prefilled once (`[P, L]`), their KV cache
//! rows are copied to the K rows of each group, and the rows decode together, one token per step.
//! A row that finishes (stop id, stop string or `max_new_tokens`) leaves the batch at the end of
//! that step: the cache, the bias and the row state are compacted, so finished rows cost nothing.
//!
//! Every completion draws its uniforms from its own ChaCha12 stream keyed by
//! (seed, prompt index, sample index), one draw per generated token, so its tokens do not depend on
//! the batch size, the wave split, the other prompts or the thread count — up to float rounding
//! of the logits themselves: a different padding or batch shape can move a logit by ~1e-7, which
//! changes a token only when a draw lands within that distance of a CDF boundary.

use candle_core::Tensor;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha12Rng;
use rayon::prelude::*;
use rlvr_model::Model;

use crate::decode::{forward_last, packed_head, KvBuffer, MASK_BIAS};
use crate::error::{Result, RolloutError};
pub use crate::params::{Completion, Detokenize, FinishReason, PromptIds, SamplingParams};
use crate::select::{choose, Choice, Scratch};

mod turns;
pub use turns::{TurnCache, TurnCacheStats, DEFAULT_TURN_CACHE_BYTES};

/// The sampling engine. See the module docs for the algorithm.
pub struct Sampler {
    /// The policy (sharing the caller's weights, or a private copy).
    model: Model,
    version: u64,
    detok: Option<Box<dyn Detokenize>>,
    timings: Option<std::sync::Mutex<DecodeTimings>>,
    device_select: Option<bool>,
    /// The fused step's smallest bucket that still halves ([`FUSED_MIN_BUCKET_ROWS`]; tests
    /// lower it).
    pub(crate) fused_min_bucket: usize,
}

/// The fused decode step's buckets halve as a wave's rows finish only while they hold more than
/// this many rows: below it a step is bound by the weights' reads and the launches, not by the
/// rows (the 0.5B shape reads ~1 GB of bf16 weights a step, ~0.3 ms on an H100, against a few
/// rows' activations), so a smaller bucket would save little and cost a new step and capture.
/// A choice to revisit with the GPU run's sampling figures (`rlvr bench sample`'s
/// `fused_builds_per_run` beside its step time).
pub const FUSED_MIN_BUCKET_ROWS: usize = 16;

/// Where a [`Sampler`]'s time went, summed over its `sample` calls since
/// [`Sampler::with_timings`] (benchmarks: `rlvr bench sample`). With timings on, the device is
/// synchronised after each forward so that GPU work is charged to the forward and not to the copy
/// that follows; this costs a little throughput, so it is off by default.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct DecodeTimings {
    /// Packing the lm_head for the call (CPU with AVX-512 only), seconds.
    pub pack_s: f64,
    /// Prefill forwards (prompt positions, all layers, last-position logits), seconds.
    pub prefill_s: f64,
    /// Decode-step forwards (one position per row), seconds: host dispatch plus, with timings on,
    /// the wait for the device to finish the step (`forward_s − forward_host_s`).
    pub forward_s: f64,
    /// The host's part of [`DecodeTimings::forward_s`]: until the forward call returned (every
    /// kernel queued), seconds. On the CPU the work itself; on a GPU the dispatch, which bounds
    /// the step when it exceeds the device's time (the wait is then ~0).
    pub forward_host_s: f64,
    /// Triton kernels launched by the decode forwards (`rlvr_kernels::triton::launch_count`,
    /// process-wide: meaningful in a benchmark that samples alone); 0 on the candle path.
    pub triton_launches: u64,
    /// Copying each step's logits `[rows, V]` to the host (host selection only), seconds.
    pub to_host_s: f64,
    /// Choosing tokens (temperature, top-k/top-p, draw, behaviour log-prob), seconds; on the
    /// device path this includes its reductions and its small transfers.
    pub select_s: f64,
    /// Retiring finished rows and compacting the KV cache, seconds (on the fused path this
    /// includes building each smaller bucket's step).
    pub compact_s: f64,
    /// Fused decode steps built (`kernels.decode`): one per wave, plus one per batch-size bucket
    /// a wave shrank to; 0 on the candle path.
    pub fused_builds: u64,
    /// Decode steps run (forwards after the prefill).
    pub steps: u64,
    /// Tokens generated.
    pub tokens: u64,
}

/// One decoding sequence.
struct Row {
    prompt_index: usize,
    sample_index: usize,
    prompt_len: usize,
    rng: ChaCha12Rng,
    tokens: Vec<u32>,
    logprobs: Vec<f32>,
    finish: Option<FinishReason>,
    /// The cache columns `(start, len)` holding this row's context before the decode steps, and
    /// that context's ids: kept for the next turn when the call records a [`TurnCache`].
    kept: Option<(Vec<(usize, usize)>, PromptIds)>,
    /// The row's context ids, for a LongRoPE model only (its switch recomputes the row from
    /// them: [`KvBuffer::recompute_row`]).
    context: Option<PromptIds>,
}

/// The position at which a LongRoPE model's row switches to the long factors (the first
/// position past `original_max_position_embeddings`), `None` for every other model.
fn longrope_switch(model: &Model) -> Option<usize> {
    match &model.config().rope_scaling {
        Some(rlvr_model::RopeScaling::LongRope {
            original_max_position_embeddings: o,
            ..
        }) => Some(*o as usize),
        _ => None,
    }
}

/// A wave's completions (retired in finishing order) put back in the order of its `rows`.
///
/// # Errors
/// Two rows of the call continue the same episode (prompt index, sample index).
fn in_row_order(rows: &[TurnRow], wave: Vec<Completion>) -> Result<Vec<Completion>> {
    let mut slot: Vec<Option<Completion>> = vec![None; rows.len()];
    for c in wave {
        let i = rows
            .iter()
            .position(|r| r.prompt_index == c.prompt_index && r.sample_index == c.sample_index)
            .filter(|&i| slot[i].is_none())
            .ok_or_else(|| RolloutError::InvalidPrompt {
                prompt_index: c.prompt_index,
                msg: format!(
                    "two rows of one call continue episode ({}, {})",
                    c.prompt_index, c.sample_index
                ),
            })?;
        slot[i] = Some(c);
    }
    Ok(slot
        .into_iter()
        .map(|c| c.expect("one completion per row"))
        .collect())
}

/// The RNG stream of one completion: ChaCha12 keyed by the 32-byte seed
/// `seed ‖ prompt_index ‖ sample_index ‖ 0` (little endian), so streams never collide.
pub fn completion_rng(seed: u64, prompt_index: usize, sample_index: usize) -> ChaCha12Rng {
    turn_rng(seed, prompt_index, sample_index, 0)
}

/// The RNG stream of one assistant turn of a multi-turn episode (docs/DESIGN.md section 14): ChaCha12
/// keyed by `seed ‖ prompt_index ‖ sample_index ‖ turn − 1` (little endian). Turn 1's stream is
/// [`completion_rng`]'s, so an episode's first turn draws exactly what a single-turn completion
/// draws.
pub fn turn_rng(
    seed: u64,
    prompt_index: usize,
    sample_index: usize,
    turn_index: u64,
) -> ChaCha12Rng {
    let mut key = [0u8; 32];
    key[..8].copy_from_slice(&seed.to_le_bytes());
    key[8..16].copy_from_slice(&(prompt_index as u64).to_le_bytes());
    key[16..24].copy_from_slice(&(sample_index as u64).to_le_bytes());
    key[24..].copy_from_slice(&turn_index.to_le_bytes());
    ChaCha12Rng::from_seed(key)
}

/// One row of [`Sampler::sample_each`]: a context to continue (an episode's prompt and
/// completion so far) and the key of its RNG stream ([`turn_rng`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TurnRow {
    /// The ids to continue (the prompt, turns and bridges so far; non-empty).
    pub context: PromptIds,
    /// The draw index of the episode's prompt (the completion's `prompt_index`).
    pub prompt_index: usize,
    /// The episode's sample index in its group (the completion's `sample_index`).
    pub sample_index: usize,
    /// The turn, from 1 (turn 1 uses [`completion_rng`]'s stream).
    pub turn: u64,
}

impl Sampler {
    /// A sampler over the weights of `model`, shared (no copy): in-place updates of the model's
    /// `Var`s are seen by the next call. `version` is the policy version recorded in every
    /// completion (DESIGN.md section 3); update it with [`Sampler::set_version`] after a sync.
    pub fn new(model: &Model, version: u64) -> Self {
        Self {
            model: model.clone(),
            version,
            detok: None,
            timings: None,
            device_select: None,
            fused_min_bucket: FUSED_MIN_BUCKET_ROWS,
        }
    }

    /// A sampler over a private copy of the weights of `model` (an explorer that keeps sampling
    /// with version `version` while the trainer updates the model).
    ///
    /// Errors: out of device memory.
    pub fn snapshot(model: &Model, version: u64) -> Result<Self> {
        Ok(Self {
            model: model.try_clone()?,
            version,
            detok: None,
            timings: None,
            device_select: None,
            fused_min_bucket: FUSED_MIN_BUCKET_ROWS,
        })
    }

    /// Sets the tokenizer used to check stop strings (e.g. `policy.tokenizer.tokenizer.clone()`).
    pub fn with_tokenizer(mut self, detok: impl Detokenize + 'static) -> Self {
        self.detok = Some(Box::new(detok));
        self
    }

    /// Where tokens are chosen: `true` keeps the logits on the device and moves only block sums and
    /// one block per row to the host ([`crate::device_select`]); `false` copies the whole logits to
    /// the host ([`crate::select`]). Default: on the device everywhere but the CPU. Both draw the
    /// same tokens from the same streams (up to float rounding at a block boundary; tested).
    pub fn select_on_device(mut self, on: bool) -> Self {
        self.device_select = Some(on);
        self
    }

    /// Turns on [`DecodeTimings`] (zeroed); read them with [`Sampler::timings`].
    pub fn with_timings(mut self) -> Self {
        self.timings = Some(Default::default());
        self
    }

    /// The timings summed since [`Sampler::with_timings`]; `None` when they are off.
    pub fn timings(&self) -> Option<DecodeTimings> {
        self.timings
            .as_ref()
            .map(|m| m.lock().unwrap_or_else(|e| e.into_inner()).clone())
    }

    fn time(&self, f: impl FnOnce(&mut DecodeTimings)) {
        if let Some(m) = &self.timings {
            f(&mut m.lock().unwrap_or_else(|e| e.into_inner()));
        }
    }

    /// How this sampler's decode steps run (`kernels.decode`, `kernels.cuda_graphs`; see
    /// [`crate::decode::DecodePath`]).
    pub fn decode_path(&self) -> crate::decode::DecodePath {
        crate::decode::DecodePath::of(&self.model)
    }

    /// The policy version recorded in completions.
    pub fn version(&self) -> u64 {
        self.version
    }

    /// Sets the policy version recorded in completions (after loading new weights).
    pub fn set_version(&mut self, version: u64) {
        self.version = version;
    }

    /// The model the sampler runs (its weights shared with the caller's model after
    /// [`Sampler::new`], a private copy after [`Sampler::snapshot`]).
    pub fn model(&self) -> &Model {
        &self.model
    }

    /// Loads new weights by checkpoint name (as `rlvr_model::Model::named_vars` names them) into
    /// the sampler's weights, in place, and sets the policy version to `version`. Names not given
    /// keep their weights; a tied model skips `lm_head.weight`. After [`Sampler::new`] the
    /// weights are the caller's model's, so that model changes too.
    ///
    /// Errors: an unknown name or a shape mismatch (then nothing is loaded and the version is
    /// kept), tensor errors.
    pub fn load_named(&mut self, version: u64, weights: &[(String, Tensor)]) -> Result<()> {
        self.model.load_named(weights)?;
        self.version = version;
        Ok(())
    }

    /// Samples `params.group_size` completions for each prompt.
    ///
    /// - `prompts`: token ids of each prompt (non-empty, ids < vocab), e.g. a step's B prompts.
    /// - `first_prompt_index`: global index of `prompts[0]` (e.g. the data cursor), so that the
    ///   same prompt index gives the same completions whichever call samples it.
    /// - `params`: group size K, temperature, truncation, lengths and stop conditions.
    /// - `seed`: the run's sampling seed; completion (i, j) uses the stream
    ///   [`completion_rng`]`(seed, first_prompt_index + i, j)`.
    ///
    /// The arguments come in [`crate::Rollout::sample`]'s order, so the two read alike.
    ///
    /// Returns B·K completions ordered by (prompt_index, sample_index): groups are contiguous.
    ///
    /// Errors: [`RolloutError::InvalidParam`] for out-of-range parameters,
    /// [`RolloutError::InvalidPrompt`] for an empty prompt, an id outside the vocabulary or a
    /// prompt whose tokens plus `max_new_tokens` exceed the model's `max_position_embeddings`,
    /// [`RolloutError::NoTokenizer`] for stop strings without a tokenizer, and tensor errors
    /// (e.g. out of device memory).
    pub fn sample(
        &self,
        prompts: &[PromptIds],
        first_prompt_index: usize,
        params: &SamplingParams,
        seed: u64,
    ) -> Result<Vec<Completion>> {
        self.sample_recording(prompts, first_prompt_index, params, seed, None)
    }

    /// [`Sampler::sample`], keeping each completion's keys and values in `record` (when given)
    /// for its episode's next turn ([`Sampler::sample_each_kept`]).
    pub(crate) fn sample_recording(
        &self,
        prompts: &[PromptIds],
        first_prompt_index: usize,
        params: &SamplingParams,
        seed: u64,
        mut record: Option<&mut TurnCache>,
    ) -> Result<Vec<Completion>> {
        self.check_inputs(
            prompts
                .iter()
                .enumerate()
                .map(|(i, p)| (first_prompt_index + i, p)),
            params,
        )?;
        // Packed once per call: the weights may change between calls (a sync), not during one.
        let t = std::time::Instant::now();
        let head = packed_head(&self.model)?;
        self.time(|d| d.pack_s += t.elapsed().as_secs_f64());
        let per_wave = (params.max_batch_rows / params.group_size).max(1);
        let mut out = Vec::with_capacity(prompts.len() * params.group_size);
        for (w, chunk) in prompts.chunks(per_wave).enumerate() {
            let first = first_prompt_index + w * per_wave;
            let keys: Vec<(usize, usize, u64)> = (0..chunk.len() * params.group_size)
                .map(|r| (first + r / params.group_size, r % params.group_size, 0))
                .collect();
            let rec = record.as_deref_mut();
            self.run_wave(chunk, &keys, params, seed, head.as_ref(), rec, &mut out)?;
        }
        out.sort_by_key(|c| (c.prompt_index, c.sample_index));
        Ok(out)
    }

    /// Continues each of `rows` by one completion (a multi-turn episode's next assistant turn,
    /// docs/DESIGN.md section 14): row i's context is prefilled on its own (no group sharing) and its
    /// tokens are drawn from [`turn_rng`]`(seed, prompt_index, sample_index, turn − 1)`, so the
    /// result does not depend on which other rows share the call. `params.group_size` is ignored
    /// (one completion per row). Returns one completion per row, in row order.
    ///
    /// Errors: as [`Sampler::sample`] (a context plus `max_new_tokens` beyond the model's
    /// positions, an id outside the vocabulary, an empty context, a turn of 0).
    pub fn sample_each(
        &self,
        rows: &[TurnRow],
        params: &SamplingParams,
        seed: u64,
    ) -> Result<Vec<Completion>> {
        let (one, head) = self.turns_prelude(rows, params)?;
        let per_wave = one.max_batch_rows.max(1);
        let mut out = Vec::with_capacity(rows.len());
        for chunk in rows.chunks(per_wave) {
            let contexts: Vec<PromptIds> = chunk.iter().map(|r| r.context.clone()).collect();
            let keys: Vec<(usize, usize, u64)> = chunk
                .iter()
                .map(|r| (r.prompt_index, r.sample_index, r.turn - 1))
                .collect();
            let mut wave = Vec::with_capacity(chunk.len());
            self.run_wave(&contexts, &keys, &one, seed, head.as_ref(), None, &mut wave)?;
            out.extend(in_row_order(chunk, wave)?);
        }
        Ok(out)
    }

    /// What [`Sampler::sample_each`] and [`Sampler::sample_each_kept`] do first: `params` for
    /// one completion per row, the rows checked (as [`Sampler::sample`]'s, and no turn 0), and
    /// the packed head.
    pub(crate) fn turns_prelude(
        &self,
        rows: &[TurnRow],
        params: &SamplingParams,
    ) -> Result<(SamplingParams, Option<rlvr_kernels::PackedHead>)> {
        let one = SamplingParams {
            group_size: 1,
            ..params.clone()
        };
        self.check_inputs(rows.iter().map(|r| (r.prompt_index, &r.context)), &one)?;
        if let Some(r) = rows.iter().find(|r| r.turn == 0) {
            return Err(RolloutError::InvalidPrompt {
                prompt_index: r.prompt_index,
                msg: "turns count from 1".into(),
            });
        }
        let t = std::time::Instant::now();
        let head = packed_head(&self.model)?;
        self.time(|d| d.pack_s += t.elapsed().as_secs_f64());
        Ok((one, head))
    }

    /// The checks of [`Sampler::sample`] on its parameters and on every `(prompt_index, ids)`.
    fn check_inputs<'a>(
        &self,
        prompts: impl Iterator<Item = (usize, &'a PromptIds)>,
        params: &SamplingParams,
    ) -> Result<()> {
        params.validate()?;
        if !params.stop_strings.is_empty() && self.detok.is_none() {
            return Err(RolloutError::NoTokenizer);
        }
        let vocab = self.model.config().vocab_size;
        for (prompt_index, p) in prompts {
            if p.is_empty() {
                return Err(RolloutError::InvalidPrompt {
                    prompt_index,
                    msg: "empty prompt (encode at least one token, e.g. a BOS)".into(),
                });
            }
            // Bounds the prefill's [L, L] attention bias and every cache by the model's positions.
            let max_pos = self.model.config().max_position_embeddings;
            if p.len() + params.max_new_tokens > max_pos {
                return Err(RolloutError::InvalidPrompt {
                    prompt_index,
                    msg: format!(
                        "{} prompt tokens + max_new_tokens {} exceed the model's \
                         max_position_embeddings {max_pos} (shorten the prompt or lower max_new_tokens)",
                        p.len(),
                        params.max_new_tokens
                    ),
                });
            }
            if let Some(&bad) = p.iter().find(|&&x| x as usize >= vocab) {
                return Err(RolloutError::InvalidPrompt {
                    prompt_index,
                    msg: format!("token id {bad} is outside the vocabulary (size {vocab})"),
                });
            }
        }
        Ok(())
    }

    /// Prefills `prompts` once, copies each prompt's cache to its K rows and decodes them all;
    /// row r (prompt r / K) draws from the stream `keys[r]` = (prompt index, sample index, turn
    /// index) of [`turn_rng`].
    #[allow(clippy::too_many_arguments)]
    fn run_wave(
        &self,
        prompts: &[PromptIds],
        keys: &[(usize, usize, u64)],
        params: &SamplingParams,
        seed: u64,
        head: Option<&rlvr_kernels::PackedHead>,
        record: Option<&mut TurnCache>,
        out: &mut Vec<Completion>,
    ) -> Result<()> {
        let dev = self.model.device().clone();
        let k = params.group_size;
        let (p_n, l) = (
            prompts.len(),
            prompts.iter().map(Vec::len).max().unwrap_or(0),
        );
        let cap = l + params.max_new_tokens;

        // Prefill: left-padded [P, L]; positions count real tokens; causal + padding bias.
        let mut ids = Vec::with_capacity(p_n * l);
        let mut pos = Vec::with_capacity(p_n * l);
        let mut bias = vec![MASK_BIAS; p_n * l * l];
        let mut bias_rows = vec![0f32; p_n * cap];
        for (pi, p) in prompts.iter().enumerate() {
            let pad = l - p.len();
            ids.extend(std::iter::repeat_n(0u32, pad).chain(p.iter().copied()));
            pos.extend(std::iter::repeat_n(0u32, pad).chain(0..p.len() as u32));
            bias_rows[pi * cap..pi * cap + pad].fill(MASK_BIAS);
            for i in 0..l {
                let row = &mut bias[(pi * l + i) * l..(pi * l + i + 1) * l];
                if i >= pad {
                    row[pad..=i].fill(0.0);
                }
            }
        }
        let ids = Tensor::from_vec(ids, (p_n, l), &dev)?;
        let bias = Tensor::from_vec(bias, (p_n, 1, l, l), &dev)?;
        let mut cache = KvBuffer::new(&self.model, bias_rows, p_n, cap)?;
        let t = std::time::Instant::now();
        // The bias's key mask, for the fused attention's layout (`kernels.attention`).
        let key_mask: Vec<Vec<u32>> = (prompts.iter())
            .map(|p| {
                let pad = l - p.len();
                (0..l).map(|j| u32::from(j >= pad)).collect()
            })
            .collect();
        let logits = crate::decode::forward_last_masked(
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
        self.time(|d| d.prefill_s += t.elapsed().as_secs_f64());

        // Group sharing: row r = prompt r / K, sample r % K; copy each prompt's cache K times.
        let mut rows: Vec<Row> = (0..p_n * k)
            .map(|r| {
                let pi = r / k;
                let (prompt_index, s, turn) = keys[r];
                Row {
                    prompt_index,
                    sample_index: s,
                    prompt_len: prompts[pi].len(),
                    rng: turn_rng(seed, prompt_index, s, turn),
                    tokens: Vec::with_capacity(params.max_new_tokens),
                    logprobs: Vec::with_capacity(params.max_new_tokens),
                    finish: None,
                    kept: record.is_some().then(|| {
                        let n = prompts[pi].len();
                        (vec![(l - n, n)], prompts[pi].clone())
                    }),
                    context: longrope_switch(&self.model).map(|_| prompts[pi].clone()),
                }
            })
            .collect();
        if k > 1 {
            let rep: Vec<u32> = (0..(p_n * k) as u32).map(|r| r / k as u32).collect();
            cache.keep_rows(&rep)?;
        }
        // Row r reads logits row `src[r]` of `host` (the prompt's row right after prefill).
        let mut src: Vec<usize> = (0..p_n * k).map(|r| r / k).collect();
        let fused = self.fused_step(&cache)?;
        self.decode_loop(
            &mut rows, &mut src, logits, &mut cache, params, head, record, fused, out,
        )
    }

    /// The fused decode step over `cache`'s rows (`kernels.decode`, CUDA; issue 50), or `None`
    /// for the candle step: the switch off, the CPU, a model the fused step does not cover, or a
    /// step that failed to build (the last two said once in the log: the candle step is slower,
    /// never wrong).
    fn fused_step(&self, cache: &KvBuffer) -> Result<Option<Box<dyn crate::fused::FusedStep>>> {
        let step = self.build_fused_step(cache);
        if step.is_ok() {
            self.time(|d| d.fused_builds += u64::from(matches!(step, Ok(Some(_)))));
        }
        step.or_else(|e| {
            rlvr_model::kernels::log_once(format!(
                "kernels.decode = on: the fused decode step could not be built ({e}); the candle \
                 decode step runs"
            ));
            Ok(None)
        })
    }

    fn build_fused_step(
        &self,
        cache: &KvBuffer,
    ) -> Result<Option<Box<dyn crate::fused::FusedStep>>> {
        if let Some(step) = crate::fused::host_step(&self.model, cache)? {
            return Ok(Some(step));
        }
        let path = self.decode_path();
        if !path.fused || !self.model.device().is_cuda() {
            return Ok(None);
        }
        if let Err(e) = crate::fused::StepShape::of(&self.model, cache.rows(), cache.capacity()) {
            rlvr_model::kernels::log_once(format!(
                "kernels.decode = on: {e}; the candle decode step runs"
            ));
            return Ok(None);
        }
        #[cfg(feature = "cuda")]
        let step: Option<Box<dyn crate::fused::FusedStep>> = Some(Box::new(
            crate::fused_cuda::FusedDecoder::new(&self.model, cache, path.cuda_graphs)?,
        ));
        #[cfg(not(feature = "cuda"))]
        let step = None;
        Ok(step)
    }

    /// The decode loop: choose a token for every row, retire finished rows (compacting the
    /// cache), feed the chosen tokens, repeat.
    ///
    /// The candle step compacts the cache whenever a row finishes. The fused step (`fused`)
    /// keeps the cache's rows as fixed slots, a batch-size bucket, while its rows finish, and
    /// compacts when the live rows fit half the slots of a bucket of more than
    /// [`FUSED_MIN_BUCKET_ROWS`]: then the step of the smaller bucket is built (a new graph is
    /// captured), at most log₂(rows / 16) + 1 times a wave. The buckets depend on the rows'
    /// lengths alone, so graphs on and off compute the same shapes.
    #[allow(clippy::too_many_arguments)]
    fn decode_loop(
        &self,
        rows: &mut Vec<Row>,
        src: &mut Vec<usize>,
        mut logits: Tensor,
        cache: &mut KvBuffer,
        params: &SamplingParams,
        head: Option<&rlvr_kernels::PackedHead>,
        mut record: Option<&mut TurnCache>,
        mut fused: Option<Box<dyn crate::fused::FusedStep>>,
        out: &mut Vec<Completion>,
    ) -> Result<()> {
        let dev = self.model.device().clone();
        // The first decode step's column: a row's fed tokens sit at `decoded..`.
        let decoded = cache.len();
        // The fused step keeps the cache's rows as fixed slots until the live rows fit half of
        // them: row r is slot `slots[r]`; the candle step compacts, and slot r is row r.
        let mut slots: Vec<usize> = (0..rows.len()).collect();
        let stop_window = params
            .stop_strings
            .iter()
            .map(String::len)
            .max()
            .map(|m| m + 2)
            .unwrap_or(0);
        loop {
            // 1. Choose one token per row from its own RNG stream (rows in parallel).
            self.choose_all(rows, src, &logits, params, stop_window)?;
            let n_rows = rows.len() as u64;
            self.time(|d| d.tokens += n_rows);
            // 2. Retire finished rows; compact the batch when any finished.
            let t = std::time::Instant::now();
            let alive: Vec<u32> = (0..rows.len() as u32)
                .filter(|&r| rows[r as usize].finish.is_none())
                .collect();
            if alive.len() < rows.len() {
                if let (Some(f), Some(_)) = (fused.as_deref_mut(), record.as_deref()) {
                    f.flush(cache)?;
                }
                let mut kept = Vec::with_capacity(alive.len());
                let before = std::mem::take(&mut slots);
                slots = alive.iter().map(|&r| before[r as usize]).collect();
                for (r, row) in rows.drain(..).enumerate() {
                    // Row r's keys and values sit in cache row `before[r]` (its slot).
                    if let (Some(rec), Some((cols, ids)), Some(_)) =
                        (record.as_deref_mut(), &row.kept, row.finish)
                    {
                        let slot = before[r];
                        turns::keep_row(rec, cache, slot, cols, decoded, ids, &row, self.version)?;
                    }
                    match row.finish {
                        Some(reason) => out.push(Completion {
                            prompt_index: row.prompt_index,
                            sample_index: row.sample_index,
                            token_ids: row.tokens,
                            behaviour_logprobs: row.logprobs,
                            finish_reason: reason,
                            version: self.version,
                        }),
                        None => kept.push(row),
                    }
                }
                *rows = kept;
                if rows.is_empty() {
                    self.time(|d| d.compact_s += t.elapsed().as_secs_f64());
                    return Ok(());
                }
                if fused.is_none() {
                    cache.keep_rows(&alive)?;
                    slots = (0..alive.len()).collect();
                } else if 2 * rows.len() <= cache.rows() && cache.rows() > self.fused_min_bucket {
                    // The live rows fit the next bucket: compact, and build its step (freeing
                    // this one's buffers and graph first).
                    if let Some(mut f) = fused.take() {
                        f.flush(cache)?;
                    }
                    let live: Vec<u32> = slots.iter().map(|&s| s as u32).collect();
                    cache.keep_rows(&live)?;
                    slots = (0..live.len()).collect();
                    fused = self.fused_step(cache)?;
                }
            }
            self.time(|d| d.compact_s += t.elapsed().as_secs_f64());
            // 3. Feed the chosen tokens: one new column per row.
            let n = rows.len();
            let ids: Vec<u32> = rows
                .iter()
                .map(|r| *r.tokens.last().expect("one token"))
                .collect();
            let pos: Vec<u32> = rows
                .iter()
                .map(|r| (r.prompt_len + r.tokens.len() - 1) as u32)
                .collect();
            let t = std::time::Instant::now();
            let launches = rlvr_kernels::triton::launch_count();
            let fused_out = fused.as_deref_mut().map(|f| {
                let (mut ids_s, mut pos_s) = (vec![0u32; cache.rows()], vec![0u32; cache.rows()]);
                for (r, &s) in slots.iter().enumerate() {
                    (ids_s[s], pos_s[s]) = (ids[r], pos[r]);
                }
                f.step(cache, &ids_s, &pos_s)
            });
            logits = match fused_out {
                Some(Ok(l)) => l,
                other => {
                    if let Some(Err(e)) = other {
                        // A step that fails (a launch its plan refuses, say) has not committed its
                        // column: the wave goes on with the candle step from this column, its
                        // rows compacted out of their slots. A fault that broke the device fails
                        // the candle step too, with the device's error.
                        rlvr_model::kernels::log_once(format!(
                            "kernels.decode = on: a fused decode step failed ({e}); the candle \
                             decode step runs instead"
                        ));
                        if let Some(mut f) = fused.take() {
                            f.flush(cache)?;
                        }
                        let live: Vec<u32> = slots.iter().map(|&s| s as u32).collect();
                        if live.iter().enumerate().any(|(i, &s)| i as u32 != s)
                            || live.len() != cache.rows()
                        {
                            cache.keep_rows(&live)?;
                        }
                        slots = (0..live.len()).collect();
                    }
                    let ids = Tensor::from_vec(ids, (n, 1), &dev)?;
                    let mut logits = forward_last(&self.model, &ids, &pos, None, cache, head)?;
                    // LongRoPE: a row whose new token is the first past the switch is run again
                    // whole, its cached keys rotated with the long factors (transformers drops
                    // its cache there).
                    if let Some(switch) = longrope_switch(&self.model) {
                        for (r, row) in rows.iter().enumerate() {
                            if pos[r] as usize != switch {
                                continue;
                            }
                            let Some(ctx) = &row.context else { continue };
                            let seq: Vec<u32> = ctx.iter().chain(&row.tokens).copied().collect();
                            let one = cache.recompute_row(&self.model, r, &seq, head)?;
                            logits = logits.slice_assign(&[r..r + 1, 0..logits.dim(1)?], &one)?;
                        }
                    }
                    logits
                }
            };
            let host = t.elapsed().as_secs_f64();
            if self.timings.is_some() {
                dev.synchronize()?;
            }
            self.time(|d| {
                d.forward_s += t.elapsed().as_secs_f64();
                d.forward_host_s += host;
                d.triton_launches += rlvr_kernels::triton::launch_count().saturating_sub(launches);
                d.steps += 1;
            });
            src.clear();
            src.extend_from_slice(&slots);
        }
    }

    /// Appends one token to every row: row r reads logits row `src[r]` of `logits` (`[.., V]`),
    /// draws from its own stream, records ℓ_old and sets `finish` when a stop condition holds.
    /// On the host path rows run in parallel on the rayon pool; each only touches its own state,
    /// so the result does not depend on the thread count. The device path
    /// ([`crate::device_select`]) draws the same `u` per row from the same stream.
    fn choose_all(
        &self,
        rows: &mut [Row],
        src: &[usize],
        logits: &Tensor,
        params: &SamplingParams,
        stop_window: usize,
    ) -> Result<()> {
        thread_local! {
            static SCRATCH: std::cell::RefCell<Scratch> = std::cell::RefCell::new(Scratch::default());
        }
        let sel = params.selection();
        let banning = !params.stop_ids.is_empty()
            && rows.iter().any(|r| r.tokens.len() < params.min_new_tokens);
        let on_device = self.device_select.unwrap_or(!logits.device().is_cpu())
            && crate::device_select::supported(&sel)
            && !banning;
        if on_device {
            let t = std::time::Instant::now();
            let identity =
                src.len() == logits.dims()[0] && src.iter().enumerate().all(|(i, &s)| i == s);
            let rows_logits = if identity {
                logits.clone()
            } else {
                let idx: Vec<u32> = src.iter().map(|&s| s as u32).collect();
                let idx = Tensor::from_vec(idx, src.len(), logits.device())?;
                logits.index_select(&idx, 0)?
            };
            let u: Vec<f64> = rows
                .iter_mut()
                .map(|row| {
                    if sel.temperature > 0.0 {
                        row.rng.random::<f64>()
                    } else {
                        0.0
                    }
                })
                .collect();
            let choices = crate::device_select::choose_on_device(&rows_logits, &sel, &u)?;
            self.time(|d| d.select_s += t.elapsed().as_secs_f64());
            for (row, c) in rows.iter_mut().zip(choices) {
                self.record(row, c, params, stop_window)?;
            }
            return Ok(());
        }
        let t = std::time::Instant::now();
        // On the CPU the logits are read in place (a copy of `[rows, V]` f32 was 7% of a step).
        let in_place = logits.device().is_cpu()
            && logits.dtype() == candle_core::DType::F32
            && logits.is_contiguous();
        let owned = if in_place {
            Vec::new()
        } else {
            logits.flatten_all()?.to_vec1::<f32>()?
        };
        let guard = in_place.then(|| logits.storage_and_layout());
        let host: &[f32] = match &guard {
            Some((st, l)) => match (&**st, l.contiguous_offsets()) {
                (candle_core::Storage::Cpu(candle_core::CpuStorage::F32(v)), Some((a, b))) => {
                    &v[a..b]
                }
                _ => {
                    return Err(candle_core::Error::Msg(
                        "logits: expected contiguous f32 CPU storage".into(),
                    )
                    .into())
                }
            },
            None => &owned,
        };
        let vocab = logits.dims()[1];
        let t1 = std::time::Instant::now();
        rows.par_iter_mut()
            .zip(src.par_iter())
            .try_for_each(|(row, &s)| -> Result<()> {
                let logits = &host[s * vocab..(s + 1) * vocab];
                let u = if sel.temperature > 0.0 {
                    row.rng.random::<f64>()
                } else {
                    0.0
                };
                let early = row.tokens.len() < params.min_new_tokens;
                let banned: &[u32] = if early { &params.stop_ids } else { &[] };
                let c = SCRATCH.with(|sc| choose(logits, &sel, u, banned, &mut sc.borrow_mut()));
                self.record(row, c, params, stop_window)
            })?;
        self.time(|d| {
            d.to_host_s += (t1 - t).as_secs_f64();
            d.select_s += t1.elapsed().as_secs_f64();
        });
        Ok(())
    }

    /// Appends the chosen token and its ℓ_old to `row` and sets `finish` when a stop condition
    /// holds (a stop id or stop string once `min_new_tokens` is reached, or the length limit).
    fn record(
        &self,
        row: &mut Row,
        c: Choice,
        params: &SamplingParams,
        stop_window: usize,
    ) -> Result<()> {
        // NaN or infinite logits (non-finite weights or an overflow) pick no meaningful token: the
        // chosen token's log-prob over the full vocabulary is finite whenever the logits are.
        if !c.logprob.is_finite() {
            return Err(RolloutError::NonFinite {
                prompt_index: row.prompt_index,
                sample_index: row.sample_index,
                position: row.tokens.len(),
                logprob: c.logprob,
            });
        }
        row.tokens.push(c.token);
        row.logprobs.push(c.logprob);
        let early = row.tokens.len() < params.min_new_tokens;
        row.finish = if !early && params.stop_ids.contains(&c.token) {
            Some(FinishReason::Eos)
        } else if stop_window > 0
            && !early
            && self.hits_stop_string(&row.tokens, params, stop_window)?
        {
            Some(FinishReason::StopString)
        } else if row.tokens.len() >= params.max_new_tokens {
            Some(FinishReason::Length)
        } else {
            None
        };
        Ok(())
    }

    /// Whether the decoded text of the last `window` tokens contains a stop string. A match must
    /// end in the newest token (an earlier one would have stopped the row), and a string of m
    /// bytes spans at most m tokens, so a window of m + 2 tokens sees every match.
    fn hits_stop_string(
        &self,
        tokens: &[u32],
        params: &SamplingParams,
        window: usize,
    ) -> Result<bool> {
        let detok = self.detok.as_ref().ok_or(RolloutError::NoTokenizer)?;
        let tail = &tokens[tokens.len().saturating_sub(window)..];
        let text = detok.detokenize(tail).map_err(RolloutError::Tokenizer)?;
        Ok(params
            .stop_strings
            .iter()
            .any(|s| text.contains(s.as_str())))
    }
}
