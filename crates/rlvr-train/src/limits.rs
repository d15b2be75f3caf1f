//! Input-size bounds that depend on the model (issue 13): a prompt longer than the model's
//! `max_position_embeddings` is refused at load time, naming its file and line, before anything
//! allocates memory quadratic in its length (the sampler's attention bias is L² floats: a 5 MB prompt
//! line asked for 6 TB).

use anyhow::Context;
use rlvr_data::dataset::{check_prompt_lengths, PreparedSplit, TokenCounter};
use rlvr_model::{ModelConfig, TokenizerBundle};

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
