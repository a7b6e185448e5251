"""The comment and string lexer (`ampfix/lexemes.py`) against another version of it: the same
masks (`_masked`) and the same `LEXEMES` matches (span and group) on every cached `.py` file and
on fuzzed strings, and the process time of each masking (bench/SPEED.md, thirtieth session).

    git show REV:ampfix/lexemes.py > /tmp/lexemes_old.py
    python bench/lexer_exact.py /tmp/lexemes_old.py [--fuzz 150000] [--trees timm-1.0.31 ...]

Prints the files compared, how many differ (must be 0), the masking time of each version over
all of them, then per tree named with `--trees` (a `bench/.cache/sdist-NAME` folder), and the fuzzed
strings that differ (must be 0).
"""

from __future__ import annotations

import argparse
import glob
import importlib.util
import os
import random
import time

from ampfix import lexemes as new

CACHE = os.path.join(os.path.dirname(os.path.abspath(__file__)), ".cache")


def _matches(lex, text):
    return [(m.span(), m.lastgroup) for m in lex.LEXEMES.finditer(text)]


def _texts(pattern):
    out = []
    for path in glob.glob(pattern, recursive=True):
        with open(path, encoding="utf-8", errors="surrogateescape") as fh:
            out.append(fh.read())
    return out


def _timed(mask, texts):
    start = time.process_time()
    for t in texts:
        mask(t)
    return time.process_time() - start


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("old", help="the other version's lexemes.py")
    ap.add_argument("--fuzz", type=int, default=150000, help="fuzzed strings per alphabet")
    ap.add_argument("--trees", nargs="*", default=["timm-1.0.31", "accelerate-1.15.0", "peft-0.21.2"])
    args = ap.parse_args()
    spec = importlib.util.spec_from_file_location("lexemes_old", args.old)
    old = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(old)  # type: ignore[union-attr]

    texts = _texts(os.path.join(CACHE, "**", "*.py"))
    differ = sum(old._masked(t) != new._masked(t) or _matches(old, t) != _matches(new, t) for t in texts)
    print(f"{len(texts)} cached files, {differ} differ; masking all: old {_timed(old._masked, texts):.2f} s, "
          f"new {_timed(new._masked, texts):.2f} s")
    for tree in args.trees:
        some = _texts(os.path.join(CACHE, f"sdist-{tree}", "**", "*.py"))
        print(f"  {tree}: {len(some)} files, old {_timed(old._masked, some):.3f} s, new {_timed(new._masked, some):.3f} s")

    rng = random.Random(7)
    fuzzed = 0
    for alphabet in ("ab'\"\\#\n\r x", "'\"\\\n#", "a'''\"\"\"\\#\n"):
        for _ in range(args.fuzz):
            s = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 40)))
            fuzzed += old._masked(s) != new._masked(s) or _matches(old, s) != _matches(new, s)
    print(f"{3 * args.fuzz} fuzzed strings, {fuzzed} differ")


if __name__ == "__main__":
    main()
