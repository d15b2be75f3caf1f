//! Multi-turn episodes on the explorer (docs/DESIGN.md section 14; issue 45): each of a step's
//! B prompts × K samples is an episode of assistant turns sampled by the rollout backend and
//! environment replies rendered as bridges, run in lock-step batches against an
//! [`rlvr_env::Environment`] (a program speaking the JSON-lines protocol, or the built-in
//! `retry` environment over the run's verifier).
//!
//! Per step: `reset` for every episode (the K replies of a group must agree), turn 1 sampled
//! through [`Rollout::sample`] exactly as a single-turn group (one prefill per prompt, the
//! stream of (seed, draw, sample)), then while any episode is live: `step` for the turns that
//! ended on the end-of-turn token, `finish` for those rlvr ends (`max_turns`, `length`, `budget`,
//! `eos`), the bridges appended, and the next turn of every live episode sampled through
//! [`Rollout::sample_turns`] (stream (seed, draw, sample, turn)). The batch depends on the
//! weights, the cursor, the seed and the environment's replies, never on timing. For the batch's
//! duration the backend keeps each episode's state between turns ([`Rollout::keep_turns`]): the
//! native engine keeps its keys and values within a byte budget and prefills only each turn's new
//! ids (`rlvr_rollout::TurnCache`).
//!
//! Each episode becomes one experience row: `completion_ids = a_1 b_1 a_2 … a_T` (never ending in
//! a bridge), `completion_mask` 1 on sampled ids and 0 on bridge ids, behaviour log-probs 0.0 on
//! bridges (read by nothing), its reward aggregated by `env.reward`; an episode the environment
//! failed is unscorable (reward null), and more than `env.max_error_frac` of them stops the run.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

use anyhow::Context;
use rlvr_env::bridge::{assemble, bridge, Bridge};
use rlvr_env::json::Json;
use rlvr_env::protocol::{
    FinishEpisode, FinishReason as EnvFinish, Message, ResetEpisode, StepEpisode,
};
use rlvr_env::reward::{episode_reward, RewardMode};
use rlvr_env::template::ChatTemplate;
use rlvr_env::tools::{parse_tool_calls, ToolFormat};
use rlvr_env::truncate::{self, Truncation};
use rlvr_env::Environment;
use rlvr_model::TokenizerBundle;
use rlvr_reward::combine::RewardFunction;
use rlvr_reward::Sample;
use rlvr_rollout::{Completion, FinishReason, Rollout, SamplingParams, TurnRow};
use serde::{Deserialize, Serialize};

/// The most distinct bridges kept between steps (an environment whose replies repeat, such as
/// `retry`, renders each once).
const BRIDGE_CACHE: usize = 4096;

/// How episodes run (the `[env]` keys, resolved).
#[derive(Debug, Clone)]
pub struct EpisodeSettings {
    /// `env.max_turns`.
    pub max_turns: u32,
    /// `env.max_episode_tokens` (resolved): tokens after the prompt, turns and bridges together.
    pub episode_tokens: usize,
    /// `env.max_observation_tokens`: most tokens of one bridge.
    pub max_observation_tokens: usize,
    /// `env.observation_truncation`: a longer reply fails its episode (`Error`) or is cut to fit
    /// ([`rlvr_env::truncate`]).
    pub truncation: Truncation,
    /// `env.tool_format`.
    pub tool_format: ToolFormat,
    /// `env.tools`: static schemas (an environment's `reset` may give its own).
    pub tools: Option<Vec<Json>>,
    /// `env.reward`.
    pub reward: RewardMode,
    /// `env.max_error_frac`.
    pub max_error_frac: f64,
    /// The end-of-turn token as text and its id.
    pub end_of_turn: (String, u32),
    /// Token strings refused in observations (empty: `env.allow_special_tokens`).
    pub specials: Vec<String>,
    /// `env.kv_cache_mib` in bytes: the native engine's budget for keys and values kept between
    /// an episode's turns ([`Rollout::keep_turns`]; 0: every turn prefills its whole context).
    pub turn_cache_bytes: usize,
    /// The most text bytes one token of the tokenizer stands for (its longest vocabulary entry,
    /// [`max_token_bytes`]): a reply's messages longer than `max_observation_tokens` such tokens
    /// could hold are refused before they are rendered and encoded ([`observation_byte_cap`]).
    pub max_token_bytes: usize,
    /// The model's positions (`max_position_embeddings`; `usize::MAX` when unknown): `reset`
    /// messages of more bytes than this many tokens could hold stop the run unrendered, as a
    /// prompt past the positions does once encoded.
    pub max_prompt_tokens: usize,
}

/// The longest entry, in UTF-8 bytes, of `tok`'s vocabulary (added tokens included): no token
/// stands for more text than this in the tokenizers LLMs use (byte-level BPE writes each byte as
/// one character of one or two bytes; SentencePiece writes a space as the 3-byte `▁`), so a text
/// of `b` bytes encodes as at least `b / max_token_bytes` tokens, up to normalisation
/// ([`observation_byte_cap`] allows for it).
pub fn max_token_bytes(tok: &TokenizerBundle) -> usize {
    tok.tokenizer
        .get_vocab(true)
        .keys()
        .map(String::len)
        .max()
        .unwrap_or(1)
        .max(1)
}

/// The bytes of text of `messages`: contents, names and tool call ids, and a reset dialogue's
/// tool calls (ids, names, arguments as compact JSON).
fn message_bytes(messages: &[Message]) -> usize {
    messages
        .iter()
        .map(|m| {
            m.content.len()
                + m.name.as_ref().map_or(0, String::len)
                + m.tool_call_id.as_ref().map_or(0, String::len)
                + m.tool_calls
                    .iter()
                    .map(|c| c.id.len() + c.name.len() + c.arguments.to_compact().len())
                    .sum::<usize>()
        })
        .sum()
}

/// The most bytes of text (message contents, names and tool call ids together) a reply may hold
/// to fit `max_observation_tokens` tokens of at most `max_token_bytes` bytes each, times 4 for a
/// normaliser that folds a 4-byte character into one byte (NFKC). A longer reply fails its
/// episode unrendered: encoding it only to count its tokens would cost memory in proportion to it
/// (measured before this bound: ~500 MB and ~5 s per MiB of reply on the tiny test tokenizer, so a
/// reply at the 16 MiB line limit held ~8 GB).
pub fn observation_byte_cap(max_observation_tokens: usize, max_token_bytes: usize) -> usize {
    max_observation_tokens
        .saturating_mul(max_token_bytes)
        .saturating_mul(4)
}

/// What the environment did in one batch, for metrics.jsonl (`env/*`, `time/env_s`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct EnvStats {
    /// Episodes run.
    pub episodes: usize,
    /// Episodes the environment failed (unscorable).
    pub errors: usize,
    /// Tool calls parsed.
    pub tool_calls: usize,
    /// Tool calls that did not parse.
    pub tool_call_errors: usize,
    /// Seconds spent waiting for the environment and rendering bridges.
    pub env_s: f64,
    /// How the episodes that did not fail ended (`env/finish/*`); absent in batches saved
    /// before it was counted (then zeros).
    #[serde(default)]
    pub ends: EndCounts,
    /// Restarts of the environment's program during the batch (`env/restarts`).
    #[serde(default)]
    pub restarts: usize,
    /// Episodes replayed to a restarted program during the batch, once per replay
    /// (`env/replayed`; `rlvr_env::replay`).
    #[serde(default)]
    pub replayed: usize,
    /// Observations cut to fit `env.max_observation_tokens` (`env/obs_truncated`;
    /// `env.observation_truncation`).
    #[serde(default)]
    pub obs_truncated: usize,
    /// Episodes sent `finish` with reason `error` during the batch so that the program frees
    /// what it holds for them (`env/closed`): those rlvr failed after the program answered
    /// (an observation too long or holding special tokens, ...) and those whose replay to a
    /// restarted program differed (DESIGN.md section 14's additions, "Closing failed replays").
    #[serde(default)]
    pub closed: usize,
}

/// How a batch's episodes ended, one count per end (failed episodes are [`EnvStats::errors`]):
/// the environment's `done`, and the reasons rlvr sends with `finish`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct EndCounts {
    /// The environment said `done`.
    pub done: usize,
    /// `env.max_turns` turns were taken without `done`.
    pub max_turns: usize,
    /// A turn was cut by `rollout.max_new_tokens`.
    pub length: usize,
    /// `env.max_episode_tokens` would have been exceeded.
    pub budget: usize,
    /// A turn ended on a stop id other than the end-of-turn token.
    pub eos: usize,
}

impl EndCounts {
    /// The names (as in `finish`'s `reason`, and `done`) and counts, in a fixed order.
    pub fn named(&self) -> [(&'static str, usize); 5] {
        [
            ("done", self.done),
            ("max_turns", self.max_turns),
            ("length", self.length),
            ("budget", self.budget),
            ("eos", self.eos),
        ]
    }

    /// Counts one episode that ended as `end` (`done`, or a `finish` reason); `error` and
    /// unknown ends are not counted here.
    pub fn count(&mut self, end: &str) {
        match end {
            "done" => self.done += 1,
            "max_turns" => self.max_turns += 1,
            "length" => self.length += 1,
            "budget" => self.budget += 1,
            "eos" => self.eos += 1,
            _ => {}
        }
    }

    /// Adds `o`'s counts.
    pub fn merge(&mut self, o: &EndCounts) {
        self.done += o.done;
        self.max_turns += o.max_turns;
        self.length += o.length;
        self.budget += o.budget;
        self.eos += o.eos;
    }
}

impl EnvStats {
    /// Adds `o`'s counts and time.
    pub fn merge(&mut self, o: &EnvStats) {
        self.episodes += o.episodes;
        self.errors += o.errors;
        self.tool_calls += o.tool_calls;
        self.tool_call_errors += o.tool_call_errors;
        self.env_s += o.env_s;
        self.ends.merge(&o.ends);
        self.restarts += o.restarts;
        self.replayed += o.replayed;
        self.obs_truncated += o.obs_truncated;
        self.closed += o.closed;
    }
}

/// The failed episodes of one request batch against `env.max_error_frac`: in one process a
/// call's batch, under data parallel the whole batch of every rank's shares (the counts summed
/// over the ranks and the first failure taken in rank order, `crate::feed::explorer`), so that
/// the stop-or-continue decision and its message are the same at every world size and on every
/// rank.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ErrorBudget {
    /// Failed episodes.
    pub errors: usize,
    /// Episodes run.
    pub episodes: usize,
    /// The first failed episode's message (`episode ID: why`), in (prompt, sample) order.
    pub first: Option<String>,
}

impl ErrorBudget {
    /// The budget of one batch's `stats` and its first failure.
    pub fn of(stats: &EnvStats, first: Option<String>) -> ErrorBudget {
        ErrorBudget {
            errors: stats.errors,
            episodes: stats.episodes,
            first,
        }
    }

    /// Fails with [`ErrorBudgetExceeded`] when more than `max_error_frac` of the episodes failed
    /// (an empty batch never does).
    ///
    /// # Errors
    /// The fraction is above `max_error_frac`.
    pub fn check(&self, max_error_frac: f64) -> Result<(), ErrorBudgetExceeded> {
        let frac = self.errors as f64 / self.episodes.max(1) as f64;
        if frac > max_error_frac {
            return Err(ErrorBudgetExceeded {
                budget: self.clone(),
                max_error_frac,
            });
        }
        Ok(())
    }
}

/// More than `env.max_error_frac` of a request batch's episodes failed in the environment: the
/// run stops. Under data parallel every rank meets it at the same point (its counts are the
/// whole batch's), so the run knows it may save together (`crate::run`).
#[derive(Debug, Clone)]
pub struct ErrorBudgetExceeded {
    /// The batch's counts and first failure.
    pub budget: ErrorBudget,
    /// `env.max_error_frac`.
    pub max_error_frac: f64,
}

impl std::fmt::Display for ErrorBudgetExceeded {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let b = &self.budget;
        write!(
            f,
            "{} of {} episodes failed in the environment ({:.0}%, above env.max_error_frac = {}); \
             the first: {}",
            b.errors,
            b.episodes,
            100.0 * b.errors as f64 / b.episodes.max(1) as f64,
            self.max_error_frac,
            b.first.as_deref().unwrap_or_default()
        )
    }
}

impl std::error::Error for ErrorBudgetExceeded {}

/// One prompt's episodes to run: its draw index, ids, text, verifier reference and row.
pub struct EpisodePrompt<'a> {
    /// The prompt's draw index (group id).
    pub draw: usize,
    /// Its token ids.
    pub ids: &'a [u32],
    /// The dataset row handed to `reset` (an object).
    pub row: Json,
}

/// One finished episode.
#[derive(Debug, Clone)]
pub struct EpisodeOut {
    /// Its prompt's draw index.
    pub draw: usize,
    /// Its index in the group.
    pub sample: usize,
    /// The prompt ids (the group's, or the environment's replacement rendered).
    pub prompt_ids: Vec<u32>,
    /// `a_1 b_1 … a_T`.
    pub completion_ids: Vec<u32>,
    /// 1 on sampled ids, 0 on bridge ids.
    pub completion_mask: Vec<u8>,
    /// The sampler's log-probs on sampled ids, 0.0 on bridges.
    pub behaviour_logprobs: Vec<f32>,
    /// The episode's reward; `None` when the environment failed it.
    pub reward: Option<f64>,
    /// The rewards the environment gave, in order: one per `step` reply (`None` when it gave
    /// none), then the `finish` reply's when it gave one. A turn cut by `length` or `budget`
    /// has no `step`, so its entry is the `finish` reward, if any.
    pub turn_rewards: Vec<Option<f64>>,
    /// Assistant turns.
    pub turns: u32,
    /// How it ended: `done`, `max_turns`, `length`, `budget`, `eos` or `error`.
    pub finish: &'static str,
    /// The environment's error, when it failed the episode.
    pub error: Option<String>,
    /// Policy version of the weights that sampled it.
    pub version: u64,
    /// The transcript: (role, text) per assistant turn and environment message.
    pub transcript: Vec<(String, String)>,
    /// The environment's metrics for the episode (`"metrics"` on its `done` step reply or its
    /// `finish` reply; DESIGN.md section 14's additions); empty when it gave none or the episode
    /// failed (an unscorable episode contributes nothing to `env/metrics/*`).
    pub metrics: rlvr_env::protocol::Metrics,
}

/// An episode while it runs.
struct Live {
    draw: usize,
    sample: usize,
    id: String,
    prompt: Vec<u32>,
    tools: Option<Vec<Json>>,
    turns: Vec<(Vec<u32>, Vec<f32>)>,
    bridges: Vec<Vec<u32>>,
    used: usize,
    rewards: Vec<Option<f64>>,
    end: Option<&'static str>,
    error: Option<String>,
    version: u64,
    transcript: Vec<(String, String)>,
    metrics: rlvr_env::protocol::Metrics,
}

impl Live {
    fn context(&self) -> Vec<u32> {
        let mut c = self.prompt.clone();
        for (t, (ids, _)) in self.turns.iter().enumerate() {
            if t > 0 {
                c.extend_from_slice(&self.bridges[t - 1]);
            }
            c.extend_from_slice(ids);
        }
        if self.bridges.len() == self.turns.len() {
            c.extend_from_slice(self.bridges.last().expect("a bridge"));
        }
        c
    }

    fn fail(&mut self, why: String) {
        self.end = Some("error");
        self.error = Some(why);
    }
}

pub use crate::store::experience::{segments, Segment};

/// Parses `env.tools`: a JSON array of objects (OpenAI-style function schemas), keys kept in
/// their order.
///
/// # Errors
/// Invalid JSON, or not an array of objects.
pub fn parse_tools(text: &str) -> Result<Vec<Json>, String> {
    let v = Json::parse(text).map_err(|e| format!("invalid JSON: {e}"))?;
    match v {
        Json::Array(a) if a.iter().all(|t| matches!(t, Json::Object(_))) => Ok(a),
        other => Err(format!(
            "expected a JSON array of tool schemas (objects), got {}",
            other.kind()
        )),
    }
}

/// The environment seed of a group, the same for its K episodes: output number `draw` + 1 of
/// SplitMix64 (Steele, Lea and Flood, "Fast splittable pseudorandom number generators", OOPSLA
/// 2014; Vigna's reference C, prng.di.unimi.it/splitmix64.c) started from the run seed, that is
/// the finaliser of `seed + (draw + 1)·γ` (γ = 0x9E3779B97F4A7C15, the golden gamma; wrapping).
/// The gamma added before mixing keeps any (seed, draw) pair from mapping to a trivial value:
/// seed 0, draw 0 gives 0xE220A8397B1DCDAF, not 0, which many environments read as "unset".
pub fn group_seed(seed: u64, draw: usize) -> u64 {
    const GAMMA: u64 = 0x9E37_79B9_7F4A_7C15;
    let mut z = seed.wrapping_add((draw as u64).wrapping_add(1).wrapping_mul(GAMMA));
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// A step reply's bridge, with the messages it was rendered from when they were cut to fit
/// (`env.observation_truncation`), or why its episode fails.
type Observation = Result<(Bridge, Option<Vec<Message>>), String>;

/// The episode runner of the explorer: the environment, the chat template of the bridges and the
/// settings.
pub struct EpisodeRunner {
    env: Box<dyn Environment>,
    template: ChatTemplate,
    settings: EpisodeSettings,
    bridges: HashMap<String, Bridge>,
}

impl EpisodeRunner {
    /// A runner over `env` rendering bridges with `template`.
    pub fn new(
        env: Box<dyn Environment>,
        template: ChatTemplate,
        settings: EpisodeSettings,
    ) -> Self {
        EpisodeRunner {
            env,
            template,
            settings,
            bridges: HashMap::new(),
        }
    }

    /// The settings.
    pub fn settings(&self) -> &EpisodeSettings {
        &self.settings
    }

    /// Hands the run's stop flag to the environment ([`rlvr_env::Environment::watch_stop`]):
    /// once set, a dead or silent program is not restarted.
    pub fn watch_stop(&mut self, stop: Arc<std::sync::atomic::AtomicBool>) {
        self.env.watch_stop(stop);
    }

    /// The bridge for `messages` after a turn (cached by messages and tools).
    fn bridge_for(
        &mut self,
        tok: &TokenizerBundle,
        messages: &[Message],
        tools: Option<&[Json]>,
    ) -> anyhow::Result<Bridge> {
        let key = format!(
            "{}\u{0}{}",
            Json::Array(messages.iter().map(Message::to_json).collect()).to_compact(),
            tools.map_or(String::new(), |t| Json::Array(t.to_vec()).to_compact())
        );
        if let Some(b) = self.bridges.get(&key) {
            return Ok(b.clone());
        }
        let encode = |t: &str| -> Result<Vec<u32>, String> {
            tok.encode(t, false).map_err(|e| e.to_string())
        };
        let b = bridge(
            &self.template,
            &self.settings.end_of_turn.0,
            messages,
            tools,
            &encode,
        )
        .context("rendering an environment reply as a bridge (env.chat_template)")?;
        if self.bridges.len() >= BRIDGE_CACHE {
            self.bridges.clear();
        }
        self.bridges.insert(key, b.clone());
        Ok(b)
    }

    /// The bridge of a step reply's `messages`, within `env.max_observation_tokens`: as rendered,
    /// or (`env.observation_truncation`) rendered from the messages cut to fit, which come with it
    /// (contents over the byte bound [`observation_byte_cap`] are first cut to it by bytes, so a
    /// flood is never encoded whole). `Ok(Err(why))`: the episode fails.
    ///
    /// # Errors
    /// A template the bridges refuse, a tokenizer that fails.
    fn observation(
        &mut self,
        tok: &TokenizerBundle,
        mut messages: Vec<Message>,
        tools: Option<&[Json]>,
    ) -> anyhow::Result<Observation> {
        let (max, side) = (
            self.settings.max_observation_tokens,
            self.settings.truncation,
        );
        let cap = observation_byte_cap(max, self.settings.max_token_bytes);
        let bytes = message_bytes(&messages);
        let mut cut = false;
        if bytes > cap {
            if side == Truncation::Error {
                return Ok(Err(format!(
                    "the reply's messages hold {bytes} bytes, more than \
                     env.max_observation_tokens = {max} tokens can render ({cap} bytes at most)"
                )));
            }
            for m in &mut messages {
                if m.content.len() > cap {
                    m.content = truncate::cut_bytes(&m.content, cap, side).into_owned();
                    cut = true;
                }
            }
        }
        let spans = |t: &str| -> Result<Vec<(usize, usize)>, String> {
            tok.tokenizer
                .encode(t, false)
                .map(|e| e.get_offsets().to_vec())
                .map_err(|e| e.to_string())
        };
        let mut render = |m: &[Message]| {
            self.bridge_for(tok, m, tools)
                .map_err(|e| rlvr_env::EnvError::Template(format!("{e:#}")))
        };
        let fitted = match truncate::fit(&mut render, &messages, max, side, &spans)? {
            Ok(f) => f,
            Err(why) => return Ok(Err(why)),
        };
        let cut = cut || fitted.cut_tokens > 0;
        Ok(Ok((fitted.bridge, cut.then_some(fitted.messages))))
    }

    /// Runs the K episodes of each of `prompts` (draw indices consecutive from `first`) to their
    /// end; returns them in (prompt, sample) order with what the environment did.
    ///
    /// # Errors
    /// A fault of the environment that stops the run (protocol, process, differing reset replies),
    /// a template the bridges refuse, sampling errors, and more than `env.max_error_frac` of the
    /// episodes failed.
    pub fn run(
        &mut self,
        rollout: &mut dyn Rollout,
        tok: &TokenizerBundle,
        prompts: &[EpisodePrompt<'_>],
        params: &SamplingParams,
        seed: u64,
    ) -> anyhow::Result<(Vec<EpisodeOut>, EnvStats)> {
        let (out, stats, first) = self.run_tallied(rollout, tok, prompts, params, seed)?;
        ErrorBudget::of(&stats, first).check(self.settings.max_error_frac)?;
        Ok((out, stats))
    }

    /// [`EpisodeRunner::run`] without the `env.max_error_frac` check, which the caller makes
    /// ([`ErrorBudget::check`]) once it knows the whole request batch: data parallel, every
    /// rank's share of it ([`crate::feed::explorer::Explorer`] sums the counts over the ranks
    /// first). The third value is the first failed episode's message (`episode ID: why`), `None`
    /// when none failed.
    ///
    /// # Errors
    /// As [`EpisodeRunner::run`], but for the error budget.
    pub fn run_tallied(
        &mut self,
        rollout: &mut dyn Rollout,
        tok: &TokenizerBundle,
        prompts: &[EpisodePrompt<'_>],
        params: &SamplingParams,
        seed: u64,
    ) -> anyhow::Result<(Vec<EpisodeOut>, EnvStats, Option<String>)> {
        // The backend keeps each episode's state (the native engine: its keys and values,
        // bounded) from one turn to the next for this batch only.
        rollout.keep_turns(Some(self.settings.turn_cache_bytes));
        let out = self.run_kept(rollout, tok, prompts, params, seed);
        rollout.keep_turns(None);
        out
    }

    /// `env.max_error_frac`: the most failed episodes, as a fraction of a request batch's.
    pub fn max_error_frac(&self) -> f64 {
        self.settings.max_error_frac
    }

    fn run_kept(
        &mut self,
        rollout: &mut dyn Rollout,
        tok: &TokenizerBundle,
        prompts: &[EpisodePrompt<'_>],
        params: &SamplingParams,
        seed: u64,
    ) -> anyhow::Result<(Vec<EpisodeOut>, EnvStats, Option<String>)> {
        let k = params.group_size;
        let mut stats = EnvStats {
            episodes: prompts.len() * k,
            ..EnvStats::default()
        };
        let Some(first) = prompts.first().map(|p| p.draw) else {
            return Ok((Vec::new(), stats, None));
        };
        anyhow::ensure!(
            prompts.iter().enumerate().all(|(i, p)| p.draw == first + i),
            "internal: episode prompts must have consecutive draw indices"
        );
        // reset: every episode, the K of a group with one seed; their replies must agree.
        let resets: Vec<ResetEpisode> = prompts
            .iter()
            .flat_map(|p| {
                (0..k).map(move |j| ResetEpisode {
                    id: format!("{}:{j}", p.draw),
                    group: p.draw.to_string(),
                    sample: j as u32,
                    seed: group_seed(seed, p.draw),
                    row: p.row.clone(),
                    prompt: None,
                })
            })
            .collect();
        let faults = self.env.faults();
        let t0 = Instant::now();
        let replies = self.env.reset(&resets).context("the environment's reset")?;
        rlvr_env::validate::check_groups(&resets, &replies)?;
        stats.env_s += t0.elapsed().as_secs_f64();
        // Each group's prompt: kept, or the environment's messages rendered with its tools.
        let mut group_prompt: Vec<Vec<u32>> = Vec::with_capacity(prompts.len());
        let mut group_tools: Vec<Option<Vec<Json>>> = Vec::with_capacity(prompts.len());
        for (g, p) in prompts.iter().enumerate() {
            let reply = replies[g * k..(g + 1) * k]
                .iter()
                .find_map(|r| r.as_ref().ok());
            let tools = reply
                .and_then(|r| r.tools.clone())
                .or_else(|| self.settings.tools.clone());
            let ids = match reply.and_then(|r| r.messages.as_ref()) {
                Some(m) => {
                    if let Some((t, field)) =
                        rlvr_env::validate::find_special_token(m, &self.settings.specials)
                    {
                        anyhow::bail!(
                            "group {}: the environment's reset {field} holds the special token \
                             {t:?} as text",
                            p.draw
                        );
                    }
                    let bytes = message_bytes(m);
                    let cap = observation_byte_cap(
                        self.settings.max_prompt_tokens,
                        self.settings.max_token_bytes,
                    );
                    if bytes > cap {
                        anyhow::bail!(
                            "group {}: the environment's reset messages hold {bytes} bytes, more \
                             than the model's max_position_embeddings = {} tokens can hold ({cap} \
                             bytes at most); they were not rendered",
                            p.draw,
                            self.settings.max_prompt_tokens
                        );
                    }
                    let text = self.template.render(m, tools.as_deref(), true)?;
                    tok.encode(&text, false)?
                }
                None if tools.is_some() => anyhow::bail!(
                    "group {}: the episode has tools but its prompt is the dataset's rendered \
                     text, which cannot be rendered again with them: have the environment's \
                     reset reply give `messages` (or `dialogue`) too",
                    p.draw
                ),
                None => p.ids.to_vec(),
            };
            group_prompt.push(ids);
            group_tools.push(tools);
        }
        let mut eps: Vec<Live> = resets
            .iter()
            .zip(&replies)
            .enumerate()
            .map(|(i, (r, reply))| {
                let g = i / k;
                let mut l = Live {
                    draw: prompts[g].draw,
                    sample: i % k,
                    id: r.id.clone(),
                    prompt: group_prompt[g].clone(),
                    tools: group_tools[g].clone(),
                    turns: Vec::new(),
                    bridges: Vec::new(),
                    used: 0,
                    rewards: Vec::new(),
                    end: None,
                    error: None,
                    version: 0,
                    transcript: Vec::new(),
                    metrics: Default::default(),
                };
                if let Err(e) = reply {
                    l.fail(format!("reset: {e}"));
                }
                l
            })
            .collect();
        // Turn 1: today's group path, one prefill per prompt.
        let groups = rollout
            .sample(&group_prompt, first, params, seed)
            .context("sampling the first turns")?;
        let completions = rlvr_rollout::flatten(groups).with_context(|| {
            format!(
                "sampling the groups of prompts {first}..{} (draw indices)",
                first + prompts.len()
            )
        })?;
        let mut turn: u32 = 1;
        let mut pending: Vec<(usize, Completion)> = completions.into_iter().enumerate().collect();
        loop {
            self.after_turn(tok, &mut eps, pending, turn, &mut stats)?;
            let live: Vec<usize> = (0..eps.len()).filter(|&i| eps[i].end.is_none()).collect();
            if live.is_empty() {
                break;
            }
            turn += 1;
            // Every live episode's next turn, within its own remaining budget: one call per
            // distinct limit, so an episode's turn never depends on which others are live.
            let cap = |e: &Live| {
                params
                    .max_new_tokens
                    .min(self.settings.episode_tokens.saturating_sub(e.used))
                    .max(1)
            };
            let mut caps: Vec<usize> = live.iter().map(|&i| cap(&eps[i])).collect();
            caps.sort_unstable();
            caps.dedup();
            pending = Vec::with_capacity(live.len());
            for c in caps {
                let these: Vec<usize> = live
                    .iter()
                    .copied()
                    .filter(|&i| cap(&eps[i]) == c)
                    .collect();
                let rows: Vec<TurnRow> = these
                    .iter()
                    .map(|&i| TurnRow {
                        context: eps[i].context(),
                        prompt_index: eps[i].draw,
                        sample_index: eps[i].sample,
                        turn: u64::from(turn),
                    })
                    .collect();
                let turn_params = SamplingParams {
                    max_new_tokens: c,
                    ..params.clone()
                };
                let out = rollout
                    .sample_turns(&rows, &turn_params, seed)
                    .with_context(|| format!("sampling turn {turn} of the episodes"))?;
                pending.extend(these.into_iter().zip(out));
            }
            pending.sort_by_key(|(i, _)| *i);
        }
        let now = self.env.faults();
        stats.restarts = (now.restarts - faults.restarts) as usize;
        stats.replayed = (now.replayed - faults.replayed) as usize;
        stats.closed += (now.closed - faults.closed) as usize;
        stats.errors = eps.iter().filter(|e| e.error.is_some()).count();
        for e in eps.iter().filter(|e| e.error.is_none()) {
            stats.ends.count(e.end.unwrap_or("done"));
        }
        let first_error = eps
            .iter()
            .find_map(|e| e.error.as_ref().map(|m| format!("episode {}: {m}", e.id)));
        let mode = self.settings.reward;
        let out = eps
            .into_iter()
            .map(|e| {
                let errored = e.error.is_some();
                let toks = if e.turns.is_empty() {
                    rlvr_env::bridge::EpisodeTokens {
                        completion_ids: Vec::new(),
                        completion_mask: Vec::new(),
                        behaviour_logprobs: Vec::new(),
                    }
                } else {
                    assemble(&e.turns, &e.bridges[..e.turns.len() - 1])?
                };
                Ok(EpisodeOut {
                    draw: e.draw,
                    sample: e.sample,
                    prompt_ids: e.prompt,
                    completion_ids: toks.completion_ids,
                    completion_mask: toks.completion_mask,
                    behaviour_logprobs: toks.behaviour_logprobs,
                    reward: episode_reward(mode, &e.rewards, errored),
                    turn_rewards: e.rewards,
                    turns: e.turns.len() as u32,
                    finish: e.end.unwrap_or("done"),
                    error: e.error,
                    version: e.version,
                    transcript: e.transcript,
                    metrics: if errored {
                        Default::default()
                    } else {
                        e.metrics
                    },
                })
            })
            .collect::<anyhow::Result<Vec<_>>>()?;
        Ok((out, stats, first_error))
    }

    /// Records each `(episode, completion)` of turn `turn`, then steps the environment for the
    /// turns that ended on the end-of-turn token and finishes the episodes rlvr ends.
    fn after_turn(
        &mut self,
        tok: &TokenizerBundle,
        eps: &mut [Live],
        done: Vec<(usize, Completion)>,
        turn: u32,
        stats: &mut EnvStats,
    ) -> anyhow::Result<()> {
        let eot = self.settings.end_of_turn.1;
        let mut steps: Vec<(usize, StepEpisode)> = Vec::new();
        let mut finishes: Vec<(usize, EnvFinish)> = Vec::new();
        for (i, c) in done {
            let e = &mut eps[i];
            e.version = c.version;
            e.used += c.token_ids.len();
            let on_eot = c.finish_reason == FinishReason::Eos && c.token_ids.last() == Some(&eot);
            let body = if on_eot {
                &c.token_ids[..c.token_ids.len() - 1]
            } else {
                &c.token_ids[..]
            };
            let text = tok.decode(body, true)?;
            e.transcript.push(("assistant".into(), text.clone()));
            e.turns.push((c.token_ids, c.behaviour_logprobs));
            if e.end.is_some() {
                // Failed at reset: its first turn is kept, never stepped.
                continue;
            }
            if on_eot {
                let parsed = parse_tool_calls(self.settings.tool_format, &text);
                stats.tool_calls += parsed.calls.len();
                stats.tool_call_errors += parsed.errors.len();
                steps.push((
                    i,
                    StepEpisode {
                        id: e.id.clone(),
                        turn,
                        text,
                        tool_calls: parsed.calls,
                        tool_call_errors: parsed.errors,
                    },
                ));
            } else if c.finish_reason == FinishReason::Length {
                let reason = if e.used >= self.settings.episode_tokens {
                    EnvFinish::Budget
                } else {
                    EnvFinish::Length
                };
                finishes.push((i, reason));
            } else {
                finishes.push((i, EnvFinish::Eos));
            }
        }
        let t0 = Instant::now();
        if !steps.is_empty() {
            let req: Vec<StepEpisode> = steps.iter().map(|(_, s)| s.clone()).collect();
            let replies = self.env.step(&req).context("the environment's step")?;
            let answered: Vec<bool> = replies.iter().map(Result::is_ok).collect();
            for ((i, _), reply) in steps.iter().zip(replies) {
                let i = *i;
                let r = match reply {
                    Ok(r) => r,
                    Err(m) => {
                        eps[i].fail(format!("step {turn}: {m}"));
                        continue;
                    }
                };
                eps[i].rewards.push(r.reward);
                let shown = eps[i].transcript.len();
                for m in &r.messages {
                    eps[i].transcript.push((m.role.clone(), m.content.clone()));
                }
                if r.done {
                    // Its last reply: the only one whose metrics are read (parse_step refuses
                    // them on any other).
                    eps[i].metrics = r.metrics;
                    eps[i].end = Some("done");
                    continue;
                }
                if turn >= self.settings.max_turns {
                    finishes.push((i, EnvFinish::MaxTurns));
                    continue;
                }
                if let Some((t, field)) =
                    rlvr_env::validate::find_special_token(&r.messages, &self.settings.specials)
                {
                    eps[i].fail(format!(
                        "step {turn}: the reply's {field} holds the special token {t:?} as text \
                         (it would be encoded as that control token; env.allow_special_tokens \
                         accepts it)"
                    ));
                    continue;
                }
                let tools = eps[i].tools.clone();
                let b = match self.observation(tok, r.messages, tools.as_deref())? {
                    Ok((b, None)) => b,
                    Ok((b, Some(cut))) => {
                        // The transcript shows what the model was shown.
                        stats.obs_truncated += 1;
                        eps[i].transcript.truncate(shown);
                        for m in &cut {
                            eps[i].transcript.push((m.role.clone(), m.content.clone()));
                        }
                        b
                    }
                    Err(why) => {
                        eps[i].fail(format!("step {turn}: {why}"));
                        continue;
                    }
                };
                // The next turn needs room for the bridge and at least one token.
                if eps[i].used + b.ids.len() >= self.settings.episode_tokens {
                    finishes.push((i, EnvFinish::Budget));
                    continue;
                }
                eps[i].used += b.ids.len();
                eps[i].bridges.push(b.ids);
            }
            // The episodes rlvr failed above after an `Ok` reply (unknown to the environment,
            // which still holds them) get `finish` with reason `error` below, once, so that it
            // frees them (DESIGN.md section 14's additions, "Closing failed replays"). Those
            // answered with an `Err` ended there: the environment failed them itself, or its
            // client failed and closed them.
            for ((i, _), ok) in steps.iter().zip(&answered) {
                if *ok && eps[*i].error.is_some() {
                    finishes.push((*i, EnvFinish::Error));
                }
            }
        }
        stats.closed += finishes.iter().filter(|f| f.1 == EnvFinish::Error).count();
        if !finishes.is_empty() {
            let req: Vec<FinishEpisode> = finishes
                .iter()
                .map(|&(i, reason)| FinishEpisode {
                    id: eps[i].id.clone(),
                    reason,
                })
                .collect();
            let replies = self.env.finish(&req).context("the environment's finish")?;
            for (&(i, reason), reply) in finishes.iter().zip(replies) {
                if reason == EnvFinish::Error {
                    // Failed already: the reply (a reward, an error) is not read.
                    continue;
                }
                match reply {
                    Ok(r) => {
                        if r.reward.is_some() {
                            eps[i].rewards.push(r.reward);
                        }
                        eps[i].metrics = r.metrics;
                        eps[i].end = Some(reason.as_str());
                    }
                    Err(m) => eps[i].fail(format!("finish: {m}")),
                }
            }
        }
        stats.env_s += t0.elapsed().as_secs_f64();
        Ok(())
    }
}

/// The built-in `retry` environment's verifier: the run's reward function judges a turn's text
/// (its `correct`, the format bonus left out) against the row's prompt, reference and columns.
pub struct RetryVerifier {
    /// The run's reward function.
    pub reward: Arc<RewardFunction>,
}

impl RetryVerifier {
    /// The row the explorer hands to `reset` for the built-in `retry` environment.
    pub fn row(prompt: &str, reference: &str, columns: &[(String, String)], index: usize) -> Json {
        Json::object([
            ("prompt", Json::from(prompt)),
            ("reference", Json::from(reference)),
            ("index", Json::UInt(index as u64)),
            (
                "columns",
                Json::Array(
                    columns
                        .iter()
                        .map(|(k, v)| {
                            Json::Array(vec![Json::from(k.as_str()), Json::from(v.as_str())])
                        })
                        .collect(),
                ),
            ),
        ])
    }
}

impl rlvr_env::retry::TurnVerifier for RetryVerifier {
    fn correct(&self, row: &Json, text: &str) -> Result<bool, String> {
        let s = |k: &str| row.get(k).and_then(Json::as_str).unwrap_or("");
        let columns: Vec<(String, String)> = match row.get("columns") {
            Some(Json::Array(a)) => a
                .iter()
                .filter_map(|p| match p {
                    Json::Array(kv) if kv.len() == 2 => {
                        Some((kv[0].as_str()?.to_string(), kv[1].as_str()?.to_string()))
                    }
                    _ => None,
                })
                .collect(),
            _ => Vec::new(),
        };
        let index = match row.get("index") {
            Some(Json::UInt(n)) => Some(*n as usize),
            Some(Json::Int(n)) => usize::try_from(*n).ok(),
            _ => None,
        };
        let sample = Sample {
            prompt: s("prompt"),
            completion: text,
            reference: s("reference"),
            columns: &columns,
            index,
        };
        let out = self
            .reward
            .score_batch(&[sample])
            .map_err(|e| format!("the verifier: {e}"))?;
        Ok(out.first().is_some_and(|b| b.correct))
    }
}

/// The row a program environment's `reset` gets: the dataset row's columns, then `reference`
/// (unless a column has that name).
pub fn program_row(reference: &str, columns: &[(String, String)]) -> Json {
    let mut pairs: Vec<(String, Json)> = rlvr_reward::visible_columns(columns)
        .map(|(k, v)| (k.clone(), Json::from(v.as_str())))
        .collect();
    if !columns.iter().any(|(k, _)| k == "reference") {
        pairs.push(("reference".into(), Json::from(reference)));
    }
    Json::object(pairs)
}

/// The end-of-turn token of `template_source` for `tok`: `explicit` when given, else the first of
/// the tokenizer's EOS tokens that the template writes; with its id (one token).
///
/// # Errors
/// No EOS token appears in the template and none was given; the string is not one token.
pub fn end_of_turn(
    tok: &TokenizerBundle,
    template_source: &str,
    explicit: Option<&str>,
) -> anyhow::Result<(String, u32)> {
    let text = match explicit {
        Some(t) => t.to_string(),
        None => tok
            .eos_ids
            .iter()
            .filter_map(|&id| tok.tokenizer.id_to_token(id))
            .find(|t| template_source.contains(t.as_str()))
            .with_context(|| {
                "none of the tokenizer's EOS tokens appears in the chat template: set \
                 env.end_of_turn to the template's end-of-turn token (e.g. \"<|im_end|>\")"
            })?,
    };
    let ids = tok.encode(&text, false)?;
    match ids[..] {
        [id] => Ok((text, id)),
        _ => anyhow::bail!(
            "env.end_of_turn {text:?} encodes as {} tokens {ids:?}, not one (it must be a special \
             token of the model's tokenizer)",
            ids.len()
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// More than `max_error_frac` stops, exactly `max_error_frac` does not, an empty batch never
    /// does; the message names the counts, the percentage, the limit and the first failure.
    #[test]
    fn the_error_budget_stops_only_above_the_limit() {
        let b = |errors, episodes| ErrorBudget {
            errors,
            episodes,
            first: Some("episode 7:0: reset: no such game".into()),
        };
        assert!(b(2, 4).check(0.5).is_ok());
        assert!(b(0, 0).check(0.0).is_ok());
        assert!(b(0, 4).check(0.0).is_ok());
        assert!(b(4, 4).check(1.0).is_ok());
        assert_eq!(
            b(3, 4).check(0.5).unwrap_err().to_string(),
            "3 of 4 episodes failed in the environment (75%, above env.max_error_frac = 0.5); \
             the first: episode 7:0: reset: no such game"
        );
        assert!(b(1, 4).check(0.0).is_err());
    }
}
