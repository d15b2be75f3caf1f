//! Resolution of the `[algorithm]` table: defaults < preset < values the user set
//! ([`AlgorithmConfig::resolve`]). It sits above both the table's types ([`mod@crate::config`]) and
//! the presets ([`mod@crate::presets`]), which are data written in those types, so that neither of
//! the two names the other's module in both directions.

use crate::config::{
    optional_knobs, required_knobs, Algorithm, AlgorithmConfig, Knobs, PolicyLoss,
};
use crate::error::{AlgoError, Result};
use crate::presets::find_preset;

impl AlgorithmConfig {
    /// The loss these knobs select: `loss` if set here, else the preset's, else the default (`ppo`).
    ///
    /// # Errors
    /// [`AlgoError::UnknownPreset`].
    pub fn effective_loss(&self) -> Result<PolicyLoss> {
        if let Some(l) = self.loss {
            return Ok(l);
        }
        if !matches!(self.preset.as_str(), "none" | "") {
            if let Some(l) = find_preset(&self.preset)?.values.loss {
                return Ok(l);
            }
        }
        Ok(Knobs::default().loss)
    }

    /// Resolves defaults < preset < values set here into flat knobs, validates them, and builds
    /// the typed [`Algorithm`] from them.
    ///
    /// # Errors
    /// [`AlgoError::UnknownPreset`] (listing the valid names) or [`AlgoError::InvalidConfig`] naming the
    /// key: a value out of range, or a loss-specific knob set here for a loss that does not read it
    /// (the message names the key and the loss).
    pub fn resolve(&self) -> Result<Algorithm> {
        let loss = self.effective_loss()?;
        if let Some(&key) = self.inapplicable(loss).first() {
            let value = self
                .set_values()
                .into_iter()
                .find(|(k, _)| k == key)
                .map(|(_, v)| v)
                .unwrap_or_default();
            let readers: Vec<&str> = PolicyLoss::ALL
                .iter()
                .filter(|l| l.options().contains(&key))
                .map(|l| l.name())
                .collect();
            return Err(AlgoError::InvalidConfig {
                key,
                value,
                why: format!(
                    "it does not apply to loss = \"{}\" (only {} read it); remove it, or set \
                     algorithm.loss to one of those",
                    loss.name(),
                    readers.join(", ")
                ),
            });
        }
        let mut merged = self.clone();
        if !matches!(self.preset.as_str(), "none" | "") {
            let preset = find_preset(&self.preset)?;
            merged.fill_unset_from(&preset.values);
        }
        let mut alg = Knobs {
            preset: self.preset.clone(),
            ..Knobs::default()
        };
        macro_rules! take {
            ($a:ident, $c:ident; $($f:ident),*) => { $( if let Some(v) = $c.$f { $a.$f = v; } )* };
        }
        required_knobs!(take, alg, merged);
        macro_rules! take_opt {
            ($a:ident, $c:ident; $($f:ident),*) => { $( if $c.$f.is_some() { $a.$f = $c.$f; } )* };
        }
        optional_knobs!(take_opt, alg, merged);
        alg.validate()?;
        Ok(alg.build())
    }
}
