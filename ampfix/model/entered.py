"""Autocast contexts entered by hand: `ctx.__enter__()` on an object the model knows is an
autocast (`torch.autocast`, `torch.amp.autocast`, `torch.cuda.amp.autocast`, ... held in a name
or a `self.` attribute, or built on the spot), and whether the code may exit it (asked by
AMP021, a region entered by hand and never exited across a training step).

* `entries`: every such `__enter__()` written as a statement of its own (its value unused);
* `HandEntry.exited`: the object may be left: some `X.__exit__(` of the same name or attribute
  anywhere in the file, or the function that enters it uses it otherwise (a `with`, an
  `ExitStack.enter_context(X)`, an argument, a `return`, an alias, a parameter): unknown, so
  counted as exited;
* `HandEntry.caches`: the region casts and caches weights: not known disabled (a literal
  `enabled=False`), not float32 (casts nothing), not `cache_enabled=False`;
* `left_open`: the entries that are never exited and cache.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import List, Optional

import libcst as cst

from ampfix.model.facet import Facet
from ampfix.model.regions import Region
from ampfix.model.syntax import get_arg, literal_bool
from ampfix.model.tree import dotted


@dataclass(frozen=True)
class HandEntry:
    """One `X.__enter__()` statement of an autocast context."""

    call: cst.Call  # the `__enter__()` call
    receiver: cst.BaseExpression  # X
    key: Optional[str]  # X's dotted text; None: an autocast built on the spot (`torch.autocast(...).__enter__()`)
    scope: cst.CSTNode  # the function (or the module) whose body runs it
    region: Region  # the region it opens
    exited: bool
    caches: bool


class HandEntries(Facet):
    """Autocast contexts entered by hand (`model.entered`)."""

    @cached_property
    def entries(self) -> List[HandEntry]:
        """Every `X.__enter__()` statement (its value unused) of an autocast the model knows."""
        model = self.model
        out: List[HandEntry] = []
        for call in model.calls:
            func = call.func
            if not (isinstance(func, cst.Attribute) and func.attr.value == "__enter__") or call.args:
                continue
            stmt = model.statement_of(call)
            if not (isinstance(stmt, cst.SimpleStatementLine) and any(
                    isinstance(s, cst.Expr) and s.value is call for s in stmt.body)):
                continue
            recv = func.value
            key = dotted(recv)
            if key is None and not isinstance(recv, cst.Call):
                continue
            region = model._context_region(recv)  # (the region a `with` item opens, disabled ones included)
            if region is None:
                continue
            scope = model.function_of(call) or model.module
            exited = key is not None and (self._exit_called(key) or self._used_otherwise(key, scope))
            out.append(HandEntry(call, recv, key, scope, region, exited, self._caches(region)))
        return out

    def left_open(self) -> List[HandEntry]:
        """The entries of a region that caches casts and that nothing may exit."""
        return [e for e in self.entries if not e.exited and e.caches]

    def _caches(self, r: Region) -> bool:
        """The region may be enabled in a lower dtype with its cast cache on: not a literal
        `enabled=False`, not float32 (nothing to cast), not a literal `cache_enabled=False`."""
        if r.enabled is False or r.dtype == "float32":
            return False
        if r.call is None:
            return True
        api = self.model.api_of(r.call)
        pos = None if api is None or api.kind != "autocast" else 3 if api.device is None else 2  # a partial: keywords
        arg = get_arg(r.call, pos, "cache_enabled")
        return arg is None or literal_bool(arg.value) is not False

    def _exit_called(self, key: str) -> bool:
        """Some `key.__exit__(...)` anywhere in the file."""
        return any(isinstance(c.func, cst.Attribute) and c.func.attr.value == "__exit__" and dotted(c.func.value) == key
                   for c in self.model.calls)

    def _used_otherwise(self, key: str, scope: cst.CSTNode) -> bool:
        """`scope` reads the object `key` names other than to call `__enter__()` on it or binds it
        as a parameter (`with key:`, `stack.enter_context(key)`, `f(key)`, `c = key`, `return key`)."""
        model = self.model
        kind = cst.Name if "." not in key else cst.Attribute
        for n in model.nodes_of(kind):
            if dotted(n) != key or not (scope is model.module or model.is_ancestor(scope, n)):
                continue
            parent = model.parent(n)
            if isinstance(parent, cst.Attribute) and parent.attr is n:
                continue  # `obj.ctx`: another name
            if isinstance(parent, cst.Arg) and parent.keyword is n:
                continue  # `f(ctx=...)`: a keyword
            if isinstance(parent, cst.Attribute) and parent.value is n and parent.attr.value == "__enter__":
                continue
            if isinstance(parent, (cst.AssignTarget, cst.AnnAssign)) and parent.target is n:
                continue  # (re)bound here
            return True
        return False


__all__ = ["HandEntries", "HandEntry"]
