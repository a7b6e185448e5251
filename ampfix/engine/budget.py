"""What analysing one file will cost, known before it is parsed, and the bound on it.

The analysis is linear in the file, but its memory is set by LibCST's tree: every token becomes
a node with its whitespace, ~3 KB per token at the parse's peak when the statements are short
(200 KB of `a1 = 1` lines: 120k tokens, +353 MiB), ~1.3-3 KB in ordinary code. A size limit in
bytes does not bound that: 4 MiB of short statements is ~8 GB. So the tokens are counted first
(one C-speed regex pass, a string literal or a comment counting as one token, as for Python's
tokenizer; only for files large enough to be over the bound at all), and a file whose estimate
is over the bound (`max-file-memory`, default 1 GiB per
file, which is per worker: a worker analyses one file at a time) is skipped and reported, as a
file over `max-file-size` is.
"""

from __future__ import annotations

import re

DEFAULT_MAX_FILE_MEMORY = 1024 ** 3
BYTES_PER_TOKEN = 3328  # the peak per token with short statements (3.0-3.1 KiB measured), and a margin
BYTES_PER_BYTE = 32  # the text itself, in its several copies (large string literals)

_TOKEN = re.compile(r"""
    [rRbBuUfF]{0,2}(?:
        '''(?:[^'\\]|\\[\s\S]|'(?!''))*'''
      | \"\"\"(?:[^"\\]|\\[\s\S]|"(?!""))*\"\"\"
      | '(?:[^'\\\n]|\\[\s\S])*'
      | "(?:[^"\\\n]|\\[\s\S])*"
    )
  | \#[^\n]*
  | \w+
  | [^\w\s]
""", re.VERBOSE)


def tokens(text: str) -> int:
    """About the number of Python tokens in `text` (a string or a comment is one)."""
    return _TOKEN.subn("", text)[1]


def estimate(text: str) -> int:
    """Bytes the analysis of `text` takes at its peak, about (an upper estimate)."""
    return tokens(text) * BYTES_PER_TOKEN + len(text) * BYTES_PER_BYTE
