//! The metric keys of a run directory's JSONL files (DESIGN.md section 10) as typed values, so that
//! the writer (rlvr-train) and the readers (`rlvr plot`, the lab) cannot disagree on a spelling.

/// A key of every metrics.jsonl line (DESIGN.md section 10), in the order written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Metric {
    /// `step`: the 1-based step (0 for the warm start's evaluation line).
    Step,
    /// `loss`: the policy loss of the update.
    Loss,
    /// `reward/mean`.
    RewardMean,
    /// `reward/std`.
    RewardStd,
    /// `accuracy`: fraction of the step's completions judged correct.
    Accuracy,
    /// `completion_len/mean`: tokens.
    CompletionLenMean,
    /// `clip_frac`: fraction of trained tokens whose ratio was clipped.
    ClipFrac,
    /// `clip_frac/low`.
    ClipFracLow,
    /// `clip_frac/high`.
    ClipFracHigh,
    /// `ratio/mean`: π_θ/π_behaviour over trained tokens.
    RatioMean,
    /// `ratio/min`.
    RatioMin,
    /// `ratio/max`.
    RatioMax,
    /// `kl_ref`: KL to the reference policy per token (nats).
    KlRef,
    /// `kl_behaviour`: k3 estimate of KL(π_behaviour ‖ π_θ) per trained token (nats).
    KlBehaviour,
    /// `entropy`: mean token entropy (nats).
    Entropy,
    /// `ess`: effective sample size fraction of the importance weights.
    Ess,
    /// `grad_norm`: global gradient norm before clipping.
    GradNorm,
    /// `lr`: the learning rate of the step.
    Lr,
    /// `staleness/mean`: steps between the sampling policy and the trained one.
    StalenessMean,
    /// `staleness/max`.
    StalenessMax,
    /// `zero_std_frac`: fraction of groups whose rewards are all equal.
    ZeroStdFrac,
    /// `masked_frac`: fraction of tokens masked out of the loss.
    MaskedFrac,
    /// `skipped`: the update was skipped (true/false).
    Skipped,
    /// `time/sample_s`: wall seconds sampling (timing).
    TimeSampleS,
    /// `time/train_s`: wall seconds training (timing).
    TimeTrainS,
    /// `tokens_per_s`: trained tokens per wall second (timing).
    TokensPerS,
}

impl Metric {
    /// Every key, in the order a metrics.jsonl line writes them.
    pub const ALL: [Metric; 26] = [
        Metric::Step,
        Metric::Loss,
        Metric::RewardMean,
        Metric::RewardStd,
        Metric::Accuracy,
        Metric::CompletionLenMean,
        Metric::ClipFrac,
        Metric::ClipFracLow,
        Metric::ClipFracHigh,
        Metric::RatioMean,
        Metric::RatioMin,
        Metric::RatioMax,
        Metric::KlRef,
        Metric::KlBehaviour,
        Metric::Entropy,
        Metric::Ess,
        Metric::GradNorm,
        Metric::Lr,
        Metric::StalenessMean,
        Metric::StalenessMax,
        Metric::ZeroStdFrac,
        Metric::MaskedFrac,
        Metric::Skipped,
        Metric::TimeSampleS,
        Metric::TimeTrainS,
        Metric::TokensPerS,
    ];

    /// The key as written in the file.
    pub const fn key(self) -> &'static str {
        match self {
            Metric::Step => "step",
            Metric::Loss => "loss",
            Metric::RewardMean => "reward/mean",
            Metric::RewardStd => "reward/std",
            Metric::Accuracy => "accuracy",
            Metric::CompletionLenMean => "completion_len/mean",
            Metric::ClipFrac => "clip_frac",
            Metric::ClipFracLow => "clip_frac/low",
            Metric::ClipFracHigh => "clip_frac/high",
            Metric::RatioMean => "ratio/mean",
            Metric::RatioMin => "ratio/min",
            Metric::RatioMax => "ratio/max",
            Metric::KlRef => "kl_ref",
            Metric::KlBehaviour => "kl_behaviour",
            Metric::Entropy => "entropy",
            Metric::Ess => "ess",
            Metric::GradNorm => "grad_norm",
            Metric::Lr => "lr",
            Metric::StalenessMean => "staleness/mean",
            Metric::StalenessMax => "staleness/max",
            Metric::ZeroStdFrac => "zero_std_frac",
            Metric::MaskedFrac => "masked_frac",
            Metric::Skipped => "skipped",
            Metric::TimeSampleS => "time/sample_s",
            Metric::TimeTrainS => "time/train_s",
            Metric::TokensPerS => "tokens_per_s",
        }
    }

    /// Whether the value depends on wall-clock time (left out of reproducibility comparisons).
    pub const fn is_timing(self) -> bool {
        matches!(
            self,
            Metric::TimeSampleS | Metric::TimeTrainS | Metric::TokensPerS
        )
    }

    /// The metric whose key is `key`, if it is one.
    pub fn from_key(key: &str) -> Option<Metric> {
        Metric::ALL.into_iter().find(|m| m.key() == key)
    }
}

/// An `eval/*` key, written to eval.jsonl and, at evaluation steps, to metrics.jsonl.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Eval {
    /// `eval/accuracy`: held-out accuracy, a fraction in [0, 1].
    Accuracy,
    /// `eval/mean@k`: mean accuracy over k samples per problem.
    MeanAtK,
    /// `eval/pass@k`: fraction of problems with a correct sample among k.
    PassAtK,
    /// `eval/n`: problems evaluated (an integer).
    N,
}

impl Eval {
    /// Every `eval/*` key, in the order written.
    pub const ALL: [Eval; 4] = [Eval::Accuracy, Eval::MeanAtK, Eval::PassAtK, Eval::N];

    /// The key as written in the file.
    pub const fn key(self) -> &'static str {
        match self {
            Eval::Accuracy => "eval/accuracy",
            Eval::MeanAtK => "eval/mean@k",
            Eval::PassAtK => "eval/pass@k",
            Eval::N => "eval/n",
        }
    }
}

impl AsRef<str> for Metric {
    fn as_ref(&self) -> &str {
        self.key()
    }
}

impl AsRef<str> for Eval {
    fn as_ref(&self) -> &str {
        self.key()
    }
}

impl std::fmt::Display for Metric {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.key())
    }
}

impl std::fmt::Display for Eval {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.key())
    }
}

const fn all_keys() -> [&'static str; 26] {
    let mut out = [""; 26];
    let mut i = 0;
    while i < 26 {
        out[i] = Metric::ALL[i].key();
        i += 1;
    }
    out
}

/// The wall time of a step's environment calls (`time/env_s`, written beside the metric keys when
/// a run has `[env]`): timing, like the [`Metric::is_timing`] keys.
pub const ENV_TIME_KEY: &str = "time/env_s";

const fn timing_keys() -> [&'static str; 4] {
    let mut out = [ENV_TIME_KEY; 4];
    let (mut i, mut j) = (0, 0);
    while i < 26 {
        if Metric::ALL[i].is_timing() {
            out[j] = Metric::ALL[i].key();
            j += 1;
        }
        i += 1;
    }
    out
}

/// The keys of [`Metric::ALL`] as strings, in the order written.
pub const METRIC_KEYS: [&str; 26] = all_keys();

/// The keys whose values depend on wall-clock time ([`Metric::is_timing`], then
/// [`ENV_TIME_KEY`]).
pub const TIME_KEYS: [&str; 4] = timing_keys();

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_distinct_and_round_trip() {
        for (i, m) in Metric::ALL.iter().enumerate() {
            assert_eq!(Metric::from_key(m.key()), Some(*m));
            assert_eq!(METRIC_KEYS[i], m.key());
            assert!(!Metric::ALL[..i].contains(m), "{m} twice");
        }
        assert_eq!(Metric::from_key("eval/accuracy"), None);
        assert_eq!(
            TIME_KEYS,
            [
                "time/sample_s",
                "time/train_s",
                "tokens_per_s",
                "time/env_s"
            ]
        );
        assert_eq!(Eval::ALL.map(Eval::key)[3], "eval/n");
    }
}
