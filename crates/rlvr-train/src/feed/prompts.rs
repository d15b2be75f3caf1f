//! The prompts of a run: a `[data]` split loaded and rendered with the policy's tokenizer (its
//! chat template, its token counter for `data.max_prompt_len`), every prompt within the model's
//! positions.
//!
//! A prompt longer than the model's `max_position_embeddings` is refused at load time, naming its
//! file and line, before anything allocates memory quadratic in its length (the sampler's
//! attention bias is L² floats: a 5 MB prompt line would ask for terabytes).

use anyhow::Context;
use rlvr_data::dataset::{check_prompt_lengths, prepare_split, PreparedSplit, TokenCounter};
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
}

/// Loads and renders a split of `[data]` with the policy tokenizer (chat template, token counter).
///
/// # Errors
/// Data errors (files, templates, all prompts filtered).
pub fn prepare_prompts(
    cfg: &rlvr_data::config::DataConfig,
    split: Split,
    tok: &TokenizerBundle,
) -> anyhow::Result<PreparedPrompts> {
    let render = |msgs: &[ChatMessage], gen: bool| -> anyhow::Result<String> {
        let m: Vec<Message> = msgs
            .iter()
            .map(|m| Message::new(&m.role, &m.content))
            .collect();
        Ok(tok.apply_chat_template(&m, gen)?)
    };
    let count = |t: &str| -> anyhow::Result<usize> { Ok(tok.encode(t, true)?.len()) };
    let prep = prepare_split(cfg, split, Some(&render), Some(&count))
        .map_err(|e| anyhow::anyhow!("[data] {split:?} split: {e}"))?;
    // No prompt longer than the model's positions: refused here, naming its file and line.
    check_prompts(&prep, tok, &count)
        .map_err(|e| anyhow::anyhow!("[data] {split:?} split: {e:#}"))?;
    if prep.prompts.dropped > 0 {
        crate::log::say(&format!(
            "note: {} {split:?} prompts longer than data.max_prompt_len were dropped",
            prep.prompts.dropped
        ));
    }
    let problems = &prep.dataset.problems;
    Ok(PreparedPrompts {
        rows: prep.prompts.prompts.iter().map(|p| p.problem).collect(),
        columns: prep
            .prompts
            .prompts
            .iter()
            .map(|p| problems[p.problem].vars.clone())
            .collect(),
        references: prep
            .prompts
            .prompts
            .iter()
            .map(|p| prep.dataset.problems[p.problem].reference.clone())
            .collect(),
        texts: prep.prompts.prompts.into_iter().map(|p| p.text).collect(),
    })
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
    let Some(config) = tok
        .path
        .parent()
        .map(|d| d.join("config.json"))
        .filter(|p| p.is_file())
    else {
        return Ok(());
    };
    let mc =
        ModelConfig::from_file(&config).with_context(|| format!("reading {}", config.display()))?;
    check_prompt_lengths(prep, mc.max_position_embeddings, count)?;
    Ok(())
}
