//! The prompts of a run: a `[data]` split loaded and rendered with the policy's tokenizer (its
//! chat template, its token counter for `data.max_prompt_len`), every prompt within the model's
//! positions.
//!
//! A prompt longer than the model's `max_position_embeddings` is refused at load time, naming its
//! file and line, before anything allocates memory quadratic in its length (the sampler's
//! attention bias is L² floats: a 5 MB prompt line would ask for terabytes).

use anyhow::Context;
use rlvr_data::dataset::{check_prompt_lengths, prepare_split_for, PreparedSplit, TokenCounter};
use rlvr_data::generate::Split;
use rlvr_data::ChatMessage;
use rlvr_model::{Message, ModelConfig, TokenizerBundle};

/// A train or test split as prompt texts and verifier references, with the dataset row each
/// prompt comes from.
pub struct PreparedPrompts {
    /// Rendered prompt texts.
    pub texts: Vec<String>,
    /// Reference of each prompt.
    pub references: Vec<String>,
    /// The index of each prompt's row in its split (0-based, file order, before length filtering).
    pub rows: Vec<usize>,
    /// Each prompt's row columns (`question`, and every string or number field of a `jsonl` row)
    /// for the verifier ([`rlvr_reward::Sample::columns`]).
    pub columns: Vec<Vec<(String, String)>>,
    /// Where each prompt's problem comes from (`FILE:LINE`, or `generated:<split>:<index>`), for
    /// error messages.
    pub sources: Vec<String>,
}

/// Loads and renders a split of `[data]` with the policy tokenizer (chat template, token counter),
/// its rows scored by `scoring` (a program environment's `jsonl` rows need no verifier and may
/// lack the answer field: [`rlvr_data::config::DataConfig::reference_optional`]).
///
/// # Errors
/// Data errors (files, templates, all prompts filtered).
pub fn prepare_prompts(
    cfg: &rlvr_data::config::DataConfig,
    split: Split,
    tok: &TokenizerBundle,
    scoring: rlvr_data::config::Scoring,
) -> anyhow::Result<PreparedPrompts> {
    let render = |msgs: &[ChatMessage], gen: bool| -> anyhow::Result<String> {
        let m: Vec<Message> = msgs
            .iter()
            .map(|m| Message::new(&m.role, &m.content))
            .collect();
        Ok(tok.apply_chat_template(&m, gen)?)
    };
    let count = |t: &str| -> anyhow::Result<usize> { Ok(tok.encode(t, true)?.len()) };
    let prep = prepare_split_for(cfg, split, Some(&render), Some(&count), scoring)
        .map_err(|e| anyhow::anyhow!("[data] {split:?} split: {e}"))?;
    // No prompt longer than the model's positions: refused here, naming its file and line.
    check_prompts(&prep, tok, &count)
        .map_err(|e| anyhow::anyhow!("[data] {split:?} split: {e:#}"))?;
    if prep.prompts.dropped > 0 {
        crate::log::say(&format!(
            "note: {} longer than data.max_prompt_len dropped",
            crate::log::counted(prep.prompts.dropped as u64, &format!("{split:?} prompt"))
        ));
    }
    // Each kept prompt's problem is moved out (one prompt per problem), never copied: a large
    // dataset is held once.
    let mut problems = prep.dataset.problems;
    let n = prep.prompts.prompts.len();
    let mut out = PreparedPrompts {
        sources: Vec::with_capacity(n),
        rows: Vec::with_capacity(n),
        columns: Vec::with_capacity(n),
        references: Vec::with_capacity(n),
        texts: Vec::with_capacity(n),
    };
    for p in prep.prompts.prompts {
        let problem = std::mem::take(&mut problems[p.problem]);
        out.sources.push(problem.source);
        out.rows.push(p.problem);
        out.columns.push(problem.vars);
        out.references.push(problem.reference);
        out.texts.push(p.text);
    }
    Ok(out)
}

impl PreparedPrompts {
    /// The token ids of every prompt text, encoded with the tokenizer's added special tokens when
    /// `add_special_tokens` (plain prompts; chat prompts are rendered by the template and encoded
    /// without them).
    ///
    /// # Errors
    /// Tokenizer errors.
    pub fn encode(
        &self,
        tok: &TokenizerBundle,
        add_special_tokens: bool,
    ) -> anyhow::Result<Vec<Vec<u32>>> {
        self.texts
            .iter()
            .map(|t| tok.encode(t, add_special_tokens))
            .collect::<Result<Vec<_>, _>>()
            .context("encoding prompts")
    }

    /// Keeps the first `n` prompts (`eval.limit`).
    pub fn truncate(&mut self, n: usize) {
        self.texts.truncate(n);
        self.references.truncate(n);
        self.rows.truncate(n);
        self.columns.truncate(n);
        self.sources.truncate(n);
    }

    /// Refuses, at start-up, a prompt with no room to generate: its tokens (`ids`, one list per
    /// prompt, as [`PreparedPrompts::encode`] returns them) plus `max_new_tokens` above the
    /// model's `max_positions`, which would otherwise fail at the first step that samples it.
    /// `key` names the setting `max_new_tokens` comes from (`rollout.max_new_tokens`,
    /// `eval.max_new_tokens`).
    ///
    /// # Errors
    /// The first such prompt, naming its source (`FILE:LINE`), its tokens, `key` and its value,
    /// `max_position_embeddings` and the largest `key` that fits.
    pub fn check_room(
        &self,
        ids: &[Vec<u32>],
        max_positions: usize,
        max_new_tokens: usize,
        key: &str,
    ) -> anyhow::Result<()> {
        let Some((i, longest)) = ids
            .iter()
            .enumerate()
            .map(|(i, p)| (i, p.len()))
            .max_by_key(|&(i, n)| (n, std::cmp::Reverse(i)))
        else {
            return Ok(());
        };
        if longest.saturating_add(max_new_tokens) <= max_positions {
            return Ok(());
        }
        let source = self.sources.get(i).map_or("?", String::as_str);
        let fits = max_positions.saturating_sub(longest);
        anyhow::bail!(
            "{source}: the prompt has {longest} tokens, and {longest} + {key} = {max_new_tokens} \
             is more than the model's max_position_embeddings = {max_positions}: its completion \
             would run past the model's positions; set {key} to at most {fits}, or drop long \
             prompts with data.max_prompt_len"
        )
    }
}

/// The model's positions (`max_position_embeddings` of the config.json beside `tok`'s file), or
/// `None` when there is no config.json there (a bare tokenizer).
///
/// # Errors
/// An unreadable or invalid config.json, naming it.
pub fn model_positions(tok: &TokenizerBundle) -> anyhow::Result<Option<usize>> {
    let Some(config) = tok
        .path
        .parent()
        .map(|d| d.join("config.json"))
        .filter(|p| p.is_file())
    else {
        return Ok(None);
    };
    let mc =
        ModelConfig::from_file(&config).with_context(|| format!("reading {}", config.display()))?;
    Ok(Some(mc.max_position_embeddings))
}

/// Checks every prompt of `prep` against the positions of the model whose directory `tok` was
/// loaded from (its config.json; no check when there is none, e.g. a bare tokenizer).
///
/// # Errors
/// A prompt with more tokens than `max_position_embeddings` (naming `FILE:LINE`, its tokens, the
/// limit and `data.max_prompt_len`); an unreadable config.json.
pub(crate) fn check_prompts(
    prep: &PreparedSplit,
    tok: &TokenizerBundle,
    count: TokenCounter<'_>,
) -> anyhow::Result<()> {
    let Some(positions) = model_positions(tok)? else {
        return Ok(());
    };
    check_prompt_lengths(prep, positions, count)?;
    Ok(())
}
