"""Code run in other threads: `nn.DataParallel` replicas and threads of the file's own.

Autocast state is thread-local, so what a worker thread runs, and whether it opens its own
region, is its own question (asked by AMP002, and by `events` to classify a call):

* `forward_kind`: a call that runs a module's replicas in worker threads (`dp_model(x)`,
  `dp_model.forward(x)`, `parallel_apply`, `data_parallel`);
* `dataparallel_module`: the module an `nn.DataParallel` (any spelling, or a subclass of this
  file) wraps;
* `thread_target`: the function a call hands to another thread (`Thread(target=f)`,
  `pool.submit(f, ...)` on a thread pool);
* `library_module`: a module built by a library (torchvision, timm, ...), whose `forward`
  certainly opens no region;
* `function_enables_autocast`: calling a function runs (part of) its body under an enabled
  autocast (a region it opens, or its autocast decorator).
"""

from __future__ import annotations

from typing import List, Optional, Sequence

import libcst as cst

from ampfix.model.facet import Facet
from ampfix.model.regions import Region
from ampfix.model.syntax import get_arg
from ampfix.model.values import SAME_OBJECT_METHODS


class Parallel(Facet):
    """DataParallel replicas and threads, and whether what they run opens a region
    (`model.parallel`)."""

    def forward_kind(self, call: cst.Call) -> Optional[str]:
        """"DataParallel" for `dp_model(x)` / `dp_model.forward(x)`, "parallel_apply" and
        "data_parallel" for the functional forms; None for any other call."""
        api = self.model.api_of(call)
        if api is not None and api.kind in ("parallel_apply", "data_parallel"):
            return api.kind
        func = call.func
        if isinstance(func, cst.Attribute) and func.attr.value == "forward":
            func = func.value
        if isinstance(func, (cst.Name, cst.Attribute)) and self.dataparallel_module(func) is not None:
            return "DataParallel"
        return None

    def dataparallel_module(self, expr: cst.CSTNode) -> Optional[cst.CSTNode]:
        """When `expr` holds an `nn.DataParallel` (any spelling, or a subclass of this file):
        the module it wraps (the DataParallel call itself when the module is not given)."""
        for v in self.model.possible_values(expr):
            while isinstance(v, cst.Call) and isinstance(v.func, cst.Attribute) and \
                    v.func.attr.value in SAME_OBJECT_METHODS:
                v = v.func.value  # nn.DataParallel(net).cuda()
            if not isinstance(v, cst.Call):
                continue
            cls = self.model._class_of_value(v)
            if self.model.is_api(v, "DataParallel") or (cls is not None and self._is_dataparallel_class(cls)):
                arg = get_arg(v, 0, "module")
                return arg.value if arg is not None else v
        return None

    def _is_dataparallel_class(self, cls: cst.ClassDef) -> bool:
        """A class of this file that is (a subclass of) `nn.DataParallel`."""
        return any(self.model.is_api(b.value, "DataParallel") or
                   (isinstance(b.value, cst.Name) and (base := self.model._class_named(b.value)) is not None
                    and base is not cls and self._is_dataparallel_class(base)) for b in cls.bases)

    def thread_target(self, call: cst.Call) -> Optional[cst.BaseExpression]:
        """The function a call hands to another thread: `Thread(target=f)`,
        `pool.submit(f, ...)`, `pool.map(f, ...)` on a thread pool."""
        api = self.model.api_of(call)
        if api is not None and api.kind == "thread":
            arg = get_arg(call, 1, "target")
            return arg.value if arg is not None else None
        if isinstance(call.func, cst.Attribute) and call.func.attr.value in ("submit", "map", "apply_async", "imap"):
            owner = call.func.value
            if any(isinstance(v, cst.Call) and self.model.is_api(v, "thread_pool")
                   for v in self.model.possible_values(owner)):
                arg = get_arg(call, 0, None)
                return arg.value if arg is not None else None
        return None

    def library_module(self, expr: Optional[cst.CSTNode], prefixes: Sequence[str]) -> bool:
        """`expr` holds a module built by a library named by `prefixes` (torchvision, timm, ...)."""
        if expr is None:
            return False
        out = False
        for v in self.model.possible_values(expr):
            while isinstance(v, cst.Call) and isinstance(v.func, cst.Attribute) and v.func.attr.value in SAME_OBJECT_METHODS:
                v = v.func.value
            if not isinstance(v, cst.Call) or not any(q.startswith(tuple(prefixes)) for q in self.model.qualnames(v)):
                return False
            out = True
        return out

    def function_enables_autocast(self, func: cst.FunctionDef) -> bool:
        """True when calling `func` runs (part of) its body under an enabled autocast."""
        return bool(self._regions_in(func))

    def _regions_in(self, func: cst.CSTNode) -> List[Region]:
        """Every possibly enabled region opened by `func`'s own body (or its decorator)."""
        out = []
        if isinstance(func, cst.FunctionDef):
            r = self.model._decorator_region(func)
            if r is not None and r.enabled is not False:
                out.append(r)
        for w in self.model.nodes_of(cst.With):
            if self.model.scope_of(w) is func:
                r = self.model.with_region(w)
                if r is not None and r.enabled is not False:
                    out.append(r)
        return out
