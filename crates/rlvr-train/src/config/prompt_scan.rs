//! The prompt length `rlvr plan` plans for when `data.max_prompt_len` is unset: the longest
//! prompt of the train split, rendered and tokenized as the run does (the model's tokenizer and
//! chat template, the data's template, system prompt and few-shot examples), without loading any
//! weights.
//!
//! Bounded for big datasets: the split is loaded and rendered as the run loads it (the run holds
//! the same texts), but only the longest prompts by bytes are tokenized, longest first, and the
//! scan stops as soon as no shorter one can have more tokens: a tokenizer makes at most one token
//! per byte plus a few special tokens ([`rlvr_data::dataset::check_prompt_lengths`] uses the same
//! bound), so a prompt of `n` bytes has at most `n + 16` tokens. When [`MAX_TOKENIZED`] prompts or
//! [`MAX_TOKENIZED_BYTES`] bytes were tokenized before that bound settled it, the result is the
//! longest of those tokenized (the longest by bytes), marked as sampled.

use rlvr_data::generate::Split;
use serde::Serialize;

use super::settings;
use super::RawConfig;

/// The most prompts tokenized when looking for the longest one.
pub const MAX_TOKENIZED: usize = 16384;
/// The most prompt bytes tokenized when looking for the longest one (32 MiB).
pub const MAX_TOKENIZED_BYTES: usize = 32 << 20;
/// Tokens a prompt may have beyond its byte length (the special tokens a tokenizer adds).
pub const SPECIAL_TOKENS_SLACK: usize = 16;

/// The longest prompt of a split, in tokens, and how it was found.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct LongestPrompt {
    /// Its tokens, as the run encodes it.
    pub tokens: u64,
    /// Where its problem comes from (`FILE:LINE`, or `generated:<split>:<index>`).
    pub source: String,
    /// The split's prompts.
    pub prompts: u64,
    /// How many of them were tokenized (the longest by bytes).
    pub tokenized: u64,
    /// Whether no prompt of the split can have more tokens (the byte bound settled it); false
    /// when the scan stopped at [`MAX_TOKENIZED`] or [`MAX_TOKENIZED_BYTES`].
    pub exact: bool,
}

/// The longest train prompt of `raw`'s data in tokens, as the run renders and encodes it
/// ([`crate::feed::prompts::prepare_prompts`], then `TokenizerBundle::encode` with the special
/// tokens of plain prompts): the tokenizer and chat template of `model.path`, no weights.
///
/// # Errors
/// Why the prompts cannot be read: an offline run (`data.experiences`), no tokenizer in
/// `model.path`, a data error (missing file, bad row, template), a tokenizer error.
pub fn longest_train_prompt(raw: &RawConfig) -> anyhow::Result<LongestPrompt> {
    if let Some(p) = &raw.data.experiences {
        anyhow::bail!(
            "the run trains on data.experiences ({}), whose rows carry their own prompts",
            p.display()
        );
    }
    let tok = settings::load_tokenizer(&raw.model.path)?;
    let prompts = crate::feed::prompts::prepare_prompts(
        &raw.data,
        Split::Train,
        &tok,
        settings::scoring(raw),
    )?;
    let add_special = settings::add_special_tokens(&raw.data);
    let count = |text: &str| -> anyhow::Result<usize> { Ok(tok.encode(text, add_special)?.len()) };
    longest_of(&prompts.texts, &prompts.sources, &count)
}

/// The longest of `texts` in tokens by `count`, tokenizing the longest by bytes first and
/// stopping when no remaining text can be longer (module docs). `sources[i]` names `texts[i]`.
///
/// # Errors
/// No text; a failing counter, naming the text's source.
pub fn longest_of(
    texts: &[String],
    sources: &[String],
    count: &dyn Fn(&str) -> anyhow::Result<usize>,
) -> anyhow::Result<LongestPrompt> {
    anyhow::ensure!(!texts.is_empty(), "the train split has no prompt");
    let mut order: Vec<usize> = (0..texts.len()).collect();
    // Longest in bytes first; ties in file order.
    order.sort_by_key(|&i| (std::cmp::Reverse(texts[i].len()), i));
    let (mut best, mut best_at, mut tokenized, mut bytes) = (0usize, order[0], 0usize, 0usize);
    let mut exact = true;
    for &i in &order {
        let text = &texts[i];
        if text.len() + SPECIAL_TOKENS_SLACK <= best {
            break;
        }
        if tokenized == MAX_TOKENIZED || (tokenized > 0 && bytes + text.len() > MAX_TOKENIZED_BYTES)
        {
            exact = false;
            break;
        }
        let n = count(text).map_err(|e| {
            let source = sources.get(i).map_or("?", String::as_str);
            anyhow::anyhow!("{source}: counting prompt tokens failed: {e:#}")
        })?;
        tokenized += 1;
        bytes += text.len();
        if n > best {
            (best, best_at) = (n, i);
        }
    }
    Ok(LongestPrompt {
        tokens: best as u64,
        source: sources.get(best_at).cloned().unwrap_or_default(),
        prompts: texts.len() as u64,
        tokenized: tokenized as u64,
        exact,
    })
}
