//! GPT-2's pre-tokenization, written out by hand.
//!
//! GPT-2 (and the Hugging Face `ByteLevel` pre-tokenizer) splits text with the pattern
//!
//! ```text
//! 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
//! ```
//!
//! matched leftmost-first: at each position the first alternative that matches wins, and
//! the next piece starts where it ended. The rules, in that order:
//!
//! 1. a contraction: `'s`, `'t`, `'re`, `'ve`, `'m`, `'ll`, `'d` (lower case only);
//! 2. an optional space (U+0020 only) and a run of letters (`\p{L}`);
//! 3. an optional space and a run of numbers (`\p{N}`);
//! 4. an optional space and a run of anything else that is not whitespace;
//! 5. a run of whitespace that is not followed by a non-whitespace character: a
//!    whitespace run before a word gives its last character to the word (so `"a   b"` is
//!    `"a"`, `"  "`, `" b"`), a run at the end of the text is kept whole;
//! 6. whitespace: what rule 5 leaves, a single whitespace character before a
//!    non-whitespace one (`"\nb"` is `"\n"`, `"b"`).
//!
//! A hand-written matcher is several times faster than a backtracking regex engine (the
//! negative lookahead of rule 5 rules out the `regex` crate) and has no dependency
//! beyond the Unicode tables. Classes: letters and numbers are the general categories
//! `L` and `N` (from `unicode-properties`), whitespace is Unicode `White_Space`
//! (`char::is_whitespace`), as in Oniguruma, the engine behind `tokenizers`. Marks
//! (`M`) are neither letters nor numbers, so, as in GPT-2, a combining accent or an Indic
//! vowel sign splits a word.

use std::sync::OnceLock;
use unicode_properties::{GeneralCategoryGroup, UnicodeGeneralCategory};

/// The class of a character, as the pattern sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub(crate) enum Class {
    Letter = 0,
    Number = 1,
    /// Not whitespace, not a letter, not a number (punctuation, symbols, marks, emoji).
    Other = 2,
    /// U+0020, the only character the `' ?'` of rules 2-4 accepts.
    Space = 3,
    /// Any other `White_Space` character.
    Whitespace = 4,
}

impl Class {
    #[inline]
    fn is_space(self) -> bool {
        matches!(self, Class::Space | Class::Whitespace)
    }

    fn from_u8(v: u8) -> Class {
        match v {
            0 => Class::Letter,
            1 => Class::Number,
            2 => Class::Other,
            3 => Class::Space,
            _ => Class::Whitespace,
        }
    }
}

fn class_of_char_slow(c: char) -> Class {
    if c == ' ' {
        Class::Space
    } else if c.is_whitespace() {
        Class::Whitespace
    } else {
        match c.general_category_group() {
            GeneralCategoryGroup::Letter => Class::Letter,
            GeneralCategoryGroup::Number => Class::Number,
            _ => Class::Other,
        }
    }
}

/// Classes of the Basic Multilingual Plane, computed once (64 KiB): most non-ASCII text
/// is in the BMP, and a table lookup is much cheaper than a binary search over ranges.
fn bmp_table() -> &'static [u8] {
    static TABLE: OnceLock<Box<[u8]>> = OnceLock::new();
    TABLE.get_or_init(|| {
        (0u32..0x1_0000)
            .map(|u| char::from_u32(u).map_or(Class::Other, class_of_char_slow) as u8)
            .collect()
    })
}

const ASCII_CLASS: [Class; 128] = {
    let mut t = [Class::Other; 128];
    let mut i = 0;
    while i < 128 {
        let b = i as u8;
        t[i] = if b == b' ' {
            Class::Space
        } else if matches!(b, b'\t' | b'\n' | 0x0B | 0x0C | b'\r') {
            Class::Whitespace
        } else if b.is_ascii_alphabetic() {
            Class::Letter
        } else if b.is_ascii_digit() {
            Class::Number
        } else {
            Class::Other
        };
        i += 1;
    }
    t
};

/// The class and byte length of the character starting at `b[i]`; `b` is valid UTF-8 and
/// `i` a character boundary.
#[inline(always)]
fn class_at(b: &[u8], i: usize, bmp: &[u8]) -> (Class, usize) {
    let b0 = b[i];
    if b0 < 0x80 {
        return (ASCII_CLASS[b0 as usize], 1);
    }
    if b0 < 0xE0 {
        let u = ((b0 as u32 & 0x1F) << 6) | (b[i + 1] as u32 & 0x3F);
        (Class::from_u8(bmp[u as usize]), 2)
    } else if b0 < 0xF0 {
        let u =
            ((b0 as u32 & 0x0F) << 12) | ((b[i + 1] as u32 & 0x3F) << 6) | (b[i + 2] as u32 & 0x3F);
        (Class::from_u8(bmp[u as usize]), 3)
    } else {
        let u = ((b0 as u32 & 0x07) << 18)
            | ((b[i + 1] as u32 & 0x3F) << 12)
            | ((b[i + 2] as u32 & 0x3F) << 6)
            | (b[i + 3] as u32 & 0x3F);
        // Valid UTF-8 decodes to a valid char.
        let c = char::from_u32(u).unwrap_or('\u{FFFD}');
        (class_of_char_slow(c), 4)
    }
}

/// The end of the contraction (rule 1) that starts at `b[i] == '\''`, if any.
#[inline]
fn contraction_end(b: &[u8], i: usize) -> Option<usize> {
    match b.get(i + 1)? {
        b's' | b't' | b'm' | b'd' => Some(i + 2),
        b'r' | b'v' if b.get(i + 2) == Some(&b'e') => Some(i + 3),
        b'l' if b.get(i + 2) == Some(&b'l') => Some(i + 3),
        _ => None,
    }
}

/// The end of the run of `class` characters that starts at `j`.
#[inline(always)]
fn run_end(b: &[u8], mut j: usize, class: Class, bmp: &[u8]) -> usize {
    while j < b.len() {
        let (c, len) = class_at(b, j, bmp);
        if c != class {
            break;
        }
        j += len;
    }
    j
}

/// Rules 5 and 6 at `i`, a whitespace character.
#[inline]
fn whitespace_end(b: &[u8], i: usize, bmp: &[u8]) -> usize {
    let mut j = i;
    let mut last = i;
    let mut n = 0usize;
    while j < b.len() {
        let (c, len) = class_at(b, j, bmp);
        if !c.is_space() {
            break;
        }
        last = j;
        j += len;
        n += 1;
    }
    if j == b.len() || n == 1 {
        j
    } else {
        // `\s+(?!\S)` backs off one character so the word keeps its space.
        last
    }
}

/// The end of the piece that starts at `i` (`i < b.len()`).
#[inline]
fn piece_end(b: &[u8], i: usize, bmp: &[u8]) -> usize {
    let (c0, len0) = class_at(b, i, bmp);
    match c0 {
        Class::Letter | Class::Number => run_end(b, i + len0, c0, bmp),
        Class::Other => {
            if b[i] == b'\'' {
                if let Some(end) = contraction_end(b, i) {
                    return end;
                }
            }
            run_end(b, i + len0, Class::Other, bmp)
        }
        Class::Space => {
            if i + 1 < b.len() {
                let (c1, len1) = class_at(b, i + 1, bmp);
                if !c1.is_space() {
                    return run_end(b, i + 1 + len1, c1, bmp);
                }
            }
            whitespace_end(b, i, bmp)
        }
        Class::Whitespace => whitespace_end(b, i, bmp),
    }
}

/// The pieces of `text`, in order; concatenated they are `text`.
pub fn pieces(text: &str) -> Pieces<'_> {
    Pieces {
        text,
        pos: 0,
        bmp: bmp_table(),
    }
}

/// Iterator over the pre-tokenization pieces of a text (see [`pieces`]).
#[derive(Clone, Debug)]
pub struct Pieces<'a> {
    text: &'a str,
    pos: usize,
    bmp: &'static [u8],
}

impl<'a> Iterator for Pieces<'a> {
    type Item = &'a str;

    #[inline]
    fn next(&mut self) -> Option<&'a str> {
        let b = self.text.as_bytes();
        if self.pos >= b.len() {
            return None;
        }
        let start = self.pos;
        let end = piece_end(b, start, self.bmp);
        self.pos = end;
        // `end` is a character boundary: every step above moves by whole characters.
        Some(&self.text[start..end])
    }
}

/// The first position `p >= from` at which `text` can be cut so that the pieces of
/// `text[..p]` followed by the pieces of `text[p..]` are the pieces of `text`.
///
/// Such a cut lies between two non-whitespace characters of different classes (letter,
/// number, other), the first of which is not an apostrophe: a piece of rules 1-4 never
/// spans such a pair unless it is a contraction (which starts with `'`), and no rule
/// looks past a non-whitespace character of another class, so both sides split as they
/// would in the whole text. Typical text has one every few bytes; a text without one
/// (a single run of letters, say) cannot be cut at all.
pub(crate) fn safe_cut(text: &str, from: usize) -> Option<usize> {
    let b = text.as_bytes();
    if from == 0 || from >= b.len() {
        return None;
    }
    let bmp = bmp_table();
    // Step back to the start of the character that ends before `from`.
    let mut p = from;
    while !text.is_char_boundary(p) {
        p += 1;
    }
    let mut q = p - 1;
    while !text.is_char_boundary(q) {
        q -= 1;
    }
    let (mut prev, _) = class_at(b, q, bmp);
    let mut prev_is_apostrophe = b[q] == b'\'';
    while p < b.len() {
        let (cur, len) = class_at(b, p, bmp);
        if !prev.is_space() && !cur.is_space() && prev != cur && !prev_is_apostrophe {
            return Some(p);
        }
        prev = cur;
        prev_is_apostrophe = b[p] == b'\'';
        p += len;
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn split(s: &str) -> Vec<&str> {
        pieces(s).collect()
    }

    #[test]
    fn rule_1_contractions() {
        assert_eq!(split("don't"), ["don", "'t"]);
        assert_eq!(
            split("we're we've I'm he'll she'd it's"),
            ["we", "'re", " we", "'ve", " I", "'m", " he", "'ll", " she", "'d", " it", "'s"]
        );
        // Upper case is not a contraction (as in GPT-2): the apostrophe is "other".
        assert_eq!(split("IT'S"), ["IT", "'", "S"]);
        // A contraction is matched wherever an apostrophe starts a piece.
        assert_eq!(split("'sup"), ["'s", "up"]);
        assert_eq!(split("'x"), ["'", "x"]);
        // Inside a run of other characters the apostrophe is just other.
        assert_eq!(split("?'s"), ["?'", "s"]);
        assert_eq!(split(" 's"), [" '", "s"]);
        assert_eq!(split("'ll'"), ["'ll", "'"]);
    }

    #[test]
    fn rule_2_letters_with_optional_space() {
        assert_eq!(split("Hello world"), ["Hello", " world"]);
        assert_eq!(split(" héllo wörld"), [" héllo", " wörld"]);
        assert_eq!(split("Привет мир"), ["Привет", " мир"]);
        assert_eq!(split("日本語 テキスト"), ["日本語", " テキスト"]);
        // Only U+0020 joins a word; a tab or NBSP stands alone.
        assert_eq!(split("\tword"), ["\t", "word"]);
        assert_eq!(split("\u{a0}word"), ["\u{a0}", "word"]);
        // Marks are not letters: a combining accent splits the word.
        assert_eq!(split("e\u{301}te"), ["e", "\u{301}", "te"]);
    }

    #[test]
    fn rule_3_numbers_with_optional_space() {
        assert_eq!(split("abc123"), ["abc", "123"]);
        assert_eq!(
            split("in 2024, 3.14"),
            ["in", " 2024", ",", " 3", ".", "14"]
        );
        assert_eq!(split("٣٤ ½ ⅷ"), ["٣٤", " ½", " ⅷ"]);
    }

    #[test]
    fn rule_4_other_with_optional_space() {
        assert_eq!(split("a+=b"), ["a", "+=", "b"]);
        assert_eq!(split("x !?!"), ["x", " !?!"]);
        assert_eq!(split("hi 👋🏽!"), ["hi", " 👋🏽!"]);
        assert_eq!(split("(a)"), ["(", "a", ")"]);
    }

    #[test]
    fn rule_5_whitespace_not_before_a_word() {
        assert_eq!(split("a   b"), ["a", "  ", " b"]);
        assert_eq!(split("a\n\n\nb"), ["a", "\n\n", "\n", "b"]);
        assert_eq!(split("a\n    b"), ["a", "\n   ", " b"]);
        assert_eq!(split("end  "), ["end", "  "]);
        assert_eq!(split("end\n"), ["end", "\n"]);
        assert_eq!(split(" \n "), [" \n "]);
        assert_eq!(split("a \u{3000}b"), ["a", " ", "\u{3000}", "b"]);
    }

    #[test]
    fn rule_6_single_whitespace_before_a_word() {
        assert_eq!(split("a\nb"), ["a", "\n", "b"]);
        assert_eq!(split("\u{3000}b"), ["\u{3000}", "b"]);
        assert_eq!(split("a \nb"), ["a", " ", "\n", "b"]);
    }

    #[test]
    fn empty_and_single() {
        assert!(split("").is_empty());
        assert_eq!(split(" "), [" "]);
        assert_eq!(split("x"), ["x"]);
    }

    #[test]
    fn pieces_cover_the_text() {
        let s = "Hello, world!  It's 2024\n\n\tfn main() { println!(\"hi\"); }  ";
        assert_eq!(split(s).concat(), s);
    }

    #[test]
    fn safe_cuts_do_not_change_pieces() {
        let s = "It's a test: x1 = 'y'; don't\n\n  stop... 日本語2 émoji👋 'll";
        let whole = split(s);
        for from in 1..s.len() {
            if let Some(p) = safe_cut(s, from) {
                let mut parts = split(&s[..p]);
                parts.extend(split(&s[p..]));
                assert_eq!(parts, whole, "cut at {p}");
            }
        }
    }
}
