//! The `Rollout` boundary: what the explorer, evaluation and `rlvr generate` need of a sampling
//! engine, so that another engine (a vLLM server: rlvr-vllm) plugs in beside the native one.
//!
//! A backend samples K completions for each prompt of a batch with the weights of one policy
//! version, and is told new weights (with their checkpoint names) after every sync. Every call
//! returns a `Result`: a remote backend can fail (network, server error). `sample` answers one
//! result per group, so a caller can tell which groups failed and never trains on a partial one.
//!
//! Seeds (DESIGN.md section 3, "explorer"): completion j of the prompt with draw index i uses the
//! randomness of (seed, i, j), whatever the batch split; the native engine keys a ChaCha12 stream
//! by exactly that triple ([`crate::completion_rng`]), and a remote backend derives its request
//! seeds from it.

use candle_core::Tensor;
use rlvr_model::Model;

use crate::engine::{
    Completion, PromptIds, Sampler, SamplingParams, TurnCache, TurnRow, DEFAULT_TURN_CACHE_BYTES,
};
use crate::error::{Result, RolloutError};

/// One group's outcome: its K completions in sample order (`sample_index` 0..K, every one with
/// the draw index of its prompt as `prompt_index`), or why this group could not be sampled.
pub type GroupResult = std::result::Result<Vec<Completion>, RolloutError>;

/// A sampling engine behind the explorer (DESIGN.md section 3).
///
/// `Send`: the explorer runs on its own thread when the sync offset o ≥ 1.
pub trait Rollout: Send {
    /// The policy version of the weights it samples with (the last [`Rollout::load_weights`]).
    fn version(&self) -> u64;

    /// Loads `weights` as policy version `version`: every trainable tensor, named as in the
    /// checkpoint (`rlvr_model::Model::named_vars`: `model.layers.0.self_attn.q_proj.weight`, …),
    /// values copied (later changes of the caller's tensors are not seen). The run calls it once
    /// at start and on resume (a remote backend must be told the starting weights) and after
    /// every sync (every v-th trainer step).
    ///
    /// Errors: a missing or unknown name, a shape mismatch, or a backend failure; after an error
    /// the backend's weights are unspecified and it must not be sampled from.
    fn load_weights(&mut self, version: u64, weights: &[(String, Tensor)]) -> Result<()>;

    /// Samples `params.group_size` (K) completions for each of `prompts` (token ids, already
    /// rendered and encoded). `prompts[i]` has draw index `first_index + i`, which keys its
    /// randomness together with `seed` (module docs) and is its completions' `prompt_index`.
    ///
    /// Returns one [`GroupResult`] per prompt, in prompt order. Each completion carries its ids
    /// (a generated stop id included), one behaviour log-prob ℓ_old per id (DESIGN.md section 3),
    /// its finish reason and the policy version that sampled it.
    ///
    /// Errors (the whole call): invalid parameters or prompts, or a backend that cannot sample at
    /// all; a failure confined to some groups is reported in those groups' entries instead.
    fn sample(
        &mut self,
        prompts: &[PromptIds],
        first_index: usize,
        params: &SamplingParams,
        seed: u64,
    ) -> Result<Vec<GroupResult>>;

    /// Continues each of `rows` by one assistant turn of a multi-turn episode (docs/DESIGN.md
    /// §14): one completion per row, in row order, row i's randomness keyed by its (seed, prompt
    /// index, sample index, turn) ([`crate::engine::turn_rng`]; a remote backend derives its
    /// request seed from the same key). The native engine and rlvr-vllm's do; the default
    /// refuses (a backend that cannot run episodes after their first turn).
    ///
    /// Errors: as [`Rollout::sample`]; [`RolloutError::Backend`] from a backend without it.
    fn sample_turns(
        &mut self,
        rows: &[TurnRow],
        params: &SamplingParams,
        seed: u64,
    ) -> Result<Vec<Completion>> {
        let _ = (rows, params, seed);
        Err(RolloutError::Backend(
            "this rollout backend does not run multi-turn episodes (the native and vLLM \
             backends do)"
                .into(),
        ))
    }

    /// Whether to keep each episode's state between its turns: `Some(budget_bytes)` before an
    /// episode batch's first turn, `None` after its last. The native engine then keeps the keys
    /// and values of every completion of [`Rollout::sample`] and [`Rollout::sample_turns`], at
    /// most `budget_bytes` of them (`crate::engine::TurnCache`), so that the next turn prefills
    /// only the new ids; `None` frees them, and `Some(0)` keeps nothing (every later turn
    /// prefills its whole context, bit for bit the path without a cache). Default: ignored (a
    /// backend without such state).
    fn keep_turns(&mut self, budget_bytes: Option<usize>) {
        let _ = budget_bytes;
    }

    /// The weights it samples with as a model on this process, when it has one (the native
    /// engine over a model it owns): the explorer then scores with the behaviour weights
    /// (`train.recompute_behaviour`) and checkpoints them without a second copy. Default `None`
    /// (a remote backend).
    fn local_model(&self) -> Option<&Model> {
        None
    }
}

/// The native engine ([`Sampler`]) behind the [`Rollout`] boundary.
pub struct NativeRollout {
    sampler: Sampler,
    /// The model the sampler shares storage with, when this backend owns it.
    model: Option<Model>,
    /// Episodes' keys and values between turns, while [`Rollout::keep_turns`] is on.
    turns: TurnCache,
    keeping: bool,
}

impl NativeRollout {
    /// Wraps `sampler` (built over the caller's model with [`Sampler::new`], which shares its
    /// storage, or over a private copy with [`Sampler::snapshot`]).
    pub fn new(sampler: Sampler) -> Self {
        Self {
            sampler,
            model: None,
            turns: TurnCache::new(DEFAULT_TURN_CACHE_BYTES),
            keeping: false,
        }
    }

    /// Sets the byte budget of the keys and values kept between an episode's turns (default
    /// [`DEFAULT_TURN_CACHE_BYTES`]; 0: every later turn prefills its whole context).
    pub fn with_turn_cache_budget(mut self, bytes: usize) -> Self {
        self.turns = TurnCache::new(bytes);
        self
    }

    /// The keys and values kept between turns (their budget, size and counts).
    pub fn turn_cache(&self) -> &TurnCache {
        &self.turns
    }

    /// A backend that owns `model` (version `version`) and samples with it in place (no copy);
    /// [`Rollout::local_model`] returns it, and [`Rollout::load_weights`] updates it.
    /// `tokenizer` decodes completions for stop strings.
    pub fn owning(model: Model, version: u64, tokenizer: Option<tokenizers::Tokenizer>) -> Self {
        let mut sampler = Sampler::new(&model, version);
        if let Some(t) = tokenizer {
            sampler = sampler.with_tokenizer(t);
        }
        Self {
            sampler,
            model: Some(model),
            turns: TurnCache::new(DEFAULT_TURN_CACHE_BYTES),
            keeping: false,
        }
    }

    /// The wrapped sampler.
    pub fn sampler(&self) -> &Sampler {
        &self.sampler
    }
}

impl Rollout for NativeRollout {
    fn version(&self) -> u64 {
        self.sampler.version()
    }

    fn load_weights(&mut self, version: u64, weights: &[(String, Tensor)]) -> Result<()> {
        // A new version must replace every weight: one left out would sample with a stale part
        // (`Sampler::load_named` itself accepts partial sets; a tied lm_head is not a weight).
        let model = self.sampler.model();
        if let Some((name, _)) = model
            .named_vars()
            .into_iter()
            .find(|(n, _)| !weights.iter().any(|(m, _)| m == n))
        {
            return Err(crate::RolloutError::from(candle_core::Error::Msg(format!(
                "load_weights: weight `{name}` of version {version} is missing"
            ))));
        }
        // The sampler shares storage with `self.model` (Sampler::new), so this updates both.
        self.turns.clear();
        self.sampler.load_named(version, weights)
    }

    fn sample(
        &mut self,
        prompts: &[PromptIds],
        first_index: usize,
        params: &SamplingParams,
        seed: u64,
    ) -> Result<Vec<GroupResult>> {
        let k = params.group_size;
        let out = if self.keeping {
            // A new batch of episodes: what earlier ones left is of no use.
            self.turns.clear();
            self.sampler
                .sample_keeping(prompts, first_index, params, seed, &mut self.turns)?
        } else {
            self.sampler.sample(prompts, first_index, params, seed)?
        };
        // `Sampler::sample` returns B·K completions ordered by (prompt index, sample index).
        let mut groups: Vec<GroupResult> = Vec::with_capacity(prompts.len());
        let mut it = out.into_iter();
        for _ in 0..prompts.len() {
            groups.push(Ok(it.by_ref().take(k).collect()));
        }
        Ok(groups)
    }

    fn sample_turns(
        &mut self,
        rows: &[TurnRow],
        params: &SamplingParams,
        seed: u64,
    ) -> Result<Vec<Completion>> {
        if self.keeping {
            self.sampler
                .sample_each_kept(rows, params, seed, &mut self.turns)
        } else {
            self.sampler.sample_each(rows, params, seed)
        }
    }

    fn keep_turns(&mut self, budget_bytes: Option<usize>) {
        self.keeping = budget_bytes.is_some_and(|b| b > 0);
        match budget_bytes {
            Some(b) if b != self.turns.budget() => self.turns = TurnCache::new(b),
            Some(_) => {}
            None => self.turns.clear(),
        }
    }

    fn local_model(&self) -> Option<&Model> {
        self.model.as_ref()
    }
}

/// The completions of every group in order (groups contiguous), or the first failed group's
/// error.
///
/// Errors: the first [`GroupResult`] that is an error.
pub fn flatten(groups: Vec<GroupResult>) -> Result<Vec<Completion>> {
    let mut out = Vec::new();
    for g in groups {
        out.extend(g?);
    }
    Ok(out)
}

/// A model's trainable tensors with their checkpoint names, as [`Rollout::load_weights`] takes
/// them (shared storage, no copy: the backend copies).
pub fn named_tensors(model: &Model) -> Vec<(String, Tensor)> {
    model
        .named_vars()
        .into_iter()
        .map(|(n, v)| (n, v.as_tensor().detach()))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::{DType, Device};
    use rlvr_model::ModelConfig;

    fn model(seed: u64) -> Model {
        let config = ModelConfig::from_json(
            &serde_json::json!({"model_type": "qwen2", "vocab_size": 64, "hidden_size": 16,
                "intermediate_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2,
                "num_key_value_heads": 1, "max_position_embeddings": 64}),
            "inline".as_ref(),
        )
        .unwrap();
        Model::random(config, 0.02, seed, DType::F32, &Device::Cpu).unwrap()
    }

    fn params(k: usize) -> SamplingParams {
        SamplingParams {
            group_size: k,
            max_new_tokens: 6,
            ..Default::default()
        }
    }

    /// The boundary returns exactly the sampler's completions, grouped, with the same seeds.
    #[test]
    fn native_groups_equal_the_sampler_output() {
        let m = model(0);
        let prompts = vec![vec![1, 2, 3], vec![4, 5], vec![6]];
        let direct = Sampler::new(&m, 3)
            .sample(&prompts, 10, &params(4), 7)
            .unwrap();
        let mut r = NativeRollout::new(Sampler::new(&m, 3));
        let groups = r.sample(&prompts, 10, &params(4), 7).unwrap();
        assert_eq!(groups.len(), 3);
        let flat = flatten(groups).unwrap();
        assert_eq!(flat, direct);
        assert!(flat
            .chunks(4)
            .enumerate()
            .all(|(i, g)| g
                .iter()
                .enumerate()
                .all(|(j, c)| c.prompt_index == 10 + i && c.sample_index == j && c.version == 3)));
    }

    /// Weights cross by name: after loading model B's tensors into a backend over model A, it
    /// samples exactly as a sampler over B, reports the new version, and its model holds B.
    #[test]
    fn load_weights_by_name_switches_the_policy() {
        let (a, b) = (model(0), model(1));
        let prompts = vec![vec![1, 2, 3], vec![4, 5]];
        let p = SamplingParams {
            temperature: 0.0,
            ..params(1)
        };
        let want = Sampler::new(&b, 9).sample(&prompts, 0, &p, 0).unwrap();
        let mut r = NativeRollout::owning(a, 0, None);
        let before = r.sample(&prompts, 0, &p, 0).unwrap();
        // Reversed order: names, not positions, decide where each tensor goes.
        let mut w = named_tensors(&b);
        w.reverse();
        r.load_weights(9, &w).unwrap();
        assert_eq!(r.version(), 9);
        let got: Vec<Completion> = r
            .sample(&prompts, 0, &p, 0)
            .unwrap()
            .into_iter()
            .flat_map(|g| g.unwrap())
            .collect();
        assert_eq!(got, want);
        assert_ne!(
            before
                .into_iter()
                .flat_map(|g| g.unwrap())
                .collect::<Vec<_>>(),
            want
        );
        let local = r.local_model().unwrap();
        for ((n1, v1), (n2, v2)) in local.named_vars().iter().zip(b.named_vars().iter()) {
            assert_eq!(n1, n2);
            let d = (v1.as_tensor() - v2.as_tensor())
                .unwrap()
                .abs()
                .unwrap()
                .max_all()
                .unwrap()
                .to_scalar::<f32>()
                .unwrap();
            assert_eq!(d, 0.0, "{n1}");
        }
        // The caller's tensors are copied, not shared: changing B afterwards leaves the backend.
        let nv = b.named_vars();
        let v = nv[0].1;
        v.set(&v.as_tensor().zeros_like().unwrap()).unwrap();
        let l0 = local.named_vars()[0].1.as_tensor().abs().unwrap();
        assert!(l0.max_all().unwrap().to_scalar::<f32>().unwrap() > 0.0);
    }

    /// A turn-1 row of `sample_each` draws exactly the group path's completion (same stream,
    /// same context), whatever other rows share the call; later turns use other streams.
    #[test]
    fn sample_each_turn_one_equals_the_group_path() {
        let m = model(0);
        let prompts = vec![vec![1, 2, 3], vec![4, 5]];
        let p = params(3);
        let s = Sampler::new(&m, 2);
        let direct = s.sample(&prompts, 5, &p, 11).unwrap();
        let rows: Vec<TurnRow> = [(1usize, 2usize), (0, 0), (1, 0)]
            .iter()
            .map(|&(pi, j)| TurnRow {
                context: prompts[pi].clone(),
                prompt_index: 5 + pi,
                sample_index: j,
                turn: 1,
            })
            .collect();
        let each = s.sample_each(&rows, &p, 11).unwrap();
        assert_eq!(each[0], direct[3 + 2]);
        assert_eq!(each[1], direct[0]);
        assert_eq!(each[2], direct[3]);
        // Alone in its call, the same row draws the same completion.
        assert_eq!(s.sample_each(&rows[..1], &p, 11).unwrap()[0], each[0]);
        // Turn 2 of the same episode draws from another stream.
        let mut r2 = rows[..1].to_vec();
        r2[0].turn = 2;
        let ids = |c: &Completion| c.token_ids.clone();
        let lp2 = s.sample_each(
            &r2,
            &SamplingParams {
                max_new_tokens: 6,
                ..p.clone()
            },
            11,
        );
        assert_ne!(ids(&lp2.unwrap()[0]), ids(&each[0]));
        r2[0].turn = 0;
        assert!(s.sample_each(&r2, &p, 11).is_err());
    }

    /// `keep_turns(Some(budget))`: the first turn's `sample` leaves each completion's keys and
    /// values, a later turn's `sample_turns` reuses them (same tokens as without), new weights or
    /// `keep_turns(None)` drop them; off, or with a budget of 0, nothing is kept and the later
    /// turn equals the plain path bit for bit.
    #[test]
    fn native_keeps_turns_only_while_asked() {
        let m = model(0);
        let prompts = vec![vec![1, 2, 3], vec![4, 5]];
        let p = params(2);
        let turn2 = |first: &[Completion]| -> Vec<TurnRow> {
            first
                .iter()
                .map(|c| {
                    let mut context = prompts[c.prompt_index].clone();
                    context.extend(&c.token_ids);
                    context.extend([7, 8]);
                    TurnRow {
                        context,
                        prompt_index: c.prompt_index,
                        sample_index: c.sample_index,
                        turn: 2,
                    }
                })
                .collect()
        };
        let mut plain = NativeRollout::owning(m.try_clone().unwrap(), 0, None);
        let first = flatten(plain.sample(&prompts, 0, &p, 3).unwrap()).unwrap();
        let want = plain.sample_turns(&turn2(&first), &p, 3).unwrap();
        assert_eq!(plain.turn_cache().stats(), Default::default());
        let mut zero = NativeRollout::owning(m.try_clone().unwrap(), 0, None);
        zero.keep_turns(Some(0));
        assert_eq!(
            flatten(zero.sample(&prompts, 0, &p, 3).unwrap()).unwrap(),
            first
        );
        assert_eq!(zero.sample_turns(&turn2(&first), &p, 3).unwrap(), want);
        assert!(zero.turn_cache().is_empty());
        let mut r = NativeRollout::owning(m, 0, None);
        r.keep_turns(Some(DEFAULT_TURN_CACHE_BYTES));
        let got_first = flatten(r.sample(&prompts, 0, &p, 3).unwrap()).unwrap();
        assert_eq!(got_first, first);
        assert_eq!(r.turn_cache().len(), 4);
        let got = r.sample_turns(&turn2(&first), &p, 3).unwrap();
        for (a, b) in got.iter().zip(&want) {
            assert_eq!(a.token_ids, b.token_ids);
            for (x, y) in a.behaviour_logprobs.iter().zip(&b.behaviour_logprobs) {
                assert!((x - y).abs() < 1e-5, "{x} vs {y}");
            }
        }
        let st = r.turn_cache().stats();
        assert_eq!((st.hits, st.misses), (4, 0));
        assert_eq!(r.turn_cache().len(), 4);
        let w = named_tensors(r.local_model().unwrap());
        r.load_weights(1, &w).unwrap();
        assert!(r.turn_cache().is_empty());
        flatten(r.sample(&prompts, 0, &p, 3).unwrap()).unwrap();
        assert_eq!(r.turn_cache().len(), 4);
        r.keep_turns(None);
        assert!(r.turn_cache().is_empty());
        flatten(r.sample(&prompts, 0, &p, 3).unwrap()).unwrap();
        assert!(r.turn_cache().is_empty());
    }

    #[test]
    fn load_weights_rejects_missing_and_unknown_names() {
        let (a, b) = (model(0), model(1));
        let mut r = NativeRollout::owning(a, 0, None);
        let mut w = named_tensors(&b);
        let last = w.pop().unwrap();
        let e = r.load_weights(1, &w).unwrap_err().to_string();
        assert!(e.contains(&last.0), "{e}");
        w.push(last);
        w.push(("model.layers.7.mlp.up_proj.weight".into(), w[0].1.clone()));
        let e = r.load_weights(1, &w).unwrap_err().to_string();
        assert!(e.contains("model.layers.7.mlp.up_proj.weight"), "{e}");
    }
}
