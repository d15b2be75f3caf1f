//! The `[data]` config table (DESIGN.md section 10: `data.task`, `data.train`, `data.test`,
//! `data.experiences`, `data.prompts_per_step`, `data.seed`, plus the keys of this crate).
//!
//! Defaults are written once, in the `Default` impls; unknown keys are rejected with their name.

use crate::generate::{ArithmeticGenConfig, CountdownGenConfig};
use rlvr_reward::combine::VerifierConfig;
use rlvr_reward::gsm8k::Gsm8kMode;
use serde::{Deserialize, Serialize};
use std::path::PathBuf;

/// The task: which dataset shape, default fields, prompt template and verifier.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum TaskKind {
    /// GSM8K: fields `question` / `answer` (full solution ending `#### N`), GSM8K verifier.
    #[default]
    Gsm8k,
    /// MATH-500: fields `problem` / `answer` (bare LaTeX answer), MATH verifier.
    Math500,
    /// Countdown: fields `nums` / `target` from a file, or generated (`[data.countdown]`).
    Countdown,
    /// Arithmetic: fields `question` / `answer` from a file, or generated (`[data.arithmetic]`).
    Arithmetic,
    /// Any JSONL/Parquet file: `question_field` / `answer_field` and the verifier named in
    /// `data.verifier` (required, unless a program environment gives the reward:
    /// [`DataConfig::validate_for`]).
    Jsonl,
}

impl TaskKind {
    /// The name used in config files and metrics (`gsm8k`, `math500`, ...).
    pub fn name(self) -> &'static str {
        match self {
            TaskKind::Gsm8k => "gsm8k",
            TaskKind::Math500 => "math500",
            TaskKind::Countdown => "countdown",
            TaskKind::Arithmetic => "arithmetic",
            TaskKind::Jsonl => "jsonl",
        }
    }

    /// Default (question, answer) field names of a data file for this task.
    pub fn default_fields(self) -> (&'static str, &'static str) {
        match self {
            TaskKind::Gsm8k => ("question", "answer"),
            TaskKind::Math500 => ("problem", "answer"),
            TaskKind::Countdown => ("nums", "target"),
            TaskKind::Arithmetic | TaskKind::Jsonl => ("question", "answer"),
        }
    }

    /// The default prompt template for this task (`{question}` is the question field; countdown also
    /// has `{numbers}` and `{target}`).
    pub fn default_template(self) -> &'static str {
        match self {
            TaskKind::Gsm8k => "{question}\nLet's think step by step and output the final answer after \"####\".",
            TaskKind::Math500 => "{question}\nLet's think step by step and output the final answer within \\boxed{{}}.",
            TaskKind::Countdown => "Using the numbers {numbers}, create an equation that equals {target}. You can use basic arithmetic operations (+, -, *, /) and each number exactly once. Show your work in <think> </think> tags and return the final equation in <answer> </answer> tags, for example <answer> (1 + 2) / 3 </answer>.",
            TaskKind::Arithmetic | TaskKind::Jsonl => "{question}",
        }
    }

    /// The verifier of the built-in tasks; `None` for `jsonl`, which names its own.
    pub fn default_verifier(self) -> Option<VerifierConfig> {
        match self {
            TaskKind::Gsm8k => Some(VerifierConfig::Gsm8k {
                mode: Gsm8kMode::Flexible,
            }),
            TaskKind::Math500 => Some(VerifierConfig::Math {}),
            TaskKind::Countdown => Some(VerifierConfig::Countdown {}),
            TaskKind::Arithmetic => Some(VerifierConfig::Arithmetic {
                mode: Gsm8kMode::Flexible,
            }),
            TaskKind::Jsonl => None,
        }
    }
}

/// What gives the reward of a split's completions, which decides whether its rows need a
/// reference and the config a verifier.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Scoring {
    /// The task's verifier (`data.verifier`, or the built-in task's): every row has its reference.
    #[default]
    Verifier,
    /// A program environment's rewards (`env.command`, DESIGN.md section 14): a `jsonl` task may
    /// then have no verifier, and its rows no answer field ([`DataConfig::reference_optional`]).
    Environment,
    /// The `[[reward.components]]`' verifiers, each reading the row's reference: a `jsonl` task
    /// needs no `data.verifier` (nothing would read it).
    Components,
    /// Programs that see the row's columns and need no reference: every component's verifier,
    /// or `data.verifier` when there are no components, is of kind `external` or `python` (TRL's
    /// reward functions, which read the columns they name). A `jsonl` task needs no
    /// `data.verifier` when components score it, and its rows no answer field when
    /// `data.answer_field` is unset ([`DataConfig::reference_optional`]): TRL's datasets need
    /// only a `prompt` column.
    Programs,
}

/// How the prompt text is built.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum PromptStyle {
    /// Plain text: system prompt, few-shot examples and the question joined by blank lines.
    #[default]
    Plain,
    /// Chat messages rendered by the model's chat template (a caller-supplied renderer).
    Chat,
}

/// One few-shot example: a question (rendered with the same template) and its answer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FewShotExample {
    /// The example's question (fills `{question}` of the template; other placeholders take the
    /// problem's values).
    pub question: String,
    /// The example's answer shown to the model (on the next line in plain style, an assistant
    /// message in chat style).
    pub answer: String,
}

/// The `[data]` table.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct DataConfig {
    /// Task (gsm8k, math500, countdown, arithmetic, jsonl). Default gsm8k.
    pub task: TaskKind,
    /// Training data file (`.jsonl`, or `.parquet`). Countdown and arithmetic generate problems when
    /// it is unset. Default unset.
    pub train: Option<PathBuf>,
    /// Held-out data file, same format. Countdown and arithmetic generate a disjoint set when unset.
    pub test: Option<PathBuf>,
    /// Offline experiences file (DESIGN.md section 10); when set no task or verifier is needed.
    pub experiences: Option<PathBuf>,
    /// B: prompts per trainer step. Default 32.
    pub prompts_per_step: usize,
    /// Seed of the shuffling and of the generators. Default 0.
    pub seed: u64,
    /// Field (JSONL key, Parquet column) holding the question; default per task (gsm8k `question`,
    /// math500 `problem`, countdown `nums`, others `question`). Its value is text, or (but for
    /// countdown) a list of chat messages `{"role", "content"}` that is the whole prompt (TRL's
    /// conversational `prompt`, verl's `prompt` column: needs `style = "chat"`). A name with dots
    /// (`a.b`) is the top-level key of that name if the row has one, else the path into nested
    /// objects or Parquet struct columns. docs/data.md shows each layout.
    pub question_field: Option<String>,
    /// Field (JSONL key, Parquet column) holding the reference handed to the verifier; default per
    /// task (countdown `target`, others `answer`). A dotted name reads nested fields as in
    /// `question_field` (verl's `reward_model.ground_truth`, `extra_info.answer`). A `jsonl` task
    /// whose program environment gives the rewards (`env.command`, no `data.verifier`), or whose
    /// rewards all come from `external` or `python` verifiers (which see the row's columns: TRL's
    /// reward functions on a `prompt`-only dataset), reads it when a row has it (else the
    /// reference is empty), and requires it in every row only when set.
    pub answer_field: Option<String>,
    /// Verifier of a `jsonl` task, an inline table tagged by `kind` (e.g. `{ kind = "math" }`; each
    /// kind's keys follow); required for `task = "jsonl"` unless a program environment
    /// (`env.command`) gives the rewards, and overrides a built-in task's own otherwise.
    /// docs/external-verifier.md describes the external, judge and reward-model kinds.
    pub verifier: Option<VerifierConfig>,
    /// Prompt style: `plain` (system prompt, few-shot examples and the question joined by blank
    /// lines) or `chat` (system, user/assistant pairs of the few-shot examples, then the question
    /// as the user's message, rendered by the model's chat template with the generation prompt;
    /// a row whose question is a list of chat messages is rendered as it is, and needs `chat`).
    /// Default `plain`.
    pub style: PromptStyle,
    /// Prompt template: `{question}` is the question field; countdown adds `{numbers}` and
    /// `{target}`, a `jsonl` task any string or number field of the row as `{NAME}`; `{{`/`}}` for
    /// literal braces. Default: the task's template (gsm8k and math500 add their answer-format
    /// instruction, countdown its instructions, others `{question}` alone). Not applied to a row
    /// of chat messages (setting it with such rows is refused).
    pub template: Option<String>,
    /// Optional system prompt (a system message in chat style, the first paragraph in plain style).
    /// Refused with rows of chat messages (put the system message in the row's list).
    pub system_prompt: Option<String>,
    /// Few-shot examples placed before the question, each a table of `question` (rendered with the
    /// same template) and `answer`. Default none. Refused with rows of chat messages.
    pub few_shot: Vec<FewShotExample>,
    /// Drop prompts longer than this many tokens (counted by the caller's tokenizer, after the
    /// template and few-shot examples): such a prompt is left out of training, not cut (verl's
    /// `max_prompt_length` truncates or errors instead). Default: keep all.
    pub max_prompt_len: Option<usize>,
    /// Countdown generator settings.
    pub countdown: CountdownGenConfig,
    /// Arithmetic generator settings.
    pub arithmetic: ArithmeticGenConfig,
}

impl Default for DataConfig {
    fn default() -> Self {
        DataConfig {
            task: TaskKind::Gsm8k,
            train: None,
            test: None,
            experiences: None,
            prompts_per_step: 32,
            seed: 0,
            question_field: None,
            answer_field: None,
            verifier: None,
            style: PromptStyle::Plain,
            template: None,
            system_prompt: None,
            few_shot: Vec::new(),
            max_prompt_len: None,
            countdown: CountdownGenConfig::default(),
            arithmetic: ArithmeticGenConfig::default(),
        }
    }
}

impl DataConfig {
    /// The verifier to score this task: `data.verifier` if set, else the task's default.
    ///
    /// # Errors
    /// [`crate::DataError::Config`] for a `jsonl` task without `data.verifier`.
    pub fn verifier(&self) -> crate::Result<VerifierConfig> {
        match (&self.verifier, self.task.default_verifier()) {
            (Some(v), _) => Ok(v.clone()),
            (None, Some(v)) => Ok(v),
            (None, None) => Err(crate::DataError::Config(
                "data.task = \"jsonl\" needs data.verifier, e.g. verifier = { kind = \"math\" } or { kind = \"external\", command = [\"./score.py\"] } (or a program environment, env.command, that gives the rewards)".into(),
            )),
        }
    }

    /// Whether this config's completions are scored by an environment alone under `scoring`: a
    /// `jsonl` task without `data.verifier` whose reward a program environment gives (it needs
    /// no verifier then).
    pub fn scored_by_environment(&self, scoring: Scoring) -> bool {
        scoring == Scoring::Environment && self.task == TaskKind::Jsonl && self.verifier.is_none()
    }

    /// Whether the rows of this config may lack the answer field under `scoring`: a `jsonl` task
    /// scored by an environment alone ([`DataConfig::scored_by_environment`]) or by programs
    /// that read the row's columns ([`Scoring::Programs`]), with no `data.answer_field` named (a
    /// row's reference is then its `answer` when it has one, else empty).
    pub fn reference_optional(&self, scoring: Scoring) -> bool {
        let programs = scoring == Scoring::Programs && self.task == TaskKind::Jsonl;
        (self.scored_by_environment(scoring) || programs) && self.answer_field.is_none()
    }

    /// The (question, answer) field names in force.
    pub fn fields(&self) -> (String, String) {
        let (q, a) = self.task.default_fields();
        (
            self.question_field.clone().unwrap_or_else(|| q.to_string()),
            self.answer_field.clone().unwrap_or_else(|| a.to_string()),
        )
    }

    /// The prompt template in force.
    pub fn template(&self) -> &str {
        self.template
            .as_deref()
            .unwrap_or_else(|| self.task.default_template())
    }

    /// Checks values the types cannot: B ≥ 1, generator knobs in range, `jsonl` names a verifier.
    ///
    /// # Errors
    /// [`crate::DataError::Config`] naming the key.
    pub fn validate(&self) -> crate::Result<()> {
        self.validate_for(Scoring::Verifier)
    }

    /// [`DataConfig::validate`] for rows scored by `scoring`: with [`Scoring::Environment`],
    /// [`Scoring::Components`] or [`Scoring::Programs`] a `jsonl` task needs no `data.verifier`.
    ///
    /// # Errors
    /// As [`DataConfig::validate`].
    pub fn validate_for(&self, scoring: Scoring) -> crate::Result<()> {
        if self.prompts_per_step == 0 {
            return Err(crate::DataError::Config(
                "data.prompts_per_step must be at least 1".into(),
            ));
        }
        let scored_elsewhere = self.scored_by_environment(scoring)
            || matches!(scoring, Scoring::Components | Scoring::Programs);
        if self.experiences.is_none() && !scored_elsewhere {
            self.verifier()?;
        }
        if self.max_prompt_len == Some(0) {
            return Err(crate::DataError::Config(
                "data.max_prompt_len must be at least 1 (or unset to keep every prompt)".into(),
            ));
        }
        self.countdown.validate()?;
        self.arithmetic.validate()?;
        crate::placeholders::check_template(self.template())?;
        Ok(())
    }
}

/// The `[data]` keys as rows of a Markdown table (`| `data.KEY` | meaning |`), generated from the
/// `///` comments of [`DataConfig`]'s fields, in field order, each table's keys right after its
/// row: a few-shot example's (`data.few_shot[].question`), the verifier's (every kind's keys,
/// from rlvr-reward's doc comments: [`rlvr_reward::reference::verifier_rows`]) and the
/// generators' (`data.countdown.*`, `data.arithmetic.*`). rlvr-train's README embeds them in its
/// config reference, which a test keeps in sync and which fails on a key without a row.
pub fn reference_rows() -> String {
    use rlvr_reward::reference::{fields, row, verifier_rows};
    let config = [include_str!("config.rs")];
    let generate = [include_str!("generate.rs")];
    let mut out = String::new();
    for f in fields(&config, "pub struct DataConfig {") {
        out.push_str(&row(&format!("data.{}", f.name), "", &f.doc));
        let (src, header, prefix) = match f.name.as_str() {
            "verifier" => {
                out.push_str(&verifier_rows("data.verifier"));
                continue;
            }
            "few_shot" => (&config, "pub struct FewShotExample {", "data.few_shot[]"),
            "countdown" => (
                &generate,
                "pub struct CountdownGenConfig {",
                "data.countdown",
            ),
            "arithmetic" => (
                &generate,
                "pub struct ArithmeticGenConfig {",
                "data.arithmetic",
            ),
            _ => continue,
        };
        for g in fields(src, header) {
            out.push_str(&row(&format!("{prefix}.{}", g.name), "", &g.doc));
        }
    }
    out
}
