//! The shared-prefix training forward (`Model::shared_prefix_logprobs`) equals the
//! unshared path (`Model::token_logprobs_at` over right-padded `[prompt, completion]` rows, as
//! rlvr-train packs them) in log-probs, entropies, a weighted loss, every parameter's gradient and
//! the gradient norm: within 1e-5 relative in f32 and 1e-6 in f64, on random qwen2 (q/k/v biases,
//! tied), qwen3 (q/k RMSNorm, tied) and llama (untied, Llama-3 rope scaling) models with grouped KV
//! heads; uneven prompts and completions (padding in both parts, empty and one-token completions);
//! K = 1, 2 and 8; a group split into two parts; LoRA adapters; activation checkpointing on and
//! off; bf16 within a stated bound.
//!
//! "Relative", b the unshared value: for log-probs and entropies max |a − b| ≤ tol · max |b| (their
//! scale); for each parameter's gradient ‖a − b‖₂ ≤ tol · ‖b‖₂ (the largest single entry's gap over
//! the largest entry is printed too); for the loss and the gradient norm |a − b| ≤ tol · |b|. In f64
//! the two paths agree to about 1e-15 (the printed gaps), so they compute the same function; in f32
//! each path is about 5e-6 (norm-wise) from the f64 answer on these deliberately ill-conditioned
//! models, and the shared path's error is no larger than the unshared path's own (tested).

use candle_core::backprop::GradStore;
use candle_core::{DType, Device, Tensor};
use rlvr_model::recompute::backward;
use rlvr_model::{
    Arch, LoraConfig, LoraTarget, Model, ModelConfig, PromptGroup, RopeScaling, SharedPrefixBatch,
    SlidingWindow,
};

const VOCAB: usize = 48;
const TEMPERATURE: f64 = 0.8;

fn config(arch: Arch) -> ModelConfig {
    ModelConfig {
        arch,
        vocab_size: VOCAB,
        hidden_size: 16,
        intermediate_size: 24,
        num_hidden_layers: 2,
        num_attention_heads: 4,
        num_key_value_heads: 2,
        head_dim: if arch == Arch::Qwen3 { 8 } else { 4 },
        rms_norm_eps: 1e-6,
        rope_theta: 10000.0,
        rope_scaling: (arch == Arch::Llama).then_some(RopeScaling::Llama3 {
            factor: 8.0,
            low_freq_factor: 1.0,
            high_freq_factor: 4.0,
            original_max_position_embeddings: 8.0,
        }),
        max_position_embeddings: 128,
        sliding_window: None,
        tie_word_embeddings: arch != Arch::Llama,
        qkv_bias: arch == Arch::Qwen2,
        o_bias: false,
        mlp_bias: false,
        stored_dtype: None,
        bos_token_id: None,
        eos_token_ids: vec![],
        gemma: rlvr_model::GemmaConfig::defaults_for(arch, 4),
        partial_rotary_factor: 1.0,
    }
}

/// A deterministic stream of values in [−0.5, 0.5).
struct Lcg(u64);

impl Lcg {
    fn next(&mut self) -> f64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (self.0 >> 11) as f64 / (1u64 << 53) as f64 - 0.5
    }

    fn token(&mut self) -> u32 {
        ((self.next() + 0.5) * VOCAB as f64) as u32 % VOCAB as u32
    }
}

/// Adds noise to every trainable weight (norms and biases leave their 1/0 init; LoRA's B leaves
/// zero), so every gradient is generic.
fn randomise(model: &Model, seed: u64) {
    let mut rng = Lcg(seed);
    for (_, v) in model.named_vars() {
        let t = v.as_tensor();
        let noise: Vec<f64> = (0..t.elem_count()).map(|_| rng.next() * 0.8).collect();
        let noise = Tensor::from_vec(noise, t.shape(), t.device())
            .unwrap()
            .to_dtype(t.dtype())
            .unwrap();
        v.set(&(t + noise).unwrap()).unwrap();
    }
}

fn model(arch: Arch, dtype: DType, seed: u64) -> Model {
    let m = Model::random(config(arch), 0.3, seed, dtype, &Device::Cpu).unwrap();
    randomise(&m, seed + 100);
    m
}

/// Groups from `(prompt length, [completion lengths])` with random tokens.
fn groups(spec: &[(usize, &[usize])], seed: u64) -> Vec<PromptGroup> {
    let mut rng = Lcg(seed);
    spec.iter()
        .map(|&(p, cs)| PromptGroup {
            prompt: (0..p).map(|_| rng.token()).collect(),
            completions: cs
                .iter()
                .map(|&c| (0..c).map(|_| rng.token()).collect())
                .collect(),
        })
        .collect()
}

/// The unshared path as rlvr-train runs it (`pack::pack_rows` + `token_logprobs_at`): rows
/// `[prompt, completion]` right-padded (pad id 0), output from the shortest prompt − 1, each
/// row's completion positions listed.
fn unshared(m: &Model, groups: &[PromptGroup], grad: bool) -> rlvr_model::LogProbs {
    let rows: Vec<(&[u32], &[u32])> = groups
        .iter()
        .flat_map(|g| g.completions.iter().map(|c| (&g.prompt[..], &c[..])))
        .collect();
    let t = rows
        .iter()
        .map(|(p, c)| p.len() + c.len())
        .max()
        .unwrap()
        .max(2);
    let start = rows.iter().map(|(p, _)| p.len()).min().unwrap() - 1;
    let (mut ids, mut mask, mut at) = (vec![], vec![], vec![]);
    for (p, c) in &rows {
        let mut row = [*p, *c].concat();
        let n = row.len();
        row.resize(t, 0);
        let mut mk = vec![1u32; n];
        mk.resize(t, 0);
        ids.push(row);
        mask.push(mk);
        at.push((0..c.len()).map(|j| p.len() + j - 1 - start).collect());
    }
    m.token_logprobs_at(&ids, &mask, start, &at, TEMPERATURE, true, grad)
        .unwrap()
}

fn shared(m: &Model, groups: &[PromptGroup], grad: bool) -> rlvr_model::LogProbs {
    let batch = SharedPrefixBatch {
        groups: groups.to_vec(),
    };
    m.shared_prefix_logprobs(&batch, TEMPERATURE, true, grad)
        .unwrap()
}

/// Σ_rj w_rj·ℓ_rj + 0.1·Σ_rj m_rj·H_rj over real completion tokens, with weights of both signs
/// fixed by (first row index + r, j): the shape of every policy loss.
fn loss(out: &rlvr_model::LogProbs, groups: &[PromptGroup], first_row: usize) -> Tensor {
    let (r, c) = out.logprobs.dims2().unwrap();
    let lens: Vec<usize> = groups
        .iter()
        .flat_map(|g| g.completions.iter().map(Vec::len))
        .collect();
    assert_eq!(lens.len(), r);
    let (mut w, mut m) = (vec![0f64; r * c], vec![0f64; r * c]);
    for (ri, &len) in lens.iter().enumerate() {
        for j in 0..len {
            w[ri * c + j] = (((first_row + ri) * 7 + j * 3) % 5) as f64 - 2.0 + 0.25;
            m[ri * c + j] = 1.0;
        }
    }
    let dt = out.logprobs.dtype();
    let t = |v: Vec<f64>| {
        Tensor::from_vec(v, (r, c), &Device::Cpu)
            .unwrap()
            .to_dtype(dt)
            .unwrap()
    };
    let ent = out.entropy.as_ref().unwrap();
    let pg = (&out.logprobs * t(w)).unwrap().sum_all().unwrap();
    let reg = (ent * t(m)).unwrap().sum_all().unwrap();
    (pg + (reg * 0.1).unwrap()).unwrap()
}

fn host(t: &Tensor) -> Vec<f64> {
    t.to_dtype(DType::F64)
        .unwrap()
        .flatten_all()
        .unwrap()
        .to_vec1()
        .unwrap()
}

fn scalar(t: &Tensor) -> f64 {
    t.to_dtype(DType::F64).unwrap().to_scalar().unwrap()
}

/// The entries of `[R, C]` at real completion tokens, row by row.
fn real(t: &Tensor, groups: &[PromptGroup]) -> Vec<f64> {
    let c = t.dim(1).unwrap();
    let v = host(t);
    let lens = groups
        .iter()
        .flat_map(|g| g.completions.iter().map(Vec::len));
    lens.enumerate()
        .flat_map(|(r, len)| v[r * c..r * c + len].to_vec())
        .collect()
}

/// ‖a − b‖₂ / ‖b‖₂ (0 when both are 0).
fn norm_gap(a: &[f64], b: &[f64]) -> f64 {
    assert_eq!(a.len(), b.len(), "lengths differ");
    let d: f64 = a.iter().zip(b).map(|(x, y)| (x - y) * (x - y)).sum();
    let s: f64 = b.iter().map(|y| y * y).sum();
    if d == 0.0 {
        0.0
    } else {
        (d / s).sqrt()
    }
}

/// max |a − b| / max |b| (0 when both are 0).
fn rel_gap(a: &[f64], b: &[f64]) -> f64 {
    assert_eq!(a.len(), b.len(), "lengths differ");
    let scale = b.iter().fold(0f64, |m, x| m.max(x.abs()));
    let gap = a.iter().zip(b).fold(0f64, |m, (x, y)| m.max((x - y).abs()));
    if gap == 0.0 {
        0.0
    } else {
        gap / scale
    }
}

/// What one side (shared or unshared) produced: host log-probs and entropies, the loss, the
/// gradient of every trainable weight (by name) and the gradient norm.
struct Side {
    logprobs: Vec<f64>,
    entropy: Vec<f64>,
    loss: f64,
    grads: Vec<(String, Vec<f64>)>,
    norm: f64,
}

/// The side's results from the summed losses of `parts` (each a forward of its own).
fn side(m: &Model, parts: &[(Vec<PromptGroup>, usize)], forward: Fwd) -> Side {
    let (mut lp, mut ent, mut total) = (vec![], vec![], None::<Tensor>);
    for (groups, first_row) in parts {
        let out = forward(m, groups, true);
        lp.extend(real(&out.logprobs, groups));
        ent.extend(real(out.entropy.as_ref().unwrap(), groups));
        let l = loss(&out, groups, *first_row);
        total = Some(match total {
            None => l,
            Some(t) => (t + l).unwrap(),
        });
    }
    let total = total.unwrap();
    let g: GradStore = backward(&total).unwrap();
    let grads: Vec<(String, Vec<f64>)> = m
        .named_vars()
        .into_iter()
        .map(|(n, v)| {
            let gv = g
                .get(v.as_tensor())
                .unwrap_or_else(|| panic!("no gradient for {n}"));
            (n, host(gv))
        })
        .collect();
    let norm = grads
        .iter()
        .flat_map(|(_, g)| g.iter())
        .map(|x| x * x)
        .sum::<f64>()
        .sqrt();
    Side {
        logprobs: lp,
        entropy: ent,
        loss: scalar(&total),
        grads,
        norm,
    }
}

type Fwd = fn(&Model, &[PromptGroup], bool) -> rlvr_model::LogProbs;

/// The relative gaps (module docs) between shared `s` and unshared `u`.
struct Gaps {
    logprobs: f64,
    entropy: f64,
    loss: f64,
    /// The parameter with the largest norm-wise gradient gap, and that gap.
    grad: (String, f64),
    /// The largest max-entry gradient gap over the parameters (printed, not bounded).
    grad_entry: f64,
    norm: f64,
}

fn gaps(s: &Side, u: &Side) -> Gaps {
    let mut grad = (String::new(), 0f64);
    let mut grad_entry = 0f64;
    for ((n, a), (n2, b)) in s.grads.iter().zip(&u.grads) {
        assert_eq!(n, n2);
        let scale: f64 = b.iter().map(|x| x * x).sum();
        assert!(scale > 0.0, "{n}: the unshared gradient is zero");
        let g = norm_gap(a, b);
        if g >= grad.1 {
            grad = (n.clone(), g);
        }
        grad_entry = grad_entry.max(rel_gap(a, b));
    }
    Gaps {
        logprobs: rel_gap(&s.logprobs, &u.logprobs),
        entropy: rel_gap(&s.entropy, &u.entropy),
        loss: (s.loss - u.loss).abs() / u.loss.abs(),
        grad,
        grad_entry,
        norm: (s.norm - u.norm).abs() / u.norm,
    }
}

impl std::fmt::Display for Gaps {
    fn fmt(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        write!(
            f,
            "log-prob {:.1e}, entropy {:.1e}, loss {:.1e}, grad {:.1e} ({}; max entry {:.1e}), norm {:.1e}",
            self.logprobs, self.entropy, self.loss, self.grad.1, self.grad.0, self.grad_entry, self.norm
        )
    }
}

/// One comparison: the shared path over `shared_parts` (each part its own forward, their losses
/// summed, as micro-batches' gradients are) against the unshared path over `whole` in one forward.
struct Check<'a> {
    what: &'a str,
    shared_model: &'a Model,
    unshared_model: &'a Model,
    shared_parts: Vec<(Vec<PromptGroup>, usize)>,
    whole: Vec<PromptGroup>,
    tol: f64,
}

fn check(c: Check) {
    let s = side(c.shared_model, &c.shared_parts, shared);
    let u = side(c.unshared_model, &[(c.whole.clone(), 0)], unshared);
    let gp = gaps(&s, &u);
    eprintln!("{}: {gp} (loss {:.6}, norm {:.6})", c.what, u.loss, u.norm);
    for (q, v) in [
        ("log-probs", gp.logprobs),
        ("entropy", gp.entropy),
        ("loss", gp.loss),
        ("grad norm", gp.norm),
    ] {
        assert!(
            v <= c.tol,
            "{}: {q} differ by {v:.3e} > {:.0e}",
            c.what,
            c.tol
        );
    }
    let (name, g) = &gp.grad;
    assert!(
        g <= &c.tol,
        "{}: gradient of {name} differs by {g:.3e}",
        c.what
    );
    // The comparison sees real values: log-probs spread, a loss and gradients that are not 0.
    let spread = u.logprobs.iter().fold(0f64, |m, x| m.max(x.abs()));
    assert!(spread > 0.1 && u.norm > 1e-3, "{}: degenerate case", c.what);
}

/// Uneven prompts (5, 9, 3 tokens) with K = 1, 2 and 8; completions of 1 to 7 tokens, one empty.
const MIXED: &[(usize, &[usize])] = &[(5, &[3]), (9, &[1, 6]), (3, &[4, 2, 7, 1, 5, 0, 6, 2])];

fn one_part(groups: &[PromptGroup]) -> Vec<(Vec<PromptGroup>, usize)> {
    vec![(groups.to_vec(), 0)]
}

fn tol(dtype: DType) -> f64 {
    if dtype == DType::F64 {
        1e-6
    } else {
        1e-5
    }
}

#[test]
fn every_architecture_matches_the_unshared_path_in_f32_and_f64() {
    for dtype in [DType::F32, DType::F64] {
        for (i, arch) in [Arch::Qwen2, Arch::Qwen3, Arch::Llama]
            .into_iter()
            .enumerate()
        {
            let m = model(arch, dtype, 1 + i as u64);
            let g = groups(MIXED, 7 + i as u64);
            check(Check {
                what: &format!("{arch:?} {dtype:?}"),
                shared_model: &m,
                unshared_model: &m,
                shared_parts: one_part(&g),
                whole: g.clone(),
                tol: tol(dtype),
            });
        }
    }
}

#[test]
fn group_sizes_1_2_and_8_each_alone() {
    let m = model(Arch::Qwen2, DType::F32, 3);
    let specs: [&[(usize, &[usize])]; 4] = [
        &[(6, &[5])],
        &[(4, &[3, 6])],
        &[(7, &[2, 5, 1, 6, 3, 4, 6, 2])],
        // Two groups of 8 with different prompt lengths in one micro-batch.
        &[
            (2, &[3, 1, 4, 1, 5, 2, 6, 5]),
            (8, &[3, 5, 8, 9, 7, 9, 3, 2]),
        ],
    ];
    for (i, spec) in specs.iter().enumerate() {
        let g = groups(spec, 20 + i as u64);
        check(Check {
            what: &format!("qwen2 K case {i}"),
            shared_model: &m,
            unshared_model: &m,
            shared_parts: one_part(&g),
            whole: g.clone(),
            tol: 1e-5,
        });
    }
}

#[test]
fn a_split_group_sums_to_the_whole_groups_gradients() {
    for dtype in [DType::F32, DType::F64] {
        let m = model(Arch::Qwen3, dtype, 4);
        let g = groups(&[(7, &[3, 6, 1, 5, 2, 7, 4, 3])], 31);
        let part = |r: std::ops::Range<usize>| PromptGroup {
            prompt: g[0].prompt.clone(),
            completions: g[0].completions[r].to_vec(),
        };
        check(Check {
            what: &format!("split 3 + 5 {dtype:?}"),
            shared_model: &m,
            unshared_model: &m,
            shared_parts: vec![(vec![part(0..3)], 0), (vec![part(3..8)], 3)],
            whole: g.clone(),
            tol: tol(dtype),
        });
    }
}

#[test]
fn activation_checkpointing_gives_the_same_values_and_gradients() {
    for (i, arch) in [Arch::Qwen2, Arch::Qwen3, Arch::Llama]
        .into_iter()
        .enumerate()
    {
        let plain = model(arch, DType::F32, 5 + i as u64);
        let mut ckpt = plain.clone(); // the same weights
        ckpt.set_gradient_checkpointing(true);
        let g = groups(MIXED, 40 + i as u64);
        check(Check {
            what: &format!("{arch:?} checkpointed shared vs plain unshared"),
            shared_model: &ckpt,
            unshared_model: &plain,
            shared_parts: one_part(&g),
            whole: g.clone(),
            tol: 1e-5,
        });
        check(Check {
            what: &format!("{arch:?} both checkpointed"),
            shared_model: &ckpt,
            unshared_model: &ckpt,
            shared_parts: one_part(&g),
            whole: g.clone(),
            tol: 1e-5,
        });
    }
}

#[test]
fn lora_adapters_get_the_same_gradients_with_and_without_checkpointing() {
    for dtype in [DType::F32, DType::F64] {
        for arch in [Arch::Qwen2, Arch::Llama] {
            let mut m = model(arch, dtype, 6);
            let lora = LoraConfig {
                rank: 2,
                alpha: 4.0,
                targets: LoraTarget::ALL.to_vec(),
                dropout: 0.0,
            };
            m.add_lora(&lora, 9).unwrap();
            randomise(&m, 77); // B away from zero (named_vars are the adapters now)
            assert!(m.named_vars()[0].0.contains("lora_A"));
            let mut ckpt = m.clone();
            ckpt.set_gradient_checkpointing(true);
            let g = groups(MIXED, 50);
            for (what, s) in [("plain", &m), ("checkpointed", &ckpt)] {
                check(Check {
                    what: &format!("{arch:?} {dtype:?} LoRA {what}"),
                    shared_model: s,
                    unshared_model: &m,
                    shared_parts: one_part(&g),
                    whole: g.clone(),
                    tol: tol(dtype),
                });
            }
        }
    }
}

/// LoRA dropout's masks are keyed by each token's context (`rlvr_model::lora`), so the shared
/// path (each prompt once), the unshared one (the prompt in every row), a group split into two
/// micro-batches and activation checkpointing all draw the same masks: the same log-probs, loss
/// and adapter gradients within float rounding, at p = 0.3; and the masks do something (another
/// round, or p = 0, moves the loss).
#[test]
fn lora_dropout_draws_the_same_masks_shared_unshared_and_split() {
    for dtype in [DType::F32, DType::F64] {
        let mut m = model(Arch::Qwen2, dtype, 12);
        let lora = LoraConfig {
            rank: 2,
            alpha: 4.0,
            targets: LoraTarget::ALL.to_vec(),
            dropout: 0.3,
        };
        m.add_lora(&lora, 9).unwrap();
        randomise(&m, 78);
        m.set_lora_dropout_round(4);
        let mut ckpt = m.clone();
        ckpt.set_gradient_checkpointing(true);
        let g = groups(&[(7, &[3, 6, 1, 5, 2, 7, 4, 3]), (4, &[2, 5])], 32);
        let part = |r: std::ops::Range<usize>| PromptGroup {
            prompt: g[0].prompt.clone(),
            completions: g[0].completions[r].to_vec(),
        };
        for (what, s) in [("plain", &m), ("checkpointed", &ckpt)] {
            check(Check {
                what: &format!("{dtype:?} LoRA dropout {what}, shared vs unshared"),
                shared_model: s,
                unshared_model: &m,
                shared_parts: one_part(&g),
                whole: g.clone(),
                tol: tol(dtype),
            });
            check(Check {
                what: &format!("{dtype:?} LoRA dropout {what}, split 3 + 5 + 2"),
                shared_model: s,
                unshared_model: &m,
                shared_parts: vec![
                    (vec![part(0..3)], 0),
                    (vec![part(3..8)], 3),
                    (vec![g[1].clone()], 8),
                ],
                whole: g.clone(),
                tol: tol(dtype),
            });
        }
        let at = |m: &Model| side(m, &one_part(&g), shared).loss;
        let base = at(&m);
        let other = m.clone();
        other.set_lora_dropout_round(5);
        assert!(
            (at(&other) - base).abs() > 1e3 * tol(dtype) * base.abs(),
            "round 5 = round 4"
        );
        m.set_lora_dropout_round(4);
        let mut none = model(Arch::Qwen2, dtype, 12);
        none.add_lora(
            &LoraConfig {
                dropout: 0.0,
                ..lora.clone()
            },
            9,
        )
        .unwrap();
        randomise(&none, 78);
        assert!(
            (at(&none) - base).abs() > 1e3 * tol(dtype) * base.abs(),
            "p = 0.3 = p = 0"
        );
    }
}

/// bf16 (the GPU training dtype): the forward is bit-identical here, the backward sums the K rows'
/// prompt gradients in another order, in bf16. Bound: log-probs, entropies and the loss within
/// 1e-3 relative, every gradient within 3e-2 norm-wise, the gradient norm within 1e-2 (bf16 has an
/// 8-bit mantissa: 3.9e-3 per rounding; measured gaps are printed).
#[test]
fn bf16_agrees_within_the_stated_bound() {
    for (i, arch) in [Arch::Qwen2, Arch::Qwen3, Arch::Llama]
        .into_iter()
        .enumerate()
    {
        let m = model(arch, DType::BF16, 8 + i as u64);
        let g = groups(MIXED, 60 + i as u64);
        let s = side(&m, &one_part(&g), shared);
        let u = side(&m, &one_part(&g), unshared);
        let gp = gaps(&s, &u);
        eprintln!("{arch:?} bf16: {gp}");
        assert!(
            gp.logprobs <= 1e-3 && gp.entropy <= 1e-3 && gp.loss <= 1e-3,
            "{arch:?}: {gp}"
        );
        assert!(gp.grad.1 <= 3e-2 && gp.norm <= 1e-2, "{arch:?}: {gp}");
    }
}

/// In f32 both paths round; measured against the f64 answer (the same weights in f64), the shared
/// path's error is within 1e-5 and at most 1.5× the unshared path's own (plus 1e-7) for every
/// quantity: sharing the prompt costs no accuracy.
#[test]
fn f32_errors_against_the_f64_answer_are_no_larger_than_the_unshared_paths() {
    for (i, arch) in [Arch::Qwen2, Arch::Qwen3, Arch::Llama]
        .into_iter()
        .enumerate()
    {
        let m32 = model(arch, DType::F32, 13 + i as u64);
        let m64 = Model::random(config(arch), 0.3, 0, DType::F64, &Device::Cpu).unwrap();
        let w: Vec<(String, Tensor)> = m32
            .named_vars()
            .into_iter()
            .map(|(n, v)| (n, v.as_tensor().clone()))
            .collect();
        m64.load_named(&w).unwrap();
        let g = groups(
            &[(7, &[2, 5, 1, 6, 3, 4, 6, 2]), (4, &[3, 1])],
            90 + i as u64,
        );
        let exact = side(&m64, &one_part(&g), unshared);
        let s = gaps(&side(&m32, &one_part(&g), shared), &exact);
        let u = gaps(&side(&m32, &one_part(&g), unshared), &exact);
        eprintln!("{arch:?} f32 vs f64, shared: {s}\n{arch:?} f32 vs f64, unshared: {u}");
        for (q, a, b) in [
            ("log-probs", s.logprobs, u.logprobs),
            ("entropy", s.entropy, u.entropy),
            ("loss", s.loss, u.loss),
            ("gradient", s.grad.1, u.grad.1),
            ("grad norm", s.norm, u.norm),
        ] {
            assert!(
                a <= 1e-5 && a <= 1.5 * b + 1e-7,
                "{arch:?} {q}: shared {a:.2e}, unshared {b:.2e}"
            );
        }
    }
}

/// The rows form keeps the caller's row order (interleaved groups, a lone prompt) and the layout
/// of `token_logprobs_at`: `[b, longest completion]`, exact zeros after each row's end.
#[test]
fn rows_in_any_order_keep_their_order_and_layout() {
    let m = model(Arch::Llama, DType::F32, 10);
    let g = groups(&[(4, &[3, 5, 2]), (6, &[4, 1]), (5, &[6])], 70);
    let (a, b, c) = (&g[0], &g[1], &g[2]);
    let rows: Vec<(&[u32], &[u32])> = vec![
        (&b.prompt, &b.completions[0]),
        (&a.prompt, &a.completions[0]),
        (&c.prompt, &c.completions[0]),
        (&a.prompt, &a.completions[1]),
        (&b.prompt, &b.completions[1]),
        (&a.prompt, &a.completions[2]),
    ];
    let (batch, order) = SharedPrefixBatch::from_rows(&rows);
    assert_eq!(batch.groups.len(), 3);
    assert!(batch.decoder_positions() < batch.unshared_positions()); // the shared path
    assert_eq!(order, vec![0, 2, 5, 3, 1, 4]);
    let got = m
        .shared_prefix_logprobs_rows(&rows, TEMPERATURE, true, false)
        .unwrap();
    // The reference: the same rows, each its own group of one, in the same order.
    let alone: Vec<PromptGroup> = rows
        .iter()
        .map(|(p, c)| PromptGroup {
            prompt: p.to_vec(),
            completions: vec![c.to_vec()],
        })
        .collect();
    let want = unshared(&m, &alone, false);
    assert_eq!(got.logprobs.dims(), &[6, 6]);
    assert_eq!(got.logprobs.dims(), want.logprobs.dims());
    let (gl, wl) = (host(&got.logprobs), host(&want.logprobs));
    assert!(rel_gap(&gl, &wl) <= 1e-5, "{gl:?}\n{wl:?}");
    for (r, (_, c)) in rows.iter().enumerate() {
        for j in 0..6 {
            let v = gl[r * 6 + j];
            assert_eq!(v == 0.0, j >= c.len(), "row {r} column {j}: {v}");
        }
    }
}

/// Rows that share no prompt would gain nothing: the rows form takes the unshared path, so its
/// values are bit for bit those of `token_logprobs_at` over the same rows.
#[test]
fn rows_without_a_shared_prompt_take_the_unshared_path() {
    let m = model(Arch::Qwen3, DType::F32, 14);
    let g = groups(&[(4, &[5]), (6, &[1]), (3, &[6])], 75); // 33 shared vs 27 unshared positions
    let rows: Vec<(&[u32], &[u32])> = g
        .iter()
        .map(|x| (&x.prompt[..], &x.completions[0][..]))
        .collect();
    let batch = SharedPrefixBatch::from_rows(&rows).0;
    assert!(batch.decoder_positions() >= batch.unshared_positions());
    let got = m
        .shared_prefix_logprobs_rows(&rows, TEMPERATURE, true, false)
        .unwrap();
    let want = unshared(&m, &g, false);
    assert_eq!(host(&got.logprobs), host(&want.logprobs));
    assert_eq!(
        host(got.entropy.as_ref().unwrap()),
        host(want.entropy.as_ref().unwrap())
    );
}

/// The comparison is sensitive: changing one prompt token of the shared side moves every row of
/// its group far outside the tolerance.
#[test]
fn a_changed_prompt_token_is_seen() {
    let m = model(Arch::Qwen2, DType::F32, 11);
    let g = groups(&[(6, &[4, 3])], 80);
    let mut h = g.clone();
    h[0].prompt[1] = (h[0].prompt[1] + 1) % VOCAB as u32;
    let a = host(&shared(&m, &h, false).logprobs);
    let b = host(&unshared(&m, &g, false).logprobs);
    assert!(rel_gap(&a, &b) > 1e-3, "{}", rel_gap(&a, &b));
}

#[test]
fn the_shared_layout_counts_each_prompt_once() {
    let g = groups(&[(110, &[64; 8])], 90);
    let batch = SharedPrefixBatch { groups: g };
    assert_eq!(batch.rows(), 8);
    assert_eq!(batch.longest_completion(), 64);
    assert_eq!(batch.decoder_positions(), 110 + 8 * 63);
    assert_eq!(batch.unshared_positions(), 8 * 174);
}

#[test]
fn invalid_batches_are_refused_with_the_reason() {
    let m = model(Arch::Qwen2, DType::F32, 12);
    let err = |groups: Vec<PromptGroup>, t: f64| -> String {
        let batch = SharedPrefixBatch { groups };
        match m.shared_prefix_logprobs(&batch, t, false, false) {
            Ok(_) => panic!("accepted"),
            Err(e) => e.to_string(),
        }
    };
    let grp = |p: Vec<u32>, c: Vec<Vec<u32>>| PromptGroup {
        prompt: p,
        completions: c,
    };
    assert!(err(vec![], 1.0).contains("no completion rows"));
    assert!(err(vec![grp(vec![], vec![vec![1]])], 1.0).contains("empty prompt"));
    assert!(err(vec![grp(vec![1], vec![vec![VOCAB as u32]])], 1.0).contains("outside"));
    assert!(err(vec![grp(vec![1], vec![vec![2]])], 0.0).contains("temperature"));
    // Only empty completions: a [R, 0] result, no decoder work.
    let out = m
        .shared_prefix_logprobs(
            &SharedPrefixBatch {
                groups: vec![grp(vec![1, 2], vec![vec![], vec![]])],
            },
            1.0,
            true,
            true,
        )
        .unwrap();
    assert_eq!(out.logprobs.dims(), &[2, 0]);
}

/// Sliding-window models: Mistral with a 3-token window on both layers, Qwen2 with YaRN and a
/// 4-token window on layer 1 only, Gemma 2 with a 3-token window on layer 0 and softcapping that
/// bends (attention 1, logits 2), Gemma 3 with a 4-token window (and its local rotary base) on
/// layer 1 and linear scaling on layer 0 (`window: false`: the same model without its window).
fn window_config(arch: Arch, window: bool) -> ModelConfig {
    let mut c = config(arch);
    let (size, layers) = match arch {
        Arch::Mistral => (3, vec![true, true]),
        Arch::Gemma2 => {
            let g = c.gemma.as_mut().unwrap();
            g.attn_logit_softcapping = Some(1.0);
            g.final_logit_softcapping = Some(2.0);
            (3, vec![true, false])
        }
        Arch::Gemma3 => {
            c.rope_scaling = Some(RopeScaling::Linear { factor: 4.0 });
            (4, vec![false, true])
        }
        _ => {
            c.rope_scaling = Some(RopeScaling::Yarn {
                factor: 4.0,
                original_max_position_embeddings: 8.0,
                beta_fast: 32.0,
                beta_slow: 1.0,
                attention_factor: None,
                mscale: 0.0,
                mscale_all_dim: 0.0,
                truncate: true,
            });
            (4, vec![false, true])
        }
    };
    c.sliding_window = window.then_some(SlidingWindow { size, layers });
    c
}

fn window_model(arch: Arch, dtype: DType, seed: u64, window: bool) -> Model {
    let m = Model::random(window_config(arch, window), 0.3, seed, dtype, &Device::Cpu).unwrap();
    randomise(&m, seed + 100);
    m
}

/// The shared-prompt layout equals the unshared one through a sliding window shorter than the
/// rows (prompts of 3 to 9 tokens, completions to 7): values and gradients, plain, with
/// activation checkpointing and with LoRA adapters; and the window does change the values.
#[test]
fn sliding_window_models_match_the_unshared_path() {
    for (i, arch) in [Arch::Mistral, Arch::Qwen2, Arch::Gemma2, Arch::Gemma3]
        .into_iter()
        .enumerate()
    {
        let g = groups(MIXED, 80 + i as u64);
        for dtype in [DType::F32, DType::F64] {
            let m = window_model(arch, dtype, 60 + i as u64, true);
            let mut ckpt = m.clone();
            ckpt.set_gradient_checkpointing(true);
            for (what, s) in [("plain", &m), ("checkpointed", &ckpt)] {
                check(Check {
                    what: &format!("{arch:?} {dtype:?} window {what}"),
                    shared_model: s,
                    unshared_model: &m,
                    shared_parts: one_part(&g),
                    whole: g.clone(),
                    tol: tol(dtype),
                });
            }
        }
        let mut m = window_model(arch, DType::F32, 64, true);
        let lora = LoraConfig {
            rank: 2,
            alpha: 4.0,
            targets: LoraTarget::ALL.to_vec(),
            dropout: 0.0,
        };
        m.add_lora(&lora, 9).unwrap();
        randomise(&m, 78);
        let mut ckpt = m.clone();
        ckpt.set_gradient_checkpointing(true);
        check(Check {
            what: &format!("{arch:?} window LoRA checkpointed"),
            shared_model: &ckpt,
            unshared_model: &m,
            shared_parts: one_part(&g),
            whole: g.clone(),
            tol: 1e-5,
        });
        // The same weights without the window score differently.
        let with = window_model(arch, DType::F64, 60 + i as u64, true);
        let without = window_model(arch, DType::F64, 60 + i as u64, false);
        let (a, b) = (
            real(&unshared(&with, &g, false).logprobs, &g),
            real(&unshared(&without, &g, false).logprobs, &g),
        );
        let gap = a
            .iter()
            .zip(&b)
            .fold(0f64, |m, (x, y)| m.max((x - y).abs()));
        assert!(gap > 1e-3, "{arch:?}: the window changed nothing ({gap:e})");
    }
}
