//! Special tokens (`<|endoftext|>`) and finding them in text.
//!
//! A special token is a whole string with one id that BPE never produces. Plain
//! [`crate::Tokenizer::encode`] treats the string `<|endoftext|>` as ordinary text (as
//! `tiktoken`'s `encode_ordinary` does), so a user's text cannot inject control tokens;
//! [`crate::Tokenizer::encode_with_special_tokens`] recognises them. Where two special
//! tokens match at the same position the longer wins, otherwise the leftmost, and the text
//! between them is pre-tokenized on its own, as `tokenizers` does with added tokens.

use memchr::memmem;

/// A special token: its text and its id.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SpecialToken {
    pub content: String,
    pub id: u32,
}

/// GPT-2's end-of-text token, the one special token of andrea's vocabulary.
pub const END_OF_TEXT: &str = "<|endoftext|>";

/// A piece of text between special tokens, or a special token.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Segment<'a> {
    Text(&'a str),
    Special(u32),
}

/// Finds special tokens in text.
#[derive(Clone, Debug, Default)]
pub(crate) struct SpecialMatcher {
    /// (content, id), longest first so that ties at one position go to the longest.
    tokens: Vec<(String, u32)>,
}

impl SpecialMatcher {
    pub(crate) fn new(specials: &[SpecialToken]) -> Self {
        let mut tokens: Vec<(String, u32)> = specials
            .iter()
            .filter(|s| !s.content.is_empty())
            .map(|s| (s.content.clone(), s.id))
            .collect();
        tokens.sort_by(|a, b| b.0.len().cmp(&a.0.len()).then(a.1.cmp(&b.1)));
        SpecialMatcher { tokens }
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.tokens.is_empty()
    }

    pub(crate) fn max_len(&self) -> usize {
        self.tokens.iter().map(|t| t.0.len()).max().unwrap_or(0)
    }

    /// The first special token at or after `from`: (start, end, id).
    pub(crate) fn find(&self, text: &str, from: usize) -> Option<(usize, usize, u32)> {
        let hay = &text.as_bytes()[from..];
        let mut best: Option<(usize, usize, u32)> = None;
        for (content, id) in &self.tokens {
            // Only a match strictly left of the best so far can win (longest first).
            let limit = best.map_or(hay.len(), |b| (b.0 - from + content.len()).min(hay.len()));
            if let Some(p) = memmem::find(&hay[..limit], content.as_bytes()) {
                let start = from + p;
                if best.is_none_or(|b| start < b.0) {
                    best = Some((start, start + content.len(), *id));
                }
            }
        }
        best
    }

    /// Does a special token occurrence contain both `text[p - 1]` and `text[p]`?
    pub(crate) fn spans(&self, text: &str, p: usize) -> bool {
        let max = self.max_len();
        if max < 2 {
            return false;
        }
        let lo = p.saturating_sub(max - 1);
        let mut from = lo;
        while let Some((s, e, _)) = self.find(text, from) {
            if s >= p {
                return false;
            }
            if e > p {
                return true;
            }
            from = s + 1;
            while !text.is_char_boundary(from) {
                from += 1;
            }
        }
        false
    }

    /// Splits `text` into text and special tokens.
    pub(crate) fn segments<'a>(&self, text: &'a str) -> Vec<Segment<'a>> {
        let mut out = Vec::new();
        let mut pos = 0;
        while let Some((s, e, id)) = self.find(text, pos) {
            if s > pos {
                out.push(Segment::Text(&text[pos..s]));
            }
            out.push(Segment::Special(id));
            pos = e;
        }
        if pos < text.len() {
            out.push(Segment::Text(&text[pos..]));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn matcher() -> SpecialMatcher {
        SpecialMatcher::new(&[
            SpecialToken {
                content: "<|endoftext|>".into(),
                id: 9,
            },
            SpecialToken {
                content: "<|end".into(),
                id: 8,
            },
        ])
    }

    #[test]
    fn longest_at_a_position_leftmost_overall() {
        let m = matcher();
        assert_eq!(m.find("ab<|endoftext|>", 0), Some((2, 15, 9)));
        assert_eq!(m.find("<|end <|endoftext|>", 0), Some((0, 5, 8)));
        assert_eq!(m.find("none", 0), None);
    }

    #[test]
    fn segments() {
        let m = matcher();
        assert_eq!(
            m.segments("a<|endoftext|><|endoftext|>b"),
            [
                Segment::Text("a"),
                Segment::Special(9),
                Segment::Special(9),
                Segment::Text("b")
            ]
        );
        assert!(m.segments("").is_empty());
    }

    #[test]
    fn spans() {
        let m = matcher();
        let t = "xx<|endoftext|>yy";
        assert!(!m.spans(t, 2));
        assert!(m.spans(t, 3));
        assert!(m.spans(t, 14));
        assert!(!m.spans(t, 15));
    }
}
