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

#: what masks a comment or a triple-quoted string (`masked`), and a name the project triggers do not
#: read (`ampfix.project.project._AUTOCAST_VALUE`): no trigger string of a rule holds it
#: (tests/test_project_layer.py), so a masked text holds no trigger string its text does not
MASK = "~"
_NOT_LINE_BREAK = re.compile(r"[^\r\n]+")
_LEXEME_START = re.compile(r"[#'\"]")


#: the texts masked so far, and their masks (`masked`): the engine's trigger tests and the
#: project's read the same files, and the workers of a pool are forks that inherit what the
#: parent's prefilter masked. Emptied past `_MEMO_CHARS` characters of text.
_MEMO: "dict[str, str]" = {}
_MEMO_CHARS = 32 * 1024 * 1024
_memo_size = 0


def masked(text: str) -> str:
    """`text` with each character of its comments and triple-quoted strings (docstrings) but
    line breaks replaced by `MASK`: the same offsets (a definition's span reads a masked module
    as it reads its text), the same lines, and no string the text does not hold. Lexed from the
    start of the text, so a quote inside another string or a comment is not taken for one. What
    the rules' trigger tests read of code (`ampfix.engine.analyze._Tests`, the project's
    `trigger_view`). Memoised per text (`_MEMO`)."""
    global _memo_size
    hit = _MEMO.get(text)
    if hit is None:
        hit = _masked(text)
        if _memo_size + len(text) > _MEMO_CHARS:
            _MEMO.clear()
            _memo_size = 0
        _MEMO[text] = hit
        _memo_size += len(text)
    return hit


def _masked(text: str) -> str:
    """The lexing of `masked`."""
    if "#" not in text and '"""' not in text and "'''" not in text:
        return text
    out = []
    at = pos = 0
    search, match = _LEXEME_START.search, LEXEMES.match
    while True:  # (a lexeme starts at one of its first characters: searched for, then matched, 2x
        start = search(text, pos)  # faster than `LEXEMES.finditer`, which tries every offset)
        if start is None:
            break
        m = match(text, start.start())
        if m is None:  # (never: a lone quote is a lexeme, `open`)
            pos = start.start() + 1
            continue
        pos = m.end()
        if m.group("c") is None and not text.startswith(('"""', "'''"), m.start()):
            continue  # a one-line string: code reads it (`getattr(torch, "autocast")`)
        out.append(text[at:m.start()])
        lexeme = m.group(0)
        out.append(_NOT_LINE_BREAK.sub(lambda w: MASK * len(w.group(0)), lexeme)
                   if "\n" in lexeme or "\r" in lexeme else MASK * len(lexeme))
        at = pos
    if not out:
        return text
    out.append(text[at:])
    return "".join(out)
