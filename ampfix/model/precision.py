"""Precision: the dtypes a file chooses, and the dtype its autocast regions run in.

* `dtype_values(expr)`: the dtypes an expression may hold, through names, attributes,
  parameters, conditional expressions, `{...}[key]` tables and `getattr(torch, name)`;
  strings that name a dtype (`"bfloat16"`, `"bf16"`) count too; None when some value is unknown;
* `torch_dtype_valued(expr)`: every value is a torch dtype object (it can be passed as `dtype=`);
* `region_dtype(region)`: the dtype an autocast region runs in (its `dtype=`, or the device's
  default: float16 on CUDA, bfloat16 on the CPU), None when unknown;
* `autocast_regions()`: every enabled (or possibly enabled) region of the file;
* `float16_gated(expr)`: an `enabled=` expression that is tied to float16
  (`dtype == torch.float16`, `use_fp16`, `args.precision == "16"`).
"""

from __future__ import annotations

import re
from typing import FrozenSet, List, Optional

import libcst as cst

from ampfix.model.regions import Region
from ampfix.model.syntax import call_name, literal_string
from ampfix.model.tree import dotted
from ampfix.model.values import ReturnedElement

DTYPE_STRINGS = {"float16": "float16", "fp16": "float16", "half": "float16", "bfloat16": "bfloat16",
                 "bf16": "bfloat16", "float32": "float32", "fp32": "float32", "float": "float32"}
DEFAULT_DTYPE = {"cuda": "float16", "cpu": "bfloat16"}
FLOAT16_WORDS = re.compile(r"fp16|float16|half|dtype|precision|16", re.IGNORECASE)


class Precision:
    """Dtypes (a part of `AmpModel`)."""

    def dtype_values(self, expr: cst.CSTNode, depth: int = 0) -> Optional[FrozenSet[str]]:
        if depth > 4:
            return None
        out = set()
        for v in self.possible_values(expr):
            if isinstance(v, ReturnedElement):
                return None
            one = self._dtype_of_leaf(v, depth)
            if one is None:
                return None
            out |= one
        return frozenset(out)

    def _dtype_of_leaf(self, v: cst.CSTNode, depth: int) -> Optional[FrozenSet[str]]:
        api = self.api_of(v)
        if api is not None and api.kind.startswith("dtype."):
            return frozenset([api.kind.split(".", 1)[1]])
        s = literal_string(v)
        if s is not None:
            return frozenset([DTYPE_STRINGS[s.lower()]]) if s.lower() in DTYPE_STRINGS else None
        if isinstance(v, cst.Subscript) and isinstance(v.value, cst.Dict) and len(v.slice) == 1 \
                and isinstance(v.slice[0].slice, cst.Index):  # {"bfloat16": torch.bfloat16, ...}[dtype]
            table = {}
            for el in v.value.elements:
                if not isinstance(el, cst.DictElement):
                    return None
                value = self._dtype_of_leaf(el.value, depth + 1)
                if value is None:
                    return None
                table[literal_string(el.key)] = value
            keys = self.possible_values(v.slice[0].slice.value)
            if all(literal_string(k) in table for k in keys):
                return frozenset(d for k in keys for d in table[literal_string(k)])
            return frozenset(d for ds in table.values() for d in ds)
        if isinstance(v, cst.Call) and self.is_builtin(v.func, "getattr") and len(v.args) >= 2 \
                and dotted(v.args[0].value) == self.torch_alias():  # getattr(torch, name)
            return self.dtype_values(v.args[1].value, depth + 1)
        return None

    def option_values(self, expr: cst.CSTNode) -> Optional[List[cst.BaseExpression]]:
        """For `args.name` where `args` holds `parser.parse_args()` (or `parse_known_args`) and
        this file declares `add_argument("--name", default=..., choices=[...])`: the default
        and the choices (the values the option may hold); None when not such an option."""
        if not (isinstance(expr, cst.Attribute) and isinstance(expr.value, cst.Name)):
            return None
        if not any(isinstance(v, cst.Call) and call_name(v) in ("parse_args", "parse_known_args")
                   or isinstance(v, ReturnedElement) and call_name(v.call) == "parse_known_args"
                   for v in self.possible_values(expr.value)):
            return None
        flag = "--" + expr.attr.value
        for call in self.calls:
            if call_name(call) != "add_argument" or not any(
                    (literal_string(a.value) or "").replace("-", "_") == flag.replace("-", "_")
                    for a in call.args if a.keyword is None):
                continue
            out: List[cst.BaseExpression] = []
            for a in call.args:
                if a.keyword is not None and a.keyword.value == "default":
                    out.append(a.value)
                if a.keyword is not None and a.keyword.value == "choices" \
                        and isinstance(a.value, (cst.List, cst.Tuple)):
                    out.extend(e.value for e in a.value.elements)
            return out or None
        return None

    def torch_dtype_valued(self, expr: cst.CSTNode) -> bool:
        """Every value `expr` may hold is a torch dtype object (not a string): it can be passed
        as autocast's `dtype=`."""
        values = self.possible_values(expr)
        return bool(values) and all(self._torch_dtype_leaf(v) for v in values)

    def _torch_dtype_leaf(self, v: cst.CSTNode) -> bool:
        if isinstance(v, ReturnedElement) or literal_string(v) is not None or self._dtype_of_leaf(v, 0) is None:
            return False
        if isinstance(v, cst.Subscript) and isinstance(v.value, cst.Dict):
            return all(isinstance(el, cst.DictElement) and self._torch_dtype_leaf(el.value) for el in v.value.elements)
        return True

    def region_devices(self, region: Region) -> Optional[FrozenSet[str]]:
        """The device types a region may run on; None when unknown."""
        if region.effective_device is not None:
            return frozenset([region.effective_device])
        call = region.call
        if call is None:
            return None
        args = call.args[1:] if self.partial_parts(call) is not None else call.args
        arg = next((a for a in args if a.keyword is not None and a.keyword.value == "device_type"), None)
        if arg is None and args and args[0].keyword is None and not args[0].star:
            arg = args[0]
        if arg is None:
            return None
        out = set()
        for v in self.possible_values(arg.value):
            s = literal_string(v)
            if s is None:
                return None
            out.add(s.split(":")[0])
        return frozenset(out)

    def region_dtype(self, region: Region) -> Optional[str]:
        """The dtype the region runs in: "float16", "bfloat16", "float32", or None (unknown)."""
        if region.dtype in ("float16", "bfloat16", "float32"):
            return region.dtype
        if region.dtype == "dynamic" and region.dtype_node is not None:
            values = self.dtype_values(region.dtype_node)
            return next(iter(values)) if values is not None and len(values) == 1 else None
        devices = self.region_devices(region)
        if devices is None or len(devices) != 1 or self.sets_autocast_dtype():
            return None
        return DEFAULT_DTYPE.get(next(iter(devices)))

    def sets_autocast_dtype(self) -> bool:
        """The file changes autocast's default dtype (`torch.set_autocast_dtype`, ...)."""
        return any("set_autocast" in (call_name(c) or "") and "dtype" in (call_name(c) or "") for c in self.calls)

    def autocast_regions(self) -> List[Region]:
        """Every enabled or possibly enabled autocast region of the file."""
        cached = getattr(self, "_all_regions", None)
        if cached is None:
            cached = []
            for w in self.nodes_of(cst.With):
                r = self.with_region(w)  # type: ignore[arg-type]
                if r is not None and r.enabled is not False:
                    cached.append(r)
            for f in self.nodes_of(cst.FunctionDef):
                r = self.decorator_region(f)  # type: ignore[arg-type]
                if r is not None and r.enabled is not False:
                    cached.append(r)
            self._all_regions = cached
        return cached

    def float16_gated(self, expr: Optional[cst.CSTNode]) -> bool:
        """The (scaler's) `enabled=` expression names float16, a dtype or a precision, directly
        or through the values of its names (`use_fp16`, `dtype == torch.float16`)."""
        if expr is None:
            return False
        stack = [expr]
        seen = 0
        while stack and seen < 50:
            n = stack.pop()
            seen += 1
            if isinstance(n, (cst.Name, cst.Attribute)) and dotted(n) is not None:
                if FLOAT16_WORDS.search(dotted(n) or ""):
                    return True
                stack.extend(v for v in self.possible_values(n) if v is not n and isinstance(v, cst.CSTNode))
                continue
            s = literal_string(n)
            if s is not None and FLOAT16_WORDS.search(s):
                return True
            if isinstance(n, cst.Integer) and n.value == "16":
                return True
            if isinstance(n, cst.CSTNode):
                stack.extend(n.children)
        return False
