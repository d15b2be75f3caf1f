//! The episode reward's sign of zero: an episode that got no reward is +0.0
//! (docs/DESIGN.md section 14: "No reward at all: 0"), which experiences files and
//! `rlvr generate --env` print as `0.0`, not `-0.0`.

use rlvr_env::reward::{episode_reward, RewardMode};

#[test]
fn no_reward_at_all_is_positive_zero() {
    // -0.0 == 0.0, so the bits are compared.
    for mode in [RewardMode::Sum, RewardMode::Final] {
        for given in [&[][..], &[None, None][..]] {
            let r = episode_reward(mode, given, false).unwrap();
            assert_eq!(r.to_bits(), 0.0f64.to_bits(), "{mode:?} {given:?}: {r}");
        }
    }
    // A sum whose terms are all -0.0 was -0.0 as well; a sum with other terms is unchanged.
    let r = episode_reward(RewardMode::Sum, &[Some(-0.0)], false).unwrap();
    assert_eq!(r.to_bits(), 0.0f64.to_bits(), "{r}");
    let r = episode_reward(RewardMode::Sum, &[Some(0.25), Some(-1.0)], false).unwrap();
    assert_eq!(r.to_bits(), (-0.75f64).to_bits());
}
