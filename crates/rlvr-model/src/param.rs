//! The handles every block shares: a weight ([`Param`]: its checkpoint name, its trainable `Var`
//! and a detached view of the same storage) and how a forward runs ([`Pass`]). They sit below
//! both the decoder's blocks (`layers`) and the LoRA adapters (`lora`), which hold and run
//! weights of their own.

use candle_core::{Tensor, Var};

/// How a forward runs: with the autograd graph (`grad`), through the base weights too (`base`:
/// false when only LoRA adapters train, so the frozen base gets no gradient), whether the
/// decode fast path may be used (`fast`: cached inference, never with `grad`), and whether LoRA
/// dropout applies (`dropout`: training forwards, including a checkpointed layer's first pass,
/// which runs without a graph but must see the masks its recompute will see).
#[derive(Clone, Copy)]
pub(crate) struct Pass {
    pub grad: bool,
    pub base: bool,
    pub fast: bool,
    pub dropout: bool,
}

/// One weight: its checkpoint name, the trainable [`Var`] and a detached handle on the same
/// storage (for forwards without a graph; in-place updates of the `Var` are seen through it).
#[derive(Clone)]
pub(crate) struct Param {
    pub name: String,
    pub var: Var,
    frozen: Tensor,
}

impl Param {
    pub(crate) fn new(name: String, var: Var) -> Self {
        let frozen = var.as_tensor().detach();
        Self { name, var, frozen }
    }

    /// The weight, tracked by autograd when `grad`.
    pub fn get(&self, grad: bool) -> &Tensor {
        if grad {
            self.var.as_tensor()
        } else {
            &self.frozen
        }
    }
}
