#!/usr/bin/env python3
"""Writes the reference fixtures of andrea-tokenizer with Hugging Face `tokenizers`.

Not run by CI (it needs Python and `pip install tokenizers`); the fixtures it writes are
committed, and `tests/hf_fixtures.rs` checks andrea against them.

    pip install tokenizers
    python3 crates/andrea-tokenizer/scripts/make_fixtures.py

It writes, under crates/andrea-tokenizer/tests/fixtures/:

- train.txt          ~100 KB of andrea's deterministic synthetic text (mixed_text example)
- hf_tokenizer.json  a byte-level BPE with 1000 merges trained on it by `tokenizers`
                     (ByteLevel pre-tokenizer without prefix space, <|endoftext|> special)
- hf_encodings.json  for each test string: the ids `tokenizers` gives with that vocabulary,
                     with special tokens recognised (`ids`) and as plain text (`ids_plain`)
- hf_pretokenize.json  random strings over many character classes and the pieces
                     `tokenizers`' ByteLevel pre-tokenizer cuts them into
- hf-vocab.json, hf-merges.txt  the same vocabulary in GPT-2's two-file format, as
                     `tokenizers` writes it (`model.save`)

Then, as a check of the other direction (nothing is written), it trains andrea on the same
text, loads andrea's tokenizer.json into `tokenizers` and compares the ids of the test
strings.
"""

import json
import os
import random
import subprocess
import sys
import tempfile

import tokenizers
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

HERE = os.path.dirname(os.path.abspath(__file__))
CRATE = os.path.dirname(HERE)
ROOT = os.path.dirname(os.path.dirname(CRATE))
FIXTURES = os.path.join(CRATE, "tests", "fixtures")
MERGES = 1000
TRAIN_BYTES = 100_000
TRAIN_SEED = 4

TEST_STRINGS = [
    "",
    " ",
    "Hello, world!",
    "Hello world. The quick brown fox jumps over the lazy dog.",
    "  leading spaces and trailing ones   ",
    "tabs\tand\nnewlines\n\n\nand\r\nwindows line ends\r\n",
    "a\n    indented\n\tcode() {\n        return x + 1;\n    }\n",
    "don't won't it's we're they've I'm she'll he'd",
    "DON'T IT'S 'quoted' ''double'' '",
    "numbers 0 12 345 6789 3.14159 1,000,000 2024-01-01 ٣٤٥ ½ ⅷ",
    "Ünïcödé: naïve café résumé Straße Æsir Ørsted",
    "Русский текст, и ещё немного.",
    "Ελληνικά γράμματα και λέξεις",
    "日本語のテキストと漢字、カタカナ。",
    "中文文本，没有空格。",
    "한국어 텍스트입니다",
    "العربية نص قصير",
    "हिन्दी पाठ नमस्ते",
    "emoji 😀🎉 👍🏽 ❤️ 👩‍💻 🇫🇷",
    "mixed: x=1;y=2 // comment /* block */ #hash $money @user 100%",
    "https://example.org/path?query=1&other=two#frag",
    "<|endoftext|>",
    "before<|endoftext|>after",
    "two<|endoftext|><|endoftext|>in a row and <|endoftext| broken",
    "\u00a0nbsp\u3000ideographic space\u2028line sep\u0085nel",
    "zero\u200bwidth\ufeffbom",
    "combining e\u0301 a\u0308 n\u0303",
    "a" * 300,
    "=" * 120 + " " + "-" * 80,
    "The cat sat on the mat. " * 20,
]

# Characters the random pre-tokenization strings are made of: every class the pattern
# distinguishes, and the edge cases between them.
POOL = (
    list("abcXYZ")
    + list("0123")
    + list(" " * 8)
    + list("\t\n\r\x0b\x0c")
    + ["'", "'s", "'t", "'re", "'ve", "'m", "'ll", "'d", "'S", "'x"]
    + list(".,;:!?()[]{}-_=+*/\\\"#@$%^&|~`<>")
    + list("éüßÆØ")
    + list("жЯω")
    + list("日本語カ")
    + list("한")
    + list("عب")
    + list("नमस्ते")
    + ["\u0301", "\u0308", "\u093e"]
    + list("٣½ⅷ²")
    + ["\u00a0", "\u3000", "\u2028", "\u2029", "\u0085", "\u1680", "\u2009", "\u202f"]
    + ["\u200b", "\ufeff", "\u180e", "\u00ad"]
    + ["😀", "👍", "🏽", "\u200d", "🇫", "\U0001d400", "\U00020000"]
)


def mixed_text(nbytes, seed):
    exe = os.path.join(ROOT, "target", "tok", "release", "examples", "mixed_text")
    if not os.path.exists(exe):
        subprocess.run(
            ["cargo", "build", "--release", "-p", "andrea-tokenizer", "--example", "mixed_text"],
            cwd=ROOT,
            check=True,
            env={**os.environ, "CARGO_TARGET_DIR": os.path.join(ROOT, "target", "tok")},
        )
    out = subprocess.run([exe, str(nbytes), str(seed)], check=True, capture_output=True)
    return out.stdout.decode("utf-8")


def hf_byte_level_bpe():
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    return tok


def byte_decoder():
    """GPT-2's unicode-to-byte table (the inverse of bytes_to_unicode)."""
    bs = (
        list(range(ord("!"), ord("~") + 1))
        + list(range(ord("¡"), ord("¬") + 1))
        + list(range(ord("®"), ord("ÿ") + 1))
    )
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(bs, cs)}


def main():
    os.makedirs(FIXTURES, exist_ok=True)
    print(f"tokenizers {tokenizers.__version__}")

    text = mixed_text(TRAIN_BYTES, TRAIN_SEED)
    with open(os.path.join(FIXTURES, "train.txt"), "w", encoding="utf-8", newline="") as f:
        f.write(text)

    tok = hf_byte_level_bpe()
    trainer = trainers.BpeTrainer(
        vocab_size=1 + 256 + MERGES,
        special_tokens=["<|endoftext|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        min_frequency=0,
        show_progress=False,
    )
    # The whole text as one sequence: andrea pre-tokenizes a file as one text.
    tok.train_from_iterator([text], trainer=trainer)
    hf_path = os.path.join(FIXTURES, "hf_tokenizer.json")
    tok.save(hf_path)
    tok.model.save(FIXTURES, "hf")

    encodings = []
    for s in TEST_STRINGS:
        ids = tok.encode(s).ids
        tok.encode_special_tokens = True
        plain = tok.encode(s).ids
        tok.encode_special_tokens = False
        encodings.append({"text": s, "ids": ids, "ids_plain": plain})
    with open(os.path.join(FIXTURES, "hf_encodings.json"), "w", encoding="utf-8") as f:
        json.dump(
            {"tokenizers_version": tokenizers.__version__, "cases": encodings},
            f,
            ensure_ascii=False,
            indent=1,
        )

    rng = random.Random(20240520)
    pre = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    dec = byte_decoder()
    cases = []
    for _ in range(400):
        s = "".join(rng.choice(POOL) for _ in range(rng.randint(1, 24)))
        pieces = [bytes(dec[c] for c in p).decode("utf-8") for p, _ in pre.pre_tokenize_str(s)]
        assert "".join(pieces) == s
        cases.append({"text": s, "pieces": pieces})
    with open(os.path.join(FIXTURES, "hf_pretokenize.json"), "w", encoding="utf-8") as f:
        json.dump({"tokenizers_version": tokenizers.__version__, "cases": cases}, f, ensure_ascii=False)
    print(f"wrote fixtures to {FIXTURES}")

    check_andrea_json_in_tokenizers(text)


def check_andrea_json_in_tokenizers(text):
    """Train andrea on the same text, load its tokenizer.json here, compare ids."""
    env = {**os.environ, "CARGO_TARGET_DIR": os.path.join(ROOT, "target", "tok")}
    subprocess.run(
        ["cargo", "build", "--release", "-p", "andrea-tokenizer", "--example", "tokenizer_tool"],
        cwd=ROOT,
        check=True,
        env=env,
    )
    tool = os.path.join(ROOT, "target", "tok", "release", "examples", "tokenizer_tool")
    with tempfile.TemporaryDirectory() as d:
        corpus = os.path.join(d, "train.txt")
        with open(corpus, "w", encoding="utf-8", newline="") as f:
            f.write(text)
        out = os.path.join(d, "andrea.json")
        subprocess.run([tool, "train", "--input", corpus, "--merges", str(MERGES), "--out", out], check=True)
        strings = os.path.join(d, "strings.json")
        with open(strings, "w", encoding="utf-8") as f:
            json.dump(TEST_STRINGS, f)
        res = subprocess.run(
            [tool, "ids", "--tokenizer", out, "--strings", strings], check=True, capture_output=True
        )
        andrea_ids = json.loads(res.stdout)
        hf = Tokenizer.from_file(out)
        bad = 0
        for s, ids in zip(TEST_STRINGS, andrea_ids):
            hf_ids = hf.encode(s).ids
            if hf_ids != ids:
                bad += 1
                print(f"MISMATCH {s!r}: tokenizers {hf_ids[:20]} andrea {ids[:20]}")
            if hf.decode(hf_ids, skip_special_tokens=False) != s:
                bad += 1
                print(f"DECODE MISMATCH {s!r}")
        print(
            f"andrea's tokenizer.json in tokenizers: {len(TEST_STRINGS) - bad}/{len(TEST_STRINGS)} "
            f"strings give the same ids (vocab size {hf.get_vocab_size()})"
        )
        if bad:
            sys.exit(1)


if __name__ == "__main__":
    main()
