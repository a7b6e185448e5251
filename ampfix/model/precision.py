"""Precision: the dtypes a file chooses, and the dtype its autocast regions run in.

* `dtype_values(expr)`: the dtypes an expression may hold, through names, attributes,
  parameters, conditional expressions, `{...}[key]` tables and `getattr(torch, name)`;
  strings that name a dtype (`"bfloat16"`, `"bf16"`) count too; None when some value is unknown;
* `torch_dtype_valued(expr)`: every value is a torch dtype object (it can be passed as `dtype=`);
* `region_dtype(region)`: the dtype an autocast region runs in (its `dtype=`, or the device's
  default: float16 on CUDA, bfloat16 on the CPU), None when unknown;
* `autocast_regions()`: every enabled (or possibly enabled) region of the file;
* `float16_gated(expr)`: an `enabled=` expression that is tied to float16
  (`dtype == torch.float16`, `use_fp16`, `args.precision == "16"`);
* `may_be_float16(expr)`: every autocast region computing the value of `expr` runs float16 for
  some value of its dtype (a dtype chosen from fp16/bf16 by configuration);
* `value_dtypes(expr)`: the dtypes of the autocast regions that compute the value of `expr`
  with gradient (a loss: `loss = crit(out, y)` after `with autocast(...): out = model(x)`),
  through assignments, helpers of this file and functions of other modules that return it.
"""

from __future__ import annotations

import re
from typing import FrozenSet, List, NamedTuple, Optional, Set, Tuple

import libcst as cst

from ampfix.model.facet import Facet
from ampfix.model.regions import Region
from ampfix.model.syntax import call_name, get_arg, literal_string
from ampfix.model.tree import child_nodes, dotted
from ampfix.model.values import ReturnedElement

DTYPE_STRINGS = {"float16": "float16", "fp16": "float16", "half": "float16", "bfloat16": "bfloat16",
                 "bf16": "bfloat16", "float32": "float32", "fp32": "float32", "float": "float32"}
DEFAULT_DTYPE = {"cuda": "float16", "cpu": "bfloat16"}
FLOAT16_WORDS = re.compile(r"fp16|float16|half|dtype|precision|16", re.IGNORECASE)
MAX_VALUE_HOPS = 3  # assignments followed back from a value (`loss` <- `crit(out, y)` <- `out` <- `model(x)`)
MAX_VALUE_NODES = 400
# methods whose result carries no gradient back: what feeds them is not part of the backward
DETACHING = {"detach", "detach_", "item", "tolist", "numpy"}
NO_GRAD = {"torch.no_grad", "torch.inference_mode", "torch.autograd.grad_mode.no_grad",
           "torch.autograd.grad_mode.inference_mode", "torch.autograd.no_grad"}

LOADER_DTYPE = ("torch_dtype", "dtype")  # `from_pretrained(..., torch_dtype=torch.float16)`


class ForeignRegion(NamedTuple):
    """An autocast region of another module in which a function computes what it returns."""

    dtype: str  # "float16", "bfloat16", "float32" or "unknown"
    path: str
    line: int
    function: str  # the function of that module (`Trainer.compute_loss`)


class Precision(Facet):
    """Dtypes: the ones the file chooses, each autocast region's (`model.precision`)."""

    def dtype_values(self, expr: cst.CSTNode, depth: int = 0) -> Optional[FrozenSet[str]]:
        if depth > 4:
            return None
        out = set()
        for v in self.model.possible_values(expr):
            if isinstance(v, ReturnedElement):
                return None
            one = self._dtype_of_leaf(v, depth)
            if one is None:
                return None
            out |= one
        return frozenset(out)

    def _dtype_of_leaf(self, v: cst.CSTNode, depth: int) -> Optional[FrozenSet[str]]:
        api = self.model.api_of(v)
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
            keys = self.model.possible_values(v.slice[0].slice.value)
            if all(literal_string(k) in table for k in keys):
                return frozenset(d for k in keys for d in table[literal_string(k)])
            return frozenset(d for ds in table.values() for d in ds)
        if isinstance(v, cst.Call) and self.model._is_builtin(v.func, "getattr") and len(v.args) >= 2 \
                and dotted(v.args[0].value) == self.model.torch_alias():  # getattr(torch, name)
            return self.dtype_values(v.args[1].value, depth + 1)
        return None

    def option_values(self, expr: cst.CSTNode) -> Optional[List[cst.BaseExpression]]:
        """For `args.name` where `args` holds `parser.parse_args()` (or `parse_known_args`) and
        this file declares `add_argument("--name", default=..., choices=[...])`: the default
        and the choices (the values the option may hold); None when not such an option."""
        call = self._option_declaration(expr)
        if call is not None:
            out: List[cst.BaseExpression] = []
            for a in call.args:
                if a.keyword is not None and a.keyword.value == "default":
                    out.append(a.value)
                if a.keyword is not None and a.keyword.value == "choices" \
                        and isinstance(a.value, (cst.List, cst.Tuple)):
                    out.extend(e.value for e in a.value.elements)
            return out or None
        return None

    def option_default(self, expr: cst.CSTNode) -> Optional[cst.BaseExpression]:
        """For a command-line option of this file (see `option_values`): its `default=`."""
        call = self._option_declaration(expr)
        return None if call is None else next(
            (a.value for a in call.args if a.keyword is not None and a.keyword.value == "default"), None)

    def _option_declaration(self, expr: cst.CSTNode) -> Optional[cst.Call]:
        if not (isinstance(expr, cst.Attribute) and isinstance(expr.value, cst.Name)):
            return None
        if not any(isinstance(v, cst.Call) and call_name(v) in ("parse_args", "parse_known_args")
                   or isinstance(v, ReturnedElement) and call_name(v.call) == "parse_known_args"
                   for v in self.model.possible_values(expr.value)):
            return None
        flag = "--" + expr.attr.value
        for call in self.model.calls:
            if call_name(call) == "add_argument" and any(
                    (literal_string(a.value) or "").replace("-", "_") == flag.replace("-", "_")
                    for a in call.args if a.keyword is None):
                return call
        return None

    def torch_dtype_valued(self, expr: cst.CSTNode) -> bool:
        """Every value `expr` may hold is a torch dtype object (not a string): it can be passed
        as autocast's `dtype=`."""
        values = self.model.possible_values(expr)
        return bool(values) and all(self._torch_dtype_leaf(v) for v in values)

    def _torch_dtype_leaf(self, v: cst.CSTNode) -> bool:
        if isinstance(v, ReturnedElement) or literal_string(v) is not None or self._dtype_of_leaf(v, 0) is None:
            return False
        if isinstance(v, cst.Subscript) and isinstance(v.value, cst.Dict):
            return all(isinstance(el, cst.DictElement) and self._torch_dtype_leaf(el.value) for el in v.value.elements)
        return True

    def value_dtypes(self, expr: Optional[cst.CSTNode]) -> FrozenSet[str]:
        """The dtypes of the autocast regions that compute (part of) the value of `expr` with
        gradient (`computing_regions`): "float16", "bfloat16", "float32", or "unknown" for a
        region whose dtype is not known. Empty: no region this model sees computes it."""
        regions, foreign = self.computing_regions(expr)
        return frozenset({self.region_dtype(r) or "unknown" for r in regions} | {f.dtype for f in foreign})

    def computing_regions(self, expr: Optional[cst.CSTNode]) -> Tuple[List[Region], FrozenSet["ForeignRegion"]]:
        """The autocast regions of this file that compute (part of) the value of `expr` with
        gradient, and the dtypes of those of other modules: the region each of its values is
        computed in, following names back through their assignments (at most
        `MAX_VALUE_HOPS`), parameters (the arguments at call sites) and the returns of this
        file's functions; a function of another module contributes the regions in which it
        computes what it returns (its summary's `return_dtypes`). What is cut from the graph
        does not count: `.detach()`, `.item()`, values computed under `torch.no_grad()` /
        `inference_mode()`."""
        regions: List[Region] = []
        foreign: Set[ForeignRegion] = set()
        seen: set = set()
        stack: List[tuple] = [(expr, 0, True)] if expr is not None else []
        while stack and len(seen) < MAX_VALUE_NODES:
            n, hops, is_value = stack.pop()
            if id(n) in seen or isinstance(n, (cst.Lambda, cst.FunctionDef)):
                continue
            seen.add(id(n))
            if isinstance(n, ReturnedElement):  # `logits, loss = model(x, y)`: the call's region and returns
                foreign |= self._foreign_return_dtypes(n.call)
                stack.append((n.call, hops, True))
                stack.extend((r, hops, True) for r in self.model._returned(n.call, n.index))
                continue
            if isinstance(n, cst.Call) and isinstance(n.func, cst.Attribute) and n.func.attr.value in DETACHING:
                continue
            if is_value and not self.model.is_synthetic(n):
                if self.under_no_grad(n):
                    continue
                region = self.model.region_of(n)
                if region is not None and all(region.node is not r.node for r in regions):
                    regions.append(region)
            if isinstance(n, (cst.Name, cst.Attribute)) and dotted(n) is not None:
                if hops < MAX_VALUE_HOPS:
                    stack.extend((v, hops + 1, True) for v in self.model.values_of(n) if v is not n)
                if isinstance(n, cst.Attribute):
                    stack.append((n.value, hops, False))  # `out.loss`, `out.sum`: what `out` holds
                continue
            if isinstance(n, cst.Call):
                foreign |= self._foreign_return_dtypes(n)
                if hops < MAX_VALUE_HOPS and self.model.callees(n):
                    stack.extend((r, hops + 1, True) for r in self.model._returned(n, None))
                if isinstance(n.func, cst.Attribute):
                    stack.append((n.func.value, hops, False))
                stack.extend((a.value, hops, False) for a in n.args)
                continue
            stack.extend((c, hops, False) for c in child_nodes(n))
        return regions, frozenset(foreign)

    def _foreign_return_dtypes(self, call: cst.Call) -> Set["ForeignRegion"]:
        ff = self.model._foreign_callee(call) if isinstance(call, cst.Call) else None
        if ff is None:
            return set()
        return {ForeignRegion(d, ff.path, line, ff.qual) for d, line in ff.summary.return_dtypes.items()}

    def under_no_grad(self, node: cst.CSTNode) -> bool:
        """`node` runs under `with torch.no_grad()` / `torch.inference_mode()` in its function."""
        for anc in self.model.ancestors(node):
            if isinstance(anc, cst.With) and any(
                    self.model.qualnames(i.item.func if isinstance(i.item, cst.Call) else i.item) & NO_GRAD
                    for i in anc.items):
                return True
            if isinstance(anc, (cst.FunctionDef, cst.Lambda, cst.ClassDef)):
                return any(self.model.qualnames(d.decorator.func if isinstance(d.decorator, cst.Call) else d.decorator)
                           & NO_GRAD for d in getattr(anc, "decorators", ()))
        return False

    def region_devices(self, region: Region) -> Optional[FrozenSet[str]]:
        """The device types a region may run on; None when unknown."""
        if region.effective_device is not None:
            return frozenset([region.effective_device])
        call = region.call
        if call is None:
            return None
        args = call.args[1:] if self.model._partial_parts(call) is not None else call.args
        arg = next((a for a in args if a.keyword is not None and a.keyword.value == "device_type"), None)
        if arg is None and args and args[0].keyword is None and not args[0].star:
            arg = args[0]
        if arg is None:
            return None
        out = set()
        for v in self.model.possible_values(arg.value):
            s = literal_string(v)
            if s is None:
                return None
            out.add(s.split(":")[0])
        return frozenset(out)

    def region_device_code(self, regions: List[Region], at: cst.CSTNode) -> Optional[str]:
        """The device type these regions run on, as code that means it at `at` (where a
        GradScaler for them is built): their one literal device (`"cuda"`), or the variable
        they all take it from (`device_type=device`) when it is set by then; None otherwise."""
        texts = set()
        for r in regions:
            devices = self.region_devices(r)
            if not devices or not devices <= {"cuda", "cpu"}:
                return None
            if len(devices) == 1:
                texts.add(f'"{next(iter(devices))}"')
                continue
            direct = r.call is not None and r.api.device is None and self.model._autocast_call_info(r.call) is not None
            arg = get_arg(r.call, 0, "device_type") if direct else None  # type: ignore[arg-type]
            key = dotted(arg.value) if arg is not None else None
            root = (key or "").split(".")[0]
            if key is None or root == "self" or self.model.binding_scope(root, self.model.scope_of(r.call)) is not \
                    self.model.binding_scope(root, self.model.scope_of(at)) or not any(
                        self.model.before(n, at) for n, _ in self.model.assignments_to(key)):
                return None
            texts.add(key)
        return texts.pop() if len(texts) == 1 else None

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
        return any("set_autocast" in (call_name(c) or "") and "dtype" in (call_name(c) or "") for c in self.model.calls)

    def autocast_regions(self) -> List[Region]:
        """Every enabled or possibly enabled autocast region of the file."""
        cached = getattr(self, "_all_regions", None)
        if cached is None:
            cached = []
            for w in self.model.nodes_of(cst.With):
                r = self.model.with_region(w)  # type: ignore[arg-type]
                if r is not None and r.enabled is not False:
                    cached.append(r)
            for f in self.model.nodes_of(cst.FunctionDef):
                r = self.model._decorator_region(f)  # type: ignore[arg-type]
                if r is not None and r.enabled is not False:
                    cached.append(r)
            self._all_regions = cached
        return cached

    def may_be_float16(self, expr: Optional[cst.CSTNode]) -> bool:
        """Every autocast region computing (part of) the value of `expr` (`computing_regions`) is
        of this file and runs float16 for some value of its dtype (`{"fp16": torch.float16,
        "bf16": torch.bfloat16}[dtype]`), and there is one."""
        regions, foreign = self.computing_regions(expr)
        return bool(regions) and not foreign and all(
            self.region_dtype(r) == "float16" or r.dtype_node is not None
            and "float16" in (self.dtype_values(r.dtype_node) or ()) for r in regions)

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
                stack.extend(v for v in self.model.possible_values(n) if v is not n and isinstance(v, cst.CSTNode))
                continue
            s = literal_string(n)
            if s is not None and FLOAT16_WORDS.search(s):
                return True
            if isinstance(n, cst.Integer) and n.value == "16":
                return True
            if isinstance(n, cst.CSTNode):
                stack.extend(child_nodes(n))
        return False

    def default_choice(self, expr: cst.CSTNode, depth: int = 0) -> Optional[cst.CSTNode]:
        """What a dtype choice gives where nothing is asked for: on hardware that has bfloat16
        (`torch.bfloat16 if torch.cuda.is_bf16_supported() else ...`), with the defaults of this
        file's command-line options (a table read by one, a test of one); None when unknown."""
        if depth > 4:
            return None
        api = self.model.api_of(expr)
        if api is not None and api.kind.startswith("dtype."):
            return expr
        if isinstance(expr, (cst.Name, cst.Attribute)):
            default = self.option_default(expr)
            if default is not None:
                return default
            values = [v for v in self.model.values_of(expr) if v is not expr]
            return self.default_choice(values[0], depth + 1) if len(values) == 1 \
                and isinstance(values[0], cst.CSTNode) else None
        if isinstance(expr, cst.IfExp):
            test = self._default_test(expr.test, depth)
            return None if test is None else self.default_choice(expr.body if test else expr.orelse, depth + 1)
        if isinstance(expr, cst.Subscript) and isinstance(expr.value, cst.Dict) and len(expr.slice) == 1 \
                and isinstance(expr.slice[0].slice, cst.Index):
            key = self.default_choice(expr.slice[0].slice.value, depth + 1)
            name = literal_string(key) if key is not None else None
            hit = [el.value for el in expr.value.elements if isinstance(el, cst.DictElement)
                   and name is not None and literal_string(el.key) == name]
            return self.default_choice(hit[0], depth + 1) if len(hit) == 1 else None
        if isinstance(expr, cst.Call) and self.model._is_builtin(expr.func, "getattr") and len(expr.args) == 2 \
                and dotted(expr.args[0].value) == self.model.torch_alias():
            return self.default_choice(expr.args[1].value, depth + 1)
        return expr

    def _default_test(self, test: cst.BaseExpression, depth: int) -> Optional[bool]:
        """A choice's test where nothing is asked for: `torch.cuda.is_bf16_supported()` (alone or
        with `torch.cuda.is_available()`) is true on hardware that has bfloat16; `opt == "bf16"`
        compares an option's default."""
        if isinstance(test, cst.BooleanOperation) and isinstance(test.operator, cst.And):
            left, right = self._default_test(test.left, depth), self._default_test(test.right, depth)
            return None if left is None or right is None else left and right
        if isinstance(test, cst.Call) and call_name(test) in ("is_bf16_supported", "is_available") \
                and "cuda" in (dotted(test.func) or ""):
            return True
        if isinstance(test, cst.Comparison) and len(test.comparisons) == 1 \
                and isinstance(test.comparisons[0].operator, (cst.Equal, cst.NotEqual)):
            left = self.default_choice(test.left, depth + 1)
            right = test.comparisons[0].comparator
            a, b = literal_string(left) if left is not None else None, literal_string(right)
            if a is None or b is None:
                return None
            return (a == b) == isinstance(test.comparisons[0].operator, cst.Equal)
        return None

    def built_under_dtype_test(self, call: cst.Call) -> bool:
        """The scaler is built (or enabled) under a condition on the dtype or the precision."""
        child: cst.CSTNode = call
        for anc in self.model.ancestors(call):
            if isinstance(anc, (cst.If, cst.IfExp)) and child is not anc.test and self.float16_gated(anc.test):
                return True
            child = anc
        return False

    def scaler_float16_gates(self) -> List[cst.CSTNode]:
        """What the file's GradScalers compare with float16 in their `enabled=` (`dtype == "float16"`)."""
        model = self.model
        return [g for c in model.calls if model.is_api(c, "GradScaler")
                for g in self.float16_gates_in(model.scaler_enabled(c))]

    def float16_gates_in(self, expr: Optional[cst.CSTNode]) -> List[cst.CSTNode]:
        """The names and attributes `expr` compares with float16 (`X == torch.float16`, `X == "fp16"`)."""
        out = []
        stack = [expr] if expr is not None else []
        while stack:
            n = stack.pop()
            if isinstance(n, cst.Comparison) and len(n.comparisons) == 1 \
                    and isinstance(n.comparisons[0].operator, cst.Equal):
                for a, b in ((n.left, n.comparisons[0].comparator), (n.comparisons[0].comparator, n.left)):
                    api = self.model.api_of(b)
                    if dotted(a) is not None and (api is not None and api.kind == "dtype.float16" or
                                                  literal_string(b) is not None and self.dtype_values(b) == {"float16"}):
                        out.append(a)
            stack.extend(n.children)
        return out

    def float16_cast(self, call: cst.Call):
        """False when `call` is no float16 cast (`.half()`, `.to(torch.float16)`, `from_pretrained(...,
        torch_dtype=torch.float16)`); else the dtype Arg (None for `.half()`)."""
        name = call_name(call)
        if not isinstance(call.func, cst.Attribute):
            return False
        if name == "half" and not call.args:
            return None
        if name == "from_pretrained":  # loaded as float16
            for arg in call.args:
                if arg.keyword is not None and arg.keyword.value in LOADER_DTYPE and self.is_float16(arg.value):
                    return arg
            return False
        if name == "to":
            for arg in call.args:
                if arg.star or (arg.keyword is not None and arg.keyword.value != "dtype"):
                    continue
                if self.is_float16(arg.value):
                    return arg
        return False

    def is_float16(self, expr: cst.BaseExpression) -> bool:
        """`expr` is `torch.float16` (or `torch.half`), directly or through names that hold only it."""
        api = self.model.api_of(expr)
        if api is not None:
            return api.kind == "dtype.float16"
        return isinstance(expr, (cst.Name, cst.Attribute)) and self.torch_dtype_valued(expr) \
            and self.dtype_values(expr) == {"float16"}
