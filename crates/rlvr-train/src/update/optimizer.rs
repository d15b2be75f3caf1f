//! The optimizer step, one for RL, SFT and the quickstart's warm start:
//!
//! ```text
//! g_k = Σ_m ∇ loss_m              accumulate micro-batch gradients (no division by their count)
//! g_k ← reduce(g_k), finite       GradReduce: identity on one process; a data-parallel all-reduce
//!                                 of the sums and of the non-finite flag (rlvr_dist::DistReduce)
//! ‖g‖ = sqrt(Σ_k Σ g_k²)          global L2 norm; non-finite loss or norm → skip, no update
//! g_k ← g_k · min(1, c/(‖g‖+1e-6)) when c > 0 and ‖g‖ > c   (global-norm clipping)
//! θ ← AdamW(θ, g, lr)             decoupled weight decay (Loshchilov & Hutter, arXiv 1711.05101)
//! θ finite?                       else NonFiniteWeight: the training diverged (no later step)
//! ```
//!
//! A finite loss and gradient can still carry a weight past f32's range (a huge step where a
//! second moment is tiny), and a weight that is not finite stays so: every later step, sample
//! and save would fail on it. So after each applied update the weights are checked
//! ([`first_non_finite`]: one sum per parameter, one device-to-host read) and a non-finite one
//! is an error naming it.
//!
//! Sharded (ZeRO-1, `rlvr_dist::ZeroReduce`): the reduction leaves each rank the sums of the
//! parameters it owns, ‖g‖² is summed over the ranks' shares, each rank's AdamW keeps state for
//! and updates its own parameters only, and the owners then share the new weights. ZeRO-2
//! ([`GradReduce::shards_gradients`]) reduces each micro-batch's gradients to their owners in
//! [`OptimizerStep::accumulate`] instead, so `g_k` above is only ever held by its owner; the rest
//! is ZeRO-1's.

use candle_core::{backprop::GradStore, DType, Tensor, Var};
use rlvr_model::optim::{AdamW, AdamWConfig, GradAccumulator};
use rlvr_model::Model;

use crate::store::checkpoint::OptimizerRecord;

/// The optimizer settings checked at start-up by [`check_optimizer`], with the name each has
/// where it was given (`train.beta1` in a config, `--lr` on `rlvr sft`).
#[derive(Debug, Clone, Copy)]
pub struct OptimizerValues<'a> {
    /// Peak learning rate, with its key.
    pub lr: (&'a str, f64),
    /// AdamW β₁, β₂, ε and weight decay, with their keys (`None`: fixed, not user-given).
    pub beta1: Option<(&'a str, f64)>,
    /// AdamW β₂.
    pub beta2: Option<(&'a str, f64)>,
    /// AdamW ε.
    pub eps: Option<(&'a str, f64)>,
    /// Decoupled weight decay λ.
    pub weight_decay: (&'a str, f64),
    /// Global gradient-norm clip (0 = off).
    pub grad_clip: (&'a str, f64),
}

/// Checks the optimizer settings before anything is trained: lr finite and positive; β₁, β₂ in
/// [0, 1) (β = 1 freezes a moment and AdamW's bias correction 1 − βᵗ divides by 0); ε finite and
/// positive (it keeps the step finite where the second moment is 0); weight decay finite and
/// ≥ 0; the gradient clip finite and ≥ 0 (0 = off). A NaN anywhere would train every weight into
/// NaN.
///
/// # Errors
/// The first value out of range, naming its key, the value and the allowed range.
pub fn check_optimizer(v: &OptimizerValues) -> anyhow::Result<()> {
    let check = |(key, x): (&str, f64), ok: bool, range: &str| {
        // Scientific notation where the plain form runs long (1e300 is 301 digits).
        let shown = Some(x.to_string())
            .filter(|p| p.len() <= 16)
            .unwrap_or_else(|| format!("{x:e}"));
        anyhow::ensure!(ok, "{key} = {shown} is out of range: expected {range}");
        Ok(())
    };
    let (_, lr) = v.lr;
    check(v.lr, lr.is_finite() && lr > 0.0, "a finite number > 0")?;
    for b in [v.beta1, v.beta2].into_iter().flatten() {
        check(b, (0.0..1.0).contains(&b.1), "[0, 1)")?;
    }
    if let Some(e) = v.eps {
        check(
            e,
            e.1.is_finite() && e.1 > 0.0 && e.1 <= 1.0,
            "a finite number in (0, 1] (e.g. 1e-8)",
        )?;
    }
    let (_, wd) = v.weight_decay;
    check(
        v.weight_decay,
        wd.is_finite() && (0.0..=1e3).contains(&wd),
        "a finite number in [0, 1000] (AdamW's decoupled decay; 0.01 to 0.1 is usual)",
    )?;
    let (_, c) = v.grad_clip;
    check(
        v.grad_clip,
        c.is_finite() && c >= 0.0,
        "a finite number >= 0 (0 = off)",
    )
}

/// Where the gradient of one update is combined across processes before the norm is taken.
///
/// Called once per optimizer update with this process's gradient sums, one entry per parameter
/// in `Model::named_vars` order (`None`: no micro-batch reached that parameter), and whether this
/// process's part of the update was finite. A data-parallel implementation must leave in each
/// entry the sum over all processes (an all-reduce with `sum`; the loss normaliser is already
/// global, so no averaging) and in `finite` the AND over all processes, with every process calling
/// it in the same order: then every replica skips or applies the update together (a flag kept
/// per process let one rank skip an update the others applied, and the replicas diverged).
/// [`LocalReduce`] (one process) leaves both as they are.
pub trait GradReduce: Send {
    /// Combines `grads` and `finite` in place (see the trait docs).
    ///
    /// # Errors
    /// A failed collective (a peer died, a shape mismatch).
    fn reduce(&mut self, grads: &mut [Option<Tensor>], finite: &mut bool) -> anyhow::Result<()>;

    /// A sharded optimizer (ZeRO-1): the parameters this rank updates (it keeps their optimizer
    /// state; `reduce` left it their sums and `None` for the rest). `None`: every parameter.
    fn owned(&self) -> Option<&[bool]> {
        None
    }

    /// The global ‖g‖² from this rank's sum of squares over the gradients `reduce` left it:
    /// the identity when every rank holds every sum; summed over the ranks when sharded.
    ///
    /// # Errors
    /// A failed collective.
    fn norm_sq(&mut self, local: f64) -> anyhow::Result<f64> {
        Ok(local)
    }

    /// After an applied update: makes every rank's `params` the updated ones (sharded: each
    /// owner's are broadcast). Nothing to do otherwise.
    ///
    /// # Errors
    /// A failed collective.
    fn share_weights(&mut self, _params: &[Var]) -> anyhow::Result<()> {
        Ok(())
    }

    /// Sharded, for a checkpoint: parameter `i`'s `count` state tensors (its moments, then its
    /// master), given by its owner, returned on rank 0 (`None` elsewhere); every rank calls it for
    /// every parameter in order. Unsharded: `state` as it is.
    ///
    /// # Errors
    /// A failed collective.
    fn gather_to_root(
        &mut self,
        _i: usize,
        state: Option<&[Tensor]>,
        _count: usize,
    ) -> anyhow::Result<Option<Vec<Tensor>>> {
        Ok(state.map(<[Tensor]>::to_vec))
    }

    /// Whether the gradients are sharded too (ZeRO-2): each micro-batch's gradients go to their
    /// owners through [`GradReduce::reduce_micro_batch`] and the accumulation holds this rank's
    /// share only; `reduce` then combines the non-finite flags alone.
    fn shards_gradients(&self) -> bool {
        false
    }

    /// ZeRO-2, after each micro-batch's backward on every rank together: leaves in `grads` (one
    /// micro-batch's, `None` where it reached no parameter or the rank had no micro-batch) the
    /// sums over the ranks of this rank's own parameters and `None` elsewhere. The identity
    /// otherwise.
    ///
    /// # Errors
    /// A failed collective.
    fn reduce_micro_batch(&mut self, _grads: &mut [Option<Tensor>]) -> anyhow::Result<()> {
        Ok(())
    }

    /// The number of micro-batches this rank runs in the update when it has `local` of its own:
    /// ZeRO-2's per-micro-batch collectives need the same count on every rank (the largest);
    /// otherwise `local`.
    ///
    /// # Errors
    /// A failed collective.
    fn agree_micro_batches(&mut self, local: usize) -> anyhow::Result<usize> {
        Ok(local)
    }
}

/// ZeRO-1 and ZeRO-2 over a [`rlvr_dist::Communicator`] (`rlvr_dist::zero`'s module docs).
impl GradReduce for rlvr_dist::ZeroReduce {
    fn reduce(&mut self, grads: &mut [Option<Tensor>], finite: &mut bool) -> anyhow::Result<()> {
        Ok(rlvr_dist::ZeroReduce::reduce(self, grads, finite)?)
    }
    fn owned(&self) -> Option<&[bool]> {
        Some(rlvr_dist::ZeroReduce::owned(self))
    }
    fn norm_sq(&mut self, local: f64) -> anyhow::Result<f64> {
        Ok(rlvr_dist::ZeroReduce::norm_sq(self, local)?)
    }
    fn share_weights(&mut self, params: &[Var]) -> anyhow::Result<()> {
        Ok(rlvr_dist::ZeroReduce::share_weights(self, params)?)
    }
    fn gather_to_root(
        &mut self,
        i: usize,
        state: Option<&[Tensor]>,
        count: usize,
    ) -> anyhow::Result<Option<Vec<Tensor>>> {
        Ok(rlvr_dist::ZeroReduce::gather_to_root(
            self, i, state, count,
        )?)
    }
    fn shards_gradients(&self) -> bool {
        rlvr_dist::ZeroReduce::shards_gradients(self)
    }
    fn reduce_micro_batch(&mut self, grads: &mut [Option<Tensor>]) -> anyhow::Result<()> {
        Ok(rlvr_dist::ZeroReduce::reduce_micro_batch(self, grads)?)
    }
    fn agree_micro_batches(&mut self, local: usize) -> anyhow::Result<usize> {
        match rlvr_dist::ZeroReduce::shards_gradients(self) {
            true => Ok(rlvr_dist::ZeroReduce::agree_micro_batches(self, local)?),
            false => Ok(local),
        }
    }
}

/// The identity reduction of a single process.
#[derive(Debug, Clone, Copy, Default)]
pub struct LocalReduce;

impl GradReduce for LocalReduce {
    fn reduce(&mut self, _grads: &mut [Option<Tensor>], _finite: &mut bool) -> anyhow::Result<()> {
        Ok(())
    }
}

/// The data-parallel reduction over a [`rlvr_dist::Communicator`]: gradient sums and the
/// non-finite flag in one all-reduce per bucket.
impl GradReduce for rlvr_dist::DistReduce {
    fn reduce(&mut self, grads: &mut [Option<Tensor>], finite: &mut bool) -> anyhow::Result<()> {
        Ok(rlvr_dist::DistReduce::reduce(self, grads, finite)?)
    }
}

/// An applied update made a weight NaN or infinite: the training diverged, and every later step
/// would stay so. The weights are no longer the previous step's, so nothing of the update can be
/// saved or undone.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error(
    "the training diverged: the optimizer update made weight {weight} NaN or infinite; lower \
     the learning rate or clip the gradient norm"
)]
pub struct NonFiniteWeight {
    /// The first such weight, in `Model::named_vars` order (its checkpoint name).
    pub weight: String,
}

/// The index of the first of `vars` (in order) holding a value that is not finite, or `None`.
///
/// Cheap and exact: each parameter's sum (in its dtype, on its device) is added into one f32
/// total, read back once; a NaN or infinity anywhere makes the total non-finite, so a finite total
/// proves every value finite. Only when it is not finite (a diverged update, or finite values
/// whose sum overflows, beyond 10³⁸) is each parameter tested exactly, in order, by `x · 0`
/// (0 for a finite x, NaN otherwise) summed.
///
/// # Errors
/// Tensor errors.
pub fn first_non_finite(vars: &[Var]) -> anyhow::Result<Option<usize>> {
    let Some(first) = vars.first() else {
        return Ok(None);
    };
    let mut total = Tensor::zeros((), DType::F32, first.device())?;
    for v in vars {
        total = (total + v.as_tensor().sum_all()?.to_dtype(DType::F32)?)?;
    }
    if total.to_scalar::<f32>()?.is_finite() {
        return Ok(None);
    }
    for (i, v) in vars.iter().enumerate() {
        let zero = (v.as_tensor() * 0.0)?.sum_all()?.to_dtype(DType::F32)?;
        if !zero.to_scalar::<f32>()?.is_finite() {
            return Ok(Some(i));
        }
    }
    Ok(None)
}

/// The gradient of one update being accumulated (see [`OptimizerStep::accumulate`]).
pub struct Gradients {
    acc: Vec<GradAccumulator>,
    finite: bool,
}

impl Gradients {
    /// Marks the update as non-finite (a micro-batch's loss was NaN or infinite): it will be
    /// skipped by [`OptimizerStep::apply`].
    pub fn mark_non_finite(&mut self) {
        self.finite = false;
    }
}

/// AdamW over a model's parameters with global-norm clipping and a gradient reduction hook
/// (module docs).
pub struct OptimizerStep {
    vars: Vec<Var>,
    /// The parameters' names (`Model::named_vars`), for [`NonFiniteWeight`].
    names: Vec<String>,
    /// The AdamW state (moments, update count).
    pub adamw: AdamW,
    grad_clip: f64,
    reduce: Box<dyn GradReduce>,
    /// Sharded: the whole state brought to rank 0 for the checkpoint of the step just completed
    /// ([`OptimizerStep::gather_for_checkpoint`]); cleared by the next update.
    gathered: Option<OptimizerRecord>,
}

impl OptimizerStep {
    /// An optimizer over every parameter of `model` (`named_vars` order), clipping the global
    /// gradient norm to `grad_clip` (0 = off), with the single-process [`LocalReduce`].
    ///
    /// # Errors
    /// Tensor allocation errors (the moments).
    pub fn new(model: &Model, config: AdamWConfig, grad_clip: f64) -> anyhow::Result<Self> {
        let (names, vars): (Vec<String>, Vec<Var>) = model
            .named_vars()
            .into_iter()
            .map(|(n, v)| (n, v.clone()))
            .unzip();
        let mut adamw = AdamW::new(vars.clone(), config)?;
        adamw.set_fused(model.fused_adamw());
        Ok(OptimizerStep {
            adamw,
            vars,
            names,
            grad_clip,
            reduce: Box::new(LocalReduce),
            gathered: None,
        })
    }

    /// Replaces the gradient reduction (data-parallel training). A sharding reduction
    /// ([`GradReduce::owned`]) shards the AdamW state: the moments and masters of parameters
    /// another rank owns are freed.
    ///
    /// # Errors
    /// An ownership mask that does not fit the parameters.
    pub fn with_reduce(mut self, reduce: Box<dyn GradReduce>) -> anyhow::Result<Self> {
        if let Some(owned) = reduce.owned() {
            self.adamw.shard(owned)?;
        }
        self.reduce = reduce;
        Ok(self)
    }

    /// Whether the optimizer state is sharded over ranks (ZeRO-1).
    pub fn is_sharded(&self) -> bool {
        self.adamw.owned().is_some()
    }

    /// AdamW updates applied so far.
    pub fn update_count(&self) -> u64 {
        self.adamw.step
    }

    /// The optimizer's tensors for a checkpoint: the moments and masters (their handles, not
    /// copies). Sharded, the whole state [`OptimizerStep::gather_for_checkpoint`] brought to this
    /// rank (rank 0).
    ///
    /// # Errors
    /// A sharded state that was not gathered since the last update.
    pub fn record(&self) -> anyhow::Result<OptimizerRecord> {
        if !self.is_sharded() {
            let (m, v) = self.adamw.moments();
            return Ok(OptimizerRecord {
                m: m.to_vec(),
                v: v.to_vec(),
                masters: self.adamw.masters().to_vec(),
            });
        }
        self.gathered.clone().ok_or_else(|| {
            anyhow::anyhow!(
                "the optimizer state is sharded over the ranks (distributed.zero >= 1) and was not \
                 gathered: a checkpoint needs every rank (the last one written stays the last good \
                 one)"
            )
        })
    }

    /// Whether [`OptimizerStep::record`] can give the state now: unsharded, or sharded and
    /// gathered since the last update (a save after an error, which the other ranks do not
    /// join, cannot gather it).
    pub fn can_record(&self) -> bool {
        !self.is_sharded() || self.gathered.is_some()
    }

    /// Continues from a checkpoint's `record` after `update_count` updates.
    ///
    /// # Errors
    /// Moments or masters that do not fit the parameters.
    pub fn load_record(
        &mut self,
        record: OptimizerRecord,
        update_count: u64,
    ) -> anyhow::Result<()> {
        self.adamw.set_moments(record.m, record.v, update_count)?;
        self.adamw.set_masters(record.masters)?;
        Ok(())
    }

    /// For a checkpoint of a sharded optimizer: every parameter's state brought to rank 0, one
    /// parameter at a time, kept for [`OptimizerStep::record`]; every rank must call it. Unsharded:
    /// nothing to do.
    ///
    /// # Errors
    /// A failed collective.
    pub fn gather_for_checkpoint(&mut self) -> anyhow::Result<()> {
        self.gathered = self.gather_state()?;
        Ok(())
    }

    fn gather_state(&mut self) -> anyhow::Result<Option<OptimizerRecord>> {
        if !self.is_sharded() {
            return Ok(None);
        }
        let owned: Vec<bool> = self.adamw.owned().map(<[bool]>::to_vec).unwrap_or_default();
        let (mut m, mut v, mut masters) = (Vec::new(), Vec::new(), Vec::new());
        let mut root = true;
        for (i, p) in self.vars.iter().enumerate() {
            let with_master = rlvr_model::optim::needs_master(p.dtype());
            let count = 2 + usize::from(with_master);
            let state = owned[i].then(|| {
                let (am, av) = self.adamw.moments();
                let mut s = vec![am[i].clone(), av[i].clone()];
                if let Some(w) = &self.adamw.masters()[i] {
                    s.push(w.clone());
                }
                s
            });
            match self.reduce.gather_to_root(i, state.as_deref(), count)? {
                Some(mut s) if s.len() == count => {
                    let master = with_master.then(|| s.pop()).flatten();
                    let sv = s.pop();
                    let sm = s.pop();
                    m.extend(sm);
                    v.extend(sv);
                    masters.push(master);
                }
                Some(s) => anyhow::bail!(
                    "parameter {i}: {} state tensors gathered, {count} expected",
                    s.len()
                ),
                None => root = false,
            }
        }
        Ok(root.then_some(OptimizerRecord { m, v, masters }))
    }

    /// An empty gradient for a new update.
    pub fn gradients(&self) -> Gradients {
        Gradients {
            acc: self.vars.iter().map(|_| Default::default()).collect(),
            finite: true,
        }
    }

    /// Backpropagates `loss` (a scalar already weighted by the update's normaliser) and adds its
    /// gradient to `g` (summed in f32).
    ///
    /// ZeRO-2 ([`GradReduce::shards_gradients`]): the micro-batch's gradients are first reduced
    /// to their owners, on every rank together, and this rank adds only the sums of its own
    /// parameters; the others' are dropped at once. Every rank must then make the same number of
    /// calls to this and [`OptimizerStep::accumulate_nothing`] per update
    /// ([`OptimizerStep::agree_micro_batches`]).
    ///
    /// # Errors
    /// Tensor errors; a failed collective.
    pub fn accumulate(&mut self, g: &mut Gradients, loss: &Tensor) -> anyhow::Result<()> {
        // Tensor::backward plus the weight gradients of checkpointed decoder layers.
        let mut grads = rlvr_model::recompute::backward(loss)?;
        if !self.reduce.shards_gradients() {
            for (k, v) in self.vars.iter().enumerate() {
                if let Some(x) = grads.get(v.as_tensor()) {
                    g.acc[k].add(x)?;
                }
            }
            return Ok(());
        }
        let mut mine: Vec<Option<Tensor>> = self
            .vars
            .iter()
            .map(|v| grads.remove(v.as_tensor()))
            .collect();
        // The backward's other gradients (activations') are not needed.
        drop(grads);
        self.add_reduced(g, &mut mine)
    }

    /// A micro-batch this rank has no gradient for (no rows left, a skipped forward, a
    /// non-finite loss): nothing to add, except under ZeRO-2, where it takes part in the other
    /// ranks' reduction with zeros and adds the sums of its own parameters.
    ///
    /// # Errors
    /// A failed collective.
    pub fn accumulate_nothing(&mut self, g: &mut Gradients) -> anyhow::Result<()> {
        if !self.reduce.shards_gradients() {
            return Ok(());
        }
        let mut none: Vec<Option<Tensor>> = vec![None; self.vars.len()];
        self.add_reduced(g, &mut none)
    }

    /// ZeRO-2: the micro-batch's `grads` reduced to their owners, this rank's share added to `g`.
    fn add_reduced(
        &mut self,
        g: &mut Gradients,
        grads: &mut [Option<Tensor>],
    ) -> anyhow::Result<()> {
        self.reduce.reduce_micro_batch(grads)?;
        for (acc, x) in g.acc.iter_mut().zip(grads.iter_mut()) {
            if let Some(x) = x.take() {
                acc.add(&x)?;
            }
        }
        Ok(())
    }

    /// The number of micro-batches to run in an update where this rank has `local`: `local`,
    /// or under ZeRO-2 the largest over the ranks (one collective; every rank must call it once
    /// per update, before its micro-batches), the ones past `local` passed to
    /// [`OptimizerStep::accumulate_nothing`].
    ///
    /// # Errors
    /// A failed collective.
    pub fn agree_micro_batches(&mut self, local: usize) -> anyhow::Result<usize> {
        self.reduce.agree_micro_batches(local)
    }

    /// Reduces, measures, clips and applies `g` with learning rate `lr` (module docs). Returns
    /// the global gradient norm before clipping, or `None` when the update was skipped (a
    /// non-finite loss or norm: the weights and moments are untouched).
    ///
    /// A parameter no micro-batch reached gets an explicit zero gradient: its moments still
    /// decay and weight decay still applies, as in an update that computed it.
    ///
    /// # Errors
    /// Tensor errors and [`GradReduce`] failures; [`NonFiniteWeight`] when the applied update
    /// made a weight NaN or infinite. Every parameter is checked after the update is shared, so
    /// with data parallel (ZeRO-1 included: each rank updates its shard, then every rank holds
    /// the whole updated model) every rank reaches the same verdict on the same weights.
    pub fn apply(&mut self, g: Gradients, lr: f64) -> anyhow::Result<Option<f64>> {
        self.gathered = None;
        let mut sums: Vec<Option<Tensor>> = g.acc.into_iter().map(|a| a.take()).collect();
        let mut finite = g.finite;
        self.reduce.reduce(&mut sums, &mut finite)?;
        let present: Vec<&Tensor> = sums.iter().flatten().collect();
        let sq = rlvr_model::optim::grad_sumsq(&present, self.adamw.fused())?;
        drop(present);
        let sq = self.reduce.norm_sq(sq)?;
        let grad_norm = sq.sqrt();
        if !finite || !grad_norm.is_finite() {
            return Ok(None);
        }
        let clip = self.grad_clip;
        let scale = if clip > 0.0 && grad_norm > clip {
            clip / (grad_norm + 1e-6)
        } else {
            1.0
        };
        let owned = self.adamw.owned().map(<[bool]>::to_vec);
        let mut store = GradStore::default();
        for (k, (v, s)) in self.vars.iter().zip(sums).enumerate() {
            if owned.as_ref().is_some_and(|o| !o[k]) {
                // Sharded: another rank updates it and shares the result below.
                continue;
            }
            // The clipping factor is applied by the update (AdamW::step_scaled).
            let s = match s {
                Some(s) => s,
                None => Tensor::zeros(v.shape(), DType::F32, v.device())?,
            };
            store.insert(v.as_tensor(), s);
        }
        self.adamw.step_scaled(&store, lr, scale)?;
        drop(store);
        self.reduce.share_weights(&self.vars)?;
        if let Some(i) = first_non_finite(&self.vars)? {
            return Err(NonFiniteWeight {
                weight: self.names[i].clone(),
            }
            .into());
        }
        Ok(Some(grad_norm))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;

    fn tiny() -> Model {
        let config = rlvr_model::ModelConfig::from_json(
            &serde_json::json!({"model_type": "qwen2", "vocab_size": 16, "hidden_size": 8,
                "intermediate_size": 16, "num_hidden_layers": 1, "num_attention_heads": 2,
                "num_key_value_heads": 1, "max_position_embeddings": 16}),
            "inline".as_ref(),
        )
        .unwrap();
        Model::random(config, 0.02, 0, DType::F32, &Device::Cpu).unwrap()
    }

    fn loss(m: &Model, scale: f64) -> Tensor {
        let out = m
            .token_logprobs(
                &[vec![1, 2, 3, 4]],
                &[vec![1, 1, 1, 1]],
                0,
                1.0,
                false,
                true,
            )
            .unwrap();
        (out.logprobs.sum_all().unwrap() * scale).unwrap()
    }

    /// A reduction that doubles every gradient stands in for a two-process all-reduce of equal
    /// halves: the norm it reports is twice the single-process one.
    struct Double;
    impl GradReduce for Double {
        fn reduce(&mut self, grads: &mut [Option<Tensor>], _: &mut bool) -> anyhow::Result<()> {
            for g in grads.iter_mut().flatten() {
                *g = (&*g * 2.0)?;
            }
            Ok(())
        }
    }

    #[test]
    fn reduce_hook_runs_before_the_norm_and_non_finite_updates_are_skipped() {
        let cfg = AdamWConfig::default();
        let m1 = tiny();
        let mut one = OptimizerStep::new(&m1, cfg, 0.0).unwrap();
        let mut g = one.gradients();
        one.accumulate(&mut g, &loss(&m1, 1.0)).unwrap();
        let n1 = one.apply(g, 1e-3).unwrap().unwrap();
        let m2 = tiny();
        let mut two = OptimizerStep::new(&m2, cfg, 0.0)
            .unwrap()
            .with_reduce(Box::new(Double))
            .unwrap();
        let mut g = two.gradients();
        two.accumulate(&mut g, &loss(&m2, 1.0)).unwrap();
        let n2 = two.apply(g, 1e-3).unwrap().unwrap();
        assert!(n1 > 0.0 && (n2 / n1 - 2.0).abs() < 1e-6, "{n1} {n2}");

        let before = m1.named_vars()[0].1.as_tensor().to_vec2::<f32>().unwrap();
        let mut g = one.gradients();
        one.accumulate(&mut g, &loss(&m1, 1.0)).unwrap();
        g.mark_non_finite();
        assert_eq!(one.apply(g, 1e-3).unwrap(), None);
        assert_eq!(one.adamw.step, 1);
        let after = m1.named_vars()[0].1.as_tensor().to_vec2::<f32>().unwrap();
        assert_eq!(before, after);
    }

    /// `kernels.adamw = "on"` on the CPU: the clipped update (the factor applied by
    /// `AdamW::step_scaled`) and its norm are those of the plain optimizer, bit for bit; the
    /// clip did act (the norm is over it).
    #[test]
    fn fused_adamw_switch_leaves_the_cpu_update_bit_identical() {
        let cfg = AdamWConfig::default();
        let run = |fused: bool| -> (Vec<f64>, Vec<Vec<u32>>) {
            let mut m = tiny();
            if fused {
                m.set_kernels(rlvr_model::KernelSwitches {
                    adamw: rlvr_model::Switch::On,
                    ..Default::default()
                });
            }
            let mut o = OptimizerStep::new(&m, cfg, 0.05).unwrap();
            assert_eq!(o.adamw.fused(), fused);
            let mut norms = Vec::new();
            for _ in 0..3 {
                let mut g = o.gradients();
                o.accumulate(&mut g, &loss(&m, 1.0)).unwrap();
                norms.push(o.apply(g, 1e-2).unwrap().unwrap());
            }
            let bits = (m.named_vars().into_iter())
                .map(|(_, v)| {
                    let x = v
                        .as_tensor()
                        .flatten_all()
                        .unwrap()
                        .to_vec1::<f32>()
                        .unwrap();
                    x.iter().map(|x| x.to_bits()).collect()
                })
                .collect();
            (norms, bits)
        };
        let (plain, fused) = (run(false), run(true));
        assert!(plain.0.iter().all(|n| *n > 0.05), "{:?}", plain.0);
        assert_eq!(plain, fused);
    }

    /// `first_non_finite` is exact: a NaN, +inf or −inf in any parameter of any dtype is found
    /// (the first, in order), and finite values whose sums overflow f32 (3e38 twice) are not
    /// taken for infinite.
    #[test]
    fn first_non_finite_finds_exactly_the_non_finite_parameters() {
        let var = |x: &[f32], dt: DType| {
            let t = Tensor::new(x, &Device::Cpu).unwrap().to_dtype(dt).unwrap();
            Var::from_tensor(&t).unwrap()
        };
        let ok = |dt| var(&[1.0, -2.0, 0.5], dt);
        let huge = |dt| var(&[3e38, 3e38, -1.0], dt);
        for dt in [DType::F32, DType::BF16, DType::F64] {
            assert_eq!(
                first_non_finite(&[ok(dt), huge(dt)]).unwrap(),
                None,
                "{dt:?}"
            );
            for bad in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
                let b = var(&[0.0, bad, 1.0], dt);
                let vars = [ok(dt), huge(dt), b.clone(), b];
                assert_eq!(first_non_finite(&vars).unwrap(), Some(2), "{dt:?} {bad}");
            }
        }
        // +inf in one parameter and −inf in another: their sum is NaN, still found.
        let vars = [
            var(&[f32::INFINITY], DType::F32),
            var(&[f32::NEG_INFINITY], DType::F32),
        ];
        assert_eq!(first_non_finite(&vars).unwrap(), Some(0));
        assert_eq!(first_non_finite(&[]).unwrap(), None);
    }

    /// An update that makes a weight non-finite (a learning rate past f32's range: the loss and
    /// gradient are finite) is an error naming the weight, for f32 weights, bf16 weights with
    /// f32 masters and LoRA adapters alike; a sane update passes the same check. Before, the
    /// update returned a norm and the run went on with NaN weights.
    #[test]
    fn an_update_that_makes_a_weight_non_finite_is_an_error_naming_it() {
        let cfg = AdamWConfig::default();
        let lora = |m: &mut Model| {
            let c = rlvr_model::LoraConfig {
                rank: 2,
                alpha: 4.0,
                targets: rlvr_model::LoraTarget::ALL.to_vec(),
                dropout: 0.0,
            };
            m.add_lora(&c, 5).unwrap();
        };
        let models: [(&str, DType, bool); 3] = [
            ("f32", DType::F32, false),
            ("bf16", DType::BF16, false),
            ("lora", DType::F32, true),
        ];
        for (what, dt, adapters) in models {
            let mut m = Model::random(tiny().config().clone(), 0.02, 0, dt, &Device::Cpu).unwrap();
            if adapters {
                lora(&mut m);
            }
            let mut o = OptimizerStep::new(&m, cfg, 0.0).unwrap();
            let mut g = o.gradients();
            o.accumulate(&mut g, &loss(&m, 1.0)).unwrap();
            assert!(o.apply(g, 1e-3).unwrap().is_some(), "{what}");
            let mut g = o.gradients();
            o.accumulate(&mut g, &loss(&m, 1.0)).unwrap();
            let e = o.apply(g, 1e39).unwrap_err();
            let w = e
                .downcast_ref::<NonFiniteWeight>()
                .expect("NonFiniteWeight");
            let names: Vec<String> = m.named_vars().into_iter().map(|(n, _)| n).collect();
            assert!(names.contains(&w.weight), "{what}: {w:?} not in {names:?}");
            if adapters {
                assert!(w.weight.contains("lora"), "{what}: {}", w.weight);
            }
            assert!(e.to_string().contains("the training diverged"), "{e}");
        }
    }

    /// Two micro-batches of half the loss give the gradient of one full micro-batch.
    #[test]
    fn accumulation_sums_micro_batch_gradients() {
        let cfg = AdamWConfig::default();
        let m = tiny();
        let mut o = OptimizerStep::new(&m, cfg, 0.0).unwrap();
        let mut g = o.gradients();
        o.accumulate(&mut g, &loss(&m, 0.5)).unwrap();
        o.accumulate(&mut g, &loss(&m, 0.5)).unwrap();
        let mut whole = o.gradients();
        o.accumulate(&mut whole, &loss(&m, 1.0)).unwrap();
        let n_half = o.apply(g, 0.0).unwrap().unwrap();
        let n_whole = o.apply(whole, 0.0).unwrap().unwrap();
        assert!(
            (n_half - n_whole).abs() < 1e-6 * n_whole,
            "{n_half} {n_whole}"
        );
    }
}
