"""Names: what an expression refers to through the imports in scope.

* canonical torch API names whatever the import style (`api_of`, `is_api`, `qualname`);
* import bindings and their references (`import_bindings`, `references`), for rules that
  rewrite an import together with its uses;
* the file's own spellings: the name `torch` is imported as, whether a module-level import
  binds a name, a free name for new code.
"""

from __future__ import annotations

import builtins
from dataclasses import dataclass, field
from typing import Dict, Iterable, List, Optional, Sequence, Set, Tuple

import libcst as cst
from libcst.metadata import QualifiedName, QualifiedNameSource

from ampfix.model.tree import dotted


@dataclass(frozen=True)
class Api:
    """A torch API an expression refers to."""

    kind: str  # "autocast", "GradScaler", "clip_grad", "DataParallel", "autograd.backward", ...
    device: Optional[str] = None  # implied device for deprecated spellings ("cuda"/"cpu")
    deprecated: bool = False
    qualname: str = ""


# frameworks whose AMP objects look like torch's (a `GradScaler` with `scale`/`step`/`update`) and
# are not (`Names.other_frameworks`)
OTHER_FRAMEWORKS = frozenset({"paddle", "oneflow", "jittor", "mindspore", "megengine", "mxnet", "tensorflow", "jax"})


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
    # the device-specific autocast state functions torch 2.4 deprecated (`torch.get_autocast_gpu_dtype()`:
    # ampfix.knowledge.torch_amp_api.AUTOCAST_STATE); CUDA's enabled flag never had a device-specific name
    for dev, infix in (("cuda", "gpu"), ("cpu", "cpu"), ("ipu", "ipu"), ("xla", "xla")):
        fns = [f"get_autocast_{infix}_dtype", f"set_autocast_{infix}_dtype"]
        fns += [f"is_autocast_{infix}_enabled", f"set_autocast_{infix}_enabled"] if dev != "cuda" else []
        add([f"{mod}.{fn}" for fn in fns for mod in ("torch", "torch._C")], "autocast_state", dev, True)
    clip = ["clip_grad_norm_", "clip_grad_norm", "clip_grad_value_", "clip_grad_value"]
    add([f"torch.nn.utils.{c}" for c in clip] + [f"torch.nn.utils.clip_grad.{c}" for c in clip], "clip_grad")
    add(
        ["torch.nn.DataParallel", "torch.nn.parallel.DataParallel", "torch.nn.parallel.data_parallel.DataParallel"],
        "DataParallel",
    )
    add(["torch.nn.parallel.data_parallel", "torch.nn.parallel.data_parallel.data_parallel"], "data_parallel")
    add(["torch.nn.parallel.parallel_apply", "torch.nn.parallel.parallel_apply.parallel_apply"], "parallel_apply")
    add(["torch.autograd.backward"], "autograd.backward")
    add(["torch.autograd.grad"], "autograd.grad")
    add(["torch.autograd.Function", "torch.autograd.function.Function"], "autograd.Function")
    add(["torch.float16", "torch.half"], "dtype.float16")
    add(["torch.bfloat16"], "dtype.bfloat16")
    add(["torch.float32", "torch.float"], "dtype.float32")
    add(["contextlib.nullcontext", "contextlib.suppress"], "nullcontext")
    add(["functools.partial"], "partial")
    add(["torch.device"], "device")
    add(["torch.save"], "save")
    add(["torch.load"], "load")
    add(["threading.Thread"], "thread")
    add(["concurrent.futures.ThreadPoolExecutor", "concurrent.futures.thread.ThreadPoolExecutor",
         "multiprocessing.pool.ThreadPool", "multiprocessing.dummy.Pool"], "thread_pool")
    for opt in (
        "SGD Adam AdamW Adagrad Adadelta Adamax ASGD LBFGS NAdam RAdam RMSprop Rprop SparseAdam Adafactor Muon"
    ).split():
        add([f"torch.optim.{opt}"], "optimizer")
    return table


API_TABLE = _api_table()
_BUILTINS = set(dir(builtins))


@dataclass
class ImportBinding:
    """A name bound by one alias of an import statement, and the Names that refer to it."""

    stmt: cst.CSTNode  # the Import / ImportFrom small statement
    alias: cst.ImportAlias
    name: str  # the bound name
    qualified: str  # what it imports ("torch.cuda.amp", "torch.cuda.amp.autocast")
    scope: cst.CSTNode
    refs: List[cst.Name] = field(default_factory=list)


def _is_reference(name: cst.Name, parent: Optional[cst.CSTNode]) -> bool:
    """False for Names that bind or label rather than refer (an attribute's `.attr`, a keyword,
    a def/class/param name, an import alias)."""
    if isinstance(parent, cst.Attribute) and parent.attr is name:
        return False
    if isinstance(parent, cst.Arg) and parent.keyword is name:
        return False
    if isinstance(parent, (cst.FunctionDef, cst.ClassDef, cst.Param)) and parent.name is name:
        return False
    if isinstance(parent, (cst.ImportAlias, cst.AsName, cst.ImportFrom)):
        return False
    return True


def _target_name_nodes(target: cst.CSTNode) -> List[cst.Name]:
    """The Name nodes an assignment target binds (not those under attributes or subscripts)."""
    if isinstance(target, cst.Name):
        return [target]
    if isinstance(target, (cst.Tuple, cst.List)):
        return [n for el in target.elements for n in _target_name_nodes(el.value)]
    if isinstance(target, cst.StarredElement):
        return _target_name_nodes(target.value)
    return []


class Names:
    """Name resolution (a part of `AmpModel`)."""

    def _init_names(self) -> None:
        # id(node) -> (node, its qualified names); by id() as `_api_cache` below
        self._qname_cache: Dict[int, Tuple[cst.CSTNode, Set[QualifiedName]]] = {}
        # (name, id(scope)) -> (scope, `_resolve_scope`'s answer): the index does not change once
        # built, so the answer is the same each time it is asked (and asked for every name read)
        self._scope_memo: Dict[Tuple[str, int], tuple] = {}
        # id(node) -> (node, its API): by id() as `_callees` (model/callgraph.py), the node kept in the entry
        self._api_cache: Dict[int, Tuple[cst.CSTNode, Optional[Api]]] = {}
        self._bindings: Optional[List[ImportBinding]] = None

    # ---------------------------------------------------------------- qualified names
    def _resolve_scope(self, first: str, scope: Optional[cst.CSTNode]):
        """(scope, import entries) of the innermost binding of `first` visible from `scope`;
        entries is None when the binding is local (an assignment or parameter)."""
        key = (first, id(scope))
        hit = self._scope_memo.get(key)
        if hit is not None and hit[0] is scope:
            return hit[1]
        found = self._resolve_scope_walk(first, scope)
        self._scope_memo[key] = (scope, found)
        return found

    def _resolve_scope_walk(self, first: str, scope: Optional[cst.CSTNode]):
        innermost = scope
        while scope is not None:
            if isinstance(scope, cst.ClassDef) and scope is not innermost:
                scope = self._index.scope_of(scope)
                continue
            imported = self._index.imports.get(scope, {}).get(first)
            if imported:
                return scope, imported
            if first in self._index.local_names.get(scope, ()):
                return scope, None
            scope = None if scope is self.module else self._index.scope_of(scope, self.module)
        return None, None

    def qualified_names(self, node: cst.CSTNode) -> Set[QualifiedName]:
        """What a Name/Attribute may refer to through the imports in scope, as
        `QualifiedName(name, QualifiedNameSource.IMPORT)` (e.g. `T.cuda.amp.autocast` after
        `import torch as T` -> "torch.cuda.amp.autocast"). Locally bound names shadow imports;
        class bodies are not visible from the functions inside them (Python's rules)."""
        hit = self._qname_cache.get(id(node))
        if hit is not None:
            return hit[1]
        result: Set[QualifiedName] = set()
        text = dotted(node)
        if text is not None and node in self._synthetic:  # type: ignore[attr-defined]
            # a value materialised from another module: its names are canonical (summary.py)
            first = text.partition(".")[0]
            if first.startswith("__") and first.endswith("__"):
                result = set()
            elif "." not in text and first in _BUILTINS:
                result = {QualifiedName(f"builtins.{first}", QualifiedNameSource.BUILTIN)}
            else:
                result = {QualifiedName(text, QualifiedNameSource.IMPORT)}
            self._qname_cache[id(node)] = (node, result)
            return result
        if text is not None:
            first, _, rest = text.partition(".")
            scope, imported = self._resolve_scope(first, self.scope_of(node))
            if scope is None or (scope is self.module and imported):
                # not bound, or imported, at the module's level: a star import may bind it there too
                starred = self._star_entries(first)
                if starred:
                    scope = self.module
                    imported = starred if not imported else self._last_top_level(
                        node, sorted([*imported, *starred], key=lambda e: self._index.order_of(e[1])))
            if imported and len({q for q, _, _ in imported}) > 1:
                imported = self._reaching_imports(node, scope, imported)
            if imported:
                result = {QualifiedName(f"{q}.{rest}" if rest else q, QualifiedNameSource.IMPORT)
                          for q in (self._through_project(q) for q, _, _ in imported)}
            elif scope is None and first in _BUILTINS and text == first:
                result = {QualifiedName(f"builtins.{first}", QualifiedNameSource.BUILTIN)}
        self._qname_cache[id(node)] = (node, result)
        return result

    def _star_entries(self, name: str) -> list:
        """The module-level `from <module> import *` statements that bind `name`, as entries of
        the import index, (qualified, statement, None): `.utils.amp` for `from .utils import *`,
        where the project's module `.utils` binds `amp` (`ForeignFacts.star_names`: its
        `__all__`, else its public top-level names, through its own star imports). None bind
        it when a later star import's names are not known (a library's, an `__all__` computed):
        that one may bind it too. Python's order otherwise: a local binding shadows them (the
        caller asks only when the name is not bound in the module, or imported there), the last
        import before a use is the one it reads (`_reaching_imports`)."""
        stars = self.__dict__.get("_stars")
        if stars is None:
            ask = getattr(getattr(self, "foreign", None), "star_names", None)
            stars = self.__dict__["_stars"] = [] if ask is None else [
                (stmt, module, ask(self.path, module))  # type: ignore[attr-defined]
                for stmt in self.nodes_of(cst.ImportFrom)
                if isinstance(stmt.names, cst.ImportStar) and self._index.scope_of(stmt, self.module) is self.module
                for module in ["." * len(stmt.relative) + (dotted(stmt.module) or "" if stmt.module is not None else "")]]
        memo = self.__dict__.setdefault("_star_memo", {})
        found = memo.get(name)
        if found is None:
            found = []
            for stmt, module, names in stars:
                if names is None:
                    found = []  # it may bind the name too
                elif name in names:
                    found.append((f"{module}.{name}" if module and not module.endswith(".") else f"{module}{name}",
                                  stmt, None))
            memo[name] = found
        return found

    def _last_top_level(self, node: cst.CSTNode, entries: list) -> list:
        """Of a star import and other imports of one name (in text order), the last when each is
        a statement of the module's own body (none in an `if` or `try`) and `node` reads the
        name after all of them ran: in a function (which runs later), or in a statement below
        the last of them; else what `_reaching_imports` shows."""
        tops = {id(s) for s in self.module.body}
        if not all(id(self.parent(e[1])) in tops for e in entries):
            return self._reaching_imports(node, self.module, entries)
        top, in_function, at_module = node, False, False
        for a in self.ancestors(node):
            if a is self.module:
                at_module = True
                break
            in_function = in_function or isinstance(a, (cst.FunctionDef, cst.Lambda))
            top = a
        if at_module and (in_function or id(top) in tops and self._index.order_of(top) > self._index.order_of(
                self.parent(entries[-1][1]))):
            return [entries[-1]]
        return self._reaching_imports(node, self.module, entries)  # (also a node the model made, not in the tree)

    def _through_project(self, qualified: str) -> str:
        """An import binding as a library's name where one of the project's modules re-exports
        that library's (`from ..compat import torch`, compat.py holding `import torch`: "torch",
        `Project.library_name`); else as it is. Memoised per binding."""
        foreign = getattr(self, "foreign", None)
        if foreign is None or qualified.partition(".")[0] == "torch":
            return qualified
        memo = self.__dict__.setdefault("_library_names", {})
        found = memo.get(qualified)
        if found is None:
            found = memo[qualified] = foreign.library_name(self.path, qualified) or qualified  # type: ignore[attr-defined]
        return found

    def _reaching_imports(self, node: cst.CSTNode, scope: Optional[cst.CSTNode], imported: list) -> list:
        """Of the imports binding one name in `scope` (a version shim's two branches, each
        with its own `from ... import autocast`), the one `node` provably reads: the last before
        it in the block that holds it or in a block around it, with no other of them in a loop or
        `try` around `node` (a loop's next pass, or a `try` body cut short, may have run another)
        nor in a function between (which runs later). All of them when that cannot be shown (and
        for a use in the module's own body, whose statements are not looked through)."""
        inside = []  # (entry, the ids of its statement and of every node around it)
        for entry in imported:
            inside.append((entry, {id(a) for a in (entry[1], *self.ancestors(entry[1]))}))
        child = node
        for a in self.ancestors(node):
            if a is scope or (scope is None and isinstance(a, cst.Module)):
                break
            if isinstance(a, (cst.FunctionDef, cst.Lambda, cst.ClassDef)):
                return imported  # a nested scope runs later: any of them may have run
            if isinstance(a, (cst.For, cst.While, cst.Try, cst.TryStar)) \
                    and any(id(a) in around for _, around in inside):
                return imported
            body = getattr(a, "body", None)
            at = next((i for i, b in enumerate(body) if b is child), None) \
                if isinstance(a, (cst.IndentedBlock, cst.Module)) and isinstance(body, (list, tuple)) else None
            if at is not None:
                for stmt in reversed(body[:at]):
                    here = [entry for entry, around in inside if id(stmt) in around]
                    if not here:
                        continue
                    if isinstance(stmt, cst.SimpleStatementLine):
                        return [here[-1]]  # (the last of one line: `import a as x; import b as x`)
                    return imported  # in a compound statement before it: which ran is not known
            child = a
        return imported

    def qualname(self, node: cst.CSTNode) -> Optional[str]:
        if isinstance(node, cst.Call):
            node = node.func
        names = sorted(qn.name for qn in self.qualified_names(node))
        return names[0] if names else None

    def qualnames(self, node: cst.CSTNode) -> Set[str]:
        if type(node) is cst.Call:
            node = node.func  # type: ignore[attr-defined]
        return {qn.name for qn in self.qualified_names(node)}

    def api_of(self, node: cst.CSTNode) -> Optional[Api]:
        """The torch API an expression (Name/Attribute, or the callee of a Call) names
        (computed once per node: every rule asks it of the same calls)."""
        cache = self._api_cache
        hit = cache.get(id(node))
        if hit is not None:
            return hit[1]
        key = node
        if isinstance(node, cst.Call):
            node = node.func
        found: Optional[Api] = None
        if isinstance(node, (cst.Name, cst.Attribute)):
            for qn in self.qualified_names(node):
                found = API_TABLE.get(qn.name)
                if found is not None:
                    break
        cache[id(key)] = (key, found)
        return found

    def is_api(self, node: cst.CSTNode, kind: str) -> bool:
        api = self.api_of(node)
        return api is not None and api.kind == kind

    def _is_builtin(self, node: cst.CSTNode, name: str) -> bool:
        """`node` is the builtin `name` (not shadowed)."""
        return isinstance(node, cst.Name) and node.value == name and \
            self._resolve_scope(name, self.scope_of(node))[0] is None

    def reference_role(self, expr: cst.CSTNode):
        """How a reference to an API is used: ("call", the call), ("bare-decorator", the
        decorator), ("type", None) in an annotation or an isinstance/issubclass check, else
        ("value", None): passed around, where its uses cannot be followed."""
        parent = self.parent(expr)
        if isinstance(parent, cst.Call) and parent.func is expr:
            return "call", parent
        if isinstance(parent, cst.Decorator) and parent.decorator is expr:
            return "bare-decorator", parent
        if any(isinstance(a, cst.Annotation) for a in self.ancestors(expr)):
            return "type", None
        node = expr
        if isinstance(parent, cst.Element) and isinstance(self.parent(parent), cst.Tuple):
            node = self.parent(parent)
            parent = self.parent(node)
        if isinstance(parent, cst.Arg):
            call = self.parent(parent)
            if (isinstance(call, cst.Call) and isinstance(call.func, cst.Name)
                    and call.func.value in ("isinstance", "issubclass") and len(call.args) == 2
                    and call.args[1] is parent):
                return "type", None
        return "value", None

    # ---------------------------------------------------------------- import bindings
    @property
    def import_bindings(self) -> List[ImportBinding]:
        """Every name an import binds, with the Names that refer to it (in text order)."""
        if self._bindings is None:
            bindings: List[ImportBinding] = []
            by_key: Dict[tuple, ImportBinding] = {}
            for scope, names in self._index.imports.items():
                for name, entries in names.items():
                    for qualified, stmt, alias in entries:
                        twin = by_key.get((id(scope), name))
                        b = ImportBinding(stmt, alias, name, qualified, scope)
                        if twin is not None and twin.qualified == qualified:
                            b.refs = twin.refs  # the same import written twice: one set of uses
                        bindings.append(b)
                        by_key[(id(scope), name)] = b
            bound = {b.name for b in bindings}
            targets = {id(n) for _, t, _ in self._index.assignments for n in _target_name_nodes(t)}
            for n in self.nodes_of(cst.Name):
                if n.value not in bound or id(n) in targets or not _is_reference(n, self.parent(n)):
                    continue
                if self.in_import(n):
                    continue
                scope, imported = self._resolve_scope(n.value, self.scope_of(n))
                if imported:
                    b = by_key.get((id(scope), n.value))
                    if b is not None:
                        b.refs.append(n)
            bindings.sort(key=lambda b: self._index.order_of(b.stmt))
            self._bindings = bindings
        return self._bindings

    def binding_is_ambiguous(self, b: ImportBinding) -> bool:
        """The name is also bound to something else in its scope, on a path where the import
        ran too: imported from elsewhere, or assigned or defined there. (The same import written
        twice is not ambiguous, nor an old-torch alternative in the other branch of an `if`:
        `if torch >= 1.6: from torch.cuda.amp import autocast` / `else: def autocast(...)`.)"""
        entries = self._index.imports.get(b.scope, {}).get(b.name, [])
        if len({q for q, _, _ in entries}) > 1:
            return True
        if b.name not in self._index.local_names.get(b.scope, ()):
            return False
        others = [f for f in self.functions.get(b.name, []) if self.scope_of(f) is b.scope]
        others += [self.classes[b.name]] if b.name in self.classes and self.scope_of(self.classes[b.name]) is b.scope else []
        others += [n for n, _, s in self._by_key.get(b.name, []) if s is b.scope]
        return not others or any(not self.exclusive(b.stmt, o) and not self.guards.in_fallback(o) for o in others)

    def module_binds(self, name: str) -> bool:
        """True when a module-level import binds `name` (new module-level code may use it)."""
        return bool(self._index.imports.get(self.module, {}).get(name))

    def other_frameworks(self) -> Set[str]:
        """The deep-learning frameworks other than PyTorch the file imports (`OTHER_FRAMEWORKS`,
        any scope): their objects copy torch's AMP API (`paddle.amp.GradScaler().scale(loss)
        .backward()`) with other semantics, so an object used like a GradScaler there is not
        taken for torch's."""
        found = self.__dict__.get("_other_frameworks")
        if found is None:
            found = self.__dict__["_other_frameworks"] = {
                q.partition(".")[0] for names in self._index.imports.values() for entries in names.values()
                for q, _, _ in entries if q.partition(".")[0] in OTHER_FRAMEWORKS}
        return found

    def torch_alias(self) -> Optional[str]:
        """The name `import torch [as T]` binds at module level, if any."""
        for name, entries in self._index.imports.get(self.module, {}).items():
            if any(isinstance(stmt, cst.Import) and dotted(alias.name) == "torch" for _, stmt, alias in entries):
                return name
        return None

    def _names_used(self) -> Set[str]:
        return {n.value for n in self.nodes_of(cst.Name)}

    def free_name(self, candidates: Iterable[str]) -> Optional[str]:
        """The first candidate that no Name in the file uses."""
        used = self._names_used()
        return next((c for c in candidates if c not in used), None)

    def quote(self) -> str:
        """The quote the file prefers for new string literals (counted once, in the source text
        when the engine gave it: the module's code is that text, without generating it)."""
        found = self.__dict__.get("_quote")
        if found is None:
            src = self.__dict__.get("source_text")
            if src is None:
                src = self.module.code
            found = self.__dict__["_quote"] = "'" if src.count("'") > src.count('"') else '"'
        return found
