//! What the process client keeps of each live episode so that a restarted program can be brought
//! to the state the dead one had (docs/environments.md, "Restarts and replay"; an addition to
//! docs/DESIGN.md section 14 that needs no protocol change).
//!
//! A program that keeps state per episode (a game board, a sandbox, a conversation) loses it when
//! it dies or is killed for a timeout. Its replacement is sent, for each episode of a request
//! whose state lived in an earlier process, that episode's `reset` and then each of its earlier
//! `step`s in order (lock-step batches over those episodes), before the request itself. The
//! replayed replies are compared with the originals: the model's later turns were conditioned on
//! the original observations, so an episode whose replay answers differently cannot be scored and
//! fails with an error saying that the environment is not deterministic across a restart. The
//! program that got the replay holds that episode's state, so the client then sends it `finish`
//! with reason `error` for the episode (unless the program failed the replay itself), and the
//! program can free what it keeps for it.
//!
//! Compared: a `reset` reply's `messages` and `tools` (the prompt the model saw), a `step`
//! reply's `messages` (the observation it saw) and `done` (whether the episode went on). Not
//! compared: rewards. The episode keeps the rewards first given (replayed rewards are dropped),
//! and a reward is a score, not something the model's later turns or the environment's later
//! state were conditioned on; an environment may legitimately score with a sampled judge.
//!
//! Bound: an episode is kept from its `reset` reply until it ends: a `step` reply with `done`,
//! any `finish` reply (reason `error` when rlvr failed it itself after a reply), an episode
//! error, or the client refusing a reply. So the history holds at most the live episodes of the batch in flight (B × K for a
//! training step), each with its `reset` request and at most `env.max_turns` `step` requests
//! (a turn's text) and replies (messages bounded by the reply limits).

use crate::protocol::{ResetEpisode, ResetReply, StepEpisode, StepReply};
use std::collections::HashMap;

/// One live episode's requests and the replies they got.
#[derive(Debug, Clone)]
pub struct Kept {
    /// Its `reset` request entry.
    pub reset: ResetEpisode,
    /// The `reset` reply it got.
    pub reset_reply: ResetReply,
    /// Its `step` request entries so far, each with the reply it got, in order.
    pub steps: Vec<(StepEpisode, StepReply)>,
    /// The process start (1, 2, ...) whose program holds its state.
    pub start: u32,
}

/// The live episodes' histories, by episode id (see the module docs).
#[derive(Debug, Default)]
pub struct History {
    kept: HashMap<String, Kept>,
}

impl History {
    /// Episodes kept.
    pub fn len(&self) -> usize {
        self.kept.len()
    }

    /// Whether no episode is kept.
    pub fn is_empty(&self) -> bool {
        self.kept.is_empty()
    }

    /// Steps kept over all episodes.
    pub fn steps(&self) -> usize {
        self.kept.values().map(|k| k.steps.len()).sum()
    }

    /// The episode `id`'s history, when it is live.
    pub fn get(&self, id: &str) -> Option<&Kept> {
        self.kept.get(id)
    }

    /// Episode `e` began with `reply` in the program of start `start`.
    pub fn reset(&mut self, e: &ResetEpisode, reply: &ResetReply, start: u32) {
        self.kept.insert(
            e.id.clone(),
            Kept {
                reset: e.clone(),
                reset_reply: reply.clone(),
                steps: Vec::new(),
                start,
            },
        );
    }

    /// Episode `e.id` got `reply` to step `e`: kept, or forgotten when the reply ends it.
    /// An episode not kept (its reset was not recorded) stays unkept.
    pub fn step(&mut self, e: &StepEpisode, reply: &StepReply) {
        if reply.done {
            self.kept.remove(&e.id);
        } else if let Some(k) = self.kept.get_mut(&e.id) {
            k.steps.push((e.clone(), reply.clone()));
        }
    }

    /// Episode `id` ended (or failed): nothing of it is kept.
    pub fn forget(&mut self, id: &str) {
        self.kept.remove(id);
    }

    /// The episodes among `ids` whose state lives in a program other than start `start`'s, in
    /// the order of `ids`.
    pub fn stale<'a>(&self, ids: &[&'a str], start: u32) -> Vec<&'a str> {
        ids.iter()
            .copied()
            .filter(|id| self.kept.get(*id).is_some_and(|k| k.start != start))
            .collect()
    }

    /// Episode `id`'s state now lives in the program of start `start`.
    pub fn moved(&mut self, id: &str, start: u32) {
        if let Some(k) = self.kept.get_mut(id) {
            k.start = start;
        }
    }
}

/// What differs between an original `reset` reply and its replay, or `None` when they agree on
/// what is compared (messages and tools).
pub fn reset_differs(original: &ResetReply, replayed: &ResetReply) -> Option<&'static str> {
    if original.messages != replayed.messages {
        Some("messages")
    } else if original.tools != replayed.tools {
        Some("tools")
    } else {
        None
    }
}

/// What differs between an original `step` reply and its replay, or `None` when they agree on
/// what is compared (messages and done; not the reward).
pub fn step_differs(original: &StepReply, replayed: &StepReply) -> Option<&'static str> {
    if original.messages != replayed.messages {
        Some("messages")
    } else if original.done != replayed.done {
        Some("done")
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::json::Json;
    use crate::protocol::Message;

    fn reset_ep(id: &str) -> ResetEpisode {
        ResetEpisode {
            id: id.into(),
            group: "0".into(),
            sample: 0,
            seed: 1,
            row: Json::object([("q", Json::from("x"))]),
            prompt: None,
        }
    }

    fn step_ep(id: &str, turn: u32) -> StepEpisode {
        StepEpisode {
            id: id.into(),
            turn,
            text: format!("t{turn}"),
            tool_calls: vec![],
            tool_call_errors: vec![],
        }
    }

    fn reply(content: &str, reward: Option<f64>, done: bool) -> StepReply {
        StepReply {
            messages: vec![Message::new("user", content)],
            reward,
            done,
            metrics: Default::default(),
        }
    }

    #[test]
    fn episodes_are_kept_while_live_and_moved_between_starts() {
        let mut h = History::default();
        h.reset(&reset_ep("a"), &ResetReply::default(), 1);
        h.reset(&reset_ep("b"), &ResetReply::default(), 1);
        h.step(&step_ep("a", 1), &reply("more", None, false));
        h.step(&step_ep("b", 1), &reply("bye", Some(1.0), true));
        // A step of an episode never reset is not kept.
        h.step(&step_ep("z", 1), &reply("?", None, false));
        assert_eq!((h.len(), h.steps()), (1, 1));
        assert_eq!(h.get("a").unwrap().steps[0].0.text, "t1");
        assert!(h.get("b").is_none() && h.get("z").is_none());
        // After a restart (start 2), "a" is stale until replayed.
        assert_eq!(h.stale(&["b", "a", "z"], 2), vec!["a"]);
        assert!(h.stale(&["a"], 1).is_empty());
        h.moved("a", 2);
        assert!(h.stale(&["a"], 2).is_empty());
        h.forget("a");
        assert!(h.is_empty());
    }

    #[test]
    fn replies_are_compared_on_observations_and_done_not_rewards() {
        let a = reply("n=3", Some(0.5), false);
        assert_eq!(step_differs(&a, &reply("n=3", Some(0.9), false)), None);
        assert_eq!(
            step_differs(&a, &reply("n=4", Some(0.5), false)),
            Some("messages")
        );
        assert_eq!(
            step_differs(&a, &reply("n=3", Some(0.5), true)),
            Some("done")
        );
        let r = ResetReply {
            messages: Some(vec![Message::new("user", "go")]),
            tools: None,
        };
        assert_eq!(reset_differs(&r, &r.clone()), None);
        assert_eq!(reset_differs(&r, &ResetReply::default()), Some("messages"));
        let with_tools = ResetReply {
            tools: Some(vec![Json::object([("type", Json::from("function"))])]),
            ..r.clone()
        };
        assert_eq!(reset_differs(&r, &with_tools), Some("tools"));
    }
}
