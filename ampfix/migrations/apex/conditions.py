"""The imports that bind apex, the availability flags of an optional import, and every `if` that
tests them (native AMP is always there: the tests are settled)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Dict, List, Set

import libcst as cst

from ampfix.model import literal_bool
from ampfix.migrations.apex.common import Blocked, statements, smalls

if TYPE_CHECKING:
    from ampfix.migrations.apex.plan import ApexMigration


def imports(m: "ApexMigration") -> None:
    model = m.model
    use_roots = {id(root(u.call.func)) for u in m.uses}
    bound_here = {id(r) for b in model.import_bindings if b.qualified == "apex" or b.qualified.startswith("apex.amp")
                  for r in b.refs}
    for u in m.uses:
        name = root(u.call.func)
        if isinstance(name, cst.Name) and id(name) not in bound_here:
            # `from .utils import *` (or `from .utils import amp`): the modules that share it migrate together
            raise Blocked(f"`{name.value}` is apex's amp imported in another module of the project (a star "
                          "import or a re-export): migrate the modules that share it together, by hand")
    tries: Dict[cst.Try, List] = {}
    for b in model.import_bindings:
        if not (b.qualified == "apex" or b.qualified.startswith("apex.amp")):
            continue
        if b.qualified not in ("apex", "apex.amp"):
            raise Blocked(f"`{b.qualified}` is imported by name (line {m.line(b.stmt)}): import apex.amp "
                           "itself, or migrate by hand")
        other = [r for r in b.refs if id(r) not in use_roots and not availability_ref(m, r, b)]
        if b.qualified == "apex" and other:
            continue  # `import apex` still used for apex.parallel & co: AMP103's business
        if other:
            raise Blocked(f"`{b.name}` is used on line {m.line(other[0])} other than by a call of apex.amp")
        holder = model.parent(b.stmt)
        if isinstance(holder, cst.SimpleStatementLine):
            holder = model.parent(holder)
        holder = model.parent(holder) if isinstance(holder, (cst.IndentedBlock, cst.SimpleStatementSuite)) else None
        if b.qualified == "apex.amp":
            m.none_names.add(b.name)  # `amp is not None` is true once native AMP replaces it
        if isinstance(holder, cst.Try) and model.is_ancestor(holder.body, b.stmt):
            tries.setdefault(holder, []).append(b)
        else:
            remove_alias(m, b.stmt, b.alias)
    for node, bindings in tries.items():
        optional_import(m, node, bindings)
    if model.torch_alias() is None:  # `import torch` goes with the other imports
        first = model.apex.first_import()  # after `from __future__` imports (a line that holds one too)
        if first is None or any(n.value == "torch" and not model.in_import(n) for n in model.nodes_of(cst.Name)):
            raise Blocked("the file does not `import torch` at module level: add it, then migrate")
        m.rw.insert_before(m.init, first, [m.stmt("import torch")])


def root(node: cst.CSTNode) -> cst.CSTNode:
    while isinstance(node, cst.Attribute):
        node = node.value
    return node


def availability_ref(m: "ApexMigration", ref: cst.Name, b) -> bool:
    """`amp is None`, `amp is not None` or a bare `amp` in an `if` test."""
    parent = m.model.parent(ref)
    if isinstance(parent, cst.Comparison) and parent.left is ref and len(parent.comparisons) == 1 \
            and isinstance(parent.comparisons[0].operator, (cst.Is, cst.IsNot)) \
            and isinstance(parent.comparisons[0].comparator, cst.Name) \
            and parent.comparisons[0].comparator.value == "None":
        node = parent
    else:
        node = ref
    return in_test(m, node)


def in_test(m: "ApexMigration", node: cst.CSTNode) -> bool:
    cur = node
    for anc in m.model.ancestors(node):
        if isinstance(anc, cst.If):
            return anc.test is cur
        if not isinstance(anc, (cst.BooleanOperation, cst.UnaryOperation, cst.Comparison)):
            return False
        cur = anc
    return False


def remove_alias(m: "ApexMigration", stmt: cst.CSTNode, alias: cst.ImportAlias) -> None:
    names = [a for a in stmt.names if a is not alias]  # type: ignore[attr-defined]
    if names:
        from ampfix.fixes.edits import clean_commas
        m.rw.add(m.init, stmt, lambda cur, n=names: stmt.with_changes(names=clean_commas(n)))
    else:
        line = m.model.parent(stmt)
        if isinstance(line, cst.SimpleStatementLine) and len(line.body) == 1:
            m.rw.remove(m.init, line)
        else:
            m.rw.add(m.init, stmt, lambda cur: cst.RemoveFromParent())


def optional_import(m: "ApexMigration", node: cst.Try, bindings) -> None:
    """`try: from apex import amp; FLAG = True / except ImportError: amp = None; FLAG = False`."""
    model = m.model
    alias_ids = {id(b.alias) for b in bindings}
    flags: Set[str] = set()
    for s, sm in smalls(node.body):
        if isinstance(sm, (cst.Import, cst.ImportFrom)) and not isinstance(sm.names, cst.ImportStar) \
                and all(id(a) in alias_ids for a in sm.names):
            continue
        if isinstance(sm, cst.Assign) and literal_bool(sm.value) is True and len(sm.targets) == 1 \
                and isinstance(sm.targets[0].target, cst.Name):
            flags.add(sm.targets[0].target.value)
            continue
        raise Blocked(f"the `try` that imports apex (line {m.line(node)}) does more (line {m.line(s)}): "
                       "migrate the rest of it first")
    for h in node.handlers:
        for s, sm in smalls(h.body):
            if isinstance(sm, (cst.Pass, cst.Raise, cst.Expr)):
                continue
            if isinstance(sm, cst.Assign) and len(sm.targets) == 1 \
                    and isinstance(sm.targets[0].target, cst.Name):
                name = sm.targets[0].target.value
                if name in m.none_names or (name in flags and literal_bool(sm.value) is False):
                    continue
            raise Blocked(f"the `except` of the apex import (line {m.line(h)}) does more "
                           f"(line {m.line(s)}): migrate it by hand")
    if node.orelse is not None or node.finalbody is not None:
        raise Blocked(f"the `try` that imports apex (line {m.line(node)}) has else/finally: migrate by hand")
    m.avail |= flags
    m.rw.remove(m.init, node)
    # `FLAG = False` set before the try, and every other read of a flag
    for flag in flags:
        for n in model.nodes_of(cst.Name):
            if n.value != flag or model.is_ancestor(node, n):
                continue
            parent = model.parent(n)
            if isinstance(parent, cst.AssignTarget):
                line = model.statement_of(n)
                assign = model.parent(parent)
                if literal_bool(assign.value) is False and isinstance(line, cst.SimpleStatementLine) \
                        and len(line.body) == 1:
                    m.rw.remove(m.init, line)
                    continue
            if isinstance(parent, (cst.Global,)) or isinstance(parent, cst.NameItem):
                continue
            if not in_test(m, n):
                raise Blocked(f"the apex availability flag `{flag}` is used on line {m.line(n)}: "
                               "migrate it by hand")


def simplify(m: "ApexMigration", expr: cst.BaseExpression):
    """The test with apex available: True, False, or the residual expression (which must not
    mention apex any more)."""
    value = simplify_parts(m, expr)
    names = m.avail | m.none_names
    if not isinstance(value, bool) and any(n.value in names for n in read_names(value)):
        raise Blocked(f"the test `{m.code(expr)}` uses apex in a way ampfix does not simplify: migrate by hand")
    return value


def simplify_parts(m: "ApexMigration", expr: cst.BaseExpression):
    if isinstance(expr, cst.Name) and (expr.value in m.avail or expr.value in m.none_names):
        return True
    if isinstance(expr, cst.Comparison) and len(expr.comparisons) == 1 and isinstance(expr.left, cst.Name) \
            and expr.left.value in m.none_names and isinstance(expr.comparisons[0].comparator, cst.Name) \
            and expr.comparisons[0].comparator.value == "None":
        return isinstance(expr.comparisons[0].operator, cst.IsNot)
    if isinstance(expr, cst.UnaryOperation) and isinstance(expr.operator, cst.Not):
        inner = simplify_parts(m, expr.expression)
        if isinstance(inner, bool):
            return not inner
        return expr if inner is expr.expression else expr.with_changes(expression=inner)
    if isinstance(expr, cst.BooleanOperation):
        left, right = simplify_parts(m, expr.left), simplify_parts(m, expr.right)
        is_and = isinstance(expr.operator, cst.And)
        for a, b in ((left, right), (right, left)):
            if isinstance(a, bool):
                if a is not is_and:  # False and x / True or x
                    return a
                return b
        if left is expr.left and right is expr.right:
            return expr
        return expr.with_changes(left=left, right=right)
    return expr


def availability_ifs(m: "ApexMigration") -> None:
    """Every `if` that tests apex's availability, simplified (apex is gone, native AMP is there)."""
    names = m.avail | m.none_names
    if not names:
        return
    for node in m.model.nodes_of(cst.If):
        if m.rw.claimed(node):
            continue
        if not any(isinstance(n, cst.Name) and n.value in names for n in read_names(node.test)):
            continue
        value = simplify(m, node.test)
        parent = m.model.parent(node)
        if isinstance(parent, cst.If):
            raise Blocked(f"an `elif` tests apex's availability (line {m.line(node)}): migrate it by hand")
        m.rw.add(m.init, node, lambda cur, v=value: settle_if(cur, v))


def read_names(node: cst.CSTNode) -> List[cst.CSTNode]:
    found: List[cst.CSTNode] = []

    class V(cst.CSTVisitor):  # names that are read: not `x.attr`'s attr, not `f(key=...)`'s key
        def visit_Name(self, n: cst.Name) -> None:
            found.append(n)

        def visit_Attribute(self, n: cst.Attribute) -> bool:
            n.value.visit(self)
            return False

        def visit_Arg(self, n: cst.Arg) -> bool:
            n.value.visit(self)
            return False
    node.visit(V())
    return found


def settle_if(cur: cst.If, value) -> object:
    if value is True:
        body = statements(cur.body)
        body[0] = body[0].with_changes(leading_lines=[*cur.leading_lines, *body[0].leading_lines])
        return body
    if value is False:
        if cur.orelse is None:
            return []
        if isinstance(cur.orelse, cst.If):
            return cur.orelse.with_changes(leading_lines=cur.leading_lines)
        body = statements(cur.orelse.body)
        body[0] = body[0].with_changes(leading_lines=cur.leading_lines)
        return body
    return cur.with_changes(test=value)


def prune_if(m: "ApexMigration", node: cst.If):
    """The `if` around amp.initialize once it is gone: its test simplified, gone if it is empty."""
    value = simplify(m, node.test)

    def edit(cur):
        if isinstance(cur, list):
            return cur
        body = [s for s in cur.body.body
                if not (isinstance(s, cst.SimpleStatementLine) and len(s.body) == 1
                        and isinstance(s.body[0], cst.Pass))]
        if not body and cur.orelse is None:
            return []
        if value is True:
            return settle_if(cur, True)
        return cur if value is node.test else cur.with_changes(test=value)
    return edit
