//! Named algorithm presets (DESIGN.md section 4's table), as data.
//!
//! A preset is a partial [`AlgorithmConfig`]: the knobs it sets. [`AlgorithmConfig::resolve`] applies it
//! under the user's values (defaults < preset < file < `--set`). Every preset sets `kl_coef = 0` and
//! `entropy_coef = 0` explicitly; anything a preset does not list keeps the config default. The sync
//! interval is never part of a preset (it is `sync.interval`).

use std::io::Write;
use std::sync::LazyLock;

use crate::config::{
    Aggregation as Ag, AlgorithmConfig, Baseline, KeepMask, Overlong, PolicyLoss as L, RecWeight,
    RedDropRule, Regulariser, StdLevel, StdNorm,
};
use crate::error::{AlgoError, Result};

/// One named preset.
#[derive(Debug, Clone)]
pub struct Preset {
    /// Name used in `algorithm.preset`.
    pub name: &'static str,
    /// One-line description.
    pub description: &'static str,
    /// Paper (arXiv id) and the equation the preset implements, written out.
    pub reference: &'static str,
    /// The code the preset's values follow (repository, file, commit where it matters), or that
    /// no peer's code was compared.
    pub follows: &'static str,
    /// The knobs the preset sets (`preset` field empty); all others keep their defaults.
    pub values: AlgorithmConfig,
}

/// Builder shorthand: advantage block.
fn adv(std_norm: StdNorm) -> AlgorithmConfig {
    let mut c = AlgorithmConfig::empty("");
    c.baseline = Some(Baseline::Mean);
    c.std_norm = Some(std_norm);
    if std_norm != StdNorm::None {
        c.std_level = Some(StdLevel::Group);
        c.std_eps = Some(1e-6);
    }
    c.kl_coef = Some(0.0);
    c.entropy_coef = Some(0.0);
    c
}

fn ppo(mut c: AlgorithmConfig, lo: f64, hi: f64, agg: Ag) -> AlgorithmConfig {
    c.loss = Some(L::Ppo);
    c.clip_low = Some(lo);
    c.clip_high = Some(hi);
    c.aggregation = Some(agg);
    c
}

/// Paper B's presets follow its Trinity-RFT recipes (`examples/rec_gsm8k/README.md`), whose REC
/// loss takes the token mean over every row of the batch (`rec_policy_loss.py`, `masked_mean(pg_losses,
/// action_mask)`): zero-variance groups stay in the normaliser.
fn paper_b(mut c: AlgorithmConfig) -> AlgorithmConfig {
    c.exclude_zero_std = Some(false);
    c
}

fn rec(keep: KeepMask, weight: RecWeight, lo: f64, hi: f64, agg: Ag) -> AlgorithmConfig {
    rec_with(adv(StdNorm::None), keep, weight, lo, hi, agg)
}

fn rec_with(
    mut c: AlgorithmConfig,
    keep: KeepMask,
    weight: RecWeight,
    lo: f64,
    hi: f64,
    agg: Ag,
) -> AlgorithmConfig {
    c = paper_b(c);
    c.loss = Some(L::Rec);
    c.keep_mask = Some(keep);
    c.rec_weight = Some(weight);
    if keep != KeepMask::None {
        c.clip_low = Some(lo);
        c.clip_high = Some(hi);
    }
    if keep == KeepMask::Ring {
        c.clip_low_prime = Some(0.6);
        c.clip_high_prime = Some(2.0);
    }
    c.aggregation = Some(agg);
    c
}

fn reinforce(std_norm: StdNorm) -> AlgorithmConfig {
    let mut c = paper_b(adv(std_norm));
    c.loss = Some(L::Reinforce);
    c.aggregation = Some(Ag::TokenMean);
    c
}

/// One preset, its `follows` looked up by name.
fn preset(
    name: &'static str,
    description: &'static str,
    reference: &'static str,
    values: AlgorithmConfig,
) -> Preset {
    Preset {
        name,
        description,
        reference,
        follows: follows(name),
        values,
    }
}

// The preset table as data, one entry per row of DESIGN.md section 4's table, in its order: one
// small function per family of rows.
fn build() -> Vec<Preset> {
    [
        paper_a(),
        paper_b_rec(),
        paper_b_rep_red(),
        peers_ppo(),
        peers_other(),
    ]
    .concat()
}

/// GRPO and paper A's off-policy GRPO.
fn paper_a() -> Vec<Preset> {
    vec![
        preset(
            "grpo",
            "On-policy GRPO: group-whitened rewards, PPO clipped surrogate, per-sequence token mean",
            "arXiv 2402.03300 (DeepSeekMath) Eq. 3 and §4.1.2: A = (r - mean)/std, \
             J = mean_i mean_t min(rho*A, clip(rho, 1-eps, 1+eps)*A)",
            ppo(adv(StdNorm::Sample), 0.2, 0.2, Ag::SeqMeanTokenMean),
        ),
        preset(
            "off_policy_grpo",
            "Off-policy GRPO (paper A): as grpo, ratio against the stale behaviour policy; set sync.interval",
            "arXiv 2505.22257: J = E[min(rho*A, clip(rho, 1-eps, 1+eps)*A)], rho = pi_theta/alpha per token",
            ppo(adv(StdNorm::Sample), 0.2, 0.2, Ag::SeqMeanTokenMean),
        ),
    ]
}

/// Paper B's group-relative REINFORCE and its REC family: one row per keep-mask and weight.
fn paper_b_rec() -> Vec<Preset> {
    const ONE: &str =
        "arXiv 2509.24203 REC: L = -A'*k*logp, k = [A>=0, rho<=1+eps_h] or [A<=0, rho>=1-eps_l]";
    const TWO: &str = "arXiv 2509.24203 REC: L = -A'*k*logp, k = [1-eps_l <= rho <= 1+eps_h]";
    const RING: &str =
        "arXiv 2509.24203 REC: k = two-side or [A>=0, rho<=1-eps'_l] or [A<=0, rho>=1+eps'_h]";
    const GSPO: &str =
        "arXiv 2509.24203 REC with s = exp(mean_t(logp - logp_old)) in the keep-mask (and weight)";
    use KeepMask as K;
    use RecWeight as W;
    #[rustfmt::skip]
    let rows: [(&str, &str, &str, K, W); 8] = [
        ("rec_oneside_nois", "REC one-side keep-mask (PPO's clip pattern), no IS weight", ONE, K::OneSide, W::None),
        ("rec_oneside_is", "REC one-side keep-mask with token IS weight (same gradient as PPO clip)", ONE, K::OneSide, W::Is),
        ("rec_twoside_nois", "REC two-side keep-mask, no IS weight", TWO, K::TwoSide, W::None),
        ("rec_twoside_is", "REC two-side keep-mask with token IS weight", TWO, K::TwoSide, W::Is),
        ("rec_ring_nois", "REC ring keep-mask (two-side plus far-off-policy tokens that help), no IS", RING, K::Ring, W::None),
        ("rec_ring_is", "REC ring keep-mask with token IS weight", RING, K::Ring, W::Is),
        ("rec_gspo_nois", "REC one-side keep-mask on the sequence ratio, no IS weight", GSPO, K::GspoOneSide, W::None),
        ("rec_gspo_is", "REC one-side keep-mask on the sequence ratio, detached sequence IS weight", GSPO, K::GspoOneSide, W::SeqIs),
    ];
    let mut v = vec![preset(
        "reinforce",
        "Group-relative REINFORCE: -A*logp with the group mean as baseline, no std",
        "arXiv 2509.24203 (group-relative REINFORCE): L = -(r - mean_group) * log pi_theta",
        reinforce(StdNorm::None),
    )];
    for (name, desc, reference, keep, w) in rows {
        let values = match keep {
            K::GspoOneSide => rec(keep, w, 3e-4, 4e-4, Ag::SeqMeanTokenMean),
            _ => rec(keep, w, 0.2, 0.2, Ag::TokenMean),
        };
        v.push(preset(name, desc, reference, values));
    }
    v
}

/// Paper B's REP regularisers (OPMD, AsymRE), its RED variants, and GRPO as it runs it.
fn paper_b_rep_red() -> Vec<Preset> {
    // The regulariser acts on every sample, zero-variance groups included (−τ·ℓ pushes an
    // all-correct group up: the lowered baseline).
    let rep = |r: Regulariser| {
        let mut c = reinforce(StdNorm::None);
        c.regulariser = Some(r);
        c.tau = Some(0.1);
        c.exclude_zero_std = Some(false);
        c
    };
    // Trinity-RFT's RED-Drop recipe (examples/rec_gsm8k/README.md: `std_normalize: false`, `drop:
    // "balance"`; advantage_fn/rec_advantage.py): A = r - mean of the kept rows, no std; dropped
    // rows keep A = 0 in the batch, so they stay in the token-mean normaliser. As first written
    // (yaochaorui/Trinity-RFT 8a0e9e81, `rec_advantage.py`): each negative dropped with
    // probability 1 - pos/neg, the group mean of all rows kept.
    let red_drop = |rule: RedDropRule| {
        let mut c = reinforce(StdNorm::None);
        c.red_drop = Some(true);
        c.red_drop_in_normaliser = Some(true);
        c.red_drop_rule = (rule == RedDropRule::Bernoulli).then_some(rule);
        c
    };
    let mut red_weight = rec(
        KeepMask::None,
        RecWeight::AdvantageExp,
        0.2,
        0.2,
        Ag::TokenMean,
    );
    red_weight.adv_temperature = Some(1.0);
    vec![
        preset(
            "opmd",
            "Online policy mirror descent: REINFORCE plus tau*(logp - logp_old)^2 on every sample",
            "arXiv 2509.24203 REP / Kimi k1.5 arXiv 2501.12599: L = -A*logp + tau*(logp - logp_old)^2 \
             (Trinity's tau absorbs Kimi's 1/2; mean baseline)",
            rep(Regulariser::Opmd),
        ),
        preset(
            "asymre",
            "Asymmetric REINFORCE: REINFORCE with the baseline lowered by tau (zero-variance groups too)",
            "arXiv 2509.24203 REP (AsymRE): L = -A*logp - tau*logp = -(r - (mean - tau))*logp",
            rep(Regulariser::Asymre),
        ),
        preset(
            "red_drop",
            "RED-Drop: drop surplus negatives per group at random, centre on the kept rows (no std)",
            "arXiv 2509.24203 RED-Drop, as its Trinity-RFT recipe: balance negatives (r < mean), \
             A = r - mean_kept; dropped rows A = 0, still in the token mean",
            red_drop(RedDropRule::Surplus),
        ),
        preset(
            "red_drop_bernoulli",
            "RED-Drop as first written in Trinity-RFT: each negative dropped with probability 1 - pos/neg, mean not recomputed",
            "arXiv 2509.24203 RED-Drop, Trinity-RFT's first code: drop each r < mean with p = 1 - pos/neg, \
             A = r - mean_all (no std); dropped rows A = 0, still in the token mean",
            red_drop(RedDropRule::Bernoulli),
        ),
        preset(
            "red_weight",
            "RED-Weight: REINFORCE with advantages reweighted by exp(A/T)",
            "arXiv 2509.24203 RED-Weight: L = -A*exp(A/T)*logp, T = 1",
            red_weight,
        ),
        // Paper B's own GRPO baseline, its Trinity-RFT recipe (examples/rec_gsm8k/README.md
        // "GRPO": clip_mode one-side, weight importance_sampling, std_normalize true); the std is
        // the population std of the group (rec_advantage.py: `std(unbiased=False)`), the
        // aggregation the REC token mean.
        preset(
            "grpo_rec",
            "GRPO as paper B runs it: REC one-side keep-mask with the IS weight, population-std whitening, token mean",
            "arXiv 2509.24203 GRPO baseline (Trinity-RFT rec recipe): A = (r - mean)/(std_pop + eps), \
             L = -A*sg(rho)*k*logp, k = one-side keep-mask 0.2/0.2",
            rec_with(adv(StdNorm::Population), KeepMask::OneSide, RecWeight::Is, 0.2, 0.2, Ag::TokenMean),
        ),
    ]
}

/// GRPO as verl and Trinity-RFT ship it, Dr. GRPO and DAPO: the PPO clip with their settings.
fn peers_ppo() -> Vec<Preset> {
    // verl `compute_grpo_outcome_advantage` (torch.std, epsilon 1e-6) and actor defaults
    // (clip_ratio 0.2, clip_ratio_c 3.0, loss_agg_mode token-mean); Trinity-RFT
    // `grpo_advantage.py` and `ppo_policy_loss.py` (clip_ratio_c 3.0, token-mean). Their token
    // mean runs over every row: zero-variance groups stay in it.
    let mut grpo_verl = ppo(adv(StdNorm::Sample), 0.2, 0.2, Ag::TokenMean);
    grpo_verl.dual_clip = Some(3.0);
    grpo_verl.exclude_zero_std = Some(false);
    let mut dapo = ppo(adv(StdNorm::Sample), 0.2, 0.28, Ag::TokenMean);
    dapo.dynamic_sampling = Some(true);
    dapo.exclude_zero_std = Some(true);
    dapo.overlong = Some(Overlong::Soft);
    dapo.overlong_buffer_frac = Some(0.2);
    dapo.overlong_penalty_factor = Some(1.0);
    vec![
        preset(
            "grpo_verl",
            "GRPO as verl and Trinity-RFT ship it: sample-std whitening, PPO clip 0.2 with dual clip 3, token mean over every row",
            "arXiv 2402.03300 GRPO with verl's defaults: A = (r - mean)/(std + 1e-6), \
             L = -min(rho*A, clip(rho, 0.8, 1.2)*A), at most -3*A when A < 0 (dual clip), \
             summed over every token of the batch / their count",
            grpo_verl,
        ),
        preset(
            "dr_grpo",
            "Dr. GRPO: no std, PPO clip, constant normaliser B*max_new_tokens (no length bias)",
            "arXiv 2503.20783 (Understanding R1-Zero-Like Training, Dr. GRPO objective): A = r - mean, sum/(B*L_max)",
            ppo(adv(StdNorm::None), 0.2, 0.2, Ag::Constant),
        ),
        preset(
            "dapo",
            "DAPO: clip-higher 0.2/0.28, token mean, dynamic sampling, soft overlong penalty",
            "arXiv 2503.14476 (DAPO objective: clip-higher, token-level sum / total tokens; \
             soft overlong punishment R_length, L_cache = 0.2*L_max)",
            dapo,
        ),
    ]
}

/// GSPO, CISPO and TRL's GRPOTrainer defaults (its `dapo` and `bnpo` loss types).
fn peers_other() -> Vec<Preset> {
    let mut gspo = adv(StdNorm::Sample);
    gspo.loss = Some(L::Gspo);
    gspo.clip_low = Some(3e-4);
    gspo.clip_high = Some(4e-4);
    gspo.aggregation = Some(Ag::SeqMeanTokenMean);
    let mut cispo = adv(StdNorm::Sample);
    cispo.loss = Some(L::Cispo);
    cispo.clip_high = Some(0.28);
    cispo.aggregation = Some(Ag::TokenMean);
    // TRL 1.16 GRPOTrainer with its GRPOConfig defaults (`loss_type="dapo"`, `scale_rewards=
    // "group"`, epsilon 0.2, beta 0, importance_sampling_level "token"): A = (r - mean)/(std +
    // 1e-4) with the unbiased group std (trl/trainer/utils.py `nanstd`, the 1e-4 hard-coded in
    // grpo_trainer.py `_generate_and_score_completions`), the per-token clipped surrogate summed
    // over the update's tokens / their count (`num_items_in_batch`), zero-variance groups counted.
    let mut grpo_trl = ppo(adv(StdNorm::Sample), 0.2, 0.2, Ag::TokenMean);
    grpo_trl.std_eps = Some(1e-4);
    grpo_trl.exclude_zero_std = Some(false);
    vec![
        preset(
            "gspo",
            "GSPO: clipped surrogate on the length-normalised sequence ratio",
            "arXiv 2507.18071 (GSPO objective): s = exp(mean_t(logp - logp_old)), \
             J = mean_i min(s*A, clip(s, 1-3e-4, 1+4e-4)*A)",
            gspo,
        ),
        preset(
            "cispo",
            "CISPO: REINFORCE weighted by the detached, upper-clipped IS ratio",
            "arXiv 2506.13585 (MiniMax-M1, CISPO objective): L = -sg(min(rho, 1+eps_h))*A*logp, token mean",
            cispo,
        ),
        preset(
            "grpo_trl",
            "GRPO as TRL 1.16's GRPOTrainer runs it by default (loss_type \"dapo\"): std + 1e-4, PPO clip 0.2/0.2, token mean over every row of the update",
            "arXiv 2402.03300 GRPO with TRL's defaults: A = (r - mean)/(std + 1e-4), \
             L = -min(rho*A, clip(rho, 0.8, 1.2)*A) summed over every token of the update / their count",
            grpo_trl.clone(),
        ),
        // TRL's loss_type="bnpo" divides by the tokens of each micro-batch (then by the
        // accumulation steps); rlvr's normaliser is fixed once per update (DESIGN.md section 4),
        // so `bnpo` is the token mean per update: TRL's bnpo with one micro-batch per optimizer
        // step (gradient_accumulation_steps = 1, one process), where it equals TRL's dapo and so
        // grpo_trl's values.
        preset(
            "bnpo",
            "TRL's bnpo as a token mean per update (equal to TRL's when an update is one micro-batch): as grpo_trl",
            "arXiv 2402.03300 GRPO with TRL's loss_type=\"bnpo\": A = (r - mean)/(std + 1e-4), \
             L = -min(rho*A, clip(rho, 0.8, 1.2)*A) summed over the update's tokens / their count",
            grpo_trl,
        ),
    ]
}

/// The code each preset follows ([`Preset::follows`]), by name: a peer's file (and commit where
/// it changed), or the paper alone where no code was compared.
fn follows(name: &str) -> &'static str {
    const TRINITY_REC: &str =
        "Trinity-RFT trinity/algorithm/policy_loss_fn/rec_policy_loss.py and \
        advantage_fn/rec_advantage.py, recipe examples/rec_gsm8k/README.md (PR #292, f777fb22), \
        except Trinity's token mean divides by count + 1e-8 (relative 1e-8/count)";
    match name {
        "grpo" => {
            "TRL 1.16 GRPOTrainer loss_type=\"grpo\", scale_rewards=\"group\" (per-sequence \
             token mean, unbiased std), except std + 1e-6 (TRL 1e-4) and zero-variance groups \
             out of the normaliser (TRL counts them; rlvr's default, DESIGN.md section 5)"
        }
        "off_policy_grpo" => {
            "grpo's code (TRL 1.16 loss_type=\"grpo\", except std + 1e-6 and zero-variance \
             groups out of the normaliser) with sync.interval > 1; paper A's own code was not found"
        }
        "reinforce" | "rec_oneside_nois" | "rec_oneside_is" | "rec_twoside_nois"
        | "rec_twoside_is" | "rec_ring_nois" | "rec_ring_is" | "opmd" | "asymre" | "red_weight"
        | "grpo_rec" => TRINITY_REC,
        "rec_gspo_nois" | "rec_gspo_is" => {
            "Trinity-RFT rec_policy_loss.py clip_mode=\"gspo-one-side\", weight \
                   \"gspo_importance_sampling\" (yanxi-chen/Trinity-RFT 9051d637), except Trinity's \
                   per-row token mean divides by length + 1e-8"
        }
        "red_drop" => {
            "Trinity-RFT rec_advantage.py drop=\"balance\" as released (PR #292, f777fb22): \
                   exactly the surplus negatives dropped, mean recomputed on the kept rows"
        }
        "red_drop_bernoulli" => {
            "Trinity-RFT rec_advantage.py drop=\"balance\" as first written \
                   (yaochaorui/Trinity-RFT 8a0e9e81, 2025-09-12)"
        }
        "grpo_verl" => {
            "verl trainer/ppo/core_algos.py compute_grpo_outcome_advantage and \
                   compute_policy_loss_vanilla with actor.yaml defaults (b178a3cd); Trinity-RFT \
                   grpo_advantage.py and ppo_policy_loss.py defaults, except Trinity's token mean divides \
                   by count + 1e-8 (relative 1e-8/count)"
        }
        "gspo" => {
            "TRL 1.16 GRPOTrainer importance_sampling_level=\"sequence\", loss_type=\"grpo\", \
             epsilon 3e-4, epsilon_high 4e-4, except std + 1e-6 (TRL 1e-4) and zero-variance \
             groups out of the normaliser (TRL counts them)"
        }
        "cispo" => {
            "TRL 1.16 GRPOTrainer loss_type=\"cispo\" with epsilon_high = 1.28 (TRL's \
             epsilon_high is the absolute cap, here 1 + clip_high; TRL recommends 5.0: \
             clip_high = 4), except std + 1e-6 (TRL 1e-4) and zero-variance groups out of the \
             normaliser (TRL counts them)"
        }
        "grpo_trl" => {
            "TRL 1.16 GRPOTrainer with GRPOConfig's defaults (loss_type=\"dapo\", \
             scale_rewards=\"group\", epsilon 0.2, beta 0): no difference"
        }
        "bnpo" => {
            "TRL 1.16 GRPOTrainer loss_type=\"bnpo\", except the token mean is taken per update, \
             not per micro-batch (equal when gradient_accumulation_steps = 1 on one process)"
        }
        "dapo" => {
            "the DAPO paper's objective; no peer code compared (TRL's loss_type=\"dapo\", \
             its default, is preset grpo_trl)"
        }
        _ => "the paper's objective; no peer code compared",
    }
}

static PRESETS: LazyLock<Vec<Preset>> = LazyLock::new(build);

/// All presets, in DESIGN.md section 4's order.
pub fn presets() -> &'static [Preset] {
    &PRESETS
}

/// The preset called `name`.
///
/// # Errors
/// [`AlgoError::UnknownPreset`] listing the valid names, with "did you mean" naming the nearest
/// preset ([`preset_hint`]).
pub fn find_preset(name: &str) -> Result<&'static Preset> {
    presets()
        .iter()
        .find(|p| p.name == name)
        .ok_or_else(|| AlgoError::UnknownPreset {
            name: name.to_string(),
            hint: preset_hint(name),
            valid: presets()
                .iter()
                .map(|p| p.name)
                .collect::<Vec<_>>()
                .join(", "),
        })
}

/// The "did you mean" of an unknown preset name: TRL's loss_type names that are no preset of
/// that name (`sapo`, `luspo`, `vespo`: not implemented; `trl`), else the preset nearest by edit
/// distance after lower-casing and reading `-`, ` ` and `.` as `_` (`drgrpo`, `DR-GRPO` →
/// `dr_grpo`), within a third of the name's length (at least 1, at most 3 edits), else every
/// preset the name begins (`rec_ring`). Starts with `; ` when not empty.
pub fn preset_hint(name: &str) -> String {
    let norm: String = name
        .trim()
        .to_lowercase()
        .chars()
        .map(|c| if matches!(c, '-' | ' ' | '.') { '_' } else { c })
        .collect();
    match norm.as_str() {
        "sapo" | "luspo" | "vespo" => {
            return format!(
                "; TRL's loss_type=\"{norm}\" has no rlvr preset (rlvr's losses: ppo, gspo, cispo, \
                 reinforce, rec)"
            )
        }
        "trl" | "trl_grpo" | "grpotrainer" => {
            return "; did you mean `grpo_trl`? (TRL GRPOTrainer's defaults)".into()
        }
        _ => {}
    }
    if let Some(p) = presets().iter().find(|p| p.name == norm) {
        return format!("; did you mean `{}`?", p.name);
    }
    let limit = (norm.chars().count() / 3).clamp(1, 3);
    presets()
        .iter()
        .map(|p| (strsim::damerau_levenshtein(&norm, p.name), p.name))
        .filter(|(d, _)| *d <= limit)
        .min_by_key(|(d, _)| *d)
        .map(|(_, n)| format!("; did you mean `{n}`?"))
        .unwrap_or_else(|| {
            // A prefix of some presets' names (`rec_ring`): all of them.
            let starts: Vec<String> = presets()
                .iter()
                .filter(|p| norm.len() >= 3 && p.name.starts_with(&norm))
                .map(|p| format!("`{}`", p.name))
                .collect();
            match starts.len() {
                0 => String::new(),
                1 => format!("; did you mean {}?", starts[0]),
                _ => format!("; did you mean one of {}?", starts.join(", ")),
            }
        })
}

/// docs/algorithms.md's preset table (a test keeps it equal): per preset, as Markdown rows, the
/// resolved advantage ε (`std_eps`, or "no std"), whether zero-variance groups count in the
/// normaliser, the aggregation, and [`Preset::follows`].
pub fn follows_table() -> String {
    let mut out = String::from(
        "| preset | std + ε | zero-variance groups | aggregation | follows |\n|---|---|---|---|---|\n",
    );
    for p in presets() {
        let a = crate::AlgorithmConfig::empty(p.name)
            .resolve()
            .expect("every preset resolves");
        let eps = match a.advantage.std {
            None => "no std".to_string(),
            Some(d) => format!("{:?} std + {:e}", d.norm, d.eps).to_lowercase(),
        };
        let zero = if a.advantage.exclude_zero_std {
            "out of the normaliser"
        } else {
            "counted"
        };
        let agg = serde_json::to_value(a.aggregation)
            .ok()
            .and_then(|v| v.as_str().map(str::to_string))
            .unwrap_or_default();
        out.push_str(&format!(
            "| `{}` | {eps} | {zero} | {agg} | {} |\n",
            p.name,
            p.follows.replace('|', "\\|")
        ));
    }
    out
}

/// Writes the `rlvr algorithms` listing: per preset its name, description, reference and every value it
/// sets (as `key = value` lines ready for an `[algorithm]` table).
///
/// # Errors
/// Any error of `out`.
pub fn print_algorithms(out: &mut dyn Write) -> std::io::Result<()> {
    writeln!(
        out,
        "Algorithm presets (select with algorithm.preset = \"NAME\"; any value below can be overridden;\n\
         unlisted keys keep their defaults; the sync interval is sync.interval, never part of a preset)\n"
    )?;
    for p in presets() {
        writeln!(
            out,
            "{}\n  {}\n  ref: {}\n  follows: {}",
            p.name, p.description, p.reference, p.follows
        )?;
        for (k, v) in p.values.set_values() {
            writeln!(out, "    {k} = {v}")?;
        }
        writeln!(out)?;
    }
    Ok(())
}
