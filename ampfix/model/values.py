"""Values: what a name, `self.` attribute or module global may hold, file-wide.

A name is resolved the way Python resolves it: the function that binds it (locals,
parameters: the arguments of the calls to that function in this file), enclosing functions
(closures), then the module (module-level assignments, `if __name__ == "__main__":` blocks,
functions that declare it `global`). `self.x` in a method is every `self.x = ...` in the
methods of its class and of the classes it is related to in this file (bases and subclasses),
plus class-level assignments. `obj.x` where `obj` holds an instance of a class of this file is
that class's `self.x`.

`possible_values` follows names through these bindings and splits conditional expressions
(`a if c else b`, `a or b`), so a consumer sees the objects an expression may be.
"""

from __future__ import annotations

from typing import Dict, List, Optional, Tuple

import libcst as cst

from ampfix.model.tree import dotted, node_types

_MODULE_OR_CLASS = node_types(cst.Module, cst.ClassDef)

Entry = Tuple[cst.CSTNode, cst.BaseExpression, cst.CSTNode]  # (assign node, value, scope)
MAX_DEPTH = 6


class ReturnedElement:
    """The value of one target of `a, b = f(...)`: element `index` of what `f` returns."""

    def __init__(self, call: cst.Call, index: int):
        self.call, self.index = call, index
# methods that return their module unchanged: Net().cuda(), model.to(device), ...
SAME_OBJECT_METHODS = ("cuda", "to", "half", "float", "cpu", "bfloat16", "train", "eval", "requires_grad_")


class Values:
    """Value tracking (a part of `AmpModel`)."""

    def _init_values(self) -> None:
        by_key: Dict[str, List[Entry]] = {}

        def record(node: cst.CSTNode, target: cst.BaseExpression, value: Optional[cst.BaseExpression]) -> None:
            if value is None:
                return
            key = dotted(target)
            if key is not None:
                by_key.setdefault(key, []).append((node, value, self.scope_of(node)))
            elif isinstance(target, (cst.Tuple, cst.List)) and isinstance(value, (cst.Tuple, cst.List)):
                if len(target.elements) == len(value.elements):
                    for t, v in zip(target.elements, value.elements):
                        record(node, t.value, v.value)
            elif isinstance(target, (cst.Tuple, cst.List)) and isinstance(value, cst.Call):
                # `model, opt, scaler = build()`: element i of what the call returns
                for i, t in enumerate(target.elements):
                    if not isinstance(t.value, cst.StarredElement):
                        record(node, t.value, ReturnedElement(value, i))  # type: ignore[arg-type]

        for node, target, value in self._index.assignments:
            record(node, target, value)
        # (a recursive closure over the model: a cycle that only a collection would free)
        record = None  # type: ignore[assignment]
        self._by_key = by_key
        self._values_cache: Dict[Tuple[int, str], List[cst.BaseExpression]] = {}
        self._related: Dict[cst.ClassDef, List[cst.ClassDef]] = {}

    # ---------------------------------------------------------------- assignments
    @property
    def assignments(self) -> Dict[str, List[Tuple[cst.CSTNode, cst.BaseExpression]]]:
        """Dotted target text ("scaler", "self.scaler") -> [(assign node, value)], file-wide."""
        return {k: [(n, v) for n, v, _ in entries] for k, entries in self._by_key.items()}

    def assignments_to(self, key: str) -> List[Tuple[cst.CSTNode, cst.BaseExpression]]:
        return [(n, v) for n, v, _ in self._by_key.get(key, [])]

    def assigned_keys(self) -> List[str]:
        """The dotted targets assigned anywhere in the file (the keys of `assignments`, without
        building its lists)."""
        return list(self._by_key)

    def binding_scope(self, name: str, scope: cst.CSTNode) -> Optional[cst.CSTNode]:
        """The scope whose binding of `name` is visible from `scope` (None: builtin/unknown)."""
        found, _ = self._resolve_scope(name, scope)
        if found is not None and name in self._index.declared.get(found, ()):
            return self.module
        return found

    def _is_param(self, func: cst.CSTNode, name: str) -> bool:
        return self._param_of(func, name) is not None

    @staticmethod
    def _param_of(func: cst.CSTNode, name: str) -> Optional[cst.Param]:
        """The parameter `name` of the function or lambda `func` (not `*args`/`**kwargs`), if any."""
        if not isinstance(func, (cst.FunctionDef, cst.Lambda)):
            return None
        p = func.params
        return next((x for x in (*p.posonly_params, *p.params, *p.kwonly_params) if x.name.value == name), None)

    def self_class(self, node: cst.CSTNode) -> Optional[cst.ClassDef]:
        """The class `self` means at `node`: the class of the method (or a function nested in a
        method) whose first parameter is `self`/`cls`."""
        scope: Optional[cst.CSTNode] = self.scope_of(node)
        while scope is not None and type(scope) not in _MODULE_OR_CLASS:
            if type(scope) is cst.FunctionDef:
                cls = self.class_of(scope)
                if cls is not None:
                    params = [*scope.params.posonly_params, *scope.params.params]
                    if params and params[0].name.value in ("self", "cls"):
                        return cls
                    return None
            scope = self._index.scope_of(scope)
        return None

    # ---------------------------------------------------------------- values
    def values_of(self, expr: cst.CSTNode, depth: int = 0) -> List[cst.BaseExpression]:
        """The values assigned to the name or attribute chain `expr` that are visible where
        `expr` is (see the module docstring). Not followed further: see `possible_values`."""
        key = dotted(expr)
        if key is None or depth > MAX_DEPTH:
            return []
        scope = self.scope_of(expr)
        cache_key = (id(scope), key)
        cached = self._values_cache.get(cache_key)
        if cached is not None:
            return cached
        self._values_cache[cache_key] = []  # recursion guard
        if self.is_synthetic(expr):  # type: ignore[attr-defined]
            found = self._synthetic_values(expr)  # type: ignore[attr-defined]
            self._values_cache[cache_key] = found or []
            return found or []
        root, _, rest = key.partition(".")
        values: List[cst.BaseExpression] = []
        cls = self.self_class(expr) if root in ("self", "cls") else None
        if cls is not None:
            if rest:
                values = self.attribute_values(cls, rest)
                if "." not in rest:
                    values = values + self.inherited_attribute(cls, rest)  # type: ignore[attr-defined]
        else:
            bscope = self.binding_scope(root, scope)
            if bscope is not None:
                for node, value, s in self._by_key.get(key, []):
                    if s is bscope or (bscope is self.module and s is not bscope
                                       and root in self._index.declared.get(s, ())):
                        values.append(value)
                    elif rest and bscope is self.module and self.binding_scope(root, s) is self.module:
                        values.append(value)  # `cfg.amp = True` in a function, `cfg` a module global
                if not rest and self._is_param(bscope, root):
                    values.extend(self.argument_values(bscope, root, depth + 1))  # type: ignore[attr-defined]
                    if not values and isinstance(bscope, cst.FunctionDef):
                        values.extend(self.foreign_argument_values(bscope, root))  # type: ignore[attr-defined]
                if not values and rest:
                    head, _, last = key.rpartition(".")
                    head_expr = _parse_dotted(head, expr)
                    for owner in self._classes_of(head_expr, depth + 1):
                        values.extend(self.attribute_values(owner, last))
                    if not values and head_expr is not None:
                        values.extend(self._foreign_instance_attribute(head_expr, last))
                    if not values and head_expr is not None and "." not in rest:
                        values.extend(self._option_values(head_expr, last))
                if not values and self.foreign is not None:  # type: ignore[attr-defined]
                    values.extend(self._imported_values(expr))
        self._values_cache[cache_key] = values
        return values

    def _imported_values(self, expr: cst.CSTNode) -> List[cst.BaseExpression]:
        """The values of a name imported from another module of the project (a constant's
        values, or a synthetic name standing for a function, class or module)."""
        d = self._foreign_definition(expr)  # type: ignore[attr-defined]
        if d is None:
            return []
        from ampfix.model.foreign import Synthetic

        return self._definition_values(d, "", Synthetic(None))  # type: ignore[attr-defined]

    def _option_values(self, head: cst.CSTNode, name: str) -> List[cst.BaseExpression]:
        """`args.<name>` where `args` holds what `parser.parse_args()` returns: the values the
        command-line option may hold (its default, its choices, True/False for a flag), with an
        unknown value when nothing closes the set; the parser declared in this file, or in the
        function of another module that returns `parse_args()`."""
        from ampfix.model.summarize import option_value_set
        from ampfix.model.syntax import call_name, literal_string

        for v in self.values_of(head):
            if not isinstance(v, cst.Call) or self.is_synthetic(v):  # type: ignore[attr-defined]
                continue
            if call_name(v) in ("parse_args", "parse_known_args") and isinstance(v.func, cst.Attribute):
                for call in self.calls:
                    if call_name(call) != "add_argument":
                        continue
                    flags = [literal_string(a.value) or "" for a in call.args if a.keyword is None]
                    dests = [literal_string(a.value) for a in call.args if a.keyword and a.keyword.value == "dest"]
                    if name in dests or any(f.startswith("--") and f[2:].replace("-", "_") == name for f in flags):
                        return [self._unknown_value() if e is None else e for e in option_value_set(self, call)]
                return []
            ff = self._foreign_callee(v) if self.foreign is not None else None  # type: ignore[attr-defined]
            if ff is not None and name in ff.summary.options:
                from ampfix.model.foreign import Synthetic

                origin = Synthetic(ff.module)
                return [self._materialize(val, origin) or self._unknown_value()  # type: ignore[attr-defined]
                        for val in ff.summary.options[name]]
        return []

    def _unknown_value(self) -> cst.BaseExpression:
        """A value nobody can know (what the user passes on the command line)."""
        node = self.__dict__.get("_unknown_node")
        if node is None:
            from ampfix.model.foreign import Synthetic

            node = self.__dict__["_unknown_node"] = cst.Name("__unknown__")
            self._synthetic[node] = Synthetic(None)  # type: ignore[attr-defined]
        return node

    def _foreign_instance_attribute(self, head: cst.CSTNode, attr: str) -> List[cst.BaseExpression]:
        """`obj.attr` where `obj` holds an instance of a class of another module."""
        if self.foreign is None:  # type: ignore[attr-defined]
            return []
        from ampfix.model.foreign import Synthetic

        out: List[cst.BaseExpression] = []
        for v in self.possible_values(head):
            fc = self._foreign_class_of(v)  # type: ignore[attr-defined]
            if fc is None or self.foreign.lacks_relevant_attributes(fc):  # type: ignore[attr-defined]
                continue  # (the texts show no AMP code and no dataclass in its classes: no summary read)
            if fc.summary.fields and attr in fc.summary.fields and isinstance(v, cst.Call):
                passed = self._field_argument(v, fc.summary.fields, attr)
                if passed is not None:  # a dataclass field given to the constructor
                    out.append(passed)
                    continue
            origin = Synthetic(fc.module, fc)
            out.extend(m for val in self._foreign_attribute(fc, attr)  # type: ignore[attr-defined]
                       for m in [self._materialize(val, origin)] if m is not None)  # type: ignore[attr-defined]
        return out

    def _field_argument(self, call: cst.Call, fields: List[str], attr: str) -> Optional[cst.BaseExpression]:
        """What a dataclass construction passes for field `attr` (unknown after *args/**kwargs,
        None when it is not passed: the default holds)."""
        pos = 0
        for a in call.args:
            if a.star:
                return self._unknown_value()
            if a.keyword is not None:
                if a.keyword.value == attr:
                    return a.value
                continue
            if pos < len(fields) and fields[pos] == attr:
                return a.value
            pos += 1
        return None

    def possible_values(self, expr: cst.CSTNode, depth: int = 0) -> List[cst.BaseExpression]:
        """The leaf values `expr` may evaluate to: names and attributes followed through their
        assignments, conditional expressions split into their branches. A name with no known
        assignment is its own leaf."""
        if depth > MAX_DEPTH:
            return []
        kind = _VALUE_KIND.get(type(expr))
        if kind is None:
            kind = _value_kind(type(expr))
        if kind == _IFEXP:
            return self.possible_values(expr.body, depth + 1) + self.possible_values(expr.orelse, depth + 1)  # type: ignore[attr-defined]
        if kind == _BOOLOP:
            return self.possible_values(expr.left, depth + 1) + self.possible_values(expr.right, depth + 1)  # type: ignore[attr-defined]
        if kind == _RETURNED:
            return [leaf for e in self._returned(expr.call, expr.index) for leaf in self.possible_values(e, depth + 1)]  # type: ignore[attr-defined]
        if kind == _DOTTED and dotted(expr) is not None:
            values = self.values_of(expr)
            if values:
                # a name whose values are being followed already, further up (a parameter a
                # function passes back to itself: fastestimator's `_trace_value(x, tables)` calls
                # itself 25 times, and each `tables` again held all 25, 25^6 times) adds nothing
                key = (id(self.scope_of(expr)), dotted(expr))
                following = self.__dict__.setdefault("_following", set())
                if key in following:
                    return []
                following.add(key)
                out: List[cst.BaseExpression] = []
                try:
                    for v in values:
                        out.extend(self.possible_values(v, depth + 1))
                finally:
                    following.discard(key)
                return out
        if kind == _CALL and not isinstance(expr.func, cst.Call):  # type: ignore[attr-defined]
            if self.is_synthetic(expr):  # type: ignore[attr-defined]
                found = self._synthetic_values(expr)  # type: ignore[attr-defined]
                if found:  # `__imported__("cfg.AMP")`: what the other module binds
                    return [leaf for e in found for leaf in self.possible_values(e, depth + 1)]
            returned = self._returned(expr, None)
            if returned:  # a helper of this file (or of another module) that builds the object
                return [leaf for e in returned for leaf in self.possible_values(e, depth + 1)]
        return [expr]  # type: ignore[list-item]

    def _returned(self, call: cst.Call, index: Optional[int]) -> List[cst.BaseExpression]:
        """What a call to a function of this file returns (element `index` of a returned tuple);
        empty when unknown."""
        out: List[cst.BaseExpression] = []
        callees = self.callees(call)  # type: ignore[attr-defined]
        if not callees and self.foreign is not None:  # type: ignore[attr-defined]
            ff = self._foreign_callee(call)  # type: ignore[attr-defined]
            if ff is not None and not ff.qual.endswith(".__init__"):
                return self._foreign_returned(call, ff, index)  # type: ignore[attr-defined]
        for func in callees:
            for r in self._nodes_in_scope(func, cst.Return):
                if r.value is None:
                    continue
                value = r.value
                if index is not None:
                    if not isinstance(value, (cst.Tuple, cst.List)) or index >= len(value.elements):
                        return []
                    value = value.elements[index].value
                out.append(value)
        return out

    # ---------------------------------------------------------------- classes and attributes
    def related_classes(self, cls: cst.ClassDef) -> List[cst.ClassDef]:
        """`cls`, its bases and its subclasses among the classes of this file."""
        cached = self._related.get(cls)
        if cached is not None:
            return cached
        classes: List[cst.ClassDef] = self.nodes_of(cst.ClassDef)  # type: ignore[assignment]
        bases = {c: {(dotted(b.value) or "").rpartition(".")[2] for b in c.bases} for c in classes}
        found = [cls]
        changed = True
        while changed:
            changed = False
            for c in classes:
                if c in found:
                    continue
                if any(f.name.value in bases[c] or c.name.value in bases[f] for f in found):
                    found.append(c)
                    changed = True
        self._related[cls] = found
        return found

    def _has_unseen_bases(self, cls: cst.ClassDef) -> bool:
        """`cls` (or a class related to it here) derives from a class this file does not define
        and that is not torch's, the standard library's `object`/`abc`/`typing` ones: a base in
        another module, which may set any `self.` attribute. `attribute_values` then knows only
        this file's assignments: an attribute it does not see is unknown, not unassigned."""
        for c in self.related_classes(cls):
            for b in c.bases:
                if b.keyword is not None or self._class_named(b.value) is not None:
                    continue
                names = self.qualnames(b.value)  # type: ignore[attr-defined]
                text = dotted(b.value) or ""
                if text in ("object", "ABC", "Generic", "Protocol", "NamedTuple", "Exception") or any(
                        n.startswith(("torch.", "abc.", "typing.", "builtins.", "enum.")) for n in names):
                    continue
                return True
        return False

    def attribute_values(self, cls: cst.ClassDef, attr: str) -> List[cst.BaseExpression]:
        """Values of `self.<attr>` for instances of `cls` (assigned in the methods of related
        classes, or in their class bodies)."""
        related = self.related_classes(cls)
        out: List[cst.BaseExpression] = []
        for node, value, scope in self._by_key.get(f"self.{attr}", []):
            if self.self_class(node) in related:
                out.append(value)
        for node, value, scope in self._by_key.get(attr, []):
            if scope in related:
                out.append(value)
        for cls_ in related:  # a @property returns its value
            method = self.method(cls_, attr)
            if method is not None and any(isinstance(d.decorator, cst.Name) and d.decorator.value == "property"
                                          for d in method.decorators):
                out.extend(r.value for r in self._nodes_in_scope(method, cst.Return) if r.value is not None)
        return out

    def _classes_of(self, expr: Optional[cst.CSTNode], depth: int = 0) -> List[cst.ClassDef]:
        """Classes of this file whose instances `expr` may be (`Net(...)`, `Net().cuda()`,
        `self` in a method, a name bound to one of those)."""
        if expr is None or depth > MAX_DEPTH:
            return []
        if isinstance(expr, cst.Name) and expr.value in ("self", "cls"):
            cls = self.self_class(expr)
            if cls is not None:
                return [cls]
        out: List[cst.ClassDef] = []
        for v in self.possible_values(expr, depth + 1):
            cls = self._class_of_value(v, depth + 1)
            if cls is not None and cls not in out:
                out.append(cls)
        return out

    def _class_of_value(self, value: cst.CSTNode, depth: int = 0) -> Optional[cst.ClassDef]:
        """The class of this file that `value` constructs (`Net(...)`, `Net(...).cuda()`, or a
        name bound to one)."""
        if depth > MAX_DEPTH:
            return None
        if isinstance(value, cst.Call):
            if isinstance(value.func, cst.Attribute) and value.func.attr.value in SAME_OBJECT_METHODS:
                return self._class_of_value(value.func.value, depth + 1)
            return self._class_named(value.func)
        if isinstance(value, (cst.Name, cst.Attribute)):
            for v in self.values_of(value):
                cls = self._class_of_value(v, depth + 1)
                if cls is not None:
                    return cls
        return None

    def _class_named(self, expr: cst.CSTNode) -> Optional[cst.ClassDef]:
        """The class of this file that the Name `expr` refers to."""
        if isinstance(expr, cst.Name) and expr.value in self.classes:
            cls = self.classes[expr.value]
            if self.binding_scope(expr.value, self.scope_of(expr)) is self.scope_of(cls):
                return cls
        return None

    # ---------------------------------------------------------------- functools.partial
    def _partial_parts(self, value: cst.CSTNode) -> Optional[Tuple[cst.BaseExpression, cst.Call]]:
        """For `functools.partial(f, *args, **kw)`: (f, the partial call)."""
        if isinstance(value, cst.Call) and self.is_api(value, "partial") and value.args \
                and value.args[0].keyword is None and not value.args[0].star:
            return value.args[0].value, value
        return None


# which branch of `possible_values` takes a node, by its type (as its isinstance tests, in their
# order; asked of every value followed, and `isinstance` against LibCST's classes goes through ABCMeta)
_IFEXP, _BOOLOP, _RETURNED, _DOTTED, _CALL, _LEAF = range(6)
_VALUE_KIND: Dict[type, int] = {}


def _value_kind(cls: type) -> int:
    kind = _VALUE_KIND[cls] = (
        _IFEXP if issubclass(cls, cst.IfExp) else
        _BOOLOP if issubclass(cls, cst.BooleanOperation) else
        _RETURNED if issubclass(cls, ReturnedElement) else
        _DOTTED if issubclass(cls, (cst.Name, cst.Attribute)) else
        _CALL if issubclass(cls, cst.Call) else _LEAF)
    return kind


def _parse_dotted(text: str, like: cst.CSTNode) -> Optional[cst.CSTNode]:
    """The sub-expression of `like` (an attribute chain) whose text is `text`."""
    node: Optional[cst.CSTNode] = like
    while isinstance(node, cst.Attribute):
        if dotted(node) == text:
            return node
        node = node.value
    if isinstance(node, cst.Name) and node.value == text:
        return node
    return None
