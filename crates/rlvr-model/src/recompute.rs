//! Activation checkpointing (gradient checkpointing): a decoder layer's forward keeps no
//! activations for the backward; the backward runs the layer's forward again, with the graph, and
//! backpropagates through that, trading one more forward for the memory of the activations
//! (transformers' `gradient_checkpointing_enable`, which wraps
//! each decoder layer in `torch.utils.checkpoint`).
//!
//! How, in candle (which has no checkpoint primitive): the layer runs once without a graph, giving
//! `y`; a custom op [`Recompute`] of the layer's input `x` returns a copy of `y` and records only `x`
//! for the backward. Its backward recomputes `y' = layer(x)` with the graph (x as a fresh leaf),
//! backpropagates `Σ y'·∂L/∂y` and returns `∂L/∂x`. The layer's weight gradients found there are
//! not the custom op's to return (it has one argument): they go to a per-thread sink that
//! [`backward`] merges into the outer gradient store. So every gradient equals the plain path's up
//! to float reassociation, and the graph holds one `[B, T, hidden]` tensor per layer instead of the
//! layer's attention scores, probabilities, projections and MLP activations.
//!
//! Use [`backward`] instead of `Tensor::backward` for a loss that may pass through a checkpointed
//! forward ([`crate::Model::set_gradient_checkpointing`]); it is `Tensor::backward` otherwise.

use std::cell::RefCell;
use std::sync::Mutex;

use candle_core::backprop::GradStore;
use candle_core::{CpuStorage, CustomOp1, Layout, Shape, Storage, Tensor, TensorId, Var};

use crate::layers::{AttnMask, DecoderLayer, Rope};
use crate::param::Pass;

thread_local! {
    // Weight gradients found by `Recompute::bwd` during the backward running on this thread.
    static SINK: RefCell<Vec<(TensorId, Tensor)>> = const { RefCell::new(Vec::new()) };
}

/// Backpropagates `loss` like `Tensor::backward`, then adds the weight gradients that checkpointed
/// layers computed during it (module docs).
///
/// Errors: candle errors of the backward or of the sums.
pub fn backward(loss: &Tensor) -> candle_core::Result<GradStore> {
    SINK.with(|s| s.borrow_mut().clear());
    let mut grads = loss.backward()?;
    let found = SINK.with(|s| std::mem::take(&mut *s.borrow_mut()));
    for (id, g) in found {
        let sum = match grads.get_id(id) {
            Some(prev) => (prev + &g)?,
            None => g,
        };
        grads.insert_id(id, sum);
    }
    Ok(grads)
}

/// The checkpointed forward of one decoder layer: `x` `[B, T, hidden]` with the graph, `rope` and
/// `mask` as for [`DecoderLayer::forward`] (no KV cache: training only), `base` whether the base
/// weights train (false with LoRA adapters: only they get gradients). Returns the layer's output,
/// tracked through `x` only.
///
/// Errors: candle errors of the layer's forward.
pub(crate) fn checkpointed(
    layer: &DecoderLayer,
    x: &Tensor,
    rope: &Rope,
    mask: &AttnMask,
    base: bool,
) -> candle_core::Result<Tensor> {
    let plain = Pass {
        grad: false,
        base: false,
        fast: false,
        dropout: true,
    };
    // LoRA dropout: the recompute draws the masks this pass draws, since they are keyed by the
    // round and the tokens' keys that `rope` carries (`crate::lora::DropoutKeys`).
    let y = layer
        .forward(&x.detach(), rope, mask, None, plain)
        .map_err(candle_core::Error::wrap)?;
    // With a frozen base (LoRA) the first layer's input carries no graph; the op must still be
    // recorded for the adapters' gradients, so the input becomes a leaf (its gradient is unused).
    let x = if x.track_op() {
        x.clone()
    } else {
        Var::from_tensor(x)?.as_tensor().clone()
    };
    x.apply_op1(Recompute {
        layer: layer.clone(),
        rope: rope.clone(),
        mask: mask.clone(),
        base,
        out: Mutex::new(Some(y)),
    })
}

/// The custom op of [`checkpointed`]: forward hands out the precomputed output, backward recomputes.
struct Recompute {
    layer: DecoderLayer,
    rope: Rope,
    mask: AttnMask,
    /// Whether the base weights train (else only LoRA adapters do).
    base: bool,
    /// The output computed without a graph; taken by the forward (so the op does not keep it).
    out: Mutex<Option<Tensor>>,
}

impl Recompute {
    fn take(&self) -> candle_core::Result<Tensor> {
        self.out
            .lock()
            .map_err(|_| candle_core::Error::Msg("recompute: poisoned lock".into()))?
            .take()
            .ok_or_else(|| candle_core::Error::Msg("recompute: forward ran twice".into()))
    }
}

/// The whole storage of a fresh output (contiguous from offset 0), or an error.
fn check_fresh(l: &Layout) -> candle_core::Result<()> {
    match l.contiguous_offsets() {
        Some((0, _)) => Ok(()),
        _ => Err(candle_core::Error::Msg(
            "recompute: the layer's output is not a fresh contiguous tensor".into(),
        )),
    }
}

impl CustomOp1 for Recompute {
    fn name(&self) -> &'static str {
        "recompute-decoder-layer"
    }

    fn cpu_fwd(&self, _x: &CpuStorage, _l: &Layout) -> candle_core::Result<(CpuStorage, Shape)> {
        let y = self.take()?;
        let (st, l) = y.storage_and_layout();
        check_fresh(l)?;
        match &*st {
            Storage::Cpu(c) => Ok((c.clone(), l.shape().clone())),
            _ => Err(candle_core::Error::Msg(
                "recompute: output on another device".into(),
            )),
        }
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        _x: &candle_core::CudaStorage,
        _l: &Layout,
    ) -> candle_core::Result<(candle_core::CudaStorage, Shape)> {
        use candle_core::backend::BackendStorage;
        let y = self.take()?;
        let (st, l) = y.storage_and_layout();
        check_fresh(l)?;
        match &*st {
            Storage::Cuda(c) => Ok((c.try_clone(l)?, l.shape().clone())),
            _ => Err(candle_core::Error::Msg(
                "recompute: output on another device".into(),
            )),
        }
    }

    fn bwd(
        &self,
        x: &Tensor,
        _res: &Tensor,
        grad_res: &Tensor,
    ) -> candle_core::Result<Option<Tensor>> {
        let leaf = Var::from_tensor(&x.detach())?;
        let graph = Pass {
            grad: true,
            base: self.base,
            fast: false,
            dropout: true,
        };
        // Same dropout masks as the first pass: the same keys, carried by `rope`.
        let y = self
            .layer
            .forward(leaf.as_tensor(), &self.rope, &self.mask, None, graph)
            .map_err(candle_core::Error::wrap)?;
        // ∂(Σ y·g)/∂y = g exactly, whatever the precision of the sum itself.
        let grads = (y * grad_res.detach())?.sum_all()?.backward()?;
        let mut params = Vec::new();
        self.layer.params(&mut params);
        // Every adapter, Phi-3's on the fused modules too.
        for (_, _, a) in self.layer.adapter_slots() {
            params.extend(a.iter().flat_map(|a| [&a.a, &a.b]));
        }
        SINK.with(|s| {
            let mut s = s.borrow_mut();
            for p in params {
                let w = p.var.as_tensor();
                if let Some(g) = grads.get(w) {
                    s.push((w.id(), g.clone()));
                }
            }
        });
        Ok(grads.get(leaf.as_tensor()).cloned())
    }
}
