//! Deterministic synthetic text for benchmarks, tests and demos: mixed like a web
//! corpus, with no third-party text in it.
//!
//! [`mixed_text`] writes paragraphs of English-like prose (a Zipf-distributed lexicon of
//! common function words and made-up words, with contractions, numbers, quotes and
//! punctuation), source code (indentation, operators, comments), text in other scripts
//! (Cyrillic, Greek, CJK, Japanese, Hangul, Arabic, Devanagari, accented Latin), and
//! lists, headings, URLs, tables and emoji. The same `(bytes, seed)` always gives the
//! same text, on every platform; the benchmark and the comparison script with
//! `tokenizers` both use it (`cargo run --release -p andrea-tokenizer --example
//! mixed_text`).

/// SplitMix64: tiny, fast, and fully specified, so the text is the same everywhere.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (`n > 0`).
    fn below(&mut self, n: usize) -> usize {
        ((self.next() >> 11) as f64 / (1u64 << 53) as f64 * n as f64) as usize
    }

    fn chance(&mut self, p: f64) -> bool {
        ((self.next() >> 11) as f64 / (1u64 << 53) as f64) < p
    }

    fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len())]
    }

    fn pick_str(&mut self, items: &[&'static str]) -> &'static str {
        items[self.below(items.len())]
    }
}

/// Draws ranks `0..n` with probability proportional to `1 / (rank + 2)^s`.
struct Zipf {
    cdf: Vec<f64>,
}

impl Zipf {
    fn new(n: usize, s: f64) -> Self {
        let mut acc = 0.0;
        let cdf = (0..n)
            .map(|r| {
                acc += 1.0 / ((r + 2) as f64).powf(s);
                acc
            })
            .collect::<Vec<_>>();
        let total = acc;
        Zipf {
            cdf: cdf.into_iter().map(|c| c / total).collect(),
        }
    }

    fn draw(&self, rng: &mut Rng) -> usize {
        let u = (rng.next() >> 11) as f64 / (1u64 << 53) as f64;
        self.cdf.partition_point(|&c| c < u).min(self.cdf.len() - 1)
    }
}

const FUNCTION_WORDS: &[&str] = &[
    "the", "of", "and", "to", "a", "in", "is", "that", "for", "it", "as", "was", "with", "be",
    "by", "on", "not", "he", "this", "are", "or", "his", "from", "at", "which", "but", "have",
    "an", "had", "they", "you", "were", "their", "one", "all", "we", "can", "her", "has", "there",
    "been", "if", "more", "when", "will", "would", "who", "so", "no", "she", "other", "its", "may",
    "these", "what", "them", "than", "some", "him", "time", "into", "only", "do", "new", "about",
    "two", "first", "then", "also", "after", "over", "such", "any", "where", "most", "used",
    "could", "each", "many", "make", "like", "people", "between", "because", "through", "while",
    "should", "during", "without", "however", "before", "under", "around",
];

const ONSETS: &[&str] = &[
    "b", "c", "d", "f", "g", "h", "j", "k", "l", "m", "n", "p", "r", "s", "t", "v", "w", "z", "br",
    "cl", "cr", "dr", "fl", "gr", "pl", "pr", "sc", "sl", "sp", "st", "str", "th", "tr", "ch",
    "sh", "wh", "qu", "",
];
const VOWELS: &[&str] = &[
    "a", "e", "i", "o", "u", "ea", "ou", "io", "ai", "ee", "oo", "y", "ie", "au",
];
const CODAS: &[&str] = &[
    "", "", "", "", "", "", "n", "r", "s", "t", "l", "m", "nd", "nt", "st", "ng", "ck", "rd", "ss",
    "ll", "rt", "sh", "th", "x", "ct", "nk",
];
const SUFFIXES: &[&str] = &[
    "", "", "", "", "", "", "", "", "", "", "", "s", "s", "ed", "ing", "ly", "tion", "ment",
    "ness", "able", "er", "est", "ous", "ity", "ive", "al",
];
const CONTRACTIONS: &[&str] = &["'s", "n't", "'re", "'ll", "'ve", "'d", "'m"];

/// A made-up English-like word, the same for the same index.
fn made_up_word(index: usize) -> String {
    let mut rng = Rng(index as u64 ^ 0xA5A5_5A5A_0F0F_F0F0);
    let syllables = 1 + rng.below(2) + usize::from(index > 8000 && rng.chance(0.5));
    let mut w = String::new();
    for _ in 0..syllables {
        w.push_str(rng.pick_str(ONSETS));
        w.push_str(rng.pick_str(VOWELS));
        w.push_str(rng.pick_str(CODAS));
    }
    w.push_str(rng.pick_str(SUFFIXES));
    w
}

/// Words of another script, built from its letters.
struct Script {
    /// Ranges of letters (inclusive) that words draw from.
    letters: &'static [(u32, u32)],
    /// Marks (vowel signs) that may follow a letter.
    marks: &'static [(u32, u32)],
    /// Characters per word.
    word_len: (usize, usize),
    /// Words are separated by spaces.
    spaced: bool,
    stops: &'static [&'static str],
}

const SCRIPTS: &[Script] = &[
    // Cyrillic
    Script {
        letters: &[(0x430, 0x44F)],
        marks: &[],
        word_len: (2, 9),
        spaced: true,
        stops: &[".", ",", "!", "?"],
    },
    // Greek
    Script {
        letters: &[(0x3B1, 0x3C9), (0x3AC, 0x3AF)],
        marks: &[],
        word_len: (2, 9),
        spaced: true,
        stops: &[".", ",", ";"],
    },
    // CJK ideographs (a common block)
    Script {
        letters: &[(0x4E00, 0x4FFF), (0x5B50, 0x5BFF), (0x6700, 0x67FF)],
        marks: &[],
        word_len: (1, 4),
        spaced: false,
        stops: &["，", "。", "、", "！"],
    },
    // Japanese: hiragana with some katakana and kanji
    Script {
        letters: &[(0x3041, 0x3093), (0x30A1, 0x30F3), (0x65E5, 0x65FF)],
        marks: &[],
        word_len: (1, 5),
        spaced: false,
        stops: &["。", "、", "「", "」"],
    },
    // Hangul syllables
    Script {
        letters: &[(0xAC00, 0xAFFF), (0xB098, 0xB2E4)],
        marks: &[],
        word_len: (1, 4),
        spaced: true,
        stops: &[".", ",", "?"],
    },
    // Arabic
    Script {
        letters: &[(0x627, 0x64A)],
        marks: &[(0x64B, 0x650)],
        word_len: (2, 7),
        spaced: true,
        stops: &["،", ".", "؟"],
    },
    // Devanagari: consonants and vowel signs
    Script {
        letters: &[(0x915, 0x939)],
        marks: &[(0x93E, 0x94C)],
        word_len: (2, 6),
        spaced: true,
        stops: &["।", ",", "?"],
    },
    // Accented Latin (French/German-like)
    Script {
        letters: &[(0x61, 0x7A), (0x61, 0x7A), (0x61, 0x7A), (0xE0, 0xFC)],
        marks: &[],
        word_len: (2, 10),
        spaced: true,
        stops: &[".", ",", "!", "?", ";"],
    },
];

const EMOJI: &[&str] = &[
    "😀",
    "🎉",
    "👍",
    "👍🏽",
    "❤️",
    "🚀",
    "🔥",
    "✨",
    "🙏",
    "😂",
    "🤖",
    "📈",
    "✅",
    "⚠️",
    "👩‍💻",
];
const OPERATORS: &[&str] = &[
    " = ", " == ", " += ", " -> ", " => ", " + ", " * ", " - ", " / ", " < ", " >= ", " && ",
    " || ", ".", "::", ", ",
];
const KEYWORDS: &[&str] = &[
    "let", "fn", "if", "else", "for", "while", "return", "def", "class", "import", "const",
    "match", "self", "None", "true", "false", "pub", "struct", "impl", "in",
];

/// Generates about `bytes` bytes (never more) of mixed text; the same arguments give the
/// same text.
pub fn mixed_text(bytes: usize, seed: u64) -> String {
    let mut g = Generator {
        rng: Rng(seed),
        zipf: Zipf::new(40_000, 1.05),
        lexicon: (0..40_000)
            .map(|i| match FUNCTION_WORDS.get(i) {
                Some(w) => w.to_string(),
                None => made_up_word(i),
            })
            .collect(),
        out: String::with_capacity(bytes + 4096),
    };
    while g.out.len() < bytes {
        let kind = g.rng.below(100);
        match kind {
            0..=64 => g.prose_paragraph(),
            65..=76 => g.code_block(),
            77..=91 => g.foreign_paragraph(),
            _ => g.misc_block(),
        }
        g.out.push_str(match g.rng.below(10) {
            0 => "\n\n\n",
            1 => "\n",
            2 => " \n\n",
            _ => "\n\n",
        });
    }
    let mut end = bytes.min(g.out.len());
    while !g.out.is_char_boundary(end) {
        end -= 1;
    }
    g.out.truncate(end);
    g.out
}

struct Generator {
    rng: Rng,
    zipf: Zipf,
    lexicon: Vec<String>,
    out: String,
}

impl Generator {
    fn word(&mut self) -> String {
        let r = self.zipf.draw(&mut self.rng);
        self.lexicon[r].clone()
    }

    fn number(&mut self) {
        let n = match self.rng.below(6) {
            0 => format!("{}", 1900 + self.rng.below(130)),
            1 => format!("{}.{}", self.rng.below(100), self.rng.below(100)),
            2 => format!("{}%", self.rng.below(101)),
            3 => format!("{},{:03}", 1 + self.rng.below(999), self.rng.below(1000)),
            4 => format!("{}", self.rng.below(10)),
            _ => format!("{}", self.rng.below(100_000)),
        };
        self.out.push_str(&n);
    }

    fn sentence(&mut self) {
        let n = 4 + self.rng.below(20);
        for i in 0..n {
            if i > 0 {
                self.out.push(' ');
            }
            if self.rng.chance(0.05) {
                self.number();
                continue;
            }
            let w = self.word();
            let capital = i == 0 || self.rng.chance(0.04);
            if capital {
                let mut c = w.chars();
                if let Some(f) = c.next() {
                    self.out.extend(f.to_uppercase());
                    self.out.push_str(c.as_str());
                }
            } else if self.rng.chance(0.03) {
                self.out.push('"');
                self.out.push_str(&w);
                self.out.push('"');
            } else if self.rng.chance(0.02) {
                self.out.push('(');
                self.out.push_str(&w);
                self.out.push(')');
            } else {
                self.out.push_str(&w);
            }
            if self.rng.chance(0.04) {
                let c = *self.rng.pick(CONTRACTIONS);
                self.out.push_str(c);
            }
            if i + 1 < n && self.rng.chance(0.08) {
                self.out
                    .push_str(if self.rng.chance(0.8) { "," } else { ";" });
            } else if i + 1 < n && self.rng.chance(0.01) {
                self.out.push_str(" -");
            }
        }
        let end = *self.rng.pick(&[".", ".", ".", ".", "!", "?", "...", ":"]);
        self.out.push_str(end);
    }

    fn prose_paragraph(&mut self) {
        let n = 1 + self.rng.below(7);
        for i in 0..n {
            if i > 0 {
                self.out
                    .push_str(if self.rng.chance(0.1) { "  " } else { " " });
            }
            self.sentence();
        }
        if self.rng.chance(0.05) {
            self.out.push(' ');
            let e = *self.rng.pick(EMOJI);
            self.out.push_str(e);
        }
    }

    fn identifier(&mut self) -> String {
        let a = self.word();
        match self.rng.below(4) {
            0 => a,
            1 => format!("{a}_{}", self.word()),
            2 => {
                let b = self.word();
                let mut c = b.chars();
                let cap: String = c
                    .next()
                    .map(|f| f.to_uppercase().collect())
                    .unwrap_or_default();
                format!("{a}{cap}{}", c.as_str())
            }
            _ => format!("{a}{}", self.rng.below(10)),
        }
    }

    fn code_block(&mut self) {
        let lines = 3 + self.rng.below(12);
        let tabs = self.rng.chance(0.15);
        let mut depth = 0usize;
        for _ in 0..lines {
            for _ in 0..depth {
                self.out.push_str(if tabs { "\t" } else { "    " });
            }
            match self.rng.below(6) {
                0 => {
                    let c = format!("// {} {} {}", self.word(), self.word(), self.word());
                    self.out.push_str(&c);
                }
                1 if depth < 4 => {
                    let kw = *self.rng.pick(KEYWORDS);
                    let id = self.identifier();
                    let arg = self.identifier();
                    self.out.push_str(&format!("{kw} {id}({arg}) {{"));
                    depth += 1;
                }
                2 if depth > 0 => {
                    self.out.push('}');
                    depth -= 1;
                }
                _ => {
                    let lhs = self.identifier();
                    let op = *self.rng.pick(OPERATORS);
                    let rhs = self.identifier();
                    self.out.push_str(&format!("{lhs}{op}{rhs}"));
                    if self.rng.chance(0.5) {
                        self.out.push_str(&format!("[{}]", self.rng.below(64)));
                    }
                    self.out.push(';');
                }
            }
            self.out.push('\n');
        }
        while depth > 0 {
            depth -= 1;
            for _ in 0..depth {
                self.out.push_str("    ");
            }
            self.out.push_str("}\n");
        }
    }

    fn foreign_word(&mut self, script: &Script, rank: usize) {
        // Words of a script come from a fixed lexicon too (seeded by rank), so they repeat
        // with Zipf frequencies like real words.
        let mut r = Rng(rank as u64 * 7919 + script.letters[0].0 as u64);
        let len = script.word_len.0 + r.below(script.word_len.1 - script.word_len.0 + 1);
        for _ in 0..len {
            let (lo, hi) = *r.pick(script.letters);
            let c = char::from_u32(lo + r.below((hi - lo + 1) as usize) as u32).unwrap_or('?');
            self.out.push(c);
            if !script.marks.is_empty() && r.chance(0.4) {
                let (lo, hi) = *r.pick(script.marks);
                let m = char::from_u32(lo + r.below((hi - lo + 1) as usize) as u32).unwrap_or('?');
                self.out.push(m);
            }
        }
    }

    fn foreign_paragraph(&mut self) {
        let script = &SCRIPTS[self.rng.below(SCRIPTS.len())];
        let sentences = 1 + self.rng.below(5);
        for s in 0..sentences {
            if s > 0 && script.spaced {
                self.out.push(' ');
            }
            let words = 3 + self.rng.below(15);
            for w in 0..words {
                if w > 0 && script.spaced {
                    self.out.push(' ');
                }
                let rank = self.zipf.draw(&mut self.rng) % 5000;
                self.foreign_word(script, rank);
                if self.rng.chance(0.03) {
                    self.out.push(' ');
                    self.number();
                }
            }
            let stop = *self.rng.pick(script.stops);
            self.out.push_str(stop);
        }
    }

    fn misc_block(&mut self) {
        match self.rng.below(5) {
            0 => {
                let n = 2 + self.rng.below(6);
                for i in 0..n {
                    if self.rng.chance(0.5) {
                        self.out.push_str(&format!("{}. ", i + 1));
                    } else {
                        self.out.push_str("- ");
                    }
                    self.sentence();
                    self.out.push('\n');
                }
            }
            1 => {
                let level = 1 + self.rng.below(3);
                self.out.push_str(&"#".repeat(level));
                self.out.push(' ');
                let title = format!("{} {}", self.word(), self.word());
                self.out.push_str(&title);
            }
            2 => {
                let url = format!(
                    "https://www.{}.org/{}/{}?id={}&lang=en",
                    self.word(),
                    self.word(),
                    self.identifier(),
                    self.rng.below(100_000)
                );
                self.out.push_str(&url);
                let mail = format!(" <{}@{}.com>", self.word(), self.word());
                self.out.push_str(&mail);
            }
            3 => {
                let rows = 2 + self.rng.below(5);
                for _ in 0..rows {
                    self.out.push('|');
                    for _ in 0..3 {
                        let w = self.word();
                        let pad = 12usize.saturating_sub(w.len());
                        self.out.push(' ');
                        self.out.push_str(&w);
                        self.out.push_str(&" ".repeat(pad));
                        self.out.push('|');
                    }
                    self.out
                        .push_str(if self.rng.chance(0.2) { "\r\n" } else { "\n" });
                }
            }
            _ => {
                let n = 3 + self.rng.below(8);
                for _ in 0..n {
                    let e = *self.rng.pick(EMOJI);
                    self.out.push_str(e);
                    self.out.push(' ');
                    let w = self.word();
                    self.out.push_str(&w);
                    self.out.push(' ');
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deterministic_and_sized() {
        let a = mixed_text(20_000, 1);
        assert_eq!(a, mixed_text(20_000, 1));
        assert_ne!(a, mixed_text(20_000, 2));
        assert!(a.len() <= 20_000 && a.len() > 19_990);
        assert!(mixed_text(30_000, 1)
            .as_bytes()
            .starts_with(&a.as_bytes()[..10_000]));
    }

    #[test]
    fn is_mixed() {
        let t = mixed_text(200_000, 7);
        assert!(t.contains("the"));
        assert!(t.contains("n't") || t.contains("'s"));
        assert!(t.chars().any(|c| ('\u{430}'..='\u{44F}').contains(&c)));
        assert!(t.chars().any(|c| ('\u{4E00}'..='\u{9FFF}').contains(&c)));
        assert!(t.contains("    "));
        assert!(t.chars().any(|c| c as u32 > 0x1F000));
    }
}
