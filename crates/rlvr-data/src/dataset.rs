//! Datasets of problems: loaded from files with configurable field names, or generated; turned into
//! prompts with `max_prompt_len` filtering.

use crate::config::PromptStyle;
use crate::config::{DataConfig, Scoring, TaskKind};
use crate::generate::Split;
use crate::read::{for_each_record, FieldReader, QuestionValue};
use crate::template::{ChatMessage, ChatRenderer, PromptBuilder};
use crate::{DataError, Result};
use rlvr_reward::countdown::CountdownProblem;
use std::collections::HashSet;
use std::path::Path;

/// One problem: what the prompt template needs and what the verifier compares against.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Problem {
    /// Where it came from: `FILE:LINE` or `generated:<split>:<index>`.
    pub source: String,
    /// Template variables: always `question`; countdown adds `numbers` and `target`; a `jsonl` task adds
    /// every string or number field of its row, and, when the row has fields that are not
    /// strings, the hidden column `rlvr_reward::TYPED_COLUMNS` (those fields with their JSON
    /// types, for external verifiers).
    pub vars: Vec<(String, String)>,
    /// The reference handed to the verifier (`Sample::reference`): GSM8K's full solution, MATH's
    /// answer, countdown's JSON `{"numbers", "target"}`, arithmetic's exact answer.
    pub reference: String,
    /// The prompt's own chat messages when the row's question field holds a list of them (TRL
    /// GRPOTrainer's conversational `prompt`, verl's `prompt` column): rendered as they are by
    /// the chat template, with no template, system prompt or few-shot examples added; the
    /// `question` variable is then the last (user) message's text. `None` for a question given
    /// as text, which [`PromptBuilder`] turns into messages. (A boxed slice: 16 bytes a problem,
    /// where most rows hold none.)
    pub messages: Option<Box<[ChatMessage]>>,
}

impl Problem {
    /// The `question` variable.
    pub fn question(&self) -> &str {
        self.vars
            .iter()
            .find(|(k, _)| k == "question")
            .map(|(_, v)| v.as_str())
            .unwrap_or("")
    }
}

/// A task's problems for one split.
#[derive(Debug, Clone, PartialEq)]
pub struct Dataset {
    /// The task.
    pub task: TaskKind,
    /// The problems, in file (or generation) order.
    pub problems: Vec<Problem>,
}

fn countdown_problem(source: String, p: CountdownProblem) -> Problem {
    let numbers = p
        .numbers
        .iter()
        .map(i64::to_string)
        .collect::<Vec<_>>()
        .join(", ");
    let target = p.target.to_string();
    Problem {
        source,
        vars: vec![
            ("question".into(), format!("[{numbers}] -> {target}")),
            ("numbers".into(), format!("[{numbers}]")),
            ("target".into(), target),
        ],
        reference: p.to_reference(),
        messages: None,
    }
}

/// A GSM8K reference must end its solution with `#### N`: without `####` the verifier would take
/// the solution's last number as gold, and with nothing after it the gold is empty (every reward 0).
fn check_gsm8k_reference(path: &Path, line: usize, field: &str, reference: &str) -> Result<()> {
    let bad = |reason: String| DataError::BadField {
        file: path.to_path_buf(),
        line,
        field: field.to_string(),
        reason,
    };
    match rlvr_reward::extract::after_hashes(reference) {
        None => Err(bad(
            "has no `#### ANSWER` line: a GSM8K solution ends with `#### N` (for bare answers use \
             data.task = \"jsonl\" with data.verifier = { kind = \"gsm8k\" })"
                .into(),
        )),
        Some(seg) if rlvr_reward::gsm8k::gold_number(reference).is_none() => Err(bad(format!(
            "has no number after its last `####` (found {:?}): the gold answer would be empty",
            seg.trim()
        ))),
        Some(_) => Ok(()),
    }
}

/// A row whose question field holds chat messages is the whole prompt: it needs the chat style
/// (the model's chat template renders the messages) and takes no `data.system_prompt`,
/// `data.few_shot` or `data.template`, which would add to or rewrite messages the row already
/// fixes. `Err` names the config keys at fault, for [`DataError::BadField`]'s reason.
fn check_messages_config(cfg: &DataConfig) -> std::result::Result<(), String> {
    if cfg.style != PromptStyle::Chat {
        return Err(
            "holds chat messages, which need data.style = \"chat\" (the model's chat template \
             renders them); with data.style = \"plain\" give the question as a string"
                .into(),
        );
    }
    let mut keys = Vec::new();
    if cfg.system_prompt.is_some() {
        keys.push("data.system_prompt");
    }
    if !cfg.few_shot.is_empty() {
        keys.push("data.few_shot");
    }
    if cfg.template.is_some() {
        keys.push("data.template");
    }
    if keys.is_empty() {
        return Ok(());
    }
    Err(format!(
        "holds chat messages, which are the whole prompt, and {} would add to or rewrite them: \
         unset {}, or write the system message, the example turns or the instructions into the \
         row's messages",
        keys.join(" and "),
        if keys.len() == 1 { "it" } else { "them" }
    ))
}

/// Reads the problems of a data file for `cfg.task` with `cfg`'s field names.
///
/// A field name with dots reads nested objects when the row has no top-level key of that name
/// (see [`FieldReader`]). For every task but countdown the question field may hold a list of
/// chat messages instead of text ([`QuestionValue::Messages`]): the problem keeps them in
/// [`Problem::messages`], and the row needs `data.style = "chat"` without `data.system_prompt`,
/// `data.few_shot` or `data.template`.
///
/// # Errors
/// [`DataError`] naming the file for an empty one; file, line and field for unreadable files,
/// malformed lines, missing fields (for a dotted path, which part), empty questions, malformed
/// chat messages and messages rows under a config that cannot take them (naming its keys),
/// then (once every line has its fields) a GSM8K answer without a number after `####`.
pub fn load_file(cfg: &DataConfig, path: &Path) -> Result<Vec<Problem>> {
    load_file_for(cfg, path, Scoring::Verifier)
}

/// [`load_file`] for rows scored by `scoring`: when the answer field is optional
/// ([`DataConfig::reference_optional`]) a row without it gets an empty reference.
///
/// # Errors
/// As [`load_file`].
pub fn load_file_for(cfg: &DataConfig, path: &Path, scoring: Scoring) -> Result<Vec<Problem>> {
    let (qf, af) = cfg.fields();
    let optional = cfg.reference_optional(scoring);
    // The reference: the answer field, or (optional and absent) empty.
    let reference = |r: &FieldReader| -> Result<String> {
        match r.text(&af, "answer_field") {
            Err(DataError::MissingField { .. }) if optional => Ok(String::new()),
            other => other,
        }
    };
    // A question that is empty or only whitespace trains the model on the template alone.
    let question = |r: &FieldReader| -> Result<(String, Option<Box<[ChatMessage]>>)> {
        let bad = |reason: String| DataError::BadField {
            file: path.to_path_buf(),
            line: r.record.line,
            field: qf.clone(),
            reason,
        };
        match r.question(&qf, "question_field")? {
            QuestionValue::Text(q) if q.trim().is_empty() => {
                Err(bad("is empty (a prompt needs a question)".into()))
            }
            QuestionValue::Text(q) => Ok((q, None)),
            QuestionValue::Messages(m) => {
                check_messages_config(cfg).map_err(bad)?;
                let last = m.last().expect("question() returns a non-empty list");
                Ok((last.content.clone(), Some(m.into_boxed_slice())))
            }
        }
    };
    // One record at a time: a problem keeps the fields it uses, never the record's JSON tree.
    let mut out = Vec::new();
    // The line of each problem, for the GSM8K answers checked once every record has its fields.
    let mut lines = Vec::new();
    let shown = path.display().to_string();
    for_each_record(path, |record| {
        let record = &record;
        let r = FieldReader { file: path, record };
        let source = format!("{shown}:{}", record.line);
        let problem = match cfg.task {
            TaskKind::Countdown => countdown_problem(
                source,
                CountdownProblem {
                    numbers: r.ints(&qf, "question_field")?,
                    target: r.int(&af, "answer_field")?,
                },
            ),
            TaskKind::Jsonl => {
                let (q, messages) = question(&r)?;
                let mut vars = vec![("question".to_string(), q)];
                // Fields that are not strings keep their JSON types for external verifiers.
                let mut typed = serde_json::Map::new();
                for (k, v) in &record.fields {
                    if !matches!(v, serde_json::Value::String(_)) {
                        typed.insert(k.clone(), v.clone());
                    }
                    let s = match v {
                        serde_json::Value::String(s) => s.clone(),
                        serde_json::Value::Number(n) => n.to_string(),
                        _ => continue,
                    };
                    if k != "question" {
                        vars.push((k.clone(), s));
                    }
                }
                if !typed.is_empty() {
                    let text = serde_json::Value::Object(typed).to_string();
                    vars.push((rlvr_reward::TYPED_COLUMNS.to_string(), text));
                }
                Problem {
                    source,
                    vars,
                    reference: reference(&r)?,
                    messages,
                }
            }
            _ => {
                let (q, messages) = question(&r)?;
                Problem {
                    source,
                    vars: vec![("question".into(), q)],
                    reference: r.text(&af, "answer_field")?,
                    messages,
                }
            }
        };
        let mut problem = problem;
        problem.vars.shrink_to_fit();
        out.push(problem);
        if cfg.task == TaskKind::Gsm8k {
            lines.push(record.line);
        }
        Ok(())
    })?;
    if out.is_empty() {
        return Err(DataError::Config(format!(
            "{}: the file has no records (it is empty or holds only blank lines)",
            path.display()
        )));
    }
    out.shrink_to_fit();
    // The gold answers once every record has its fields: a file's structural errors (malformed
    // lines, missing fields) are reported first, whichever line comes first.
    if cfg.task == TaskKind::Gsm8k {
        for (line, p) in lines.iter().zip(&out) {
            check_gsm8k_reference(path, *line, &af, &p.reference)?;
        }
    }
    Ok(out)
}

/// Draws `size` generated problems of `split`; a test split skips every problem whose key (as
/// `generate` returns it) is among the `train_size` train problems, so held-out never overlaps train.
/// Gives up after `100·size + 1000` draws.
fn draw_split<K: std::hash::Hash + Eq>(
    split: Split,
    train_size: usize,
    size: usize,
    generate: impl Fn(Split, u64) -> Result<(K, Problem)>,
) -> Result<Vec<Problem>> {
    let train_keys: HashSet<K> = if split == Split::Test {
        (0..train_size as u64)
            .map(|i| generate(Split::Train, i).map(|p| p.0))
            .collect::<Result<_>>()?
    } else {
        HashSet::new()
    };
    let mut out = Vec::with_capacity(size);
    let mut i = 0u64;
    while out.len() < size && i < 100 * size as u64 + 1000 {
        let (key, problem) = generate(split, i)?;
        if !train_keys.contains(&key) {
            out.push(problem);
        }
        i += 1;
    }
    Ok(out)
}

fn generate(cfg: &DataConfig, split: Split) -> Result<Vec<Problem>> {
    let name = match split {
        Split::Train => "train",
        Split::Test => "test",
    };
    let source = |s: Split, i: u64| {
        let n = if s == Split::Train { "train" } else { "test" };
        format!("generated:{n}:{i}")
    };
    // The split's size knob: `train_size` or `test_size`.
    let pick = |train: usize, test: usize| if split == Split::Train { train } else { test };
    match cfg.task {
        TaskKind::Countdown => {
            let g = &cfg.countdown;
            g.validate()?;
            let size = pick(g.train_size, g.test_size);
            draw_split(split, g.train_size, size, |s, i| {
                let (p, _) = g.generate(cfg.seed, s, i)?;
                Ok((p.clone(), countdown_problem(source(s, i), p)))
            })
        }
        TaskKind::Arithmetic => {
            let g = &cfg.arithmetic;
            g.validate()?;
            let size = pick(g.train_size, g.test_size);
            draw_split(split, g.train_size, size, |s, i| {
                let (q, a) = g.generate(cfg.seed, s, i)?;
                let problem = Problem {
                    source: source(s, i),
                    vars: vec![("question".into(), q.clone())],
                    reference: a,
                    messages: None,
                };
                Ok((q, problem))
            })
        }
        _ => Err(DataError::Config(format!(
            "data.{name} is required for task {}",
            cfg.task.name()
        ))),
    }
}

/// Loads the train or test split that `cfg` describes: the file `data.train` / `data.test`, or for
/// countdown and arithmetic without a file, the seeded generator (a test split disjoint from train).
///
/// # Errors
/// [`DataError`] for a missing path (file-only tasks), unreadable files, malformed lines, missing
/// fields, bad generator knobs.
pub fn load_split(cfg: &DataConfig, split: Split) -> Result<Dataset> {
    load_split_for(cfg, split, Scoring::Verifier)
}

/// [`load_split`] for rows scored by `scoring` ([`load_file_for`]).
///
/// # Errors
/// As [`load_split`].
pub fn load_split_for(cfg: &DataConfig, split: Split, scoring: Scoring) -> Result<Dataset> {
    let path = match split {
        Split::Train => cfg.train.as_deref(),
        Split::Test => cfg.test.as_deref(),
    };
    let problems = match path {
        Some(p) => load_file_for(cfg, p, scoring)?,
        None => generate(cfg, split)?,
    };
    Ok(Dataset {
        task: cfg.task,
        problems,
    })
}

/// A problem's rendered prompt.
#[derive(Debug, Clone, PartialEq)]
pub struct Prompt {
    /// Index of the problem in [`Dataset::problems`].
    pub problem: usize,
    /// The prompt text (what the sampler encodes).
    pub text: String,
}

/// The prompts of a dataset after `max_prompt_len` filtering.
#[derive(Debug, Clone, PartialEq)]
pub struct PromptSet {
    /// Kept prompts, in dataset order.
    pub prompts: Vec<Prompt>,
    /// How many prompts were longer than `max_prompt_len` tokens and dropped.
    pub dropped: usize,
    /// The longest kept prompt, in tokens (0 when no counter ran).
    pub max_len: usize,
}

/// A token counter (usually the policy tokenizer): text → number of tokens.
pub type TokenCounter<'a> = &'a dyn Fn(&str) -> anyhow::Result<usize>;

/// Renders every problem of `dataset` and drops those longer than `max_prompt_len` tokens.
///
/// The counter is only called when `max_prompt_len` is set. Returns the kept prompts and how many
/// were dropped (log it; DESIGN.md asks that filtering be reported, never silent).
///
/// # Errors
/// Template errors, a failing counter or renderer (naming the problem's source), or
/// [`DataError::Config`] when every prompt was dropped.
pub fn build_prompts(
    dataset: &Dataset,
    builder: &PromptBuilder,
    renderer: Option<ChatRenderer<'_>>,
    max_prompt_len: Option<usize>,
    counter: Option<TokenCounter<'_>>,
) -> Result<PromptSet> {
    let mut prompts = Vec::with_capacity(dataset.problems.len());
    let (mut dropped, mut max_len) = (0, 0);
    for (k, p) in dataset.problems.iter().enumerate() {
        let rendered = match &p.messages {
            Some(m) => builder.render_messages(m, renderer),
            None => builder.render(&p.vars, renderer),
        };
        let text = rendered.map_err(|e| match e {
            DataError::Template(m) => DataError::Template(format!("{}: {m}", p.source)),
            other => other,
        })?;
        if let Some(limit) = max_prompt_len {
            let count = counter.ok_or_else(|| {
                DataError::Config(
                    "data.max_prompt_len is set but no token counter was given".into(),
                )
            })?;
            let n = count(&text).map_err(|e| {
                DataError::Template(format!(
                    "{}: counting prompt tokens failed: {e:#}",
                    p.source
                ))
            })?;
            if n > limit {
                dropped += 1;
                continue;
            }
            max_len = max_len.max(n);
        }
        prompts.push(Prompt { problem: k, text });
    }
    if prompts.is_empty() && !dataset.problems.is_empty() {
        return Err(DataError::Config(format!(
            "{} longer than data.max_prompt_len = {}; raise it",
            match dataset.problems.len() {
                1 => "the only prompt is".to_string(),
                n => format!("all {n} prompts are"),
            },
            max_prompt_len.unwrap_or(0)
        )));
    }
    Ok(PromptSet {
        prompts,
        dropped,
        max_len,
    })
}

/// Bytes per token beyond which a prompt is refused without tokenizing it (real tokenizers average
/// 3 to 5 bytes a token on text; none packs 64).
pub const BYTES_PER_POSITION: usize = 64;

/// Refuses every kept prompt of `split` longer than `max_tokens` tokens (a model's
/// `max_position_embeddings`): it could be neither sampled nor trained on, and its attention would
/// allocate memory quadratic in its length. Only prompts whose byte length could exceed the limit
/// are counted (no tokenizer makes more than one token per byte, plus a few special tokens), so the
/// check costs nothing for ordinary data; a prompt of more than 64 bytes per position is refused
/// without tokenizing it (tokenizing megabytes allocates far more than the text itself).
///
/// # Errors
/// [`DataError::PromptTooLong`] naming the first such problem's `FILE:LINE`, its tokens and the
/// limit; a failing counter, naming the problem.
pub fn check_prompt_lengths(
    split: &PreparedSplit,
    max_tokens: usize,
    counter: TokenCounter<'_>,
) -> Result<()> {
    for p in &split.prompts.prompts {
        if p.text.len() + 16 <= max_tokens {
            continue;
        }
        let source = &split.dataset.problems[p.problem].source;
        let too_long = |size: String| DataError::PromptTooLong {
            source_: source.clone(),
            size,
            limit: max_tokens,
            suggest: (max_tokens / 2).max(1),
        };
        if p.text.len() > BYTES_PER_POSITION * max_tokens {
            return Err(too_long(format!(
                "{} bytes (over {BYTES_PER_POSITION} a position)",
                p.text.len()
            )));
        }
        let n = counter(&p.text).map_err(|e| {
            DataError::Template(format!("{source}: counting prompt tokens failed: {e:#}"))
        })?;
        if n > max_tokens {
            return Err(too_long(format!("{n} tokens")));
        }
    }
    Ok(())
}

/// A split ready for training or evaluation: its problems and their filtered prompts.
#[derive(Debug, Clone, PartialEq)]
pub struct PreparedSplit {
    /// The problems (references for the verifier).
    pub dataset: Dataset,
    /// The rendered prompts that passed `max_prompt_len` (indices into `dataset.problems`).
    pub prompts: PromptSet,
}

/// Loads a split and renders its prompts as `cfg` says: [`load_split`], then [`build_prompts`] with
/// [`PromptBuilder::from_config`] and `cfg.max_prompt_len`.
///
/// `renderer` is needed for `data.style = "chat"`, `counter` when `data.max_prompt_len` is set.
///
/// # Errors
/// As [`DataConfig::validate`], [`load_split`] and [`build_prompts`].
pub fn prepare_split(
    cfg: &DataConfig,
    split: Split,
    renderer: Option<ChatRenderer<'_>>,
    counter: Option<TokenCounter<'_>>,
) -> Result<PreparedSplit> {
    prepare_split_for(cfg, split, renderer, counter, Scoring::Verifier)
}

/// [`prepare_split`] for rows scored by `scoring` ([`DataConfig::validate_for`],
/// [`load_split_for`]).
///
/// # Errors
/// As [`prepare_split`].
pub fn prepare_split_for(
    cfg: &DataConfig,
    split: Split,
    renderer: Option<ChatRenderer<'_>>,
    counter: Option<TokenCounter<'_>>,
    scoring: Scoring,
) -> Result<PreparedSplit> {
    cfg.validate_for(scoring)?;
    let dataset = load_split_for(cfg, split, scoring)?;
    let prompts = build_prompts(
        &dataset,
        &PromptBuilder::from_config(cfg),
        renderer,
        cfg.max_prompt_len,
        counter,
    )?;
    Ok(PreparedSplit { dataset, prompts })
}
