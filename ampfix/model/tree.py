"""The one indexing pass over a parsed file, and navigation over it.

`Index` visits the tree once and records parents, text order (pre- and post-order), scopes,
calls, imports, local bindings, assignments, functions and classes. It replaces LibCST's
parent, position, scope and qualified-name providers (four passes, several times slower);
positions are computed only for the nodes that are reported.

`Tree` is the part of `AmpModel` that answers structural questions: parent, ancestors,
statement, block, scope, enclosing loop/function/class, text order, source text.
"""

from __future__ import annotations

from typing import Dict, Iterator, List, Optional, Set, Tuple

import libcst as cst
from libcst.metadata import CodeRange

from ampfix.model.positions import Positions

BLOCK_TYPES = (cst.IndentedBlock, cst.Module)
SCOPE_TYPES = (cst.FunctionDef, cst.Lambda, cst.ClassDef, cst.Module)
LOOP_TYPES = (cst.For, cst.While)
COMPREHENSIONS = (cst.ListComp, cst.SetComp, cst.DictComp, cst.GeneratorExp)


def dotted(node: Optional[cst.CSTNode]) -> Optional[str]:
    """`a.b.c` for a chain of Names/Attributes, else None."""
    if isinstance(node, cst.Name):
        return node.value
    if isinstance(node, cst.Attribute):
        base = dotted(node.value)
        return None if base is None else f"{base}.{node.attr.value}"
    return None


def target_names(target: cst.CSTNode) -> List[str]:
    """Plain names bound by an assignment target (`a`, `a, (b, *c)`)."""
    if isinstance(target, cst.Name):
        return [target.value]
    if isinstance(target, (cst.Tuple, cst.List)):
        return [n for el in target.elements for n in target_names(el.value)]
    if isinstance(target, cst.StarredElement):
        return target_names(target.value)
    return []


class Index(cst.CSTVisitor):
    """One pass over the tree (see the module docstring)."""

    def __init__(self) -> None:
        super().__init__()
        self.parents: Dict[cst.CSTNode, cst.CSTNode] = {}
        self.order: Dict[cst.CSTNode, int] = {}
        self.post: Dict[cst.CSTNode, int] = {}
        self.scope: Dict[cst.CSTNode, cst.CSTNode] = {}
        self.calls: List[cst.Call] = []
        self.functions: Dict[str, List[cst.FunctionDef]] = {}
        self.classes: Dict[str, cst.ClassDef] = {}
        # scope node -> bound name -> [(qualified name, the Import/ImportFrom node, the alias)]
        self.imports: Dict[cst.CSTNode, Dict[str, List[Tuple[str, cst.CSTNode, cst.ImportAlias]]]] = {}
        # scope node -> names bound locally by anything but an import (parameters, assignments)
        self.local_names: Dict[cst.CSTNode, Set[str]] = {}
        # scope node -> names declared `global` / `nonlocal` there
        self.declared: Dict[cst.CSTNode, Set[str]] = {}
        # (assign node, target expression, value expression or None for augmented/for/with targets)
        self.assignments: List[Tuple[cst.CSTNode, cst.BaseExpression, Optional[cst.BaseExpression]]] = []
        self.by_type: Dict[type, List[cst.CSTNode]] = {}
        self._stack: List[cst.CSTNode] = []
        self._scopes: List[cst.CSTNode] = []

    def on_visit(self, node: cst.CSTNode) -> bool:
        if self._stack:
            self.parents[node] = self._stack[-1]
        self.order[node] = len(self.order)
        self.by_type.setdefault(type(node), []).append(node)
        if self._scopes:
            self.scope[node] = self._scopes[-1]
        self._stack.append(node)
        if isinstance(node, SCOPE_TYPES):
            self._scopes.append(node)
        if isinstance(node, cst.Call):
            self.calls.append(node)
        elif isinstance(node, cst.FunctionDef):
            self.functions.setdefault(node.name.value, []).append(node)
            self._bind_local(self.scope.get(node), node.name.value)
            params = node.params
            for p in (*params.posonly_params, *params.params, *params.kwonly_params):
                self._bind_local(node, p.name.value)
            for p in (params.star_arg, params.star_kwarg):
                if isinstance(p, cst.Param):
                    self._bind_local(node, p.name.value)
        elif isinstance(node, cst.Lambda):
            params = node.params
            for p in (*params.posonly_params, *params.params, *params.kwonly_params):
                self._bind_local(node, p.name.value)
        elif isinstance(node, cst.ClassDef):
            self.classes.setdefault(node.name.value, node)
            self._bind_local(self.scope.get(node), node.name.value)
        elif isinstance(node, cst.Assign):
            for t in node.targets:
                self._assign(node, t.target, node.value)
        elif isinstance(node, cst.AnnAssign):
            self._assign(node, node.target, node.value)
        elif isinstance(node, (cst.AugAssign, cst.NamedExpr)):
            self._assign(node, node.target, node.value if isinstance(node, cst.NamedExpr) else None)
        elif isinstance(node, cst.Import):
            for alias in node.names:
                full = dotted(alias.name)
                if full is None:
                    continue
                if alias.asname is not None and isinstance(alias.asname.name, cst.Name):
                    self._bind_import(alias.asname.name.value, full, node, alias)
                else:
                    root = full.split(".")[0]
                    self._bind_import(root, root, node, alias)
        elif isinstance(node, cst.ImportFrom) and not isinstance(node.names, cst.ImportStar):
            base = dotted(node.module) if node.module is not None else ""
            dots = "." * len(node.relative)
            for alias in node.names:
                name = dotted(alias.name)
                if name is None:
                    continue
                bound = name
                if alias.asname is not None and isinstance(alias.asname.name, cst.Name):
                    bound = alias.asname.name.value
                self._bind_import(bound, f"{dots}{base}.{name}" if base else f"{dots}{name}", node, alias)
        elif isinstance(node, (cst.For, cst.CompFor)):
            self._assign(node, node.target, None)
        elif isinstance(node, cst.AsName) and isinstance(self.parents.get(node), cst.WithItem):
            item = self.parents[node]  # `with ThreadPoolExecutor() as pool`: pool is (usually) the manager
            self._assign(item, node.name, item.item)  # type: ignore[attr-defined]
        elif isinstance(node, cst.AsName) and isinstance(self.parents.get(node), cst.ExceptHandler):
            self._assign(self.parents[node], node.name, None)
        elif isinstance(node, (cst.Global, cst.Nonlocal)):
            for n in node.names:
                self.declared.setdefault(self._scopes[-1], set()).add(n.name.value)
        return True

    def on_leave(self, original_node: cst.CSTNode) -> None:
        self.post[original_node] = len(self.post)
        self._stack.pop()
        if isinstance(original_node, SCOPE_TYPES):
            self._scopes.pop()

    def _bind_import(self, name: str, qualified: str, stmt: cst.CSTNode, alias: cst.ImportAlias) -> None:
        scope = self._scopes[-1]
        self.imports.setdefault(scope, {}).setdefault(name, []).append((qualified, stmt, alias))

    def _bind_local(self, scope: Optional[cst.CSTNode], name: str) -> None:
        if scope is not None:
            self.local_names.setdefault(scope, set()).add(name)

    def _assign(self, node: cst.CSTNode, target: cst.BaseExpression, value: Optional[cst.BaseExpression]) -> None:
        self.assignments.append((node, target, value))
        for name in target_names(target):
            self._bind_local(self._scopes[-1], name)


class Tree:
    """Structural queries over the indexed tree (a part of `AmpModel`)."""

    module: cst.Module
    _index: Index

    def _init_tree(self, module: cst.Module) -> None:
        self.module = module
        index = Index()
        module.visit(index)
        self._index = index
        self._parents = index.parents
        self._positions: Optional[Positions] = None

    # ---------------------------------------------------------------- navigation
    def parent(self, node: cst.CSTNode) -> Optional[cst.CSTNode]:
        return self._parents.get(node)

    def ancestors(self, node: cst.CSTNode) -> Iterator[cst.CSTNode]:
        cur = self._parents.get(node)
        while cur is not None:
            yield cur
            cur = self._parents.get(cur)

    def is_ancestor(self, anc: cst.CSTNode, node: cst.CSTNode) -> bool:
        return any(p is anc for p in self.ancestors(node))

    def position(self, node: cst.CSTNode) -> CodeRange:
        """Line/column range of `node` (computed on first use, per top-level statement: only
        reported nodes need it; see ampfix/model/positions.py)."""
        if self._positions is None:
            self._positions = Positions(self.module, self._parents.get)
        return self._positions[node]

    def start(self, node: cst.CSTNode) -> Tuple[int, int]:
        pos = self.position(node).start
        return (pos.line, pos.column)

    def line(self, node: cst.CSTNode) -> int:
        return self.position(node).start.line

    def before(self, a: cst.CSTNode, b: cst.CSTNode) -> bool:
        """True when `a` starts before `b` in the text (an ancestor comes before its children)."""
        return self._index.order[a] < self._index.order[b]

    def finishes_before(self, a: cst.CSTNode, b: cst.CSTNode) -> bool:
        """True when `a` is evaluated before `b` within one statement (post-order: in
        `scaler.scale(loss).backward()` the `scale` call finishes first)."""
        return self._index.post[a] < self._index.post[b]

    def nodes_of(self, *types: type) -> List[cst.CSTNode]:
        """Every node of these exact types, in text order (from the one indexing pass)."""
        found = [n for t in types for n in self._index.by_type.get(t, [])]
        if len(types) > 1:
            found.sort(key=self._index.order.__getitem__)
        return found

    def code(self, node: cst.CSTNode) -> str:
        """The source text of `node`, without surrounding whitespace."""
        return self.module.code_for_node(node).strip()

    def in_import(self, node: cst.CSTNode) -> bool:
        return any(isinstance(a, (cst.Import, cst.ImportFrom)) for a in self.ancestors(node))

    def statement_of(self, node: cst.CSTNode) -> Optional[cst.BaseStatement]:
        """The statement (simple line or compound) that directly contains `node`."""
        cur: Optional[cst.CSTNode] = node
        while cur is not None and not isinstance(cur, (cst.SimpleStatementLine, cst.BaseCompoundStatement)):
            cur = self._parents.get(cur)
        return cur  # type: ignore[return-value]

    def small_statement_of(self, node: cst.CSTNode) -> Optional[cst.BaseSmallStatement]:
        cur: Optional[cst.CSTNode] = node
        while cur is not None and not isinstance(cur, cst.BaseSmallStatement):
            if isinstance(cur, (cst.BaseCompoundStatement, cst.SimpleStatementLine)):
                return None
            cur = self._parents.get(cur)
        return cur  # type: ignore[return-value]

    def block_of(self, stmt: cst.CSTNode) -> Optional[cst.CSTNode]:
        """The block (IndentedBlock or Module) whose body holds `stmt` directly, if any."""
        parent = self._parents.get(stmt)
        if isinstance(parent, BLOCK_TYPES) and any(s is stmt for s in parent.body):
            return parent
        return None

    def scope_of(self, node: cst.CSTNode) -> cst.CSTNode:
        """The innermost function, lambda, class body or module that runs `node`."""
        return self._index.scope.get(node, self.module)

    def function_of(self, node: cst.CSTNode) -> Optional[cst.FunctionDef]:
        """The innermost `def` whose body runs `node` (None at module or class level)."""
        scope = self.scope_of(node)
        while isinstance(scope, cst.Lambda):
            scope = self.scope_of(scope)
        return scope if isinstance(scope, cst.FunctionDef) else None

    def class_of(self, func: cst.CSTNode) -> Optional[cst.ClassDef]:
        """The class whose body defines `func` directly (a method), else None."""
        scope = self._index.scope.get(func)
        return scope if isinstance(scope, cst.ClassDef) else None

    def loop_of(self, node: cst.CSTNode, stop: Optional[cst.CSTNode] = None) -> Optional[cst.CSTNode]:
        """The innermost for/while loop around `node` (within its scope) whose body holds it."""
        child = node
        for anc in self.ancestors(node):
            if anc is stop or isinstance(anc, SCOPE_TYPES):
                return None
            if isinstance(anc, LOOP_TYPES) and child is anc.body:
                return anc
            child = anc
        return None

    @property
    def functions(self) -> Dict[str, List[cst.FunctionDef]]:
        return self._index.functions

    @property
    def classes(self) -> Dict[str, cst.ClassDef]:
        return self._index.classes

    @property
    def calls(self) -> List[cst.Call]:
        """Every call in the file, in text order."""
        return self._index.calls

    def method(self, cls: cst.ClassDef, name: str) -> Optional[cst.FunctionDef]:
        if isinstance(cls.body, cst.IndentedBlock):
            for stmt in cls.body.body:
                if isinstance(stmt, cst.FunctionDef) and stmt.name.value == name:
                    return stmt
        return None

    def methods(self, cls: cst.ClassDef) -> List[cst.FunctionDef]:
        if isinstance(cls.body, cst.IndentedBlock):
            return [s for s in cls.body.body if isinstance(s, cst.FunctionDef)]
        return []
