#!/usr/bin/env python3
"""andrea-tokenizer side by side with Hugging Face `tokenizers`: same text, same vocabulary.

Optional, not run by CI.

    pip install tokenizers
    python3 crates/andrea-tokenizer/scripts/compare_tokenizers.py [--repeat 5]
        [--local-text | --train-text FILE --encode-text FILE] [--merges 8192]

By default both texts are andrea's deterministic synthetic mixed text, the same the
criterion benchmark (benches/benches/tokenizer.rs) uses: 10 MB (seed 1) to train on,
4 MB (seed 2) to encode. `--local-text` uses real text found on the machine instead:
the plain-text files under /usr/share/doc interleaved with the Python standard library's
sources (in sorted order), the first 10 MB to train on and the next 4 MB to encode.

Training: andrea (`train_from_files`) and `tokenizers`' BpeTrainer (`Tokenizer.train` on the
file, ByteLevel pre-tokenizer, 256-byte initial alphabet, <|endoftext|>), both learning
`--merges` merges on all cores (2 here). Encoding: the vocabulary andrea trained, saved as
tokenizer.json and loaded by both; the encode text cut into paragraphs (at blank lines)
and encoded as one batch (`encode_batch` and `encode_batch_fast` for tokenizers, the
faster of the two is its figure), with 1 and 2 threads (RAYON_NUM_THREADS for
tokenizers, a rayon pool for andrea); andrea also encodes the whole text as one string.
The ids are checked to be the same (count, sum, sum of squares). Merges are checked too:
`tokenizers` trained on the whole training text as one sequence (`train_from_iterator`,
which pre-tokenizes it as andrea pre-tokenizes a file; `train` on a file splits it into
lines first) must learn exactly andrea's merges. Runs alternate between
the two libraries so that noise from other processes hits both alike; the figures are
medians over the repeats.
"""

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(HERE)))
TARGET = os.environ.get("CARGO_TARGET_DIR", os.path.join(ROOT, "target", "tok"))
EXAMPLES = os.path.join(TARGET, "release", "examples")


def worker(args):
    """Runs inside a fresh interpreter, so RAYON_NUM_THREADS takes effect."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    if args.worker == "merges":
        tok = Tokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
        trainer = trainers.BpeTrainer(
            vocab_size=1 + 256 + args.merges,
            special_tokens=["<|endoftext|>"],
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
            min_frequency=0,
            show_progress=False,
        )
        with open(args.text, encoding="utf-8", newline="") as f:
            tok.train_from_iterator([f.read()], trainer)
        theirs = [m if isinstance(m, str) else " ".join(m) for m in json.loads(tok.to_str())["model"]["merges"]]
        with open(args.tokenizer, encoding="utf-8") as f:
            ours = json.load(f)["model"]["merges"]
        diff = next((i for i, (a, b) in enumerate(zip(ours, theirs)) if a != b), None)
        print(json.dumps({"ours": len(ours), "theirs": len(theirs), "first_difference": diff}))
        return
    if args.worker == "train":
        tok = Tokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
        tok.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(
            vocab_size=1 + 256 + args.merges,
            special_tokens=["<|endoftext|>"],
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
            min_frequency=0,
            show_progress=False,
        )
        t = time.perf_counter()
        tok.train([args.text], trainer)
        print(json.dumps({"seconds": time.perf_counter() - t, "vocab": tok.get_vocab_size()}))
        return
    tok = Tokenizer.from_file(args.tokenizer)
    with open(args.text, encoding="utf-8", newline="") as f:
        text = f.read()
    parts = text.split("\n\n")
    docs = [p + "\n\n" for p in parts[:-1]] + ([parts[-1]] if parts[-1] else [])
    fn = {"batch": tok.encode_batch, "batch_fast": getattr(tok, "encode_batch_fast", None)}[args.worker]
    if fn is None:
        print(json.dumps({"seconds": None}))
        return
    fn(docs[:200])  # warm up
    t = time.perf_counter()
    encs = fn(docs)
    seconds = time.perf_counter() - t
    ids = [i for e in encs for i in e.ids]
    print(
        json.dumps(
            {
                "seconds": seconds,
                "tokens": len(ids),
                "id_sum": sum(ids),
                "id_sq_sum": sum(map(int.__mul__, ids, ids)),
            }
        )
    )


def local_text(tmp):
    """Real English and code from the machine: /usr/share/doc and the Python stdlib."""
    import glob
    import itertools
    import sysconfig

    skip = (".gz", ".xz", ".bz2", ".png", ".jpg", ".svg", ".html", ".js", ".css", ".pdf")
    docs = sorted(
        f for f in glob.glob("/usr/share/doc/**/*", recursive=True) if os.path.isfile(f) and not f.endswith(skip)
    )
    code = sorted(glob.glob(os.path.join(sysconfig.get_paths()["stdlib"], "**", "*.py"), recursive=True))
    parts, total = [], 0
    for f in itertools.chain.from_iterable(itertools.zip_longest(docs, code)):
        if f is None:
            continue
        try:
            with open(f, encoding="utf-8") as fh:
                t = fh.read()
        except (UnicodeDecodeError, OSError):
            continue
        parts.append(t)
        total += len(t.encode())
        if total > 14_000_000:
            break
    data = "".join(parts).encode()
    data = data[:14_000_000].decode("utf-8", "ignore").encode()
    with open(os.path.join(tmp, "local.txt"), "wb") as fh:
        fh.write(data)
    paths = []
    for name, lo, hi in (("train", 0, 10_000_000), ("encode", 10_000_000, 14_000_000)):
        path = os.path.join(tmp, f"local_{name}.txt")
        with open(path, "wb") as fh:
            fh.write(data[lo:hi].decode("utf-8", "ignore").encode())
        paths.append(path)
    return paths


def run_json(cmd, env=None):
    out = subprocess.run(cmd, check=True, capture_output=True, env=env)
    return json.loads(out.stdout.decode().strip().splitlines()[-1])


def hf(kind, text, tokenizer=None, threads=None, merges=8192):
    env = dict(os.environ)
    if threads:
        env["RAYON_NUM_THREADS"] = str(threads)
    cmd = [sys.executable, __file__, "--worker", kind, "--text", text, "--merges", str(merges)]
    if tokenizer:
        cmd += ["--tokenizer", tokenizer]
    return run_json(cmd, env)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--merges", type=int, default=8192)
    ap.add_argument("--local-text", action="store_true")
    ap.add_argument("--keep", action="store_true", help="keep the temporary folder (texts, vocabulary)")
    ap.add_argument("--train-text")
    ap.add_argument("--encode-text")
    ap.add_argument("--worker")
    ap.add_argument("--text")
    ap.add_argument("--tokenizer")
    args = ap.parse_args()
    if args.worker:
        return worker(args)

    import tokenizers

    env = {**os.environ, "CARGO_TARGET_DIR": TARGET}
    subprocess.run(
        ["cargo", "build", "--release", "-p", "andrea-tokenizer", "--examples"], cwd=ROOT, check=True, env=env
    )
    tool = os.path.join(EXAMPLES, "tokenizer_tool")
    tmp = tempfile.mkdtemp(prefix="andrea-compare-")
    try:
        compare(args, tool, tmp, tokenizers.__version__)
    finally:
        if args.keep:
            print(f"kept {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)


def compare(args, tool, tmp, version):
    train_text = args.train_text
    encode_text = args.encode_text
    if args.local_text:
        train_text, encode_text = local_text(tmp)
    for name, nbytes, seed in [("train", 10_000_000, 1), ("encode", 4_000_000, 2)]:
        if (train_text if name == "train" else encode_text) is None:
            path = os.path.join(tmp, f"{name}.txt")
            with open(path, "wb") as f:
                subprocess.run([os.path.join(EXAMPLES, "mixed_text"), str(nbytes), str(seed)], stdout=f, check=True)
            if name == "train":
                train_text = path
            else:
                encode_text = path
    vocab = os.path.join(tmp, "andrea.json")
    train_mb = os.path.getsize(train_text) / 1e6
    encode_mb = os.path.getsize(encode_text) / 1e6
    print(f"tokenizers {version}; train text {train_mb:.1f} MB, encode text {encode_mb:.1f} MB")

    a_train, h_train = [], []
    for _ in range(args.repeat):
        a_train.append(run_json([tool, "train", "--input", train_text, "--merges", str(args.merges), "--out", vocab])["seconds"])
        h_train.append(hf("train", train_text, merges=args.merges)["seconds"])

    same = hf("merges", train_text, tokenizer=vocab, merges=args.merges)

    rows = []
    for threads in (1, 2):
        a_docs, a_text, h_batch, h_fast = [], [], [], []
        check = None
        for _ in range(args.repeat):
            r = run_json([tool, "encode", "--tokenizer", vocab, "--input", encode_text, "--threads", str(threads), "--repeat", "1", "--docs"])
            a_docs.append(r["median_seconds"])
            a_sum = (r["tokens"], r["id_sum"], r["id_sq_sum"])
            r = run_json([tool, "encode", "--tokenizer", vocab, "--input", encode_text, "--threads", str(threads), "--repeat", "1"])
            a_text.append(r["median_seconds"])
            for kind, acc in (("batch", h_batch), ("batch_fast", h_fast)):
                h = hf(kind, encode_text, tokenizer=vocab, threads=threads)
                if h["seconds"] is None:
                    continue
                acc.append(h["seconds"])
                h_sum = (h["tokens"], h["id_sum"], h["id_sq_sum"])
                if h_sum != a_sum:
                    sys.exit(f"ids differ: andrea {a_sum}, tokenizers {kind} {h_sum}")
                check = h_sum
        med = statistics.median
        hf_best = min(med(h_batch), med(h_fast) if h_fast else float("inf"))
        rows.append((threads, encode_mb / med(a_docs), encode_mb / med(a_text), encode_mb / med(h_batch),
                     encode_mb / med(h_fast) if h_fast else float("nan"), encode_mb / hf_best, check))

    med = statistics.median
    print()
    print(f"Training {args.merges} merges on {train_mb:.1f} MB (2 threads), median of {args.repeat}:")
    print(f"  andrea      {med(a_train):7.2f} s   (runs: {', '.join(f'{x:.2f}' for x in a_train)})")
    print(f"  tokenizers  {med(h_train):7.2f} s   (runs: {', '.join(f'{x:.2f}' for x in h_train)})")
    print(f"  ratio       {med(h_train) / med(a_train):7.1f}x faster")
    if same["first_difference"] is None and same["ours"] == same["theirs"]:
        print(f"  merges: identical to tokenizers' train_from_iterator on the same text ({same['ours']})")
    else:
        print(f"  merges: DIFFER from tokenizers' train_from_iterator: {same}")
    print()
    print(f"Encoding {encode_mb:.1f} MB, same vocabulary, same ids (tokens {rows[0][6][0]}), MB/s, median of {args.repeat}:")
    print("| threads | andrea batch | andrea one text | tokenizers encode_batch | tokenizers encode_batch_fast | ratio (andrea batch / best tokenizers) |")
    print("|---|---|---|---|---|---|")
    for t, ad, at, hb, hfst, hbest, _ in rows:
        print(f"| {t} | {ad:.1f} | {at:.1f} | {hb:.2f} | {hfst:.2f} | {ad / hbest:.1f}x |")


if __name__ == "__main__":
    main()
