//! Observations over `env.max_observation_tokens`: cut at token boundaries so that the bridge fits
//! (`env.observation_truncation`; verl's `max_tool_response_length` with its truncate side, in
//! tokens rather than characters). An addition to docs/DESIGN.md section 14, which is silent on
//! long observations; the default (`error`) keeps its behaviour: the episode is unscorable.
//!
//! What is cut: the contents of the environment's messages of one turn (never their roles, names
//! or tool call ids, nor the template's headers), each kept part a run of whole tokens of the
//! content's own encoding (a token holding part of a character, as byte-level BPE makes of an
//! emoji, is kept whole or not at all), with [`MARKER`] where the text was removed so the model
//! can see that it was. The bridge is then rendered from the cut
//! messages exactly as any bridge (template, encoding and every check of [`crate::bridge`]), so
//! the row's tokens are the template's rendering of what the model was shown: the marker costs
//! exactness nothing. Several messages share the room: each keeps its whole content while that
//! fits, and the longest are cut to one common length (water-filling, extra tokens to the
//! earliest). Because a cut and the marker may merge into other tokens once rendered, the room is
//! recomputed from the rendered bridge's excess and the cut repeated, at most [`MAX_TRIES`]
//! times; each step is a function of the messages, the template and the tokenizer only.

use crate::bridge::Bridge;
use crate::protocol::Message;
use crate::EnvError;
use std::borrow::Cow;

/// Which part of an observation too long for its bridge is kept (`env.observation_truncation`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Truncation {
    /// None: the episode is unscorable (the behaviour before this key).
    Error,
    /// The first tokens (verl's truncate side `left`; Hugging Face `truncation_side="right"`).
    KeepHead,
    /// The last tokens (verl's `right`; Hugging Face `truncation_side="left"`).
    KeepTail,
    /// The first and the last tokens, the middle cut (verl's `middle`); the head gets the odd
    /// token.
    KeepEnds,
}

/// Written where text was cut: plain ASCII words any tokenizer spells and a model can read.
pub const MARKER: &str = "[...truncated...]";

/// The most renders one observation is cut and rendered again before its episode fails.
pub const MAX_TRIES: usize = 8;

/// The byte span (start, end) of each token of a text, in order (the tokenizer's offsets, without
/// added special tokens), or why not. A byte-level BPE token that holds part of a character spans
/// the whole character, so neighbours may overlap.
pub type TokenSpans<'a> = &'a dyn Fn(&str) -> Result<Vec<(usize, usize)>, String>;

/// An observation cut to fit: its bridge, the messages it renders, and how many of the contents'
/// tokens were cut.
#[derive(Debug, Clone, PartialEq)]
pub struct Fitted {
    /// The bridge of `messages`, at most the limit's tokens.
    pub bridge: Bridge,
    /// The messages as the model sees them (contents cut, [`MARKER`] added).
    pub messages: Vec<Message>,
    /// Tokens of the contents' own encodings that were cut, over all messages.
    pub cut_tokens: usize,
}

fn floor_char(s: &str, mut i: usize) -> usize {
    i = i.min(s.len());
    while !s.is_char_boundary(i) {
        i -= 1;
    }
    i
}

fn ceil_char(s: &str, mut i: usize) -> usize {
    i = i.min(s.len());
    while !s.is_char_boundary(i) {
        i += 1;
    }
    i
}

/// `text` cut to at most `cap` bytes on `side`'s terms (at char boundaries, no marker): the
/// cheap first cut of a flood of text, before it is encoded. [`Truncation::KeepEnds`] keeps the
/// first and the last `cap / 2` bytes, joined; `Error` keeps it whole.
pub fn cut_bytes(text: &str, cap: usize, side: Truncation) -> Cow<'_, str> {
    if text.len() <= cap {
        return Cow::Borrowed(text);
    }
    match side {
        Truncation::Error => Cow::Borrowed(text),
        Truncation::KeepHead => Cow::Borrowed(&text[..floor_char(text, cap)]),
        Truncation::KeepTail => Cow::Borrowed(&text[ceil_char(text, text.len() - cap)..]),
        Truncation::KeepEnds => {
            let head = &text[..floor_char(text, cap / 2)];
            let tail = &text[ceil_char(text, text.len() - cap / 2)..];
            Cow::Owned(format!("{head}{tail}"))
        }
    }
}

/// `text` of `spans.len()` tokens (`spans`: each token's bytes) keeping `keep` of them on `side`,
/// with [`MARKER`] where the rest was; `text` itself when `keep` covers it.
pub fn cut_tokens(text: &str, spans: &[(usize, usize)], keep: usize, side: Truncation) -> String {
    cut_counted(text, spans, keep, side).0
}

/// [`cut_tokens`] and how many tokens it keeps. Only whole tokens are kept: where a token shares
/// a character with its neighbour across the cut (byte-level BPE splits an emoji, and one token
/// may hold a space and the emoji's first bytes), the cut moves to keep one token fewer, so the
/// kept text never holds part of a token and its encoding is the original's tokens.
fn cut_counted(
    text: &str,
    spans: &[(usize, usize)],
    keep: usize,
    side: Truncation,
) -> (String, usize) {
    let n = spans.len();
    if keep >= n || side == Truncation::Error {
        return (text.to_string(), n);
    }
    // The head: tokens 0..k, none of them reaching past where token k starts.
    let head = |mut k: usize| -> (usize, usize) {
        while k > 0 && spans[k - 1].1 > spans[k].0 {
            k -= 1;
        }
        (k, floor_char(text, spans[k].0))
    };
    // The tail: tokens j..n, the first of them starting where token j − 1 ends or after.
    let tail = |mut j: usize| -> (usize, usize) {
        while j < n && j > 0 && spans[j].0 < spans[j - 1].1 {
            j += 1;
        }
        let at = if j < n { spans[j].0 } else { text.len() };
        (n - j, ceil_char(text, at))
    };
    let ((h, head_end), (t, tail_begin)) = match side {
        Truncation::KeepHead => (head(keep), (0, text.len())),
        Truncation::KeepTail => ((0, 0), tail(n - keep)),
        Truncation::KeepEnds => (head(keep - keep / 2), tail(n - keep / 2)),
        Truncation::Error => unreachable!("returned above"),
    };
    let out = format!("{}{MARKER}{}", &text[..head_end], &text[tail_begin..]);
    (out, h + t)
}

/// Tokens kept of each of `counts` (the messages' content tokens) so that the kept tokens and a
/// marker of `marker` tokens per cut message sum to at most `total`: all of each while the whole
/// fits; else the most short messages whole, and the rest cut to equal shares of what is left
/// (one more each to the earliest of them for the remainder). All cut to 0 when even the markers
/// do not fit.
pub fn shares(counts: &[usize], total: usize, marker: usize) -> Vec<usize> {
    let n = counts.len();
    if counts.iter().sum::<usize>() <= total {
        return counts.to_vec();
    }
    let mut order: Vec<usize> = (0..n).collect();
    order.sort_by_key(|&i| (counts[i], i));
    for whole in (0..n).rev() {
        let kept: usize = order[..whole].iter().map(|&i| counts[i]).sum();
        let cut = n - whole;
        let Some(room) = total.checked_sub(kept + cut * marker) else {
            continue;
        };
        let mut out = counts.to_vec();
        let mut cut_ids: Vec<usize> = order[whole..].to_vec();
        cut_ids.sort_unstable();
        for (r, &i) in cut_ids.iter().enumerate() {
            let share = room / cut + usize::from(r < room % cut);
            out[i] = counts[i].min(share);
        }
        return out;
    }
    vec![0; n]
}

/// `messages` cut so that their bridge (`render`) holds at most `max_tokens` tokens (see the
/// module docs). `Ok(Err(why))`: it cannot fit (the episode fails; `why` says so), also for
/// [`Truncation::Error`].
///
/// # Errors
/// What `render` or `spans` fail with (a template the bridges refuse stops the run).
pub fn fit(
    render: &mut dyn FnMut(&[Message]) -> Result<Bridge, EnvError>,
    messages: &[Message],
    max_tokens: usize,
    side: Truncation,
    spans: TokenSpans<'_>,
) -> Result<Result<Fitted, String>, EnvError> {
    let first = render(messages)?;
    if first.ids.len() <= max_tokens {
        return Ok(Ok(Fitted {
            bridge: first,
            messages: messages.to_vec(),
            cut_tokens: 0,
        }));
    }
    if side == Truncation::Error {
        return Ok(Err(format!(
            "the reply renders as {} tokens, above env.max_observation_tokens = {max_tokens}",
            first.ids.len()
        )));
    }
    let offsets: Vec<Vec<(usize, usize)>> = messages
        .iter()
        .map(|m| spans(&m.content))
        .collect::<Result<_, _>>()
        .map_err(EnvError::Template)?;
    let counts: Vec<usize> = offsets.iter().map(Vec::len).collect();
    let marker = spans(MARKER).map_err(EnvError::Template)?.len();
    let all: usize = counts.iter().sum();
    let mut room = all.saturating_sub(first.ids.len() - max_tokens);
    let mut last = first.ids.len();
    for _ in 0..MAX_TRIES {
        let keep = shares(&counts, room, marker);
        let mut kept = 0;
        let cut: Vec<Message> = messages
            .iter()
            .zip(&offsets)
            .zip(&keep)
            .map(|((m, o), &k)| {
                let (content, n) = cut_counted(&m.content, o, k, side);
                kept += n;
                Message {
                    content,
                    ..m.clone()
                }
            })
            .collect();
        let b = render(&cut)?;
        if b.ids.len() <= max_tokens {
            return Ok(Ok(Fitted {
                bridge: b,
                messages: cut,
                cut_tokens: all - kept,
            }));
        }
        last = b.ids.len();
        if room == 0 {
            break;
        }
        room = room.saturating_sub(b.ids.len() - max_tokens);
    }
    Ok(Err(format!(
        "the reply renders as {} tokens, above env.max_observation_tokens = {max_tokens}, and \
         cutting its contents (env.observation_truncation) left {last} (the template's headers \
         and the truncation marker alone do not fit)",
        first.ids.len()
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One token per char: spans are the chars'.
    fn chars(t: &str) -> Result<Vec<(usize, usize)>, String> {
        Ok(t.char_indices()
            .map(|(i, c)| (i, i + c.len_utf8()))
            .collect())
    }

    #[test]
    fn cuts_keep_the_side_asked_for_at_token_boundaries() {
        let t = "abcdefghij";
        let s = chars(t).unwrap();
        assert_eq!(
            cut_tokens(t, &s, 4, Truncation::KeepHead),
            "abcd[...truncated...]"
        );
        assert_eq!(
            cut_tokens(t, &s, 4, Truncation::KeepTail),
            "[...truncated...]ghij"
        );
        assert_eq!(
            cut_tokens(t, &s, 5, Truncation::KeepEnds),
            "abc[...truncated...]ij"
        );
        assert_eq!(cut_tokens(t, &s, 0, Truncation::KeepEnds), MARKER);
        assert_eq!(cut_tokens(t, &s, 10, Truncation::KeepHead), t);
        // Multi-byte characters: cuts fall on char boundaries.
        let u = "añb€c";
        let su = chars(u).unwrap();
        assert_eq!(
            cut_tokens(u, &su, 2, Truncation::KeepHead),
            "añ[...truncated...]"
        );
        assert_eq!(
            cut_tokens(u, &su, 2, Truncation::KeepTail),
            "[...truncated...]€c"
        );
        // A token holding a space and part of an emoji (as byte-level BPE makes: its span
        // covers the whole emoji, like the next token's): the cut keeps whole tokens only.
        let e = "ab 🚀c";
        let spans = [(0, 1), (1, 2), (2, 7), (3, 7), (7, 8)];
        assert_eq!(
            cut_counted(e, &spans, 3, Truncation::KeepHead),
            (format!("ab{MARKER}"), 2)
        );
        assert_eq!(
            cut_counted(e, &spans, 2, Truncation::KeepTail),
            (format!("{MARKER}c"), 1)
        );
        assert_eq!(cut_counted(e, &spans, 4, Truncation::KeepHead).1, 4);
        assert_eq!(cut_bytes("añb", 2, Truncation::KeepHead), "a");
        assert_eq!(cut_bytes("añb", 2, Truncation::KeepTail), "b");
        assert_eq!(cut_bytes("abcdefgh", 4, Truncation::KeepEnds), "abgh");
    }

    #[test]
    fn shares_cut_the_longest_first() {
        assert_eq!(shares(&[3, 10, 6], 100, 2), vec![3, 10, 6]);
        // The two shortest whole (9), the marker (2): 14 - 11 = 3 left for the longest.
        assert_eq!(shares(&[3, 10, 6], 14, 2), vec![3, 3, 6]);
        assert_eq!(shares(&[3, 10, 6], 12, 2), vec![3, 1, 6]);
        // Two cut: 10 - 3 - 2 × 2 = 3, shared 2 and 1, the earlier message first.
        assert_eq!(shares(&[3, 10, 6], 10, 2), vec![3, 2, 1]);
        assert_eq!(shares(&[3, 10, 6], 5, 2), vec![0, 0, 0]);
        assert_eq!(shares(&[], 5, 2), Vec::<usize>::new());
    }

    /// A bridge whose ids are the chars of `<role>content|` per message: 2 template tokens per
    /// message besides the role's, one token per content char.
    fn render(ms: &[Message]) -> Result<Bridge, EnvError> {
        let text: String = ms
            .iter()
            .map(|m| format!("<{}>{}|", m.role, m.content))
            .collect();
        Ok(Bridge {
            ids: text.chars().map(u32::from).collect(),
            text,
        })
    }

    #[test]
    fn an_observation_is_cut_to_fit_its_bridge() {
        let ms = vec![
            Message::new("tool", "0123456789012345678901234567890123456789"),
            Message::new("tool", "short"),
        ];
        // Each message costs 7 tokens of template ("<tool>" and "|"); 40 + 5 content tokens.
        let mut r = |m: &[Message]| render(m);
        let f = fit(&mut r, &ms, 40, Truncation::KeepHead, &chars)
            .unwrap()
            .unwrap();
        // 40 tokens - 14 of template = 26 for contents and the 17-char marker: the short one is
        // whole, the long one keeps 4 chars + marker (4 + 17 + 5 = 26).
        assert_eq!(f.messages[0].content, "0123[...truncated...]");
        assert_eq!(f.messages[1].content, "short");
        assert_eq!(f.bridge.ids.len(), 40);
        assert_eq!(f.cut_tokens, 36);
        let f = fit(&mut r, &ms, 40, Truncation::KeepTail, &chars)
            .unwrap()
            .unwrap();
        assert_eq!(f.messages[0].content, "[...truncated...]6789");
        let f = fit(&mut r, &ms, 40, Truncation::KeepEnds, &chars)
            .unwrap()
            .unwrap();
        assert_eq!(f.messages[0].content, "01[...truncated...]89");
        // A fitting reply is untouched; `error` refuses; a limit below the headers fails.
        let f = fit(&mut r, &ms, 100, Truncation::KeepHead, &chars)
            .unwrap()
            .unwrap();
        assert_eq!((f.messages.clone(), f.cut_tokens), (ms.clone(), 0));
        let e = fit(&mut r, &ms, 40, Truncation::Error, &chars)
            .unwrap()
            .unwrap_err();
        assert!(e.contains("renders as 59 tokens"), "{e}");
        let e = fit(&mut r, &ms, 20, Truncation::KeepHead, &chars)
            .unwrap()
            .unwrap_err();
        assert!(e.contains("headers and the truncation marker alone"), "{e}");
    }
}
