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
#: starts no complete string (the text is not Python). A string's body is written as runs of
#: plain characters between its escapes (Friedl's unrolled loop, `[^'\\]*(?:\\.[^'\\]*)*`):
#: the same strings as one character or escape at a time, matched about twice as fast.
_SINGLE = r"(?!''')'[^'\\\n]*(?:\\[\s\S][^'\\\n]*)*'"  # a one-line string (three quotes start a
_DOUBLE = r'(?!""")"[^"\\\n]*(?:\\[\s\S][^"\\\n]*)*"'  # triple-quoted one)
LEXEMES = re.compile(
    r"(?P<c>#[^\r\n]*)"
    r"|'''[^'\\]*(?:(?:\\[\s\S]|'(?!''))[^'\\]*)*'''"
    r'|"""[^"\\]*(?:(?:\\[\s\S]|"(?!""))[^"\\]*)*"""'
    rf"|{_SINGLE}|{_DOUBLE}"
    r"|(?P<open>['\"])"
)

#: what masks a comment or a triple-quoted string (`masked`), and a name the project triggers do not
#: read (`ampfix.project.project._AUTOCAST_VALUE`): no trigger string of a rule holds it
#: (tests/test_project_layer.py), so a masked text holds no trigger string its text does not
MASK = "~"
_NOT_LINE_BREAK = re.compile(r"[^\r\n]+")
#: what `masked` passes over in one match: code and one-line strings, up to the next comment or
#: triple-quoted string (or a quote that starts no complete string), which `LEXEMES` then matches
#: as it would there; each one-line string is the match `LEXEMES` makes at its quote
_CODE = re.compile(rf"""(?:[^#'"]+|{_SINGLE}|{_DOUBLE})*""")


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
    end = len(text)
    skip, match = _CODE.match, LEXEMES.match
    while True:
        pos = skip(text, pos).end()  # (one match of `re` over what stays as it is: 2x faster than
        if pos >= end:  # a search for each quote and `#` and a match of each string after it)
            break
        m = match(text, pos)  # (never None: a lone quote is a lexeme, `open`)
        if m.group("c") is None and not text.startswith(('"""', "'''"), pos):
            pos = m.end()  # a quote that starts no string: code
            continue
        out.append(text[at:pos])
        lexeme = m.group(0)
        out.append(_NOT_LINE_BREAK.sub(lambda w: MASK * len(w.group(0)), lexeme)
                   if "\n" in lexeme or "\r" in lexeme else MASK * len(lexeme))
        at = pos = m.end()
    if not out:
        return text
    out.append(text[at:])
    return "".join(out)
