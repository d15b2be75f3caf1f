//! The sampler's fused decode step (issue 50, `kernels.decode`): one decode step of every row as
//! a fixed list of launches over preallocated buffers ([`StepProgram`]), so that the same list
//! can run eagerly or be captured once as a CUDA graph and replayed (`rlvr_kernels::graph`).
//!
//! Per layer (the Qwen2/Llama layout, and Qwen3's with its q/k norms; LoRA adapters as two more
//! products per adapted projection):
//!
//! 1. `rmsnorm_fwd` (layer 0 only: later layers get their input norm from the previous layer's
//!    last `rmsnorm_add_fwd`);
//! 2. the q, k, v projections (cuBLAS; a bias as a rank-1 product accumulated into the output;
//!    a LoRA adapter as `T = x·Aᵀ` then `out += (α/r)·T·Bᵀ`, every projection alike);
//!    Qwen3: `rmsnorm_fwd` over each head of q, then of k (rows of `head_dim`, the weights
//!    `q_norm`/`k_norm`);
//! 3. `decode_rope_kv`: the rotary embedding of q and k, k and v written into the cache at each
//!    row's column;
//! 4. `decode_attn` + `decode_attn_combine`: split-KV attention over each row's cache;
//! 5. the o projection; `rmsnorm_add_fwd` (the residual add with the post-attention norm);
//! 6. the gate and up projections, `swiglu_fwd`, the down projection;
//! 7. `rmsnorm_add_fwd`: the residual add with the next layer's input norm, or with the final
//!    norm after the last layer; then the head (one projection to the vocabulary).
//!
//! Everything a step changes is in device buffers written before the step (the new tokens'
//! embeddings in `X0`, the rows' positions, cache columns and lengths); grids and scalars are
//! functions of the shapes, so the list is the same at every step of a wave.
//!
//! What runs where:
//! - [`StepProgram::build`]: plain Rust, the same on every device (tested on the CPU: order,
//!   arguments, buffer sizes).
//! - [`StepProgram::run_host`]: the program's host emulation in f32 (each Triton kernel's
//!   semantics as `kernels/src` documents them, the projections as plain products): tested
//!   against the candle decode step on the CPU, and, under a [`Recorder`], writing each
//!   kernel's launch with the emulation's inputs and outputs, which `scripts/ci_kernels.sh`
//!   replays under Triton's interpreter (so the kernels are held to the same values the
//!   emulation is held to).
//! - `fused_cuda` (feature `cuda`): the program on candle's CUDA stream (cuBLAS for the
//!   projections, `rlvr_kernels::triton::cuda::launch` for the kernels) and its graph capture.

use std::collections::{BTreeMap, BTreeSet};

use candle_core::{DType, Tensor};
use rlvr_kernels::triton::families::decode::{self, Decode, SplitRule};
use rlvr_kernels::triton::families::{rmsnorm, swiglu};
use rlvr_kernels::triton::{self, HostBuffer, LaunchPlan, Manifest, Recorder, Target, Tolerance};
use rlvr_model::{Arch, Model, ModelError};

use crate::decode::KvBuffer;
use crate::error::Result;

/// A weight of the model, by where it sits.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Weight {
    /// `model.layers.{layer}.{name}` (e.g. `self_attn.q_proj.weight`).
    Layer(usize, &'static str),
    /// `model.norm.weight`.
    FinalNorm,
    /// The lm_head weight `[vocab, hidden]` (the embedding when tied).
    Head,
    /// Layer `l`'s LoRA factor A `[rank, in]` of projection `path` (e.g. `self_attn.q_proj`), in
    /// the model's dtype (the adapters are f32: a bf16 model's step reads a bf16 copy made when
    /// the step is built).
    LoraA(usize, &'static str),
    /// The LoRA factor B `[out, rank]`; see [`Weight::LoraA`].
    LoraB(usize, &'static str),
}

impl Weight {
    /// The checkpoint name (`Model::var`'s), `None` for the head (`Model::head_weight`).
    pub fn name(&self) -> Option<String> {
        match self {
            Weight::Layer(l, n) => Some(format!("model.layers.{l}.{n}")),
            Weight::FinalNorm => Some("model.norm.weight".into()),
            Weight::Head => None,
            Weight::LoraA(l, p) => Some(format!(
                "base_model.model.model.layers.{l}.{p}.lora_A.weight"
            )),
            Weight::LoraB(l, p) => Some(format!(
                "base_model.model.model.layers.{l}.{p}.lora_B.weight"
            )),
        }
    }
}

/// One buffer of the step. Shapes (rows = the program's rows, the model's dtype unless f32 or
/// i32 is said): [`StepShape::spec`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Buf {
    /// The residual stream `[rows, hidden]`, two buffers used in turn (`X(0)` holds the new
    /// tokens' embeddings at the start of a step).
    X(u8),
    /// The normed hidden state `[rows, hidden]`.
    H,
    /// The norms' `1/rms` per row `[rows]` f32 (scratch).
    Rstd,
    /// The projections' outputs `[rows, q_heads·hd]`, `[rows, kv_heads·hd]`.
    Q,
    /// See [`Buf::Q`].
    K,
    /// See [`Buf::Q`].
    V,
    /// The rotated query `[rows, q_heads·hd]`.
    QRot,
    /// Qwen3: the per-head normed query `[rows, q_heads·hd]` and key `[rows, kv_heads·hd]`.
    QNorm,
    /// See [`Buf::QNorm`].
    KNorm,
    /// Qwen3: the head norms' `1/rms` per row and head, `[rows·q_heads]` and `[rows·kv_heads]`
    /// f32 (scratch).
    QRstd,
    /// See [`Buf::QRstd`].
    KRstd,
    /// A LoRA adapter's low-rank activations `x·Aᵀ` `[rows, rank]` (scratch).
    LoraT,
    /// The attention's per-split outputs `[rows, q_heads, n_splits, hd]` f32.
    OPart,
    /// The attention's per-split base-2 log-sum-exp `[rows, q_heads, n_splits]` f32.
    LsePart,
    /// The attention's output `[rows, q_heads·hd]`.
    Attn,
    /// The o projection's output `[rows, hidden]`.
    AttnOut,
    /// The gate and up projections' outputs and the gated activation `[rows, intermediate]`.
    Gate,
    /// See [`Buf::Gate`].
    Up,
    /// See [`Buf::Gate`].
    Act,
    /// The down projection's output `[rows, hidden]`.
    MlpOut,
    /// The head's output `[rows, vocab]`.
    Logits,
    /// Ones `[rows]`: the left factor of a bias's rank-1 product.
    Ones,
    /// Each row's rotary position `[rows]` i32.
    Pos,
    /// Each row's new cache column `[rows]` i32.
    Cols,
    /// Each row's attention length `[rows]` i32.
    Lens,
    /// The attention bias `[rows, capacity]` f32 (0 or the mask value).
    Bias,
    /// The rotary tables `[max_pos, hd]` f32 (the model's, rounded as its dtype rounds them).
    Cos,
    /// See [`Buf::Cos`].
    Sin,
    /// Layer l's key cache `[rows, kv_heads, capacity, hd]`.
    KCache(usize),
    /// Layer l's value cache.
    VCache(usize),
    /// A weight of the model.
    W(Weight),
}

/// The shapes one program is built for.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct StepShape {
    /// Rows of the step (a batch-size bucket).
    pub rows: usize,
    /// Cache columns per row.
    pub capacity: usize,
    /// The model's hidden size, heads, head dim, MLP width, vocabulary, layers.
    pub hidden: usize,
    /// Query heads.
    pub q_heads: usize,
    /// Key/value heads.
    pub kv_heads: usize,
    /// Head dimension.
    pub head_dim: usize,
    /// MLP width.
    pub intermediate: usize,
    /// Vocabulary.
    pub vocab: usize,
    /// Decoder layers.
    pub layers: usize,
    /// Rows of the rotary tables (the model's `max_position_embeddings`).
    pub max_pos: usize,
    /// RMSNorm epsilon.
    pub eps: f32,
    /// The kernels' dtype (the model's: f32 or bf16).
    pub dtype: triton::DType,
    /// Which projections carry a bias.
    pub qkv_bias: bool,
    /// See [`StepShape::qkv_bias`].
    pub o_bias: bool,
    /// See [`StepShape::qkv_bias`].
    pub mlp_bias: bool,
    /// Qwen3's RMSNorm over each head of q and k before the rotary embedding.
    pub qk_norm: bool,
    /// The LoRA adapters, when attached.
    pub lora: Option<LoraShape>,
}

/// The LoRA adapters a step runs: every layer has the same targets.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LoraShape {
    /// r.
    pub rank: usize,
    /// α / r.
    pub scale: f32,
    /// Bit i set: an adapter acts on `rlvr_model::LoraTarget::ALL[i]`, its own or (Phi-3) the
    /// fused module's whose rows hold it ([`rlvr_model::Model::lora_factors`]).
    pub targets: u8,
}

impl LoraShape {
    /// Whether projection `path` (e.g. `self_attn.q_proj`) has an adapter.
    pub fn covers(&self, path: &str) -> bool {
        let module = path.rsplit('.').next().unwrap_or(path);
        (rlvr_model::LoraTarget::ALL.iter())
            .position(|t| t.module() == module)
            .is_some_and(|i| self.targets & (1 << i) != 0)
    }
}

impl StepShape {
    /// The shapes of `model`'s step at `rows` rows and `capacity` cache columns.
    ///
    /// Errors: what the fused step does not cover (a dtype other than f32/bf16), zero rows or
    /// capacity.
    pub fn of(model: &Model, rows: usize, capacity: usize) -> Result<Self> {
        let c = model.config();
        let bad = |why: String| -> Result<Self> {
            Err(ModelError::Invalid(format!("fused decode step: {why}")).into())
        };
        let dtype = match model.dtype() {
            DType::F32 => triton::DType::Fp32,
            DType::BF16 => triton::DType::Bf16,
            other => return bad(format!("{other:?} (the kernels are f32 and bf16)")),
        };
        if rows == 0 || capacity == 0 {
            return bad(format!("{rows} rows × {capacity} columns"));
        }
        Ok(StepShape {
            rows,
            capacity,
            hidden: c.hidden_size,
            q_heads: c.num_attention_heads,
            kv_heads: c.num_key_value_heads,
            head_dim: c.head_dim,
            intermediate: c.intermediate_size,
            vocab: c.vocab_size,
            layers: c.num_hidden_layers,
            max_pos: c.max_position_embeddings,
            eps: c.rms_norm_eps as f32,
            dtype,
            qkv_bias: c.qkv_bias,
            o_bias: c.o_bias,
            mlp_bias: c.mlp_bias,
            qk_norm: c.arch == Arch::Qwen3,
            lora: model.lora_config().map(|l| LoraShape {
                rank: l.rank,
                scale: l.scale() as f32,
                targets: (rlvr_model::LoraTarget::ALL.iter().enumerate())
                    .filter(|(_, t)| {
                        l.targets.contains(t)
                            || t.fused_in().is_some_and(|f| l.targets.contains(&f))
                    })
                    .fold(0u8, |m, (i, _)| m | (1 << i)),
            }),
        })
    }

    fn decode(&self) -> Decode {
        Decode {
            rows: self.rows,
            q_heads: self.q_heads,
            kv_heads: self.kv_heads,
            head_dim: self.head_dim,
            capacity: self.capacity,
            fused_qkv: false,
            softmax_scale: 1.0 / (self.head_dim as f32).sqrt(),
        }
    }

    /// The dtype and shape of a non-weight buffer (`n_splits`: the attention's split axis).
    pub fn spec(&self, b: Buf, n_splits: usize) -> (triton::DType, Vec<usize>) {
        use triton::DType::{Fp32, I32};
        let (r, dt) = (self.rows, self.dtype);
        let (qd, kd) = (self.q_heads * self.head_dim, self.kv_heads * self.head_dim);
        match b {
            Buf::X(_) | Buf::H | Buf::AttnOut | Buf::MlpOut => (dt, vec![r, self.hidden]),
            Buf::Rstd => (Fp32, vec![r]),
            Buf::Q | Buf::QRot | Buf::QNorm | Buf::Attn => (dt, vec![r, qd]),
            Buf::K | Buf::V | Buf::KNorm => (dt, vec![r, kd]),
            Buf::QRstd => (Fp32, vec![r * self.q_heads]),
            Buf::LoraT => (dt, vec![r, self.lora.map_or(0, |l| l.rank)]),
            Buf::KRstd => (Fp32, vec![r * self.kv_heads]),
            Buf::OPart => (Fp32, vec![r, self.q_heads, n_splits, self.head_dim]),
            Buf::LsePart => (Fp32, vec![r, self.q_heads, n_splits]),
            Buf::Gate | Buf::Up | Buf::Act => (dt, vec![r, self.intermediate]),
            Buf::Logits => (dt, vec![r, self.vocab]),
            Buf::Ones => (dt, vec![r]),
            Buf::Pos | Buf::Cols | Buf::Lens => (I32, vec![r]),
            Buf::Bias => (Fp32, vec![r, self.capacity]),
            Buf::Cos | Buf::Sin => (Fp32, vec![self.max_pos, self.head_dim]),
            Buf::KCache(_) | Buf::VCache(_) => {
                (dt, vec![r, self.kv_heads, self.capacity, self.head_dim])
            }
            Buf::W(w) => (dt, self.weight_shape(w)),
        }
    }

    /// The shape of a weight.
    pub fn weight_shape(&self, w: Weight) -> Vec<usize> {
        let (h, i) = (self.hidden, self.intermediate);
        let (qd, kd) = (self.q_heads * self.head_dim, self.kv_heads * self.head_dim);
        // A projection's `(out, in)`.
        let proj = |p: &str| match p {
            "self_attn.q_proj" => (qd, h),
            "self_attn.k_proj" | "self_attn.v_proj" => (kd, h),
            "self_attn.o_proj" => (h, qd),
            "mlp.gate_proj" | "mlp.up_proj" => (i, h),
            "mlp.down_proj" => (h, i),
            _ => (0, 0),
        };
        let rank = self.lora.map_or(0, |l| l.rank);
        match w {
            Weight::LoraA(_, p) => vec![rank, proj(p).1],
            Weight::LoraB(_, p) => vec![proj(p).0, rank],
            Weight::Head => vec![self.vocab, h],
            Weight::FinalNorm => vec![h],
            Weight::Layer(_, n) => match n {
                "input_layernorm.weight" | "post_attention_layernorm.weight" => vec![h],
                "self_attn.q_norm.weight" | "self_attn.k_norm.weight" => vec![self.head_dim],
                "self_attn.q_proj.weight" => vec![qd, h],
                "self_attn.k_proj.weight" | "self_attn.v_proj.weight" => vec![kd, h],
                "self_attn.q_proj.bias" => vec![qd],
                "self_attn.k_proj.bias" | "self_attn.v_proj.bias" => vec![kd],
                "self_attn.o_proj.weight" => vec![h, qd],
                "self_attn.o_proj.bias" | "mlp.down_proj.bias" => vec![h],
                "mlp.gate_proj.weight" | "mlp.up_proj.weight" => vec![i, h],
                "mlp.gate_proj.bias" | "mlp.up_proj.bias" => vec![i],
                "mlp.down_proj.weight" => vec![h, i],
                _ => vec![0],
            },
        }
    }
}

/// One operation of the step.
#[derive(Clone, Debug, PartialEq)]
pub enum Op {
    /// `out[m, n] = alpha · x[m, k] · w[n, k]ᵀ (+ bias[n] on every row) (+ out)`: cuBLAS on a GPU (the bias as
    /// the rank-1 product `ones[m, 1] · bias[n, 1]ᵀ` written first, then the product
    /// accumulated onto it).
    Gemm {
        /// The input rows.
        x: Buf,
        /// The weight `[n, k]`.
        w: Buf,
        /// The bias `[n]`, if any.
        bias: Option<Buf>,
        /// The output.
        out: Buf,
        /// Rows, outputs, inputs.
        m: usize,
        /// See `m`.
        n: usize,
        /// See `m`.
        k: usize,
        /// The product's factor (1, or a LoRA adapter's α/r).
        alpha: f32,
        /// Add the product to `out` instead of overwriting it (a LoRA adapter's update onto
        /// its projection's output; never with `bias`).
        accumulate: bool,
    },
    /// One Triton launch; `bind` gives the step buffer of each buffer name of the plan.
    Launch {
        /// The plan (grid, scalars, the buffer names of its pointers).
        plan: LaunchPlan,
        /// Plan buffer name → step buffer.
        bind: Vec<(String, Buf)>,
    },
}

/// The decode step of one model at one [`StepShape`]: its operations in order.
#[derive(Clone, Debug)]
pub struct StepProgram {
    /// The shapes.
    pub shape: StepShape,
    /// The attention's split rule (the committed `decode_attn` variant's).
    pub split: SplitRule,
    /// The attention's split axis.
    pub n_splits: usize,
    /// The operations, in launch order.
    pub ops: Vec<Op>,
}

/// The buffers each kernel writes (the rest it only reads), by entry point.
fn written(entry: &str) -> &'static [&'static str] {
    match entry {
        "decode_rope_kv_kernel" => &["q_out", "k_cache", "v_cache"],
        "decode_attn_kernel" => &["o_part", "lse_part"],
        "decode_attn_combine_kernel" => &["o"],
        "rmsnorm_fwd_kernel" => &["y", "rstd"],
        "rmsnorm_add_fwd_kernel" => &["h_out", "y", "rstd"],
        "swiglu_fwd_kernel" => &["a"],
        _ => &[],
    }
}

impl StepProgram {
    /// The program of `shape` with the kernels of `manifest` for `target` (the fallback
    /// variants, compiled without alignment assumptions).
    ///
    /// Errors: a kernel the manifest lacks, a shape a plan refuses (head dim, GQA ratio, a
    /// hidden size over the RMSNorm classes).
    pub fn build(shape: StepShape, manifest: &Manifest, target: Target) -> Result<Self> {
        let s = shape;
        let terr = |e: triton::TritonError| -> crate::RolloutError {
            ModelError::Invalid(format!("fused decode step: {e}")).into()
        };
        let entry = |name: &str| manifest.entry(name, target).map_err(terr);
        let dec = s.decode();
        let attn_entry = entry(&decode::variant("attn", s.dtype, s.head_dim))?;
        let split = SplitRule::of(attn_entry).map_err(terr)?;
        let n_splits = dec.n_splits(attn_entry).map_err(terr)?;
        let dplan = |k: &str| -> Result<LaunchPlan> {
            decode::plan(entry(&decode::variant(k, s.dtype, s.head_dim))?, &dec).map_err(terr)
        };
        let norm = rmsnorm::RmsNorm {
            rows: s.rows,
            cols: s.hidden,
            eps: s.eps,
            rows_per_prog: 1,
        };
        let nplan = |k: &str| -> Result<LaunchPlan> {
            let name = rmsnorm::variant(k, s.dtype, s.hidden).map_err(terr)?;
            rmsnorm::plan(entry(&name)?, &norm).map_err(terr)
        };
        let glu = swiglu::Swiglu {
            rows: s.rows,
            cols: s.intermediate,
        };
        let swiglu_plan =
            swiglu::plan(entry(&swiglu::variant("fwd", s.dtype))?, &glu).map_err(terr)?;
        let (norm_fwd, norm_add) = (nplan("fwd")?, nplan("add_fwd")?);
        // Qwen3's q/k norms: the row kernel over rows of one head (`head_dim` elements).
        let head_norm = |heads: usize| -> Result<LaunchPlan> {
            let n = rmsnorm::RmsNorm {
                rows: s.rows * heads,
                cols: s.head_dim,
                eps: s.eps,
                rows_per_prog: 1,
            };
            let name = rmsnorm::variant("fwd", s.dtype, s.head_dim).map_err(terr)?;
            rmsnorm::plan(entry(&name)?, &n).map_err(terr)
        };
        let qk_norm = match s.qk_norm {
            true => Some((head_norm(s.q_heads)?, head_norm(s.kv_heads)?)),
            false => None,
        };
        let (rope, attn, combine) = (dplan("rope_kv")?, dplan("attn")?, dplan("attn_combine")?);
        let launch = |plan: &LaunchPlan, bind: &[(&str, Buf)]| Op::Launch {
            plan: plan.clone(),
            bind: bind.iter().map(|(n, b)| (n.to_string(), *b)).collect(),
        };
        let (qd, kd) = (s.q_heads * s.head_dim, s.kv_heads * s.head_dim);
        let lw = |l: usize, n: &'static str| Buf::W(Weight::Layer(l, n));
        // A projection: its product (and bias), then its LoRA adapter's two products.
        let gemm = |x: Buf, l: usize, proj: &'static str, bias: bool, out: Buf, n: usize, k| {
            let (path, w, b) = match proj {
                "q" => (
                    "self_attn.q_proj",
                    "self_attn.q_proj.weight",
                    "self_attn.q_proj.bias",
                ),
                "k" => (
                    "self_attn.k_proj",
                    "self_attn.k_proj.weight",
                    "self_attn.k_proj.bias",
                ),
                "v" => (
                    "self_attn.v_proj",
                    "self_attn.v_proj.weight",
                    "self_attn.v_proj.bias",
                ),
                "o" => (
                    "self_attn.o_proj",
                    "self_attn.o_proj.weight",
                    "self_attn.o_proj.bias",
                ),
                "gate" => (
                    "mlp.gate_proj",
                    "mlp.gate_proj.weight",
                    "mlp.gate_proj.bias",
                ),
                "up" => ("mlp.up_proj", "mlp.up_proj.weight", "mlp.up_proj.bias"),
                _ => (
                    "mlp.down_proj",
                    "mlp.down_proj.weight",
                    "mlp.down_proj.bias",
                ),
            };
            let mut v = vec![Op::Gemm {
                x,
                w: lw(l, w),
                bias: bias.then(|| lw(l, b)),
                out,
                m: s.rows,
                n,
                k,
                alpha: 1.0,
                accumulate: false,
            }];
            if let Some(lo) = s.lora.filter(|lo| lo.covers(path)) {
                v.push(Op::Gemm {
                    x,
                    w: Buf::W(Weight::LoraA(l, path)),
                    bias: None,
                    out: Buf::LoraT,
                    m: s.rows,
                    n: lo.rank,
                    k,
                    alpha: 1.0,
                    accumulate: false,
                });
                v.push(Op::Gemm {
                    x: Buf::LoraT,
                    w: Buf::W(Weight::LoraB(l, path)),
                    bias: None,
                    out,
                    m: s.rows,
                    n,
                    k: lo.rank,
                    alpha: lo.scale,
                    accumulate: true,
                });
            }
            v
        };
        let mut ops = Vec::new();
        // The residual stream alternates between X(0) and X(1): `cur` holds it.
        let mut cur = 0u8;
        ops.push(launch(
            &norm_fwd,
            &[
                ("x", Buf::X(0)),
                ("w", lw(0, "input_layernorm.weight")),
                ("y", Buf::H),
                ("rstd", Buf::Rstd),
            ],
        ));
        for l in 0..s.layers {
            ops.extend(gemm(Buf::H, l, "q", s.qkv_bias, Buf::Q, qd, s.hidden));
            ops.extend(gemm(Buf::H, l, "k", s.qkv_bias, Buf::K, kd, s.hidden));
            ops.extend(gemm(Buf::H, l, "v", s.qkv_bias, Buf::V, kd, s.hidden));
            let (q_in, k_in) = match &qk_norm {
                Some((qn, kn)) => {
                    for (plan, x, w, y, rstd) in [
                        (
                            qn,
                            Buf::Q,
                            "self_attn.q_norm.weight",
                            Buf::QNorm,
                            Buf::QRstd,
                        ),
                        (
                            kn,
                            Buf::K,
                            "self_attn.k_norm.weight",
                            Buf::KNorm,
                            Buf::KRstd,
                        ),
                    ] {
                        let bind = [("x", x), ("w", lw(l, w)), ("y", y), ("rstd", rstd)];
                        ops.push(launch(plan, &bind));
                    }
                    (Buf::QNorm, Buf::KNorm)
                }
                None => (Buf::Q, Buf::K),
            };
            ops.push(launch(
                &rope,
                &[
                    ("q", q_in),
                    ("k", k_in),
                    ("v", Buf::V),
                    ("q_out", Buf::QRot),
                    ("k_cache", Buf::KCache(l)),
                    ("v_cache", Buf::VCache(l)),
                    ("cos", Buf::Cos),
                    ("sin", Buf::Sin),
                    ("pos", Buf::Pos),
                    ("cols", Buf::Cols),
                ],
            ));
            ops.push(launch(
                &attn,
                &[
                    ("q_out", Buf::QRot),
                    ("k_cache", Buf::KCache(l)),
                    ("v_cache", Buf::VCache(l)),
                    ("bias", Buf::Bias),
                    ("lens", Buf::Lens),
                    ("o_part", Buf::OPart),
                    ("lse_part", Buf::LsePart),
                ],
            ));
            ops.push(launch(
                &combine,
                &[
                    ("o_part", Buf::OPart),
                    ("lse_part", Buf::LsePart),
                    ("lens", Buf::Lens),
                    ("o", Buf::Attn),
                ],
            ));
            ops.extend(gemm(
                Buf::Attn,
                l,
                "o",
                s.o_bias,
                Buf::AttnOut,
                s.hidden,
                qd,
            ));
            ops.push(launch(
                &norm_add,
                &[
                    ("x", Buf::AttnOut),
                    ("residual", Buf::X(cur)),
                    ("w", lw(l, "post_attention_layernorm.weight")),
                    ("h_out", Buf::X(1 - cur)),
                    ("y", Buf::H),
                    ("rstd", Buf::Rstd),
                ],
            ));
            cur = 1 - cur;
            let i = s.intermediate;
            ops.extend(gemm(Buf::H, l, "gate", s.mlp_bias, Buf::Gate, i, s.hidden));
            ops.extend(gemm(Buf::H, l, "up", s.mlp_bias, Buf::Up, i, s.hidden));
            ops.push(launch(
                &swiglu_plan,
                &[("g", Buf::Gate), ("u", Buf::Up), ("a", Buf::Act)],
            ));
            ops.extend(gemm(
                Buf::Act,
                l,
                "down",
                s.mlp_bias,
                Buf::MlpOut,
                s.hidden,
                i,
            ));
            let next_norm = if l + 1 < s.layers {
                lw(l + 1, "input_layernorm.weight")
            } else {
                Buf::W(Weight::FinalNorm)
            };
            ops.push(launch(
                &norm_add,
                &[
                    ("x", Buf::MlpOut),
                    ("residual", Buf::X(cur)),
                    ("w", next_norm),
                    ("h_out", Buf::X(1 - cur)),
                    ("y", Buf::H),
                    ("rstd", Buf::Rstd),
                ],
            ));
            cur = 1 - cur;
        }
        ops.push(Op::Gemm {
            x: Buf::H,
            w: Buf::W(Weight::Head),
            bias: None,
            out: Buf::Logits,
            m: s.rows,
            n: s.vocab,
            k: s.hidden,
            alpha: 1.0,
            accumulate: false,
        });
        Ok(StepProgram {
            shape,
            split,
            n_splits,
            ops,
        })
    }

    /// Every buffer the program names, weights included, each once (sorted).
    pub fn buffers(&self) -> Vec<Buf> {
        let mut set = BTreeSet::new();
        for op in &self.ops {
            match op {
                Op::Gemm {
                    x, w, bias, out, ..
                } => {
                    set.extend([*x, *w, *out]);
                    if let Some(b) = bias {
                        set.extend([*b, Buf::Ones]);
                    }
                }
                Op::Launch { bind, .. } => set.extend(bind.iter().map(|(_, b)| *b)),
            }
        }
        set.into_iter().collect()
    }

    /// `(triton launches, projections)` per step; a projection with a bias counts as one.
    pub fn counts(&self) -> (usize, usize) {
        let t = (self.ops.iter())
            .filter(|o| matches!(o, Op::Launch { .. }))
            .count();
        (t, self.ops.len() - t)
    }

    /// The dtype and element count of every buffer (`spec` of [`StepShape`]).
    pub fn sizes(&self) -> BTreeMap<Buf, (triton::DType, usize)> {
        (self.buffers().into_iter())
            .map(|b| {
                let (dt, sh) = self.shape.spec(b, self.n_splits);
                (b, (dt, sh.iter().product()))
            })
            .collect()
    }
}

/// The f32 rotary tables `[max_pos, hd]` the decode kernels read, from `model`'s own tables (in
/// its dtype, so a bf16 model's rounding of cos and sin is kept).
///
/// Errors: tensor errors.
pub fn rotary_tables(model: &Model) -> Result<(Tensor, Tensor)> {
    let n = model.config().max_position_embeddings;
    let (cos, sin) = model.rotary_tables(n)?;
    Ok((cos.to_dtype(DType::F32)?, sin.to_dtype(DType::F32)?))
}

/// The tensor of `w` in `model` (detached; the same storage as the model's).
///
/// Errors: the model has no such weight.
pub fn weight(model: &Model, w: Weight) -> Result<Tensor> {
    match (w, w.name()) {
        (_, None) => Ok(model.head_weight().clone()),
        // The adapters are f32: the step's products run in the model's dtype. A Phi-3 split
        // projection's factors are the fused module's A and its rows of B.
        (Weight::LoraA(l, p) | Weight::LoraB(l, p), Some(n)) => {
            let (a, b) = model
                .lora_factors(l, p)?
                .ok_or_else(|| ModelError::Invalid(format!("fused decode step: no weight {n}")))?;
            let t = if matches!(w, Weight::LoraA(..)) { a } else { b };
            Ok(t.to_dtype(model.dtype())?)
        }
        (_, Some(n)) => weight_named(model, &n),
    }
}

/// A decode step run by the fused program over a wave's cache (`FusedDecoder` on CUDA,
/// `host::HostStep` in the CPU tests): the sampler's decode loop calls it instead of the candle step
/// when `kernels.decode` is on.
///
/// A step is built for one batch-size bucket: the cache's rows are its fixed slots, and finished
/// rows stay as slots whose results are ignored (a graph replays over fixed addresses and
/// shapes) until the live rows fit half the slots; then the sampler compacts the cache and builds
/// the step of the smaller bucket (`Sampler`'s decode loop).
pub(crate) trait FusedStep {
    /// Runs one step: slot `s` feeds token `ids[s]` at rotary position `pos[s]` into cache
    /// column `cache.len()` (every slot, `ids.len() == cache.rows()`), then commits the column.
    /// Returns the logits `[slots, vocab]` f32. On CUDA with an f32 model they are the step's
    /// own logits buffer (no copy), which the next step overwrites: read them before it.
    fn step(&mut self, cache: &mut KvBuffer, ids: &[u32], pos: &[u32]) -> Result<Tensor>;

    /// Makes `cache` hold every column this step wrote, before the sampler reads rows out of it
    /// (a finished row's keys and values kept for its next turn) or compacts it. The CUDA step
    /// writes the cache in place and has nothing to do; the host step writes its own copies.
    fn flush(&mut self, cache: &mut KvBuffer) -> Result<()> {
        let _ = cache;
        Ok(())
    }
}

fn weight_named(model: &Model, name: &str) -> Result<Tensor> {
    Ok(model
        .var(name)
        .ok_or_else(|| ModelError::Invalid(format!("fused decode step: no weight {name}")))?
        .as_tensor()
        .detach())
}

mod host;

pub(crate) use host::host_step;
pub use host::{host_weights, HostBufs};
#[cfg(test)]
pub(crate) use host::{HOST_FAIL_AT, HOST_FUSED, HOST_STEPS};

#[cfg(test)]
mod tests;
