"""Incremental re-parse for the language server: an edit inside one statement re-parses that
statement only and splices it into the previous tree.

`Reparser.parse(text, path)` gives the same `cst.Module` as `analyze.parse(text, path)` would
(same nodes, same whitespace ownership, same code), re-using the previous version's tree when the
edit lies inside one statement S of a block reached through `class`/`def` bodies:

* the changed region (common prefix and suffix of the two texts) starts after S's first token
  (its first decorator or keyword) and ends inside S's old code, so the empty lines before S and
  their split between the previous statement's block footers and S's leading lines are as before;
* S's new code (the old code with the edit) is parsed inside a scaffold of `if 1:` headers at the
  absolute indentation of each enclosing block, with the module's parser configuration (default
  indentation and newline, Python version), and must come out as one or more statements whose
  code, generated at S's place, is the new text of that place byte for byte (the scaffold's blocks
  and module own nothing else: no header, no footer); between two of them, the split of the empty
  lines is made in the same block, at the same indentation, as a full parse makes it;
* the trailing empty lines of the last of them (the footers of its last nested blocks) are the
  same text as S's were, and the absolute indentations of those blocks are the same: LibCST gives
  a block's footer the lines up to the last one indented at the block's level, so the lines after
  S's place are split as before.

The new module is the old one with the ancestors of S copied (`with_changes`); since code
generation is compositional, its code is the old text with S's old code replaced by its new code,
i.e. the new text. Anything else (an edit across statements, on a statement's first token, at
module level between statements, a text `guard` finds risky, an error) is a full parse. A text
that does not parse keeps the last good version as the base for the next edit.
"""

from __future__ import annotations

from typing import Dict, List, Optional, Sequence, Tuple

import libcst as cst
from libcst._nodes.internal import CodegenState

from ampfix.engine import guard
from ampfix.model.parsing import parse_module

#: statements whose body the re-parse descends into (their body is their last child)
_DESCEND = (cst.FunctionDef, cst.ClassDef)
_CHUNK = 4096
#: code lengths kept (each holds its statement): the statements an edit replaced stay in the table
#: until it is cleared, which costs the next edit the lengths again (one code generation)
MAX_LENGTHS = 5000


def common_prefix(a: str, b: str) -> int:
    n = min(len(a), len(b))
    k = 0
    while k + _CHUNK <= n and a[k:k + _CHUNK] == b[k:k + _CHUNK]:
        k += _CHUNK
    while k < n and a[k] == b[k]:
        k += 1
    return k


def common_suffix(a: str, b: str, limit: int) -> int:
    """The length of the common suffix of `a` and `b`, at most `limit` (<= both lengths)."""
    la, lb = len(a), len(b)
    k = 0
    while k + _CHUNK <= limit and a[la - k - _CHUNK:la - k] == b[lb - k - _CHUNK:lb - k]:
        k += _CHUNK
    while k < limit and a[la - k - 1] == b[lb - k - 1]:
        k += 1
    return k


def _is_empty_line(line: str) -> bool:
    s = line.strip()
    return not s or s.startswith("#")


def _first_token(text: str, start: int, end: int) -> int:
    """The offset of the first non-blank character of the first line in text[start:end] that is
    neither blank nor a comment."""
    i = start
    while i < end:
        j = text.find("\n", i, end)
        j = end if j < 0 else j + 1
        line = text[i:j]
        if not _is_empty_line(line):
            return i + len(line) - len(line.lstrip())
        i = j
    return end


def _tail(code: str) -> str:
    """The trailing lines of `code` that are blank or comments only (the footers of its blocks)."""
    lines = code.splitlines(keepends=True)
    n = len(lines)
    while n and _is_empty_line(lines[n - 1]):
        n -= 1
    return "".join(lines[n:])


def _last_part(node: cst.CSTNode) -> Optional[cst.CSTNode]:
    """What a compound statement's code ends with: its last block, or the clause holding it."""
    if isinstance(node, (cst.FunctionDef, cst.ClassDef, cst.With, cst.Else, cst.Finally, cst.ExceptHandler,
                         cst.ExceptStarHandler)):
        return node.body
    if isinstance(node, (cst.If, cst.For, cst.While)):
        return node.orelse if node.orelse is not None else node.body
    if isinstance(node, (cst.Try, cst.TryStar)):
        if node.finalbody is not None:
            return node.finalbody
        if node.orelse is not None:
            return node.orelse
        return node.handlers[-1] if node.handlers else node.body
    return None  # match statements and anything newer: not spliced


class Reparser:
    """The last parsed version of one document, and the code lengths of its statements (by node
    identity: a node not on the path of an edit is shared by the next version)."""

    def __init__(self) -> None:
        self.text: Optional[str] = None
        self.module: Optional[cst.Module] = None
        self._lens: Dict[int, Tuple[cst.CSTNode, int]] = {}
        self.stats = {"full": 0, "spliced": 0, "fallback": 0}

    # ------------------------------------------------------------------ entry point

    def parse(self, text: str, path: str) -> cst.Module:
        from ampfix.engine.analyze import parse  # (analyze imports nothing from here)

        if self.module is not None and self.text is not None:
            if text == self.text:
                return self.module
            module = None
            if not (not guard.UNGUARDED and guard.risky(text)):
                try:
                    module = self.splice(text)
                except (Exception, RecursionError):  # an odd fragment: the full parse decides
                    module = None
            if module is not None:
                self.stats["spliced"] += 1
                if len(self._lens) > MAX_LENGTHS:  # old versions' statements kept alive: start over
                    self._lens.clear()
                self.text, self.module = text, module
                return module
            self.stats["fallback"] += 1
        module = parse(text, path)  # InputError: the last good version stays the base
        self.stats["full"] += 1
        self.text, self.module = text, module
        self._lens.clear()
        return module

    # ------------------------------------------------------------------ lengths

    def _state(self, indents: Sequence[str]) -> CodegenState:
        assert self.module is not None
        st = CodegenState(default_indent=self.module.default_indent, default_newline=self.module.default_newline)
        st.indent_tokens = list(indents)
        return st

    def _code(self, nodes: Sequence[cst.CSTNode], indents: Sequence[str]) -> str:
        st = self._state(indents)
        for n in nodes:
            n._codegen(st)
        return "".join(st.tokens)

    def _len(self, node: cst.CSTNode, indents: Sequence[str]) -> int:
        hit = self._lens.get(id(node))
        if hit is not None and hit[0] is node:
            return hit[1]
        n = len(self._code([node], indents))
        self._lens[id(node)] = (node, n)
        return n

    def prepare(self) -> None:
        """Compute the code lengths of the top-level statements and of the statements in class
        bodies (what the first edit needs; the server does it while the document rests)."""
        if self.module is None:
            return
        for st in self.module.body:
            self._len(st, [])
            if isinstance(st, cst.ClassDef) and isinstance(st.body, cst.IndentedBlock):
                ind = [st.body.indent if st.body.indent is not None else self.module.default_indent]
                for inner in st.body.body:
                    self._len(inner, ind)

    def top_shifts(self, module: cst.Module) -> Optional[Dict[int, int]]:
        """id() of each top-level statement of `module` (the last parsed) -> the number of lines
        before its code (leading lines included), from the statements' code lengths; None when
        they are not all known (the model then asks CPython's parser)."""
        if module is not self.module or self.text is None:
            return None
        out: Dict[int, int] = {}
        off = len(self._code(module.header, []))
        line, pos = 0, 0
        for st in module.body:
            hit = self._lens.get(id(st))
            if hit is None or hit[0] is not st:
                return None
            line += self.text.count("\n", pos, off)
            pos = off
            out[id(st)] = line
            off += hit[1]
        return out

    # ------------------------------------------------------------------ the splice

    def _chain(self, node: cst.CSTNode, indents: List[str]) -> Optional[List[str]]:
        """The absolute indentation of each block that ends where `node` ends (their footers own
        the lines after its last token); None for a statement this does not know."""
        out: List[str] = []
        assert self.module is not None
        while True:
            if isinstance(node, cst.SimpleStatementLine):
                return out
            last = _last_part(node)
            if last is None:
                return None
            if not isinstance(last, cst.BaseSuite):
                node = last  # elif / else / except / finally: the block ending the statement is theirs
                continue
            if isinstance(last, cst.SimpleStatementSuite):
                return out
            if not isinstance(last, cst.IndentedBlock) or not last.body:
                return None
            indents = indents + [last.indent if last.indent is not None else self.module.default_indent]
            out.append("".join(indents))
            node = last.body[-1]

    def splice(self, new: str) -> Optional[cst.Module]:
        old, module = self.text, self.module
        assert old is not None and module is not None
        p = common_prefix(old, new)
        s = common_suffix(old, new, min(len(old), len(new)) - p)
        e_old = len(old) - s
        delta = len(new) - len(old)
        # descend: (block's statements, index, start offset, length, indent tokens, path)
        candidates = []
        path: List[Tuple[cst.CSTNode, int]] = []  # (statement containing the region, its index)
        stmts: Sequence[cst.BaseStatement] = module.body
        start = len(self._code(module.header, []))
        indents: List[str] = []
        while True:
            a = start
            found = None
            for i, st in enumerate(stmts):
                n = self._len(st, indents)
                if a <= p and e_old <= a + n:
                    found = (i, st, a, n)
                    break
                a += n
                if a > p:
                    break
            if found is None:
                break
            i, st, a, n = found
            if not path and i == len(stmts) - 1 and not module.has_trailing_newline:
                break  # the module's code drops the last statement's newline
            path = path + [(st, i)]
            if _first_token(old, a, a + n) < p:
                candidates.append((list(path), a, n, list(indents)))
            if not isinstance(st, _DESCEND) or not isinstance(st.body, cst.IndentedBlock) or not st.body.body:
                break
            blk = st.body
            inner = indents + [blk.indent if blk.indent is not None else module.default_indent]
            blk_len = (len(self._code([blk.header], inner)) + sum(self._len(x, inner) for x in blk.body)
                       + len(self._code(blk.footer, inner)))
            start = a + n - blk_len + len(self._code([blk.header], inner))
            stmts, indents = blk.body, inner
        for cpath, a, n, ind in reversed(candidates):  # the innermost first
            if n > len(old) // 2:
                break  # as costly as a full parse
            done = self._try(new, cpath, a, n, ind, delta)
            if done is not None:
                return done
        return None

    def _try(self, new: str, path: List[Tuple[cst.CSTNode, int]], a: int, n: int, indents: List[str],
             delta: int) -> Optional[cst.Module]:
        old, module = self.text, self.module
        assert old is not None and module is not None
        fragment = new[a:a + n + delta]
        old_fragment = old[a:a + n]
        nl = module.default_newline
        if not fragment.endswith(("\n", "\r")) or _tail(fragment) != _tail(old_fragment):
            return None
        abs_indents = ["".join(indents[:k]) for k in range(len(indents))]
        scaffold = "".join(f"{ind}if 1:{nl}" for ind in abs_indents) + fragment
        small = parse_module(scaffold, config=module.config_for_parsing)
        if small.header or small.footer or not small.has_trailing_newline:
            return None
        node: cst.CSTNode = small
        for _ in abs_indents:
            body = node.body  # type: ignore[attr-defined]
            if len(body) != 1 or not isinstance(body[0], cst.If) or body[0].orelse is not None:
                return None
            blk = body[0].body
            if not isinstance(blk, cst.IndentedBlock) or blk.footer:
                return None
            node = blk
        new_sts = list(node.body)  # type: ignore[attr-defined]  # S, or what the edit made of it
        if not new_sts:
            return None
        old_st = path[-1][0]
        if self._code(new_sts, indents) != fragment:
            return None
        chain_old, chain_new = self._chain(old_st, indents), self._chain(new_sts[-1], indents)
        if chain_old is None or chain_old != chain_new:
            return None
        # path copying: each ancestor with the new statements in place of the old one
        for st in new_sts:
            self._len(st, indents)
        replaced: List[cst.CSTNode] = new_sts
        for k in range(len(path) - 1, 0, -1):
            parent, _ = path[k - 1]
            i = path[k][1]
            blk = parent.body  # type: ignore[attr-defined]
            stmts = list(blk.body)
            stmts[i:i + 1] = replaced
            parent_new = parent.with_changes(body=blk.with_changes(body=type(blk.body)(stmts)
                                                                    if isinstance(blk.body, tuple) else stmts))
            old_len = self._lens.get(id(parent))
            if old_len is not None and old_len[0] is parent:
                self._lens[id(parent_new)] = (parent_new, old_len[1] + delta)
            replaced = [parent_new]
        top = list(module.body)
        top[path[0][1]:path[0][1] + 1] = replaced
        for st, _ in path:
            self._lens.pop(id(st), None)
        return module.with_changes(body=type(module.body)(top) if isinstance(module.body, tuple) else top)
