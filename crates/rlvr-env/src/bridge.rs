//! Bridges: the tokens between two assistant turns, and the episode row they make
//! (docs/DESIGN.md section 14, "Tokens, masks, log-probs").
//!
//! An assistant turn enters the row as the sampler's ids, its stop id (the end-of-turn token)
//! included; it is never decoded and re-encoded. What follows it until the next assistant turn
//! is the bridge: what the chat template writes after an assistant turn's end-of-turn token for
//! the environment's messages (the rest of the turn's separator such as Qwen's `\n` after
//! `<|im_end|>`, each message's role header and content, consecutive tool messages grouped as
//! the template groups them, and the next generation prompt). [`bridge`] renders those messages
//! in a fixed synthetic context, `[user Q, assistant A] + messages` with the generation prompt,
//! and cuts the rendering right after A's end-of-turn token; the part before the cut is the
//! context's rendering and the part after it is the bridge. Reading the context's rendering off
//! the whole rendering (rather than rendering the context alone) is this crate's addition to §14:
//! templates that render an assistant turn differently once messages follow it (Qwen3 drops a
//! `<think>` block from turns before the last user message) still give one well-defined bridge,
//! and the sampled turn, which already holds what the model wrote, is never re-rendered.
//!
//! Checks, each refusing the template with the reason:
//! 1. A's text appears in the rendering, followed by the end-of-turn string with nothing between
//!    (else the sampled turn, which ends at its stop id, would miss template text);
//! 2. the end-of-turn string is one token, and it is the last token of the context's encoding;
//! 3. the context's tokens are a prefix of the whole rendering's tokens (so the bridge's ids are
//!    exactly the whole rendering's ids after the context: no token straddles the cut);
//! 4. the bridge is the same for two different assistant texts (it depends on the environment's
//!    messages only).

use crate::json::Json;
use crate::protocol::Message;
use crate::template::ChatTemplate;
use crate::EnvError;

/// A tokenizer's encoding without added special tokens (BOS): text → ids, or why not.
pub type Encode<'a> = &'a dyn Fn(&str) -> Result<Vec<u32>, String>;

/// The synthetic user message of the bridge context.
const CONTEXT_USER: &str = "rlvr bridge context question";
/// The two synthetic assistant turns (check 4 compares their bridges).
const CONTEXT_ASSISTANT: [&str; 2] = ["rlvr bridge context answer one", "rlvr other answer 2"];

/// One bridge: its text and its ids.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Bridge {
    /// What the template writes after the end-of-turn token.
    pub text: String,
    /// Its tokens, as the whole rendering's tokenization has them.
    pub ids: Vec<u32>,
}

fn first_difference(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

fn one_bridge(
    template: &ChatTemplate,
    end_of_turn: &str,
    eot_id: u32,
    messages: &[Message],
    tools: Option<&[Json]>,
    assistant: &str,
    encode: Encode<'_>,
) -> Result<Bridge, EnvError> {
    let mut all = vec![
        Message::new("user", CONTEXT_USER),
        Message::new("assistant", assistant),
    ];
    all.extend_from_slice(messages);
    let full = template.render(&all, tools, true)?;
    let at = full.find(assistant).ok_or_else(|| {
        EnvError::Template(format!(
            "the rendering of an assistant turn {assistant:?} does not contain its text, so the \
             turn's end cannot be found"
        ))
    })? + assistant.len();
    let after = &full[at..];
    let k = after.find(end_of_turn).ok_or_else(|| {
        EnvError::Template(format!(
            "no end-of-turn {end_of_turn:?} after an assistant turn's text in the template's \
             rendering (is the end-of-turn token right for this template?)"
        ))
    })?;
    if k > 0 {
        return Err(EnvError::Template(format!(
            "the template writes {:?} between an assistant turn's text and its end-of-turn \
             {end_of_turn:?}; a sampled turn ends at its stop id, so that text would be missing \
             from the row",
            &after[..k]
        )));
    }
    let cut = at + end_of_turn.len();
    let (context, text) = full.split_at(cut);
    let ids_full = encode(&full).map_err(EnvError::Template)?;
    let ids_context = encode(context).map_err(EnvError::Template)?;
    if ids_context.last() != Some(&eot_id) {
        return Err(EnvError::Template(format!(
            "the context's tokens do not end with the end-of-turn id {eot_id} of \
             {end_of_turn:?} (last: {:?})",
            ids_context.last()
        )));
    }
    if !ids_full.starts_with(&ids_context) {
        let i = first_difference(&ids_full, &ids_context);
        return Err(EnvError::Template(format!(
            "the bridge does not extend the context as a token prefix: the tokens of the \
             rendering up to the end-of-turn are not a prefix of the whole rendering's (first \
             difference at token {i}: {:?} in the whole, {:?} in the context), so a token \
             straddles the end of the assistant turn",
            ids_full.get(i),
            ids_context.get(i)
        )));
    }
    Ok(Bridge {
        text: text.to_string(),
        ids: ids_full[ids_context.len()..].to_vec(),
    })
}

/// The bridge after an assistant turn for the environment's `messages` (see the module docs):
/// `end_of_turn` is the template's end-of-turn token as text (`<|im_end|>`, `<|eot_id|>`), the
/// stop id that ended the turn; `tools` the episode's tool schemas; `encode` the tokenizer
/// without added special tokens.
///
/// # Errors
/// [`EnvError::Template`] when the template fails to render or any check of the module docs
/// fails, naming why.
pub fn bridge(
    template: &ChatTemplate,
    end_of_turn: &str,
    messages: &[Message],
    tools: Option<&[Json]>,
    encode: Encode<'_>,
) -> Result<Bridge, EnvError> {
    let eot = encode(end_of_turn).map_err(EnvError::Template)?;
    let [eot_id] = eot[..] else {
        return Err(EnvError::Template(format!(
            "the end-of-turn {end_of_turn:?} encodes as {} tokens {eot:?}, not one (is it a \
             special token of this tokenizer?)",
            eot.len()
        )));
    };
    let [a, b] = CONTEXT_ASSISTANT
        .map(|a| one_bridge(template, end_of_turn, eot_id, messages, tools, a, encode));
    let (a, b) = (a?, b?);
    if a != b {
        return Err(EnvError::Template(format!(
            "the bridge depends on the assistant turn's text ({:?} after one turn, {:?} after \
             another), so it cannot be computed once for every episode",
            a.text, b.text
        )));
    }
    Ok(a)
}

/// One episode's completion: `a_1 b_1 a_2 … a_T` with its loss mask and behaviour log-probs.
#[derive(Debug, Clone, PartialEq)]
pub struct EpisodeTokens {
    /// Every assistant turn's sampled ids and the bridges between them; never ends in a bridge.
    pub completion_ids: Vec<u32>,
    /// 1 on sampled ids, 0 on bridge ids.
    pub completion_mask: Vec<u8>,
    /// The sampler's log-probs on sampled ids; 0.0 (a placeholder nothing reads) on bridges.
    pub behaviour_logprobs: Vec<f32>,
}

/// Joins `turns` (each the sampler's ids and log-probs, equal lengths) with `bridges` (one
/// fewer than turns) into the episode's completion.
///
/// # Errors
/// [`EnvError::Config`] when there is no turn, the bridge count is not one fewer than the turn
/// count, or a turn's ids and log-probs differ in length (naming the turn and both lengths).
pub fn assemble(
    turns: &[(Vec<u32>, Vec<f32>)],
    bridges: &[Vec<u32>],
) -> Result<EpisodeTokens, EnvError> {
    if turns.is_empty() || bridges.len() + 1 != turns.len() {
        return Err(EnvError::Config(format!(
            "an episode of {} turns needs {} bridges, got {}",
            turns.len(),
            turns.len().saturating_sub(1),
            bridges.len()
        )));
    }
    let mut out = EpisodeTokens {
        completion_ids: Vec::new(),
        completion_mask: Vec::new(),
        behaviour_logprobs: Vec::new(),
    };
    for (t, (ids, lps)) in turns.iter().enumerate() {
        if ids.len() != lps.len() {
            return Err(EnvError::Config(format!(
                "turn {} has {} ids but {} log-probs",
                t + 1,
                ids.len(),
                lps.len()
            )));
        }
        if t > 0 {
            let b = &bridges[t - 1];
            out.completion_ids.extend_from_slice(b);
            out.completion_mask.extend(std::iter::repeat_n(0, b.len()));
            out.behaviour_logprobs
                .extend(std::iter::repeat_n(0.0, b.len()));
        }
        out.completion_ids.extend_from_slice(ids);
        out.completion_mask
            .extend(std::iter::repeat_n(1, ids.len()));
        out.behaviour_logprobs.extend_from_slice(lps);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn assemble_masks_bridges_and_keeps_sampled_values() {
        let turns = vec![
            (vec![5, 6, 9], vec![-0.5, -1.0, -0.25]),
            (vec![7, 9], vec![-2.0, -0.1]),
        ];
        let e = assemble(&turns, &[vec![1, 2]]).unwrap();
        assert_eq!(e.completion_ids, [5, 6, 9, 1, 2, 7, 9]);
        assert_eq!(e.completion_mask, [1, 1, 1, 0, 0, 1, 1]);
        assert_eq!(
            e.behaviour_logprobs,
            [-0.5, -1.0, -0.25, 0.0, 0.0, -2.0, -0.1]
        );
        assert!(assemble(&turns, &[]).is_err());
        let e = assemble(&[(vec![1], vec![])], &[]).unwrap_err().to_string();
        assert!(e.contains("turn 1 has 1 ids but 0 log-probs"), "{e}");
    }
}
