//! The sections of the run configuration that rlvr-train defines (`[model]`, `[rollout]`, `[sync]`,
//! `[train]`, `[eval]`, `[output]`). The `///` comments of their fields are the README's config
//! reference ([`super::reference_markdown`] reads this file).

use std::path::PathBuf;

use rlvr_algo::parts::{Knob, Part, Registered};
use rlvr_model::{ComputeDtype, DeviceSpec, LoraConfig, LoraTarget};
use serde::{Deserialize, Serialize};

pub use crate::feed::explorer::ShortBatch;
pub use crate::update::lr::Schedule;

/// `[model]`: the policy checkpoint and where it computes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ModelSection {
    /// Policy checkpoint directory (HF layout: config.json, *.safetensors, tokenizer.json). Required.
    /// A Hugging Face Hub id (`ORG/NAME`) that is no directory here is read from the local Hugging
    /// Face cache (`$HF_HOME/hub`, default `~/.cache/huggingface/hub`) when it is there (a note
    /// says so); rlvr downloads nothing, and a run refuses to start naming the
    /// `huggingface-cli download` command otherwise.
    pub path: PathBuf,
    /// Compute dtype of the weights: `auto`, `f32` or `bf16` (or `f64`, slow, for checks). `auto` is
    /// `bf16` on a GPU (with f32 master weights and AdamW moments) and `f32` on the CPU. `f16` is
    /// refused for training (no loss scaling: its gradients underflow); `rlvr eval` and
    /// `rlvr logprobs` accept it. Default `auto`.
    pub dtype: ComputeDtype,
    /// Device: `auto`, `cpu`, `cuda` (the GPU of this process's local rank) or `cuda:N` (a binary
    /// built with `--features cuda`). `auto` is `cuda` when the binary has CUDA and that GPU opens,
    /// else `cpu`; the choice is printed once at start and recorded in config.toml. Default `auto`.
    pub device: DeviceSpec,
    /// Frozen reference policy for the KL term; default: `model.path` (the initial policy). Loaded only
    /// when `algorithm.kl_coef` ≠ 0.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reference: Option<PathBuf>,
    /// LoRA rank r (Hu et al. 2021, arXiv 2106.09685): 0 = off (full fine-tuning); r ≥ 1 trains rank-r
    /// adapters A `[r, in]`, B `[out, r]` (f32) on the `lora_targets` projections of every layer while
    /// the base, the embedding and the lm_head stay frozen. Checkpoints then hold `adapter/` in PEFT's
    /// format; the KL reference is the base with the adapters off. At most the model's hidden size
    /// (and 65536). Default 0.
    pub lora_rank: usize,
    /// LoRA α: the adapter update is scaled by α / r (PEFT's `lora_alpha`). Default 2 × `lora_rank`
    /// (the resolved config records the value).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lora_alpha: Option<f64>,
    /// Projections that get an adapter: `"all-linear"` (PEFT's `target_modules` value: every
    /// decoder projection, not the lm_head; as a bare string or a one-item list), or a list of any
    /// of `q`, `k`, `v`, `o`, `gate`, `up`, `down` (or PEFT's `q_proj` … `down_proj`); phi3
    /// checkpoints fuse q/k/v and gate/up, so there: `qkv_proj`, `o_proj`, `gate_up_proj`,
    /// `down_proj` (as a PEFT adapter for Phi-3 names them). Default `["all-linear"]`.
    #[serde(deserialize_with = "lora_targets")]
    pub lora_targets: Vec<LoraTarget>,
    /// Dropout probability on the adapters' input in training forwards, in [0, 1) (PEFT's
    /// `lora_dropout`; sampling and scoring never drop, so dropout > 0 makes even staleness-0 data
    /// slightly off-policy; the masks come from a seeded stream whose position trainer_state
    /// keeps, so a resume is exact). Default 0.
    pub lora_dropout: f64,
}

/// Reads `model.lora_targets`: a list of projections, or PEFT's `"all-linear"` (all seven, as
/// peft's `target_modules="all-linear"` selects every linear layer of the decoder but the lm_head).
///
/// # Errors
/// Any other string (a list is needed), an unknown projection, or `"all-linear"` inside a list.
fn lora_targets<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Vec<LoraTarget>, D::Error> {
    struct Targets;
    impl<'de> serde::de::Visitor<'de> for Targets {
        type Value = Vec<LoraTarget>;
        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str("a list of q, k, v, o, gate, up, down (phi3: qkv_proj, o_proj, gate_up_proj, down_proj), or \"all-linear\"")
        }
        fn visit_str<E: serde::de::Error>(self, s: &str) -> Result<Self::Value, E> {
            if s == "all-linear" {
                return Ok(vec![LoraTarget::AllLinear]);
            }
            Err(E::custom(format!(
                "\"{s}\" is one string: write a list, e.g. [\"{s}\"], of q, k, v, o, gate, up, \
                 down (or q_proj … down_proj; phi3: qkv_proj, o_proj, gate_up_proj, down_proj), \
                 or \"all-linear\" for every projection"
            )))
        }
        fn visit_seq<A: serde::de::SeqAccess<'de>>(
            self,
            mut seq: A,
        ) -> Result<Self::Value, A::Error> {
            let mut out = Vec::new();
            // `["all-linear"]` (the resolved config's own spelling) reads back; all-linear beside
            // other names is refused by the config checks, naming the key.
            while let Some(s) = seq.next_element::<String>()? {
                out.push(s.parse().map_err(serde::de::Error::custom)?);
            }
            Ok(out)
        }
    }
    d.deserialize_any(Targets)
}

/// The parts of `model.lora_rank` (a switch at 0): adapters read their α, targets and dropout.
pub const LORA_PARTS: &[Part] = &[
    Part {
        name: "≥ 1",
        knobs: &[
            Knob {
                key: "lora_alpha",
                default: "unset",
            },
            Knob {
                key: "lora_targets",
                default: "[\"all-linear\"]",
            },
            Knob {
                key: "lora_dropout",
                default: "0.0",
            },
        ],
        metrics: &[],
    },
    Part {
        name: "0",
        knobs: &[],
        metrics: &[],
    },
];

impl Default for ModelSection {
    fn default() -> Self {
        ModelSection {
            path: PathBuf::new(),
            dtype: ComputeDtype::Auto,
            device: DeviceSpec::Auto,
            reference: None,
            lora_rank: 0,
            lora_alpha: None,
            lora_targets: vec![LoraTarget::AllLinear],
            lora_dropout: 0.0,
        }
    }
}

impl ModelSection {
    /// The LoRA settings, `None` when `lora_rank = 0`; α defaults to 2 × rank.
    pub fn lora(&self) -> Option<LoraConfig> {
        (self.lora_rank > 0).then(|| LoraConfig {
            rank: self.lora_rank,
            alpha: self.lora_alpha.unwrap_or(2.0 * self.lora_rank as f64),
            targets: self.lora_targets.clone(),
            dropout: self.lora_dropout,
        })
    }
}

/// `[rollout]`: sampling (DESIGN.md section 3).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RolloutSection {
    /// K: completions per prompt; at least 2 (a group baseline needs two; see
    /// `allow_group_size_one`), at most 4096, and `data.prompts_per_step` × K at most 2²⁰ rows per
    /// step. Default 8.
    pub group_size: usize,
    /// Most generated tokens per completion (the EOS included); also the constant normaliser's L.
    /// At least 1, at most 2²⁴, and prompt + this must fit the model's positions. Default 256.
    pub max_new_tokens: usize,
    /// Fewest new tokens before EOS or a stop string may end a completion (transformers'
    /// `min_new_tokens`, vLLM's `min_tokens`); the EOS probability is removed from the draw until
    /// then, while ℓ_old stays the full-distribution log-prob. Equal to `max_new_tokens` it gives
    /// fixed-length completions (benchmarks). Default 0.
    pub min_new_tokens: usize,
    /// Sampling temperature T, in (0, 1000]; the trainer scores with the same T. Default 1.
    pub temperature: f64,
    /// Nucleus mass in (0, 1]; 1 = off. Default 1. Below 1 even staleness-0 data is slightly
    /// off-policy (ℓ_old is the untruncated log-prob).
    pub top_p: f64,
    /// Top-k; 0 = off. Default 0.
    pub top_k: usize,
    /// Extra stop strings (the tokenizer's EOS ids always stop). Default none.
    pub stop: Vec<String>,
    /// Most rows decoded together (KV-cache memory bound). Default 64.
    pub max_batch_rows: usize,
    /// Allow `group_size = 1`, which every group baseline turns into zero advantages (the policy
    /// never learns from rewards); for benchmarks. Default false: `group_size = 1` is an error.
    pub allow_group_size_one: bool,
    /// The sampling engine: `native` (this process) or `vllm` (vLLM OpenAI-compatible servers
    /// started with `--logprobs-mode processed_logprobs` and `VLLM_SERVER_DEV_MODE=1`; README
    /// "Scaling out with vLLM"). Same experience records and staleness semantics. Default `native`.
    pub backend: RolloutBackend,
    /// vLLM backend: base URLs of the servers, e.g. `["http://127.0.0.1:8000"]`; groups are spread
    /// over them. Required with `backend = "vllm"`.
    pub servers: Vec<String>,
    /// vLLM backend: the `--served-model-name` the servers run. Default `rlvr-policy`.
    pub served_model_name: String,
    /// vLLM backend: where each policy version is written as a checkpoint directory for the servers to
    /// reload (a path they can read: a shared filesystem for remote servers). Default
    /// `RUN_DIR/vllm-weights`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub weights_dir: Option<PathBuf>,
    /// vLLM backend: the name of an environment variable holding the servers' API key (vLLM's
    /// `--api-key`), sent as a bearer token; the key itself never reaches config.toml. Default none.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub api_key_env: Option<String>,
    /// vLLM backend: whole-request timeout in seconds: one group of completions (and a weight
    /// reload) must come back within it. A request that times out is sent again only if the server
    /// answers `GET /health` within 10 s, so a hung server stops the run after one timeout. Default
    /// 180; raise it for completions of many thousand tokens or a large model's reload.
    pub request_timeout_s: f64,
    /// vLLM backend: attempts after a failed request (back-off from 0.5 s, doubled); then the run
    /// stops with a checkpoint and an error naming the server. At most 100; default 3.
    pub retries: usize,
    /// vLLM backend: requests (groups) in flight per server. Default 8.
    pub in_flight: usize,
    /// vLLM backend: accept `top_p < 1`, `top_k > 0` or `min_new_tokens > 0`, whose behaviour
    /// log-probs vLLM renormalises over the kept tokens (not DESIGN.md section 3's full-vocabulary
    /// ℓ_old of the native engine, so the ratio carries log(kept mass)); recorded in run.json.
    /// Default false: such a config is refused.
    pub accept_renormalised_logprobs: bool,
    /// vLLM backend: largest max |ℓ_server − ℓ_trainer| (nats, T = 1) on the fixed sequence scored
    /// after each weight refresh; above it the refresh failed (stale weights). ~1e-6 is seen with
    /// `--dtype float32` servers; raise it for bf16 servers (~0.05). Default 0.01.
    pub refresh_tolerance: f64,
    /// vLLM backend: the `cache_salt` sent with every completion request. `version`: a salt
    /// naming this run (a hash of its run directory; `rlvr eval` and `rlvr generate`: of the
    /// process) and the policy version whose weights the servers hold, so that a server started
    /// with prefix caching on shares KV blocks only between requests of one run at one version
    /// (later turns of an episode reuse their context's blocks, a group's K samples their prompt's)
    /// and never serves KV computed under other weights, in flight across a reload or from another
    /// run. `off`: no salt. Without prefix caching on the server the salt changes nothing. Default
    /// `version`; docs/vllm.md "Prefix caching".
    pub cache_salt: CacheSalt,
}

/// `rollout.cache_salt`: the prefix-cache salt of vLLM requests (docs/vllm.md "Prefix caching").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CacheSalt {
    /// A salt naming the run and the policy version the servers hold.
    #[default]
    Version,
    /// No salt: requests of any run and version may share the servers' prefix-cache blocks.
    Off,
}

/// `env.observation_truncation`: what happens to a reply whose bridge is longer than
/// `env.max_observation_tokens` (`rlvr_env::truncate`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ObservationTruncation {
    /// Its episode is unscorable.
    #[default]
    Error,
    /// The contents' first tokens are kept.
    KeepHead,
    /// The contents' last tokens are kept.
    KeepTail,
    /// The contents' first and last tokens are kept, the middle cut.
    KeepEnds,
}

impl ObservationTruncation {
    /// The episode runner's form.
    pub fn truncation(self) -> rlvr_env::truncate::Truncation {
        use rlvr_env::truncate::Truncation;
        match self {
            ObservationTruncation::Error => Truncation::Error,
            ObservationTruncation::KeepHead => Truncation::KeepHead,
            ObservationTruncation::KeepTail => Truncation::KeepTail,
            ObservationTruncation::KeepEnds => Truncation::KeepEnds,
        }
    }
}

/// `rollout.backend`: which engine samples (DESIGN.md section 12).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RolloutBackend {
    /// rlvr's own engine in this process (rlvr-rollout).
    #[default]
    Native,
    /// vLLM OpenAI-compatible servers (rlvr-vllm).
    Vllm,
}

impl Registered for RolloutBackend {
    const KEY: &'static str = "backend";
    const PARTS: &'static [Part] = &[
        Part {
            name: "native",
            knobs: &[],
            metrics: &[],
        },
        Part {
            name: "vllm",
            knobs: &[
                Knob {
                    key: "servers",
                    default: "[]",
                },
                Knob {
                    key: "served_model_name",
                    default: "\"rlvr-policy\"",
                },
                Knob {
                    key: "weights_dir",
                    default: "unset",
                },
                Knob {
                    key: "api_key_env",
                    default: "unset",
                },
                Knob {
                    key: "request_timeout_s",
                    default: "180.0",
                },
                Knob {
                    key: "retries",
                    default: "3",
                },
                Knob {
                    key: "in_flight",
                    default: "8",
                },
                Knob {
                    key: "accept_renormalised_logprobs",
                    default: "false",
                },
                Knob {
                    key: "refresh_tolerance",
                    default: "0.01",
                },
                Knob {
                    key: "cache_salt",
                    default: "\"version\"",
                },
            ],
            metrics: &[],
        },
    ];
}

impl Default for RolloutSection {
    fn default() -> Self {
        RolloutSection {
            group_size: 8,
            max_new_tokens: 256,
            min_new_tokens: 0,
            temperature: 1.0,
            top_p: 1.0,
            top_k: 0,
            stop: Vec::new(),
            max_batch_rows: 64,
            allow_group_size_one: false,
            backend: RolloutBackend::Native,
            servers: Vec::new(),
            served_model_name: "rlvr-policy".into(),
            weights_dir: None,
            api_key_env: None,
            request_timeout_s: 180.0,
            retries: 3,
            in_flight: 8,
            accept_renormalised_logprobs: false,
            refresh_tolerance: 0.01,
            cache_salt: CacheSalt::Version,
        }
    }
}

/// `[env]`: multi-turn, tool-using episodes (docs/DESIGN.md section 14; docs/environments.md).
/// Setting `env.command`, `env.builtin` or `env.verifiers` makes the run multi-turn; otherwise every
/// other key must stay at its default.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct EnvSection {
    /// The environment program and its arguments (no shell), started once per run in its own
    /// process group and spoken to in JSON lines (docs/DESIGN.md section 14). Relative paths are
    /// relative to the config file, like an external verifier's. Its rewards are the episodes'
    /// rewards, so a `data.task = "jsonl"` run needs no `data.verifier` with it
    /// (docs/environments.md, "Data without a verifier"). Empty: no program. Default empty.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub command: Vec<String>,
    /// A built-in environment instead of a program: `retry` (the run's task verifier scores each
    /// turn; a wrong turn gets "That is not correct. Please try again." until `env.max_turns`; a
    /// correct one ends the episode with reward `env.turn_discount`^(turn − 1)). Default unset.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub builtin: Option<String>,
    /// An environment written with Prime Intellect's `verifiers` library (verifiers 0.3.1's
    /// classic API: `load_environment`, `MultiTurnEnv`, `ToolEnv`, a `Rubric`; or verifiers
    /// 0.4.0's `verifiers.v1`: a taskset and its harness), run unchanged: its id, as prime-rl's
    /// `[[orchestrator.env]] id` and `vf-eval` name it (the module imported is the id with `-` as
    /// `_`). rlvr runs it with the adapter it carries (examples/verifiers_env.py) under
    /// `env.python`, as a program environment whose rewards are the environment's rubric's (v1:
    /// its task's reward functions'); instead of `env.command` (docs/coming-from-prime-rl.md).
    /// Default unset.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub verifiers: Option<String>,
    /// The keyword arguments of the `env.verifiers` environment's `load_environment` (prime-rl's
    /// `[[orchestrator.env]] args`, `vf-eval --env-args`), e.g. `{ num_train_examples = 2000 }`;
    /// for a verifiers 0.4.0 (v1) environment, its taskset's config fields. Default none.
    #[serde(skip_serializing_if = "toml::Table::is_empty")]
    pub env_args: toml::Table,
    /// The Python interpreter that runs the `env.verifiers` environment: one with `verifiers` and
    /// the environment's package installed (a path with a `/` is relative to the config file).
    /// Default `python3`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub python: Option<String>,
    /// Assistant turns per episode, 1 to 1024. Default 4.
    pub max_turns: u32,
    /// Tokens after the prompt, assistant turns and bridges together, per episode; at least
    /// `rollout.max_new_tokens` (the first turn is sampled exactly as a single-turn completion),
    /// and prompt + this must fit the model's positions. Later turns get at most what is left.
    /// Default `env.max_turns` × `rollout.max_new_tokens` + (`env.max_turns` − 1) ×
    /// `env.max_observation_tokens`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_episode_tokens: Option<usize>,
    /// Most tokens of one bridge (the environment's reply as the chat template renders it, with
    /// the next generation prompt); a longer one makes its episode unscorable, or is cut to fit
    /// (`env.observation_truncation`). Default 1024.
    pub max_observation_tokens: usize,
    /// What happens to a reply whose bridge is longer than `env.max_observation_tokens`:
    /// `error` (its episode is unscorable), or its messages' contents are cut at token boundaries
    /// until the bridge fits, `[...truncated...]` written where text was removed: `keep-head`
    /// (the first tokens; verl's `tool_response_truncate_side = "left"`), `keep-tail` (the last
    /// tokens; verl's `right`) or `keep-ends` (the first and last halves; verl's `middle`).
    /// Counted by `env/obs_truncated`. Default `error` (docs/environments.md, "Long observations").
    pub observation_truncation: ObservationTruncation,
    /// How tool calls are parsed from a turn: `hermes` (`<tool_call>{json}</tool_call>`, Qwen2.5
    /// and Qwen3), `llama3_json` (Llama 3.1) or `none` (games, user feedback). Default `none`.
    pub tool_format: String,
    /// Static tool schemas handed to the chat template (`tools=`), as a string holding a JSON
    /// array of OpenAI-style function schemas (a string keeps the keys in the order written,
    /// which the template prints). An environment's `reset` reply may give its own. Default unset.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tools: Option<String>,
    /// The episode's reward: `sum` of every reward the environment gave, or `final` (the last
    /// one). Default `sum`.
    pub reward: String,
    /// Longest wait for one reply of the environment program, seconds, in (0, 86400]. Default 60.
    pub timeout_s: f64,
    /// Restarts of a dead or silent environment program per run, at most 1000: the new program
    /// gets the live episodes' `reset` and earlier `step`s again, then the request
    /// (docs/environments.md, "Restarts and replay"). Default 3.
    pub restarts: u32,
    /// The run stops when more than this share of a batch's episodes failed (reward null), in
    /// [0, 1]. Default 0.5.
    pub max_error_frac: f64,
    /// Environment variables passed to the program besides `PATH HOME LANG TMPDIR`. Default none.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub env: Vec<String>,
    /// The program's working directory; default the directory of the config file that set
    /// `env.command` (recorded in the run's config.toml).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dir: Option<PathBuf>,
    /// Extra variables for the chat template, e.g. `{ enable_thinking = false }`. Default none.
    #[serde(skip_serializing_if = "toml::Table::is_empty")]
    pub template_kwargs: toml::Table,
    /// A table handed to the program in `hello`. Default empty.
    #[serde(skip_serializing_if = "toml::Table::is_empty")]
    pub options: toml::Table,
    /// The `retry` environment's reward factor per extra turn, in (0, 1]; refused beside
    /// `env.command` (a program gives its own rewards). Default 1.
    pub turn_discount: f64,
    /// A Jinja chat template file that renders the bridges (and prompts an environment's `reset`
    /// replaces), relative to the config file; default the model's own chat template. Its
    /// end-of-turn string must be one token of the model's tokenizer.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub chat_template: Option<PathBuf>,
    /// The template's end-of-turn token as text (`<|im_end|>`, `<|eot_id|>`): a turn that ends on
    /// it is handed to the environment; another stop id ends the episode (`eos`). Default the
    /// first of the tokenizer's EOS tokens that the template writes.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub end_of_turn: Option<String>,
    /// Accept observations that hold the tokenizer's special tokens as text (they would be
    /// encoded as those control tokens). Default false: such an episode is unscorable.
    pub allow_special_tokens: bool,
    /// Native engine: MiB of keys and values kept per batch between an episode's turns, so that
    /// a later turn prefills only its new tokens (the environment's reply and the next
    /// generation prompt). Past the budget, episodes are dropped from it in (prompt, sample)
    /// order, never by timing, and prefill their whole context. The kept keys and values come
    /// from decode steps rather than one prefill, so log-probs differ by float rounding (about
    /// 1e-5 nats), which can flip a sampled token; runs stay bit-identical at any thread count.
    /// 0 prefills every turn's whole context (the path before this key). At most 1048576 (1
    /// TiB). With the vLLM backend (its servers cache by themselves) it stays at its default.
    /// Default 1024.
    pub kv_cache_mib: u64,
}

impl Default for EnvSection {
    fn default() -> Self {
        EnvSection {
            command: Vec::new(),
            builtin: None,
            verifiers: None,
            env_args: toml::Table::new(),
            python: None,
            max_turns: 4,
            max_episode_tokens: None,
            max_observation_tokens: 1024,
            observation_truncation: ObservationTruncation::Error,
            tool_format: "none".into(),
            tools: None,
            reward: "sum".into(),
            timeout_s: 60.0,
            restarts: 3,
            max_error_frac: 0.5,
            env: Vec::new(),
            dir: None,
            template_kwargs: toml::Table::new(),
            options: toml::Table::new(),
            turn_discount: 1.0,
            chat_template: None,
            end_of_turn: None,
            allow_special_tokens: false,
            kv_cache_mib: 1024,
        }
    }
}

impl EnvSection {
    /// Whether the run is multi-turn (`env.command`, `env.builtin` or `env.verifiers` set).
    pub fn is_on(&self) -> bool {
        self.is_program() || self.builtin.is_some()
    }

    /// Whether the environment is a program: `env.command`, or `env.verifiers` (the adapter rlvr
    /// carries, run as a program).
    pub fn is_program(&self) -> bool {
        !self.command.is_empty() || self.verifiers.is_some()
    }

    /// The program of a program environment and the options its `hello` gets: `env.command` and
    /// `env.options`, or for `env.verifiers` `[env.python, the adapter]` (written out once per
    /// process, `rlvr_env::verifiers::adapter_path`) and `env.options` with `env_id` and
    /// `env_args` added. `None` for the built-in `retry` or no environment.
    ///
    /// # Errors
    /// The adapter cannot be written out (its temporary directory), or a table that is not JSON.
    pub fn program(&self) -> anyhow::Result<Option<(Vec<String>, rlvr_env::json::Json)>> {
        use rlvr_env::json::Json;
        let to_json = |t: &toml::Table| -> anyhow::Result<Json> {
            Ok(Json::parse(&serde_json::to_string(t)?)?)
        };
        let options = to_json(&self.options)?;
        if let Some(id) = &self.verifiers {
            let python = self.python.as_deref().unwrap_or("python3");
            let command = rlvr_env::verifiers::command(python)
                .map_err(|e| anyhow::anyhow!("env.verifiers: {e}"))?;
            let options = rlvr_env::verifiers::hello_options(options, id, to_json(&self.env_args)?);
            return Ok(Some((command, options)));
        }
        Ok((!self.command.is_empty()).then(|| (self.command.clone(), options)))
    }

    /// Whether every key is at its default (a single-turn run's `[env]`, left out of config.toml).
    pub fn is_default(&self) -> bool {
        *self == EnvSection::default()
    }

    /// `env.max_episode_tokens`, or its default for `max_new_tokens` per turn.
    pub fn episode_tokens(&self, max_new_tokens: usize) -> usize {
        self.max_episode_tokens.unwrap_or_else(|| {
            let t = self.max_turns.max(1) as usize;
            t.saturating_mul(max_new_tokens)
                .saturating_add((t - 1).saturating_mul(self.max_observation_tokens))
        })
    }
}

/// `[sync]`: staleness regime (DESIGN.md section 3).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SyncSection {
    /// v: the explorer loads the trainer's weights when the completed step count is a multiple of v.
    /// v = 1 is on-policy (with o = 0). Default 1.
    pub interval: u64,
    /// o: the explorer runs o steps ahead on its own thread (staleness o..o+v−1); at most
    /// `train.steps`. Default 0.
    pub offset: u64,
    /// Drop experiences older than this many steps (staleness > max). Unset: keep all. Experiences
    /// without a version (offline files) are never dropped.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_staleness: Option<u64>,
}

impl Default for SyncSection {
    fn default() -> Self {
        SyncSection {
            interval: 1,
            offset: 0,
            max_staleness: None,
        }
    }
}

/// `[distributed]`: data parallel across processes (README, "Scaling out"). How many processes and
/// which one this is come from the launcher (`mpirun -np N`, `srun --mpi=pmix`, torchrun), never
/// from the config; the engine is MPI (build with `--features mpi`), with NCCL for GPU tensors in
/// a build with `--features nccl`.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct DistributedSection {
    /// Engine of the tensor collectives: "auto" (NCCL when the build has the `nccl` feature, the
    /// device is a GPU and there is more than one rank, else MPI; torch's rule), "host" (MPI;
    /// GPU tensors staged through host memory), "nccl" (NCCL, also in one process: a check of
    /// the NCCL path on one GPU). Default "auto".
    pub backend: DistBackend,
    /// Seconds a collective waits for the slowest rank before the job is aborted with a message
    /// naming the ranks that never arrived; 0 waits forever. It must exceed the longest skew
    /// between ranks (one rank sampling longer completions, one evaluating more problems).
    /// Unset: the `RLVR_DIST_TIMEOUT_S` environment variable, else 600 (torch's NCCL default).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub timeout_s: Option<f64>,
    /// ZeRO stage: 0 every rank holds the whole optimizer state (AdamW moments, the f32 masters
    /// of bf16 weights); 1 shards it over the ranks by whole parameters (about 1/W of it per
    /// rank), with the same steps, metrics and checkpoints (`rlvr plan --world-size N --zero 1`
    /// shows the memory); 2 shards the f32 gradient sum too (each micro-batch's gradients are
    /// reduced to their owners; the sums in another order, so metrics agree with stage 0 and 1
    /// to rounding). Default 0.
    pub zero: u8,
}

/// `distributed.backend` (see [`DistributedSection::backend`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DistBackend {
    /// NCCL for GPUs at more than one rank when built, else the host engine.
    #[default]
    Auto,
    /// MPI (or nothing in one process).
    Host,
    /// NCCL, also in one process.
    Nccl,
}

impl From<DistBackend> for rlvr_dist::Backend {
    fn from(b: DistBackend) -> Self {
        match b {
            DistBackend::Auto => rlvr_dist::Backend::Auto,
            DistBackend::Host => rlvr_dist::Backend::Host,
            DistBackend::Nccl => rlvr_dist::Backend::Nccl,
        }
    }
}

impl DistributedSection {
    /// The collective timeout: `Some(d)`, or `None` to wait forever (module docs of the field).
    ///
    /// # Errors
    /// A negative or non-finite `timeout_s`; a bad `RLVR_DIST_TIMEOUT_S`.
    pub fn timeout(&self) -> anyhow::Result<Option<std::time::Duration>> {
        match self.timeout_s {
            _ if self.zero > 2 => anyhow::bail!(
                "distributed.zero = {}: expected 0 (no sharding), 1 (optimizer state sharded) or \
                 2 (gradients sharded too)",
                self.zero
            ),
            Some(s) if !(s.is_finite() && (0.0..=rlvr_dist::comm::MAX_TIMEOUT_S).contains(&s)) => {
                let shown = Some(s.to_string())
                    .filter(|p| p.len() <= 16)
                    .unwrap_or_else(|| format!("{s:e}"));
                anyhow::bail!(
                    "distributed.timeout_s = {shown} is out of range: expected a number of seconds \
                     in [0, {:e}] (0 waits forever)",
                    rlvr_dist::comm::MAX_TIMEOUT_S
                )
            }
            Some(0.0) => Ok(None),
            Some(s) => Ok(std::time::Duration::try_from_secs_f64(s).ok()),
            None => Ok(rlvr_dist::comm::timeout_from_env()?),
        }
    }
}

/// `[train]`: the trainer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TrainSection {
    /// Trainer steps (each: B prompts × K completions, possibly several optimizer updates), at
    /// least 1. Default 100.
    pub steps: u64,
    /// Peak learning rate, finite and > 0. Default 1e-6.
    pub lr: f64,
    /// Lowest learning rate of the `linear` and `cosine` schedules, in [0, `lr`]. Default 0.
    pub min_lr: f64,
    /// Steps of linear warm-up from 0 to `lr`. Default 0.
    pub warmup_steps: u64,
    /// `constant`, `linear` or `cosine`. Default `constant`.
    pub schedule: Schedule,
    /// AdamW decoupled weight decay λ, in [0, 1000]. Default 0.01.
    pub weight_decay: f64,
    /// AdamW β₁, in [0, 1). Default 0.9.
    pub beta1: f64,
    /// AdamW β₂, in [0, 1). Default 0.999.
    pub beta2: f64,
    /// AdamW ε, in (0, 1]. Default 1e-8.
    pub adam_eps: f64,
    /// Clip the global gradient L2 norm to this value (finite, ≥ 0); 0 = off. Default 1.
    pub grad_clip: f64,
    /// Rows (completions) per micro-batch. Default 8.
    pub micro_batch_size: usize,
    /// Token budget per micro-batch: the decoder positions of its forward (rows × padded length,
    /// or with `share_prompt` each distinct prompt once plus rows × longest completion, whichever
    /// is less); when set it replaces `micro_batch_size` (a single longer row still gets its own
    /// micro-batch). Default unset.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub micro_batch_tokens: Option<usize>,
    /// Compute each group's prompt once for its K completions, forward and backward (the
    /// prefix-shared forward), in the training pass, the KL reference pass, the mismatch scoring
    /// and `recompute_behaviour`. Micro-batches always hold whole groups (a group above the limit
    /// is split into parts that each share the prompt). Rows are grouped by identical prompt ids,
    /// so rows that share no prompt take the unshared path. The same values up to float
    /// reassociation; false computes every row's prompt (for checking). Default true.
    pub share_prompt: bool,
    /// Leave out of forward and backward the rows whose gradient is exactly zero: rows outside the
    /// normaliser (zero-variance groups under `exclude_zero_std`, masked truncations) and, when the
    /// loss has no KL, entropy or regulariser term, rows with advantage 0. The update is unchanged;
    /// the step's ratio, clip, entropy and KL diagnostics then cover the trained rows only. TRL and
    /// verl compute these rows; set false to match their work (benchmarks). Default true.
    pub skip_zero_gradient_rows: bool,
    /// Activation (gradient) checkpointing: each decoder layer keeps only its input for the
    /// backward and recomputes its forward there (transformers' `gradient_checkpointing`), about
    /// one more forward per step for much less activation memory (`rlvr plan` shows both).
    /// Gradients equal the plain path's up to float reassociation. Default false.
    pub gradient_checkpointing: bool,
    /// Optimizer updates per epoch: the step's groups are split into this many mini-batches, at
    /// most 2²⁰. Default 1.
    pub mini_batches: usize,
    /// μ: passes over the step's batch, 1 to 1024. Default 1.
    pub epochs: usize,
    /// Seed of sampling and of the trainer's random choices (RED-Drop). Default 0.
    pub seed: u64,
    /// Held-out evaluation every this many steps, at step 0 and at the last step; 0 = never.
    /// Default 0.
    pub eval_every: u64,
    /// Checkpoint every this many steps (and at the end); 0 = only at the end. Default 0.
    pub save_every: u64,
    /// Keep this many newest checkpoints (the best one is kept too); 0 = keep all. Default 2.
    pub keep_last: usize,
    /// Save the optimizer's state (AdamW's two moments and, for bf16 weights, f32 master
    /// weights: about 8 or 12 bytes per parameter, 1.08 GB for a 135M model) in each checkpoint's
    /// `trainer_state/`, so that `--resume` continues exactly. false saves the model alone
    /// (TRL's `save_only_model = true`); a resume from such a checkpoint is refused unless
    /// `train.resume_without_optimizer` is set. Default true.
    pub save_optimizer: bool,
    /// Resume from a checkpoint saved without the optimizer (`train.save_optimizer = false`)
    /// with a fresh AdamW (zero moments, bias correction from its first update): the run then
    /// differs from an uninterrupted one. Without it such a resume is refused. Default false.
    pub resume_without_optimizer: bool,
    /// Recompute behaviour log-probs with the trainer's forward at the behaviour version (train/sampler
    /// mismatch correction, DESIGN.md section 3). Default false.
    pub recompute_behaviour: bool,
    /// DAPO dynamic sampling: most extra sampling rounds per step to refill dropped groups. Default 4.
    pub dynamic_sampling_max_rounds: usize,
    /// DAPO dynamic sampling when the rounds end short of B groups with reward variance: `train`
    /// on the short batch (counted in diagnostics.jsonl `dynamic_sampling/short_groups`) or stop
    /// with an `error` (verl's behaviour). Default `train`.
    pub dynamic_sampling_short_batch: ShortBatch,
    /// Abort after this many skipped (non-finite) steps in a row. Default 3.
    pub max_skipped_in_row: u32,
    /// Completions per step written to rollouts.jsonl (0 = none). Default 4.
    pub log_rollouts: usize,
}

/// The parts of `algorithm.dynamic_sampling` (a switch the trainer reads): on, it reads its
/// refill rounds and what a short batch does.
pub const DYNAMIC_SAMPLING_PARTS: &[Part] = &[
    Part {
        name: "true",
        knobs: &[
            Knob {
                key: "train.dynamic_sampling_max_rounds",
                default: "4",
            },
            Knob {
                key: "train.dynamic_sampling_short_batch",
                default: "\"train\"",
            },
        ],
        // `dynamic_sampling/dropped_groups` and `dynamic_sampling/short_groups` are no part's:
        // every run writes them (0 when dynamic sampling is off).
        metrics: &[],
    },
    Part {
        name: "false",
        knobs: &[],
        metrics: &[],
    },
];

impl Default for TrainSection {
    fn default() -> Self {
        TrainSection {
            steps: 100,
            lr: 1e-6,
            min_lr: 0.0,
            warmup_steps: 0,
            schedule: Schedule::Constant,
            weight_decay: 0.01,
            beta1: 0.9,
            beta2: 0.999,
            adam_eps: 1e-8,
            grad_clip: 1.0,
            micro_batch_size: 8,
            micro_batch_tokens: None,
            share_prompt: true,
            skip_zero_gradient_rows: true,
            gradient_checkpointing: false,
            mini_batches: 1,
            epochs: 1,
            seed: 0,
            eval_every: 0,
            save_every: 0,
            keep_last: 2,
            save_optimizer: true,
            resume_without_optimizer: false,
            recompute_behaviour: false,
            dynamic_sampling_max_rounds: 4,
            dynamic_sampling_short_batch: ShortBatch::Train,
            max_skipped_in_row: 3,
            log_rollouts: 4,
        }
    }
}

/// `[eval]`: held-out evaluation during training and in `rlvr eval`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct EvalSection {
    /// Samples per problem; 1 = greedy, > 1 = temperature 1 (mean@k, pass@k); at most 4096.
    /// Default 1.
    pub samples: usize,
    /// First N problems of the test split (N ≥ 1); unset = all. Default unset.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub limit: Option<usize>,
    /// Most new tokens, 1 to 2²⁴; default `rollout.max_new_tokens`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_new_tokens: Option<usize>,
}

impl Default for EvalSection {
    fn default() -> Self {
        EvalSection {
            samples: 1,
            limit: None,
            max_new_tokens: None,
        }
    }
}

/// `[output]`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct OutputSection {
    /// RUN_DIR. Default `runs/run`.
    pub dir: PathBuf,
    /// Write TensorBoard event files in `RUN_DIR/tensorboard/` (every scalar of metrics.jsonl,
    /// eval.jsonl and diagnostics.jsonl, the log-ratio histograms `diagnostics/hist/*`, the
    /// resolved config as text). Default true.
    pub tensorboard: bool,
    /// Off a terminal (or with `--no-progress`): a console line every this many steps (and at the
    /// last step); evaluations always get a line. At least 1. Default 1.
    pub log_every: u64,
    /// Warn when this many steps in a row gave no learning signal (every group of equal reward,
    /// or every row skipped), or had one reward across the whole batch; 0 = never. Default 10.
    pub warn_no_signal_steps: u64,
}

impl Default for OutputSection {
    fn default() -> Self {
        OutputSection {
            dir: PathBuf::from("runs/run"),
            tensorboard: true,
            log_every: 1,
            warn_no_signal_steps: 10,
        }
    }
}
