"""Nested edits of one file, resolved into the non-overlapping replacements fixes are made of.

A migration that restructures code (an `if` simplified to its body while a statement inside it
is rewritten too) registers edits on any nodes, nested or not: an edit is a function of the
node *with the edits inside it already applied*. `resolve` runs them in one pass and returns
the outermost edited nodes with their new code, each with the owner that registered it (and
the owners whose edits ended up inside another owner's node), so each finding's `Fix` can
carry its own replacements and never overlap another's.
"""

from __future__ import annotations

from typing import Callable, Dict, Hashable, List, Sequence, Tuple

import libcst as cst

from ampfix.fixes.edits import _comment_lines, _lost_comments, keep_comments

# an edit maps the statement (or node) as rewritten so far to what replaces it: a node, a list
# of statements (empty: removed)
Edit = Callable[[cst.CSTNode], object]


class Rewrites:
    def __init__(self, model) -> None:
        self.model = model
        self.edits: Dict[cst.CSTNode, List[Tuple[Hashable, Edit]]] = {}

    def add(self, owner: Hashable, node: cst.CSTNode, edit: Edit) -> None:
        self.edits.setdefault(node, []).append((owner, edit))

    def claimed(self, node: cst.CSTNode) -> bool:
        return node in self.edits

    # ---------------------------------------------------------------- common edits
    def replace(self, owner: Hashable, stmt: cst.CSTNode, new: Sequence[cst.CSTNode]) -> None:
        """`stmt` becomes the statements `new` (the first takes its comment and blank lines; a
        comment on its line stays on the line that replaces it, any other comment of it that
        the new statements do not carry becomes a comment line before them)."""
        def edit(cur, new=list(new)):
            if isinstance(cur, list) and len(cur) == 1:
                cur = cur[0]  # an earlier edit of the statement gave it comment lines (`remove` of the one before)
            out = list(new)
            if out and hasattr(cur, "leading_lines"):
                out[0] = out[0].with_changes(leading_lines=cur.leading_lines)
            return keep_comments(cur, out)
        self.add(owner, stmt, edit)

    def remove(self, owner: Hashable, stmt: cst.CSTNode) -> None:
        """Remove `stmt`; its comments (comment lines, a trailing one, those inside a compound
        statement) go to the next statement of its block, or stay behind a `pass` when it is the
        last one (as `edits.remove_statement`)."""
        self.add(owner, stmt, lambda cur: [])
        lines = [ln for ln in getattr(stmt, "leading_lines", ()) if ln.comment is not None]
        lines += _comment_lines(_lost_comments(stmt, lines))
        if not lines:
            return
        block = self.model.block_of(stmt)
        body = list(block.body) if block is not None else []
        index = next((i for i, s in enumerate(body) if s is stmt), None)
        if index is not None and index + 1 < len(body):
            def keep(cur, lines=lines):
                seq = cur if isinstance(cur, list) else [cur]
                if not seq:
                    return seq
                first = seq[0]
                return [first.with_changes(leading_lines=[*lines, *first.leading_lines]), *seq[1:]]
            self.add(owner, body[index + 1], keep)

    def insert_before(self, owner: Hashable, stmt: cst.CSTNode, new: Sequence[cst.CSTNode]) -> None:
        def edit(cur, new=list(new), lead=getattr(stmt, "leading_lines", ())):
            seq = cur if isinstance(cur, list) else [cur]
            if not seq:  # the statement went: the new ones take its comment and blank lines
                return [new[0].with_changes(leading_lines=lead), *new[1:]]
            first = seq[0]
            lead = first.leading_lines
            return [new[0].with_changes(leading_lines=lead), *new[1:], first.with_changes(leading_lines=()), *seq[1:]]
        self.add(owner, stmt, edit)

    def insert_after(self, owner: Hashable, stmt: cst.CSTNode, new: Sequence[cst.CSTNode]) -> None:
        def edit(cur, new=list(new)):
            seq = cur if isinstance(cur, list) else [cur]
            return [*seq, *[n.with_changes(leading_lines=()) for n in new]]
        self.add(owner, stmt, edit)

    # ---------------------------------------------------------------- resolution
    def resolve(self) -> Tuple[Dict[Hashable, Dict[cst.CSTNode, object]], Dict[Hashable, Hashable]]:
        """({owner: {original node: replacement}}, {absorbed owner: owner of the node it is in})."""
        edits = self.edits
        results: Dict[cst.CSTNode, object] = {}
        owners: Dict[cst.CSTNode, Hashable] = {}
        forced: Dict[cst.CSTNode, Hashable] = {}
        model = self.model

        class Apply(cst.CSTTransformer):
            def on_leave(self, original, updated):  # type: ignore[override]
                if isinstance(updated, cst.IndentedBlock) and not updated.body and original.body:
                    updated = updated.with_changes(body=[cst.SimpleStatementLine(body=[cst.Pass()])])
                    parent = model.parent(original)
                    first = next((o for o, _ in _first_edit_under(edits, model, original)), None)
                    if parent is not None and parent not in edits:
                        forced[parent] = first
                if original in edits:
                    cur: object = updated
                    for _, edit in edits[original]:
                        cur = edit(cur)
                    results[original] = cur
                    owners[original] = edits[original][0][0]
                    return _as_replacement(cur)
                if original in forced:
                    results[original] = updated
                    owners[original] = forced[original]
                return updated

        self.model.module.visit(Apply())
        top = [n for n in results if not any(a in results for a in model.ancestors(n))]
        per_owner: Dict[Hashable, Dict[cst.CSTNode, object]] = {}
        for n in top:
            result = results[n]
            if isinstance(n, cst.BaseStatement):
                # a comment the edits inside dropped (a statement removed with the `if` that held
                # it) stays, as a comment line before what replaces the outermost edited statement
                seq = result if isinstance(result, list) else [result]
                if seq and all(isinstance(x, cst.BaseStatement) for x in seq):
                    result = keep_comments(n, list(seq))
            per_owner.setdefault(owners[n], {})[n] = _as_replacement(result)
        absorbed: Dict[Hashable, Hashable] = {}
        for n in top:
            for inner, entries in edits.items():
                if inner is not n and model.is_ancestor(n, inner):
                    for o, _ in entries:
                        if o not in per_owner:
                            absorbed.setdefault(o, owners[n])
        return per_owner, absorbed


def _first_edit_under(edits, model, node):
    for inner, entries in edits.items():
        if model.is_ancestor(node, inner):
            return entries
    return []


def _as_replacement(value: object):
    if isinstance(value, list):
        if not value:
            return cst.RemoveFromParent()
        return value[0] if len(value) == 1 else cst.FlattenSentinel(value)
    return value
