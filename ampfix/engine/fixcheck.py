"""What a pass of fixes must not do, checked on its result before it is kept.

The fix loop (`ampfix.engine.analyze.fix_text`) applies the fixes of a pass, re-parses and
re-analyses the new text, and asks here what went wrong:

* `introduced`: findings of the new text that were not in the old one (matched by code and
  position through the line diff, then by code, message and source line for code that moved);
* `unsafe_reads`: code the fixes added or moved that reads a name not assigned on every path to
  it, or calls a method on something that may be None there (`ampfix.model.bound`); reads the
  replaced code made anyway do not count;
* `comment_troubles`: a comment lost, copied, or moved off the code line it was on.

Each trouble names the place in the old text (through the line diff) so the engine can tell
which fix caused it; the fix is refused and its finding stays reported with the reason.
"""

from __future__ import annotations

import difflib
import io
import re
import tokenize
from collections import Counter
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Set, Tuple

import libcst as cst

from ampfix.engine.results import Diagnostic
from ampfix.model.bound import NONE, UNBOUND, head_expressions as _head_expressions, uses as _uses

Opcodes = List[Tuple[str, int, int, int, int]]
_DIGITS = re.compile(r"\d+")
_NOQA = re.compile(r"#\s*(?:ampfix:\s*)?noqa", re.IGNORECASE)  # `# noqa`, `# ampfix: noqa`
_CELL_MARKER = re.compile(r"^# ampfix-cell: \d+$")  # the notebook layer's own (it checks them itself)


@dataclass
class Trouble:
    old_lines: Tuple[int, int]  # the old text's lines (1-based, inclusive) the trouble comes from
    reason: str
    new_line: Optional[int] = None


def opcodes(old: str, new: str) -> Opcodes:
    return difflib.SequenceMatcher(None, old.split("\n"), new.split("\n"), autojunk=False).get_opcodes()


def old_range(ops: Opcodes, new_line: int) -> Tuple[int, int]:
    """The old lines (1-based, inclusive) that new line `new_line` comes from: itself when it
    is unchanged, else the changed block around it (the lines on both sides for an insertion)."""
    for tag, i1, i2, j1, j2 in ops:
        if j1 < new_line <= j2 or (tag == "delete" and j1 == new_line - 1):
            if tag == "equal":
                line = i1 + new_line - j1
                return line, line
            return max(1, i1), max(i1 + 1, i2 + 1 if tag != "insert" else i1 + 1)
    return 1, 1 << 30


def changed_new_lines(ops: Opcodes) -> Set[int]:
    return {n for tag, _, _, j1, j2 in ops if tag != "equal" for n in range(j1 + 1, j2 + 1)}


def _mapped(ops: Opcodes, new_line: int) -> Optional[int]:
    for tag, i1, _, j1, j2 in ops:
        if tag == "equal" and j1 < new_line <= j2:
            return i1 + new_line - j1
    return None


def _norm(message: str) -> str:
    return _DIGITS.sub("#", message)


# ----------------------------------------------------------------------------- findings


def match(old: Sequence[Diagnostic], old_text: str, new: Sequence[Diagnostic], new_text: str,
          ops: Opcodes) -> Dict[int, int]:
    """new index -> old index for the findings that are the same finding after the edit."""
    old_lines, new_lines = old_text.split("\n"), new_text.split("\n")

    def src(lines: List[str], d: Diagnostic) -> str:
        return lines[d.line - 1].strip() if 0 < d.line <= len(lines) else ""

    free = set(range(len(old)))
    out: Dict[int, int] = {}

    def take(i: int, pred) -> None:
        for j in sorted(free):
            if pred(old[j]):
                out[i] = j
                free.discard(j)
                return

    for i, d in enumerate(new):  # the same place
        line = _mapped(ops, d.line)
        if line is not None:
            take(i, lambda e, d=d, line=line: e.code == d.code and e.line == line and e.column == d.column)
    for i, d in enumerate(new):  # the same code line, what it says unchanged (a moved statement)
        if i not in out:
            take(i, lambda e, d=d: e.code == d.code and _norm(e.message) == _norm(d.message)
                 and src(old_lines, e) == src(new_lines, d))
    for i, d in enumerate(new):  # in the block the fixes changed
        if i not in out:
            lo, hi = old_range(ops, d.line)
            take(i, lambda e, d=d, lo=lo, hi=hi: e.code == d.code and lo <= e.line <= hi)
    for i, d in enumerate(new):  # what it says unchanged, elsewhere
        if i not in out:
            take(i, lambda e, d=d: e.code == d.code and _norm(e.message) == _norm(d.message))
    return out


# ----------------------------------------------------------------------------- reads


def unsafe_reads(old_model, new_model, ops: Opcodes) -> List[Trouble]:
    """Statements of the new text on changed lines that read a name the old code there did not,
    where it may be unassigned, or dereference (a method call, an attribute, an item) something
    the old code did not, where it may be None."""
    changed = changed_new_lines(ops)
    if not changed:
        return []
    old_uses: Dict[Tuple[int, int], Tuple[Set[str], Set[str]]] = {}

    def uses_in(model, nodes) -> Tuple[Set[str], Set[str]]:
        reads: List[str] = []
        derefs: List[str] = []
        for n in nodes:
            for e in _head_expressions(n):
                _uses(e, reads, derefs, unconditional=False)
        return set(reads), set(derefs)

    old_stmts = _statements_by_line(old_model)
    new_stmts = _statements_by_line(new_model)
    created = _created_attributes(old_model, new_model)
    out: List[Trouble] = []
    for line in sorted(changed):
        for stmt in new_stmts.get(line, []):
            if new_model.block_of(stmt) is None:
                continue
            lo, hi = old_range(ops, line)
            if (lo, hi) not in old_uses:
                old_uses[(lo, hi)] = uses_in(old_model, [s for ln in range(lo, hi + 1) for s in old_stmts.get(ln, [])])
            old_reads, old_derefs = old_uses[(lo, hi)]
            reads, derefs = uses_in(new_model, [stmt])
            new_reads = reads - old_reads - old_derefs
            new_derefs = derefs - old_derefs
            if not new_reads and not new_derefs:
                continue
            problem = _check(new_model, stmt, new_reads, new_derefs, created, changed)
            if problem is not None:
                out.append(Trouble((lo, hi), problem, line))
    return out


def _check(model, stmt, reads: Set[str], derefs: Set[str], created: Set[str], changed: Set[int]) -> Optional[str]:
    for p in model.bound.head_problems(stmt, lambda s: model.line(s) in changed):
        if p.kind == NONE and p.key in derefs or p.kind == UNBOUND and p.key in reads | derefs and p.key not in created:
            kind = "may be None" if p.kind == NONE else "may not be assigned"
            return f"the fix makes line {model.line(stmt)} use `{p.key}`, which {kind} there"
    return None


def _statements_by_line(model) -> Dict[int, List[cst.CSTNode]]:
    out: Dict[int, List[cst.CSTNode]] = {}
    for stmt in model.nodes_of(cst.SimpleStatementLine, cst.If, cst.For, cst.While, cst.With, cst.Try,
                               cst.FunctionDef, cst.ClassDef):
        try:
            line = model.line(stmt)
        except KeyError:  # pragma: no cover - every node of the tree has a position
            continue
        out.setdefault(line, []).append(stmt)
    return out


def _created_attributes(old_model, new_model) -> Set[str]:
    """`self.x` attributes the new text assigns and the old did not: the fix that creates one
    (a scaler in place of apex's `amp.initialize`) is responsible for where it lives."""
    def assigned(model) -> Set[str]:
        return {k for k in model.assignments if k.startswith("self.") and k.count(".") == 1}
    return assigned(new_model) - assigned(old_model)


# ----------------------------------------------------------------------------- comments


def _comments(text: str) -> List[Tuple[int, str, str]]:
    """(line, code on that line before the comment, comment) for every comment."""
    out = []
    lines = text.split("\n")
    try:
        for tok in tokenize.generate_tokens(io.StringIO(text).readline):
            if tok.type == tokenize.COMMENT and not _CELL_MARKER.match(tok.string):
                line = tok.start[0]
                code = lines[line - 1][: tok.start[1]].strip() if line <= len(lines) else ""
                out.append((line, code, tok.string.rstrip()))
    except (tokenize.TokenError, IndentationError, SyntaxError):  # pragma: no cover - the text parsed
        return []
    return out


def comment_troubles(old_text: str, new_text: str, ops: Opcodes) -> List[Trouble]:
    """A comment of the old text that the new text lost (`# noqa` directives excepted: AMP901
    removes stale ones), has twice where it had it once, or carries on another code line while
    the code line it was on is still there without it."""
    old, new = _comments(old_text), _comments(new_text)
    old_count = Counter(c for _, _, c in old)
    new_count = Counter(c for _, _, c in new)
    out: List[Trouble] = []
    where: Dict[str, int] = {}
    for line, _, c in old:
        where.setdefault(c, line)
    for c, n in old_count.items():
        if new_count[c] < n and not _NOQA.search(c):
            out.append(Trouble((where[c], where[c]), f"the fix would remove the comment `{c}`"))
        elif new_count[c] > n:
            line = next(ln for ln, _, c2 in new if c2 == c)
            out.append(Trouble(old_range(ops, line), f"the fix would copy the comment `{c}` to another line", line))
    new_lines = new_text.split("\n")
    new_comment_at = {ln: (code, c) for ln, code, c in new}
    for line, code, c in old:
        if not code:
            continue
        hunk = next(((j1, j2) for tag, i1, i2, j1, j2 in ops if tag != "equal" and i1 < line <= i2), None)
        if hunk is None:
            continue  # its line is unchanged
        # the code line is still in the changed block, without the comment, and the comment is
        # on another code line: it moved off its line
        left_behind = any(
            _code_part(new_lines[j], new_comment_at.get(j + 1)) == code and new_comment_at.get(j + 1, ("", ""))[1] != c
            for j in range(hunk[0], hunk[1]))
        if left_behind and any(c2 == c and code2 != code for _, code2, c2 in new):
            out.append(Trouble((line, line), f"the fix would move the comment `{c}` off the line `{code}`"))
    return out


def _code_part(line: str, comment: Optional[Tuple[str, str]]) -> str:
    return comment[0] if comment is not None else line.strip()


__all__ = ["Trouble", "opcodes", "old_range", "match", "unsafe_reads", "comment_troubles"]
