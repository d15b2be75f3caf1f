//! The built-in `retry` environment (`env.builtin = "retry"`): the task's verifier judges each
//! assistant turn; a correct turn ends the episode with reward `turn_discount^(turn − 1)`, a
//! wrong one gets a fixed user message asking to try again, and the episode ends with reward 0
//! after `max_turns` wrong turns (docs/DESIGN.md section 14). Its last reply carries the metric
//! `solved` (1 for a correct turn, 0 otherwise; logged as `env/metrics/solved/mean`, the share
//! of episodes solved within `max_turns`, which the reward hides under `turn_discount` < 1). It implements [`Environment`] like the
//! process client, so callers cannot tell them apart; CI and demos need no Python.

use crate::json::Json;
use crate::protocol::{
    EpisodeResult, FinishEpisode, FinishReply, Message, Metrics, ResetEpisode, ResetReply,
    StepEpisode, StepReply,
};
use crate::{EnvError, Environment};
use std::collections::HashMap;

/// Judges one assistant turn's text against its dataset row: `Ok(true)` when correct.
/// An `Err` (the verifier could not judge) makes that episode unscorable.
pub trait TurnVerifier: Send {
    /// Whether `text` answers `row` correctly.
    ///
    /// # Errors
    /// Why the turn cannot be judged.
    fn correct(&self, row: &Json, text: &str) -> Result<bool, String>;
}

impl<F> TurnVerifier for F
where
    F: Fn(&Json, &str) -> Result<bool, String> + Send,
{
    fn correct(&self, row: &Json, text: &str) -> Result<bool, String> {
        self(row, text)
    }
}

/// The user message a wrong turn gets.
pub const RETRY_MESSAGE: &str = "That is not correct. Please try again.";

/// The `retry` environment (see the module docs).
pub struct RetryEnvironment<V> {
    verifier: V,
    max_turns: u32,
    turn_discount: f64,
    message: String,
    rows: HashMap<String, Json>,
}

impl<V: TurnVerifier> RetryEnvironment<V> {
    /// The environment over `verifier`, ending wrong episodes after `max_turns` turns, with
    /// reward `turn_discount^(turn − 1)` for a correct turn.
    ///
    /// # Errors
    /// [`EnvError::Config`] for `max_turns` 0 or a `turn_discount` outside (0, 1].
    pub fn new(verifier: V, max_turns: u32, turn_discount: f64) -> Result<Self, EnvError> {
        if max_turns == 0 {
            return Err(EnvError::Config("env.max_turns must be at least 1".into()));
        }
        if !(turn_discount > 0.0 && turn_discount <= 1.0) {
            return Err(EnvError::Config(format!(
                "env.turn_discount = {turn_discount} must be in (0, 1]"
            )));
        }
        Ok(RetryEnvironment {
            verifier,
            max_turns,
            turn_discount,
            message: RETRY_MESSAGE.to_string(),
            rows: HashMap::new(),
        })
    }
}

impl<V> RetryEnvironment<V> {
    /// Episodes whose row is kept (reset, not yet ended by `done`, `finish` or a turn the
    /// verifier could not judge): 0 once every episode sent ended.
    pub fn live(&self) -> usize {
        self.rows.len()
    }
}

impl<V: TurnVerifier> Environment for RetryEnvironment<V> {
    fn reset(
        &mut self,
        episodes: &[ResetEpisode],
    ) -> Result<Vec<EpisodeResult<ResetReply>>, EnvError> {
        Ok(episodes
            .iter()
            .map(|e| {
                self.rows.insert(e.id.clone(), e.row.clone());
                Ok(ResetReply::default())
            })
            .collect())
    }

    fn step(
        &mut self,
        episodes: &[StepEpisode],
    ) -> Result<Vec<EpisodeResult<StepReply>>, EnvError> {
        Ok(episodes
            .iter()
            .map(|e| {
                let row = self
                    .rows
                    .get(&e.id)
                    .ok_or_else(|| format!("episode {:?} was never reset", e.id))?;
                // A turn the verifier cannot judge fails the episode: it ends here (an `Err`
                // gets no `finish`), so its row is dropped.
                let correct = match self.verifier.correct(row, &e.text) {
                    Ok(c) => c,
                    Err(why) => {
                        self.rows.remove(&e.id);
                        return Err(why);
                    }
                };
                let reply = if correct {
                    let extra = i32::try_from(e.turn.saturating_sub(1)).unwrap_or(i32::MAX);
                    StepReply {
                        messages: Vec::new(),
                        reward: Some(self.turn_discount.powi(extra)),
                        done: true,
                        metrics: solved(true),
                    }
                } else if e.turn >= self.max_turns {
                    StepReply {
                        messages: Vec::new(),
                        reward: Some(0.0),
                        done: true,
                        metrics: solved(false),
                    }
                } else {
                    StepReply {
                        messages: vec![Message::new("user", self.message.clone())],
                        reward: None,
                        done: false,
                        metrics: Metrics::new(),
                    }
                };
                if reply.done {
                    self.rows.remove(&e.id);
                }
                Ok(reply)
            })
            .collect())
    }

    fn finish(
        &mut self,
        episodes: &[FinishEpisode],
    ) -> Result<Vec<EpisodeResult<FinishReply>>, EnvError> {
        Ok(episodes
            .iter()
            .map(|e| {
                self.rows.remove(&e.id);
                Ok(FinishReply {
                    reward: None,
                    metrics: solved(false),
                })
            })
            .collect())
    }
}

/// The `retry` environment's metrics for an episode's last reply: `solved` 1 or 0.
fn solved(yes: bool) -> Metrics {
    Metrics::from([("solved".to_string(), f64::from(u8::from(yes)))])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn turn(id: &str, turn: u32, text: &str) -> StepEpisode {
        StepEpisode {
            id: id.into(),
            turn,
            text: text.into(),
            tool_calls: vec![],
            tool_call_errors: vec![],
        }
    }

    #[test]
    fn rewards_discount_per_extra_turn_and_wrong_episodes_end_at_max_turns() {
        let v = |row: &Json, text: &str| -> Result<bool, String> {
            if text == "?" {
                return Err("cannot judge".into());
            }
            Ok(row.get("a").and_then(Json::as_str) == Some(text))
        };
        let mut env: Box<dyn Environment> = Box::new(RetryEnvironment::new(v, 3, 0.5).unwrap());
        let eps: Vec<ResetEpisode> = ["a", "b", "c"]
            .iter()
            .map(|id| ResetEpisode {
                id: (*id).into(),
                group: "0".into(),
                sample: 0,
                seed: 0,
                row: Json::object([("a", Json::from("4"))]),
                prompt: None,
            })
            .collect();
        assert!(env
            .reset(&eps)
            .unwrap()
            .iter()
            .all(|r| r == &Ok(ResetReply::default())));
        let r = env
            .step(&[turn("a", 1, "4"), turn("b", 1, "5"), turn("c", 1, "?")])
            .unwrap();
        assert_eq!(
            r[0],
            Ok(StepReply {
                messages: vec![],
                reward: Some(1.0),
                done: true,
                metrics: solved(true),
            })
        );
        assert_eq!(
            r[1],
            Ok(StepReply {
                messages: vec![Message::new("user", RETRY_MESSAGE)],
                reward: None,
                done: false,
                metrics: Metrics::new(),
            })
        );
        assert_eq!(r[2], Err("cannot judge".to_string()));
        let r = env.step(&[turn("b", 2, "5")]).unwrap();
        assert!(!r[0].as_ref().unwrap().done);
        let r = env.step(&[turn("b", 3, "4")]).unwrap();
        assert_eq!(r[0].as_ref().unwrap().reward, Some(0.25)); // 0.5^(3-1)
        env.reset(&eps[1..2]).unwrap();
        let r = env.step(&[turn("b", 3, "5")]).unwrap();
        assert_eq!(
            (r[0].as_ref().unwrap().reward, r[0].as_ref().unwrap().done),
            (Some(0.0), true)
        );
        // Wrong at max_turns: not solved.
        assert_eq!(r[0].as_ref().unwrap().metrics, solved(false));
        let r = env.step(&[turn("b", 1, "4")]).unwrap();
        assert!(r[0].as_ref().unwrap_err().contains("never reset"));
        // "c" failed at its turn 1 ("cannot judge"): it ended there.
        let r = env.step(&[turn("c", 2, "4")]).unwrap();
        assert!(r[0].as_ref().unwrap_err().contains("never reset"));
        assert!(RetryEnvironment::new(v, 0, 1.0).is_err());
        assert!(RetryEnvironment::new(v, 2, 1.5).is_err());
    }

    /// Every episode ends holding nothing: by `done`, by a turn the verifier cannot judge, or by
    /// `finish` with any reason, `error` (rlvr failed it after a reply) included. Before, the
    /// unjudged one's row stayed, and rlvr's own failures were never finished.
    #[test]
    fn every_way_an_episode_ends_drops_its_row() {
        use crate::protocol::FinishReason;
        let v = |_: &Json, text: &str| -> Result<bool, String> {
            match text {
                "?" => Err("cannot judge".into()),
                t => Ok(t == "4"),
            }
        };
        let mut env = RetryEnvironment::new(v, 3, 1.0).unwrap();
        let eps: Vec<ResetEpisode> = ["done", "unjudged", "error", "length"]
            .iter()
            .map(|id| ResetEpisode {
                id: (*id).into(),
                group: (*id).into(),
                sample: 0,
                seed: 0,
                row: Json::Object(vec![]),
                prompt: None,
            })
            .collect();
        env.reset(&eps).unwrap();
        assert_eq!(env.live(), 4);
        let r = env
            .step(&[
                turn("done", 1, "4"),
                turn("unjudged", 1, "?"),
                turn("error", 1, "5"),
            ])
            .unwrap();
        assert!(r[0].as_ref().unwrap().done && r[1].is_err() && !r[2].as_ref().unwrap().done);
        assert_eq!(env.live(), 2);
        let fin = |id: &str, reason| FinishEpisode {
            id: id.into(),
            reason,
        };
        let r = env
            .finish(&[
                fin("error", FinishReason::Error),
                fin("length", FinishReason::Length),
            ])
            .unwrap();
        assert!(r.iter().all(|r| r
            == &Ok(FinishReply {
                reward: None,
                metrics: solved(false)
            })));
        assert_eq!(env.live(), 0);
    }
}
