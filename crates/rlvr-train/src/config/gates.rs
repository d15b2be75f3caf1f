//! Knobs read only when another option turns them on ([`GATES`]). Setting such a knob while its
//! option is off is an error naming that option (README: an option that does not apply is an
//! error), since nothing would read the value: `algorithm.tau` without a regulariser,
//! `algorithm.mismatch_cap` with `mismatch_correction = "none"`, a vLLM key with the native engine.
//!
//! Only keys the user wrote count (the file and `--set`; on `--resume`, the `--set` overrides),
//! never values a preset or a default filled in. The loss-specific knobs of `[algorithm]` (which
//! loss reads `clip_low`, ...) are rlvr-algo's check ([`rlvr_algo::AlgorithmConfig::resolve`]).

use rlvr_algo::{
    Baseline, KeepMask, MismatchCorrection, Overlong, RecWeight, Regulariser, StdNorm,
};

use super::{ResolvedConfig, RolloutBackend, Schedule};

/// A knob and the option that turns it on.
#[derive(Clone, Copy)]
pub struct Gate {
    /// The knob's dotted key (`algorithm.tau`).
    pub key: &'static str,
    /// The dotted key of the option that turns it on (`algorithm.regulariser`).
    pub gate: &'static str,
    /// The values of `gate` that turn the knob on, as the error says them.
    pub when: &'static str,
    /// Whether the resolved config reads the knob.
    pub reads: fn(&ResolvedConfig) -> bool,
}

impl std::fmt::Debug for Gate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Gate({} by {})", self.key, self.gate)
    }
}

macro_rules! gate {
    ($key:literal, $gate:literal, $when:literal, |$c:ident| $reads:expr) => {
        Gate {
            key: $key,
            gate: $gate,
            when: $when,
            reads: |$c: &ResolvedConfig| $reads,
        }
    };
}

/// Every knob that is read only when another option is on (a test walks it, and fails when a
/// documented key says "only read"/"only when"/"vLLM backend" without an entry here).
pub const GATES: &[Gate] = &[
    // [algorithm]: advantages.
    gate!(
        "algorithm.lme_temperature",
        "algorithm.baseline",
        "\"log-mean-exp\"",
        |c| c.algorithm.baseline == Baseline::LogMeanExp
    ),
    gate!(
        "algorithm.std_eps",
        "algorithm.std_norm",
        "\"sample\" or \"population\"",
        |c| c.algorithm.std_norm != StdNorm::None
    ),
    gate!(
        "algorithm.std_level",
        "algorithm.std_norm",
        "\"sample\" or \"population\"",
        |c| c.algorithm.std_norm != StdNorm::None
    ),
    gate!(
        "algorithm.red_drop_in_normaliser",
        "algorithm.red_drop",
        "true",
        |c| c.algorithm.red_drop
    ),
    gate!(
        "algorithm.red_drop_rule",
        "algorithm.red_drop",
        "true",
        |c| c.algorithm.red_drop
    ),
    // [algorithm]: within the REC loss.
    gate!(
        "algorithm.clip_low_prime",
        "algorithm.keep_mask",
        "\"ring\"",
        |c| c.algorithm.keep_mask == KeepMask::Ring
    ),
    gate!(
        "algorithm.clip_high_prime",
        "algorithm.keep_mask",
        "\"ring\"",
        |c| c.algorithm.keep_mask == KeepMask::Ring
    ),
    gate!(
        "algorithm.adv_temperature",
        "algorithm.rec_weight",
        "\"advantage-exp\"",
        |c| c.algorithm.rec_weight == RecWeight::AdvantageExp
    ),
    // [algorithm]: regulariser, KL, corrections, overlong.
    gate!(
        "algorithm.tau",
        "algorithm.regulariser",
        "\"opmd\" or \"asymre\"",
        |c| c.algorithm.regulariser != Regulariser::None
    ),
    gate!(
        "algorithm.kl_estimator",
        "algorithm.kl_coef",
        "≠ 0",
        |c| c.algorithm.kl_coef != 0.0
    ),
    gate!(
        "algorithm.kl_ratio_weighted",
        "algorithm.kl_coef",
        "≠ 0",
        |c| c.algorithm.kl_coef != 0.0
    ),
    gate!(
        "model.reference",
        "algorithm.kl_coef",
        "≠ 0 (the reference is loaded for the KL term)",
        |c| c.algorithm.kl_coef != 0.0
    ),
    gate!(
        "algorithm.mismatch_cap",
        "algorithm.mismatch_correction",
        "a truncation, a mask or \"icepop\"",
        |c| c.algorithm.mismatch_correction.reads_cap()
    ),
    gate!(
        "algorithm.mismatch_low",
        "algorithm.mismatch_correction",
        "\"token-mask\", \"sequence-mask\", \"geometric-mask\" or \"icepop\"",
        |c| c.algorithm.mismatch_correction.has_lower_bound()
    ),
    gate!(
        "algorithm.mismatch_k3_threshold",
        "algorithm.mismatch_correction",
        "\"sequence-k3-mask\"",
        |c| c.algorithm.mismatch_correction == MismatchCorrection::SequenceK3Mask
    ),
    gate!(
        "algorithm.overlong_buffer_frac",
        "algorithm.overlong",
        "\"soft\"",
        |c| c.algorithm.overlong == Overlong::Soft
    ),
    gate!(
        "algorithm.overlong_penalty_factor",
        "algorithm.overlong",
        "\"soft\"",
        |c| c.algorithm.overlong == Overlong::Soft
    ),
    // [train].
    gate!(
        "train.min_lr",
        "train.schedule",
        "\"linear\" or \"cosine\"",
        |c| c.raw.train.schedule != Schedule::Constant
    ),
    gate!(
        "train.dynamic_sampling_max_rounds",
        "algorithm.dynamic_sampling",
        "true",
        |c| c.algorithm.dynamic_sampling
    ),
    gate!(
        "train.dynamic_sampling_short_batch",
        "algorithm.dynamic_sampling",
        "true",
        |c| c.algorithm.dynamic_sampling
    ),
    // [model]: LoRA.
    gate!("model.lora_alpha", "model.lora_rank", "≥ 1", |c| c
        .raw
        .model
        .lora_rank
        > 0),
    gate!("model.lora_targets", "model.lora_rank", "≥ 1", |c| c
        .raw
        .model
        .lora_rank
        > 0),
    gate!("model.lora_dropout", "model.lora_rank", "≥ 1", |c| c
        .raw
        .model
        .lora_rank
        > 0),
    // [rollout]: the vLLM backend.
    gate!("rollout.servers", "rollout.backend", "\"vllm\"", |c| vllm(
        c
    )),
    gate!(
        "rollout.served_model_name",
        "rollout.backend",
        "\"vllm\"",
        |c| vllm(c)
    ),
    gate!("rollout.weights_dir", "rollout.backend", "\"vllm\"", |c| {
        vllm(c)
    }),
    gate!("rollout.api_key_env", "rollout.backend", "\"vllm\"", |c| {
        vllm(c)
    }),
    gate!(
        "rollout.request_timeout_s",
        "rollout.backend",
        "\"vllm\"",
        |c| vllm(c)
    ),
    gate!("rollout.retries", "rollout.backend", "\"vllm\"", |c| vllm(
        c
    )),
    gate!(
        "rollout.in_flight",
        "rollout.backend",
        "\"vllm\"",
        |c| vllm(c)
    ),
    gate!(
        "rollout.accept_renormalised_logprobs",
        "rollout.backend",
        "\"vllm\"",
        |c| vllm(c)
    ),
    gate!(
        "rollout.refresh_tolerance",
        "rollout.backend",
        "\"vllm\"",
        |c| vllm(c)
    ),
];

fn vllm(c: &ResolvedConfig) -> bool {
    c.raw.rollout.backend == RolloutBackend::Vllm
}

/// Refuses a knob of [`GATES`] that the user wrote (`written`: dotted keys with where each was
/// written) while its option is off.
///
/// # Errors
/// The first such knob: its key, where it was written, the option and its value in force, the
/// values that would read it, and the two fixes.
pub fn check(cfg: &ResolvedConfig, written: &[super::Written]) -> anyhow::Result<()> {
    let resolved: Option<toml::Table> = cfg.to_toml().ok().and_then(|t| t.parse().ok());
    for g in GATES {
        let Some(w) = written
            .iter()
            .find(|w| w.key == g.key || w.key.starts_with(&format!("{}.", g.key)))
        else {
            continue;
        };
        if (g.reads)(cfg) {
            continue;
        }
        let value = resolved
            .as_ref()
            .and_then(|t| lookup(t, g.gate))
            .map_or_else(|| "unset".to_string(), |v| v.to_string());
        let (table, field) = g.key.rsplit_once('.').unwrap_or(("", g.key));
        anyhow::bail!(
            "{} is set ({}) but nothing reads it: {} = {value}, and {field} is read only when {} \
             is {}; remove `{field}` from [{table}], or set {}",
            g.key,
            w.origin,
            g.gate,
            g.gate,
            g.when,
            g.gate
        );
    }
    Ok(())
}

/// The value at dotted `key` of `t`.
fn lookup<'a>(t: &'a toml::Table, key: &str) -> Option<&'a toml::Value> {
    let mut parts = key.split('.');
    let mut cur = t.get(parts.next()?)?;
    for p in parts {
        cur = cur.as_table()?.get(p)?;
    }
    Some(cur)
}

/// `text` (the resolved config as TOML, `toml::to_string_pretty`'s layout: `[table]` headers,
/// one `key = value` per line, an array over several lines closed by a line `]`) without the
/// knobs of [`GATES`] that `cfg` does not read: what `config.toml` and `--print-config` hold, so
/// that they load again as a `--config`.
///
/// When it leaves knobs out, the text starts with a comment line [`UNREAD_COMMENT`] followed by
/// their dotted keys, comma-separated: `rlvr lab` reads it to tell a knob an older config.toml
/// still holds (written before such knobs were left out) from a change of the sweep.
pub fn drop_unread(cfg: &ResolvedConfig, text: &str) -> String {
    let unread: Vec<&str> = GATES
        .iter()
        .filter(|g| !(g.reads)(cfg))
        .map(|g| g.key)
        .collect();
    let mut out = String::with_capacity(text.len());
    let mut table = String::new();
    let mut skipping_array = false;
    let mut left_out = Vec::new();
    for line in text.lines() {
        if skipping_array {
            skipping_array = line.trim() != "]";
            continue;
        }
        let l = line.trim();
        if let Some(h) = l.strip_prefix('[').and_then(|h| h.strip_suffix(']')) {
            if !l.starts_with("[[") {
                table = h.trim().to_string();
            }
        } else if let Some((k, v)) = l.split_once(" = ") {
            let key = format!("{table}.{}", k.trim().trim_matches('"'));
            if unread.contains(&key.as_str()) {
                let v = v.trim();
                skipping_array = v.starts_with('[') && !v.ends_with(']');
                left_out.push(key);
                continue;
            }
        }
        out.push_str(line);
        out.push('\n');
    }
    match left_out.is_empty() {
        true => out,
        false => format!("{UNREAD_COMMENT}{}\n{out}", left_out.join(", ")),
    }
}

/// The start of the comment line of [`drop_unread`] (rlvr-lab's `runner::UNREAD_COMMENT` is the
/// same text; `crates/rlvr/tests/it/configs.rs` checks it).
pub const UNREAD_COMMENT: &str = "# Not read with these options, so left out: ";
