"""AMP016 autocast-dtype-ignored."""

from __future__ import annotations

from typing import Dict, Iterator, List, Optional

import libcst as cst

from ampfix.fixes.edits import region_dtype
from ampfix.model import AmpModel, Region, dotted, literal_string
from ampfix.model.regions import DTYPE_CHOICE
from ampfix.rule import SAFE, UNSAFE, FileContext, Fix, Rule, Violation

TORCH_NAMES = ("float16", "bfloat16", "float32", "half", "float")  # getattr(torch, name) is a dtype


class AutocastDtypeIgnored(Rule):
    code = "AMP016"
    name = "autocast-dtype-ignored"
    message = ("this CUDA autocast region gets no `dtype=` and runs float16 although the code chooses "
               "`{name}` (which may be bfloat16); pass `dtype={expr}`")
    triggers = ("autocast",)
    requires = (("dtype", "GradScaler"),)
    project_requires = (("autocast",),)
    fixable = "sometimes"
    fix_note = ("safe (`dtype=` the chosen dtype variable) when it holds torch dtypes; unsafe when its values "
                "are unknown")
    docs = """
`torch.autocast("cuda")` and `torch.cuda.amp.autocast()` without `dtype=` run in float16.
Code that chooses a dtype for mixed precision (an `amp_dtype`/`ptdtype`/`autocast_dtype`
variable, argument, `self.` attribute or config attribute, a `dtype` variable that may be
bfloat16, a `--dtype` command-line option whose default or choices include bfloat16, what a
GradScaler's `enabled=` compares with float16 when it may name bfloat16:
`enabled=args.precision == "fp16"` with `choices=["fp16", "bf16"]`) and then opens the region
without passing it asks for bfloat16 and gets float16: float16's narrow range overflows where
bfloat16 would not, and with the scaler disabled for bfloat16 nothing scales the float16
gradients, so small ones underflow to zero.

Reported for an enabled region without `dtype=` that may run on CUDA (a literal `"cuda"`, the
deprecated `torch.cuda.amp.autocast`, or a device that is not provably the CPU), that is not
nested in another region (a nested region inherits its dtype), when a chosen dtype is visible
there and is not provably float16; a region in a function (or `nn.Module.forward`) that this
file runs inside another region inherits that region's dtype and is left alone. CPU autocast
defaults to bfloat16, which is what people choose there, so a CPU-only region is left alone.
A file that changes autocast's default (`torch.set_autocast_dtype`) is left alone, and so is a
region opened with `**kwargs` (the dict may pass `dtype`).

The fix passes `dtype=<the variable>`: safe when it provably holds torch dtypes (not strings),
unsafe when its values are unknown (a config attribute could be a string like `"bf16"`). A
string option (`--dtype bfloat16`) is passed as `dtype=getattr(torch, args.dtype)`: safe when its
`choices=` are all torch dtype names, unsafe when only its default is known.

On the CPU the mistake cannot happen (CPU autocast defaults to bfloat16); it is a CUDA
mistake.

Bad:
```python
import torch

amp_dtype = torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
with torch.autocast("cuda"):
    loss = model(x).sum()
```

Good:
```python
import torch

amp_dtype = torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
with torch.autocast("cuda", dtype=amp_dtype):
    loss = model(x).sum()
```
"""

    def check(self, ctx: FileContext) -> Iterator[Violation]:
        model = ctx.model
        if model.precision.sets_autocast_dtype():
            return
        seen = set()
        for region in model.precision.autocast_regions():
            if region.dtype is not None or region.call is None or model.region_of(region.node) is not None \
                    or id(region.call) in seen:
                continue
            if any(a.star == "**" for a in region.call.args):
                continue  # `torch.autocast(**autocast_kwargs)`: the dict may hold `dtype`
            seen.add(id(region.call))
            if model.called_from_region(region):
                continue  # it inherits the dtype of the region it is called in
            devices = model.precision.region_devices(region)
            if devices is not None and "cuda" not in devices:
                continue
            chosen, late = self._chosen(model, region)
            if not chosen:
                continue
            typed = [k for k, v in chosen.items() if v is not None and all(model.precision.torch_dtype_valued(x) for x in v)]
            named = [k for k, v in chosen.items() if v is not None and k not in typed
                     and all(literal_string(x) in TORCH_NAMES for x in v)]
            torch_name = model.torch_alias()
            expr = applicability = None
            if len(typed) == 1:
                expr, applicability = typed[0], SAFE
            elif not typed and len(named) == 1 and torch_name is not None:  # "bfloat16": getattr(torch, ...)
                expr = f"getattr({torch_name}, {named[0]})"
                applicability = SAFE if _has_choices(model, chosen[named[0]]) else UNSAFE
            elif not typed and len(chosen) == 1 and None in chosen.values():
                expr, applicability = next(iter(chosen)), UNSAFE  # values unknown: it may be a string
            fix = self._fix(region, expr, applicability) if expr is not None and not region.opened_by_decorator \
                and expr not in late else None
            shown = " / ".join(sorted(chosen))
            message = self.message.format(name=shown, expr=expr or "<the torch dtype>")
            yield Violation(region.call, message=message, fix=fix)

    @staticmethod
    def _chosen(model: AmpModel, region: Region):
        """Dtype choices readable at the region that may be bfloat16: text -> the value nodes it
        may hold (None: unknown)."""
        at = region.call
        scope = model.scope_of(at)
        candidates: Dict[str, Optional[List[cst.CSTNode]]] = {}
        late: set = set()
        for key, entries in _dtype_assignments(model).items():
            root, _, last = key.rpartition(".")
            if root == "self":
                cls = model.self_class(at)
                mine = [n for n, _ in entries if cls is not None and model.self_class(n) in model.related_classes(cls)]
                here = [n for n in mine if model.function_of(n) is model.function_of(at)]
                if mine:
                    candidates[key] = list(model.attribute_values(cls, last))
                    if len(here) == len(mine) and not any(model.before(n, at) for n in here):
                        late.add(key)  # only set after the region is built: no fix can read it there
            elif not root:
                bscope = model.binding_scope(key, scope)
                values = [v for n, v in entries if model.scope_of(n) is bscope
                          and (bscope is not scope or model.before(n, at))]
                if bscope is not None and values:
                    candidates[key] = values
        func = model.function_of(at)
        while func is not None:  # parameters of the enclosing functions
            for p in [*func.params.posonly_params, *func.params.params, *func.params.kwonly_params]:
                if DTYPE_CHOICE.match(p.name.value) or p.name.value == "dtype":
                    values = model.argument_values(func, p.name.value)
                    known = values if values or p.default is None else [*values, p.default]
                    candidates.setdefault(p.name.value, known if known and (values or p.default) else None)
            func = model.function_of(model.parent(func))
        for key, values in model.dtype_attributes(scope).items():  # `args.amp_dtype`, `args.dtype` read there
            candidates.setdefault(key, values)
        enabled = next((a.value for a in region.call.args if a.keyword and a.keyword.value == "enabled"), None)
        region_gates = {dotted(g) for g in model.precision.float16_gates_in(enabled)}  # enabled only for float16: fine
        for gate in model.precision.scaler_float16_gates():  # `GradScaler(enabled=args.precision == "fp16")`: what it compares
            key, values = dotted(gate), model.precision.option_values(gate) or [gate]
            root = (key or "").split(".")[0]
            visible = model.self_class(at) is not None if root == "self" else model.binding_scope(root, scope)
            if key and visible and key not in region_gates and all(model.precision.dtype_values(v) is not None for v in values):
                candidates.setdefault(key, values)
        out: Dict[str, Optional[List[cst.CSTNode]]] = {}
        for key, values in candidates.items():
            dtypes = set()
            for v in values or ():
                d = model.precision.dtype_values(v)
                if d is None:
                    dtypes = None
                    break
                dtypes |= d
            if values is None or dtypes is None:
                if key != "dtype" and not key.endswith(".dtype"):
                    out[key] = None
            elif "bfloat16" in dtypes:
                out[key] = values
        return out, late

    @staticmethod
    def _fix(region: Region, name: str, applicability) -> Optional[Fix]:
        edit = region_dtype(region, name) if region.dtype_node is None else None
        return None if edit is None else Fix(edit, applicability=applicability, description=f"`dtype={name}` passed")


def _has_choices(model: AmpModel, values: List[cst.CSTNode]) -> bool:
    """The string values come from a command-line option with `choices=` (nothing else parses)."""
    return any(isinstance(model.parent(model.parent(v)), (cst.List, cst.Tuple)) for v in values)


def _dtype_assignments(model: AmpModel) -> Dict[str, list]:
    """The file's assignments to names that hold a chosen dtype."""
    return {k: model.assignments_to(k) for k in model.assigned_keys()
            if DTYPE_CHOICE.match(k.rpartition(".")[2]) or k == "dtype"}
