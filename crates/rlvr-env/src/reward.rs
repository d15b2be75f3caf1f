//! An episode's reward from the rewards its environment gave (`env.reward`, docs/DESIGN.md section 14).

/// How an episode's reward is made from the environment's rewards (`env.reward`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum RewardMode {
    /// The sum of every reward given (each step's, and `finish`'s if any). The default.
    #[default]
    Sum,
    /// The last reward given (the `done` step's or `finish`'s).
    Final,
}

impl RewardMode {
    /// The mode named `name` (`sum`, `final`).
    ///
    /// # Errors
    /// An unknown name, listing the valid ones.
    pub fn parse(name: &str) -> Result<Self, String> {
        match name {
            "sum" => Ok(RewardMode::Sum),
            "final" => Ok(RewardMode::Final),
            other => Err(format!(
                "env.reward = {other:?} is not a reward mode (valid: \"sum\", \"final\")"
            )),
        }
    }
}

/// The episode's reward: `given` holds, in order, the `reward` field of each reply for the
/// episode (`None` where a reply had none); `errored` is true when any reply for it was an
/// error. No reward at all gives 0; an error gives `None` (unscorable).
///
/// ```
/// use rlvr_env::reward::{episode_reward, RewardMode};
/// let given = [Some(0.5), None, Some(1.0)];
/// assert_eq!(episode_reward(RewardMode::Sum, &given, false), Some(1.5));
/// assert_eq!(episode_reward(RewardMode::Final, &given, false), Some(1.0));
/// assert_eq!(episode_reward(RewardMode::Final, &[None, None], false), Some(0.0));
/// assert_eq!(episode_reward(RewardMode::Sum, &given, true), None);
/// ```
pub fn episode_reward(mode: RewardMode, given: &[Option<f64>], errored: bool) -> Option<f64> {
    if errored {
        return None;
    }
    let mut it = given.iter().flatten();
    Some(match mode {
        // From +0.0: `Iterator::sum` of f64 starts at -0.0, so no reward at all would be -0.0
        // (printed "-0.0" in experiences and `rlvr generate --env`). Any other sum is the same.
        RewardMode::Sum => it.fold(0.0, |acc, r| acc + r),
        RewardMode::Final => it.next_back().copied().unwrap_or(0.0),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sum_final_none_and_error() {
        let check = |mode, given: &[Option<f64>], err, want: Option<f64>| {
            assert_eq!(
                episode_reward(mode, given, err),
                want,
                "{mode:?} {given:?} {err}"
            );
        };
        check(RewardMode::Sum, &[], false, Some(0.0));
        check(RewardMode::Final, &[], false, Some(0.0));
        check(
            RewardMode::Sum,
            &[Some(0.25), Some(-1.0), None],
            false,
            Some(-0.75),
        );
        check(
            RewardMode::Final,
            &[Some(0.25), Some(-1.0), None],
            false,
            Some(-1.0),
        );
        check(RewardMode::Final, &[Some(2.0), None], false, Some(2.0));
        check(RewardMode::Sum, &[Some(1.0)], true, None);
        check(RewardMode::Final, &[], true, None);
        assert_eq!(RewardMode::parse("final"), Ok(RewardMode::Final));
        assert!(RewardMode::parse("mean")
            .unwrap_err()
            .contains("\"sum\", \"final\""));
    }
}
