"""Autocast regions: where code runs under an enabled (or possibly enabled) autocast.

A region is opened by `with torch.autocast(...)` (any spelling), by a name, attribute or module
global bound to one (`ctx = nullcontext() if cpu else torch.autocast(...)`,
`self.amp_autocast = partial(torch.autocast, dtype=...)` called as `self.amp_autocast()`), or
by a function decorated with autocast. A literal `enabled=False` region masks its parents; a
value that may also be `nullcontext`/`suppress` makes a region that is only possibly enabled.
Regions are lexical within a function; the traces (`events.py`) carry them through calls.

Where a region gets its dtype from another region (`called_from_region`), whether it is a
decorator (`Region.opened_by_decorator`), the names of a chosen autocast dtype (`DTYPE_CHOICE`:
`amp_dtype`, `ptdtype`, ...) and the attributes of that name a function reads (`dtype_attributes`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from typing import Dict, List, Optional, Sequence

import libcst as cst

from ampfix.model.names import Api
from ampfix.model.syntax import literal_string
from ampfix.model.tree import FUNCTION_BOUNDARY, child_nodes, dotted, node_types

_LAMBDA_OR_CLASS = node_types(cst.Lambda, cst.ClassDef)

MAX_DEPTH = 6
# names of a chosen autocast dtype: amp_dtype, autocast_dtype, ptdtype, mixed_precision_dtype, self.amp_dtype
DTYPE_CHOICE = re.compile(r"^(?:amp|autocast|pt|mixed_precision|mp|half)_?dtype$", re.IGNORECASE)


@dataclass
class Region:
    """An enabled (or possibly enabled) autocast region."""

    node: cst.CSTNode  # the With, the decorated FunctionDef, or the autocast call
    call: Optional[cst.Call]  # the autocast(...) call, when known (for partial: the partial call)
    api: Api
    device: Optional[str]  # "cuda", "cpu", ... when known
    dtype: Optional[str]  # "float16", "bfloat16", "float32", "dynamic" (non-literal) or None (default)
    enabled: Optional[bool]  # True, False, or None when not a literal (treated as possibly enabled)
    dtype_node: Optional[cst.BaseExpression] = None

    @property
    def effective_device(self) -> Optional[str]:
        return self.device or self.api.device

    def may_run_float16(self) -> bool:
        """The region may run float16 (bfloat16 does not underflow like it): enabled, and float16,
        a dtype chosen at run time, or no dtype on a device whose default is float16 (or unknown)."""
        if self.enabled is False:
            return False
        if self.dtype is None:
            return self.effective_device not in ("cpu", "xpu", "mps") or self.effective_device is None
        return self.dtype in ("float16", "dynamic")

    @property
    def opened_by_decorator(self) -> bool:
        """The region is opened by a decorator of its function (`@torch.autocast("cuda")`), whose
        arguments are evaluated where the function is defined (its `self` is not there)."""
        return isinstance(self.node, cst.FunctionDef) and self.call in [d.decorator for d in self.node.decorators]


def _arg(args: Sequence[cst.Arg], position: Optional[int], keyword: str) -> Optional[cst.Arg]:
    pos = 0
    for arg in args:
        if arg.keyword is not None:
            if arg.keyword.value == keyword:
                return arg
            continue
        if arg.star:
            return None if arg.star == "*" and position is not None and pos <= position else None
        if position is not None and pos == position:
            return arg
        pos += 1
    return None


class Regions:
    """Autocast regions (a part of `AmpModel`)."""

    def dtype_name(self, node: Optional[cst.CSTNode]) -> Optional[str]:
        """"float16"/"bfloat16"/"float32" for a torch dtype expression, "dynamic" for anything
        else (a variable, a config value), None for no expression or `None`."""
        if node is None or (isinstance(node, cst.Name) and node.value == "None"):
            return None
        api = self.api_of(node)
        if api is not None and api.kind.startswith("dtype."):
            return api.kind.split(".", 1)[1]
        return "dynamic"

    def _region_from_args(self, api: Api, args: Sequence[cst.Arg], node: cst.CSTNode,
                          call: Optional[cst.Call]) -> Region:
        if api.device is None:  # torch.autocast(device_type, dtype=None, enabled=True, cache_enabled=None)
            dev_arg, dtype_arg, en_arg = _arg(args, 0, "device_type"), _arg(args, 1, "dtype"), _arg(args, 2, "enabled")
            device = literal_string(dev_arg.value) if dev_arg else None
        else:  # torch.cuda.amp.autocast(enabled=True, dtype=torch.float16, cache_enabled=True)
            en_arg, dtype_arg = _arg(args, 0, "enabled"), _arg(args, 1, "dtype")
            device = api.device
        if device is not None and ":" in device:
            device = device.split(":")[0]
        enabled: Optional[bool] = True if en_arg is None else self.test_value(en_arg.value)  # type: ignore[attr-defined]
        dtype_node = dtype_arg.value if dtype_arg is not None else None
        return Region(node=node, call=call, api=api, device=device, dtype=self.dtype_name(dtype_node),
                      enabled=enabled, dtype_node=dtype_node)

    def _autocast_call_info(self, call: cst.Call) -> Optional[Region]:
        """Describe `torch.autocast(...)`-like calls (any spelling), else None."""
        api = self.api_of(call)
        if api is None or api.kind != "autocast":
            return None
        return self._region_from_args(api, call.args, call, call)

    def _framework_region(self, call: cst.Call) -> Optional[Region]:
        """`accelerator.autocast()` / `fabric.autocast()` (no arguments: an `autocast_handler`
        may change the region) on an Accelerator or Fabric built in the code: a `torch.autocast`
        region in the framework's mixed-precision dtype, disabled when it runs none, possibly
        enabled in a dtype not known ("dynamic") when its precision is not known statically (a
        launch option). None for any other call (an object the code does not show to be one of
        them: unknown)."""
        func = call.func
        if not (isinstance(func, cst.Attribute) and func.attr.value == "autocast") or call.args:
            return None
        from ampfix.model.frameworks import frameworks

        fws = frameworks(self).frameworks_of(func.value)
        if not fws:
            return None
        kinds = [fw.mixed_dtypes for fw in fws]
        dtypes = {d for k in kinds if k is not None for d in k}
        known = all(k is not None for k in kinds)
        enabled: Optional[bool] = False if known and not dtypes else True if known and all(kinds) else None
        dtype = dtypes.pop() if known and len(dtypes) == 1 else "dynamic"
        api = Api("autocast", None, False, f"{fws[0].name}.autocast")
        return Region(node=call, call=call, api=api, device=None, dtype=dtype, enabled=enabled)

    def _context_region(self, expr: cst.BaseExpression, depth: int = 0) -> Optional[Region]:
        """The autocast region a `with` item's expression opens (None: not an autocast)."""
        if depth > MAX_DEPTH:
            return None
        if isinstance(expr, cst.Call):
            direct = self._autocast_call_info(expr) or self._framework_region(expr)
            if direct is not None:
                return direct
            # a name bound to partial(torch.autocast, ...) (or to a region-returning value), called
            if isinstance(expr.func, (cst.Name, cst.Attribute)):
                found = []
                values = self.possible_values(expr.func)
                for v in values:
                    parts = self._partial_parts(v)
                    if parts is not None:
                        api = self.api_of(parts[0])
                        if api is not None and api.kind == "autocast":
                            found.append(self._region_from_args(api, [*parts[1].args[1:], *expr.args], expr,
                                                                parts[1]))
                            continue
                    api = self.api_of(v)
                    if api is not None and api.kind == "autocast" and not isinstance(v, cst.Call):
                        found.append(self._region_from_args(api, expr.args, expr, expr))  # amp_autocast = torch.autocast
                merged = self._merge(found, len(values))
                if merged is not None:
                    return merged
            # a helper (of this file or another module) that returns the region
            returned = [v for r in self._returned(expr, None) for v in self.possible_values(r)]
            found = [r for r in (self._context_region(v, depth + 1) for v in returned
                                 if isinstance(v, (cst.Call, cst.IfExp))) if r is not None]
            merged = self._merge(found, len(returned)) if returned else None
            return replace(merged, node=expr) if merged is not None else None
        if isinstance(expr, (cst.IfExp, cst.Name, cst.Attribute, cst.BooleanOperation)):
            values = self.possible_values(expr)
            if values == [expr]:
                return None
            found = [r for r in (self._context_region(v, depth + 1) for v in values
                                 if isinstance(v, (cst.Call, cst.IfExp))) if r is not None]
            return self._merge(found, len(values))
        return None

    @staticmethod
    def _merge(found: List[Region], n_values: int) -> Optional[Region]:
        """One region for the values an expression may have: the first enabled one; possibly
        enabled when some values are not autocast regions at all."""
        live = [r for r in found if r.enabled is not False]
        if not live:
            return found[0] if found and len(found) == n_values else None
        r = live[0]
        if len(live) < n_values:
            r = replace(r, enabled=None)
        return r

    def with_region(self, node: cst.With) -> Optional[Region]:
        """The region a `with` statement opens (first autocast item), disabled ones included."""
        for item in node.items:
            r = self._context_region(item.item)
            if r is not None:
                return replace(r, node=node)
        return None

    def opens_region(self, expr: cst.BaseExpression) -> bool:
        """`expr`, entered by a `with`, would open an autocast region (enabled or not), any
        spelling: torch's, a framework's, a partial or a helper returning one."""
        return self._context_region(expr) is not None

    def items_outside_region(self, node: cst.With) -> List[cst.WithItem]:
        """The items of a `with` statement that open no autocast region (DDP's `no_sync()`, a
        profiler, `torch.no_grad()`): what stays entered when the autocast is left."""
        return [item for item in node.items if not self.opens_region(item.item)]

    def _decorator_region(self, func: cst.FunctionDef) -> Optional[Region]:
        for dec in func.decorators:
            r = self._context_region(dec.decorator) if isinstance(dec.decorator, cst.Call) else None
            if r is not None:
                return replace(r, node=func)
        return None

    def _called_in_region(self, func: cst.FunctionDef, depth: int = 0) -> bool:
        """Some call of this file runs `func` inside an autocast region (directly or through callers)."""
        if depth > 4:
            return False
        callers = list(self.callers(func))
        cls = self.class_of(func)
        if func.name.value == "forward" and cls is not None and self._is_module_class(cls):  # module(x) runs forward
            callers += [c for c in self.calls if isinstance(c.func, (cst.Name, cst.Attribute))
                        and cls in self._classes_of(c.func)]
        for call in callers:
            if self.region_of(call) is not None:
                return True
            outer = self.function_of(call)
            if outer is not None and outer is not func and self._called_in_region(outer, depth + 1):
                return True
        return False

    def called_from_region(self, region: Region) -> bool:
        """The function the region is in, or the one it decorates, is run inside another autocast
        region by some call of this file (`_called_in_region`): it inherits that region's dtype."""
        func = region.node if isinstance(region.node, cst.FunctionDef) else self.function_of(region.node)
        return func is not None and self._called_in_region(func)

    def dtype_attributes(self, scope: cst.CSTNode) -> Dict[str, List[cst.BaseExpression]]:
        """The attributes read in `scope` (not `self.`'s) that hold a chosen dtype: named like one
        (`args.amp_dtype`, `cfg.ptdtype`: `DTYPE_CHOICE`), or `args.dtype` when it is a
        command-line option: key -> the option's default and choices (`precision.option_values`),
        else the attribute (its first read)."""
        out: Dict[str, List[cst.BaseExpression]] = {}
        for n in self.nodes_of(cst.Attribute):
            key = dotted(n)
            if self.scope_of(n) is not scope or key is None or key.startswith("self."):
                continue
            options = self.precision.option_values(n)  # type: ignore[attr-defined]
            if DTYPE_CHOICE.match(n.attr.value) or (n.attr.value == "dtype" and options):
                out.setdefault(key, options or [n])
        return out

    def region_of(self, node: cst.CSTNode) -> Optional[Region]:
        """The innermost autocast region that lexically runs `node` within its function, or None.

        A region whose `enabled` is the literal False masks its parents. Function, lambda and
        class boundaries end the search (their bodies run when called), except a function
        decorated with autocast, which is a region itself.
        """
        child = node
        for anc in self.ancestors(node):
            kind = type(anc)  # (type tests: `node_types`)
            if kind is cst.With and child is anc.body:  # type: ignore[attr-defined]
                r = self.with_region(anc)  # type: ignore[arg-type]
                if r is not None:
                    return None if r.enabled is False else r
            elif kind is cst.FunctionDef:
                r = self._decorator_region(anc)  # type: ignore[arg-type]
                if r is not None:
                    return None if r.enabled is False else r
                return None
            elif kind in _LAMBDA_OR_CLASS:
                return None
            child = anc
        return None

    def value_regions(self, expr: cst.CSTNode) -> List[Region]:
        """The autocast regions the value of `expr` is computed in: `expr`'s own, and those of
        the values its names and attributes may hold (`d_out.sum()` with `d_out = D(x)` inside
        `with autocast():`, or a parameter whose argument is computed in one at a call site)."""
        found: List[Region] = []
        nodes = [expr]
        stack = [expr]
        while stack:
            n = stack.pop()
            if isinstance(n, (cst.Name, cst.Attribute)) and dotted(n) is not None:
                nodes.extend(v for v in self.possible_values(n) if v is not n)
                if isinstance(n, cst.Attribute):
                    stack.append(n.value)  # `out.sum`: what `out` holds
                continue
            if isinstance(n, (cst.Lambda, cst.FunctionDef)):
                continue
            stack.extend(child_nodes(n))
        for n in nodes:
            r = self.region_of(n)
            if r is not None and all(r.node is not f.node for f in found):
                found.append(r)
        return found

    def _masked_by_disabled_region(self, node: cst.CSTNode) -> bool:
        """`node` runs inside a literal `autocast(enabled=False)` region of its function."""
        child = node
        for anc in self.ancestors(node):
            kind = type(anc)
            if kind is cst.With and child is anc.body:  # type: ignore[attr-defined]
                r = self.with_region(anc)  # type: ignore[arg-type]
                if r is not None:
                    return r.enabled is False
            elif kind in FUNCTION_BOUNDARY:
                return False
            child = anc
        return False

