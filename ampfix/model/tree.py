"""The one indexing pass over a parsed file, and navigation over it.

`Index` visits the tree once and records parents, text order (pre- and post-order), scopes,
calls, imports, local bindings, assignments, functions and classes. It replaces LibCST's
parent, position, scope and qualified-name providers (four passes, several times slower);
positions are computed only for the nodes that are reported.

`Tree` is the part of `AmpModel` that answers structural questions: parent, ancestors,
statement, block, scope, enclosing loop/function/class, text order, source text.
"""

from __future__ import annotations

import ast as pyast
import dataclasses
import re
from collections import defaultdict
from typing import Callable, DefaultDict, Dict, FrozenSet, Iterator, List, Optional, Sequence, Set, Tuple

import libcst as cst
from libcst import MaybeSentinel
from libcst._nodes.internal import CodegenState
from libcst.metadata import CodePosition, CodeRange

_NEWLINE_RE = re.compile(r"\r\n?|\n")  # as LibCST's position provider splits lines

BLOCK_TYPES = (cst.IndentedBlock, cst.Module)
SCOPE_TYPES = (cst.FunctionDef, cst.Lambda, cst.ClassDef, cst.Module)
LOOP_TYPES = (cst.For, cst.While)
COMPREHENSIONS = (cst.ListComp, cst.SetComp, cst.DictComp, cst.GeneratorExp)


def node_types(*classes: type) -> FrozenSet[type]:
    """`classes` and every class deriving from one of them (read when called): for a node,
    `type(node) in node_types(A, B)` is `isinstance(node, (A, B))`, without the `ABCMeta` check
    that every `isinstance` against a LibCST class goes through (~140 ns each, millions per
    large project; bench/SPEED.md, sixth session). For the hot paths; LibCST defines all its
    node classes when it is imported, and ampfix derives none."""
    out: Set[type] = set()
    todo = list(classes)
    while todo:
        c = todo.pop()
        if c not in out:
            out.add(c)
            todo.extend(c.__subclasses__())
    return frozenset(out)


FUNCTION_BOUNDARY = node_types(cst.FunctionDef, cst.Lambda, cst.ClassDef)
_STATEMENTS = node_types(cst.SimpleStatementLine, cst.BaseCompoundStatement)
_IMPORTS = node_types(cst.Import, cst.ImportFrom)


_NAME, _ATTRIBUTE, _OTHER = 1, 2, 0
_DOTTED_KIND: Dict[type, int] = {}  # node type -> what `dotted` does with it (`isinstance` through ABCMeta is slow)


def _dotted_kind(cls: type) -> int:
    kind = _DOTTED_KIND.get(cls)
    if kind is None:
        kind = _DOTTED_KIND[cls] = (_NAME if issubclass(cls, cst.Name) else
                                    _ATTRIBUTE if issubclass(cls, cst.Attribute) else _OTHER)
    return kind


def dotted(node: Optional[cst.CSTNode]) -> Optional[str]:
    """`a.b.c` for a chain of Names/Attributes, else None."""
    kind = _DOTTED_KIND.get(type(node))
    if kind is None:
        kind = _dotted_kind(type(node))
    if kind == _NAME:
        return node.value  # type: ignore[union-attr]
    if kind == _ATTRIBUTE:
        base = dotted(node.value)  # type: ignore[union-attr]
        return None if base is None else f"{base}.{node.attr.value}"  # type: ignore[union-attr]
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


# ----------------------------------------------------------------------------- node kinds
#
# The index walks the tree itself instead of through `CSTNode.visit`: LibCST's visit rebuilds
# every node it passes (`_visit_and_replace_children` constructs and validates a copy), and
# every `isinstance` test against its node classes goes through `ABCMeta`. Each node type is
# looked up once per process in one table (`_Kind`): the fields that hold its children, in the
# order LibCST visits them (text order), and what the index records for it.


class _Kind:
    __slots__ = ("fields", "scope", "handler")

    def __init__(self, fields: Optional[Tuple[str, ...]], scope: bool, handler: Optional[Callable[["Index", cst.CSTNode], None]]):
        self.fields = fields
        self.scope = scope
        self.handler = handler


_KINDS: Dict[type, _Kind] = {}
_LEAVES: Set[type] = set()  # node types without children that record nothing of their own (whitespace)


class _FieldProbe(cst.CSTVisitor):
    """Records the fields LibCST's own visit walks for one node (its children not entered)."""

    def __init__(self, root: cst.CSTNode) -> None:
        super().__init__()
        self.root = root
        self.fields: List[str] = []

    def on_visit(self, node: cst.CSTNode) -> bool:
        return False

    def on_visit_attribute(self, node: cst.CSTNode, attribute: str) -> None:
        if node is self.root:
            self.fields.append(attribute)


def _child_fields(node: cst.CSTNode) -> Optional[Tuple[str, ...]]:
    """The fields of `node`'s type that hold children, in LibCST's visiting order: the field
    names its `_visit_and_replace_children` passes to `visit_*`, in the order they appear
    there (a code object lists its constants in order of first use). Checked against what
    LibCST's visit really walks on this first node of the type; None when they disagree."""
    cls = type(node)
    names = set(getattr(cls, "__dataclass_fields__", ()))
    code = getattr(getattr(cls, "_visit_and_replace_children", None), "__code__", None)
    if code is None:
        return None
    seen: List[str] = []
    for const in code.co_consts:
        if isinstance(const, str) and const in names and const not in seen:
            seen.append(const)
    probe = _FieldProbe(node)
    node._visit_and_replace_children(probe)
    if not set(probe.fields) <= set(seen) or probe.fields != [f for f in seen if f in probe.fields]:
        return None
    return tuple(seen)


def _kind(node: cst.CSTNode) -> _Kind:
    cls = type(node)
    kind = _KINDS.get(cls)
    if kind is None:
        # fields None: a node type this reading does not understand, walked by its `children`
        kind = _KINDS[cls] = _Kind(_child_fields(node), issubclass(cls, SCOPE_TYPES), _handler_for(cls))
        if kind.fields == () and not kind.scope and kind.handler is None:
            _LEAVES.add(cls)
    return kind


def child_nodes(node: cst.CSTNode) -> List[cst.CSTNode]:
    """`node.children`, read from the node's fields (`_Kind`, the walk's table): the same nodes in
    the same order, without LibCST's way of listing them (a visit that rebuilds the node)."""
    kind = _KINDS.get(type(node)) or _kind(node)
    if kind.fields is None:  # pragma: no cover - see `_kind`
        return list(node.children)
    out: List[cst.CSTNode] = []
    for name in kind.fields:
        value = getattr(node, name)
        if value is None or value is MaybeSentinel.DEFAULT:
            continue
        if type(value) is tuple or type(value) is list:
            out.extend(value)
        else:
            out.append(value)
    return out


def nodes_under(node: cst.CSTNode, kind: type) -> List[cst.CSTNode]:
    """The nodes of type `kind` at or under `node`, not looking into lambdas, functions and
    classes (their bodies run when called, not where they are written)."""
    out: List[cst.CSTNode] = []
    stack = [node]
    while stack:
        n = stack.pop()
        if isinstance(n, kind):
            out.append(n)
        if isinstance(n, (cst.Lambda, cst.FunctionDef, cst.ClassDef)):
            continue
        stack.extend(child_nodes(n))
    return out


_FIELDS: Dict[type, Tuple[Tuple[str, ...], Tuple[str, ...]]] = {}  # type -> (its other fields, its child fields)


def copied(node: cst.CSTNode, keep: Set[int], each: Callable[[cst.CSTNode, Optional[cst.CSTNode]], None],
           replace: Optional[Callable[[cst.CSTNode], Optional[cst.CSTNode]]] = None) -> Optional[cst.CSTNode]:
    """A copy of `node` made of new nodes, except the nodes whose id is in `keep` (used as they
    are, not looked into): what a fresh parse of its code would give, about 2.5 times faster
    (bench/SPEED.md, tenth session), and no node is shared with `node`. Built field by field,
    without LibCST's constructors (a copy of a tree needs no validation). `each(new, parent)`
    is called for every new node (its parent None for the copy's root), in no particular
    order. With `replace`, a node for which it gives one is that one (used as it is, not looked
    into): what a LibCST transformer whose `on_leave` returns it makes, and the nodes on the
    way to it are checked as LibCST's constructors check them (the same error). None when a
    node type's child fields are not known (`_kind`). (A module-level recursion, not a closure
    that calls itself: that would be a reference cycle through `each`, and the model it
    records into would wait for the cyclic collector.)"""
    if id(node) in keep:
        return node
    try:
        return _copy(node, None, keep, each, replace, [0])
    except _Unknown:  # pragma: no cover - see `_kind`
        return None


def _copy(n: cst.CSTNode, parent: Optional[cst.CSTNode], keep: Set[int],
          each: Callable[[cst.CSTNode, Optional[cst.CSTNode]], None],
          replace: Optional[Callable[[cst.CSTNode], Optional[cst.CSTNode]]], swaps: List[int]) -> cst.CSTNode:
    if replace is not None:
        other = replace(n)
        if other is not None:
            swaps[0] += 1
            return other
    cls = type(n)
    fields = _FIELDS.get(cls)
    if fields is None:
        kind = _KINDS.get(cls) or _kind(n)
        if kind.fields is None:  # pragma: no cover - see `_kind`
            raise _Unknown()
        fields = _FIELDS[cls] = (tuple(f.name for f in dataclasses.fields(cls) if f.name not in kind.fields), kind.fields)
    new = object.__new__(cls)
    set_field = object.__setattr__
    others, children = fields
    for name in others:
        set_field(new, name, getattr(n, name))
    before = swaps[0]
    for name in children:
        value = getattr(n, name)
        if type(value) is tuple or type(value) is list:
            value = type(value)([v if id(v) in keep else _copy(v, new, keep, each, replace, swaps) for v in value])
        elif value is not None and value is not MaybeSentinel.DEFAULT and id(value) not in keep:
            value = _copy(value, new, keep, each, replace, swaps)
        set_field(new, name, value)
    if swaps[0] != before:
        new._validate()  # (what `with_changes` would check of a node rebuilt around a replacement)
    each(new, parent)
    return new


class _Unknown(Exception):
    pass


class Index(cst.CSTVisitor):
    """One pass over the tree (see the module docstring): `Index.of(module)`. (Visiting a
    module with it, `module.visit(Index())`, records the same, more slowly.)

    Parents, scopes and pre/post order are kept in lists by a node's position in `nodes` (text
    order), and `_slot` maps `id(node)` to that position. A dict keyed by the node itself would
    hash through LibCST's Python-level `CSTNode.__hash__` (identity, but one Python call per
    insertion and lookup: four per node, a fifth of the analysis); `id()` is a C call, and the
    lists are filled by `append` during the walk. `nodes` keeps every node of the tree alive, so
    an id in `_slot` cannot be reused by another node while the index lives. Nodes that are not
    part of the tree (synthetic expressions of the model, `set_parent`/`set_scope`) are kept in
    `_extra`, with the node itself, for the same reason. Ask through `parent`, `scope_of`,
    `order_of`, `post_of`."""

    def __init__(self) -> None:
        super().__init__()
        self.nodes: List[cst.CSTNode] = []  # every node, in text order (pre-order)
        self.parent_at: List[Optional[cst.CSTNode]] = []  # by position in `nodes`
        self.scope_at: List[Optional[cst.CSTNode]] = []  # by position (None: the module itself)
        self.post_at: List[int] = []  # post-order number, by position
        self._slot: Dict[int, int] = {}  # id(node) -> position in `nodes`, built once the tree is walked
        # id(node) -> (node, parent, scope) for nodes outside the tree given a parent or scope
        self._extra: Dict[int, Tuple[cst.CSTNode, Optional[cst.CSTNode], Optional[cst.CSTNode]]] = {}
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
        self._stack: List[int] = []  # positions of the open nodes (visitor form)
        self._scopes: List[cst.CSTNode] = []
        self._done = 0  # nodes left so far (the next post-order number)

    @classmethod
    def of(cls, module: cst.CSTNode) -> "Index":
        """The index of `module` (a tree walked once, one call per node)."""
        index = cls()
        nodes, parent_at, scope_at, post_at = index.nodes, index.parent_at, index.scope_at, index.post_at
        add_node, add_parent, add_scope, add_post = nodes.append, parent_at.append, scope_at.append, post_at.append
        by_type: DefaultDict[type, List[cst.CSTNode]] = defaultdict(list)
        scopes = index._scopes
        kinds = _KINDS
        leaves = _LEAVES
        sentinel = MaybeSentinel.DEFAULT
        done = 0  # the next post-order number

        def walk(node: cst.CSTNode, parent: Optional[cst.CSTNode], scope: Optional[cst.CSTNode]) -> None:
            nonlocal done
            cls_ = type(node)
            kind = kinds.get(cls_) or _kind(node)
            at = len(nodes)
            add_node(node)
            add_parent(parent)
            add_scope(scope)
            add_post(-1)  # set when the node is left
            by_type[cls_].append(node)
            inner = scope
            if kind.scope:
                scopes.append(node)
                inner = node
            if kind.handler is not None:
                kind.handler(index, node)  # the node is the last one recorded
            if kind.fields is None:  # pragma: no cover - see `_kind`
                for child in node.children:
                    walk(child, node, inner)
            else:
                for name in kind.fields:
                    value = getattr(node, name)
                    if value is None or value is sentinel:
                        continue
                    if type(value) is tuple or type(value) is list:
                        for child in value:
                            if type(child) in leaves:  # whitespace, most of a tree: no call
                                add_node(child)
                                add_parent(node)
                                add_scope(inner)
                                add_post(done)
                                done += 1
                                by_type[type(child)].append(child)
                            else:
                                walk(child, node, inner)
                    elif type(value) in leaves:
                        add_node(value)
                        add_parent(node)
                        add_scope(inner)
                        add_post(done)
                        done += 1
                        by_type[type(value)].append(value)
                    else:
                        walk(value, node, inner)
            post_at[at] = done
            done += 1
            if kind.scope:
                scopes.pop()

        walk(module, None, None)
        # (the recursive closure refers to itself: a cycle that would keep the tree's nodes until a collection)
        walk = None  # type: ignore[assignment]
        index._done = done
        index.by_type = dict(by_type)
        index._slot = dict(zip(map(id, nodes), range(len(nodes))))
        return index

    def on_visit(self, node: cst.CSTNode) -> bool:
        kind = _kind(node)
        self._stack.append(len(self.nodes))
        self.nodes.append(node)
        self.parent_at.append(self.nodes[self._stack[-2]] if len(self._stack) > 1 else None)
        self.scope_at.append(self._scopes[-1] if self._scopes else None)
        self.post_at.append(-1)
        self.by_type.setdefault(type(node), []).append(node)
        if kind.scope:
            self._scopes.append(node)
        if kind.handler is not None:
            kind.handler(self, node)
        return True

    def on_leave(self, original_node: cst.CSTNode) -> None:
        self.post_at[self._stack.pop()] = self._done
        self._done += 1
        if _kind(original_node).scope:
            self._scopes.pop()
        if not self._stack:  # the root is left: the tree is walked
            self._slot = dict(zip(map(id, self.nodes), range(len(self.nodes))))

    # ------------------------------------------------------------ lookups (by identity)
    def parent(self, node: cst.CSTNode) -> Optional[cst.CSTNode]:
        """The node whose child `node` is (None for the module and for unknown nodes)."""
        at = self._slot.get(id(node))
        if at is not None:
            return self.parent_at[at]
        extra = self._extra.get(id(node))
        return None if extra is None else extra[1]

    def scope_of(self, node: cst.CSTNode, default: Optional[cst.CSTNode] = None) -> Optional[cst.CSTNode]:
        """The innermost scope node (function, lambda, class, module) that holds `node`;
        `default` for the module itself and for nodes without one."""
        at = self._slot.get(id(node))
        if at is not None:
            scope = self.scope_at[at]
        else:
            extra = self._extra.get(id(node))
            scope = None if extra is None else extra[2]
        return default if scope is None else scope

    def order_of(self, node: cst.CSTNode) -> int:
        """`node`'s position in text order (pre-order); KeyError for a node not in the tree."""
        return self._slot[id(node)]

    def post_of(self, node: cst.CSTNode) -> int:
        """`node`'s number in evaluation order (post-order); KeyError for a node not in the tree."""
        return self.post_at[self._slot[id(node)]]

    def set_parent(self, node: cst.CSTNode, parent: cst.CSTNode) -> None:
        """Give `node` (a synthetic expression of the model, usually not in the tree) a parent."""
        at = self._slot.get(id(node))
        if at is not None:
            self.parent_at[at] = parent
        else:
            _, _, scope = self._extra.get(id(node), (node, None, None))
            self._extra[id(node)] = (node, parent, scope)

    def adopt(self, node: cst.CSTNode, parent: cst.CSTNode) -> None:
        """`set_parent` for a node made just now (not in the tree, no parent nor scope yet)."""
        self._extra[id(node)] = (node, parent, None)

    def set_scope(self, node: cst.CSTNode, scope: cst.CSTNode) -> None:
        """Give `node` (as `set_parent`) a scope."""
        at = self._slot.get(id(node))
        if at is not None:
            self.scope_at[at] = scope
        else:
            _, parent, _ = self._extra.get(id(node), (node, None, None))
            self._extra[id(node)] = (node, parent, scope)

    # ------------------------------------------------------------ what a node records
    def _on_call(self, node: cst.Call) -> None:
        self.calls.append(node)

    def _on_function(self, node: cst.FunctionDef) -> None:
        self.functions.setdefault(node.name.value, []).append(node)
        self._bind_local(self.scope_at[-1], node.name.value)  # the node is the last recorded
        params = node.params
        for p in (*params.posonly_params, *params.params, *params.kwonly_params):
            self._bind_local(node, p.name.value)
        for p in (params.star_arg, params.star_kwarg):
            if isinstance(p, cst.Param):
                self._bind_local(node, p.name.value)

    def _on_lambda(self, node: cst.Lambda) -> None:
        params = node.params
        for p in (*params.posonly_params, *params.params, *params.kwonly_params):
            self._bind_local(node, p.name.value)

    def _on_class(self, node: cst.ClassDef) -> None:
        self.classes.setdefault(node.name.value, node)
        self._bind_local(self.scope_at[-1], node.name.value)  # the node is the last recorded

    def _on_assign(self, node: cst.Assign) -> None:
        for t in node.targets:
            self._assign(node, t.target, node.value)

    def _on_ann_assign(self, node: cst.AnnAssign) -> None:
        self._assign(node, node.target, node.value)

    def _on_aug_assign(self, node: cst.AugAssign) -> None:
        self._assign(node, node.target, None)

    def _on_named_expr(self, node: cst.NamedExpr) -> None:
        self._assign(node, node.target, node.value)

    def _on_import(self, node: cst.Import) -> None:
        for alias in node.names:
            full = dotted(alias.name)
            if full is None:
                continue
            if alias.asname is not None and isinstance(alias.asname.name, cst.Name):
                self._bind_import(alias.asname.name.value, full, node, alias)
            else:
                root = full.split(".")[0]
                self._bind_import(root, root, node, alias)

    def _on_import_from(self, node: cst.ImportFrom) -> None:
        if isinstance(node.names, cst.ImportStar):
            return
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

    def _on_for(self, node: cst.CSTNode) -> None:
        self._assign(node, node.target, None)  # type: ignore[attr-defined]

    def _on_as_name(self, node: cst.AsName) -> None:
        parent = self.parent_at[-1]  # the node is the last recorded
        if isinstance(parent, cst.WithItem):
            # `with ThreadPoolExecutor() as pool`: pool is (usually) the manager
            self._assign(parent, node.name, parent.item)
        elif isinstance(parent, cst.ExceptHandler):
            self._assign(parent, node.name, None)

    def _on_global(self, node: cst.CSTNode) -> None:
        for n in node.names:  # type: ignore[attr-defined]
            self.declared.setdefault(self._scopes[-1], set()).add(n.name.value)

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


# the first matching class wins, as in an if/elif chain (a subclass takes its base's handler)
_HANDLERS: Tuple[Tuple[type, Callable[[Index, cst.CSTNode], None]], ...] = (
    (cst.Call, Index._on_call),
    (cst.FunctionDef, Index._on_function),
    (cst.Lambda, Index._on_lambda),
    (cst.ClassDef, Index._on_class),
    (cst.Assign, Index._on_assign),
    (cst.AnnAssign, Index._on_ann_assign),
    (cst.AugAssign, Index._on_aug_assign),
    (cst.NamedExpr, Index._on_named_expr),
    (cst.Import, Index._on_import),
    (cst.ImportFrom, Index._on_import_from),
    (cst.For, Index._on_for),
    (cst.CompFor, Index._on_for),
    (cst.AsName, Index._on_as_name),
    (cst.Global, Index._on_global),
    (cst.Nonlocal, Index._on_global),
)


def _handler_for(cls: type) -> Optional[Callable[[Index, cst.CSTNode], None]]:
    for base, handler in _HANDLERS:
        if issubclass(cls, base):
            return handler
    return None


# ----------------------------------------------------------------------------- positions


class _Record:
    """`record_syntactic_position` of LibCST's `PositionProvidingCodegenState`, as a plain
    context manager."""

    __slots__ = ("state", "node", "start_node", "end_node", "start")

    def __init__(self, state: "_PositionState", node: cst.CSTNode, start_node: Optional[cst.CSTNode],
                 end_node: Optional[cst.CSTNode]) -> None:
        self.state, self.node, self.start_node, self.end_node = state, node, start_node, end_node

    def __enter__(self) -> None:
        self.start = (self.state.line, self.state.column)

    def __exit__(self, *exc: object) -> None:
        state = self.state
        computed = state.computed
        start = computed[self.start_node][0] if self.start_node is not None else self.start
        end = computed[self.end_node][1] if self.end_node is not None else (state.line, state.column)
        computed[self.node] = (start, end)


class _PositionState(CodegenState):
    """The code generation state of LibCST's `PositionProvider` (same lines and columns, the
    same syntactic ranges), keeping plain tuples: no `CodeRange` per node, no metadata visit."""

    def __init__(self, module: cst.Module) -> None:
        super().__init__(default_indent=module.default_indent, default_newline=module.default_newline)
        self.computed: Dict[cst.CSTNode, Tuple[Tuple[int, int], Tuple[int, int]]] = {}
        self.line = 1  # one-indexed
        self.column = 0  # zero-indexed
        self._starts: List[Tuple[int, int]] = []

    def add_indent_tokens(self) -> None:
        for token in self.indent_tokens:
            self.add_token(token)

    def add_token(self, value: str) -> None:
        self.tokens.append(value)
        if "\n" in value or "\r" in value:
            segments = _NEWLINE_RE.split(value)
            self.line += len(segments) - 1
            self.column = len(segments[-1])
        else:
            self.column += len(value)

    def before_codegen(self, node: cst.CSTNode) -> None:
        self._starts.append((self.line, self.column))

    def after_codegen(self, node: cst.CSTNode) -> None:
        start = self._starts.pop()
        if node not in self.computed:
            self.computed[node] = (start, (self.line, self.column))

    def record_syntactic_position(self, node: cst.CSTNode, *, start_node: Optional[cst.CSTNode] = None,
                                  end_node: Optional[cst.CSTNode] = None) -> _Record:  # type: ignore[override]
        return _Record(self, node, start_node, end_node)


def positions(module: cst.Module) -> Dict[cst.CSTNode, Tuple[Tuple[int, int], Tuple[int, int]]]:
    """node -> ((line, column), (end line, end column)) for every node of `module`: what
    LibCST's `PositionProvider` computes, in one code generation pass."""
    state = _PositionState(module)
    module._codegen(state)
    return state.computed


def _plain_dotted(node: cst.CSTNode) -> Optional[str]:
    """The code of a name or attribute chain written without parentheses or blanks around its
    dots (`self.scaler.step`): its `dotted` name, without generating its code. None otherwise."""
    cur = node
    while type(cur) is cst.Attribute:
        dot = cur.dot  # type: ignore[attr-defined]
        if cur.lpar or cur.rpar or type(dot) is not cst.Dot \
                or not _no_space(dot.whitespace_before) or not _no_space(dot.whitespace_after):  # type: ignore[attr-defined]
            return None
        cur = cur.value  # type: ignore[attr-defined]
    if type(cur) is not cst.Name or cur.lpar or cur.rpar:  # type: ignore[attr-defined]
        return None
    return dotted(node)


def _no_space(ws: cst.BaseParenthesizableWhitespace) -> bool:
    return type(ws) is cst.SimpleWhitespace and ws.value == ""  # type: ignore[attr-defined]


def _pair_statements(stmts: Sequence[cst.BaseStatement], nodes: List[pyast.stmt],
                     out: Dict[int, int]) -> Optional[List[Tuple[cst.BaseStatement, pyast.stmt]]]:
    """Pair LibCST statements with CPython's (a simple statement line is as many statements as
    it holds), recording id() -> the line CPython gives each: the pairs, or None when they do
    not pair up."""
    pairs, i = [], 0
    for stmt in stmts:
        n = len(stmt.body) if isinstance(stmt, cst.SimpleStatementLine) else 1
        if i + n > len(nodes):
            return None
        out[id(stmt)] = nodes[i].lineno
        pairs.append((stmt, nodes[i]))
        i += n
    return pairs if i == len(nodes) else None


class Tree:
    """Structural queries over the indexed tree (a part of `AmpModel`)."""

    module: cst.Module
    _index: Index

    def _init_tree(self, module: cst.Module, index: Optional[Index] = None) -> None:
        """`index`: one another model built of this same tree (a summary's, `Project._summarize`),
        read-only but for the synthetic nodes each model adds (`Index.set_parent`)."""
        self.module = module
        if index is None or not index.nodes or index.nodes[0] is not module:
            index = Index.of(module)
        self._index = index
        self._parent = index.parent
        self._slot, self._parent_at, self._scope_at = index._slot, index.parent_at, index.scope_at  # hot lookups
        self._positions: Optional[Dict[cst.CSTNode, CodeRange]] = None

    # ---------------------------------------------------------------- navigation
    def parent(self, node: cst.CSTNode) -> Optional[cst.CSTNode]:
        return self._parent(node)

    def ancestors(self, node: cst.CSTNode) -> Iterator[cst.CSTNode]:
        slot, parent_at = self._slot, self._parent_at
        at = slot.get(id(node))
        cur = parent_at[at] if at is not None else self._parent(node)
        while cur is not None:
            yield cur
            at = slot.get(id(cur))
            cur = parent_at[at] if at is not None else self._parent(cur)

    def is_ancestor(self, anc: cst.CSTNode, node: cst.CSTNode) -> bool:
        return any(p is anc for p in self.ancestors(node))

    def position(self, node: cst.CSTNode) -> CodeRange:
        """Line/column range of `node`, as LibCST's `PositionProvider` gives it. Computed on
        first use (only files with something to report need positions), by generating the code
        of the top-level statement that holds `node` alone, placed at the line CPython's parser
        gives that statement, and checked against the source text; where that cannot be done
        (no source text, CPython rejects it, the check fails), by one pass over the module."""
        if self._positions is None:
            self._positions = {}
        found = self._positions.get(node)
        if found is None:
            (sl, sc), (el, ec) = self._raw_position(node)
            found = self._positions[node] = CodeRange(CodePosition(sl, sc), CodePosition(el, ec))
        return found

    def _raw_position(self, node: cst.CSTNode) -> Tuple[Tuple[int, int], Tuple[int, int]]:
        whole = self.__dict__.get("_raw_positions")
        if whole is not None:
            return whole[node]
        parts = self.__dict__.setdefault("_part_positions", {})
        chain = [node]  # node and its ancestors below the module
        for anc in self.ancestors(node):
            if anc is self.module:
                break
            chain.append(anc)
        top = chain[-1]
        if top is not node or self._parent(node) is self.module:
            # the statement of a top-level class's or function's body that holds `node` (a
            # method: its code alone, not its whole class's), then the top-level statement
            unit = chain[-3] if len(chain) >= 3 and type(chain[-2]) is cst.IndentedBlock else top
            for stmt in (unit, top) if unit is not top else (top,):
                part = parts.get(stmt)
                if part is None:
                    part = parts[stmt] = self._statement_positions(stmt) or {}
                found = part.get(node)
                if found is not None:
                    return found
        whole = self.__dict__["_raw_positions"] = positions(self.module)
        return whole[node]

    def _statement_positions(self, top: cst.CSTNode) -> Optional[Dict[cst.CSTNode, Tuple[Tuple[int, int], Tuple[int, int]]]]:
        """The positions of every node of `top` (see `position`), or None: a top-level statement,
        a line of the module's header, or a statement of the body of a top-level class or
        function (its code generated alone, at its block's indentation)."""
        text = self.__dict__.get("source_text")
        if text is None:
            return None
        # the lines before each top-level statement, when the caller knows them (the language
        # server's re-parse keeps the statements' lengths); checked against the text below
        shifts = self.__dict__.get("top_shifts")
        shift = (shifts or {}).get(id(top))
        if shift is None and shifts is not None and self._parent(top) is not self.module:
            return None  # (the language server's re-parse: top-level statements, no CPython parse)
        lines = self._top_lines() if shift is None else None
        if shift is None and (lines is None or id(top) not in lines):
            return None
        state = _PositionState(self.module)
        block = self._parent(top)
        if isinstance(block, cst.IndentedBlock):
            state.increase_indent(self.module.default_indent if block.indent is None else block.indent)
        top._codegen(state)
        computed = state.computed
        if shift is None:
            assert lines is not None
            # the line CPython gives a statement is its keyword's or first token's; for a def or a
            # class that is the line of `def`/`class`, after the decorators: anchor on its name there
            anchor = top.name if isinstance(top, (cst.FunctionDef, cst.ClassDef)) else top  # type: ignore[attr-defined]
            shift = lines[id(top)] - computed[anchor][0][0]
        starts = self.__dict__.get("_line_starts")
        if starts is None:
            starts = self.__dict__["_line_starts"] = [0] + [m.end() for m in _NEWLINE_RE.finditer(text)]
        if not 0 <= shift < len(starts):
            return None
        offset = starts[shift]  # where the statement's first line (its leading lines included) starts
        code = "".join(state.tokens)
        if not text.startswith(code, offset):
            # the file's last statement, when the file does not end with a line break
            last = state.tokens[-1] if state.tokens else ""
            if not (top is self.module.body[-1] and not self.module.has_trailing_newline and last
                    and offset + len(code) - len(last) == len(text) and text.startswith(code[: -len(last)], offset)):
                return None
        return {n: ((sl + shift, sc), (el + shift, ec)) for n, ((sl, sc), (el, ec)) in computed.items()}

    def _top_lines(self) -> Optional[Dict[int, int]]:
        """id() of each top-level statement, and of each statement of a top-level class's or
        function's body -> the line CPython's parser gives it; id() of each line of the module's
        header -> its line (None when there is no source text, CPython cannot parse it, or the
        top-level statements do not pair up; a body whose statements do not pair up is left out)."""
        if "_top_line_map" in self.__dict__:
            return self.__dict__["_top_line_map"]
        out: Optional[Dict[int, int]] = None
        text = self.__dict__.get("source_text")
        if text is not None:
            try:
                body = pyast.parse(text).body
            except (SyntaxError, ValueError, RecursionError, MemoryError, OverflowError):
                body = None
            if body is not None:
                out = {}
                pairs = _pair_statements(self.module.body, body, out)
                if pairs is None:
                    out = None
                else:
                    for i, h in enumerate(self.module.header):
                        out[id(h)] = i + 1  # the header is the file's first lines
                    for stmt, node in pairs:
                        if type(stmt) in (cst.ClassDef, cst.FunctionDef) and type(stmt.body) is cst.IndentedBlock \
                                and isinstance(node, (pyast.ClassDef, pyast.FunctionDef, pyast.AsyncFunctionDef)):
                            inner: Dict[int, int] = {}
                            if _pair_statements(stmt.body.body, node.body, inner) is not None:
                                out.update(inner)
        self.__dict__["_top_line_map"] = out
        return out

    def _known_line(self, node: cst.CSTNode) -> Optional[int]:
        """The line of `node` when its position is computed already (None: not yet)."""
        found = self._positions.get(node) if self._positions is not None else None
        return found.start.line if found is not None else None

    def start(self, node: cst.CSTNode) -> Tuple[int, int]:
        pos = self.position(node).start
        return (pos.line, pos.column)

    def line(self, node: cst.CSTNode) -> int:
        return self.position(node).start.line

    def before(self, a: cst.CSTNode, b: cst.CSTNode) -> bool:
        """True when `a` starts before `b` in the text (an ancestor comes before its children)."""
        return self._index.order_of(a) < self._index.order_of(b)

    def nodes_of(self, *types: type) -> List[cst.CSTNode]:
        """Every node of these exact types, in text order (from the one indexing pass)."""
        found = [n for t in types for n in self._index.by_type.get(t, [])]
        if len(types) > 1:
            found.sort(key=self._index.order_of)
        return found

    def _nodes_in_scope(self, scope: cst.CSTNode, cls: type) -> List[cst.CSTNode]:
        """`[n for n in self.nodes_of(cls) if self.scope_of(n) is scope]`, grouped once per type."""
        groups_by_type = self.__dict__.setdefault("_scope_groups", {})
        groups = groups_by_type.get(cls)
        if groups is None:
            groups = groups_by_type[cls] = {}
            scope_of, module = self._index.scope_of, self.module
            for n in self._index.by_type.get(cls, ()):
                groups.setdefault(scope_of(n, module), []).append(n)
        return groups.get(scope, [])

    def code(self, node: cst.CSTNode) -> str:
        """The source text of `node`, without surrounding whitespace."""
        plain = _plain_dotted(node)
        return plain if plain is not None else self.module.code_for_node(node).strip()

    def in_import(self, node: cst.CSTNode) -> bool:
        return any(type(a) in _IMPORTS for a in self.ancestors(node))

    def statement_of(self, node: cst.CSTNode) -> Optional[cst.BaseStatement]:
        """The statement (simple line or compound) that directly contains `node`."""
        cur: Optional[cst.CSTNode] = node
        while cur is not None and type(cur) not in _STATEMENTS:
            cur = self._parent(cur)
        return cur  # type: ignore[return-value]

    def small_statement_of(self, node: cst.CSTNode) -> Optional[cst.BaseSmallStatement]:
        cur: Optional[cst.CSTNode] = node
        while cur is not None and not isinstance(cur, cst.BaseSmallStatement):
            if isinstance(cur, (cst.BaseCompoundStatement, cst.SimpleStatementLine)):
                return None
            cur = self._parent(cur)
        return cur  # type: ignore[return-value]

    def block_of(self, stmt: cst.CSTNode) -> Optional[cst.CSTNode]:
        """The block (IndentedBlock or Module) whose body holds `stmt` directly, if any."""
        parent = self._parent(stmt)
        if isinstance(parent, BLOCK_TYPES) and any(s is stmt for s in parent.body):
            return parent
        return None

    def _statement_in(self, node: cst.CSTNode, block: cst.CSTNode) -> Optional[cst.BaseStatement]:
        """The statement of `block` (its direct child) that holds `node`, if any."""
        cur: Optional[cst.CSTNode] = node
        while cur is not None:
            parent = self._parent(cur)
            if parent is block:
                return cur  # type: ignore[return-value]
            cur = parent
        return None

    def scope_of(self, node: cst.CSTNode) -> cst.CSTNode:
        """The innermost function, lambda, class body or module that runs `node`."""
        at = self._slot.get(id(node))  # (`Index.scope_of`, inlined: asked very often)
        if at is None:
            return self._index.scope_of(node, self.module)  # type: ignore[return-value]
        scope = self._scope_at[at]
        return self.module if scope is None else scope

    def function_of(self, node: cst.CSTNode) -> Optional[cst.FunctionDef]:
        """The innermost `def` whose body runs `node` (None at module or class level)."""
        scope = self.scope_of(node)
        while type(scope) is cst.Lambda:
            scope = self.scope_of(scope)
        return scope if type(scope) is cst.FunctionDef else None  # type: ignore[return-value]

    def class_of(self, func: cst.CSTNode) -> Optional[cst.ClassDef]:
        """The class whose body defines `func` directly (a method), else None."""
        scope = self._index.scope_of(func)
        return scope if type(scope) is cst.ClassDef else None  # type: ignore[return-value]

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
