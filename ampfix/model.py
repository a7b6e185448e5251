"""The shared model of a training file that every rule queries.

Built once per file from LibCST metadata (qualified names, scopes, parents, positions).
It answers the questions rules share:

* what torch API an expression names, whatever the import style (`api_of`);
* which autocast region, if any, a node runs in (`region_of`);
* which expressions are GradScalers (`scaler_key`), optimizers, backward calls;
* the order of calls in one function body or loop iteration, and which nodes sit in
  mutually exclusive `if`/`else` branches (`calls_in_scope`, `exclusive`, `before`).
"""

from __future__ import annotations

import builtins
from dataclasses import dataclass
from typing import Dict, Iterator, List, Optional, Sequence, Set, Tuple

import libcst as cst
from libcst.metadata import CodeRange, MetadataWrapper, PositionProvider, QualifiedName, QualifiedNameSource

# --------------------------------------------------------------------------------------
# Canonical torch API names
# --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Api:
    """A torch API an expression refers to."""

    kind: str  # "autocast", "GradScaler", "clip_grad", "DataParallel", "autograd.backward", ...
    device: Optional[str] = None  # implied device for deprecated spellings ("cuda"/"cpu")
    deprecated: bool = False
    qualname: str = ""


def _api_table() -> Dict[str, Api]:
    table: Dict[str, Api] = {}

    def add(names: Sequence[str], kind: str, device: Optional[str] = None, deprecated: bool = False) -> None:
        for n in names:
            table[n] = Api(kind, device, deprecated, n)

    add(["torch.autocast", "torch.amp.autocast", "torch.amp.autocast_mode.autocast"], "autocast")
    add(["torch.cuda.amp.autocast", "torch.cuda.amp.autocast_mode.autocast"], "autocast", "cuda", True)
    add(["torch.cpu.amp.autocast", "torch.cpu.amp.autocast_mode.autocast"], "autocast", "cpu", True)
    add(["torch.amp.GradScaler", "torch.amp.grad_scaler.GradScaler", "torch.GradScaler"], "GradScaler")
    add(["torch.cuda.amp.GradScaler", "torch.cuda.amp.grad_scaler.GradScaler"], "GradScaler", "cuda", True)
    add(["torch.cpu.amp.GradScaler", "torch.cpu.amp.grad_scaler.GradScaler"], "GradScaler", "cpu", True)
    add(["torch.amp.custom_fwd", "torch.amp.autocast_mode.custom_fwd"], "custom_fwd")
    add(["torch.amp.custom_bwd", "torch.amp.autocast_mode.custom_bwd"], "custom_bwd")
    add(["torch.cuda.amp.custom_fwd", "torch.cuda.amp.autocast_mode.custom_fwd"], "custom_fwd", "cuda", True)
    add(["torch.cuda.amp.custom_bwd", "torch.cuda.amp.autocast_mode.custom_bwd"], "custom_bwd", "cuda", True)
    clip = ["clip_grad_norm_", "clip_grad_norm", "clip_grad_value_", "clip_grad_value"]
    add([f"torch.nn.utils.{c}" for c in clip] + [f"torch.nn.utils.clip_grad.{c}" for c in clip], "clip_grad")
    add(
        ["torch.nn.DataParallel", "torch.nn.parallel.DataParallel", "torch.nn.parallel.data_parallel.DataParallel"],
        "DataParallel",
    )
    add(["torch.autograd.backward"], "autograd.backward")
    add(["torch.autograd.Function", "torch.autograd.function.Function"], "autograd.Function")
    add(["torch.float16", "torch.half"], "dtype.float16")
    add(["torch.bfloat16"], "dtype.bfloat16")
    add(["torch.float32", "torch.float"], "dtype.float32")
    add(["contextlib.nullcontext"], "nullcontext")
    add(["torch.device"], "device")
    for opt in (
        "SGD Adam AdamW Adagrad Adadelta Adamax ASGD LBFGS NAdam RAdam RMSprop Rprop SparseAdam Adafactor Muon"
    ).split():
        add([f"torch.optim.{opt}"], "optimizer")
    return table


API_TABLE = _api_table()

BLOCK_TYPES = (cst.IndentedBlock, cst.Module)
SCOPE_TYPES = (cst.FunctionDef, cst.Lambda, cst.ClassDef, cst.Module)


@dataclass
class Region:
    """An enabled (or possibly enabled) autocast region."""

    node: cst.CSTNode  # the With or the decorated FunctionDef
    call: Optional[cst.Call]  # the autocast(...) call, when known
    api: Api
    device: Optional[str]  # "cuda", "cpu", ... when known
    dtype: Optional[str]  # "float16", "bfloat16", "float32", "dynamic" (non-literal) or None (default)
    enabled: Optional[bool]  # True, or None when not a literal (treated as enabled)
    dtype_node: Optional[cst.BaseExpression] = None


@dataclass
class BackwardCall:
    call: cst.Call
    kind: str  # "tensor" (x.backward()), "scaled" (scaler.scale(x).backward()), "autograd"
    scaler: Optional[str] = None  # scaler key for "scaled"


def dotted(node: cst.CSTNode) -> Optional[str]:
    """`a.b.c` for a chain of Names/Attributes, else None."""
    if isinstance(node, cst.Name):
        return node.value
    if isinstance(node, cst.Attribute):
        base = dotted(node.value)
        return None if base is None else f"{base}.{node.attr.value}"
    return None


def call_name(call: cst.CSTNode) -> Optional[str]:
    """For `x.y.method(...)` the method name, for `f(...)` the function name."""
    if isinstance(call, cst.Call):
        if isinstance(call.func, cst.Attribute):
            return call.func.attr.value
        if isinstance(call.func, cst.Name):
            return call.func.value
    return None


def get_arg(call: cst.Call, position: Optional[int], keyword: Optional[str]) -> Optional[cst.Arg]:
    pos = 0
    for arg in call.args:
        if arg.keyword is not None:
            if keyword is not None and arg.keyword.value == keyword:
                return arg
            continue
        if arg.star:
            return None if position is not None and pos <= position else None
        if position is not None and pos == position:
            return arg
        pos += 1
    return None


def literal_string(node: Optional[cst.CSTNode]) -> Optional[str]:
    if isinstance(node, cst.SimpleString):
        try:
            value = node.evaluated_value
        except Exception:  # pragma: no cover - defensive
            return None
        return value if isinstance(value, str) else None
    if isinstance(node, cst.ConcatenatedString):
        left, right = literal_string(node.left), literal_string(node.right)
        return None if left is None or right is None else left + right
    return None


def literal_bool(node: Optional[cst.CSTNode]) -> Optional[bool]:
    if isinstance(node, cst.Name) and node.value in ("True", "False"):
        return node.value == "True"
    return None


class _Index(cst.CSTVisitor):
    """One pass over the tree: parents, text order, scopes, calls, imports, assignments,
    functions and classes. It replaces LibCST's parent, position, scope and qualified-name
    providers (four passes, several times slower) for everything but reported positions."""

    def __init__(self) -> None:
        super().__init__()
        self.parents: Dict[cst.CSTNode, cst.CSTNode] = {}
        self.order: Dict[cst.CSTNode, int] = {}
        self.scope: Dict[cst.CSTNode, cst.CSTNode] = {}
        self.calls: List[cst.Call] = []
        self.functions: Dict[str, List[cst.FunctionDef]] = {}
        self.classes: Dict[str, cst.ClassDef] = {}
        # scope node -> bound name -> qualified names it may import
        self.imports: Dict[cst.CSTNode, Dict[str, Set[str]]] = {}
        # scope node -> names bound locally by anything but an import (parameters, assignments)
        self.local_names: Dict[cst.CSTNode, Set[str]] = {}
        self.assign_nodes: List[cst.CSTNode] = []
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
        elif isinstance(node, cst.ClassDef):
            self.classes.setdefault(node.name.value, node)
        elif isinstance(node, (cst.Assign, cst.AnnAssign, cst.NamedExpr, cst.AugAssign)):
            self.assign_nodes.append(node)
        elif isinstance(node, cst.Import):
            for alias in node.names:
                full = dotted(alias.name)
                if full is None:
                    continue
                if alias.asname is not None and isinstance(alias.asname.name, cst.Name):
                    self._bind_import(alias.asname.name.value, full)
                else:
                    root = full.split(".")[0]
                    self._bind_import(root, root)
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
                self._bind_import(bound, f"{dots}{base}.{name}" if base else f"{dots}{name}")
        elif isinstance(node, (cst.For, cst.CompFor)):
            self._bind_targets(node.target)
        elif isinstance(node, cst.AsName) and isinstance(self.parents.get(node), (cst.WithItem, cst.ExceptHandler)):
            self._bind_targets(node.name)
        return True

    def on_leave(self, original_node: cst.CSTNode) -> None:
        self._stack.pop()
        if isinstance(original_node, SCOPE_TYPES):
            self._scopes.pop()

    def _bind_import(self, name: str, qualified: str) -> None:
        scope = self._scopes[-1]
        self.imports.setdefault(scope, {}).setdefault(name, set()).add(qualified)

    def _bind_local(self, scope: Optional[cst.CSTNode], name: str) -> None:
        if scope is not None:
            self.local_names.setdefault(scope, set()).add(name)

    def _bind_targets(self, target: cst.CSTNode) -> None:
        if isinstance(target, cst.Name):
            self._bind_local(self._scopes[-1], target.value)
        elif isinstance(target, (cst.Tuple, cst.List)):
            for el in target.elements:
                self._bind_targets(el.value)
        elif isinstance(target, cst.StarredElement):
            self._bind_targets(target.value)


class AmpModel:
    """Facts about one parsed file, computed lazily and cached."""

    def __init__(self, wrapper: MetadataWrapper):
        self.wrapper = wrapper
        self.module: cst.Module = wrapper.module
        index = _Index()
        self.module.visit(index)
        self._index = index
        self._parents = index.parents
        self._positions = None
        self._qname_cache: Dict[cst.CSTNode, Set[QualifiedName]] = {}
        self._calls: List[cst.Call] = index.calls  # pre-order is text order
        self._calls_by_scope: Optional[Dict[cst.CSTNode, List[cst.Call]]] = None
        self._scalers: Optional[Set[str]] = None
        self._assignments: Optional[Dict[str, List[Tuple[cst.CSTNode, cst.BaseExpression]]]] = None
        self._functions: Dict[str, List[cst.FunctionDef]] = index.functions
        self._classes: Dict[str, cst.ClassDef] = index.classes
        for assign in index.assign_nodes:  # names assigned in a scope shadow its imports
            scope = index.scope.get(assign, self.module)
            targets = []
            if isinstance(assign, cst.Assign):
                targets = [t.target for t in assign.targets]
            elif isinstance(assign, (cst.AnnAssign, cst.AugAssign, cst.NamedExpr)):
                targets = [assign.target]
            for t in targets:
                for name in _target_names(t):
                    index.local_names.setdefault(scope, set()).add(name)

    # ---------------------------------------------------------------- tree navigation
    def parent(self, node: cst.CSTNode) -> Optional[cst.CSTNode]:
        return self._parents.get(node)

    def ancestors(self, node: cst.CSTNode) -> Iterator[cst.CSTNode]:
        cur = self._parents.get(node)
        while cur is not None:
            yield cur
            cur = self._parents.get(cur)

    def position(self, node: cst.CSTNode) -> CodeRange:
        """Line/column range of `node` (computed on first use: only reported nodes need it)."""
        if self._positions is None:
            self._positions = self.wrapper.resolve(PositionProvider)
        return self._positions[node]

    def start(self, node: cst.CSTNode) -> Tuple[int, int]:
        pos = self.position(node).start
        return (pos.line, pos.column)

    def before(self, a: cst.CSTNode, b: cst.CSTNode) -> bool:
        """True when `a` comes before `b` in the text (an ancestor comes before its children)."""
        return self._index.order[a] < self._index.order[b]

    def nodes_of(self, *types: type) -> List[cst.CSTNode]:
        """Every node of these exact types, in text order (from the one indexing pass)."""
        found = [n for t in types for n in self._index.by_type.get(t, [])]
        if len(types) > 1:
            found.sort(key=self._index.order.__getitem__)
        return found

    def in_import(self, node: cst.CSTNode) -> bool:
        return any(isinstance(a, (cst.Import, cst.ImportFrom)) for a in self.ancestors(node))

    def is_ancestor(self, anc: cst.CSTNode, node: cst.CSTNode) -> bool:
        return any(p is anc for p in self.ancestors(node))

    def statement_of(self, node: cst.CSTNode) -> Optional[cst.BaseStatement]:
        """The statement (simple line or compound) that directly contains `node`."""
        cur: Optional[cst.CSTNode] = node
        while cur is not None and not isinstance(cur, (cst.SimpleStatementLine, cst.BaseCompoundStatement)):
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

    def loop_of(self, node: cst.CSTNode, stop: Optional[cst.CSTNode] = None) -> Optional[cst.CSTNode]:
        """The innermost for/while loop around `node` (within its scope) whose body holds it."""
        child = node
        for anc in self.ancestors(node):
            if anc is stop or isinstance(anc, SCOPE_TYPES):
                return None
            if isinstance(anc, (cst.For, cst.While)) and child is anc.body:
                return anc
            child = anc
        return None

    def exclusive(self, a: cst.CSTNode, b: cst.CSTNode) -> bool:
        """True when `a` and `b` sit in different branches of one `if`/`else` (or match case),
        so that one run of the enclosing code never executes both."""
        path_a = [a, *self.ancestors(a)]
        ids_a = {id(n): i for i, n in enumerate(path_a)}
        child_b = b
        for anc in [b, *self.ancestors(b)]:
            if id(anc) in ids_a:
                i = ids_a[id(anc)]
                child_a = path_a[i - 1] if i > 0 else None
                if child_a is None or anc is b:
                    return False
                if isinstance(anc, cst.If):
                    return self._branch(anc, child_a) != self._branch(anc, child_b)
                if isinstance(anc, cst.IfExp):
                    return {self._branch(anc, child_a), self._branch(anc, child_b)} == {"body", "orelse"}
                if isinstance(anc, cst.Match):
                    return child_a is not child_b
                return False
            child_b = anc
        return False

    @staticmethod
    def _branch(node, child: cst.CSTNode) -> str:
        """Which part of an `if` statement or expression `child` is."""
        if child is node.body:
            return "body"
        if child is node.orelse:
            return "orelse"
        return "test"

    # ---------------------------------------------------------------- names
    def qualified_names(self, node: cst.CSTNode) -> Set[QualifiedName]:
        """What a Name/Attribute may refer to through the imports in scope, as
        `QualifiedName(name, QualifiedNameSource.IMPORT)` (e.g. `T.cuda.amp.autocast` after
        `import torch as T` -> "torch.cuda.amp.autocast"). Locally bound names shadow imports;
        class bodies are not visible from the functions inside them (Python's rules)."""
        cached = self._qname_cache.get(node)
        if cached is not None:
            return cached
        result: Set[QualifiedName] = set()
        text = dotted(node)
        if text is not None:
            first, _, rest = text.partition(".")
            scope: Optional[cst.CSTNode] = self.scope_of(node)
            innermost = scope
            while scope is not None:
                if isinstance(scope, cst.ClassDef) and scope is not innermost:
                    scope = self._index.scope.get(scope)
                    continue
                imported = self._index.imports.get(scope, {}).get(first)
                if imported:
                    result = {QualifiedName(f"{q}.{rest}" if rest else q, QualifiedNameSource.IMPORT)
                              for q in imported}
                    break
                if first in self._index.local_names.get(scope, ()):
                    break
                scope = None if scope is self.module else self._index.scope.get(scope, self.module)
            if not result and first in _BUILTINS and text == first:
                result = {QualifiedName(f"builtins.{first}", QualifiedNameSource.BUILTIN)}
        self._qname_cache[node] = result
        return result

    def api_of(self, node: cst.CSTNode) -> Optional[Api]:
        """The torch API an expression (Name/Attribute, or the callee of a Call) names."""
        if isinstance(node, cst.Call):
            node = node.func
        if not isinstance(node, (cst.Name, cst.Attribute)):
            return None
        for qn in self.qualified_names(node):
            if qn.source in (QualifiedNameSource.IMPORT, QualifiedNameSource.BUILTIN) or qn.name.startswith("torch."):
                api = API_TABLE.get(qn.name)
                if api is not None:
                    return api
        return None

    def is_api(self, node: cst.CSTNode, kind: str) -> bool:
        api = self.api_of(node)
        return api is not None and api.kind == kind

    def qualname(self, node: cst.CSTNode) -> Optional[str]:
        if isinstance(node, cst.Call):
            node = node.func
        names = sorted(qn.name for qn in self.qualified_names(node))
        return names[0] if names else None

    # ---------------------------------------------------------------- calls and assignments
    @property
    def calls(self) -> List[cst.Call]:
        """Every call in the file, in text order."""
        return self._calls

    def calls_in_scope(self, scope: cst.CSTNode) -> List[cst.Call]:
        """Calls that run as part of `scope` itself (not inside nested defs, lambdas, classes)."""
        if self._calls_by_scope is None:
            by_scope: Dict[cst.CSTNode, List[cst.Call]] = {}
            for c in self._calls:
                by_scope.setdefault(self.scope_of(c), []).append(c)
            self._calls_by_scope = by_scope
        return self._calls_by_scope.get(scope, [])

    @property
    def scopes(self) -> List[cst.CSTNode]:
        """Every scope that contains a call."""
        self.calls_in_scope(self.module)
        assert self._calls_by_scope is not None
        return list(self._calls_by_scope)

    @property
    def assignments(self) -> Dict[str, List[Tuple[cst.CSTNode, cst.BaseExpression]]]:
        """Dotted target text ("scaler", "self.scaler") -> [(assign statement node, value)]."""
        if self._assignments is None:
            result: Dict[str, List[Tuple[cst.CSTNode, cst.BaseExpression]]] = {}

            def record(target: cst.BaseExpression, value: cst.BaseExpression, node: cst.CSTNode) -> None:
                key = dotted(target)
                if key is not None:
                    result.setdefault(key, []).append((node, value))
                elif isinstance(target, (cst.Tuple, cst.List)) and isinstance(value, (cst.Tuple, cst.List)):
                    if len(target.elements) == len(value.elements):
                        for t, v in zip(target.elements, value.elements):
                            record(t.value, v.value, node)

            class V(cst.CSTVisitor):
                def visit_Assign(self, node: cst.Assign) -> None:
                    for t in node.targets:
                        record(t.target, node.value, node)

                def visit_AnnAssign(self, node: cst.AnnAssign) -> None:
                    if node.value is not None:
                        record(node.target, node.value, node)

                def visit_NamedExpr(self, node: cst.NamedExpr) -> None:
                    record(node.target, node.value, node)

            self.module.visit(V())
            self._assignments = result
        return self._assignments

    def values_of(self, expr: cst.CSTNode) -> List[cst.BaseExpression]:
        """Values assigned anywhere in the file to the dotted name `expr` spells."""
        key = dotted(expr)
        if key is None:
            return []
        return [v for _, v in self.assignments.get(key, [])]

    @property
    def functions(self) -> Dict[str, List[cst.FunctionDef]]:
        return self._functions

    @property
    def classes(self) -> Dict[str, cst.ClassDef]:
        return self._classes

    def method(self, cls: cst.ClassDef, name: str) -> Optional[cst.FunctionDef]:
        if isinstance(cls.body, cst.IndentedBlock):
            for stmt in cls.body.body:
                if isinstance(stmt, cst.FunctionDef) and stmt.name.value == name:
                    return stmt
        return None

    def class_of_value(self, value: cst.CSTNode, depth: int = 0) -> Optional[cst.ClassDef]:
        """The class defined in this file that `value` constructs (`Net(...)`, or a name bound to one)."""
        if depth > 4:
            return None
        if isinstance(value, cst.Call):
            # Net(...).cuda() / .to(device) keep the class
            if isinstance(value.func, cst.Attribute) and value.func.attr.value in ("cuda", "to", "half", "float", "cpu"):
                return self.class_of_value(value.func.value, depth + 1)
            name = dotted(value.func)
            if name is not None and name in self.classes:
                return self.classes[name]
            return None
        key = dotted(value)
        if key is not None:
            for v in self.values_of(value):
                cls = self.class_of_value(v, depth + 1)
                if cls is not None:
                    return cls
        return None

    # ---------------------------------------------------------------- autocast regions
    def autocast_call_info(self, call: cst.Call) -> Optional[Region]:
        """Describe `torch.autocast(...)`-like calls (any spelling), else None."""
        api = self.api_of(call)
        if api is None or api.kind != "autocast":
            return None
        if api.device is None:  # torch.autocast(device_type, dtype=None, enabled=True, cache_enabled=None)
            dev_arg = get_arg(call, 0, "device_type")
            dtype_arg = get_arg(call, 1, "dtype")
            en_arg = get_arg(call, 2, "enabled")
            device = literal_string(dev_arg.value) if dev_arg else None
        else:  # torch.cuda.amp.autocast(enabled=True, dtype=torch.float16, cache_enabled=True)
            en_arg = get_arg(call, 0, "enabled")
            dtype_arg = get_arg(call, 1, "dtype")
            device = api.device
        if device is not None and ":" in device:
            device = device.split(":")[0]
        enabled: Optional[bool] = True
        if en_arg is not None:
            enabled = literal_bool(en_arg.value)
        dtype: Optional[str] = None
        dtype_node = dtype_arg.value if dtype_arg is not None else None
        if dtype_node is not None:
            d_api = self.api_of(dtype_node)
            if d_api is not None and d_api.kind.startswith("dtype."):
                dtype = d_api.kind.split(".", 1)[1]
            elif isinstance(dtype_node, cst.Name) and dtype_node.value == "None":
                dtype = None
            else:
                dtype = "dynamic"
        return Region(node=call, call=call, api=api, device=device, dtype=dtype, enabled=enabled, dtype_node=dtype_node)

    def _context_region(self, expr: cst.BaseExpression, depth: int = 0) -> Optional[Region]:
        """Autocast region for a `with` item's expression (a call, or a name bound to one)."""
        if depth > 3:
            return None
        if isinstance(expr, cst.Call):
            return self.autocast_call_info(expr)
        if isinstance(expr, cst.IfExp):  # autocast(...) if amp else nullcontext()
            for branch in (expr.body, expr.orelse):
                r = self._context_region(branch, depth + 1)
                if r is not None and r.enabled is not False:
                    return Region(r.node, r.call, r.api, r.device, r.dtype, None, r.dtype_node)
            return None
        if isinstance(expr, (cst.Name, cst.Attribute)):
            values = self.values_of(expr)
            regions = [self._context_region(v, depth + 1) for v in values]
            found = [r for r in regions if r is not None]
            if found and len(found) == len(values):
                return found[0]
            if found:  # sometimes an autocast, sometimes something else: possibly a region
                r = found[0]
                return Region(r.node, r.call, r.api, r.device, r.dtype, None, r.dtype_node)
        return None

    def with_region(self, node: cst.With) -> Optional[Region]:
        """The region a `with` statement opens (first autocast item), disabled ones included."""
        for item in node.items:
            r = self._context_region(item.item)
            if r is not None:
                return r
        return None

    def decorator_region(self, func: cst.FunctionDef) -> Optional[Region]:
        for dec in func.decorators:
            if isinstance(dec.decorator, cst.Call):
                r = self.autocast_call_info(dec.decorator)
                if r is not None:
                    return r
        return None

    def region_of(self, node: cst.CSTNode) -> Optional[Region]:
        """The innermost autocast region that lexically runs `node`, or None.

        A region whose `enabled` is the literal False masks its parents. Function, lambda and
        class boundaries end the search (their bodies run when called), except a function
        decorated with autocast, which is a region itself.
        """
        child = node
        for anc in self.ancestors(node):
            if isinstance(anc, cst.With) and child is anc.body:
                r = self.with_region(anc)
                if r is not None:
                    r.node = anc
                    return None if r.enabled is False else r
            elif isinstance(anc, cst.FunctionDef):
                r = self.decorator_region(anc)
                if r is not None:
                    r.node = anc
                    return None if r.enabled is False else r
                return None
            elif isinstance(anc, (cst.Lambda, cst.ClassDef)):
                return None
            child = anc
        return None

    def function_enables_autocast(self, func: cst.FunctionDef) -> bool:
        """True when calling `func` runs (part of) its body under an enabled autocast."""
        r = self.decorator_region(func)
        if r is not None and r.enabled is not False:
            return True
        found = False
        model = self

        class V(cst.CSTVisitor):
            def visit_With(self, node: cst.With) -> None:
                nonlocal found
                r = model.with_region(node)
                if r is not None and r.enabled is not False:
                    found = True

            def visit_FunctionDef(self, node: cst.FunctionDef) -> bool:
                return node is func

        func.visit(V())
        return found

    # ---------------------------------------------------------------- scalers
    @property
    def scalers(self) -> Set[str]:
        """Dotted keys ("scaler", "self.scaler", parameter names) that hold a GradScaler."""
        if self._scalers is None:
            keys: Set[str] = set()
            for key, entries in self.assignments.items():
                if any(isinstance(v, cst.Call) and self.is_api(v, "GradScaler") for _, v in entries):
                    keys.add(key)
            # parameters annotated as GradScaler
            for funcs in self.functions.values():
                for f in funcs:
                    for p in [*f.params.params, *f.params.kwonly_params, *f.params.posonly_params]:
                        if p.annotation is not None and self.is_api(p.annotation.annotation, "GradScaler"):
                            keys.add(p.name.value)
            # parameters that receive a known scaler at a call site in this file
            changed = True
            while changed:
                changed = False
                for call in self.calls:
                    name = dotted(call.func)
                    if name is None:
                        continue
                    short = name.split(".")[-1]
                    for f in self.functions.get(short, []):
                        for pname in self._params_receiving(call, f, keys):
                            if pname not in keys:
                                keys.add(pname)
                                changed = True
            # duck typing: x.scale(loss).backward() together with x.step/x.update/x.unscale_
            used: Dict[str, Set[str]] = {}
            for call in self.calls:
                if isinstance(call.func, cst.Attribute):
                    base = dotted(call.func.value)
                    if base is not None:
                        used.setdefault(base, set()).add(call.func.attr.value)
            for base, methods in used.items():
                if "scale" in methods and methods & {"update", "unscale_"} and "step" in methods:
                    if any(self._scaled_backward_base(c) == base for c in self.calls):
                        keys.add(base)
            self._scalers = keys
        return self._scalers

    @staticmethod
    def _params_receiving(call: cst.Call, func: cst.FunctionDef, known: Set[str]) -> List[str]:
        params = [*func.params.posonly_params, *func.params.params]
        is_method = bool(params) and params[0].name.value in ("self", "cls")
        offset = 1 if is_method and isinstance(call.func, cst.Attribute) else 0
        names: List[str] = []
        pos = 0
        for arg in call.args:
            if arg.star:
                break
            key = dotted(arg.value)
            if arg.keyword is not None:
                if key in known:
                    names.append(arg.keyword.value)
                continue
            idx = pos + offset
            pos += 1
            if key in known and idx < len(params):
                names.append(params[idx].name.value)
        return names

    def _scaled_backward_base(self, call: cst.Call) -> Optional[str]:
        """For `X.scale(loss).backward()` the dotted X, else None."""
        if (
            isinstance(call.func, cst.Attribute)
            and call.func.attr.value == "backward"
            and isinstance(call.func.value, cst.Call)
            and isinstance(call.func.value.func, cst.Attribute)
            and call.func.value.func.attr.value == "scale"
        ):
            return dotted(call.func.value.func.value)
        return None

    def scaler_key(self, expr: cst.CSTNode) -> Optional[str]:
        key = dotted(expr)
        return key if key is not None and key in self.scalers else None

    def scaler_method(self, call: cst.Call, method: str) -> Optional[str]:
        """For `scaler.<method>(...)` on a known scaler, the scaler key."""
        if isinstance(call.func, cst.Attribute) and call.func.attr.value == method:
            return self.scaler_key(call.func.value)
        return None

    # ---------------------------------------------------------------- backward calls
    def backward_call(self, call: cst.Call) -> Optional[BackwardCall]:
        if isinstance(call.func, cst.Attribute) and call.func.attr.value == "backward":
            receiver = call.func.value
            base = self._scaled_backward_base(call)
            if base is not None and base in self.scalers:
                return BackwardCall(call, "scaled", base)
            # Function.backward(ctx, ...) / super().backward(...) are not tensor backward calls
            if isinstance(receiver, cst.Call) and call_name(receiver) == "super":
                return None
            if isinstance(receiver, cst.Name) and receiver.value in self.classes:
                return None
            if self.is_api(receiver, "autograd.Function"):
                return None
            return BackwardCall(call, "tensor")
        if self.is_api(call, "autograd.backward"):
            return BackwardCall(call, "autograd")
        return None

    @property
    def backward_calls(self) -> List[BackwardCall]:
        return [b for b in (self.backward_call(c) for c in self.calls) if b is not None]

    # ---------------------------------------------------------------- custom autograd Functions
    def custom_functions_without_custom_bwd(self) -> List[cst.ClassDef]:
        """autograd.Function subclasses in this file whose backward lacks custom_bwd."""
        result = []
        for cls in self.classes.values():
            if not any(self.is_api(b.value, "autograd.Function") for b in cls.bases):
                continue
            bwd = self.method(cls, "backward")
            if bwd is None:
                continue
            if not any(self._decorator_api(d.decorator) == "custom_bwd" for d in bwd.decorators):
                result.append(cls)
        return result

    def _decorator_api(self, dec: cst.BaseExpression) -> Optional[str]:
        api = self.api_of(dec.func if isinstance(dec, cst.Call) else dec)
        return api.kind if api else None


_BUILTINS = set(dir(builtins))


def _target_names(target: cst.CSTNode) -> List[str]:
    if isinstance(target, cst.Name):
        return [target.value]
    if isinstance(target, (cst.Tuple, cst.List)):
        return [n for el in target.elements for n in _target_names(el.value)]
    if isinstance(target, cst.StarredElement):
        return _target_names(target.value)
    return []


# Helpers used by several rules to build fixes -----------------------------------------


def is_expression_statement_of(stmt: cst.CSTNode, call: cst.Call) -> bool:
    """True when `stmt` is a one-statement line whose only statement is `call` (maybe assigned)."""
    if not isinstance(stmt, cst.SimpleStatementLine) or len(stmt.body) != 1:
        return False
    small = stmt.body[0]
    if isinstance(small, cst.Expr):
        return small.value is call
    if isinstance(small, (cst.Assign, cst.AnnAssign)):
        return small.value is call
    return False


__all__ = [
    "Api",
    "AmpModel",
    "BackwardCall",
    "Region",
    "API_TABLE",
    "call_name",
    "dotted",
    "get_arg",
    "is_expression_statement_of",
    "literal_bool",
    "literal_string",
]
