"""The file's call graph: which functions and methods of this file a call runs.

Resolved: plain functions (module level and closures), `self.method()` (the class and its
bases in this file), `obj.method()` and `obj(...)` (`__call__`) where `obj` holds an instance
of a class of this file, `super().method()`, names bound to a function or to
`functools.partial(function, ...)`. Arguments are bound to parameters (`bind_arguments`), so
a fact about a parameter can be read at each call site.
"""

from __future__ import annotations

from typing import Dict, List, Optional, Set, Tuple

import libcst as cst

from ampfix.model.syntax import call_name
from ampfix.model.tree import _ATTRIBUTE, _DOTTED_KIND, _NAME, _OTHER, _dotted_kind, dotted

MAX_DEPTH = 6
# open callee resolutions at once (see `CallGraph.callees`)
MAX_NESTING = 24


class CallGraph:
    """Call resolution (a part of `AmpModel`)."""

    def _init_callgraph(self) -> None:
        # id(call) -> (call, its callees): keyed by id() because LibCST's `CSTNode.__hash__` is a
        # Python call and this is asked hundreds of thousands of times on a big file; the call is
        # kept in the entry, so its id cannot be reused while the entry lives
        self._callees: Dict[int, Tuple[cst.Call, List[cst.FunctionDef]]] = {}
        self._callers: Optional[Dict[cst.FunctionDef, List[cst.Call]]] = None

    # ---------------------------------------------------------------- resolution
    def callees(self, call: cst.Call) -> List[cst.FunctionDef]:
        """The functions of this file that `call` may run (empty: unknown or external)."""
        hit = self._callees.get(id(call))
        if hit is None:
            # resolving a callee asks what values hold, which asks what other calls return: a
            # chain through other modules' values (each materialised anew) has no natural end,
            # so past MAX_NESTING open resolutions the answer is unknown
            level = self.__dict__.get("_callee_nesting", 0)
            if level >= MAX_NESTING:
                return []
            self._callees[id(call)] = (call, [])  # recursion guard
            self._callee_nesting = level + 1
            try:
                cached = self._resolve_callable(call.func, call, 0)
            finally:
                self._callee_nesting = level
            self._callees[id(call)] = (call, cached)
            return cached
        return hit[1]

    def _resolve_callable(self, func: cst.BaseExpression, at: cst.CSTNode, depth: int) -> List[cst.FunctionDef]:
        if depth > MAX_DEPTH:
            return []
        # Name, Attribute or other, by type (`isinstance` against LibCST's classes goes through ABCMeta)
        kind = _DOTTED_KIND.get(type(func))
        if kind is None:
            kind = _dotted_kind(type(func))
        if kind == _ATTRIBUTE:
            owner = func.value
            name = func.attr.value
            if isinstance(owner, cst.Call) and isinstance(owner.func, cst.Name) and owner.func.value == "super":
                cls = self.self_class(at)
                if cls is None:
                    return []
                for base in self._bases(cls):
                    m = self.lookup_method(base, name)
                    if m is not None:
                        return [m]
                return []
            found: List[cst.FunctionDef] = []
            named = self._class_named(owner)
            if named is not None:
                m = self.lookup_method(named, name)  # Class.method(obj, ...)
                return [m] if m is not None else []
            if name in self._method_names():  # (no method of this file has the name: none to find)
                for cls in self._classes_of(owner, depth + 1):
                    m = self.lookup_method(cls, name)
                    if m is not None and m not in found:
                        found.append(m)
            if found:
                return found
        if kind == _NAME:
            bscope = self.binding_scope(func.value, self.scope_of(at))
            if bscope is not None:
                defs = [f for f in self.functions.get(func.value, []) if self.scope_of(f) is bscope]
                if defs:
                    return [defs[-1]]
        if kind != _OTHER:
            out: List[cst.FunctionDef] = []
            # a name or chain resolves by its text and scope alone (`values_of` is keyed so):
            # values that repeat one (a parameter bound to a list of 500 `LoraConfig`s) are
            # followed once, with the same answer in the same state
            followed: Set[Tuple[int, str]] = set()
            # a function reached through values is one this file uses as a value, and
            # `obj(...)` runs a `__call__` of this file: without either, nothing to follow
            for value in self.values_of(func) if self.functions_used_as_values() else ():
                parts = self._partial_parts(value)
                target = parts[0] if parts is not None else value
                target_kind = _DOTTED_KIND.get(type(target))
                if target_kind is None:
                    target_kind = _dotted_kind(type(target))
                if target_kind != _OTHER:  # a Name or an Attribute
                    text = dotted(target)
                    if text is not None:
                        key = (id(self.scope_of(target)), text)
                        if key in followed:
                            continue
                        followed.add(key)
                    for f in self._resolve_callable(target, target, depth + 1):
                        if f not in out:
                            out.append(f)
            for cls in self._classes_of(func, depth + 1) if "__call__" in self.functions else ():
                m = self.lookup_method(cls, "__call__")  # an instance: obj(...) runs __call__
                if m is not None and m not in out:
                    out.append(m)
            return out
        return []

    def functions_used_as_values(self) -> Set[str]:
        """The names of this file's functions that its code uses other than by calling or
        defining them (`g = f`, `run(f)`, `partial(f, x)`, `self.method` passed on): a function
        a call reaches through values is named by one of these (a value of another module's
        code is a node of this file when it names a function of this file: an argument bound to
        a parameter). A name counts where it is bound to the function (`_names_function`), an
        attribute where the name is a method's, a keyword never. Memoised."""
        used = self.__dict__.get("_used_as_values")
        if used is None:
            names = self.functions
            used = set()
            parent = self._index.parent
            for n in self.nodes_of(cst.Name):
                if n.value in names and n.value not in used:
                    p = parent(n)
                    if not ((type(p) is cst.FunctionDef and p.name is n) or (type(p) is cst.Call and p.func is n)
                            or (type(p) is cst.Attribute and p.attr is n) or (type(p) is cst.Arg and p.keyword is n)) \
                            and self._names_function(n):
                        used.add(n.value)
            methods = self._method_names()  # an attribute resolves to a method (`lookup_method`)
            for a in self.nodes_of(cst.Attribute):
                if a.attr.value in methods and a.attr.value not in used:
                    p = parent(a)
                    if not (type(p) is cst.Call and p.func is a):
                        used.add(a.attr.value)
            self.__dict__["_used_as_values"] = used
        return used

    def _method_names(self) -> Set[str]:
        """The names of the functions defined in a class body of this file: the only ones
        `lookup_method` finds. Memoised."""
        names = self.__dict__.get("_methods_named")
        if names is None:
            names = self.__dict__["_methods_named"] = {
                name for name, defs in self.functions.items()
                if any(type(self.scope_of(f)) is cst.ClassDef for f in defs)}
        return names

    def _names_function(self, name: cst.Name) -> bool:
        """The name `name` is bound where a function of its name is defined: the binding a
        value's name resolves to in `_resolve_callable` (a parameter or a local variable that
        shares a function's name names no function)."""
        bscope = self.binding_scope(name.value, self.scope_of(name))
        return bscope is not None and any(self.scope_of(f) is bscope for f in self.functions[name.value])

    def functions_named_by(self, expr: cst.CSTNode) -> List[cst.FunctionDef]:
        """The functions of this file that the expression `expr` (not a call) refers to."""
        if not isinstance(expr, (cst.Name, cst.Attribute)):
            return []
        return self._resolve_callable(expr, expr, 0)

    def _bases(self, cls: cst.ClassDef) -> List[cst.ClassDef]:
        out = []
        for b in cls.bases:
            name = (dotted(b.value) or "").rpartition(".")[2]
            base = self.classes.get(name)
            if base is not None and base is not cls:
                out.append(base)
        return out

    def lookup_method(self, cls: cst.ClassDef, name: str, depth: int = 0) -> Optional[cst.FunctionDef]:
        """`name` in `cls` or, failing that, in its bases of this file (depth first)."""
        if depth > MAX_DEPTH:
            return None
        m = self.method(cls, name)
        if m is not None:
            return m
        for base in self._bases(cls):
            m = self.lookup_method(base, name, depth + 1)
            if m is not None:
                return m
        return None

    def _is_method(self, func: cst.FunctionDef) -> bool:
        if self.class_of(func) is None:
            return False
        params = [*func.params.posonly_params, *func.params.params]
        if any(isinstance(d.decorator, cst.Name) and d.decorator.value == "staticmethod" for d in func.decorators):
            return False
        return bool(params)

    # ---------------------------------------------------------------- callers and arguments
    def callers(self, func: cst.FunctionDef) -> List[cst.Call]:
        """The calls in this file that may run `func`. A call reaches a function of another name
        only through values (`functions_used_as_values`) or as `__call__` (`_resolve_callable`);
        for any other function only the calls of its name are resolved (in the file's order)."""
        name = func.name.value
        if name != "__call__" and name not in self.functions_used_as_values():
            memo = self.__dict__.setdefault("_callers_by_name", {})
            hit = memo.get(func)
            if hit is None:
                hit = memo[func] = [c for c in self._calls_named(name) if func in self.callees(c)]
            return hit
        if self._callers is None:
            callers: Dict[cst.FunctionDef, List[cst.Call]] = {}
            for call in self.calls:
                for f in self.callees(call):
                    callers.setdefault(f, []).append(call)
            self._callers = callers
        return self._callers.get(func, [])

    def functions_reaching(self, node: cst.CSTNode) -> List[cst.FunctionDef]:
        """The functions of this file whose runs may reach `node`: its own function, the
        functions that enclose it, and, again for each of those, the functions of the calls that
        run it (`callers`), to the end; in the order they are found. Empty at module level."""
        start = self.function_of(node)
        found: Dict[int, cst.FunctionDef] = {}  # keyed by id(): `CSTNode.__hash__` is a Python call
        todo = [start] if start is not None else []
        while todo:
            func = todo.pop()
            if id(func) in found:
                continue
            found[id(func)] = func
            outer = self.function_of(func)
            if outer is not None:
                todo.append(outer)
            for call in self.callers(func):
                caller = self.function_of(call)
                if caller is not None:
                    todo.append(caller)
        return list(found.values())

    def _calls_named(self, name: str) -> List[cst.Call]:
        """The calls of this file whose `call_name` is `name` (`f(...)`, `x.f(...)`), in order."""
        by_name = self.__dict__.get("_calls_by_name")
        if by_name is None:
            by_name = {}
            for call in self.calls:
                n = call_name(call)
                if n is not None:
                    by_name.setdefault(n, []).append(call)
            self.__dict__["_calls_by_name"] = by_name
        return by_name.get(name, [])

    def bind_arguments(self, call: cst.Call, func: cst.FunctionDef) -> Dict[str, cst.BaseExpression]:
        """Parameter name -> the argument expression `call` passes to it (when certain)."""
        params = [*func.params.posonly_params, *func.params.params]
        bound_self = self._is_method(func) and (isinstance(call.func, cst.Attribute) or func.name.value == "__call__")
        if bound_self and isinstance(call.func, cst.Attribute) and self._class_named(call.func.value) is not None:
            bound_self = False  # Class.method(obj, ...): obj is passed explicitly
        if bound_self:
            params = params[1:]
        out: Dict[str, cst.BaseExpression] = {}
        pos = 0
        kw_names = {p.name.value for p in (*params, *func.params.kwonly_params)}
        for arg in call.args:
            if arg.star:
                if arg.star == "*":
                    break
                continue
            if arg.keyword is not None:
                if arg.keyword.value in kw_names:
                    out[arg.keyword.value] = arg.value
                continue
            if pos < len(params):
                out[params[pos].name.value] = arg.value
            pos += 1
        return out

    def argument_values(self, func: cst.CSTNode, param: str, depth: int = 0) -> List[cst.BaseExpression]:
        """The expressions passed to parameter `param` of `func` by the calls in this file."""
        if not isinstance(func, cst.FunctionDef) or depth > MAX_DEPTH:
            return []
        out = []
        for call in self.callers(func):
            arg = self.bind_arguments(call, func).get(param)
            if arg is not None:
                out.append(arg)
        return out
