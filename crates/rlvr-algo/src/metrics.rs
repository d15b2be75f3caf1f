//! Loss diagnostics: sums that accumulate over micro-batches (and updates), then finalise to DESIGN.md section 10
//! metric values.

use crate::advantage::AdvantageStats;

/// Edges of the ratio histograms, in log-ratio (nats): log ρ = ±10^k for k = −4..1, so that the
/// buckets are log-spaced in |log ρ| on each side of ρ = 1. Bucket 0 is log ρ < −10, bucket k
/// (1 ≤ k ≤ 11) is `EDGES[k−1] ≤ log ρ < EDGES[k]`, bucket 12 is log ρ ≥ 10; bucket 6,
/// |log ρ| < 1e-4 (−1e-4 included), is "ρ = 1 within 0.01%".
pub const RATIO_HIST_EDGES: [f64; 12] = [
    -10.0, -1.0, -0.1, -0.01, -1e-3, -1e-4, 1e-4, 1e-3, 0.01, 0.1, 1.0, 10.0,
];

/// Number of buckets of a ratio histogram (`RATIO_HIST_EDGES.len() + 1`).
pub const RATIO_BUCKETS: usize = RATIO_HIST_EDGES.len() + 1;

/// The bucket of [`RATIO_HIST_EDGES`] that log-ratio `x` (nats) falls in: the number of edges
/// ≤ x. NaN falls in bucket 0.
pub fn ratio_bucket(x: f64) -> usize {
    RATIO_HIST_EDGES.iter().take_while(|&&e| x >= e).count()
}

/// A human label of bucket `k` of [`RATIO_HIST_EDGES`] in log ρ (`"log ρ < -10"`, `"[-1, -0.1)"`,
/// `"|log ρ| < 1e-4"`, `"≥ 10"`), for figures.
pub fn ratio_bucket_label(k: usize) -> String {
    let e = |i: usize| {
        let v = RATIO_HIST_EDGES[i];
        if v.abs() < 0.01 {
            format!("{v:.0e}")
        } else {
            format!("{v}")
        }
    };
    let n = RATIO_HIST_EDGES.len();
    if k == 0 {
        format!("log ρ < {}", e(0))
    } else if k >= n {
        format!("log ρ ≥ {}", e(n - 1))
    } else if RATIO_HIST_EDGES[k - 1] < 0.0 && RATIO_HIST_EDGES[k] > 0.0 {
        format!("|log ρ| < {}", e(k))
    } else {
        format!("[{}, {})", e(k - 1), e(k))
    }
}

/// What one correction (the sampler/trainer mismatch correction, or OPSM) did to the trained tokens
/// of one or more micro-batches. Counts in completion tokens and rows of rows in the normaliser;
/// summed over micro-batches, updates and data-parallel ranks.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct CorrectionCounts {
    /// Tokens the correction looked at.
    pub tokens: f64,
    /// Of those, tokens whose weight it set to 0.
    pub masked_tokens: f64,
    /// Of those, tokens whose weight it capped (truncated IS).
    pub truncated_tokens: f64,
    /// Rows (with at least one token) it looked at.
    pub rows: f64,
    /// Rows with at least one masked token (verl's `rollout_rs_seq_masked_fraction`).
    pub masked_rows: f64,
    /// Rows with at least one truncated token.
    pub truncated_rows: f64,
}

impl CorrectionCounts {
    /// Adds one row of `tokens` tokens of which `masked` were masked and `truncated` truncated.
    pub fn add_row(&mut self, tokens: usize, masked: usize, truncated: usize) {
        if tokens == 0 {
            return;
        }
        self.tokens += tokens as f64;
        self.masked_tokens += masked as f64;
        self.truncated_tokens += truncated as f64;
        self.rows += 1.0;
        self.masked_rows += f64::from(u8::from(masked > 0));
        self.truncated_rows += f64::from(u8::from(truncated > 0));
    }

    /// Adds `other`'s counts.
    pub fn merge(&mut self, other: &CorrectionCounts) {
        for (a, b) in self.as_array_mut().into_iter().zip(other.as_array()) {
            *a += b;
        }
    }

    fn as_array(&self) -> [f64; 6] {
        [
            self.tokens,
            self.masked_tokens,
            self.truncated_tokens,
            self.rows,
            self.masked_rows,
            self.truncated_rows,
        ]
    }

    fn as_array_mut(&mut self) -> [&mut f64; 6] {
        [
            &mut self.tokens,
            &mut self.masked_tokens,
            &mut self.truncated_tokens,
            &mut self.rows,
            &mut self.masked_rows,
            &mut self.truncated_rows,
        ]
    }

    fn from_array(a: [f64; 6]) -> Self {
        CorrectionCounts {
            tokens: a[0],
            masked_tokens: a[1],
            truncated_tokens: a[2],
            rows: a[3],
            masked_rows: a[4],
            truncated_rows: a[5],
        }
    }

    /// `(masked token share, masked row share, truncated token share, truncated row share)`, each
    /// `None` when nothing was looked at.
    pub fn fractions(&self) -> [Option<f64>; 4] {
        let frac = |num: f64, den: f64| (den > 0.0).then(|| num / den);
        [
            frac(self.masked_tokens, self.tokens),
            frac(self.masked_rows, self.rows),
            frac(self.truncated_tokens, self.tokens),
            frac(self.truncated_rows, self.rows),
        ]
    }
}

/// Additive sums behind the loss metrics of one or more micro-batches. Counts are in completion tokens
/// of rows that are in the normaliser ("trained tokens") unless said otherwise. Merge with
/// [`LossStats::merge`]; finish with [`LossStats::finalise`].
#[derive(Debug, Clone, PartialEq)]
pub struct LossStats {
    /// Σ of the scalar losses returned (each already normalised), i.e. the update loss.
    pub loss: f64,
    /// The policy-gradient term's part of `loss` (the surrogate alone, aggregated as the loss).
    pub pg_loss: f64,
    /// The rest of `loss`: the regulariser (OPMD's +τx², AsymRE's −τℓ), the KL penalty β·k and
    /// the entropy bonus −c_H·H, aggregated as the loss (`pg_loss + reg_loss = loss` up to
    /// rounding).
    pub reg_loss: f64,
    /// All completion tokens (Σ mask), trained or not.
    pub tokens_total: f64,
    /// Trained tokens.
    pub tokens: f64,
    /// Trained tokens with A ≠ 0 whose PG term the clip or keep-mask zeroed, with ρ̄ < 1.
    pub clipped_low: f64,
    /// Same with ρ̄ ≥ 1 (includes dual-clipped tokens). CISPO zeroes nothing: it counts here the tokens
    /// whose IS weight was capped at 1 + ε_high (their gradient is scaled, not zeroed).
    pub clipped_high: f64,
    /// Trained tokens whose PG term the dual-clip bound −c·A set (A < 0 and ratio > c).
    pub dual_clipped: f64,
    /// Trained tokens of losses with a dual clip (0 without one, so that the share is null).
    pub dual_clip_tokens: f64,
    /// Trained tokens with A > 0.
    pub pos_tokens: f64,
    /// Of those, clipped (zeroed).
    pub clipped_pos: f64,
    /// Trained tokens with A < 0.
    pub neg_tokens: f64,
    /// Of those, clipped (zeroed).
    pub clipped_neg: f64,
    /// Σ ρ̄ over trained tokens (ρ̄ = exp(clamped ℓ − ℓ_old), before any truncated-IS cap).
    pub ratio_sum: f64,
    /// Σ ρ̄².
    pub ratio_sq_sum: f64,
    /// min ρ̄ (+∞ when empty).
    pub ratio_min: f64,
    /// max ρ̄ (−∞ when empty).
    pub ratio_max: f64,
    /// Σ (ρ̄ − 1 − log ρ̄): k3 estimate of KL(π_old‖π_θ) on behaviour samples.
    pub kl_behaviour_sum: f64,
    /// Σ of the configured KL-to-reference estimate (unweighted), over trained tokens.
    pub kl_ref_sum: f64,
    /// Trained tokens that had reference log-probs.
    pub kl_ref_tokens: f64,
    /// Σ per-token entropy (nats).
    pub entropy_sum: f64,
    /// Trained tokens that had entropies.
    pub entropy_tokens: f64,
    /// Histogram of the trained tokens' log-ratio log ρ̄ = clamped ℓ − ℓ_old over
    /// [`RATIO_HIST_EDGES`] (token counts).
    pub ratio_hist: [f64; RATIO_BUCKETS],
    /// What `algorithm.mismatch_correction` did (filled by the trainer, which applies it).
    pub mismatch: CorrectionCounts,
    /// What `algorithm.opsm_delta` did (rows whose PG term it removed; their tokens as masked).
    pub opsm: CorrectionCounts,
}

impl Default for LossStats {
    fn default() -> Self {
        LossStats {
            loss: 0.0,
            pg_loss: 0.0,
            reg_loss: 0.0,
            tokens_total: 0.0,
            tokens: 0.0,
            clipped_low: 0.0,
            clipped_high: 0.0,
            dual_clipped: 0.0,
            dual_clip_tokens: 0.0,
            pos_tokens: 0.0,
            clipped_pos: 0.0,
            neg_tokens: 0.0,
            clipped_neg: 0.0,
            ratio_sum: 0.0,
            ratio_sq_sum: 0.0,
            ratio_min: f64::INFINITY,
            ratio_max: f64::NEG_INFINITY,
            kl_behaviour_sum: 0.0,
            kl_ref_sum: 0.0,
            kl_ref_tokens: 0.0,
            entropy_sum: 0.0,
            entropy_tokens: 0.0,
            ratio_hist: [0.0; RATIO_BUCKETS],
            mismatch: CorrectionCounts::default(),
            opsm: CorrectionCounts::default(),
        }
    }
}

/// Finalised loss metrics; `None` where undefined (DESIGN.md section 10: undefined values are null).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct LossMetrics {
    /// `loss`: the summed (normalised) loss.
    pub loss: f64,
    /// `pg_loss`: the policy-gradient term's part of `loss` (verl's `actor/pg_loss`, Trinity-RFT's
    /// `pg_loss`).
    pub pg_loss: f64,
    /// `reg_loss`: the rest of `loss`, what the loss adds to the surrogate (regulariser, KL
    /// penalty, entropy bonus); 0 when it adds nothing.
    pub reg_loss: f64,
    /// `clip_frac`: share of trained tokens whose PG term the clip or keep-mask zeroed.
    pub clip_frac: Option<f64>,
    /// `clip_frac/low`: share clipped with ρ̄ < 1.
    pub clip_frac_low: Option<f64>,
    /// `clip_frac/high`: share clipped with ρ̄ ≥ 1.
    pub clip_frac_high: Option<f64>,
    /// `clip_frac/dual`: share of the trained tokens whose PG term the dual clip bounded (A < 0,
    /// ratio > c; verl's `actor/pg_clipfrac_lower`); `None` without a dual clip.
    pub clip_frac_dual: Option<f64>,
    /// `clip_frac/adv_pos`: share of A > 0 tokens clipped.
    pub clip_frac_adv_pos: Option<f64>,
    /// `clip_frac/adv_neg`: share of A < 0 tokens clipped.
    pub clip_frac_adv_neg: Option<f64>,
    /// `ratio/mean`.
    pub ratio_mean: Option<f64>,
    /// `ratio/min`.
    pub ratio_min: Option<f64>,
    /// `ratio/max`.
    pub ratio_max: Option<f64>,
    /// `kl_behaviour`: mean k3 estimate of KL(π_old‖π_θ).
    pub kl_behaviour: Option<f64>,
    /// `kl_ref`: mean KL-to-reference estimate (configured estimator).
    pub kl_ref: Option<f64>,
    /// `entropy`: mean per-token entropy.
    pub entropy: Option<f64>,
    /// `ess`: normalised effective sample size of the token IS weights, (Σρ̄)²/(n·Σρ̄²) ∈ (0, 1].
    pub ess: Option<f64>,
    /// `masked_frac`: share of completion tokens outside the normaliser.
    pub masked_frac: Option<f64>,
    /// `zero_std_frac`: share of zero-variance groups (from the advantages).
    pub zero_std_frac: Option<f64>,
    /// `hist/ratio`: token counts of log ρ̄ over [`RATIO_HIST_EDGES`] (summed over the updates).
    pub ratio_hist: [f64; RATIO_BUCKETS],
    /// What the mismatch correction did (`mismatch/*` fractions).
    pub mismatch: CorrectionCounts,
    /// What OPSM did (`opsm/*` fractions).
    pub opsm: CorrectionCounts,
}

/// Calls `$m!` with the scalar fields of [`LossStats`] that add across micro-batches, updates and
/// processes, in the order of [`LossStats::to_sums`]: the one list of them.
macro_rules! additive_fields {
    ($m:ident, $($args:tt)*) => {
        $m!($($args)*; loss, tokens_total, tokens, clipped_low, clipped_high, pos_tokens,
            clipped_pos, neg_tokens, clipped_neg, ratio_sum, ratio_sq_sum, kl_behaviour_sum,
            kl_ref_sum, kl_ref_tokens, entropy_sum, entropy_tokens, pg_loss, reg_loss,
            dual_clipped, dual_clip_tokens)
    };
}

impl LossStats {
    /// Adds `other`'s sums into `self`.
    pub fn merge(&mut self, other: &LossStats) {
        macro_rules! add {
            ($s:ident, $o:ident; $($f:ident),*) => { $( $s.$f += $o.$f; )* };
        }
        additive_fields!(add, self, other);
        self.ratio_min = self.ratio_min.min(other.ratio_min);
        self.ratio_max = self.ratio_max.max(other.ratio_max);
        for (a, b) in self.ratio_hist.iter_mut().zip(other.ratio_hist) {
            *a += b;
        }
        self.mismatch.merge(&other.mismatch);
        self.opsm.merge(&other.opsm);
    }

    /// Every additive field, in a fixed order, for a sum across processes (data-parallel training):
    /// the scalar sums (`additive_fields!`), the ratio histogram, then the mismatch and OPSM
    /// counts. [`LossStats::from_sums`] rebuilds the struct from the summed vector and the reduced
    /// [`LossStats::extrema`], reading the same list in the same order.
    pub fn to_sums(&self) -> Vec<f64> {
        macro_rules! list {
            ($s:ident; $($f:ident),*) => { vec![$($s.$f),*] };
        }
        let mut v = additive_fields!(list, self);
        v.extend_from_slice(&self.ratio_hist);
        v.extend_from_slice(&self.mismatch.as_array());
        v.extend_from_slice(&self.opsm.as_array());
        v
    }

    /// The fields that reduce by a maximum: `[ratio_max, −ratio_min]` (reduce both with max).
    pub fn extrema(&self) -> [f64; 2] {
        [self.ratio_max, -self.ratio_min]
    }

    /// The stats whose [`LossStats::to_sums`] and [`LossStats::extrema`] are `sums` and `extrema`.
    ///
    /// # Panics
    /// When `sums` is not as long as [`LossStats::to_sums`]'s vector.
    pub fn from_sums(sums: &[f64], extrema: [f64; 2]) -> LossStats {
        let n = LossStats::default().to_sums().len();
        assert_eq!(sums.len(), n, "LossStats::from_sums takes {n} sums");
        let mut next = sums.iter().copied();
        let mut take = || next.next().expect("length checked above");
        let mut out = LossStats {
            ratio_min: -extrema[1],
            ratio_max: extrema[0],
            ..LossStats::default()
        };
        macro_rules! read {
            ($o:ident, $t:ident; $($f:ident),*) => { $( $o.$f = $t(); )* };
        }
        additive_fields!(read, out, take);
        out.ratio_hist = std::array::from_fn(|_| take());
        out.mismatch = CorrectionCounts::from_array(std::array::from_fn(|_| take()));
        out.opsm = CorrectionCounts::from_array(std::array::from_fn(|_| take()));
        out
    }

    /// Metric values; `adv` supplies `zero_std_frac` when given.
    pub fn finalise(&self, adv: Option<&AdvantageStats>) -> LossMetrics {
        let frac = |num: f64, den: f64| (den > 0.0).then(|| num / den);
        let n = self.tokens;
        LossMetrics {
            loss: self.loss,
            pg_loss: self.pg_loss,
            reg_loss: self.reg_loss,
            clip_frac: frac(self.clipped_low + self.clipped_high, n),
            clip_frac_low: frac(self.clipped_low, n),
            clip_frac_high: frac(self.clipped_high, n),
            clip_frac_dual: frac(self.dual_clipped, self.dual_clip_tokens),
            clip_frac_adv_pos: frac(self.clipped_pos, self.pos_tokens),
            clip_frac_adv_neg: frac(self.clipped_neg, self.neg_tokens),
            ratio_mean: frac(self.ratio_sum, n),
            ratio_min: (n > 0.0).then_some(self.ratio_min),
            ratio_max: (n > 0.0).then_some(self.ratio_max),
            kl_behaviour: frac(self.kl_behaviour_sum, n),
            kl_ref: frac(self.kl_ref_sum, self.kl_ref_tokens),
            entropy: frac(self.entropy_sum, self.entropy_tokens),
            ess: frac(self.ratio_sum * self.ratio_sum, n * self.ratio_sq_sum),
            masked_frac: frac(self.tokens_total - self.tokens, self.tokens_total),
            zero_std_frac: adv.and_then(|a| a.zero_std_frac()),
            ratio_hist: self.ratio_hist,
            mismatch: self.mismatch,
            opsm: self.opsm,
        }
    }
}

impl LossMetrics {
    /// `(metrics.jsonl name, value)` pairs (`None` → null): DESIGN.md section 10's, then
    /// `pg_loss`, `reg_loss` and `clip_frac/dual`.
    pub fn pairs(&self) -> Vec<(&'static str, Option<f64>)> {
        vec![
            ("loss", Some(self.loss)),
            ("clip_frac", self.clip_frac),
            ("clip_frac/low", self.clip_frac_low),
            ("clip_frac/high", self.clip_frac_high),
            ("clip_frac/adv_pos", self.clip_frac_adv_pos),
            ("clip_frac/adv_neg", self.clip_frac_adv_neg),
            ("ratio/mean", self.ratio_mean),
            ("ratio/min", self.ratio_min),
            ("ratio/max", self.ratio_max),
            ("kl_behaviour", self.kl_behaviour),
            ("kl_ref", self.kl_ref),
            ("entropy", self.entropy),
            ("ess", self.ess),
            ("masked_frac", self.masked_frac),
            ("zero_std_frac", self.zero_std_frac),
            ("pg_loss", Some(self.pg_loss)),
            ("reg_loss", Some(self.reg_loss)),
            ("clip_frac/dual", self.clip_frac_dual),
        ]
    }
}
