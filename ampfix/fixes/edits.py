"""The edits layer: the ways a fix changes a file, each keeping what it does not name.

Every helper returns the replacements of a `Fix` (node -> new node); the engine applies them.
Statements inserted take the file's own indentation and newline style (LibCST renders a block
relative to its parent) and the comments and blank lines of the statement they go before;
a replaced or removed statement keeps its comment lines and its trailing comment, and the
comments inside it (a compound statement's header, body and footer) that the new statements
do not carry become comment lines before them.
"""

from __future__ import annotations

from typing import Dict, List, Optional, Sequence, Tuple, Union

import libcst as cst

from ampfix.model.tree import dotted


Replacement = Union[cst.CSTNode, cst.RemovalSentinel, cst.FlattenSentinel]
Replacements = Dict[cst.CSTNode, Replacement]
StatementLike = Union[str, cst.BaseStatement]


# ----------------------------------------------------------------------------- statements


def statement(module: cst.Module, code: StatementLike) -> cst.BaseStatement:
    """A statement from source text, parsed with the file's settings (indent, newline)."""
    if isinstance(code, cst.BaseStatement):
        return code
    return cst.parse_statement(code if code.endswith("\n") else code + "\n", config=module.config_for_parsing)


def in_block(model, stmt: Optional[cst.CSTNode]) -> bool:
    """`stmt` is a statement directly in a block, where statements can go before/after it."""
    return stmt is not None and model.block_of(stmt) is not None


def _trailing_comment(stmt: cst.BaseStatement) -> Optional[cst.Comment]:
    if isinstance(stmt, cst.SimpleStatementLine):
        return stmt.trailing_whitespace.comment
    return None


def _comments(node: cst.CSTNode) -> List[str]:
    """Every comment in `node`, in source order."""
    found: List[str] = []

    class _Collect(cst.CSTVisitor):
        def visit_Comment(self, c: cst.Comment) -> None:
            found.append(c.value)

    node.visit(_Collect())
    return found


def _lost_comments(old: cst.CSTNode, kept: Sequence[cst.CSTNode]) -> List[str]:
    """The comments of `old` that none of `kept` carries (each counted once per occurrence)."""
    have: Dict[str, int] = {}
    for node in kept:
        for c in _comments(node):
            have[c] = have.get(c, 0) + 1
    lost = []
    for c in _comments(old):
        if have.get(c, 0):
            have[c] -= 1
        else:
            lost.append(c)
    return lost


def _comment_lines(comments: Sequence[str]) -> List[cst.EmptyLine]:
    return [cst.EmptyLine(indent=True, whitespace=cst.SimpleWhitespace(""), comment=cst.Comment(c)) for c in comments]


def _header_comment(stmt: cst.CSTNode) -> Optional[cst.TrailingWhitespace]:
    """The whitespace that ends a statement's first line, when it carries a comment: a simple
    line's trailing comment, a compound statement's header comment."""
    if isinstance(stmt, cst.SimpleStatementLine):
        ws = stmt.trailing_whitespace
    else:
        body = getattr(stmt, "body", None)
        ws = getattr(body, "header", None) if isinstance(body, cst.IndentedBlock) else \
            getattr(body, "trailing_whitespace", None)
    return ws if isinstance(ws, cst.TrailingWhitespace) and ws.comment is not None else None


def keep_comments(old: cst.CSTNode, new: List[cst.CSTNode]) -> List[cst.CSTNode]:
    """`new` (the statements that replace `old`) with every comment of `old` they do not carry:
    the comment on its first line on the first new line (when that is a simple line without
    one), the others as comment lines before them."""
    if not new or not isinstance(old, cst.CSTNode):
        return new
    lost = _lost_comments(old, new)
    if not lost:
        return new
    out = list(new)
    header = _header_comment(old)
    first = out[0]
    if header is not None and header.comment.value in lost and isinstance(first, cst.SimpleStatementLine) \
            and first.trailing_whitespace.comment is None:
        out[0] = first = first.with_changes(trailing_whitespace=first.trailing_whitespace.with_changes(
            whitespace=header.whitespace, comment=header.comment))
        lost.remove(header.comment.value)
    if lost and hasattr(first, "leading_lines"):
        out[0] = first.with_changes(leading_lines=[*first.leading_lines, *_comment_lines(lost)])
    return out


def insert_before(module: cst.Module, stmt: cst.BaseStatement, new: Sequence[StatementLike]) -> Replacements:
    """New statements before `stmt`; they take over its blank lines and comment lines."""
    first, *rest = [statement(module, s) for s in new]
    first = first.with_changes(leading_lines=stmt.leading_lines)
    return {stmt: cst.FlattenSentinel([first, *rest, stmt.with_changes(leading_lines=())])}


def insert_after(module: cst.Module, stmt: cst.BaseStatement, new: Sequence[StatementLike]) -> Replacements:
    """New statements right after `stmt`."""
    stmts = [statement(module, s) for s in new]
    stmts = [s.with_changes(leading_lines=()) for s in stmts]
    return {stmt: cst.FlattenSentinel([stmt, *stmts])}


def replace_statement(module: cst.Module, stmt: cst.BaseStatement, new: Sequence[StatementLike]) -> Replacements:
    """`stmt` replaced by (at least one) new statements: its comment lines go before the first, its trailing
    comment after the last one when that is a simple line without one of its own."""
    stmts = [statement(module, s) for s in new]
    stmts[0] = stmts[0].with_changes(leading_lines=stmt.leading_lines)
    comment = _trailing_comment(stmt)
    last = stmts[-1]
    if comment is not None and isinstance(last, cst.SimpleStatementLine) and last.trailing_whitespace.comment is None:
        stmts[-1] = last.with_changes(trailing_whitespace=stmt.trailing_whitespace)
    # any other comment of the old statement (in a compound statement's header, body or
    # footer, or a trailing one with no simple line to go on) becomes a comment line before it
    lost = _lost_comments(stmt, stmts)
    if lost:
        stmts[0] = stmts[0].with_changes(leading_lines=[*stmts[0].leading_lines, *_comment_lines(lost)])
    return {stmt: stmts[0] if len(stmts) == 1 else cst.FlattenSentinel(stmts)}


def replace_small_statement(module: cst.Module, stmt: cst.SimpleStatementLine, code: str,
                            then: Sequence[StatementLike] = ()) -> Replacements:
    """The one-statement line `stmt` with its statement replaced by `code` (its comment lines
    and trailing comment stay where they are), then the statements `then` after it."""
    new = statement(module, code)
    assert isinstance(new, cst.SimpleStatementLine) and len(stmt.body) == 1
    first = stmt.with_changes(body=[new.body[0]])
    rest = [statement(module, s).with_changes(leading_lines=()) for s in then]
    return {stmt: cst.FlattenSentinel([first, *rest]) if rest else first}


def remove_statement(model, stmt: cst.BaseStatement) -> Replacements:
    """Remove `stmt`. Its comments (lines before it, and a trailing one) move to the next
    statement of its block, so nothing the user wrote in prose disappears; when it is the last
    statement they stay behind a `pass`."""
    kept = [ln for ln in stmt.leading_lines if ln.comment is not None]
    extra = _comment_lines(_lost_comments(stmt, kept))  # a trailing comment, those inside a compound statement
    if not extra and all(ln.comment is None for ln in stmt.leading_lines):
        return {stmt: cst.RemoveFromParent()}
    block = model.block_of(stmt)
    body = list(block.body) if block is not None else []
    index = next((i for i, s in enumerate(body) if s is stmt), None)
    if index is not None and index + 1 < len(body):
        nxt = body[index + 1]
        return {stmt: cst.RemoveFromParent(),
                nxt: nxt.with_changes(leading_lines=[*stmt.leading_lines, *extra, *nxt.leading_lines])}
    return {stmt: cst.SimpleStatementLine(body=[cst.Pass()], leading_lines=[*stmt.leading_lines, *extra])}


def move_after(module: cst.Module, stmt: cst.BaseStatement, anchor: cst.BaseStatement) -> Replacements:
    """Move `stmt` to right after `anchor` (a later statement of the same block, not
    containing it), with its comment lines."""
    moved = stmt.with_changes(leading_lines=[ln for ln in stmt.leading_lines if ln.comment is not None])
    return {stmt: cst.RemoveFromParent(), anchor: cst.FlattenSentinel([anchor, moved])}


def hoist_before(stmt: cst.BaseStatement, anchor: cst.BaseStatement) -> Replacements:
    """Move `stmt`, a statement somewhere inside the compound statement `anchor` (a loop),
    to right before `anchor`: it takes `anchor`'s blank and comment lines and keeps its own
    comment lines. The block `stmt` leaves must keep another statement."""
    moved = stmt.with_changes(leading_lines=[*anchor.leading_lines,
                                             *[ln for ln in stmt.leading_lines if ln.comment is not None]])
    rest = anchor.deep_remove(stmt)
    if not isinstance(rest, cst.BaseStatement):  # pragma: no cover - anchor contains stmt
        raise ValueError("hoist_before: the anchor disappeared")
    return {anchor: cst.FlattenSentinel([moved, rest.with_changes(leading_lines=())])}


def hoist_or_drop(model, stmt: cst.SimpleStatementLine, loop: cst.BaseStatement) -> Tuple[Replacements, bool]:
    """`stmt` (one statement, inside the loop `loop`) moved to right before the loop
    (`hoist_before`), or removed (`remove_statement`) where the same statement already stands
    right before it: (edit, removed)."""
    body = list(model.block_of(loop).body)
    previous = body[body.index(loop) - 1] if body.index(loop) > 0 else None
    if isinstance(previous, cst.SimpleStatementLine) and len(previous.body) == 1 \
            and model.code(previous.body[0]) == model.code(stmt.body[0]):
        return remove_statement(model, stmt), True
    return hoist_before(stmt, loop), False


def build_in_init(model, stmt: cst.SimpleStatementLine, init: cst.FunctionDef, name: str, attr: str) -> Replacements:
    """The value `stmt` (`name = <value>`) assigns built once, as `attr = <value>` at the end of
    `init` (a method with a block); `stmt` becomes `name = attr`, or goes where `name` is
    `attr`."""
    built = model.code(stmt.body[0].value)  # type: ignore[attr-defined]
    fix = insert_after(model.module, init.body.body[-1], [f"{attr} = {built}"])  # type: ignore[union-attr]
    if attr != name:
        fix.update(replace_statement(model.module, stmt, [f"{name} = {attr}"]))
    else:
        fix.update(remove_statement(model, stmt))
    return fix


def move_into_block(first: Sequence[cst.BaseStatement], target: cst.BaseCompoundStatement,
                    last: Sequence[cst.BaseStatement] = ()) -> Replacements:
    """Move sibling statements of `target` (in the block that holds it) into its body: `first`
    at the start of the body, `last` at its end, in their order, with their comment lines."""
    def keep(stmts):
        return [s.with_changes(leading_lines=[ln for ln in s.leading_lines if ln.comment is not None]) for s in stmts]

    body = target.body
    out: Replacements = {s: cst.RemoveFromParent() for s in (*first, *last)}
    out[target] = target.with_changes(body=body.with_changes(body=[*keep(first), *body.body, *keep(last)]))
    return out


def negated(model, test: cst.BaseExpression) -> str:
    """The source of `not test`, written the way people write it (`x is not None` for `x is
    None`, `flag` for `not flag`)."""
    if isinstance(test, cst.UnaryOperation) and isinstance(test.operator, cst.Not):
        return model.code(test.expression)
    if isinstance(test, cst.Comparison) and len(test.comparisons) == 1:
        target = test.comparisons[0]
        swap = {cst.Is: " is not ", cst.IsNot: " is ", cst.Equal: " != ", cst.NotEqual: " == ",
                cst.In: " not in ", cst.NotIn: " in "}
        for op, text in swap.items():
            if isinstance(target.operator, op):
                return f"{model.code(test.left)}{text}{model.code(target.comparator)}"
    if isinstance(test, (cst.Name, cst.Attribute, cst.Call, cst.Subscript)):
        return f"not {model.code(test)}"
    return f"not ({model.code(test)})"


def guard_test(model, tests) -> str:
    """The test of an `if` that holds exactly when each (test, value) has that value."""
    parts = []
    for test, value in tests:
        text = model.code(test) if value else negated(model, test)
        if value and isinstance(test, cst.BooleanOperation) and isinstance(test.operator, cst.Or) and len(tests) > 1:
            text = f"({text})"
        parts.append(text)
    return " and ".join(parts)


def guarded(model, tests, code: str) -> str:
    """`code` (one statement) under `if <tests>:` (see `guard_test`), in the file's indentation."""
    indent = model.module.default_indent
    return f"if {guard_test(model, tests)}:\n{indent}{code}"


def insert_where_bound(model, stmt: cst.BaseStatement, code: str, after: bool = False,
                       under: Optional[cst.CSTNode] = None) -> Tuple[Optional[Replacements], Optional[str], Optional[list]]:
    """`code` (one statement) inserted before `stmt` (`after`: after it) where every name it
    reads is bound, and not None where it calls a method, on every path that reaches it
    (`bound.insertion_problem`); else under the test the statement `under` runs under
    (`bound.branch_tests(under, stmt)`: `if self.scaler is not None:`) where that proves it.
    Returns (edit, None, tests: () unguarded, else the guard's) or (None, why not, None)."""
    place = insert_after if after else insert_before
    problem = model.bound.insertion_problem([statement(model.module, code)], stmt, after=after)
    if problem is None:
        return place(model.module, stmt, [code]), None, ()
    tests = model.bound.branch_tests(under, stmt) if under is not None and under is not stmt else None
    if tests:
        moved = guarded(model, tests, code)
        if model.bound.insertion_problem([statement(model.module, moved)], stmt, after=after) is None:
            return place(model.module, stmt, [moved]), None, tests
    return None, problem, None


def insert_method_call_after(model, stmt: cst.BaseStatement, call: cst.Call, method: str
                             ) -> Tuple[Optional[Replacements], Optional[str], Optional[list]]:
    """`<receiver>.<method>()`, on the receiver of the method call `call` (`scaler.update()`
    for `scaler.step(opt)`), inserted after `stmt` where it is bound (`insert_where_bound`,
    under the test the statement of `call` runs under where that proves it). Returns what
    `insert_where_bound` does."""
    code = f"{model.code(call.func.value)}.{method}()"  # type: ignore[attr-defined]
    return insert_where_bound(model, stmt, code, after=True, under=model.statement_of(call))


def move_before_import(model, stmt: cst.BaseStatement, package: str) -> Optional[Replacements]:
    """Move the module-level statement `stmt` to right before the file's first top-level
    statement that imports `package` (`import torch`, `from torch.x import y`), when it comes
    after that import and reads only names bound before it; None otherwise. It takes the
    import's blank and comment lines, and keeps its own comment lines."""
    from ampfix.model.readwrite import names_bound, uses_only

    body = model.module.body
    first = next((i for i, s in enumerate(body) if _imports(s, package)), None)
    at = next((i for i, s in enumerate(body) if s is stmt), None)
    if first is None or at is None or at < first or not uses_only(stmt, names_bound(body[:first])):
        return None
    anchor = body[first]
    comments = [ln for ln in stmt.leading_lines if ln.comment is not None]
    moved = stmt.with_changes(leading_lines=[*anchor.leading_lines, *comments])
    return {stmt: cst.RemoveFromParent(), anchor: cst.FlattenSentinel([moved, anchor.with_changes(leading_lines=[])])}


def _imports(stmt: cst.CSTNode, package: str) -> bool:
    """`stmt` imports `package` or a module of it (not inside a def or class)."""
    found = False

    class V(cst.CSTVisitor):
        def visit_Import(self, node: cst.Import) -> None:
            nonlocal found
            if any(dotted(a.name) is not None and (dotted(a.name) + ".").startswith(package + ".") for a in node.names):
                found = True

        def visit_ImportFrom(self, node: cst.ImportFrom) -> None:
            nonlocal found
            mod = dotted(node.module) if node.module is not None else None
            if not node.relative and mod is not None and (mod + ".").startswith(package + "."):
                found = True

        def visit_FunctionDef(self, node: cst.FunctionDef) -> bool:
            return False

        def visit_ClassDef(self, node: cst.ClassDef) -> bool:
            return False

    stmt.visit(V())
    return found


# ----------------------------------------------------------------------------- arguments


def comma() -> cst.Comma:
    return cst.Comma(whitespace_after=cst.SimpleWhitespace(" "))


def keyword_arg(name: str, value: cst.BaseExpression) -> cst.Arg:
    return cst.Arg(value=value, keyword=cst.Name(name),
                   equal=cst.AssignEqual(whitespace_before=cst.SimpleWhitespace(""),
                                         whitespace_after=cst.SimpleWhitespace("")))


def string(value: str, quote: str = '"') -> cst.SimpleString:
    return cst.SimpleString(f"{quote}{value}{quote}")


def with_args(call: cst.Call, args: List[cst.Arg]) -> cst.Call:
    """`call` with these args; commas normalised (the old last arg's trailing comma is kept)."""
    trailing = call.args[-1].comma if call.args else cst.MaybeSentinel.DEFAULT
    out = []
    for i, a in enumerate(args):
        if i < len(args) - 1:
            if not isinstance(a.comma, cst.Comma):
                a = a.with_changes(comma=comma())
        else:
            a = a.with_changes(comma=trailing)
        out.append(a)
    return call.with_changes(args=out)


def first_arg(call: cst.Call, value: cst.BaseExpression) -> cst.Arg:
    """An argument to put first in `call`'s list, laid out like it: on its own line when the
    call has one argument a line."""
    arg = cst.Arg(value=value)
    ws = call.whitespace_before_args
    if call.args and isinstance(ws, cst.ParenthesizedWhitespace):  # keep the line break and indent
        arg = arg.with_changes(comma=cst.Comma(whitespace_after=ws.with_changes(
            first_line=cst.TrailingWhitespace(), empty_lines=())))
    return arg


def set_keyword(call: cst.Call, name: str, value: cst.BaseExpression) -> cst.Call:
    """`call` with `name=value`: replaced when present, else appended."""
    args = list(call.args)
    for i, a in enumerate(args):
        if a.keyword is not None and a.keyword.value == name:
            args[i] = a.with_changes(value=value)
            return call.with_changes(args=args)
    return with_args(call, [*args, keyword_arg(name, value)])


def region_dtype(region, dtype: str, replace_float16: bool = False) -> Optional[Replacements]:
    """`dtype=<dtype>` (source text) on the autocast call of `region` (a `model.Region`): added
    where the call has none; with `replace_float16`, a literal float16 dtype is replaced by it.
    None where it cannot be said in the call (no call, `*args`/`**kwargs`, another dtype)."""
    call = region.call
    if call is None or any(a.star for a in call.args):
        return None
    new = cst.parse_expression(dtype)
    if region.dtype_node is None:
        return {call: set_keyword(call, "dtype", new)}
    if replace_float16 and region.dtype == "float16":
        return {region.dtype_node: new}
    return None


def with_regions_dtype(regions, dtype: str, replace_float16: bool = False) -> Optional[Replacements]:
    """`region_dtype` on every region of `regions`, each the autocast call of a `with` statement
    (not a decorator, nor a context built elsewhere); None where one of them cannot take it."""
    edits: Replacements = {}
    for r in regions:
        if not isinstance(r.node, cst.With) or not any(i.item is r.call for i in r.node.items):
            return None
        edit = region_dtype(r, dtype, replace_float16=replace_float16)
        if edit is None:
            return None
        edits.update(edit)
    return edits


def clean_commas(items: List[cst.CSTNode]) -> List[cst.CSTNode]:
    """Import aliases / elements with commas between them and none after the last."""
    out = []
    for i, a in enumerate(items):
        if i < len(items) - 1:
            out.append(a if isinstance(getattr(a, "comma", None), cst.Comma) else a.with_changes(comma=comma()))
        else:
            out.append(a.with_changes(comma=cst.MaybeSentinel.DEFAULT))
    return out


# ----------------------------------------------------------------------------- imports


def _semicolon() -> cst.Semicolon:
    return cst.Semicolon(whitespace_before=cst.SimpleWhitespace(""), whitespace_after=cst.SimpleWhitespace(" "))


def import_from_elsewhere(model, stmt: cst.CSTNode, aliases: Sequence[cst.ImportAlias], module: str) -> Replacements:
    """Import `aliases` (names of the `from ... import` or `import ...` statement `stmt`) from
    `module` instead, keeping their `as` names; the statement's other names stay where they
    were (the statement is split in two when it has some)."""
    moved_ids = {id(a) for a in aliases}
    if isinstance(stmt, cst.Import):
        names = [a.with_changes(name=cst.parse_expression(module)) if id(a) in moved_ids else a for a in stmt.names]
        return {stmt: stmt.with_changes(names=names)}
    assert isinstance(stmt, cst.ImportFrom) and not isinstance(stmt.names, cst.ImportStar)
    moved = [a for a in stmt.names if id(a) in moved_ids]
    kept = [a for a in stmt.names if id(a) not in moved_ids]
    if not kept:
        return {stmt: stmt.with_changes(module=cst.parse_expression(module), relative=())}
    fresh = cst.ImportFrom(module=cst.parse_expression(module), names=clean_commas(moved))
    old = stmt.with_changes(names=clean_commas(kept))
    line = model.parent(stmt)
    if isinstance(line, cst.SimpleStatementLine) and len(line.body) == 1:
        return {line: cst.FlattenSentinel([line.with_changes(body=[old]), cst.SimpleStatementLine(body=[fresh])])}
    return {stmt: cst.FlattenSentinel([old.with_changes(semicolon=_semicolon()),
                                       fresh.with_changes(semicolon=getattr(stmt, "semicolon", cst.MaybeSentinel.DEFAULT))])}


def remove_import_alias(model, stmt: cst.CSTNode, alias: cst.ImportAlias) -> Replacements:
    """Drop one name from an import statement (the whole line when it is the only one)."""
    names = [a for a in stmt.names if a is not alias]  # type: ignore[attr-defined]
    if names:
        return {stmt: stmt.with_changes(names=clean_commas(names))}
    line = model.parent(stmt)
    if isinstance(line, cst.SimpleStatementLine) and len(line.body) == 1:
        return remove_statement(model, line)
    return {stmt: cst.RemoveFromParent()}


def _without_blank_after(model, stmt: cst.BaseStatement, edit: Replacements) -> Replacements:
    """`stmt` goes by `edit` alone, first in a nested block: the blank line that followed it goes too."""
    block = model.block_of(stmt)
    if block is not None and block is not model.module and len(block.body) > 1 and block.body[0] is stmt \
            and len(edit) == 1:
        nxt = block.body[1]
        edit[nxt] = nxt.with_changes(leading_lines=[ln for ln in nxt.leading_lines if ln.comment is not None])
    return edit


def remove_import_alias_tidily(model, stmt: cst.CSTNode, alias: cst.ImportAlias) -> Replacements:
    """`remove_import_alias`, where the import line goes whole (no comment moves): a `pass` stays
    when it was alone in its block, and the blank line after it goes when it opened a nested one."""
    edit = remove_import_alias(model, stmt, alias)
    line = model.parent(stmt)
    block = model.block_of(line)
    if block is None or not isinstance(edit.get(line), cst.RemovalSentinel):
        return edit
    if len(block.body) == 1:
        return {line: cst.SimpleStatementLine(body=[cst.Pass()], leading_lines=line.leading_lines,
                                              trailing_whitespace=line.trailing_whitespace)}
    return _without_blank_after(model, line, edit)


def remove_statement_tidily(model, stmt: cst.BaseStatement) -> Replacements:
    """`remove_statement`, but a `pass` takes the place of a statement alone in its block, and the
    blank line after it goes when it opened a nested block."""
    block = model.block_of(stmt)
    if block is not None and len(block.body) == 1:
        return {stmt: cst.SimpleStatementLine(body=[cst.Pass()], leading_lines=stmt.leading_lines)}
    edit = remove_statement(model, stmt)
    return _without_blank_after(model, stmt, edit) if block is not None else edit


# ----------------------------------------------------------------------------- literals


def add_dict_entry(node: cst.Dict, key: cst.BaseExpression, value: cst.BaseExpression) -> cst.Dict:
    """`node` with `key: value` after its last entry, laid out like the entries before it: on a
    line of its own when they are one a line. Every comment stays on the line it was on (a
    trailing comment of the last entry stays on that entry, not on the new one)."""
    elements = list(node.elements)
    last = elements[-1]
    prev = elements[-2].comma if len(elements) > 1 else None
    # the whitespace that starts an entry's line (after the comma before it, or after `{`)
    sep = prev.whitespace_after if isinstance(prev, cst.Comma) else node.lbrace.whitespace_after
    entry = cst.DictElement(key=key, value=value)
    rbrace = node.rbrace
    trailing = isinstance(last.comma, cst.Comma)
    no_space = cst.SimpleWhitespace("")
    after_last = last.comma.whitespace_after if trailing else None  # type: ignore[union-attr]
    closing = after_last if isinstance(after_last, cst.ParenthesizedWhitespace) else rbrace.whitespace_before
    if isinstance(closing, cst.ParenthesizedWhitespace):
        # the last entry ends its line (its comment with it); the new entry gets a line like it
        line_start = sep if isinstance(sep, cst.ParenthesizedWhitespace) else closing
        last_comma = last.comma if trailing else cst.Comma(whitespace_before=no_space)
        last = last.with_changes(comma=last_comma.with_changes(whitespace_after=closing.with_changes(  # type: ignore[union-attr]
            empty_lines=(), indent=line_start.indent, last_line=line_start.last_line)))
        rest = closing.with_changes(first_line=cst.TrailingWhitespace(newline=closing.first_line.newline))
        if closing is after_last:
            entry = entry.with_changes(comma=cst.Comma(whitespace_before=no_space, whitespace_after=rest))
        else:
            entry = entry.with_changes(comma=cst.Comma(whitespace_before=no_space, whitespace_after=no_space)
                                       if trailing else cst.MaybeSentinel.DEFAULT)
            rbrace = rbrace.with_changes(whitespace_before=rest)
    elif isinstance(sep, cst.ParenthesizedWhitespace):  # one a line, `}` right after the last
        last = last.with_changes(comma=cst.Comma(whitespace_before=no_space, whitespace_after=sep.with_changes(
            first_line=cst.TrailingWhitespace(newline=sep.first_line.newline), empty_lines=())))
        if trailing:
            entry = entry.with_changes(comma=last.comma.with_changes(whitespace_after=after_last))  # type: ignore[union-attr]
    else:  # one line
        space = sep if isinstance(sep, cst.SimpleWhitespace) and sep.value else cst.SimpleWhitespace(" ")
        last = last.with_changes(comma=cst.Comma(whitespace_before=no_space, whitespace_after=space))
        if trailing:
            entry = entry.with_changes(comma=cst.Comma(whitespace_before=no_space, whitespace_after=after_last))
    return node.with_changes(elements=[*elements[:-1], last, entry], rbrace=rbrace)
