"""`# noqa` directives: reading them (line-level and file-level), adding them (`ampfix check
--add-noqa`) and finding the ones that suppress nothing (rule AMP901).

Line level: `# noqa` (everything) or `# noqa: AMP003, AMP1` (codes or prefixes) in a comment on
the reported line, or on the first or last line of its simple statement.
File level: `# ampfix: noqa` (the whole file is skipped) or `# ampfix: noqa: AMP003, ...` on a
line of its own (those codes are off for the file).
"""

from __future__ import annotations

import io
import re
import tokenize
from dataclasses import dataclass, field
from typing import Dict, Iterable, List, Optional, Sequence, Set, Tuple

from ampfix.lexemes import LEXEMES

CODES = r"[A-Za-z]+[0-9]+(?:[\s,]+[A-Za-z]+[0-9]+)*"
NOQA_RE = re.compile(r"#\s*noqa(?::\s*(?P<codes>" + CODES + r"))?", re.IGNORECASE)
FILE_NOQA_RE = re.compile(r"^#\s*ampfix\s*:\s*noqa(?:\s*:\s*(?P<codes>" + CODES + r"))?\s*$", re.IGNORECASE)
SPLIT_RE = re.compile(r"[\s,]+")


@dataclass
class Comment:
    line: int
    column: int  # 0-based start of the `#`
    text: str
    own_line: bool  # nothing but whitespace before it


def comments(text: str) -> List[Comment]:
    """Every comment of `text` (empty when it does not tokenize)."""
    out: List[Comment] = []
    try:
        for tok in tokenize.generate_tokens(io.StringIO(text).readline):
            if tok.type == tokenize.COMMENT:
                own = not tok.line[: tok.start[1]].strip()
                out.append(Comment(tok.start[0], tok.start[1], tok.string, own))
    except (tokenize.TokenError, SyntaxError, IndentationError):
        return out
    return out


def noqa_comments(text: str) -> List[Comment]:
    """The comments of `text` that hold `noqa` (any case): `comments(text)` filtered, without
    Python's tokenizer (a regular expression that skips the string literals, about 10x faster on
    a large file). A text with a lone carriage return or an unterminated string goes to the
    tokenizer."""
    if "\r" in text and "\r" in text.replace("\r\n", ""):
        return [c for c in comments(text) if "noqa" in c.text.lower()]
    out: List[Comment] = []
    line, pos = 1, 0
    for m in LEXEMES.finditer(text):
        if m.group("open") is not None:
            return [c for c in comments(text) if "noqa" in c.text.lower()]
        body = m.group("c")
        if body is None or "noqa" not in body.lower():
            continue
        start = m.start()
        line += text.count("\n", pos, start)
        pos = start
        line_start = text.rfind("\n", 0, start) + 1
        out.append(Comment(line, start - line_start, body, not text[line_start:start].strip()))
    return out


def _codes(raw: Optional[str]) -> List[str]:
    return [c.upper() for c in SPLIT_RE.split(raw or "") if c]


def noqa_lines(text: str) -> Dict[int, Optional[Set[str]]]:
    """line -> None (bare noqa: everything) or the set of codes named."""
    result: Dict[int, Optional[Set[str]]] = {}
    for c in noqa_comments(text):
        mt = NOQA_RE.search(c.text)
        if not mt:
            continue
        if mt.group("codes") is None:
            result[c.line] = None
        elif c.line not in result or result[c.line] is not None:
            result[c.line] = (result.get(c.line) or set()) | set(_codes(mt.group("codes")))
    return result


def covers(selector: str, code: str) -> bool:
    return code == selector or code.startswith(selector)


def suppressed(noqa: Dict[int, Optional[Set[str]]], code: str, lines: Iterable[int]) -> bool:
    return bool(suppressing(noqa, code, lines))


def suppressing(noqa: Dict[int, Optional[Set[str]]], code: str, lines: Iterable[int]) -> List[Tuple[int, Optional[str]]]:
    """The (line, code named) pairs that silence `code` on these lines (None: a bare noqa)."""
    out: List[Tuple[int, Optional[str]]] = []
    for line in lines:
        if line in noqa:
            codes = noqa[line]
            if codes is None:
                out.append((line, None))
            else:
                out.extend((line, c) for c in codes if covers(c, code))
    return out


@dataclass
class FileExemption:
    everything: bool = False
    codes: Tuple[str, ...] = ()
    lines: Dict[str, int] = field(default_factory=dict)  # code named -> the line of its directive

    def covers(self, code: str) -> bool:
        return self.everything or any(covers(c, code) for c in self.codes)

    def covering(self, code: str) -> List[Tuple[int, Optional[str]]]:
        """The (line, code named) of the file-level directives that turn `code` off (as
        `suppressing` gives them for line directives, for AMP901)."""
        return [(self.lines.get(c, 0), c) for c in self.codes if covers(c, code)]


def file_exemption(text: str) -> FileExemption:
    """`# ampfix: noqa` / `# ampfix: noqa: CODES` on a line of its own."""
    if "ampfix" not in text.lower():
        return FileExemption()
    codes: List[str] = []
    lines: Dict[str, int] = {}
    for c in comments(text):
        if not c.own_line:
            continue
        mt = FILE_NOQA_RE.match(c.text.strip())
        if mt:
            if mt.group("codes") is None:
                return FileExemption(everything=True)
            for code in _codes(mt.group("codes")):
                codes.append(code)
                lines.setdefault(code, c.line)
    return FileExemption(codes=tuple(codes), lines=lines)


# ----------------------------------------------------------------------------- adding


def _line_starts(text: str) -> List[int]:
    starts = [0]
    for line in text.splitlines(keepends=True):
        starts.append(starts[-1] + len(line))
    return starts


def uncommentable_lines(text: str) -> Set[int]:
    """Lines whose end a comment cannot go after: inside a multi-line string, or continued
    with a backslash."""
    bad: Set[int] = set()
    try:
        tokens = list(tokenize.generate_tokens(io.StringIO(text).readline))
    except (tokenize.TokenError, SyntaxError, IndentationError):
        return set(range(1, text.count("\n") + 2))
    fstring_starts: List[int] = []
    for tok in tokens:
        name = tokenize.tok_name.get(tok.type, "")
        if tok.type == tokenize.STRING and tok.end[0] > tok.start[0]:
            bad.update(range(tok.start[0], tok.end[0]))
        elif name == "FSTRING_START":  # Python 3.12+: an f-string is several tokens
            fstring_starts.append(tok.start[0])
        elif name == "FSTRING_END" and fstring_starts:
            start = fstring_starts.pop()
            bad.update(range(start, tok.end[0]))
    for i, line in enumerate(text.splitlines(), 1):
        if line.rstrip("\r\n").endswith("\\"):
            bad.add(i)
    return bad


def add_noqa(text: str, wanted: Sequence[Tuple[str, Sequence[int]]]) -> Tuple[str, int, List[Tuple[str, int]]]:
    """Add `# noqa: CODE` for each (code, lines where a noqa would silence it; preferred first).

    An existing `# noqa: ...` on the chosen line gets the code added to its list; another comment
    gets `  # noqa: CODE` after it. A line that ends inside a string or with a backslash
    continuation is never touched: the next candidate line is used, else the finding is
    returned as not silenced. Returns (new text, directives added, [(code, line) not silenced]).
    """
    bad = uncommentable_lines(text)
    existing = noqa_lines(text)
    by_line: Dict[int, List[str]] = {}
    failed: List[Tuple[str, int]] = []
    for code, lines in wanted:
        if not lines:
            continue
        if suppressed(existing, code, lines) or any(code in by_line.get(ln, ()) for ln in lines):
            continue
        target = next((ln for ln in lines if ln not in bad), None)
        if target is None:
            failed.append((code, lines[0]))
            continue
        by_line.setdefault(target, []).append(code)
    if not by_line:
        return text, 0, failed
    line_comments = {c.line: c for c in comments(text)}
    lines = text.splitlines(keepends=True)
    added = 0
    for ln, codes in by_line.items():
        if ln > len(lines):
            continue
        raw = lines[ln - 1]
        body = raw.rstrip("\r\n")
        newline = raw[len(body):]
        comment = line_comments.get(ln)
        mt = NOQA_RE.search(comment.text) if comment is not None else None
        if comment is not None and mt is not None and mt.group("codes") is not None:
            # merge into the existing list: `# noqa: E501` -> `# noqa: E501, AMP003`
            end = comment.column + mt.end("codes")
            body = body[:end] + "".join(f", {c}" for c in codes) + body[end:]
        else:
            body = body.rstrip() + f"  # noqa: {', '.join(codes)}"
        lines[ln - 1] = body + newline
        added += len(codes)
    return "".join(lines), added, failed


# ----------------------------------------------------------------------------- stale codes


@dataclass
class NoqaDirective:
    line: int
    column: int  # 0-based column of the comment's `#`
    comment: str
    codes: List[str]  # as written, upper-cased; empty for a bare noqa
    span: Tuple[int, int]  # of the `noqa...` match within the comment
    file_level: bool = False  # `# ampfix: noqa: CODES` on a line of its own (those codes off for the file)


def directives(text: str) -> List[NoqaDirective]:
    """The `# noqa: CODES` directives and the file-level `# ampfix: noqa: CODES` ones (each holds
    `noqa`: read from `noqa_comments`, without the tokenizer)."""
    out = []
    for c in noqa_comments(text):
        if c.own_line:
            stripped = c.text.rstrip()
            mt = FILE_NOQA_RE.match(stripped)
            if mt:
                if mt.group("codes") is not None:
                    out.append(NoqaDirective(c.line, c.column, c.text, _codes(mt.group("codes")), mt.span(),
                                             file_level=True))
                continue
        mt = NOQA_RE.search(c.text)
        if mt and mt.group("codes") is not None:
            out.append(NoqaDirective(c.line, c.column, c.text, _codes(mt.group("codes")), mt.span()))
    return out


def without_codes(d: NoqaDirective, stale: Set[str]) -> Optional[str]:
    """The comment with the stale codes taken out of its noqa list; None when nothing of the
    comment is left (remove it)."""
    keep = [c for c in d.codes if c not in stale]
    start, end = d.span
    before, after = d.comment[:start], d.comment[end:]
    if keep:
        raw = d.comment[start:end]
        mt = (FILE_NOQA_RE if d.file_level else NOQA_RE).match(raw)
        head = raw[: mt.start("codes")]  # type: ignore[union-attr]
        return before + head + ", ".join(keep) + after
    if d.file_level:
        return None
    rest = after.strip()
    prefix = before.rstrip()
    if prefix in ("", "#"):
        return f"# {rest.lstrip('#').strip()}" if rest.lstrip("#").strip() else None
    return prefix + (f" {rest}" if rest else "")
