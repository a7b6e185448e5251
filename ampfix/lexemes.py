"""The comments and string literals of Python source, found by one regular expression (no
tokenizer): shared by the `# noqa` reader (`ampfix.engine.noqa`) and the summaries, which look
for a node's code in the text (`ampfix.model.summarize`). This module imports nothing heavy, so
the engine's cheap paths stay cheap."""

from __future__ import annotations

import re

#: a comment, or a string literal (skipped: a `#` or a quote in it is text). Outside strings and
#: comments, `#` starts a comment and a quote a string; inside one, a backslash escapes the next
#: character (in raw strings too, as far as where the string ends goes); Python 3.11's f-strings
#: are strings here as for its tokenizer. Group `c`: a comment; group `open`: a quote that
#: starts no complete string (the text is not Python).
LEXEMES = re.compile(
    r"(?P<c>#[^\r\n]*)"
    r"|'''(?:[^'\\]|\\[\s\S]|'(?!''))*'''"
    r'|"""(?:[^"\\]|\\[\s\S]|"(?!""))*"""'
    r"|(?!''')'(?:[^'\\\n]|\\[\s\S])*'"  # three quotes start a triple-quoted string
    r'|(?!""")"(?:[^"\\\n]|\\[\s\S])*"'
    r"|(?P<open>['\"])"
)
