//! Multi-turn environments for RLVR (docs/DESIGN.md section 14; issue 45): an episode is the group's
//! prompt, then assistant turns sampled by rlvr, each followed by the environment's answer
//! (a tool's result, a user's feedback) until the environment says `done` or rlvr ends it.
//!
//! - [`Environment`]: `reset`, `step` and `finish` over a lock-step batch of episodes, one reply
//!   per episode, each the episode's record or its error (the episode is then unscorable); a
//!   run-level fault is an [`EnvError`]. Two implementations that callers cannot tell apart:
//!   [`client::ProcessEnvironment`], a program in any language speaking JSON lines
//!   ([`protocol`]), supervised like a persistent verifier, and [`retry::RetryEnvironment`],
//!   the built-in `retry` environment over a task verifier.
//! - [`replay`]: what the process client keeps of each live episode, replayed to a program
//!   restarted after a death or a timeout so that it holds the dead one's state.
//! - [`validate`]: a group's `reset` replies must be identical; special-token strings in
//!   observations are refused.
//! - [`truncate`]: observations over `env.max_observation_tokens` cut at token boundaries to fit
//!   their bridge (`env.observation_truncation`).
//! - [`tools`]: tool calls parsed from a turn's text (`hermes`, `llama3_json`, `none`).
//! - [`reward`]: an episode's reward from its environment's rewards (`sum`, `final`).
//! - [`verifiers`]: the adapter that runs an environment written with Prime Intellect's
//!   `verifiers` library unchanged (`env.verifiers`, docs/coming-from-prime-rl.md).
//! - [`template`] and [`bridge`]: chat templates with tools rendered as transformers does
//!   (Python's `json.dumps` as `tojson`, [`json`]), and the bridge tokens between turns, checked
//!   to extend the context as a token prefix.
//!
//! rlvr-train runs episodes through these on its native explorer (`feed::episodes`): the `[env]`
//! keys, the multi-turn sampling loop, the loss mask in the trainer (docs/environments.md). Not
//! yet: the vLLM backend, `rlvr eval` and `rlvr generate`.
//!
//! ```
//! use rlvr_env::json::Json;
//! use rlvr_env::protocol::{ResetEpisode, StepEpisode};
//! use rlvr_env::retry::RetryEnvironment;
//! use rlvr_env::Environment;
//!
//! // A verifier that wants the row's answer in the turn's text.
//! let verifier = |row: &Json, text: &str| -> Result<bool, String> {
//!     Ok(text.contains(row.get("answer").and_then(Json::as_str).unwrap_or("?")))
//! };
//! let mut env = RetryEnvironment::new(verifier, 3, 0.5).unwrap();
//! let row = Json::object([("answer", Json::from("4"))]);
//! let ep = ResetEpisode { id: "0:0".into(), group: "0".into(), sample: 0, seed: 7, row, prompt: None };
//! env.reset(&[ep]).unwrap();
//! let turn = |turn, text: &str| StepEpisode {
//!     id: "0:0".into(), turn, text: text.into(), tool_calls: vec![], tool_call_errors: vec![],
//! };
//! let wrong = env.step(&[turn(1, "5")]).unwrap().remove(0).unwrap();
//! assert!(!wrong.done && wrong.messages[0].role == "user");
//! let right = env.step(&[turn(2, "4")]).unwrap().remove(0).unwrap();
//! assert_eq!((right.done, right.reward), (true, Some(0.5))); // 0.5^(2-1)
//! ```
#![warn(missing_docs)]
#![forbid(unsafe_code)]

pub mod bridge;
pub mod client;
pub mod error;
pub use rlvr_template::json;
pub mod message;
pub mod protocol;
pub mod replay;
pub mod retry;
pub mod reward;
pub mod template;
pub mod tools;
pub mod truncate;
pub mod validate;
pub mod verifiers;

pub use error::EnvError;

use protocol::{
    EpisodeResult, FinishEpisode, FinishReply, ResetEpisode, ResetReply, StepEpisode, StepReply,
};

/// An environment over lock-step batches (docs/DESIGN.md section 14). Each method takes every live
/// episode of a batch and returns one result per episode, in the same order: the reply, or the
/// environment's error for that episode (which makes it unscorable, and ends it: it gets no
/// `finish`). An empty batch sends nothing.
pub trait Environment: Send {
    /// Episodes begin: each gets its prompt (kept or replaced) and tools.
    ///
    /// # Errors
    /// A fault that stops the run (protocol, process, a group whose replies differ).
    fn reset(
        &mut self,
        episodes: &[ResetEpisode],
    ) -> Result<Vec<EpisodeResult<ResetReply>>, EnvError>;

    /// Assistant turns ended on the end-of-turn token: the environment answers each.
    ///
    /// # Errors
    /// A fault that stops the run.
    fn step(&mut self, episodes: &[StepEpisode])
        -> Result<Vec<EpisodeResult<StepReply>>, EnvError>;

    /// rlvr ended these episodes without the environment's `done`: the reasons of section 14,
    /// or [`protocol::FinishReason::Error`] for an episode rlvr failed itself after an `Ok`
    /// reply (an observation too long, or holding a special token), so that the environment
    /// frees what it keeps for it (DESIGN.md section 14's additions, "Closing failed replays";
    /// the reply is then not read). Never sent for an episode whose result was an `Err`: an
    /// environment that returns one has ended the episode itself (the process client closes
    /// the episodes it fails on its own, [`client`]).
    ///
    /// # Errors
    /// A fault that stops the run.
    fn finish(
        &mut self,
        episodes: &[FinishEpisode],
    ) -> Result<Vec<EpisodeResult<FinishReply>>, EnvError>;

    /// `stop` is set when the run is asked to stop (the first Ctrl-C, SIGTERM): the request in
    /// flight is still awaited (the current step finishes), but an environment that dies or
    /// stays silent is no longer restarted. The default ignores it (nothing to restart).
    fn watch_stop(&mut self, stop: std::sync::Arc<std::sync::atomic::AtomicBool>) {
        let _ = stop;
    }

    /// Restarts and replays over the environment's life so far (zeros for one that never
    /// restarts, the default).
    fn faults(&self) -> Faults {
        Faults::default()
    }
}

/// What an environment's supervision did over its life: restarts of its program and episodes
/// replayed to a restarted program ([`replay`]). Counts since the environment was started; a
/// caller takes differences for one batch.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Faults {
    /// Times the program was started again after a death or a timeout.
    pub restarts: u64,
    /// Episodes replayed (`reset` and earlier `step`s) to a restarted program, once per replay.
    pub replayed: u64,
    /// Replayed episodes whose replies differed from the originals (each failed, unscorable).
    pub diverged: u64,
    /// Episodes the client failed while the program held their state, sent `finish` with
    /// reason `error` so that the program frees it: those whose replay differed (all but those
    /// the program failed itself) and those whose observation the client refused (a special
    /// token). rlvr's own later failures, finished by the caller, are not counted here.
    pub closed: u64,
}
