"""Which names a statement reads and which it binds.

Precise about what a Name is: `x.attr` reads `x` (not `attr`), `f(k=v)` reads `f` and `v`
(not `k`), an assignment target binds its names and reads the names under its attributes and
subscripts (`a.b = 1` reads `a`), `import`/`def`/`class` bind their names.
"""

from __future__ import annotations

import builtins
from typing import Dict, Iterable, List, Set, Tuple

import libcst as cst

from ampfix.model.tree import child_nodes, dotted, node_types

BUILTIN_NAMES = set(dir(builtins))


class _ReadsWrites(cst.CSTVisitor):
    def __init__(self) -> None:
        super().__init__()
        self.reads: Set[str] = set()
        self.writes: Set[str] = set()
        self.opaque = False  # a lambda or generator: reads happen later, when it is called

    def visit_Name(self, node: cst.Name) -> None:
        self.reads.add(node.value)

    def visit_Attribute(self, node: cst.Attribute) -> bool:
        node.value.visit(self)
        return False

    def visit_Arg(self, node: cst.Arg) -> bool:
        node.value.visit(self)
        return False

    def _target(self, t: cst.CSTNode) -> None:
        if isinstance(t, cst.Name):
            self.writes.add(t.value)
        elif isinstance(t, (cst.Tuple, cst.List)):
            for e in t.elements:
                self._target(e.value)
        elif isinstance(t, cst.StarredElement):
            self._target(t.value)
        elif isinstance(t, (cst.Attribute, cst.Subscript)):
            t.visit(self)  # `a.b = ...` / `a[i] = ...` read `a` (and `i`)

    def visit_AssignTarget(self, node: cst.AssignTarget) -> bool:
        self._target(node.target)
        return False

    def visit_AugAssign(self, node: cst.AugAssign) -> bool:
        node.target.visit(self)
        self._target(node.target)
        node.value.visit(self)
        return False

    def visit_AnnAssign(self, node: cst.AnnAssign) -> bool:
        if node.value is not None:
            self._target(node.target)
            node.value.visit(self)
        return False

    def visit_For(self, node: cst.For) -> None:
        self._target(node.target)

    def visit_CompFor(self, node: cst.CompFor) -> None:
        self._target(node.target)

    def visit_AsName(self, node: cst.AsName) -> bool:
        self._target(node.name)
        return False

    def visit_NamedExpr(self, node: cst.NamedExpr) -> bool:
        self._target(node.target)
        node.value.visit(self)
        return False

    def visit_Import(self, node: cst.Import) -> bool:
        for a in node.names:
            if a.asname is not None and isinstance(a.asname.name, cst.Name):
                self.writes.add(a.asname.name.value)
            else:
                self.writes.add((dotted(a.name) or "").split(".")[0])
        return False

    def visit_ImportFrom(self, node: cst.ImportFrom) -> bool:
        if not isinstance(node.names, cst.ImportStar):
            for a in node.names:
                if a.asname is not None and isinstance(a.asname.name, cst.Name):
                    self.writes.add(a.asname.name.value)
                elif isinstance(a.name, cst.Name):
                    self.writes.add(a.name.value)
        return False

    def visit_FunctionDef(self, node: cst.FunctionDef) -> bool:
        self.writes.add(node.name.value)
        for d in node.decorators:
            d.visit(self)
        return False

    def visit_ClassDef(self, node: cst.ClassDef) -> bool:
        self.writes.add(node.name.value)
        for b in node.bases:
            b.visit(self)
        return False

    def visit_Lambda(self, node: cst.Lambda) -> bool:
        self.opaque = True
        return False

    def visit_GeneratorExp(self, node: cst.GeneratorExp) -> bool:
        self.opaque = True
        return False


def reads_writes(node: cst.CSTNode) -> Tuple[Set[str], Set[str]]:
    """(names read, names bound) by a statement or expression."""
    v = _ReadsWrites()
    node.visit(v)
    return v.reads, v.writes


def mutations(node: cst.CSTNode) -> Set[str]:
    """The objects a statement changes without rebinding a name, as dotted keys: the targets of
    attribute and subscript assignments (`x.requires_grad = True` -> `x.requires_grad`, `x[i] = v`
    -> `x`) and the receivers of in-place methods (`x.requires_grad_()`, `x.add_(y)` -> `x`)."""
    out: Set[str] = set()

    def target(t: cst.CSTNode) -> None:
        if isinstance(t, (cst.Tuple, cst.List)):
            for e in t.elements:
                target(e.value)
        elif isinstance(t, cst.Attribute) and dotted(t) is not None:
            out.add(dotted(t))  # type: ignore[arg-type]
        elif isinstance(t, cst.Subscript) and dotted(t.value) is not None:
            out.add(dotted(t.value))  # type: ignore[arg-type]

    stack = [node]
    while stack:
        n = stack.pop()
        if isinstance(n, (cst.Lambda, cst.FunctionDef, cst.ClassDef)):
            continue
        if isinstance(n, cst.AssignTarget):
            target(n.target)
        elif isinstance(n, (cst.AugAssign, cst.AnnAssign)):
            target(n.target)
        elif isinstance(n, cst.Call) and isinstance(n.func, cst.Attribute) and dotted(n.func.value) is not None:
            name = n.func.attr.value
            if name.endswith("_") and not name.startswith("_"):
                out.add(dotted(n.func.value))  # type: ignore[arg-type]
        stack.extend(child_nodes(n))
    return out


def dotted_reads(node: cst.CSTNode) -> Set[str]:
    """The names and attribute chains a statement or expression reads, each as its longest dotted
    key (`f(self.model, x)` -> `self.model`, `x`, `f`)."""
    out: Set[str] = set()
    stack = [node]
    while stack:
        n = stack.pop()
        key = dotted(n) if isinstance(n, (cst.Name, cst.Attribute)) else None
        if key is not None:
            out.add(key)
            continue
        stack.extend(child_nodes(n))
    return out


def overlaps(a: Set[str], b: Set[str]) -> bool:
    """Some key of `a` is a key of `b`, or one is an attribute of the other (`x` and `x.grad`)."""
    return any(p == q or p.startswith(q + ".") or q.startswith(p + ".") for p in a for q in b)


def names_bound(stmts: Iterable[cst.CSTNode]) -> Set[str]:
    out: Set[str] = set()
    for s in stmts:
        out |= reads_writes(s)[1]
    return out


def uses_only(node: cst.CSTNode, bound: Set[str]) -> bool:
    """Every name `node` reads is in `bound` or a builtin, and nothing is read later (no
    lambda or generator expression)."""
    v = _ReadsWrites()
    node.visit(v)
    return not v.opaque and all(n in bound or n in BUILTIN_NAMES for n in v.reads - v.writes)


# What `binding_counts` does with a node, by its type: one dictionary lookup per node instead of
# a chain of `isinstance` tests, each a call of `ABCMeta.__instancecheck__` for LibCST's node
# classes (about 4% of a check of accelerate, bench/SPEED.md, twenty-ninth session). The types
# are `node_types`'s (subclasses included); in the order of the chain it replaced.
_OTHER, _TARGET, _AS, _DECLARED, _IMPORT, _DEFINED, _CAPTURE, _REST, _PARAMETERS = range(9)
_BINDING_KINDS: Dict[type, int] = {}
for _kind, _classes in (
        (_TARGET, (cst.AssignTarget, cst.AugAssign, cst.AnnAssign, cst.For, cst.CompFor, cst.NamedExpr, cst.Del)),
        (_AS, (cst.AsName,)), (_DECLARED, (cst.Global, cst.Nonlocal)), (_IMPORT, (cst.Import, cst.ImportFrom)),
        (_DEFINED, (cst.FunctionDef, cst.ClassDef)), (_CAPTURE, (cst.MatchAs, cst.MatchStar)),
        (_REST, (cst.MatchMapping,)), (_PARAMETERS, (cst.Parameters,))):
    for _t in node_types(*_classes):
        _BINDING_KINDS.setdefault(_t, _kind)
del _kind, _classes, _t


def binding_counts(func: cst.FunctionDef, memo: Dict[cst.FunctionDef, Dict[str, int]]) -> Dict[str, int]:
    """How many times each name is bound in `func`'s body, nested functions, classes and
    lambdas included (their parameters, `global`/`nonlocal` declarations and `del` count
    too): assignment, augmented and annotated targets, `for` and comprehension targets, `as`
    names, walrus targets, imports, definitions, match captures. Over-counts on purpose:
    a name counted here is not known to hold what the function received."""
    found = memo.get(func)
    if found is not None:
        return found
    out: Dict[str, int] = {}

    def add(name: str) -> None:
        out[name] = out.get(name, 0) + 1

    def target(t: cst.CSTNode) -> None:
        if isinstance(t, cst.Name):
            add(t.value)
        elif isinstance(t, (cst.Tuple, cst.List)):
            for e in t.elements:
                target(e.value)
        elif isinstance(t, cst.StarredElement):
            target(t.value)

    stack: List[cst.CSTNode] = [func.body]
    while stack:
        n = stack.pop()
        kind = _BINDING_KINDS.get(type(n), _OTHER)
        if kind == _OTHER:  # most nodes: they bind nothing
            pass
        elif kind == _TARGET:
            target(n.target)  # type: ignore[attr-defined]
        elif kind == _AS:
            target(n.name)  # type: ignore[attr-defined]
        elif kind == _DECLARED:
            for item in n.names:  # type: ignore[attr-defined]
                add(item.name.value)
        elif kind == _IMPORT:
            for name in reads_writes(n)[1]:
                add(name)
        elif kind == _DEFINED:
            add(n.name.value)  # type: ignore[attr-defined]
        elif kind == _CAPTURE:
            if n.name is not None:  # type: ignore[attr-defined]
                add(n.name.value)  # type: ignore[attr-defined]
        elif kind == _REST:
            if n.rest is not None:  # type: ignore[attr-defined]
                add(n.rest.value)  # type: ignore[attr-defined]
        elif kind == _PARAMETERS:
            for prm in (*n.posonly_params, *n.params, *n.kwonly_params):  # type: ignore[attr-defined]
                add(prm.name.value)
            for star in (n.star_arg, n.star_kwarg):  # type: ignore[attr-defined]
                if isinstance(star, cst.Param):
                    add(star.name.value)
        stack.extend(child_nodes(n))
    memo[func] = out
    return out
